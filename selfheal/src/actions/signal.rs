//! Signalling a process through its pidfd: SIGTERM, the grace, SIGKILL,
//! and the bounded waits for it to exit.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{ActionError, deadline, guard::check_target};
use crate::sys::pidfd::Pidfd;

/// A signal [`signal_escalate`] sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Signal {
    #[serde(rename = "SIGTERM")]
    Term,
    #[serde(rename = "SIGKILL")]
    Kill,
}

/// What [`signal_escalate`] did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalOutcome {
    pub pid: u32,
    /// In order: `SIGTERM`, then `SIGKILL` if the grace ran out.
    pub sent: Vec<Signal>,
    /// Whether the process was seen to exit.
    pub exited: bool,
    /// When it exited, counted from the SIGTERM.
    pub exited_after_ms: Option<u64>,
    pub grace_ms: u64,
    /// Only SIGTERM was sent so far: the helper sends SIGKILL on its own
    /// timer after `grace_ms` if the process still lives then (and is
    /// still who it was). Absent (false) from a synchronous escalation.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub escalating: bool,
}

/// How long [`signal_escalate`] waits after SIGKILL (a process in
/// uninterruptible sleep dies only when it leaves it).
pub const KILL_WAIT: Duration = Duration::from_secs(3);

/// Waits (bounded by `timeout`) for the target to exit; retries after
/// interrupted polls.
fn wait_exit(target: &Pidfd, timeout: Duration) -> bool {
    let end = deadline(Instant::now(), timeout);
    // Each wait either sees the exit or ends at the deadline; an early
    // return (EINTR) only costs one more round.
    for _ in 0..1000 {
        let left = end.saturating_duration_since(Instant::now());
        if target.wait_exit(left) {
            return true;
        }
        if left.is_zero() {
            return false;
        }
    }
    !target.is_alive()
}

/// Sends `sig` through the target's pidfd.
fn send_signal(target: &Pidfd, sig: libc::c_int, name: &str) -> Result<(), ActionError> {
    let pid = target.pid();
    target.send_signal(sig).map_err(|e| match e.raw_os_error() {
        Some(libc::ESRCH) => ActionError::Gone { pid },
        _ => ActionError::io(format!("pidfd_send_signal {name} to pid {pid}"), e),
    })
}

/// How long [`signal_term`] watches for a quick exit before it answers.
pub const TERM_WATCH: Duration = Duration::from_millis(200);

/// The first half of [`signal_escalate`], for the helper: SIGTERM through
/// the pidfd, then up to [`TERM_WATCH`] to see the process exit. It never
/// waits out the grace: the helper's timer sends SIGKILL (see
/// [`signal_kill`]). `grace` is only reported.
pub fn signal_term(target: &Pidfd, grace: Duration) -> Result<SignalOutcome, ActionError> {
    check_target(target)?;
    let start = Instant::now();
    send_signal(target, libc::SIGTERM, "SIGTERM")?;
    let exited = wait_exit(target, TERM_WATCH.min(grace));
    Ok(SignalOutcome {
        pid: target.pid(),
        sent: vec![Signal::Term],
        exited,
        exited_after_ms: exited.then(|| start.elapsed().as_millis() as u64),
        grace_ms: grace.as_millis() as u64,
        escalating: !exited,
    })
}

/// The second half, on the helper's timer: SIGKILL through the pidfd
/// (never to a recycled pid), without waiting. The caller has checked that
/// the process is still the one that got SIGTERM, and still allowed.
pub fn signal_kill(target: &Pidfd) -> Result<SignalOutcome, ActionError> {
    check_target(target)?;
    send_signal(target, libc::SIGKILL, "SIGKILL")?;
    Ok(SignalOutcome {
        pid: target.pid(),
        sent: vec![Signal::Kill],
        exited: false,
        exited_after_ms: None,
        grace_ms: 0,
        escalating: false,
    })
}

/// SIGTERM through the pidfd, up to `grace` for the process to exit, then
/// SIGKILL and up to [`KILL_WAIT`]. A target that is already gone is
/// [`ActionError::Gone`] and nothing is sent.
pub fn signal_escalate(target: &Pidfd, grace: Duration) -> Result<SignalOutcome, ActionError> {
    check_target(target)?;
    let send = |sig: libc::c_int, name: &str| send_signal(target, sig, name);
    let pid = target.pid();
    let start = Instant::now();
    send(libc::SIGTERM, "SIGTERM")?;
    let mut sent = vec![Signal::Term];
    let mut exited = wait_exit(target, grace);
    if !exited {
        match send(libc::SIGKILL, "SIGKILL") {
            Ok(()) => sent.push(Signal::Kill),
            // It exited between the wait and the kill.
            Err(ActionError::Gone { .. }) => {}
            Err(e) => return Err(e),
        }
        exited = wait_exit(target, KILL_WAIT);
    }
    Ok(SignalOutcome {
        pid,
        sent,
        exited,
        exited_after_ms: exited.then(|| start.elapsed().as_millis() as u64),
        grace_ms: grace.as_millis() as u64,
        escalating: false,
    })
}
