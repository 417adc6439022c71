//! `selfheal helper` over real unix sockets: the protocol round trip with
//! the eBPF tracer, authorization by `SO_PEERCRED` (an unprivileged caller
//! is a thread of this test that dropped to `nobody` with raw
//! `setresuid`, which changes only that thread's credentials — the kernel
//! records them at `connect`), malformed, oversized, slow and flooding
//! clients, socket activation, graceful shutdown, and the client's view of a
//! helper that is down or dies mid-request.
//!
//! Needs root (it changes credentials and spawns processes as `nobody`);
//! skips otherwise. The eBPF test needs the object built in.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    os::{
        fd::AsRawFd as _,
        unix::{
            fs::PermissionsExt as _,
            net::{UnixListener, UnixStream},
            process::CommandExt as _,
        },
    },
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, atomic::AtomicUsize, atomic::Ordering},
    time::{Duration, Instant},
};

use selfheal::{
    actions::{ActOutcome, ActionError},
    ebpf::TracerOptions,
    helper::{
        ClientError, DryPerformer, HelperClient, Listen, Performer, RateLimit, ServerHandle,
        ServerOptions, StopReason, access::policy, serve,
    },
    sys::pidfd::{Pidfd, start_ticks},
};
use selfheal_core::ebpf::strategy::Strategy;
use selfheal_core::protocol::Act;
use selfheal_core::protocol::ActRequest;
use selfheal_core::protocol::Action;
use selfheal_core::protocol::Caller;
use selfheal_core::protocol::ErrorCode;
use selfheal_core::protocol::Response;
use serde_json::{Value, json};
use tests::fixtures::{LineConn, Reaped};
use tests::{
    Peer, Scratch, as_uid, client_opts, expected_strategy, forced_strategy, listener, need_ebpf,
    need_root, skip, wait_for,
};

const NOBODY: u32 = 65534;
const SEC: Duration = Duration::from_secs(1);
const TICK: Duration = Duration::from_millis(20);

/// A `sleep` process (optionally as another uid), killed on drop.
struct Sleeper(Reaped);

impl Sleeper {
    fn new(uid: Option<u32>) -> Sleeper {
        Sleeper::with_stdin(uid, Stdio::inherit())
    }

    /// One whose fd 0 is `stdin` (a socket, for the socket actions).
    fn with_stdin(uid: Option<u32>, stdin: Stdio) -> Sleeper {
        let mut cmd = Command::new("sleep");
        cmd.arg("120").stdin(stdin);
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        let child = cmd.spawn().expect("spawn sleep");
        let pid = child.id();
        // The exec has happened once the uid shows in procfs and comm is sleep.
        wait_for(5 * SEC, TICK, || {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .ok()
                .filter(|c| c.trim() == "sleep")
        })
        .expect("sleep started");
        Sleeper(Reaped(child))
    }

    fn pid(&self) -> u32 {
        self.0.pid()
    }

    fn act(&self, action: Action) -> ActRequest {
        let mut r = ActRequest::new(action, self.pid(), start_ticks(self.pid()).unwrap());
        r.agent = Some("sleeper".into());
        r
    }
}

fn client(path: &Path) -> HelperClient {
    HelperClient::connect_with(path, client_opts()).expect("connect to the helper")
}

/// An in-process helper on `dir`'s socket with a recording executor.
fn start(
    dir: &Scratch,
    tweak: impl FnOnce(&mut ServerOptions),
) -> (ServerHandle, Arc<DryPerformer>) {
    let exec = Arc::new(DryPerformer::new());
    let handle = tests::fixtures::serve_helper(dir.join("helper.sock"), exec.clone(), tweak);
    (handle, exec)
}

/// Waits (bounded) for the server to stop and returns why.
fn wait_stopped(h: ServerHandle, within: Duration) -> StopReason {
    wait_for(within, TICK, || h.is_finished().then_some(())).expect("the helper stopped in time");
    h.join().expect("the helper stopped cleanly")
}

/// A line-level client for what `HelperClient` would never send.
struct Raw(LineConn);

impl Raw {
    fn connect(path: &Path) -> Raw {
        Raw(LineConn::connect(path))
    }

    fn send(&mut self, bytes: &[u8]) {
        self.0.stream.write_all(bytes).expect("send");
    }

    /// The next response, or `None` when the helper closed the connection
    /// (a reset when it closed with our unread request in its queue).
    fn recv(&mut self) -> Option<Response> {
        match self.0.read_line() {
            Ok(None) => None,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => None,
            Ok(Some(line)) => Some(Response::parse(line.as_bytes()).expect("a valid response")),
            Err(e) => panic!("read a response: {e}"),
        }
    }

    fn ask(&mut self, line: &str) -> Response {
        self.send(format!("{line}\n").as_bytes());
        self.recv().expect("a response")
    }
}

fn code(r: &Response) -> Option<ErrorCode> {
    r.error.as_ref().map(|e| e.code)
}

#[test]
fn hello_watch_and_snapshot_round_trip_with_the_tracer() {
    let _area = tests::area(module_path!());
    if !need_ebpf("helper round trip") {
        return;
    }
    let dir = Scratch::new("helper-ebpf");
    let (h, _) = start(&dir, |o| {
        o.ebpf = Some(TracerOptions {
            strategies: forced_strategy().map_or(Strategy::ALL.to_vec(), |s| vec![s]),
            ..TracerOptions::default()
        });
    });
    let mut c = client(&dir.join("helper.sock"));
    let hello = c.hello().unwrap();
    assert_eq!(hello.protocol, 1);
    assert_eq!(hello.helper_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(
        (hello.caller.uid, hello.caller.pid),
        (0, std::process::id())
    );
    assert_eq!(hello.helper_pid, std::process::id());
    let strategy = hello
        .ebpf
        .strategy
        .as_deref()
        .unwrap_or_else(|| panic!("no strategy: {:?}", hello.ebpf));
    let strategy = Strategy::from_name(strategy).expect("a known strategy name");
    if let Some(expected) = forced_strategy().or_else(expected_strategy) {
        assert_eq!(strategy, expected, "{:?}", hello.ebpf.attempts);
    }
    assert!(hello.ebpf.error.is_none());
    assert_eq!(hello.limits.max_request_bytes, 64 * 1024);

    // A client blocked in a read, watched through the helper.
    let l = listener();
    let addr = l.local_addr().unwrap().to_string();
    let mut peer = Peer::recv_peer(&["client", &addr]);
    let _server_side = l.accept().expect("accept").0;
    let ready = peer.ready();
    let other = Sleeper::new(None);
    let w = c.watch(&[ready.pid, other.pid(), 999_999_999]).unwrap();
    assert_eq!(w.gone, vec![999_999_999]);
    let pids: Vec<u32> = w.watched.iter().map(|p| p.pid).collect();
    assert_eq!(pids, {
        let mut v = vec![ready.pid, other.pid()];
        v.sort();
        v
    });
    assert!(w.watched.iter().all(|p| p.since_ns >= w.attached_at_ns));
    peer.tell("go");

    let snap = wait_for(10 * SEC, 5 * TICK, || {
        let s = c.ebpf_snapshot(&[ready.pid]).unwrap();
        s.blocked
            .iter()
            .any(|b| b.tid == ready.tid && b.age_ms >= 300)
            .then_some(s)
    })
    .expect("the peer's blocked read seen through the helper");
    assert_eq!(snap.strategy, strategy);
    assert!(snap.blocked.iter().all(|b| b.tgid == ready.pid));
    assert!(snap.sockets.iter().all(|s| s.tgid == ready.pid));
    // Filtered: asking for another pid shows nothing of the peer.
    let s = c.ebpf_snapshot(&[other.pid()]).unwrap();
    assert!(s.blocked.iter().all(|b| b.tgid == other.pid()), "{s:?}");
    assert!(s.sockets.iter().all(|a| a.tgid == other.pid()), "{s:?}");

    // nobody may neither watch nor read root's processes: each is a
    // refused pid (a gap), nothing of it is shown.
    let path = dir.join("helper.sock");
    let (w, s) = as_uid(NOBODY, || {
        let mut c = client(&path);
        (
            c.watch(&[ready.pid]).unwrap(),
            c.ebpf_snapshot_with_gaps(&[ready.pid]).unwrap(),
        )
    });
    assert!(w.watched.is_empty() && w.gone.is_empty(), "{w:?}");
    assert_eq!(w.refused, vec![ready.pid]);
    assert_eq!(s.refused, vec![ready.pid]);
    assert!(
        s.snapshot.blocked.is_empty() && s.snapshot.sockets.is_empty(),
        "{s:?}"
    );

    let u = c.unwatch(&[ready.pid, other.pid()]).unwrap();
    assert_eq!(u.unwatched.len(), 2);
    let s = c.ebpf_snapshot(&[ready.pid]).unwrap();
    assert!(s.blocked.is_empty() && s.sockets.is_empty(), "{s:?}");
    drop(c);
    assert_eq!(wait_stopped_after_shutdown(h), StopReason::Shutdown);
}

fn wait_stopped_after_shutdown(h: ServerHandle) -> StopReason {
    h.shutdown();
    wait_stopped(h, 10 * SEC)
}

#[test]
fn without_ebpf_the_tracer_ops_are_unavailable() {
    let _area = tests::area(module_path!());
    if !need_root("helper without eBPF") {
        return;
    }
    let dir = Scratch::new("helper-noebpf");
    let (_h, _) = start(&dir, |_| {});
    let mut c = client(&dir.join("helper.sock"));
    let hello = c.hello().unwrap();
    assert_eq!(hello.ebpf.strategy, None);
    assert!(
        hello.ebpf.error.as_deref().unwrap().contains("disabled"),
        "{:?}",
        hello.ebpf
    );
    let me = std::process::id();
    for e in [
        c.watch(&[me]).unwrap_err(),
        c.ebpf_snapshot(&[me]).unwrap_err(),
        c.unwatch(&[me]).unwrap_err(),
    ] {
        assert_eq!(e.code(), Some(ErrorCode::Unavailable), "{e}");
        assert!(e.to_string().contains("no eBPF tracer"), "{e}");
    }
}

#[test]
fn callers_act_only_on_what_they_may_and_every_act_is_audited() {
    let _area = tests::area(module_path!());
    if !need_root("helper authorization") {
        return;
    }
    let dir = Scratch::new("helper-authz");
    let (h, exec) = start(&dir, |_| {});
    let path = dir.join("helper.sock");
    // Its fd 0 is a socket: socket actions are refused on anything else.
    let (sock, _peer) = UnixStream::pair().unwrap();
    let roots = Sleeper::with_stdin(None, Stdio::from(std::os::fd::OwnedFd::from(sock)));
    let nobodys = Sleeper::new(Some(NOBODY));

    let (hello_uid, on_root, on_own) = as_uid(NOBODY, || {
        let mut c = client(&path);
        (
            c.hello().unwrap().caller.uid,
            c.act(&roots.act(Action::Signal)).unwrap_err(),
            c.act(&nobodys.act(Action::Signal)),
        )
    });
    assert_eq!(hello_uid, NOBODY);
    assert_eq!(on_root.code(), Some(ErrorCode::Forbidden), "{on_root}");
    assert!(
        on_root
            .to_string()
            .contains(&format!("uid {NOBODY} may not act on pid {}", roots.pid())),
        "{on_root}"
    );
    let result = on_own.expect("nobody may act on its own process");
    assert_eq!(result["dry_run"], true);
    let calls = exec.calls();
    assert_eq!(calls.len(), 1, "only the allowed act reached the executor");
    assert_eq!((calls[0].caller.uid, calls[0].pid), (NOBODY, nobodys.pid()));
    assert_eq!(calls[0].start_ticks, start_ticks(nobodys.pid()).unwrap());

    let mut c = client(&path);
    let refused = |c: &mut HelperClient, req: &ActRequest| {
        let e = c.act(req).unwrap_err();
        (e.code(), e.to_string())
    };
    // Never, even for root: pid 1, the helper itself, kernel threads.
    let (code1, m) = refused(
        &mut c,
        &ActRequest::new(Action::Signal, 1, start_ticks(1).unwrap()),
    );
    assert_eq!(code1, Some(ErrorCode::Forbidden), "{m}");
    assert!(m.contains("pid 1 is init"), "{m}");
    let me = std::process::id();
    let (code_me, m) = refused(
        &mut c,
        &ActRequest::new(Action::Restart, me, start_ticks(me).unwrap()),
    );
    assert_eq!(code_me, Some(ErrorCode::Forbidden), "{m}");
    let kthreadd = std::fs::read_to_string("/proc/2/comm").is_ok_and(|c| c.trim() == "kthreadd");
    if kthreadd {
        let (code2, m) = refused(
            &mut c,
            &ActRequest::new(Action::Signal, 2, start_ticks(2).unwrap()),
        );
        assert_eq!(code2, Some(ErrorCode::Forbidden), "{m}");
        assert!(m.contains("kernel thread"), "{m}");
    } else {
        skip(
            "helper authorization (kernel thread)",
            "pid 2 is not kthreadd here",
        );
    }
    // A wrong start time: the pid now names another process.
    let mut wrong = roots.act(Action::Signal);
    wrong.start_ticks += 1;
    let (code_g, m) = refused(&mut c, &wrong);
    assert_eq!(code_g, Some(ErrorCode::Gone), "{m}");
    assert!(m.contains("no longer the process"), "{m}");
    // A process that exited.
    let dead = {
        let s = Sleeper::new(None);
        s.act(Action::Signal)
    };
    assert_eq!(refused(&mut c, &dead).0, Some(ErrorCode::Gone));
    // Root may act on root's process.
    let mut destroy = roots.act(Action::DestroySocket).with_fd(0);
    destroy.inode = Some(1);
    c.act(&destroy).unwrap();

    // Every act, allowed or refused, is audited with caller, target, outcome.
    let audit = h.audit();
    let n_kthread = usize::from(kthreadd);
    assert_eq!(audit.len(), 7 + n_kthread, "{audit:#?}");
    assert_eq!(audit[0].caller.uid, NOBODY);
    assert_eq!(audit[0].pid, roots.pid());
    assert_eq!(audit[0].agent.as_deref(), Some("sleeper"));
    assert_eq!(
        audit[0].error.as_ref().map(|e| e.code),
        Some(ErrorCode::Forbidden)
    );
    assert_eq!((audit[1].caller.uid, audit[1].pid), (NOBODY, nobodys.pid()));
    assert!(audit[1].error.is_none());
    let last = audit.last().unwrap();
    assert!(last.error.is_none() && last.fd == Some(0) && last.caller.uid == 0);
    assert_eq!(exec.calls().len(), 2);
}

/// `fd` on an act request, for the socket actions.
trait WithFd {
    fn with_fd(self, fd: i32) -> Self;
}

impl WithFd for ActRequest {
    fn with_fd(mut self, fd: i32) -> Self {
        self.fd = Some(fd);
        self
    }
}

#[test]
fn a_policy_grant_lets_a_uid_act_on_another_uids_processes() {
    let _area = tests::area(module_path!());
    if !need_root("helper policy grant") {
        return;
    }
    let dir = Scratch::new("helper-grant");
    let policy_path = dir.0.join("helper.toml");
    std::fs::write(
        &policy_path,
        format!("[[grant]]\nuid = {NOBODY}\nuids = [0]\n"),
    )
    .unwrap();
    std::fs::set_permissions(&policy_path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let policy = policy::load(Some(&policy_path), 0).unwrap();
    let (_h, exec) = start(&dir, |o| o.policy = policy);
    let roots = Sleeper::new(None);
    let path = dir.join("helper.sock");
    let r = as_uid(NOBODY, || client(&path).act(&roots.act(Action::Signal)));
    r.expect("granted");
    assert_eq!(exec.calls().len(), 1);
    // Not pid 1, whatever the grant.
    let r = as_uid(NOBODY, || {
        client(&path).act(&ActRequest::new(Action::Signal, 1, start_ticks(1).unwrap()))
    });
    assert_eq!(r.unwrap_err().code(), Some(ErrorCode::Forbidden));
}

#[test]
fn malformed_requests_are_bad_requests_and_the_connection_goes_on() {
    let _area = tests::area(module_path!());
    if !need_root("helper malformed requests") {
        return;
    }
    let dir = Scratch::new("helper-malformed");
    let (_h, exec) = start(&dir, |_| {});
    let mut raw = Raw::connect(&dir.join("helper.sock"));
    let cases: &[(&str, Option<u64>, &str)] = &[
        ("{not json", None, "malformed JSON"),
        ("[]", None, "not a JSON object"),
        (
            r#"{"v":2,"id":5,"op":"hello"}"#,
            Some(5),
            "unsupported protocol version 2",
        ),
        (r#"{"v":1,"id":6,"op":"reboot"}"#, Some(6), "unknown op"),
        (
            r#"{"v":1,"id":7,"op":"watch"}"#,
            Some(7),
            "missing field `pids`",
        ),
        (
            r#"{"v":1,"id":8,"op":"act","action":"signal","pid":5}"#,
            Some(8),
            "missing field `start_ticks`",
        ),
        (
            r#"{"v":1,"id":9,"op":"act","action":"arm_keepalive","pid":5,"start_ticks":1}"#,
            Some(9),
            "missing field `fd`",
        ),
        (r#"{"v":1,"op":"hello"}"#, None, "missing field `id`"),
        ("", None, "empty request"),
    ];
    for (line, id, needle) in cases {
        let r = raw.ask(line);
        assert_eq!(
            (r.id, code(&r)),
            (*id, Some(ErrorCode::BadRequest)),
            "{line}: {r:?}"
        );
        let m = &r.error.as_ref().unwrap().message;
        assert!(m.contains(needle), "{line}: {m:?} lacks {needle:?}");
    }
    // Still served on the same connection.
    let r = raw.ask(r#"{"v":1,"id":10,"op":"hello"}"#);
    assert!(r.ok, "{r:?}");
    assert_eq!(r.id, Some(10));
    assert!(exec.calls().is_empty());
}

#[test]
fn an_oversized_request_is_too_large_and_closes_the_connection() {
    let _area = tests::area(module_path!());
    if !need_root("helper oversized request") {
        return;
    }
    let dir = Scratch::new("helper-large");
    let (_h, _) = start(&dir, |_| {});
    let mut raw = Raw::connect(&dir.join("helper.sock"));
    let mut big = br#"{"v":1,"id":1,"op":"hello","pad":""#.to_vec();
    big.resize(200 * 1024, b'x');
    big.extend_from_slice(b"\"}\n");
    // The helper stops reading after the limit and closes: the rest of the
    // write may fail, which is the point.
    let _ = raw.0.stream.write_all(&big);
    let r = raw.recv().expect("a too_large response");
    assert_eq!((r.id, code(&r)), (None, Some(ErrorCode::TooLarge)), "{r:?}");
    assert!(raw.recv().is_none(), "the connection is closed");
    // Others are served.
    client(&dir.join("helper.sock")).hello().unwrap();
}

#[test]
fn a_slow_client_is_dropped_while_others_are_served() {
    let _area = tests::area(module_path!());
    if !need_root("helper slow client") {
        return;
    }
    let dir = Scratch::new("helper-slow");
    let (_h, _) = start(&dir, |o| o.request_timeout = SEC);
    let mut slow = Raw::connect(&dir.join("helper.sock"));
    slow.send(br#"{"v":1,"id":1,"op":"#);
    let began = Instant::now();
    let path = dir.join("helper.sock");
    let served = std::thread::spawn(move || {
        let mut worst = Duration::ZERO;
        let mut n = 0;
        while began.elapsed() < Duration::from_millis(1500) {
            let t = Instant::now();
            // A fresh connection each time: the slow one must not hold
            // anything others need.
            client(&path).hello().unwrap();
            worst = worst.max(t.elapsed());
            n += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
        (n, worst)
    });
    let r = slow.recv().expect("a timeout response");
    let waited = began.elapsed();
    assert_eq!((r.id, code(&r)), (None, Some(ErrorCode::Timeout)), "{r:?}");
    assert!(slow.recv().is_none(), "the slow connection is closed");
    assert!(
        waited >= Duration::from_millis(900) && waited < 4 * SEC,
        "{waited:?}"
    );
    let (n, worst) = served.join().unwrap();
    assert!(n >= 5, "only {n} requests served meanwhile");
    assert!(
        worst < Duration::from_millis(500),
        "a request took {worst:?}"
    );
}

#[test]
fn a_flood_from_one_uid_is_busy_while_another_uid_is_served() {
    let _area = tests::area(module_path!());
    if !need_root("helper flood") {
        return;
    }
    let dir = Scratch::new("helper-flood");
    let (_h, _) = start(&dir, |o| {
        o.rate = RateLimit {
            burst: 20,
            per_second: 10,
        }
    });
    const FLOOD: usize = 400;
    const ROOT_HELLOS: usize = 15;
    // During the flood root's connection thread shares the machine with
    // three busy ones (the helper's thread for the flood's connection, the
    // flood's writer and its reader): a fair scheduler runs it at least a
    // quarter of the time (4x), and a woken thread may wait out a slice of
    // each runnable one before it runs (the other 4x, rounded up to 10).
    // Queued behind the flood, root would wait for hundreds of answers.
    const FLOOD_FACTOR: u32 = 10;
    // Root's own burst (20) holds these and the hellos during the flood.
    const UNLOADED_HELLOS: usize = 5;
    let path = dir.join("helper.sock");
    let others_ok = Arc::new(AtomicUsize::new(0));
    // The same client's hellos with no flood, in this run: the bound's base.
    let unloaded = {
        let mut c = client(&path);
        (0..UNLOADED_HELLOS)
            .map(|_| {
                let t = Instant::now();
                c.hello().expect("root is served before the flood");
                t.elapsed()
            })
            .max()
            .expect("UNLOADED_HELLOS > 0")
    };
    let bound = unloaded * FLOOD_FACTOR;
    eprintln!("root's slowest hello before the flood: {unloaded:?}; bound during it: {bound:?}");
    let flood = std::thread::scope(|s| {
        let flood = s.spawn(|| {
            as_uid(NOBODY, || {
                let mut raw = Raw::connect(&path);
                let mut all = Vec::new();
                for id in 0..FLOOD {
                    all.extend_from_slice(
                        format!("{{\"v\":1,\"id\":{id},\"op\":\"hello\"}}\n").as_bytes(),
                    );
                }
                let writer = raw.0.stream.try_clone().unwrap();
                let w = std::thread::spawn(move || (&writer).write_all(&all).is_ok());
                let mut busy = 0;
                let mut ok = 0;
                for _ in 0..FLOOD {
                    let r = raw.recv().expect("a response to every request");
                    match code(&r) {
                        None => ok += 1,
                        Some(ErrorCode::Busy) => busy += 1,
                        other => panic!("unexpected {other:?}: {r:?}"),
                    }
                }
                assert!(w.join().unwrap());
                (ok, busy)
            })
        });
        // Meanwhile root is answered, promptly, every time: within
        // FLOOD_FACTOR times the slowest of its hellos before the flood,
        // plus two wake-ups (the helper's thread, then this one) as late
        // as the machine woke this thread from a 10 ms sleep so far (on a
        // loaded machine other processes' threads are runnable too).
        let mut c = client(&path);
        let nap = Duration::from_millis(10);
        let mut late = Duration::ZERO;
        for _ in 0..ROOT_HELLOS {
            let slept = Instant::now();
            std::thread::sleep(nap);
            late = late.max(slept.elapsed().saturating_sub(nap));
            let t = Instant::now();
            c.hello().expect("root is served during the flood");
            let took = t.elapsed();
            let allowed = bound + 2 * late;
            assert!(
                took <= allowed,
                "root's hello took {took:?} during the flood, past {allowed:?} \
                 ({FLOOD_FACTOR} x its slowest of {UNLOADED_HELLOS} before: {unloaded:?}, \
                 plus 2 x the latest wake-up from a sleep: {late:?})"
            );
            others_ok.fetch_add(1, Ordering::SeqCst);
        }
        eprintln!("the latest wake-up from a {nap:?} sleep during the flood: {late:?}");
        flood.join().unwrap()
    });
    let (ok, busy) = flood;
    assert_eq!(ok + busy, FLOOD);
    assert!(ok >= 20, "the burst is served: {ok}");
    assert!(
        busy >= FLOOD / 2,
        "most of the flood is refused: {busy} busy, {ok} ok"
    );
    assert_eq!(others_ok.load(Ordering::SeqCst), ROOT_HELLOS);
}

/// A connection attempt's first answer: a hello, or why it was refused.
fn try_hello(path: &Path) -> Result<u32, ClientError> {
    HelperClient::connect_with(path, client_opts())?
        .hello()
        .map(|h| h.caller.uid)
}

#[test]
fn connections_beyond_the_caps_are_busy() {
    let _area = tests::area(module_path!());
    if !need_root("helper connection cap") {
        return;
    }
    let dir = Scratch::new("helper-cap");
    let (_h, _) = start(&dir, |o| {
        o.max_connections = 3;
        o.max_connections_per_uid = 2;
    });
    let path = dir.join("helper.sock");
    let held: Vec<Raw> = (0..2)
        .map(|i| {
            let mut r = Raw::connect(&path);
            assert!(r.ask(&format!(r#"{{"v":1,"id":{i},"op":"hello"}}"#)).ok);
            r
        })
        .collect();
    // Root holds its share: its next connection is refused...
    let e = try_hello(&path).unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Busy), "{e}");
    assert!(
        e.to_string()
            .contains("uid 0 has 2 connections open (at most 2)"),
        "{e}"
    );
    // ...while another uid still gets in, up to the total.
    let (first, second) = as_uid(NOBODY, || {
        let mut mine = Raw::connect(&path);
        let first = mine.ask(r#"{"v":1,"id":1,"op":"hello"}"#);
        (first, try_hello(&path))
    });
    assert!(first.ok, "{first:?}");
    let e = second.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Busy), "{e}");
    assert!(
        e.to_string().contains("too many connections (at most 3)"),
        "{e}"
    );
    drop(held);
    wait_for(5 * SEC, TICK, || try_hello(&path).ok()).expect("served once others left");
}

#[test]
fn a_socket_activated_server_serves_then_exits_when_idle() {
    let _area = tests::area(module_path!());
    if !need_root("helper socket activation") {
        return;
    }
    let dir = Scratch::new("helper-activated");
    let path = dir.join("helper.sock");
    // What systemd would hand over: a bound, listening socket.
    let l = UnixListener::bind(&path).unwrap();
    let mut opts = ServerOptions::new(Listen::Fd(l.into()));
    opts.idle_timeout = Some(Duration::from_millis(700));
    let h = serve(opts, Arc::new(DryPerformer::new())).unwrap();
    let began = Instant::now();
    let mut c = client(&path);
    assert_eq!(c.hello().unwrap().caller.uid, 0);
    std::thread::sleep(Duration::from_millis(900));
    // A connection held open keeps it alive past the idle timeout.
    assert!(!h.is_finished());
    c.hello().unwrap();
    drop(c);
    let closed = Instant::now();
    assert_eq!(wait_stopped(h, 10 * SEC), StopReason::Idle);
    assert!(
        closed.elapsed() >= Duration::from_millis(600),
        "{:?}",
        closed.elapsed()
    );
    assert!(began.elapsed() < 10 * SEC);
    // The socket is systemd's: left in place.
    assert!(path.exists());
}

/// An executor that says when an action has begun, then takes its time.
struct Gate {
    entered: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
    calls: AtomicUsize,
}

impl Performer for Gate {
    fn act(&self, _: &Caller, target: &Pidfd, _: &Act) -> Result<ActOutcome, ActionError> {
        let _ = self.entered.lock().unwrap().send(());
        std::thread::sleep(Duration::from_millis(700));
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(ActOutcome::Reported(json!({ "pid": target.pid() })))
    }
}

#[test]
fn shutdown_finishes_the_action_in_flight_then_stops() {
    let _area = tests::area(module_path!());
    if !need_root("helper graceful shutdown") {
        return;
    }
    let dir = Scratch::new("helper-graceful");
    let mut opts = ServerOptions::new(Listen::Path(dir.join("helper.sock")));
    opts.shutdown_grace = 5 * SEC;
    let (tx, entered) = std::sync::mpsc::channel();
    let gate = Arc::new(Gate {
        entered: std::sync::Mutex::new(tx),
        calls: AtomicUsize::new(0),
    });
    let h = serve(opts, gate.clone()).unwrap();
    let target = Sleeper::new(None);
    let req = target.act(Action::Signal);
    let path = dir.join("helper.sock");
    let in_flight = std::thread::spawn(move || client(&path).act(&req));
    entered.recv_timeout(5 * SEC).expect("the action began");
    h.shutdown();
    let r = in_flight.join().unwrap();
    assert_eq!(
        r.expect("the action in flight finished")["pid"],
        target.pid()
    );
    assert_eq!(wait_stopped(h, 10 * SEC), StopReason::Shutdown);
    assert!(!dir.join("helper.sock").exists(), "the socket is removed");
    let e = HelperClient::connect_with(dir.join("helper.sock"), client_opts())
        .err()
        .unwrap();
    assert!(matches!(e, ClientError::Unavailable { .. }), "{e}");
    assert_eq!(gate.calls.load(Ordering::SeqCst), 1);
}

#[test]
fn a_helper_that_is_down_is_unavailable_quickly() {
    let _area = tests::area(module_path!());
    let dir = Scratch::new("helper-down");
    let t = Instant::now();
    let e = HelperClient::connect_with(dir.join("helper.sock"), client_opts())
        .err()
        .unwrap();
    assert!(matches!(e, ClientError::Unavailable { .. }), "{e}");
    assert!(e.to_string().contains("no socket there"), "{e}");
    // A socket file nobody listens on (a helper that died).
    drop(UnixListener::bind(dir.join("helper.sock")).unwrap());
    let e = HelperClient::connect_with(dir.join("helper.sock"), client_opts())
        .err()
        .unwrap();
    assert!(matches!(e, ClientError::Unavailable { .. }), "{e}");
    assert!(e.to_string().contains("nobody listens"), "{e}");
    assert!(t.elapsed() < SEC, "{:?}", t.elapsed());
}

/// A fake helper that takes each connection's first request and either
/// answers it (`true`) or dies without answering (`false`), in script order;
/// returns the requests it saw.
fn fake_helper(path: &Path, script: Vec<bool>) -> std::thread::JoinHandle<Vec<Value>> {
    let l = UnixListener::bind(path).unwrap();
    l.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut script = script.into_iter();
        let end = Instant::now() + 10 * SEC;
        let mut next = script.next();
        // After the script, keep accepting briefly to catch a retry that
        // should not happen.
        let mut quiet_until = None;
        while Instant::now() < end {
            if next.is_none() && quiet_until.is_none() {
                quiet_until = Some(Instant::now() + Duration::from_millis(500));
            }
            if quiet_until.is_some_and(|q| Instant::now() >= q) {
                break;
            }
            let Ok((s, _)) = l.accept() else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(5 * SEC)).unwrap();
            let mut line = String::new();
            if BufReader::new(&s).read_line(&mut line).unwrap_or(0) == 0 {
                continue;
            }
            let req: Value = serde_json::from_str(&line).unwrap();
            seen.push(req.clone());
            match next {
                Some(true) => {
                    let hello = json!({
                        "protocol": 1, "helper_version": "fake", "helper_pid": 1,
                        "caller": {"uid": 0, "gid": 0, "pid": 1},
                        "ebpf": {"strategy": null, "attempts": [], "error": "fake"},
                        "limits": {"max_request_bytes": 65536, "request_timeout_ms": 5000, "max_pids": 4096},
                    });
                    let id = req["id"].as_u64().unwrap();
                    let _ = (&s).write_all(&Response::ok(id, hello).to_line());
                    // Hold the connection until the client is done with it.
                    let _ = (&s).read(&mut [0u8; 1]);
                }
                // Dies mid-request: the connection closes unanswered.
                Some(false) => drop(s),
                None => {}
            }
            next = script.next();
        }
        seen
    })
}

#[test]
fn a_helper_killed_mid_request_is_retried_once_for_queries_never_for_act() {
    let _area = tests::area(module_path!());
    let dir = Scratch::new("helper-killed");
    let path = dir.join("helper.sock");
    // hello: the first connection dies, the retry is answered.
    let fake = fake_helper(&path, vec![false, true]);
    let mut c = client(&path);
    let hello = c.hello().expect("answered on the retry");
    assert_eq!(hello.helper_version, "fake");
    drop(c);
    let seen = fake.join().unwrap();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0]["id"], seen[1]["id"], "the same request, resent");
    std::fs::remove_file(&path).unwrap();

    // act: the connection dies; no second attempt.
    let fake = fake_helper(&path, vec![false]);
    let mut c = client(&path);
    let e = c
        .act(&ActRequest::new(Action::Signal, 4242, 1))
        .unwrap_err();
    assert!(matches!(e, ClientError::Broken { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("closed the connection before answering"),
        "{e}"
    );
    let seen = fake.join().unwrap();
    assert_eq!(seen.len(), 1, "act was sent once: {seen:?}");
    assert_eq!(seen[0]["op"], "act");
    std::fs::remove_file(&path).unwrap();

    // Both connections die: a clear error, after one retry.
    let fake = fake_helper(&path, vec![false, false]);
    let e = client(&path).watch(&[1]).unwrap_err();
    assert!(matches!(e, ClientError::Broken { .. }), "{e}");
    assert_eq!(fake.join().unwrap().len(), 2);
}

/// Whether the `selfheal` binary of this build has the `helper` subcommand
/// (it is wired into `main` separately).
fn selfheal_with_helper(test: &str) -> Option<PathBuf> {
    let bin = tests::selfheal_bin();
    let out = Command::new(&bin)
        .args(["helper", "--help"])
        .output()
        .ok()?;
    if out.status.success() && String::from_utf8_lossy(&out.stdout).contains("--idle-timeout") {
        Some(bin)
    } else {
        skip(test, "this selfheal binary has no `helper` subcommand");
        None
    }
}

/// Waits (bounded) for `child` to exit.
fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    wait_for(within, TICK, || child.try_wait().ok().flatten()).unwrap_or_else(|| {
        let _ = child.kill();
        panic!("selfheal helper did not exit within {within:?}")
    })
}

fn stderr_of(child: &mut Child) -> String {
    let mut s = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut s);
    }
    s
}

#[test]
fn the_command_is_socket_activated_and_exits_when_idle() {
    let _area = tests::area(module_path!());
    if !need_root("selfheal helper activation") {
        return;
    }
    let Some(bin) = selfheal_with_helper("selfheal helper activation") else {
        return;
    };
    let dir = Scratch::new("helper-cli-activated");
    let path = dir.join("helper.sock");
    let l = UnixListener::bind(&path).unwrap();
    let fd = l.as_raw_fd();
    let mut cmd = Command::new("sh");
    // LISTEN_PID must be the helper's pid: the shell's, which exec keeps.
    cmd.arg("-c")
        .arg(r#"export LISTEN_PID=$$ LISTEN_FDS=1; exec "$0" helper --idle-timeout 1s --no-ebpf"#)
        .arg(&bin)
        .stderr(Stdio::piped());
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
    let began = Instant::now();
    let mut child = cmd.spawn().unwrap();
    let hello = client(&path).hello().expect("the activated helper answers");
    assert_eq!(hello.helper_pid, child.id(), "served by the spawned helper");
    assert_eq!(hello.caller.uid, 0);
    let status = wait_exit(&mut child, 15 * SEC);
    let err = stderr_of(&mut child);
    assert!(status.success(), "{status}: {err}");
    assert!(
        began.elapsed() >= SEC,
        "exited before the idle timeout: {err}"
    );
    assert!(err.contains("the socket systemd passed"), "{err}");
    assert!(err.contains("no connection for 1s"), "{err}");
}

#[test]
fn the_command_stops_on_sigterm_and_refuses_non_root_without_socket() {
    let _area = tests::area(module_path!());
    if !need_root("selfheal helper signals") {
        return;
    }
    let Some(bin) = selfheal_with_helper("selfheal helper signals") else {
        return;
    };
    let dir = Scratch::new("helper-cli-term");
    let path = dir.join("helper.sock");
    let mut child = Command::new(&bin)
        .args(["helper", "--no-ebpf", "--socket"])
        .arg(&path)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let hello = wait_for(10 * SEC, TICK, || {
        HelperClient::connect_with(&path, client_opts())
            .ok()
            .and_then(|mut c| c.hello().ok())
    })
    .expect("the helper answers");
    assert_eq!(hello.helper_pid, child.id());
    // SAFETY: a signal to our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = wait_exit(&mut child, 10 * SEC);
    let err = stderr_of(&mut child);
    assert!(status.success(), "{status}: {err}");
    assert!(err.contains("SIGTERM"), "{err}");
    assert!(!path.exists(), "the socket is removed on exit");

    if Command::new("setpriv").arg("--version").output().is_err() {
        skip("selfheal helper as non-root", "setpriv is not installed");
        return;
    }
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin)
        .args(["helper", "--no-ebpf"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("give --socket PATH"), "{err}");
}

/// Set (to a socket path) when this test binary runs as a client inside
/// another pid namespace, for the test below.
pub(crate) const PIDNS_CLIENT: &str = "SELFHEAL_HELPER_TEST_PIDNS_CLIENT";

/// Not a test: the client half of the one below, run in a new pid
/// namespace (this binary with [`PIDNS_CLIENT`] set: `crate::ROLES`).
pub(crate) fn pid_namespace_client_mode() {
    let Ok(path) = std::env::var(PIDNS_CLIENT) else {
        return;
    };
    let target: u32 = std::env::var("TARGET_PID").unwrap().parse().unwrap();
    let start: u64 = std::env::var("TARGET_START").unwrap().parse().unwrap();
    let mut c = client(Path::new(&path));
    let hello = c.hello().unwrap();
    let act = c.act(&ActRequest::new(Action::Signal, target, start));
    let watch = c.watch(&[target]);
    println!(
        "RESULT hello_uid={} act={:?} watch={:?}",
        hello.caller.uid,
        act.err().and_then(|e| e.code()),
        watch.err().and_then(|e| e.code()),
    );
}

#[test]
fn a_caller_in_another_pid_namespace_may_name_no_pid() {
    let _area = tests::area(module_path!());
    if !need_root("helper pid namespaces") {
        return;
    }
    if Command::new("unshare").arg("--version").output().is_err() {
        skip("helper pid namespaces", "unshare is not installed");
        return;
    }
    let dir = Scratch::new("helper-pidns");
    let (h, exec) = start(&dir, |_| {});
    let target = Sleeper::new(None);
    let out = Command::new("unshare")
        .args(["--pid", "--fork", "--"])
        .arg(std::env::current_exe().unwrap())
        .env(PIDNS_CLIENT, dir.join("helper.sock"))
        .env("TARGET_PID", target.pid().to_string())
        .env(
            "TARGET_START",
            start_ticks(target.pid()).unwrap().to_string(),
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("RESULT "))
        .unwrap_or_else(|| panic!("no result: {stdout}"));
    // Its hello is answered; a pid it names is refused, and audited.
    assert_eq!(
        line,
        "RESULT hello_uid=0 act=Some(Forbidden) watch=Some(Unavailable)"
    );
    assert!(exec.calls().is_empty());
    let audit = h.audit();
    assert_eq!(audit.len(), 1);
    let e = audit[0].error.as_ref().unwrap();
    assert!(e.message.contains("pid namespace"), "{e:?}");
}

/// `iterate` runs the helper's task iterators on the pids the caller may
/// query and on nothing else: nobody gets its own agent's threads and
/// sockets (equal to procfs's), and root's agent and a pid that does not
/// exist only as `refused`; root gets both agents, and the missing pid as
/// `gone`. A check running as nobody, given the helper's passes, reads its
/// agent through them ("helper"), with the same evidence procfs gives, and
/// root's agent from procfs, saying why. `collect` and `namespaces` answer
/// the same pids the same way: nobody's agent read whole by the helper
/// (equal to procfs's, with its TCP sockets from the namespace's dump) and
/// its namespaces, but no kernel stacks (root's); a collector reading
/// through `collect` gives the same evidence.
#[test]
fn iterate_passes_only_what_the_caller_may_query() {
    let _area = tests::area(module_path!());
    use selfheal::{
        check::TracerSource as _,
        inspect::{Collector, Target},
    };
    use selfheal_core::proc::Detail;
    if !need_ebpf("helper::iterate_passes_only_what_the_caller_may_query") {
        return;
    }
    const MISSING: u32 = 999_999_999;
    let dir = Scratch::new("helper-iterate");
    let (h, _) = start(&dir, |o| {
        o.ebpf = Some(TracerOptions {
            strategies: forced_strategy().map_or(Strategy::ALL.to_vec(), |s| vec![s]),
            ..TracerOptions::default()
        });
    });
    let l = listener();
    let addr = l.local_addr().unwrap().to_string();
    let mut cmd = Command::new(tests::helper_bin("recv-peer"));
    cmd.args(["fat", &addr, "3", "2"]).uid(NOBODY).gid(NOBODY);
    let theirs = Peer::spawn(cmd);
    theirs.expect("ready ", 10 * SEC);
    let root = Peer::recv_peer(&["fat", &addr, "2", "1"]);
    root.expect("ready ", 10 * SEC);
    let (mine, rootp) = (theirs.pid(), root.pid());
    // Every reader asleep in its read before anything is compared.
    let asleep = |pid: u32, n: usize| {
        wait_for(10 * SEC, TICK, || {
            let in_read = std::fs::read_dir(format!("/proc/{pid}/task"))
                .ok()?
                .flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("syscall"))
                        .is_ok_and(|s| s.starts_with("45 "))
                })
                .count();
            (in_read == n).then_some(())
        })
        .is_some()
    };
    assert!(asleep(mine, 3) && asleep(rootp, 2), "readers never settled");

    let path = dir.join("helper.sock");
    let theirs_seen = as_uid(NOBODY, || {
        client(&path).iterate(&[mine, rootp, MISSING]).unwrap()
    });
    let pids: Vec<u32> = theirs_seen.processes.iter().map(|p| p.pid).collect();
    assert_eq!(pids, vec![mine], "{theirs_seen:?}");
    let mut refused = vec![rootp, MISSING];
    refused.sort_unstable();
    assert_eq!(theirs_seen.refused, refused);
    assert!(theirs_seen.gone.is_empty());
    let pass = &theirs_seen.processes[0];
    assert_eq!(Some(pass.start_ticks), start_ticks(mine));
    assert_eq!(pass.pass.threads.len(), 4, "{:?}", pass.pass.threads);
    assert!(pass.pass.threads.iter().all(|t| t.tgid == mine));
    let fds = selfheal::proc::socket_fds(&Default::default(), mine).expect("fds");
    assert_eq!(pass.pass.sockets, fds);

    let root_seen = client(&path).iterate(&[mine, rootp, MISSING]).unwrap();
    let pids: Vec<u32> = root_seen.processes.iter().map(|p| p.pid).collect();
    assert_eq!(pids, vec![mine, rootp]);
    assert_eq!(root_seen.gone, vec![MISSING]);
    assert!(root_seen.refused.is_empty());

    // A check as nobody, through the helper's passes.
    let target = || Target {
        agent: Some("theirs".into()),
        rule: format!("pid={mine}"),
        roots: vec![mine, rootp],
        pids: vec![mine, rootp],
        problem: None,
        upstream_of: Box::new(|_| None),
        upstreams: Vec::new(),
        roles: selfheal_core::config::Roles::ByAddress,
        containers: Vec::new(),
        container_gaps: Vec::new(),
        unread_cmdlines: None,
    };
    let (by_helper, by_procfs) = as_uid(NOBODY, || {
        let shared = Arc::new(std::sync::Mutex::new(client(&path)));
        let tracer = selfheal::check::through_helper::HelperTracer(shared);
        let mut c = Collector::from_snapshot(Err("no tracer in this test".into()), Detail::Light);
        let mut passes = tracer.passes().expect("the helper's passes");
        c.passes_from(passes.as_mut(), &[mine, rootp]);
        let by_helper = c.collect(&target());
        c.without_iterators("the procfs side of the comparison");
        (by_helper, c.collect(&target()))
    });
    let col = &by_helper.collection;
    assert_eq!(
        (col.iterators, col.iterators_from.as_deref()),
        (1, Some("helper")),
        "{col:?}"
    );
    assert_eq!(col.procfs, 1, "{col:?}");
    assert!(
        col.why_procfs.iter().any(|w| w.contains("may not query")),
        "{col:?}"
    );
    let of = |ev: &selfheal_core::inspect::Evidence, pid: u32| {
        tests::steady(
            ev.processes
                .iter()
                .find(|p| p.pid == pid)
                .unwrap_or_else(|| panic!("pid {pid} not read")),
        )
    };
    assert_eq!(of(&by_helper, mine), of(&by_procfs, mine));
    assert!(
        of(&by_helper, mine)
            .threads
            .iter()
            .filter(|t| t.recv.is_some())
            .count()
            == 3,
        "{:?}",
        of(&by_helper, mine)
    );

    // `collect` and `namespaces`: the same pids, answered the same way.
    let req = selfheal_core::protocol::CollectRequest {
        pids: vec![mine, rootp, MISSING],
        detail: Detail::Light,
        budget_ms: 5_000,
    };
    let (collected, spaces, through) = as_uid(NOBODY, || {
        let mut c = client(&path);
        let collected = c.collect(&req).unwrap();
        let spaces = c.namespaces(&[mine, rootp, MISSING]).unwrap();
        let tracer =
            selfheal::check::through_helper::HelperTracer(Arc::new(std::sync::Mutex::new(c)));
        let mut col = Collector::from_snapshot(Err("no tracer in this test".into()), Detail::Light);
        col.reads_from(tracer.passes().expect("the helper's reads"));
        (collected, spaces, col.collect(&target()))
    });
    let pids: Vec<u32> = collected.processes.iter().map(|p| p.pid).collect();
    assert_eq!(pids, vec![mine], "{collected:?}");
    assert_eq!(
        (collected.refused.clone(), collected.gone.clone()),
        (refused.clone(), vec![])
    );
    let one = &collected.processes[0];
    assert_eq!(Some(one.start_ticks), start_ticks(mine));
    assert_eq!(tests::steady(&one.process), of(&by_procfs, mine));
    let inodes: std::collections::BTreeSet<u64> = fds.iter().map(|(_, i)| *i).collect();
    let tcp: std::collections::BTreeSet<u64> = one.tcp.iter().flatten().map(|s| s.inode).collect();
    assert_eq!(tcp, inodes, "its TCP sockets, all from the dump: {one:?}");
    let spaced: Vec<u32> = spaces.processes.iter().map(|p| p.pid).collect();
    assert_eq!((spaced, spaces.refused.clone()), (vec![mine], refused));
    let own_ns = |link: &str| {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(format!("/proc/{mine}/ns/{link}"))
            .ok()
            .map(|m| m.ino())
    };
    assert_eq!(spaces.processes[0].pid_ns, own_ns("pid"));
    assert_eq!(spaces.processes[0].net_ns, own_ns("net"));
    assert_eq!(of(&through, mine), of(&by_procfs, mine));
    assert!(
        through
            .collection
            .why_procfs
            .iter()
            .any(|w| w.contains("may not query")),
        "root's agent read here, saying why: {:?}",
        through.collection
    );
    // Kernel stacks: the kernel shows them to CAP_SYS_ADMIN only, so the
    // helper gives them to root and to no one else.
    let full = selfheal_core::protocol::CollectRequest {
        pids: vec![mine],
        detail: Detail::Full,
        budget_ms: 5_000,
    };
    let theirs_full = as_uid(NOBODY, || client(&path).collect(&full).unwrap());
    let p = &theirs_full.processes[0].process;
    assert!(p.threads.iter().all(|t| t.kstack.is_empty()), "{p:?}");
    assert!(
        p.gaps
            .iter()
            .any(|g| g.contains("kernel stacks are root's")),
        "{:?}",
        p.gaps
    );
    let root_full = client(&path).collect(&full).unwrap();
    assert!(
        root_full.processes[0]
            .process
            .threads
            .iter()
            .any(|t| !t.kstack.is_empty()),
        "{root_full:?}"
    );
    let root_collected = client(&path).collect(&req).unwrap();
    let pids: Vec<u32> = root_collected.processes.iter().map(|p| p.pid).collect();
    assert_eq!(
        (pids, root_collected.gone),
        (vec![mine, rootp], vec![MISSING])
    );
    drop(h);
}
