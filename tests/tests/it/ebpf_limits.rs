//! The eBPF maps are bounded (`selfheal-common`); here they are filled for
//! real. A watched process that sends on more sockets than `SOCKS` holds
//! gets every socket either tracked or counted as lost — never silently
//! dropped — and the loss is a line in the inspect report's gaps (and its
//! `ebpf.overflow`) and in `check`'s gaps through the helper. Sockets that
//! were closed leave the map, so a long-lived agent that opens a connection
//! per request does not fill it over time.
//!
//! The sockets are made by a thread of this test process inside a network
//! namespace of its own (its loopback, its ports: nothing else on the host
//! competes for them), and the process watches itself. Needs root.

use std::{
    fs::File,
    io::Write as _,
    net::{TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use selfheal::{
    ebpf::{PRUNE_SOCKS_AT, Tracer},
    inspect::{Collector, Target},
};
use selfheal_common::MAX_SOCKS;
use selfheal_core::proc::Detail;
use tests::fixtures::rethrow;
use tests::fixtures::{Places, check_cmd};
use tests::{Netns, attach, need_ebpf, selfheal_bin, skip, wait_for};

/// The tests here watch this process: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Longest a fill may take.
const FILL_BOUND: Duration = Duration::from_secs(90);

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Lets this process hold `n` descriptors: raises the soft limit (and the
/// hard one, where the hard one is lower and we may). `false`, with the
/// reason printed, when this machine will not allow that many.
fn allow_fds(test: &str, n: u64) -> bool {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills a valid struct.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    let want = libc::rlimit {
        rlim_cur: n.max(lim.rlim_cur),
        rlim_max: n.max(lim.rlim_max),
    };
    // SAFETY: setrlimit reads a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } != 0 {
        skip(
            test,
            &format!(
                "needs {n} open files; the hard limit is {} and cannot be raised: {}",
                lim.rlim_max,
                std::io::Error::last_os_error()
            ),
        );
        return false;
    }
    true
}

/// Descriptors a fill of `n` sockets needs, with room for the rest of the
/// test process.
fn fds_for(n: usize) -> u64 {
    n as u64 + 1024
}

/// `n` loopback connections made inside `ns` by a thread of this process,
/// the client end of each sending one byte (one socket event each). The
/// client ends are returned open; the server ends are closed at once (one
/// descriptor per connection, and the client ports leave no TIME_WAIT).
fn fill(ns: &Netns, n: usize) -> Vec<TcpStream> {
    let path = format!("/run/netns/{}", ns.name);
    std::thread::scope(|s| {
        s.spawn(|| {
            let f = File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            // SAFETY: setns moves only this thread, given a valid fd.
            let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
            let l = TcpListener::bind("127.0.0.1:0").expect("bind in the namespace");
            let addr = l.local_addr().expect("addr");
            let end = Instant::now() + FILL_BOUND;
            let mut socks = Vec::with_capacity(n);
            for i in 0..n {
                assert!(
                    Instant::now() < end,
                    "made only {i} of {n} connections in {FILL_BOUND:?}"
                );
                let mut c = TcpStream::connect(addr)
                    .unwrap_or_else(|e| panic!("connection {i} of {n}: {e}"));
                let (server, _) = l.accept().expect("accept");
                c.write_all(b"x").expect("send");
                drop(server);
                socks.push(c);
            }
            socks
        })
        .join()
        .expect("the filling thread")
    })
}

/// An inspect target for this process alone.
fn me() -> Target {
    let pid = std::process::id();
    Target {
        agent: Some("me".into()),
        rule: format!("pid={pid}"),
        roots: vec![pid],
        pids: vec![pid],
        problem: None,
        upstream_of: Box::new(|_| None),
        upstreams: Vec::new(),
        roles: selfheal_core::config::Roles::ByAddress,
        containers: Vec::new(),
        container_gaps: Vec::new(),
        unread_cmdlines: None,
    }
}

/// Whom `pid`'s socket entries count against, as the helper reads it.
fn owner(pid: u32) -> u32 {
    use selfheal::helper::access::owner::{DEFAULT_SUBUID, Owners};
    Owners::new(DEFAULT_SUBUID.into()).of_process(pid).owner
}

fn watched_tracer() -> Tracer {
    let mut tracer = attach(None);
    tracer
        .watch(std::process::id(), 0)
        .expect("watch this process");
    tracer
}

#[test]
fn a_full_socket_map_is_counted_and_reported_not_silent() {
    let _area = tests::area(module_path!());
    if !need_ebpf("full_socket_map") {
        return;
    }
    let _serial = serial();
    let n = MAX_SOCKS as usize + 1000;
    if !allow_fds("full_socket_map", fds_for(n)) {
        return;
    }
    let ns = Netns::new("limfill").expect("netns");
    let mut tracer = watched_tracer();
    let socks = fill(&ns, n);
    let snap = tracer.snapshot().expect("snapshot");
    let o = snap.overflow;
    let tracked = snap.sockets.len();
    eprintln!(
        "{n} sockets sent on: {tracked} tracked, {} socket events counted lost ({o:?})",
        o.socks_full
    );
    assert!(tracked <= MAX_SOCKS as usize, "{tracked} entries");
    assert!(o.socks_full > 0, "the map was filled: {o:?}");
    assert!(
        tracked as u64 + o.socks_full >= n as u64,
        "every socket tracked or counted: {tracked} + {} < {n}",
        o.socks_full
    );

    // The report says so: in the inspect JSON's `ebpf.overflow` and gaps.
    let report = selfheal_core::inspect::build(
        &Collector::from_snapshot(
            Ok((snap, tracer.watched_since(std::process::id()))),
            Detail::Minimal,
        )
        .collect(&me()),
    );
    let json = serde_json::to_value(&report).expect("report as JSON");
    assert_eq!(
        json["ebpf"]["overflow"]["socks_full"], o.socks_full,
        "{}",
        json["ebpf"]
    );
    let gaps: Vec<&str> = json["gaps"]
        .as_array()
        .expect("gaps")
        .iter()
        .filter_map(|g| g.as_str())
        .collect();
    let line = format!(
        "{} socket event(s) not recorded (SOCKS full at {MAX_SOCKS} sockets)",
        o.socks_full
    );
    assert!(
        gaps.iter().any(|g| g.contains(&line)),
        "a gap names the loss: {gaps:#?}"
    );
    drop(socks);
}

#[test]
fn closed_sockets_leave_the_map_so_churn_does_not_fill_it() {
    let _area = tests::area(module_path!());
    if !need_ebpf("closed_sockets_leave") {
        return;
    }
    let _serial = serial();
    let first = PRUNE_SOCKS_AT + 2000;
    let second = MAX_SOCKS as usize - 1000;
    if !allow_fds("closed_sockets_leave", fds_for(second.max(first))) {
        return;
    }
    let mut tracer = watched_tracer();

    let ns = Netns::new("limchurn1").expect("netns");
    let socks = fill(&ns, first);
    let snap = tracer.snapshot().expect("snapshot");
    assert!(
        snap.sockets.len() >= first,
        "{} of {first} open sockets tracked",
        snap.sockets.len()
    );
    drop(socks);
    drop(ns);
    // The next snapshot finds them closed (the map is past half full) and
    // drops them.
    let after = wait_for(Duration::from_secs(10), Duration::from_millis(100), || {
        let s = tracer.snapshot().expect("snapshot");
        (s.sockets.len() < 100).then_some(s)
    });
    let after = after.expect("the closed sockets left the map");
    eprintln!(
        "{first} sockets closed: {} entries left",
        after.sockets.len()
    );

    // Room for a second wave that, with the first still there, would not fit.
    let ns = Netns::new("limchurn2").expect("netns");
    let socks = fill(&ns, second);
    let snap = tracer.snapshot().expect("snapshot");
    assert_eq!(
        snap.overflow.socks_full, 0,
        "{first} + {second} sockets over time, at most {second} at once: nothing lost"
    );
    assert!(
        snap.sockets.len() >= second,
        "{} tracked",
        snap.sockets.len()
    );
    drop(socks);
}

/// The same loss through the long-running helper: `check` reports it among
/// the agent's gaps.
#[test]
fn check_reports_the_helpers_full_map_in_its_gaps() {
    let _area = tests::area(module_path!());
    if !need_ebpf("check_reports_full_map") {
        return;
    }
    let _serial = serial();
    let n = MAX_SOCKS as usize + 1000;
    if !allow_fds("check_reports_full_map", fds_for(n)) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("selfheal-limits-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let sock = dir.join("helper.sock");
    let mut helper = Command::new(selfheal_bin())
        .args(["helper", "--tracer", "--socket"])
        .arg(&sock)
        .stderr(Stdio::null())
        .spawn()
        .expect("start the helper");
    let up = wait_for(Duration::from_secs(10), Duration::from_millis(50), || {
        sock.exists().then_some(())
    });
    let config = dir.join("config.toml");
    tests::own_agent_config(&config);
    let check = |dir: &PathBuf| -> serde_json::Value {
        let out = check_cmd(&config, &Places::under(dir).helper(&sock))
            .output()
            .expect("run check");
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "check printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    };
    let result = std::panic::catch_unwind(|| {
        assert!(up.is_some(), "the helper did not come up");
        // The first check has the helper watch this process. A helper that
        // has not answered within the check's own wait (its tracer still
        // loading on a loaded machine: 10 s were seen at a load of 15) is
        // a gap the check says; asked again, at most twice more, before
        // the test proper.
        let began = Instant::now();
        let mut before = check(&dir);
        for _ in 0..2 {
            if !before["gaps"].to_string().contains("did not answer") {
                break;
            }
            before = check(&dir);
        }
        eprintln!(
            "the helper answered with its eBPF after {:?}",
            began.elapsed()
        );
        let gaps = before["gaps"].to_string();
        assert!(!gaps.contains("SOCKS full"), "{gaps}");
        assert!(
            !gaps.contains("no eBPF evidence"),
            "the helper's eBPF: {gaps}"
        );
        let ns = Netns::new("limcheck").expect("netns");
        let socks = fill(&ns, n);
        let after = check(&dir);
        drop(socks);
        let gaps: Vec<String> = after["gaps"]
            .as_array()
            .expect("gaps")
            .iter()
            .filter_map(|g| g.as_str().map(str::to_string))
            .collect();
        assert!(
            gaps.iter()
                .any(|g| g.contains("socket event(s) not recorded (SOCKS full at")),
            "check reports the full map: {gaps:#?}"
        );
    });
    let _ = helper.kill();
    let _ = helper.wait();
    let _ = std::fs::remove_dir_all(&dir);
    rethrow(result);
}

/// Opens `pairs` loopback connections inside `ns` as uid `nobody`, both
/// ends sending a byte (two socket events each), after a line on stdin; says
/// `ready` when done and holds them until stdin closes.
const FILLER: &str = r#"
import socket, sys
n = int(sys.argv[1])
print("waiting", flush=True)
sys.stdin.readline()
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(1024)
keep = []
for i in range(n):
    c = socket.create_connection(l.getsockname())
    s, _ = l.accept()
    c.send(b"x")
    s.send(b"y")
    keep += [c, s]
print("ready", flush=True)
sys.stdin.read()
"#;

/// One uid cannot starve another of the socket map.
/// A process of `nobody` fills all of `SOCKS` while it is the only one
/// watched; then this process (root) is watched too, the map's share per
/// uid halves, the next snapshot evicts nobody's oldest entries down to
/// its share, and root's new connections are all recorded. The loss is
/// nobody's gap (`over_share`), not root's. Before the share, root's
/// connections found the map full and went unrecorded.
#[test]
fn one_uid_filling_the_socket_map_leaves_another_uid_its_share() {
    let _area = tests::area(module_path!());
    use std::io::{BufRead as _, BufReader};

    use selfheal_core::ebpf::socks_share;
    use selfheal_core::protocol::filter_snapshot;

    if !need_ebpf("socket_map_share") {
        return;
    }
    let _serial = serial();
    let pairs = MAX_SOCKS as usize / 2 + 100;
    if !allow_fds("socket_map_share", fds_for(2 * pairs)) {
        return;
    }
    let python = "/usr/bin/python3";
    if !Path::new(python).exists() {
        skip("socket_map_share", &format!("{python} is missing"));
        return;
    }
    let ns = Netns::new("limshare").expect("netns");
    let mut filler = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.name,
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
        ])
        .args(["--clear-groups", python, "-c", FILLER])
        .arg(pairs.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the filler");
    let pid = filler.id();
    let mut lines = BufReader::new(filler.stdout.take().expect("stdout")).lines();
    let mut stdin = filler.stdin.take().expect("stdin");
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut next = || lines.next().expect("a line from the filler").expect("read");
        assert_eq!(next(), "waiting");
        let mut tracer = attach(None);
        tracer.watch(pid, owner(pid)).expect("watch the filler");
        writeln!(stdin, "go").expect("start the fill");
        // Bounded by the test harness's own time limit and the fill's size:
        // python makes ~8,300 loopback connections in a few seconds.
        assert_eq!(next(), "ready");
        let full = tracer.snapshot().expect("snapshot");
        let filled = full.sockets.iter().filter(|s| s.tgid == pid).count();
        let by_filler = filled;
        eprintln!(
            "nobody alone: {by_filler} entries of {} sockets, {} events lost (SOCKS full)",
            2 * pairs,
            full.overflow.socks_full
        );
        assert!(
            by_filler >= MAX_SOCKS as usize - 64,
            "nobody filled the map: {by_filler}"
        );

        // Root's agent is watched now: two uids, half the map each.
        let me = std::process::id();
        tracer.watch(me, owner(me)).expect("watch this process");
        let share = socks_share(2) as usize;
        let evicted = tracer.snapshot().expect("snapshot");
        let by_filler = evicted.sockets.iter().filter(|s| s.tgid == pid).count();
        assert!(
            by_filler <= share,
            "{by_filler} entries above the share {share}"
        );

        let ns2 = Netns::new("limshare2").expect("netns");
        let mine = fill(&ns2, 200);
        let snap = tracer.snapshot().expect("snapshot");
        let recorded = snap.sockets.iter().filter(|s| s.tgid == me).count();
        let lost_mine = filter_snapshot(snap.clone(), &[me]).overflow.over_share;
        let lost_filler = filter_snapshot(snap.clone(), &[pid]).overflow.over_share;
        eprintln!(
            "after root was watched: share {share}; nobody holds {by_filler}, \
             root's 200 new connections: {recorded} recorded; over share: nobody {lost_filler}, root {lost_mine}"
        );
        assert!(
            recorded >= 200,
            "root's connections recorded: {recorded} of 200"
        );
        assert_eq!(lost_mine, 0, "root lost nothing to its share");
        assert!(
            lost_filler as usize >= filled - share,
            "nobody's evicted entries are counted as its own loss: {lost_filler}"
        );
        // The report of nobody's agent names the loss; root's does not.
        let gap = filter_snapshot(snap.clone(), &[pid]).overflow.describe();
        assert!(
            gap.as_deref()
                .is_some_and(|g| g.contains("at its share of SOCKS")),
            "{gap:?}"
        );
        drop(mine);
    }));
    drop(stdin);
    let _ = filler.kill();
    let _ = filler.wait();
    rethrow(result);
}

/// A filler of `pairs` connections ([`FILLER`]) as `uid` inside `ns`,
/// once it says it is waiting for the word to start.
fn filler(ns: &Netns, uid: u32, pairs: usize) -> Filler {
    use std::io::{BufRead as _, BufReader};
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns.name, "setpriv"])
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .args(["--clear-groups", "/usr/bin/python3", "-c", FILLER])
        .arg(pairs.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start a filler");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let stdin = child.stdin.take();
    let first = lines.next().and_then(Result::ok);
    assert_eq!(first.as_deref(), Some("waiting"), "the filler of uid {uid}");
    Filler {
        child,
        stdin,
        lines,
    }
}

/// A running [`FILLER`]: killed on drop.
struct Filler {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl Filler {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn go(&mut self) {
        writeln!(self.stdin.as_mut().expect("stdin"), "go").expect("start the fill");
    }

    /// Waits for `ready` (bounded by the fill's size: python makes ~8,300
    /// loopback connections in a few seconds; a filler that dies ends it).
    fn ready(&mut self) {
        let line = self.lines.next().and_then(Result::ok);
        assert_eq!(line.as_deref(), Some("ready"), "the filler finished");
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The socket map's share counts a process's owner, not its kernel uid.
/// Two subordinate uids of one user (a subuid file's range), watched by
/// root through the helper, each try to fill all of `SOCKS`; then root's
/// own process is watched and opens `MAX_SOCKS / 2 - 300` connections.
/// Counted per kernel uid there were three uids, a third of the map each:
/// the user's two uids kept two thirds, and root's connections past a
/// third went unrecorded. Counted per owner the user holds at most half,
/// and every one of root's is recorded.
#[test]
fn subordinate_uids_share_their_owners_part_of_the_socket_map() {
    let _area = tests::area(module_path!());
    use std::sync::Arc;

    use selfheal::{
        ebpf::TracerOptions,
        helper::server::performer::ActionsPerformer,
        helper::{ClientOptions, HelperClient},
    };
    use selfheal_core::ebpf::socks_share;
    use selfheal_core::ebpf::strategy::Strategy;
    use tests::{Scratch, forced_strategy};

    const OWNER: u32 = 61116;
    const SUBUIDS: u32 = 2_313_300;
    if !need_ebpf("socket_map_share_by_owner") {
        return;
    }
    let _serial = serial();
    let pairs = MAX_SOCKS as usize / 2 + 100;
    if !allow_fds("socket_map_share_by_owner", fds_for(2 * pairs)) {
        return;
    }
    if !Path::new("/usr/bin/python3").exists() {
        skip("socket_map_share_by_owner", "/usr/bin/python3 is missing");
        return;
    }
    let dir = Scratch::new("limits-socks");
    tests::fixtures::subuid_file(&dir.join("subuid"), &format!("{OWNER}:{SUBUIDS}:100\n"));
    let _helper = tests::fixtures::serve_helper(
        dir.join("helper.sock"),
        Arc::new(ActionsPerformer::default()),
        |opts| {
            opts.subuid = dir.join("subuid");
            opts.ebpf = Some(TracerOptions {
                strategies: forced_strategy().map_or(Strategy::ALL.to_vec(), |s| vec![s]),
                ..TracerOptions::default()
            });
        },
    );
    let mut client = HelperClient::connect_with(
        dir.join("helper.sock"),
        ClientOptions {
            connect_timeout: Duration::from_secs(1),
            timeout: Duration::from_secs(30),
            act_timeout: Duration::from_secs(10),
        },
    )
    .expect("connect to the helper");

    let ns = Netns::new("limowner").expect("netns");
    let mut a = filler(&ns, SUBUIDS, pairs);
    let mut b = filler(&ns, SUBUIDS + 1, pairs);
    let theirs = {
        let mut v = vec![a.pid(), b.pid()];
        v.sort_unstable();
        v
    };
    let w = client.watch(&theirs).expect("watch the fillers");
    assert_eq!(w.watched.len(), 2, "{w:?}");
    a.go();
    b.go();
    a.ready();
    b.ready();
    let full = client.ebpf_snapshot(&theirs).expect("snapshot");
    let held = |s: &selfheal_core::ebpf::TracerSnapshot| {
        s.sockets
            .iter()
            .filter(|x| theirs.contains(&x.tgid))
            .count()
    };
    eprintln!(
        "the user's two subordinate uids alone: {} entries, {} events lost (SOCKS full)",
        held(&full),
        full.overflow.socks_full
    );
    assert!(held(&full) >= MAX_SOCKS as usize - 64, "{}", held(&full));

    // Root's agent is watched: two owners, half the map each.
    let me = std::process::id();
    client.watch(&[me]).expect("watch this process");
    let share = socks_share(2) as usize;
    let evicted = client.ebpf_snapshot(&theirs).expect("snapshot");
    eprintln!(
        "root watched too: the user holds {} (share of 2 owners: {share}; of 3 uids: {})",
        held(&evicted),
        socks_share(3)
    );
    assert!(
        held(&evicted) <= share,
        "the user's two uids hold {} of {share}",
        held(&evicted)
    );

    let n = share - 300;
    let ns2 = Netns::new("limowner2").expect("netns");
    let mine = fill(&ns2, n);
    let snap = client.ebpf_snapshot(&[me]).expect("snapshot");
    let recorded = snap.sockets.iter().filter(|s| s.tgid == me).count();
    let lost_theirs = client
        .ebpf_snapshot(&theirs)
        .expect("snapshot")
        .overflow
        .over_share;
    eprintln!(
        "root's {n} connections: {recorded} recorded, {} lost at root's share; the user's lost: {lost_theirs}",
        snap.overflow.over_share
    );
    assert!(
        recorded >= n,
        "root's connections recorded: {recorded} of {n}"
    );
    assert_eq!(
        snap.overflow.over_share, 0,
        "root lost nothing to its share"
    );
    assert!(
        lost_theirs > 0,
        "the user's evicted entries are its own loss"
    );
    drop(mine);
}
