//! Signalling a process through its pidfd: SIGTERM, the grace, SIGKILL,
//! and the bounded waits for it to exit.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ActionError, deadline, guard::check_target};
use crate::sys::{
    pidfd::Pidfd,
    system::{Handle as _, Kernel, System},
};

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
fn wait_exit<S: System>(sys: &S, target: &S::Process, timeout: Duration) -> bool {
    let end = deadline(sys.now(), timeout);
    // Each wait either sees the exit or ends at the deadline; an early
    // return (EINTR) only costs one more round.
    for _ in 0..1000 {
        let left = end.saturating_duration_since(sys.now());
        if sys.wait_exit(target, left) {
            return true;
        }
        if left.is_zero() {
            return false;
        }
    }
    !sys.is_alive(target)
}

/// Sends `sig` through the target's pidfd.
fn send_signal<S: System>(
    sys: &S,
    target: &S::Process,
    sig: libc::c_int,
    name: &str,
) -> Result<(), ActionError> {
    let pid = target.pid();
    sys.send_signal(target, sig)
        .map_err(|e| match e.raw_os_error() {
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
pub fn signal_term<S: System>(
    sys: &S,
    target: &S::Process,
    grace: Duration,
) -> Result<SignalOutcome, ActionError> {
    check_target(sys, target)?;
    let start = sys.now();
    send_signal(sys, target, libc::SIGTERM, "SIGTERM")?;
    let exited = wait_exit(sys, target, TERM_WATCH.min(grace));
    Ok(SignalOutcome {
        pid: target.pid(),
        sent: vec![Signal::Term],
        exited,
        exited_after_ms: exited.then(|| sys.now().duration_since(start).as_millis() as u64),
        grace_ms: grace.as_millis() as u64,
        escalating: !exited,
    })
}

/// The second half, on the helper's timer: SIGKILL through the pidfd
/// (never to a recycled pid), without waiting. The caller has checked that
/// the process is still the one that got SIGTERM, and still allowed.
pub fn signal_kill(target: &Pidfd) -> Result<SignalOutcome, ActionError> {
    signal_kill_on(&Kernel, target)
}

/// [`signal_kill`] on `sys`.
pub fn signal_kill_on<S: System>(
    sys: &S,
    target: &S::Process,
) -> Result<SignalOutcome, ActionError> {
    check_target(sys, target)?;
    send_signal(sys, target, libc::SIGKILL, "SIGKILL")?;
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
    signal_escalate_on(&Kernel, target, grace)
}

/// [`signal_escalate`] on `sys`.
pub fn signal_escalate_on<S: System>(
    sys: &S,
    target: &S::Process,
    grace: Duration,
) -> Result<SignalOutcome, ActionError> {
    check_target(sys, target)?;
    let send = |sig: libc::c_int, name: &str| send_signal(sys, target, sig, name);
    let pid = target.pid();
    let start = sys.now();
    send(libc::SIGTERM, "SIGTERM")?;
    let mut sent = vec![Signal::Term];
    let mut exited = wait_exit(sys, target, grace);
    if !exited {
        match send(libc::SIGKILL, "SIGKILL") {
            Ok(()) => sent.push(Signal::Kill),
            // It exited between the wait and the kill.
            Err(ActionError::Gone { .. }) => {}
            Err(e) => return Err(e),
        }
        exited = wait_exit(sys, target, KILL_WAIT);
    }
    Ok(SignalOutcome {
        pid,
        sent,
        exited,
        exited_after_ms: exited.then(|| sys.now().duration_since(start).as_millis() as u64),
        grace_ms: grace.as_millis() as u64,
        escalating: false,
    })
}
