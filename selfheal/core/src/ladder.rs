//! The healing ladder: a pure policy from a wedged agent's judgement, its
//! evidence and its healing history to the next step — the gentlest that
//! fits the reason, escalating only when the previous step did not clear the
//! wedge within its window, within budgets, with backoff, and a circuit
//! breaker that gives up (and says so) rather than storm.
//!
//! Rungs, gentlest first:
//! 1. on each dead socket, `expire_keepalive` where the prove stage's
//!    keepalive already went unanswered (the kernel ends the connection as
//!    a keepalive timeout, now that the snapshot is written), else
//!    `arm_keepalive`: either way the agent's blocked read fails and its
//!    own reconnect logic runs. Death is already proven when this rung is
//!    armed (silence past 3 × the heartbeat, unanswered probes, a FIN), so
//!    `arm_keepalive` ends the connection about 5 s later — its probes
//!    are the live peer's last chance to answer, and its user timeout is
//!    derived from the silence observed rather than a fixed floor (see
//!    `selfheal::actions::keepalive::Keepalive` for why a slow live link survives):
//!    the first rung completes well before a 30 s timer's next run;
//! 2. `destroy_socket` on each dead socket still there;
//! 3. `signal` (SIGTERM, then SIGKILL after the grace), if the config allows;
//! 4. `restart` with the configured command, if there is one, or (with
//!    `restart = { runtime = true }`) `restart_container`: the agent's one
//!    container restarted through its runtime.
//!
//! No I/O, no clock: `now_ms` (`CLOCK_BOOTTIME`) comes in, the caller
//! executes the step and records it with [`HealHistory::record`].

use serde::{Deserialize, Serialize};

use crate::{
    config::HealConfig,
    inspect::Report,
    judge::{Judgement, Verdict},
    model::{DeadKind, DeadSocket},
    protocol::{Act, ContainerRestart, SocketRef},
};

/// The acts that end or probe one socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketStep {
    ArmKeepalive,
    ExpireKeepalive,
    Destroy,
}

impl SocketStep {
    /// This act on `socket` of process `pid`/`start_ticks`.
    pub fn on(self, pid: u32, start_ticks: u64, socket: SocketRef) -> Act {
        match self {
            SocketStep::ArmKeepalive => Act::ArmKeepalive {
                pid,
                start_ticks,
                socket,
            },
            SocketStep::ExpireKeepalive => Act::ExpireKeepalive {
                pid,
                start_ticks,
                socket,
            },
            SocketStep::Destroy => Act::DestroySocket {
                pid,
                start_ticks,
                socket,
            },
        }
    }
}

/// What the ladder decides.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Decision {
    /// Nothing to heal (not wedged), or not allowed to.
    Nothing { why: String },
    /// Take these steps now (one rung; one step per dead socket).
    Act { steps: Vec<Act> },
    /// A step was taken; give it time, or respect the backoff.
    Wait { why: String, until_ms: u64 },
    /// Every allowed rung was tried, or the budget is spent: stop acting.
    GaveUp { why: String },
}

/// One action taken.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionRecord {
    pub at_ms: u64,
    pub step: Act,
    pub ok: bool,
    pub detail: String,
}

/// What the ladder remembers of an agent between checks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealHistory {
    /// Actions of the last hour, oldest first.
    #[serde(default)]
    pub actions: Vec<ActionRecord>,
    /// The rung the current wedge has reached, if one is being healed.
    #[serde(default)]
    pub rung: Option<u8>,
    /// Steps taken on this wedge (each one that is followed by another did
    /// not clear it).
    #[serde(default)]
    pub steps_this_wedge: u32,
    /// Set when the breaker opened: no action until the agent recovers.
    #[serde(default)]
    pub gave_up: Option<String>,
}

const HOUR_MS: u64 = 3_600_000;

impl HealHistory {
    /// Records a step taken at `now_ms`.
    pub fn record(&mut self, now_ms: u64, step: Act, ok: bool, detail: String) {
        self.rung = Some(self.rung.map_or(step.rung(), |r| r.max(step.rung())));
        self.steps_this_wedge = self.steps_this_wedge.saturating_add(1);
        self.actions.push(ActionRecord {
            at_ms: now_ms,
            step,
            ok,
            detail,
        });
    }

    /// Records a step that ended a dead connection nobody waits on, or a
    /// hung connect, in an agent that is not wedged: in the hour's actions
    /// (budgets, the step window), but not as a rung of a wedge.
    pub fn record_ending(&mut self, now_ms: u64, step: Act, ok: bool, detail: String) {
        self.actions.push(ActionRecord {
            at_ms: now_ms,
            step,
            ok,
            detail,
        });
    }

    fn last_action_ms(&self) -> Option<u64> {
        self.actions.last().map(|a| a.at_ms)
    }

    fn within_hour(&self, now_ms: u64) -> impl Iterator<Item = &ActionRecord> {
        self.actions
            .iter()
            .filter(move |a| now_ms.saturating_sub(a.at_ms) < HOUR_MS)
    }
}

/// The dead sockets the judge found that the evidence still holds, each
/// addressed as it is now (its holder and fd in `report`, which may be a
/// fresher read than the judge's) and with its unacknowledged data as now.
fn dead_sockets(j: &Judgement, report: &Report) -> Vec<DeadSocket> {
    j.dead
        .iter()
        .filter_map(|d| {
            let s = report.sockets.iter().find(|s| s.inode == d.inode)?;
            let start_ticks = report
                .processes
                .iter()
                .find(|p| p.pid == s.pid)?
                .start_ticks?;
            Some(DeadSocket {
                pid: s.pid,
                start_ticks,
                fd: s.fd?,
                unacked: s.tcp_info.as_ref().map_or(0, |i| i.unacked),
                ..*d
            })
        })
        .collect()
}

/// The one container the agent's processes are in, for a runtime restart
/// (none on the host, and none when they span several: which one to
/// restart is then not ours to guess).
fn the_container(report: &Report) -> Option<&crate::runtime::Identity> {
    match report.containers.as_slice() {
        [one] => Some(one),
        _ => None,
    }
}

/// Decides the next step for an agent. `hist` is updated for the new
/// situation (a recovered agent's ladder is reset; a breaker opens).
///
/// In order: a recovered agent resets the ladder; an open breaker, a
/// stopped process, the last step's window and the backoff hold it
/// (`hold`); then the next rung that has steps (`next_rung`), within
/// the budgets (`over_budget`).
pub fn decide(
    cfg: &HealConfig,
    j: &Judgement,
    report: &Report,
    hist: &mut HealHistory,
    now_ms: u64,
) -> Decision {
    hist.actions
        .retain(|a| now_ms.saturating_sub(a.at_ms) < HOUR_MS);
    if j.verdict != Verdict::Wedged {
        // Recovered (or never wedged): the next wedge starts at the bottom.
        hist.rung = None;
        hist.steps_this_wedge = 0;
        hist.gave_up = None;
        return end_unawaited(cfg, j, report, hist, now_ms).unwrap_or_else(|| Decision::Nothing {
            why: format!("{} is not wedged", j.verdict),
        });
    }
    if let Some(d) = hold(cfg, report, hist, now_ms) {
        return d;
    }
    let Some(steps) = next_rung(cfg, j, report, hist) else {
        let why = if hist.rung.is_none() {
            "no step fits: no dead socket to act on, and neither signal nor restart is enabled in [agent.heal]".to_string()
        } else {
            format!(
                "every allowed step was tried ({} action(s) this hour) and the agent is still wedged",
                hist.within_hour(now_ms).count()
            )
        };
        hist.gave_up = Some(why.clone());
        return Decision::GaveUp { why };
    };
    if let Some(why) = over_budget(cfg, &steps, hist, now_ms) {
        hist.gave_up = Some(why.clone());
        return Decision::GaveUp { why };
    }
    Decision::Act { steps }
}

/// For an agent that is not wedged: the dead connections nobody waits on
/// (an idle pooled one, proven dead by the prove stage's keepalive: its
/// keepalive is expired) and the connection attempts past their
/// `connect_timeout` (destroyed, so the connect fails now), within the
/// action budget. A socket acted on within the step window is given that
/// window (`Wait`). `None` when there is none.
fn end_unawaited(
    cfg: &HealConfig,
    j: &Judgement,
    report: &Report,
    hist: &HealHistory,
    now_ms: u64,
) -> Option<Decision> {
    if !cfg.sockets {
        return None;
    }
    let window = crate::clock::ms(cfg.step_window);
    // When a step on this socket was taken within the window.
    let recent = |inode: u64| {
        hist.actions.iter().rev().find_map(|a| {
            (now_ms.saturating_sub(a.at_ms) < window
                && matches!(a.step,
                    Act::ExpireKeepalive { socket, .. } | Act::DestroySocket { socket, .. } if socket.inode == inode))
            .then_some(a.at_ms)
        })
    };
    let (waiting, fresh): (Vec<DeadSocket>, Vec<DeadSocket>) = dead_sockets(j, report)
        .into_iter()
        .filter(|d| d.kind != DeadKind::Awaited)
        .partition(|d| recent(d.inode).is_some());
    if fresh.is_empty() {
        // Ended within the window: given its time (and its proof is not
        // put back meanwhile).
        let last = waiting.iter().filter_map(|d| recent(d.inode)).max()?;
        return Some(Decision::Wait {
            why: "giving the dead connection(s) already ended their window".into(),
            until_ms: last.saturating_add(window),
        });
    }
    let steps: Vec<Act> = fresh
        .into_iter()
        .map(|d| expire_or(&d, SocketStep::Destroy))
        .collect();
    if steps.is_empty() {
        return None;
    }
    Some(match over_budget(cfg, &steps, hist, now_ms) {
        Some(why) => Decision::Nothing {
            why: format!("dead connection(s) nobody waits on left open: {why}"),
        },
        None => Decision::Act { steps },
    })
}

/// What keeps a wedged agent's ladder from acting now: a breaker already
/// open, a process stopped on purpose, the last step's window, the backoff.
fn hold(cfg: &HealConfig, report: &Report, hist: &HealHistory, now_ms: u64) -> Option<Decision> {
    if let Some(why) = &hist.gave_up {
        return Some(Decision::GaveUp { why: why.clone() });
    }
    // A process stopped on purpose (SIGSTOP, a debugger) is left alone.
    if let Some(p) = report
        .processes
        .iter()
        .find(|p| report.roots.contains(&p.pid) && matches!(p.state, 'T' | 't'))
    {
        return Some(Decision::Nothing {
            why: format!("pid {} is stopped (state {}): left alone", p.pid, p.state),
        });
    }
    // Give the last step its window, and respect the backoff.
    if let (Some(rung), Some(last)) = (hist.rung, hist.last_action_ms()) {
        let wait = crate::clock::ms(cfg.step_window);
        if now_ms < last.saturating_add(wait) {
            return Some(Decision::Wait {
                why: format!("giving rung {rung} until its window ends"),
                until_ms: last.saturating_add(wait),
            });
        }
    }
    // Still wedged after the window: every step of this wedge so far did not
    // help, and each doubles the wait before the next.
    if let Some(last) = hist.last_action_ms() {
        let doublings = hist.steps_this_wedge.saturating_sub(1).min(20);
        let backoff = crate::clock::ms(cfg.backoff)
            .saturating_mul(1 << doublings)
            .min(HOUR_MS);
        if now_ms < last.saturating_add(backoff) {
            return Some(Decision::Wait {
                why: format!(
                    "backing off {backoff} ms after {} step(s) that did not clear the wedge",
                    hist.steps_this_wedge
                ),
                until_ms: last.saturating_add(backoff),
            });
        }
    }
    None
}

/// The steps of the first rung above the last one taken that has any.
fn next_rung(
    cfg: &HealConfig,
    j: &Judgement,
    report: &Report,
    hist: &HealHistory,
) -> Option<Vec<Act>> {
    let sockets = if cfg.sockets {
        dead_sockets(j, report)
    } else {
        Vec::new()
    };
    let targets = signal_targets(j, report);
    let from = hist.rung.map_or(0, |r| r.saturating_add(1));
    (from..=3u8)
        .map(|rung| rung_steps(rung, cfg, &sockets, &targets, report))
        .find(|steps| !steps.is_empty())
}

/// The processes the signal rung is for: the agent's root process above
/// each process that holds a dead socket a call waits on (the holder itself
/// when no root is above it), in the order of the dead sockets; with no dead socket, the
/// agent's root only when it has one. Never whichever root a rule matched
/// first: a wedge proven on one process's socket is that process's.
fn signal_targets(j: &Judgement, report: &Report) -> Vec<(u32, u64)> {
    let process = |pid: u32| report.processes.iter().find(|p| p.pid == pid);
    let root_above = |holder: u32| {
        let mut cur = holder;
        // Bounded: a torn read could hold a ppid cycle.
        for _ in 0..=report.processes.len() {
            if report.roots.contains(&cur) {
                return cur;
            }
            match process(cur) {
                Some(p) if p.ppid != cur && process(p.ppid).is_some() => cur = p.ppid,
                _ => break,
            }
        }
        holder
    };
    let holders: Vec<u32> = j
        .dead
        .iter()
        .filter(|d| d.kind == DeadKind::Awaited)
        .filter_map(|d| report.sockets.iter().find(|s| s.inode == d.inode))
        .map(|s| s.pid)
        .collect();
    let mut pids: Vec<u32> = Vec::new();
    if holders.is_empty() {
        if let [root] = report.roots.as_slice() {
            pids.push(*root);
        }
    } else {
        for h in holders {
            let r = root_above(h);
            if !pids.contains(&r) {
                pids.push(r);
            }
        }
    }
    pids.into_iter()
        .filter_map(|pid| Some((pid, process(pid)?.start_ticks?)))
        .collect()
}

/// The socket step `kind` on the dead socket `d`.
fn socket_step(d: &DeadSocket, kind: SocketStep) -> Act {
    kind.on(
        d.pid,
        d.start_ticks,
        SocketRef {
            fd: d.fd,
            inode: d.inode,
        },
    )
}

/// On the dead socket `d`: ending it as a keepalive timeout when a proof
/// keepalive went unanswered on it, else `unproven`.
fn expire_or(d: &DeadSocket, unproven: SocketStep) -> Act {
    let kind = if d.by_proof {
        SocketStep::ExpireKeepalive
    } else {
        unproven
    };
    socket_step(d, kind)
}

/// The steps rung `rung` would take now (none when it does not apply).
fn rung_steps(
    rung: u8,
    cfg: &HealConfig,
    sockets: &[DeadSocket],
    targets: &[(u32, u64)],
    report: &Report,
) -> Vec<Act> {
    let root = targets.first().copied();
    let grace_ms = crate::clock::ms(cfg.grace);
    let timeout_ms = crate::clock::ms(cfg.restart_timeout);
    match rung {
        // Keepalive where it can work (a proof keepalive that went
        // unanswered is ended; elsewhere one is armed); a socket with data
        // in flight, or whose peer is alive (a stream stalled behind its
        // pings), goes straight to the next rung.
        0 if sockets
            .iter()
            .all(|d| !d.peer_alive && (d.by_proof || d.unacked == 0)) =>
        {
            sockets
                .iter()
                .map(|d| expire_or(d, SocketStep::ArmKeepalive))
                .collect()
        }
        1 => sockets
            .iter()
            .map(|d| socket_step(d, SocketStep::Destroy))
            .collect(),
        2 if cfg.signal => targets
            .iter()
            .map(|&(pid, start_ticks)| Act::Signal {
                pid,
                start_ticks,
                grace_ms: Some(grace_ms),
            })
            .collect(),
        3 if cfg.restart_runtime => root
            .zip(the_container(report))
            .map(|((pid, start_ticks), c)| {
                Act::RestartContainer(ContainerRestart {
                    runtime: c.runtime,
                    id: c.id.clone(),
                    pid,
                    start_ticks,
                    grace_ms,
                    timeout_ms,
                })
            })
            .into_iter()
            .collect(),
        3 => cfg
            .restart
            .clone()
            .map(|argv| Act::Restart { argv, timeout_ms })
            .into_iter()
            .collect(),
        _ => Vec::new(),
    }
}

/// Why taking `steps` now would spend more than this hour's budgets allow.
fn over_budget(cfg: &HealConfig, steps: &[Act], hist: &HealHistory, now_ms: u64) -> Option<String> {
    let this_hour = hist.within_hour(now_ms).count() as u32;
    if this_hour + steps.len() as u32 > cfg.max_actions_per_hour {
        return Some(format!(
            "action budget spent: {this_hour} of {} this hour",
            cfg.max_actions_per_hour
        ));
    }
    if steps.iter().any(Act::is_disruptive) {
        let disruptive = hist
            .within_hour(now_ms)
            .filter(|a| a.step.is_disruptive())
            .count() as u32;
        if disruptive >= cfg.max_restarts_per_hour {
            return Some(format!(
                "restart budget spent: {disruptive} of {} this hour",
                cfg.max_restarts_per_hour
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests;
