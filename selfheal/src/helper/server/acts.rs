//! An act: refused for pids never acted on, pinned and checked against
//! the policy and the kernel's own authority, its fd checked to be a
//! socket, counted against the owner's acts in flight (and, for a
//! `signal`, its room for an escalation), then handed to the
//! [`Performer`] and its SIGKILL queued for the timer.
//! [`DryPerformer`] records the calls instead (tests, dry runs).

use std::{
    io::Write as _,
    panic::AssertUnwindSafe,
    sync::Mutex,
    time::{Duration, Instant},
};

use selfheal_core::{
    access::owner::Account,
    access::policy::never_acted_on,
    protocol::{Act, ActRequest, Action, Caller, ErrorCode, MAX_GRACE, WireError},
};
use serde_json::Value;

use super::{Performer, Shared, escalation::Escalation, lock, refusal};
use crate::{
    actions::{ActOutcome, ActionError, DryRun},
    helper::access::{
        authority::Authority,
        authz::{check_socket_fd, identity},
    },
    sys::pidfd::Pidfd,
};

/// One call a [`DryPerformer`] received.
#[derive(Clone, Debug, PartialEq)]
pub struct DryCall {
    pub caller: Caller,
    /// The pidfd's pid and start time.
    pub pid: u32,
    pub start_ticks: u64,
    pub act: Act,
    /// The second step (an escalation on the server's timer).
    pub escalation: bool,
}

/// An performer that does nothing but record its calls (tests, dry runs).
#[derive(Debug, Default)]
pub struct DryPerformer {
    calls: Mutex<Vec<DryCall>>,
    delay: Duration,
}

impl DryPerformer {
    pub fn new() -> Self {
        Self::default()
    }

    /// One that takes `delay` per call (an action in flight).
    pub fn with_delay(delay: Duration) -> Self {
        Self {
            calls: Mutex::default(),
            delay,
        }
    }

    /// The calls so far, in order.
    pub fn calls(&self) -> Vec<DryCall> {
        lock(&self.calls).clone()
    }

    /// Records a call and answers what it would have done.
    fn record(&self, caller: &Caller, target: &Pidfd, act: &Act, escalation: bool) -> ActOutcome {
        lock(&self.calls).push(DryCall {
            caller: *caller,
            pid: target.pid(),
            start_ticks: target.start_ticks(),
            act: act.clone(),
            escalation,
        });
        ActOutcome::DryRun(DryRun {
            dry_run: true,
            action: act.name(),
            pid: target.pid(),
            escalation,
        })
    }
}

impl Performer for DryPerformer {
    fn act(&self, caller: &Caller, target: &Pidfd, act: &Act) -> Result<ActOutcome, ActionError> {
        std::thread::sleep(self.delay);
        Ok(self.record(caller, target, act, false))
    }

    fn escalate(
        &self,
        caller: &Caller,
        target: &Pidfd,
        act: &Act,
    ) -> Result<ActOutcome, ActionError> {
        Ok(self.record(caller, target, act, true))
    }
}

/// Counts an act of an owner out when it ends, however it ends.
struct ActSlot<'a>(&'a Shared, u32);

impl Drop for ActSlot<'_> {
    fn drop(&mut self) {
        let mut acts = lock(&self.0.acts);
        if let Some(n) = acts.get_mut(&self.1) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                acts.remove(&self.1);
            }
        }
    }
}

impl Shared {
    /// Takes one of the owner's act slots, or says it has none left.
    fn act_slot(&self, account: &Account) -> Result<ActSlot<'_>, WireError> {
        let mut acts = lock(&self.acts);
        let n = acts.entry(account.owner).or_default();
        if *n >= self.max_acts_per_uid {
            return Err(refusal(
                ErrorCode::Busy,
                format!(
                    "{account} has {} acts in flight (at most {}); try again later",
                    *n, self.max_acts_per_uid
                ),
            ));
        }
        *n += 1;
        Ok(ActSlot(self, account.owner))
    }

    pub(super) fn act(
        &self,
        caller: &Caller,
        account: &Account,
        same_ns: bool,
        req: &ActRequest,
    ) -> Result<Value, WireError> {
        let forbidden = |m: String| refusal(ErrorCode::Forbidden, m);
        if let Some(why) = never_acted_on(req.pid, self.helper_pid) {
            return Err(forbidden(why));
        }
        self.check_pid_namespace(caller, same_ns)?;
        let (target, info) = self.pin_for(caller, "act on", req.pid, Some(req.start_ticks))?;
        self.policy
            .check_act(caller, &info, self.helper_pid)
            .map_err(|m| {
                if caller.uid == 0 {
                    forbidden(m)
                } else {
                    Self::out_of_reach(caller, "act on", req.pid)
                }
            })?;
        // What the kernel would let the caller do itself, before anything
        // of the target (its fds) is read for it.
        let exited = || {
            refusal(
                ErrorCode::Gone,
                format!("pid {} exited: nothing was done", req.pid),
            )
        };
        let authority = Authority::check(caller, &target, &self.policy).map_err(|m| {
            if target.is_alive() {
                forbidden(m.to_string())
            } else {
                exited()
            }
        })?;
        if req.action.needs_fd()
            && let Some(fd) = req.fd
        {
            check_socket_fd(req.pid, fd)?;
        }
        let _slot = self.act_slot(account)?;
        let signal = req.action == Action::Signal;
        let (before, _room) =
            if signal {
                let room = self.escalation_room(account)?;
                (
                    Some(identity(&target).ok_or_else(|| {
                        refusal(ErrorCode::Gone, format!("pid {} exited", req.pid))
                    })?),
                    Some(room),
                )
            } else {
                (None, None)
            };
        let still = || {
            if target.is_alive() {
                ""
            } else {
                " (the process has exited)"
            }
        };
        let act = req
            .act()
            .map_err(|e| refusal(e.code, format!("{}: {}{}", req.action, e.message, still())))?;
        let performer = self.performer.clone();
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            performer.act_checked(caller, &target, &act, &authority)
        }));
        let mut value = match outcome {
            Ok(Ok(out)) => out.to_json(),
            // Refused right before anything changed: said so, or that the
            // process exited meanwhile; tried and failed: said how.
            Ok(Err(e)) => {
                return Err(match e.code() {
                    ErrorCode::Forbidden if !target.is_alive() => exited(),
                    ErrorCode::Forbidden => {
                        forbidden(format!("{}: {e}: nothing was done", req.action))
                    }
                    code => refusal(code, format!("{}: {e}{}", req.action, still())),
                });
            }
            Err(_) => {
                return Err(refusal(
                    ErrorCode::Failed,
                    format!("{}: the action panicked", req.action),
                ));
            }
        };
        if let Some(before) = before
            && target.is_alive()
        {
            let grace = act.grace().min(MAX_GRACE);
            if let Value::Object(m) = &mut value {
                m.insert("escalating".into(), true.into());
                m.insert("grace_ms".into(), (grace.as_millis() as u64).into());
            }
            lock(&self.escalations).pending.push(Escalation {
                caller: *caller,
                owner: account.owner,
                target,
                req: req.clone(),
                act,
                due: Instant::now() + grace,
                before,
            });
            let _ = (&self.timer_wake).write(&[1]);
        }
        Ok(value)
    }
}
