//! The `inspect` report for one agent (or one process and its descendants):
//! a tree of processes → threads (state, wchan, kernel stack, the receive
//! each is blocked in and for how long, from eBPF or procfs and which, or
//! the poll/select/epoll wait it sits in and on which sockets) and
//! sockets (role, addresses, tcp_info ages, timer, eBPF activity), zombies
//! and the missing-init diagnosis, the eBPF strategy or why there is none,
//! and what could not be read.
//!
//! Collecting is the I/O edge (`selfheal::inspect`); [`build`] is a pure
//! join of what it gathered; [`render`] is the text for a person at a
//! terminal.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{
    ebpf::{self, Attempt, BlockedRecv, SocketActivity, Strategy, TracerSnapshot},
    model::{Gap, GapKind, RecvSource, SocketRole, TcpState},
    proc::ProcessInfo,
    sockdiag::{TcpInfo, TcpSocket, TimerInfo},
};

/// Everything `inspect` shows.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub agent: Option<String>,
    pub rule: String,
    pub roots: Vec<u32>,
    pub upstreams: Vec<String>,
    /// The containers the agent's processes are in: runtime, id, name,
    /// image, pod, namespace (absent on the host).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<crate::runtime::Identity>,
    pub processes: Vec<ProcessReport>,
    pub sockets: Vec<SocketReport>,
    pub zombies: Vec<Zombie>,
    pub init: InitDiagnosis,
    pub ebpf: EbpfStatus,
    /// What could not be seen, in words (with its kind).
    pub gaps: Vec<Gap>,
    /// What the report leaves out past its caps ([`MAX_PROCESSES`] …),
    /// counted; absent when nothing is.
    #[serde(skip_serializing_if = "LeftOut::is_empty")]
    pub left_out: LeftOut,
}

/// The most processes (zombies apart) an agent's report holds; the
/// collector reads no more than these ([`Evidence::unread_processes`]).
pub const MAX_PROCESSES: usize = 512;
/// The most zombies an agent's report lists (all are counted).
pub const MAX_ZOMBIES: usize = 256;
/// The most threads an agent's report holds, over all its processes:
/// threads in a receive or a wait on sockets, or with an anomaly, first.
pub const MAX_THREADS: usize = 1024;
/// The most TCP sockets an agent's report holds: upstream sockets first,
/// then those a thread waits on, then the rest in order. A thread's
/// `wait_inodes` and a process's `sockets` name only sockets kept.
pub const MAX_SOCKETS: usize = 1024;
/// The most gaps of one kind a report lists (the rest are summed up).
pub const MAX_GAPS_PER_KIND: usize = 32;

/// What an agent's report left out past its caps: how many of each.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LeftOut {
    pub processes: usize,
    pub threads: usize,
    pub sockets: usize,
    pub zombies: usize,
    /// Gaps summed up rather than listed.
    pub gaps: usize,
}

impl LeftOut {
    pub fn is_empty(&self) -> bool {
        *self == LeftOut::default()
    }
}

/// One process of the agent.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessReport {
    pub pid: u32,
    pub ppid: u32,
    pub name: String,
    pub state: char,
    /// Start time in clock ticks after boot (the process's identity).
    pub start_ticks: Option<u64>,
    pub uid: Option<u32>,
    /// PID 1 of its own pid namespace.
    pub pid_ns_init: bool,
    pub threads: Vec<ThreadReport>,
    /// Inodes of its TCP sockets (details in the report's `sockets`).
    pub sockets: Vec<u64>,
}

/// One thread.
#[derive(Clone, Debug, Serialize)]
pub struct ThreadReport {
    pub tid: u32,
    pub name: String,
    pub state: char,
    pub wchan: Option<String>,
    pub cpu_ticks: u64,
    /// The syscall it is blocked in, by name (or number).
    pub syscall: Option<String>,
    /// Milliseconds since it last ran.
    pub idle_ms: Option<u64>,
    /// Top kernel stack frames (root only).
    pub kstack: Vec<String>,
    /// How long it has been blocked in a receive on a TCP socket, or `None`.
    pub recv_blocked_ms: Option<u64>,
    pub recv_inode: Option<u64>,
    pub recv_syscall: Option<String>,
    /// `ebpf` (timed from the receive's start) or `procfs` (timed from when
    /// the thread last ran).
    pub recv_source: Option<RecvSource>,
    /// The readiness wait it sits in (poll, select, epoll_*) when its set
    /// includes sockets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_syscall: Option<String>,
    /// The sockets (inodes) that wait covers with read interest.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub wait_inodes: Vec<u64>,
    /// Whether that wait is an event loop's (epoll): its sockets are
    /// registered, not necessarily awaited.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub wait_event_loop: bool,
    pub anomalies: Vec<String>,
}

/// One TCP socket of the agent.
#[derive(Clone, Debug, Serialize)]
pub struct SocketReport {
    /// The process holding it (the first, if several share it).
    pub pid: u32,
    /// Its file descriptor in that process.
    pub fd: Option<i32>,
    pub inode: u64,
    pub cookie: u64,
    pub local: String,
    pub remote: String,
    pub state: TcpState,
    pub role: SocketRole,
    /// Index of the matching upstream in the agent's config.
    pub upstream: Option<usize>,
    pub timer: Option<TimerInfo>,
    pub tcp_info: Option<TcpInfo>,
    /// Receive/send activity from eBPF since the process was watched.
    pub ebpf: Option<SocketActivity>,
    pub anomalies: Vec<String>,
}

/// A zombie in the agent's tree.
#[derive(Clone, Debug, Serialize)]
pub struct Zombie {
    pub pid: u32,
    pub ppid: u32,
    pub name: String,
}

/// Whether the agent's root is an init that does not reap.
#[derive(Clone, Debug, Serialize)]
pub struct InitDiagnosis {
    /// A root process is PID 1 of its pid namespace.
    pub root_is_pid1: bool,
    /// The agent's process that is PID 1 of its pid namespace, if any (the
    /// one that inherits orphans and must reap them).
    pub pid1: Option<u32>,
    pub zombies: usize,
    /// Set when zombies pile up under a PID 1 that is not an init.
    pub diagnosis: Option<String>,
}

/// The tracer, as far as this report is concerned.
#[derive(Clone, Debug, Serialize)]
pub struct EbpfStatus {
    pub built_in: bool,
    /// The strategy that attached, or `None`.
    pub strategy: Option<Strategy>,
    /// Every strategy tried, in order, with why it failed.
    pub attempts: Vec<Attempt>,
    /// Why there is no tracer at all, if there is none.
    pub error: Option<String>,
    /// How long the processes had been watched when the snapshot was taken.
    pub watched_ms: Option<u64>,
    /// Events the tracer could not record (full maps, unreadable pointers).
    pub overflow: Option<ebpf::Overflow>,
}

/// Evidence gathered for a target.
pub struct Evidence {
    pub agent: Option<String>,
    pub rule: String,
    pub roots: Vec<u32>,
    pub problem: Option<String>,
    pub upstreams: Vec<String>,
    pub containers: Vec<crate::runtime::Identity>,
    pub container_gaps: Vec<String>,
    pub processes: Vec<ProcessInfo>,
    /// Processes that vanished before they could be read.
    pub gone: Vec<u32>,
    /// Set when the collection ran past its time budget and stopped: the
    /// gap's words. The evidence is then partial (processes or threads
    /// left unread) and is not to be judged as if it were whole.
    pub over_budget: Option<String>,
    /// Processes (not zombies) past [`MAX_PROCESSES`], not read.
    pub unread_processes: usize,
    /// Zombies past [`MAX_ZOMBIES`], not read but counted: how many under
    /// each parent pid.
    pub unread_zombies: BTreeMap<u32, usize>,
    /// TCP sockets per network namespace the processes live in, with the
    /// pid the dump was made through.
    pub tcp: Vec<NetnsSockets>,
    /// Role and upstream index of each socket by inode.
    pub roles: BTreeMap<u64, (SocketRole, usize)>,
    pub ebpf: EbpfEvidence,
}

/// The tracer's side of the evidence.
pub struct EbpfEvidence {
    /// Whether the binary carries the eBPF object.
    pub built_in: bool,
    pub attempts: Vec<Attempt>,
    pub error: Option<String>,
    pub watched_since_ns: Option<u64>,
    pub snapshot: Option<TracerSnapshot>,
}

/// The TCP sockets of one network namespace, and the pid whose namespace it
/// is; or why they could not be read.
pub type NetnsSockets = (u32, Result<Vec<TcpSocket>, String>);

/// A receive blocked longer than this is marked in the report.
const LONG_RECV_MS: u64 = 60_000;
/// A connection silent longer than this is marked.
const SILENT_MS: u32 = 300_000;

/// Joins the evidence into the report: what could not be seen, the agent's
/// TCP sockets (`AgentSockets`), each process's threads
/// (`thread_report`) with the receive or wait each sits in, the tracer's
/// own gaps, the sockets with their roles, and the init diagnosis.
pub fn build(ev: &Evidence) -> Report {
    let mut gaps = evidence_gaps(ev);
    let sockets = AgentSockets::of(ev, &mut gaps);
    let snapshot = ev.ebpf.snapshot.as_ref();
    let blocked: BTreeMap<u32, &BlockedRecv> = snapshot
        .map(|s| {
            s.blocked
                .iter()
                .filter(|b| b.tcp_checked || b.inode.is_some_and(|i| sockets.is_tcp(i)))
                .map(|b| (b.tid, b))
                .collect()
        })
        .unwrap_or_default();

    let mut unseen_by_ebpf = 0;
    let mut processes = Vec::new();
    let mut zombies = Vec::new();
    for p in &ev.processes {
        if p.state == 'Z' {
            zombies.push(Zombie {
                pid: p.pid,
                ppid: p.ppid,
                name: p.name.clone(),
            });
        }
        let threads = p
            .threads
            .iter()
            .map(|t| {
                let (r, unseen) = thread_report(t, blocked.get(&t.tid).copied(), &sockets);
                unseen_by_ebpf += usize::from(unseen && snapshot.is_some());
                r
            })
            .collect();
        processes.push(ProcessReport {
            pid: p.pid,
            start_ticks: Some(p.start_ticks),
            ppid: p.ppid,
            name: p.name.clone(),
            state: p.state,
            uid: p.uid,
            pid_ns_init: p.pid_ns_init,
            threads,
            sockets: p
                .sockets
                .iter()
                .map(|(_, ino)| *ino)
                .filter(|ino| sockets.tcp.contains_key(ino))
                .collect(),
        });
    }
    gaps.extend(ebpf_gaps(ev, unseen_by_ebpf));
    let socket_reports = sockets.reports(ev);
    let init = init_diagnosis(ev, &zombies);

    let mut report = Report {
        agent: ev.agent.clone(),
        rule: ev.rule.clone(),
        roots: ev.roots.clone(),
        upstreams: ev.upstreams.clone(),
        containers: ev.containers.clone(),
        processes,
        sockets: socket_reports,
        init,
        zombies,
        ebpf: EbpfStatus {
            built_in: ev.ebpf.built_in,
            strategy: snapshot.map(|s| s.strategy),
            attempts: ev.ebpf.attempts.clone(),
            error: ev.ebpf.error.clone(),
            watched_ms: snapshot
                .zip(ev.ebpf.watched_since_ns)
                .map(|(s, since)| crate::clock::age_ms(s.taken_at_ns, since)),
            overflow: snapshot.map(|s| s.overflow),
        },
        gaps,
        left_out: LeftOut {
            processes: ev.unread_processes,
            zombies: ev.unread_zombies.values().sum(),
            ..LeftOut::default()
        },
    };
    cap(&mut report);
    report
}

/// Holds `r` to the caps ([`MAX_ZOMBIES`], [`MAX_THREADS`],
/// [`MAX_SOCKETS`], [`MAX_GAPS_PER_KIND`]; processes are capped where they
/// are read), keeping what the judge and a person look at first, and
/// counts what it left out in `r.left_out`, with a gap that says so.
fn cap(r: &mut Report) {
    if r.zombies.len() > MAX_ZOMBIES {
        r.left_out.zombies += r.zombies.len() - MAX_ZOMBIES;
        r.zombies.truncate(MAX_ZOMBIES);
    }

    // Threads: the ones in a receive, a wait or with an anomaly first.
    let total: usize = r.processes.iter().map(|p| p.threads.len()).sum();
    if total > MAX_THREADS {
        let notable = |t: &ThreadReport| {
            t.recv_inode.is_some() || t.wait_syscall.is_some() || !t.anomalies.is_empty()
        };
        let mut budget = MAX_THREADS;
        let mut keep_notable: Vec<Vec<bool>> = Vec::with_capacity(r.processes.len());
        for p in &r.processes {
            keep_notable.push(
                p.threads
                    .iter()
                    .map(|t| {
                        let k = notable(t) && budget > 0;
                        budget -= usize::from(k);
                        k
                    })
                    .collect(),
            );
        }
        for (p, notable_kept) in r.processes.iter_mut().zip(keep_notable) {
            let mut kept = notable_kept.into_iter();
            p.threads.retain(|t| {
                let noted = kept.next().unwrap_or(false);
                let filler = !noted && !notable(t) && budget > 0;
                budget -= usize::from(filler);
                noted || filler
            });
        }
        r.left_out.threads = total - MAX_THREADS;
    }

    // Sockets: upstreams, then those a kept thread waits on, then the rest.
    if r.sockets.len() > MAX_SOCKETS {
        let waited: std::collections::BTreeSet<u64> = r
            .processes
            .iter()
            .flat_map(|p| &p.threads)
            .flat_map(|t| t.recv_inode.iter().chain(&t.wait_inodes))
            .copied()
            .collect();
        let rank = |s: &SocketReport| {
            if s.role != SocketRole::Other {
                0
            } else if waited.contains(&s.inode) {
                1
            } else {
                2
            }
        };
        let mut order: Vec<(u8, usize)> = r
            .sockets
            .iter()
            .enumerate()
            .map(|(i, s)| (rank(s), i))
            .collect();
        order.sort_unstable();
        let mut keep = vec![false; r.sockets.len()];
        for (_, i) in order.into_iter().take(MAX_SOCKETS) {
            keep[i] = true;
        }
        let mut keep = keep.into_iter();
        r.left_out.sockets = r.sockets.len() - MAX_SOCKETS;
        r.sockets.retain(|_| keep.next().unwrap_or(false));
        let kept: std::collections::BTreeSet<u64> = r.sockets.iter().map(|s| s.inode).collect();
        for p in &mut r.processes {
            p.sockets.retain(|i| kept.contains(i));
            for t in &mut p.threads {
                t.wait_inodes.retain(|i| kept.contains(i));
            }
        }
    }

    // Gaps: a few of each kind, then how many more.
    let mut per_kind: BTreeMap<String, usize> = BTreeMap::new();
    let mut summed: BTreeMap<String, (GapKind, usize)> = BTreeMap::new();
    r.gaps.retain(|g| {
        let key = format!("{:?}", g.kind);
        let n = per_kind.entry(key.clone()).or_default();
        *n += 1;
        if *n > MAX_GAPS_PER_KIND {
            summed.entry(key).or_insert((g.kind, 0)).1 += 1;
            false
        } else {
            true
        }
    });
    for (_, (kind, n)) in summed {
        r.left_out.gaps += n;
        r.gaps
            .push(Gap::new(kind, format!("… and {n} more like these")));
    }

    let l = &r.left_out;
    if !l.is_empty() {
        r.gaps.push(Gap::new(
            GapKind::LeftOut,
            format!(
                "the report is capped: left out {} process(es), {} zombie(s) (all counted in \
                 init.zombies), {} thread(s), {} socket(s), {} gap(s)",
                l.processes, l.zombies, l.threads, l.sockets, l.gaps
            ),
        ));
    }
}

/// What the collectors could not see: no process matched, processes that
/// exited, what the runtimes and procfs could not tell.
fn evidence_gaps(ev: &Evidence) -> Vec<Gap> {
    let mut gaps: Vec<Gap> = Vec::new();
    if let Some(p) = &ev.problem {
        gaps.push(Gap::new(
            GapKind::NoProcess,
            format!("no process matched: {p}"),
        ));
    }
    if let Some(why) = &ev.over_budget {
        gaps.push(Gap::new(GapKind::Budget, why.clone()));
    }
    for pid in &ev.gone {
        gaps.push(Gap::new(
            GapKind::Vanished,
            format!("pid {pid} exited before it could be read"),
        ));
    }
    gaps.extend(
        ev.container_gaps
            .iter()
            .map(|g| Gap::new(GapKind::Container, g.clone())),
    );
    for p in &ev.processes {
        gaps.extend(p.gaps.iter().map(|g| Gap::new(GapKind::Process, g.clone())));
    }
    gaps
}

/// The agent's TCP sockets: the dumps, restricted to inodes its processes
/// hold, with the holder of each.
struct AgentSockets<'e> {
    /// inode → (pid, fd) of the first process holding it.
    owner: BTreeMap<u64, (u32, i32)>,
    tcp: BTreeMap<u64, &'e TcpSocket>,
    /// Every namespace's table was read (else any socket may be TCP).
    complete: bool,
}

impl<'e> AgentSockets<'e> {
    fn of(ev: &'e Evidence, gaps: &mut Vec<Gap>) -> Self {
        let owner: BTreeMap<u64, (u32, i32)> = ev
            .processes
            .iter()
            .rev()
            .flat_map(|p| p.sockets.iter().map(move |(fd, ino)| (*ino, (p.pid, *fd))))
            .collect();
        let mut tcp: BTreeMap<u64, &TcpSocket> = BTreeMap::new();
        let mut complete = true;
        for (pid, dump) in &ev.tcp {
            match dump {
                Ok(all) => tcp.extend(
                    all.iter()
                        .filter(|s| owner.contains_key(&s.inode))
                        .map(|s| (s.inode, s)),
                ),
                Err(e) => {
                    complete = false;
                    gaps.push(Gap::new(
                        GapKind::Sockets,
                        format!("TCP sockets of pid {pid}'s network namespace unavailable: {e}"),
                    ));
                }
            }
        }
        AgentSockets {
            owner,
            tcp,
            complete,
        }
    }

    /// Whether `inode` is (or, with a table unread, may be) a TCP socket.
    fn is_tcp(&self, inode: u64) -> bool {
        self.tcp.contains_key(&inode) || !self.complete
    }

    /// The sockets as the report shows them: role, holder, `tcp_info`, the
    /// tracer's activity, anomalies.
    fn reports(&self, ev: &Evidence) -> Vec<SocketReport> {
        let activity: BTreeMap<u64, &SocketActivity> = ev
            .ebpf
            .snapshot
            .as_ref()
            .map(|s| s.sockets.iter().map(|a| (a.inode, a)).collect())
            .unwrap_or_default();
        self.tcp
            .values()
            .map(|s| {
                let upstream = ev.roles.get(&s.inode).copied();
                SocketReport {
                    role: upstream.map_or(SocketRole::Other, |(role, _)| role),
                    upstream: upstream.map(|(_, i)| i),
                    pid: self.owner.get(&s.inode).map_or(0, |(pid, _)| *pid),
                    fd: self.owner.get(&s.inode).map(|(_, fd)| *fd),
                    inode: s.inode,
                    cookie: s.cookie,
                    local: s.local.to_string(),
                    remote: s.remote.to_string(),
                    state: s.state,
                    timer: s.timer.clone(),
                    tcp_info: s.tcp_info.clone(),
                    ebpf: activity.get(&s.inode).map(|a| (*a).clone()),
                    anomalies: socket_anomalies(s),
                }
            })
            .collect()
    }
}

/// One thread as the report shows it: the receive it is blocked in (timed
/// by the tracer's `blocked`, else from procfs), or the readiness wait on
/// TCP sockets it sits in. The flag is set when the receive came from
/// procfs alone (the tracer, if any, did not see it begin).
fn thread_report(
    t: &crate::proc::ThreadInfo,
    blocked: Option<&BlockedRecv>,
    sockets: &AgentSockets<'_>,
) -> (ThreadReport, bool) {
    let mut r = ThreadReport {
        tid: t.tid,
        name: t.name.clone(),
        state: t.state,
        wchan: t.wchan.clone(),
        cpu_ticks: t.cpu_ticks,
        syscall: t.syscall.as_ref().map(|s| {
            s.name
                .map_or_else(|| format!("syscall {}", s.nr), String::from)
        }),
        idle_ms: t.idle_ms,
        kstack: t.kstack.clone(),
        recv_blocked_ms: None,
        recv_inode: None,
        recv_syscall: None,
        recv_source: None,
        wait_syscall: None,
        wait_inodes: Vec::new(),
        wait_event_loop: false,
        anomalies: Vec::new(),
    };
    // The TCP sockets of a readiness wait (as for receives).
    if let Some(w) = &t.wait {
        let inodes: Vec<u64> = w
            .sockets
            .iter()
            .map(|(_, ino)| *ino)
            .filter(|ino| sockets.is_tcp(*ino))
            .collect();
        if !inodes.is_empty() {
            r.wait_syscall = Some(w.syscall.to_string());
            r.wait_inodes = inodes;
            r.wait_event_loop = w.epoll_fd.is_some();
        }
    }
    let mut from_procfs = false;
    if let Some(b) = blocked {
        r.recv_blocked_ms = Some(b.age_ms);
        r.recv_inode = b.inode;
        r.recv_syscall = Some(b.syscall.unwrap_or("tcp_recvmsg").to_string());
        r.recv_source = Some(RecvSource::Ebpf);
    } else if let Some(pr) = t.recv.as_ref().filter(|pr| sockets.is_tcp(pr.inode)) {
        r.recv_blocked_ms = pr.idle_ms;
        r.recv_inode = Some(pr.inode);
        r.recv_syscall = Some(pr.syscall.to_string());
        r.recv_source = Some(RecvSource::Procfs);
        from_procfs = true;
    }
    if t.state == 'D' {
        r.anomalies.push("uninterruptible sleep (D)".into());
    }
    if r.recv_blocked_ms.is_some_and(|ms| ms >= LONG_RECV_MS) {
        r.anomalies.push(format!(
            "blocked in a receive for {}",
            human_ms(r.recv_blocked_ms.unwrap_or(0))
        ));
    }
    (r, from_procfs)
}

/// What the tracer could not see: receives that began before it watched,
/// no tracer at all, lost events, evidence the helper refused.
fn ebpf_gaps(ev: &Evidence, unseen_by_ebpf: usize) -> Vec<Gap> {
    let snapshot = ev.ebpf.snapshot.as_ref();
    let mut gaps = Vec::new();
    let ebpf_gap = |text: String| Gap::new(GapKind::Ebpf, text);
    if unseen_by_ebpf > 0 {
        gaps.push(ebpf_gap(format!(
            "{unseen_by_ebpf} receive(s) began before the tracer watched: eBPF cannot see them; \
             timed from procfs (when the thread last ran) instead"
        )));
    }
    if snapshot.is_none() {
        gaps.push(ebpf_gap(match &ev.ebpf.error {
            Some(e) => format!("no eBPF evidence ({e}); receives timed from procfs only"),
            None => "no eBPF evidence; receives timed from procfs only".into(),
        }));
    }
    if let Some(line) = snapshot.and_then(|s| s.overflow.describe()) {
        gaps.push(ebpf_gap(line));
    }
    if let Some(s) = snapshot.filter(|s| !s.refused.is_empty()) {
        gaps.push(ebpf_gap(format!(
            "the helper refused the eBPF evidence of pid(s) {:?} (not this user's, or not \
             running): theirs is from procfs only",
            s.refused
        )));
    }
    gaps
}

/// Whether the agent's PID 1 (of its pid namespace) leaves zombies unreaped.
fn init_diagnosis(ev: &Evidence, zombies: &[Zombie]) -> InitDiagnosis {
    let root_is_pid1 = ev
        .processes
        .iter()
        .any(|p| ev.roots.contains(&p.pid) && p.pid_ns_init);
    let pid1 = ev
        .processes
        .iter()
        .find(|p| p.pid_ns_init && p.state != 'Z')
        .map(|p| p.pid);
    let unreaped = pid1.map_or(0, |init| {
        zombies.iter().filter(|z| z.ppid == init).count()
            + ev.unread_zombies.get(&init).copied().unwrap_or(0)
    });
    let diagnosis = (unreaped > 0).then(|| {
        format!(
            "{unreaped} zombie(s) under pid {} (PID 1 of its pid namespace), which does not reap: \
             run the agent under an init (tini, `docker run --init`, `init: true`)",
            pid1.unwrap_or(0)
        )
    });
    InitDiagnosis {
        root_is_pid1,
        pid1,
        zombies: zombies.len() + ev.unread_zombies.values().sum::<usize>(),
        diagnosis,
    }
}

/// What looks wrong with a socket, as a person would say it.
fn socket_anomalies(s: &TcpSocket) -> Vec<String> {
    let mut a = Vec::new();
    if s.state == TcpState::CloseWait {
        a.push("peer closed; the application has not".into());
    }
    if let Some(i) = &s.tcp_info {
        if i.probes > 0 {
            a.push(format!("{} keepalive/window probe(s) unanswered", i.probes));
        }
        if i.backoff > 0 {
            a.push(format!("retransmission backoff {}", i.backoff));
        }
        if i.unacked > 0 && i.last_ack_recv_ms > i.rto_us / 1000 {
            a.push(format!(
                "{} segment(s) unacknowledged for {}",
                i.unacked,
                human_ms(u64::from(i.last_ack_recv_ms))
            ));
        }
        if i.last_data_recv_ms >= SILENT_MS && i.last_ack_recv_ms >= SILENT_MS {
            a.push(format!(
                "silent for {}",
                human_ms(u64::from(i.last_data_recv_ms.min(i.last_ack_recv_ms)))
            ));
        }
    }
    a
}

/// Milliseconds as people read them: `850ms`, `3.2s`, `12m05s`, `4h31m`, `2d3h`.
pub fn human_ms(ms: u64) -> String {
    let s = ms / 1000;
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{}.{}s", s, (ms % 1000) / 100),
        60_000..3_600_000 => format!("{}m{:02}s", s / 60, s % 60),
        3_600_000..86_400_000 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// A thread's readiness wait, in words: `waits in poll on socket inode 1234
/// (fd 5, provider) for 3.2s`, or `event loop waits in epoll_wait on 3
/// sockets (inodes 1, 2, 3) for 3.2s`. Only static names and numbers.
fn wait_line(t: &ThreadReport, pid: u32, sockets: &BTreeMap<u64, &SocketReport>) -> String {
    let sc = t.wait_syscall.as_deref().unwrap_or("?");
    let what = if t.wait_event_loop {
        format!("event loop waits in {sc}")
    } else {
        format!("waits in {sc}")
    };
    let on = match t.wait_inodes.as_slice() {
        [inode] => {
            let s = sockets.get(inode);
            let fd = s
                .filter(|s| s.pid == pid)
                .and_then(|s| s.fd)
                .map(|fd| format!("fd {fd}"));
            let about: Vec<String> = fd
                .into_iter()
                .chain(s.map(|s| s.role.to_string()))
                .collect();
            if about.is_empty() {
                format!("socket inode {inode}")
            } else {
                format!("socket inode {inode} ({})", about.join(", "))
            }
        }
        many => {
            let shown: Vec<String> = many.iter().take(8).map(u64::to_string).collect();
            let more = if many.len() > 8 { ", …" } else { "" };
            format!("{} sockets (inodes {}{more})", many.len(), shown.join(", "))
        }
    };
    match t.idle_ms {
        Some(ms) => format!("{what} on {on} for {}", human_ms(ms)),
        None => format!("{what} on {on}"),
    }
}

pub use crate::text::escape;
use crate::text::escape_lines;

/// The report for a person at a terminal: a tree, anomalies marked `!`.
pub fn render(r: &Report) -> String {
    escape_lines(&render_raw(r))
}

fn render_raw(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let title = match &r.agent {
        Some(name) => format!("agent {} ({})", escape(name), escape(&r.rule)),
        None => format!("process tree of {}", escape(&r.rule)),
    };
    let _ = writeln!(
        o,
        "{title}: {} process(es), {} zombie(s)",
        r.processes.len(),
        r.zombies.len()
    );
    for u in &r.upstreams {
        let _ = writeln!(o, "  upstream {}", escape(u));
    }
    // Container identity: `describe` escapes what a runtime said.
    for c in &r.containers {
        let _ = writeln!(o, "  container {}", c.describe());
    }
    let sockets: BTreeMap<u64, &SocketReport> = r.sockets.iter().map(|s| (s.inode, s)).collect();
    let live: Vec<&ProcessReport> = r.processes.iter().filter(|p| p.state != 'Z').collect();
    for (i, p) in live.iter().enumerate() {
        let last = i + 1 == live.len() && r.zombies.is_empty();
        let (branch, indent) = if last {
            ("└─", "   ")
        } else {
            ("├─", "│  ")
        };
        let init = if p.pid_ns_init {
            ", PID 1 of its pid namespace"
        } else {
            ""
        };
        let _ = writeln!(
            o,
            "{branch} pid {} {} [{}] (parent {}{init})",
            p.pid,
            escape(&p.name),
            p.state,
            p.ppid
        );
        for t in &p.threads {
            let mark = if t.anomalies.is_empty() { ' ' } else { '!' };
            let what = match (t.recv_blocked_ms, t.recv_inode) {
                (Some(ms), inode) => format!(
                    "blocked {} in {} on socket {}{} [{}]",
                    human_ms(ms),
                    t.recv_syscall.as_deref().unwrap_or("?"),
                    inode.map_or("?".into(), |i| i.to_string()),
                    inode
                        .and_then(|i| sockets.get(&i))
                        .map_or(String::new(), |s| format!(" ({})", s.role)),
                    t.recv_source.map_or("?", |s| s.as_str())
                ),
                _ if t.wait_syscall.is_some() => wait_line(t, p.pid, &sockets),
                _ => match (&t.syscall, t.idle_ms) {
                    (Some(sc), Some(ms)) => format!("in {sc} for {}", human_ms(ms)),
                    (Some(sc), None) => format!("in {sc}"),
                    (None, _) => "running".into(),
                },
            };
            let _ = writeln!(
                o,
                "{indent}{mark} thread {:>7} {:<15} {} {:<18} {what}",
                t.tid,
                escape(&t.name),
                t.state,
                t.wchan.as_deref().unwrap_or("-")
            );
            if !t.kstack.is_empty() {
                let _ = writeln!(o, "{indent}    kernel: {}", t.kstack.join(" < "));
            }
        }
        for inode in &p.sockets {
            let Some(s) = sockets.get(inode) else {
                continue;
            };
            let mark = if s.anomalies.is_empty() { ' ' } else { '!' };
            let _ = writeln!(
                o,
                "{indent}{mark} socket {} {:<8} {} -> {} {}",
                s.inode, s.role, s.local, s.remote, s.state
            );
            if let Some(t) = &s.tcp_info {
                let keepalive = match &s.timer {
                    Some(timer) if timer.kind == "keepalive" => "keepalive on".to_string(),
                    Some(timer) => {
                        format!("{} timer in {}", timer.kind, human_ms(timer.expires_ms))
                    }
                    None => "no timer".to_string(),
                };
                let _ = writeln!(
                    o,
                    "{indent}    data in {} ago, out {} ago, ack {} ago; unacked {}, retrans {}, probes {}; {keepalive}",
                    human_ms(u64::from(t.last_data_recv_ms)),
                    human_ms(u64::from(t.last_data_sent_ms)),
                    human_ms(u64::from(t.last_ack_recv_ms)),
                    t.unacked,
                    t.retransmits,
                    t.probes
                );
            }
            if let Some(a) = &s.ebpf {
                let age = |v: Option<u64>| {
                    v.map_or("never".to_string(), |ms| format!("{} ago", human_ms(ms)))
                };
                let _ = writeln!(
                    o,
                    "{indent}    eBPF: app read {} ({} B), wrote {} ({} B); reads {} with data, {} empty",
                    age(a.last_recv_ms),
                    a.last_recv_bytes,
                    age(a.last_send_ms),
                    a.last_send_bytes,
                    a.recv_data,
                    a.recv_empty
                );
            }
            for an in &s.anomalies {
                let _ = writeln!(o, "{indent}    ! {an}");
            }
        }
    }
    if !r.zombies.is_empty() {
        let pids: Vec<String> = r
            .zombies
            .iter()
            .take(8)
            .map(|z| z.pid.to_string())
            .collect();
        let more = if r.zombies.len() > 8 { ", …" } else { "" };
        let _ = writeln!(
            o,
            "└─ ! zombies: {} (pids {}{more})",
            r.zombies.len(),
            pids.join(", ")
        );
    }
    if let Some(d) = &r.init.diagnosis {
        let _ = writeln!(o, "   ! missing init: {}", escape(d));
    }
    let _ = writeln!(
        o,
        "\neBPF: {}",
        r.ebpf.strategy.map_or("none".to_string(), |s| {
            format!(
                "{s} (watched for {})",
                human_ms(r.ebpf.watched_ms.unwrap_or(0))
            )
        })
    );
    for a in &r.ebpf.attempts {
        if let Some(e) = &a.error {
            let _ = writeln!(o, "  {:<10} failed: {e}", a.strategy.name());
        }
    }
    if let Some(e) = &r.ebpf.error {
        let _ = writeln!(o, "  error: {e}");
    }
    if !r.gaps.is_empty() {
        let _ = writeln!(o, "\nnot seen");
        for g in &r.gaps {
            let _ = writeln!(o, "  - {}", escape(&g.text));
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::{
        ebpf::snapshot::BlockedRecv,
        proc::{ProcRecv, SyscallInfo, ThreadInfo},
    };

    fn thread(tid: u32, recv: Option<(u64, u64)>) -> ThreadInfo {
        ThreadInfo {
            tid,
            name: format!("t{tid}"),
            state: 'S',
            wchan: Some("wait_woken".into()),
            cpu_ticks: 3,
            syscall: recv.map(|_| SyscallInfo {
                nr: 45,
                name: Some("recvfrom"),
                arg0: 3,
            }),
            idle_ms: recv.map(|(_, ms)| ms),
            kstack: vec!["wait_woken".into()],
            recv: recv.map(|(inode, ms)| ProcRecv {
                syscall: "recvfrom",
                fd: 3,
                inode,
                idle_ms: Some(ms),
            }),
            wait: None,
        }
    }

    fn process(
        pid: u32,
        ppid: u32,
        state: char,
        init: bool,
        threads: Vec<ThreadInfo>,
        sockets: Vec<(i32, u64)>,
    ) -> ProcessInfo {
        ProcessInfo {
            pid,
            ppid,
            name: format!("p{pid}"),
            state,
            start_ticks: 1000 + u64::from(pid),
            uid: Some(0),
            pid_ns_init: init,
            threads,
            sockets,
            gaps: vec![],
        }
    }

    fn socket(inode: u64, remote: &str, last_recv: u32, last_ack: u32, probes: u8) -> TcpSocket {
        TcpSocket {
            inode,
            cookie: inode + 1000,
            local: "10.0.0.2:40000".parse().unwrap(),
            remote: remote.parse().unwrap(),
            state: TcpState::Established,
            uid: 0,
            recv_queue: 0,
            send_queue: 0,
            timer: None,
            tcp_info: Some(TcpInfo {
                rtt_us: 100,
                rto_us: 204_000,
                unacked: 0,
                retransmits: 0,
                backoff: 0,
                probes,
                last_data_recv_ms: last_recv,
                last_data_sent_ms: last_recv,
                last_ack_recv_ms: last_ack,
                bytes_received: 10,
                bytes_acked: 10,
            }),
        }
    }

    fn evidence(
        processes: Vec<ProcessInfo>,
        tcp: Vec<TcpSocket>,
        snapshot: Option<TracerSnapshot>,
    ) -> Evidence {
        let roles = tcp
            .iter()
            .map(|s| {
                (
                    s.inode,
                    if s.remote.port() == 7443 {
                        (SocketRole::Control, 0)
                    } else {
                        (SocketRole::Provider, 1)
                    },
                )
            })
            .collect();
        Evidence {
            agent: Some("sol".into()),
            rule: "cmdline=sol".into(),
            roots: vec![processes[0].pid],
            problem: None,
            upstreams: vec![],
            containers: vec![],
            container_gaps: vec![],
            processes,
            gone: vec![99],
            over_budget: None,
            unread_processes: 0,
            unread_zombies: BTreeMap::new(),
            tcp: vec![(1, Ok(tcp))],
            roles,
            ebpf: EbpfEvidence {
                built_in: true,
                attempts: vec![],
                error: None,
                watched_since_ns: Some(0),
                snapshot,
            },
        }
    }

    fn snapshot(blocked: Vec<BlockedRecv>) -> TracerSnapshot {
        TracerSnapshot {
            strategy: Strategy::TpBtf,
            taken_at_ns: 5_000_000_000,
            blocked,
            sockets: vec![],
            overflow: Default::default(),
            shares: Default::default(),
            refused: Vec::new(),
        }
    }

    #[test]
    fn receives_come_from_ebpf_when_it_saw_them_and_from_procfs_otherwise() {
        let ev = evidence(
            vec![process(
                10,
                1,
                'S',
                false,
                vec![
                    thread(10, Some((500, 16_260_000))),
                    thread(11, Some((501, 2_000))),
                ],
                vec![(3, 500), (4, 501), (5, 999)],
            )],
            vec![
                socket(500, "10.0.0.1:7443", 16_260_000, 16_260_000, 0),
                socket(501, "10.0.0.9:443", 2_000, 100, 0),
            ],
            Some(snapshot(vec![BlockedRecv {
                tgid: 10,
                tid: 11,
                inode: Some(501),
                fd: Some(4),
                syscall: Some("recvfrom"),
                tcp_checked: false,
                since_ns: 0,
                age_ms: 1_900,
            }])),
        );
        let r = build(&ev);
        let t10 = &r.processes[0].threads[0];
        assert_eq!(
            (t10.recv_blocked_ms, t10.recv_inode, t10.recv_source),
            (Some(16_260_000), Some(500), Some(RecvSource::Procfs))
        );
        assert!(
            t10.anomalies.iter().any(|a| a.contains("4h31m")),
            "{:?}",
            t10.anomalies
        );
        let t11 = &r.processes[0].threads[1];
        assert_eq!(
            (t11.recv_blocked_ms, t11.recv_source),
            (Some(1_900), Some(RecvSource::Ebpf))
        );
        // Socket 999 is not TCP (not in the dump): not reported.
        assert_eq!(
            r.sockets
                .iter()
                .map(|s| (s.inode, s.role))
                .collect::<Vec<_>>(),
            [(500, SocketRole::Control), (501, SocketRole::Provider)]
        );
        assert!(
            r.sockets[0]
                .anomalies
                .iter()
                .any(|a| a.starts_with("silent for"))
        );
        assert!(r.sockets[1].anomalies.is_empty());
        assert!(r.gaps.iter().any(|g| g.text.contains("pid 99 exited")));
        assert!(
            r.gaps
                .iter()
                .any(|g| g.text.contains("1 receive(s) began before the tracer"))
        );
    }

    /// An agent past every cap: what is kept is what matters (the thread
    /// in a receive, the upstream socket and the one it waits on), every
    /// zombie is counted, and what is left out is counted and said.
    #[test]
    fn a_report_past_its_caps_keeps_what_matters_and_counts_the_rest() {
        let mut threads: Vec<ThreadInfo> = (1..=1100).map(|tid| thread(tid, None)).collect();
        threads.push(thread(5000, Some((7, 90_000))));
        let mut sockets: Vec<(i32, u64)> = (10..1110).map(|ino| (ino as i32, ino)).collect();
        sockets.extend([(3, 7), (4, 5)]);
        let mut procs = vec![process(1, 0, 'S', true, threads, sockets.clone())];
        procs.extend((2..=301).map(|pid| process(pid, 1, 'Z', false, vec![], vec![])));
        let mut tcp: Vec<TcpSocket> = (10..1110)
            .map(|ino| socket(ino, "10.0.0.9:9", 10, 10, 0))
            .collect();
        tcp.push(socket(7, "10.0.0.9:9", 10, 10, 0));
        tcp.push(socket(5, "10.0.0.1:7443", 10, 10, 0));
        let mut ev = evidence(procs, tcp, None);
        ev.roles.retain(|ino, _| *ino == 5);
        ev.gone = (10_000..10_050).collect();
        ev.unread_processes = 20;
        ev.unread_zombies = BTreeMap::from([(1, 1000)]);
        let r = build(&ev);

        let threads: Vec<&ThreadReport> = r.processes.iter().flat_map(|p| &p.threads).collect();
        assert_eq!(threads.len(), MAX_THREADS);
        assert!(
            threads.iter().any(|t| t.tid == 5000),
            "the receiving thread is kept"
        );
        assert_eq!(r.left_out.threads, 1101 - MAX_THREADS);

        assert_eq!(r.sockets.len(), MAX_SOCKETS);
        let kept: Vec<u64> = r.sockets.iter().map(|s| s.inode).collect();
        assert!(
            kept.contains(&5) && kept.contains(&7),
            "upstream and awaited kept"
        );
        assert_eq!(r.left_out.sockets, 1102 - MAX_SOCKETS);
        assert!(r.processes[0].sockets.iter().all(|i| kept.contains(i)));

        assert_eq!(r.zombies.len(), MAX_ZOMBIES);
        assert_eq!(r.left_out.zombies, 300 - MAX_ZOMBIES + 1000);
        assert_eq!(r.init.zombies, 1300, "every zombie is counted");
        assert!(
            r.init
                .diagnosis
                .as_deref()
                .is_some_and(|d| d.contains("1300 zombie(s)"))
        );
        assert_eq!(r.left_out.processes, 20);

        let vanished = r
            .gaps
            .iter()
            .filter(|g| g.kind == GapKind::Vanished)
            .count();
        assert_eq!(vanished, MAX_GAPS_PER_KIND + 1, "{:?}", r.gaps);
        assert!(r.gaps.iter().any(|g| g.text == "… and 18 more like these"));
        let said = r
            .gaps
            .iter()
            .find(|g| g.kind == GapKind::LeftOut)
            .expect("said");
        assert!(
            said.text
                .contains("left out 20 process(es), 1044 zombie(s)"),
            "{said}"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["left_out"]["sockets"], 1102 - MAX_SOCKETS);
        // Under the caps: nothing is left out, and the JSON has no `left_out`.
        let small = build(&evidence(
            vec![process(1, 0, 'S', false, vec![thread(1, None)], vec![])],
            vec![],
            None,
        ));
        assert!(small.left_out.is_empty());
        assert!(
            serde_json::to_value(&small)
                .unwrap()
                .get("left_out")
                .is_none()
        );
    }

    #[test]
    fn a_collection_over_its_budget_is_a_budget_gap() {
        let procs = vec![process(1, 0, 'S', false, vec![thread(1, None)], vec![])];
        let mut ev = evidence(procs, vec![], None);
        assert!(!build(&ev).gaps.iter().any(|g| g.kind == GapKind::Budget));
        let why = "sol: collection exceeded its budget of 5000 ms and stopped (1 of 3 processes reached): the evidence is partial";
        ev.over_budget = Some(why.into());
        let r = build(&ev);
        let budget: Vec<_> = r
            .gaps
            .iter()
            .filter(|g| g.kind == GapKind::Budget)
            .collect();
        assert_eq!(budget.len(), 1, "{:?}", r.gaps);
        assert_eq!(budget[0].text, why);
        assert!(render(&r).contains("exceeded its budget of 5000 ms"));
    }

    #[test]
    fn zombies_under_a_pid_1_are_the_missing_init() {
        let mut procs = vec![process(1, 0, 'S', true, vec![thread(1, None)], vec![])];
        procs.extend((2..=6).map(|pid| process(pid, 1, 'Z', false, vec![], vec![])));
        let r = build(&evidence(procs.clone(), vec![], None));
        assert_eq!(r.zombies.len(), 5);
        assert!(r.init.root_is_pid1);
        assert!(
            r.init
                .diagnosis
                .as_deref()
                .is_some_and(|d| d.contains("5 zombie(s)"))
        );
        assert!(r.gaps.iter().any(|g| g.text.contains("no eBPF evidence")));
        // The same zombies under a root that is not PID 1: no init diagnosis.
        procs[0].pid_ns_init = false;
        let r = build(&evidence(procs, vec![], None));
        assert_eq!((r.zombies.len(), r.init.diagnosis.is_some()), (5, false));
        assert!(render(&r).contains("zombies: 5"));
    }

    #[test]
    fn a_failed_socket_dump_is_a_gap_and_receives_are_still_shown() {
        let mut ev = evidence(
            vec![process(
                10,
                1,
                'S',
                false,
                vec![thread(10, Some((500, 3_000)))],
                vec![(3, 500)],
            )],
            vec![],
            None,
        );
        ev.tcp = vec![(10, Err("sock_diag: permission denied".into()))];
        let r = build(&ev);
        assert!(r.gaps.iter().any(|g| g.text.contains("permission denied")));
        assert_eq!(r.processes[0].threads[0].recv_blocked_ms, Some(3_000));
        assert!(r.sockets.is_empty());
    }

    #[test]
    fn readiness_waits_name_their_tcp_sockets_and_event_loops() {
        use crate::proc::ProcWait;
        let waiting = |tid: u32, syscall: &'static str, sockets: Vec<(i32, u64)>, epoll| {
            let mut t = thread(tid, None);
            t.idle_ms = Some(3_200);
            t.wait = Some(ProcWait {
                syscall,
                sockets,
                epoll_fd: epoll,
                idle_ms: Some(3_200),
            });
            t
        };
        let ev = evidence(
            vec![process(
                10,
                1,
                'S',
                false,
                vec![
                    waiting(10, "poll", vec![(5, 500)], None),
                    waiting(
                        11,
                        "epoll_wait",
                        vec![(5, 500), (6, 501), (7, 999)],
                        Some(4),
                    ),
                    // Only a non-TCP socket (999 is not in the dump): no wait.
                    waiting(12, "select", vec![(7, 999)], None),
                ],
                vec![(5, 500), (6, 501), (7, 999)],
            )],
            vec![
                socket(500, "10.0.0.9:443", 3_200, 100, 0),
                socket(501, "10.0.0.1:7443", 3_200, 100, 0),
            ],
            None,
        );
        let r = build(&ev);
        let t = &r.processes[0].threads;
        assert_eq!(
            (
                t[0].wait_syscall.as_deref(),
                &t[0].wait_inodes[..],
                t[0].wait_event_loop
            ),
            (Some("poll"), &[500][..], false)
        );
        assert_eq!(
            (
                t[1].wait_syscall.as_deref(),
                &t[1].wait_inodes[..],
                t[1].wait_event_loop
            ),
            (Some("epoll_wait"), &[500, 501][..], true)
        );
        assert_eq!(
            (t[2].wait_syscall.as_ref(), t[2].wait_inodes.len()),
            (None, 0)
        );
        // Not a receive: the recv fields stay empty.
        assert!(t.iter().all(|t| t.recv_inode.is_none()));
        let text = render(&r);
        assert!(
            text.contains("waits in poll on socket inode 500 (fd 5, provider) for 3.2s"),
            "{text}"
        );
        assert!(
            text.contains("event loop waits in epoll_wait on 2 sockets (inodes 500, 501) for 3.2s"),
            "{text}"
        );
        // JSON: the fields appear only when set.
        let json = serde_json::to_value(&r).unwrap();
        let threads = &json["processes"][0]["threads"];
        assert_eq!(threads[1]["wait_event_loop"], true);
        assert_eq!(threads[1]["wait_inodes"], serde_json::json!([500, 501]));
        let quiet = threads[2].as_object().unwrap();
        for key in ["wait_syscall", "wait_inodes", "wait_event_loop"] {
            assert!(!quiet.contains_key(key), "{key} in {quiet:?}");
        }
    }

    #[test]
    fn ages_read_like_people_write_them() {
        for (ms, s) in [
            (0, "0ms"),
            (850, "850ms"),
            (3_200, "3.2s"),
            (59_999, "59.9s"),
            (725_000, "12m05s"),
            (16_260_000, "4h31m"),
            (183_600_000, "2d3h"),
        ] {
            assert_eq!(human_ms(ms), s, "{ms}");
        }
    }
}

#[cfg(test)]
mod escape_tests {
    use super::escape;

    #[test]
    fn control_characters_are_shown_escaped_and_plain_text_is_kept() {
        for (raw, shown) in [
            ("sol-runner", "sol-runner"),
            ("evil\nthread 1 fake", "evil\\nthread 1 fake"),
            ("\u{1b}[31mred", "\\u{1b}[31mred"),
            ("tab\there", "tab\\there"),
            ("snowman ☃", "snowman ☃"),
        ] {
            assert_eq!(escape(raw), shown, "{raw:?}");
        }
    }
}
