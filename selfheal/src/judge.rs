//! The judge: a pure function from an agent's config, its evidence (the
//! joined [`crate::inspect::Report`] and its probe results) and its
//! history to a verdict with reasons. No I/O, no clock: `now_ms` is passed
//! in (`CLOCK_BOOTTIME` milliseconds), and the updated history comes back
//! for the caller to store.
//!
//! The proof rules (design.md, "Verdicts"): a silent upstream socket is
//! *suspect*, never dead by silence alone. It is *dead* on proof —
//! unanswered keepalive probes, retransmission backoff on unacknowledged
//! data, a peer that closed (CLOSE-WAIT), or, for a control upstream with a
//! heartbeat, no data for more than 3 × the heartbeat. A suspect socket whose
//! peer still acknowledges is alive.
//!
//! Proof is also asked for: a suspect socket with a call in flight and
//! nothing unacknowledged is handed to the prove stage ([`ProofWork`]), whose
//! proof keepalive this judge then reads ([`Proof`]): answered, the socket is
//! alive; `count` probes unanswered, each given its interval, it is dead.
//! "A call in flight" is decided from the socket itself as well as from the
//! threads: a thread waits on it (in a receive, `poll` or `select`), or the
//! last thing on it was a send (ties included), or nothing has come back
//! since a request went out (kept across checks).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{
    config::{AgentConfig, Role, Thresholds},
    inspect::{Report, SocketReport, human_ms},
    prove::{Answered, Proof, ProofTarget, ProofWork},
};

/// What is concluded about an agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Running, probes answer, nothing suspicious.
    Healthy,
    /// No upstream call in flight; the control connection is alive.
    Idle,
    /// An upstream call is in flight and not proven dead.
    Busy,
    /// Alive but accumulating damage.
    Degraded,
    /// A probe fails while the process lives.
    Unresponsive,
    /// Something the agent depends on is stuck, with proof.
    Wedged,
    /// No process matches.
    Down,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Idle => "idle",
            Self::Busy => "busy",
            Self::Degraded => "degraded",
            Self::Unresponsive => "unresponsive",
            Self::Wedged => "wedged",
            Self::Down => "down",
        }
    }

    /// Severity, for picking the worst of several: higher is worse.
    pub fn rank(self) -> u8 {
        match self {
            Self::Healthy => 0,
            Self::Idle => 1,
            Self::Busy => 2,
            Self::Degraded => 3,
            Self::Unresponsive => 4,
            Self::Wedged => 5,
            Self::Down => 6,
        }
    }

    /// Whether the agent is fine: nothing to record or heal.
    pub fn is_ok(self) -> bool {
        self.rank() <= Self::Busy.rank()
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One reason behind a verdict: a stable code, words for a person, and the
/// evidence (socket, thread, ages) it rests on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reason {
    pub code: String,
    /// The verdict this reason alone would give.
    pub verdict: Verdict,
    pub message: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub evidence: BTreeMap<String, serde_json::Value>,
}

/// A verdict with its reasons, worst first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Judgement {
    pub verdict: Verdict,
    pub reasons: Vec<Reason>,
    /// What the prove stage is to do after this judgement.
    #[serde(skip)]
    pub work: Vec<ProofWork>,
}

/// What the judge needs of a probe result.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProbeView {
    /// URL or file path.
    pub target: String,
    /// The error kind when it failed to answer (`timeout`, `refused`, …).
    pub error: Option<String>,
    /// Whether every expectation (status, fields) was met, when it answered.
    pub expectations_met: bool,
    /// Whether the probe declares expectations about the agent's state
    /// (fields with expected values): its "all is well" is then a claim.
    pub makes_claims: bool,
    pub latency_ms: Option<u64>,
    /// Extracted fields.
    pub fields: BTreeMap<String, serde_json::Value>,
}

/// What the judge remembers of an agent between runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentHistory {
    /// The last verdict and since when (`CLOCK_BOOTTIME` ms).
    pub verdict: Option<Verdict>,
    pub verdict_since_ms: u64,
    /// Suspect sockets by cookie: since when.
    #[serde(default)]
    pub suspect_since_ms: BTreeMap<u64, u64>,
    /// Since when the configured control upstream has had no socket.
    #[serde(default)]
    pub control_absent_since_ms: Option<u64>,
    /// The last `current_task` a probe reported, and since when.
    #[serde(default)]
    pub current_task: Option<(String, u64)>,
    /// Proof keepalives armed, by socket cookie.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub proofs: BTreeMap<u64, Proof>,
    /// Peers that answered their proofs, by socket cookie.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub answered: BTreeMap<u64, Answered>,
    /// Sockets with a request out and no answer yet, by cookie: the bytes
    /// received when that was seen. The call stays in flight until more
    /// arrive.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pending: BTreeMap<u64, u64>,
}

/// The field a probe names `current_task` (design: the agent's own story of
/// what it is doing).
pub const CURRENT_TASK: &str = "current_task";

/// How one upstream socket looks.
#[derive(Clone, Debug, PartialEq)]
enum Liveness {
    /// Data arriving, or the peer acknowledges.
    Alive(&'static str),
    /// Silent past its threshold, no proof either way.
    Suspect { silent_ms: u64 },
    /// Proven dead (`by_proof`: by the prove stage's own keepalive).
    Dead {
        code: &'static str,
        why: String,
        by_proof: bool,
    },
}

/// How long a proof whose socket is not in the report is kept while its
/// process lives (10 minutes: past the kernel's own deadline for a dead
/// peer, `actions::PROOF_HOLD`).
const KEEP_UNSEEN_PROOF_MS: u64 = 600_000;

/// How long a peer's close may go unnoticed before it counts against the
/// agent (`peer_closed`).
const CLOSE_WAIT_GRACE_MS: u64 = 2_000;

/// The proof keepalive history holds for this socket, if it is this socket.
fn proof_of<'h>(s: &SocketReport, history: &'h AgentHistory) -> Option<&'h Proof> {
    history.proofs.get(&s.cookie).filter(|p| p.inode == s.inode)
}

/// How long a call on this socket has been silent: since the last data
/// received, or, when a request went out after that (a new call on an old
/// keep-alive connection), since the request. A control connection's
/// heartbeat rule counts from the last data received only.
fn call_silence(i: &crate::sockdiag::TcpInfo) -> u64 {
    if i.last_data_sent_ms < i.last_data_recv_ms {
        u64::from(i.last_data_sent_ms)
    } else {
        u64::from(i.last_data_recv_ms)
    }
}

fn liveness(s: &SocketReport, cfg: &AgentConfig, proof: Option<&Proof>, now_ms: u64) -> Liveness {
    let th = &cfg.thresholds;
    let upstream = s.upstream.and_then(|i| cfg.upstreams.get(i));
    let suspect_after = upstream
        .and_then(|u| u.suspect_after)
        .unwrap_or(th.suspect_after)
        .as_millis() as u64;
    // The peer closed and the agent has not, for longer than an agent
    // takes to notice a closed stream (the FIN is the last thing received:
    // a response ending with `Connection: close` is caught in that instant).
    let closed_for = s
        .tcp_info
        .as_ref()
        .map_or(u64::MAX, |i| u64::from(i.last_ack_recv_ms));
    if s.state == "CLOSE-WAIT" && closed_for >= CLOSE_WAIT_GRACE_MS {
        return Liveness::Dead {
            code: "peer_closed",
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
        let armed_for = p.armed_for(now_ms);
        if silent < armed_for {
            return Liveness::Alive("data arriving");
        }
        if u64::from(i.last_ack_recv_ms) < armed_for {
            return Liveness::Alive("the peer answered the proof keepalive");
        }
        if i.unacked == 0 && p.proves_dead(i.probes, armed_for) {
            return Liveness::Dead {
                code: "peer_unresponsive",
                why: format!(
                    "proof keepalive armed {} ago: {} probe(s) unanswered, {} apart; nothing from the peer for {}",
                    human_ms(armed_for),
                    i.probes,
                    human_ms(p.interval_ms),
                    human_ms(silent)
                ),
                by_proof: true,
            };
        }
    } else if u32::from(i.probes) >= th.dead_probes {
        return Liveness::Dead {
            code: "peer_unresponsive",
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
            code: "peer_unresponsive",
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
        let limit = (hb.as_millis() as u64).saturating_mul(3);
        if silent > limit {
            // Which kind of silence: a peer whose kernel still acknowledges
            // (the server process hung) or one that vanished.
            let ack = u64::from(i.last_ack_recv_ms);
            let peer = if ack < silent && ack <= limit {
                format!(
                    "the peer's kernel still acknowledges (last ACK {} ago): its application is silent",
                    human_ms(ack)
                )
            } else {
                format!("nothing acknowledged for {} either", human_ms(ack))
            };
            return Liveness::Dead {
                code: "control_silent",
                why: format!(
                    "no data for {} on a control connection with a {} heartbeat (limit 3×); {peer}",
                    human_ms(silent),
                    human_ms(hb.as_millis() as u64)
                ),
                by_proof: false,
            };
        }
    }
    // A provider call's silence starts with its request, not with the
    // answer to the call before it.
    let silent = if s.role == "control" {
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
fn request_out(s: &SocketReport) -> bool {
    s.tcp_info
        .as_ref()
        .is_some_and(|i| i.bytes_acked > 1 && i.last_data_sent_ms <= i.last_data_recv_ms)
}

/// Whether an upstream socket carries a call now: a thread waits on it (in
/// a receive, `poll` or `select`), or a request is out with no answer yet
/// (`pending`: [`request_out`] now or kept from an earlier check), or an
/// answer is streaming in.
fn in_flight(
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
struct Waiter {
    tid: u32,
    age_ms: u64,
    syscall: Wait,
}

/// What a waiting thread sits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    /// A blocking receive on the socket.
    Recv,
    /// `poll`/`select` with the socket in its read set.
    Poll,
}

fn reason(code: &str, verdict: Verdict, message: String) -> Reason {
    Reason {
        code: code.into(),
        verdict,
        message,
        evidence: BTreeMap::new(),
    }
}

fn with(mut r: Reason, key: &str, value: impl Into<serde_json::Value>) -> Reason {
    r.evidence.insert(key.into(), value.into());
    r
}

fn socket_reason(r: Reason, s: &SocketReport) -> Reason {
    let r = with(
        with(with(r, "inode", s.inode), "role", s.role),
        "remote",
        s.remote.clone(),
    );
    match &s.tcp_info {
        Some(i) => with(
            with(
                with(r, "last_data_recv_ms", i.last_data_recv_ms),
                "last_ack_recv_ms",
                i.last_ack_recv_ms,
            ),
            "probes",
            i.probes,
        ),
        None => r,
    }
}

/// Whether judging this agent needs more than the minimal per-thread
/// evidence: an upstream socket that is not plainly alive (the threads
/// waiting on it are evidence), or a thread in uninterruptible sleep (how
/// long it has been there). A check reads every thread's syscall and wait
/// only then.
pub fn needs_thread_detail(
    cfg: &AgentConfig,
    report: &Report,
    history: &AgentHistory,
    now_ms: u64,
) -> bool {
    report
        .sockets
        .iter()
        .filter(|s| s.role != "other")
        .any(|s| {
            // A socket alive only by our proof's answer is still a silent
            // one: whether its call is in flight may rest on a waiting
            // thread.
            history.proofs.contains_key(&s.cookie)
                || history.answered.contains_key(&s.cookie)
                || !matches!(
                    liveness(s, cfg, proof_of(s, history), now_ms),
                    Liveness::Alive(_)
                )
        })
        || report
            .processes
            .iter()
            .flat_map(|p| &p.threads)
            .any(|t| t.state == 'D')
}

/// Judges one agent. Returns the judgement and the history to store.
pub fn judge(
    cfg: &AgentConfig,
    report: &Report,
    probes: &[ProbeView],
    history: &AgentHistory,
    now_ms: u64,
) -> (Judgement, AgentHistory) {
    let th: &Thresholds = &cfg.thresholds;
    let mut next = AgentHistory {
        verdict: history.verdict,
        verdict_since_ms: history.verdict_since_ms,
        ..AgentHistory::default()
    };
    let mut reasons = Vec::new();

    if report.processes.iter().all(|p| p.state == 'Z') {
        let why = report
            .gaps
            .iter()
            .find(|g| g.starts_with("no process matched"))
            .cloned();
        reasons.push(reason(
            "no_process",
            Verdict::Down,
            why.unwrap_or_else(|| "no process matches the agent's rule".into()),
        ));
        return finish(reasons, Vec::new(), next, now_ms);
    }

    // The agent says it is working on something (an event loop waiting on
    // a provider shows no thread blocked in a receive): a silent provider
    // call is then in flight, not abandoned. Only ever a reason for busy
    // over idle, never for a wedge.
    let claimed_task = probes
        .iter()
        .filter(|p| p.error.is_none())
        .filter_map(|p| p.fields.get(CURRENT_TASK))
        .find(|t| !t.is_null() && t.as_str() != Some(""))
        .map(|t| t.as_str().map_or_else(|| t.to_string(), str::to_string));

    // Threads waiting on a socket, by inode: in a receive (procfs or eBPF),
    // or in poll/select with it in the read set. The longest wait wins, a
    // receive over a poll. An event loop's epoll set is not counted: it
    // holds idle connections too; the socket's own history decides there.
    let mut waiting: BTreeMap<u64, Waiter> = BTreeMap::new();
    let mut wait_on = |inode: u64, w: Waiter| {
        let e = waiting.entry(inode).or_insert(w);
        if (w.syscall == Wait::Recv, w.age_ms) > (e.syscall == Wait::Recv, e.age_ms) {
            *e = w;
        }
    };
    for t in report.processes.iter().flat_map(|p| &p.threads) {
        if let (Some(inode), Some(age_ms)) = (t.recv_inode, t.recv_blocked_ms) {
            wait_on(
                inode,
                Waiter {
                    tid: t.tid,
                    age_ms,
                    syscall: Wait::Recv,
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
                    },
                );
            }
        }
    }
    let recv_blocked_ms = th.recv_blocked.as_millis() as u64;

    // Upstream sockets.
    let mut control_alive = false;
    let mut control_dead = false;
    let mut busy = false;
    let mut work = Vec::new();
    // A connection attempt (SYN sent, no answer yet) has exchanged no data:
    // its tcp_info silences are meaningless. It is judged as what it is,
    // the absence of a connection, below.
    let connecting = |s: &&SocketReport| s.state == "SYN-SENT";
    for s in report
        .sockets
        .iter()
        .filter(|s| s.role != "other" && !connecting(s))
    {
        let upstream = s.upstream.and_then(|i| cfg.upstreams.get(i));
        let suspect_after = upstream
            .and_then(|u| u.suspect_after)
            .unwrap_or(th.suspect_after)
            .as_millis() as u64;
        let control = s.role == "control";
        // A control upstream with a heartbeat is proven by its silence
        // (3 × the heartbeat): no proof keepalive is armed on it.
        let heartbeat = upstream
            .filter(|u| u.role == Role::Control)
            .and_then(|u| u.heartbeat);
        let proof = proof_of(s, history);
        // A request out and nothing back: now, or since an earlier check
        // with no byte received since.
        let received = s.tcp_info.as_ref().map_or(0, |i| i.bytes_received);
        let pending = request_out(s) || history.pending.get(&s.cookie) == Some(&received);
        if pending {
            next.pending.insert(s.cookie, received);
        }
        let task = claimed_task.as_ref().filter(|_| s.role == "provider");
        let awaited = in_flight(s, &waiting, pending, suspect_after) || task.is_some();
        // Evidence strong enough to call a long silence unresponsive: a
        // thread waits on the socket, the agent says it is working, or the
        // request strictly followed the last answer (not a one-tick tie, a
        // fast answer's look).
        let strong = waiting.contains_key(&s.inode)
            || task.is_some()
            || s.tcp_info
                .as_ref()
                .is_some_and(|i| i.bytes_acked > 1 && i.last_data_sent_ms < i.last_data_recv_ms);
        let liveness = liveness(s, cfg, proof, now_ms);
        if let Some(p) = proof {
            // Kept until the peer answers (then put back) or the socket goes.
            next.proofs.insert(s.cookie, p.clone());
            let given_up = p.restore_failures >= crate::prove::MAX_RESTORE_FAILURES;
            if (matches!(liveness, Liveness::Alive(_)) || !cfg.proof.keepalive) && !given_up {
                // Addressed as the socket is now (its fd, its holder).
                let target = ProofTarget {
                    pid: s.pid,
                    start_ticks: start_ticks(report, s.pid).unwrap_or(p.start_ticks),
                    fd: s.fd.unwrap_or(p.fd),
                    inode: s.inode,
                };
                work.push(ProofWork::Restore {
                    cookie: s.cookie,
                    answered: matches!(liveness, Liveness::Alive(_)),
                    target,
                    remote: s.remote.clone(),
                });
            }
        }
        if let Some(a) = history.answered.get(&s.cookie) {
            next.answered.insert(s.cookie, *a);
        }
        let answered = history.answered.get(&s.cookie).map_or(String::new(), |a| {
            format!(
                "; the peer answered {} proof keepalive round(s), the last {} ago",
                a.rounds,
                human_ms(now_ms.saturating_sub(a.at_ms))
            )
        });
        let waiter = waiting.get(&s.inode);
        let dead = matches!(liveness, Liveness::Dead { .. });
        match liveness {
            Liveness::Dead {
                code,
                why,
                by_proof,
            } => {
                control_dead |= control;
                let r = reason(
                    code,
                    Verdict::Wedged,
                    format!("{} connection to {}: {why}", s.role, s.remote),
                );
                let r = socket_reason(r, s);
                reasons.push(if by_proof { with(r, "proof", true) } else { r });
                if let Some(w) = waiter.filter(|w| w.age_ms >= recv_blocked_ms) {
                    let (code, what) = match w.syscall {
                        Wait::Recv => ("recv_blocked", "in a receive"),
                        Wait::Poll => ("wait_blocked", "in poll/select"),
                    };
                    let r = reason(
                        code,
                        Verdict::Wedged,
                        format!(
                            "thread {} has been waiting {} {what} on that dead connection",
                            w.tid,
                            human_ms(w.age_ms)
                        ),
                    );
                    reasons.push(with(
                        with(with(r, "tid", w.tid), "inode", s.inode),
                        "age_ms",
                        w.age_ms,
                    ));
                }
            }
            Liveness::Suspect { silent_ms } => {
                let since = history
                    .suspect_since_ms
                    .get(&s.cookie)
                    .copied()
                    .unwrap_or(now_ms);
                next.suspect_since_ms.insert(s.cookie, since);
                if control {
                    control_alive = true; // unproven either way: not dead
                }
                if control || awaited {
                    busy |= !control;
                    let waiting = match (waiter, task) {
                        (Some(w), _) => format!(
                            "; thread {} waiting {} in {}",
                            w.tid,
                            human_ms(w.age_ms),
                            match w.syscall {
                                Wait::Recv => "a receive",
                                Wait::Poll => "poll/select",
                            }
                        ),
                        (None, Some(task)) => format!("; the agent reports current_task {task:?}"),
                        (None, None) if pending => "; a request is out and no answer came".into(),
                        (None, None) => String::new(),
                    };
                    let unacked = s.tcp_info.as_ref().map_or(0, |i| i.unacked);
                    let proving = match (proof, s.fd, start_ticks(report, s.pid)) {
                        (Some(p), _, _) => format!(
                            "; proof keepalive armed {} ago: {} probe(s) unanswered so far",
                            human_ms(p.armed_for(now_ms)),
                            s.tcp_info.as_ref().map_or(0, |i| i.probes)
                        ),
                        (None, _, _) if !cfg.proof.keepalive => {
                            "; no proof either way (proof keepalives are off: [agent.proof] keepalive = false)".into()
                        }
                        (None, _, _) if unacked > 0 => format!(
                            "; {unacked} segment(s) unacknowledged: their retransmissions will prove it"
                        ),
                        (None, _, _) if heartbeat.is_some() => String::new(),
                        (None, _, _) if s.state != "ESTAB" => {
                            format!("; no proof either way (state {})", s.state)
                        }
                        (None, Some(fd), Some(start)) => {
                            work.push(ProofWork::Arm {
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
                    };
                    let r = reason(
                        "suspect",
                        if control {
                            Verdict::Idle
                        } else {
                            Verdict::Busy
                        },
                        format!(
                            "{} connection to {} silent for {} (suspect for {}){waiting}{answered}{proving}",
                            s.role,
                            s.remote,
                            human_ms(silent_ms),
                            human_ms(now_ms.saturating_sub(since))
                        ),
                    );
                    reasons.push(socket_reason(r, s));
                }
            }
            Liveness::Alive(how) => {
                control_alive |= control;
                if !control && awaited {
                    busy = true;
                    let r = reason(
                        "call_in_flight",
                        Verdict::Busy,
                        format!("{} call to {} in flight: {how}{answered}", s.role, s.remote),
                    );
                    reasons.push(socket_reason(r, s));
                }
            }
        }
        // One hop only: keepalive and ACKs prove the TCP peer, which may be
        // a proxy answering for a dead upstream. A call silent past
        // max_silence is not thinking, whoever answers the probes.
        let max_silence = upstream.map_or(crate::config::DEFAULT_MAX_SILENCE, |u| u.max_silence);
        let silent = s.tcp_info.as_ref().map_or(0, call_silence);
        if !control && strong && silent > max_silence.as_millis() as u64 && !dead {
            let r = reason(
                "silence_exceeded",
                Verdict::Unresponsive,
                format!(
                    "{} call to {} silent for {}, past its max_silence of {}, while its TCP peer still answers: a proxy may be answering for a dead upstream",
                    s.role,
                    s.remote,
                    human_ms(silent),
                    human_ms(max_silence.as_millis() as u64)
                ),
            );
            reasons.push(socket_reason(r, s));
        }
    }

    // A proof whose socket this report lacks while its process lives (a
    // socket table that could not be read, a moment's gap) is kept for a
    // while: forgetting it would leave its options unrestored, and a later
    // proof would take them for the socket's own. Cookies are never reused,
    // so a record of a socket that closed only waits out its time.
    for (cookie, p) in &history.proofs {
        let lives = report
            .processes
            .iter()
            .any(|q| q.pid == p.pid && q.start_ticks == Some(p.start_ticks) && q.state != 'Z');
        if lives && p.armed_for(now_ms) < KEEP_UNSEEN_PROOF_MS {
            next.proofs.entry(*cookie).or_insert_with(|| p.clone());
        }
    }

    // The control upstream the config promises, absent from the kernel.
    let wants_control = cfg.upstreams.iter().any(|u| u.role == Role::Control);
    let no_control = wants_control
        && !report
            .sockets
            .iter()
            .any(|s| s.role == "control" && !connecting(&s));
    let attempts = report
        .sockets
        .iter()
        .filter(|s| s.role == "control" && connecting(s))
        .count();
    // Absent for a moment is a reconnect; past `suspect_after` it is a fact.
    let mut control_absent = false;
    if no_control {
        let since = history.control_absent_since_ms.unwrap_or(now_ms);
        next.control_absent_since_ms = Some(since);
        let absent_ms = now_ms.saturating_sub(since);
        if absent_ms >= th.suspect_after.as_millis() as u64 {
            control_absent = true;
            reasons.push(reason(
                "control_absent",
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
        }
    }

    // Probes: failures, slowness, and the agent's story against the kernel.
    for p in probes {
        let r = match &p.error {
            Some(kind) => Some(reason(
                "probe_failed",
                Verdict::Unresponsive,
                format!("probe {} failed: {kind}", p.target),
            )),
            None if !p.expectations_met => Some(reason(
                "probe_unexpected",
                Verdict::Degraded,
                format!("probe {} answered, but not as expected", p.target),
            )),
            None if p
                .latency_ms
                .is_some_and(|ms| ms > th.probe_slow.as_millis() as u64) =>
            {
                Some(reason(
                    "probe_slow",
                    Verdict::Degraded,
                    format!(
                        "probe {} took {}",
                        p.target,
                        human_ms(p.latency_ms.unwrap_or(0))
                    ),
                ))
            }
            None => None,
        };
        if let Some(r) = r {
            reasons.push(with(
                with(r, "probe", p.target.clone()),
                "latency_ms",
                p.latency_ms,
            ));
        }
        if p.error.is_none()
            && p.expectations_met
            && p.makes_claims
            && (control_dead || control_absent)
        {
            let kernel = if control_absent {
                "there is no control connection"
            } else {
                "its control connection is dead"
            };
            reasons.push(with(
                reason(
                    "status_contradicts_kernel",
                    Verdict::Wedged,
                    format!("probe {} says all is well, but {kernel}", p.target),
                ),
                "probe",
                p.target.clone(),
            ));
        }
    }
    if let Some(task) = probes
        .iter()
        .filter(|p| p.error.is_none())
        .find_map(|p| p.fields.get(CURRENT_TASK))
    {
        let text = match task {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let since = match &history.current_task {
            Some((prev, since)) if *prev == text => *since,
            _ => now_ms,
        };
        next.current_task = Some((text.clone(), since));
        let unchanged = now_ms.saturating_sub(since);
        let stale = th.current_task_stale.as_millis() as u64;
        let upstream = report.sockets.iter().filter(|s| s.role != "other");
        let moved_since = upstream
            .clone()
            .filter_map(|s| s.tcp_info.as_ref())
            .any(|i| u64::from(i.last_data_recv_ms) < unchanged.min(stale));
        let working = !matches!(task, serde_json::Value::Null) && !text.is_empty();
        if working && unchanged >= stale && !moved_since {
            reasons.push(with(
                reason(
                    "status_contradicts_kernel",
                    Verdict::Wedged,
                    format!(
                        "current_task {text:?} unchanged for {} while no upstream connection received anything",
                        human_ms(unchanged)
                    ),
                ),
                "current_task",
                text,
            ));
        }
    }

    // Damage.
    let zombies = report.zombies.len();
    if zombies > th.zombies as usize {
        let mut msg = format!("{zombies} zombie processes (threshold {})", th.zombies);
        if let Some(d) = &report.init.diagnosis {
            msg = format!("{msg}; missing init: {d}");
        }
        reasons.push(with(
            reason("zombies", Verdict::Degraded, msg),
            "zombies",
            zombies,
        ));
    }
    for p in &report.processes {
        for t in p.threads.iter().filter(|t| t.state == 'D') {
            if t.idle_ms
                .is_some_and(|ms| ms >= th.d_state.as_millis() as u64)
            {
                let r = reason(
                    "d_state",
                    Verdict::Degraded,
                    format!(
                        "thread {} in uninterruptible sleep for {} ({})",
                        t.tid,
                        human_ms(t.idle_ms.unwrap_or(0)),
                        t.wchan.as_deref().unwrap_or("?")
                    ),
                );
                reasons.push(with(r, "tid", t.tid));
            }
        }
    }

    if reasons.is_empty() || reasons.iter().all(|r| r.verdict.is_ok()) {
        let base = if busy {
            Verdict::Busy
        } else if wants_control && control_alive {
            Verdict::Idle
        } else {
            Verdict::Healthy
        };
        if !reasons.iter().any(|r| r.verdict == base) {
            let msg = match base {
                Verdict::Idle => {
                    "no upstream call in flight; the control connection is alive".to_string()
                }
                Verdict::Healthy if probes.is_empty() => "running; nothing suspicious".to_string(),
                _ => "running; probes answer; nothing suspicious".to_string(),
            };
            reasons.push(reason(base.as_str(), base, msg));
        }
    }
    finish(reasons, work, next, now_ms)
}

fn finish(
    mut reasons: Vec<Reason>,
    work: Vec<ProofWork>,
    mut next: AgentHistory,
    now_ms: u64,
) -> (Judgement, AgentHistory) {
    reasons.sort_by_key(|r| std::cmp::Reverse(r.verdict.rank()));
    let verdict = reasons.first().map_or(Verdict::Healthy, |r| r.verdict);
    if next.verdict != Some(verdict) {
        next.verdict = Some(verdict);
        next.verdict_since_ms = now_ms;
    }
    (
        Judgement {
            verdict,
            reasons,
            work,
        },
        next,
    )
}

/// The start time of process `pid` of the report, if it was read.
fn start_ticks(report: &Report, pid: u32) -> Option<u64> {
    report
        .processes
        .iter()
        .find(|p| p.pid == pid)
        .and_then(|p| p.start_ticks)
}

#[cfg(test)]
mod tests;
