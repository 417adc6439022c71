//! `selfheal scan` end to end, as root, on connections in network
//! namespaces made here: a receive on a cut connection is `suspect` once
//! silent past `--silent-for`, a connect whose SYNs are dropped is
//! `connecting`, a connection whose peer sends is `alive`, a held
//! CLOSE-WAIT is `peer_closed`; an unprivileged user sees only their own
//! processes; processes ending mid-scan are no error; a process of 10,000
//! sockets has its whole epoll set of 5,000 listed. `--prove` proves a
//! cut call dead and a thinking one alive within the bound it states, puts
//! both sockets' options back and leaves both calls as they were (the
//! thinking one then completes, same pid); interrupted, it still puts
//! every option back; an unprivileged user proves their own. Per process,
//! unreaped zombies (with the missing-init diagnosis under PID 1 of a pid
//! namespace) and a thread in D state (a read on a FUSE filesystem that
//! stopped answering) are listed, each user's own only. Every wait is
//! bound by `--silent-for`, the proof's stated bound and the scans' own
//! measured time.

use std::{
    os::unix::process::CommandExt as _,
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;
use tests::{NetnsPair, Peer, need_root, selfheal_bin};

/// The threshold the tests scan with.
pub(super) const SILENT_FOR: Duration = Duration::from_secs(1);

/// One `selfheal scan --json --silent-for 1s` (as `uid` when given): its
/// findings, its last line (what it read and could not see), exit code,
/// standard error and how long it took.
pub(super) struct Run {
    pub(super) findings: Vec<Value>,
    pub(super) coverage: Value,
    pub(super) code: i32,
    pub(super) stderr: String,
    pub(super) took: Duration,
}

fn scan_as(uid: Option<u32>) -> Run {
    run_scan(uid, &[])
}

/// `selfheal scan --json --silent-for 1s` and `extra` (as `uid` when given).
pub(super) fn run_scan(uid: Option<u32>, extra: &[&str]) -> Run {
    let mut cmd = Command::new(selfheal_bin());
    cmd.args(["scan", "--json", "--silent-for", "1s"])
        .args(extra)
        // No helper: proofs are armed by the scan itself.
        .args(["--helper", "/nonexistent/helper.sock"])
        .env_remove("RUST_LOG");
    if let Some(uid) = uid {
        cmd.uid(uid).gid(uid); // std drops root's supplementary groups too
    }
    let started = Instant::now();
    let out = cmd.output().expect("run selfheal scan");
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut findings: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect();
    // The coverage line comes last, once (a run that failed has none).
    let coverage = match findings.last() {
        Some(last) if last["kind"] == "coverage" => findings.pop().expect("last"),
        _ => Value::Null,
    };
    assert!(
        findings.iter().all(|f| f["kind"] != "coverage"),
        "a coverage line before the last: {stdout}"
    );
    Run {
        findings,
        coverage,
        code: out.status.code().expect("exited"),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        took,
    }
}

pub(super) fn scan() -> Run {
    scan_as(None)
}

/// `selfheal scan --silent-for 1s` and `extra` as root: its table.
fn table(extra: &[&str]) -> String {
    let out = Command::new(selfheal_bin())
        .args(["scan", "--silent-for", "1s"])
        .args(extra)
        .env_remove("RUST_LOG")
        .output()
        .expect("run selfheal scan");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The finding on socket `inode`, if listed.
pub(super) fn on(run: &Run, inode: u64) -> Option<&Value> {
    run.findings.iter().find(|f| f["inode"] == inode)
}

/// The process finding (`"kind": "process"`) of `pid`, if listed.
fn process_of(run: &Run, pid: u32) -> Option<&Value> {
    run.findings
        .iter()
        .find(|f| f["kind"] == "process" && f["pid"] == pid)
}

/// Scans until `want` holds of the finding on `inode`, at most `polls`
/// times and for at most twice `SILENT_FOR` plus ten times the first
/// scan's own time: the finding and the last run.
pub(super) fn until(inode: u64, polls: u32, want: impl Fn(&Value) -> bool) -> (Value, Run) {
    until_in(|run| on(run, inode), polls, want)
}

/// [`until`] of the finding `find` picks out of a run.
pub(super) fn until_in(
    find: impl for<'r> Fn(&'r Run) -> Option<&'r Value>,
    polls: u32,
    want: impl Fn(&Value) -> bool,
) -> (Value, Run) {
    let first = scan();
    let limit = 2 * SILENT_FOR + 10 * first.took;
    let started = Instant::now();
    let mut run = first;
    for _ in 0..polls {
        if let Some(f) = find(&run).filter(|f| want(f)) {
            return (f.clone(), run);
        }
        assert!(
            started.elapsed() < limit,
            "not as wanted within {limit:?}: {:?}; the last scan ({:?}, {} findings) said: {}",
            find(&run),
            run.took,
            run.findings.len(),
            run.stderr.trim()
        );
        std::thread::sleep(SILENT_FOR / 4);
        run = scan();
    }
    panic!(
        "not as wanted after {polls} scans: {:?}; the last scan said: {}",
        find(&run),
        run.stderr.trim()
    );
}

#[test]
fn a_receive_on_a_cut_connection_is_suspect_once_silent_past_the_threshold() {
    let _area = tests::area(module_path!());
    if !need_root("scan_suspect") {
        return;
    }
    let pair = NetnsPair::new("scs").expect("netns pair");
    let _server = pair.listening_in_b(&["server", &format!("{}:7100", pair.b_addr)]);
    let before = Instant::now();
    let (mut client, ready) = pair.client_in_a(7100);
    client.tell("go");
    pair.cut_port_in_b(7100).expect("cut the port");
    let (f, run) = until(ready.inode, 40, |f| f["verdict"] == "suspect");
    let silent = f["silent_ms"].as_u64().expect("silent_ms");
    assert!(silent >= 1000, "{f}");
    // Never longer than the connection has existed.
    assert!(silent <= before.elapsed().as_millis() as u64, "{f}");
    assert_eq!(f["pid"], ready.pid);
    assert_eq!(f["state"], "ESTAB");
    assert_eq!(f["remote"], ready.remote);
    assert!(f["proof"].is_null(), "{f}");
    let waiting = f["waiting"].as_array().expect("waiting");
    assert!(
        waiting.iter().any(|w| w["tid"] == ready.tid),
        "the blocked thread waits on it: {f}"
    );
    assert_eq!(run.code, 1, "a suspect exits 1");
    assert_eq!(run.stderr, "", "nothing but the answer");
    // Every finding's verdict agrees with its silence.
    for g in &run.findings {
        if g["state"] == "ESTAB" {
            let s = g["silent_ms"].as_u64().unwrap_or(0);
            let v = if s >= 1000 { "suspect" } else { "alive" };
            assert_eq!(g["verdict"], v, "{g}");
        }
    }
}

/// A client in `pair`'s namespace A blocked in `connect` to `port` of B,
/// whose SYNs B drops; and when it called `connect` (ms, monotonic).
fn connecting_to(pair: &NetnsPair, port: u16) -> (Peer, u64) {
    pair.drop_port_into_b(port).expect("drop SYNs");
    let mut cmd = pair.a.command(&tests::helper_bin("recv-peer"));
    cmd.args(["connect", &format!("{}:{port}", pair.b_addr)]);
    let client = Peer::spawn(cmd);
    let line = client.expect("connecting", Duration::from_secs(10));
    let at = line
        .split_once("at_ms=")
        .and_then(|(_, v)| v.trim().parse().ok())
        .expect("at_ms");
    (client, at)
}

#[test]
fn a_connect_whose_syns_are_dropped_is_connecting() {
    let _area = tests::area(module_path!());
    if !need_root("scan_connecting") {
        return;
    }
    let pair = NetnsPair::new("scc").expect("netns pair");
    let (client, at) = connecting_to(&pair, 7101);
    // Its socket: the one connect() made, found by pid in the census.
    let pid = client.pid();
    let first = scan();
    let limit = 3 * SILENT_FOR + 10 * first.took;
    let started = Instant::now();
    let mut run = first;
    let f = loop {
        if let Some(f) = run
            .findings
            .iter()
            .find(|f| f["pid"] == pid && f["verdict"] == "connecting")
        {
            break f.clone();
        }
        assert!(
            started.elapsed() < limit,
            "no connecting finding within {limit:?}: {:?}",
            run.findings
        );
        std::thread::sleep(SILENT_FOR / 4);
        run = scan();
    };
    assert_eq!(f["state"], "SYN-SENT");
    let age = f["silent_ms"].as_u64().expect("age");
    let real = tests::monotonic_ms() - at;
    assert!(age >= 1000, "{f}");
    assert!(
        age <= real,
        "a lower bound: {age} ms > {real} ms since connect"
    );
    assert_eq!(run.code, 1);
}

#[test]
fn a_connection_whose_peer_sends_is_alive_and_a_held_close_wait_is_peer_closed() {
    let _area = tests::area(module_path!());
    if !need_root("scan_alive") {
        return;
    }
    let pair = NetnsPair::new("sca").expect("netns pair");
    let _beat = pair.listening_in_b(&["beat", &format!("{}:7102", pair.b_addr), "100"]);
    let (mut alive, alive_conn) = pair.client_in_a(7102);
    alive.tell("go");
    let mut server = pair.listening_in_b(&["server", &format!("{}:7103", pair.b_addr)]);
    let mut cmd = pair.a.command(&tests::helper_bin("recv-peer"));
    cmd.args(["client", &format!("{}:7103", pair.b_addr), "--once"]);
    let mut held = Peer::spawn(cmd);
    let held_conn = held.ready();
    held.tell("go");
    server.tell("send 1");
    held.expect("got 1", Duration::from_secs(10));
    // The server ends: its FIN puts the client's socket in CLOSE-WAIT,
    // which the client holds, out of any receive.
    server.tell("close");
    std::thread::sleep(SILENT_FOR);
    // The beating connection is listed while its thread waits in its
    // receive; a scan that meets the thread woken by a beat and not yet
    // back in it (on a loaded machine, often) rightly does not list it:
    // polled until one scan shows both.
    let (f, run) = until_in(
        |run| on(run, held_conn.inode).filter(|_| on(run, alive_conn.inode).is_some()),
        20,
        |f| f["verdict"] == "peer_closed",
    );
    assert_eq!(f["state"], "CLOSE-WAIT");
    let a = on(&run, alive_conn.inode).expect("the beating connection is listed");
    assert_eq!(a["verdict"], "alive", "{a}");
    assert!(a["silent_ms"].as_u64().expect("silent_ms") < 1000, "{a}");
    // peer_closed sorts before alive.
    let order: Vec<&Value> = run.findings.iter().map(|f| &f["verdict"]).collect();
    let closed_at = order.iter().position(|v| *v == "peer_closed");
    let alive_at = order.iter().position(|v| *v == "alive");
    assert!(closed_at < alive_at, "{order:?}");
}

/// The census of one pass of the kernel's task iterators over the host
/// and of procfs with sock_diag (`--no-iterators`), over the same
/// connections: a receive on a cut connection `suspect`, a connect whose
/// SYNs are dropped `connecting` (its age a lower bound both ways: the
/// pass takes the retransmit timer from the namespace's dump), a beating
/// connection `alive`; each with the same fd, inode, state, verdict and
/// waiting threads. The pass's table says nothing of procfs; the other's
/// says why it read procfs.
#[test]
fn the_iterators_pass_and_procfs_read_the_same_census() {
    let _area = tests::area(module_path!());
    if !tests::need_ebpf("scan_pass_procfs") {
        return;
    }
    let pair = NetnsPair::new("sci").expect("netns pair");
    let cut = cut_suspect(&pair, 7111);
    let _beat = pair.listening_in_b(&["beat", &format!("{}:7113", pair.b_addr), "100"]);
    let (mut alive, alive_conn) = pair.client_in_a(7113);
    alive.tell("go");
    let (connecting, at) = connecting_to(&pair, 7112);
    let pids = [cut.conn.pid, alive_conn.pid, connecting.pid()];
    let (_, pass) = until_in(
        |run| {
            run.findings
                .iter()
                .find(|f| f["pid"] == connecting.pid() && f["verdict"] == "connecting")
        },
        40,
        |_| true,
    );
    let procfs = run_scan(None, &["--no-iterators"]);
    let real = tests::monotonic_ms() - at;
    // What each read of these processes: everything but the ages.
    let census = |run: &Run| {
        let mut out: Vec<String> = run
            .findings
            .iter()
            .filter(|f| pids.iter().any(|p| f["pid"] == *p))
            .map(|f| {
                let mut waiting: Vec<String> = f["waiting"]
                    .as_array()
                    .expect("waiting")
                    .iter()
                    .map(|w| format!("{}/{}/{}", w["tid"], w["syscall"], w["event_loop"]))
                    .collect();
                waiting.sort();
                format!(
                    "pid {} fd {} inode {} {} {} waiting {waiting:?}",
                    f["pid"], f["fd"], f["inode"], f["state"], f["verdict"]
                )
            })
            .collect();
        out.sort();
        out
    };
    let (a, b) = (census(&pass), census(&procfs));
    assert_eq!(a, b, "the pass read {a:#?}, procfs {b:#?}");
    let verdicts: Vec<(u64, &str)> = [cut.conn.inode, alive_conn.inode]
        .iter()
        .map(|i| {
            (
                *i,
                on(&pass, *i).map_or("absent", |f| f["verdict"].as_str().unwrap_or("?")),
            )
        })
        .collect();
    assert_eq!(
        verdicts,
        [(cut.conn.inode, "suspect"), (alive_conn.inode, "alive")]
    );
    assert_eq!(
        pass.coverage["procfs_because"],
        Value::Null,
        "{}",
        pass.coverage
    );
    assert_eq!(
        procfs.coverage["procfs_because"], "disabled by --no-iterators",
        "{}",
        procfs.coverage
    );
    for run in [&pass, &procfs] {
        assert!(
            run.coverage["processes"].as_u64() >= Some(3),
            "{}",
            run.coverage
        );
        let f = run
            .findings
            .iter()
            .find(|f| f["pid"] == connecting.pid())
            .expect("the connect is listed");
        assert_eq!(f["verdict"], "connecting", "{f}");
        let age = f["silent_ms"].as_u64().expect("age");
        assert!(
            (1000..=real).contains(&age),
            "{age} ms, {real} ms since connect: {f}"
        );
        assert_eq!(run.stderr, "");
    }
    // The table says which reader read.
    let pid = cut.conn.pid.to_string();
    let through_pass = table(&["--pid", &pid]);
    assert!(
        !through_pass.contains("read through procfs"),
        "{through_pass}"
    );
    let through_procfs = table(&["--pid", &pid, "--no-iterators"]);
    assert!(
        through_procfs.contains("read through procfs and sock_diag: disabled by --no-iterators"),
        "{through_procfs}"
    );
}

#[test]
fn an_unprivileged_user_sees_only_their_own_processes() {
    let _area = tests::area(module_path!());
    if !need_root("scan_own_only") {
        return;
    }
    // Both clients wait on a listener that never answers, on loopback of
    // this namespace (the one an unprivileged scan can dump).
    let listener = tests::listener();
    let addr = listener.local_addr().expect("addr").to_string();
    let mut roots = Peer::recv_peer(&["client", &addr]);
    let root_conn = roots.ready();
    roots.tell("go");
    let mut cmd = Command::new(tests::helper_bin("recv-peer"));
    cmd.args(["client", &addr]).uid(65534).gid(65534);
    let mut nobodys = Peer::spawn(cmd);
    let nobody_conn = nobodys.ready();
    nobodys.tell("go");
    std::thread::sleep(SILENT_FOR);
    // Root sees both waiting; nobody, its own only.
    let (_, as_root) = until(nobody_conn.inode, 20, |f| f["verdict"] == "suspect");
    assert!(
        on(&as_root, root_conn.inode).is_some(),
        "{:?}",
        as_root.findings
    );
    let mine = scan_as(Some(65534));
    assert_eq!(mine.stderr, "", "nothing but the answer");
    // Others' processes counted on the coverage line, never read; root
    // reads every one.
    assert!(
        mine.coverage["not_yours"].as_u64() > Some(0),
        "{}",
        mine.coverage
    );
    assert_eq!(as_root.coverage["not_yours"], 0, "{}", as_root.coverage);
    let f = on(&mine, nobody_conn.inode).expect("nobody's own connection is listed");
    assert_eq!(f["verdict"], "suspect", "{f}");
    assert_eq!(mine.code, 1);
    for f in &mine.findings {
        assert_eq!(
            f["uid"], 65534,
            "another user's process shown to nobody: {f}"
        );
    }
    assert!(on(&mine, root_conn.inode).is_none());
}

#[test]
fn processes_ending_mid_scan_are_no_error() {
    let _area = tests::area(module_path!());
    if !need_root("scan_churn") {
        return;
    }
    let listener = tests::listener();
    let addr = listener.local_addr().expect("addr").to_string();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let runs = std::thread::scope(|s| {
        // Clients that connect, wait in a read and are killed, one after
        // another (at most 100: the listener never accepts), while the scans run.
        s.spawn(|| {
            for _ in 0..100 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let mut c = Peer::recv_peer(&["client", &addr]);
                c.ready();
                c.tell("go");
                drop(c);
            }
        });
        let runs: Vec<Run> = (0..5).map(|_| scan()).collect();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        runs
    });
    for r in &runs {
        assert!(r.code == 0 || r.code == 1, "exit {}: {}", r.code, r.stderr);
        assert_eq!(r.stderr, "");
    }
    eprintln!(
        "scan during churn: {:?}",
        runs.iter().map(|r| r.took).collect::<Vec<_>>()
    );
}

/// One process of 10,000 TCP sockets (5,000 loopback pairs in a network
/// namespace of its own), 5,000 of them in one epoll set a thread waits
/// on: every socket of the set is listed `suspect` with that wait (its
/// `fdinfo` is ~400 KiB; read in one 64 KiB buffer, only the first 818
/// were), none of the others, and the scan says it read no process with
/// a gap. Scans are polled until the set is silent past `--silent-for`,
/// bound as [`until_in`] bounds them.
#[test]
fn a_process_of_ten_thousand_sockets_has_its_whole_epoll_set_listed() {
    let _area = tests::area(module_path!());
    const TEST: &str = "a_process_of_ten_thousand_sockets_has_its_whole_epoll_set_listed";
    if !need_root(TEST) {
        return;
    }
    let ns = tests::Netns::new("scan-10k").expect("a network namespace");
    let (pairs, in_epoll) = (5000usize, 5000usize);
    let peer = Peer::spawn({
        let mut c = ns.command(&tests::helper_bin("recv-peer"));
        c.args([
            "limits",
            &pairs.to_string(),
            &in_epoll.to_string(),
            "0",
            "0",
        ]);
        c
    });
    let pid: u32 = peer
        .expect("ready", Duration::from_secs(120))
        .trim_start_matches("ready pid=")
        .trim()
        .parse()
        .expect("recv-peer's pid");
    let pid_arg = pid.to_string();
    let listed = |run: &Run| {
        run.findings
            .iter()
            .filter(|f| f["pid"] == pid && f["kind"].is_null())
            .count()
    };
    let suspect = |run: &Run| {
        run.findings
            .iter()
            .filter(|f| f["pid"] == pid && f["verdict"] == "suspect")
            .count()
    };
    let first = run_scan(None, &["--pid", &pid_arg]);
    let limit = 2 * SILENT_FOR + 10 * first.took;
    let started = Instant::now();
    let mut run = first;
    for _ in 0..40 {
        if suspect(&run) >= in_epoll || started.elapsed() >= limit {
            break;
        }
        std::thread::sleep(SILENT_FOR / 4);
        run = run_scan(None, &["--pid", &pid_arg]);
    }
    let text = Command::new(selfheal_bin())
        .args(["scan", "--silent-for", "1s", "--pid", &pid_arg])
        .args(["--helper", "/nonexistent/helper.sock"])
        .env_remove("RUST_LOG")
        .output()
        .expect("run selfheal scan");
    drop(peer);
    eprintln!(
        "{TEST}: {} of {in_epoll} listed, the last scan took {:?} (limit {limit:?})",
        listed(&run),
        run.took
    );
    assert_eq!(listed(&run), in_epoll, "{}", run.stderr);
    for f in run.findings.iter().filter(|f| f["pid"] == pid) {
        assert_eq!(f["verdict"], "suspect", "{f}");
        assert_eq!(f["waiting"][0]["syscall"], "epoll_wait", "{f}");
        assert_eq!(f["waiting"][0]["event_loop"], true, "{f}");
    }
    let mut inodes: Vec<u64> = run
        .findings
        .iter()
        .filter_map(|f| f["inode"].as_u64())
        .collect();
    inodes.sort_unstable();
    inodes.dedup();
    assert_eq!(inodes.len(), in_epoll, "each socket once");
    assert_eq!(run.code, 1, "suspects: exit 1");
    let summary = String::from_utf8_lossy(&text.stdout);
    let last = summary.lines().last().unwrap_or_default();
    assert!(last.starts_with(&format!("{in_epoll} suspect")), "{last}");
    assert!(!last.contains("gaps"), "{last}");
}

/// The socket's keepalive options, read by root through a duplicate.
pub(super) fn options_of(pid: u32, fd: i32) -> selfheal_core::keepalive::KeepaliveSettings {
    let t = selfheal::sys::pidfd::Pidfd::open(pid, None).expect("pidfd");
    selfheal::actions::keepalive::read_keepalive(&t, fd).expect("read the options")
}

/// The fd a finding names.
pub(super) fn fd_of(f: &Value) -> i32 {
    f["fd"].as_i64().expect("fd") as i32
}

/// A finding's proof: its result, when it came and its bound (ms).
pub(super) fn proof_of(f: &Value) -> (&str, u64, u64) {
    let p = &f["proof"];
    (
        p["result"]
            .as_str()
            .unwrap_or_else(|| panic!("no proof: {f}")),
        p["after_ms"]
            .as_u64()
            .unwrap_or_else(|| panic!("no after_ms: {f}")),
        p["bound_ms"]
            .as_u64()
            .unwrap_or_else(|| panic!("no bound_ms: {f}")),
    )
}

/// One `--prove` test at a time (each proves only its own processes,
/// `--pid`; a second prover on one socket is told apart, and its own test
/// shows how).
static PROVING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn proving() -> std::sync::MutexGuard<'static, ()> {
    PROVING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The slack `scan --prove` gives the kernel's last probe past a proof's
/// bound (`selfheal::scan::PROOF_SLACK`).
pub(super) const PROOF_SLACK: Duration = selfheal::scan::PROOF_SLACK;

#[test]
fn prove_tells_a_cut_call_dead_and_a_thinking_one_alive_and_leaves_both_as_they_were() {
    let _area = tests::area(module_path!());
    if !need_root("scan_prove") {
        return;
    }
    let _one = proving();
    let pair = NetnsPair::new("scp").expect("netns pair");
    let _cut_server = pair.listening_in_b(&["server", &format!("{}:7104", pair.b_addr)]);
    let mut thinking_server = pair.listening_in_b(&["server", &format!("{}:7105", pair.b_addr)]);
    let (mut cut, cut_conn) = pair.client_in_a(7104);
    cut.tell("go");
    let (mut thinking, thinking_conn) = pair.client_in_a(7105);
    thinking.tell("go");
    pair.cut_port_in_b(7104).expect("cut the port");
    until(cut_conn.inode, 40, |f| f["verdict"] == "suspect");
    let (_, before) = until(thinking_conn.inode, 40, |f| f["verdict"] == "suspect");
    let fd = |inode| fd_of(on(&before, inode).expect("listed"));
    let (cut_fd, thinking_fd) = (fd(cut_conn.inode), fd(thinking_conn.inode));
    let cut_options = options_of(cut_conn.pid, cut_fd);
    let thinking_options = options_of(thinking_conn.pid, thinking_fd);

    let (a, b) = (cut_conn.pid.to_string(), thinking_conn.pid.to_string());
    let run = run_scan(None, &["--prove", "--pid", &a, "--pid", &b]);
    eprintln!("scan --prove took {:?}: {:?}", run.took, run.findings);
    assert_eq!(run.findings.len(), 2, "only the processes asked for");
    assert_eq!(run.stderr, "", "nothing but the answer");
    let dead = on(&run, cut_conn.inode).expect("the cut call is listed");
    let alive = on(&run, thinking_conn.inode).expect("the thinking call is listed");
    assert_eq!(dead["verdict"], "dead", "{dead}");
    assert_eq!(alive["verdict"], "alive", "{alive}");
    let (result, after, bound) = proof_of(dead);
    assert_eq!(result, "dead");
    // Never before its bound (count probes, each its whole interval), and
    // at most the slack past it.
    assert!(after >= bound, "proven dead early: {dead}");
    assert!(
        after <= bound + PROOF_SLACK.as_millis() as u64,
        "proven dead late: {dead}"
    );
    let (result, after, bound) = proof_of(alive);
    assert_eq!(result, "alive");
    assert!(after < bound, "{alive}");
    for f in [dead, alive] {
        assert_eq!(f["proof"]["restored"], true, "{f}");
    }
    // The whole run within the stated bound, the slack and a plain scan's
    // own time (ten of them: the proofs' reads and the puts back).
    let plain = scan();
    let limit = Duration::from_millis(bound) + PROOF_SLACK + 10 * plain.took;
    assert!(run.took <= limit, "{:?} > {limit:?}", run.took);
    assert_eq!(run.code, 2, "a dead connection exits 2");

    // Nothing else was done: both sockets have their own options, both
    // calls still wait, and the thinking one completes, same pid.
    assert_eq!(options_of(cut_conn.pid, cut_fd), cut_options);
    assert_eq!(options_of(thinking_conn.pid, thinking_fd), thinking_options);
    let after_run = scan();
    let still = on(&after_run, cut_conn.inode).expect("the cut call still waits");
    assert_eq!(still["pid"], cut_conn.pid);
    assert!(
        still["proof"].is_null(),
        "a plain scan proves nothing: {still}"
    );
    thinking_server.tell("send 1");
    thinking.expect("got 1", Duration::from_secs(10));
    assert_eq!(thinking.pid(), thinking_conn.pid);
    drop(cut);
}

#[test]
fn an_interrupted_prove_puts_every_option_back() {
    let _area = tests::area(module_path!());
    if !need_root("scan_prove_interrupted") {
        return;
    }
    let _one = proving();
    let pair = NetnsPair::new("spi").expect("netns pair");
    let Cut {
        conn,
        fd,
        options,
        _server,
        _client,
    } = cut_suspect(&pair, 7106);
    // The table's scan says on stderr when its proofs are out; SIGINT then.
    let (child, _) = proving_table(conn.pid);
    let started = Instant::now();
    // Armed: the socket holds the proof's options now.
    assert_ne!(options_of(conn.pid, fd), options, "the proof is armed");
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT");
    let out = child.wait_with_output().expect("wait");
    let stopped = started.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("interrupted after {stopped:?}:\n{text}");
    assert!(
        text.contains("unproven") && text.contains("interrupted before an answer"),
        "{text}"
    );
    assert!(text.contains("its own options put back"), "{text}");
    assert_eq!(options_of(conn.pid, fd), options, "put back on SIGINT");
    assert_eq!(out.status.code(), Some(1), "still a suspect");
}

#[test]
fn an_unprivileged_user_proves_their_own_connection_alive() {
    let _area = tests::area(module_path!());
    if !need_root("scan_prove_own") {
        return;
    }
    let _one = proving();
    // A listener that never accepts: its kernel still answers probes.
    let listener = tests::listener();
    let addr = listener.local_addr().expect("addr").to_string();
    let mut cmd = Command::new(tests::helper_bin("recv-peer"));
    cmd.args(["client", &addr]).uid(65534).gid(65534);
    let mut nobodys = Peer::spawn(cmd);
    let conn = nobodys.ready();
    nobodys.tell("go");
    // Root's client of the same listener, which nobody names too.
    let mut roots = Peer::recv_peer(&["client", &addr]);
    let root_conn = roots.ready();
    roots.tell("go");
    let (f, _) = until(conn.inode, 40, |f| f["verdict"] == "suspect");
    let (g, _) = until(root_conn.inode, 40, |f| f["verdict"] == "suspect");
    let options = options_of(conn.pid, fd_of(&f));
    let root_options = options_of(root_conn.pid, fd_of(&g));
    let (mine, roots_pid) = (conn.pid.to_string(), root_conn.pid.to_string());
    let run = run_scan(
        Some(65534),
        &["--prove", "--pid", &mine, "--pid", &roots_pid],
    );
    assert_eq!(run.stderr, "", "nothing but the answer");
    let f = on(&run, conn.inode).expect("nobody's own connection is listed");
    assert_eq!(f["verdict"], "alive", "{f}");
    assert_eq!(f["proof"]["restored"], true, "{f}");
    assert_eq!(options_of(conn.pid, fd_of(f)), options);
    // Root's, named by pid: neither listed nor touched.
    assert_eq!(run.findings.len(), 1, "{:?}", run.findings);
    assert_eq!(options_of(root_conn.pid, fd_of(&g)), root_options);
}

/// A call on a cut connection in `pair`, once `suspect`: its server and
/// client (kept running), the connection, its fd and its own options.
struct Cut {
    _server: Peer,
    _client: Peer,
    conn: tests::Ready,
    fd: i32,
    options: selfheal_core::keepalive::KeepaliveSettings,
}

fn cut_suspect(pair: &NetnsPair, port: u16) -> Cut {
    let server = pair.listening_in_b(&["server", &format!("{}:{port}", pair.b_addr)]);
    let (mut client, conn) = pair.client_in_a(port);
    client.tell("go");
    pair.cut_port_in_b(port).expect("cut the port");
    let (f, _) = until(conn.inode, 40, |f| f["verdict"] == "suspect");
    let fd = fd_of(&f);
    let options = options_of(conn.pid, fd);
    Cut {
        _server: server,
        _client: client,
        conn,
        fd,
        options,
    }
}

/// `selfheal scan --silent-for 1s --prove --pid PID` (a table), once it said on
/// stderr that its proofs are out; and that line.
fn proving_table(pid: u32) -> (std::process::Child, String) {
    let mut child = Command::new(selfheal_bin())
        .args([
            "scan",
            "--silent-for",
            "1s",
            "--prove",
            "--pid",
            &pid.to_string(),
        ])
        .args(["--helper", "/nonexistent/helper.sock"])
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run selfheal scan --prove");
    let mut err = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut err, &mut line).expect("read stderr");
    assert!(line.starts_with("proving "), "{line:?}");
    (child, line)
}

#[test]
fn a_second_prove_leaves_the_first_ones_proof_alone() {
    let _area = tests::area(module_path!());
    if !need_root("scan_prove_twice") {
        return;
    }
    let _one = proving();
    let pair = NetnsPair::new("sp2").expect("netns pair");
    let Cut {
        conn,
        fd,
        options,
        _server,
        _client,
    } = cut_suspect(&pair, 7107);
    let (first, said) = proving_table(conn.pid);
    // A second scan while the first's proof is out: it reads the proof's
    // options, not the socket's own, so it asks nothing and puts them back.
    let second = run_scan(None, &["--prove", "--pid", &conn.pid.to_string()]);
    let g = on(&second, conn.inode).expect("listed by the second scan");
    assert_eq!(g["verdict"], "suspect", "{g}");
    assert_eq!(g["proof"]["result"], "unproven", "{g}");
    assert!(
        g["proof"]["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with("not asked: another proof keepalive")),
        "{g}"
    );
    assert_ne!(
        options_of(conn.pid, fd),
        options,
        "the first proof is still armed"
    );
    let out = first.wait_with_output().expect("wait for the first scan");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{said}{text}");
    let row = format!("pid {} fd {fd} -> {}: dead", conn.pid, conn.remote);
    assert!(
        text.contains(&row),
        "the first proof went on to its answer:\n{text}"
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        options_of(conn.pid, fd),
        options,
        "the socket's own options, in the end"
    );
}

/// A Python process that forks `children` children, each of which exits
/// at once, and never reaps them; `unshare` first when `init` (it is then
/// PID 1 of a pid namespace of its own, with `unshare` its parent, killed
/// with it), as `uid` when given. The process and the pid of the one that
/// does not reap, once it says the children are forked.
fn zombie_maker(children: u32, init: bool, uid: Option<u32>) -> (Peer, u32) {
    let script = "import os, sys, time\n\
                  for _ in range(int(sys.argv[1])):\n    \
                      if os.fork() == 0:\n        os._exit(0)\n\
                  print('forked', flush=True)\ntime.sleep(600)\n";
    let mut cmd = if init {
        let mut c = Command::new("unshare");
        c.args(["--pid", "--fork", "--kill-child", "python3"]);
        c
    } else {
        Command::new("python3")
    };
    cmd.args(["-c", script, &children.to_string()]);
    if let Some(uid) = uid {
        cmd.uid(uid).gid(uid);
    }
    let peer = Peer::spawn(cmd);
    peer.expect("forked", Duration::from_secs(30));
    let pid = if init {
        let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", peer.pid()))
            .expect("unshare's children");
        children
            .trim()
            .parse()
            .expect("one child: the namespace's init")
    } else {
        peer.pid()
    };
    (peer, pid)
}

#[test]
fn unreaped_zombies_and_a_thread_in_d_state_are_listed_per_process() {
    let _area = tests::area(module_path!());
    if !need_root("scan_processes") {
        return;
    }
    let dir = tests::Scratch::new("scan-dstate");
    let freeze = dir.join("freeze");
    // Declared before the filesystem, so dropped after it, also when the
    // test fails: a request the server has read waits, SIGKILL or not,
    // until the server answers or dies (dropping it kills it).
    let reader: Peer;
    // Frozen before it is mounted, so its server never answers the
    // kernel's INIT: every request waits in `fuse_get_req`, killable and
    // so in D state. Frozen after INIT, a request would wait for its
    // answer interruptibly (S state), and which one a run got was a race
    // the machine's load decided.
    std::fs::write(&freeze, "").expect("freeze the filesystem");
    let fs = tests::HangFs::mount(&dir, &freeze).expect("a FUSE filesystem (root, /dev/fuse)");
    // A read of a file there waits on a server that never answers:
    // uninterruptible sleep.
    let mut cmd = Command::new("cat");
    cmd.arg(fs.mnt.join("f"));
    reader = Peer::spawn(cmd);
    // The scans' bound counts from when the reader is in D state, however
    // long starting it took on this machine.
    let in_d = Instant::now();
    let stat = format!("/proc/{}/stat", reader.pid());
    tests::wait_for(Duration::from_secs(60), Duration::from_millis(20), || {
        std::fs::read_to_string(&stat)
            .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('D')))
            .then_some(())
    })
    .expect("the reader never waited on the frozen filesystem");
    eprintln!("the reader was in D state after {:?}", in_d.elapsed());
    let (_leaker, leaker) = zombie_maker(2, false, None);
    let (_init, init) = zombie_maker(3, true, None);
    let (_nobodys, nobodys) = zombie_maker(1, false, Some(65534));

    let (d, _) = until_in(
        |run| process_of(run, reader.pid()),
        40,
        |f| f["d_state_count"].as_u64() >= Some(1),
    );
    eprintln!("D state: {d}");
    assert_eq!(d["comm"], "cat", "{d}");
    assert_eq!(d["zombie_count"], 0, "{d}");
    let t = &d["d_state"][0];
    assert_eq!(t["tid"], reader.pid(), "{d}");
    assert_eq!(t["name"], "cat", "{d}");
    assert!(
        t["wchan"].as_str().is_some_and(|w| !w.is_empty()),
        "its wait channel: {d}"
    );
    let blocked = t["blocked_ms"].as_u64();
    assert!(
        blocked.is_none_or(|ms| ms >= 1000),
        "past --silent-for: {d}"
    );

    let (z, run) = until_in(
        |run| process_of(run, leaker),
        20,
        |f| f["zombie_count"] == 2,
    );
    assert_eq!(z["comm"], "python3", "{z}");
    assert_eq!(z["pid_ns_init"], false, "{z}");
    assert!(z["missing_init"].is_null(), "not an init: {z}");
    let pids: Vec<u64> = z["zombies"]
        .as_array()
        .expect("zombies")
        .iter()
        .map(|c| c["pid"].as_u64().expect("a zombie's pid"))
        .collect();
    assert_eq!(pids.len(), 2, "{z}");
    for p in pids {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).expect("the zombie's stat");
        let ppid = stat
            .rsplit_once(") ")
            .map(|(_, rest)| rest.split(' ').nth(1));
        assert_eq!(ppid, Some(Some(leaker.to_string().as_str())), "{stat}");
        assert!(stat.contains(") Z "), "a zombie: {stat}");
    }
    let i = process_of(&run, init).expect("the namespace's init is listed");
    assert_eq!(i["pid_ns_init"], true, "{i}");
    assert_eq!(i["zombie_count"], 3, "{i}");
    let why = i["missing_init"].as_str().unwrap_or_default();
    assert!(
        why.contains(&format!(
            "3 zombie(s) under pid {init} (PID 1 of its pid namespace)"
        )),
        "{i}"
    );
    assert!(
        process_of(&run, nobodys).is_some(),
        "root sees every user's"
    );
    // No connection is involved: the exit code is the connections'.
    assert!(run.code == 0 || run.code == 1, "{}", run.stderr);

    // The table says the same, with what to run next.
    let (r, l, n) = (
        reader.pid().to_string(),
        leaker.to_string(),
        init.to_string(),
    );
    let text = table(&["--pid", &r, "--pid", &l, "--pid", &n]);
    eprintln!("{text}");
    assert!(text.contains("\nprocesses:\n"), "{text}");
    assert!(
        text.contains(&format!(
            "  pid {l} python3: 2 zombie child(ren) not reaped ("
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "thread {r} (cat) in D state (uninterruptible) for "
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("next: selfheal inspect --pid {n}")),
        "{text}"
    );
    assert!(
        text.contains("2 with unreaped zombies, 1 with threads in D state"),
        "{text}"
    );

    // Nobody sees its own zombies, and nothing of root's.
    let mine = scan_as(Some(65534));
    assert_eq!(mine.stderr, "", "nothing but the answer");
    let own = process_of(&mine, nobodys).expect("nobody's own process is listed");
    assert_eq!(own["zombie_count"], 1, "{own}");
    for pid in [reader.pid(), leaker, init] {
        assert!(
            process_of(&mine, pid).is_none(),
            "root's {pid} shown to nobody"
        );
    }
    for f in &mine.findings {
        assert_eq!(f["uid"], 65534, "another user's shown to nobody: {f}");
    }
}
