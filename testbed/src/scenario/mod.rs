//! The scenarios: a [`Bed`] (topology, testbed programs, a `selfheal
//! helper`, a config) and the scripts that fault it and watch selfheal
//! answer, by running `selfheal check` as a timer would. Every observation
//! goes to a narrator as an [`Event`] (the demo prints them, the tests log
//! them) and is summed up in a [`Report`] the tests assert on.
//!
//! Checks run inside the runners' network namespace (so the runners'
//! status endpoints on 127.0.0.1 answer the probes) and heal through the
//! helper, which runs in the host's.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc::{Receiver, channel},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde::Serialize;
use serde_json::Value;

use super::{http, runner::Mode, topology::Topology};

/// Set (by a signal handler) to stop a scenario at its next pause; the bed
/// is then dropped, which kills its processes and deletes its namespaces.
pub static STOP: AtomicBool = AtomicBool::new(false);

const ATTACH_PORT: u16 = 7443;
const API_PORT: u16 = 8080;
const PROVIDER_PORT: u16 = 8443;

/// What every scenario is given.
#[derive(Clone, Debug)]
pub struct Options {
    /// The `selfheal` binary to run (helper, check, snapshots): the
    /// product, as an operator runs it.
    pub selfheal: PathBuf,
    /// The `selfheal-testbed` binary whose programs make the bed (dispatch
    /// server, provider, runners, proxy): kept out of the product binary.
    pub testbed: PathBuf,
    /// The runners' heartbeat, and the control upstream's in the config.
    pub heartbeat: Duration,
    /// How often `selfheal check` runs (the timer's interval).
    pub check_every: Duration,
    /// Picks the subnets (1–250); concurrent scenarios need distinct values.
    pub net: u8,
    /// Where to keep the snapshot log when the bed is removed (it is
    /// deleted with the bed otherwise).
    pub keep_snapshots: Option<PathBuf>,
    /// Environment every `selfheal` the bed runs (helper, check,
    /// snapshots) gets on top of this process's: which container runtimes
    /// it asks, for one.
    pub env: Vec<(&'static str, String)>,
}

/// One thing a person watching should see.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The bed is up.
    Setup { what: String },
    /// A runner's own story (`GET /status`) and the dispatch server's row.
    Story {
        at_ms: u64,
        runner: String,
        status: Value,
        table: Value,
    },
    /// The fault was injected.
    Fault { at_ms: u64, what: String },
    /// One agent's verdict in one check (printed on a change, or when it
    /// carries a snapshot or a heal).
    Verdict {
        at_ms: u64,
        agent: String,
        verdict: String,
        reasons: Vec<Value>,
        snapshot: Option<String>,
        heal: Vec<String>,
        /// Whether the verdict or its reasons' codes differ from this
        /// agent's previous ones.
        changed: bool,
    },
    /// A runner is back at work: time from the fault to the verdict and to
    /// the first work item done after reattaching.
    Recovered {
        agent: String,
        detect_ms: u64,
        recover_ms: u64,
    },
    /// Anything else worth a line.
    Note { at_ms: u64, text: String },
}

/// What a scenario saw.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub scenario: String,
    /// Every verdict of every agent, in check order.
    pub verdicts: BTreeMap<String, Vec<String>>,
    /// Every reason code seen per agent.
    pub reasons: BTreeMap<String, Vec<String>>,
    /// Healing steps taken, as "agent: action".
    pub heals: Vec<String>,
    /// Snapshot ids written.
    pub snapshots: Vec<String>,
    /// Fault to the first `wedged` verdict.
    pub detect_ms: Option<u64>,
    /// Fault to the runner's first work item done after it reattached.
    pub recover_ms: Option<u64>,
    pub checks: u32,
    /// Facts a scenario wants to keep (its own assertions' inputs).
    pub facts: BTreeMap<String, Value>,
}

impl Report {
    fn new(scenario: &str) -> Report {
        Report {
            scenario: scenario.into(),
            ..Report::default()
        }
    }

    /// Verdicts of `agent` other than those in `allowed`.
    pub fn verdicts_outside(&self, agent: &str, allowed: &[&str]) -> Vec<String> {
        self.verdicts
            .get(agent)
            .into_iter()
            .flatten()
            .filter(|v| !allowed.contains(&v.as_str()))
            .cloned()
            .collect()
    }

    pub fn saw_reason(&self, agent: &str, code: &str) -> bool {
        self.reasons
            .get(agent)
            .is_some_and(|c| c.iter().any(|x| x == code))
    }
}

/// A testbed program, killed on drop.
struct Proc {
    child: Child,
    lines: Receiver<String>,
    /// The last lines of its stderr, for the error when it fails to start.
    errors: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<String>>>,
    what: String,
}

/// Stderr lines kept per program.
const KEEP_ERRORS: usize = 10;

impl Proc {
    fn spawn(mut cmd: Command, what: &str) -> anyhow::Result<Proc> {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {what}"))?;
        let stdout = child.stdout.take().context("piped stdout")?;
        let stderr = child.stderr.take().context("piped stderr")?;
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let errors = std::sync::Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
        let keep = errors.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut q = keep
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if q.len() == KEEP_ERRORS {
                    q.pop_front();
                }
                q.push_back(line);
            }
        });
        Ok(Proc {
            child,
            lines,
            errors,
            what: what.into(),
        })
    }

    /// Waits for a line starting with `prefix`; the error carries the
    /// program's last stderr lines.
    fn expect(&self, prefix: &str, timeout: Duration) -> anyhow::Result<String> {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return Ok(line),
                Ok(_) => {}
                Err(_) => {
                    // Give its stderr reader a moment to catch the last words.
                    std::thread::sleep(Duration::from_millis(50));
                    let errors = self
                        .errors
                        .lock()
                        .map(|q| q.iter().cloned().collect::<Vec<_>>().join(" | "))
                        .unwrap_or_default();
                    bail!(
                        "{}: no `{prefix}` line within {timeout:?}; its stderr: {errors}",
                        self.what
                    )
                }
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How a runner is set up.
#[derive(Clone, Debug)]
pub struct RunnerSpec {
    pub name: String,
    pub mode: Mode,
    /// The provider request per work item (its pacing).
    pub provider_path: String,
    /// Run as PID 1 of its own pid namespace, leaking a child this often.
    pub leak_every: Option<Duration>,
    /// Where the agent's probe asks: the runner itself, or the dispatch
    /// server's row for it.
    pub probe_table: bool,
    /// Extra `[agent.thresholds]` lines.
    pub thresholds: String,
    /// The provider request for work items after the first.
    pub then_path: Option<String>,
    /// Lines appended to the agent's config block (more tables).
    pub extra: String,
}

impl RunnerSpec {
    pub fn new(name: &str, mode: Mode) -> RunnerSpec {
        RunnerSpec {
            name: name.into(),
            mode,
            provider_path: FAST.into(),
            leak_every: None,
            probe_table: false,
            thresholds: String::new(),
            then_path: None,
            extra: String::new(),
        }
    }
}

/// A provider answering at once, 5 tokens 20 ms apart.
pub const FAST: &str = "/v1/stream?first_ms=100&gap_ms=20&tokens=5";

/// The topology, the programs in it, a helper, and the config.
pub struct Bed {
    pub opts: Options,
    pub topo: Topology,
    dir: PathBuf,
    started: Instant,
    dispatch: Option<Proc>,
    procs: Vec<Proc>,
    runners: Vec<(RunnerSpec, SocketAddr)>,
    /// Index into `procs` of each runner and agent program, by name.
    named: BTreeMap<String, usize>,
    /// `[[agent]]` blocks of agents that are not testbed runners.
    agents: Vec<String>,
}

impl Bed {
    /// Builds the topology and starts the dispatch server (work every
    /// `work_every`), the provider and the helper.
    pub fn new(opts: &Options, tag: &str, work_every: Duration) -> anyhow::Result<Bed> {
        super::topology::remove_stale();
        let tag = format!("{tag}{}", opts.net);
        let topo = Topology::new(&tag, opts.net)?;
        let dir = std::env::temp_dir().join(format!("selfheal-tb{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let mut bed = Bed {
            opts: opts.clone(),
            topo,
            dir,
            started: Instant::now(),
            dispatch: None,
            procs: Vec::new(),
            runners: Vec::new(),
            named: BTreeMap::new(),
            agents: Vec::new(),
        };
        let mut cmd = bed.topo.dispatch.command(&bed.opts.testbed);
        cmd.args(["dispatch", "--listen"])
            .arg(bed.dispatch_addr().to_string())
            .arg("--api")
            .arg(bed.api_addr().to_string())
            .arg("--work-every")
            .arg(format!("{}ms", work_every.as_millis()));
        let d = Proc::spawn(cmd, "the dispatch server")?;
        d.expect("listening", Duration::from_secs(10))?;
        bed.dispatch = Some(d);
        let mut cmd = bed.topo.provider.command(&bed.opts.testbed);
        cmd.args(["provider", "--listen"])
            .arg(bed.provider_addr().to_string());
        let p = Proc::spawn(cmd, "the provider")?;
        p.expect("listening", Duration::from_secs(10))?;
        bed.procs.push(p);
        let mut cmd = Command::new(&bed.opts.selfheal);
        cmd.args(["helper", "--socket"])
            .arg(bed.helper_socket())
            .envs(bed.opts.env.iter().map(|(k, v)| (*k, v)));
        bed.procs.push(Proc::spawn(cmd, "selfheal helper")?);
        let sock = bed.helper_socket();
        bed.wait("the helper's socket", Duration::from_secs(20), || {
            Ok(sock.exists().then_some(()))
        })?;
        Ok(bed)
    }

    pub fn dispatch_addr(&self) -> SocketAddr {
        SocketAddr::from((self.topo.dispatch_ip, ATTACH_PORT))
    }

    fn api_addr(&self) -> SocketAddr {
        SocketAddr::from((self.topo.dispatch_ip, API_PORT))
    }

    fn provider_addr(&self) -> SocketAddr {
        SocketAddr::from((self.topo.provider_ip, PROVIDER_PORT))
    }

    fn helper_socket(&self) -> PathBuf {
        self.dir.join("helper.sock")
    }

    /// Milliseconds since the bed was built.
    pub fn at_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// The dispatch server's pid (to stop it).
    pub fn dispatch_pid(&self) -> Option<u32> {
        self.dispatch.as_ref().map(|d| d.child.id())
    }

    /// Starts a runner in the runners' namespace and adds it to the config.
    pub fn add_runner(&mut self, spec: RunnerSpec) -> anyhow::Result<()> {
        let status = SocketAddr::from(([127, 0, 0, 1], 9001 + self.runners.len() as u16));
        let mut cmd = self.topo.runners.command(&self.opts.testbed);
        cmd.args(["runner", "--name", &spec.name, "--dispatch"])
            .arg(self.dispatch_addr().to_string())
            .arg("--provider")
            .arg(self.provider_addr().to_string())
            .args(["--provider-path", &spec.provider_path, "--status"])
            .arg(status.to_string())
            .arg("--heartbeat")
            .arg(format!("{}ms", self.opts.heartbeat.as_millis()))
            .args([
                "--mode",
                match spec.mode {
                    Mode::Blocking => "blocking",
                    Mode::Tokio => "tokio",
                },
            ]);
        if let Some(then) = &spec.then_path {
            cmd.args(["--then-path", then]);
        }
        if let Some(every) = spec.leak_every {
            cmd.args(["--pid1", "--pidfile"])
                .arg(self.pidfile(&spec.name))
                .arg("--leak-every")
                .arg(format!("{}ms", every.as_millis()));
        }
        let p = Proc::spawn(cmd, &format!("runner {}", spec.name))?;
        if spec.leak_every.is_some() {
            p.expect("pid1 ", Duration::from_secs(10))?;
        }
        self.named.insert(spec.name.clone(), self.procs.len());
        self.procs.push(p);
        self.runners.push((spec, status));
        self.write_config()
    }

    /// Starts `cmd` (made with `self.topo.runners.command(…)` or another
    /// namespace's) as program `name`, and adds `config` (an `[[agent]]`
    /// block, or nothing) to the config.
    pub fn spawn(
        &mut self,
        name: &str,
        cmd: Command,
        config: Option<String>,
    ) -> anyhow::Result<()> {
        let p = Proc::spawn(cmd, name)?;
        self.named.insert(name.into(), self.procs.len());
        self.procs.push(p);
        if let Some(block) = config {
            self.agents.push(block);
            self.write_config()?;
        }
        Ok(())
    }

    fn named(&self, name: &str) -> anyhow::Result<&Proc> {
        self.named
            .get(name)
            .and_then(|&i| self.procs.get(i))
            .with_context(|| format!("no program {name}"))
    }

    /// Waits for a line of program `name` starting with `prefix`.
    pub fn expect_line(
        &self,
        name: &str,
        prefix: &str,
        timeout: Duration,
    ) -> anyhow::Result<String> {
        self.named(name)?.expect(prefix, timeout)
    }

    /// The lines program `name` printed since the last call (or wait).
    pub fn lines(&self, name: &str) -> anyhow::Result<Vec<String>> {
        Ok(self.named(name)?.lines.try_iter().collect())
    }

    /// Program `name`'s pid (`ip netns exec` execs it: the program's own).
    pub fn pid(&self, name: &str) -> anyhow::Result<u32> {
        Ok(self.named(name)?.child.id())
    }

    /// Whether program `name` still runs (has not exited).
    pub fn running(&mut self, name: &str) -> anyhow::Result<bool> {
        let i = *self
            .named
            .get(name)
            .with_context(|| format!("no program {name}"))?;
        Ok(matches!(self.procs[i].child.try_wait(), Ok(None)))
    }

    pub fn provider(&self) -> SocketAddr {
        self.provider_addr()
    }

    fn pidfile(&self, runner: &str) -> PathBuf {
        self.dir.join(format!("{runner}.pid"))
    }

    fn config_path(&self) -> PathBuf {
        self.dir.join("config.toml")
    }

    fn write_config(&self) -> anyhow::Result<()> {
        let mut text = String::new();
        for (spec, status) in &self.runners {
            let name = &spec.name;
            let matcher = if spec.leak_every.is_some() {
                format!("pidfile = {:?}", self.pidfile(name).display().to_string())
            } else {
                format!("cmdline = \"selfheal-testbed runner --name {name} \"")
            };
            let probe = if spec.probe_table {
                format!("http://{}/runners/{name}", self.api_addr())
            } else {
                format!("http://{status}/status")
            };
            text.push_str(&format!(
                "[[agent]]\nname = \"{name}\"\nmatch = {{ {matcher} }}\n\
                 [[agent.upstream]]\nrole = \"control\"\naddr = \"{}\"\nheartbeat = \"{}ms\"\n\
                 [[agent.upstream]]\nrole = \"provider\"\naddr = \"{}\"\n\
                 [[agent.probe]]\nurl = \"{probe}\"\ntimeout = \"1s\"\n\
                 fields = {{ server_status = \"/status\", current_task = \"/current_task\" }}\n\
                 expect = {{ server_status = \"connected\" }}\n\
                 [agent.thresholds]\nsuspect_after = \"2s\"\nrecv_blocked = \"2s\"\n{}\n\
                 [agent.heal]\nstep_window = \"5s\"\nbackoff = \"1s\"\n{}\n",
                self.dispatch_addr(),
                self.opts.heartbeat.as_millis(),
                self.provider_addr(),
                spec.thresholds,
                spec.extra,
            ));
        }
        for block in &self.agents {
            text.push_str(block);
            text.push('\n');
        }
        let path = self.config_path();
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
    }

    /// One `selfheal check --json`, as the timer runs it, inside the
    /// runners' namespace and through the helper.
    pub fn check(&self) -> anyhow::Result<CheckRun> {
        let mut cmd = self.topo.runners.command(&self.opts.selfheal);
        cmd.envs(self.opts.env.iter().map(|(k, v)| (*k, v)));
        cmd.args(["check", "--json", "--config"])
            .arg(self.config_path())
            .arg("--state-dir")
            .arg(self.dir.join("state"))
            .arg("--snapshot-dir")
            .arg(self.snapshot_dir())
            .arg("--helper")
            .arg(self.helper_socket());
        let out = cmd.output().context("cannot run selfheal check")?;
        let mut outcomes = Vec::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            outcomes.push(
                serde_json::from_str::<Value>(line)
                    .with_context(|| format!("check printed a line that is not JSON: {line:?}"))?,
            );
        }
        Ok(CheckRun {
            code: out.status.code().unwrap_or(-1),
            outcomes,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    pub fn snapshot_dir(&self) -> PathBuf {
        self.dir.join("snapshots")
    }

    /// The config the bed wrote (its runners' `[[agent]]` blocks), for a
    /// `selfheal watch` of a test's own (tests/tests/it/alerting.rs).
    pub fn config_file(&self) -> PathBuf {
        self.config_path()
    }

    /// The bed's helper's socket.
    pub fn helper_socket_path(&self) -> PathBuf {
        self.helper_socket()
    }

    /// A runner's own story (`GET /status`).
    pub fn runner_status(&self, name: &str) -> anyhow::Result<Value> {
        let (_, addr) = self
            .runners
            .iter()
            .find(|(s, _)| s.name == name)
            .with_context(|| format!("no runner {name}"))?;
        let addr = *addr;
        let (_, v) = self
            .topo
            .runners
            .enter(move || http::get_json(addr, "/status", Duration::from_secs(2)))??;
        Ok(v)
    }

    /// The dispatch server's row for `name` (Null when it has none).
    pub fn row(&self, name: &str) -> anyhow::Result<Value> {
        let addr = self.api_addr();
        let (_, v) = self
            .topo
            .runners
            .enter(move || http::get_json(addr, "/runners", Duration::from_secs(2)))??;
        Ok(v["runners"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["runner"] == name))
            .cloned()
            .unwrap_or(Value::Null))
    }

    /// Polls `f` every 100 ms until it yields, for at most `timeout`.
    pub fn wait<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut() -> anyhow::Result<Option<T>>,
    ) -> anyhow::Result<T> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(v) = f()? {
                return Ok(v);
            }
            if Instant::now() >= end {
                bail!("{what}: not within {timeout:?}");
            }
            pause(Duration::from_millis(100))?;
        }
    }

    /// Waits until `runner` is attached and has finished `n` work items.
    pub fn wait_working(&self, runner: &str, n: u64) -> anyhow::Result<Value> {
        self.wait(
            &format!("{runner} attached and working"),
            Duration::from_secs(30),
            || {
                let row = self.row(runner).unwrap_or(Value::Null);
                Ok(
                    (row["status"] == "connected" && row["done"].as_u64() >= Some(n))
                        .then_some(row),
                )
            },
        )
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        // Processes first (they hold the namespaces' sockets), then the
        // files; the topology deletes the namespaces when dropped after.
        self.procs.clear();
        if let Some(keep) = &self.opts.keep_snapshots {
            keep_snapshots(&self.snapshot_dir(), keep);
        }
        if let Some(d) = self.dispatch.take() {
            // A stopped server must be continued to die promptly.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(d.child.id() as i32),
                nix::sys::signal::Signal::SIGCONT,
            );
            drop(d);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Copies the snapshot log's files from `from` into `to` (created 0700),
/// saying on stderr what could not be copied: the bed is being removed and
/// there is nobody else to tell.
fn keep_snapshots(from: &Path, to: &Path) {
    use std::os::unix::fs::DirBuilderExt as _;
    let copy = || -> std::io::Result<()> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(to)?;
        for entry in std::fs::read_dir(from)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                std::fs::copy(entry.path(), to.join(entry.file_name()))?;
            }
        }
        Ok(())
    };
    if let Err(e) = copy() {
        eprintln!(
            "selfheal: cannot keep the snapshots of {} in {}: {e}",
            from.display(),
            to.display()
        );
    }
}

/// One `selfheal check` run.
#[derive(Debug)]
pub struct CheckRun {
    pub code: i32,
    pub outcomes: Vec<Value>,
    pub stderr: String,
}

impl CheckRun {
    pub fn of(&self, agent: &str) -> Option<&Value> {
        self.outcomes.iter().find(|o| o["agent"] == agent)
    }
}

/// Sleeps `d` in short slices; fails at once when [`STOP`] is set.
pub fn pause(d: Duration) -> anyhow::Result<()> {
    let end = Instant::now() + d;
    loop {
        if STOP.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

/// Runs checks every `check_every` for at most `limit`, recording and
/// narrating every outcome, until `done` says so (given the bed and the
/// latest check).
fn checks(
    bed: &Bed,
    report: &mut Report,
    say: &mut dyn FnMut(Event),
    limit: Duration,
    done: impl FnMut(&Bed, &CheckRun, &mut Report, &mut dyn FnMut(Event)) -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    checks_with(bed, report, say, limit, |_, _| {}, done)
}

/// [`checks`], with `first` told about each check before its outcomes are
/// narrated (to narrate what stood before it).
fn checks_with(
    bed: &Bed,
    report: &mut Report,
    say: &mut dyn FnMut(Event),
    limit: Duration,
    mut first: impl FnMut(&CheckRun, &mut dyn FnMut(Event)),
    mut done: impl FnMut(&Bed, &CheckRun, &mut Report, &mut dyn FnMut(Event)) -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let end = Instant::now() + limit;
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    while Instant::now() < end {
        let tick = Instant::now();
        let run = bed.check()?;
        note_check_time(report, tick.elapsed());
        if run.outcomes.is_empty() {
            bail!(
                "selfheal check printed nothing (exit {}): {}",
                run.code,
                run.stderr.trim()
            );
        }
        report.checks += 1;
        first(&run, say);
        for o in &run.outcomes {
            record(bed, o, report, &mut last, say);
        }
        if done(bed, &run, report, say)? {
            return Ok(());
        }
        pause(bed.opts.check_every.saturating_sub(tick.elapsed()))?;
    }
    Ok(())
}

fn record(
    bed: &Bed,
    o: &Value,
    report: &mut Report,
    last: &mut BTreeMap<String, String>,
    say: &mut dyn FnMut(Event),
) {
    let agent = o["agent"].as_str().unwrap_or("?").to_string();
    let verdict = o["verdict"].as_str().unwrap_or("?").to_string();
    report
        .verdicts
        .entry(agent.clone())
        .or_default()
        .push(verdict.clone());
    let reasons = o["reasons"].as_array().cloned().unwrap_or_default();
    let codes = report.reasons.entry(agent.clone()).or_default();
    for r in &reasons {
        if let Some(c) = r["code"].as_str().filter(|c| !codes.iter().any(|x| x == c)) {
            codes.push(c.to_string());
        }
    }
    let snapshot = o["snapshot"].as_str().map(str::to_string);
    if let Some(id) = &snapshot {
        report.snapshots.push(id.clone());
    }
    let heal: Vec<String> = o["heal"]["actions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            let action = a["step"]["action"].as_str().unwrap_or("?");
            match a["error"].as_str() {
                Some(e) => format!("{action} (failed: {e})"),
                None => action.to_string(),
            }
        })
        .collect();
    for h in &heal {
        report.heals.push(format!("{agent}: {h}"));
    }
    // A change of verdict or of the reasons' codes is news.
    let now: Vec<&str> = reasons.iter().filter_map(|r| r["code"].as_str()).collect();
    let key = format!("{verdict} {}", now.join(","));
    let changed = last.insert(agent.clone(), key.clone()).as_ref() != Some(&key);
    if changed || snapshot.is_some() || !heal.is_empty() {
        say(Event::Verdict {
            at_ms: bed.at_ms(),
            agent,
            verdict,
            reasons,
            snapshot,
            heal,
            changed,
        });
    }
}

fn story(bed: &Bed, runner: &str, say: &mut dyn FnMut(Event)) -> anyhow::Result<()> {
    say(told(bed, runner)?);
    Ok(())
}

/// A runner's story and the table's row, now.
fn told(bed: &Bed, runner: &str) -> anyhow::Result<Event> {
    Ok(Event::Story {
        at_ms: bed.at_ms(),
        runner: runner.into(),
        status: bed.runner_status(runner).unwrap_or(Value::Null),
        table: bed.row(runner)?,
    })
}

/// A provider that thinks 6 s before its first token (longer than the
/// suspect threshold of 2 s), then streams 20 tokens 100 ms apart.
pub const THINKING: &str = "/v1/stream?first_ms=6000&gap_ms=100&tokens=20";

/// The 2026-07-23 incident: a runner's attach stream goes half-open (the
/// gateway drops the flow without a FIN) while the dispatch server's table
/// keeps saying `connected`. selfheal must call it `wedged`, snapshot it,
/// heal it without a restart, and the runner must reattach and work again.
/// With `thinker`, a second runner waits on a slow provider beside it and
/// must stay `busy` (the demo runs both side by side).
pub fn incident(
    opts: &Options,
    mode: Mode,
    thinker: bool,
    say: &mut dyn FnMut(Event),
) -> anyhow::Result<Report> {
    let mut report = Report::new("incident");
    let mut bed = Bed::new(opts, "inc", Duration::from_secs(1))?;
    bed.add_runner(RunnerSpec::new("runner", mode))?;
    if thinker {
        let mut t = RunnerSpec::new("thinker", Mode::Blocking);
        t.provider_path = THINKING.into();
        bed.add_runner(t)?;
    }
    say(Event::Setup {
        what: format!(
            "dispatch server {} (namespace {}), provider {} ({}), runners in {} (the wedging one: {}); heartbeat {} ms, a check every {} ms",
            bed.dispatch_addr(),
            bed.topo.dispatch.name,
            bed.provider_addr(),
            bed.topo.provider.name,
            bed.topo.runners.name,
            match mode {
                Mode::Blocking => "a blocking reader thread",
                Mode::Tokio => "a tokio event loop",
            },
            opts.heartbeat.as_millis(),
            opts.check_every.as_millis()
        ),
    });
    let row = bed.wait_working("runner", 1)?;
    story(&bed, "runner", say)?;
    // A first check: all is well.
    checks(
        &bed,
        &mut report,
        say,
        Duration::from_secs(1),
        |_, _, _, _| Ok(true),
    )?;

    let peer: SocketAddr = row["peer"]
        .as_str()
        .and_then(|p| p.parse().ok())
        .context("the table has no peer address for the runner")?;
    let (old_conn, done_before) = (row["conn"].as_u64(), row["done"].as_u64().unwrap_or(0));
    bed.topo.drop_flow(peer)?;
    let fault = Instant::now();
    say(Event::Fault {
        at_ms: bed.at_ms(),
        what: format!(
            "the gateway drops the attach flow {peer} ↔ {} both ways, without a FIN or RST: the stream is half-open",
            bed.dispatch_addr()
        ),
    });

    // The stories as they stood before the check that found the wedge (it
    // may heal at once): both still say all is well.
    let before = std::cell::RefCell::new(None::<Event>);
    checks_with(
        &bed,
        &mut report,
        say,
        Duration::from_secs(60),
        |run, say| {
            let wedged = run.of("runner").is_some_and(|o| o["verdict"] == "wedged");
            if let Some(e) = before.borrow_mut().take().filter(|_| wedged) {
                say(e);
            }
        },
        |bed, run, report, say| {
            let verdict = run.of("runner").map(|o| o["verdict"].clone());
            if report.detect_ms.is_none() && verdict.as_ref().is_some_and(|v| v == "wedged") {
                report.detect_ms = Some(fault.elapsed().as_millis() as u64);
            }
            if report.detect_ms.is_none() {
                *before.borrow_mut() = Some(told(bed, "runner")?);
                return Ok(false);
            }
            let row = bed.row("runner")?;
            let back = row["conn"].as_u64() > old_conn
                && row["done"].as_u64().unwrap_or(0) > done_before
                && row["status"] == "connected";
            if back && report.recover_ms.is_none() {
                report.recover_ms = Some(fault.elapsed().as_millis() as u64);
                story(bed, "runner", say)?;
                say(Event::Recovered {
                    agent: "runner".into(),
                    detect_ms: report.detect_ms.unwrap_or(0),
                    recover_ms: report.recover_ms.unwrap_or(0),
                });
            }
            // One more check after recovery, to see the verdict clear.
            Ok(back && verdict.is_some_and(|v| v != "wedged"))
        },
    )?;
    // The runner's pid did not change: healed, not restarted.
    report.facts.insert(
        "runner_status".into(),
        bed.runner_status("runner").unwrap_or(Value::Null),
    );
    report.facts.insert("row".into(), bed.row("runner")?);
    Ok(report)
}

/// Busy, not wedged: a provider that thinks silently longer than the
/// suspect threshold, then streams. Two think cycles; never healed.
pub fn busy_provider(opts: &Options, say: &mut dyn FnMut(Event)) -> anyhow::Result<Report> {
    let mut report = Report::new("busy_provider");
    let mut bed = Bed::new(opts, "busy", Duration::from_millis(500))?;
    let mut spec = RunnerSpec::new("thinker", Mode::Blocking);
    spec.provider_path = THINKING.into();
    bed.add_runner(spec)?;
    let mut spec = RunnerSpec::new("thinker-tokio", Mode::Tokio);
    spec.provider_path = THINKING.into();
    bed.add_runner(spec)?;
    say(Event::Setup {
        what: format!(
            "two runners (blocking, tokio) whose provider thinks 6 s before streaming; suspect after 2 s; heartbeat {} ms",
            opts.heartbeat.as_millis()
        ),
    });
    bed.wait_working("thinker", 0)?;
    checks(
        &bed,
        &mut report,
        say,
        Duration::from_secs(16),
        |_, _, _, _| Ok(false),
    )?;
    for r in ["thinker", "thinker-tokio"] {
        report
            .facts
            .insert(format!("{r}_done"), bed.row(r)?["done"].clone());
    }
    Ok(report)
}

/// Peer alive, application silent: the dispatch server is stopped
/// (SIGSTOP); its kernel still ACKs the heartbeats, but nothing comes back.
/// The control upstream's heartbeat rule makes the runner `wedged`, and the
/// evidence says the peer still acknowledges.
pub fn peer_stopped(opts: &Options, say: &mut dyn FnMut(Event)) -> anyhow::Result<Report> {
    let mut report = Report::new("peer_stopped");
    let mut bed = Bed::new(opts, "stop", Duration::from_secs(1))?;
    bed.add_runner(RunnerSpec::new("runner", Mode::Blocking))?;
    bed.wait_working("runner", 1)?;
    let pid = bed.dispatch_pid().context("no dispatch server")?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .context("SIGSTOP the dispatch server")?;
    let fault = Instant::now();
    say(Event::Fault {
        at_ms: bed.at_ms(),
        what: format!("the dispatch server (pid {pid}) is stopped: its kernel still ACKs"),
    });
    checks(
        &bed,
        &mut report,
        say,
        Duration::from_secs(20),
        |_, run, report, _| {
            let Some(o) = run.of("runner").filter(|o| o["verdict"] == "wedged") else {
                return Ok(false);
            };
            report.detect_ms = Some(fault.elapsed().as_millis() as u64);
            report.facts.insert("wedged".into(), o.clone());
            Ok(true)
        },
    )?;
    if let Some(id) = report.snapshots.last() {
        let out = Command::new(&bed.opts.selfheal)
            .envs(bed.opts.env.iter().map(|(k, v)| (*k, v)))
            .args(["snapshots", "show", id, "--json", "--dir"])
            .arg(bed.snapshot_dir())
            .output()
            .context("selfheal snapshots show")?;
        let snap: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        report.facts.insert("snapshot".into(), snap);
    }
    Ok(report)
}

/// A zombie leak: a runner as PID 1 of its namespace starts a child every
/// 100 ms and never reaps one. It must turn `degraded` with the
/// missing-init diagnosis long before it reaches `limit` zombies.
pub fn zombie_leak(
    opts: &Options,
    limit: u32,
    say: &mut dyn FnMut(Event),
) -> anyhow::Result<Report> {
    let mut report = Report::new("zombie_leak");
    let mut bed = Bed::new(opts, "zmb", Duration::from_secs(1))?;
    let mut spec = RunnerSpec::new("pid1", Mode::Blocking);
    spec.leak_every = Some(Duration::from_millis(100));
    spec.thresholds = "zombies = 10".into();
    bed.add_runner(spec)?;
    say(Event::Setup {
        what: format!(
            "a runner as PID 1 of its pid namespace, leaking a zombie every 100 ms; threshold 10, limit {limit}"
        ),
    });
    checks(
        &bed,
        &mut report,
        say,
        Duration::from_secs(20),
        |_, run, report, _| {
            let Some(o) = run.of("pid1").filter(|o| o["verdict"] == "degraded") else {
                return Ok(false);
            };
            report.facts.insert("degraded".into(), o.clone());
            Ok(true)
        },
    )?;
    Ok(report)
}

/// The table lies: the runner's control connection is gone (destroyed, and
/// the way to the server's attach port blocked, so it cannot reattach and
/// the server never hears of it), while the server's HTTP view — the
/// agent's probe here — still says `connected`.
pub fn table_lies(opts: &Options, say: &mut dyn FnMut(Event)) -> anyhow::Result<Report> {
    let mut report = Report::new("table_lies");
    let mut bed = Bed::new(opts, "tbl", Duration::from_secs(1))?;
    let mut spec = RunnerSpec::new("runner", Mode::Tokio);
    spec.probe_table = true;
    bed.add_runner(spec)?;
    bed.wait_working("runner", 1)?;
    bed.topo.drop_port(ATTACH_PORT)?;
    // The runner's socket dies where only the runner sees it.
    let out = bed
        .topo
        .runners
        .command(Path::new("ss"))
        .args(["-K", "dst"])
        .arg(bed.topo.dispatch_ip.to_string())
        .args(["dport", "=", &ATTACH_PORT.to_string()])
        .output()
        .context("cannot run ss -K (Debian package iproute2)")?;
    if !out.status.success() {
        bail!("ss -K: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let fault = Instant::now();
    say(Event::Fault {
        at_ms: bed.at_ms(),
        what: "the runner's control socket is destroyed and the attach port blocked; the server never hears".into(),
    });
    checks(
        &bed,
        &mut report,
        say,
        Duration::from_secs(20),
        |bed, run, report, _| {
            let Some(o) = run.of("runner").filter(|o| {
                o["reasons"]
                    .to_string()
                    .contains("status_contradicts_kernel")
            }) else {
                return Ok(false);
            };
            report.detect_ms = Some(fault.elapsed().as_millis() as u64);
            report.facts.insert("wedged".into(), o.clone());
            report.facts.insert("row".into(), bed.row("runner")?);
            Ok(true)
        },
    )?;
    Ok(report)
}

/// No false positives under load: `n` runners (alternately blocking and
/// tokio) streaming from the provider back to back for `length`.
pub fn load(
    opts: &Options,
    n: usize,
    length: Duration,
    say: &mut dyn FnMut(Event),
) -> anyhow::Result<Report> {
    let mut report = Report::new("load");
    let mut bed = Bed::new(opts, "load", Duration::from_millis(200))?;
    for i in 0..n {
        let mode = if i % 2 == 0 {
            Mode::Blocking
        } else {
            Mode::Tokio
        };
        let mut spec = RunnerSpec::new(&format!("r{i}"), mode);
        // 50 tokens 100 ms apart: each call streams for 5 s.
        spec.provider_path = "/v1/stream?first_ms=300&gap_ms=100&tokens=50".into();
        bed.add_runner(spec)?;
    }
    say(Event::Setup {
        what: format!("{n} runners streaming from the provider back to back for {length:?}"),
    });
    for i in 0..n {
        bed.wait_working(&format!("r{i}"), 0)?;
    }
    checks(&bed, &mut report, say, length, |_, _, _, _| Ok(false))?;
    let mut done = 0;
    for i in 0..n {
        done += bed.row(&format!("r{i}"))?["done"].as_u64().unwrap_or(0);
    }
    report.facts.insert("work_done".into(), done.into());
    Ok(report)
}

// ---------------------------------------------------------------------------
// Silent calls: a provider flow cut while the LLM thinks.

/// Who makes the provider call that goes silent, and what it waits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Caller {
    /// The testbed runner's blocking worker thread (a read on the socket).
    Blocking,
    /// The testbed runner's `--mode tokio` (an event loop in `epoll_wait`).
    Tokio,
    /// The official `openai` Python SDK (`tests/py/sdk_runner.py`).
    OpenAi,
    /// The official `anthropic` Python SDK, which enables SO_KEEPALIVE
    /// itself (60 s idle and interval, 5 probes).
    Anthropic,
    /// `openai.AsyncOpenAI` on asyncio (an event loop in `epoll_wait`).
    AsyncOpenAi,
    /// `anthropic.AsyncAnthropic` on asyncio (its own keepalive, as above).
    AsyncAnthropic,
    /// `litellm.acompletion` on its `openai/` route (what OpenHands and
    /// aider call), on asyncio.
    Litellm,
    /// The official `openai` Node SDK (`tests/node/sdk_runner.mjs`: undici
    /// under its fetch, on Node's event loop).
    NodeOpenAi,
    /// The official `@anthropic-ai/sdk` Node SDK, the same way.
    NodeAnthropic,
}

impl Caller {
    pub fn name(self) -> &'static str {
        match self {
            Caller::Blocking => "blocking",
            Caller::Tokio => "tokio",
            Caller::OpenAi => "openai",
            Caller::Anthropic => "anthropic",
            Caller::AsyncOpenAi => "openai_async",
            Caller::AsyncAnthropic => "anthropic_async",
            Caller::Litellm => "litellm",
            Caller::NodeOpenAi => "node_openai",
            Caller::NodeAnthropic => "node_anthropic",
        }
    }

    /// Whether it waits in an event loop's `epoll_wait`, where no thread
    /// is seen waiting on the socket of a call.
    pub fn event_loop(self) -> bool {
        matches!(
            self,
            Caller::Tokio
                | Caller::AsyncOpenAi
                | Caller::AsyncAnthropic
                | Caller::Litellm
                | Caller::NodeOpenAi
                | Caller::NodeAnthropic
        )
    }
}

/// A provider that never answers (thinks 600 s), for the testbed runners.
pub const NEVER: &str = "/v1/stream?first_ms=600000&gap_ms=100&tokens=20";
/// The same for the SDKs (the compatible APIs' pacing is the model name).
pub const NEVER_MODEL: &str = "think-600000-gap-100-tokens-20";
/// A model that answers at once: 5 tokens 20 ms apart.
pub const FAST_MODEL: &str = "think-100-gap-20-tokens-5";

/// The proof the silent-call scenarios configure: three probes a second
/// apart after a second of silence.
pub const PROOF: &str =
    "[agent.proof]\nkeepalive = true\nidle = \"1s\"\ninterval = \"1s\"\ncount = 3\n";

/// Where the SDK runners' status endpoints listen (runners' namespace).
const SDK_STATUS_PORT: u16 = 9101;
/// Where `proxy_cut`'s local proxy listens (runners' namespace).
const PROXY_PORT: u16 = 18443;

/// Where the SDK callers' programs are, from the workspace root:
/// `py/` (the Python SDKs' runner, an HTTP/2 provider) and `node/` (the
/// Node SDKs' runner, beside the `node_modules` that `cargo xtask setup`
/// installs there).
pub const SDK_CALLERS: &str = "tests";

/// `rel` in [`SDK_CALLERS`] of this source tree.
fn sdk_path(rel: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    root.parent().unwrap_or(root).join(SDK_CALLERS).join(rel)
}

/// The Python interpreter with the SDKs, and `tests/py/sdk_runner.py`
/// (`SELFHEAL_SDK_RUNNER` overrides where the script is).
pub fn sdk_runner() -> anyhow::Result<(PathBuf, PathBuf)> {
    let script = std::env::var_os("SELFHEAL_SDK_RUNNER")
        .map(PathBuf::from)
        .unwrap_or_else(|| sdk_path("py/sdk_runner.py"));
    if !script.exists() {
        bail!(
            "no SDK runner at {} (set SELFHEAL_SDK_RUNNER)",
            script.display()
        );
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys, openai, anthropic, litellm; print(sys.executable)",
        ])
        .output()
        .context("cannot run python3")?;
    if !out.status.success() {
        bail!(
            "python3 cannot import the openai and anthropic SDKs and litellm (`cargo xtask setup` installs them): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok((
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()),
        script,
    ))
}

/// `node` and `tests/node/sdk_runner.mjs`, with the Node SDKs installed
/// beside it (`cargo xtask setup` runs `npm ci` there).
pub fn node_sdk_runner() -> anyhow::Result<(PathBuf, PathBuf)> {
    let dir = sdk_path("node");
    for package in ["openai", "@anthropic-ai/sdk"] {
        if !dir.join("node_modules").join(package).exists() {
            bail!(
                "the Node SDK {package} is not installed in {} (`cargo xtask setup` installs it)",
                dir.display()
            );
        }
    }
    let node = Command::new("sh")
        .args(["-c", "command -v node"])
        .output()
        .context("cannot look for node")?;
    if !node.status.success() {
        bail!("no node on PATH (`cargo xtask setup` installs Debian's nodejs)");
    }
    Ok((
        PathBuf::from(String::from_utf8_lossy(&node.stdout).trim()),
        dir.join("sdk_runner.mjs"),
    ))
}

/// One call's milestone in a caller's output: the SDK runner's `call N
/// start|done tokens=K|failed: E`, or a testbed runner's `working W`,
/// `done W tokens=K`, `provider call for W failed: E`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallLine {
    Start(String),
    Done(String, u64),
    Failed(String, String),
}

impl CallLine {
    pub fn parse(line: &str) -> Option<CallLine> {
        if let Some(rest) = line.strip_prefix("call ") {
            let (n, what) = rest.split_once(' ')?;
            if what == "start" {
                return Some(CallLine::Start(n.into()));
            }
            if let Some(t) = what.strip_prefix("done tokens=") {
                return Some(CallLine::Done(n.into(), t.parse().ok()?));
            }
            return what
                .strip_prefix("failed: ")
                .map(|e| CallLine::Failed(n.into(), e.into()));
        }
        if let Some(id) = line.strip_prefix("working ") {
            return Some(CallLine::Start(id.into()));
        }
        if let Some(rest) = line.strip_prefix("provider call for ") {
            let (id, e) = rest.split_once(" failed: ")?;
            return Some(CallLine::Failed(id.into(), e.into()));
        }
        let (id, t) = line.strip_prefix("done ")?.split_once(" tokens=")?;
        Some(CallLine::Done(id.into(), t.parse().ok()?))
    }
}

/// What a caller's calls did, from its output.
#[derive(Debug, Default)]
struct Calls {
    /// The call in flight when the flow was cut.
    cut: Option<String>,
    started: Vec<String>,
    failed: Option<(String, String, u64)>,
    next_started: Option<(String, u64)>,
    next_done: Option<(String, u64, u64)>,
    /// Calls done and failed, all told.
    done: u64,
    failed_total: u64,
}

/// Appends the call lines `name` printed since the last read to `lines`,
/// narrating each.
fn read_calls(bed: &Bed, name: &str, lines: &mut Vec<CallLine>, say: &mut dyn FnMut(Event)) {
    for line in bed.lines(name).unwrap_or_default() {
        if let Some(c) = CallLine::parse(&line) {
            say(Event::Note {
                at_ms: bed.at_ms(),
                text: format!("{name}: {line}"),
            });
            lines.push(c);
        }
    }
}

impl Calls {
    /// Reads what `name` printed; `since` is the cut (None before it).
    fn read(&mut self, bed: &Bed, name: &str, since: Option<Instant>, say: &mut dyn FnMut(Event)) {
        for line in bed.lines(name).unwrap_or_default() {
            let Some(c) = CallLine::parse(&line) else {
                continue;
            };
            let at = since.map_or(0, |t| t.elapsed().as_millis() as u64);
            say(Event::Note {
                at_ms: bed.at_ms(),
                text: format!("{name}: {line}"),
            });
            match &c {
                CallLine::Done(..) => self.done += 1,
                CallLine::Failed(..) => self.failed_total += 1,
                CallLine::Start(_) => {}
            }
            match c {
                CallLine::Start(id) => {
                    if since.is_some()
                        && self.next_started.is_none()
                        && self.cut.as_ref() != Some(&id)
                    {
                        self.next_started = Some((id.clone(), at));
                    }
                    self.started.push(id);
                }
                CallLine::Failed(id, e) if since.is_some() && self.cut.as_ref() == Some(&id) => {
                    self.failed.get_or_insert((id, e, at));
                }
                CallLine::Done(id, tokens)
                    if self.next_started.as_ref().is_some_and(|(n, _)| *n == id) =>
                {
                    self.next_done.get_or_insert((id, tokens, at));
                }
                _ => {}
            }
        }
    }
}

/// A TCP socket of a process: its fd, and its row of the process's own
/// namespace's `/proc/PID/net/tcp`.
#[derive(Clone, Debug, Serialize)]
pub struct TcpSocket {
    pub fd: i32,
    pub inode: u64,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// The kernel's TCP state (1: established).
    pub state: u8,
}

/// The IPv4 TCP sockets process `pid` holds.
pub fn tcp_sockets(pid: u32) -> anyhow::Result<Vec<TcpSocket>> {
    let mut fds = BTreeMap::new();
    let dir = format!("/proc/{pid}/fd");
    for e in std::fs::read_dir(&dir)
        .with_context(|| format!("cannot read {dir}"))?
        .flatten()
    {
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        let inode = selfheal::proc::socket_inode_of_target(&target.to_string_lossy());
        if let (Some(inode), Ok(fd)) = (inode, e.file_name().to_string_lossy().parse::<i32>()) {
            fds.insert(inode, fd);
        }
    }
    let path = format!("/proc/{pid}/net/tcp");
    let table = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    let hex = |s: &str| -> Option<SocketAddr> {
        let (ip, port) = s.split_once(':')?;
        let ip = u32::from_str_radix(ip, 16).ok()?;
        let port = u16::from_str_radix(port, 16).ok()?;
        Some(SocketAddr::from((
            std::net::Ipv4Addr::from(ip.to_ne_bytes()),
            port,
        )))
    };
    let mut out = Vec::new();
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 10 {
            continue;
        }
        let Some(&fd) = f[9].parse::<u64>().ok().as_ref().and_then(|i| fds.get(i)) else {
            continue;
        };
        if let (Some(local), Some(remote)) = (hex(f[1]), hex(f[2])) {
            out.push(TcpSocket {
                fd,
                inode: f[9].parse().unwrap_or(0),
                local,
                remote,
                state: u8::from_str_radix(f[3], 16).unwrap_or(0),
            });
        }
    }
    Ok(out)
}

/// Process `pid`'s established connections to `remote`.
fn connections_to(pid: u32, remote: SocketAddr) -> Vec<TcpSocket> {
    tcp_sockets(pid)
        .unwrap_or_default()
        .into_iter()
        .filter(|s| s.remote == remote && s.state == 1)
        .collect()
}

/// What each thread of `pid` waits in: `tid: syscall` (with `on fd N` for
/// a receive whose first argument is a socket in `fds`).
pub fn waits(pid: u32, fds: &[i32]) -> Vec<String> {
    let name = |nr: u64| match nr {
        0 => "read",
        7 => "poll",
        23 => "select",
        35 => "nanosleep",
        45 => "recvfrom",
        47 => "recvmsg",
        202 => "futex",
        230 => "clock_nanosleep",
        232 => "epoll_wait",
        270 => "pselect6",
        271 => "ppoll",
        281 => "epoll_pwait",
        288 => "accept4",
        441 => "epoll_pwait2",
        _ => "other",
    };
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let Ok(text) = std::fs::read_to_string(t.path().join("syscall")) else {
            continue;
        };
        let f: Vec<&str> = text.split_whitespace().collect();
        let Some(nr) = f.first().and_then(|n| n.parse::<u64>().ok()) else {
            out.push(format!(
                "{}: {}",
                t.file_name().to_string_lossy(),
                text.trim()
            ));
            continue;
        };
        let arg0 = f
            .get(1)
            .and_then(|a| i64::from_str_radix(a.trim_start_matches("0x"), 16).ok());
        let on = match arg0 {
            Some(fd) if matches!(nr, 0 | 45 | 47) && fds.contains(&(fd as i32)) => {
                format!(" on the provider socket (fd {fd})")
            }
            _ => String::new(),
        };
        out.push(format!(
            "{}: {}{on}",
            t.file_name().to_string_lossy(),
            name(nr)
        ));
    }
    out.sort();
    out
}

/// An `[[agent]]` block for an SDK runner named `name` calling `upstream`.
/// The config block of an SDK runner. With `claims`, its status probe reads
/// the agent's `current_task`; without, the probe only says it answers,
/// and whether a call is in flight rests on the kernel alone.
fn sdk_agent(
    name: &str,
    script: &str,
    upstream: SocketAddr,
    status: SocketAddr,
    provider_extra: &str,
    claims: bool,
) -> String {
    let fields = if claims {
        "fields = { current_task = \"/current_task\" }\n"
    } else {
        ""
    };
    format!(
        "[[agent]]\nname = \"{name}\"\nmatch = {{ cmdline = \"{script} --name {name} \" }}\n\
         [[agent.upstream]]\nrole = \"provider\"\naddr = \"{upstream}\"\n{provider_extra}\
         [[agent.probe]]\nurl = \"http://{status}/status\"\ntimeout = \"1s\"\n{fields}\
         [agent.thresholds]\nsuspect_after = \"2s\"\nrecv_blocked = \"2s\"\n\
         [agent.heal]\nstep_window = \"5s\"\nbackoff = \"1s\"\n{PROOF}"
    )
}

/// Starts caller `name` of kind `caller` against `upstream` (the
/// provider, or a proxy before it): its first call never answers, later
/// ones answer at once. `models` (SDK callers only) overrides the first
/// calls' models, one thread per model.
fn start_caller(
    bed: &mut Bed,
    name: &str,
    caller: Caller,
    upstream: SocketAddr,
    provider_extra: &str,
    models: Option<Vec<String>>,
) -> anyhow::Result<()> {
    start_caller_with(bed, name, caller, upstream, provider_extra, models, &[])
}

/// [`start_caller`], with more arguments for an SDK runner
/// (`tests/py/sdk_runner.py`: `--pause-ms`, `--whole`).
fn start_caller_with(
    bed: &mut Bed,
    name: &str,
    caller: Caller,
    upstream: SocketAddr,
    provider_extra: &str,
    models: Option<Vec<String>>,
    extra: &[&str],
) -> anyhow::Result<()> {
    let sdk = match caller {
        Caller::Blocking | Caller::Tokio => {
            let mut spec = RunnerSpec::new(
                name,
                if caller == Caller::Blocking {
                    Mode::Blocking
                } else {
                    Mode::Tokio
                },
            );
            spec.provider_path = NEVER.into();
            spec.then_path = Some(FAST.into());
            spec.extra = PROOF.into();
            return bed.add_runner(spec);
        }
        Caller::OpenAi => "openai",
        Caller::Anthropic => "anthropic",
        Caller::AsyncOpenAi => "openai-async",
        Caller::AsyncAnthropic => "anthropic-async",
        Caller::Litellm => "litellm",
        Caller::NodeOpenAi => "openai",
        Caller::NodeAnthropic => "anthropic",
    };
    let node = matches!(caller, Caller::NodeOpenAi | Caller::NodeAnthropic);
    let (program, script) = if node {
        node_sdk_runner()?
    } else {
        sdk_runner()?
    };
    let status = SocketAddr::from(([127, 0, 0, 1], SDK_STATUS_PORT));
    let base = match caller {
        Caller::Anthropic | Caller::AsyncAnthropic | Caller::NodeAnthropic => {
            format!("http://{upstream}")
        }
        _ => format!("http://{upstream}/v1"),
    };
    let mut cmd = bed.topo.runners.command(&program);
    cmd.arg(&script)
        .args([
            "--name",
            name,
            "--sdk",
            sdk,
            "--base-url",
            &base,
            "--status",
        ])
        .arg(status.to_string());
    // OpenAI's API sends the response head with the first token, Anthropic's
    // at once: the first call's head comes as each provider's would. The
    // event-loop clients get the hard case: the head and the first event
    // (role chunk, `message_start`) 300 ms after the request (so the last
    // thing on the socket is plainly a receive), then the thinking.
    let models = models.unwrap_or_else(|| match caller {
        Caller::OpenAi => vec![format!("{NEVER_MODEL}-head-late")],
        Caller::AsyncOpenAi
        | Caller::AsyncAnthropic
        | Caller::Litellm
        | Caller::NodeOpenAi
        | Caller::NodeAnthropic => vec![format!("{NEVER_MODEL}-first-early-lag-300")],
        _ => vec![NEVER_MODEL.into()],
    });
    cmd.args(extra);
    if models.len() > 1 {
        cmd.args(["--threads", &models.len().to_string()]);
    } else {
        cmd.args(["--then-model", FAST_MODEL]);
    }
    for m in &models {
        cmd.args(["--model", m]);
    }
    // The event-loop SDKs' agents tell nothing of their calls: the hard
    // case, where only the kernel's evidence and the proof can tell.
    let script_name = script
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let block = sdk_agent(
        name,
        &script_name,
        upstream,
        status,
        provider_extra,
        !caller.event_loop(),
    );
    bed.spawn(name, cmd, Some(block))?;
    bed.expect_line(name, "ready", Duration::from_secs(30))?;
    Ok(())
}

/// Records the longest `selfheal check` run so far.
fn note_check_time(report: &mut Report, took: Duration) {
    let ms = took.as_millis() as u64;
    let max = report
        .facts
        .entry("check_ms_max".into())
        .or_insert(0.into());
    if max.as_u64() < Some(ms) {
        *max = ms.into();
    }
}

/// The silent call: caller `caller` waits for an LLM that never answers;
/// 1 s into the wait the gateway drops the provider flow both ways without
/// a FIN or RST. Only the proof can tell: a live peer would ACK the proof
/// keepalive's probes, a dead one does not. selfheal must call it
/// `wedged`, heal it so that the caller's own call fails (same process),
/// and the caller's next call must start and complete.
pub fn silent_cut(
    opts: &Options,
    caller: Caller,
    say: &mut dyn FnMut(Event),
) -> anyhow::Result<Report> {
    silent_cut_of(opts, caller, None, say)
}

/// [`silent_cut`] with the SDK caller's first call on `model` (how the
/// provider paces its head and first event: [`Pacing`](super::provider::Pacing)),
/// named after it.
pub fn silent_cut_of(
    opts: &Options,
    caller: Caller,
    model: Option<&str>,
    say: &mut dyn FnMut(Event),
) -> anyhow::Result<Report> {
    let name = "caller";
    let mut report = Report::new(&match model {
        None => format!("silent_cut_{}", caller.name()),
        Some(m) => format!("silent_cut_{}_{m}", caller.name()),
    });
    let mut bed = Bed::new(opts, "sil", Duration::from_millis(500))?;
    let provider = bed.provider();
    start_caller(
        &mut bed,
        name,
        caller,
        provider,
        "",
        model.map(|m| vec![m.to_string()]),
    )?;
    say(Event::Setup {
        what: format!(
            "caller {} calls the provider {provider} with a model that thinks 600 s; suspect after 2 s, proof keepalive 1 s idle + 3 × 1 s; a check every {} ms",
            caller.name(),
            opts.check_every.as_millis()
        ),
    });
    let pid = bed.pid(name)?;
    let cut = cut_while_thinking(&mut bed, &mut report, name, pid, pid, provider, say)?;
    let mut calls = cut.calls;
    let fault = cut.at;
    checks(
        &bed,
        &mut report,
        say,
        Duration::from_secs(60),
        |bed, run, report, say| {
            let verdict = run.of(name).map(|o| o["verdict"].clone());
            if report.detect_ms.is_none() && verdict.as_ref().is_some_and(|v| v == "wedged") {
                report.detect_ms = Some(fault.elapsed().as_millis() as u64);
                if let Some(o) = run.of(name) {
                    report.facts.insert("wedged".into(), o.clone());
                }
            }
            calls.read(bed, name, Some(fault), say);
            Ok(calls.failed.is_some() && calls.next_done.is_some())
        },
    )?;
    finish_calls(&mut bed, &mut report, name, pid, &calls, fault)?;
    Ok(report)
}

/// What [`cut_while_thinking`] did.
struct Cut {
    at: Instant,
    calls: Calls,
}

/// Waits for `caller`'s call to be in flight, checks for about a second,
/// then drops every established flow of `holder` (the caller, or a proxy
/// in front of it) to `remote`. Records the verdicts before the cut, what
/// the caller waits in, and the flows cut.
fn cut_while_thinking(
    bed: &mut Bed,
    report: &mut Report,
    caller: &str,
    pid: u32,
    holder: u32,
    remote: SocketAddr,
    say: &mut dyn FnMut(Event),
) -> anyhow::Result<Cut> {
    let mut calls = Calls::default();
    bed.wait("the caller's first call", Duration::from_secs(30), || {
        calls.read(bed, caller, None, say);
        Ok(calls.started.first().cloned())
    })?;
    calls.cut = calls.started.first().cloned();
    let flows = bed.wait("the provider connection", Duration::from_secs(10), || {
        let c = connections_to(holder, remote);
        Ok((!c.is_empty()).then_some(c))
    })?;
    // About a second of checks while the call is in flight, before the cut.
    checks(
        bed,
        report,
        say,
        Duration::from_millis(1000),
        |_, _, _, _| Ok(false),
    )?;
    report.facts.insert(
        "verdicts_before_cut".into(),
        serde_json::to_value(report.verdicts.get(caller).cloned().unwrap_or_default())?,
    );
    let fds: Vec<i32> = connections_to(
        pid,
        if pid == holder {
            remote
        } else {
            SocketAddr::from(([127, 0, 0, 1], PROXY_PORT))
        },
    )
    .iter()
    .map(|s| s.fd)
    .collect();
    report
        .facts
        .insert("waits".into(), serde_json::to_value(waits(pid, &fds))?);
    // The caller's own keepalive options on its provider socket (the
    // anthropic SDK sets SO_KEEPALIVE itself), before any proof.
    if let (Some(&fd), Some(start)) = (fds.first(), selfheal::pidfd::start_ticks(pid)) {
        let ka = selfheal::actions::guard::open_target(pid, start)
            .and_then(|t| selfheal::actions::keepalive::read_keepalive(&t, fd));
        report.facts.insert(
            "caller_keepalive".into(),
            match ka {
                Ok(k) => serde_json::to_value(k)?,
                Err(e) => e.to_string().into(),
            },
        );
    }
    for f in &flows {
        bed.topo.drop_provider_flow(f.local)?;
    }
    let at = Instant::now();
    report
        .facts
        .insert("cut".into(), serde_json::to_value(&flows)?);
    say(Event::Fault {
        at_ms: bed.at_ms(),
        what: format!(
            "the gateway drops the provider flow(s) {} ↔ {remote} both ways, without a FIN or RST, while the LLM thinks",
            flows
                .iter()
                .map(|f| f.local.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    });
    Ok(Cut { at, calls })
}

/// Records what the caller's calls did after the cut, and that it is the
/// same process.
fn finish_calls(
    bed: &mut Bed,
    report: &mut Report,
    name: &str,
    pid: u32,
    calls: &Calls,
    fault: Instant,
) -> anyhow::Result<()> {
    if let Some((id, e, ms)) = &calls.failed {
        report.facts.insert("call_failed_ms".into(), (*ms).into());
        report
            .facts
            .insert("call_failed_error".into(), e.clone().into());
        report
            .facts
            .insert("call_failed_id".into(), id.clone().into());
    }
    if let Some((id, ms)) = &calls.next_started {
        report
            .facts
            .insert("next_call_started_ms".into(), (*ms).into());
        report
            .facts
            .insert("next_call_id".into(), id.clone().into());
    }
    if let Some((_, tokens, ms)) = &calls.next_done {
        report
            .facts
            .insert("next_call_done_ms".into(), (*ms).into());
        report
            .facts
            .insert("next_call_tokens".into(), (*tokens).into());
        if report.recover_ms.is_none() {
            report.recover_ms = Some(*ms);
        }
    }
    report.facts.insert("pid".into(), pid.into());
    let same = bed.running(name)? && bed.pid(name)? == pid;
    report.facts.insert("same_pid".into(), same.into());
    report
        .facts
        .insert("ran_ms".into(), (fault.elapsed().as_millis() as u64).into());
    Ok(())
}

/// One hop: the caller (the openai SDK) talks to a local TCP proxy on
/// loopback, the proxy to the provider; the proxy→provider flow is cut
/// while the LLM thinks. The proxy's kernel answers the proof keepalive's
/// probes, so the proof says alive and the verdict must never be `wedged`;
/// the provider upstream's `max_silence = "8s"` must make it
/// `unresponsive` (`silence_exceeded`) instead.
pub fn proxy_cut(opts: &Options, say: &mut dyn FnMut(Event)) -> anyhow::Result<Report> {
    let name = "caller";
    let mut report = Report::new("proxy_cut");
    let mut bed = Bed::new(opts, "pxy", Duration::from_millis(500))?;
    let provider = bed.provider();
    let proxy = SocketAddr::from(([127, 0, 0, 1], PROXY_PORT));
    let mut cmd = bed.topo.runners.command(&bed.opts.testbed);
    cmd.args(["proxy", "--listen"])
        .arg(proxy.to_string())
        .arg("--upstream")
        .arg(provider.to_string());
    bed.spawn("proxy", cmd, None)?;
    bed.expect_line("proxy", "listening", Duration::from_secs(10))?;
    start_caller(
        &mut bed,
        name,
        Caller::OpenAi,
        proxy,
        "max_silence = \"8s\"\n",
        None,
    )?;
    say(Event::Setup {
        what: format!(
            "caller openai → proxy {proxy} → provider {provider}, a model that thinks 600 s; max_silence 8 s, suspect after 2 s; a check every {} ms",
            opts.check_every.as_millis()
        ),
    });
    let pid = bed.pid(name)?;
    let holder = bed.pid("proxy")?;
    let cut = cut_while_thinking(&mut bed, &mut report, name, pid, holder, provider, say)?;
    let mut calls = cut.calls;
    let fault = cut.at;
    let mut after = 0;
    checks(
        &bed,
        &mut report,
        say,
        Duration::from_secs(30),
        |bed, run, report, say| {
            calls.read(bed, name, Some(fault), say);
            let Some(o) = run.of(name) else {
                return Ok(false);
            };
            let silence = o["reasons"]
                .as_array()
                .is_some_and(|r| r.iter().any(|r| r["code"] == "silence_exceeded"));
            if report.detect_ms.is_none() && o["verdict"] == "unresponsive" && silence {
                report.detect_ms = Some(fault.elapsed().as_millis() as u64);
                report.facts.insert("unresponsive".into(), o.clone());
            }
            // A few more checks: it must not turn `wedged` later either.
            if report.detect_ms.is_some() {
                after += 1;
            }
            Ok(after > 3)
        },
    )?;
    finish_calls(&mut bed, &mut report, name, pid, &calls, fault)?;
    Ok(report)
}

/// No false heals at scale: one agent (an SDK runner, one process) with `n`
/// callers (`caller`: threads of the sync SDK, or tasks of one event loop),
/// each calling a model that thinks between 30 and 300 s (spread evenly;
/// every other one sends the response head only with the first token, the
/// others at once, and for an event loop with the first event too) and
/// then streams, checked every `opts.check_every` for `length`. Every provider socket's keepalive options are read before
/// the first check and again while it thinks, every 15 s (through pidfd,
/// as root): the proof must put back what it changed.
pub fn many_thinking(
    opts: &Options,
    caller: Caller,
    n: usize,
    length: Duration,
    say: &mut dyn FnMut(Event),
) -> anyhow::Result<Report> {
    use selfheal::actions::{guard::open_target, keepalive::read_keepalive};
    let name = "thinkers";
    let mut report = Report::new(&format!("many_thinking_{}", caller.name()));
    let mut bed = Bed::new(opts, "many", Duration::from_secs(1))?;
    let provider = bed.provider();
    let models: Vec<String> = (0..n)
        .map(|i| {
            let think = 30_000 + (270_000 * i as u64) / (n.max(2) as u64 - 1);
            // Half send the response head at once, half with the first token.
            let head = match (i % 2, caller.event_loop()) {
                (0, true) => "early-first-early",
                (0, false) => "early",
                _ => "late",
            };
            format!("think-{think}-gap-100-tokens-20-head-{head}")
        })
        .collect();
    start_caller(&mut bed, name, caller, provider, "", Some(models))?;
    say(Event::Setup {
        what: format!(
            "one {} SDK process, {n} callers, each calling a model that thinks 30–300 s then streams 20 tokens; a check every {} ms for {length:?}",
            caller.name(),
            opts.check_every.as_millis()
        ),
    });
    let pid = bed.pid(name)?;
    let start = selfheal::pidfd::start_ticks(pid).context("the caller's start time")?;
    let baseline = bed.wait("every call's connection", Duration::from_secs(60), || {
        let c = connections_to(pid, provider);
        Ok((c.len() >= n).then_some(c))
    })?;
    let read = |fd: i32| -> anyhow::Result<selfheal_core::keepalive::KeepaliveSettings> {
        let target = open_target(pid, start)?;
        Ok(read_keepalive(&target, fd)?)
    };
    let mut before = BTreeMap::new();
    for s in &baseline {
        before.insert(s.inode, (s.fd, read(s.fd)?));
    }
    report.facts.insert(
        "keepalive_before".into(),
        serde_json::to_value(before.values().map(|(_, k)| k).next())?,
    );
    // A socket's options are compared right after the check that put them
    // back (its `proofs` say which): between proofs they must be the
    // socket's own again. While a proof is armed they are the proof's.
    let mut compared = 0u64;
    let (mut armed, mut restored) = (0u64, 0u64);
    let mut mismatches: Vec<String> = Vec::new();
    let mut compare = |report: &mut Report, run: &CheckRun| -> anyhow::Result<()> {
        let events = run
            .of(name)
            .and_then(|o| o["proofs"].as_array().cloned())
            .unwrap_or_default();
        armed += events
            .iter()
            .filter(|e| e["action"] == "arm" && e["ok"] == true)
            .count() as u64;
        let back: Vec<u64> = events
            .iter()
            .filter(|e| e["action"] == "restore" && e["ok"] == true)
            .filter_map(|e| e["inode"].as_u64())
            .collect();
        restored += back.len() as u64;
        for s in connections_to(pid, provider)
            .into_iter()
            .filter(|s| back.contains(&s.inode))
        {
            let Some((fd, old)) = before.get(&s.inode) else {
                continue;
            };
            if *fd != s.fd {
                continue;
            }
            let now = read(s.fd)?;
            compared += 1;
            if now != *old {
                mismatches.push(format!("fd {fd}: before {old:?}, now {now:?}"));
            }
        }
        report
            .facts
            .insert("keepalive_compared".into(), compared.into());
        report.facts.insert("proofs_armed".into(), armed.into());
        report
            .facts
            .insert("proofs_restored".into(), restored.into());
        report.facts.insert(
            "keepalive_mismatches".into(),
            serde_json::to_value(&mismatches)?,
        );
        Ok(())
    };
    let mut calls = Calls::default();
    checks(&bed, &mut report, say, length, |bed, run, report, say| {
        calls.read(bed, name, None, say);
        compare(report, run)?;
        Ok(false)
    })?;
    calls.read(&bed, name, None, say);
    report
        .facts
        .insert("calls_started".into(), calls.started.len().into());
    report.facts.insert("calls_done".into(), calls.done.into());
    report
        .facts
        .insert("calls_failed".into(), calls.failed_total.into());
    report.facts.insert("pid".into(), pid.into());
    report.facts.insert(
        "same_pid".into(),
        (bed.running(name)? && bed.pid(name)? == pid).into(),
    );
    Ok(report)
}

/// An idle pooled connection whose peer is cut: the sync openai SDK makes a
/// call that answers at once (not streamed: the SDK closes a streamed
/// answer's connection at `[DONE]`), then pauses 20 s with its connection
/// idle in its pool, and the flow is cut 1 s into the pause. Nobody waits on it, so
/// the proof's answer decides alone: `idle_connection_dead` (degraded, not
/// wedged), a snapshot, and the connection ended before the next call,
/// which goes out on a fresh connection and completes at once.
pub fn pooled_cut(opts: &Options, say: &mut dyn FnMut(Event)) -> anyhow::Result<Report> {
    let name = "pooled";
    let mut report = Report::new("pooled_cut");
    let mut bed = Bed::new(opts, "pool", Duration::from_millis(500))?;
    let provider = bed.provider();
    start_caller_with(
        &mut bed,
        name,
        Caller::OpenAi,
        provider,
        "",
        Some(vec![format!("{FAST_MODEL}-pool")]),
        &["--whole", "--pause-ms", "20000"],
    )?;
    say(Event::Setup {
        what: format!(
            "the openai SDK calls {provider} with a model that answers at once, then pauses 20 s with its connection idle in its pool; suspect after 2 s; a check every {} ms",
            opts.check_every.as_millis()
        ),
    });
    let pid = bed.pid(name)?;
    let mut lines: Vec<CallLine> = Vec::new();
    bed.wait("the first call done", Duration::from_secs(30), || {
        read_calls(&bed, name, &mut lines, say);
        Ok(lines
            .iter()
            .any(|l| matches!(l, CallLine::Done(..)))
            .then_some(()))
    })?;
    let flows = bed.wait("the pooled connection", Duration::from_secs(10), || {
        let c = connections_to(pid, provider);
        Ok((!c.is_empty()).then_some(c))
    })?;
    std::thread::sleep(Duration::from_secs(1));
    for f in &flows {
        bed.topo.drop_provider_flow(f.local)?;
    }
    let cut = Instant::now();
    report
        .facts
        .insert("cut".into(), serde_json::to_value(&flows)?);
    say(Event::Fault {
        at_ms: bed.at_ms(),
        what: format!(
            "the gateway drops the idle pooled flow(s) {} ↔ {provider} both ways, without a FIN or RST",
            flows
                .iter()
                .map(|f| f.local.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    });
    let done_before = lines
        .iter()
        .filter(|l| matches!(l, CallLine::Done(..)))
        .count();
    let (mut next_start, mut next_done): (Option<u64>, Option<u64>) = (None, None);
    let mut next_local: Option<String> = None;
    checks(
        &bed,
        &mut report,
        say,
        Duration::from_secs(40),
        |bed, run, report, say| {
            let at = cut.elapsed().as_millis() as u64;
            if let Some(o) = run.of(name)
                && report.detect_ms.is_none()
                && o["reasons"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|r| r["code"] == "idle_connection_dead"))
            {
                report.detect_ms = Some(at);
                report.facts.insert("ended".into(), o.clone());
            }
            let seen = lines.len();
            read_calls(bed, name, &mut lines, say);
            for l in &lines[seen..] {
                match l {
                    CallLine::Start(_) if next_start.is_none() => next_start = Some(at),
                    CallLine::Done(..)
                        if next_done.is_none()
                            && lines
                                .iter()
                                .filter(|l| matches!(l, CallLine::Done(..)))
                                .count()
                                > done_before =>
                    {
                        next_done = Some(at)
                    }
                    _ => {}
                }
            }
            if next_start.is_some() && next_local.is_none() {
                next_local = connections_to(pid, provider)
                    .first()
                    .map(|s| s.local.to_string());
            }
            Ok(next_done.is_some())
        },
    )?;
    let failed = lines
        .iter()
        .filter(|l| matches!(l, CallLine::Failed(..)))
        .count();
    report.facts.insert("calls_failed".into(), failed.into());
    if let Some(ms) = next_start {
        report
            .facts
            .insert("next_call_started_ms".into(), ms.into());
    }
    if let Some(ms) = next_done {
        report.facts.insert("next_call_done_ms".into(), ms.into());
        report.recover_ms = Some(ms);
    }
    report.facts.insert(
        "next_call_local".into(),
        next_local.map_or(serde_json::Value::Null, Into::into),
    );
    report.facts.insert("pid".into(), pid.into());
    report.facts.insert(
        "same_pid".into(),
        (bed.running(name)? && bed.pid(name)? == pid).into(),
    );
    Ok(report)
}

/// A connect that never completes: the provider's SYNs go unanswered from
/// the start, and `litellm.acompletion` (which waits out the kernel's SYN
/// retries, about 130 s) calls it. The upstream's `connect_timeout = "3s"`
/// must make it `unresponsive` (`connect_timeout`), the heal end the
/// attempt so the caller's connect fails now (its own error path, same
/// pid); then the provider answers again and the next call completes.
pub fn hanging_connect(opts: &Options, say: &mut dyn FnMut(Event)) -> anyhow::Result<Report> {
    let name = "connecting";
    let mut report = Report::new("hanging_connect");
    let mut bed = Bed::new(opts, "syn", Duration::from_millis(500))?;
    let provider = bed.provider();
    bed.topo.drop_provider_syns(provider.port())?;
    let fault = Instant::now();
    say(Event::Fault {
        at_ms: bed.at_ms(),
        what: format!("the provider {provider} answers no new connection (its SYNs dropped)"),
    });
    start_caller_with(
        &mut bed,
        name,
        Caller::Litellm,
        provider,
        "connect_timeout = \"3s\"\n",
        Some(vec![FAST_MODEL.into()]),
        &[],
    )?;
    say(Event::Setup {
        what: format!(
            "litellm calls {provider}; connect_timeout 3 s; a check every {} ms",
            opts.check_every.as_millis()
        ),
    });
    let pid = bed.pid(name)?;
    let mut lines: Vec<CallLine> = Vec::new();
    let (mut started, mut failed, mut done): (Option<u64>, Option<(u64, String)>, Option<u64>) =
        (None, None, None);
    let mut syn_sent: Option<u64> = None;
    let mut answering = false;
    checks(
        &bed,
        &mut report,
        say,
        Duration::from_secs(60),
        |bed, run, report, say| {
            let at = fault.elapsed().as_millis() as u64;
            if syn_sent.is_none()
                && tcp_sockets(pid)
                    .unwrap_or_default()
                    .iter()
                    .any(|s| s.remote == provider && s.state == 2)
            {
                syn_sent = Some(at);
            }
            if let Some(o) = run.of(name)
                && report.detect_ms.is_none()
                && o["reasons"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|r| r["code"] == "connect_timeout"))
            {
                report.detect_ms = Some(at);
                report.facts.insert("unresponsive".into(), o.clone());
            }
            read_calls(bed, name, &mut lines, say);
            for l in &lines {
                match l {
                    CallLine::Start(_) if started.is_none() => started = Some(at),
                    CallLine::Failed(_, e) if failed.is_none() => failed = Some((at, e.clone())),
                    CallLine::Done(..) if done.is_none() => done = Some(at),
                    _ => {}
                }
            }
            // Once the attempt has failed, the provider answers again.
            if failed.is_some() && !answering {
                bed.topo.answer_provider_syns(provider.port())?;
                answering = true;
            }
            Ok(done.is_some())
        },
    )?;
    if !answering {
        bed.topo.answer_provider_syns(provider.port())?;
    }
    if let Some(ms) = syn_sent {
        report.facts.insert("syn_sent_seen_ms".into(), ms.into());
    }
    if let Some(ms) = started {
        report.facts.insert("call_started_ms".into(), ms.into());
    }
    if let Some((ms, e)) = failed {
        report.facts.insert("call_failed_ms".into(), ms.into());
        report.facts.insert("call_failed_error".into(), e.into());
    }
    if let Some(ms) = done {
        report.facts.insert("next_call_done_ms".into(), ms.into());
        report.recover_ms = Some(ms);
    }
    report.facts.insert(
        "same_pid".into(),
        (bed.running(name)? && bed.pid(name)? == pid).into(),
    );
    Ok(report)
}

/// Where the HTTP/2 provider listens (the provider's namespace).
const H2_PROVIDER_PORT: u16 = 8444;

/// One connection, many calls: `AsyncOpenAI` over HTTP/2 (httpx, prior
/// knowledge) makes `calls` concurrent streaming calls, all on one
/// connection to an HTTP/2 provider (`tests/py/h2_provider.py`) that sends
/// each head and first event at once and then thinks 600 s; the flow is cut
/// while they think. The proof is of the connection: one proof keepalive,
/// `wedged`, and every call on it fails in the SDK, same pid; the next ones
/// (on a fresh connection) complete.
pub fn http2_cut(
    opts: &Options,
    calls: usize,
    say: &mut dyn FnMut(Event),
) -> anyhow::Result<Report> {
    let name = "multiplexed";
    let mut report = Report::new("http2_cut");
    let mut bed = Bed::new(opts, "h2", Duration::from_millis(500))?;
    let (python, _) = sdk_runner()?;
    let provider = SocketAddr::from((bed.topo.provider_ip, H2_PROVIDER_PORT));
    let mut cmd = bed.topo.provider.command(&python);
    cmd.arg(sdk_path("py/h2_provider.py"))
        .args(["--listen", &provider.to_string()]);
    bed.spawn("h2provider", cmd, None)?;
    bed.expect_line("h2provider", "listening", Duration::from_secs(30))?;
    start_caller_with(
        &mut bed,
        name,
        Caller::AsyncOpenAi,
        provider,
        "",
        Some(vec![format!("{NEVER_MODEL}-first-early"); calls]),
        &["--http2", "--then-model", FAST_MODEL],
    )?;
    say(Event::Setup {
        what: format!(
            "AsyncOpenAI over HTTP/2 makes {calls} concurrent calls to {provider}, each thinking 600 s after its head and first event; suspect after 2 s; a check every {} ms",
            opts.check_every.as_millis()
        ),
    });
    let pid = bed.pid(name)?;
    let mut lines: Vec<CallLine> = Vec::new();
    bed.wait("every call thinking", Duration::from_secs(30), || {
        read_calls(&bed, name, &mut lines, say);
        let thinking = bed
            .lines("h2provider")
            .unwrap_or_default()
            .iter()
            .filter(|l| l.starts_with("call "))
            .count();
        Ok((lines
            .iter()
            .filter(|l| matches!(l, CallLine::Start(_)))
            .count()
            >= calls
            && thinking > 0)
            .then_some(()))
    })?;
    std::thread::sleep(Duration::from_millis(500));
    let flows = connections_to(pid, provider);
    report
        .facts
        .insert("connections".into(), flows.len().into());
    checks(
        &bed,
        &mut report,
        say,
        Duration::from_millis(1000),
        |_, _, _, _| Ok(false),
    )?;
    for f in &flows {
        bed.topo.drop_provider_flow(f.local)?;
    }
    let cut = Instant::now();
    say(Event::Fault {
        at_ms: bed.at_ms(),
        what: format!(
            "the gateway drops the one HTTP/2 flow {} ↔ {provider} both ways, without a FIN or RST, while {calls} calls think",
            flows
                .iter()
                .map(|f| f.local.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    });
    let (mut failed_at, mut done_after): (Vec<u64>, Option<u64>) = (Vec::new(), None);
    checks(
        &bed,
        &mut report,
        say,
        Duration::from_secs(60),
        |bed, run, report, say| {
            let at = cut.elapsed().as_millis() as u64;
            if report.detect_ms.is_none() && run.of(name).is_some_and(|o| o["verdict"] == "wedged")
            {
                report.detect_ms = Some(at);
                if let Some(o) = run.of(name) {
                    report.facts.insert("wedged".into(), o.clone());
                }
            }
            let seen = lines.len();
            read_calls(bed, name, &mut lines, say);
            for l in &lines[seen..] {
                match l {
                    CallLine::Failed(..) => failed_at.push(at),
                    CallLine::Done(..) if done_after.is_none() => done_after = Some(at),
                    _ => {}
                }
            }
            Ok(failed_at.len() >= calls && done_after.is_some())
        },
    )?;
    report
        .facts
        .insert("calls_failed".into(), failed_at.len().into());
    if let (Some(first), Some(last)) = (failed_at.first(), failed_at.last()) {
        report
            .facts
            .insert("first_failed_ms".into(), (*first).into());
        report.facts.insert("last_failed_ms".into(), (*last).into());
    }
    if let Some(ms) = done_after {
        report.facts.insert("next_call_done_ms".into(), ms.into());
        report.recover_ms = Some(ms);
    }
    report.facts.insert(
        "same_pid".into(),
        (bed.running(name)? && bed.pid(name)? == pid).into(),
    );
    Ok(report)
}

/// A live call that thinks: `caller` calls a provider that sends the head
/// and first event at once (300 ms after the request), thinks 15 s, then
/// streams 20 tokens; a check every `opts.check_every` until the call is
/// done. Proof keepalives ask the peer while it thinks (it answers); the
/// call must never be `wedged`, never healed, and complete with its tokens.
pub fn thinking(
    opts: &Options,
    caller: Caller,
    say: &mut dyn FnMut(Event),
) -> anyhow::Result<Report> {
    let name = "thinker";
    let mut report = Report::new(&format!("thinking_{}", caller.name()));
    let mut bed = Bed::new(opts, "thk", Duration::from_millis(500))?;
    let provider = bed.provider();
    start_caller_with(
        &mut bed,
        name,
        caller,
        provider,
        "",
        Some(vec![
            "think-15000-gap-100-tokens-20-first-early-lag-300".into(),
        ]),
        &[],
    )?;
    say(Event::Setup {
        what: format!(
            "caller {} calls {provider}: head and first event at once, 15 s of thinking, then 20 tokens; a check every {} ms",
            caller.name(),
            opts.check_every.as_millis()
        ),
    });
    let mut done: Option<u64> = None;
    let mut failed: Option<String> = None;
    let mut armed = 0u64;
    let start = Instant::now();
    checks(
        &bed,
        &mut report,
        say,
        Duration::from_secs(60),
        |bed, run, _, say| {
            armed += run
                .of(name)
                .and_then(|o| o["proofs"].as_array().cloned())
                .unwrap_or_default()
                .iter()
                .filter(|e| e["action"] == "arm" && e["ok"] == true)
                .count() as u64;
            for line in bed.lines(name).unwrap_or_default() {
                say(Event::Note {
                    at_ms: bed.at_ms(),
                    text: format!("{name}: {line}"),
                });
                match CallLine::parse(&line) {
                    Some(CallLine::Done(_, tokens)) if done.is_none() => done = Some(tokens),
                    Some(CallLine::Failed(_, e)) => failed = Some(e),
                    _ => {}
                }
            }
            Ok(done.is_some() || failed.is_some())
        },
    )?;
    report.facts.insert("proofs_armed".into(), armed.into());
    if let Some(t) = done {
        report.facts.insert("tokens".into(), t.into());
    }
    if let Some(e) = failed {
        report.facts.insert("failed".into(), e.into());
    }
    report
        .facts
        .insert("ran_ms".into(), (start.elapsed().as_millis() as u64).into());
    Ok(report)
}
