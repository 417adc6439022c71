//! `soak`: `selfheal watch` healing through a running `selfheal helper` for a
//! bounded time while agents churn, sampling both processes' memory and file
//! descriptors, and counting every forensic snapshot against the verdicts
//! the watch reported. Run by `cargo xtask soak [--seconds N]`; needs root
//! (network namespaces, nftables, the helper's eBPF).
//!
//! The churn: `--slots` agents (`recv-peer reconnecting`, a runner with its
//! own reconnect logic) in network namespace `a`, each with its own dispatch
//! server (`recv-peer beats`, a byte every 300 ms) on its own port in `b`.
//! Each slot loops, out of phase with the others:
//!
//! 1. start: a server and a runner; the watch sees it `idle`;
//! 2. wedge: the server's port is cut both ways and the server replaced
//!    (a pod gone without a FIN); the watch must find the runner `wedged`
//!    (control silent past 3 × its 1 s heartbeat), write its snapshot, and
//!    arm keepalive on the dead connection through the helper;
//! 3. heal: the port comes back, the keepalive probe draws a reset, the
//!    runner reconnects by itself, and the watch sees it `idle` again;
//! 4. exit: the runner and its server exit; the watch sees it `down`.
//!
//! Every agent also has an HTTP probe (a status endpoint in this process),
//! so the probe path runs every check too.
//!
//! About every 10 s a sample also reads where each process's memory is
//! (`/proc/PID/smaps`: heap, anonymous, file) and counts the records of the
//! watch's saved history (heal actions, proofs, progress records); the
//! report prints that timeline, so a growth says whether it levels off and
//! what grew with it.
//!
//! Passes when, after the warm-up: neither process's anonymous memory
//! (`RssAnon`: what it allocated) grew by 1 MiB or more (median of the
//! first samples against the median of the last; the pages of its binary,
//! read in and dropped by the kernel, are printed apart), the
//! floor of their open fds did not rise, no not-ok verdict lacks its
//! snapshot and every snapshot id reported is in the snapshot log, every
//! injected wedge was found, healed and recovered, and both processes are
//! still running. Prints a summary table; exits 1 on failure, 2 when it
//! cannot run here.
//!
//! `--fleet` soaks SDK calls over TLS instead: see `fleet.rs` beside the
//! bench crate's library (`bench/src/fleet.rs`).

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Command, Stdio},
    sync::{Arc, Mutex, mpsc},
    time::{Duration, Instant},
};

#[path = "../fleet.rs"]
mod fleet;

use bench::status_server;
use serde_json::Value;
use tests::{NetnsPair, Peer, is_root, open_fds};

const SEC: Duration = Duration::from_secs(1);
/// First port of the slots' dispatch servers (inside namespace `b`).
const BASE_PORT: u16 = 7600;
/// Longest the watch may take to find, snapshot and heal an injected wedge.
const HEAL_BOUND: Duration = Duration::from_secs(30);
/// Longest a healed runner may take to reconnect.
const RECOVER_BOUND: Duration = Duration::from_secs(30);
/// No wedge is injected with less time left (one takes about 5 s to heal
/// and recover).
const WEDGE_MIN_LEFT: Duration = Duration::from_secs(15);
/// RSS growth after warm-up that fails the soak.
const RSS_LIMIT_KIB: i64 = 1024;

/// `watch` healing through the helper under churn, for a while: fails on
/// RSS growth, fd growth or a lost snapshot.
#[derive(clap::Parser)]
#[command(name = "soak")]
struct Args {
    /// How long the soak runs (at least 30).
    #[arg(long, default_value_t = 600)]
    seconds: u64,
    /// Runner slots churned at once (1 to 50).
    #[arg(long, default_value_t = 4)]
    slots: usize,
    /// `watch`'s interval, in milliseconds.
    #[arg(long, default_value_t = 500)]
    interval_ms: u64,
    /// Seconds before RSS and fds are first measured (default: a third of
    /// the run, 20 to 120).
    #[arg(long)]
    warmup: Option<u64>,
    /// The fleet soak instead of the churn: SDK agents calling a TLS
    /// provider whose every call has a fate picked at random.
    #[arg(long)]
    fleet: bool,
    /// Fleet: agents per SDK (1 to 8).
    #[arg(long, default_value_t = 2)]
    per_sdk: usize,
    /// Fleet: the provider's seed (default: from the clock; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Fleet: the agents' `stall_after`, in milliseconds (1,000 to 60,000).
    #[arg(long, default_value_t = 5000)]
    stall_after_ms: u64,
}

fn parse_args() -> Args {
    let a: Args = clap::Parser::parse();
    if a.seconds < 30 || a.slots == 0 || a.slots > 50 || a.interval_ms == 0 {
        eprintln!("soak: --seconds must be at least 30, --slots 1 to 50, --interval-ms above 0");
        std::process::exit(2);
    }
    if a.per_sdk == 0 || a.per_sdk > 8 || !(1000..=60_000).contains(&a.stall_after_ms) {
        eprintln!("soak: --per-sdk must be 1 to 8, --stall-after-ms 1000 to 60000");
        std::process::exit(2);
    }
    a
}

/// What the churn did, summed over the slots.
#[derive(Default)]
struct Churn {
    started: u64,
    injected: u64,
    healed: u64,
    recovered: u64,
    exited: u64,
    /// Waits the end of the soak cut short (not failures).
    cut_short: u64,
    failures: Vec<String>,
}

/// What the watch printed, summed over its JSON lines.
#[derive(Default)]
struct Seen {
    lines: u64,
    verdicts: BTreeMap<String, u64>,
    /// Outcomes with a not-ok verdict (each must carry a snapshot).
    not_ok: u64,
    snapshot_ids: Vec<String>,
    /// Each snapshot id with the agent and verdict of every outcome that
    /// named it: a check that acts writes its own; one that does not may
    /// name its agent's last (a repeat within the same verdict).
    named_by: BTreeMap<String, Vec<(String, String)>>,
    snapshot_errors: Vec<String>,
    wedged_transitions: u64,
    actions_ok: u64,
    actions_failed: Vec<String>,
    no_ebpf: u64,
    bad_lines: u64,
}

/// One sample of a process.
#[derive(Clone)]
struct Sample {
    at: f64,
    /// `VmRSS`, `RssAnon` and `RssFile` ([`rss_of`]).
    rss_kib: u64,
    anon_kib: u64,
    file_kib: u64,
    fds: usize,
    /// What each fd is (`/proc/PID/fd/N` → target), to name a leak.
    open: BTreeMap<u32, String>,
    /// Where the resident memory is, every [`DETAIL_EVERY`]th sample.
    mem: Option<Mem>,
    /// The watch's history as saved, at the same samples (the watch only).
    census: Option<Census>,
}

/// Every this many samples (about 10 s apart), a sample also reads where
/// the memory is and counts the watch's history.
const DETAIL_EVERY: u64 = 10;

/// A process's resident memory by kind of mapping (`/proc/PID/smaps`):
/// the main heap (`[heap]`, brk), anonymous mappings (glibc's thread
/// arenas, large allocations, thread stacks) and the rest (the binary,
/// libraries, vdso), in KiB; and how many threads it runs.
#[derive(Clone, Copy, Default)]
struct Mem {
    heap_kib: u64,
    anon_kib: u64,
    other_kib: u64,
    threads: u64,
}

fn mem_of(pid: u32) -> Option<Mem> {
    use procfs::process::MMapPath;
    let p = procfs::process::Process::new(pid as i32).ok()?;
    let mut m = Mem {
        threads: p.status().ok()?.threads,
        ..Mem::default()
    };
    for map in p.smaps().ok()? {
        let kib = map.extension.map.get("Rss").copied().unwrap_or(0) / 1024;
        match map.pathname {
            MMapPath::Heap => m.heap_kib += kib,
            MMapPath::Anonymous | MMapPath::Stack | MMapPath::TStack(_) => m.anon_kib += kib,
            _ => m.other_kib += kib,
        }
    }
    Some(m)
}

/// `pid`'s resident memory in KiB (`/proc/PID/status`): all of it
/// (`VmRSS`), what it allocated (`RssAnon`: heap, arenas, stacks) and the
/// pages of the files it maps (`RssFile`: its binary and libraries, read
/// in as their code runs, dropped and read again under memory pressure).
fn rss_of(pid: u32) -> Option<(u64, u64, u64)> {
    let s = procfs::process::Process::new(pid as i32)
        .ok()?
        .status()
        .ok()?;
    Some((s.vmrss?, s.rssanon?, s.rssfile?))
}

/// What the watch's saved history holds, summed over its agents: the
/// records that could grow with time.
#[derive(Clone, Copy, Default)]
struct Census {
    bytes: u64,
    /// Heal actions of the last hour (`heal.actions`).
    actions: u64,
    /// Proof keepalives remembered (`judge.proofs`), answered peers,
    /// per-connection progress, suspect and pending sockets.
    proofs: u64,
    answered: u64,
    progress: u64,
    suspects: u64,
    pending: u64,
}

/// Reads `dir/state.json` (the store's envelope, its history in `data`).
fn census_of(dir: &Path) -> Option<Census> {
    let bytes = std::fs::read(dir.join(selfheal::store::STATE_FILE)).ok()?;
    let mut v: Value = serde_json::from_slice(&bytes).ok()?;
    let h: selfheal_core::history::History = serde_json::from_value(v["data"].take()).ok()?;
    let mut c = Census {
        bytes: bytes.len() as u64,
        ..Census::default()
    };
    for a in h.agents.values() {
        c.actions += a.heal.actions.len() as u64;
        c.proofs += a.judge.proofs.len() as u64;
        c.answered += a.judge.answered.len() as u64;
        c.progress += a.judge.progress.len() as u64;
        c.suspects += a.judge.suspect_since_ms.len() as u64;
        c.pending += a.judge.pending.len() as u64;
    }
    Some(c)
}

fn main() {
    let args = parse_args();
    if !is_root() {
        eprintln!("SKIPPED soak: needs root (network namespaces, nftables, the helper's eBPF)");
        std::process::exit(2);
    }
    let warmup = args
        .warmup
        .unwrap_or_else(|| (args.seconds / 3).clamp(20, 120));
    if warmup + 20 > args.seconds {
        eprintln!("soak: the warm-up ({warmup} s) leaves under 20 s to measure");
        std::process::exit(2);
    }
    if args.fleet {
        std::process::exit(fleet::run(&args, warmup));
    }
    let bench::Bins { selfheal, peer } = bench::Bins::find();
    for p in [&selfheal, &peer] {
        if !p.exists() {
            eprintln!(
                "soak: {} is missing (cargo build --release -p selfheal -p tests --bins)",
                p.display()
            );
            std::process::exit(2);
        }
    }
    let work = std::env::temp_dir().join(format!("selfheal-soak-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("work dir");

    let pair = Arc::new(NetnsPair::new("soak").unwrap_or_else(|e| {
        eprintln!("soak: cannot make the network namespaces: {e}");
        std::process::exit(2)
    }));
    let status = status_server();
    let config = work.join("config.toml");
    std::fs::write(&config, config_text(&pair.b_addr, args.slots, status)).expect("config");

    let Some((mut helper, mut watch)) =
        start_watch(&selfheal, None, &work, &config, args.interval_ms)
    else {
        std::process::exit(1);
    };
    let (watch_pid, helper_pid) = (watch.id(), helper.id());

    // The watch's JSON lines: counted here, routed to their slot.
    let mut routes = Vec::new();
    let mut inboxes = Vec::new();
    for _ in 0..args.slots {
        let (tx, rx) = mpsc::channel::<Value>();
        routes.push(tx);
        inboxes.push(rx);
    }
    let stdout = watch.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        read_watch(stdout, |o| {
            let slot = o["agent"]
                .as_str()
                .and_then(|a| a.strip_prefix("slot"))
                .and_then(|k| k.parse::<usize>().ok());
            if let Some(tx) = slot.and_then(|k| routes.get(k)) {
                let _ = tx.send(o);
            }
        })
    });

    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.seconds);
    let sampler = {
        let stop = deadline;
        let state_dir = work.join("state");
        std::thread::spawn(move || {
            sample(watch_pid, helper_pid, &state_dir, started, stop, || false)
        })
    };
    println!(
        "soak: {} s, {} agents churning, watch every {} ms with the helper, warm-up {warmup} s; work dir {}",
        args.seconds,
        args.slots,
        args.interval_ms,
        work.display()
    );

    let churn = Arc::new(Mutex::new(Churn::default()));
    let slots: Vec<_> = inboxes
        .into_iter()
        .enumerate()
        .map(|(k, inbox)| {
            let pair = Arc::clone(&pair);
            let churn = Arc::clone(&churn);
            let peer = peer.clone();
            std::thread::spawn(move || {
                // Out of phase: slot k starts k × 2.5 s in.
                sleep_until(started + Duration::from_millis(2500 * k as u64), deadline);
                slot(k, &pair, &peer, deadline, &inbox, &churn);
            })
        })
        .collect();
    for (k, s) in slots.into_iter().enumerate() {
        if s.join().is_err() {
            lock(&churn)
                .failures
                .push(format!("slot{k}: its driver panicked"));
        }
    }
    let samples = sampler.join().expect("sampler");
    let watch_alive = watch.try_wait().ok().flatten().is_none();
    let helper_alive = helper.try_wait().ok().flatten().is_none();
    // A snapshot appended after the last line the watch printed is not lost:
    // the watch was stopped between the two.
    let seen = stop_watch(&mut helper, &mut watch, reader);
    let logged = logged_snapshot_ids(&work.join("snapshots"));
    let transitions = wedged_transition_ids(&work.join("watch.log"));
    let churn = std::mem::take(&mut *lock(&churn));
    let ok = report(
        &args,
        warmup,
        &samples,
        &churn,
        &seen,
        &logged,
        &transitions,
        watch_alive,
        helper_alive,
    );
    drop(pair);
    if ok {
        let _ = std::fs::remove_dir_all(&work);
        println!("soak: PASS");
    } else {
        println!("soak: FAIL (logs kept in {})", work.display());
        std::process::exit(1);
    }
}

/// Starts `selfheal helper` and then `selfheal watch --json` healing
/// through it with `config` (inside `netns`, where its agents' probes
/// answer on loopback, or here), both writing into `work`; None (said
/// why) when the helper does not come up.
fn start_watch(
    selfheal: &Path,
    netns: Option<&tests::Netns>,
    work: &Path,
    config: &Path,
    interval_ms: u64,
) -> Option<(std::process::Child, std::process::Child)> {
    // The helper first: the watch connects to it once, when it starts.
    let sock = work.join("helper.sock");
    let helper_log = std::fs::File::create(work.join("helper.log")).expect("helper log");
    let mut helper = Command::new(selfheal)
        .args(["helper", "--socket"])
        .arg(&sock)
        .stdout(Stdio::null())
        .stderr(helper_log)
        .spawn()
        .expect("start the helper");
    if tests::wait_for(10 * SEC, Duration::from_millis(50), || {
        sock.exists().then_some(())
    })
    .is_none()
    {
        let _ = helper.kill();
        let _ = helper.wait();
        eprintln!("soak: the helper did not come up; see {}", work.display());
        return None;
    }
    let watch_log = std::fs::File::create(work.join("watch.log")).expect("watch log");
    let watch = netns
        .map_or_else(|| Command::new(selfheal), |n| n.command(selfheal))
        .args([
            "watch",
            "--json",
            "--interval",
            &format!("{interval_ms}ms"),
            "--config",
        ])
        .arg(config)
        .arg("--state-dir")
        .arg(work.join("state"))
        .arg("--snapshot-dir")
        .arg(work.join("snapshots"))
        .arg("--helper")
        .arg(&sock)
        .stdout(Stdio::piped())
        .stderr(watch_log)
        .spawn()
        .expect("start the watch");
    Some((helper, watch))
}

/// Stops the watch, then what `reader` read of it, then the helper
/// (SIGTERM, then SIGKILL after 5 s).
fn stop_watch(
    helper: &mut std::process::Child,
    watch: &mut std::process::Child,
    reader: std::thread::JoinHandle<Seen>,
) -> Seen {
    let _ = watch.kill();
    let _ = watch.wait();
    let seen = reader.join().expect("watch reader");
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(helper.id() as libc::pid_t, libc::SIGTERM) };
    let _ = tests::wait_for(5 * SEC, Duration::from_millis(50), || {
        helper.try_wait().ok().flatten()
    });
    let _ = helper.kill();
    let _ = helper.wait();
    seen
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn sleep_until(t: Instant, deadline: Instant) {
    let t = t.min(deadline);
    std::thread::sleep(t.saturating_duration_since(Instant::now()));
}

/// The watch's config: one agent per slot, its control upstream with a 1 s
/// heartbeat, a status probe, and a heal budget large enough for the churn.
fn config_text(b: &str, slots: usize, status: std::net::SocketAddr) -> String {
    let mut text = String::new();
    for k in 0..slots {
        let port = BASE_PORT + k as u16;
        text.push_str(&format!(
            "[[agent]]\nname = \"slot{k}\"\nmatch = {{ cmdline = \"recv-peer reconnecting {b}:{port}$\" }}\n\
             [[agent.upstream]]\nrole = \"control\"\naddr = \"{b}:{port}\"\nheartbeat = \"1s\"\n\
             [[agent.probe]]\nurl = \"http://{status}/status/{k}\"\nfields = {{ current_task = \"/current_task\" }}\n\
             [agent.thresholds]\nsuspect_after = \"2s\"\n\
             [agent.heal]\nstep_window = \"20s\"\nbackoff = \"1s\"\nmax_actions_per_hour = 10000\n"
        ));
    }
    text
}

/// One slot's churn until `deadline`. A wait that the deadline cuts short
/// is not a failure; one that runs out its own bound is.
fn slot(
    k: usize,
    pair: &NetnsPair,
    peer: &Path,
    deadline: Instant,
    inbox: &mpsc::Receiver<Value>,
    churn: &Mutex<Churn>,
) {
    let port = BASE_PORT + k as u16;
    let name = format!("slot{k}");
    let over = || Instant::now() >= deadline;
    let bound = |b: Duration| b.min(deadline.saturating_duration_since(Instant::now()));
    let fail = |why: String| {
        if over() {
            lock(churn).cut_short += 1;
        } else {
            lock(churn).failures.push(format!("{name}: {why}"));
        }
    };
    let server = || -> Option<Peer> {
        let mut cmd = pair.b.command(peer);
        cmd.args(["beats", &format!("{}:{port}", pair.b_addr), "300"]);
        let s = Peer::spawn(cmd);
        s.try_expect("listening", 10 * SEC).map(|_| s)
    };
    while !over() {
        // 1. start
        let Some(old_server) = server() else {
            fail("its server did not start".into());
            return;
        };
        let mut cmd = pair.a.command(peer);
        cmd.args(["reconnecting", &format!("{}:{port}", pair.b_addr)]);
        let runner = Peer::spawn(cmd);
        if runner.try_expect("ready ", 10 * SEC).is_none() {
            fail("its runner did not connect".into());
            return;
        }
        lock(churn).started += 1;
        if !wait_verdict(inbox, &name, bound(10 * SEC), |o| o["verdict"] == "idle") {
            fail("the watch never saw the new runner idle".into());
            continue;
        }
        std::thread::sleep(bound(SEC));
        if deadline.saturating_duration_since(Instant::now()) < WEDGE_MIN_LEFT {
            // No time for a whole wedge: idle until the end.
            std::thread::sleep(bound(WEDGE_MIN_LEFT));
            return;
        }

        // 2. wedge: the server vanishes without a FIN, a new one takes its port.
        if let Err(e) = pair.cut_port_in_b(port) {
            fail(format!("cannot cut port {port}: {e}"));
            return;
        }
        drop(old_server);
        let Some(new_server) = server() else {
            fail("its new server did not start".into());
            return;
        };
        lock(churn).injected += 1;
        let healed = wait_verdict(inbox, &name, bound(HEAL_BOUND), |o| {
            o["verdict"] == "wedged"
                && o["snapshot"].is_string()
                && o["heal"]["actions"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|a| a["ok"] == true))
        });
        if let Err(e) = pair.restore_port_in_b(port) {
            fail(format!("cannot restore port {port}: {e}"));
            return;
        }
        if !healed {
            fail(format!(
                "an injected wedge was not found and healed within {HEAL_BOUND:?}"
            ));
            continue;
        }
        lock(churn).healed += 1;

        // 3. the runner reconnects by itself, the watch sees it idle again.
        if runner.try_expect("ready ", bound(RECOVER_BOUND)).is_none() {
            fail(format!(
                "the healed runner did not reconnect within {RECOVER_BOUND:?}"
            ));
            continue;
        }
        if wait_verdict(inbox, &name, bound(10 * SEC), |o| o["verdict"] == "idle") {
            lock(churn).recovered += 1;
        } else {
            fail("the watch never saw the healed runner idle".into());
            continue;
        }
        std::thread::sleep(bound(SEC));

        // 4. exit
        drop(runner);
        drop(new_server);
        lock(churn).exited += 1;
        if !wait_verdict(inbox, &name, bound(10 * SEC), |o| o["verdict"] == "down") {
            fail("the watch never saw the runner gone".into());
        }
    }
}

/// Waits until the watch reports `agent` with an outcome that satisfies
/// `f`; outcomes before it are consumed.
fn wait_verdict(
    inbox: &mpsc::Receiver<Value>,
    agent: &str,
    timeout: Duration,
    f: impl Fn(&Value) -> bool,
) -> bool {
    let end = Instant::now() + timeout;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match inbox.recv_timeout(left) {
            Ok(o) if o["agent"] == agent && f(&o) => return true,
            Ok(_) => continue,
            Err(_) => return false,
        }
    }
}

/// Reads the watch's JSON lines until it exits: counts them and hands each
/// to `route`.
fn read_watch(stdout: impl std::io::Read, mut route: impl FnMut(Value)) -> Seen {
    let mut seen = Seen::default();
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        seen.lines += 1;
        let Ok(o) = serde_json::from_str::<Value>(&line) else {
            seen.bad_lines += 1;
            continue;
        };
        let verdict = o["verdict"].as_str().unwrap_or("?").to_string();
        *seen.verdicts.entry(verdict.clone()).or_default() += 1;
        if !matches!(verdict.as_str(), "healthy" | "idle" | "busy") {
            seen.not_ok += 1;
            match (o["snapshot"].as_str(), o["snapshot_error"].as_str()) {
                (Some(id), _) => {
                    seen.snapshot_ids.push(id.to_string());
                    seen.named_by.entry(id.to_string()).or_default().push((
                        o["agent"].as_str().unwrap_or("?").to_string(),
                        verdict.clone(),
                    ));
                }
                (None, e) => seen.snapshot_errors.push(format!(
                    "{} {verdict}: {}",
                    o["agent"],
                    e.unwrap_or("no snapshot and no error")
                )),
            }
        }
        if verdict == "wedged" && o.get("previous").is_some() {
            seen.wedged_transitions += 1;
        }
        for a in o["heal"]["actions"].as_array().into_iter().flatten() {
            if a["ok"] == true {
                seen.actions_ok += 1;
            } else {
                seen.actions_failed.push(a["detail"].to_string());
            }
        }
        if o["gaps"].as_array().is_some_and(|g| {
            g.iter()
                .any(|g| g.as_str().is_some_and(|g| g.contains("no eBPF evidence")))
        }) {
            seen.no_ebpf += 1;
        }
        route(o);
    }
    seen
}

/// Samples both processes about every second until `stop`, or until
/// `halted` says so; every [`DETAIL_EVERY`]th sample also where their
/// memory is and what the watch's history in `state_dir` holds.
fn sample(
    watch: u32,
    helper: u32,
    state_dir: &Path,
    started: Instant,
    stop: Instant,
    halted: impl Fn() -> bool,
) -> [Vec<Sample>; 2] {
    let mut out = [Vec::new(), Vec::new()];
    // From a second in: a process just started has not mapped its binary.
    std::thread::sleep(SEC);
    let mut k: u64 = 0;
    while Instant::now() + SEC < stop && !halted() {
        // 0.7 to 1.3 s apart, never in step with the watch's interval: a
        // fixed period locks onto one phase of the check, and a floor taken
        // in the middle of every check would look like a leak.
        k += 1;
        std::thread::sleep(Duration::from_millis(700 + (k * 379) % 600));
        let at = started.elapsed().as_secs_f64();
        let detail = k.is_multiple_of(DETAIL_EVERY);
        for (i, pid) in [watch, helper].into_iter().enumerate() {
            if let (Some((rss_kib, anon_kib, file_kib)), Some(open)) = (rss_of(pid), open_fds(pid))
            {
                out[i].push(Sample {
                    at,
                    rss_kib,
                    anon_kib,
                    file_kib,
                    fds: open.len(),
                    open,
                    mem: detail.then(|| mem_of(pid)).flatten(),
                    census: (detail && i == 0).then(|| census_of(state_dir)).flatten(),
                });
            }
        }
    }
    out
}

/// Ids of every record in the snapshot logs: each agent's
/// (`snapshots.NAME-HASH.jsonl`) and the shared one of older versions,
/// current and rotated files.
fn logged_snapshot_ids(dir: &Path) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with("snapshots.") && name.contains(".jsonl")) {
            continue;
        }
        let Ok(f) = std::fs::File::open(entry.path()) else {
            continue;
        };
        for line in BufReader::new(f).lines().map_while(Result::ok) {
            if let Some(id) = serde_json::from_str::<Value>(&line)
                .ok()
                .and_then(|v| v["id"].as_str().map(str::to_string))
            {
                ids.insert(id);
            }
        }
    }
    ids
}

/// The snapshot ids of the `-> wedged` transitions in the watch's log stream.
fn wedged_transition_ids(log: &Path) -> Vec<Option<String>> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(" -> wedged"))
        .map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("snapshot="))
                .map(str::to_string)
        })
        .collect()
}

/// Median of `v`'s values (`v` not empty).
fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// Prints, about every 10 s, where the watch's and the helper's memory
/// is and what the watch's history holds: whether a growth levels off,
/// and what grows with it.
fn timeline(samples: &[Vec<Sample>; 2]) {
    println!(
        "{:>5} | {:>7} {:>6} {:>6} {:>6} {:>3} | {:>7} {:>7} {:>6} {:>8} {:>6} {:>8} {:>5} | {:>7} {:>6} {:>6} {:>3}",
        "t s",
        "watch",
        "heap",
        "anon",
        "other",
        "thr",
        "state B",
        "actions",
        "proofs",
        "answered",
        "progr",
        "suspects",
        "pend",
        "helper",
        "heap",
        "anon",
        "thr"
    );
    for w in &samples[0] {
        let Some(wm) = w.mem else { continue };
        let c = w.census.unwrap_or_default();
        let h = samples[1].iter().find(|h| h.at == w.at);
        let hm = h.and_then(|h| h.mem).unwrap_or_default();
        println!(
            "{:>5.0} | {:>7} {:>6} {:>6} {:>6} {:>3} | {:>7} {:>7} {:>6} {:>8} {:>6} {:>8} {:>5} | {:>7} {:>6} {:>6} {:>3}",
            w.at,
            w.rss_kib,
            wm.heap_kib,
            wm.anon_kib,
            wm.other_kib,
            wm.threads,
            c.bytes,
            c.actions,
            c.proofs,
            c.answered,
            c.progress,
            c.suspects,
            c.pending,
            h.map_or(0, |h| h.rss_kib),
            hm.heap_kib,
            hm.anon_kib,
            hm.threads
        );
    }
    println!(
        "(RSS in KiB: heap is [heap], anon the anonymous mappings: thread arenas, large allocations, stacks)"
    );
}

/// Prints the watch's and the helper's RSS and fds after `warmup`; what
/// failed.
fn usage(
    warmup: u64,
    samples: &[Vec<Sample>; 2],
    watch_alive: bool,
    helper_alive: bool,
) -> Vec<String> {
    let mut failures = Vec::new();
    println!();
    timeline(samples);
    println!(
        "{:<16} {:>9} {:>9} {:>9} {:>9} {:>9} {:>11} {:>11} {:>8} {:>8} {:>8}",
        "process",
        "rss start",
        "rss warm",
        "rss end",
        "rss max",
        "growth",
        "anon growth",
        "file growth",
        "fds warm",
        "fds end",
        "fds max"
    );
    for (name, s, alive) in [
        ("selfheal watch", &samples[0], watch_alive),
        ("selfheal helper", &samples[1], helper_alive),
    ] {
        if !alive {
            failures.push(format!("{name} exited during the soak"));
        }
        let after: Vec<&Sample> = s.iter().filter(|x| x.at >= warmup as f64).collect();
        if after.len() < 10 {
            failures.push(format!(
                "{name}: only {} samples after the warm-up",
                after.len()
            ));
            continue;
        }
        // Medians of the first and last five samples after the warm-up: a
        // leak moves the level, a single allocation peak does not.
        let n = 5.min(after.len() / 2);
        let growth_of = |f: fn(&Sample) -> u64| {
            let warm = median(after[..n].iter().map(|x| f(x)).collect());
            let end = median(after[after.len() - n..].iter().map(|x| f(x)).collect());
            (warm, end, end as i64 - warm as i64)
        };
        let (warm, end, growth) = growth_of(|x| x.rss_kib);
        let (anon_warm, anon_end, anon_growth) = growth_of(|x| x.anon_kib);
        let (_, _, file_growth) = growth_of(|x| x.file_kib);
        let max = after.iter().map(|x| x.rss_kib).max().unwrap_or(0);
        // The fd floor: a leak raises the fewest fds the process ever holds;
        // descriptors open during a check come and go.
        let q = (after.len() / 4).max(1);
        let fds_warm = after[..q].iter().map(|x| x.fds).min().unwrap_or(0);
        let fds_end = after[after.len() - q..]
            .iter()
            .map(|x| x.fds)
            .min()
            .unwrap_or(0);
        let fds_max = after.iter().map(|x| x.fds).max().unwrap_or(0);
        println!(
            "{name:<16} {:>6} KiB {warm:>5} KiB {end:>5} KiB {max:>5} KiB {growth:>+5} KiB {anon_growth:>+7} KiB {file_growth:>+7} KiB {fds_warm:>8} {fds_end:>8} {fds_max:>8}",
            s.first().map_or(0, |x| x.rss_kib),
        );
        // What the process allocated is what a leak grows: its anonymous
        // memory. The pages of its binary (RssFile) are read in as code
        // first runs and dropped and read again as the kernel needs memory:
        // they move the RSS with no allocation at all, and never past the
        // size of what is mapped.
        if anon_growth >= RSS_LIMIT_KIB {
            failures.push(format!(
                "{name}: its anonymous memory (RssAnon: heap, arenas, stacks) grew {anon_growth} KiB after the warm-up, {anon_warm} to {anon_end} KiB (limit {RSS_LIMIT_KIB} KiB; RSS {growth:+} KiB, file pages {file_growth:+} KiB)"
            ));
        }
        if fds_end > fds_warm {
            // Name what the extra descriptors are: held in every late sample,
            // in none of the early samples with the fewest.
            let early = after[..q]
                .iter()
                .find(|x| x.fds == fds_warm)
                .map(|x| &x.open);
            let late = &after[after.len() - q..];
            let extra: Vec<String> = late[0]
                .open
                .iter()
                .filter(|(n, t)| {
                    late.iter().all(|x| x.open.get(n) == Some(t))
                        && early.is_none_or(|e| e.get(n) != Some(t))
                })
                .map(|(n, t)| format!("{n} -> {t}"))
                .collect();
            failures.push(format!(
                "{name}: open fds grew from {fds_warm} to {fds_end} after the warm-up; held since: {}",
                if extra.is_empty() {
                    "(none held throughout: a different one each time)".to_string()
                } else {
                    extra.join(", ")
                }
            ));
        }
    }
    // What the watch's history kept from the warm-up to the end: the
    // records that grow with heals and connections (each within its own
    // window: an hour of actions, ten minutes of proofs).
    let census: Vec<(f64, Census)> = samples[0]
        .iter()
        .filter(|x| x.at >= warmup as f64)
        .filter_map(|x| Some((x.at, x.census?)))
        .collect();
    if let (Some((t0, a)), Some((t1, b))) = (census.first(), census.last()) {
        println!(
            "watch history {t0:.0} s → {t1:.0} s: state {} → {} bytes, heal actions {} → {}, proofs {} → {}, progress records {} → {}",
            a.bytes, b.bytes, a.actions, b.actions, a.proofs, b.proofs, a.progress, b.progress
        );
    }
    failures
}

/// Prints what the watch printed and the snapshots it wrote over
/// `seconds` with `agents` agents; what failed.
fn watched(
    seconds: u64,
    agents: usize,
    seen: &Seen,
    logged: &BTreeSet<String>,
    transitions: &[Option<String>],
) -> Vec<String> {
    let mut failures = Vec::new();
    let verdicts: Vec<String> = seen
        .verdicts
        .iter()
        .map(|(v, n)| format!("{v} {n}"))
        .collect();
    println!(
        "watch: {} outcome lines over {} s ({}), {} wedged transitions, {} heal actions ok, {} failed",
        seen.lines,
        seconds,
        verdicts.join(", "),
        seen.wedged_transitions,
        seen.actions_ok,
        seen.actions_failed.len()
    );
    let reported: BTreeSet<&String> = seen.snapshot_ids.iter().collect();
    let missing: Vec<&&String> = reported
        .iter()
        .filter(|id| !logged.contains(**id))
        .collect();
    let unreported = logged.len().saturating_sub(reported.len());
    let transitions_missing = transitions
        .iter()
        .filter(|id| id.as_ref().is_none_or(|id| !logged.contains(id)))
        .count();
    println!(
        "snapshots: {} not-ok outcomes, {} with a snapshot id, {} records in the log; {} reported ids missing from the log, {} without a snapshot, {} logged after the last line read; {} `-> wedged` log lines, {} of them without their snapshot in the log",
        seen.not_ok,
        seen.snapshot_ids.len(),
        logged.len(),
        missing.len(),
        seen.snapshot_errors.len(),
        unreported,
        transitions.len(),
        transitions_missing
    );
    if seen.no_ebpf > 0 {
        println!(
            "note: {} outcomes had no eBPF evidence from the helper",
            seen.no_ebpf
        );
    }
    if seen.bad_lines > 0 {
        failures.push(format!("{} watch lines were not JSON", seen.bad_lines));
    }
    let repeats = seen.snapshot_ids.len() - reported.len();
    if repeats > 0 {
        println!("{repeats} outcomes named their agent's last snapshot (a repeat of one verdict)");
    }
    let shared: Vec<&String> = seen
        .named_by
        .iter()
        .filter(|(_, by)| {
            by.iter().any(|b| b != &by[0]) || by.iter().filter(|(_, v)| v == "wedged").count() > 1
        })
        .map(|(id, _)| id)
        .collect();
    if !shared.is_empty() {
        failures.push(format!(
            "a snapshot id was reported for two agents, two verdicts or two wedged checks: {shared:?}"
        ));
    }
    if !missing.is_empty() {
        failures.push(format!(
            "{} reported snapshot ids are not in the log, e.g. {}",
            missing.len(),
            missing[0]
        ));
    }
    for e in seen.snapshot_errors.iter().take(5) {
        failures.push(format!("a not-ok verdict without its snapshot: {e}"));
    }
    // Only the check the watch was killed in may have logged unreported
    // snapshots: at most one per agent.
    if unreported > agents {
        failures.push(format!(
            "{unreported} snapshots in the log were never reported"
        ));
    }
    if transitions.len() as u64 != seen.wedged_transitions {
        failures.push(format!(
            "{} `-> wedged` log lines against {} wedged transitions reported",
            transitions.len(),
            seen.wedged_transitions
        ));
    }
    if transitions_missing > 0 {
        failures.push(format!(
            "{transitions_missing} `-> wedged` transitions without their snapshot in the log"
        ));
    }
    for f in seen.actions_failed.iter().take(5) {
        failures.push(format!("a heal action failed: {f}"));
    }
    failures
}

/// Prints the summary; `true` when everything held.
#[expect(
    clippy::too_many_arguments,
    reason = "one summary of everything measured"
)]
fn report(
    args: &Args,
    warmup: u64,
    samples: &[Vec<Sample>; 2],
    churn: &Churn,
    seen: &Seen,
    logged: &BTreeSet<String>,
    transitions: &[Option<String>],
    watch_alive: bool,
    helper_alive: bool,
) -> bool {
    let mut failures: Vec<String> = churn.failures.clone();
    failures.extend(usage(warmup, samples, watch_alive, helper_alive));
    println!();
    println!(
        "churn: {} runners started, {} wedges injected, {} found and healed, {} recovered, {} exits ({} waits cut short by the end)",
        churn.started, churn.injected, churn.healed, churn.recovered, churn.exited, churn.cut_short
    );
    if churn.injected == 0 {
        failures.push("no wedge was injected: the soak was too short".into());
    }
    failures.extend(watched(args.seconds, args.slots, seen, logged, transitions));
    if churn.healed + churn.cut_short < churn.injected {
        failures.push("not every injected wedge was healed".into());
    }
    for f in &failures {
        println!("FAILED: {f}");
    }
    failures.is_empty()
}
