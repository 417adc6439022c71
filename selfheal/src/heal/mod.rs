//! Who carries out the ladder's and the prove stage's acts: one
//! [`Executor`] trait, an [`Act`] in and an [`ActOutcome`] out, with two
//! executors side by side. [`direct::DirectExecutor`] acts from this
//! process (when it has the permission: same uid, or root);
//! [`helper::HelperExecutor`] sends the act's wire form to the privileged
//! helper and acts directly when the helper has gone away (no connection:
//! nothing was sent). Either way every act goes down through
//! [`crate::actions::act`], and every process is re-opened by pidfd
//! against the start time the check saw, so a pid reused since then is
//! never touched.
//!
//! Errors are typed: an act's own is an [`ActionError`] (whose
//! [`code`](ActionError::code) is the protocol's error code); the helper's
//! transport and answers add the rest of [`HealError`].

pub mod direct;
pub mod helper;

use selfheal_core::{
    keepalive::{KeepaliveSettings, ProofKeepalive},
    protocol::Act,
    prove::ProofTarget,
};

use crate::{
    actions::NO_PROOF,
    actions::{ActOutcome, ActionError, keepalive::KeepaliveOutcome},
    helper::ClientError,
};

/// Why an act through an [`Executor`] was not done.
#[derive(Debug, thiserror::Error)]
pub enum HealError {
    /// The act itself was refused or failed.
    #[error(transparent)]
    Action(#[from] ActionError),
    /// The helper refused the act, or could not be heard.
    #[error("through the helper: {0}")]
    Helper(#[source] ClientError),
    /// The helper went away before anything was sent (`helper`), and
    /// acting directly failed too (`direct`).
    #[error("{helper}; acting directly: {direct}")]
    Direct {
        helper: Box<HealError>,
        direct: Box<HealError>,
    },
    /// The helper was unavailable: nothing was sent.
    #[error(transparent)]
    Unavailable(ClientError),
    /// The connection shared with the tracer was poisoned by a panic.
    #[error("helper client poisoned")]
    Poisoned,
    /// The helper's answer is not the outcome the act reports.
    #[error("the helper's answer: {0}")]
    Answer(#[source] serde_json::Error),
    /// The act reported an outcome that is not its own.
    #[error("an unexpected outcome: {0}")]
    Unexpected(ActOutcome),
    /// The act has no wire form for the helper.
    #[error("{act} does not cross the wire")]
    NotOnWire { act: &'static str },
}

impl HealError {
    /// Whether the helper refused to put back a proof it has no record of
    /// (it was restarted since arming it).
    pub fn is_no_proof(&self) -> bool {
        matches!(self, HealError::Helper(ClientError::Remote(r)) if r.message.contains(NO_PROOF))
    }
}

/// Who carries out an act: the privileged helper, or this process
/// directly where it has the permission.
pub trait Executor {
    /// Performs `act` for `agent`; the outcome's text, or the error's,
    /// goes into the audit trail and the report.
    fn act(&self, agent: &str, act: &Act) -> Result<ActOutcome, HealError>;

    /// The prove stage: arms a proof keepalive on socket `t` of `agent`,
    /// returning the options it had and those set.
    fn arm_proof(
        &self,
        agent: &str,
        t: &ProofTarget,
        ka: &ProofKeepalive,
    ) -> Result<KeepaliveOutcome, HealError> {
        match self.act(agent, &t.prove(ka))? {
            ActOutcome::Keepalive(out) => Ok(out),
            other => Err(HealError::Unexpected(other)),
        }
    }

    /// The prove stage: puts `previous` back on socket `t` of `agent`,
    /// returning the options as read back.
    fn restore_proof(
        &self,
        agent: &str,
        t: &ProofTarget,
        previous: &KeepaliveSettings,
    ) -> Result<KeepaliveSettings, HealError> {
        match self.act(agent, &t.restore(previous))? {
            ActOutcome::Restored(back) => Ok(back),
            other => Err(HealError::Unexpected(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use selfheal_core::protocol::ErrorCode;

    use super::*;
    use crate::{actions::DryRun, helper::RemoteError};

    /// An executor that answers every act with `outcome`.
    struct Answers(ActOutcome);

    impl Executor for Answers {
        fn act(&self, _agent: &str, _act: &Act) -> Result<ActOutcome, HealError> {
            Ok(self.0.clone())
        }
    }

    fn target() -> ProofTarget {
        ProofTarget {
            pid: 5,
            start_ticks: 9,
            fd: 7,
            inode: 42,
        }
    }

    #[test]
    fn a_proof_answered_with_another_acts_outcome_is_an_error() {
        let dry = ActOutcome::DryRun(DryRun {
            dry_run: true,
            action: "signal",
            pid: 5,
            escalation: false,
        });
        let ka = ProofKeepalive {
            idle_s: 1,
            interval_s: 1,
            count: 3,
            hold_ms: 1000,
        };
        let e = Answers(dry.clone())
            .arm_proof("sol", &target(), &ka)
            .unwrap_err();
        assert!(matches!(&e, HealError::Unexpected(o) if *o == dry), "{e:?}");
        assert_eq!(e.to_string(), format!("an unexpected outcome: {dry}"));
        let previous = KeepaliveSettings {
            enabled: false,
            idle_s: 7200,
            interval_s: 75,
            count: 9,
            user_timeout_ms: 0,
        };
        let back = Answers(ActOutcome::Restored(previous.clone()))
            .restore_proof("sol", &target(), &previous)
            .unwrap();
        assert_eq!(back, previous);
    }

    #[test]
    fn errors_say_what_went_wrong_where() {
        let unavailable = || ClientError::Unavailable {
            path: PathBuf::from("/run/selfheal/helper.sock"),
            reason: "no such file".into(),
        };
        let gone = HealError::Action(ActionError::Gone { pid: 5 });
        assert_eq!(gone.to_string(), "pid 5 is not running");
        let both = HealError::Direct {
            helper: Box::new(HealError::Unavailable(unavailable())),
            direct: Box::new(gone),
        };
        assert_eq!(
            both.to_string(),
            "helper at /run/selfheal/helper.sock is unavailable: no such file; \
             acting directly: pid 5 is not running"
        );
        let refused = |message: &str| {
            HealError::Helper(ClientError::Remote(RemoteError {
                code: ErrorCode::Forbidden,
                message: message.into(),
            }))
        };
        let no_proof = refused(&format!("restore_keepalive: {NO_PROOF}"));
        assert!(no_proof.is_no_proof());
        assert!(
            no_proof
                .to_string()
                .starts_with("through the helper: helper refused: forbidden: ")
        );
        assert!(!refused("pid 5 is out of reach").is_no_proof());
        assert!(!HealError::Unavailable(unavailable()).is_no_proof());
    }
}
