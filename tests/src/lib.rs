//! Helpers for selfheal's integration tests: spawning the peer programs and
//! talking to them, network namespaces that clean up after themselves,
//! bounded waiting, and skipping (with the reason on stderr) where the
//! machine truly cannot run a test.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    process::{Child, ChildStdin, Command, Stdio},
    sync::mpsc::{Receiver, RecvTimeoutError, channel},
    time::{Duration, Instant},
};

use selfheal::ebpf::{Strategy, Tracer, TracerOptions};

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
pub fn selfheal_bin() -> std::path::PathBuf {
    static BUILD: std::sync::Once = std::sync::Once::new();
    BUILD.call_once(|| {
        let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["build", "--quiet", "-p", "selfheal", "--bin", "selfheal"])
            .status()
            .expect("run cargo");
        assert!(status.success(), "cannot build selfheal");
    });
    bin_dir().join("selfheal")
}

/// Whether we run as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Prints why a test is skipped, on stderr, in one recognizable form.
pub fn skip(test: &str, why: &str) {
    eprintln!("SKIPPED {test}: {why}");
}

/// Skips (returns `false`) unless root.
pub fn need_root(test: &str) -> bool {
    if !is_root() {
        skip(test, "needs root (eBPF, network namespaces)");
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
        skip(
            test,
            "eBPF is not built in (no eBPF toolchain: `cargo xtask setup`)",
        );
        return false;
    }
    need_root(test)
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

/// A network namespace made for one test, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// Creates `selfheal-<tag>-<pid>` with its loopback up. `None` (with the
    /// reason printed) when `ip netns` is unavailable.
    pub fn new(tag: &str) -> Result<Netns, String> {
        let name = format!("selfheal-{tag}-{}", std::process::id());
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(Stdio::null())
            .status();
        run("ip", &["netns", "add", &name])?;
        let ns = Netns { name };
        run("ip", &["-n", &ns.name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// A command that runs `program` inside the namespace.
    pub fn command(&self, program: &std::path::Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
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

/// A loopback listener the test drives directly.
pub fn listener() -> std::net::TcpListener {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback")
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
        // Distinct per pair, even for pairs of concurrent tests in one
        // process: their addresses appear in agents' command lines.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let n = (std::process::id().wrapping_mul(7).wrapping_add(k * 13)) % 250 + 1;
        let (va, vb) = (format!("sha{n}"), format!("shb{n}"));
        run(
            "ip",
            &[
                "-n", &a.name, "link", "add", &va, "type", "veth", "peer", "name", &vb, "netns",
                &b.name,
            ],
        )?;
        let (a_addr, b_addr) = (format!("10.251.{n}.1"), format!("10.251.{n}.2"));
        run(
            "ip",
            &[
                "-n",
                &a.name,
                "addr",
                "add",
                &format!("{a_addr}/24"),
                "dev",
                &va,
            ],
        )?;
        run(
            "ip",
            &[
                "-n",
                &b.name,
                "addr",
                "add",
                &format!("{b_addr}/24"),
                "dev",
                &vb,
            ],
        )?;
        run("ip", &["-n", &a.name, "link", "set", &va, "up"])?;
        run("ip", &["-n", &b.name, "link", "set", &vb, "up"])?;
        Ok(NetnsPair {
            a,
            b,
            a_addr,
            b_addr,
        })
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
        run(
            "ip",
            &[
                "netns",
                "exec",
                &self.b.name,
                "nft",
                "delete",
                "table",
                "inet",
                &format!("selfheal_cut_{port}"),
            ],
        )
    }

    fn nft_in_b(&self, rules: &str) -> Result<(), String> {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.b.name, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run nft: {e}"))?;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(rules.as_bytes())
            .map_err(|e| e.to_string())?;
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "nft: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
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
    // SAFETY: plain syscalls with integer arguments; the fds they return are
    // closed below.
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
        libc::close(dup);
        err.map_or(Ok(()), Err)
    }
}

/// Runs `cmd` with its output discarded; wall seconds and peak RSS (KiB).
#[expect(
    clippy::zombie_processes,
    reason = "the child is reaped by wait4, for its rusage"
)]
pub fn timed(cmd: &mut Command) -> (f64, i64) {
    let start = Instant::now();
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for the child we just spawned (and that std never waits for).
    unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    (start.elapsed().as_secs_f64(), usage.ru_maxrss)
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
