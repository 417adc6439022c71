//! Who carries out the ladder's steps: [`DirectHealer`] does them from this
//! process (when it has the permission: same uid, or root) through
//! [`run_step`], and [`ActionsExecutor`] is the helper's side: it carries
//! out a helper request's action with the same functions.
//! Every step re-opens its target by pidfd against the start time the check
//! saw, so a pid reused since then is never touched. [`HelperHealer`] acts
//! directly when its helper has gone away (no connection: nothing was sent).
//! The helper answers a `signal` after SIGTERM and sends SIGKILL on its own
//! timer; [`HelperHealer`] then watches the process's exit through a pidfd
//! of its own, so the ladder still learns how the step ended.

use std::time::Duration;

use selfheal_core::{keepalive::KeepaliveSettings, ladder::Step, prove::ProofTarget};

use crate::{
    actions::{
        self,
        keepalive::{Keepalive, KeepaliveOutcome, ProofKeepalive},
    },
    check::Healer,
    helper::authority::{ActError, Authority, NO_PROOF, ProofBook, Recorded, no_proof, put_back},
};

/// Runs a step here and now; `Ok` carries the action's outcome as JSON text.
pub fn run_step(step: &Step, keepalive: &Keepalive) -> Result<serde_json::Value, String> {
    let e = |e: actions::ActionError| e.to_string();
    let json = |v: Result<serde_json::Value, serde_json::Error>| v.map_err(|e| e.to_string());
    match step {
        Step::ArmKeepalive {
            pid,
            start_ticks,
            fd,
            inode,
        } => {
            let target = actions::guard::open_target(*pid, *start_ticks).map_err(e)?;
            json(serde_json::to_value(
                actions::keepalive::arm_keepalive(&target, *fd, Some(*inode), keepalive)
                    .map_err(e)?,
            ))
        }
        Step::ExpireKeepalive {
            pid,
            start_ticks,
            fd,
            inode,
        } => {
            let target = actions::guard::open_target(*pid, *start_ticks).map_err(e)?;
            json(serde_json::to_value(
                actions::keepalive::expire_keepalive(&target, *fd, *inode).map_err(e)?,
            ))
        }
        Step::DestroySocket {
            pid,
            start_ticks,
            fd,
            inode,
        } => {
            let target = actions::guard::open_target(*pid, *start_ticks).map_err(e)?;
            json(serde_json::to_value(
                actions::destroy::destroy_socket(&target, *fd, Some(*inode)).map_err(e)?,
            ))
        }
        Step::Signal {
            pid,
            start_ticks,
            grace_ms,
        } => {
            let target = actions::guard::open_target(*pid, *start_ticks).map_err(e)?;
            json(serde_json::to_value(
                actions::signal::signal_escalate(&target, Duration::from_millis(*grace_ms))
                    .map_err(e)?,
            ))
        }
        Step::Restart { argv, timeout_ms } => {
            let out =
                actions::restart::restart(argv, Duration::from_millis(*timeout_ms)).map_err(e)?;
            if out.success {
                json(serde_json::to_value(out))
            } else {
                Err(format!(
                    "restart command {argv:?} {}: {}",
                    if out.timed_out {
                        "timed out".to_string()
                    } else {
                        format!("exited with {:?}", out.exit_code)
                    },
                    out.stderr.trim()
                ))
            }
        }
        Step::RestartContainer {
            runtime,
            id,
            pid,
            start_ticks,
            grace_ms,
            timeout_ms,
        } => crate::runtime::restart::restart_container(
            &crate::runtime::Sources::from_env(),
            *runtime,
            id,
            *pid,
            *start_ticks,
            Duration::from_millis(*grace_ms),
            Duration::from_millis(*timeout_ms),
        ),
    }
}

/// Arms a proof keepalive from this process.
fn arm_proof_here(t: &ProofTarget, ka: &ProofKeepalive) -> Result<KeepaliveOutcome, String> {
    let e = |e: actions::ActionError| e.to_string();
    let target = actions::guard::open_target(t.pid, t.start_ticks).map_err(e)?;
    actions::keepalive::arm_proof_keepalive(&target, t.fd, t.inode, ka).map_err(e)
}

/// Puts a socket's keepalive options back from this process.
fn restore_here(
    t: &ProofTarget,
    previous: &KeepaliveSettings,
) -> Result<KeepaliveSettings, String> {
    let e = |e: actions::ActionError| e.to_string();
    let target = actions::guard::open_target(t.pid, t.start_ticks).map_err(e)?;
    actions::keepalive::restore_keepalive(&target, t.fd, Some(t.inode), previous).map_err(e)
}

/// Acts from this process: for agents of our own uid, or as root without a
/// helper running.
#[derive(Debug, Default)]
pub struct DirectHealer {
    pub keepalive: Keepalive,
}

impl Healer for DirectHealer {
    fn act(&self, _agent: &str, step: &Step) -> Result<String, String> {
        run_step(step, &self.keepalive).map(|v| v.to_string())
    }

    fn arm_proof(
        &self,
        _agent: &str,
        t: &ProofTarget,
        ka: &ProofKeepalive,
    ) -> Result<KeepaliveOutcome, String> {
        arm_proof_here(t, ka)
    }

    fn restore_proof(
        &self,
        _agent: &str,
        t: &ProofTarget,
        previous: &KeepaliveSettings,
    ) -> Result<KeepaliveSettings, String> {
        restore_here(t, previous)
    }
}

/// The helper's executor: the real actions, for requests the helper has
/// already parsed, authorized and pinned to a pidfd. It keeps the proofs
/// it armed ([`ProofBook`], by socket cookie): `restore_keepalive` puts
/// back what it recorded then, and `expire_keepalive` ends only a proof it
/// armed. A request's own values are used only for root, and only for a
/// socket it has no record of (a helper restarted since the arming).
#[derive(Debug, Default)]
pub struct ActionsExecutor {
    pub keepalive: Keepalive,
    proofs: std::sync::Arc<std::sync::Mutex<ProofBook>>,
    /// Whether the thread that puts back proofs whose time is up runs.
    expiry: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// Longest hold a caller may ask of a proof keepalive (10 minutes).
const MAX_PROOF_HOLD_MS: u32 = 600_000;

impl ActionsExecutor {
    /// One that puts back a proof nobody restored after `ttl` (rather than
    /// [`crate::helper::authority::PROOF_RECORD_TTL`]: tests).
    pub fn with_proof_ttl(ttl: Duration) -> ActionsExecutor {
        ActionsExecutor {
            proofs: std::sync::Arc::new(std::sync::Mutex::new(ProofBook::new(ttl))),
            ..ActionsExecutor::default()
        }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, ProofBook> {
        lock_book(&self.proofs)
    }

    /// Starts the thread that puts back proofs nobody restored in time
    /// ([`crate::helper::authority::PROOF_RECORD_TTL`]), unless it runs. It ends when no proof is left
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

impl crate::helper::server::Executor for ActionsExecutor {
    fn act(
        &self,
        caller: &selfheal_core::protocol::Caller,
        target: &crate::sys::pidfd::Pidfd,
        req: &selfheal_core::protocol::ActRequest,
    ) -> Result<serde_json::Value, String> {
        // Root's authority: what an in-process caller (tests) asks.
        self.act_checked(caller, target, req, &Authority::root())
            .map_err(|e| match e {
                ActError::Refused(m) | ActError::Failed(m) => m,
            })
    }

    fn act_checked(
        &self,
        caller: &selfheal_core::protocol::Caller,
        target: &crate::sys::pidfd::Pidfd,
        req: &selfheal_core::protocol::ActRequest,
        authority: &Authority,
    ) -> Result<serde_json::Value, ActError> {
        use selfheal_core::protocol::Action;
        let e = |e: actions::ActionError| match e {
            actions::ActionError::Refused { why } => ActError::Refused(why),
            other => ActError::Failed(other.to_string()),
        };
        let failed = ActError::Failed;
        let fd = || {
            req.fd
                .ok_or_else(|| failed(format!("{} needs an fd", req.action.as_str())))
        };
        let inode = || {
            req.inode
                .ok_or_else(|| failed(format!("{} needs an inode", req.action.as_str())))
        };
        // The prove stage's parameters, as a whole object of known keys.
        fn params<T: serde::de::DeserializeOwned>(
            req: &selfheal_core::protocol::ActRequest,
        ) -> Result<T, ActError> {
            serde_json::from_value(serde_json::Value::Object(req.params.clone()))
                .map_err(|e| ActError::Failed(format!("{}: bad params: {e}", req.action.as_str())))
        }
        // Right before anything changes, on the socket's duplicate: the
        // caller may still act on the target, and the socket is in a state
        // the act is for.
        let gate = |seen: &actions::dup::SocketSeen<'_>| {
            authority.check_socket(req.action, target, seen.fd)
        };
        let value = match req.action {
            Action::ArmKeepalive => serde_json::to_value(
                actions::keepalive::arm_keepalive_gated(
                    target,
                    fd()?,
                    req.inode,
                    &self.keepalive,
                    &gate,
                )
                .map_err(e)?,
            ),
            Action::DestroySocket => serde_json::to_value(
                actions::destroy::destroy_socket_gated(target, fd()?, req.inode, &gate)
                    .map_err(e)?,
            ),
            Action::ProveKeepalive => {
                let ka: ProofKeepalive = params(req)?;
                // A caller may not stretch the kernel's own deadline past
                // what a proof needs.
                if ka.hold_ms > MAX_PROOF_HOLD_MS {
                    return Err(failed(format!(
                        "prove_keepalive: hold_ms {} is over the limit of {MAX_PROOF_HOLD_MS}",
                        ka.hold_ms
                    )));
                }
                let cookie = std::cell::Cell::new(None);
                let recording = |seen: &actions::dup::SocketSeen<'_>| {
                    gate(seen)?;
                    let c = seen.cookie.ok_or(
                        "the socket's cookie (SO_COOKIE) cannot be read: no proof is armed that \
                         the helper could not put back",
                    )?;
                    if self.book().get(c).is_none() {
                        self.book().room(caller.uid)?;
                    }
                    cookie.set(Some(c));
                    Ok(())
                };
                let out = actions::keepalive::arm_proof_keepalive_gated(
                    target,
                    fd()?,
                    inode()?,
                    &ka,
                    &recording,
                )
                .map_err(e)?;
                if let Some(c) = cookie.get() {
                    self.book().record(
                        c,
                        Recorded {
                            pid: target.pid(),
                            start_ticks: target.start_ticks(),
                            fd: out.fd,
                            inode: out.inode,
                            uid: caller.uid,
                            previous: out.previous.clone(),
                            at: std::time::Instant::now(),
                        },
                    );
                    self.watch_expiry();
                }
                serde_json::to_value(out)
            }
            Action::RestoreKeepalive => {
                // What a request sends is used only for root, and only for
                // a socket the helper has no record of; clients still send
                // the values their state file holds (protocol 1), so they
                // are accepted, and must be well formed, when present.
                let sent: Option<KeepaliveSettings> = if req.params.is_empty() {
                    None
                } else {
                    Some(params(req)?)
                };
                let cookie = std::cell::Cell::new(None);
                let choose = |seen: &actions::dup::SocketSeen<'_>| {
                    gate(seen)?;
                    let recorded = seen.cookie.and_then(|c| self.book().get(c).cloned());
                    cookie.set(seen.cookie);
                    match recorded {
                        Some(r) => Ok(r.previous),
                        None if authority.is_root() => sent.clone().ok_or_else(|| {
                            "the helper armed no proof keepalive on this socket and the \
                             request names no options to put back"
                                .to_string()
                        }),
                        None => Err(no_proof(req.action)),
                    }
                };
                let back = actions::keepalive::restore_keepalive_chosen(
                    target,
                    fd()?,
                    Some(inode()?),
                    &choose,
                )
                .map_err(e)?;
                if let Some(c) = cookie.get() {
                    self.book().take(c);
                }
                serde_json::to_value(back)
            }
            Action::ExpireKeepalive => {
                let cookie = std::cell::Cell::new(None);
                let armed = |seen: &actions::dup::SocketSeen<'_>| {
                    gate(seen)?;
                    let known = seen.cookie.is_some_and(|c| self.book().get(c).is_some());
                    if !known && !authority.is_root() {
                        return Err(no_proof(req.action));
                    }
                    cookie.set(seen.cookie);
                    Ok(())
                };
                let out =
                    actions::keepalive::expire_keepalive_gated(target, fd()?, inode()?, &armed)
                        .map_err(e)?;
                if out.ended
                    && let Some(c) = cookie.get()
                {
                    self.book().take(c);
                }
                serde_json::to_value(out)
            }
            // SIGTERM only: the server sends SIGKILL on its own timer when
            // the grace runs out ([`Executor::escalate`]), after checking
            // the process and the policy again.
            Action::Signal => {
                let grace = req
                    .params
                    .get("grace_ms")
                    .and_then(serde_json::Value::as_u64)
                    .map_or(crate::helper::server::DEFAULT_GRACE, Duration::from_millis)
                    .min(crate::helper::server::MAX_GRACE);
                authority.recheck(target).map_err(ActError::Refused)?;
                serde_json::to_value(actions::signal::signal_term(target, grace).map_err(e)?)
            }
            // Running a command as root on a caller's say-so is not the
            // helper's to do: the caller runs its own restart command.
            Action::Restart => {
                return Err(failed(
                    "the helper does not run restart commands: the caller runs its own".into(),
                ));
            }
        };
        value.map_err(|e| failed(e.to_string()))
    }

    fn holds_state(&self) -> bool {
        let mut book = self.book();
        book.prune();
        !book.is_empty()
    }

    fn escalate(
        &self,
        _caller: &selfheal_core::protocol::Caller,
        target: &crate::sys::pidfd::Pidfd,
        req: &selfheal_core::protocol::ActRequest,
    ) -> Result<serde_json::Value, String> {
        use selfheal_core::protocol::Action;
        match req.action {
            Action::Signal => serde_json::to_value(
                actions::signal::signal_kill(target).map_err(|e| e.to_string())?,
            )
            .map_err(|e| e.to_string()),
            other => Err(format!("{other} has no second step")),
        }
    }
}

/// Acts through the privileged helper (for agents of other users, or to
/// keep the caller unprivileged); restart commands and runtime restarts run
/// here, as the caller.
pub struct HelperHealer {
    client: SharedClient,
    keepalive: Keepalive,
}

/// One helper connection shared by the healer and the tracer of a check.
pub type SharedClient = std::sync::Arc<std::sync::Mutex<crate::helper::client::HelperClient>>;

impl HelperHealer {
    pub fn new(client: crate::helper::client::HelperClient) -> HelperHealer {
        HelperHealer::shared(std::sync::Arc::new(std::sync::Mutex::new(client)))
    }

    /// A healer on a connection the check's [`HelperTracer`] uses too.
    pub fn shared(client: SharedClient) -> HelperHealer {
        HelperHealer {
            client,
            keepalive: Keepalive::default(),
        }
    }
}

impl Healer for HelperHealer {
    fn act(&self, agent: &str, step: &Step) -> Result<String, String> {
        use selfheal_core::protocol::{ActRequest, Action};
        let socket = |action, pid: &u32, start_ticks: &u64, fd: &i32, inode: &u64| {
            let mut req = ActRequest::new(action, *pid, *start_ticks);
            req.fd = Some(*fd);
            req.inode = Some(*inode);
            req
        };
        let mut req = match step {
            Step::ArmKeepalive {
                pid,
                start_ticks,
                fd,
                inode,
            } => socket(Action::ArmKeepalive, pid, start_ticks, fd, inode),
            Step::ExpireKeepalive {
                pid,
                start_ticks,
                fd,
                inode,
            } => socket(Action::ExpireKeepalive, pid, start_ticks, fd, inode),
            Step::DestroySocket {
                pid,
                start_ticks,
                fd,
                inode,
            } => socket(Action::DestroySocket, pid, start_ticks, fd, inode),
            Step::Signal {
                pid,
                start_ticks,
                grace_ms,
            } => {
                let mut req = ActRequest::new(Action::Signal, *pid, *start_ticks);
                req.params.insert("grace_ms".into(), (*grace_ms).into());
                req
            }
            // Restarts run here, as the caller: a command is the caller's
            // own, and the runtime's socket is the caller's to reach
            // (docs/capabilities.md: the helper is no runtime proxy).
            Step::Restart { .. } | Step::RestartContainer { .. } => {
                return run_step(step, &self.keepalive).map(|v| v.to_string());
            }
        };
        req.agent = Some(agent.to_string());
        let v = self.request(&req, || run_step(step, &self.keepalive))?;
        Ok(match step {
            Step::Signal {
                pid,
                start_ticks,
                grace_ms,
            } if v["escalating"] == true => {
                await_escalation(v, *pid, *start_ticks, *grace_ms).to_string()
            }
            _ => v.to_string(),
        })
    }

    fn arm_proof(
        &self,
        agent: &str,
        t: &ProofTarget,
        ka: &ProofKeepalive,
    ) -> Result<KeepaliveOutcome, String> {
        use selfheal_core::protocol::Action;
        self.prove(Action::ProveKeepalive, agent, t, ka, || {
            arm_proof_here(t, ka)
        })
    }

    fn restore_proof(
        &self,
        agent: &str,
        t: &ProofTarget,
        previous: &KeepaliveSettings,
    ) -> Result<KeepaliveSettings, String> {
        use selfheal_core::protocol::Action;
        let through = self.prove(Action::RestoreKeepalive, agent, t, previous, || {
            restore_here(t, previous)
        });
        match through {
            // A helper that has no record of the proof (it was restarted
            // since arming) puts nothing back for us: we do, where the
            // kernel lets us (our own agent), with what our state recorded.
            Err(e) if e.contains(NO_PROOF) => {
                tracing::warn!("{e}; putting the options back directly where permitted");
                restore_here(t, previous).map_err(|d| format!("{e}; acting directly: {d}"))
            }
            other => other,
        }
    }
}

/// The helper answers a `signal` after SIGTERM and sends SIGKILL on its own
/// timer; the ladder still wants to know how it ended. So the healer
/// watches the process itself through a pidfd of its own (anyone may open
/// one and see the exit), up to the grace plus the SIGKILL wait, and adds
/// `exited` and `watched_ms` (from the answer on) to the helper's
/// answer. A pid that is already gone (or now another process) counts as
/// exited. The next check verifies either way.
fn await_escalation(
    mut v: serde_json::Value,
    pid: u32,
    start_ticks: u64,
    grace_ms: u64,
) -> serde_json::Value {
    let began = std::time::Instant::now();
    let limit =
        Duration::from_millis(grace_ms.min(crate::helper::server::MAX_GRACE.as_millis() as u64))
            + actions::signal::KILL_WAIT
            + Duration::from_secs(1);
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

/// A prove-stage request for socket `t`, with `params` as its options.
fn proof_request(
    action: selfheal_core::protocol::Action,
    agent: &str,
    t: &ProofTarget,
    params: &impl serde::Serialize,
) -> Result<selfheal_core::protocol::ActRequest, String> {
    let mut req = selfheal_core::protocol::ActRequest::new(action, t.pid, t.start_ticks);
    req.fd = Some(t.fd);
    req.inode = Some(t.inode);
    req.agent = Some(agent.to_string());
    match serde_json::to_value(params).map_err(|e| e.to_string())? {
        serde_json::Value::Object(map) => req.params = map,
        other => return Err(format!("params are not an object: {other}")),
    }
    Ok(req)
}

impl HelperHealer {
    /// A prove-stage action on socket `t` with `params`, through the helper
    /// (or `direct`ly, when it went away), its answer typed.
    fn prove<T: serde::Serialize + serde::de::DeserializeOwned>(
        &self,
        action: selfheal_core::protocol::Action,
        agent: &str,
        t: &ProofTarget,
        params: &impl serde::Serialize,
        direct: impl FnOnce() -> Result<T, String>,
    ) -> Result<T, String> {
        let req = proof_request(action, agent, t, params)?;
        let v = self.request(&req, || {
            direct().and_then(|o| serde_json::to_value(o).map_err(|e| e.to_string()))
        })?;
        serde_json::from_value(v).map_err(|e| format!("the helper's answer: {e}"))
    }

    /// Sends `req` to the helper. When the helper went away since the check
    /// began (the request was never sent: no connection could be had),
    /// `direct` acts from here, where permitted, and the log says so.
    fn request(
        &self,
        req: &selfheal_core::protocol::ActRequest,
        direct: impl FnOnce() -> Result<serde_json::Value, String>,
    ) -> Result<serde_json::Value, String> {
        let mut client = self
            .client
            .lock()
            .map_err(|_| "helper client poisoned".to_string())?;
        match client.act(req) {
            Ok(v) => Ok(v),
            Err(e @ crate::helper::ClientError::Unavailable { .. }) => {
                tracing::warn!("{e}; acting directly where permitted");
                direct().map_err(|d| format!("{e}; acting directly: {d}"))
            }
            Err(e) => Err(format!("through the helper: {e}")),
        }
    }
}

/// The helper's tracer as `check`'s eBPF evidence, on the connection the
/// check's [`HelperHealer`] uses.
pub struct HelperTracer(pub SharedClient);

impl crate::check::TracerSource for HelperTracer {
    fn snapshot(
        &mut self,
        pids: &[u32],
    ) -> Result<(selfheal_core::ebpf::TracerSnapshot, Option<u64>), String> {
        let mut client = self
            .0
            .lock()
            .map_err(|_| "helper client poisoned".to_string())?;
        let watched = client.watch(pids).map_err(|e| e.to_string())?;
        let since = watched.watched.iter().map(|w| w.since_ns).max();
        let got = client
            .ebpf_snapshot_with_gaps(pids)
            .map_err(|e| e.to_string())?;
        // The helper answers the pids this user may query; the others are
        // gaps in the evidence, not a reason to lose all of it.
        let mut refused = got.refused;
        refused.extend(watched.refused);
        refused.sort_unstable();
        refused.dedup();
        let mut snapshot = got.snapshot;
        // A gap in the report of the agent whose pid it is.
        snapshot.refused = refused;
        Ok((snapshot, since))
    }
}
