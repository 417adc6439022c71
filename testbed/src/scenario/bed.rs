//! The bed: the topology, the testbed programs in it (killed on drop), a
//! `selfheal helper`, the config its agents are judged by, and one
//! `selfheal check` run as the timer runs it.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc::{Receiver, channel},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde_json::Value;

use super::{
    checks::pause,
    sockets::{TcpSocket, connections_to},
};
use crate::{http, runner::Mode, topology::Topology};

pub(super) const ATTACH_PORT: u16 = 7443;
pub(super) const API_PORT: u16 = 8080;
pub(super) const PROVIDER_PORT: u16 = 8443;

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
    /// Arguments every `selfheal check` the bed runs gets after its own:
    /// `--no-iterators`, to run a scenario on the procfs reader.
    pub check_args: Vec<&'static str>,
}

/// A testbed program, killed on drop.
pub(super) struct Proc {
    child: Child,
    lines: Receiver<String>,
    /// The last lines of its stderr, for the error when it fails to start.
    errors: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<String>>>,
    what: String,
}

/// Stderr lines kept per program.
pub(super) const KEEP_ERRORS: usize = 10;

impl Proc {
    pub(super) fn spawn(mut cmd: Command, what: &str) -> anyhow::Result<Proc> {
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
    pub(super) fn expect(&self, prefix: &str, timeout: Duration) -> anyhow::Result<String> {
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
    /// The CA (PEM) that SDK callers started from now on trust, calling
    /// their upstream over TLS (`https://`).
    pub(super) tls_ca: Option<PathBuf>,
}

impl Bed {
    /// Builds the topology and starts the dispatch server (work every
    /// `work_every`), the provider and the helper.
    pub fn new(opts: &Options, tag: &str, work_every: Duration) -> anyhow::Result<Bed> {
        crate::topology::remove_stale();
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
            tls_ca: None,
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

    pub(super) fn api_addr(&self) -> SocketAddr {
        SocketAddr::from((self.topo.dispatch_ip, API_PORT))
    }

    pub(super) fn provider_addr(&self) -> SocketAddr {
        SocketAddr::from((self.topo.provider_ip, PROVIDER_PORT))
    }

    pub(super) fn helper_socket(&self) -> PathBuf {
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

    pub(super) fn named(&self, name: &str) -> anyhow::Result<&Proc> {
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

    /// Kills program `name` (SIGKILL) and reaps it, as its parent would.
    pub(super) fn kill(&mut self, name: &str) -> anyhow::Result<()> {
        let i = *self
            .named
            .get(name)
            .with_context(|| format!("no program {name}"))?;
        let child = &mut self.procs[i].child;
        child
            .kill()
            .with_context(|| format!("cannot kill {name}"))?;
        child
            .wait()
            .with_context(|| format!("cannot reap {name}"))?;
        Ok(())
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

    /// The CA (PEM) of the bed's TLS edge ([`super::tls_edge`]), once it
    /// runs: what a caller of it trusts.
    pub fn tls_ca(&self) -> Option<&Path> {
        self.tls_ca.as_deref()
    }

    /// A path for file `name` in the bed's own directory (removed with it).
    pub(super) fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub(super) fn pidfile(&self, runner: &str) -> PathBuf {
        self.dir.join(format!("{runner}.pid"))
    }

    pub(super) fn config_path(&self) -> PathBuf {
        self.dir.join("config.toml")
    }

    pub(super) fn write_config(&self) -> anyhow::Result<()> {
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
        self.check_by(self.topo.runners.command(&self.opts.selfheal))
    }

    /// [`Bed::check`] with the check's `CLOCK_BOOTTIME` moved by `secs`
    /// (negative: back), as a host's suspend and resume moves it between
    /// two timer runs: the check runs in a time namespace of its own
    /// (`unshare --time --boottime SECS`, inside the runners' network
    /// namespace), with the same helper, arguments and environment;
    /// `CLOCK_MONOTONIC`, the kernel's own timers (`tcp_info` ages) and
    /// the helper's clock do not move. The kernel refuses an offset that
    /// would take the clock below zero (`unshare` fails, and so does this).
    pub fn check_with_boottime_offset(&self, secs: i64) -> anyhow::Result<CheckRun> {
        let run = self.check_by(self.boottime_offset(secs))?;
        if run.outcomes.is_empty() && run.stderr.contains("unshare") {
            bail!(
                "cannot run check with CLOCK_BOOTTIME moved by {secs} s: {}",
                run.stderr.trim()
            );
        }
        Ok(run)
    }

    /// `cmd` (`selfheal`, or a wrapper that runs it) with `check`'s
    /// arguments and environment.
    fn check_by(&self, mut cmd: Command) -> anyhow::Result<CheckRun> {
        cmd.envs(self.opts.env.iter().map(|(k, v)| (*k, v)));
        cmd.args(["check", "--json", "--config"])
            .arg(self.config_path())
            .arg("--state-dir")
            .arg(self.dir.join("state"))
            .arg("--snapshot-dir")
            .arg(self.snapshot_dir())
            .arg("--helper")
            .arg(self.helper_socket())
            .args(&self.opts.check_args);
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

    /// `selfheal inspect NAME` of runner `name` against the checks'
    /// history (procfs and sock_diag only: no tracer of its own), as text
    /// and as `--json`: (the text, the document).
    pub fn inspect(&self, name: &str) -> anyhow::Result<(String, Value)> {
        self.inspect_by(name, || self.topo.runners.command(&self.opts.selfheal))
    }

    /// [`Bed::inspect`] with its `CLOCK_BOOTTIME` moved by `secs`, as
    /// [`Bed::check_with_boottime_offset`] moves a check's.
    pub fn inspect_with_boottime_offset(
        &self,
        name: &str,
        secs: i64,
    ) -> anyhow::Result<(String, Value)> {
        self.inspect_by(name, || self.boottime_offset(secs))
    }

    /// `selfheal` in the runners' network namespace and a time namespace
    /// of its own with `CLOCK_BOOTTIME` moved by `secs`.
    fn boottime_offset(&self, secs: i64) -> Command {
        let mut cmd = self.topo.runners.command(Path::new("unshare"));
        cmd.args(["--time", "--boottime", &secs.to_string(), "--"])
            .arg(&self.opts.selfheal);
        cmd
    }

    /// [`Bed::inspect`] by the command `selfheal` (or a wrapper that runs
    /// it) that `command` gives.
    fn inspect_by(
        &self,
        name: &str,
        command: impl Fn() -> Command,
    ) -> anyhow::Result<(String, Value)> {
        let run = |json: bool| -> anyhow::Result<String> {
            let mut cmd = command();
            cmd.envs(self.opts.env.iter().map(|(k, v)| (*k, v)));
            cmd.args(["inspect", name, "--no-ebpf", "--config"])
                .arg(self.config_path())
                .arg("--state-dir")
                .arg(self.dir.join("state"));
            if json {
                cmd.arg("--json");
            }
            let out = cmd.output().context("cannot run selfheal inspect")?;
            if !out.status.success() {
                bail!(
                    "selfheal inspect {name} failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        };
        let text = run(false)?;
        let json = run(true)?;
        let doc = serde_json::from_str(&json)
            .with_context(|| format!("inspect --json printed no JSON: {json:?}"))?;
        Ok((text, doc))
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

    /// Waits (at most 10 s) until process `pid` has an established
    /// connection to `remote`, and returns its connections there.
    pub(super) fn wait_connection(
        &self,
        what: &str,
        pid: u32,
        remote: SocketAddr,
    ) -> anyhow::Result<Vec<TcpSocket>> {
        self.wait_connections(what, Duration::from_secs(10), pid, remote, 1)
    }

    /// Waits (at most `timeout`) until process `pid` has `min` established
    /// connections to `remote`, and returns them.
    pub(super) fn wait_connections(
        &self,
        what: &str,
        timeout: Duration,
        pid: u32,
        remote: SocketAddr,
        min: usize,
    ) -> anyhow::Result<Vec<TcpSocket>> {
        self.wait(what, timeout, || {
            let c = connections_to(pid, remote);
            Ok((c.len() >= min).then_some(c))
        })
    }

    /// The gateway drops each of `flows` both ways, without a FIN or RST.
    /// When, and the flows' local ends (for the narration).
    pub(super) fn cut_provider_flows(
        &self,
        flows: &[TcpSocket],
    ) -> anyhow::Result<(Instant, String)> {
        for f in flows {
            self.topo.drop_provider_flow(f.local)?;
        }
        let locals: Vec<String> = flows.iter().map(|f| f.local.to_string()).collect();
        Ok((Instant::now(), locals.join(", ")))
    }

    /// Whether program `name` still runs as `pid` (healed, not restarted).
    pub(super) fn still_runs(&mut self, name: &str, pid: u32) -> anyhow::Result<bool> {
        Ok(self.running(name)? && self.pid(name)? == pid)
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
pub(super) fn keep_snapshots(from: &Path, to: &Path) {
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
