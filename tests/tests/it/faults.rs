//! Faults, attacked on purpose, each against real
//! processes and sockets: the snapshot directory full, the helper killed
//! mid-request and restarted (and its eBPF programs gone with it), a pid
//! reused between judging and acting, a churn of short-lived matching
//! processes, and the wall clock jumping between checks.
//!
//! Most need root (network namespaces, mounts, pidfd_getfd on other
//! processes, clock_settime); they skip, saying why, otherwise.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use tests::fixtures::{Places, Reaped, control_runner, quiet_helper};
use tests::{
    CheckRun, NetnsPair, Peer, Ready, Scratch, keepalive_enabled, need_root, run_check,
    run_check_at, selfheal_bin, socket_fd_of, wait_for,
};

const SEC: Duration = Duration::from_secs(1);

/// A runner in netns `a`, blocked reading its control connection from a
/// heartbeat server in `b` (a byte every 300 ms), and a config that judges
/// it (`control` upstream, heartbeat 1 s): wedged about 3 s after `b`
/// starts dropping the port.
struct Runner {
    pair: NetnsPair,
    _server: Peer,
    client: Peer,
    ready: Ready,
    fd: i32,
}

impl Runner {
    fn new(tag: &str) -> Runner {
        let pair = NetnsPair::new(tag).expect("netns pair");
        let b = pair.b_addr.clone();
        let server = pair.listening_in_b(&["beat", &format!("{b}:7443"), "300"]);
        let (mut client, ready) = pair.client_in_a(7443);
        client.tell("go");
        let fd = socket_fd_of(ready.pid, ready.inode).expect("the runner's socket fd");
        Runner {
            pair,
            _server: server,
            client,
            ready,
            fd,
        }
    }

    fn config(&self, path: &Path) {
        let b = &self.pair.b_addr;
        std::fs::write(
            path,
            format!(
                "{}[agent.heal]\nstep_window = \"20s\"\nbackoff = \"1s\"\n",
                control_runner("client", b)
            ),
        )
        .expect("write config");
    }

    fn keepalive(&self) -> bool {
        keepalive_enabled(self.ready.pid, self.fd).expect("read the runner's SO_KEEPALIVE")
    }

    /// The control server vanishes without a FIN.
    fn cut(&self) {
        self.pair.drop_port_into_b(7443).expect("nft");
    }
}

/// A tmpfs mounted on `dir` for the test, unmounted (lazily, so a busy
/// mount cannot leak) on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount tmpfs: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the file system under `path` with one file until `ENOSPC`; the
/// bytes written.
fn fill(path: &Path) -> u64 {
    use std::io::Write as _;
    let mut f = std::fs::File::create(path).expect("create the filler");
    let chunk = [0x55u8; 4096];
    let mut n = 0u64;
    // Bounded: the tmpfs is 64 KiB.
    for _ in 0..100_000 {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(k) => n += k as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("fill {}: {e}", path.display()),
        }
    }
    // Whatever tail is left (a partial page) too.
    for _ in 0..4096 {
        match f.write(&chunk[..1]) {
            Ok(1) => n += 1,
            _ => break,
        }
    }
    n
}

fn reason_codes(v: &serde_json::Value) -> Vec<String> {
    v["reasons"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["code"].as_str().map(str::to_string))
        .collect()
}

/// The snapshot directory is full (a 64 KiB tmpfs, filled): `check` finds
/// the runner wedged, says the snapshot was NOT written, exits non-zero and
/// takes no healing step — the runner's socket keeps no keepalive. Once the
/// space is back, the next check writes the snapshot and heals (keepalive
/// armed), and the log holds exactly that one whole record.
#[test]
fn a_full_snapshot_dir_means_no_heal_until_space_returns() {
    let _area = tests::area(module_path!());
    if !need_root("snapshot_dir_full") {
        return;
    }
    let runner = Runner::new("sf");
    let dirs = Scratch::new("faults-full");
    let config = dirs.join("config.toml");
    runner.config(&config);
    let snaps = dirs.join("snapshots");
    let _tmpfs = match Tmpfs::mount(&snaps, "64k") {
        Ok(t) => t,
        Err(e) => {
            tests::skip("snapshot_dir_full", &format!("cannot mount a tmpfs: {e}"));
            return;
        }
    };
    let check = || {
        run_check_at(
            &config,
            &Places::without_helper(&dirs).snapshots(&snaps),
            &[],
        )
    };
    std::thread::sleep(SEC);
    let warm = check();
    assert_eq!(warm.agent("runner")["verdict"], "idle", "{warm:#?}");
    assert_eq!(warm.code, 0, "{warm:#?}");

    let filler = snaps.join("filler");
    let filled = fill(&filler);
    eprintln!("filled the snapshot tmpfs with {filled} bytes");
    assert!(!runner.keepalive(), "no keepalive before any heal");

    runner.cut();
    let cut = Instant::now();
    let mut wedged: Option<CheckRun> = None;
    for _ in 0..30 {
        std::thread::sleep(Duration::from_millis(500));
        let r = check();
        assert!(!r.stderr.contains("panicked"), "{r:#?}");
        if r.agent("runner")["verdict"] == "wedged" {
            wedged = Some(r);
            break;
        }
    }
    let r = wedged.expect("the runner turned wedged within 15 s");
    eprintln!("wedged {:?} after the cut", cut.elapsed());
    let o = r.agent("runner");
    assert_eq!(r.code, 2, "wedged and NOT healed: {r:#?}");
    assert!(o["snapshot"].is_null(), "{o:#}");
    let err = o["snapshot_error"].as_str().expect("snapshot_error");
    assert!(
        err.contains("No space left") && err.contains(&selfheal::snapshots::agent_file("runner")),
        "the error names the file and ENOSPC: {err}"
    );
    assert!(r.stderr.contains("NOT written"), "{}", r.stderr);
    // The ladder decided to act, and nothing was taken.
    for a in o["heal"]["actions"].as_array().into_iter().flatten() {
        assert_eq!(a["ok"], false, "{o:#}");
        assert!(
            a["detail"]
                .as_str()
                .is_some_and(|d| d.contains("snapshot could not be written")),
            "{o:#}"
        );
    }
    assert!(
        reason_codes(o).contains(&"control_silent".to_string()),
        "{o:#}"
    );
    assert!(!runner.keepalive(), "keepalive armed without a snapshot");

    // Still full: still no action, check after check.
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(300));
        let r = check();
        assert_eq!(r.agent("runner")["verdict"], "wedged", "{r:#?}");
        assert_eq!(r.code, 2, "{r:#?}");
        assert!(r.agent("runner")["snapshot"].is_null());
        assert!(!runner.keepalive(), "keepalive armed without a snapshot");
    }

    // Space returns: the snapshot is written, then the heal is taken.
    std::fs::remove_file(&filler).unwrap();
    let r = check();
    let o = r.agent("runner");
    assert_eq!(o["verdict"], "wedged", "{r:#?}");
    let id = o["snapshot"].as_str().expect("a snapshot now").to_string();
    let actions = o["heal"]["actions"].as_array().cloned().unwrap_or_default();
    assert_eq!(actions.len(), 1, "{o:#}");
    assert_eq!(actions[0]["step"]["action"], "arm_keepalive", "{o:#}");
    assert_eq!(actions[0]["ok"], true, "{o:#}");
    assert_eq!(r.code, 1, "wedged and healed: {r:#?}");
    assert!(runner.keepalive(), "the heal armed keepalive");

    // The log holds that one record, whole (no torn line from the full disk).
    let out = Command::new(selfheal_bin())
        .args(["snapshots", "list", "--json", "--dir"])
        .arg(&snaps)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let ids: Vec<String> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(ids, vec![id], "{text}");
    let log = std::fs::read(snaps.join(selfheal::snapshots::agent_file("runner"))).unwrap();
    assert_eq!(log.iter().filter(|b| **b == b'\n').count(), 1);
    assert_eq!(log.last(), Some(&b'\n'));
    drop(runner.client);
}

// ---------------------------------------------------------------------------
// The helper killed mid-request and restarted.

/// A `selfheal helper` started on a listening socket the test holds (as
/// systemd's socket unit would: the socket outlives the helper), killed on
/// drop.
struct ActivatedHelper {
    child: Reaped,
}

impl ActivatedHelper {
    fn start(listener: &std::os::unix::net::UnixListener, extra: &[&str]) -> ActivatedHelper {
        use std::os::{fd::AsRawFd as _, unix::process::CommandExt as _};
        let fd = listener.as_raw_fd();
        let mut cmd = Command::new("sh");
        // LISTEN_PID must be the helper's pid: the shell's, which exec keeps.
        cmd.arg("-c")
            .arg(r#"export LISTEN_PID=$$ LISTEN_FDS=1; exec "$0" helper --idle-timeout 120s "$@""#)
            .arg(selfheal_bin())
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if fd == 3 {
                    let flags = libc::fcntl(3, libc::F_GETFD);
                    libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
                } else if libc::dup2(fd, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        ActivatedHelper {
            child: Reaped(cmd.spawn().expect("start selfheal helper")),
        }
    }

    fn pid(&self) -> u32 {
        self.child.pid()
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: a signal to our own child.
        assert_eq!(unsafe { libc::kill(self.pid() as libc::pid_t, sig) }, 0);
    }

    /// SIGKILL, reaped.
    fn kill(mut self) -> String {
        self.signal(libc::SIGKILL);
        let _ = self.child.0.wait();
        self.child.stderr()
    }

    /// SIGTERM, reaped within 10 s.
    fn stop(mut self) -> String {
        self.signal(libc::SIGTERM);
        let exited = wait_for(10 * SEC, Duration::from_millis(20), || {
            self.child.0.try_wait().ok().flatten()
        });
        if exited.is_none() {
            let _ = self.child.0.kill();
            let _ = self.child.0.wait();
            panic!(
                "the helper did not stop on SIGTERM: {}",
                self.child.stderr()
            );
        }
        self.child.stderr()
    }
}

fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// The helper (real `selfheal helper`, eBPF loaded) takes a `watch`
/// request and dies (SIGKILL) before answering; systemd-style, the socket
/// stays and a new helper is started on it. The client retries once on a
/// new connection and gets its answer from the new helper. Every BPF
/// program and map the killed helper held is gone from the kernel's lists
/// (but the task iterators pinned for checks, which are meant to stay);
/// the new helper's are new ones, and they go too when it stops.
#[test]
fn a_helper_killed_mid_request_is_retried_and_leaks_no_bpf_programs() {
    let _area = tests::area(module_path!());
    use selfheal::helper::{ClientOptions, HelperClient};
    if !tests::need_ebpf("helper_killed") {
        return;
    }
    let dir = Scratch::new("faults-killed");
    let path = dir.join("helper.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    let before = tests::kernel_bpf_ids(false).expect("the kernel's program list");

    let a = ActivatedHelper::start(&listener, &["--tracer"]);
    let opts = ClientOptions {
        connect_timeout: 3 * SEC,
        timeout: 15 * SEC,
        act_timeout: 15 * SEC,
    };
    let mut client = HelperClient::connect_with(&path, opts).expect("connect");
    let hello = client.hello().expect("helper A answers");
    assert_eq!(hello.helper_pid, a.pid());
    assert!(
        hello.ebpf.strategy.is_some(),
        "helper A attached its tracer: {:?}",
        hello.ebpf
    );
    // The task iterators it pinned (or opened from pins) are meant to
    // outlive it; everything else it holds is not.
    let pinned = tests::pinned_iterator_ids();
    let (a_progs, a_maps) = tests::bpf_ids_held_by(a.pid());
    let a_progs: std::collections::BTreeSet<u32> = a_progs.difference(&pinned).copied().collect();
    assert!(!a_progs.is_empty() && !a_maps.is_empty());
    let loaded = tests::kernel_bpf_ids(false).unwrap();
    assert!(a_progs.is_subset(&loaded), "{a_progs:?} not in {loaded:?}");
    assert!(a_progs.is_disjoint(&before));
    eprintln!(
        "helper A (pid {}) holds {} BPF programs and {} maps ({:?})",
        a.pid(),
        a_progs.len(),
        a_maps.len(),
        hello.ebpf.strategy
    );

    // A process to watch: ours.
    let me = std::process::id();
    // Mid-request: A has the connection (it answered on it just now) and
    // is stopped, so the request sits unanswered; then A dies.
    client.hello().expect("keep the connection fresh");
    a.signal(libc::SIGSTOP);
    wait_for(5 * SEC, Duration::from_millis(2), || {
        (process_state(a.pid()) == Some('T')).then_some(())
    })
    .expect("helper A stopped");
    let sent = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    let asker = std::thread::spawn(move || {
        let r = client.watch(&[me]);
        let _ = tx.send(sent.elapsed());
        (client, r)
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(rx.try_recv().is_err(), "nobody could have answered yet");
    let a_pid = a.pid();
    let a_log = a.kill();
    let killed = Instant::now();
    // The kernel frees the programs once the last fd closes (RCU: soon).
    let gone = wait_for(10 * SEC, Duration::from_millis(20), || {
        let progs = tests::kernel_bpf_ids(false).ok()?;
        let maps = tests::kernel_bpf_ids(true).ok()?;
        (progs.is_disjoint(&a_progs) && maps.is_disjoint(&a_maps)).then_some(())
    });
    assert!(
        gone.is_some(),
        "helper A's BPF programs or maps outlived it: progs {:?} maps {:?}",
        a_progs.intersection(&tests::kernel_bpf_ids(false).unwrap()),
        a_maps.intersection(&tests::kernel_bpf_ids(true).unwrap()),
    );
    let freed_in = killed.elapsed();
    assert!(
        !a_log.contains("panicked"),
        "helper A (pid {a_pid}): {a_log}"
    );

    // The restart, on the same socket.
    let b = ActivatedHelper::start(&listener, &["--tracer"]);
    let (mut client, answer) = asker.join().expect("the asking thread");
    let waited = rx.recv().unwrap();
    let watched = answer.expect("the watch is answered after the retry");
    assert_eq!(
        watched.watched.iter().map(|w| w.pid).collect::<Vec<_>>(),
        vec![me]
    );
    assert!(
        waited > Duration::from_millis(300),
        "answered only once B was up: {waited:?}"
    );
    let hello = client.hello().expect("helper B answers");
    assert_eq!(hello.helper_pid, b.pid(), "the answer came from helper B");
    let (b_progs, b_maps) = tests::bpf_ids_held_by(b.pid());
    let b_progs: std::collections::BTreeSet<u32> = b_progs.difference(&pinned).copied().collect();
    assert!(!b_progs.is_empty());
    assert!(b_progs.is_disjoint(&a_progs), "new programs, not A's");
    eprintln!(
        "helper A killed mid-request: its {} programs and {} maps were gone {freed_in:?} \
         later; the retried watch was answered by helper B {waited:?} after it was sent",
        a_progs.len(),
        a_maps.len()
    );
    drop(client);
    let b_log = b.stop();
    let gone = wait_for(10 * SEC, Duration::from_millis(20), || {
        let progs = tests::kernel_bpf_ids(false).ok()?;
        let maps = tests::kernel_bpf_ids(true).ok()?;
        (progs.is_disjoint(&b_progs) && maps.is_disjoint(&b_maps)).then_some(())
    });
    assert!(
        gone.is_some(),
        "helper B's BPF objects outlived it: {b_log}"
    );
}

/// `selfheal check --helper` where the helper was SIGKILLed (its socket
/// left behind, nobody listening): the check says so on stderr, reports
/// the missing eBPF evidence as a gap, and still judges.
#[test]
fn check_reports_a_dead_helper_and_goes_on_without_it() {
    let _area = tests::area(module_path!());
    if !need_root("check_dead_helper") {
        return;
    }
    let dir = Scratch::new("faults-dead-helper");
    let path = dir.join("helper.sock");
    let mut helper = quiet_helper(&path);
    let up = wait_for(10 * SEC, Duration::from_millis(20), || {
        selfheal::helper::HelperClient::connect(&path).ok()
    });
    let _ = helper.kill();
    let _ = helper.wait();
    assert!(up.is_some(), "the helper came up");
    assert!(path.exists(), "SIGKILL leaves the socket file behind");
    let config = dir.join("config.toml");
    tests::own_agent_config(&config);
    let r = run_check(&config, &dir.join("state"), &dir.join("snaps"), &path, &[]);
    assert_eq!(r.code, 0, "{r:#?}");
    assert_eq!(r.agent("me")["verdict"], "healthy", "{r:#?}");
    assert!(
        r.stderr
            .contains(&format!("helper at {} is unavailable", path.display()))
            && r.stderr.contains("nobody listens"),
        "{}",
        r.stderr
    );
    let gaps = r.agent("me")["gaps"].to_string();
    assert!(gaps.contains("helper"), "the missing eBPF evidence: {gaps}");
}

/// The same without socket activation: the killed helper leaves a stale
/// socket file (connections refused) until a supervisor starts a new helper
/// on the path. The client's retry waits for it, within its connect
/// timeout, instead of failing at once.
#[test]
fn the_retry_waits_for_a_helper_restarted_on_its_path() {
    let _area = tests::area(module_path!());
    use selfheal::helper::{ClientOptions, HelperClient};
    if !need_root("helper_restarted_on_path") {
        return;
    }
    let dir = Scratch::new("faults-restart-path");
    let path = dir.join("helper.sock");
    let start = || quiet_helper(&path);
    let mut a = start();
    let opts = tests::patient_client_opts();
    let mut client = wait_for(10 * SEC, Duration::from_millis(20), || {
        HelperClient::connect_with(&path, opts).ok()
    })
    .expect("helper A up");
    assert_eq!(client.hello().unwrap().helper_pid, a.id());
    // SAFETY: signals to our own child.
    unsafe { libc::kill(a.id() as libc::pid_t, libc::SIGSTOP) };
    wait_for(5 * SEC, Duration::from_millis(2), || {
        (process_state(a.id()) == Some('T')).then_some(())
    })
    .expect("helper A stopped");
    let asker = std::thread::spawn(move || {
        let r = client.hello();
        (client, r)
    });
    std::thread::sleep(Duration::from_millis(200));
    let _ = a.kill();
    let _ = a.wait();
    // The supervisor takes a moment to start the new one.
    std::thread::sleep(Duration::from_millis(300));
    let mut b = start();
    let (_client, r) = asker.join().unwrap();
    let _ = b.kill();
    let _ = b.wait();
    let hello = r.expect("answered by the restarted helper");
    assert_eq!(hello.helper_pid, b.id());

    // No helper comes back: a clear error after the bounded wait.
    let mut c = start();
    let mut client = wait_for(10 * SEC, Duration::from_millis(20), || {
        HelperClient::connect_with(
            &path,
            ClientOptions {
                connect_timeout: SEC,
                ..opts
            },
        )
        .ok()
    })
    .expect("helper C up");
    client.hello().unwrap();
    // SAFETY: signals to our own child.
    unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGSTOP) };
    wait_for(5 * SEC, Duration::from_millis(2), || {
        (process_state(c.id()) == Some('T')).then_some(())
    })
    .expect("helper C stopped");
    let asker = std::thread::spawn(move || client.hello());
    std::thread::sleep(Duration::from_millis(200));
    let _ = c.kill();
    let _ = c.wait();
    let killed = Instant::now();
    let e = asker.join().unwrap().expect_err("nobody answers");
    let waited = killed.elapsed();
    let msg = e.to_string();
    assert!(
        msg.contains("the retry found no helper within 1000 ms") && msg.contains("nobody listens"),
        "{msg}"
    );
    assert!(waited < 5 * SEC, "bounded: {waited:?}");
    eprintln!("no helper came back: gave up {waited:?} after the kill: {msg}");
}

// ---------------------------------------------------------------------------
// A pid reused between judging and acting.

/// `struct clone_args` (linux/sched.h, version 2: with `set_tid`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// A `sleep 60` that the kernel gives exactly pid `pid` (`clone3` with
/// `set_tid`: root only), killed and reaped on drop.
struct Impostor(u32);

impl Impostor {
    fn spawn(pid: u32) -> std::io::Result<Impostor> {
        use std::ffi::CString;
        let prog = CString::new("/bin/sleep").unwrap();
        let args = [CString::new("sleep").unwrap(), CString::new("60").unwrap()];
        let argv: [*const libc::c_char; 3] = [args[0].as_ptr(), args[1].as_ptr(), std::ptr::null()];
        let tid: [libc::pid_t; 1] = [pid as libc::pid_t];
        let mut ca = CloneArgs {
            exit_signal: libc::SIGCHLD as u64,
            set_tid: tid.as_ptr() as u64,
            set_tid_size: 1,
            ..CloneArgs::default()
        };
        // SAFETY: clone3 without CLONE_VM forks this thread; the child only
        // calls execv and _exit (async-signal-safe) on memory prepared above.
        let r = unsafe {
            libc::syscall(
                libc::SYS_clone3,
                &mut ca as *mut CloneArgs,
                std::mem::size_of::<CloneArgs>(),
            )
        };
        match r {
            // SAFETY: in the child: exec, or exit without unwinding.
            0 => unsafe {
                libc::execv(prog.as_ptr(), argv.as_ptr());
                libc::_exit(127)
            },
            r if r < 0 => Err(std::io::Error::last_os_error()),
            r => Ok(Impostor(r as u32)),
        }
    }

    /// Whether it still runs (not signalled, not exited).
    fn alive(&self) -> bool {
        let mut status = 0;
        // SAFETY: WNOHANG wait for our own child.
        let r = unsafe { libc::waitpid(self.0 as libc::pid_t, &mut status, libc::WNOHANG) };
        r == 0
    }
}

impl Drop for Impostor {
    fn drop(&mut self) {
        // SAFETY: our own child, reaped right after.
        unsafe {
            libc::kill(self.0 as libc::pid_t, libc::SIGKILL);
            libc::waitpid(self.0 as libc::pid_t, std::ptr::null_mut(), 0);
        }
    }
}

/// A process is judged (pid and start time, as the ladder's steps carry
/// them), dies, and another process gets its very pid. Every way to act —
/// the direct healer `check` uses, the helper's real executor over the
/// socket, and the helper healer — refuses: the pid no longer names the
/// judged process. The impostor is never signalled.
#[test]
fn a_reused_pid_is_never_acted_on() {
    let _area = tests::area(module_path!());
    use selfheal::{
        actions::keepalive::Keepalive,
        heal::{
            Executor as _,
            direct::{DirectExecutor, act_here},
            helper::HelperExecutor,
        },
        helper::server::performer::ActionsPerformer,
        helper::{ClientOptions, HelperClient},
        sys::pidfd::start_ticks,
    };
    use selfheal_core::protocol::ActRequest;
    use selfheal_core::protocol::Action;
    use selfheal_core::protocol::ErrorCode;
    use selfheal_core::protocol::{Act, SocketRef};
    if !need_root("pid_reuse") {
        return;
    }
    let mut victim = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = victim.id();
    wait_for(5 * SEC, Duration::from_millis(5), || {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()
            .filter(|c| c.trim() == "sleep")
    })
    .expect("victim started");
    let judged = start_ticks(pid).unwrap();
    let steps = [
        Act::Signal {
            pid,
            start_ticks: judged,
            grace_ms: Some(100),
        },
        Act::ArmKeepalive {
            pid,
            start_ticks: judged,
            socket: SocketRef { fd: 0, inode: 1 },
        },
        Act::DestroySocket {
            pid,
            start_ticks: judged,
            socket: SocketRef { fd: 0, inode: 1 },
        },
    ];
    victim.kill().unwrap();
    victim.wait().unwrap();
    // Start times are in clock ticks (10 ms): let one pass.
    std::thread::sleep(Duration::from_millis(30));
    let impostor = match Impostor::spawn(pid) {
        Ok(i) => i,
        Err(e) => panic!("clone3 with set_tid={pid}: {e}"),
    };
    assert_eq!(impostor.0, pid, "the impostor has the judged pid");
    let now = wait_for(5 * SEC, Duration::from_millis(5), || {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()
            .filter(|c| c.trim() == "sleep")
            .and_then(|_| start_ticks(pid))
    })
    .expect("impostor running");
    assert_ne!(now, judged);
    eprintln!("pid {pid} reused: judged start tick {judged}, now {now}");

    // The direct healer (what `check` uses without a helper).
    for step in &steps {
        let e = act_here(step, &Keepalive::default(), None)
            .expect_err("refused")
            .to_string();
        assert!(e.contains("no longer the process that was judged"), "{e}");
        let e = DirectExecutor::default()
            .act("victim", step)
            .expect_err("refused")
            .to_string();
        assert!(e.contains("no longer the process"), "{e}");
    }

    // The helper, with the real executor, over its socket.
    let dir = Scratch::new("faults-reuse");
    let server = tests::fixtures::serve_helper(
        dir.join("helper.sock"),
        std::sync::Arc::new(ActionsPerformer::default()),
        |_| {},
    );
    let copts = ClientOptions {
        connect_timeout: SEC,
        timeout: 5 * SEC,
        act_timeout: 5 * SEC,
    };
    let mut client = HelperClient::connect_with(dir.join("helper.sock"), copts).unwrap();
    for action in [Action::Signal, Action::ArmKeepalive, Action::DestroySocket] {
        let mut req = ActRequest::new(action, pid, judged);
        req.fd = Some(0);
        req.inode = Some(1);
        let e = client.act(&req).expect_err("refused");
        assert_eq!(e.code(), Some(ErrorCode::Gone), "{e}");
        assert!(e.to_string().contains("no longer the process"), "{e}");
    }
    let healer =
        HelperExecutor::new(HelperClient::connect_with(dir.join("helper.sock"), copts).unwrap());
    for step in &steps {
        let e = healer.act("victim", step).expect_err("refused").to_string();
        assert!(e.contains("no longer the process"), "{e}");
    }
    let audit = server.audit();
    assert_eq!(audit.len(), 6, "{audit:#?}");
    assert!(
        audit
            .iter()
            .all(|a| a.error.as_ref().is_some_and(|e| e.code == ErrorCode::Gone))
    );

    // After all that, the impostor has not been touched.
    std::thread::sleep(Duration::from_millis(300));
    assert!(impostor.alive(), "the impostor was signalled");
    assert!(process_state(pid).is_some_and(|s| s != 'Z'));
    server.shutdown();
}

// ---------------------------------------------------------------------------
// Churn.

/// 300 short-lived processes that match an agent's cmdline rule — shells
/// that sleep 20–200 ms, and TCP clients killed 20–200 ms into a blocking
/// read, six at a time — start and exit while `selfheal check` runs in a loop, next to
/// one steady matching process. Every check exits 0 with a whole JSON
/// report and a `healthy` verdict: no panic, no `wedged`, no `down`.
#[test]
fn a_churn_of_matching_processes_never_upsets_check() {
    let _area = tests::area(module_path!());
    use std::process::Stdio;
    const CHURN: usize = 300;
    let dir = Scratch::new("faults-churn");
    let marker = format!("selfheal-churn-{}", std::process::id());
    let l = tests::listener();
    let addr = l.local_addr().unwrap().to_string();
    // Accepts (and holds, bounded) the churning clients' connections.
    let acceptor = {
        let l = l.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for s in l.incoming().take(CHURN) {
                match s {
                    Ok(s) => held.push(s),
                    Err(_) => break,
                }
            }
            held.len()
        })
    };
    let mut steady = Command::new("sh")
        .args(["-c", "sleep 120; true", &marker])
        .spawn()
        .unwrap();
    let config = tests::config_in(
        &dir,
        format!(
            "[[agent]]\nname = \"churn\"\nmatch = {{ cmdline = \"{marker}|recv-peer client {addr}$\" }}\n"
        ),
    );
    let peer = tests::helper_bin("recv-peer");
    let began = Instant::now();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spawner = {
        let done = done.clone();
        let marker = marker.clone();
        let addr = addr.clone();
        std::thread::spawn(move || {
            let mut live: Vec<(std::process::Child, Instant)> = Vec::new();
            let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(std::process::id());
            let mut rand = move |n: u64| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed % n
            };
            let end = Instant::now() + 25 * SEC;
            let mut started = 0;
            while (started < CHURN || !live.is_empty()) && Instant::now() < end {
                live.retain_mut(|(c, kill_at)| {
                    if Instant::now() >= *kill_at {
                        let _ = c.kill();
                    }
                    !matches!(c.try_wait(), Ok(Some(_)))
                });
                while started < CHURN && live.len() < 6 {
                    let ms = 20 + rand(180);
                    let child = if started % 3 == 0 {
                        Command::new(&peer)
                            .args(["client", &addr])
                            .stdin(Stdio::null())
                            .stdout(Stdio::null())
                            .stderr(Stdio::null())
                            .spawn()
                    } else {
                        Command::new("sh")
                            .args(["-c", &format!("sleep 0.{ms:03}; true"), &marker])
                            .spawn()
                    };
                    live.push((
                        child.expect("spawn a churning process"),
                        Instant::now() + Duration::from_millis(ms),
                    ));
                    started += 1;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            for (mut c, _) in live {
                let _ = c.kill();
                let _ = c.wait();
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            started
        })
    };
    let mut checks = 0u32;
    let mut verdicts = std::collections::BTreeMap::<String, u32>::new();
    while !done.load(std::sync::atomic::Ordering::SeqCst) && began.elapsed() < 30 * SEC {
        let r = run_check_at(&config, &Places::without_helper(&dir), &[]);
        checks += 1;
        assert!(!r.stderr.contains("panicked"), "{r:#?}");
        assert_eq!(r.results.len(), 1, "{r:#?}");
        let v = r.agent("churn")["verdict"]
            .as_str()
            .unwrap_or("?")
            .to_string();
        *verdicts.entry(v.clone()).or_default() += 1;
        assert_eq!(v, "healthy", "check {checks}: {r:#?}");
        assert_eq!(r.code, 0, "check {checks}: {r:#?}");
    }
    let started = spawner.join().unwrap();
    let _ = steady.kill();
    let _ = steady.wait();
    // Unblock the acceptor if fewer clients than CHURN connected.
    for _ in 0..CHURN {
        if acceptor.is_finished() {
            break;
        }
        let _ = std::net::TcpStream::connect(&addr);
    }
    let _ = acceptor.join();
    assert_eq!(started, CHURN, "all churning processes started");
    assert!(checks >= 5, "only {checks} checks ran during the churn");
    eprintln!(
        "{CHURN} processes churned in {:?}; {checks} checks: {verdicts:?}",
        began.elapsed()
    );
}

// ---------------------------------------------------------------------------
// The wall clock jumping.

fn clock_now(clock: libc::clockid_t) -> libc::timespec {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { libc::clock_gettime(clock, &mut ts) }, 0);
    ts
}

fn ns(ts: &libc::timespec) -> i128 {
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

fn set_wall(total_ns: i128) -> std::io::Result<()> {
    let ts = libc::timespec {
        tv_sec: (total_ns.div_euclid(1_000_000_000)) as libc::time_t,
        tv_nsec: (total_ns.rem_euclid(1_000_000_000)) as libc::c_long,
    };
    // SAFETY: a valid timespec.
    if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The wall clock moved by `offset_s` for as long as this lives; put back on
/// drop (also on a panic) to where it would be now, from the monotonic time
/// that passed meanwhile.
struct WallClockJump {
    wall0: i128,
    mono0: i128,
}

impl WallClockJump {
    fn by(offset_s: i64) -> std::io::Result<WallClockJump> {
        let mono0 = ns(&clock_now(libc::CLOCK_MONOTONIC));
        let wall0 = ns(&clock_now(libc::CLOCK_REALTIME));
        set_wall(wall0 + i128::from(offset_s) * 1_000_000_000)?;
        Ok(WallClockJump { wall0, mono0 })
    }
}

impl Drop for WallClockJump {
    fn drop(&mut self) {
        let passed = ns(&clock_now(libc::CLOCK_MONOTONIC)) - self.mono0;
        if let Err(e) = set_wall(self.wall0 + passed) {
            eprintln!("CANNOT RESTORE THE WALL CLOCK: {e}");
        }
    }
}

/// The state file's `saved_unix_ms` and the judge's history of `agent`.
fn saved_history(state: &Path, agent: &str) -> (u64, serde_json::Value) {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("state.json")).unwrap()).unwrap();
    (
        v["saved_unix_ms"].as_u64().unwrap(),
        v["data"]["agents"][agent]["judge"].clone(),
    )
}

/// Two steady runners — one idle on a live control connection (a beat
/// every 300 ms), one busy on a silent but live provider — are checked,
/// then checked again with the wall clock set 3 hours ahead, then 3 hours
/// back (each time only for that one check, and restored). The check saw
/// the jumps (the state file's save time moved by ±3 h), yet every verdict
/// stayed as it was, no age or history time moved, and nothing was healed.
#[test]
fn a_wall_clock_jump_moves_no_verdict_and_no_age() {
    let _area = tests::area(module_path!());
    if !need_root("wall_clock_jump") {
        return;
    }
    const JUMP_S: i64 = 3 * 3600;
    let pair = NetnsPair::new("wc").expect("netns pair");
    let b = pair.b_addr.clone();
    let _servers: Vec<Peer> = [
        vec!["beat".to_string(), format!("{b}:7443"), "300".into()],
        vec!["sink".into(), format!("{b}:9443")],
    ]
    .iter()
    .map(|args| pair.listening_in_b(args))
    .collect();
    let clients: Vec<Peer> = [7443, 9443]
        .into_iter()
        .map(|port| {
            let (mut c, _) = pair.client_in_a(port);
            c.tell("go");
            c
        })
        .collect();
    // The thinking runner's own status: the same task all along (a wall
    // clock age would make it stale, and the runner wedged, at once).
    let status = tests::status_server(r#"{"current_task": "WI-7"}"#, 200);
    let dir = Scratch::new("faults-clock");
    let config = tests::config_in(
        &dir,
        format!(
            "{}[[agent]]\nname = \"thinking\"\nmatch = {{ cmdline = \"recv-peer client {b}:9443$\" }}\n\
             [[agent.upstream]]\nrole = \"provider\"\naddr = \"{b}:9443\"\n\
             [[agent.probe]]\nurl = \"http://{status}/status\"\ntimeout = \"1s\"\n\
             fields = {{ current_task = \"/current_task\" }}\n\
             [agent.thresholds]\nsuspect_after = \"1s\"\ncurrent_task_stale = \"10m\"\n\
             [agent.proof]\nkeepalive = false\n",
            control_runner("client", &b)
        ),
    );
    // No proof keepalive on the silent provider: its answer (about 5 s in,
    // sooner or later in the loop below depending on the machine's load)
    // proves the socket alive and so rightly restarts its suspicion, which
    // is not the clock's doing. This test is about the clock.
    let state = dir.join("state");
    let check = || run_check_at(&config, &Places::without_helper(&dir), &[]);
    // Settle: the silent provider turns suspect (busy) after 1 s.
    std::thread::sleep(2 * SEC);
    check();
    std::thread::sleep(Duration::from_millis(300));
    let base = check();
    let verdicts = |r: &CheckRun| {
        (
            r.agent("runner")["verdict"].as_str().unwrap().to_string(),
            r.agent("thinking")["verdict"].as_str().unwrap().to_string(),
        )
    };
    let want = verdicts(&base);
    assert_eq!(want, ("idle".to_string(), "busy".to_string()), "{base:#?}");
    assert_eq!(base.code, 0, "{base:#?}");
    let (_, runner0) = saved_history(&state, "runner");
    let (_, thinking0) = saved_history(&state, "thinking");
    assert!(
        thinking0["suspect_since_ms"]
            .as_object()
            .is_some_and(|m| !m.is_empty()),
        "the silent socket is suspect: {thinking0:#}"
    );

    for offset in [JUMP_S, -JUMP_S, JUMP_S] {
        std::thread::sleep(Duration::from_millis(300));
        let (r, real_ms) = {
            let jump = match WallClockJump::by(offset) {
                Ok(j) => j,
                Err(e) => panic!("clock_settime as root: {e}"),
            };
            let real_ms = (jump.wall0 / 1_000_000) as i64;
            let r = check();
            drop(jump);
            (r, real_ms)
        };
        let (saved, runner) = saved_history(&state, "runner");
        let (_, thinking) = saved_history(&state, "thinking");
        let skew_ms = saved as i64 - real_ms;
        assert!(
            (skew_ms - offset * 1000).abs() < 60_000,
            "the check ran with the wall clock moved by {offset} s (its save time is {skew_ms} ms off)"
        );
        assert_eq!(verdicts(&r), want, "after a {offset} s jump: {r:#?}");
        assert_eq!(r.code, 0, "{r:#?}");
        assert!(r.results.iter().all(|o| o.get("heal").is_none()), "{r:#?}");
        assert_eq!(
            runner["verdict_since_ms"], runner0["verdict_since_ms"],
            "{runner:#}"
        );
        assert_eq!(
            thinking["verdict_since_ms"], thinking0["verdict_since_ms"],
            "{thinking:#}"
        );
        assert_eq!(
            thinking["suspect_since_ms"], thinking0["suspect_since_ms"],
            "the suspect socket's age did not jump"
        );
        assert_eq!(thinking["current_task"], thinking0["current_task"]);
        let suspect_for = suspect_for_ms(r.agent("thinking"));
        assert!(
            suspect_for < 60_000,
            "the suspect age jumped to {suspect_for} ms: {r:#?}"
        );
        eprintln!("wall clock {offset:+} s for one check: verdicts {want:?}, history unchanged");
    }
    // The clock is back (within the test's own run time of where it was).
    let after = check();
    assert_eq!(verdicts(&after), want);
    let (saved, _) = saved_history(&state, "runner");
    let now_ms = ns(&clock_now(libc::CLOCK_REALTIME)) / 1_000_000;
    assert!((now_ms - i128::from(saved)).abs() < 10_000, "restored");
    drop(clients);
}

/// The "suspect for N" age in a `suspect` reason's message, in ms.
fn suspect_for_ms(o: &serde_json::Value) -> u64 {
    let msg = o["reasons"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["code"] == "suspect")
        .and_then(|r| r["message"].as_str())
        .unwrap_or_else(|| panic!("no suspect reason: {o:#}"));
    let age = msg
        .split("(suspect for ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .unwrap_or_else(|| panic!("no age in {msg:?}"));
    // `inspect::human_ms`: 500ms, 1.2s, 1m05s, 3h00m, 2d3h.
    let mut total = 0.0f64;
    let mut chars = age.chars().peekable();
    while chars.peek().is_some() {
        let num: String =
            std::iter::from_fn(|| chars.next_if(|c| c.is_ascii_digit() || *c == '.')).collect();
        let unit: String =
            std::iter::from_fn(|| chars.next_if(char::is_ascii_alphabetic)).collect();
        let n: f64 = num.parse().unwrap_or_else(|_| panic!("age {age:?}"));
        total += n * match unit.as_str() {
            "ms" => 1.0,
            "s" => 1000.0,
            "m" => 60_000.0,
            "h" => 3_600_000.0,
            "d" => 86_400_000.0,
            u => panic!("unit {u:?} in {age:?}"),
        };
    }
    total as u64
}

/// The helper `check` connected to dies before `check` acts (SIGKILL, its
/// socket file left behind): the step is taken directly instead (we are
/// root here), and the outcome says the helper was unavailable. A process
/// that was judged and then exited is still refused.
#[test]
fn a_helper_gone_before_the_act_falls_back_to_acting_directly() {
    let _area = tests::area(module_path!());
    use selfheal::{
        heal::{Executor as _, helper::HelperExecutor},
        helper::HelperClient,
    };
    use selfheal_core::protocol::Act;
    if !need_root("helper_gone_before_act") {
        return;
    }
    let dir = Scratch::new("faults-gone-act");
    let path = dir.join("helper.sock");
    let mut helper = quiet_helper(&path);
    let client = wait_for(10 * SEC, Duration::from_millis(20), || {
        HelperClient::connect(&path).ok()
    });
    let _ = helper.kill();
    let _ = helper.wait();
    let healer = HelperExecutor::new(client.expect("the helper came up"));
    let mut target = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = target.id();
    let start = wait_for(5 * SEC, Duration::from_millis(5), || {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()
            .filter(|c| c.trim() == "sleep")
            .and_then(|_| selfheal::sys::pidfd::start_ticks(pid))
    })
    .unwrap();
    let step = Act::Signal {
        pid,
        start_ticks: start,
        grace_ms: Some(1000),
    };
    let done = healer
        .act("sleeper", &step)
        .expect("acted directly")
        .to_string();
    assert!(
        done.contains("SIGTERM") || done.contains("sigterm"),
        "{done}"
    );
    let status = target.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGTERM)
    );
    // Gone meanwhile: refused, with both reasons.
    let e = healer
        .act("sleeper", &step)
        .expect_err("the target is gone")
        .to_string();
    assert!(
        e.contains("unavailable") && e.contains("acting directly") && e.contains("not running"),
        "{e}"
    );
}
