//! The rules of one agent's sockets: an upstream socket's liveness turned
//! into a dead or suspect finding (with the proof it needs), a connect
//! that does not complete, and a control connection that is absent.

use super::*;

impl<'a> Judging<'a> {
    /// The ladder's finding that socket `s` is dead, when the process that
    /// holds it and its fd are known (an act needs both).
    pub(super) fn finding(
        &self,
        s: &SocketReport,
        by_proof: bool,
        kind: DeadKind,
    ) -> Option<DeadSocket> {
        Some(DeadSocket {
            pid: s.pid,
            start_ticks: start_ticks(self.report, s.pid)?,
            fd: s.fd?,
            inode: s.inode,
            cookie: s.cookie,
            unacked: s.tcp_info.as_ref().map_or(0, |i| i.unacked),
            by_proof,
            peer_alive: false,
            kind,
        })
    }

    /// The rules of one upstream socket.
    pub(super) fn upstream_socket<'s>(
        &mut self,
        s: &'s SocketReport,
        waiting: &BTreeMap<u64, Waiter>,
        event_loop: &BTreeSet<u64>,
        claimed_task: Option<&'s str>,
        up: &mut Upstreams,
    ) where
        'a: 's,
    {
        let upstream = s.upstream.and_then(|i| self.cfg.upstreams.get(i));
        let suspect_after = crate::clock::ms(
            upstream
                .and_then(|u| u.suspect_after)
                .unwrap_or(self.th().suspect_after),
        );
        let control = s.role == SocketRole::Control;
        let proof = proof_of(s, self.history);
        if s.state == TcpState::CloseWait {
            let since = self.history.closed_since_ms.get(&s.cookie).copied();
            self.next
                .closed_since_ms
                .insert(s.cookie, since.unwrap_or(self.now_ms));
        }
        // A request out and nothing back: now, or since an earlier check
        // with no byte received since.
        let received = s.tcp_info.as_ref().map_or(0, |i| i.bytes_received);
        let pending = request_out(s) || self.history.pending.get(&s.cookie) == Some(&received);
        if pending {
            self.next.pending.insert(s.cookie, received);
        }
        let task = claimed_task.filter(|_| s.role == SocketRole::Provider);
        let awaited = in_flight(s, waiting, pending, suspect_after) || task.is_some();
        // Evidence strong enough to call a long silence unresponsive: a
        // thread waits on the socket, the agent says it is working, or the
        // request strictly followed the last answer (not a one-tick tie, a
        // fast answer's look).
        let strong = waiting.contains_key(&s.inode)
            || task.is_some()
            || s.tcp_info
                .as_ref()
                .is_some_and(|i| i.bytes_acked > 1 && i.last_data_sent_ms < i.last_data_recv_ms);
        let closed_seen = closed_seen_ms(s, self.history, self.now_ms);
        let (stall, keepalive_only) = self.progress(s, upstream, suspect_after);
        let liveness = liveness(
            s,
            self.cfg,
            proof,
            closed_seen,
            keepalive_only,
            self.now_ms,
            self.report.read_ms.unwrap_or(self.now_ms),
        );
        self.keep_proof(s, proof_held(s, self.history), &liveness);
        if let Some(a) = self.history.answered.get(&s.cookie) {
            self.next.answered.insert(s.cookie, *a);
        }
        let answered = self
            .history
            .answered
            .get(&s.cookie)
            .map_or(String::new(), |a| {
                format!(
                    "; the peer answered {} proof keepalive round(s), the last {} ago",
                    a.rounds,
                    human_ms(self.now_ms.saturating_sub(a.at_ms))
                )
            });
        let view = SocketView {
            s,
            control,
            heartbeat: upstream
                .filter(|u| u.role == Role::Control)
                .and_then(|u| u.heartbeat)
                .is_some(),
            proof,
            pending,
            task,
            awaited,
            may_wait: awaited || event_loop.contains(&s.inode),
            waiter: waiting.get(&s.inode).copied(),
            answered,
        };
        let stall =
            stall.filter(|_| matches!(liveness, Liveness::Alive(_)) && (control || awaited));
        let dead = matches!(liveness, Liveness::Dead { .. }) || stall.is_some();
        if let Some(stall) = stall {
            up.control_dead |= control;
            self.stalled_socket(&view, stall, upstream);
        }
        match liveness {
            Liveness::Alive(_) if stall.is_some() => {}
            Liveness::Dead {
                code,
                why,
                by_proof,
            } => {
                up.control_dead |= control;
                self.dead_socket(&view, code, why, by_proof);
            }
            Liveness::Suspect { silent_ms } => {
                if control {
                    up.control_alive = true; // unproven either way: not dead
                }
                up.busy |= !control && awaited;
                self.suspect_socket(&view, silent_ms);
            }
            Liveness::Alive(how) => {
                up.control_alive |= control;
                if !control && awaited {
                    up.busy = true;
                    let r = reason(
                        ReasonCode::CallInFlight,
                        Verdict::Busy,
                        format!(
                            "{} call to {} in flight: {how}{}",
                            s.role, s.remote, view.answered
                        ),
                    );
                    self.reasons.push(socket_reason(r, s));
                }
            }
        }
        if !control && strong && !dead {
            self.silence_exceeded(s, upstream);
        }
    }

    /// A proof keepalive armed on `s` is kept until the peer answers (then
    /// its options are put back) or the socket goes. On a socket whose peer
    /// closed (CLOSE-WAIT) it proves nothing more: its options are put back
    /// at once, not as an answer.
    pub(super) fn keep_proof(
        &mut self,
        s: &SocketReport,
        proof: Option<&Proof>,
        liveness: &Liveness,
    ) {
        let Some(p) = proof else { return };
        self.next.proofs.insert(s.cookie, p.clone());
        let given_up = p.restore_failures >= crate::prove::MAX_RESTORE_FAILURES;
        let closed = s.state == TcpState::CloseWait;
        let alive = matches!(liveness, Liveness::Alive(_)) && !closed;
        if (alive || closed || !self.cfg.proof.keepalive) && !given_up {
            // Addressed as the socket is now (its fd, its holder).
            let target = ProofTarget {
                pid: s.pid,
                start_ticks: start_ticks(self.report, s.pid).unwrap_or(p.start_ticks),
                fd: s.fd.unwrap_or(p.fd),
                inode: s.inode,
            };
            self.work.push(ProofWork::Restore {
                cookie: s.cookie,
                answered: alive,
                target,
                remote: s.remote.clone(),
            });
        }
    }

    /// A socket proven dead: its reason, the thread waiting on it, and the
    /// finding the ladder acts on.
    pub(super) fn dead_socket(
        &mut self,
        v: &SocketView<'_>,
        code: ReasonCode,
        why: String,
        by_proof: bool,
    ) {
        let s = v.s;
        // Only the prove stage asks a connection nobody waits on; what the
        // agent's own keepalive or a FIN found keeps its meaning.
        let kind = if by_proof && !v.control && !v.may_wait {
            DeadKind::Idle
        } else {
            DeadKind::Awaited
        };
        let r = match kind {
            DeadKind::Idle => reason(
                ReasonCode::IdleConnectionDead,
                Verdict::Degraded,
                format!(
                    "{} connection to {}, idle with no call waiting on it: {why}; ending it before a request is sent into it",
                    s.role, s.remote
                ),
            ),
            _ => reason(
                code,
                Verdict::Wedged,
                format!("{} connection to {}: {why}", s.role, s.remote),
            ),
        };
        let r = socket_reason(r, s);
        self.reasons
            .push(if by_proof { with(r, "proof", true) } else { r });
        if !self.dead.iter().any(|d| d.inode == s.inode)
            && let Some(d) = self.finding(s, by_proof, kind)
        {
            self.dead.push(d);
        }
        let recv_blocked_ms = crate::clock::ms(self.th().recv_blocked);
        if let Some(w) = v.waiter.filter(|w| w.age_ms >= recv_blocked_ms) {
            let (code, what) = match w.syscall {
                Wait::Recv => (ReasonCode::RecvBlocked, "in a receive"),
                Wait::Poll => (ReasonCode::WaitBlocked, "in poll/select"),
            };
            let r = reason(
                code,
                Verdict::Wedged,
                format!(
                    "thread {} has been waiting {} {what} on that dead connection{}",
                    w.tid,
                    human_ms(w.age_ms),
                    others(w.threads)
                ),
            );
            self.reasons.push(with(
                with(
                    with(with(r, "tid", w.tid), "inode", s.inode),
                    "age_ms",
                    w.age_ms,
                ),
                "waiters",
                w.threads,
            ));
        }
    }

    /// A socket silent past its threshold with no proof either way: on a
    /// control connection or a call in flight, it is reported, and a proof
    /// keepalive is asked for where one can be armed.
    pub(super) fn suspect_socket(&mut self, v: &SocketView<'_>, silent_ms: u64) {
        let s = v.s;
        let now_ms = self.now_ms;
        let since = self
            .history
            .suspect_since_ms
            .get(&s.cookie)
            .copied()
            .unwrap_or(now_ms);
        self.next.suspect_since_ms.insert(s.cookie, since);
        if !(v.control || v.awaited) {
            // Nobody is known to wait on it, but a call may (a head that
            // came first, an event loop): it is proven all the same, and
            // says so without making the agent busy.
            let proving = self.proving(v, silent_ms);
            let r = reason(
                ReasonCode::Suspect,
                Verdict::Healthy,
                format!(
                    "{} connection to {} silent for {}, no call known to wait on it{}{}{proving}",
                    s.role,
                    s.remote,
                    human_ms(silent_ms),
                    if v.may_wait {
                        " (it is in a waiting event loop's epoll set)"
                    } else {
                        ""
                    },
                    v.answered
                ),
            );
            self.reasons.push(socket_reason(r, s));
            return;
        }
        let waiting = match (v.waiter, v.task) {
            (Some(w), _) => format!(
                "; thread {} waiting {} in {}{}",
                w.tid,
                human_ms(w.age_ms),
                match w.syscall {
                    Wait::Recv => "a receive",
                    Wait::Poll => "poll/select",
                },
                others(w.threads)
            ),
            (None, Some(task)) => format!("; the agent reports current_task {task:?}"),
            (None, None) if v.pending => "; a request is out and no answer came".into(),
            (None, None) => String::new(),
        };
        let proving = self.proving(v, silent_ms);
        let r = reason(
            ReasonCode::Suspect,
            if v.control {
                Verdict::Idle
            } else {
                Verdict::Busy
            },
            format!(
                "{} connection to {} silent for {} (suspect for {}){waiting}{}{proving}",
                s.role,
                s.remote,
                human_ms(silent_ms),
                human_ms(now_ms.saturating_sub(since)),
                v.answered
            ),
        );
        self.reasons.push(socket_reason(r, s));
    }

    /// How a suspect socket's proof stands, in words; asks the prove stage
    /// for a proof keepalive where none is armed and one can be.
    pub(super) fn proving(&mut self, v: &SocketView<'_>, silent_ms: u64) -> String {
        let s = v.s;
        let unacked = s.tcp_info.as_ref().map_or(0, |i| i.unacked);
        match (v.proof, s.fd, start_ticks(self.report, s.pid)) {
            (Some(p), _, _) => format!(
                "; proof keepalive armed {} ago: {} probe(s) unanswered so far",
                human_ms(p.armed_for(self.now_ms)),
                s.tcp_info.as_ref().map_or(0, |i| i.probes)
            ),
            (None, _, _) if !self.cfg.proof.keepalive => {
                "; no proof either way (proof keepalives are off: [agent.proof] keepalive = false)"
                    .into()
            }
            (None, _, _) if unacked > 0 => format!(
                "; {unacked} segment(s) unacknowledged: their retransmissions will prove it"
            ),
            (None, _, _) if v.heartbeat => String::new(),
            (None, _, _) if s.state != TcpState::Established => {
                format!("; no proof either way (state {})", s.state)
            }
            (None, Some(fd), Some(start)) => {
                self.work.push(ProofWork::Arm {
                    cookie: s.cookie,
                    target: ProofTarget {
                        pid: s.pid,
                        start_ticks: start,
                        fd,
                        inode: s.inode,
                    },
                    silent_ms,
                    remote: s.remote.clone(),
                });
                "; no proof either way yet: arming a proof keepalive".into()
            }
            (None, _, _) => {
                "; no proof either way (its fd or process could not be read: no proof keepalive can be armed)".into()
            }
        }
    }

    /// One hop only: keepalive and ACKs prove the TCP peer, which may be a
    /// proxy answering for a dead upstream. A call silent past max_silence
    /// is not thinking, whoever answers the probes.
    pub(super) fn silence_exceeded(
        &mut self,
        s: &SocketReport,
        upstream: Option<&crate::config::Upstream>,
    ) {
        let max_silence = upstream.map_or(crate::config::DEFAULT_MAX_SILENCE, |u| u.max_silence);
        let silent = s.tcp_info.as_ref().map_or(0, call_silence);
        if silent <= crate::clock::ms(max_silence) {
            return;
        }
        let r = reason(
            ReasonCode::SilenceExceeded,
            Verdict::Unresponsive,
            format!(
                "{} call to {} silent for {}, past its max_silence of {}, while its TCP peer still answers: a proxy may be answering for a dead upstream",
                s.role,
                s.remote,
                human_ms(silent),
                human_ms(crate::clock::ms(max_silence))
            ),
        );
        self.reasons.push(socket_reason(r, s));
    }

    /// A connection attempt to an upstream: how long its SYN has gone
    /// unanswered, from evidence that assumes no schedule (since a check
    /// first saw it, and the sum of the socket's own retransmission
    /// timeouts, [`syn_waited_ms`]), and past the upstream's
    /// `connect_timeout`, a finding the ladder ends so the caller's connect
    /// fails now. The message says which evidence measured the age.
    pub(super) fn connect_attempt(&mut self, s: &SocketReport) {
        let since = self
            .history
            .connecting_since_ms
            .get(&s.cookie)
            .copied()
            .unwrap_or(self.now_ms);
        self.next.connecting_since_ms.insert(s.cookie, since);
        let seen = self.now_ms.saturating_sub(since);
        let by_timers = s.tcp_info.as_ref().map_or(0, syn_waited_ms);
        let waited = seen.max(by_timers);
        let limit = crate::clock::ms(
            s.upstream
                .and_then(|i| self.cfg.upstreams.get(i))
                .map_or(crate::config::DEFAULT_CONNECT_TIMEOUT, |u| {
                    u.connect_timeout
                }),
        );
        if waited <= limit {
            return;
        }
        let resent = s.tcp_info.as_ref().map_or(0, |i| i.retransmits);
        let measured = if seen >= by_timers {
            format!("first seen {} ago", human_ms(seen))
        } else {
            let rto = s
                .tcp_info
                .as_ref()
                .map_or(0, |i| u64::from(i.rto_us) / 1000);
            format!(
                "at least {} by its own retransmission timeouts (RTO now {})",
                human_ms(by_timers),
                human_ms(rto)
            )
        };
        let r = reason(
            ReasonCode::ConnectTimeout,
            Verdict::Unresponsive,
            format!(
                "{} connection to {}: the peer never answered the handshake ({measured}; {resent} SYN(s) resent), past its connect_timeout of {}; ending the attempt so the connect fails now",
                s.role,
                s.remote,
                human_ms(limit)
            ),
        );
        self.reasons
            .push(with(socket_reason(r, s), "waited_ms", waited));
        if let Some(d) = self.finding(s, false, DeadKind::Connecting) {
            self.dead.push(d);
        }
    }

    /// A proof whose socket this report lacks while its process lives (a
    /// socket table that could not be read, a moment's gap) is kept for a
    /// while: forgetting it would leave its options unrestored, and a later
    /// proof would take them for the socket's own. Cookies are never
    /// reused, so a record of a socket that closed only waits out its time.
    pub(super) fn keep_unseen_proofs(&mut self) {
        for (cookie, p) in &self.history.proofs {
            let lives =
                self.report.processes.iter().any(|q| {
                    q.pid == p.pid && q.start_ticks == Some(p.start_ticks) && q.state != 'Z'
                });
            if lives && p.armed_for(self.now_ms) < KEEP_UNSEEN_PROOF_MS {
                self.next.proofs.entry(*cookie).or_insert_with(|| p.clone());
            }
        }
    }

    /// The control upstream the config promises, absent from the kernel.
    /// Absent for a moment is a reconnect; past `suspect_after` it is a
    /// fact. Returns whether it is.
    pub(super) fn control_absent(&mut self) -> bool {
        let sockets = &self.report.sockets;
        let control = |s: &&SocketReport| s.role == SocketRole::Control;
        let no_control =
            self.wants_control() && !sockets.iter().filter(control).any(|s| !connecting(s));
        if !no_control {
            return false;
        }
        let attempts = sockets
            .iter()
            .filter(control)
            .filter(|s| connecting(s))
            .count();
        let since = self.history.control_absent_since_ms.unwrap_or(self.now_ms);
        self.next.control_absent_since_ms = Some(since);
        let absent_ms = self.now_ms.saturating_sub(since);
        if absent_ms < crate::clock::ms(self.th().suspect_after) {
            return false;
        }
        self.reasons.push(reason(
            ReasonCode::ControlAbsent,
            Verdict::Wedged,
            format!(
                "no connection to the control upstream for {}{}",
                human_ms(absent_ms),
                if attempts > 0 {
                    format!("; {attempts} connection attempt(s) unanswered (SYN sent)")
                } else {
                    String::new()
                }
            ),
        ));
        true
    }

    pub(super) fn wants_control(&self) -> bool {
        self.cfg.upstreams.iter().any(|u| u.role == Role::Control)
    }
}

/// How long a SYN-SENT socket has waited at least, from its own `tcp_info`:
/// the sum of the retransmission timeouts that have run out, rebuilt from
/// what the kernel keeps (`retransmits` SYNs resent, `backoff` doublings,
/// the RTO now), whatever schedule the socket's namespace uses. Linux
/// resends a SYN when its RTO runs out; the first
/// `net.ipv4.tcp_syn_linear_timeouts` resends (4 by default since 6.5, none
/// before) keep the RTO, each later one doubles it (`backoff` + 1). So with
/// `n` resent and backoff `b`, the timeouts that ran out are
/// `n - b + 1` of the first RTO and one each of 2, 4 … 2^(b-1) times it
/// (`n` of it when `b` is 0); the first RTO is the RTO now halved `b`
/// times, which only understates it where the RTO reached its ceiling.
/// Measured on 6.18 (linear 4): 5 resent, backoff 1 at 5 s; 8 resent,
/// backoff 4 at 19 s. The time since the last resend is not counted.
pub(super) fn syn_waited_ms(i: &crate::sockdiag::TcpInfo) -> u64 {
    let n = u64::from(i.retransmits);
    let b = u64::from(i.backoff).min(n);
    let first_us = u64::from(i.rto_us) >> b.min(63);
    let timeouts = if b == 0 {
        n
    } else {
        // n - b + 1 of the first RTO, then 2 + 4 + … + 2^(b-1) of it.
        (n - b + 1).saturating_add((1u64 << b.min(62)).saturating_sub(2))
    };
    first_us.saturating_mul(timeouts) / 1000
}
