//! The privileged actions of the healing ladder, and nothing else: arming
//! TCP keepalive on an agent's socket, destroying a socket, signalling a
//! process (SIGTERM, then SIGKILL), running a restart command — plus the
//! [`guard`](guard::guard) every one of them passes first.
//!
//! Processes are addressed by [`Pidfd`](crate::sys::pidfd::Pidfd) (opened when the decision was taken,
//! checked against the judged process's start time), so a pid reused between
//! decision and action is never hit. Sockets are reached through
//! `pidfd_getfd`: the agent's own socket, duplicated into this process, is
//! changed and the duplicate closed; the agent's fd table is never touched.
//!
//! A socket fd is duplicated only when `/proc/PID/fd/FD` names a socket,
//! and the duplicate is checked by its own `/proc` link, never `fstat`: a
//! file on a FUSE mount could block such calls forever. Each socket action
//! has a `_gated` form that checks a [`SocketGate`](dup::SocketGate) on the duplicate, after
//! the inode comparison and right before anything changes: the helper's
//! authority re-checks the target and the socket's state there
//! ([`restore_keepalive_chosen`](keepalive::restore_keepalive_chosen) lets it choose the options too). The
//! helper signals in two halves ([`signal_term`](signal::signal_term) now,
//! [`signal_kill`](signal::signal_kill) on its timer);
//! [`signal_escalate`](signal::signal_escalate) does both in one call for acting
//! directly.
//!
//! Every outcome is a plain `Serialize`/`Deserialize` value, fit for the
//! helper's JSON protocol and for audit lines. Deciding *whether* to act is
//! the ladder's job, not this module's.
//!
//! The rooms: [`guard`] (who may be acted on, and the handle), [`dup`]
//! (the duplicated socket and its gate), [`keepalive`], [`destroy`],
//! [`signal`] and [`restart`] (the acts).

pub mod destroy;
pub mod dup;
pub mod guard;
pub mod keepalive;
pub mod restart;
pub mod signal;

use std::time::{Duration, Instant};

use crate::sys::pidfd::PidfdError;

/// Why an action was not taken, or failed.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    /// The guard refused the target (pid 1, ourselves, an ancestor of ours,
    /// a kernel thread).
    #[error("refusing to act on pid {pid}: {why}")]
    Forbidden { pid: u32, why: String },
    #[error("pid {pid} is not running")]
    Gone { pid: u32 },
    #[error(
        "pid {pid} is no longer the process that was judged (started at tick {expected}, now {found})"
    )]
    Reused { pid: u32, expected: u64, found: u64 },
    #[error("pid {pid} has no fd {fd}")]
    NoSuchFd { pid: u32, fd: i32 },
    #[error("fd {fd} of pid {pid} is not a socket")]
    NotASocket { pid: u32, fd: i32 },
    #[error("fd {fd} of pid {pid} is not a TCP socket")]
    NotTcp { pid: u32, fd: i32 },
    /// The fd now holds another socket than the one judged (the agent
    /// closed it and the number was reused): nothing was done to it. The
    /// message names only the inode the caller gave: the one found is the
    /// target's, not the caller's to learn.
    #[error(
        "fd {fd} of pid {pid} no longer holds the judged socket (inode {expected}): left alone"
    )]
    Replaced {
        pid: u32,
        fd: i32,
        expected: u64,
        found: u64,
    },
    /// The socket is not in a state the action is for; nothing was done.
    #[error("fd {fd} of pid {pid}: {why}")]
    NotApplicable { pid: u32, fd: i32, why: String },
    /// The [`SocketGate`](dup::SocketGate) refused the socket, or the target, right before
    /// the action: nothing was done.
    #[error("{why}")]
    Refused { why: String },
    #[error("invalid keepalive settings: {0}")]
    InvalidKeepalive(String),
    #[error("the restart command is empty")]
    EmptyCommand,
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    /// A system call failed; `action` names it with its pid and fd.
    #[error("{action}: {source}")]
    Io {
        action: String,
        source: std::io::Error,
    },
    /// sock_diag could not find or destroy the socket.
    #[error("sock_diag for fd {fd} of pid {pid}: {reason}")]
    Netlink { pid: u32, fd: i32, reason: String },
}

impl ActionError {
    fn io(action: String, source: std::io::Error) -> ActionError {
        ActionError::Io { action, source }
    }
}

impl From<PidfdError> for ActionError {
    fn from(e: PidfdError) -> ActionError {
        match e {
            PidfdError::Gone { pid } => ActionError::Gone { pid },
            PidfdError::Reused {
                pid,
                expected,
                found,
            } => ActionError::Reused {
                pid,
                expected,
                found,
            },
            PidfdError::Open { pid, source } => {
                ActionError::io(format!("pidfd_open {pid}"), source)
            }
        }
    }
}

/// `from + d`, saturating at a year ahead (an absurd duration must not
/// panic).
fn deadline(from: Instant, d: Duration) -> Instant {
    from.checked_add(d)
        .or_else(|| from.checked_add(Duration::from_secs(365 * 86_400)))
        .unwrap_or(from)
}

#[cfg(test)]
mod tests {
    use super::{
        destroy::{DestroyMethod, DestroyOutcome},
        signal::{Signal, SignalOutcome},
    };

    #[test]
    fn outcomes_round_trip_through_json() {
        let o = SignalOutcome {
            pid: 42,
            sent: vec![Signal::Term, Signal::Kill],
            exited: true,
            exited_after_ms: Some(1200),
            grace_ms: 1000,
            escalating: false,
        };
        let json = serde_json::to_string(&o).unwrap();
        assert!(!json.contains("escalating"), "{json}");
        assert!(json.contains(r#""sent":["SIGTERM","SIGKILL"]"#), "{json}");
        assert_eq!(serde_json::from_str::<SignalOutcome>(&json).unwrap(), o);
        let d = DestroyOutcome {
            method: DestroyMethod::SockDestroy,
            detail: String::new(),
            pid: 1,
            fd: 3,
            inode: 9,
            local: Some("127.0.0.1:1".parse().unwrap()),
            remote: None,
        };
        let json = serde_json::to_string(&d).unwrap();
        assert!(json.contains(r#""method":"sock_destroy""#), "{json}");
        assert_eq!(serde_json::from_str::<DestroyOutcome>(&json).unwrap(), d);
    }
}
