//! The testbed's LLM provider: `GET /v1/stream` answers at once with the
//! head of a server-sent-events response, then thinks for `first_ms`, then
//! sends `tokens` events `gap_ms` apart and `[DONE]`. With `hang=1` it sends
//! the head and then nothing, keeping the connection open: a provider gone
//! silent.

use std::{net::SocketAddr, time::Duration};

use tokio::io::AsyncWriteExt as _;

use super::{http, say};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to serve on.
    #[arg(long)]
    pub listen: SocketAddr,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    super::runtime()?.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen).await?;
        say(format!("listening provider={}", args.listen));
        http::serve(listener, |req, mut s| async move {
            if req.path != "/v1/stream" {
                return http::respond_json(&mut s, 404, &serde_json::json!({"error": "no such path"}))
                    .await;
            }
            let first = Duration::from_millis(req.param_u64("first_ms", 200));
            let gap = Duration::from_millis(req.param_u64("gap_ms", 50));
            let tokens = req.param_u64("tokens", 10).min(100_000);
            let hang = req.param_u64("hang", 0) == 1;
            s.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n",
            )
            .await?;
            if hang {
                // Silent with the connection open, for an hour at most.
                tokio::time::sleep(Duration::from_secs(3600)).await;
                return Ok(());
            }
            tokio::time::sleep(first).await;
            for i in 0..tokens {
                s.write_all(format!("data: {{\"token\":{i}}}\n\n").as_bytes())
                    .await?;
                tokio::time::sleep(gap).await;
            }
            s.write_all(b"data: [DONE]\n\n").await?;
            s.shutdown().await
        })
        .await;
        Ok(())
    })
}
