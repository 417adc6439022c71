//! The testbed's dispatch server. Runners attach over the [`wire`]
//! protocol and heartbeat; every heartbeat is acknowledged; a runner with
//! nothing outstanding is sent a work item every `--work-every`. `GET
//! /runners` on the API address serves the runners table (`status`,
//! `last_seen_ms_ago`, …).
//!
//! Like the incident's server, the table says `connected` until the
//! runner's stream *errors*: a stream that went half-open (the flow dropped
//! without a FIN) errors on neither side, so the row keeps saying
//! `connected` while nothing arrives. A stream's teardown only touches its
//! own row (the incident's WI 3 fix): a runner that reattached is never
//! evicted by its old connection.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{io::AsyncWriteExt as _, sync::mpsc};

use super::{
    http, say,
    wire::{self, Msg},
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address for runners' attach streams.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Address of the HTTP API (`GET /runners`).
    #[arg(long)]
    pub api: SocketAddr,
    /// How often a runner with nothing outstanding is given work.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub work_every: Duration,
}

struct Row {
    executor: String,
    status: &'static str,
    last_seen: std::time::Instant,
    conn: u64,
    peer: SocketAddr,
    dispatched: u64,
    done: u64,
    tx: Option<mpsc::UnboundedSender<Msg>>,
}

#[derive(Default)]
struct Table {
    rows: BTreeMap<String, Row>,
    next_conn: u64,
    next_work: u64,
}

type Shared = Arc<Mutex<Table>>;

fn lock(t: &Shared) -> std::sync::MutexGuard<'_, Table> {
    t.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.work_every < Duration::from_millis(10) {
        anyhow::bail!("--work-every {:?}: at least 10ms", args.work_every);
    }
    super::runtime()?.block_on(async {
        let attach = tokio::net::TcpListener::bind(args.listen).await?;
        let api = tokio::net::TcpListener::bind(args.api).await?;
        say(format!("listening attach={} api={}", args.listen, args.api));
        let table = Shared::default();
        let t = table.clone();
        tokio::spawn(http::serve(api, move |req, mut s| {
            let t = t.clone();
            async move {
                let all = runners_json(&t);
                if req.path == "/runners" {
                    http::respond_json(&mut s, 200, &all).await
                } else if let Some(row) = req.path.strip_prefix("/runners/").and_then(|name| {
                    all["runners"]
                        .as_array()?
                        .iter()
                        .find(|r| r["runner"] == name)
                        .cloned()
                }) {
                    http::respond_json(&mut s, 200, &row).await
                } else {
                    http::respond_json(&mut s, 404, &serde_json::json!({"error": "no such path"}))
                        .await
                }
            }
        }));
        tokio::spawn(dispatcher(table.clone(), args.work_every));
        loop {
            match attach.accept().await {
                Ok((stream, peer)) => {
                    tokio::spawn(connection(table.clone(), stream, peer));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
}

fn runners_json(t: &Shared) -> serde_json::Value {
    let t = lock(t);
    let rows: Vec<_> = t
        .rows
        .iter()
        .map(|(name, r)| {
            serde_json::json!({
                "runner": name,
                "executor": r.executor,
                "status": r.status,
                "last_seen_ms_ago": r.last_seen.elapsed().as_millis() as u64,
                "conn": r.conn,
                "peer": r.peer.to_string(),
                "dispatched": r.dispatched,
                "done": r.done,
            })
        })
        .collect();
    serde_json::json!({ "runners": rows })
}

async fn connection(table: Shared, stream: tokio::net::TcpStream, peer: SocketAddr) {
    let (mut rd, mut wr) = stream.into_split();
    let hello = tokio::time::timeout(Duration::from_secs(5), wire::read_async(&mut rd)).await;
    let Ok(Ok(Msg::Hello { runner, executor })) = hello else {
        say(format!("refused peer={peer}: no hello"));
        return;
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let conn = {
        let mut t = lock(&table);
        t.next_conn += 1;
        let conn = t.next_conn;
        let done = t.rows.get(&runner).map_or(0, |r| r.done);
        t.rows.insert(
            runner.clone(),
            Row {
                executor,
                status: "connected",
                last_seen: std::time::Instant::now(),
                conn,
                peer,
                // Work sent down an older connection is lost with it.
                dispatched: done,
                done,
                tx: Some(tx.clone()),
            },
        );
        conn
    };
    say(format!("attached runner={runner} conn={conn} peer={peer}"));
    let writer = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            if wr.write_all(&wire::encode(&m)).await.is_err() {
                break;
            }
        }
    });
    let err = loop {
        match wire::read_async(&mut rd).await {
            Ok(Msg::Heartbeat { seq }) => {
                touch(&table, &runner, conn, |_| {});
                let _ = tx.send(Msg::Ack { seq });
            }
            Ok(Msg::Done { id, tokens }) => {
                touch(&table, &runner, conn, |r| r.done += 1);
                say(format!("done {id} runner={runner} tokens={tokens}"));
            }
            Ok(_) => {}
            Err(e) => break e,
        }
    };
    writer.abort();
    let mut t = lock(&table);
    if let Some(r) = t.rows.get_mut(&runner).filter(|r| r.conn == conn) {
        r.status = "disconnected";
        r.tx = None;
    }
    say(format!("stream ended runner={runner} conn={conn}: {err}"));
}

fn touch(table: &Shared, runner: &str, conn: u64, f: impl FnOnce(&mut Row)) {
    if let Some(r) = lock(table).rows.get_mut(runner).filter(|r| r.conn == conn) {
        r.last_seen = std::time::Instant::now();
        f(r);
    }
}

async fn dispatcher(table: Shared, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let mut t = lock(&table);
        let mut next = t.next_work;
        for (name, r) in t.rows.iter_mut() {
            let Some(tx) = r.tx.as_ref().filter(|_| r.status == "connected") else {
                continue;
            };
            if r.dispatched > r.done {
                continue;
            }
            next += 1;
            let id = format!("WI-{next}");
            if tx
                .send(Msg::Work {
                    id: id.clone(),
                    prompt: "review the pull request".into(),
                })
                .is_ok()
            {
                r.dispatched += 1;
                say(format!("dispatched {id} runner={name}"));
            }
        }
        t.next_work = next;
    }
}
