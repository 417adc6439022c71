//! A local TCP proxy (`selfheal-testbed proxy --listen A --upstream B`):
//! every accepted connection is joined to a new connection to the upstream
//! and bytes are copied both ways until either side closes. It stands for
//! a sidecar or gateway on the caller's own host: the caller's connection
//! ends at the proxy, whose kernel answers keepalive probes even when the
//! proxy's own flow to the provider is dead.

use std::net::SocketAddr;

use super::say;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to accept callers on.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Where to forward each connection.
    #[arg(long)]
    pub upstream: SocketAddr,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    super::runtime()?.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen).await?;
        say(format!(
            "listening proxy={} upstream={}",
            args.listen, args.upstream
        ));
        loop {
            let Ok((mut inbound, from)) = listener.accept().await else {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            };
            let upstream = args.upstream;
            tokio::spawn(async move {
                let mut outbound = match tokio::net::TcpStream::connect(upstream).await {
                    Ok(s) => s,
                    Err(e) => {
                        say(format!("upstream {upstream} for {from}: {e}"));
                        return;
                    }
                };
                let local = outbound
                    .local_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_default();
                say(format!("forwarding from={from} via={local} to={upstream}"));
                let r = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                say(format!("closed from={from} via={local}: {r:?}"));
            });
        }
    })
}
