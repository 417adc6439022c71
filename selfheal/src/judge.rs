//! The judge: a pure function from an agent's config, its evidence (the
//! joined [`Report`](crate::inspect::Report) and its probe results) and its
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

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{
    config::{AgentConfig, Role, Thresholds},
    inspect::{Report, SocketReport, human_ms},
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
    /// Proven dead.
    Dead { code: &'static str, why: String },
}

fn liveness(s: &SocketReport, cfg: &AgentConfig) -> Liveness {
    let th = &cfg.thresholds;
    let upstream = s.upstream.and_then(|i| cfg.upstreams.get(i));
    let suspect_after = upstream
        .and_then(|u| u.suspect_after)
        .unwrap_or(th.suspect_after)
        .as_millis() as u64;
    if s.state == "CLOSE-WAIT" {
        return Liveness::Dead {
            code: "peer_closed",
            why: "the peer closed the connection; the agent has not".into(),
        };
    }
    let Some(i) = &s.tcp_info else {
        return Liveness::Alive("no tcp_info");
    };
    let silent = u64::from(i.last_data_recv_ms);
    if u32::from(i.probes) >= th.dead_probes {
        return Liveness::Dead {
            code: "peer_unresponsive",
            why: format!(
                "{} keepalive probe(s) unanswered, nothing from the peer for {}",
                i.probes,
                human_ms(silent)
            ),
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
            };
        }
    }
    if silent <= suspect_after {
        return Liveness::Alive("data arriving");
    }
    if u64::from(i.last_ack_recv_ms) <= suspect_after && i.last_ack_recv_ms < i.last_data_recv_ms {
        return Liveness::Alive("the peer still acknowledges");
    }
    Liveness::Suspect { silent_ms: silent }
}

/// Whether a provider socket carries a call now: a thread waits on it, or a
/// request went out after the last answer, or an answer is streaming in.
fn in_flight(
    s: &SocketReport,
    blocked_on: &BTreeMap<u64, (u32, u64)>,
    suspect_after_ms: u64,
) -> bool {
    if blocked_on.contains_key(&s.inode) {
        return true;
    }
    s.tcp_info.as_ref().is_some_and(|i| {
        i.last_data_sent_ms < i.last_data_recv_ms
            || u64::from(i.last_data_recv_ms) <= suspect_after_ms
    })
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
pub fn needs_thread_detail(cfg: &AgentConfig, report: &Report) -> bool {
    report
        .sockets
        .iter()
        .filter(|s| s.role != "other")
        .any(|s| !matches!(liveness(s, cfg), Liveness::Alive(_)))
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
        return finish(reasons, next, now_ms);
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

    // Threads blocked in a receive, by socket: (tid, age).
    let mut blocked_on: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
    for p in &report.processes {
        for t in &p.threads {
            if let (Some(inode), Some(age)) = (t.recv_inode, t.recv_blocked_ms) {
                let e = blocked_on.entry(inode).or_insert((t.tid, age));
                if age > e.1 {
                    *e = (t.tid, age);
                }
            }
        }
    }

    // Upstream sockets.
    let mut control_alive = false;
    let mut control_dead = false;
    let mut busy = false;
    // A connection attempt (SYN sent, no answer yet) has exchanged no data:
    // its tcp_info silences are meaningless. It is judged as what it is,
    // the absence of a connection, below.
    let connecting = |s: &&SocketReport| s.state == "SYN-SENT";
    for s in report
        .sockets
        .iter()
        .filter(|s| s.role != "other" && !connecting(s))
    {
        let suspect_after = s
            .upstream
            .and_then(|i| cfg.upstreams.get(i))
            .and_then(|u| u.suspect_after)
            .unwrap_or(th.suspect_after)
            .as_millis() as u64;
        let control = s.role == "control";
        match liveness(s, cfg) {
            Liveness::Dead { code, why } => {
                control_dead |= control;
                let r = reason(
                    code,
                    Verdict::Wedged,
                    format!("{} connection to {}: {why}", s.role, s.remote),
                );
                reasons.push(socket_reason(r, s));
                if let Some(&(tid, age)) = blocked_on
                    .get(&s.inode)
                    .filter(|(_, age)| *age >= th.recv_blocked.as_millis() as u64)
                {
                    let r = reason(
                        "recv_blocked",
                        Verdict::Wedged,
                        format!(
                            "thread {tid} has been blocked {} in a receive on that dead connection",
                            human_ms(age)
                        ),
                    );
                    reasons.push(with(
                        with(with(r, "tid", tid), "inode", s.inode),
                        "age_ms",
                        age,
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
                let task = claimed_task.as_ref().filter(|_| s.role == "provider");
                if control || in_flight(s, &blocked_on, suspect_after) || task.is_some() {
                    busy |= !control;
                    let waiting = match (blocked_on.get(&s.inode), task) {
                        (Some((tid, age)), _) => {
                            format!("; thread {tid} waiting {}", human_ms(*age))
                        }
                        (None, Some(task)) => format!("; the agent reports current_task {task:?}"),
                        (None, None) => String::new(),
                    };
                    let r = reason(
                        "suspect",
                        if control {
                            Verdict::Idle
                        } else {
                            Verdict::Busy
                        },
                        format!(
                            "{} connection to {} silent for {} (suspect for {}){waiting}: no proof the peer is dead or alive yet",
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
                if !control && in_flight(s, &blocked_on, suspect_after) {
                    busy = true;
                    let r = reason(
                        "call_in_flight",
                        Verdict::Busy,
                        format!("provider call to {} in flight: {how}", s.remote),
                    );
                    reasons.push(socket_reason(r, s));
                }
            }
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
    finish(reasons, next, now_ms)
}

fn finish(
    mut reasons: Vec<Reason>,
    mut next: AgentHistory,
    now_ms: u64,
) -> (Judgement, AgentHistory) {
    reasons.sort_by_key(|r| std::cmp::Reverse(r.verdict.rank()));
    let verdict = reasons.first().map_or(Verdict::Healthy, |r| r.verdict);
    if next.verdict != Some(verdict) {
        next.verdict = Some(verdict);
        next.verdict_since_ms = now_ms;
    }
    (Judgement { verdict, reasons }, next)
}

#[cfg(test)]
mod tests;
