//! The helper's limits, counted by the real owner, under attack: one user
//! who holds many kernel uids (subordinate uids of `/etc/subuid`, or the
//! uids of a user namespace it made) and owners that together try to keep
//! a third out.
//!
//! - 16 uids of one user namespace, each arming the escalations it may
//!   (`signal` acts, 120 s grace, on its own processes that ignore
//!   SIGTERM), then root's own `signal`, and a third owner's;
//! - the same by 16 subordinate uids of a subuid file;
//! - 3 subordinate uids × 16 idle connections (each asking `hello` every
//!   second, so that the helper's request timeout does not close them),
//!   then another user's request (what its timer's `check` sends first);
//! - 3 owners × 16 such connections, then two more owners' requests;
//! - subordinate uids watching pids (the eBPF pid filter's share);
//! - a subuid file that is huge and full of garbage;
//! - and the owner read of processes in user namespaces, nested too.
//!
//! Other users are threads of this test that dropped to a uid with raw
//! `setresuid` (that thread only), children started as that uid, or this
//! test binary started as a user that made a user namespace (the `userns`
//! role). Needs root; skips otherwise. The uids are in 61100..61120 and
//! 2311000..2466000, the scratch directories named `limits-…`.

use std::{
    io::{Read as _, Write as _},
    os::unix::{net::UnixStream, process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use selfheal::{
    ebpf::TracerOptions,
    helper::server::performer::ActionsPerformer,
    helper::{HelperClient, Performer, ServerHandle, ServerOptions},
    sys::pidfd::start_ticks,
};
use selfheal_core::ebpf::strategy::Strategy;
use selfheal_core::protocol::ActRequest;
use selfheal_core::protocol::Action;
use selfheal_core::protocol::Response;
use tests::fixtures::{Procs, Reaped, ask, outcome, serve_helper};
use tests::{
    Peer, Scratch, as_uid, client_opts, forced_strategy, need_ebpf, need_root, skip, wait_for,
};

const SEC: Duration = Duration::from_secs(1);
const TICK: Duration = Duration::from_millis(20);

/// The user who makes the user namespace, and its 16 uids on the host.
const NS_OWNER: u32 = 61101;
const NS_UIDS: u32 = 2_311_000;
/// The user of the subuid file's range for escalations, and its range.
const SUB_OWNER: u32 = 61102;
const SUB_UIDS: u32 = 2_311_100;
/// A third owner, who must still get its share.
const THIRD: u32 = 61103;
/// The owner of the range used for the connection flood, and its range.
const CONN_OWNER: u32 = 61104;
const CONN_UIDS: u32 = 2_312_000;
/// Another ordinary user, whose timer asks during a flood.
const BYSTANDER: u32 = 61105;
/// Owns a range written past the first MiB of a huge subuid file.
const LATE_OWNER: u32 = 61119;
const LATE_UIDS: u32 = 2_400_000;

/// Set when this test binary runs as the process inside a user namespace.
pub(crate) const ROLE: &str = "SELFHEAL_LIMITS_ROLE";

/// An in-process helper on `dir`'s socket, with `dir`'s subuid file.
fn start(
    dir: &Scratch,
    exec: Arc<dyn Performer>,
    tweak: impl FnOnce(&mut ServerOptions),
) -> ServerHandle {
    serve_helper(dir.join("helper.sock"), exec, |o| {
        o.subuid = dir.join("subuid");
        tweak(o);
    })
}

/// Writes `dir`'s subuid file (0644, root's).
fn subuid_file(dir: &Scratch, text: &str) {
    tests::fixtures::subuid_file(&dir.join("subuid"), text);
}

fn signal_line(pid: u32) -> String {
    let mut r = ActRequest::new(Action::Signal, pid, start_ticks(pid).expect("running"));
    r.params.insert("grace_ms".into(), 120_000.into());
    r.agent = Some("limits".into());
    let mut v = serde_json::to_value(&r).unwrap();
    let m = v.as_object_mut().unwrap();
    m.insert("v".into(), 1.into());
    m.insert("id".into(), 1.into());
    m.insert("op".into(), "act".into());
    v.to_string()
}

const HELLO: &str = r#"{"v":1,"id":1,"op":"hello"}"#;

fn message(r: &Option<Response>) -> String {
    r.as_ref()
        .and_then(|r| r.error.as_ref())
        .map_or(String::new(), |e| e.message.clone())
}

/// A `signal` act on each of `pids` (each on a connection of its own, as
/// the thread's uid), all at once; their outcomes.
fn signal_all(path: &Path, pids: &[u32]) -> Vec<String> {
    std::thread::scope(|s| {
        let jobs: Vec<_> = pids
            .iter()
            .map(|pid| {
                s.spawn(move || {
                    let Ok(c) = UnixStream::connect(path) else {
                        return "refused".to_string();
                    };
                    outcome(&ask(&c, &signal_line(*pid), 5 * SEC))
                })
            })
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap()).collect()
    })
}

/// The helper's limits for the escalation floods: a table of 32, 2 per
/// uid before (so 16 uids fill it), 2 per owner now.
fn escalation_limits(o: &mut ServerOptions) {
    o.max_escalations = 32;
    o.max_escalations_per_uid = 2;
    o.root_escalation_reserve = 2;
}

/// After a flood: root's own `signal` and a third owner's two.
fn root_and_third(path: &Path, procs: &mut Procs) -> (Option<Response>, Vec<String>) {
    let root_target = procs.deaf(0);
    let third: Vec<u32> = (0..2).map(|_| procs.deaf(THIRD)).collect();
    let root = UnixStream::connect(path)
        .ok()
        .and_then(|c| ask(&c, &signal_line(root_target), 5 * SEC));
    let third = as_uid(THIRD, || signal_all(path, &third));
    (root, third)
}

fn count(v: &[String], what: &str) -> usize {
    v.iter().filter(|o| *o == what).count()
}

/// Not a test: the attacker's process inside the user namespace it made
/// (this binary with [`ROLE`] set: `crate::ROLES`).
pub(crate) fn owners_roles() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    if role == "userns" {
        // Made the namespace (before exec, as its owner) and lost its
        // capabilities in it at exec: the test writes the maps (our uid
        // as 0), then we exec again, as root of the namespace.
        println!("WAITING");
        std::io::stdout().flush().unwrap();
        let mut go = String::new();
        std::io::stdin().read_line(&mut go).unwrap();
        let e = Command::new(std::env::current_exe().unwrap())
            .env(ROLE, "mapped")
            .exec();
        panic!("exec: {e}");
    }
    assert_eq!(role, "mapped");
    let path = PathBuf::from(std::env::var("HELPER_SOCKET").unwrap());
    // Targets: two SIGTERM-deaf sleepers per uid of the namespace (1, 2,
    // …), made here, in the namespace, as that uid: processes the kernel
    // lets that uid ptrace and signal (a caller in a user namespace may not
    // ptrace one outside it, whatever its uid), so the helper's authority
    // lets the acts through and the limits alone decide.
    let mut procs = Procs::default();
    let targets: Vec<Vec<u32>> = (1..=16)
        .map(|uid| (0..2).map(|_| procs.deaf(uid)).collect())
        .collect();
    let outcomes: Vec<Vec<String>> = std::thread::scope(|s| {
        let jobs: Vec<_> = targets
            .iter()
            .enumerate()
            .map(|(uid, pids)| {
                let path = &path;
                s.spawn(move || as_uid(uid as u32 + 1, || signal_all(path, pids)))
            })
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap()).collect()
    });
    let all: Vec<String> = outcomes.into_iter().flatten().collect();
    println!("RESULT {}", all.join(","));
    std::io::stdout().flush().unwrap();
    // Stay, so that the helper's pin on us holds until the test is done.
    let _ = std::io::stdin().read(&mut [0u8; 1]);
}

/// Whether this machine lets a user make a user namespace.
fn userns_possible() -> Result<(), String> {
    let max = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .map_err(|e| format!("cannot read user.max_user_namespaces: {e}"))?;
    if max.trim() == "0" {
        return Err("user.max_user_namespaces is 0".into());
    }
    Ok(())
}

/// 16 uids of one user namespace, made by an ordinary user (uid 61101)
/// with a uid map root wrote (its own uid as 0, and 16 more), each `signal`
/// twice on its own processes in the namespace that ignore SIGTERM (grace
/// 120 s). Before, every uid counted as its
/// own: the 32 escalations filled the table and root's own `signal` was
/// answered `busy … nothing was sent`, the third owner's too. Now they
/// count against the namespace's owner: 2 armed, 30 `busy`; root and the
/// third owner are served.
#[test]
fn the_uids_of_a_user_namespace_share_their_owners_escalations() {
    let _area = tests::area(module_path!());
    let test = "limits: user namespace escalations";
    if !need_root(test) {
        return;
    }
    if let Err(why) = userns_possible() {
        skip(test, &why);
        return;
    }
    let dir = Scratch::new("limits-userns");
    subuid_file(&dir, "");
    let h = start(
        &dir,
        Arc::new(ActionsPerformer::default()),
        escalation_limits,
    );
    let path = dir.join("helper.sock");
    let mut procs = Procs::default();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.env(ROLE, "userns")
        .env("HELPER_SOCKET", &path)
        .uid(NS_OWNER)
        .gid(NS_OWNER);
    // SAFETY: unshare is async-signal-safe; nothing else runs in the child.
    unsafe {
        cmd.pre_exec(|| {
            if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut ns = Peer::spawn(cmd);
    ns.expect("WAITING", 30 * SEC);
    let pid = ns.pid();
    for map in ["uid_map", "gid_map"] {
        std::fs::write(
            format!("/proc/{pid}/{map}"),
            format!("0 {NS_OWNER} 1\n1 {NS_UIDS} 16\n"),
        )
        .unwrap_or_else(|e| panic!("write {map}: {e}"));
    }
    ns.tell("go");
    let line = ns.expect("RESULT ", 60 * SEC);
    let flood: Vec<String> = line["RESULT ".len()..]
        .split(',')
        .map(str::to_string)
        .collect();
    let (root, third) = root_and_third(&path, &mut procs);
    eprintln!(
        "userns escalation flood: 16 uids × 2 signal acts: {} ok, {} busy, others {:?}; \
         root's signal: {} {:?}; third owner: {third:?}",
        count(&flood, "ok"),
        count(&flood, "busy"),
        flood
            .iter()
            .filter(|o| *o != "ok" && *o != "busy")
            .collect::<Vec<_>>(),
        outcome(&root),
        message(&root)
    );
    let audit = h.audit();
    let armed = audit
        .iter()
        .filter(|a| !a.escalation && a.error.is_none() && a.caller.uid >= NS_UIDS)
        .count();
    assert_eq!(count(&flood, "ok"), 2, "{flood:?}");
    assert_eq!(count(&flood, "busy"), 30, "{flood:?}");
    assert_eq!(armed, 2);
    assert_eq!(outcome(&root), "ok", "{root:?}");
    assert_eq!(third, ["ok", "ok"]);
    drop(ns);
    drop(h);
}

/// The same by 16 subordinate uids of one user's `/etc/subuid` range
/// (here a test file the helper is given): before, 32 escalations armed
/// and root's `signal` was `busy`; now 2, and root and a third owner are
/// served.
#[test]
fn subordinate_uids_share_their_owners_escalations() {
    let _area = tests::area(module_path!());
    if !need_root("limits: subordinate uid escalations") {
        return;
    }
    let dir = Scratch::new("limits-subuid");
    subuid_file(
        &dir,
        &format!("# rootless containers\n{SUB_OWNER}:{SUB_UIDS}:65536\n"),
    );
    let _h = start(
        &dir,
        Arc::new(ActionsPerformer::default()),
        escalation_limits,
    );
    let path = dir.join("helper.sock");
    let mut procs = Procs::default();
    let targets: Vec<(u32, Vec<u32>)> = (0..16)
        .map(|i| {
            let uid = SUB_UIDS + i;
            (uid, (0..2).map(|_| procs.deaf(uid)).collect())
        })
        .collect();
    let flood: Vec<String> = std::thread::scope(|s| {
        let jobs: Vec<_> = targets
            .iter()
            .map(|(uid, pids)| {
                let path = &path;
                s.spawn(move || as_uid(*uid, || signal_all(path, pids)))
            })
            .collect();
        jobs.into_iter().flat_map(|j| j.join().unwrap()).collect()
    });
    let (root, third) = root_and_third(&path, &mut procs);
    eprintln!(
        "subuid escalation flood: 16 subordinate uids × 2 signal acts: {} ok, {} busy; \
         root's signal: {} {:?}; third owner: {third:?}",
        count(&flood, "ok"),
        count(&flood, "busy"),
        outcome(&root),
        message(&root)
    );
    assert_eq!(count(&flood, "ok"), 2, "{flood:?}");
    assert_eq!(outcome(&root), "ok", "{root:?}");
    assert_eq!(third, ["ok", "ok"]);
}

/// `n` connections as `uid`, each answered its `hello`, held open (idle).
fn hold(path: &Path, uid: u32, n: usize) -> (Vec<UnixStream>, usize) {
    as_uid(uid, || {
        let mut held = Vec::new();
        let mut refused = 0;
        for _ in 0..n {
            let Ok(c) = UnixStream::connect(path) else {
                refused += 1;
                continue;
            };
            if outcome(&ask(&c, HELLO, 5 * SEC)) == "ok" {
                held.push(c);
            } else {
                refused += 1;
            }
        }
        (held, refused)
    })
}

/// What another user's timer sends first: a fresh connection and `hello`.
fn timer_hello(path: &Path, uid: u32) -> Result<u32, String> {
    as_uid(uid, || {
        HelperClient::connect_with(path, client_opts())
            .and_then(|mut c| c.hello())
            .map(|h| h.caller.uid)
            .map_err(|e| e.to_string())
    })
}

/// Keeps held connections open as an attacker would: the helper closes a
/// connection that sends nothing for its request timeout (5 s), so each
/// asks `hello` every second. Counts those the helper closed.
struct Keeper {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<usize>>,
}

impl Keeper {
    fn new(held: Vec<UnixStream>) -> Keeper {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut open: Vec<UnixStream> = held;
            let mut closed = 0;
            while !flag.load(Ordering::SeqCst) {
                let before = open.len();
                open.retain(|c| outcome(&ask(c, HELLO, 2 * SEC)) == "ok");
                closed += before - open.len();
                std::thread::sleep(SEC);
            }
            // Once more, for what closed since the last round.
            let before = open.len();
            open.retain(|c| outcome(&ask(c, HELLO, 2 * SEC)) == "ok");
            closed + before - open.len()
        });
        Keeper {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops; how many connections the helper closed meanwhile.
    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().map_or(0, |t| t.join().unwrap())
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// 3 subordinate uids of one user × 16 idle connections (the defaults: 64
/// connections, 16 kept for root, 16 per uid before and per owner now).
/// Before, they held all 48 connections uids other than root may hold,
/// and another user's timer was answered `busy: too many connections (at
/// most 48 for uids other than root …)`. Now the owner holds 16, the rest
/// are `busy`, and the other user is served.
#[test]
fn subordinate_uids_cannot_hold_every_connection() {
    let _area = tests::area(module_path!());
    if !need_root("limits: subordinate uid connection flood") {
        return;
    }
    let dir = Scratch::new("limits-connflood");
    subuid_file(&dir, &format!("{CONN_OWNER}:{CONN_UIDS}:65536\n"));
    let _h = start(&dir, Arc::new(ActionsPerformer::default()), |_| {});
    let path = dir.join("helper.sock");
    let mut held = Vec::new();
    let mut refused = 0;
    for i in 0..3 {
        let (h, r) = hold(&path, CONN_UIDS + i, 16);
        held.extend(h);
        refused += r;
    }
    let n = held.len();
    let keeper = Keeper::new(held);
    // Past the request timeout: the flood is still held.
    std::thread::sleep(6 * SEC);
    let other = timer_hello(&path, BYSTANDER);
    let root = HelperClient::connect_with(&path, client_opts()).and_then(|mut c| c.hello());
    let lost = keeper.finish();
    eprintln!(
        "subuid connection flood: 3 subordinate uids × 16: {n} held ({lost} of them closed \
         by the helper), {refused} refused; another user's hello: {other:?}; root's: {:?}",
        root.as_ref().map(|h| h.caller.uid)
    );
    assert_eq!(n, 16);
    assert_eq!(lost, 0);
    assert_eq!(other, Ok(BYSTANDER));
    assert_eq!(root.map(|h| h.caller.uid).ok(), Some(0));
}

/// 3 owners × 16 idle connections fill the 48 others may hold; then two
/// more owners' timers ask. Before, both were `busy`. Now each is served:
/// the oldest idle connection of the largest holder above its share is
/// closed (and told why) to admit it.
#[test]
fn three_owners_cannot_keep_a_fourth_out() {
    let _area = tests::area(module_path!());
    if !need_root("limits: three owners' connection flood") {
        return;
    }
    let dir = Scratch::new("limits-owners");
    subuid_file(&dir, "");
    let _h = start(&dir, Arc::new(ActionsPerformer::default()), |_| {});
    let path = dir.join("helper.sock");
    let mut held = Vec::new();
    for uid in [61106, 61107, 61108] {
        held.extend(hold(&path, uid, 16).0);
    }
    let n = held.len();
    let keeper = Keeper::new(held);
    std::thread::sleep(6 * SEC);
    let fourth = timer_hello(&path, 61109);
    let fifth = timer_hello(&path, 61110);
    let gone = keeper.finish();
    eprintln!(
        "three owners' connection flood: {n} held (pinged every second); a fourth owner's \
         hello: {fourth:?}, a fifth's: {fifth:?}; {gone} idle connections closed to admit them"
    );
    assert_eq!(n, 48);
    assert_eq!(fourth, Ok(61109));
    assert_eq!(fifth, Ok(61110));
    assert!((1..=2).contains(&gone), "{gone} closed");
}

/// A subuid file larger than the bound, full of garbage around one good
/// line, with another good line past its first MiB: the helper starts,
/// serves, and counts the good range's uids to its owner; the range past
/// the first MiB is not read (its uids count as their own), and the real
/// `selfheal helper` logs the bound and how many lines it skipped.
#[test]
fn a_huge_garbage_subuid_file_is_bounded() {
    let _area = tests::area(module_path!());
    if !need_root("limits: huge subuid file") {
        return;
    }
    let dir = Scratch::new("limits-hugesubuid");
    let mut text =
        format!("\u{0}\u{1}garbage\n{CONN_OWNER}:{CONN_UIDS}:65536\n::::\nnobody-x:1:\n");
    while text.len() < 3 << 20 {
        text.push_str("x:y:z\n-1:-1:-1\nnosuchuser:100:100\n");
    }
    text.push_str(&format!("{LATE_OWNER}:{LATE_UIDS}:65536\n"));
    subuid_file(&dir, &text);
    let _h = start(&dir, Arc::new(ActionsPerformer::default()), |o| {
        o.max_connections_per_uid = 2;
    });
    let path = dir.join("helper.sock");
    let (held, refused) = hold(&path, CONN_UIDS + 1, 1);
    let (held2, refused2) = hold(&path, CONN_UIDS + 2, 2);
    assert_eq!((held.len(), refused), (1, 0));
    // The same owner: one more of its cap of 2.
    assert_eq!((held2.len(), refused2), (1, 1));
    assert_eq!(timer_hello(&path, BYSTANDER), Ok(BYSTANDER));
    // Past the first MiB: two uids of the late range are each their own
    // owner, both served their cap (one owner would refuse the second's).
    let (late1, late_refused1) = hold(&path, LATE_UIDS + 1, 2);
    let (late2, late_refused2) = hold(&path, LATE_UIDS + 2, 2);
    assert_eq!(
        (late1.len(), late_refused1, late2.len(), late_refused2),
        (2, 0, 2, 0),
        "the range past the first MiB was read"
    );

    // The real command logs what it left out: the bound, and every line
    // of the first MiB but the good one skipped.
    let first_mib = &text.as_bytes()[..1 << 20];
    let lines = first_mib.iter().filter(|b| **b == b'\n').count();
    let cli_sock = dir.join("cli.sock");
    let mut child = Command::new(tests::selfheal_bin())
        .args(["helper", "--no-ebpf", "--socket"])
        .arg(&cli_sock)
        .arg("--subuid")
        .arg(dir.join("subuid"))
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn selfheal helper");
    let answered = wait_for(10 * SEC, TICK, || {
        timer_hello(&cli_sock, LATE_UIDS + 3).ok()
    });
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let exited = wait_for(10 * SEC, TICK, || child.try_wait().ok().flatten());
    if exited.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    assert_eq!(answered, Some(LATE_UIDS + 3), "{err}");
    assert!(exited.is_some(), "selfheal helper exits on SIGTERM: {err}");
    assert!(
        err.contains("is larger than 1 MiB: only its first MiB is read"),
        "{err}"
    );
    let skipped = format!(
        "1 subordinate uid ranges; {} lines skipped (line 1: ",
        lines - 1
    );
    assert!(err.contains(&skipped), "wanted {skipped:?} in {err}");
}

/// Waits until `pid` runs `sleep`.
fn exec_sleep(pid: u32) {
    wait_for(5 * SEC, TICK, || {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()
            .filter(|c| c.trim() == "sleep")
    })
    .expect("exec'd sleep");
}

/// The owner the helper reads for processes in user namespaces: one made
/// by a plain user, one made by a subordinate uid, a nested one whose
/// inner namespace another uid made (the outermost's creator counts), and
/// none at all.
#[test]
fn the_owner_of_a_namespace_is_its_outermost_creator() {
    let _area = tests::area(module_path!());
    use selfheal::helper::access::owner::Owners;
    use selfheal_core::access::owner::Basis;
    let test = "limits: namespace owners";
    if !need_root(test) {
        return;
    }
    if let Err(why) = userns_possible() {
        skip(test, &why);
        return;
    }
    if Command::new("nsenter").arg("--version").output().is_err() {
        skip(test, "nsenter is not installed");
        return;
    }
    let dir = Scratch::new("limits-nsowner");
    subuid_file(&dir, "61112:2313000:100\n");
    let owners = Owners::new(dir.join("subuid"));
    let spawn = |uid: u32, unshare: bool| {
        let mut cmd = Command::new("sleep");
        cmd.arg("60").uid(uid).gid(uid).stdin(Stdio::null());
        if unshare {
            // SAFETY: unshare is async-signal-safe.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = cmd.spawn().expect("spawn sleep");
        exec_sleep(child.id());
        Reaped(child)
    };
    let read = |s: &Reaped, uid: u32| {
        let pid = s.0.id();
        let fd = selfheal::sys::pidfd::Pidfd::open(pid, None).unwrap();
        owners.account(uid, Some(std::os::fd::AsFd::as_fd(&fd)), pid)
    };
    // A plain user's namespace; a subordinate uid's; no namespace.
    let plain = spawn(61111, true);
    let a = read(&plain, 61111);
    assert_eq!((a.owner, &a.basis), (61111, &Basis::Namespace), "{a:?}");
    let sub = spawn(2313005, true);
    let a = read(&sub, 2313005);
    assert_eq!(a.owner, 61112, "{a:?}");
    let none = spawn(2313006, false);
    let a = read(&none, 2313006);
    assert_eq!(
        (a.owner, &a.basis),
        (
            61112,
            &Basis::Subuid {
                uid: 2313006,
                line: 1
            }
        )
    );
    // Nested: uid 61113 makes a namespace (root writes its map: itself as
    // 0, 10 uids of 2313500 from 1); its uid 1 (2313500 here) makes
    // another inside. The outermost's creator counts, not the inner's.
    let outer = spawn(61113, true);
    let pid = outer.0.id();
    for map in ["uid_map", "gid_map"] {
        std::fs::write(format!("/proc/{pid}/{map}"), "0 61113 1\n1 2313500 10\n")
            .unwrap_or_else(|e| panic!("write {map}: {e}"));
    }
    let inner = Command::new("nsenter")
        .args([
            "--user",
            "--target",
            &pid.to_string(),
            "--setuid",
            "1",
            "--setgid",
            "1",
        ])
        .args(["unshare", "--user", "sleep", "60"])
        .stdin(Stdio::null())
        .spawn()
        .expect("nsenter");
    let inner = Reaped(inner);
    exec_sleep(inner.0.id());
    let ns = |pid: u32| std::fs::read_link(format!("/proc/{pid}/ns/user")).unwrap();
    assert_ne!(ns(inner.0.id()), ns(pid), "the inner namespace is its own");
    let a = read(&inner, 2313500);
    eprintln!("namespace owners: nested: {a} ({a:?})");
    assert_eq!((a.owner, &a.basis), (61113, &Basis::Namespace), "{a:?}");
}

/// Two subordinate uids of one user watch their own pids (the eBPF pid
/// filter), 4 pids per uid before and per owner now: the first watches 3,
/// the second asks for 2. Counted per kernel uid, the second's 2 fitted
/// (it held none): a user's uids together held 4 per uid. Now the second
/// is `busy` ("would watch more than 4"), 1 more fits, and another owner
/// still watches its 4.
#[test]
fn subordinate_uids_share_their_owners_watched_pids() {
    let _area = tests::area(module_path!());
    if !need_ebpf("limits: watched pids by owner") {
        return;
    }
    let dir = Scratch::new("limits-watch");
    subuid_file(&dir, "61114:2313200:100\n");
    let _h = start(&dir, Arc::new(ActionsPerformer::default()), |o| {
        o.max_watched_per_uid = 4;
        o.ebpf = Some(TracerOptions {
            strategies: forced_strategy().map_or(Strategy::ALL.to_vec(), |s| vec![s]),
            ..TracerOptions::default()
        });
    });
    let path = dir.join("helper.sock");
    let mut procs = Procs::default();
    let first: Vec<u32> = (0..3).map(|_| procs.deaf(2313200)).collect();
    let second: Vec<u32> = (0..2).map(|_| procs.deaf(2313201)).collect();
    let other: Vec<u32> = (0..4).map(|_| procs.deaf(61115)).collect();
    let watch = |uid: u32, pids: &[u32]| {
        as_uid(uid, || {
            HelperClient::connect_with(&path, client_opts())
                .and_then(|mut c| c.watch(pids))
                .map(|w| w.watched.len())
                .map_err(|e| e.to_string())
        })
    };
    let a = watch(2313200, &first);
    let b = watch(2313201, &second);
    let c = watch(2313201, &second[..1]);
    let d = watch(61115, &other);
    eprintln!(
        "watched pids by owner: first uid 3: {a:?}; second uid 2: {b:?}; then 1: {c:?}; another owner 4: {d:?}"
    );
    assert_eq!(a, Ok(3));
    let b = b.unwrap_err();
    assert!(b.contains("would watch more than 4"), "{b}");
    assert!(b.contains("uid 61114 (the owner of uid 2313201's"), "{b}");
    assert_eq!(c, Ok(1));
    assert_eq!(d, Ok(4));
}
