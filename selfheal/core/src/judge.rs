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
//! Proof is also asked for: every established upstream socket silent past
//! its threshold with nothing unacknowledged is handed to the prove stage
//! ([`ProofWork`]), whether or not a call is known to be in flight on it (a
//! provider that sent its response head first leaves an event-loop agent's
//! awaited socket looking like an idle pooled one). The judge then reads
//! the proof keepalive ([`Proof`]): answered, the socket is alive; `count`
//! probes unanswered, each given its interval, it is dead.
//!
//! Whether a call may be waiting decides what a dead connection *means*:
//! a thread waits on it (in a receive, `poll`, `select`, or with it in the
//! epoll set of a thread waiting in `epoll_wait`), or the last thing on it
//! was a send (ties included), or nothing has come back since a request went
//! out (kept across checks), or the agent reports a task: the agent is
//! `wedged`. Nobody can be waiting on it (an idle pooled connection): it is
//! `idle_connection_dead`, and it is ended before a request is sent into it.
//! A connection attempt the peer has not answered past the upstream's
//! `connect_timeout` is `connect_timeout` (`unresponsive`), and it is ended
//! so the caller's connect fails now.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub use crate::model::{DeadSocket, ReasonCode};
use crate::{
    config::{AgentConfig, Role, Thresholds},
    inspect::{Report, SocketReport, human_ms},
    model::{DeadKind, GapKind, SocketRole, TcpState},
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
    pub code: ReasonCode,
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
    /// The sockets proven dead that an action can address (their holder's
    /// fd and start time were read), for the ladder.
    #[serde(skip)]
    pub dead: Vec<DeadSocket>,
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
    /// Upstream connection attempts (SYN sent, no answer), by cookie: since
    /// when they were first seen.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub connecting_since_ms: BTreeMap<u64, u64>,
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
        code: ReasonCode,
        why: String,
        by_proof: bool,
    },
}

/// How long a proof whose socket is not in the report is kept while its
/// process lives (10 minutes: past the kernel's own deadline for a dead
/// peer, `actions::keepalive::PROOF_HOLD`).
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
        let armed_for = p.armed_for(now_ms);
        if silent < armed_for {
            return Liveness::Alive("data arriving");
        }
        if u64::from(i.last_ack_recv_ms) < armed_for {
            return Liveness::Alive("the peer answered the proof keepalive");
        }
        if i.unacked == 0 && p.proves_dead(i.probes, armed_for) {
            return Liveness::Dead {
                code: ReasonCode::PeerUnresponsive,
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
                code: ReasonCode::ControlSilent,
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
    /// Threads waiting on the socket in all (one connection may carry
    /// several calls: HTTP/2, gRPC); this one waited longest.
    threads: u32,
}

/// ", with N other thread(s) waiting on it" for a socket several threads
/// wait on (one connection, several calls), or nothing.
fn others(threads: u32) -> String {
    match threads.saturating_sub(1) {
        0 => String::new(),
        n => format!(", with {n} other thread(s) waiting on it"),
    }
}

/// What a waiting thread sits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    /// A blocking receive on the socket.
    Recv,
    /// `poll`/`select` with the socket in its read set.
    Poll,
}

fn reason(code: ReasonCode, verdict: Verdict, message: String) -> Reason {
    Reason {
        code,
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
        with(with(r, "inode", s.inode), "role", s.role.as_str()),
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

/// A connection attempt (SYN sent, no answer yet) has exchanged no data:
/// its tcp_info silences are meaningless. It is judged as what it is: the
/// absence of a connection ([`Judging::control_absent`]), and an attempt
/// that has waited too long ([`Judging::connect_attempt`]).
fn connecting(s: &SocketReport) -> bool {
    s.state == TcpState::SynSent
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
        .filter(|s| s.role.is_upstream())
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
///
/// The rules run in families, each its own method of `Judging`: the
/// upstream sockets one by one, the control upstream's absence, the probes,
/// the agent's `current_task` against the kernel, and damage (zombies,
/// D-state). Then the base verdict when nothing is wrong.
pub fn judge(
    cfg: &AgentConfig,
    report: &Report,
    probes: &[ProbeView],
    history: &AgentHistory,
    now_ms: u64,
) -> (Judgement, AgentHistory) {
    let mut j = Judging {
        cfg,
        report,
        history,
        now_ms,
        next: AgentHistory {
            verdict: history.verdict,
            verdict_since_ms: history.verdict_since_ms,
            ..AgentHistory::default()
        },
        reasons: Vec::new(),
        work: Vec::new(),
        dead: Vec::new(),
    };
    if report.processes.iter().all(|p| p.state == 'Z') {
        let why = report
            .gaps
            .iter()
            .find(|g| g.kind == GapKind::NoProcess)
            .map(|g| g.text.clone());
        j.reasons.push(reason(
            ReasonCode::NoProcess,
            Verdict::Down,
            why.unwrap_or_else(|| "no process matches the agent's rule".into()),
        ));
        return j.finish();
    }
    let task = claimed_task(probes);
    let waiting = waiters(report);
    let event_loop = event_loop_sockets(report);
    let mut up = Upstreams::default();
    for s in report.sockets.iter().filter(|s| s.role.is_upstream()) {
        if connecting(s) {
            j.connect_attempt(s);
        } else {
            j.upstream_socket(s, &waiting, &event_loop, task.as_deref(), &mut up);
        }
    }
    j.keep_unseen_proofs();
    let control_absent = j.control_absent();
    j.probes(probes, up.control_dead, control_absent);
    j.current_task(probes);
    j.damage();
    j.base_verdict(&up, control_absent, probes.is_empty());
    j.finish()
}

/// The agent says it is working on something (an event loop waiting on a
/// provider shows no thread blocked in a receive): a silent provider call
/// is then in flight, not abandoned. Only ever a reason for busy over idle,
/// never for a wedge.
fn claimed_task(probes: &[ProbeView]) -> Option<String> {
    probes
        .iter()
        .filter(|p| p.error.is_none())
        .filter_map(|p| p.fields.get(CURRENT_TASK))
        .find(|t| !t.is_null() && t.as_str() != Some(""))
        .map(|t| t.as_str().map_or_else(|| t.to_string(), str::to_string))
}

/// Threads waiting on a socket, by inode: in a receive (procfs or eBPF), or
/// in poll/select with it in the read set. The longest wait wins, a receive
/// over a poll. An event loop's epoll set is not counted: it holds idle
/// connections too; the socket's own history decides there.
fn waiters(report: &Report) -> BTreeMap<u64, Waiter> {
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
fn event_loop_sockets(report: &Report) -> BTreeSet<u64> {
    report
        .processes
        .iter()
        .flat_map(|p| &p.threads)
        .filter(|t| t.wait_event_loop)
        .flat_map(|t| t.wait_inodes.iter().copied())
        .collect()
}

/// What the upstream sockets showed, for the rules after them.
#[derive(Default)]
struct Upstreams {
    /// A control connection is alive (or unproven either way).
    control_alive: bool,
    /// A control connection is proven dead.
    control_dead: bool,
    /// A provider call is in flight.
    busy: bool,
}

/// How one upstream socket stands, as its rules need it.
struct SocketView<'s> {
    s: &'s SocketReport,
    control: bool,
    /// A control upstream with a heartbeat is proven by its silence (3 ×
    /// the heartbeat): no proof keepalive is armed on it.
    heartbeat: bool,
    proof: Option<&'s Proof>,
    /// A request is out and nothing came back.
    pending: bool,
    /// The task the agent reports, for a provider socket.
    task: Option<&'s str>,
    /// A call is in flight on it.
    awaited: bool,
    /// A call is or may be waiting on it: `awaited`, or it is in the epoll
    /// set of a waiting thread.
    may_wait: bool,
    waiter: Option<Waiter>,
    /// "; the peer answered …", or nothing.
    answered: String,
}

/// One judging of one agent: what it reads, and what it builds.
struct Judging<'a> {
    cfg: &'a AgentConfig,
    report: &'a Report,
    history: &'a AgentHistory,
    now_ms: u64,
    next: AgentHistory,
    reasons: Vec<Reason>,
    work: Vec<ProofWork>,
    dead: Vec<DeadSocket>,
}

impl<'a> Judging<'a> {
    fn th(&self) -> &'a Thresholds {
        &self.cfg.thresholds
    }

    /// The rules of one upstream socket.
    fn upstream_socket<'s>(
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
        let suspect_after = upstream
            .and_then(|u| u.suspect_after)
            .unwrap_or(self.th().suspect_after)
            .as_millis() as u64;
        let control = s.role == SocketRole::Control;
        let proof = proof_of(s, self.history);
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
        let liveness = liveness(s, self.cfg, proof, self.now_ms);
        self.keep_proof(s, proof, &liveness);
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
        let dead = matches!(liveness, Liveness::Dead { .. });
        match liveness {
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
    /// its options are put back) or the socket goes.
    fn keep_proof(&mut self, s: &SocketReport, proof: Option<&Proof>, liveness: &Liveness) {
        let Some(p) = proof else { return };
        self.next.proofs.insert(s.cookie, p.clone());
        let given_up = p.restore_failures >= crate::prove::MAX_RESTORE_FAILURES;
        let alive = matches!(liveness, Liveness::Alive(_));
        if (alive || !self.cfg.proof.keepalive) && !given_up {
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
    fn dead_socket(&mut self, v: &SocketView<'_>, code: ReasonCode, why: String, by_proof: bool) {
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
        if let (Some(fd), Some(start)) = (s.fd, start_ticks(self.report, s.pid))
            && !self.dead.iter().any(|d| d.inode == s.inode)
        {
            self.dead.push(DeadSocket {
                pid: s.pid,
                start_ticks: start,
                fd,
                inode: s.inode,
                cookie: s.cookie,
                unacked: s.tcp_info.as_ref().map_or(0, |i| i.unacked),
                by_proof,
                kind,
            });
        }
        let recv_blocked_ms = self.th().recv_blocked.as_millis() as u64;
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
    fn suspect_socket(&mut self, v: &SocketView<'_>, silent_ms: u64) {
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
    fn proving(&mut self, v: &SocketView<'_>, silent_ms: u64) -> String {
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
    fn silence_exceeded(&mut self, s: &SocketReport, upstream: Option<&crate::config::Upstream>) {
        let max_silence = upstream.map_or(crate::config::DEFAULT_MAX_SILENCE, |u| u.max_silence);
        let silent = s.tcp_info.as_ref().map_or(0, call_silence);
        if silent <= max_silence.as_millis() as u64 {
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
                human_ms(max_silence.as_millis() as u64)
            ),
        );
        self.reasons.push(socket_reason(r, s));
    }

    /// A connection attempt to an upstream: how long its SYN has gone
    /// unanswered (since it was first seen, or at least the kernel's own
    /// retransmission schedule: `retransmits` SYNs resent 1 s, 2 s, 4 s …
    /// apart), and past the upstream's `connect_timeout`, a finding the
    /// ladder ends so the caller's connect fails now.
    fn connect_attempt(&mut self, s: &SocketReport) {
        let since = self
            .history
            .connecting_since_ms
            .get(&s.cookie)
            .copied()
            .unwrap_or(self.now_ms);
        self.next.connecting_since_ms.insert(s.cookie, since);
        let resent = s.tcp_info.as_ref().map_or(0, |i| i.retransmits);
        let by_schedule = ((1u64 << resent.min(20)) - 1).saturating_mul(1_000);
        let waited = self.now_ms.saturating_sub(since).max(by_schedule);
        let limit = s
            .upstream
            .and_then(|i| self.cfg.upstreams.get(i))
            .map_or(crate::config::DEFAULT_CONNECT_TIMEOUT, |u| {
                u.connect_timeout
            })
            .as_millis() as u64;
        if waited <= limit {
            return;
        }
        let r = reason(
            ReasonCode::ConnectTimeout,
            Verdict::Unresponsive,
            format!(
                "{} connection to {}: the peer never answered the handshake ({} SYN(s) resent over at least {}, past its connect_timeout of {}); ending the attempt so the connect fails now",
                s.role,
                s.remote,
                resent,
                human_ms(waited),
                human_ms(limit)
            ),
        );
        self.reasons
            .push(with(socket_reason(r, s), "waited_ms", waited));
        if let (Some(fd), Some(start)) = (s.fd, start_ticks(self.report, s.pid)) {
            self.dead.push(DeadSocket {
                pid: s.pid,
                start_ticks: start,
                fd,
                inode: s.inode,
                cookie: s.cookie,
                unacked: s.tcp_info.as_ref().map_or(0, |i| i.unacked),
                by_proof: false,
                kind: DeadKind::Connecting,
            });
        }
    }

    /// A proof whose socket this report lacks while its process lives (a
    /// socket table that could not be read, a moment's gap) is kept for a
    /// while: forgetting it would leave its options unrestored, and a later
    /// proof would take them for the socket's own. Cookies are never
    /// reused, so a record of a socket that closed only waits out its time.
    fn keep_unseen_proofs(&mut self) {
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
    fn control_absent(&mut self) -> bool {
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
        if absent_ms < self.th().suspect_after.as_millis() as u64 {
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

    fn wants_control(&self) -> bool {
        self.cfg.upstreams.iter().any(|u| u.role == Role::Control)
    }

    /// Probes: failures, slowness, and an "all is well" against a control
    /// connection the kernel shows dead or absent.
    fn probes(&mut self, probes: &[ProbeView], control_dead: bool, control_absent: bool) {
        let slow_ms = self.th().probe_slow.as_millis() as u64;
        for p in probes {
            let r = match &p.error {
                Some(kind) => Some(reason(
                    ReasonCode::ProbeFailed,
                    Verdict::Unresponsive,
                    format!("probe {} failed: {kind}", p.target),
                )),
                None if !p.expectations_met => Some(reason(
                    ReasonCode::ProbeUnexpected,
                    Verdict::Degraded,
                    format!("probe {} answered, but not as expected", p.target),
                )),
                None if p.latency_ms.is_some_and(|ms| ms > slow_ms) => Some(reason(
                    ReasonCode::ProbeSlow,
                    Verdict::Degraded,
                    format!(
                        "probe {} took {}",
                        p.target,
                        human_ms(p.latency_ms.unwrap_or(0))
                    ),
                )),
                None => None,
            };
            if let Some(r) = r {
                self.reasons.push(with(
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
                self.reasons.push(with(
                    reason(
                        ReasonCode::StatusContradictsKernel,
                        Verdict::Wedged,
                        format!("probe {} says all is well, but {kernel}", p.target),
                    ),
                    "probe",
                    p.target.clone(),
                ));
            }
        }
    }

    /// The agent's `current_task`, unchanged past its threshold while no
    /// upstream connection received anything.
    fn current_task(&mut self, probes: &[ProbeView]) {
        let Some(task) = probes
            .iter()
            .filter(|p| p.error.is_none())
            .find_map(|p| p.fields.get(CURRENT_TASK))
        else {
            return;
        };
        let text = match task {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let since = match &self.history.current_task {
            Some((prev, since)) if *prev == text => *since,
            _ => self.now_ms,
        };
        self.next.current_task = Some((text.clone(), since));
        let unchanged = self.now_ms.saturating_sub(since);
        let stale = self.th().current_task_stale.as_millis() as u64;
        let moved_since = self
            .report
            .sockets
            .iter()
            .filter(|s| s.role.is_upstream())
            .filter_map(|s| s.tcp_info.as_ref())
            .any(|i| u64::from(i.last_data_recv_ms) < unchanged.min(stale));
        let working = !matches!(task, serde_json::Value::Null) && !text.is_empty();
        if working && unchanged >= stale && !moved_since {
            self.reasons.push(with(
                reason(
                    ReasonCode::StatusContradictsKernel,
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

    /// Damage: zombies past the threshold, threads in D-state too long.
    fn damage(&mut self) {
        let th = self.th();
        let report = self.report;
        // Every zombie is counted in `init.zombies`; the list is capped.
        let zombies = report.zombies.len().max(report.init.zombies);
        if zombies > th.zombies as usize {
            let mut msg = format!("{zombies} zombie processes (threshold {})", th.zombies);
            if let Some(d) = &report.init.diagnosis {
                msg = format!("{msg}; missing init: {d}");
            }
            self.reasons.push(with(
                reason(ReasonCode::Zombies, Verdict::Degraded, msg),
                "zombies",
                zombies,
            ));
        }
        let d_state_ms = th.d_state.as_millis() as u64;
        for t in report
            .processes
            .iter()
            .flat_map(|p| &p.threads)
            .filter(|t| t.state == 'D')
        {
            if t.idle_ms.is_some_and(|ms| ms >= d_state_ms) {
                let r = reason(
                    ReasonCode::DState,
                    Verdict::Degraded,
                    format!(
                        "thread {} in uninterruptible sleep for {} ({})",
                        t.tid,
                        human_ms(t.idle_ms.unwrap_or(0)),
                        t.wchan.as_deref().unwrap_or("?")
                    ),
                );
                self.reasons.push(with(r, "tid", t.tid));
            }
        }
    }

    /// When nothing is wrong: busy (a call in flight), idle (the control
    /// connection is alive) or healthy, said once.
    fn base_verdict(&mut self, up: &Upstreams, _control_absent: bool, no_probes: bool) {
        if !self.reasons.iter().all(|r| r.verdict.is_ok()) {
            return;
        }
        let (base, code) = if up.busy {
            (Verdict::Busy, ReasonCode::Busy)
        } else if self.wants_control() && up.control_alive {
            (Verdict::Idle, ReasonCode::Idle)
        } else {
            (Verdict::Healthy, ReasonCode::Healthy)
        };
        // A reason that already says the base verdict stands for it; the
        // healthy base is always said in its own words.
        if base != Verdict::Healthy && self.reasons.iter().any(|r| r.verdict == base) {
            return;
        }
        let msg = match base {
            Verdict::Idle => "no upstream call in flight; the control connection is alive",
            Verdict::Healthy if no_probes => "running; nothing suspicious",
            _ => "running; probes answer; nothing suspicious",
        };
        self.reasons.push(reason(code, base, msg.to_string()));
    }

    /// Worst reason first; the verdict is the worst reason's.
    fn finish(self) -> (Judgement, AgentHistory) {
        let mut reasons = self.reasons;
        let mut next = self.next;
        reasons.sort_by_key(|r| std::cmp::Reverse(r.verdict.rank()));
        let verdict = reasons.first().map_or(Verdict::Healthy, |r| r.verdict);
        if next.verdict != Some(verdict) {
            next.verdict = Some(verdict);
            next.verdict_since_ms = self.now_ms;
        }
        (
            Judgement {
                verdict,
                reasons,
                work: self.work,
                dead: self.dead,
            },
            next,
        )
    }
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
