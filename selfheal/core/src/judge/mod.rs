//! The judge: a pure function from an agent's config, its evidence (the
//! joined [`crate::inspect::Report`] and its probe results) and its
//! history to a verdict with reasons. No I/O, no clock: the time is passed
//! in (`CLOCK_BOOTTIME` milliseconds, with `CLOCK_MONOTONIC` beside them
//! where read, to tell a suspend), and the updated history comes back for
//! the caller to store.
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
//! so the caller's connect fails now; its age is measured (first seen, or
//! the SYN's retransmission timeouts that ran out), never inferred from an
//! assumed schedule.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub use crate::model::{DeadSocket, ReasonCode};
use crate::{
    config::{AgentConfig, Role, Thresholds},
    inspect::{Report, SocketReport, human_ms},
    model::{DeadKind, GapKind, SocketRole, TcpState},
    progress::Progress,
    prove::{Answer, Answered, Proof, ProofTarget, ProofWork},
};

mod liveness;
mod sockets;
mod stalled;

pub use self::stalled::{ConnectionProgress, progress_of};

use self::liveness::{
    Liveness, Waiter, call_silence, closed_seen_ms, connecting, event_loop_sockets, in_flight,
    liveness, others, proof_held, proof_of, request_out, waiters,
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
    /// Every verdict, best first (in [`Verdict::rank`] order).
    pub const ALL: [Verdict; 7] = [
        Self::Healthy,
        Self::Idle,
        Self::Busy,
        Self::Degraded,
        Self::Unresponsive,
        Self::Wedged,
        Self::Down,
    ];

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

display_as_str!(Verdict);

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
    /// Upstream sockets in CLOSE-WAIT (the peer closed), by cookie: since
    /// when they were first seen so. Keepalive probes on such a socket are
    /// answered by the peer's leftover FIN-WAIT-2 socket, so its last ACK
    /// does not date the close.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub closed_since_ms: BTreeMap<u64, u64>,
    /// What arrived on each established upstream connection, by cookie:
    /// whether a call that is talking makes progress ([`Progress`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub progress: BTreeMap<u64, Progress>,
}

/// The field a probe names `current_task` (design: the agent's own story of
/// what it is doing).
pub const CURRENT_TASK: &str = "current_task";

/// How long a proof whose socket is not in the report is kept while its
/// process lives (10 minutes: past the kernel's own deadline for a dead
/// peer, `actions::keepalive::PROOF_HOLD`).
const KEEP_UNSEEN_PROOF_MS: u64 = 600_000;

/// How long a peer's close may go unnoticed before it counts against the
/// agent (`peer_closed`).
const CLOSE_WAIT_GRACE_MS: u64 = 2_000;

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
                    liveness(
                        s,
                        cfg,
                        proof_of(s, history),
                        closed_seen_ms(s, history, now_ms),
                        history
                            .progress
                            .get(&s.cookie)
                            .and_then(|p| p.keepalive_only_ms(now_ms)),
                        now_ms,
                        report.read_ms.unwrap_or(now_ms),
                    ),
                    Liveness::Alive(_)
                )
        })
        || report
            .processes
            .iter()
            .flat_map(|p| &p.threads)
            .any(|t| t.state == 'D')
}

/// Judges one agent at `now`. Returns the judgement and the history to
/// store. Every age is `CLOCK_BOOTTIME`'s; `CLOCK_MONOTONIC`, where given
/// (a [`crate::clock::Now`] of both; a bare `u64` is `CLOCK_BOOTTIME` ms
/// alone), tells the time the machine was suspended since the last check,
/// which a stream's keepalive-only span does not count
/// ([`crate::progress`]).
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
    now: impl Into<crate::clock::Now>,
) -> (Judgement, AgentHistory) {
    let now = now.into();
    let now_ms = now.boot_ms;
    let mut j = Judging {
        cfg,
        report,
        history,
        now_ms,
        now,
        next: AgentHistory {
            verdict: history.verdict,
            verdict_since_ms: history.verdict_since_ms,
            ..AgentHistory::default()
        },
        reasons: Vec::new(),
        work: Vec::new(),
        dead: Vec::new(),
    };
    if let Some(why) = unjudgeable(report) {
        j.reasons.push(reason(
            ReasonCode::OverBudget,
            Verdict::Unresponsive,
            format!("not judged: {why}"),
        ));
        return j.finish();
    }
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

/// Why a report whose evidence is whole still cannot be judged, if so.
/// It is not judged, as evidence cut at the collection budget is not
/// (`unresponsive`, `over_budget`), when:
/// - the listening sockets of a network namespace it has connections in
///   could not be read ([`GapKind::Listening`]): none of those connections
///   got a role, so a dead upstream among them would pass for an agent
///   with no upstream call (`idle`);
/// - its rule matched no live process while command lines it had to match
///   could not be read (in time, or at all): one of those may be the
///   agent's, so it is not `down`.
pub fn unjudgeable(report: &Report) -> Option<String> {
    if let Some(g) = report.gaps.iter().find(|g| g.kind == GapKind::Listening) {
        return Some(g.text.clone());
    }
    if !report.processes.iter().all(|p| p.state == 'Z') {
        return None;
    }
    let unread = report.gaps.iter().find(|g| g.kind == GapKind::Unread)?;
    Some(format!("no process matched, and {unread}"))
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
    /// `now_ms`, with `CLOCK_MONOTONIC` where it was read.
    now: crate::clock::Now,
    next: AgentHistory,
    reasons: Vec<Reason>,
    work: Vec<ProofWork>,
    dead: Vec<DeadSocket>,
}

impl<'a> Judging<'a> {
    fn th(&self) -> &'a Thresholds {
        &self.cfg.thresholds
    }

    /// Probes: failures, slowness, and an "all is well" against a control
    /// connection the kernel shows dead or absent.
    fn probes(&mut self, probes: &[ProbeView], control_dead: bool, control_absent: bool) {
        let slow_ms = crate::clock::ms(self.th().probe_slow);
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
        let stale = crate::clock::ms(self.th().current_task_stale);
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
        let d_state_ms = crate::clock::ms(th.d_state);
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
