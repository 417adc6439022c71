//! The privileged actions of the healing ladder, and nothing else: arming
//! TCP keepalive on an agent's socket, destroying a socket, signalling a
//! process (SIGTERM, then SIGKILL), running a restart command — plus the
//! [`guard`](guard::guard) every one of them passes first.
//!
//! Processes are addressed by [`Pidfd`](crate::sys::pidfd::Pidfd) (opened
//! when the decision was taken, checked against the judged process's start
//! time), so a pid reused between decision and action is never hit. Sockets are reached through
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
//! Every act, from the ladder or from the helper's wire, goes through
//! [`act`]: one match from an [`Act`] to the action that carries it out,
//! by a [`Hand`] that says who acts (this process, or the helper for its
//! caller) and what it checks on the way. Its outcome is an [`ActOutcome`],
//! each a plain `Serialize` value fit for the helper's JSON protocol and
//! for audit lines; its error an [`ActionError`], whose
//! [`code`](ActionError::code) is the protocol's error code. Deciding
//! *whether* to act is the ladder's job, not this module's.
//!
//! Every act reaches the kernel through a
//! [`System`]: the `_on` and `_gated` forms
//! take it (the unit tests in `races` drive them on a fake kernel), and
//! the plain forms act on the [`Kernel`].
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

#[cfg(test)]
mod races;

use std::time::{Duration, Instant};

use selfheal_core::{
    keepalive::KeepaliveSettings,
    protocol::{Act, Action, ContainerRestart, ErrorCode, MAX_GRACE},
};
use serde::Serialize;

use self::{
    destroy::DestroyOutcome,
    dup::SocketSeen,
    keepalive::{ExpireOutcome, Keepalive, KeepaliveOutcome},
    restart::RestartOutcome,
    signal::SignalOutcome,
};
use crate::sys::{
    pidfd::PidfdError,
    system::{Kernel, System},
};

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
    /// The act is not one the helper carries out (it has no wire form).
    #[error("{act} is not the helper's")]
    NotTheHelpers { act: &'static str },
    /// A proof keepalive would be armed on a socket whose cookie cannot be
    /// read: one the helper could not put back.
    #[error(
        "the socket's cookie (SO_COOKIE) cannot be read: no proof is armed that \
         the helper could not put back"
    )]
    NoCookie,
    /// `action` (`restore_keepalive`, `expire_keepalive`) on a socket the
    /// helper armed no proof keepalive on.
    #[error("{}", no_proof_words(*.action))]
    NoProof { action: Option<Action> },
    /// A `restore_keepalive` that names no options, on a socket with none
    /// recorded.
    #[error("the act names no options to put back")]
    NoOptions,
    /// Root's `restore_keepalive` on a socket the helper armed no proof on,
    /// naming no options to put back.
    #[error("{NO_PROOF} and the request names no options to put back")]
    NoProofNoOptions,
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
    /// The restart command ran and did not succeed: `how` says why
    /// (timed out, or its exit), `stderr` is its output's excerpt.
    #[error("restart command {argv:?} {how}: {stderr}")]
    RestartFailed {
        argv: Vec<String>,
        how: String,
        stderr: String,
    },
    /// The container's runtime did not restart it, or it no longer holds
    /// the judged process.
    #[error("{0}")]
    Container(String),
    /// The act is out of bounds (a proof held too long): nothing was done.
    #[error("{why}")]
    OutOfBounds { why: String },
    /// Whoever was asked does not carry out that act (the helper runs no
    /// restart command; an act without a second step).
    #[error("{why}")]
    NotHere { why: String },
}

/// What the refusal for a socket the helper armed no proof on says
/// first (clients recognize it).
pub const NO_PROOF: &str = "the helper armed no proof keepalive on this socket";

/// [`ActionError::NoProof`]'s words.
fn no_proof_words(action: Option<Action>) -> String {
    match action {
        Some(action) => format!(
            "{NO_PROOF}: {action} is only for one it armed (it puts back what it recorded then, \
             never values a caller sends)"
        ),
        None => NO_PROOF.to_string(),
    }
}

impl ActionError {
    fn io(action: String, source: std::io::Error) -> ActionError {
        ActionError::Io { action, source }
    }

    /// The helper protocol's code for this error: `forbidden` when the act
    /// was refused right before anything changed, `failed` when it was
    /// tried (or could not be) and failed.
    pub fn code(&self) -> ErrorCode {
        match self {
            ActionError::Refused { .. }
            | ActionError::NotTheHelpers { .. }
            | ActionError::NoCookie
            | ActionError::NoProof { .. }
            | ActionError::NoOptions
            | ActionError::NoProofNoOptions => ErrorCode::Forbidden,
            ActionError::Forbidden { .. }
            | ActionError::Gone { .. }
            | ActionError::Reused { .. }
            | ActionError::NoSuchFd { .. }
            | ActionError::NotASocket { .. }
            | ActionError::NotTcp { .. }
            | ActionError::Replaced { .. }
            | ActionError::NotApplicable { .. }
            | ActionError::InvalidKeepalive(_)
            | ActionError::EmptyCommand
            | ActionError::Spawn { .. }
            | ActionError::Io { .. }
            | ActionError::Netlink { .. }
            | ActionError::RestartFailed { .. }
            | ActionError::Container(_)
            | ActionError::OutOfBounds { .. }
            | ActionError::NotHere { .. } => ErrorCode::Failed,
        }
    }
}

/// What an act did, in the shape each act reports (its JSON is the
/// helper's answer and the audit trail's text).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ActOutcome {
    /// `arm_keepalive`, `prove_keepalive`.
    Keepalive(KeepaliveOutcome),
    /// `expire_keepalive`.
    Expired(ExpireOutcome),
    /// `restore_keepalive`: the options as read back.
    Restored(KeepaliveSettings),
    /// `destroy_socket`.
    Destroyed(DestroyOutcome),
    /// `signal`.
    Signalled(SignalOutcome),
    /// `restart`: the command succeeded.
    Restarted(RestartOutcome),
    /// What a dry run would have done.
    DryRun(DryRun),
    /// In its reporter's own JSON: a container runtime's restart, the
    /// helper's answer, an executor of its own.
    Reported(serde_json::Value),
}

impl ActOutcome {
    /// As JSON.
    pub fn to_json(&self) -> serde_json::Value {
        // Plain data: serializing it cannot fail.
        serde_json::to_value(self).unwrap_or_default()
    }
}

impl std::fmt::Display for ActOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.to_json())
    }
}

/// An act not carried out: what it was, and on which pid.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DryRun {
    pub dry_run: bool,
    /// The act's name.
    pub action: &'static str,
    pub pid: u32,
    /// The second step (an escalation on the helper's timer).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub escalation: bool,
}

/// How a `signal` act is carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signalling {
    /// SIGTERM, the grace, then SIGKILL, in one call
    /// ([`signal::signal_escalate`]).
    Escalate,
    /// SIGTERM only, with the grace bounded by [`MAX_GRACE`]
    /// ([`signal::signal_term`]): the helper sends SIGKILL on its timer.
    TermOnly,
}

/// Who carries out an [`act`], and what it checks: acting directly, or
/// the helper for its caller. `S` is the system it acts on.
pub trait Hand<S: System = Kernel> {
    /// The keepalive rung's settings.
    fn keepalive(&self) -> &Keepalive;

    /// The process the helper pinned for this act; `None` opens it here
    /// by pid and start time ([`guard::open_target`]).
    fn pinned(&self) -> Option<&S::Process> {
        None
    }

    /// Checked first, before anything of the target is read.
    fn admit(&self, act: &Act) -> Result<(), ActionError> {
        let _ = act;
        Ok(())
    }

    /// Checked on a socket's duplicate right before a socket act changes
    /// anything.
    fn gate(&self, act: &Act, seen: &SocketSeen<'_, S>) -> Result<(), ActionError> {
        let _ = (act, seen);
        Ok(())
    }

    /// The options a `restore_keepalive` puts back on the socket seen;
    /// `sent` is what the act names.
    fn previous(
        &self,
        act: &Act,
        sent: Option<&KeepaliveSettings>,
        seen: &SocketSeen<'_, S>,
    ) -> Result<KeepaliveSettings, ActionError> {
        let _ = (act, seen);
        sent.cloned().ok_or(ActionError::NoOptions)
    }

    fn signalling(&self) -> Signalling {
        Signalling::Escalate
    }

    /// A container restart ([`Act::RestartContainer`]).
    fn restart_container(&self, restart: &ContainerRestart) -> Result<ActOutcome, ActionError> {
        let _ = restart;
        Err(ActionError::NotHere {
            why: "container restarts are not carried out here".into(),
        })
    }
}

/// The process an act is for: pinned by the helper, or opened here.
enum Held<'a, P> {
    Pinned(&'a P),
    Opened(P),
}

impl<P> std::ops::Deref for Held<'_, P> {
    type Target = P;

    fn deref(&self) -> &P {
        match self {
            Held::Pinned(p) => p,
            Held::Opened(p) => p,
        }
    }
}

/// Carries out `act` by `hand`: the one place an act becomes actions.
pub fn act(act: &Act, hand: &dyn Hand) -> Result<ActOutcome, ActionError> {
    act_on(&Kernel, act, hand)
}

/// [`act`] on `sys`.
pub fn act_on<S: System>(
    sys: &S,
    act: &Act,
    hand: &dyn Hand<S>,
) -> Result<ActOutcome, ActionError> {
    hand.admit(act)?;
    let held = |pid: u32, start_ticks: u64| -> Result<Held<'_, S::Process>, ActionError> {
        match hand.pinned() {
            Some(p) => Ok(Held::Pinned(p)),
            None => guard::open_target_on(sys, pid, start_ticks).map(Held::Opened),
        }
    };
    let gate = |seen: &SocketSeen<'_, S>| hand.gate(act, seen);
    Ok(match act {
        Act::ArmKeepalive {
            pid,
            start_ticks,
            socket,
        } => ActOutcome::Keepalive(keepalive::arm_keepalive_gated(
            sys,
            &*held(*pid, *start_ticks)?,
            socket.fd,
            Some(socket.inode),
            hand.keepalive(),
            &gate,
        )?),
        Act::DestroySocket {
            pid,
            start_ticks,
            socket,
        } => ActOutcome::Destroyed(destroy::destroy_socket_gated(
            sys,
            &*held(*pid, *start_ticks)?,
            socket.fd,
            Some(socket.inode),
            &gate,
        )?),
        Act::ExpireKeepalive {
            pid,
            start_ticks,
            socket,
        } => ActOutcome::Expired(keepalive::expire_keepalive_gated(
            sys,
            &*held(*pid, *start_ticks)?,
            socket.fd,
            socket.inode,
            &gate,
        )?),
        Act::ProveKeepalive {
            pid,
            start_ticks,
            socket,
            keepalive,
        } => ActOutcome::Keepalive(keepalive::arm_proof_keepalive_gated(
            sys,
            &*held(*pid, *start_ticks)?,
            socket.fd,
            socket.inode,
            keepalive,
            &gate,
        )?),
        Act::RestoreKeepalive {
            pid,
            start_ticks,
            socket,
            previous,
        } => ActOutcome::Restored(keepalive::restore_keepalive_chosen(
            sys,
            &*held(*pid, *start_ticks)?,
            socket.fd,
            Some(socket.inode),
            &|seen| hand.previous(act, previous.as_ref(), seen),
        )?),
        Act::Signal {
            pid, start_ticks, ..
        } => {
            let target = held(*pid, *start_ticks)?;
            ActOutcome::Signalled(match hand.signalling() {
                Signalling::Escalate => signal::signal_escalate_on(sys, &target, act.grace())?,
                Signalling::TermOnly => {
                    signal::signal_term(sys, &target, act.grace().min(MAX_GRACE))?
                }
            })
        }
        Act::Restart { argv, timeout_ms } => {
            let out = restart::restart(argv, Duration::from_millis(*timeout_ms))?;
            if !out.success {
                return Err(ActionError::RestartFailed {
                    argv: argv.clone(),
                    how: if out.timed_out {
                        "timed out".to_string()
                    } else {
                        format!("exited with {:?}", out.exit_code)
                    },
                    stderr: out.stderr.trim().to_string(),
                });
            }
            ActOutcome::Restarted(out)
        }
        Act::RestartContainer(restart) => hand.restart_container(restart)?,
    })
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
    use selfheal_core::protocol::ErrorCode;

    use super::{
        ActionError,
        destroy::{DestroyMethod, DestroyOutcome},
        signal::{Signal, SignalOutcome},
    };

    #[test]
    fn every_action_error_has_its_protocol_code() {
        let io = || std::io::Error::from_raw_os_error(libc::EPERM);
        let why = || "why".to_string();
        let (pid, fd) = (5, 3);
        let cases = [
            (
                ActionError::Forbidden { pid, why: why() },
                ErrorCode::Failed,
            ),
            (ActionError::Gone { pid }, ErrorCode::Failed),
            (
                ActionError::Reused {
                    pid,
                    expected: 1,
                    found: 2,
                },
                ErrorCode::Failed,
            ),
            (ActionError::NoSuchFd { pid, fd }, ErrorCode::Failed),
            (ActionError::NotASocket { pid, fd }, ErrorCode::Failed),
            (ActionError::NotTcp { pid, fd }, ErrorCode::Failed),
            (
                ActionError::Replaced {
                    pid,
                    fd,
                    expected: 1,
                    found: 2,
                },
                ErrorCode::Failed,
            ),
            (
                ActionError::NotApplicable {
                    pid,
                    fd,
                    why: why(),
                },
                ErrorCode::Failed,
            ),
            (ActionError::Refused { why: why() }, ErrorCode::Forbidden),
            (
                ActionError::NotTheHelpers { act: "restart" },
                ErrorCode::Forbidden,
            ),
            (ActionError::NoCookie, ErrorCode::Forbidden),
            (ActionError::NoProof { action: None }, ErrorCode::Forbidden),
            (ActionError::NoOptions, ErrorCode::Forbidden),
            (ActionError::NoProofNoOptions, ErrorCode::Forbidden),
            (ActionError::InvalidKeepalive(why()), ErrorCode::Failed),
            (ActionError::EmptyCommand, ErrorCode::Failed),
            (
                ActionError::Spawn {
                    program: "x".into(),
                    source: io(),
                },
                ErrorCode::Failed,
            ),
            (
                ActionError::Io {
                    action: "x".into(),
                    source: io(),
                },
                ErrorCode::Failed,
            ),
            (
                ActionError::Netlink {
                    pid,
                    fd,
                    reason: why(),
                },
                ErrorCode::Failed,
            ),
            (
                ActionError::RestartFailed {
                    argv: vec!["x".into()],
                    how: "timed out".into(),
                    stderr: String::new(),
                },
                ErrorCode::Failed,
            ),
            (ActionError::Container(why()), ErrorCode::Failed),
            (ActionError::OutOfBounds { why: why() }, ErrorCode::Failed),
            (ActionError::NotHere { why: why() }, ErrorCode::Failed),
        ];
        for (e, code) in cases {
            assert_eq!(e.code(), code, "{e:?}");
        }
    }

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

    /// The refusals a hand makes are typed, and their words are the
    /// protocol's (clients recognize [`super::NO_PROOF`]).
    #[test]
    fn a_hands_refusals_say_what_was_refused() {
        use selfheal_core::protocol::Action;

        let cases = [
            (
                ActionError::NotTheHelpers { act: "restart" },
                "restart is not the helper's",
            ),
            (
                ActionError::NoCookie,
                "the socket's cookie (SO_COOKIE) cannot be read: no proof is armed that \
                 the helper could not put back",
            ),
            (
                ActionError::NoProof {
                    action: Some(Action::RestoreKeepalive),
                },
                "the helper armed no proof keepalive on this socket: restore_keepalive is \
                 only for one it armed (it puts back what it recorded then, never values a \
                 caller sends)",
            ),
            (
                ActionError::NoProof { action: None },
                "the helper armed no proof keepalive on this socket",
            ),
            (
                ActionError::NoOptions,
                "the act names no options to put back",
            ),
            (
                ActionError::NoProofNoOptions,
                "the helper armed no proof keepalive on this socket and the request names \
                 no options to put back",
            ),
        ];
        for (e, words) in cases {
            assert_eq!(e.to_string(), words, "{e:?}");
            assert!(
                !matches!(e, ActionError::NoProof { .. }) || words.starts_with(super::NO_PROOF),
                "{e:?}"
            );
            assert_eq!(e.code(), ErrorCode::Forbidden, "{e:?}");
        }
    }

    /// A hand that checks nothing lets every socket through, and puts back
    /// only the options the act names.
    #[test]
    fn the_default_hand_passes_sockets_and_puts_back_only_what_is_named() {
        use selfheal_core::{
            keepalive::KeepaliveSettings,
            protocol::{Act, SocketRef},
        };

        use super::{Hand, dup::SocketSeen, keepalive::Keepalive};

        struct Plain(Keepalive);
        impl Hand for Plain {
            fn keepalive(&self) -> &Keepalive {
                &self.0
            }
        }
        let hand = Plain(Keepalive::default());
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let fd = std::os::fd::OwnedFd::from(l);
        let seen = SocketSeen {
            fd: &fd,
            inode: 42,
            cookie: None,
        };
        let act = Act::RestoreKeepalive {
            pid: 5,
            start_ticks: 9,
            socket: SocketRef { fd: 7, inode: 42 },
            previous: None,
        };
        assert!(hand.gate(&act, &seen).is_ok());
        assert!(matches!(
            hand.previous(&act, None, &seen),
            Err(ActionError::NoOptions)
        ));
        let named = KeepaliveSettings {
            enabled: true,
            idle_s: 60,
            interval_s: 10,
            count: 5,
            user_timeout_ms: 0,
        };
        assert_eq!(hand.previous(&act, Some(&named), &seen).unwrap(), named);
        assert!(matches!(
            hand.restart_container(&selfheal_core::protocol::ContainerRestart {
                runtime: selfheal_core::runtime::Runtime::Docker,
                id: "abc".into(),
                pid: 5,
                start_ticks: 9,
                grace_ms: 1,
                timeout_ms: 1,
            }),
            Err(ActionError::NotHere { .. })
        ));
    }
}
