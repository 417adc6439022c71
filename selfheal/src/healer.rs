//! Who carries out the ladder's acts: every act goes through
//! [`actions::act`]. [`DirectHealer`] acts from this
//! process (when it has the permission: same uid, or root) through
//! [`run_step`], and [`ActionsExecutor`] is the helper's side: its hand
//! pins the target, checks the caller's authority on each socket and keeps
//! the proofs it armed. Every step re-opens its target by pidfd against
//! the start time the check saw, so a pid reused since then is never
//! touched. [`HelperHealer`] sends the act's wire form
//! ([`ActRequest::from_act`]), and acts directly when its helper has gone
//! away (no connection: nothing was sent). The helper answers a `signal`
//! after SIGTERM and sends SIGKILL on its own timer; [`HelperHealer`] then
//! watches the process's exit through a pidfd of its own, so the ladder
//! still learns how the step ended.

use std::{cell::Cell, time::Duration};

use selfheal_core::{
    keepalive::{KeepaliveSettings, ProofKeepalive},
    protocol::{Act, ActRequest, Caller, ContainerRestart, MAX_GRACE},
    prove::ProofTarget,
};

use crate::{
    actions::{
        self, ActOutcome, ActionError, Hand, Signalling,
        dup::SocketSeen,
        keepalive::{Keepalive, KeepaliveOutcome},
    },
    check::Healer,
    helper::authority::{ActError, Authority, NO_PROOF, ProofBook, Recorded, no_proof, put_back},
    sys::pidfd::Pidfd,
};

/// Acting from this process: every process opened here by pid and start
/// time, every socket let through, a `signal` carried out to its end, and
/// restarts run as this user. The helper, where there is one, tells the
/// pid namespaces this process may not read itself.
struct Direct<'a> {
    keepalive: &'a Keepalive,
    helper: Option<&'a SharedClient>,
}

impl Hand for Direct<'_> {
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
        .map_err(ActionError::Container)
    }
}

/// The pid namespace of `pid` (the inode of `/proc/PID/ns/pid`): read
/// here, or, where this process may not read it, asked of `helper`.
fn pid_namespace(pid: u32, helper: Option<&SharedClient>) -> Result<u64, String> {
    let here = crate::runtime::restart::pid_namespace_here(pid);
    let Some(helper) = helper.filter(|_| here.is_err() && !crate::sys::creds::reads_others())
    else {
        return here;
    };
    let mut client = helper
        .lock()
        .map_err(|_| "helper client poisoned".to_string())?;
    let got = client
        .namespaces(&[pid])
        .map_err(|e| format!("cannot read pid {pid}'s pid namespace: the helper: {e}"))?;
    got.processes
        .iter()
        .find(|p| p.pid == pid)
        .and_then(|p| p.pid_ns)
        .ok_or_else(|| format!("cannot read pid {pid}'s pid namespace, nor can the helper"))
}

/// Carries out `act` from this process.
fn act_here(
    act: &Act,
    keepalive: &Keepalive,
    helper: Option<&SharedClient>,
) -> Result<ActOutcome, String> {
    actions::act(act, &Direct { keepalive, helper }).map_err(|e| e.to_string())
}

/// Runs an act here and now.
pub fn run_step(act: &Act, keepalive: &Keepalive) -> Result<ActOutcome, String> {
    act_here(act, keepalive, None)
}

/// An outcome that is not the one its act reports.
fn unexpected(out: &ActOutcome) -> String {
    format!("an unexpected outcome: {out}")
}

/// Arms a proof keepalive from this process.
fn arm_proof_here(t: &ProofTarget, ka: &ProofKeepalive) -> Result<KeepaliveOutcome, String> {
    match act_here(&t.prove(ka), &Keepalive::default(), None)? {
        ActOutcome::Keepalive(out) => Ok(out),
        other => Err(unexpected(&other)),
    }
}

/// Puts a socket's keepalive options back from this process.
fn restore_here(
    t: &ProofTarget,
    previous: &KeepaliveSettings,
) -> Result<KeepaliveSettings, String> {
    match act_here(&t.restore(previous), &Keepalive::default(), None)? {
        ActOutcome::Restored(back) => Ok(back),
        other => Err(unexpected(&other)),
    }
}

/// Acts from this process: for agents of our own uid, or as root without a
/// helper running.
#[derive(Debug, Default)]
pub struct DirectHealer {
    pub keepalive: Keepalive,
}

impl Healer for DirectHealer {
    fn act(&self, _agent: &str, act: &Act) -> Result<ActOutcome, String> {
        run_step(act, &self.keepalive)
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

/// The helper acting for its caller: on the pinned process, each socket
/// checked on its duplicate against the caller's authority, the proofs it
/// arms kept in its book, SIGTERM only (the server sends SIGKILL on its own
/// timer when the grace runs out, after checking the process and the
/// policy again), and no restart command: running one as root on a
/// caller's say-so is not the helper's to do.
struct HelperHand<'a> {
    exec: &'a ActionsExecutor,
    caller: &'a Caller,
    target: &'a Pidfd,
    authority: &'a Authority,
    /// The cookie of the socket a proof act was let through on.
    cookie: Cell<Option<u64>>,
}

impl HelperHand<'_> {
    /// The caller's authority on the socket's duplicate: it may still act
    /// on the target, and the socket is in a state the act is for.
    fn check_socket(&self, act: &Act, seen: &SocketSeen<'_>) -> Result<(), String> {
        let action = act
            .action()
            .ok_or_else(|| format!("{} is not the helper's", act.name()))?;
        self.authority.check_socket(action, self.target, seen.fd)
    }

    fn no_proof(&self, act: &Act) -> String {
        act.action().map_or_else(|| NO_PROOF.to_string(), no_proof)
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
                .map_err(|why| ActionError::Refused { why }),
            Act::Restart { .. } | Act::RestartContainer(_) => Err(ActionError::NotHere {
                why: "the helper does not run restart commands: the caller runs its own".into(),
            }),
            _ => Ok(()),
        }
    }

    fn gate(&self, act: &Act, seen: &SocketSeen<'_>) -> Result<(), String> {
        self.check_socket(act, seen)?;
        let book = || self.exec.book();
        match act {
            Act::ProveKeepalive { .. } => {
                let c = seen.cookie.ok_or(
                    "the socket's cookie (SO_COOKIE) cannot be read: no proof is armed that \
                     the helper could not put back",
                )?;
                if book().get(c).is_none() {
                    book().room(self.caller.uid)?;
                }
                self.cookie.set(Some(c));
            }
            Act::ExpireKeepalive { .. } => {
                let known = seen.cookie.is_some_and(|c| book().get(c).is_some());
                if !known && !self.authority.is_root() {
                    return Err(self.no_proof(act));
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
    ) -> Result<KeepaliveSettings, String> {
        self.check_socket(act, seen)?;
        let recorded = seen.cookie.and_then(|c| self.exec.book().get(c).cloned());
        self.cookie.set(seen.cookie);
        match recorded {
            Some(r) => Ok(r.previous),
            None if self.authority.is_root() => sent.cloned().ok_or_else(|| {
                "the helper armed no proof keepalive on this socket and the \
                 request names no options to put back"
                    .to_string()
            }),
            None => Err(self.no_proof(act)),
        }
    }

    fn signalling(&self) -> Signalling {
        Signalling::TermOnly
    }
}

impl ActionsExecutor {
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

impl crate::helper::server::Executor for ActionsExecutor {
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
    ) -> Result<ActOutcome, ActError> {
        self.run(caller, target, act, authority)
            .map_err(ActError::from)
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
    fn act(&self, agent: &str, act: &Act) -> Result<ActOutcome, String> {
        let direct = || act_here(act, &self.keepalive, Some(&self.client));
        // Restarts run here, as the caller: a command is the caller's
        // own, and the runtime's socket is the caller's to reach
        // (docs/capabilities.md: the helper is no runtime proxy).
        let Some(req) = ActRequest::from_act(act, agent) else {
            return direct();
        };
        let v = self.request(&req, || direct().map(|out| out.to_json()))?;
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
    ) -> Result<KeepaliveOutcome, String> {
        self.prove(&t.prove(ka), agent, || arm_proof_here(t, ka))
    }

    fn restore_proof(
        &self,
        agent: &str,
        t: &ProofTarget,
        previous: &KeepaliveSettings,
    ) -> Result<KeepaliveSettings, String> {
        let through = self.prove(&t.restore(previous), agent, || restore_here(t, previous));
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

impl HelperHealer {
    /// A prove-stage act through the helper (or `direct`ly, when it went
    /// away), its answer typed.
    fn prove<T: serde::Serialize + serde::de::DeserializeOwned>(
        &self,
        act: &Act,
        agent: &str,
        direct: impl FnOnce() -> Result<T, String>,
    ) -> Result<T, String> {
        let req = ActRequest::from_act(act, agent)
            .ok_or_else(|| format!("{} does not cross the wire", act.name()))?;
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
        req: &ActRequest,
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

/// The helper's reads, for a check that may not make them itself: on the
/// check's connection (`iterate` once per check,
/// [`crate::inspect::Collector::passes_from`]; `collect` per agent and
/// `namespaces` per table, [`crate::inspect::Collector::reads_from`]).
struct ThroughHelper(SharedClient);

impl ThroughHelper {
    fn call<T>(
        &self,
        what: &str,
        f: impl FnOnce(
            &mut crate::helper::client::HelperClient,
        ) -> Result<T, crate::helper::ClientError>,
    ) -> Result<T, String> {
        let mut client = self
            .0
            .lock()
            .map_err(|_| "helper client poisoned".to_string())?;
        f(&mut client).map_err(|e| format!("{what}: {e}"))
    }
}

impl crate::inspect::HelperReads for ThroughHelper {
    fn iterate(&mut self, pids: &[u32]) -> Result<selfheal_core::protocol::IterateResult, String> {
        self.call("the helper's task iterators", |c| c.iterate(pids))
    }

    fn collect(
        &mut self,
        req: &selfheal_core::protocol::CollectRequest,
    ) -> Result<selfheal_core::protocol::CollectResult, String> {
        self.call("the helper's collection", |c| c.collect(req))
    }

    fn namespaces(
        &mut self,
        pids: &[u32],
    ) -> Result<selfheal_core::protocol::NamespacesResult, String> {
        self.call("the helper's namespace reads", |c| c.namespaces(pids))
    }
}

impl HelperTracer {
    /// Watches `pids` and reads the tracer's evidence of them, with the
    /// helper's error as it came (a refusal means the helper answered).
    pub fn read(
        &mut self,
        pids: &[u32],
    ) -> Result<(selfheal_core::ebpf::TracerSnapshot, Option<u64>), crate::helper::ClientError>
    {
        let mut client = self
            .0
            .lock()
            .map_err(|_| crate::helper::ClientError::Broken {
                path: std::path::PathBuf::new(),
                reason: "helper client poisoned".into(),
            })?;
        let watched = client.watch(pids)?;
        let since = watched.watched.iter().map(|w| w.since_ns).max();
        let got = client.ebpf_snapshot_with_gaps(pids)?;
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

impl crate::check::TracerSource for HelperTracer {
    fn snapshot(
        &mut self,
        pids: &[u32],
    ) -> Result<(selfheal_core::ebpf::TracerSnapshot, Option<u64>), String> {
        self.read(pids).map_err(|e| e.to_string())
    }

    fn passes(&self) -> Option<Box<dyn crate::inspect::HelperReads>> {
        Some(Box::new(ThroughHelper(self.0.clone())))
    }
}
