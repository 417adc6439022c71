//! The join: [`build`] turns what the collectors gathered into one
//! agent's report, capped per agent, with every gap said.

use super::*;

/// A receive blocked longer than this is marked in the report.
pub(super) const LONG_RECV_MS: u64 = 60_000;
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
        ebpf: EbpfReport {
            built_in: ev.ebpf.built_in,
            strategy: snapshot.map(|s| s.strategy),
            attempts: ev.ebpf.attempts.clone(),
            error: ev.ebpf.error.clone(),
            watched_ms: snapshot
                .zip(ev.ebpf.watched_since_ns)
                .map(|(s, since)| crate::clock::age_ms(s.taken_at_ns, since)),
            overflow: snapshot.map(|s| s.overflow),
        },
        collection: ev.collection.clone(),
        gaps,
        left_out: LeftOut {
            processes: ev.unread_processes,
            zombies: ev.unread_zombies.values().sum(),
            ..LeftOut::default()
        },
        read_ms: None,
    };
    cap(&mut report);
    report
}

/// Holds `r` to the caps ([`MAX_ZOMBIES`], [`MAX_THREADS`],
/// [`MAX_SOCKETS`], [`MAX_GAPS_PER_KIND`]; processes are capped where they
/// are read), keeping what the judge and a person look at first, and
/// counts what it left out in `r.left_out`, with a gap that says so.
pub(super) fn cap(r: &mut Report) {
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
pub(super) fn evidence_gaps(ev: &Evidence) -> Vec<Gap> {
    let mut gaps: Vec<Gap> = Vec::new();
    if let Some(p) = &ev.problem {
        gaps.push(Gap::new(
            GapKind::NoProcess,
            format!("no process matched: {p}"),
        ));
    }
    if let Some(why) = &ev.unread_cmdlines {
        gaps.push(Gap::new(GapKind::Unread, why.clone()));
    }
    if let Some(why) = &ev.over_budget {
        gaps.push(Gap::new(GapKind::Budget, why.clone()));
    }
    gaps.extend(ev.unread_listening.iter().map(listening_gap));
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

/// The gap of a network namespace whose listening sockets could not be
/// read: its pid, namespace and error, and what that leaves unjudged.
pub(super) fn listening_gap(u: &super::UnreadListening) -> Gap {
    Gap::new(
        GapKind::Listening,
        format!(
            "listening sockets of pid {}'s network namespace{} unreadable: {}; its connections \
             cannot be told accepted from made, none was judged",
            u.pid,
            u.netns.map(|n| format!(" (net:[{n}])")).unwrap_or_default(),
            u.error
        ),
    )
}

/// The agent's TCP sockets: the dumps, restricted to inodes its processes
/// hold, with the holder of each.
pub(super) struct AgentSockets<'e> {
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
pub(super) fn thread_report(
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
pub(super) fn ebpf_gaps(ev: &Evidence, unseen_by_ebpf: usize) -> Vec<Gap> {
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

/// The missing-init diagnosis: `unreaped` zombies under `pid1`, PID 1 of
/// its pid namespace, which does not reap them.
pub fn missing_init(unreaped: usize, pid1: u32) -> String {
    format!(
        "{unreaped} zombie(s) under pid {pid1} (PID 1 of its pid namespace), which does not reap: \
         run the agent under an init (tini, `docker run --init`, `init: true`)"
    )
}

/// Whether the agent's PID 1 (of its pid namespace) leaves zombies unreaped.
pub(super) fn init_diagnosis(ev: &Evidence, zombies: &[Zombie]) -> InitDiagnosis {
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
    let diagnosis = (unreaped > 0).then(|| missing_init(unreaped, pid1.unwrap_or(0)));
    InitDiagnosis {
        root_is_pid1,
        pid1,
        zombies: zombies.len() + ev.unread_zombies.values().sum::<usize>(),
        diagnosis,
    }
}

/// What looks wrong with a socket, as a person would say it.
pub(super) fn socket_anomalies(s: &TcpSocket) -> Vec<String> {
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
