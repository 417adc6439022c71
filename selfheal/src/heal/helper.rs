//! Acting through the privileged helper (for agents of other users, or to
//! keep the caller unprivileged): the act's wire form
//! ([`ActRequest::from_act`]) over the check's connection, and directly
//! when the helper went away before anything was sent. Restart commands
//! and runtime restarts run here, as the caller. The helper answers a
//! `signal` after SIGTERM and sends SIGKILL on its own timer;
//! [`HelperExecutor`] then watches the process's exit through a pidfd of
//! its own, so the ladder still learns how the act ended.

use std::time::Duration;

use selfheal_core::{
    keepalive::{KeepaliveSettings, ProofKeepalive},
    protocol::{Act, ActRequest, MAX_GRACE},
    prove::ProofTarget,
};

use super::{
    Executor, HealError,
    direct::{DirectExecutor, act_here},
};
use crate::{
    actions::{self, ActOutcome, keepalive::Keepalive, keepalive::KeepaliveOutcome},
    helper::{ClientError, client::HelperClient},
};

/// One helper connection shared by the executor and the tracer of a check.
pub type SharedClient = std::sync::Arc<std::sync::Mutex<HelperClient>>;

/// Acts through the helper on a connection it may share with the check's
/// tracer.
pub struct HelperExecutor {
    client: SharedClient,
    keepalive: Keepalive,
}

impl HelperExecutor {
    pub fn new(client: HelperClient) -> HelperExecutor {
        HelperExecutor::shared(std::sync::Arc::new(std::sync::Mutex::new(client)))
    }

    /// An executor on a connection the check's tracer uses too.
    pub fn shared(client: SharedClient) -> HelperExecutor {
        HelperExecutor {
            client,
            keepalive: Keepalive::default(),
        }
    }

    /// `act` from this process (with the helper to read pid namespaces).
    fn direct(&self, act: &Act) -> Result<ActOutcome, HealError> {
        Ok(act_here(act, &self.keepalive, Some(&self.client))?)
    }

    /// A prove-stage act through the helper (or `direct`ly, when it went
    /// away), its answer typed.
    fn prove<T: serde::Serialize + serde::de::DeserializeOwned>(
        &self,
        act: &Act,
        agent: &str,
        direct: impl FnOnce() -> Result<T, HealError>,
    ) -> Result<T, HealError> {
        let req =
            ActRequest::from_act(act, agent).ok_or(HealError::NotOnWire { act: act.name() })?;
        let v = self.request(&req, || {
            direct().and_then(|o| serde_json::to_value(o).map_err(HealError::Answer))
        })?;
        serde_json::from_value(v).map_err(HealError::Answer)
    }

    /// Sends `req` to the helper. When the helper went away since the check
    /// began (the request was never sent: no connection could be had),
    /// `direct` acts from here, where permitted, and the log says so.
    fn request(
        &self,
        req: &ActRequest,
        direct: impl FnOnce() -> Result<serde_json::Value, HealError>,
    ) -> Result<serde_json::Value, HealError> {
        let mut client = self.client.lock().map_err(|_| HealError::Poisoned)?;
        match client.act(req) {
            Ok(v) => Ok(v),
            Err(e @ ClientError::Unavailable { .. }) => {
                tracing::warn!("{e}; acting directly where permitted");
                direct().map_err(|d| HealError::Direct {
                    helper: Box::new(HealError::Unavailable(e)),
                    direct: Box::new(d),
                })
            }
            Err(e) => Err(HealError::Helper(e)),
        }
    }
}

impl Executor for HelperExecutor {
    fn act(&self, agent: &str, act: &Act) -> Result<ActOutcome, HealError> {
        // Restarts run here, as the caller: a command is the caller's
        // own, and the runtime's socket is the caller's to reach
        // (docs/capabilities.md: the helper is no runtime proxy).
        let Some(req) = ActRequest::from_act(act, agent) else {
            return self.direct(act);
        };
        let v = self.request(&req, || self.direct(act).map(|out| out.to_json()))?;
        Ok(ActOutcome::Reported(match act {
            Act::Signal {
                pid, start_ticks, ..
            } if v["escalating"] == true => await_escalation(v, *pid, *start_ticks, act.grace()),
            _ => v,
        }))
    }

    fn arm_proof(
        &self,
        agent: &str,
        t: &ProofTarget,
        ka: &ProofKeepalive,
    ) -> Result<KeepaliveOutcome, HealError> {
        self.prove(&t.prove(ka), agent, || {
            DirectExecutor::default().arm_proof(agent, t, ka)
        })
    }

    fn restore_proof(
        &self,
        agent: &str,
        t: &ProofTarget,
        previous: &KeepaliveSettings,
    ) -> Result<KeepaliveSettings, HealError> {
        let here = || DirectExecutor::default().restore_proof(agent, t, previous);
        match self.prove(&t.restore(previous), agent, here) {
            // A helper that has no record of the proof (it was restarted
            // since arming) puts nothing back for us: we do, where the
            // kernel lets us (our own agent), with what our state recorded.
            Err(e) if e.is_no_proof() => {
                tracing::warn!("{e}; putting the options back directly where permitted");
                here().map_err(|d| HealError::Direct {
                    helper: Box::new(e),
                    direct: Box::new(d),
                })
            }
            other => other,
        }
    }
}

/// The helper answers a `signal` after SIGTERM and sends SIGKILL on its own
/// timer; the ladder still wants to know how it ended. So the executor
/// watches the process itself through a pidfd of its own (anyone may open
/// one and see the exit), up to the grace plus the SIGKILL wait, and adds
/// `exited` and `watched_ms` (from the answer on) to the helper's
/// answer. A pid that is already gone (or now another process) counts as
/// exited. The next check verifies either way.
fn await_escalation(
    mut v: serde_json::Value,
    pid: u32,
    start_ticks: u64,
    grace: Duration,
) -> serde_json::Value {
    let began = std::time::Instant::now();
    let limit = grace.min(MAX_GRACE) + actions::signal::KILL_WAIT + Duration::from_secs(1);
    let exited = match crate::sys::pidfd::Pidfd::open(pid, Some(start_ticks)) {
        Ok(fd) => {
            // Bounded: each wait ends at the limit or at the exit; an
            // interrupted one costs another round.
            let mut exited = false;
            for _ in 0..1000 {
                let left = limit.saturating_sub(began.elapsed());
                if fd.wait_exit(left) {
                    exited = true;
                    break;
                }
                if left.is_zero() {
                    break;
                }
            }
            exited
        }
        Err(_) => true,
    };
    if let serde_json::Value::Object(m) = &mut v {
        m.insert("exited".into(), exited.into());
        m.insert(
            "watched_ms".into(),
            (began.elapsed().as_millis() as u64).into(),
        );
    }
    v
}
