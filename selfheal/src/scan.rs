//! `selfheal scan`'s edge: reads, with no config, every process the caller
//! may read (root: the host, every network namespace; anyone else: their
//! own processes only), each one's TCP connections, and, for a process
//! holding one, what its threads wait in (light detail: the same reader as
//! `check`'s, with its bounds). As root, threads, socket fds and
//! connections come from one pass of the kernel's task iterators over the
//! host ([`host_pass`]); otherwise from procfs and each network
//! namespace's sock_diag dump, and the census says why. The census is the
//! core's ([`selfheal_core::scan::census`]).
//!
//! `scan --prove` ([`prove`]) asks each suspect's peer with a proof
//! keepalive, through the same acting side as `check`'s (the helper, or
//! this process where the kernel lets it), reads the answers from
//! sock_diag until each is in or the bound is up, and puts every socket's
//! own options back, read back and compared. It takes no other action.
//!
//! Beside the connections, each process's own trouble as `inspect` shows
//! it: its threads in D state (with their wait channel and age) and its
//! unreaped children (zombies, listed under their parent), which the core
//! turns into process findings ([`selfheal_core::scan::process_findings`]).
//!
//! Containment: what a process's threads wait in is read only when it
//! holds a TCP connection (or has a thread in D state); of the others,
//! only their threads' states. Each read has its own deadline
//! ([`PROCESS_BUDGET`], the memory reads of a poll set in a reader that
//! can be abandoned, as `check`'s), so a hostile process costs at most
//! that. A process that ends mid-scan is counted, never an error.

use std::{
    collections::{BTreeMap, HashMap},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use selfheal_core::{
    clock::ms,
    ebpf::iter::{HostPass, HostProcess, IterTcp},
    inspect::human_ms,
    keepalive::{KeepaliveSettings, ProofKeepalive},
    model::TcpState,
    proc::{Detail, ProcessInfo},
    prove::{Answer, Proof, ProofTarget},
    scan::{
        self, Connection, Coverage, Finding, Owner, ProcessState, ProofResult, ProofVerdict,
        Waiter, Zombie,
    },
    sockdiag::TcpSocket,
};

use crate::{
    actions::keepalive::KeepaliveOutcome,
    agents::ProcessTable,
    proc,
    sys::clock,
    sys::{procfs::ProcRoot, sockdiag},
};

/// How long one process's threads may take to read before the read stops
/// (its threads not yet read are left out, and the census says so).
pub const PROCESS_BUDGET: Duration = Duration::from_secs(2);

/// What one scan read.
pub struct Scan {
    pub connections: Vec<Connection>,
    /// The processes with a thread in D state or an unreaped child (the
    /// others are not kept).
    pub processes: Vec<ProcessState>,
    pub coverage: Coverage,
}

/// One network namespace's TCP sockets by inode, or why they could not be
/// dumped.
type Dump = Result<HashMap<u64, TcpSocket>, NetnsDumpError>;

/// Why a network namespace's sockets could not be dumped: the namespace,
/// the pid it was entered through, and the dump's error.
#[derive(Debug, thiserror::Error)]
#[error("network namespace {netns} (via pid {pid}): {source}")]
pub struct NetnsDumpError {
    pub netns: u64,
    pub pid: u32,
    pub source: sockdiag::SockDiagError,
}

/// Reads every process `euid` may read (all of them for root; else only
/// those whose uid is `euid`: another user's are counted, never read).
/// As root, the threads and sockets of every process come from one pass
/// of the kernel's task iterators over the host ([`host_pass`]); without
/// it (`no_iterators`, a kernel without them, or as another user), from
/// procfs and one sock_diag dump per network namespace.
pub fn scan(euid: u32, no_iterators: bool) -> Scan {
    scan_in(&ProcRoot::default(), euid, no_iterators)
}

/// [`scan`] of the processes under `root` (the iterators' pass reads the
/// running kernel: with another root, pass `no_iterators`).
fn scan_in(root: &ProcRoot, euid: u32, no_iterators: bool) -> Scan {
    // The table first: a process in it that the pass, read after, does
    // not hold ended in between.
    let table = ProcessTable::read_for_in(root, &[], euid);
    let mut coverage = Coverage::default();
    let mut pass = if euid != 0 {
        None
    } else if no_iterators {
        coverage.procfs_because = Some("disabled by --no-iterators".into());
        None
    } else {
        host_pass()
            .map_err(|why| coverage.procfs_because = Some(why))
            .ok()
    };
    let own = std::process::id();
    let mut dumps: BTreeMap<u64, Dump> = BTreeMap::new();
    let mut reader = crate::sys::memread::Reader::default();
    let clocks = proc::task_clocks();
    let mut zombies = zombies_by_parent(root, &table);
    let mut connections = Vec::new();
    let mut processes = Vec::new();
    for entry in table.entries() {
        if !entry.has_argv || entry.pid == own {
            continue;
        }
        if euid != 0 && entry.uid != Some(euid) {
            coverage.not_yours += 1;
            continue;
        }
        let pid = entry.pid;
        let unreaped = zombies.remove(&pid).unwrap_or_default();
        let mut access = proc::MemAccess {
            reader: &mut reader,
            deadline: Instant::now() + PROCESS_BUDGET,
            over: false,
        };
        let read = match &mut pass {
            Some(pass) => iterated(root, pid, pass, &unreaped, &mut dumps, &clocks, &mut access),
            None => from_procfs(root, pid, &mut dumps, &clocks, &mut access),
        };
        let (p, sockets) = match read {
            Read::Process(p, sockets) => (p, sockets),
            Read::Quiet => {
                coverage.processes += 1;
                continue;
            }
            Read::Gone => {
                coverage.gone += 1;
                continue;
            }
            Read::Unreadable => {
                coverage.unreadable += 1;
                continue;
            }
        };
        // The pid reused since the table was read: another process.
        if entry.start_ticks.is_some_and(|t| t != p.start_ticks) {
            coverage.gone += 1;
            continue;
        }
        coverage.processes += 1;
        coverage.over_budget += usize::from(access.over);
        coverage.with_gaps += usize::from(!p.gaps.is_empty());
        let owner = owner_of(&table, &p);
        if !unreaped.is_empty() || p.threads.iter().any(|t| t.state == 'D') {
            processes.push(ProcessState {
                owner: owner.clone(),
                pid_ns_init: p.pid_ns_init,
                threads: p.threads.clone(),
                zombies: unreaped,
            });
        }
        let Some(sockets) = sockets else {
            continue;
        };
        let waiters = waiters_of(&p);
        // The sockets as this read saw them (a pid reused since the fd
        // list is another process, read whole here).
        for &(fd, inode) in &p.sockets {
            let Some(socket) = sockets.get(&inode) else {
                continue;
            };
            connections.push(Connection {
                owner: owner.clone(),
                fd,
                socket: socket.clone(),
                waiters: waiters.get(&inode).cloned().unwrap_or_default(),
            });
        }
    }
    coverage.netns_errors = dumps
        .into_values()
        .filter_map(|d| d.err().map(|e| e.to_string()))
        .collect();
    Scan {
        connections,
        processes,
        coverage,
    }
}

/// What one pass of the task iterators over the host read.
pub struct Pass {
    /// Each process's threads and sockets, by pid (taken out as read).
    pub processes: BTreeMap<u32, HostProcess>,
    /// Every TCP connection, by inode.
    pub tcp: BTreeMap<u64, IterTcp>,
}

/// One pass of the task iterators over the host; or why there is none
/// (then procfs and sock_diag read instead). The iterators are this
/// build's pinned ones where a helper published them, else loaded here.
pub fn host_pass() -> Result<Pass, String> {
    use crate::ebpf::iter;
    if !iter::in_initial_pid_namespace() {
        return Err(
            "this scan runs in a pid namespace of its own, where the task iterators' pids are not procfs's"
                .into(),
        );
    }
    let mut it = match iter::open_published() {
        Ok((it, _)) => it,
        Err(pinned) => iter::load().map_err(|loaded| {
            format!("the task iterators are neither pinned ({pinned}) nor loadable ({loaded})")
        })?,
    };
    let HostPass { processes, tcp } = it
        .host()
        .map_err(|e| format!("the task iterators' pass failed: {e}"))?;
    let tcp = tcp.map_err(|why| format!("the task iterators read no TCP connection: {why}"))?;
    Ok(Pass { processes, tcp })
}

/// What was read of one process.
enum Read {
    /// The process, and its TCP connections by inode where it holds one.
    Process(ProcessInfo, Option<HashMap<u64, TcpSocket>>),
    /// Read by the pass, with nothing to look closer at: no TCP
    /// connection, no thread in D state, no zombie.
    Quiet,
    Gone,
    Unreadable,
}

/// `pid` from the host pass: its threads and sockets as the pass read
/// them (taken out of `pass`), and its connections; a SYN-SENT
/// one's retransmit timer, which the pass does not read, from its
/// namespace's dump. Only a process that holds a connection, has a
/// thread in D state or an unreaped child is read further (its `stat`,
/// `status`, and what its waits name).
fn iterated(
    root: &ProcRoot,
    pid: u32,
    pass: &mut Pass,
    unreaped: &[Zombie],
    dumps: &mut BTreeMap<u64, Dump>,
    clocks: &selfheal_core::proc::TaskClocks,
    access: &mut proc::MemAccess<'_>,
) -> Read {
    let Some(hp) = pass
        .processes
        .remove(&pid)
        .filter(|p| !p.threads.is_empty())
    else {
        return Read::Gone;
    };
    let mut sockets: HashMap<u64, TcpSocket> = HashMap::new();
    for (_, inode) in &hp.sockets {
        if let Some(t) = pass.tcp.get(inode) {
            let mut socket = t.socket.clone();
            if socket.state == TcpState::SynSent
                && let Ok(dumped) = dump_of(dumps, u64::from(t.netns), pid)
            {
                socket.timer = dumped.get(inode).and_then(|d| d.timer.clone());
            }
            sockets.insert(*inode, socket);
        }
    }
    let d_state = hp.threads.iter().any(|t| t.state_letter() == 'D');
    if sockets.is_empty() && !d_state && unreaped.is_empty() {
        return Read::Quiet;
    }
    // What its threads wait in where it holds a connection, or a closer
    // look (wait channel, age) at a thread in D state; else their states.
    let detail = if sockets.is_empty() && !d_state {
        Detail::Minimal
    } else {
        Detail::Light
    };
    match proc::process_iterated(root, pid, &hp.threads, &hp.sockets, detail, clocks, access) {
        Ok(p) => Read::Process(p, (!sockets.is_empty()).then_some(sockets)),
        Err(_) => Read::Gone,
    }
}

/// `pid` from procfs: its socket fds first (one readlink each: most
/// processes hold no TCP connection, and their threads are then read for
/// their state alone), its connections from its namespace's dump.
fn from_procfs(
    root: &ProcRoot,
    pid: u32,
    dumps: &mut BTreeMap<u64, Dump>,
    clocks: &selfheal_core::proc::TaskClocks,
    access: &mut proc::MemAccess<'_>,
) -> Read {
    let fds = match proc::socket_fds(root, pid) {
        Ok(fds) => fds,
        Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ESRCH) => return Read::Gone,
        Err(_) => return Read::Unreadable,
    };
    let sockets = if fds.is_empty() {
        None
    } else {
        let netns = match root.namespace(pid, "net") {
            Ok(ns) => ns,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Read::Gone,
            Err(_) => return Read::Unreadable,
        };
        dump_of(dumps, netns, pid).as_ref().ok().and_then(|all| {
            let mine: HashMap<u64, TcpSocket> = fds
                .iter()
                .filter_map(|(_, ino)| all.get(ino).map(|s| (*ino, s.clone())))
                .collect();
            (!mine.is_empty()).then_some(mine)
        })
    };
    // What its threads wait in where it holds a connection; else only
    // their states, and a closer look (wait channel, age) at a thread in
    // D state.
    let detail = if sockets.is_some() {
        Detail::Light
    } else {
        Detail::Minimal
    };
    let mut read = proc::process_in(root, pid, detail, clocks, access);
    if detail == Detail::Minimal
        && read
            .as_ref()
            .is_ok_and(|p| p.threads.iter().any(|t| t.state == 'D'))
    {
        read = proc::process_in(root, pid, Detail::Light, clocks, access);
    }
    match read {
        Ok(p) => Read::Process(p, sockets),
        Err(_) => Read::Gone,
    }
}

/// The zombies in `table` (processes with no command line that are no
/// kernel thread, whose `stat` says `Z`), by parent pid. Whose they are is
/// the parent's business: they are listed only under a parent the scan
/// reads.
fn zombies_by_parent(root: &ProcRoot, table: &ProcessTable) -> HashMap<u32, Vec<Zombie>> {
    let mut out: HashMap<u32, Vec<Zombie>> = HashMap::new();
    for entry in table.entries() {
        // Kernel threads: kthreadd (pid 2) and its children.
        if entry.has_argv || entry.pid <= 2 || matches!(entry.ppid, 0 | 2) {
            continue;
        }
        let Ok(stat) = root.process(entry.pid).and_then(|p| p.stat()) else {
            continue;
        };
        if stat.state == 'Z' {
            out.entry(stat.ppid.max(0) as u32)
                .or_default()
                .push(Zombie {
                    pid: entry.pid,
                    comm: stat.comm,
                });
        }
    }
    out
}

/// The TCP sockets of network namespace `netns`, dumped through `pid`'s
/// (once per namespace: later calls answer from `dumps`).
fn dump_of(dumps: &mut BTreeMap<u64, Dump>, netns: u64, pid: u32) -> &Dump {
    dumps.entry(netns).or_insert_with(|| {
        sockdiag::dump_tcp_in_netns_of(pid)
            .map(|all| all.into_iter().map(|s| (s.inode, s)).collect())
            .map_err(|source| NetnsDumpError { netns, pid, source })
    })
}

/// Who `p` is: its name, uid, and the unit, container and pod its cgroup
/// names (the runtimes are not asked).
fn owner_of(table: &ProcessTable, p: &ProcessInfo) -> Owner {
    let entry = table.get(p.pid);
    let container = entry.and_then(|e| e.containers.last());
    Owner {
        pid: p.pid,
        comm: p.name.clone(),
        uid: p.uid,
        unit: table.unit_of(p.pid).map(|u| u.unit.to_string()),
        container: container
            .map(|c| format!("{}:{}", c.runtime, selfheal_core::runtime::short_id(&c.id))),
        pod_uid: container.and_then(|c| c.pod_uid.clone()),
        start_ticks: Some(p.start_ticks),
    }
}

/// Each socket inode of `p` and the threads that wait on it: in a receive
/// on it, in a poll/select/epoll wait whose set holds it with read
/// interest, or blocked in `connect` on it.
fn waiters_of(p: &ProcessInfo) -> HashMap<u64, Vec<Waiter>> {
    let mut out: HashMap<u64, Vec<Waiter>> = HashMap::new();
    for t in &p.threads {
        if let Some(r) = &t.recv {
            out.entry(r.inode).or_default().push(Waiter {
                tid: t.tid,
                syscall: r.syscall.to_string(),
                event_loop: false,
                waited_ms: r.idle_ms,
            });
        }
        if let Some(w) = &t.wait {
            for (_, inode) in &w.sockets {
                out.entry(*inode).or_default().push(Waiter {
                    tid: t.tid,
                    syscall: w.syscall.to_string(),
                    event_loop: w.epoll_fd.is_some(),
                    waited_ms: w.idle_ms,
                });
            }
        }
        if let Some(s) = t.syscall.as_ref().filter(|s| s.nr == libc::SYS_connect)
            && let Some((_, inode)) = p
                .sockets
                .iter()
                .find(|(fd, _)| i64::from(*fd) as u64 == s.arg0)
        {
            out.entry(*inode).or_default().push(Waiter {
                tid: t.tid,
                syscall: "connect".into(),
                event_loop: false,
                waited_ms: t.idle_ms,
            });
        }
    }
    out
}

// ---- --prove ---------------------------------------------------------------

/// How often `--prove` reads its proofs' sockets.
pub const PROOF_POLL: Duration = Duration::from_millis(250);

/// Past a proof's own bound, how long `--prove` still waits for the
/// kernel's last probe to be counted (its timer's slack, and one read).
pub const PROOF_SLACK: Duration = Duration::from_secs(2);

/// The acting side `--prove` goes through: arms a proof keepalive on a
/// socket, and puts its own options back (returning them as read back);
/// `E` is why either failed, as the executor says it.
pub struct Prover<'a, E: std::fmt::Display> {
    pub arm: &'a dyn Fn(&ProofTarget, &ProofKeepalive) -> Result<KeepaliveOutcome, E>,
    pub restore: &'a dyn Fn(&ProofTarget, &KeepaliveSettings) -> Result<KeepaliveSettings, E>,
}

/// One proof in flight.
struct Asking {
    inode: u64,
    target: ProofTarget,
    proof: Proof,
}

/// Asks the peer of every suspect in `findings` with the proof keepalive
/// `ka`, through `prover`: each answer (data, an ACK of a probe) proves it
/// alive, `count` probes unanswered within the proof's bound prove it
/// dead; no answer by the bound (plus [`PROOF_SLACK`]), a connection that
/// ended, or `stop` set leaves it unproven. `waiting` is told, once every
/// proof is armed, how long the answers may take. Every armed socket gets
/// its own options back as soon as its answer is in. The results, by
/// socket inode.
pub fn prove<E: std::fmt::Display>(
    findings: &[Finding],
    ka: &ProofKeepalive,
    prover: &Prover<'_, E>,
    stop: &AtomicBool,
    waiting: impl FnOnce(Duration, usize),
) -> Vec<(u64, ProofResult)> {
    let mut results = Vec::new();
    let mut asking = Vec::new();
    for f in scan::suspects(findings) {
        let Some(start_ticks) = f.owner.start_ticks else {
            results.push((
                f.inode,
                unproven("not armed: its start time was not read".into()),
            ));
            continue;
        };
        let target = ProofTarget {
            pid: f.owner.pid,
            start_ticks,
            fd: f.fd,
            inode: f.inode,
        };
        // Before arming: an answer read after it is younger than this.
        let now = clock::boot_ms();
        match (prover.arm)(&target, ka) {
            // Armed over another prover's proof: the options read were
            // that proof's, not the socket's. Put back at once, not asked
            // twice (the other proof goes on).
            Ok(out) if ka.is_armed_as(&out.previous) => {
                let back = put_back(prover, &target, &out.previous)
                    .err()
                    .map(|why| format!("; {why}"))
                    .unwrap_or_default();
                results.push((
                    f.inode,
                    unproven(format!(
                        "not asked: another proof keepalive (a check's or another scan's) is armed on it{back}"
                    )),
                ));
            }
            Ok(out) => {
                let silent = out.silent_ms.map_or(f.silent_ms.unwrap_or(0), u64::from);
                tracing::debug!(
                    pid = target.pid,
                    fd = target.fd,
                    inode = target.inode,
                    "proof keepalive armed; its own options were {}",
                    out.previous.words()
                );
                asking.push(Asking {
                    inode: f.inode,
                    target,
                    proof: Proof::armed(&target, ka, silent, out.previous, now),
                });
            }
            Err(e) => results.push((f.inode, unproven(format!("not armed: {e}")))),
        }
    }
    let bound = asking
        .iter()
        .map(|a| a.proof.bound_ms())
        .max()
        .map(|ms| Duration::from_millis(ms) + PROOF_SLACK);
    let Some(bound) = bound else {
        return results;
    };
    waiting(bound, asking.len());
    let until = Instant::now() + bound;
    // Bounded in count as in time: the clock may not be trusted alone.
    let most = ms(bound) / ms(PROOF_POLL) + 8;
    for poll in 0..=most {
        let stopped = stop.load(Ordering::Relaxed);
        let out_of_time = stopped || poll == most || Instant::now() >= until;
        let now = clock::boot_ms();
        let seen = sockets_of(asking.iter().map(|a| a.target.pid));
        // The ages count back from the read, after `now`.
        let read = clock::boot_ms();
        let mut pending = Vec::new();
        for a in asking.drain(..) {
            // The verdict, its words, and whether the socket is still
            // there to have its options put back.
            let answer = match seen.get(&a.inode) {
                None => Some((
                    ProofVerdict::Unproven,
                    "the connection ended during the proof".to_string(),
                    false,
                )),
                Some(s) if s.state == TcpState::CloseWait => Some((
                    ProofVerdict::Alive,
                    "the peer closed the connection (its kernel answered)".to_string(),
                    true,
                )),
                Some(s) if s.state != TcpState::Established => Some((
                    ProofVerdict::Unproven,
                    format!("the connection left ESTAB ({}) during the proof", s.state),
                    true,
                )),
                Some(s) => match s.tcp_info.as_ref().map(|i| a.proof.answer(i, now, read)) {
                    Some(Answer::Data) => Some((
                        ProofVerdict::Alive,
                        "data arrived from the peer".into(),
                        true,
                    )),
                    Some(Answer::Answered) => Some((
                        ProofVerdict::Alive,
                        "the peer acknowledged a keepalive probe".into(),
                        true,
                    )),
                    Some(Answer::Dead { why }) => Some((ProofVerdict::Dead, why, true)),
                    Some(Answer::Pending) | None if out_of_time => Some((
                        ProofVerdict::Unproven,
                        if stopped {
                            "interrupted before an answer".into()
                        } else {
                            format!("no answer either way within {}", human_ms(ms(bound)))
                        },
                        true,
                    )),
                    Some(Answer::Pending) | None => None,
                },
            };
            match answer {
                Some((result, detail, there)) => {
                    let after = a.proof.armed_for(now);
                    results.push((a.inode, finish(&a, prover, result, detail, there, after)));
                }
                None => pending.push(a),
            }
        }
        asking = pending;
        if asking.is_empty() {
            break;
        }
        std::thread::sleep(PROOF_POLL);
    }
    results
}

/// A proof that was never armed: nothing to put back.
fn unproven(detail: String) -> ProofResult {
    ProofResult {
        result: ProofVerdict::Unproven,
        detail,
        after_ms: None,
        bound_ms: None,
        restored: false,
    }
}

/// Why a proof's socket was not put back as it was.
#[derive(Debug, thiserror::Error)]
enum PutBackError {
    /// Set, but read back otherwise.
    #[error("put back {previous}, but read back {back}")]
    ReadBack { previous: String, back: String },
    /// Not set.
    #[error("could not put back its own options ({previous}): {error}")]
    Failed { previous: String, error: String },
}

/// Puts `previous` back on `target`'s socket through `prover`, read back
/// and compared.
fn put_back<E: std::fmt::Display>(
    prover: &Prover<'_, E>,
    target: &ProofTarget,
    previous: &KeepaliveSettings,
) -> Result<(), PutBackError> {
    match (prover.restore)(target, previous) {
        Ok(back) if back == *previous => Ok(()),
        Ok(back) => Err(PutBackError::ReadBack {
            previous: previous.words(),
            back: back.words(),
        }),
        Err(e) => Err(PutBackError::Failed {
            previous: previous.words(),
            error: e.to_string(),
        }),
    }
}

/// Puts `a`'s socket's own options back (where the socket is `there`
/// still), and says what the proof found.
fn finish<E: std::fmt::Display>(
    a: &Asking,
    prover: &Prover<'_, E>,
    result: ProofVerdict,
    mut detail: String,
    there: bool,
    after_ms: u64,
) -> ProofResult {
    let restored = there
        && match put_back(prover, &a.target, &a.proof.previous) {
            Ok(()) => true,
            Err(why) => {
                detail.push_str(&format!("; {why}"));
                tracing::warn!(
                    pid = a.target.pid,
                    fd = a.target.fd,
                    "scan --prove: {detail}"
                );
                false
            }
        };
    ProofResult {
        result,
        detail,
        after_ms: Some(after_ms),
        bound_ms: Some(a.proof.bound_ms()),
        restored,
    }
}

/// The TCP sockets of the network namespaces of `pids`, by inode (one
/// dump per namespace; a namespace that cannot be dumped shows none).
fn sockets_of(pids: impl Iterator<Item = u32>) -> HashMap<u64, TcpSocket> {
    let root = ProcRoot::default();
    let mut dumps = BTreeMap::new();
    for pid in pids {
        if let Ok(netns) = root.namespace(pid, "net") {
            dump_of(&mut dumps, netns, pid);
        }
    }
    dumps.into_values().flatten().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proc::fixture::stat_line;

    /// A procfs tree of one process, pid 4242, its one thread in D state:
    /// its `stat` (what the process table reads) says it started at
    /// `listed`, its thread's (what the read of the process reads) at
    /// `read`.
    struct Tree(std::path::PathBuf);

    impl Tree {
        fn new(name: &str, listed: u64, read: u64) -> Tree {
            let dir =
                std::env::temp_dir().join(format!("selfheal-scan-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            let p = dir.join("4242");
            for d in ["task/4242", "fd", "ns"] {
                std::fs::create_dir_all(p.join(d)).expect("fixture dir");
            }
            let write = |path: &str, text: &str| {
                std::fs::write(p.join(path), text).expect("fixture file");
            };
            write("stat", &stat_line(4242, "agent", 'D', 1, listed));
            write("task/4242/stat", &stat_line(4242, "agent", 'D', 1, read));
            write("status", "Name:\tagent\nUid:\t0\t0\t0\t0\nNSpid:\t4242\n");
            Tree(dir)
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A pid reused between the process table's read and the read of its
    /// threads (another start time) is another process: counted as ended,
    /// its threads listed under no process. The same start time both
    /// times: its D-state thread is listed.
    #[test]
    fn a_pid_reused_after_the_table_was_read_is_counted_as_ended() {
        let reused = Tree::new("reused", 100, 200);
        let s = scan_in(&ProcRoot::at(&reused.0), 0, true);
        assert!(s.processes.is_empty(), "{:?}", s.processes.len());
        assert_eq!((s.coverage.processes, s.coverage.gone), (0, 1));
        let same = Tree::new("same", 100, 100);
        let s = scan_in(&ProcRoot::at(&same.0), 0, true);
        let pids: Vec<u32> = s.processes.iter().map(|p| p.owner.pid).collect();
        assert_eq!(pids, [4242]);
        assert_eq!((s.coverage.processes, s.coverage.gone), (1, 0));
        assert_eq!(
            s.coverage.procfs_because.as_deref(),
            Some("disabled by --no-iterators")
        );
    }

    /// A socket not put back as it was reads as words added to the proof's
    /// detail, naming what was set and what came back.
    #[test]
    fn a_socket_not_put_back_says_what_was_set_and_what_came_back() {
        let e = PutBackError::ReadBack {
            previous: "keepalive off".into(),
            back: "keepalive on".into(),
        };
        assert_eq!(
            e.to_string(),
            "put back keepalive off, but read back keepalive on"
        );
        let e = PutBackError::Failed {
            previous: "keepalive off".into(),
            error: "pid 42 is gone".into(),
        };
        assert_eq!(
            e.to_string(),
            "could not put back its own options (keepalive off): pid 42 is gone"
        );
    }
}
