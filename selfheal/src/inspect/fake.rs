//! The collector on a scripted kernel: a procfs tree under a directory of
//! its own, and [`FakeKernel`]'s answers for the task iterators' walks, the
//! network namespaces' dumps and their listening addresses, each call
//! recorded; [`FakeHelper`] answers for the helper. The races a collection
//! must survive (a pid reused after its walk or the helper's pass, a
//! process gone at its walk, a namespace gone before its dump, a refused
//! dump, a spent budget) are tested here without root.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
};

use selfheal_core::{
    ebpf::iter::{IterTcp, IterThread},
    model::TcpState,
    protocol::{CollectedProcess, IteratedProcess},
};

use super::{
    kernel::{CollectKernel, Walked},
    readers::Walk,
    *,
};
use crate::proc::fixture::stat_line;

/// A call the collector made of the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Call {
    Ready,
    Walk(u32),
    Dump(u32),
    Listening(u32),
}

/// What the task iterators' walk of a pid finds.
#[derive(Clone)]
enum FakeWalk {
    /// The pass, and whether the process walked has exited after it.
    Read {
        pass: IterProcess,
        exited: bool,
    },
    Gone,
    Failed(String),
}

/// The kernel's answers, and the calls asked of it.
#[derive(Default)]
struct Script {
    walks: BTreeMap<u32, FakeWalk>,
    /// The network namespace (by name) each pid's dump enters.
    netns_of: BTreeMap<u32, String>,
    /// Each namespace's TCP sockets, or why entering it failed.
    dumps: BTreeMap<String, Result<Vec<TcpSocket>, String>>,
    /// Each namespace's listening addresses.
    listening: BTreeMap<String, Vec<SocketAddr>>,
    calls: Vec<Call>,
}

/// A scripted kernel, shared with the test that wrote the script.
#[derive(Clone, Default)]
struct FakeKernel(Arc<Mutex<Script>>);

impl FakeKernel {
    fn script(&self) -> std::sync::MutexGuard<'_, Script> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn calls(&self) -> Vec<Call> {
        self.script().calls.clone()
    }

    /// The calls `kind` picks.
    fn calls_of(&self, kind: impl Fn(&Call) -> bool) -> Vec<Call> {
        self.script()
            .calls
            .iter()
            .filter(|c| kind(c))
            .cloned()
            .collect()
    }

    /// The namespace `pid`'s dump enters, or the error entering it gives.
    fn netns(s: &Script, pid: u32) -> Result<String, sockdiag::SockDiagError> {
        s.netns_of
            .get(&pid)
            .cloned()
            .ok_or(sockdiag::SockDiagError::Netns {
                pid,
                reason: "No such process (os error 3)".into(),
            })
    }
}

impl CollectKernel for FakeKernel {
    fn ready_iterators(&mut self, _load: bool) {
        self.script().calls.push(Call::Ready);
    }

    fn walk(&mut self, pid: u32, _load: bool) -> Result<Walked, Walk> {
        let mut s = self.script();
        s.calls.push(Call::Walk(pid));
        match s.walks.get(&pid).cloned() {
            Some(FakeWalk::Read { pass, exited }) => Ok(Walked {
                pass,
                from: "pinned",
                exited: Box::new(move || exited),
            }),
            Some(FakeWalk::Failed(why)) => Err(Walk::Failed(why)),
            Some(FakeWalk::Gone) | None => Err(Walk::Gone),
        }
    }

    fn dump_tcp(&mut self, pid: u32) -> Result<Vec<TcpSocket>, sockdiag::SockDiagError> {
        let mut s = self.script();
        s.calls.push(Call::Dump(pid));
        let ns = Self::netns(&s, pid)?;
        match s.dumps.get(&ns) {
            Some(Ok(all)) => Ok(all.clone()),
            Some(Err(reason)) => Err(sockdiag::SockDiagError::Netns {
                pid,
                reason: reason.clone(),
            }),
            None => Ok(Vec::new()),
        }
    }

    fn listening(&mut self, pid: u32) -> Result<Vec<SocketAddr>, sockdiag::SockDiagError> {
        let mut s = self.script();
        s.calls.push(Call::Listening(pid));
        let ns = Self::netns(&s, pid)?;
        Ok(s.listening.get(&ns).cloned().unwrap_or_default())
    }
}

/// A made-up host: a procfs tree in a directory of its own (removed on
/// drop) and the kernel's script.
struct Host {
    dir: PathBuf,
    kernel: FakeKernel,
}

impl Host {
    fn new(name: &str) -> Host {
        let dir =
            std::env::temp_dir().join(format!("selfheal-collect-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("netns")).expect("fixture dir");
        Host {
            dir,
            kernel: FakeKernel::default(),
        }
    }

    /// Process `pid` (one thread, itself), child of `ppid`, in state
    /// `state`, started at `start`, in network namespace `netns`.
    fn process(&self, pid: u32, ppid: u32, state: char, start: u64, netns: &str) {
        let p = self.dir.join(pid.to_string());
        for d in [format!("task/{pid}"), "fd".into(), "ns".into()] {
            std::fs::create_dir_all(p.join(d)).expect("fixture dir");
        }
        self.restart(pid, ppid, state, start);
        std::fs::write(
            p.join("status"),
            format!("Name:\tagent\nUid:\t1000\t1000\t1000\t1000\nNSpid:\t{pid}\n"),
        )
        .expect("status");
        // One file per namespace, hard-linked: the same (dev, inode) for
        // every process in it, as `/proc/PID/ns/net` is.
        let ns = self.dir.join("netns").join(netns);
        if !ns.exists() {
            std::fs::write(&ns, "").expect("netns");
        }
        std::fs::hard_link(&ns, p.join("ns/net")).expect("ns/net");
        self.kernel.script().netns_of.insert(pid, netns.to_string());
    }

    /// A zombie: its `stat` and `status` alone.
    fn zombie(&self, pid: u32, ppid: u32, start: u64) {
        let p = self.dir.join(pid.to_string());
        std::fs::create_dir_all(&p).expect("fixture dir");
        let line = stat_line(pid, "agent", 'Z', ppid, start);
        std::fs::write(p.join("stat"), line).expect("stat");
        std::fs::write(
            p.join("status"),
            "Name:\tagent\nUid:\t1000\t1000\t1000\t1000\n",
        )
        .expect("status");
    }

    /// `pid`'s `stat` now names a process started at `start`.
    fn restart(&self, pid: u32, ppid: u32, state: char, start: u64) {
        let p = self.dir.join(pid.to_string());
        let line = stat_line(pid, "agent", state, ppid, start);
        std::fs::write(p.join("stat"), &line).expect("stat");
        std::fs::write(p.join(format!("task/{pid}/stat")), &line).expect("stat");
    }

    /// Socket `inode` open as fd `fd` of `pid`.
    fn fd(&self, pid: u32, fd: i32, inode: u64) {
        let link = self.dir.join(format!("{pid}/fd/{fd}"));
        std::os::unix::fs::symlink(format!("socket:[{inode}]"), link).expect("fd link");
    }

    /// The walk of `pid` finds it holding `sockets` (fd, inode), its
    /// connections read by the pass as `tcp`; it still runs after.
    fn walks(&self, pid: u32, sockets: &[(i32, u64)], tcp: TcpPass) {
        let pass = IterProcess {
            threads: vec![thread(pid)],
            sockets: sockets.to_vec(),
            tcp,
        };
        self.walk_is(
            pid,
            FakeWalk::Read {
                pass,
                exited: false,
            },
        );
    }

    /// The process walked as `pid` exits after its walk (its pidfd says
    /// so).
    fn exits_after_walk(&self, pid: u32) {
        if let Some(FakeWalk::Read { exited, .. }) = self.kernel.script().walks.get_mut(&pid) {
            *exited = true;
        }
    }

    fn walk_is(&self, pid: u32, walk: FakeWalk) {
        self.kernel.script().walks.insert(pid, walk);
    }

    fn dump(&self, netns: &str, found: Result<Vec<TcpSocket>, String>) {
        self.kernel.script().dumps.insert(netns.to_string(), found);
    }

    /// A collector at minimal detail reading this host, its iterators on.
    fn collector(&self) -> Collector {
        let ebpf = EbpfEvidence {
            built_in: false,
            attempts: Vec::new(),
            error: Some("a unit test".into()),
            watched_since_ns: None,
            snapshot: None,
        };
        let mut c = Collector::with(ebpf, Detail::Minimal, None, false);
        c.proc = ProcRoot::at(&self.dir);
        c.kernel = Box::new(self.kernel.clone());
        c.iterators_off = None;
        c.iterators_asked_off = false;
        c
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A thread asleep outside any syscall.
fn thread(pid: u32) -> IterThread {
    IterThread {
        tgid: pid,
        tid: pid,
        state: 1,
        exit_state: 0,
        runtime_ns: 0,
        syscall: None,
        arg0: 0,
        arg1: 0,
        exec_start_ns: 0,
        cpu: 0,
        comm: "agent".into(),
        head: None,
    }
}

/// The provider every test's agent calls.
const PROVIDER: &str = "192.0.2.7:443";

/// An established connection `inode` to `remote` from local port `port`.
fn conn(inode: u64, port: u16, remote: &str) -> TcpSocket {
    TcpSocket {
        inode,
        cookie: inode + 1_000,
        local: SocketAddr::from(([10, 0, 0, 2], port)),
        remote: remote.parse().expect("address"),
        state: TcpState::Established,
        uid: 1000,
        recv_queue: 0,
        send_queue: 0,
        timer: None,
        tcp_info: None,
    }
}

/// The pass's reading of connection `inode` in namespace 1.
fn read(inodes: &[u64]) -> TcpPass {
    TcpPass::Read(
        inodes
            .iter()
            .map(|&i| IterTcp {
                netns: 1,
                socket: conn(i, 40_000 + i as u16, PROVIDER),
            })
            .collect(),
    )
}

/// An agent of `pids`, its one upstream the provider.
fn agent(pids: &[u32]) -> Target {
    let provider: SocketAddr = PROVIDER.parse().expect("address");
    Target {
        agent: Some("agent".into()),
        rule: "pid".into(),
        roots: pids.first().copied().into_iter().collect(),
        pids: pids.to_vec(),
        problem: None,
        upstream_of: Box::new(move |a| (a == provider).then_some((SocketRole::Provider, 0))),
        upstreams: vec![PROVIDER.into()],
        roles: Roles::ByAddress,
        containers: Vec::new(),
        container_gaps: Vec::new(),
        unread_cmdlines: None,
    }
}

/// How many processes the iterators read, and how many procfs did.
fn read_by(ev: &Evidence) -> (usize, usize) {
    (ev.collection.iterators, ev.collection.procfs)
}

fn pids(ev: &Evidence) -> Vec<u32> {
    ev.processes.iter().map(|p| p.pid).collect()
}

/// Each namespace's group: the pid it was read through, and its
/// connections' inodes or why they are unread.
fn groups(ev: &Evidence) -> Vec<(u32, Result<Vec<u64>, String>)> {
    ev.tcp
        .iter()
        .map(|(pid, found)| {
            let found = found
                .as_ref()
                .map(|all| all.iter().map(|s| s.inode).collect())
                .map_err(Clone::clone);
            (*pid, found)
        })
        .collect()
}

/// A walked process: threads and connections from its pass, its `stat`
/// from procfs; its namespace is never dumped.
#[test]
fn a_walked_process_is_read_from_its_pass_and_no_namespace_is_dumped() {
    let host = Host::new("walked");
    host.process(42, 1, 'S', 500, "a");
    host.walks(42, &[(3, 7)], read(&[7]));
    let ev = host.collector().collect(&agent(&[42]));
    assert_eq!(pids(&ev), [42]);
    assert!(ev.gone.is_empty(), "{:?}", ev.gone);
    assert_eq!(ev.processes[0].start_ticks, 500);
    assert_eq!(ev.processes[0].sockets, [(3, 7)]);
    assert_eq!(read_by(&ev), (1, 0), "{:?}", ev.collection);
    assert_eq!(ev.collection.iterators_from.as_deref(), Some("pinned"));
    assert!(ev.collection.why_sock_diag.is_empty());
    assert_eq!(groups(&ev), [(42, Ok(vec![7]))]);
    assert_eq!(ev.roles.get(&7), Some(&(SocketRole::Provider, 0)));
    assert_eq!(host.kernel.calls(), [Call::Ready, Call::Walk(42)]);
}

/// The process exited after its walk and another took its pid before its
/// `stat` was read: the pass is of the one, the `stat` of the other. It
/// is gone, never read as a mix of both, and its pass's connections are
/// not the agent's.
#[test]
fn a_pid_reused_after_its_walk_is_gone_not_read_as_the_new_process() {
    let host = Host::new("reused");
    host.process(42, 1, 'S', 500, "a");
    host.walks(42, &[(3, 7)], read(&[7]));
    host.process(43, 1, 'S', 600, "a");
    host.walks(43, &[(3, 8)], read(&[8]));
    // 42 exits after its walk and is now another process, started later.
    host.exits_after_walk(42);
    host.restart(42, 1, 'R', 900);
    let ev = host.collector().collect(&agent(&[42, 43]));
    assert_eq!(pids(&ev), [43]);
    assert_eq!(ev.gone, [42]);
    assert_eq!(ev.collection.iterators, 1);
    assert_eq!(groups(&ev), [(43, Ok(vec![8]))]);
    assert!(!ev.roles.contains_key(&7));
}

/// A process that exited by its `stat`'s read but whose `stat` is a
/// zombie's is what it left (a zombie keeps its pid): read, for the
/// zombie diagnosis. One still running after the read is its own, whatever
/// its state.
#[test]
fn an_exited_process_whose_stat_is_a_zombie_is_read_as_the_zombie() {
    let host = Host::new("zombie");
    host.process(42, 1, 'Z', 500, "a");
    host.walks(42, &[], read(&[]));
    host.exits_after_walk(42);
    host.process(43, 1, 'R', 600, "a");
    host.walks(43, &[], read(&[]));
    let ev = host.collector().collect(&agent(&[42, 43]));
    assert_eq!(pids(&ev), [42, 43]);
    assert!(ev.gone.is_empty(), "{:?}", ev.gone);
    assert_eq!(ev.processes[0].state, 'Z');
}

/// A process gone at its walk is gone: procfs is not asked instead (a
/// stale directory would read as a process).
#[test]
fn a_process_gone_at_its_walk_is_gone_and_procfs_is_not_read() {
    let host = Host::new("gone");
    host.process(42, 1, 'S', 500, "a");
    host.walk_is(42, FakeWalk::Gone);
    let ev = host.collector().collect(&agent(&[42]));
    assert!(ev.processes.is_empty());
    assert_eq!(ev.gone, [42]);
    assert_eq!(ev.collection.procfs, 0);
    assert!(ev.tcp.is_empty());
}

/// Iterators that cannot run leave each process to procfs, with why, and
/// each network namespace to one dump, however many of the agent's
/// processes live in it; the dump's other sockets are not the agent's.
#[test]
fn failed_iterators_leave_each_process_to_procfs_and_each_namespace_to_one_dump() {
    let host = Host::new("failed");
    let why = "the kernel's task iterators: run: link: Operation not permitted (os error 1)";
    for (pid, ns, inode) in [(42, "a", 7), (43, "a", 8), (44, "b", 9)] {
        host.process(pid, 1, 'S', 500, ns);
        host.fd(pid, 3, inode);
        host.walk_is(pid, FakeWalk::Failed(why.into()));
    }
    host.dump(
        "a",
        Ok(vec![
            conn(8, 2, PROVIDER),
            conn(99, 3, PROVIDER),
            conn(7, 1, PROVIDER),
        ]),
    );
    host.dump("b", Ok(vec![conn(9, 4, PROVIDER)]));
    let ev = host.collector().collect(&agent(&[42, 43, 44]));
    assert_eq!(pids(&ev), [42, 43, 44]);
    assert_eq!(read_by(&ev), (0, 3), "{:?}", ev.collection);
    assert_eq!(ev.collection.why_procfs, [why]);
    assert_eq!(ev.collection.why_sock_diag, ["procfs read the process"]);
    // In each dump's order; 99 is another process's.
    assert_eq!(groups(&ev), [(42, Ok(vec![8, 7])), (44, Ok(vec![9]))]);
    let dumps = host.kernel.calls_of(|c| matches!(c, Call::Dump(_)));
    assert_eq!(dumps, [Call::Dump(42), Call::Dump(44)]);
}

/// A process whose namespace is gone before its dump (it exited after
/// its read): its sockets are unread, saying why, and nothing is dumped
/// through it.
#[test]
fn a_namespace_gone_before_its_dump_is_a_gap_naming_the_error() {
    let host = Host::new("nsgone");
    host.process(42, 1, 'S', 500, "a");
    host.fd(42, 3, 7);
    host.walk_is(42, FakeWalk::Failed("no iterators".into()));
    std::fs::remove_file(host.dir.join("42/ns/net")).expect("unlink");
    let ev = host.collector().collect(&agent(&[42]));
    assert_eq!(pids(&ev), [42]);
    let found = groups(&ev);
    let [(42, Err(why))] = found.as_slice() else {
        panic!("{found:?}");
    };
    assert!(
        why.starts_with("cannot read it (") && why.contains("os error 2"),
        "{why}"
    );
    assert!(!host.kernel.calls().contains(&Call::Dump(42)));
}

/// A namespace that cannot be entered is one gap, through the first of
/// its processes, for every agent in it: the collector does not ask again
/// for the next agent.
#[test]
fn a_refused_dump_is_one_gap_for_its_namespace_and_not_asked_again() {
    let host = Host::new("refused");
    for (pid, inode) in [(42, 7), (43, 8)] {
        host.process(pid, 1, 'S', 500, "a");
        host.fd(pid, 3, inode);
        host.walk_is(pid, FakeWalk::Failed("no iterators".into()));
    }
    host.dump("a", Err("EPERM: Operation not permitted".into()));
    let mut c = host.collector();
    let gap = || {
        Err(
            "cannot enter the network namespace of pid 42: EPERM: Operation not permitted"
                .to_string(),
        )
    };
    let first = c.collect(&agent(&[42, 43]));
    assert_eq!(groups(&first), [(42, gap())]);
    let second = c.collect(&agent(&[43]));
    assert_eq!(groups(&second), [(42, gap())]);
    let dumps = host.kernel.calls_of(|c| matches!(c, Call::Dump(_))).len();
    assert_eq!(dumps, 1);
}

/// A pass that read no connections (a kernel without the TCP fields)
/// leaves them to the dump, which says why.
#[test]
fn a_pass_without_connections_takes_them_from_the_dump_saying_why() {
    let host = Host::new("unread");
    host.process(42, 1, 'S', 500, "a");
    let why = "this kernel's sockets have no tcp_info fields the pass reads";
    host.walks(42, &[(3, 7)], TcpPass::Unread(why.into()));
    host.dump("a", Ok(vec![conn(7, 1, PROVIDER)]));
    let ev = host.collector().collect(&agent(&[42]));
    assert_eq!(ev.collection.iterators, 1);
    assert_eq!(ev.collection.why_sock_diag, [why]);
    assert_eq!(groups(&ev), [(42, Ok(vec![7]))]);
    assert!(host.kernel.calls().contains(&Call::Dump(42)));
}

/// A socket a walked process and a procfs-read one share is listed once:
/// from the pass; the dump adds only the others.
#[test]
fn a_connection_in_a_pass_and_in_a_dump_is_listed_once() {
    let host = Host::new("shared");
    host.process(42, 1, 'S', 500, "a");
    host.walks(42, &[(3, 7)], read(&[7]));
    host.process(43, 42, 'S', 600, "a");
    host.fd(43, 3, 7);
    host.fd(43, 4, 8);
    host.walk_is(43, FakeWalk::Failed("no iterators".into()));
    host.dump("a", Ok(vec![conn(7, 1, PROVIDER), conn(8, 2, PROVIDER)]));
    let ev = host.collector().collect(&agent(&[42, 43]));
    assert_eq!(groups(&ev), [(42, Ok(vec![7])), (43, Ok(vec![8]))]);
}

/// With its budget spent, a collection stops where it is and says how far
/// it got; nothing is walked.
#[test]
fn a_spent_budget_stops_the_collection_and_says_how_far_it_got() {
    let host = Host::new("budget");
    for pid in [42, 43] {
        host.process(pid, 1, 'S', 500, "a");
        host.walks(pid, &[], read(&[]));
    }
    let mut c = host.collector();
    c.set_budget(Duration::ZERO);
    let ev = c.collect(&agent(&[42, 43]));
    assert!(ev.processes.is_empty());
    assert_eq!(
        ev.over_budget.as_deref(),
        Some(
            "agent: collection exceeded its budget of 0 ms and stopped (0 of 2 processes \
             reached): the evidence is partial"
        )
    );
    assert!(
        !host
            .kernel
            .calls()
            .iter()
            .any(|c| matches!(c, Call::Walk(_)))
    );
}

/// Past [`MAX_ZOMBIES`], a zombie is counted under its parent from its
/// `stat` alone: not walked, not read.
#[test]
fn past_the_zombie_cap_zombies_are_counted_under_their_parent_unwalked() {
    let host = Host::new("zombies");
    let all: Vec<u32> = (1000..1000 + MAX_ZOMBIES as u32 + 2).collect();
    for &pid in &all {
        host.zombie(pid, 7, 500);
        host.walks(pid, &[], read(&[]));
    }
    let ev = host.collector().collect(&agent(&all));
    assert_eq!(ev.processes.len(), MAX_ZOMBIES);
    assert_eq!(ev.unread_zombies, BTreeMap::from([(7, 2)]));
    let walks = host.kernel.calls_of(|c| matches!(c, Call::Walk(_))).len();
    assert_eq!(walks, MAX_ZOMBIES);
}

/// A full re-read (a forensic snapshot's) is procfs's even where the
/// iterators run: they are neither opened nor walked.
#[test]
fn a_full_read_is_procfs_even_where_the_iterators_run() {
    let host = Host::new("full");
    host.process(42, 1, 'S', 500, "a");
    host.walks(42, &[], read(&[]));
    let ev = host.collector().collect_with(&agent(&[42]), Detail::Full);
    assert_eq!(pids(&ev), [42]);
    assert_eq!(ev.collection.why_procfs, [FULL_IS_PROCFS]);
    assert!(host.kernel.calls().is_empty(), "{:?}", host.kernel.calls());
}

/// The helper's answers, scripted; each request recorded.
#[derive(Default)]
struct FakeHelper {
    iterate: Option<IterateResult>,
    collect: Option<CollectResult>,
    asked: Arc<Mutex<Vec<Vec<u32>>>>,
}

fn unavailable() -> crate::helper::ClientError {
    crate::helper::ClientError::Unavailable {
        path: "/run/selfheal/helper.sock".into(),
        reason: "Connection refused (os error 111)".into(),
    }
}

impl HelperReads for FakeHelper {
    fn iterate(&mut self, pids: &[u32]) -> Result<IterateResult, HelperReadError> {
        self.asked.lock().expect("lock").push(pids.to_vec());
        self.iterate
            .clone()
            .ok_or_else(|| HelperReadError::Iterate(unavailable()))
    }

    fn collect(&mut self, req: &CollectRequest) -> Result<CollectResult, HelperReadError> {
        self.asked.lock().expect("lock").push(req.pids.clone());
        self.collect
            .clone()
            .ok_or_else(|| HelperReadError::Collect(unavailable()))
    }

    fn namespaces(&mut self, _pids: &[u32]) -> Result<NamespacesResult, HelperReadError> {
        Err(HelperReadError::Namespaces(unavailable()))
    }
}

/// A collector that may not link the iterators (not root), so asks the
/// helper for its passes.
fn not_root(host: &Host) -> Collector {
    let mut c = host.collector();
    c.iterators_off = Some("not root".into());
    c
}

/// The helper's pass is of the process its authorization pinned; a pid
/// that names another process by the time its `stat` is read is gone. A
/// pid the helper refused is read by procfs here, saying why; the helper
/// is asked once for every pid.
#[test]
fn a_pid_reused_since_the_helpers_pass_is_gone_and_a_refused_one_read_here() {
    let host = Host::new("passes");
    for pid in [42, 43, 44] {
        host.process(pid, 1, 'S', 500, "a");
    }
    host.restart(42, 1, 'S', 900);
    let pass = |pid| IteratedProcess {
        pid,
        start_ticks: 500,
        pass: IterProcess {
            threads: vec![thread(pid)],
            sockets: Vec::new(),
            tcp: read(&[]),
        },
    };
    let helper = FakeHelper {
        iterate: Some(IterateResult {
            processes: vec![pass(42), pass(43)],
            gone: Vec::new(),
            refused: vec![44],
        }),
        ..FakeHelper::default()
    };
    let asked = Arc::clone(&helper.asked);
    let mut c = not_root(&host);
    c.passes_from(&mut { helper }, &[42, 43, 44]);
    let ev = c.collect(&agent(&[42, 43, 44]));
    assert_eq!(pids(&ev), [43, 44]);
    assert_eq!(ev.gone, [42]);
    assert_eq!(read_by(&ev), (1, 1), "{:?}", ev.collection);
    assert_eq!(ev.collection.iterators_from.as_deref(), Some("helper"));
    assert_eq!(
        ev.collection.why_procfs,
        ["the helper ran no task iterators on it (this user may not query it)"]
    );
    assert_eq!(*asked.lock().expect("lock"), [vec![42, 43, 44]]);
    assert!(host.kernel.calls().is_empty(), "nothing linked here");
}

/// A helper that cannot be reached leaves every process to procfs, each
/// saying why.
#[test]
fn an_unreachable_helper_leaves_every_process_to_procfs_saying_why() {
    let host = Host::new("nohelper");
    for pid in [42, 43] {
        host.process(pid, 1, 'S', 500, "a");
    }
    let mut c = not_root(&host);
    c.passes_from(&mut FakeHelper::default(), &[42, 43]);
    let ev = c.collect(&agent(&[42, 43]));
    assert_eq!(pids(&ev), [42, 43]);
    assert_eq!(ev.collection.procfs, 2);
    assert_eq!(
        ev.collection.why_procfs,
        [
            "the helper's task iterators: helper at /run/selfheal/helper.sock is unavailable: \
             Connection refused (os error 111)"
        ]
    );
}

/// Iterators turned off (`--no-iterators`) are off everywhere: the helper
/// is not asked for passes, and procfs reads each process saying so.
#[test]
fn turned_off_iterators_ask_the_helper_for_nothing() {
    let host = Host::new("off");
    host.process(42, 1, 'S', 500, "a");
    let helper = FakeHelper::default();
    let asked = Arc::clone(&helper.asked);
    let mut c = not_root(&host);
    c.without_iterators("turned off by --no-iterators");
    c.passes_from(&mut { helper }, &[42]);
    let ev = c.collect(&agent(&[42]));
    assert_eq!(pids(&ev), [42]);
    assert_eq!(ev.collection.why_procfs, ["turned off by --no-iterators"]);
    assert!(asked.lock().expect("lock").is_empty());
    assert!(host.kernel.calls().is_empty());
}

/// Whole processes read by the helper: what it read is the evidence; the
/// pid it refused is read by procfs here, saying why; the one its budget
/// did not reach is counted unread, and the collection is partial.
#[test]
fn the_helpers_collection_is_the_evidence_and_its_refusals_are_read_here() {
    let host = Host::new("through");
    for pid in [42, 43, 44] {
        host.process(pid, 1, 'S', 500, "a");
    }
    let mut p42 = crate::proc::process_in(
        &ProcRoot::at(&host.dir),
        42,
        Detail::Minimal,
        &TaskClocks::default(),
        &mut proc::MemAccess {
            reader: &mut crate::sys::memread::Reader::default(),
            deadline: std::time::Instant::now() + Duration::from_secs(5),
            over: false,
        },
    )
    .expect("fake process");
    p42.sockets = vec![(3, 7)];
    let helper = FakeHelper {
        collect: Some(CollectResult {
            processes: vec![CollectedProcess {
                pid: 42,
                start_ticks: 500,
                process: p42,
                read_by: selfheal_core::protocol::READ_BY_ITERATORS.into(),
                net_ns: Some(11),
                tcp: Some(vec![conn(7, 1, PROVIDER)]),
                tcp_error: None,
            }],
            gone: Vec::new(),
            refused: vec![43],
            over_budget: vec![44],
        }),
        ..FakeHelper::default()
    };
    let mut c = host.collector();
    c.reads_from(Box::new(helper));
    let ev = c.collect(&agent(&[42, 43, 44]));
    // The refused one is read here first.
    assert_eq!(pids(&ev), [43, 42]);
    assert_eq!(read_by(&ev), (1, 1), "{:?}", ev.collection);
    assert_eq!(
        ev.collection.why_procfs,
        ["the helper did not read it (this user may not query it)"]
    );
    assert_eq!(groups(&ev), [(42, Ok(vec![7]))]);
    assert_eq!(ev.roles.get(&7), Some(&(SocketRole::Provider, 0)));
    assert!(
        ev.over_budget
            .as_deref()
            .is_some_and(|o| o.contains("(2 of 3 processes reached)")),
        "{:?}",
        ev.over_budget
    );
    assert!(
        host.kernel.calls().is_empty(),
        "nothing read here but procfs"
    );
}

/// A helper that cannot be reached for whole processes leaves each to
/// procfs here, saying why.
#[test]
fn a_failed_collection_through_the_helper_is_read_here_saying_why() {
    let host = Host::new("throughfail");
    host.process(42, 1, 'S', 500, "a");
    let mut c = host.collector();
    c.reads_from(Box::new(FakeHelper::default()));
    let ev = c.collect(&agent(&[42]));
    assert_eq!(pids(&ev), [42]);
    assert_eq!(
        ev.collection.why_procfs,
        [
            "the helper's collection: helper at /run/selfheal/helper.sock is unavailable: \
             Connection refused (os error 111)"
        ]
    );
}

/// `[auto]` agents: the connection one made is the provider's, the one
/// another accepted (its local address listens) has none; their
/// namespace's listening addresses are read once for both.
#[test]
fn auto_agents_read_their_namespaces_listeners_once_and_accepted_connections_get_no_role() {
    let host = Host::new("auto");
    host.process(42, 1, 'S', 500, "a");
    host.process(43, 1, 'S', 600, "a");
    let made = conn(7, 40_007, "198.51.100.9:443");
    let accepted = conn(8, 8080, "198.51.100.20:51000");
    let tcp = |s: &TcpSocket| {
        TcpPass::Read(vec![IterTcp {
            netns: 1,
            socket: s.clone(),
        }])
    };
    host.walks(42, &[(3, 7)], tcp(&made));
    host.walks(43, &[(3, 8)], tcp(&accepted));
    host.kernel
        .script()
        .listening
        .insert("a".into(), vec![SocketAddr::from(([0, 0, 0, 0], 8080))]);
    let auto = |pid| {
        let mut target = agent(&[pid]);
        target.roles = Roles::Outbound;
        target.upstream_of = Box::new(|_| Some((SocketRole::Provider, 0)));
        target
    };
    let mut c = host.collector();
    let client = c.collect(&auto(42));
    assert_eq!(client.roles.get(&7), Some(&(SocketRole::Provider, 0)));
    let server = c.collect(&auto(43));
    assert!(server.roles.is_empty(), "{:?}", server.roles);
    assert!(client.unread_listening.is_empty() && server.unread_listening.is_empty());
    let listening = host.kernel.calls_of(|c| matches!(c, Call::Listening(_)));
    assert_eq!(listening, [Call::Listening(42)]);
}
