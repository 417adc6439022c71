//! The helper's server, and the room that wires the others: the options
//! it runs with ([`ServerOptions`]), the [`Performer`] it hands actions
//! to, [`serve`] that starts it, the [`ServerHandle`] and [`Stopper`] that
//! stop it, and the state every connection shares. The server listens (a
//! socket path it binds, or a listener handed over by systemd socket
//! activation: [`listen`]), runs one thread per connection with a bound
//! on their number (in all, a fair share per owner, and a reserve only
//! root may use), frames requests with size and time limits, keeps a
//! per-owner rate limit and cap on acts in flight (the owner: the
//! caller's real one, [`super::access::owner`]), authorizes every request by
//! `SO_PEERCRED` and a pidfd of the process that connected
//! (`SO_PEERPIDFD`: it must still live, in the helper's pid namespace, on
//! every request), and every pid it names (policy), keeps the eBPF tracer
//! attached, runs the escalations on its own timer (SIGKILL after a
//! `signal` act's grace, the policy checked again first), audits every
//! action ([`audit`]), and shuts down gracefully. For a caller other than
//! root, an act also needs the kernel's own authority
//! ([`super::access::authority`]: ptrace access, checked before the target's fds
//! are read and again right before the act). An idle timeout waits while
//! the performer holds state an exit would lose
//! ([`Performer::holds_state`]). The actions themselves are the
//! [`Performer`]'s: the server checks everything first and calls it last
//! ([`acts`]); the real one is [`performer::ActionsPerformer`], which keeps
//! the proofs it armed ([`proofs`]).
//!
//! Its rooms: `listen` (binding, the socket's directory, socket
//! activation), `conn` (the accept loop, one connection's framing, and
//! each request's dispatch), `ratelimit` (the per-owner token bucket),
//! `queries` (`hello` and the eBPF tracer's watch, unwatch and snapshot),
//! `acts` (an act, checked then handed to the performer), `performer` (the
//! real actions, by the helper's hand), `proofs` (the proof keepalives it
//! armed), `escalation` (the SIGKILL timer) and `audit` (the record of
//! every act). Who asks, and which processes and fds a request may
//! touch, is [`crate::helper::access`]'s.
//!
//! # Invariants
//!
//! - No request waits on another caller's action: a `signal` act answers
//!   after SIGTERM and its SIGKILL is the timer thread's; the pending
//!   escalations are a bounded table.
//! - No file descriptor a caller chose is duplicated unless
//!   `/proc/PID/fd/FD` names a socket (a file on a FUSE mount the caller
//!   serves could block `fstat` or `close` forever).
//! - A caller that may not reach a pid gets one answer, whether the pid
//!   exists or not and whatever its start time.
//! - Every limit is counted against the caller's owner, read once at
//!   accept: subordinate uids and user namespaces count to the user who
//!   holds them, and root's reserves (connections, escalations) serve only
//!   uid 0.

pub mod acts;
pub mod audit;

mod collect;
mod conn;
mod escalation;
pub mod listen;
pub mod performer;
pub mod proofs;
mod queries;

pub use self::queries::NoIterators;
mod ratelimit;

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    io::{self, Write as _},
    os::{fd::OwnedFd, unix::net::UnixStream},
    path::{Path, PathBuf},
    sync::{
        Arc, Condvar, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use selfheal_core::{
    access::policy::Policy,
    protocol::{Act, Caller, EbpfStatus, ErrorCode, WireError},
};

use self::{
    audit::AuditRecord,
    conn::{Conns, LoopLimits, accept_loop},
    escalation::{Escalations, escalation_loop},
    listen::{bind_path, listener_from_fd},
    queries::{TracerState, attach},
    ratelimit::RateLimiter,
};
use crate::{
    actions::{ActOutcome, ActionError},
    ebpf::TracerOptions,
    helper::access::{
        authority::Authority,
        authz::pid_namespace,
        owner::{ConnSet, Owners},
    },
    sys::pidfd::Pidfd,
};

/// Most pids one owner may have watched at once.
pub const MAX_WATCHED_PER_UID: usize = 4096;

/// Performs the privileged actions on the helper's side (the caller's
/// side, which asks the helper or acts itself, is [`crate::heal::Executor`]).
/// The server has already parsed the
/// request, authorized the caller, and opened `target` (checked against the
/// request's `start_ticks`) when it calls [`Performer::act`]; the performer
/// acts through `target` only, and bounds its own time (a grace period, a
/// restart command's timeout). A restart command must never come from the
/// request as root: it is the agent's configured one, or it runs with the
/// caller's credentials.
///
/// A `signal` act is two steps: [`Performer::act`] sends SIGTERM and
/// returns at once; when the process still lives after the grace, the
/// server's timer thread checks the policy again and calls
/// [`Performer::escalate`] (SIGKILL).
pub trait Performer: Send + Sync {
    /// Performs `req` on `target`; the result is the response's JSON, the
    /// error its `failed` message.
    fn act(&self, caller: &Caller, target: &Pidfd, act: &Act) -> Result<ActOutcome, ActionError>;

    /// [`Performer::act`] under `authority`: the server calls this one.
    /// The performer re-checks the authority right before it changes
    /// anything (on the socket's duplicate, for a socket act); a refusal
    /// is [`ActionError::Refused`]. This default re-checks the target, then
    /// acts.
    fn act_checked(
        &self,
        caller: &Caller,
        target: &Pidfd,
        act: &Act,
        authority: &Authority,
    ) -> Result<ActOutcome, ActionError> {
        authority
            .recheck(target)
            .map_err(|e| ActionError::Refused { why: e.to_string() })?;
        self.act(caller, target, act)
    }

    /// Whether the performer holds state an exit would lose (proofs it armed
    /// and has not yet put back): a socket-activated server then does not
    /// exit when idle.
    fn holds_state(&self) -> bool {
        false
    }

    /// The second step of `req` (SIGKILL after a `signal` act's grace), on
    /// the server's timer; the result goes to the audit log.
    fn escalate(
        &self,
        caller: &Caller,
        target: &Pidfd,
        act: &Act,
    ) -> Result<ActOutcome, ActionError> {
        let _ = (caller, target);
        Err(ActionError::NotHere {
            why: format!("{} has no second step here", act.name()),
        })
    }
}

/// Where the server gets its listening socket.
#[derive(Debug)]
pub enum Listen {
    /// Bind this path (its directory is created 0755 if missing; a stale
    /// socket is replaced; a live one is an error).
    Path(PathBuf),
    /// A listening unix stream socket handed over (socket activation).
    Fd(OwnedFd),
}

/// The per-owner token bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    /// Requests an owner may make at once.
    pub burst: u32,
    /// Requests per second an owner earns back.
    pub per_second: u32,
}

/// How the server runs.
#[derive(Debug)]
pub struct ServerOptions {
    pub listen: Listen,
    pub policy: Policy,
    /// How to attach the receive tracer; `None` attaches none (its hooks
    /// run on every context switch and socket read of the host, watched
    /// or not).
    pub ebpf: Option<TracerOptions>,
    /// Pin the task iterators and answer `iterate` and `collect` with
    /// them (they also pin with a tracer attached).
    pub iterators: bool,
    /// Exit after this long with no connection (socket activation).
    pub idle_timeout: Option<Duration>,
    /// A request must arrive completely within this long.
    pub request_timeout: Duration,
    /// A response must be taken by the client within this long.
    pub write_timeout: Duration,
    /// Connections served at once; more are answered `busy` and closed.
    pub max_connections: usize,
    /// Connections one owner may hold open at once, at most (its fair
    /// share of what other owners leave may be less; see
    /// [`selfheal_core::access::owner`]); more are answered `busy` and closed.
    pub max_connections_per_uid: usize,
    /// Of `max_connections`, how many only root (uid 0) may use: other
    /// owners together hold at most `max_connections - root_reserve`, so
    /// root is never answered `busy` while it holds fewer than this.
    pub root_reserve: usize,
    /// `act` requests one owner may have in flight at once; more are
    /// `busy`.
    pub max_acts_per_uid: usize,
    /// Escalations (SIGKILL after a grace) pending at once: the table all
    /// owners but root share, and the most one owner may have (its fair
    /// share may be less); a `signal` act beyond them is `busy` (nothing
    /// is sent).
    pub max_escalations: usize,
    pub max_escalations_per_uid: usize,
    /// Escalations root may have pending, outside `max_escalations`.
    pub root_escalation_reserve: usize,
    /// Pids one owner may have watched at once (its share of the eBPF
    /// pid filter).
    pub max_watched_per_uid: usize,
    /// The subordinate uid file (`/etc/subuid`): a uid in a range counts
    /// against the range's owner.
    pub subuid: PathBuf,
    /// Identify the connecting process by `SO_PEERPIDFD` where the kernel
    /// has it. `false` (tests) or a kernel without it: `pidfd_open` of the
    /// `SO_PEERCRED` pid at accept, with its start time, as the fallback.
    pub peer_pidfd: bool,
    pub rate: RateLimit,
    /// On shutdown, how long in-flight requests may still take.
    pub shutdown_grace: Duration,
    /// How many audit records [`ServerHandle::audit`] keeps.
    pub audit_capacity: usize,
}

impl ServerOptions {
    /// The defaults: no eBPF, no idle timeout, 5 s per request, 64
    /// connections (16 per owner, 16 of them kept for root), 4 acts in
    /// flight per owner, 1024 pending escalations (64 per owner) and 64
    /// more for root, 4096 watched pids per owner, `/etc/subuid`,
    /// `SO_PEERPIDFD`, bursts of 100 requests per owner then 50 per
    /// second, 30 s to finish in-flight requests on shutdown.
    pub fn new(listen: Listen) -> Self {
        Self {
            listen,
            policy: Policy::default(),
            ebpf: None,
            iterators: false,
            idle_timeout: None,
            request_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
            max_connections: 64,
            max_connections_per_uid: 16,
            root_reserve: 16,
            max_acts_per_uid: 4,
            max_escalations: 1024,
            max_escalations_per_uid: 64,
            root_escalation_reserve: 64,
            max_watched_per_uid: MAX_WATCHED_PER_UID,
            subuid: PathBuf::from(super::access::owner::DEFAULT_SUBUID),
            peer_pidfd: true,
            rate: RateLimit {
                burst: 100,
                per_second: 50,
            },
            shutdown_grace: Duration::from_secs(30),
            audit_capacity: 1024,
        }
    }
}

/// Why the server could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("refusing socket directory {}: {reason}", path.display())]
    UnsafeDir { path: PathBuf, reason: String },
    #[error("another helper already listens on {}", path.display())]
    AlreadyRunning { path: PathBuf },
    #[error("refusing to replace {}: it exists and is not a socket", path.display())]
    NotASocket { path: PathBuf },
    #[error("socket activation: {why}")]
    Activation {
        why: crate::sys::activation::ActivationError,
    },
    #[error("{action}: {source}")]
    Sys {
        action: &'static str,
        source: io::Error,
    },
}

/// Why the server stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// [`Stopper::stop`] (a signal, a test).
    Shutdown,
    /// No connection for the idle timeout.
    Idle,
}

/// A running server.
pub struct ServerHandle {
    stopper: Stopper,
    thread: Option<JoinHandle<Result<StopReason, ServerError>>>,
    socket: Option<PathBuf>,
}

/// Stops a server from anywhere (a signal thread, a test).
#[derive(Clone)]
pub struct Stopper {
    shared: Arc<Shared>,
    wake: Arc<UnixStream>,
}

impl Stopper {
    /// Stops accepting; in-flight requests finish within the grace period.
    pub fn stop(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        let _ = (&*self.wake).write(&[1]);
        let _ = (&self.shared.timer_wake).write(&[1]);
    }
}

impl ServerHandle {
    pub fn stopper(&self) -> Stopper {
        self.stopper.clone()
    }

    /// [`Stopper::stop`].
    pub fn shutdown(&self) {
        self.stopper.stop();
    }

    /// Whether the server has stopped (idle timeout, shutdown).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Waits for the server to stop.
    pub fn join(mut self) -> Result<StopReason, ServerError> {
        self.join_inner()
    }

    fn join_inner(&mut self) -> Result<StopReason, ServerError> {
        match self.thread.take() {
            None => Ok(StopReason::Shutdown),
            Some(t) => t.join().unwrap_or_else(|_| {
                Err(ServerError::Sys {
                    action: "accept loop",
                    source: io::Error::other("the accept thread panicked"),
                })
            }),
        }
    }

    /// The last audit records, oldest first.
    pub fn audit(&self) -> Vec<AuditRecord> {
        lock(&self.stopper.shared.audit).iter().cloned().collect()
    }

    /// The socket path the server bound (`None` when handed a listener).
    pub fn socket_path(&self) -> Option<&Path> {
        self.socket.as_deref()
    }

    /// The tracer's state, as `hello` reports it.
    pub fn ebpf(&self) -> &EbpfStatus {
        &self.stopper.shared.ebpf
    }

    /// Where the task iterators are pinned (root's checks link them; the
    /// helper answers `iterate` with them), or why they are not.
    pub fn iterators(&self) -> Result<&std::path::Path, &NoIterators> {
        match &self.stopper.shared.iterators_at {
            Ok(p) => Ok(p),
            Err(e) => Err(e),
        }
    }

    /// Whether the helper has task iterators for its own passes (pinned,
    /// or loaded unpinned where they could not be pinned).
    pub fn has_iterators(&self) -> bool {
        lock(&self.stopper.shared.iterators).is_ok()
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.shutdown();
            let _ = self.join_inner();
        }
    }
}

/// Starts a server on its own thread: binds (or takes the handed-over
/// listener), attaches the tracer, and returns once it accepts connections.
pub fn serve(
    opts: ServerOptions,
    performer: Arc<dyn Performer>,
) -> Result<ServerHandle, ServerError> {
    let (listener, bound) = match opts.listen {
        Listen::Path(path) => {
            let (l, b) = bind_path(&path)?;
            (l, Some(b))
        }
        Listen::Fd(fd) => (listener_from_fd(fd)?, None),
    };
    listener
        .set_nonblocking(true)
        .map_err(|source| ServerError::Sys {
            action: "make the listener non-blocking",
            source,
        })?;
    let (tracer, ebpf) = attach(opts.ebpf.as_ref(), opts.iterators);
    let (iterators, iterators_at) = queries::pin_iterators(opts.iterators || opts.ebpf.is_some());
    let (wake_tx, wake_rx) = UnixStream::pair().map_err(|source| ServerError::Sys {
        action: "create the wake-up pipe",
        source,
    })?;
    let (timer_tx, timer_rx) = UnixStream::pair().map_err(|source| ServerError::Sys {
        action: "create the timer's wake-up pipe",
        source,
    })?;
    for s in [&wake_tx, &wake_rx, &timer_tx, &timer_rx] {
        s.set_nonblocking(true).map_err(|source| ServerError::Sys {
            action: "make the wake-up pipe non-blocking",
            source,
        })?;
    }
    let max_per_uid = opts.max_connections_per_uid.max(1);
    let owners = Owners::new(opts.subuid);
    // Read now, so that a bad file is logged at start.
    let _ = owners.subuids();
    let shared = Arc::new(Shared {
        policy: opts.policy,
        performer,
        tracer: Mutex::new(TracerState {
            tracer,
            watched: BTreeMap::new(),
        }),
        ebpf,
        iterators: Mutex::new(iterators),
        iterators_at,
        rate: RateLimiter {
            limit: opts.rate,
            buckets: Mutex::default(),
        },
        audit: Mutex::default(),
        audit_capacity: opts.audit_capacity,
        stopping: AtomicBool::new(false),
        conns: Mutex::new(Conns {
            set: ConnSet::default(),
            last_change: Instant::now(),
        }),
        owners,
        conns_cv: Condvar::new(),
        helper_pid: std::process::id(),
        pid_ns: pid_namespace("self"),
        request_timeout: opts.request_timeout,
        write_timeout: opts.write_timeout,
        peer_pidfd: opts.peer_pidfd,
        acts: Mutex::default(),
        max_acts_per_uid: opts.max_acts_per_uid.max(1),
        max_watched: opts.max_watched_per_uid.max(1),
        escalations: Mutex::new(Escalations {
            pending: Vec::new(),
            reserved: BTreeMap::new(),
            max: opts.max_escalations.max(1),
            max_per_uid: opts.max_escalations_per_uid.max(1),
            root_reserve: opts.root_escalation_reserve.max(1),
        }),
        timer_wake: timer_tx,
    });
    let socket = bound.as_ref().map(|b| b.path.clone());
    let loop_shared = shared.clone();
    let max_connections = opts.max_connections.max(1);
    let limits = LoopLimits {
        idle_timeout: opts.idle_timeout,
        max_connections,
        max_per_uid,
        // Root keeps its reserve, but others keep at least one connection.
        root_reserve: opts.root_reserve.min(max_connections - 1),
        shutdown_grace: opts.shutdown_grace,
    };
    let timer_shared = shared.clone();
    let timer = std::thread::Builder::new()
        .name("selfheal-helper-timer".into())
        .spawn(move || escalation_loop(&timer_shared, &timer_rx))
        .map_err(|source| ServerError::Sys {
            action: "start the escalation timer",
            source,
        })?;
    let thread = std::thread::Builder::new()
        .name("selfheal-helper".into())
        .spawn(move || {
            let r = accept_loop(&loop_shared, listener, wake_rx, bound, limits);
            loop_shared.stopping.store(true, Ordering::SeqCst);
            let _ = (&loop_shared.timer_wake).write(&[1]);
            let _ = timer.join();
            r
        })
        .map_err(|source| ServerError::Sys {
            action: "start the accept thread",
            source,
        })?;
    Ok(ServerHandle {
        stopper: Stopper {
            shared,
            wake: Arc::new(wake_tx),
        },
        thread: Some(thread),
        socket,
    })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // No code holding these locks panics; if one did, its data is still
    // consistent enough to serve on.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// State shared by the accept loop and the connections.
pub(super) struct Shared {
    pub(super) policy: Policy,
    performer: Arc<dyn Performer>,
    tracer: Mutex<TracerState>,
    ebpf: EbpfStatus,
    /// The task iterators the helper pinned, opened from their pins (or
    /// loaded unpinned where they could not be pinned), for `iterate` and
    /// `collect`; or why there are none.
    iterators: Mutex<Result<crate::ebpf::iter::TaskIter, NoIterators>>,
    /// Where they are pinned, or why they are not.
    iterators_at: Result<std::path::PathBuf, NoIterators>,
    rate: RateLimiter,
    audit: Mutex<VecDeque<AuditRecord>>,
    audit_capacity: usize,
    stopping: AtomicBool,
    conns: Mutex<Conns>,
    conns_cv: Condvar,
    /// Whom each caller counts against.
    owners: Owners,
    helper_pid: u32,
    /// The helper's pid namespace (device, inode of `/proc/self/ns/pid`).
    pub(super) pid_ns: Option<(u64, u64)>,
    request_timeout: Duration,
    write_timeout: Duration,
    /// Whether to ask the kernel for `SO_PEERPIDFD`.
    peer_pidfd: bool,
    /// `act` requests in flight, by owner.
    acts: Mutex<HashMap<u32, usize>>,
    max_acts_per_uid: usize,
    /// Pids one owner may have watched.
    max_watched: usize,
    escalations: Mutex<Escalations>,
    /// Wakes the escalation timer (a new escalation, shutdown).
    timer_wake: UnixStream,
}

pub(super) fn refusal(code: ErrorCode, message: impl Into<String>) -> WireError {
    WireError {
        code,
        message: message.into(),
    }
}
