//! The `inspect` report for one process: its threads and the receive each is
//! blocked in (from eBPF where attached, from procfs otherwise, and which),
//! its TCP sockets with `tcp_info` and eBPF activity, and the eBPF strategy
//! with why the others failed.
//!
//! [`build`] is pure: it joins evidence already collected. [`collect`] is
//! the I/O edge that gathers it.

use std::{collections::BTreeMap, time::Duration};

use serde::Serialize;

use crate::{
    ebpf::{
        self, Attempt, BlockedRecv, SocketActivity, Strategy, Tracer, TracerOptions, TracerSnapshot,
    },
    proc::{self, ThreadInfo},
    sockdiag::{self, TcpInfo, TcpSocket},
};

/// Everything `inspect` shows for one process.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub pid: u32,
    pub name: String,
    pub ebpf: EbpfStatus,
    pub threads: Vec<ThreadReport>,
    pub sockets: Vec<SocketReport>,
    /// What could not be seen, in words.
    pub gaps: Vec<String>,
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
    /// How long the process had been watched when the snapshot was taken.
    pub watched_ms: Option<u64>,
    /// Events the tracer could not record (full maps, unreadable pointers).
    pub overflow: Option<ebpf::Overflow>,
}

/// One thread.
#[derive(Clone, Debug, Serialize)]
pub struct ThreadReport {
    pub tid: u32,
    pub name: String,
    pub state: char,
    pub wchan: Option<String>,
    /// How long it has been blocked in a receive on a TCP socket, or `None`
    /// when it is not in one.
    pub recv_blocked_ms: Option<u64>,
    /// The socket it is blocked on.
    pub recv_inode: Option<u64>,
    pub recv_syscall: Option<String>,
    /// `ebpf` (timed from the receive's entry) or `procfs` (timed from when
    /// the thread last ran; the receive began before the tracer saw it, or
    /// there is no tracer).
    pub recv_source: Option<&'static str>,
}

/// One TCP socket of the process.
#[derive(Clone, Debug, Serialize)]
pub struct SocketReport {
    pub inode: u64,
    pub cookie: u64,
    pub local: String,
    pub remote: String,
    pub state: &'static str,
    pub tcp_info: Option<TcpInfo>,
    /// Receive/send activity from eBPF since the process was watched.
    pub ebpf: Option<SocketActivity>,
}

/// Evidence gathered for one process.
pub struct Evidence {
    pub pid: u32,
    pub name: String,
    pub threads: Vec<ThreadInfo>,
    /// The process's socket inodes (from `/proc/PID/fd`).
    pub socket_inodes: Vec<u64>,
    /// TCP sockets of the process's network namespace.
    pub tcp: Result<Vec<TcpSocket>, String>,
    pub ebpf: EbpfEvidence,
}

/// The tracer's side of the evidence.
pub struct EbpfEvidence {
    pub attempts: Vec<Attempt>,
    pub error: Option<String>,
    pub watched_since_ns: Option<u64>,
    pub snapshot: Option<TracerSnapshot>,
}

/// Why `inspect` has nothing to show.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The process is gone, or its `what` cannot be read.
    #[error("cannot read the {what} of pid {pid}: {reason}")]
    Process {
        pid: u32,
        what: &'static str,
        reason: String,
    },
}

/// How to collect.
#[derive(Clone, Debug, Default)]
pub struct CollectOptions {
    /// Skip eBPF entirely.
    pub no_ebpf: bool,
    /// Strategies to try; all when empty.
    pub strategies: Vec<Strategy>,
    /// Watch this long before reading the tracer, so receives that begin
    /// meanwhile are timed from their start.
    pub wait: Duration,
}

/// Gathers evidence on `pid`. `Err` only when the process cannot be read.
pub fn collect(pid: u32, opts: &CollectOptions) -> Result<Evidence, InspectError> {
    let unreadable = |what: &'static str| {
        move |e: procfs::ProcError| InspectError::Process {
            pid,
            what,
            reason: e.to_string(),
        }
    };
    let process = procfs::process::Process::new(pid as i32).map_err(unreadable("process"))?;
    let name = process.stat().map(|s| s.comm).map_err(unreadable("stat"))?;

    let mut tracer = None;
    let mut ebpf = EbpfEvidence {
        attempts: Vec::new(),
        error: None,
        watched_since_ns: None,
        snapshot: None,
    };
    if opts.no_ebpf {
        ebpf.error = Some("disabled by --no-ebpf".into());
    } else {
        let topts = TracerOptions {
            strategies: if opts.strategies.is_empty() {
                Strategy::ALL.to_vec()
            } else {
                opts.strategies.clone()
            },
            ..TracerOptions::default()
        };
        match Tracer::attach(&topts) {
            Ok(mut t) => match t.watch(pid) {
                Ok(()) => tracer = Some(t),
                Err(e) => ebpf.error = Some(ebpf::chain(&e)),
            },
            Err(e) => {
                if let ebpf::TracerError::NoStrategy { attempts } = &e {
                    ebpf.attempts = attempts.clone();
                }
                ebpf.error = Some(ebpf::chain(&e));
            }
        }
    }
    if tracer.is_some() && !opts.wait.is_zero() {
        std::thread::sleep(opts.wait);
    }
    if let Some(t) = tracer.as_mut() {
        ebpf.attempts = t.attempts().to_vec();
        ebpf.watched_since_ns = t.watched_since(pid);
        match t.snapshot() {
            Ok(s) => ebpf.snapshot = Some(s),
            Err(e) => ebpf.error = Some(ebpf::chain(&e)),
        }
    }

    let threads = proc::threads(pid).map_err(unreadable("threads"))?;
    let socket_inodes = process
        .fd()
        .map(|fds| {
            fds.flatten()
                .filter_map(|fd| match fd.target {
                    procfs::process::FDTarget::Socket(inode) => Some(inode),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let tcp = sockdiag::dump_tcp_in_netns_of(pid).map_err(|e| e.to_string());
    Ok(Evidence {
        pid,
        name,
        threads,
        socket_inodes,
        tcp,
        ebpf,
    })
}

/// Joins the evidence into the report.
pub fn build(ev: &Evidence) -> Report {
    let mut gaps = Vec::new();
    let own: std::collections::BTreeSet<u64> = ev.socket_inodes.iter().copied().collect();
    let tcp: BTreeMap<u64, &TcpSocket> = match &ev.tcp {
        Ok(all) => all
            .iter()
            .filter(|s| own.contains(&s.inode))
            .map(|s| (s.inode, s))
            .collect(),
        Err(e) => {
            gaps.push(format!("TCP sockets unavailable: {e}"));
            BTreeMap::new()
        }
    };
    let is_tcp = |inode: u64| tcp.contains_key(&inode) || ev.tcp.is_err();

    let snapshot = ev.ebpf.snapshot.as_ref();
    let blocked: BTreeMap<u32, &BlockedRecv> = snapshot
        .map(|s| {
            s.blocked
                .iter()
                .filter(|b| b.tgid == ev.pid && (b.tcp_checked || b.inode.is_some_and(is_tcp)))
                .map(|b| (b.tid, b))
                .collect()
        })
        .unwrap_or_default();
    let activity: BTreeMap<u64, &SocketActivity> = snapshot
        .map(|s| {
            s.sockets
                .iter()
                .filter(|a| a.tgid == ev.pid)
                .map(|a| (a.inode, a))
                .collect()
        })
        .unwrap_or_default();

    let mut unseen_by_ebpf = 0;
    let threads = ev
        .threads
        .iter()
        .map(|t| {
            let mut r = ThreadReport {
                tid: t.tid,
                name: t.name.clone(),
                state: t.state,
                wchan: t.wchan.clone(),
                recv_blocked_ms: None,
                recv_inode: None,
                recv_syscall: None,
                recv_source: None,
            };
            if let Some(b) = blocked.get(&t.tid) {
                r.recv_blocked_ms = Some(b.age_ms);
                r.recv_inode = b.inode;
                r.recv_syscall = Some(b.syscall.unwrap_or("tcp_recvmsg").to_string());
                r.recv_source = Some("ebpf");
            } else if let Some(p) = t.recv.as_ref().filter(|p| is_tcp(p.inode)) {
                // A thread procfs shows asleep in a receive. Time it by when it
                // last ran: that is when it went to sleep in the receive.
                r.recv_blocked_ms = p.idle_ms;
                r.recv_inode = Some(p.inode);
                r.recv_syscall = Some(p.syscall.to_string());
                r.recv_source = Some("procfs");
                if snapshot.is_some() {
                    unseen_by_ebpf += 1;
                }
            }
            r
        })
        .collect();
    if unseen_by_ebpf > 0 {
        gaps.push(format!(
            "{unseen_by_ebpf} receive(s) began before the tracer watched this process: eBPF cannot see them; \
             timed from procfs (when the thread last ran) instead"
        ));
    }
    if snapshot.is_none() {
        gaps.push(match &ev.ebpf.error {
            Some(e) => format!("no eBPF evidence ({e}); receives timed from procfs only"),
            None => "no eBPF evidence; receives timed from procfs only".into(),
        });
    }
    if let Some(o) = snapshot
        .map(|s| s.overflow)
        .filter(|o| *o != ebpf::Overflow::default())
    {
        gaps.push(format!("eBPF maps overflowed or reads failed: {o:?}"));
    }

    let sockets = tcp
        .values()
        .map(|s| SocketReport {
            inode: s.inode,
            cookie: s.cookie,
            local: s.local.to_string(),
            remote: s.remote.to_string(),
            state: s.state,
            tcp_info: s.tcp_info.clone(),
            ebpf: activity.get(&s.inode).map(|a| (*a).clone()),
        })
        .collect();

    Report {
        pid: ev.pid,
        name: ev.name.clone(),
        ebpf: EbpfStatus {
            built_in: ebpf::BUILT_IN,
            strategy: snapshot.map(|s| s.strategy),
            attempts: ev.ebpf.attempts.clone(),
            error: ev.ebpf.error.clone(),
            watched_ms: snapshot
                .zip(ev.ebpf.watched_since_ns)
                .map(|(s, since)| crate::clock::age_ms(s.taken_at_ns, since)),
            overflow: snapshot.map(|s| s.overflow),
        },
        threads,
        sockets,
        gaps,
    }
}

/// The report for a person at a terminal.
pub fn render(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(o, "process {} ({})", r.pid, r.name);
    let _ = writeln!(o, "\neBPF");
    match r.ebpf.strategy {
        Some(s) => {
            let _ = writeln!(
                o,
                "  strategy: {s} (watched for {} ms)",
                r.ebpf.watched_ms.unwrap_or(0)
            );
        }
        None => {
            let _ = writeln!(o, "  strategy: none");
        }
    }
    for a in &r.ebpf.attempts {
        let _ = match &a.error {
            None => writeln!(o, "  {:<10}  attached", a.strategy.name()),
            Some(e) => writeln!(o, "  {:<10}  failed: {e}", a.strategy.name()),
        };
    }
    if let Some(e) = &r.ebpf.error {
        let _ = writeln!(o, "  error: {e}");
    }
    let _ = writeln!(o, "\nthreads");
    let _ = writeln!(
        o,
        "  {:>7}  {:<16} {:<2} {:<24} RECEIVE",
        "TID", "NAME", "ST", "WCHAN"
    );
    for t in &r.threads {
        let recv = match (t.recv_blocked_ms, t.recv_inode) {
            (Some(ms), inode) => format!(
                "blocked {ms} ms in {} on socket {} [{}]",
                t.recv_syscall.as_deref().unwrap_or("?"),
                inode.map_or("?".into(), |i| i.to_string()),
                t.recv_source.unwrap_or("?")
            ),
            (None, Some(inode)) => format!("in a receive on socket {inode}, age unknown"),
            (None, None) => "-".into(),
        };
        let _ = writeln!(
            o,
            "  {:>7}  {:<16} {:<2} {:<24} {}",
            t.tid,
            t.name,
            t.state,
            t.wchan.as_deref().unwrap_or("-"),
            recv
        );
    }
    let _ = writeln!(o, "\nTCP sockets");
    if r.sockets.is_empty() {
        let _ = writeln!(o, "  none");
    }
    for s in &r.sockets {
        let _ = writeln!(
            o,
            "  {} {} -> {} {} (cookie {})",
            s.inode, s.local, s.remote, s.state, s.cookie
        );
        if let Some(i) = &s.tcp_info {
            let _ = writeln!(
                o,
                "      kernel: last recv {} ms, last send {} ms, last ack {} ms, unacked {}, probes {}, backoff {}, rtt {} us",
                i.last_data_recv_ms,
                i.last_data_sent_ms,
                i.last_ack_recv_ms,
                i.unacked,
                i.probes,
                i.backoff,
                i.rtt_us
            );
        }
        if let Some(a) = &s.ebpf {
            let age = |v: Option<u64>| v.map_or("never".to_string(), |ms| format!("{ms} ms ago"));
            let _ = writeln!(
                o,
                "      eBPF:   last recv {} ({} B), last send {} ({} B), recvs {} with data / {} empty / {} errors",
                age(a.last_recv_ms),
                a.last_recv_bytes,
                age(a.last_send_ms),
                a.last_send_bytes,
                a.recv_data,
                a.recv_empty,
                a.recv_error
            );
        }
    }
    if !r.gaps.is_empty() {
        let _ = writeln!(o, "\nnot seen");
        for g in &r.gaps {
            let _ = writeln!(o, "  - {g}");
        }
    }
    o
}
