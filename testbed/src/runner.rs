//! The testbed's agent runner, with the incident's bug: its attach stream to
//! the dispatch server has no keepalive and no read timeout, so on a
//! half-open connection its read blocks forever and the reconnect loop
//! never runs; its heartbeat sender stops silently when a send fails. It
//! takes work items, calls the provider (streaming server-sent events), and
//! serves `GET /status` with its own story: `status` (`connected` while it
//! believes so) and `current_task`.
//!
//! `--mode blocking` reads the attach stream on a blocking thread and calls
//! the provider from blocking worker threads; `--mode tokio` does it all on
//! one event loop. `--pid1` runs it as PID 1 of a new pid namespace, and
//! `--leak-every` starts a short-lived child that often without ever reaping
//! one: the incident's zombie leak.

use std::{
    io::{BufRead as _, BufReader},
    net::{SocketAddr, TcpStream},
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use serde::Serialize;

use super::{
    http, say,
    wire::{self, Msg},
};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The runner's name (its row in the dispatch server's table).
    #[arg(long)]
    pub name: String,
    /// The executor it advertises.
    #[arg(long, default_value = "opencode")]
    pub executor: String,
    /// The dispatch server's attach address.
    #[arg(long)]
    pub dispatch: SocketAddr,
    /// The provider's address.
    #[arg(long)]
    pub provider: SocketAddr,
    /// The provider request for each work item (its pacing).
    #[arg(long, default_value = "/v1/stream")]
    pub provider_path: String,
    /// The provider request for every work item after the first (default:
    /// `--provider-path`): a first call that never answers, then fast ones.
    #[arg(long)]
    pub then_path: Option<String>,
    /// Address of the runner's own `GET /status`.
    #[arg(long)]
    pub status: SocketAddr,
    /// Heartbeat interval on the attach stream.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub heartbeat: Duration,
    #[arg(long, value_enum, default_value_t = Mode::Blocking)]
    pub mode: Mode,
    /// Run as PID 1 of a new pid namespace (the outer process waits for it).
    #[arg(long)]
    pub pid1: bool,
    /// With `--pid1`: where to write the runner's pid as the host sees it.
    #[arg(long, requires = "pid1")]
    pub pidfile: Option<PathBuf>,
    /// Start a short-lived child this often and never reap it.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub leak_every: Option<Duration>,
    /// Stop leaking after this many children.
    #[arg(long, default_value_t = 1000)]
    pub leak_max: u32,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Mode {
    Blocking,
    Tokio,
}

/// What `GET /status` says: the runner's own story.
#[derive(Clone, Debug, Default, Serialize)]
struct Status {
    runner: String,
    status: &'static str,
    current_task: Option<String>,
    tasks_done: u64,
    attaches: u64,
    last_error: Option<String>,
    children_leaked: u32,
}

type Shared = Arc<Mutex<Status>>;

fn update(s: &Shared, f: impl FnOnce(&mut Status)) {
    f(&mut s.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.heartbeat < Duration::from_millis(10)
        || args
            .leak_every
            .is_some_and(|d| d < Duration::from_millis(10))
    {
        anyhow::bail!("--heartbeat and --leak-every: at least 10ms");
    }
    if args.pid1 {
        become_pid1(args.pidfile.as_deref())?;
    }
    let state = Shared::new(Mutex::new(Status {
        runner: args.name.clone(),
        status: "connecting",
        ..Status::default()
    }));
    if let Some(every) = args.leak_every {
        let (state, max) = (state.clone(), args.leak_max);
        std::thread::spawn(move || leak_children(every, max, &state));
    }
    match args.mode {
        Mode::Blocking => {
            let (s, addr) = (state.clone(), args.status);
            std::thread::spawn(move || {
                if let Err(e) = super::runtime().map(|rt| rt.block_on(status_server(addr, s))) {
                    say(format!("status server failed: {e:#}"));
                }
            });
            attach_blocking(&args, &state)
        }
        Mode::Tokio => super::runtime()?.block_on(async {
            tokio::spawn(status_server(args.status, state.clone()));
            attach_tokio(&args, &state).await
        }),
    }
}

/// Unshares the pid namespace and forks: the child goes on as PID 1 of the
/// new namespace; the parent writes the child's pid, waits for it and exits
/// with its status. Called before any thread exists.
fn become_pid1(pidfile: Option<&std::path::Path>) -> anyhow::Result<()> {
    use nix::{
        sched::{CloneFlags, unshare},
        sys::wait::{WaitStatus, waitpid},
        unistd::{ForkResult, fork},
    };
    unshare(CloneFlags::CLONE_NEWPID).context("unshare(CLONE_NEWPID)")?;
    // SAFETY: no other thread exists yet (this runs first in `run`), so the
    // child may do anything.
    match unsafe { fork() }.context("fork")? {
        ForkResult::Child => {
            // Die with the outer process (it is what tests and the demo kill).
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .context("PR_SET_PDEATHSIG")?;
            Ok(())
        }
        ForkResult::Parent { child } => {
            if let Some(p) = pidfile {
                std::fs::write(p, format!("{child}\n"))
                    .with_context(|| format!("cannot write {}", p.display()))?;
            }
            say(format!("pid1 host_pid={child}"));
            let code = match waitpid(child, None) {
                Ok(WaitStatus::Exited(_, c)) => c,
                _ => 1,
            };
            std::process::exit(code);
        }
    }
}

fn leak_children(every: Duration, max: u32, state: &Shared) {
    for n in 1..=max {
        std::thread::sleep(every);
        match std::process::Command::new("/bin/true").spawn() {
            // Dropping a Child never waits for it: it stays a zombie.
            Ok(child) => drop(child),
            Err(e) => {
                say(format!("cannot start a child: {e}"));
                continue;
            }
        }
        update(state, |s| s.children_leaked = n);
    }
}

async fn status_server(addr: SocketAddr, state: Shared) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    http::serve(listener, move |req, mut s| {
        let state = state.clone();
        async move {
            if req.path == "/status" {
                let body = serde_json::to_value(
                    &*state
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner),
                )
                .unwrap_or_default();
                http::respond_json(&mut s, 200, &body).await
            } else {
                http::respond_json(&mut s, 404, &serde_json::json!({"error": "no such path"})).await
            }
        }
    })
    .await;
    Ok(())
}

/// Pause before reconnecting (and between failed connects).
const RECONNECT_PAUSE: Duration = Duration::from_millis(300);

fn attach_blocking(args: &Args, state: &Shared) -> anyhow::Result<()> {
    loop {
        let stream = match TcpStream::connect_timeout(&args.dispatch, Duration::from_secs(3)) {
            Ok(s) => s,
            Err(e) => {
                update(state, |s| {
                    s.status = "connecting";
                    s.last_error = Some(e.to_string());
                });
                std::thread::sleep(RECONNECT_PAUSE);
                continue;
            }
        };
        // The bug: no SO_KEEPALIVE, no read timeout, no user timeout.
        let writer = Arc::new(Mutex::new(stream.try_clone()?));
        let hello = Msg::Hello {
            runner: args.name.clone(),
            executor: args.executor.clone(),
        };
        if wire::write(&mut *writer.lock().expect("writer"), &hello).is_err() {
            std::thread::sleep(RECONNECT_PAUSE);
            continue;
        }
        let local = stream
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        update(state, |s| {
            s.status = "connected";
            s.attaches += 1;
        });
        say(format!("attached dispatch={} local={local}", args.dispatch));
        let alive = Arc::new(AtomicBool::new(true));
        {
            let (writer, alive, every) = (writer.clone(), alive.clone(), args.heartbeat);
            std::thread::spawn(move || {
                let mut seq = 0;
                while alive.load(Ordering::Relaxed) {
                    std::thread::sleep(every);
                    seq += 1;
                    let sent = wire::write(
                        &mut *writer
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner),
                        &Msg::Heartbeat { seq },
                    );
                    if sent.is_err() {
                        // The incident's silent `break`.
                        break;
                    }
                }
            });
        }
        let mut reader = BufReader::new(stream);
        let err = loop {
            match wire::read(&mut reader) {
                Ok(Msg::Work { id, .. }) => {
                    let (writer, state) = (writer.clone(), state.clone());
                    let (provider, path) = (args.provider, provider_path(args, &state));
                    std::thread::spawn(move || {
                        let tokens = work_blocking(&id, provider, &path, &state);
                        let mut w = writer
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        let _ = wire::write(&mut *w, &Msg::Done { id, tokens });
                    });
                }
                Ok(_) => {}
                Err(e) => break e,
            }
        };
        alive.store(false, Ordering::Relaxed);
        say(format!("attach stream failed: {err}; reconnecting"));
        update(state, |s| {
            s.status = "reconnecting";
            s.last_error = Some(err.to_string());
        });
        std::thread::sleep(RECONNECT_PAUSE);
    }
}

/// The provider request for the next work item: `--then-path` once the
/// runner has started one.
fn provider_path(args: &Args, state: &Shared) -> String {
    let started = {
        let s = state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        s.tasks_done > 0 || s.current_task.is_some()
    };
    match &args.then_path {
        Some(then) if started => then.clone(),
        _ => args.provider_path.clone(),
    }
}

/// One work item on a blocking thread: the provider call's reads block
/// while the provider thinks. Returns the tokens received.
fn work_blocking(id: &str, provider: SocketAddr, path: &str, state: &Shared) -> u64 {
    update(state, |s| s.current_task = Some(id.to_string()));
    say(format!("working {id}"));
    let mut tokens = 0;
    // No timeout, as a careless client has none.
    match http::get_streaming(provider, path, None) {
        Ok(resp) if resp.status == 200 => {
            for line in resp.body.lines() {
                let line = match line {
                    Ok(line) => line,
                    Err(e) => {
                        say(format!("provider call for {id} failed: {e}"));
                        break;
                    }
                };
                match line.strip_prefix("data: ") {
                    Some("[DONE]") => break,
                    Some(_) => tokens += 1,
                    None => {}
                }
            }
        }
        Ok(resp) => say(format!("provider said {} for {id}", resp.status)),
        Err(e) => say(format!("provider call for {id} failed: {}", chain(&e))),
    }
    finish(id, tokens, state);
    tokens
}

fn finish(id: &str, tokens: u64, state: &Shared) {
    update(state, |s| {
        s.current_task = None;
        s.tasks_done += 1;
    });
    say(format!("done {id} tokens={tokens}"));
}

async fn attach_tokio(args: &Args, state: &Shared) -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt as _;
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .context("HTTP client")?;
    loop {
        let connect = tokio::time::timeout(
            Duration::from_secs(3),
            tokio::net::TcpStream::connect(args.dispatch),
        )
        .await;
        let stream = match connect {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                update(state, |s| {
                    s.status = "connecting";
                    s.last_error = Some(e.to_string());
                });
                tokio::time::sleep(RECONNECT_PAUSE).await;
                continue;
            }
            Err(_) => continue,
        };
        let local = stream
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let (mut rd, wr) = stream.into_split();
        let writer = Arc::new(tokio::sync::Mutex::new(wr));
        let hello = wire::encode(&Msg::Hello {
            runner: args.name.clone(),
            executor: args.executor.clone(),
        });
        if writer.lock().await.write_all(&hello).await.is_err() {
            tokio::time::sleep(RECONNECT_PAUSE).await;
            continue;
        }
        update(state, |s| {
            s.status = "connected";
            s.attaches += 1;
        });
        say(format!("attached dispatch={} local={local}", args.dispatch));
        let heartbeat = {
            let (writer, every) = (writer.clone(), args.heartbeat);
            tokio::spawn(async move {
                let mut seq = 0;
                loop {
                    tokio::time::sleep(every).await;
                    seq += 1;
                    let frame = wire::encode(&Msg::Heartbeat { seq });
                    if writer.lock().await.write_all(&frame).await.is_err() {
                        break; // The incident's silent `break`.
                    }
                }
            })
        };
        // The incident's read loop: `inbound.message().await?`.
        let err = loop {
            match wire::read_async(&mut rd).await {
                Ok(Msg::Work { id, .. }) => {
                    let (writer, state, client) = (writer.clone(), state.clone(), client.clone());
                    let url = format!("http://{}{}", args.provider, provider_path(args, &state));
                    tokio::spawn(async move {
                        let tokens = work_tokio(&client, &id, &url, &state).await;
                        let frame = wire::encode(&Msg::Done { id, tokens });
                        let _ = writer.lock().await.write_all(&frame).await;
                    });
                }
                Ok(_) => {}
                Err(e) => break e,
            }
        };
        heartbeat.abort();
        say(format!("attach stream failed: {err}; reconnecting"));
        update(state, |s| {
            s.status = "reconnecting";
            s.last_error = Some(err.to_string());
        });
        tokio::time::sleep(RECONNECT_PAUSE).await;
    }
}

/// One work item on the event loop: tokens are counted as events arrive.
async fn work_tokio(client: &reqwest::Client, id: &str, url: &str, state: &Shared) -> u64 {
    update(state, |s| s.current_task = Some(id.to_string()));
    say(format!("working {id}"));
    let mut tokens = 0;
    match client.get(url).send().await {
        Ok(mut resp) if resp.status().is_success() => {
            let mut pending = Vec::new();
            'stream: loop {
                let chunk = match resp.chunk().await {
                    Ok(Some(chunk)) => chunk,
                    Ok(None) => break,
                    Err(e) => {
                        say(format!("provider call for {id} failed: {}", chain(&e)));
                        break;
                    }
                };
                pending.extend_from_slice(&chunk);
                while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
                    let event: Vec<u8> = pending.drain(..end + 2).collect();
                    match event.strip_prefix(b"data: ") {
                        Some(b"[DONE]\n\n") => break 'stream,
                        Some(_) => tokens += 1,
                        None => {}
                    }
                }
            }
        }
        Ok(resp) => say(format!("provider said {} for {id}", resp.status())),
        Err(e) => say(format!("provider call for {id} failed: {}", chain(&e))),
    }
    finish(id, tokens, state);
    tokens
}

/// An error with its sources, `: `-joined (reqwest's own message hides the
/// I/O error beneath).
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(&format!(": {s}"));
        source = s.source();
    }
    out
}
