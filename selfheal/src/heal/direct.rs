//! Acting from this process: every process opened here by pid and start
//! time, every socket let through, a `signal` carried out to its end, and
//! restarts run as this user.

use std::time::Duration;

use selfheal_core::protocol::{Act, ContainerRestart};

use super::{Executor, HealError, helper::SharedClient};
use crate::{
    actions::{self, ActOutcome, ActionError, Hand, keepalive::Keepalive},
    helper::ClientError,
    runtime::restart::PidNsUnread,
    sys::system::{Kernel, System},
};

/// This process's [`Hand`]. The helper, where there is one, tells the pid
/// namespaces this process may not read itself.
struct Direct<'a> {
    keepalive: &'a Keepalive,
    helper: Option<&'a SharedClient>,
}

impl<S: System> Hand<S> for Direct<'_> {
    fn keepalive(&self) -> &Keepalive {
        self.keepalive
    }

    fn restart_container(&self, c: &ContainerRestart) -> Result<ActOutcome, ActionError> {
        let pid_ns = |pid: u32| pid_namespace(pid, self.helper);
        crate::runtime::restart::restart_container(
            &crate::runtime::Sources::from_env(),
            c.runtime,
            &c.id,
            c.pid,
            c.start_ticks,
            Duration::from_millis(c.grace_ms),
            Duration::from_millis(c.timeout_ms),
            &pid_ns,
        )
        .map(ActOutcome::Reported)
        .map_err(|e| ActionError::Container(e.to_string()))
    }
}

/// Why the pid namespace of a process could not be had, here or from the
/// helper.
#[derive(Debug, thiserror::Error)]
enum PidNsError {
    /// This process may not read it, and there is no helper to ask.
    #[error(transparent)]
    Here(#[from] PidNsUnread),
    /// The connection shared with the tracer was poisoned by a panic.
    #[error("helper client poisoned")]
    Poisoned,
    /// The helper did not answer.
    #[error("cannot read pid {pid}'s pid namespace: the helper: {source}")]
    Helper { pid: u32, source: ClientError },
    /// The helper answered without it.
    #[error("cannot read pid {pid}'s pid namespace, nor can the helper")]
    NotByTheHelper { pid: u32 },
}

/// The pid namespace of `pid` (the inode of `/proc/PID/ns/pid`): read
/// here, or, where this process may not read it, asked of `helper`.
fn pid_namespace(pid: u32, helper: Option<&SharedClient>) -> Result<u64, PidNsError> {
    let here = crate::runtime::restart::pid_namespace_here(pid);
    let Some(helper) = helper.filter(|_| here.is_err() && !crate::sys::creds::reads_others())
    else {
        return Ok(here?);
    };
    let mut client = helper.lock().map_err(|_| PidNsError::Poisoned)?;
    let got = client
        .namespaces(&[pid])
        .map_err(|source| PidNsError::Helper { pid, source })?;
    got.processes
        .iter()
        .find(|p| p.pid == pid)
        .and_then(|p| p.pid_ns)
        .ok_or(PidNsError::NotByTheHelper { pid })
}

/// Carries out `act` from this process, with `keepalive` for its
/// keepalive rung; `helper`, where there is one, reads the pid namespaces
/// this process may not.
pub fn act_here(
    act: &Act,
    keepalive: &Keepalive,
    helper: Option<&SharedClient>,
) -> Result<ActOutcome, ActionError> {
    actions::act(act, &Direct { keepalive, helper })
}

/// Acts from this process: for agents of our own uid, or as root without a
/// helper running; on the kernel, or in a test on a fake one.
#[derive(Debug)]
pub struct DirectExecutor<S: System = Kernel> {
    pub keepalive: Keepalive,
    pub system: S,
}

impl Default for DirectExecutor {
    /// On the kernel, with the keepalive rung's defaults.
    fn default() -> DirectExecutor {
        DirectExecutor {
            keepalive: Keepalive::default(),
            system: Kernel,
        }
    }
}

impl<S: System> Executor for DirectExecutor<S> {
    fn act(&self, _agent: &str, act: &Act) -> Result<ActOutcome, HealError> {
        let hand = Direct {
            keepalive: &self.keepalive,
            helper: None,
        };
        Ok(actions::act_on(&self.system, act, &hand)?)
    }
}
