//! Helpers for selfheal's integration tests: spawning the peer programs and
//! talking to them, network namespaces that clean up after themselves,
//! bounded waiting, and skipping where the machine truly cannot run a
//! test: each skip says its kind and reason on stderr and is recorded for
//! `cargo xtask test`'s list ([`skip_as`]). The incident testbed the scenario
//! tests drive is its own crate ([`selfheal_testbed`]) and binary
//! (`selfheal-testbed`), kept out of the product binary.

pub mod fixtures;
pub mod runner_container;
pub mod runtimes;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    process::{Child, ChildStdin, Command, Stdio},
    sync::mpsc::{Receiver, RecvTimeoutError, channel},
    time::{Duration, Instant},
};

use selfheal::ebpf::{Tracer, TracerOptions};
use selfheal_core::ebpf::strategy::Strategy;

/// `target/<profile>/`, where cargo puts binaries: the directory above the
/// test executables (`target/<profile>/deps/`).
fn bin_dir() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("executable directory");
    if dir.ends_with("deps") {
        dir.parent().unwrap_or(dir)
    } else {
        dir
    }
    .to_path_buf()
}

/// Path of a helper program of this crate: cargo puts binaries in the
/// directory above the test executables (`target/<profile>/deps/`).
pub fn helper_bin(name: &str) -> std::path::PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build -p tests --bins`",
        path.display()
    );
    path
}

/// The `selfheal` binary of this build. `cargo test -p tests` does not build
/// other packages' binaries, so it is built (or found up to date) once per
/// test process, with the same eBPF requirement as the tests.
///
/// `SELFHEAL_TEST_BIN=PATH` runs the tests against another build instead
/// (an older commit's, to show what a test shows there).
pub fn selfheal_bin() -> std::path::PathBuf {
    if let Some(bin) = std::env::var_os("SELFHEAL_TEST_BIN") {
        return bin.into();
    }
    static BUILD: std::sync::Once = std::sync::Once::new();
    built_bin(&BUILD, "selfheal", "selfheal")
}

/// The `selfheal-testbed` binary of this build (the testbed's programs and
/// the demo), built (or found up to date) once per test process, as
/// [`selfheal_bin`].
pub fn testbed_bin() -> std::path::PathBuf {
    static BUILD: std::sync::Once = std::sync::Once::new();
    built_bin(&BUILD, "selfheal-testbed", "selfheal-testbed")
}

/// The cargo that runs the tests (`CARGO`, or `cargo` on PATH), in the
/// workspace's root directory.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    cmd
}

/// Binary `bin` of package `package` in this build's profile, built by
/// cargo the first time `once` runs.
fn built_bin(once: &std::sync::Once, package: &str, bin: &str) -> std::path::PathBuf {
    once.call_once(|| {
        let status = cargo()
            .args(["build", "--quiet", "-p", package, "--bin", bin])
            .status()
            .expect("run cargo");
        assert!(status.success(), "cannot build {bin}");
    });
    bin_dir().join(bin)
}

/// Who may run: the area (module of the `it` binary) whose tests hold
/// [`Area`] guards, and how many hold one.
struct Turn {
    area: Option<&'static str>,
    holders: usize,
}

static TURN: std::sync::Mutex<Turn> = std::sync::Mutex::new(Turn {
    area: None,
    holders: 0,
});
static TURN_FREE: std::sync::Condvar = std::sync::Condvar::new();

/// A test's turn in the one test process: while it lives, only tests of the
/// same area run beside it. The areas share this process (its pid, its
/// eBPF watch, its descriptors and threads, the machine's namespaces,
/// units and runtimes), and each area's tests are written to run beside
/// each other, not beside another area's.
pub struct Area(());

/// Waits until no other area's test runs, then holds this area's turn:
/// the first line of every test, `let _area = tests::area(module_path!());`.
pub fn area(module: &'static str) -> Area {
    let mut turn = TURN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    while turn.area.is_some_and(|a| a != module) {
        turn = TURN_FREE
            .wait(turn)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
    }
    turn.area = Some(module);
    turn.holders += 1;
    Area(())
}

impl Drop for Area {
    fn drop(&mut self) {
        let mut turn = TURN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        turn.holders -= 1;
        if turn.holders == 0 {
            turn.area = None;
            TURN_FREE.notify_all();
        }
    }
}

/// The helper client of the tests that start a helper in this process: 1 s
/// to connect, 5 s for an answer, 10 s for an act.
pub fn client_opts() -> selfheal::helper::ClientOptions {
    selfheal::helper::ClientOptions {
        connect_timeout: Duration::from_secs(1),
        timeout: Duration::from_secs(5),
        act_timeout: Duration::from_secs(10),
    }
}

/// The helper client of the tests that run `selfheal helper` as its own
/// process: 3 s to connect, 10 s for an answer or an act.
pub fn patient_client_opts() -> selfheal::helper::ClientOptions {
    selfheal::helper::ClientOptions {
        connect_timeout: Duration::from_secs(3),
        timeout: Duration::from_secs(10),
        act_timeout: Duration::from_secs(10),
    }
}

/// Runs `cmd` to its end and asserts that it exited 0 (its stderr is the
/// message when not).
pub fn output_ok(cmd: &mut Command) -> std::process::Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Writes `DIR/config.toml` with `text`: its path.
pub fn config_in(dir: impl AsRef<std::path::Path>, text: impl AsRef<[u8]>) -> std::path::PathBuf {
    let path = dir.as_ref().join("config.toml");
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    path
}

/// `selfheal snapshots show ID --json --dir DIR`, which succeeds: the
/// snapshot record it prints.
pub fn show_snapshot(id: &str, dir: &std::path::Path) -> String {
    let out = output_ok(
        Command::new(selfheal_bin())
            .args(["snapshots", "show", id, "--json", "--dir"])
            .arg(dir),
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Writes `path`: a config with one agent, "me", matching this test process
/// by pid.
pub fn own_agent_config(path: &std::path::Path) {
    std::fs::write(
        path,
        format!(
            "[[agent]]\nname = \"me\"\nmatch = {{ pid = {} }}\n",
            std::process::id()
        ),
    )
    .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

/// Compiles the C program `src/NAME.c` of this crate (`cc -O1`) into `dir`
/// and makes `dir/mnt` for it to mount on: the program and the mount point.
/// `Err` says why (no compiler, a compile error).
pub fn compile_fuse_server(
    dir: &Scratch,
    name: &str,
) -> Result<(std::path::PathBuf, std::path::PathBuf), String> {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("src/{name}.c"));
    let bin = dir.join(name);
    let out = Command::new("cc")
        .args(["-O1", "-o"])
        .arg(&bin)
        .arg(src)
        .output()
        .map_err(|e| format!("no C compiler: {e}"))?;
    if !out.status.success() {
        return Err(format!("cc: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).map_err(|e| e.to_string())?;
    Ok((bin, mnt))
}

/// A FUSE filesystem that stops answering once the file `freeze` exists:
/// `src/hangfs.c`, built with the system's C compiler, mounted on a
/// scratch directory; dropping it kills the server (the kernel then fails
/// what waits on it) and detaches the mount.
pub struct HangFs {
    server: Child,
    pub mnt: std::path::PathBuf,
}

impl HangFs {
    pub fn mount(dir: &Scratch, freeze: &std::path::Path) -> Result<HangFs, String> {
        let (bin, mnt) = compile_fuse_server(dir, "hangfs")?;
        let mut server = Command::new(&bin)
            .arg(&mnt)
            .arg(freeze)
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut line = String::new();
        let _ = BufReader::new(server.stdout.take().unwrap()).read_line(&mut line);
        if line.trim() != "mounted" {
            let _ = server.kill();
            let _ = server.wait();
            return Err("cannot mount a FUSE filesystem here".into());
        }
        Ok(HangFs { server, mnt })
    }
}

impl Drop for HangFs {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

/// The control socket in a shown snapshot's kernel evidence (its
/// `snapshot.evidence.sockets` entry of role `control`); fails the test
/// when there is none.
pub fn control_socket(shown: &serde_json::Value) -> &serde_json::Value {
    shown["snapshot"]["evidence"]["sockets"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["role"] == "control")
        .unwrap_or_else(|| panic!("no control socket in the snapshot: {shown:#}"))
}

/// The port of `addr` (`HOST:PORT`).
pub fn port_of(addr: &str) -> u16 {
    addr.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {addr:?}"))
}

/// A silent server in `b` (`recv-peer acceptor`: accepts, never sends) and
/// a reconnecting client in `a` (`recv-peer reconnecting`), connected.
/// Dropped in field order: the client, the server, then their namespaces.
pub struct SilentPair {
    pub client: Peer,
    pub server: Peer,
    pub pair: NetnsPair,
    /// The client's connection.
    pub ready: Ready,
}

impl SilentPair {
    /// The client's socket fd.
    pub fn client_fd(&self) -> i32 {
        socket_fd_of(self.ready.pid, self.ready.inode).expect("the client's socket fd")
    }
}

/// A [`SilentPair`] in a new [`NetnsPair`] named by `tag`.
pub fn silent_pair(tag: &str) -> SilentPair {
    let pair = NetnsPair::new(tag).expect("netns pair");
    let mut cmd = pair.b.command(&helper_bin("recv-peer"));
    cmd.args(["acceptor", &format!("{}:0", pair.b_addr)]);
    let server = Peer::spawn(cmd);
    let port = port_of(&server.expect("listening ", Duration::from_secs(10)));
    let mut cmd = pair.a.command(&helper_bin("recv-peer"));
    cmd.args(["reconnecting", &format!("{}:{port}", pair.b_addr)]);
    let client = Peer::spawn(cmd);
    let ready = client.ready();
    server.expect("accepted ", Duration::from_secs(10));
    SilentPair {
        pair,
        server,
        client,
        ready,
    }
}

/// Whether we run as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// What a skip lacks, said by the test that skips, never read from its
/// reason's words. CI (`SELFHEAL_CI=1`, which `cargo xtask test --ci`
/// sets) runs as root, on a kernel with what the suite uses, after `cargo
/// xtask setup` installed every tool: there a skip of a kind that
/// [`Skip::ci_never_needs`] fails its test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// Not root.
    Root,
    /// A program, library or SDK that `cargo xtask setup` installs is
    /// missing.
    Tool,
    /// The kernel lacks a feature or configuration the suite relies on.
    Kernel,
    /// The machine cannot do something a test needs (mount a tmpfs, make a
    /// cgroup, raise a limit, an unprivileged user namespace).
    Machine,
    /// Runs only in `cargo xtask vm-test`'s VM, whose kernel it sets up
    /// (its BTF hidden): expected on the host; `cargo xtask test --no-vm`
    /// says it was dropped.
    Vm,
    /// Depends on this host in a way no set-up changes (what this pid
    /// namespace shows): expected anywhere, CI included.
    Host,
}

impl Skip {
    /// The kind's name in the skip list.
    pub fn name(self) -> &'static str {
        match self {
            Skip::Root => "root",
            Skip::Tool => "tool",
            Skip::Kernel => "kernel",
            Skip::Machine => "machine",
            Skip::Vm => "vm",
            Skip::Host => "host",
        }
    }

    /// Whether CI's machine must never skip for this (see [`Skip`]).
    pub fn ci_never_needs(self) -> bool {
        !matches!(self, Skip::Vm | Skip::Host)
    }
}

/// Whether this run is CI's (`SELFHEAL_CI=1`).
pub fn under_ci() -> bool {
    std::env::var("SELFHEAL_CI").as_deref() == Ok("1")
}

/// Where skips are recorded, one file each, for `cargo xtask test` to list
/// at the end (libtest hides a passing test's stderr): `target/tmp/skips`.
pub fn skips_dir() -> std::path::PathBuf {
    let target = bin_dir();
    target.parent().unwrap_or(&target).join("tmp/skips")
}

/// Skips `test` for want of `kind`: says why on stderr, records it in
/// [`skips_dir`], and under CI fails when CI's machine should never need
/// this kind of skip.
pub fn skip_as(kind: Skip, test: &str, why: &str) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    eprintln!("SKIPPED ({}) {test}: {why}", kind.name());
    let dir = skips_dir();
    let record = serde_json::json!({
        "test": test,
        "kind": kind.name(),
        "why": why,
        "ci_never_needs": kind.ci_never_needs(),
        "vm_only": kind == Skip::Vm,
    });
    let file = dir.join(format!(
        "{}-{}.json",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    if let Err(e) =
        std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&file, record.to_string()))
    {
        eprintln!("cannot record the skip in {}: {e}", file.display());
    }
    assert!(
        !(under_ci() && kind.ci_never_needs()),
        "SELFHEAL_CI=1: {test} skipped ({}) for what CI's machine has: {why}",
        kind.name()
    );
}

/// Skips `test` for something the machine cannot do ([`Skip::Machine`]).
pub fn skip(test: &str, why: &str) {
    skip_as(Skip::Machine, test, why);
}

/// Skips `test` because `tool` is missing; `hint` says what installs it
/// ([`Skip::Tool`]).
pub fn skip_tool_missing(test: &str, tool: &str, hint: &str) {
    skip_as(Skip::Tool, test, &format!("no {tool} ({hint})"));
}

/// Skips `test` for a reason no set-up changes ([`Skip::Host`]): counted,
/// never a failure.
pub fn skip_expected(test: &str, why: &str) {
    skip_as(Skip::Host, test, why);
}

/// Skips (returns `false`) unless root ([`Skip::Root`]).
pub fn need_root(test: &str) -> bool {
    if !is_root() {
        skip_as(Skip::Root, test, "needs root (eBPF, network namespaces)");
        return false;
    }
    true
}

/// Skips (returns `false`) unless root and the eBPF object is built in. When
/// `SELFHEAL_REQUIRE_EBPF=1` (CI, `cargo xtask test`) a missing object fails.
pub fn need_ebpf(test: &str) -> bool {
    if !selfheal::ebpf::BUILT_IN {
        assert!(
            std::env::var("SELFHEAL_REQUIRE_EBPF").as_deref() != Ok("1"),
            "SELFHEAL_REQUIRE_EBPF=1 but this build has no eBPF object"
        );
        skip_as(
            Skip::Tool,
            test,
            "eBPF is not built in (no eBPF toolchain: `cargo xtask setup`)",
        );
        return false;
    }
    need_root(test)
}

/// The bound on finding a wedged connection, in ms, from what the run
/// measured: three missed heartbeats, one check interval, and the longest
/// check's own run time (at least an interval: a check that ran late on a
/// loaded machine moves the verdict by as much).
pub fn wedge_bound_ms(heartbeat: Duration, check_every: Duration, longest_check_ms: u64) -> u64 {
    let every = check_every.as_millis() as u64;
    3 * heartbeat.as_millis() as u64 + every + longest_check_ms.max(every)
}

/// Polls `f` every `step` until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(
    timeout: Duration,
    step: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> Option<T> {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(step);
    }
}

/// A running helper program whose stdout lines we read and whose stdin we
/// write. Killed on drop.
pub struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    what: String,
}

/// What a client peer reports once connected.
#[derive(Clone, Debug)]
pub struct Ready {
    pub pid: u32,
    pub tid: u32,
    pub inode: u64,
    pub local: String,
    pub remote: String,
}

impl Peer {
    /// Starts `cmd` with piped stdio.
    pub fn spawn(mut cmd: Command) -> Peer {
        let what = format!("{cmd:?}");
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Peer {
            child,
            stdin,
            lines,
            what,
        }
    }

    /// `recv-peer ARGS…`.
    pub fn recv_peer(args: &[&str]) -> Peer {
        let mut cmd = Command::new(helper_bin("recv-peer"));
        cmd.args(args);
        Peer::spawn(cmd)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next line starting with `prefix`, within `timeout`.
    pub fn expect(&self, prefix: &str, timeout: Duration) -> String {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(_) => continue,
                Err(RecvTimeoutError::Timeout) => {
                    panic!("{}: no `{prefix}` line within {timeout:?}", self.what)
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("{}: exited before a `{prefix}` line", self.what)
                }
            }
        }
    }

    /// Waits for the `ready` line of a client peer.
    pub fn ready(&self) -> Ready {
        let line = self.expect("ready ", Duration::from_secs(10));
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                .unwrap_or_else(|| panic!("no {k} in {line:?}"))
                .to_string()
        };
        Ready {
            pid: field("pid").parse().expect("pid"),
            tid: field("tid").parse().expect("tid"),
            inode: field("inode").parse().expect("inode"),
            local: field("local"),
            remote: field("remote"),
        }
    }

    /// Writes one command line to the peer's stdin.
    pub fn tell(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .expect("write to peer");
    }

    /// Closes the peer's stdin.
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A network namespace made for one test, deleted on drop (the testbed's
/// [`selfheal_testbed::topology::Netns`]: `name`, `command`, `nft`).
pub struct Netns(selfheal_testbed::topology::Netns);

impl Netns {
    /// Creates `selfheal-<tag>-<pid>` with its loopback up, or says why not.
    pub fn new(tag: &str) -> Result<Netns, String> {
        let name = format!("selfheal-{tag}-{}", std::process::id());
        selfheal_testbed::topology::Netns::create(name)
            .map(Netns)
            .map_err(|e| format!("{e:#}"))
    }
}

impl std::ops::Deref for Netns {
    type Target = selfheal_testbed::topology::Netns;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// The strategy the test environment forces (`SELFHEAL_FORCE_STRATEGY`), if any.
pub fn forced_strategy() -> Option<Strategy> {
    let name = std::env::var("SELFHEAL_FORCE_STRATEGY").ok()?;
    Some(
        Strategy::from_name(&name)
            .unwrap_or_else(|| panic!("SELFHEAL_FORCE_STRATEGY={name}: unknown strategy")),
    )
}

/// The strategy the test environment expects to be chosen
/// (`SELFHEAL_EXPECT_STRATEGY`), if any.
pub fn expected_strategy() -> Option<Strategy> {
    let name = std::env::var("SELFHEAL_EXPECT_STRATEGY").ok()?;
    Some(
        Strategy::from_name(&name)
            .unwrap_or_else(|| panic!("SELFHEAL_EXPECT_STRATEGY={name}: unknown strategy")),
    )
}

/// Attaches a tracer restricted to `strategies` (or all, or the forced one).
/// When the choice was the loader's (no list given), it must be the one the
/// environment expects (`SELFHEAL_EXPECT_STRATEGY`).
pub fn attach(strategies: Option<&[Strategy]>) -> Tracer {
    let loader_chooses = strategies.is_none();
    let strategies = match (forced_strategy(), strategies) {
        (Some(f), _) => vec![f],
        (None, Some(s)) => s.to_vec(),
        (None, None) => Strategy::ALL.to_vec(),
    };
    let tracer = Tracer::attach(&TracerOptions {
        strategies,
        ..TracerOptions::default()
    })
    .unwrap_or_else(|e| panic!("tracer: {}", selfheal_error_chain(&e)));
    if let Some(expected) = expected_strategy().filter(|_| loader_chooses) {
        assert_eq!(
            tracer.strategy(),
            expected,
            "attempts: {:?}",
            tracer.attempts()
        );
    }
    tracer
}

fn selfheal_error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(&format!(": {c}"));
        cur = c.source();
    }
    s
}

/// `CLOCK_MONOTONIC` in milliseconds (the clock `recv-peer connect`
/// reports its times in).
pub fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// A loopback listener the test drives directly.
pub fn listener() -> std::net::TcpListener {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback")
}

/// The `n` of a test's own 10.251.`n`.0/24 (1 to 250), another for each
/// of 250 calls in a row, even by concurrent tests in one process: their
/// addresses appear in agents' command lines.
pub fn subnet_251() -> u8 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    ((std::process::id().wrapping_mul(7).wrapping_add(k * 13)) % 250 + 1) as u8
}

/// Two network namespaces joined by a veth pair: `a` at 10.251.`n`.1 and
/// `b` at 10.251.`n`.2 (addresses that exist only inside these namespaces).
/// Deleting the namespaces on drop removes the veth and any nft rules.
pub struct NetnsPair {
    pub a: Netns,
    pub b: Netns,
    pub a_addr: String,
    pub b_addr: String,
}

impl NetnsPair {
    pub fn new(tag: &str) -> Result<NetnsPair, String> {
        let a = Netns::new(&format!("{tag}a"))?;
        let b = Netns::new(&format!("{tag}b"))?;
        let n = subnet_251();
        let (a_ip, b_ip) = (
            std::net::Ipv4Addr::new(10, 251, n, 1),
            std::net::Ipv4Addr::new(10, 251, n, 2),
        );
        selfheal_testbed::topology::link(&a, &b, &format!("sh{n}"), a_ip, b_ip)
            .map_err(|e| format!("{e:#}"))?;
        let (a_addr, b_addr) = (a_ip.to_string(), b_ip.to_string());
        Ok(NetnsPair {
            a,
            b,
            a_addr,
            b_addr,
        })
    }

    /// `recv-peer ARGS…` in `b`, once it says it listens (within 10 s).
    pub fn listening_in_b<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Peer {
        let mut cmd = self.b.command(&helper_bin("recv-peer"));
        cmd.args(args);
        let server = Peer::spawn(cmd);
        server.expect("listening", Duration::from_secs(10));
        server
    }

    /// `recv-peer client B:PORT` in `a` (a runner blocked reading its
    /// server on `b`), once connected, and its connection.
    pub fn client_in_a(&self, port: u16) -> (Peer, Ready) {
        let mut cmd = self.a.command(&helper_bin("recv-peer"));
        cmd.args(["client", &format!("{}:{port}", self.b_addr)]);
        let client = Peer::spawn(cmd);
        let ready = client.ready();
        (client, ready)
    }

    /// Makes `b` vanish without a FIN: it drops every packet it receives
    /// (nftables in `b`), so `a`'s connections to it go half-open.
    pub fn drop_all_into_b(&self) -> Result<(), String> {
        self.nft_in_b("table inet selfheal_test {\n chain input { type filter hook input priority 0; policy drop; }\n}\n")
    }

    /// Makes `b`'s server on `port` vanish without a FIN: `b` drops every
    /// packet for that port, other ports keep working.
    pub fn drop_port_into_b(&self, port: u16) -> Result<(), String> {
        self.nft_in_b(&format!(
            "table inet selfheal_test_{port} {{\n chain input {{ type filter hook input priority 0; tcp dport {port} drop; }}\n}}\n"
        ))
    }

    /// Cuts `b`'s `port` off in both directions: nothing in, nothing out
    /// (so not even a FIN or RST leaves when its server dies).
    pub fn cut_port_in_b(&self, port: u16) -> Result<(), String> {
        self.nft_in_b(&format!(
            "table inet selfheal_cut_{port} {{\n chain input {{ type filter hook input priority 0; tcp dport {port} drop; }}\n \
             chain output {{ type filter hook output priority 0; tcp sport {port} drop; }}\n}}\n"
        ))
    }

    /// Undoes [`NetnsPair::cut_port_in_b`].
    pub fn restore_port_in_b(&self, port: u16) -> Result<(), String> {
        self.nft_in_b(&format!("delete table inet selfheal_cut_{port}\n"))
    }

    fn nft_in_b(&self, rules: &str) -> Result<(), String> {
        self.b.nft(rules).map_err(|e| format!("{e:#}"))
    }
}

/// Arms TCP keepalive on socket `fd` of process `pid`, from outside, as the
/// helper will: `pidfd_getfd` duplicates the socket, `setsockopt` on the
/// duplicate changes the shared socket. Idle/interval in seconds.
pub fn arm_keepalive(
    pid: u32,
    fd: i32,
    idle: i32,
    interval: i32,
    count: i32,
) -> Result<(), String> {
    let os = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    let owned = dup_of(pid, fd)?;
    let dup = std::os::fd::AsRawFd::as_raw_fd(&owned);
    // SAFETY: setsockopt on the duplicate (open until `owned` drops) with
    // integer values.
    unsafe {
        let set = |level, name, value: libc::c_int| {
            libc::setsockopt(
                dup,
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        let failed = [
            set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
            set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, idle),
            set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, interval),
            set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, count),
        ]
        .iter()
        .any(|r| *r != 0);
        let err = failed.then(|| os("setsockopt"));
        err.map_or(Ok(()), Err)
    }
}

/// A duplicate of socket `fd` of process `pid` (`pidfd_open`, then
/// `pidfd_getfd`): options set or read on it are the shared socket's.
fn dup_of(pid: u32, fd: i32) -> Result<std::os::fd::OwnedFd, String> {
    let os = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    // SAFETY: plain syscalls with integer arguments; the pidfd is closed
    // here, the duplicate owned by the result.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) as libc::c_int;
        if pidfd < 0 {
            return Err(os("pidfd_open"));
        }
        let dup = libc::syscall(libc::SYS_pidfd_getfd, pidfd, fd, 0) as libc::c_int;
        libc::close(pidfd);
        if dup < 0 {
            return Err(os("pidfd_getfd"));
        }
        Ok(std::os::fd::FromRawFd::from_raw_fd(dup))
    }
}

/// Runs `cmd` with its output discarded; wall seconds and peak RSS (KiB).
pub fn timed(cmd: &mut Command) -> (f64, i64) {
    let u = timed_usage(cmd);
    (u.wall, u.max_rss)
}

/// What [`timed_usage`] measured of one run.
#[derive(Clone, Copy, Debug)]
pub struct Usage {
    /// Wall time, seconds.
    pub wall: f64,
    /// User and system CPU time of the child, seconds (`wait4`'s rusage).
    pub user: f64,
    pub sys: f64,
    /// Peak RSS, KiB.
    pub max_rss: i64,
}

/// [`timed`], with the child's CPU time: runs `cmd` with its output
/// discarded and returns its wall time, user and system time and peak RSS.
/// `cmd` runs as the child of a small process (`recv-peer rusage`), so its
/// peak RSS is its own: the kernel carries a forked copy's peak across
/// `exec` (`posix_spawn`'s too), and a test or bench process is large (a
/// C program spawned from `check-bench` measured 39 MiB). Its program,
/// arguments, environment and directory are `cmd`'s.
pub fn timed_usage(cmd: &mut Command) -> Usage {
    let mut launcher = Command::new(helper_bin("recv-peer"));
    launcher
        .arg("rusage")
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => launcher.env(k, v),
            None => launcher.env_remove(k),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        launcher.current_dir(dir);
    }
    let out = launcher.output().expect("run recv-peer rusage");
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |k: &str| -> f64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "recv-peer rusage {:?}: no {k} in {line:?} ({}; stderr: {})",
                    cmd.get_program(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                )
            })
    };
    Usage {
        wall: field("wall"),
        user: field("user"),
        sys: field("sys"),
        max_rss: field("maxrss") as i64,
    }
}

// ---------------------------------------------------------------------------
// Faults and privilege (tests/tests/it/faults.rs, tests/tests/it/privilege.rs):
// scratch directories, running `selfheal check`, reading a socket's options
// from outside, and the kernel's list of loaded BPF programs and maps.

/// A scratch directory of a name no other has (`selfheal-TAG-PID-NANOS`
/// under the temp dir), removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir =
            std::env::temp_dir().join(format!("selfheal-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    /// Writes `name` (its directories made) under the directory.
    pub fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> std::path::PathBuf {
        let p = self.0.join(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).expect("create dir");
        }
        std::fs::write(&p, contents).expect("write file");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A scratch directory under the temp dir (mode 0755), removed on drop.
pub struct Scratch(pub std::path::PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        use std::os::unix::fs::PermissionsExt as _;
        let d = std::env::temp_dir().join(format!("selfheal-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("create scratch dir");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))
            .expect("chmod scratch dir");
        Scratch(d)
    }

    pub fn join(&self, p: &str) -> std::path::PathBuf {
        self.0.join(p)
    }
}

impl AsRef<std::path::Path> for Scratch {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What one `selfheal check --json` run gave.
#[derive(Debug)]
pub struct CheckRun {
    /// Exit code (-1 when killed by a signal).
    pub code: i32,
    /// One JSON value per agent.
    pub results: Vec<serde_json::Value>,
    pub stdout: String,
    pub stderr: String,
}

impl CheckRun {
    /// The result for `agent`.
    pub fn agent(&self, agent: &str) -> &serde_json::Value {
        self.results
            .iter()
            .find(|r| r["agent"] == agent)
            .unwrap_or_else(|| panic!("no {agent} in {self:#?}"))
    }
}

/// `selfheal check --json --config CONFIG --state-dir STATE --snapshot-dir
/// SNAPS --helper HELPER` plus `extra` arguments. A line of stdout that is
/// not JSON fails the test (the report must stay machine-readable).
pub fn run_check(
    config: &std::path::Path,
    state: &std::path::Path,
    snapshots: &std::path::Path,
    helper: &std::path::Path,
    extra: &[&str],
) -> CheckRun {
    let places = fixtures::Places::new(state, snapshots).helper(helper);
    run_check_at(config, &places, extra)
}

/// [`run_check`] on `places` (`Places::without_helper(dir)`, mostly).
pub fn run_check_at(
    config: &std::path::Path,
    places: &fixtures::Places,
    extra: &[&str],
) -> CheckRun {
    let out = fixtures::check_cmd(config, places)
        .args(extra)
        .output()
        .expect("run selfheal check");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let results = stdout
        .lines()
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}; stderr: {stderr}"))
        })
        .collect();
    CheckRun {
        code: out.status.code().unwrap_or(-1),
        results,
        stdout,
        stderr,
    }
}

/// The fd number under which process `pid` holds socket `inode`.
pub fn socket_fd_of(pid: u32, inode: u64) -> Option<i32> {
    let want = format!("socket:[{inode}]");
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .flatten()
        .find(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == want.as_str()))
        .and_then(|e| e.file_name().to_str()?.parse().ok())
}

/// Whether `SO_KEEPALIVE` is on for socket `fd` of process `pid`, read from
/// outside through a duplicate (`pidfd_getfd`): the options are the shared
/// socket's.
pub fn keepalive_enabled(pid: u32, fd: i32) -> Result<bool, String> {
    let os = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    let owned = dup_of(pid, fd)?;
    let dup = std::os::fd::AsRawFd::as_raw_fd(&owned);
    // SAFETY: getsockopt on the duplicate (open until `owned` drops) into a
    // local out-value.
    unsafe {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        let r = libc::getsockopt(
            dup,
            libc::SOL_SOCKET,
            libc::SO_KEEPALIVE,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        );
        let err = (r != 0).then(|| os("getsockopt"));
        err.map_or(Ok(v != 0), Err)
    }
}

/// Ids of every BPF program (`BPF_PROG_GET_NEXT_ID`) or map
/// (`BPF_MAP_GET_NEXT_ID`) the kernel has loaded — the list `bpftool prog`
/// and `bpftool map` walk. Needs root. Bounded at 1,000,000 ids.
pub fn kernel_bpf_ids(maps: bool) -> Result<std::collections::BTreeSet<u32>, String> {
    const BPF_PROG_GET_NEXT_ID: libc::c_long = 11;
    const BPF_MAP_GET_NEXT_ID: libc::c_long = 12;
    let cmd = if maps {
        BPF_MAP_GET_NEXT_ID
    } else {
        BPF_PROG_GET_NEXT_ID
    };
    let mut ids = std::collections::BTreeSet::new();
    let mut start = 0u32;
    for _ in 0..1_000_000 {
        // union bpf_attr { struct { __u32 start_id, next_id, open_flags; } }
        let mut attr = [0u32; 4];
        attr[0] = start;
        // SAFETY: `attr` is a valid, zero-padded bpf_attr of the given size.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                cmd,
                attr.as_mut_ptr(),
                std::mem::size_of_val(&attr),
            )
        };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOENT) => Ok(ids),
                _ => Err(format!("bpf(GET_NEXT_ID): {e}")),
            };
        }
        start = attr[1];
        ids.insert(start);
    }
    Err("more than 1,000,000 BPF ids".into())
}

/// The BPF program ids (`prog_id:` lines) and map ids (`map_id:` lines) that
/// process `pid` holds through its fds (programs, links, maps), from
/// `/proc/PID/fdinfo`.
pub fn bpf_ids_held_by(
    pid: u32,
) -> (
    std::collections::BTreeSet<u32>,
    std::collections::BTreeSet<u32>,
) {
    let mut progs = std::collections::BTreeSet::new();
    let mut maps = std::collections::BTreeSet::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return (progs, maps);
    };
    for e in dir.flatten() {
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        for line in text.lines() {
            let mut kv = line.splitn(2, ':');
            let (Some(k), Some(v)) = (kv.next(), kv.next()) else {
                continue;
            };
            let Ok(id) = v.trim().parse::<u32>() else {
                continue;
            };
            match k {
                "prog_id" => {
                    progs.insert(id);
                }
                "map_id" => {
                    maps.insert(id);
                }
                _ => {}
            }
        }
    }
    (progs, maps)
}

/// A process as two readers of it must agree on it (the task iterators
/// and procfs, read moments apart): what varies with the moment it is read
/// (CPU ticks, how long each thread has waited) left out.
pub fn steady(p: &selfheal_core::proc::ProcessInfo) -> selfheal_core::proc::ProcessInfo {
    let mut p = p.clone();
    for t in &mut p.threads {
        t.cpu_ticks = 0;
        t.idle_ms = None;
        if let Some(r) = &mut t.recv {
            r.idle_ms = None;
        }
        if let Some(w) = &mut t.wait {
            w.idle_ms = None;
        }
    }
    p
}

/// The ids of the task iterator programs this build pinned (where checks
/// look for them): programs meant to outlive the helper that pinned them.
pub fn pinned_iterator_ids() -> std::collections::BTreeSet<u32> {
    selfheal::ebpf::iter::pin_dirs()
        .iter()
        .flat_map(|dir| iterator_ids_in(dir))
        .collect()
}

/// The ids of the task iterator programs pinned in `dir`.
pub fn iterator_ids_in(dir: &std::path::Path) -> std::collections::BTreeSet<u32> {
    use std::os::fd::AsRawFd as _;
    let mut ids = std::collections::BTreeSet::new();
    for name in [
        selfheal::ebpf::iter::TASK_PROGRAM,
        selfheal::ebpf::iter::FILE_PROGRAM,
    ] {
        let Ok(fd) = selfheal::sys::bpf::obj_get(&dir.join(name)) else {
            continue;
        };
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))
            .unwrap_or_default();
        ids.extend(
            info.lines()
                .filter_map(|l| l.strip_prefix("prog_id:")?.trim().parse::<u32>().ok()),
        );
    }
    ids
}

// ---- soak and scale helpers -------------------------------------------------

impl Peer {
    /// Like [`Peer::expect`], but `None` (no panic) when no such line comes
    /// within `timeout` or the peer exits first: for drivers that count
    /// failures instead of stopping at the first.
    pub fn try_expect(&self, prefix: &str, timeout: Duration) -> Option<String> {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return Some(line),
                Ok(_) => continue,
                Err(_) => return None,
            }
        }
    }
}

/// Resident set size of `pid` in KiB (`VmRSS` of `/proc/PID/status`).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// The open file descriptors of `pid` and what each points at
/// (`/proc/PID/fd/N` → `socket:[…]`, a path…); `None` when it is gone.
pub fn open_fds(pid: u32) -> Option<std::collections::BTreeMap<u32, String>> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    Some(
        dir.flatten()
            .filter_map(|e| {
                let n = e.file_name().to_str()?.parse().ok()?;
                let t = std::fs::read_link(e.path()).ok()?;
                Some((n, t.to_string_lossy().into_owned()))
            })
            .collect(),
    )
}

/// A status endpoint on loopback answering each of at most `max` requests
/// with `body` (JSON, HTTP/1.1, then closed).
pub fn status_server(body: &'static str, max: usize) -> std::net::SocketAddr {
    use std::io::Read as _;
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("local address");
    std::thread::spawn(move || {
        for s in l.incoming().take(max).flatten() {
            let mut s = s;
            let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
            let _ = s.read(&mut [0u8; 2048]);
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

/// Runs `f` on a thread whose credentials are `uid`'s (this thread only:
/// raw syscalls, not glibc's process-wide wrappers).
pub fn as_uid<T: Send>(uid: u32, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: plain syscalls that change this thread's credentials.
            unsafe {
                assert_eq!(
                    libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()),
                    0
                );
                assert_eq!(libc::syscall(libc::SYS_setresgid, uid, uid, uid), 0);
                assert_eq!(libc::syscall(libc::SYS_setresuid, uid, uid, uid), 0);
            }
            f()
        })
        .join()
        .expect("thread with dropped credentials")
    })
}

// ---- a helper behind mounts of its own ----------------------------------------

/// A `selfheal helper` in a mount namespace of its own (`unshare --mount`,
/// private propagation), laid out first by `setup` (shell commands run
/// there as root: mounts over `/run` or `/sys/fs/bpf` that no other
/// process sees). The namespace, its mounts and what is pinned in them go
/// with the helper, which is killed on drop. Its log is in `log`.
pub struct HelperInOwnMounts {
    child: Option<std::process::Child>,
    pub log: std::path::PathBuf,
}

impl HelperInOwnMounts {
    /// Starts `selfheal ARGS…` after `setup`; waits (at most `within`) for
    /// its log to say where its task iterators are, or that they are not
    /// pinned.
    pub fn start(
        setup: &str,
        args: &[String],
        log: std::path::PathBuf,
        within: std::time::Duration,
    ) -> HelperInOwnMounts {
        let script = format!("set -e\n{setup}\nexec \"$0\" \"$@\"");
        let child = Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                &script,
            ])
            .arg(selfheal_bin())
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).expect("create the helper's log"))
            .spawn()
            .expect("start unshare");
        let h = HelperInOwnMounts {
            child: Some(child),
            log,
        };
        let said = wait_for(within, std::time::Duration::from_millis(50), || {
            let text = h.log_text();
            text.contains("helper: task iterators").then_some(())
        });
        assert!(
            said.is_some(),
            "the helper said nothing of its iterators within {within:?}: {}",
            h.log_text()
        );
        h
    }

    /// The helper's pid (unshare and sh exec it).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, std::process::Child::id)
    }

    /// `path` as the helper sees it, through `/proc/PID/root`.
    pub fn inside(&self, path: &str) -> std::path::PathBuf {
        std::path::PathBuf::from(format!("/proc/{}/root{path}", self.pid()))
    }

    /// What it has logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for HelperInOwnMounts {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Where `h` logged it pinned its task iterators (`helper: task iterators
/// pinned in DIR`), as it sees the path; panics, with its log, where it
/// did not pin them.
pub fn pinned_by(h: &HelperInOwnMounts) -> String {
    let log = h.log_text();
    log.lines()
        .find_map(|l| l.split("helper: task iterators pinned in ").nth(1))
        .map(|d| d.trim().to_string())
        .unwrap_or_else(|| panic!("the helper pinned no task iterators: {log}"))
}

/// Proves `h`'s pins in `dir` (its own view of the path) work: they open
/// from outside its namespace under the rule every check applies (a
/// root-only bpffs, the expected programs) and walk this process; the
/// helper's own `iterate` passes this process too. The pinned programs'
/// ids.
pub fn pins_work(h: &HelperInOwnMounts, dir: &str) -> std::collections::BTreeSet<u32> {
    use std::os::fd::AsFd as _;
    let me = std::process::id();
    let seen = h.inside(dir);
    let (mut it, _) = selfheal::ebpf::iter::open_first(std::slice::from_ref(&seen))
        .unwrap_or_else(|e| panic!("the pins in {} do not open: {e}", seen.display()));
    let pidfd = selfheal::sys::pidfd::pidfd_open(me).expect("pidfd of this process");
    let pass = it.process(pidfd.as_fd()).expect("a pass through the pins");
    assert!(
        !pass.threads.is_empty() && pass.threads.iter().all(|t| t.tgid == me),
        "{:?}",
        pass.threads
    );
    let sock = h.inside("/run/selfheal/helper.sock");
    let mut client = selfheal::helper::client::HelperClient::connect_with(&sock, client_opts())
        .unwrap_or_else(|e| panic!("connect to {}: {e}", sock.display()));
    let answer = client.iterate(&[me]).expect("iterate");
    assert_eq!(
        answer.processes.iter().map(|p| p.pid).collect::<Vec<_>>(),
        vec![me],
        "{answer:?}"
    );
    let ids = iterator_ids_in(&seen);
    assert_eq!(ids.len(), 2, "two programs pinned: {ids:?}");
    ids
}

/// Stops `h` and waits (at most `within`) until the programs `ids` it
/// pinned are gone from the kernel: its namespace, its bpffs and the pins
/// in it went with it. The time that took.
pub fn pins_go_with(
    h: HelperInOwnMounts,
    ids: &std::collections::BTreeSet<u32>,
    within: std::time::Duration,
) -> std::time::Duration {
    let t0 = std::time::Instant::now();
    drop(h);
    let gone = wait_for(within, std::time::Duration::from_millis(100), || {
        let live = kernel_bpf_ids(false).ok()?;
        ids.iter().all(|id| !live.contains(id)).then_some(())
    });
    assert!(
        gone.is_some(),
        "programs {ids:?} still loaded {within:?} after the helper stopped"
    );
    t0.elapsed()
}
