//! `soak --fleet`: a fleet of real SDK agents calling, in a loop, a TLS
//! provider that picks every call's fate at random, under `selfheal watch`
//! healing through `selfheal helper`, for a bounded time.
//!
//! Two network namespaces joined by a veth: the agents in `a`; in `b` the
//! testbed's provider (`selfheal-testbed provider --seed S`) behind its TLS
//! edge (`selfheal-testbed proxy --tls-cert`), whose CA (made for the run
//! with the `openssl` command) the agents trust through their own
//! environment (`SSL_CERT_FILE`, `NODE_EXTRA_CA_CERTS`). `--per-sdk`
//! agents of each SDK: Python `AsyncOpenAI`, sync `Anthropic`, `litellm`
//! (`tests/py/sdk_runner.py`), Node `openai` and `@anthropic-ai/sdk`
//! (`tests/node/sdk_runner.mjs`),
//! each one long-running process streaming one call after another with
//! `max_retries` 0, its model `fleet-MS-agent-NAME-call-{n}`: the provider
//! picks the fate from the name and its seed (the provider's `Fate`) and
//! says it with the call's name, so every call's fate is matched to what
//! its SDK printed of it. The fates: quick; silent thinking past
//! `stall_after`, then the answer; pings for three fifths of it, then the
//! answer; a word every three fifths of it, past it; a cut (the provider
//! says `cut` and goes silent, and the soak drops the connection's packets
//! both ways in `b` with nft: the peer vanishes without a FIN or RST); a
//! stall behind pings for an hour.
//!
//! Passes when: every call of a fate that answers (quick, thinking, pings
//! then the answer, slow content) was done, none failed; no heal touched an
//! agent while only such a call was in flight (a false heal); no check
//! said `down` of an agent whose process ran (a false `down`: any outcome
//! but the first read after the process started, while it runs); every cut
//! and every stall failed in its SDK within its bound from the fault (the
//! cut, or the stall's first ping); every fate had a call that ended as
//! it must; every agent's process is the one started (its pid kept); and
//! the watch and helper held as in the churn soak (memory,
//! fds, snapshots, heal actions, both running). The bounds come from the
//! longest gap measured between two checks of the watch (`tick`: its
//! interval, or a check's own run when longer): a stall `stall_after` + 3
//! ticks (two intervals and the check that finds it), a cut the proof's
//! `suspect_after` + idle + count × interval + 3 ticks.
//!
//! The watch's outcomes of an agent are counted by reason from its first
//! call after its `ready` line; those before it (the agent starting:
//! importing its SDK, its status port not yet up) are start-up outcomes,
//! counted and printed apart.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use selfheal_testbed::{
    provider::Fate,
    scenario::{PROOF, make_certs, node_sdk_runner, sdk_runner},
};
use serde_json::Value;
use tests::NetnsPair;

use super::{
    Args, SEC, logged_snapshot_ids, read_watch, sample, start_watch, stop_watch, usage, watched,
    wedged_transition_ids,
};

/// The proof the agents configure (the SDK scenarios' [`PROOF`]): silent
/// this long, then probes this far apart, this many.
const SUSPECT_AFTER: Duration = Duration::from_secs(2);
const PROOF_IDLE: Duration = Duration::from_secs(1);
const PROOF_INTERVAL: Duration = Duration::from_secs(1);
const PROOF_COUNT: u32 = 3;
/// Where the provider listens (loopback of `b`) and its TLS edge (`b`'s
/// address).
const PROVIDER_PORT: u16 = 9080;
const EDGE_PORT: u16 = 9443;
/// The first agent's status port (loopback of `a`).
const STATUS_PORT: u16 = 9200;
/// How long a cut connection's port stays in the drop set at most (it
/// leaves it when its call ends).
const CUT_TIMEOUT: Duration = Duration::from_secs(180);

/// Set by SIGINT or SIGTERM: the soak stops, cleans up and fails.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// One SDK of the fleet: its name in agent names, the runner and its `--sdk`.
#[derive(Clone, Copy)]
struct Sdk {
    tag: &'static str,
    node: bool,
    sdk: &'static str,
    anthropic: bool,
}

const SDKS: [Sdk; 5] = [
    Sdk {
        tag: "aopenai",
        node: false,
        sdk: "openai-async",
        anthropic: false,
    },
    Sdk {
        tag: "anthropic",
        node: false,
        sdk: "anthropic",
        anthropic: true,
    },
    Sdk {
        tag: "litellm",
        node: false,
        sdk: "litellm",
        anthropic: false,
    },
    Sdk {
        tag: "nodeopenai",
        node: true,
        sdk: "openai",
        anthropic: false,
    },
    Sdk {
        tag: "nodeanthropic",
        node: true,
        sdk: "anthropic",
        anthropic: true,
    },
];

/// A child process, killed on drop; its stdout lines go to the soak's
/// channel, stamped when read.
struct Proc {
    child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where a line came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Src {
    Provider,
    Edge,
    Agent(usize),
}

enum Event {
    Line(Src, String),
    Watch(Value),
}

type Tx = mpsc::Sender<(Instant, Event)>;

fn spawn(mut cmd: Command, from: Src, tx: &Tx, log: &Path) -> Result<Proc, String> {
    let what = format!("{cmd:?}");
    let err = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot start {what}: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let tx = tx.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send((Instant::now(), Event::Line(from, line))).is_err() {
                break;
            }
        }
    });
    Ok(Proc { child })
}

/// One call as its agent, the provider and the soak saw it.
#[derive(Default)]
struct Call {
    fate: Option<Fate>,
    start: Option<Instant>,
    /// The cut, or a stall's first ping (a ping period after the
    /// provider's call line: the head and first event go out at once, then
    /// only pings; a stall is counted from its first keepalive).
    fault: Option<Instant>,
    /// The client's port dropped for a cut.
    cut_port: Option<u16>,
    end: Option<(Instant, Result<u64, String>)>,
}

/// `(agent, call)` of a fleet model `fleet-MS-agent-NAME-call-N`.
fn call_of(model: &str, names: &[String]) -> Option<(usize, u64)> {
    let words: Vec<&str> = model.split('-').collect();
    let after = |w: &str| {
        words
            .windows(2)
            .find(|p| p[0] == w)
            .map(|p| p[1].to_string())
    };
    let agent = names
        .iter()
        .position(|n| Some(n) == after("agent").as_ref())?;
    Some((agent, after("call")?.parse().ok()?))
}

/// The value of `key=` in a line of words.
fn field<'l>(line: &'l str, key: &str) -> Option<&'l str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// Runs the fleet soak; the exit code (0 passed, 1 failed, 2 cannot run).
pub fn run(args: &Args, warmup: u64) -> i32 {
    match Fleet::set_up(args) {
        Ok(fleet) => fleet.soak(args, warmup),
        Err(_) if STOP.load(Ordering::Relaxed) => {
            eprintln!("soak --fleet: interrupted while setting up");
            1
        }
        Err(e) => {
            eprintln!("soak --fleet: cannot run here: {e}");
            2
        }
    }
}

struct Fleet {
    pair: NetnsPair,
    work: PathBuf,
    selfheal: PathBuf,
    names: Vec<String>,
    /// Each agent's SDK (its tag).
    sdks: Vec<&'static str>,
    seed: u64,
    stall_after: Duration,
    /// The provider and its edge, then the agents (dropped last to first).
    servers: Vec<Proc>,
    agents: Vec<Proc>,
    /// When each agent's process was started.
    spawned: Vec<Instant>,
    /// The agents' commands and logs, started once the watch runs.
    to_start: Vec<(Command, PathBuf)>,
    /// Lines read while waiting for others, handled first.
    pending: Vec<(Instant, Event)>,
    rx: mpsc::Receiver<(Instant, Event)>,
    tx: Tx,
}

impl Fleet {
    /// Everything but the watch: namespaces, certificates, the drop set,
    /// the provider and its edge, the agents; what is missing when it
    /// cannot run here.
    fn set_up(args: &Args) -> Result<Fleet, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let dir = exe.parent().ok_or("no directory")?;
        let selfheal =
            std::env::var("SELFHEAL_BIN").map_or_else(|_| dir.join("selfheal"), PathBuf::from);
        let testbed = dir.join("selfheal-testbed");
        for p in [&selfheal, &testbed] {
            if !p.exists() {
                return Err(format!(
                    "{} is missing (cargo build --release -p selfheal -p selfheal-testbed)",
                    p.display()
                ));
            }
        }
        let (python, py) = sdk_runner().map_err(|e| format!("{e:#}"))?;
        let (node, mjs) = node_sdk_runner().map_err(|e| format!("{e:#}"))?;
        // SAFETY: the handler only stores to an atomic.
        unsafe {
            let handler = on_signal as extern "C" fn(libc::c_int);
            libc::signal(libc::SIGINT, handler as libc::sighandler_t);
            libc::signal(libc::SIGTERM, handler as libc::sighandler_t);
        }
        let work = std::env::temp_dir().join(format!("selfheal-fleet-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
        let pair = NetnsPair::new("flt")?;
        let b_ip: std::net::IpAddr = pair.b_addr.parse().map_err(|e| format!("{e}"))?;
        let (ca, cert, key) =
            make_certs(&work.join("tls"), &[b_ip]).map_err(|e| format!("{e:#}"))?;
        // The cut: a set of client ports whose packets `b` drops both ways.
        pair.b
            .nft(&format!(
                "table inet selfheal_fleet {{\n set cut {{ type inet_service; flags timeout; }}\n \
                 chain input {{ type filter hook input priority 0; tcp dport {EDGE_PORT} tcp sport @cut drop; }}\n \
                 chain output {{ type filter hook output priority 0; tcp sport {EDGE_PORT} tcp dport @cut drop; }}\n}}\n"
            ))
            .map_err(|e| format!("nft: {e:#}"))?;
        let (tx, rx) = mpsc::channel();
        let seed = args.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos().into())
        });
        let upstream = SocketAddr::from(([127, 0, 0, 1], PROVIDER_PORT));
        let edge = SocketAddr::new(b_ip, EDGE_PORT);
        let mut servers = Vec::new();
        let mut cmd = pair.b.command(&testbed);
        cmd.args(["provider", "--listen", &upstream.to_string()])
            .args(["--seed", &seed.to_string()]);
        servers.push(spawn(cmd, Src::Provider, &tx, &work.join("provider.log"))?);
        let mut cmd = pair.b.command(&testbed);
        cmd.args(["proxy", "--listen", &edge.to_string()])
            .args(["--upstream", &upstream.to_string()])
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key);
        servers.push(spawn(cmd, Src::Edge, &tx, &work.join("edge.log"))?);
        let mut fleet = Fleet {
            pair,
            work,
            selfheal,
            names: Vec::new(),
            sdks: Vec::new(),
            seed,
            stall_after: Duration::from_millis(args.stall_after_ms),
            servers,
            agents: Vec::new(),
            spawned: Vec::new(),
            to_start: Vec::new(),
            pending: Vec::new(),
            rx,
            tx,
        };
        fleet.wait_lines(2, |from, l| {
            matches!(from, Src::Provider | Src::Edge) && l.starts_with("listening")
        })?;
        let mut config = String::new();
        for sdk in SDKS {
            for i in 0..args.per_sdk {
                let k = fleet.names.len();
                let name = format!("{}{i}", sdk.tag);
                let status = SocketAddr::from(([127, 0, 0, 1], STATUS_PORT + k as u16));
                let (program, script) = if sdk.node {
                    (&node, &mjs)
                } else {
                    (&python, &py)
                };
                let base = if sdk.anthropic {
                    format!("https://{edge}")
                } else {
                    format!("https://{edge}/v1")
                };
                let mut cmd = fleet.pair.a.command(program);
                cmd.env("SSL_CERT_FILE", &ca)
                    .env("NODE_EXTRA_CA_CERTS", &ca)
                    .arg(script)
                    .args(["--name", &name, "--sdk", sdk.sdk, "--base-url", &base])
                    .args(["--status", &status.to_string()])
                    .args([
                        "--model",
                        &format!("fleet-{}-agent-{name}-call-{{n}}", args.stall_after_ms),
                    ]);
                let log = fleet.work.join(format!("{name}.log"));
                fleet.to_start.push((cmd, log));
                let file = script
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                config.push_str(&format!(
                    "[[agent]]\nname = \"{name}\"\nmatch = {{ cmdline = \"{file} --name {name} \" }}\n\
                     [[agent.upstream]]\nrole = \"provider\"\naddr = \"{edge}\"\nstall_after = \"{}ms\"\n\
                     [[agent.probe]]\nurl = \"http://{status}/status\"\ntimeout = \"1s\"\n\
                     [agent.thresholds]\nsuspect_after = \"{}ms\"\nrecv_blocked = \"{}ms\"\n\
                     [agent.heal]\nstep_window = \"5s\"\nbackoff = \"1s\"\nmax_actions_per_hour = 10000\n{PROOF}",
                    args.stall_after_ms,
                    SUSPECT_AFTER.as_millis(),
                    SUSPECT_AFTER.as_millis(),
                ));
                fleet.names.push(name);
                fleet.sdks.push(sdk.tag);
            }
        }
        std::fs::write(fleet.work.join("config.toml"), config).map_err(|e| e.to_string())?;
        Ok(fleet)
    }

    /// Reads lines until `n` satisfy `f` (within 60 s: litellm imports
    /// slowly on a loaded machine); every line read is kept for
    /// [`Fleet::handle`].
    fn wait_lines(&mut self, n: usize, f: impl Fn(Src, &str) -> bool) -> Result<(), String> {
        let end = Instant::now() + 60 * SEC;
        let mut seen = 0;
        while seen < n {
            let left = end.saturating_duration_since(Instant::now());
            if STOP.load(Ordering::Relaxed) {
                return Err("interrupted".into());
            }
            match self.rx.recv_timeout(left.min(SEC)) {
                Ok((at, e)) => {
                    if matches!(&e, Event::Line(from, l) if f(*from, l)) {
                        seen += 1;
                    }
                    self.pending.push((at, e));
                }
                Err(mpsc::RecvTimeoutError::Timeout) if !left.is_zero() => {}
                Err(_) => {
                    return Err(format!(
                        "{seen} of {n} programs came up within 60 s (logs in {})",
                        self.work.display()
                    ));
                }
            }
        }
        Ok(())
    }

    fn nft(&self, rules: &str) -> Result<(), String> {
        self.pair.b.nft(rules).map_err(|e| format!("{e:#}"))
    }

    /// The soak proper, then the report; the exit code.
    fn soak(mut self, args: &Args, warmup: u64) -> i32 {
        let config = self.work.join("config.toml");
        let Some((mut helper, mut watch)) = start_watch(
            &self.selfheal,
            Some(&self.pair.a),
            &self.work,
            &config,
            args.interval_ms,
        ) else {
            return 1;
        };
        let (watch_pid, helper_pid) = (watch.id(), helper.id());
        let Some(stdout) = watch.stdout.take() else {
            let _ = watch.kill();
            let _ = helper.kill();
            return 1;
        };
        let reader = {
            let tx = self.tx.clone();
            std::thread::spawn(move || {
                read_watch(stdout, |o| {
                    let _ = tx.send((Instant::now(), Event::Watch(o)));
                })
            })
        };
        // The agents, once the watch runs; each says `ready` when its SDK
        // is imported and its loop on.
        let mut early = None;
        for (k, (cmd, log)) in std::mem::take(&mut self.to_start).into_iter().enumerate() {
            let at = Instant::now();
            match spawn(cmd, Src::Agent(k), &self.tx, &log) {
                Ok(p) => {
                    self.agents.push(p);
                    self.spawned.push(at);
                }
                Err(e) => {
                    eprintln!("soak --fleet: {e}");
                    early = Some(2);
                    break;
                }
            }
        }
        let n = self.names.len();
        if early.is_none()
            && let Err(e) = self.wait_lines(n, |from, l| {
                matches!(from, Src::Agent(_)) && l.starts_with("ready")
            })
        {
            eprintln!(
                "soak --fleet: the agents: {e} (logs in {})",
                self.work.display()
            );
            early = Some(1);
        }
        if let Some(code) = early {
            stop_watch(&mut helper, &mut watch, reader);
            return code;
        }
        let mut run = Run::default();
        for (at, e) in std::mem::take(&mut self.pending) {
            self.handle(&mut run, at, e);
        }
        let started = Instant::now();
        let deadline = started + Duration::from_secs(args.seconds);
        let state_dir = self.work.join("state");
        let sampler = std::thread::spawn(move || {
            sample(watch_pid, helper_pid, &state_dir, started, deadline, || {
                STOP.load(Ordering::Relaxed)
            })
        });
        println!(
            "soak --fleet: {} s, {} agents ({} per SDK), provider seed {}, stall_after {} ms, watch every {} ms with the helper, warm-up {warmup} s; work dir {}",
            args.seconds,
            self.names.len(),
            args.per_sdk,
            self.seed,
            self.stall_after.as_millis(),
            args.interval_ms,
            self.work.display()
        );
        while Instant::now() < deadline && !STOP.load(Ordering::Relaxed) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left.min(Duration::from_millis(200))) {
                Ok((at, e)) => self.handle(&mut run, at, e),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let interrupted = STOP.load(Ordering::Relaxed);
        let samples = sampler.join().unwrap_or_default();
        let watch_alive = watch.try_wait().ok().flatten().is_none();
        let helper_alive = helper.try_wait().ok().flatten().is_none();
        let pids_kept: Vec<bool> = self
            .agents
            .iter_mut()
            .map(|p| p.child.try_wait().ok().flatten().is_none())
            .collect();
        let seen = stop_watch(&mut helper, &mut watch, reader);
        let logged = logged_snapshot_ids(&self.work.join("snapshots"));
        let transitions = wedged_transition_ids(&self.work.join("watch.log"));
        let mut failures = usage(warmup, &samples, watch_alive, helper_alive);
        failures.extend(watched(
            args.seconds,
            self.names.len(),
            &seen,
            &logged,
            &transitions,
        ));
        // Interrupted, the calls are judged at the stop, not the deadline.
        failures.extend(self.report(&run, &pids_kept, Instant::now().min(deadline)));
        if interrupted {
            failures.push("interrupted (SIGINT or SIGTERM)".into());
        }
        for f in &failures {
            println!("FAILED: {f}");
        }
        // Agents first, then the provider and edge, then the namespaces.
        self.agents.clear();
        self.servers.clear();
        if failures.is_empty() {
            let _ = std::fs::remove_dir_all(&self.work);
            println!("soak --fleet: PASS");
            0
        } else {
            println!("soak --fleet: FAIL (logs kept in {})", self.work.display());
            1
        }
    }

    /// Cuts call `key`'s connection, whose client port is `port`: `b`
    /// drops its packets both ways from now on.
    fn cut(&self, run: &mut Run, key: (usize, u64), port: u16) {
        let added = self.nft(&format!(
            "add element inet selfheal_fleet cut {{ {port} timeout {}s }}\n",
            CUT_TIMEOUT.as_secs()
        ));
        let call = run.calls.entry(key).or_default();
        match added {
            Ok(()) => {
                call.fault = Some(Instant::now());
                call.cut_port = Some(port);
            }
            Err(e) => run.failures.push(format!("cannot cut port {port}: {e}")),
        }
    }

    fn handle(&mut self, run: &mut Run, at: Instant, e: Event) {
        match e {
            Event::Line(Src::Edge, l) => {
                let (from, via) = (field(&l, "from"), field(&l, "via"));
                let port = from
                    .and_then(|f| f.parse::<SocketAddr>().ok())
                    .map(|a| a.port());
                match (l.split_whitespace().next(), via, port) {
                    (Some("forwarding"), Some(via), Some(port)) => {
                        run.vias.insert(via.to_string(), port);
                        if let Some(key) = run.cuts_waiting.remove(via) {
                            self.cut(run, key, port);
                        }
                    }
                    (Some("closed"), Some(via), _) => {
                        run.vias.remove(via.trim_end_matches(':'));
                    }
                    _ => {}
                }
            }
            Event::Line(Src::Provider, l) => {
                let Some(key) = field(&l, "model").and_then(|m| call_of(m, &self.names)) else {
                    return;
                };
                if l.starts_with("call ") {
                    let fate = field(&l, "fate").and_then(Fate::parse);
                    let call = run.calls.entry(key).or_default();
                    call.fate = fate;
                    if fate == Some(Fate::Stall) {
                        // Its first ping, one ping period after the call
                        // line: a stall is counted from its first keepalive.
                        let ping = Fate::Stall.pacing(self.stall_after).ping;
                        call.fault = Some(at + ping.unwrap_or_default());
                    }
                } else if l.starts_with("cut ") {
                    let Some(peer) = field(&l, "peer") else {
                        return;
                    };
                    match run.vias.get(peer).copied() {
                        Some(port) => self.cut(run, key, port),
                        // The edge's line of this connection not read yet
                        // (another reader thread): cut when it comes.
                        None => {
                            run.cuts_waiting.insert(peer.to_string(), key);
                        }
                    }
                }
            }
            Event::Line(Src::Agent(k), l) => {
                if l.starts_with("ready ") {
                    run.ready.entry(k).or_insert(at);
                    return;
                }
                let Some(rest) = l.strip_prefix("call ") else {
                    return;
                };
                let Some((n, what)) = rest.split_once(' ') else {
                    return;
                };
                let Ok(n) = n.parse::<u64>() else {
                    return;
                };
                let call = run.calls.entry((k, n)).or_default();
                if what == "start" {
                    call.start = Some(at);
                    if run.ready.contains_key(&k) {
                        run.counting.entry(k).or_insert(at);
                    }
                    return;
                }
                let outcome = match (
                    what.strip_prefix("done tokens="),
                    what.strip_prefix("failed: "),
                ) {
                    (Some(t), _) => Ok(t.parse().unwrap_or(0)),
                    (_, Some(e)) => Err(e.to_string()),
                    _ => return,
                };
                call.end = Some((at, outcome));
                if let Some(port) = call.cut_port {
                    let _ = self.nft(&format!(
                        "delete element inet selfheal_fleet cut {{ {port} }}\n"
                    ));
                }
            }
            Event::Watch(o) => {
                let k = o["agent"]
                    .as_str()
                    .and_then(|a| self.names.iter().position(|n| n == a));
                if let Some(k) = k {
                    // A check's outcome per agent: the gap since its last one is
                    // the watch's tick (its interval, or the check when longer).
                    if let Some(last) = run.last_check.insert(k, at) {
                        run.tick = run.tick.max(at.duration_since(last));
                    }
                    self.judge_down(run, k, at, &o);
                    let heals = o["heal"]["actions"]
                        .as_array()
                        .map_or(0, |a| a.iter().filter(|a| a["ok"] == true).count());
                    if heals > 0 {
                        run.heals.push((k, at, o["heal"]["actions"].to_string()));
                    }
                    // Counted from the agent's first call after its
                    // `ready`; before it, a start-up outcome.
                    let counted = run.counting.get(&k).is_some_and(|c| at >= *c);
                    let reasons = if counted {
                        run.outcomes += 1;
                        &mut run.reasons
                    } else {
                        run.startup_outcomes += 1;
                        &mut run.startup_reasons
                    };
                    for r in o["reasons"].as_array().into_iter().flatten() {
                        if let Some(code) = r["code"].as_str() {
                            // Codes are the watch's few words; a bad one
                            // is counted under one name, not kept.
                            let known = code.len() <= 40
                                && code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
                            let code = if known { code } else { "?" };
                            *reasons.entry(code.to_string()).or_default() += 1;
                        }
                    }
                }
            }
        }
    }
}

impl Fleet {
    /// A `down` outcome of agent `k` read at `at` is false when the check
    /// that gave it started after the agent's process did (it is not the
    /// first outcome read since the spawn) and the process still runs.
    fn judge_down(&mut self, run: &mut Run, k: usize, at: Instant, o: &Value) {
        let Some(spawned) = self.spawned.get(k).copied() else {
            return;
        };
        if at <= spawned {
            return;
        }
        let since = run.since_spawn.entry(k).or_default();
        *since += 1;
        if *since == 1 || o["verdict"] != "down" {
            return;
        }
        let runs = self
            .agents
            .get_mut(k)
            .is_some_and(|p| matches!(p.child.try_wait(), Ok(None)));
        if runs {
            let reasons: Vec<&str> = o["reasons"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r["message"].as_str())
                .collect();
            run.false_downs.push(format!(
                "{} {} ms after its start: {}",
                self.names[k],
                at.duration_since(spawned).as_millis(),
                reasons.join("; ")
            ));
        }
    }
}

/// What the soak saw.
#[derive(Default)]
struct Run {
    /// `(agent, call number)` → the call.
    calls: BTreeMap<(usize, u64), Call>,
    /// The edge's upstream address (the provider's `peer`) → the client's
    /// port.
    vias: BTreeMap<String, u16>,
    /// Cuts said before the edge's line of their connection was read: the
    /// provider's `peer` → the call.
    cuts_waiting: BTreeMap<String, (usize, u64)>,
    /// Heal actions: agent, when read, the actions.
    heals: Vec<(usize, Instant, String)>,
    last_check: BTreeMap<usize, Instant>,
    /// The longest gap between two checks of an agent.
    tick: Duration,
    /// When each agent said `ready`, and started its first call after it
    /// (its outcomes are counted from then on).
    ready: BTreeMap<usize, Instant>,
    counting: BTreeMap<usize, Instant>,
    /// Outcomes counted, and how many gave each reason.
    outcomes: u64,
    reasons: BTreeMap<String, u64>,
    /// Start-up outcomes (before the agent's first call), by reason.
    startup_outcomes: u64,
    startup_reasons: BTreeMap<String, u64>,
    /// Outcomes of each agent read since its process started.
    since_spawn: BTreeMap<usize, u64>,
    /// `down` outcomes while the agent's process ran.
    false_downs: Vec<String>,
    failures: Vec<String>,
}

/// `v`'s median, 90th percentile and maximum, in ms.
fn spread(mut v: Vec<u64>) -> Option<(u64, u64, u64)> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let at = |q: usize| v[(v.len() * q / 100).min(v.len() - 1)];
    Some((at(50), at(90), *v.last()?))
}

impl Fleet {
    /// Prints the counts per fate and the times from fault to failure;
    /// what failed.
    fn report(&self, run: &Run, pids_kept: &[bool], deadline: Instant) -> Vec<String> {
        let mut failures = run.failures.clone();
        for (peer, key) in &run.cuts_waiting {
            failures.push(format!(
                "{} call {}: no edge connection for its cut (peer {peer})",
                self.names[key.0], key.1
            ));
        }
        let tick = run.tick.max(Duration::from_millis(1));
        let stall_bound = self.stall_after + tick * 3;
        let cut_bound = SUSPECT_AFTER + PROOF_IDLE + PROOF_INTERVAL * PROOF_COUNT + tick * 3;
        // Each heal belongs to the calls of its agent in flight then (or
        // ended within a tick before: the SDK may print its failure before
        // the watch prints its outcome).
        let mut heals_of: BTreeMap<(usize, u64), u32> = BTreeMap::new();
        let mut false_heals = Vec::new();
        for (k, at, what) in &run.heals {
            let mut of = run
                .calls
                .range((*k, 0)..=(*k, u64::MAX))
                .filter(|(_, c)| {
                    c.start.is_some_and(|s| s <= *at)
                        && c.end.as_ref().is_none_or(|(e, _)| *e + tick >= *at)
                })
                .peekable();
            if of.peek().is_none() {
                false_heals.push(format!("{} with no call in flight: {what}", self.names[*k]));
            }
            let mut expected = false;
            let mut benign = Vec::new();
            for (key, c) in of {
                *heals_of.entry(*key).or_default() += 1;
                match c.fate {
                    Some(Fate::Cut | Fate::Stall) => expected = true,
                    f => benign.push(format!(
                        "call {} ({})",
                        key.1,
                        f.map_or("fate unknown", Fate::name)
                    )),
                }
            }
            if !expected && !benign.is_empty() {
                false_heals.push(format!(
                    "{} during {}: {what}",
                    self.names[*k],
                    benign.join(", ")
                ));
            }
        }
        println!();
        println!(
            "{:<12} {:>6} {:>6} {:>7} {:>10} {:>7}   fault to failure (median / p90 / max, ms) against its bound",
            "fate", "calls", "done", "failed", "in flight", "healed"
        );
        let mut by_sdk: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        let mut none_ended = Vec::new();
        for fate in Fate::ALL {
            let calls: Vec<(&(usize, u64), &Call)> = run
                .calls
                .iter()
                .filter(|(_, c)| c.fate == Some(fate))
                .collect();
            let done = calls
                .iter()
                .filter(|(_, c)| matches!(c.end, Some((_, Ok(_)))))
                .count();
            let failed: Vec<_> = calls
                .iter()
                .filter(|(_, c)| matches!(c.end, Some((_, Err(_)))))
                .collect();
            let open = calls.iter().filter(|(_, c)| c.end.is_none()).count();
            let healed = calls
                .iter()
                .filter(|(key, _)| heals_of.contains_key(key))
                .count();
            let faulty = matches!(fate, Fate::Cut | Fate::Stall);
            // Ended as the fate must: done, or failed for a cut or stall.
            if (if faulty { failed.len() } else { done }) == 0 {
                none_ended.push(fate.name());
            }
            let bound = if fate == Fate::Cut {
                cut_bound
            } else {
                stall_bound
            };
            let mut times = Vec::new();
            for (key, c) in &calls {
                let name = &self.names[key.0];
                match (&c.end, c.fault) {
                    (Some((end, Err(_))), Some(fault)) if faulty => {
                        let took = end.saturating_duration_since(fault);
                        times.push(took.as_millis() as u64);
                        let e = by_sdk.entry(self.sdks[key.0]).or_default();
                        e.0 += 1;
                        e.1 = e.1.max(took.as_millis() as u64);
                        if took > bound {
                            failures.push(format!(
                                "{name} call {} ({}) failed {} ms after its fault (bound {} ms)",
                                key.1,
                                fate.name(),
                                took.as_millis(),
                                bound.as_millis()
                            ));
                        }
                    }
                    (Some((_, Ok(t))), _) if faulty => failures.push(format!(
                        "{name} call {} ({}) was done with {t} tokens: it should have failed",
                        key.1,
                        fate.name()
                    )),
                    (Some((_, Err(e))), _) if !faulty => failures.push(format!(
                        "{name} call {} ({}) failed: {e}",
                        key.1,
                        fate.name()
                    )),
                    (None, Some(fault)) if faulty && fault + bound < deadline => {
                        failures.push(format!(
                            "{name} call {} ({}) had not failed {} ms after its fault (bound {} ms)",
                            key.1,
                            fate.name(),
                            deadline.saturating_duration_since(fault).as_millis(),
                            bound.as_millis()
                        ));
                    }
                    (Some((_, Err(_))), None) if faulty => failures.push(format!(
                        "{name} call {} ({}) failed before its fault was made",
                        key.1,
                        fate.name()
                    )),
                    _ => {}
                }
            }
            let spread = spread(times)
                .map(|(m, p, x)| format!("{m} / {p} / {x}"))
                .unwrap_or_else(|| "-".into());
            println!(
                "{:<12} {:>6} {:>6} {:>7} {:>10} {:>7}   {}",
                fate.name(),
                calls.len(),
                done,
                failed.len(),
                open,
                healed,
                if faulty {
                    format!("{spread} (bound {} ms)", bound.as_millis())
                } else {
                    String::new()
                }
            );
        }
        let unknown: Vec<_> = run
            .calls
            .iter()
            .filter(|(_, c)| c.fate.is_none() && c.start.is_some())
            .collect();
        for (key, c) in &unknown {
            if let Some((_, Err(e))) = &c.end {
                failures.push(format!(
                    "{} call {} failed before the provider saw it: {e}",
                    self.names[key.0], key.1
                ));
            }
        }
        let per_sdk: Vec<String> = by_sdk
            .iter()
            .map(|(s, (n, max))| format!("{s} {n} (max {max} ms)"))
            .collect();
        println!(
            "cuts and stalls failed per SDK: {}; {} calls without a fate (not yet at the provider at the end)",
            per_sdk.join(", "),
            unknown.len()
        );
        let words = |m: &BTreeMap<String, u64>| {
            m.iter()
                .map(|(r, n)| format!("{r} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "watch: tick (longest gap between two checks of an agent) {} ms; {} heals, {} false; {} false downs; {} outcomes from each agent's first call on, by reason: {}",
            tick.as_millis(),
            run.heals.len(),
            false_heals.len(),
            run.false_downs.len(),
            run.outcomes,
            words(&run.reasons)
        );
        println!(
            "start-up: {} outcomes before each agent's first call (not counted above), by reason: {}",
            run.startup_outcomes,
            words(&run.startup_reasons)
        );
        for d in run.false_downs.iter().take(10) {
            failures.push(format!("a false down (its process runs): {d}"));
        }
        if run.false_downs.len() > 10 {
            failures.push(format!("{} false downs in all", run.false_downs.len()));
        }
        for f in false_heals.iter().take(10) {
            failures.push(format!("a false heal: {f}"));
        }
        let lost: Vec<&String> = pids_kept
            .iter()
            .zip(&self.names)
            .filter(|(kept, _)| !**kept)
            .map(|(_, n)| n)
            .collect();
        println!(
            "agents: {} of {} kept their pid",
            pids_kept.len() - lost.len(),
            pids_kept.len()
        );
        if !lost.is_empty() {
            failures.push(format!("agents whose process exited: {lost:?}"));
        }
        for fate in none_ended {
            failures.push(format!(
                "no {fate} call ended as it must (done, or failed for a cut or stall): the soak was too short"
            ));
        }
        failures
    }
}
