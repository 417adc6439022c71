//! The helper's performer ([`ActionsPerformer`]): the real actions, for
//! requests the server has already parsed, authorized and pinned to a
//! pidfd, each through [`actions::act`] by the helper's [`Hand`]: it acts
//! on the pinned process, checks the caller's authority on each socket's
//! duplicate and keeps the proofs it armed ([`ProofBook`]).

use std::{cell::Cell, time::Duration};

use selfheal_core::{
    keepalive::KeepaliveSettings,
    protocol::{Act, Caller},
};

use crate::{
    actions::{
        self, ActOutcome, ActionError, Hand, Signalling, dup::SocketSeen, keepalive::Keepalive,
    },
    helper::access::authority::Authority,
    sys::pidfd::Pidfd,
};

use super::{
    Performer,
    proofs::{ProofBook, Recorded, put_back},
};

/// The helper's performer: the real actions, for requests the helper has
/// already parsed, authorized and pinned to a pidfd. It keeps the proofs
/// it armed ([`ProofBook`], by socket cookie): `restore_keepalive` puts
/// back what it recorded then, and `expire_keepalive` ends only a proof it
/// armed. A request's own values are used only for root, and only for a
/// socket it has no record of (a helper restarted since the arming).
#[derive(Debug, Default)]
pub struct ActionsPerformer {
    pub keepalive: Keepalive,
    proofs: std::sync::Arc<std::sync::Mutex<ProofBook>>,
    /// Whether the thread that puts back proofs whose time is up runs.
    expiry: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// Longest hold a caller may ask of a proof keepalive (10 minutes).
const MAX_PROOF_HOLD_MS: u32 = 600_000;

impl ActionsPerformer {
    /// One that puts back a proof nobody restored after `ttl` (rather than
    /// [`super::proofs::PROOF_RECORD_TTL`]: tests).
    pub fn with_proof_ttl(ttl: Duration) -> ActionsPerformer {
        ActionsPerformer {
            proofs: std::sync::Arc::new(std::sync::Mutex::new(ProofBook::new(ttl))),
            ..ActionsPerformer::default()
        }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, ProofBook> {
        lock_book(&self.proofs)
    }

    /// Starts the thread that puts back proofs nobody restored in time
    /// ([`super::proofs::PROOF_RECORD_TTL`]), unless it runs. It ends when no proof is left
    /// (decided under the book's lock, so a proof recorded meanwhile starts
    /// a new one).
    fn watch_expiry(&self) {
        use std::sync::atomic::Ordering;
        if self.expiry.swap(true, Ordering::SeqCst) {
            return;
        }
        let (book, running) = (self.proofs.clone(), self.expiry.clone());
        let spawned = std::thread::Builder::new()
            .name("selfheal-proof-expiry".into())
            .spawn(move || {
                loop {
                    let wait = {
                        let mut b = lock_book(&book);
                        b.prune();
                        match b.next_due() {
                            None => {
                                running.store(false, Ordering::SeqCst);
                                return;
                            }
                            Some(at) => at.saturating_duration_since(std::time::Instant::now()),
                        }
                    };
                    std::thread::sleep(wait.min(Duration::from_secs(60)));
                    let due = lock_book(&book).due();
                    for (cookie, r) in due {
                        match put_back(cookie, &r) {
                            Ok(back) => tracing::info!(
                                pid = r.pid, fd = r.fd, inode = r.inode, caller_uid = r.uid,
                                "proof keepalive not put back by its caller in time: the helper put back the socket's own options ({back:?})"
                            ),
                            Err(e) => tracing::warn!(
                                pid = r.pid, fd = r.fd, inode = r.inode, caller_uid = r.uid,
                                "proof keepalive not put back by its caller in time, and the helper could not: {e}"
                            ),
                        }
                    }
                }
            });
        if spawned.is_err() {
            self.expiry.store(false, Ordering::SeqCst);
        }
    }
}

fn lock_book(m: &std::sync::Mutex<ProofBook>) -> std::sync::MutexGuard<'_, ProofBook> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The helper acting for its caller: on the pinned process, each socket
/// checked on its duplicate against the caller's authority, the proofs it
/// arms kept in its book, SIGTERM only (the server sends SIGKILL on its own
/// timer when the grace runs out, after checking the process and the
/// policy again), and no restart command: running one as root on a
/// caller's say-so is not the helper's to do.
struct HelperHand<'a> {
    exec: &'a ActionsPerformer,
    caller: &'a Caller,
    target: &'a Pidfd,
    authority: &'a Authority,
    /// The cookie of the socket a proof act was let through on.
    cookie: Cell<Option<u64>>,
}

impl HelperHand<'_> {
    /// The caller's authority on the socket's duplicate: it may still act
    /// on the target, and the socket is in a state the act is for.
    fn check_socket(&self, act: &Act, seen: &SocketSeen<'_>) -> Result<(), ActionError> {
        let action = act
            .action()
            .ok_or(ActionError::NotTheHelpers { act: act.name() })?;
        self.authority
            .check_socket(action, self.target, std::os::fd::AsFd::as_fd(seen.fd))
            .map_err(|e| ActionError::Refused { why: e.to_string() })
    }
}

impl Hand for HelperHand<'_> {
    fn keepalive(&self) -> &Keepalive {
        &self.exec.keepalive
    }

    fn pinned(&self) -> Option<&Pidfd> {
        Some(self.target)
    }

    fn admit(&self, act: &Act) -> Result<(), ActionError> {
        match act {
            // A caller may not stretch the kernel's own deadline past what
            // a proof needs.
            Act::ProveKeepalive { keepalive, .. } if keepalive.hold_ms > MAX_PROOF_HOLD_MS => {
                Err(ActionError::OutOfBounds {
                    why: format!(
                        "prove_keepalive: hold_ms {} is over the limit of {MAX_PROOF_HOLD_MS}",
                        keepalive.hold_ms
                    ),
                })
            }
            Act::Signal { .. } => self
                .authority
                .recheck(self.target)
                .map_err(|e| ActionError::Refused { why: e.to_string() }),
            Act::Restart { .. } | Act::RestartContainer(_) => Err(ActionError::NotHere {
                why: "the helper does not run restart commands: the caller runs its own".into(),
            }),
            _ => Ok(()),
        }
    }

    fn gate(&self, act: &Act, seen: &SocketSeen<'_>) -> Result<(), ActionError> {
        self.check_socket(act, seen)?;
        let book = || self.exec.book();
        match act {
            Act::ProveKeepalive { .. } => {
                let c = seen.cookie.ok_or(ActionError::NoCookie)?;
                if book().get(c).is_none() {
                    book()
                        .room(self.caller.uid)
                        .map_err(|e| ActionError::Refused { why: e.to_string() })?;
                }
                self.cookie.set(Some(c));
            }
            Act::ExpireKeepalive { .. } => {
                let known = seen.cookie.is_some_and(|c| book().get(c).is_some());
                if !known && !self.authority.is_root() {
                    return Err(ActionError::NoProof {
                        action: act.action(),
                    });
                }
                self.cookie.set(seen.cookie);
            }
            _ => {}
        }
        Ok(())
    }

    /// What the helper recorded when it armed the proof on that socket.
    /// What the act sends is used only for root, and only for a socket the
    /// helper has no record of; clients still send the values their state
    /// file holds (protocol 1), so they are accepted, and must be well
    /// formed, when present.
    fn previous(
        &self,
        act: &Act,
        sent: Option<&KeepaliveSettings>,
        seen: &SocketSeen<'_>,
    ) -> Result<KeepaliveSettings, ActionError> {
        self.check_socket(act, seen)?;
        let recorded = seen.cookie.and_then(|c| self.exec.book().get(c).cloned());
        self.cookie.set(seen.cookie);
        match recorded {
            Some(r) => Ok(r.previous),
            None if self.authority.is_root() => sent.cloned().ok_or(ActionError::NoProofNoOptions),
            None => Err(ActionError::NoProof {
                action: act.action(),
            }),
        }
    }

    fn signalling(&self) -> Signalling {
        Signalling::TermOnly
    }
}

impl ActionsPerformer {
    /// Carries out `act` on `target` for `caller` under `authority`, and
    /// keeps the book of the proofs it arms.
    fn run(
        &self,
        caller: &Caller,
        target: &Pidfd,
        act: &Act,
        authority: &Authority,
    ) -> Result<ActOutcome, ActionError> {
        let hand = HelperHand {
            exec: self,
            caller,
            target,
            authority,
            cookie: Cell::new(None),
        };
        let out = actions::act(act, &hand)?;
        if let Some(c) = hand.cookie.get() {
            match &out {
                ActOutcome::Keepalive(armed) => {
                    self.book().record(
                        c,
                        Recorded {
                            pid: target.pid(),
                            start_ticks: target.start_ticks(),
                            fd: armed.fd,
                            inode: armed.inode,
                            uid: caller.uid,
                            previous: armed.previous.clone(),
                            at: std::time::Instant::now(),
                        },
                    );
                    self.watch_expiry();
                }
                ActOutcome::Restored(_) => {
                    self.book().take(c);
                }
                ActOutcome::Expired(expired) if expired.ended => {
                    self.book().take(c);
                }
                _ => {}
            }
        }
        Ok(out)
    }
}

impl Performer for ActionsPerformer {
    fn act(&self, caller: &Caller, target: &Pidfd, act: &Act) -> Result<ActOutcome, ActionError> {
        // Root's authority: what an in-process caller (tests) asks.
        self.run(caller, target, act, &Authority::root())
    }

    fn act_checked(
        &self,
        caller: &Caller,
        target: &Pidfd,
        act: &Act,
        authority: &Authority,
    ) -> Result<ActOutcome, ActionError> {
        self.run(caller, target, act, authority)
    }

    fn holds_state(&self) -> bool {
        let mut book = self.book();
        book.prune();
        !book.is_empty()
    }

    fn escalate(
        &self,
        _caller: &Caller,
        target: &Pidfd,
        act: &Act,
    ) -> Result<ActOutcome, ActionError> {
        match act {
            Act::Signal { .. } => Ok(ActOutcome::Signalled(actions::signal::signal_kill(target)?)),
            other => Err(ActionError::NotHere {
                why: format!("{} has no second step", other.name()),
            }),
        }
    }
}
