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

mod build;
mod render;

pub use self::build::{build, missing_init};
pub use self::render::{human_ms, render};

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
    pub ebpf: EbpfReport,
    /// Which readers read the processes: the kernel's task iterators or
    /// procfs, and why procfs where it did.
    pub collection: Collection,
    /// What could not be seen, in words (with its kind).
    pub gaps: Vec<Gap>,
    /// What the report leaves out past its caps ([`MAX_PROCESSES`] …),
    /// counted; absent when nothing is.
    #[serde(skip_serializing_if = "LeftOut::is_empty")]
    pub left_out: LeftOut,
    /// A clock reading (`CLOCK_BOOTTIME` ms, the check's clock) taken after
    /// the sockets were read, where the reader stamped one: the `tcp_info`
    /// ages count back from the read, and a proof's answer is timed
    /// against it ([`crate::prove::Proof::answer`]). `None`: the judge's
    /// `now_ms` stands for it.
    #[serde(skip)]
    pub read_ms: Option<u64>,
}

/// Why a full read is procfs's, not the task iterators': they read no
/// kernel stacks or wait channels.
pub const FULL_IS_PROCFS: &str = "a full read (kernel stacks, wait channels) is procfs's";

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
pub struct EbpfReport {
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

/// How a collection read an agent's processes (threads and socket fds):
/// how many the kernel's task iterators walked, how many procfs read, and
/// why procfs did where it did. Either way the evidence is the same; the
/// iterators read it in one pass in the kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Collection {
    /// Processes the task iterators read.
    pub iterators: usize,
    /// Where those iterators came from: `pinned` (by the helper, opened
    /// from its bpffs) or `loaded` (by this process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iterators_from: Option<String>,
    /// Processes procfs read.
    pub procfs: usize,
    /// Why procfs read them, each reason once.
    pub why_procfs: Vec<String>,
    /// Processes whose TCP connections sock_diag's dump of their network
    /// namespace gave, not the task iterators' pass, and why, each reason
    /// once (absent where none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub why_sock_diag: Vec<String>,
}

impl Collection {
    /// Counts one process read by procfs, for `why`.
    pub fn procfs_for(&mut self, why: &str) {
        self.procfs += 1;
        if !self.why_procfs.iter().any(|w| w == why) {
            self.why_procfs.push(why.to_string());
        }
    }

    /// Notes that sock_diag read a process's connections, for `why`.
    pub fn sock_diag_for(&mut self, why: &str) {
        if !self.why_sock_diag.iter().any(|w| w == why) {
            self.why_sock_diag.push(why.to_string());
        }
    }
}

/// A network namespace whose listening sockets could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnreadListening {
    /// The process the namespace was entered through.
    pub pid: u32,
    /// The namespace's inode (`/proc/PID/ns/net`), where it could be read.
    pub netns: Option<u64>,
    /// Why the read failed.
    pub error: String,
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
    /// Why a `cmdline` rule could not tell whether some processes match
    /// (their command lines could not be read), if so.
    pub unread_cmdlines: Option<String>,
    /// The network namespaces whose listening sockets could not be read
    /// for an agent whose roles are [`crate::config::Roles::Outbound`]:
    /// none of their connections got a role.
    pub unread_listening: Vec<UnreadListening>,
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
    /// Which readers read the processes.
    pub collection: Collection,
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

pub use crate::text::escape;
use crate::text::escape_lines;

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
                data_segs_in: 0,
                data_segs_out: 0,
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
            unread_cmdlines: None,
            unread_listening: vec![],
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
            collection: Collection::default(),
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
    fn unread_listeners_are_a_gap_naming_pid_namespace_and_error() {
        let procs = vec![process(1, 0, 'S', false, vec![thread(1, None)], vec![])];
        let mut ev = evidence(procs, vec![], None);
        assert!(!build(&ev).gaps.iter().any(|g| g.kind == GapKind::Listening));
        ev.unread_listening = vec![
            UnreadListening {
                pid: 7,
                netns: Some(4026532001),
                error: "cannot enter the network namespace of pid 7: EPERM".into(),
            },
            UnreadListening {
                pid: 9,
                netns: None,
                error: "/proc/9/ns/net: No such file or directory".into(),
            },
        ];
        let r = build(&ev);
        let gaps: Vec<_> = r
            .gaps
            .iter()
            .filter(|g| g.kind == GapKind::Listening)
            .map(|g| g.text.as_str())
            .collect();
        assert_eq!(
            gaps,
            [
                "listening sockets of pid 7's network namespace (net:[4026532001]) unreadable: \
                 cannot enter the network namespace of pid 7: EPERM; its connections cannot be \
                 told accepted from made, none was judged",
                "listening sockets of pid 9's network namespace unreadable: /proc/9/ns/net: No \
                 such file or directory; its connections cannot be told accepted from made, none \
                 was judged",
            ]
        );
        assert!(render(&r).contains("(net:[4026532001]) unreadable"));
        assert!(crate::judge::unjudgeable(&r).is_some_and(|w| w == gaps[0]));
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
