//! The escalations: SIGKILL after a `signal` act's grace, run by the
//! server's timer thread, never by the request that sent SIGTERM. The
//! pending ones are a bounded table (in all, per owner, root's apart),
//! each checked again before it runs (the same process, and the policy
//! and the kernel still allow it) and audited.

use std::{
    collections::BTreeMap,
    io::Read as _,
    os::{
        fd::{AsFd as _, AsRawFd as _},
        unix::net::UnixStream,
    },
    panic::AssertUnwindSafe,
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use selfheal_core::{
    access::owner::Account,
    protocol::{Act, ActRequest, Caller, ErrorCode, WireError},
};

use super::{Shared, lock, refusal};
use crate::{
    helper::access::{
        authority::Authority,
        authz::{Identity, identity},
    },
    sys::pidfd::Pidfd,
};

/// The escalations the timer thread will run: bounded in all, per owner,
/// and root's apart.
pub(super) struct Escalations {
    pub(super) pending: Vec<Escalation>,
    /// Room taken by acts in flight that may add an escalation, by owner:
    /// counted as pending, so that acts at once cannot overrun a share.
    pub(super) reserved: BTreeMap<u32, usize>,
    pub(super) max: usize,
    pub(super) max_per_uid: usize,
    pub(super) root_reserve: usize,
}

/// SIGKILL due at `due` unless the process exits first, or has changed.
pub(super) struct Escalation {
    pub(super) caller: Caller,
    /// The owner it counts against.
    pub(super) owner: u32,
    pub(super) target: Pidfd,
    /// The request, for the audit log, and the act it asked for.
    pub(super) req: ActRequest,
    pub(super) act: Act,
    pub(super) due: Instant,
    /// Who the process was when it got SIGTERM.
    pub(super) before: Identity,
}

/// Gives back an owner's reserved room for one escalation.
pub(super) struct EscalationRoom<'a>(&'a Shared, u32);

impl Drop for EscalationRoom<'_> {
    fn drop(&mut self) {
        let mut t = lock(&self.0.escalations);
        if let Some(n) = t.reserved.get_mut(&self.1) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                t.reserved.remove(&self.1);
            }
        }
    }
}

impl Shared {
    /// Takes room for one more escalation of the owner, if it fits:
    /// root's reserve for root, the owner's fair share of the table for
    /// every other. The room is held until the reservation drops (after
    /// the escalation is in the table, or not needed).
    pub(super) fn escalation_room(
        &self,
        account: &Account,
    ) -> Result<EscalationRoom<'_>, WireError> {
        let mut table = lock(&self.escalations);
        let mut pending: BTreeMap<u32, usize> = table.reserved.clone();
        for e in &table.pending {
            *pending.entry(e.owner).or_default() += 1;
        }
        let limits = selfheal_core::access::owner::EscalationLimits {
            max: table.max,
            per_owner: table.max_per_uid,
            root_reserve: table.root_reserve,
        };
        selfheal_core::access::owner::escalation_room(&pending, account, &limits).map_err(|why| {
            refusal(
                ErrorCode::Busy,
                format!(
                    "too many signals awaiting their grace ({why}): nothing was sent; try again later"
                ),
            )
        })?;
        *table.reserved.entry(account.owner).or_default() += 1;
        Ok(EscalationRoom(self, account.owner))
    }

    /// Runs one due escalation: SIGKILL, unless the process exited, or is
    /// no longer who it was at SIGTERM (another exe, other uids, another
    /// start time), or the caller may no longer act on it. Audited.
    pub(super) fn escalate(&self, e: Escalation) {
        let Escalation {
            caller,
            target,
            req,
            act,
            before,
            ..
        } = e;
        let pid = req.pid;
        let refuse = |m: String| refusal(ErrorCode::Forbidden, m);
        let checked = match identity(&target) {
            None => {
                tracing::debug!(pid, "helper: exited within its grace; no SIGKILL");
                return;
            }
            Some(now) if now != before => Err(refuse(format!(
                "pid {pid} changed since SIGTERM (uids {:?} → {:?}, start {} → {}, exe {:?} → {:?}): \
                 SIGKILL not sent",
                before.target.uids,
                now.target.uids,
                before.start_ticks,
                now.start_ticks,
                before.exe,
                now.exe
            ))),
            Some(now) => self
                .policy
                .check_act(&caller, &now.target, self.helper_pid)
                .and_then(|()| {
                    Authority::check(&caller, &target, &self.policy)
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                })
                .map_err(|m| refuse(format!("{m}: SIGKILL not sent"))),
        };
        let result = checked.and_then(|()| {
            let performer = self.performer.clone();
            match std::panic::catch_unwind(AssertUnwindSafe(|| {
                performer.escalate(&caller, &target, &act)
            })) {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(m)) => Err(refusal(
                    ErrorCode::Failed,
                    format!("{} escalation: {m}", req.action),
                )),
                Err(_) => Err(refusal(
                    ErrorCode::Failed,
                    format!("{} escalation: panicked", req.action),
                )),
            }
        });
        self.audit(&caller, &req, result.as_ref().err(), true);
    }
}

/// The escalation timer: waits on every pending target's pidfd (an exit
/// ends its escalation) and the nearest due time, then runs what is due.
/// On shutdown the pending escalations are dropped, each logged and
/// audited.
pub(super) fn escalation_loop(shared: &Arc<Shared>, wake: &UnixStream) {
    const TICK: Duration = Duration::from_secs(1);
    loop {
        if shared.stopping.load(Ordering::SeqCst) {
            let left = std::mem::take(&mut lock(&shared.escalations).pending);
            for e in left {
                let why = refusal(
                    ErrorCode::Failed,
                    format!(
                        "the helper stopped before the grace of pid {} ran out: SIGKILL not sent",
                        e.req.pid
                    ),
                );
                shared.audit(&e.caller, &e.req, Some(&why), true);
            }
            return;
        }
        // Only this thread removes entries, so the fds stay open while it
        // polls them.
        let (fds, nearest): (Vec<libc::c_int>, Option<Instant>) = {
            let t = lock(&shared.escalations);
            (
                t.pending
                    .iter()
                    .map(|e| e.target.as_fd().as_raw_fd())
                    .collect(),
                t.pending.iter().map(|e| e.due).min(),
            )
        };
        let timeout = nearest.map_or(TICK, |d| {
            d.saturating_duration_since(Instant::now()).min(TICK)
        });
        let mut pfds: Vec<libc::pollfd> = std::iter::once(wake.as_raw_fd())
            .chain(fds.iter().copied())
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let _ = crate::sys::poll::poll(&mut pfds, timeout.as_millis().min(i32::MAX as u128) as i32);
        if pfds[0].revents != 0 {
            let _ = (&*wake).read(&mut [0u8; 64]);
        }
        let now = Instant::now();
        let due: Vec<Escalation> = {
            let mut t = lock(&shared.escalations);
            t.pending.retain(|e| e.target.is_alive());
            let (due, wait): (Vec<_>, Vec<_>) = std::mem::take(&mut t.pending)
                .into_iter()
                .partition(|e| e.due <= now);
            t.pending = wait;
            due
        };
        for e in due {
            shared.escalate(e);
        }
    }
}
