//! What one socket shows of its connection (alive, silent, or proven
//! dead) and which threads wait on it.

use super::*;

/// How one upstream socket looks.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Liveness {
    /// Data arriving, or the peer acknowledges.
    Alive(&'static str),
    /// Silent past its threshold, no proof either way.
    Suspect { silent_ms: u64 },
    /// Proven dead (`by_proof`: by the prove stage's own keepalive).
    Dead {
        code: ReasonCode,
        why: String,
        by_proof: bool,
    },
}

/// The proof keepalive history holds for this socket, if it is this socket
/// (armed or not, for putting its options back).
pub(super) fn proof_held<'h>(s: &SocketReport, history: &'h AgentHistory) -> Option<&'h Proof> {
    history.proofs.get(&s.cookie).filter(|p| p.inode == s.inode)
}

/// The proof that counts as evidence on this socket: none in CLOSE-WAIT,
/// where the peer already closed and its leftover FIN-WAIT-2 socket answers
/// the probes (for up to `tcp_fin_timeout`, 60 s) for a process that is gone
/// or done.
pub(super) fn proof_of<'h>(s: &SocketReport, history: &'h AgentHistory) -> Option<&'h Proof> {
    proof_held(s, history).filter(|_| s.state != TcpState::CloseWait)
}

/// How long checks have seen socket `s` in CLOSE-WAIT (0 when not so).
pub(super) fn closed_seen_ms(s: &SocketReport, history: &AgentHistory, now_ms: u64) -> u64 {
    history
        .closed_since_ms
        .get(&s.cookie)
        .filter(|_| s.state == TcpState::CloseWait)
        .map_or(0, |since| now_ms.saturating_sub(*since))
}

/// How long a call on this socket has been silent: since the last data
/// received, or, when a request went out after that (a new call on an old
/// keep-alive connection), since the request. A control connection's
/// heartbeat rule counts from the last data received only.
pub(super) fn call_silence(i: &crate::sockdiag::TcpInfo) -> u64 {
    if i.last_data_sent_ms < i.last_data_recv_ms {
        u64::from(i.last_data_sent_ms)
    } else {
        u64::from(i.last_data_recv_ms)
    }
}

pub(super) fn liveness(
    s: &SocketReport,
    cfg: &AgentConfig,
    proof: Option<&Proof>,
    closed_seen_ms: u64,
    keepalive_only_ms: Option<u64>,
    now_ms: u64,
    read_ms: u64,
) -> Liveness {
    let th = &cfg.thresholds;
    let upstream = s.upstream.and_then(|i| cfg.upstreams.get(i));
    let suspect_after = crate::clock::ms(
        upstream
            .and_then(|u| u.suspect_after)
            .unwrap_or(th.suspect_after),
    );
    // The peer closed and the agent has not, for longer than an agent
    // takes to notice a closed stream (the FIN is the last thing received:
    // a response ending with `Connection: close` is caught in that instant).
    // Since the FIN at least: its last ACK (unless keepalive probes were
    // answered since), or since a check first saw it closed.
    let closed_for = s
        .tcp_info
        .as_ref()
        .map_or(u64::MAX, |i| u64::from(i.last_ack_recv_ms))
        .max(closed_seen_ms);
    if s.state == TcpState::CloseWait && closed_for >= CLOSE_WAIT_GRACE_MS {
        return Liveness::Dead {
            code: ReasonCode::PeerClosed,
            why: "the peer closed the connection; the agent has not".into(),
            by_proof: false,
        };
    }
    let Some(i) = &s.tcp_info else {
        return Liveness::Alive("no tcp_info");
    };
    let silent = u64::from(i.last_data_recv_ms);
    if let Some(p) = proof {
        // Our own probes: they govern, not the agent's keepalive threshold.
        match p.answer(i, now_ms, read_ms) {
            Answer::Data => return Liveness::Alive("data arriving"),
            Answer::Answered => {
                return Liveness::Alive("the peer answered the proof keepalive");
            }
            Answer::Dead { why } => {
                return Liveness::Dead {
                    code: ReasonCode::PeerUnresponsive,
                    why,
                    by_proof: true,
                };
            }
            Answer::Pending => {}
        }
    } else if u32::from(i.probes) >= th.dead_probes {
        return Liveness::Dead {
            code: ReasonCode::PeerUnresponsive,
            why: format!(
                "{} keepalive probe(s) unanswered, nothing from the peer for {}",
                i.probes,
                human_ms(silent)
            ),
            by_proof: false,
        };
    }
    if i.unacked > 0 && u32::from(i.backoff) >= th.dead_backoff {
        return Liveness::Dead {
            code: ReasonCode::PeerUnresponsive,
            why: format!(
                "{} segment(s) unacknowledged, retransmission backoff {}, last ACK {} ago",
                i.unacked,
                i.backoff,
                human_ms(u64::from(i.last_ack_recv_ms))
            ),
            by_proof: false,
        };
    }
    if let Some(hb) = upstream
        .filter(|u| u.role == Role::Control)
        .and_then(|u| u.heartbeat)
    {
        let limit = crate::clock::ms(hb).saturating_mul(3);
        // The application's heartbeats, not the transport's keepalive:
        // PINGs and their ACKs arriving are no heartbeat.
        let app_silent = silent.max(keepalive_only_ms.unwrap_or(0));
        if app_silent > limit {
            // Which kind of silence: a peer whose kernel still acknowledges
            // (the server process hung) or one that vanished.
            let ack = u64::from(i.last_ack_recv_ms);
            let peer = if app_silent > silent {
                "the peer's transport still answers: its application is silent".to_string()
            } else if ack < silent && ack <= limit {
                format!(
                    "the peer's kernel still acknowledges (last ACK {} ago): its application is silent",
                    human_ms(ack)
                )
            } else {
                format!("nothing acknowledged for {} either", human_ms(ack))
            };
            let what = if app_silent > silent {
                format!(
                    "no application data for {} (only transport keepalive, each answered in kind, the last {} ago)",
                    human_ms(app_silent),
                    human_ms(silent)
                )
            } else {
                format!("no data for {}", human_ms(silent))
            };
            return Liveness::Dead {
                code: ReasonCode::ControlSilent,
                why: format!(
                    "{what} on a control connection with a {} heartbeat (limit 3×); {peer}",
                    human_ms(crate::clock::ms(hb))
                ),
                by_proof: false,
            };
        }
    }
    // A provider call's silence starts with its request, not with the
    // answer to the call before it.
    let silent = if s.role == SocketRole::Control {
        silent
    } else {
        call_silence(i)
    };
    if silent <= suspect_after {
        return Liveness::Alive(if u64::from(i.last_data_recv_ms) <= suspect_after {
            "data arriving"
        } else {
            "its request went out recently"
        });
    }
    if u64::from(i.last_ack_recv_ms) <= suspect_after && i.last_ack_recv_ms < i.last_data_recv_ms {
        return Liveness::Alive("the peer still acknowledges");
    }
    Liveness::Suspect { silent_ms: silent }
}

/// Whether the last thing on the socket was a request: data was sent (more
/// than the SYN, which `bytes_acked` counts), and nothing has been received
/// since (ties included: ages are kernel ticks, 1-10 ms, and the measured
/// SDK case showed equal ages on a call never answered). A call answered
/// within one tick looks the same; it costs a proof keepalive the peer
/// answers, never a verdict worse than `busy` (see `strong` below).
pub(super) fn request_out(s: &SocketReport) -> bool {
    s.tcp_info
        .as_ref()
        .is_some_and(|i| i.bytes_acked > 1 && i.last_data_sent_ms <= i.last_data_recv_ms)
}

/// Whether an upstream socket carries a call now: a thread waits on it (in
/// a receive, `poll` or `select`), or a request is out with no answer yet
/// (`pending`: [`request_out`] now or kept from an earlier check), or an
/// answer is streaming in.
pub(super) fn in_flight(
    s: &SocketReport,
    waiting: &BTreeMap<u64, Waiter>,
    pending: bool,
    suspect_after_ms: u64,
) -> bool {
    waiting.contains_key(&s.inode)
        || pending
        || s.tcp_info
            .as_ref()
            .is_some_and(|i| u64::from(i.last_data_recv_ms) <= suspect_after_ms)
}

/// A thread waiting on a socket: its tid, how long it has waited, and in
/// what (`recv`, `poll`, …).
#[derive(Clone, Copy, Debug)]
pub(super) struct Waiter {
    pub(super) tid: u32,
    pub(super) age_ms: u64,
    pub(super) syscall: Wait,
    /// Threads waiting on the socket in all (one connection may carry
    /// several calls: HTTP/2, gRPC); this one waited longest.
    pub(super) threads: u32,
}

/// ", with N other thread(s) waiting on it" for a socket several threads
/// wait on (one connection, several calls), or nothing.
pub(super) fn others(threads: u32) -> String {
    match threads.saturating_sub(1) {
        0 => String::new(),
        n => format!(", with {n} other thread(s) waiting on it"),
    }
}

/// A connection attempt (SYN sent, no answer yet) has exchanged no data:
/// its tcp_info silences are meaningless. It is judged as what it is: the
/// absence of a connection ([`Judging::control_absent`]), and an attempt
/// that has waited too long ([`Judging::connect_attempt`]).
pub(super) fn connecting(s: &SocketReport) -> bool {
    s.state == TcpState::SynSent
}

/// Threads waiting on a socket, by inode: in a receive (procfs or eBPF), or
/// in poll/select with it in the read set. The longest wait wins, a receive
/// over a poll. An event loop's epoll set is not counted: it holds idle
/// connections too; the socket's own history decides there.
pub(super) fn waiters(report: &Report) -> BTreeMap<u64, Waiter> {
    let mut waiting: BTreeMap<u64, Waiter> = BTreeMap::new();
    let mut wait_on = |inode: u64, w: Waiter| {
        let e = waiting.entry(inode).or_insert(Waiter { threads: 0, ..w });
        let threads = e.threads.saturating_add(1);
        if (w.syscall == Wait::Recv, w.age_ms) > (e.syscall == Wait::Recv, e.age_ms) {
            *e = w;
        }
        e.threads = threads;
    };
    for t in report.processes.iter().flat_map(|p| &p.threads) {
        if let (Some(inode), Some(age_ms)) = (t.recv_inode, t.recv_blocked_ms) {
            wait_on(
                inode,
                Waiter {
                    tid: t.tid,
                    age_ms,
                    syscall: Wait::Recv,
                    threads: 1,
                },
            );
        }
        if !t.wait_event_loop {
            for &inode in &t.wait_inodes {
                let age_ms = t.idle_ms.unwrap_or(0);
                wait_on(
                    inode,
                    Waiter {
                        tid: t.tid,
                        age_ms,
                        syscall: Wait::Poll,
                        threads: 1,
                    },
                );
            }
        }
    }
    waiting
}

/// The sockets in the epoll set of a thread waiting in `epoll_wait` (with
/// read interest): a call may be waiting on any of them. Not a waiter (an
/// event loop's set holds idle pooled connections too), but what a dead one
/// among them means: the agent may be awaiting it.
pub(super) fn event_loop_sockets(report: &Report) -> BTreeSet<u64> {
    report
        .processes
        .iter()
        .flat_map(|p| &p.threads)
        .filter(|t| t.wait_event_loop)
        .flat_map(|t| t.wait_inodes.iter().copied())
        .collect()
}
