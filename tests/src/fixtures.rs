//! Set-ups that many areas share: where a test's `selfheal` commands keep
//! their state, snapshots, metrics file and helper socket ([`Places`]), and
//! the `selfheal check --json` command on them ([`check_cmd`]); an
//! in-process helper ([`serve_helper`]), the processes of other uids it
//! acts on ([`Procs`]), and a child killed with its test ([`Reaped`]).

use std::{
    ffi::OsString,
    io::{BufRead as _, BufReader, Write as _},
    os::unix::{net::UnixStream, process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::Duration,
};

use selfheal::helper::{Listen, Performer, ServerHandle, ServerOptions, serve};
use selfheal_core::protocol::Response;

/// Where one test's `selfheal` commands keep what they write, and which
/// helper socket they ask: the `--state-dir`, `--snapshot-dir`,
/// `--metrics-file` and `--helper` arguments, in that order.
#[derive(Clone, Debug)]
pub struct Places {
    pub state: PathBuf,
    pub snapshots: PathBuf,
    pub metrics: Option<PathBuf>,
    pub helper: Option<PathBuf>,
}

impl Places {
    /// The state directory `state` and the snapshot directory `snapshots`;
    /// no metrics file, no helper named.
    pub fn new(state: impl Into<PathBuf>, snapshots: impl Into<PathBuf>) -> Places {
        Places {
            state: state.into(),
            snapshots: snapshots.into(),
            metrics: None,
            helper: None,
        }
    }

    /// `DIR/state` and `DIR/snapshots`; no metrics file, no helper named.
    pub fn under(dir: impl AsRef<Path>) -> Places {
        let dir = dir.as_ref();
        Places::new(dir.join("state"), dir.join("snapshots"))
    }

    /// `DIR/state`, `DIR/snaps` and the helper socket `DIR/no-helper.sock`,
    /// where no helper listens: a check on its own, never whatever helper
    /// runs on the machine.
    pub fn without_helper(dir: impl AsRef<Path>) -> Places {
        let dir = dir.as_ref();
        Places::under(dir)
            .snapshots(dir.join("snaps"))
            .helper(dir.join("no-helper.sock"))
    }

    /// The snapshot directory `dir` instead.
    #[must_use]
    pub fn snapshots(mut self, dir: impl Into<PathBuf>) -> Places {
        self.snapshots = dir.into();
        self
    }

    /// The metrics file `file` (`--metrics-file`).
    #[must_use]
    pub fn metrics(mut self, file: impl Into<PathBuf>) -> Places {
        self.metrics = Some(file.into());
        self
    }

    /// The helper socket `socket` (`--helper`).
    #[must_use]
    pub fn helper(mut self, socket: impl Into<PathBuf>) -> Places {
        self.helper = Some(socket.into());
        self
    }

    /// `--state-dir S --snapshot-dir P [--metrics-file M] [--helper H]`.
    pub fn args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec![
            "--state-dir".into(),
            self.state.clone().into(),
            "--snapshot-dir".into(),
            self.snapshots.clone().into(),
        ];
        if let Some(m) = &self.metrics {
            a.extend(["--metrics-file".into(), m.clone().into()]);
        }
        if let Some(h) = &self.helper {
            a.extend(["--helper".into(), h.clone().into()]);
        }
        a
    }
}

/// `selfheal check --json --config CONFIG` with `places`' arguments.
pub fn check_cmd(config: &Path, places: &Places) -> Command {
    let mut cmd = Command::new(crate::selfheal_bin());
    cmd.args(["check", "--json", "--config"])
        .arg(config)
        .args(places.args());
    cmd
}

/// `selfheal helper --no-ebpf --socket SOCKET`: the helper as its own
/// process, without eBPF.
pub fn helper_cmd(socket: &Path) -> Command {
    let mut cmd = Command::new(crate::selfheal_bin());
    cmd.args(["helper", "--no-ebpf", "--socket"]).arg(socket);
    cmd
}

/// [`helper_cmd`] started, its stderr dropped.
pub fn quiet_helper(socket: &Path) -> Child {
    helper_cmd(socket)
        .stderr(Stdio::null())
        .spawn()
        .expect("start selfheal helper")
}

/// Waits (at most 15 s) until a helper answers `hello` on `socket`.
pub fn wait_answering(socket: &Path) {
    crate::wait_for(Duration::from_secs(15), Duration::from_millis(20), || {
        selfheal::helper::HelperClient::connect_with(socket, crate::patient_client_opts())
            .ok()?
            .hello()
            .ok()
    })
    .expect("the helper answers");
}

/// An in-process helper on the socket `socket` with `exec`, given 5 s to
/// shut down, its options changed by `tweak` first.
pub fn serve_helper(
    socket: impl Into<PathBuf>,
    exec: Arc<dyn Performer>,
    tweak: impl FnOnce(&mut ServerOptions),
) -> ServerHandle {
    let mut opts = ServerOptions::new(Listen::Path(socket.into()));
    opts.shutdown_grace = Duration::from_secs(5);
    tweak(&mut opts);
    serve(opts, exec).expect("start the helper")
}

/// Writes the subuid file `path` (0644, root's) with `text`.
pub fn subuid_file(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
}

/// Child processes of other uids, killed (and reaped) on drop.
#[derive(Default)]
pub struct Procs(pub Vec<Child>);

impl Procs {
    /// `cmd` started as `uid` (stdin null), kept to be killed; its pid.
    pub fn spawn_as(&mut self, uid: u32, mut cmd: Command) -> u32 {
        let child = cmd
            .uid(uid)
            .gid(uid)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        let pid = child.id();
        self.0.push(child);
        pid
    }

    /// `sh -c SCRIPT` as `uid`; waits until it runs as that uid.
    pub fn sh(&mut self, uid: u32, script: &str) -> u32 {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        let pid = self.spawn_as(uid, cmd);
        crate::wait_for(PROC_WAIT, PROC_TICK, || {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            status
                .lines()
                .any(|l| l.starts_with("Uid:") && l.contains(&uid.to_string()))
                .then_some(())
        })
        .expect("the child runs as its uid");
        pid
    }

    /// A process of `uid` that ignores SIGTERM (a `sleep` that inherited
    /// the ignored disposition), once it runs.
    pub fn deaf(&mut self, uid: u32) -> u32 {
        let pid = self.sh(uid, "trap '' TERM; exec sleep 300");
        crate::wait_for(PROC_WAIT, PROC_TICK, || {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .ok()
                .filter(|c| c.trim() == "sleep")
        })
        .expect("exec'd sleep");
        pid
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The config text of agent `runner`, the `recv-peer MODE B:7443` process
/// (`client` or `reconnecting`), whose control upstream `B:7443` beats
/// every second; suspected after 2 s. A caller appends its agent's other
/// tables (`[agent.heal]`, …) and agents.
pub fn control_runner(mode: &str, b: &str) -> String {
    format!(
        "[[agent]]\nname = \"runner\"\nmatch = {{ cmdline = \"recv-peer {mode} {b}:7443$\" }}\n\
         [[agent.upstream]]\nrole = \"control\"\naddr = \"{b}:7443\"\nheartbeat = \"1s\"\n\
         [agent.thresholds]\nsuspect_after = \"2s\"\n"
    )
}

/// A raw connection to a helper's socket, read line by line (10 s read
/// timeout): for requests `HelperClient` would never send.
pub struct LineConn {
    pub stream: UnixStream,
    reader: BufReader<UnixStream>,
}

impl LineConn {
    pub fn connect(path: &Path) -> LineConn {
        let stream = UnixStream::connect(path).expect("connect to the helper");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("set a read timeout");
        let reader = BufReader::new(stream.try_clone().expect("clone the connection"));
        LineConn { stream, reader }
    }

    /// The next line (with its `\n`); `Ok(None)` once the helper closed.
    pub fn read_line(&mut self) -> std::io::Result<Option<String>> {
        let mut line = String::new();
        match self.reader.read_line(&mut line)? {
            0 => Ok(None),
            _ => Ok(Some(line)),
        }
    }
}

/// A child killed (SIGKILL) and reaped when dropped.
pub struct Reaped(pub Child);

impl Reaped {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Its stderr, read to its end (empty unless it was piped, or once
    /// read).
    pub fn stderr(&mut self) -> String {
        use std::io::Read as _;
        let mut s = String::new();
        if let Some(mut e) = self.0.stderr.take() {
            let _ = e.read_to_string(&mut s);
        }
        s
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How long [`Procs`] waits for a child to run, and how often it looks.
const PROC_WAIT: Duration = Duration::from_secs(5);
const PROC_TICK: Duration = Duration::from_millis(20);

/// Goes on with the panic `result` holds, if any: the end of a test that
/// caught its body's panic to clean up first.
pub fn rethrow(result: std::thread::Result<()>) {
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

/// One request line on a raw connection to a helper, and its answer
/// (`None`: closed or no answer within `timeout`).
pub fn ask(stream: &UnixStream, line: &str, timeout: Duration) -> Option<Response> {
    stream.set_read_timeout(Some(timeout)).ok()?;
    // A helper that refuses a connection (busy) answers and closes it,
    // possibly before the request is written: the write then fails, and
    // the answer is there to be read all the same (as HelperClient does).
    let _ = (&*stream).write_all(format!("{line}\n").as_bytes());
    let mut reader = BufReader::new(stream);
    let mut text = String::new();
    match reader.read_line(&mut text) {
        Ok(n) if n > 0 => Response::parse(text.as_bytes()).ok(),
        _ => None,
    }
}

/// What an answer was, in one word: `ok`, an error code, or `closed`.
pub fn outcome(r: &Option<Response>) -> String {
    match r {
        None => "closed".into(),
        Some(r) if r.ok => "ok".into(),
        Some(r) => r.error.as_ref().map_or("?".into(), |e| e.code.to_string()),
    }
}

/// An agent matched by one pid whose one upstream is a provider, suspect
/// after 1 s of silence: its config, the target a collector reads, and the
/// judge's verdict on what was collected. For comparing the readers of
/// the same agents.
pub struct ProviderAgent {
    pub config: selfheal_core::config::Config,
    name: String,
    pid: u32,
    provider: std::net::SocketAddr,
    roots: Vec<u32>,
    pids: Vec<u32>,
}

impl ProviderAgent {
    /// `name`, matched by `pid`, reading `roots` and every pid of their
    /// trees (`pids`), silent on `provider`.
    pub fn new(
        name: &str,
        pid: u32,
        provider: std::net::SocketAddr,
        roots: Vec<u32>,
        pids: Vec<u32>,
    ) -> ProviderAgent {
        let config = selfheal_core::config::Config::parse(
            &format!(
                "[[agent]]\nname = \"{name}\"\nmatch = {{ pid = {pid} }}\n\
                 [[agent.upstream]]\nrole = \"provider\"\naddr = \"{provider}\"\n\
                 [agent.thresholds]\nsuspect_after = \"1s\"\n"
            ),
            Path::new(&format!("{name}.toml")),
        )
        .expect("config");
        ProviderAgent {
            config,
            name: name.to_owned(),
            pid,
            provider,
            roots,
            pids,
        }
    }

    /// What a collector reads of the agent.
    pub fn target(&self) -> selfheal::inspect::Target {
        let provider = self.provider;
        selfheal::inspect::Target {
            agent: Some(self.name.clone()),
            rule: format!("pid={}", self.pid),
            roots: self.roots.clone(),
            pids: self.pids.clone(),
            problem: None,
            upstream_of: Box::new(move |a| {
                (a == provider).then_some((selfheal_core::model::SocketRole::Provider, 0))
            }),
            upstreams: vec![provider.to_string()],
            roles: selfheal_core::config::Roles::ByAddress,
            containers: Vec::new(),
            container_gaps: Vec::new(),
            unread_cmdlines: None,
        }
    }

    /// Waits until every thread of the agent sleeps, then past its
    /// `suspect_after`.
    pub fn settle(&self) {
        assert!(all_asleep(&self.pids), "the agents never settled asleep");
        std::thread::sleep(Duration::from_millis(1500));
    }

    /// Collects the agent at light detail without the tracer, by the task
    /// iterators (loaded where none are pinned) or, given a reason, by
    /// procfs on purpose.
    pub fn collect(&self, procfs_because: Option<&str>) -> selfheal_core::inspect::Evidence {
        let opts = selfheal::inspect::CollectOptions {
            no_ebpf: true,
            detail: selfheal_core::proc::Detail::Light,
            load_iterators: true,
            ..selfheal::inspect::CollectOptions::default()
        };
        let mut c = selfheal::inspect::Collector::new(&opts, &self.pids);
        if let Some(why) = procfs_because {
            c.without_iterators(why);
        }
        c.collect(&self.target())
    }

    /// The judge's verdict on `ev` and each reason's code and verdict.
    pub fn verdict(
        &self,
        ev: &selfheal_core::inspect::Evidence,
    ) -> (
        selfheal_core::judge::Verdict,
        Vec<(
            selfheal_core::judge::ReasonCode,
            selfheal_core::judge::Verdict,
        )>,
    ) {
        let now_ms = selfheal::sys::clock::boot_ns() / 1_000_000;
        let (j, _) = selfheal_core::judge::judge(
            &self.config.agents[0],
            &selfheal_core::inspect::build(ev),
            &[],
            &selfheal_core::judge::AgentHistory::default(),
            now_ms,
        );
        let codes = j.reasons.iter().map(|r| (r.code, r.verdict)).collect();
        (j.verdict, codes)
    }
}

/// Waits up to 10 s until every thread of `pids` sleeps (or is a zombie);
/// whether they all did.
pub fn all_asleep(pids: &[u32]) -> bool {
    crate::wait_for(Duration::from_secs(10), Duration::from_millis(50), || {
        pids.iter()
            .all(|&p| {
                std::fs::read_dir(format!("/proc/{p}/task"))
                    .map(|ts| {
                        ts.flatten().all(|t| {
                            let stat =
                                std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                            let state = stat
                                .rsplit_once(')')
                                .and_then(|(_, r)| r.trim().chars().next());
                            matches!(state, Some('S' | 'Z'))
                        })
                    })
                    .unwrap_or(false)
            })
            .then_some(())
    })
    .is_some()
}
