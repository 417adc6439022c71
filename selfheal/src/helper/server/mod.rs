//! The helper's server: listening (a socket path it binds, or a listener
//! handed over by systemd socket activation), one thread per connection
//! with a bound on their number (in all, a fair share per owner, and a
//! reserve only root may use), framing with size and time limits, a
//! per-owner rate limit and cap on acts in flight (the owner: the
//! caller's real one, [`super::owner`]), authorization of every request
//! by `SO_PEERCRED` and a pidfd of the process that connected
//! (`SO_PEERPIDFD`: it must still live, in the helper's pid namespace, on
//! every request), and of
//! every pid it names (policy), the eBPF tracer it keeps attached, the
//! escalations it runs on its own timer (SIGKILL after a `signal` act's
//! grace, the policy checked again first), the audit of every action, and
//! graceful shutdown. For a caller other than root, an act also needs the
//! kernel's own authority ([`super::authority`]: ptrace access, checked
//! before the target's fds are read and again right before the act). An
//! idle timeout waits while the executor holds state an exit would lose
//! ([`Executor::holds_state`]). The actions themselves are the
//! [`Executor`]'s: the server checks everything first and calls it last.
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

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    io::{self, Read as _, Write as _},
    os::{
        fd::{AsFd, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
        unix::{
            fs::{DirBuilderExt as _, FileTypeExt as _, MetadataExt as _, PermissionsExt as _},
            net::{UnixListener, UnixStream},
        },
    },
    panic::AssertUnwindSafe,
    path::{Path, PathBuf},
    sync::{
        Arc, Condvar, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use nix::sys::socket::{getsockopt, sockopt};
use serde::Serialize;
use serde_json::Value;

use super::{
    authority::{ActError, Authority},
    owner::{Account, ConnLimits, ConnSet, Owners},
    policy::{Policy, Target, never_acted_on, read_target},
    protocol::{
        ActRequest, Action, AttemptWire, Caller, EbpfStatus, ErrorCode, HelloResult, Limits,
        MAX_PIDS, MAX_REQUEST_BYTES, Op, PROTOCOL_VERSION, Response, UnwatchResult, WatchResult,
        WatchedPid, WireError, filter_snapshot, parse_request,
    },
};
use crate::{
    ebpf::{Tracer, TracerError, TracerOptions, chain},
    pidfd::{Pidfd, PidfdError, start_ticks},
};

/// Where the helper listens when no `--socket` is given.
pub const DEFAULT_SOCKET: &str = "/run/selfheal/helper.sock";

/// Mode of the socket file the helper binds: 0666, anyone may connect.
///
/// Authorization is by `SO_PEERCRED` on every request, against the policy;
/// the file mode only limits who may *connect*. The default policy lets
/// every user query and heal its own processes, and `selfheal check` runs
/// from every user's timer, so every user must be able to connect: a 0660
/// socket would need a deployment-time group mirroring the policy with a
/// second, coarser rule that can only disagree with it. What a stranger who
/// connects can cost is bounded by the connection cap, the request size and
/// time limits, and the per-uid rate limit; what it can do is nothing the
/// policy does not grant. (A deployment that wants fewer callers can set
/// `SocketMode=` on its socket unit: the helper accepts any mode then.)
pub const SOCKET_MODE: u32 = 0o666;

/// Mode of the socket's directory when the helper creates it.
pub const SOCKET_DIR_MODE: u32 = 0o755;

/// Most pids one owner may have watched at once.
pub const MAX_WATCHED_PER_UID: usize = 4096;

/// A `signal` act's grace before SIGKILL when the request names none.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// Longest grace a caller may ask the helper to wait before SIGKILL.
pub const MAX_GRACE: Duration = Duration::from_secs(120);

/// `SO_PEERPIDFD` (Linux 6.5): a pidfd of the process that connected.
const SO_PEERPIDFD: libc::c_int = 77;

/// Performs the privileged actions. The server has already parsed the
/// request, authorized the caller, and opened `target` (checked against the
/// request's `start_ticks`) when it calls [`Executor::act`]; the executor
/// acts through `target` only, and bounds its own time (a grace period, a
/// restart command's timeout). A restart command must never come from the
/// request as root: it is the agent's configured one, or it runs with the
/// caller's credentials.
///
/// A `signal` act is two steps: [`Executor::act`] sends SIGTERM and
/// returns at once; when the process still lives after the grace, the
/// server's timer thread checks the policy again and calls
/// [`Executor::escalate`] (SIGKILL).
pub trait Executor: Send + Sync {
    /// Performs `req` on `target`; the result is the response's JSON, the
    /// error its `failed` message.
    fn act(&self, caller: &Caller, target: &Pidfd, req: &ActRequest) -> Result<Value, String>;

    /// [`Executor::act`] under `authority`: the server calls this one.
    /// The executor re-checks the authority right before it changes
    /// anything (on the socket's duplicate, for a socket act); a refusal
    /// is [`ActError::Refused`]. This default re-checks the target, then
    /// acts.
    fn act_checked(
        &self,
        caller: &Caller,
        target: &Pidfd,
        req: &ActRequest,
        authority: &Authority,
    ) -> Result<Value, ActError> {
        authority.recheck(target).map_err(ActError::Refused)?;
        self.act(caller, target, req).map_err(ActError::Failed)
    }

    /// Whether the executor holds state an exit would lose (proofs it armed
    /// and has not yet put back): a socket-activated server then does not
    /// exit when idle.
    fn holds_state(&self) -> bool {
        false
    }

    /// The second step of `req` (SIGKILL after a `signal` act's grace), on
    /// the server's timer; the result goes to the audit log.
    fn escalate(&self, caller: &Caller, target: &Pidfd, req: &ActRequest) -> Result<Value, String> {
        let _ = (caller, target);
        Err(format!("{} has no second step here", req.action))
    }
}

/// One call a [`DryExecutor`] received.
#[derive(Clone, Debug, PartialEq)]
pub struct DryCall {
    pub caller: Caller,
    /// The pidfd's pid and start time.
    pub pid: u32,
    pub start_ticks: u64,
    pub request: ActRequest,
    /// The second step (an escalation on the server's timer).
    pub escalation: bool,
}

/// An executor that does nothing but record its calls (tests, dry runs).
#[derive(Debug, Default)]
pub struct DryExecutor {
    calls: Mutex<Vec<DryCall>>,
    delay: Duration,
}

impl DryExecutor {
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
}

impl Executor for DryExecutor {
    fn act(&self, caller: &Caller, target: &Pidfd, req: &ActRequest) -> Result<Value, String> {
        std::thread::sleep(self.delay);
        lock(&self.calls).push(DryCall {
            caller: *caller,
            pid: target.pid(),
            start_ticks: target.start_ticks(),
            request: req.clone(),
            escalation: false,
        });
        Ok(serde_json::json!({
            "dry_run": true,
            "action": req.action,
            "pid": target.pid(),
        }))
    }

    fn escalate(&self, caller: &Caller, target: &Pidfd, req: &ActRequest) -> Result<Value, String> {
        lock(&self.calls).push(DryCall {
            caller: *caller,
            pid: target.pid(),
            start_ticks: target.start_ticks(),
            request: req.clone(),
            escalation: true,
        });
        Ok(serde_json::json!({
            "dry_run": true,
            "action": req.action,
            "pid": target.pid(),
            "escalation": true,
        }))
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
    /// How to attach the tracer; `None` runs without eBPF.
    pub ebpf: Option<TracerOptions>,
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
    /// [`selfheal_core::owner`]); more are answered `busy` and closed.
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
            subuid: PathBuf::from(super::owner::DEFAULT_SUBUID),
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
    #[error("socket activation: {0}")]
    Activation(String),
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

/// One audited action request, allowed or refused.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AuditRecord {
    pub caller: Caller,
    pub action: super::protocol::Action,
    pub pid: u32,
    pub start_ticks: u64,
    pub fd: Option<i32>,
    /// The judged socket's inode, when the request named one.
    pub inode: Option<u64>,
    pub agent: Option<String>,
    /// `None` when it was performed.
    pub error: Option<WireError>,
    /// The escalation of an earlier act (SIGKILL on the server's timer),
    /// not the act itself.
    pub escalation: bool,
}

/// What `systemd` passes a socket-activated service, read from
/// `LISTEN_PID` and `LISTEN_FDS` (pure): the number of fds from 3 on when
/// they are meant for `our_pid`, else `None`.
pub fn activation(
    listen_pid: Option<&str>,
    listen_fds: Option<&str>,
    our_pid: u32,
) -> Result<Option<u32>, String> {
    let Some(pid) = listen_pid else {
        return Ok(None);
    };
    // Variables inherited from a parent that was activated are not ours.
    if pid.trim().parse::<u32>().ok() != Some(our_pid) {
        return Ok(None);
    }
    let fds = listen_fds.ok_or("LISTEN_PID is set but LISTEN_FDS is not")?;
    let n: u32 = fds
        .trim()
        .parse()
        .map_err(|_| format!("LISTEN_FDS={fds:?} is not a number"))?;
    Ok((n > 0).then_some(n))
}

/// Takes the listening socket systemd passed (fd 3) when `LISTEN_PID` is
/// ours and `LISTEN_FDS` ≥ 1, and removes `LISTEN_PID`, `LISTEN_FDS` and
/// `LISTEN_FDNAMES` from the environment either way, so that no child
/// mistakes them for its own. Every passed fd is made close-on-exec; fds
/// after the first are left unused.
///
/// # Safety
///
/// Changes the environment: no other thread may read or write it
/// meanwhile (call it first thing, before any thread starts).
pub unsafe fn take_activated_listener() -> Result<Option<OwnedFd>, ServerError> {
    let pid = std::env::var("LISTEN_PID").ok();
    let fds = std::env::var("LISTEN_FDS").ok();
    let found = activation(pid.as_deref(), fds.as_deref(), std::process::id());
    for var in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        // SAFETY: the caller guarantees no other thread uses the environment.
        unsafe { std::env::remove_var(var) };
    }
    let Some(n) = found.map_err(ServerError::Activation)? else {
        return Ok(None);
    };
    for fd in 3..3 + n.min(1024) as i32 {
        // SAFETY: fcntl on any integer is harmless; a closed fd fails EBADF.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if flags < 0 {
            if fd == 3 {
                return Err(ServerError::Activation(
                    "LISTEN_FDS is set but fd 3 is not open".into(),
                ));
            }
            continue;
        }
        // SAFETY: as above, on an fd we were handed.
        unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
    }
    // SAFETY: fd 3 is open (checked above) and was passed to us to own.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(3) }))
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
    executor: Arc<dyn Executor>,
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
    let (tracer, ebpf) = attach(opts.ebpf.as_ref());
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
        executor,
        tracer: Mutex::new(TracerState {
            tracer,
            watched: BTreeMap::new(),
        }),
        ebpf,
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

fn attach(opts: Option<&TracerOptions>) -> (Option<Tracer>, EbpfStatus) {
    let Some(opts) = opts else {
        return (
            None,
            EbpfStatus {
                strategy: None,
                attempts: Vec::new(),
                error: Some("eBPF is disabled (--no-ebpf)".into()),
            },
        );
    };
    let wire = |a: &crate::ebpf::Attempt| AttemptWire {
        strategy: a.strategy.name().into(),
        error: a.error.clone(),
    };
    match Tracer::attach(opts) {
        Ok(t) => {
            let status = EbpfStatus {
                strategy: Some(t.strategy().name().into()),
                attempts: t.attempts().iter().map(wire).collect(),
                error: None,
            };
            (Some(t), status)
        }
        Err(e) => {
            let attempts = match &e {
                TracerError::NoStrategy { attempts } => attempts.iter().map(wire).collect(),
                _ => Vec::new(),
            };
            (
                None,
                EbpfStatus {
                    strategy: None,
                    attempts,
                    error: Some(chain(&e)),
                },
            )
        }
    }
}

/// A socket file we bound, removed on exit if it is still ours.
struct BoundSocket {
    path: PathBuf,
    /// Device, inode and change time: inode numbers are reused at once on
    /// tmpfs.
    id: (u64, u64, i64, i64),
}

fn file_id(md: &std::fs::Metadata) -> (u64, u64, i64, i64) {
    (md.dev(), md.ino(), md.ctime(), md.ctime_nsec())
}

impl BoundSocket {
    fn remove(&self) {
        if let Ok(md) = std::fs::symlink_metadata(&self.path)
            && file_id(&md) == self.id
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Creates the socket's directory (0755) if missing and checks that only we
/// or root could replace the socket in it — the directory and every one
/// above it, by the rule of [`crate::safedir`] (symlinks on the way only
/// when root's or ours).
fn prepare_socket_dir(dir: &Path) -> Result<(), ServerError> {
    crate::safedir::check_above(dir).map_err(|e| ServerError::UnsafeDir {
        path: dir.to_path_buf(),
        reason: e.to_string(),
    })?;
    let io_err = |action| {
        move |source| ServerError::Io {
            action,
            path: dir.to_path_buf(),
            source,
        }
    };
    match std::fs::symlink_metadata(dir) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(SOCKET_DIR_MODE)
                .create(dir)
                .map_err(io_err("create"))?;
            // The umask may have taken bits away.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(SOCKET_DIR_MODE))
                .map_err(io_err("set the mode of"))?;
        }
        Err(e) => return Err(io_err("examine")(e)),
    }
    let md = std::fs::symlink_metadata(dir).map_err(io_err("examine"))?;
    let unsafe_dir = |reason: String| ServerError::UnsafeDir {
        path: dir.to_path_buf(),
        reason,
    };
    if md.file_type().is_symlink() {
        return Err(unsafe_dir(
            "it is a symlink (give the real directory)".into(),
        ));
    }
    if !md.is_dir() {
        return Err(unsafe_dir("not a directory".into()));
    }
    let me = euid();
    let mode = md.mode() & 0o7777;
    // A sticky directory (/tmp) lets nobody else remove our socket.
    if mode & 0o1000 == 0 {
        if md.uid() != me && md.uid() != 0 {
            return Err(unsafe_dir(format!(
                "owned by uid {}, not by root or this user (uid {me})",
                md.uid()
            )));
        }
        if mode & 0o022 != 0 {
            return Err(unsafe_dir(format!(
                "writable by group or others (mode {mode:04o})"
            )));
        }
    }
    Ok(())
}

fn bind_path(path: &Path) -> Result<(UnixListener, BoundSocket), ServerError> {
    let io_err = |action| {
        move |source| ServerError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    prepare_socket_dir(dir)?;
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("examine")(e)),
        Ok(md) if md.file_type().is_socket() => match UnixStream::connect(path) {
            Ok(_) => {
                return Err(ServerError::AlreadyRunning {
                    path: path.to_path_buf(),
                });
            }
            // Nobody listens: a helper that died left it.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                std::fs::remove_file(path).map_err(io_err("remove the stale socket"))?;
            }
            Err(e) => return Err(io_err("connect to the existing socket")(e)),
        },
        Ok(_) => {
            return Err(ServerError::NotASocket {
                path: path.to_path_buf(),
            });
        }
    }
    let listener = UnixListener::bind(path).map_err(io_err("bind"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
        .map_err(io_err("set the mode of"))?;
    let md = std::fs::symlink_metadata(path).map_err(io_err("examine"))?;
    Ok((
        listener,
        BoundSocket {
            path: path.to_path_buf(),
            id: file_id(&md),
        },
    ))
}

/// Checks that a handed-over fd is a listening unix stream socket.
fn listener_from_fd(fd: OwnedFd) -> Result<UnixListener, ServerError> {
    let bad = |what: String| ServerError::Activation(format!("fd {}: {what}", fd.as_raw_fd()));
    match getsockopt(&fd, sockopt::SockType) {
        Ok(nix::sys::socket::SockType::Stream) => {}
        Ok(t) => return Err(bad(format!("a {t:?} socket, not a stream socket"))),
        Err(e) => return Err(bad(format!("not a socket ({e})"))),
    }
    if !getsockopt(&fd, sockopt::AcceptConn).unwrap_or(false) {
        return Err(bad("not a listening socket".into()));
    }
    let listener = UnixListener::from(fd);
    listener
        .local_addr()
        .map_err(|e| ServerError::Activation(format!("not a unix socket ({e})")))?;
    Ok(listener)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // No code holding these locks panics; if one did, its data is still
    // consistent enough to serve on.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// State shared by the accept loop and the connections.
struct Shared {
    policy: Policy,
    executor: Arc<dyn Executor>,
    tracer: Mutex<TracerState>,
    ebpf: EbpfStatus,
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
    pid_ns: Option<(u64, u64)>,
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

/// The escalations the timer thread will run: bounded in all, per owner,
/// and root's apart.
struct Escalations {
    pending: Vec<Escalation>,
    /// Room taken by acts in flight that may add an escalation, by owner:
    /// counted as pending, so that acts at once cannot overrun a share.
    reserved: BTreeMap<u32, usize>,
    max: usize,
    max_per_uid: usize,
    root_reserve: usize,
}

/// SIGKILL due at `due` unless the process exits first, or has changed.
struct Escalation {
    caller: Caller,
    /// The owner it counts against.
    owner: u32,
    target: Pidfd,
    req: ActRequest,
    due: Instant,
    /// Who the process was when it got SIGTERM.
    before: Identity,
}

/// What the policy and the audit need to know of a target, read again
/// before every escalation.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Identity {
    target: Target,
    start_ticks: u64,
    exe: Option<PathBuf>,
}

struct Conns {
    /// The open connections, by owner.
    set: ConnSet,
    /// When a connection last opened or closed (the idle clock).
    last_change: Instant,
}

struct TracerState {
    tracer: Option<Tracer>,
    /// Watched pid → the process it was (start time) and the uids that
    /// asked; it leaves the filter when the last uid withdraws or it exits.
    watched: BTreeMap<u32, Watched>,
}

struct Watched {
    start_ticks: u64,
    /// The uids that asked, and the owner each counts against.
    uids: BTreeMap<u32, u32>,
}

impl TracerState {
    /// Forgets watched pids that exited or now name another process.
    fn prune(&mut self) {
        let stale: Vec<u32> = self
            .watched
            .iter()
            .filter(|(pid, w)| start_ticks(**pid) != Some(w.start_ticks))
            .map(|(pid, _)| *pid)
            .collect();
        for pid in stale {
            if let Some(t) = self.tracer.as_mut() {
                let _ = t.unwatch(pid);
            }
            self.watched.remove(&pid);
        }
    }
}

struct RateLimiter {
    limit: RateLimit,
    buckets: Mutex<HashMap<u32, Bucket>>,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

impl RateLimiter {
    /// Takes one token from `uid`'s bucket (an owner's); false when it is
    /// empty.
    fn take(&self, uid: u32) -> bool {
        let now = Instant::now();
        let burst = f64::from(self.limit.burst.max(1));
        let rate = f64::from(self.limit.per_second);
        let refill = |b: &mut Bucket| {
            b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * rate).min(burst);
            b.at = now;
        };
        let mut buckets = lock(&self.buckets);
        if buckets.len() > 4096 {
            buckets.retain(|_, b| {
                refill(b);
                b.tokens < burst
            });
        }
        let b = buckets.entry(uid).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        refill(b);
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

struct LoopLimits {
    idle_timeout: Option<Duration>,
    max_connections: usize,
    max_per_uid: usize,
    root_reserve: usize,
    shutdown_grace: Duration,
}

/// Waits up to `timeout` for any of `fds` to be readable.
fn wait_readable(fds: &[BorrowedFd<'_>], timeout: Duration) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `pfds` is a valid array of `pfds.len()` pollfds.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![false; pfds.len()]);
        }
        return Err(e);
    }
    Ok(pfds.iter().map(|p| p.revents != 0).collect())
}

fn accept_loop(
    shared: &Arc<Shared>,
    listener: UnixListener,
    wake: UnixStream,
    bound: Option<BoundSocket>,
    limits: LoopLimits,
) -> Result<StopReason, ServerError> {
    const TICK: Duration = Duration::from_secs(1);
    let result = loop {
        if shared.stopping.load(Ordering::SeqCst) {
            break Ok(StopReason::Shutdown);
        }
        let mut timeout = TICK;
        if let Some(idle) = limits.idle_timeout {
            let left = {
                let c = lock(&shared.conns);
                c.set
                    .is_empty()
                    .then(|| idle.saturating_sub(c.last_change.elapsed()))
            };
            match left {
                // Idle, unless the executor holds what an exit would lose
                // (proofs armed, not yet put back): then it waits on.
                Some(left) if left.is_zero() && !shared.executor.holds_state() => {
                    break Ok(StopReason::Idle);
                }
                Some(left) if left.is_zero() => {}
                Some(left) => timeout = timeout.min(left),
                None => {}
            }
        }
        let ready = match wait_readable(&[listener.as_fd(), wake.as_fd()], timeout) {
            Ok(r) => r,
            Err(source) => {
                break Err(ServerError::Sys {
                    action: "wait for connections",
                    source,
                });
            }
        };
        let (incoming, woken) = match ready[..] {
            [incoming, woken] => (incoming, woken),
            _ => (false, false),
        };
        if woken {
            let _ = (&wake).read(&mut [0u8; 64]);
        }
        if incoming {
            accept_all(shared, &listener, &limits);
        }
    };
    // Stop accepting: close the listener (and remove our socket file), then
    // give the connections in flight the grace period.
    shared.stopping.store(true, Ordering::SeqCst);
    drop(listener);
    if let Some(b) = &bound {
        b.remove();
    }
    let deadline = Instant::now() + limits.shutdown_grace;
    let mut c = lock(&shared.conns);
    while !c.set.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            tracing::warn!(
                open = c.set.len(),
                "helper: connections still busy after the shutdown grace period; leaving them"
            );
            break;
        }
        c = shared
            .conns_cv
            .wait_timeout(c, left)
            .map(|(g, _)| g)
            .unwrap_or_else(|p| p.into_inner().0);
    }
    result
}

fn accept_all(shared: &Arc<Shared>, listener: &UnixListener, limits: &LoopLimits) {
    let conn_limits = ConnLimits {
        max: limits.max_connections,
        per_owner: limits.max_per_uid,
        root_reserve: limits.root_reserve,
    };
    loop {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                ) =>
            {
                continue;
            }
            Err(e) => {
                // Out of fds, most likely: back off rather than spin.
                tracing::warn!("helper: accept: {e}");
                std::thread::sleep(Duration::from_millis(50));
                return;
            }
        };
        let _ = stream.set_nonblocking(false);
        let caller = match peer(&stream) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!("helper: cannot read a connection's credentials: {e}");
                continue;
            }
        };
        // Who connected, pinned now: the pid SO_PEERCRED reports stays the
        // connector's number even after it exits and the number is reused.
        let connector = Connector::pin(&stream, caller, shared.peer_pidfd);
        // Whom it counts against, read through that pin.
        let account = shared.owners.account(
            caller.uid,
            connector.pidfd.as_ref().map(AsFd::as_fd),
            caller.pid,
        );
        let id = {
            let mut c = lock(&shared.conns);
            match c.set.admit(&account, &conn_limits, &stream) {
                Ok(id) => {
                    c.last_change = Instant::now();
                    id
                }
                Err(why) => {
                    drop(c);
                    refuse(&stream, format!("{why}; try again later"));
                    continue;
                }
            }
        };
        let conn_shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("selfheal-helper-conn".into())
            .spawn(move || {
                let guard = ConnGuard(conn_shared.clone(), id);
                connection(&conn_shared, &stream, &connector, &account, &guard);
            });
        if let Err(e) = spawned {
            // The closure (and its guard) never ran: count it out here.
            tracing::warn!("helper: cannot start a connection thread: {e}");
            drop(ConnGuard(shared.clone(), id));
        }
    }
}

/// Answers `busy` on a connection we will not serve, and closes it.
fn refuse(stream: &UnixStream, message: String) {
    let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
    let _ = (&*stream).write_all(&Response::error(None, ErrorCode::Busy, message).to_line());
}

/// Counts a connection out when its thread ends, however it ends.
struct ConnGuard(Arc<Shared>, u64);

impl ConnGuard {
    /// Marks the connection as serving a request; `false` when it was
    /// closed to admit another owner.
    fn start_request(&self) -> bool {
        lock(&self.0.conns).set.start_request(self.1)
    }

    fn end_request(&self) {
        lock(&self.0.conns).set.end_request(self.1);
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        let mut c = lock(&self.0.conns);
        c.set.remove(self.1);
        c.last_change = Instant::now();
        self.0.conns_cv.notify_all();
    }
}

/// What reading the next request gave.
enum Next {
    Line(Vec<u8>),
    /// The client closed the connection, or it stayed idle, or we stop.
    Done,
    /// Part of a request arrived, not all of it, in time.
    Timeout,
    TooLarge,
}

/// Reads one request line within the request timeout. Reads in slices of
/// 100 ms so that an idle connection notices a shutdown.
fn next_request(stream: &UnixStream, buf: &mut Vec<u8>, shared: &Shared) -> Next {
    const SLICE: Duration = Duration::from_millis(100);
    let deadline = Instant::now() + shared.request_timeout;
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            if pos > MAX_REQUEST_BYTES {
                return Next::TooLarge;
            }
            let line: Vec<u8> = buf.drain(..=pos).collect();
            return Next::Line(line);
        }
        if buf.len() > MAX_REQUEST_BYTES {
            return Next::TooLarge;
        }
        if buf.is_empty() && shared.stopping.load(Ordering::SeqCst) {
            return Next::Done;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return if buf.is_empty() {
                Next::Done
            } else {
                Next::Timeout
            };
        }
        if stream.set_read_timeout(Some(left.min(SLICE))).is_err() {
            return Next::Done;
        }
        match (&*stream).read(&mut chunk) {
            // End of stream: a last request without its newline still counts.
            Ok(0) if buf.is_empty() => return Next::Done,
            Ok(0) => return Next::Line(std::mem::take(buf)),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(_) => return Next::Done,
        }
    }
}

fn connection(
    shared: &Shared,
    stream: &UnixStream,
    connector: &Connector,
    account: &Account,
    guard: &ConnGuard,
) {
    if stream
        .set_write_timeout(Some(shared.write_timeout))
        .is_err()
    {
        return;
    }
    let send = |r: Response| (&*stream).write_all(&r.to_line()).is_ok();
    let mut buf = Vec::new();
    loop {
        match next_request(stream, &mut buf, shared) {
            Next::Line(line) => {
                if !guard.start_request() {
                    // Closed while idle to admit another owner.
                    return;
                }
                let (response, close) = handle(shared, connector, account, &line);
                if !send(response) || close {
                    return;
                }
                guard.end_request();
            }
            Next::Done => return,
            Next::Timeout => {
                tracing::debug!("helper: a request did not arrive in time; closing");
                send(Response::error(
                    None,
                    ErrorCode::Timeout,
                    format!(
                        "request incomplete after {} ms; closing",
                        shared.request_timeout.as_millis()
                    ),
                ));
                return;
            }
            Next::TooLarge => {
                send(Response::error(
                    None,
                    ErrorCode::TooLarge,
                    format!("request longer than {MAX_REQUEST_BYTES} bytes; closing"),
                ));
                return;
            }
        }
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
    }
}

/// The caller's credentials as the socket recorded them at `connect`.
fn peer(stream: &UnixStream) -> io::Result<Caller> {
    let c = getsockopt(stream, sockopt::PeerCredentials).map_err(io::Error::from)?;
    Ok(Caller {
        uid: c.uid(),
        gid: c.gid(),
        pid: u32::try_from(c.pid()).unwrap_or(0),
    })
}

fn refusal(code: ErrorCode, message: impl Into<String>) -> WireError {
    WireError {
        code,
        message: message.into(),
    }
}

/// Answers one request line; `true` with it when the connection must
/// close (its connecting process is gone).
fn handle(
    shared: &Shared,
    connector: &Connector,
    account: &Account,
    line: &[u8],
) -> (Response, bool) {
    let (caller, same_ns) = match connector.verify() {
        Ok(v) => v,
        Err(e) => {
            // The credentials are the dead connector's: nothing is done for
            // them, and its pid (maybe another process's now) is named
            // nowhere, not even in the audit.
            let caller = Caller {
                pid: 0,
                ..connector.caller
            };
            let id = match parse_request(line) {
                Ok(req) => {
                    if let Op::Act(act) = &req.op {
                        shared.audit(&caller, act, Some(&e), false);
                    }
                    Some(req.id)
                }
                Err(pe) => pe.id,
            };
            tracing::warn!(
                caller_uid = caller.uid,
                reason = ?e.message,
                "helper: request on a connection whose connecting process is gone; closing"
            );
            return (Response::error(id, e.code, e.message), true);
        }
    };
    (
        handle_verified(shared, &caller, account, same_ns, line),
        false,
    )
}

fn handle_verified(
    shared: &Shared,
    caller: &Caller,
    account: &Account,
    same_ns: bool,
    line: &[u8],
) -> Response {
    let caller = *caller;
    // Every request costs a token, malformed ones too; parsing first (it is
    // bounded) lets a `busy` answer carry the request's id.
    let parsed = parse_request(line);
    if !shared.rate.take(account.owner) {
        let limit = shared.rate.limit;
        let e = refusal(
            ErrorCode::Busy,
            format!(
                "{account} is over its request rate ({} per second, bursts of {}); try again later",
                limit.per_second, limit.burst
            ),
        );
        let id = match &parsed {
            Ok(req) => {
                if let Op::Act(act) = &req.op {
                    shared.audit(&caller, act, Some(&e), false);
                }
                Some(req.id)
            }
            Err(pe) => pe.id,
        };
        return Response::error(id, e.code, e.message);
    }
    let req = match parsed {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(
                caller_uid = caller.uid,
                caller_pid = caller.pid,
                code = %e.code,
                reason = ?e.message,
                "helper: bad request"
            );
            return Response::from_error(e);
        }
    };
    let result = match &req.op {
        Op::Hello => Ok(shared.hello(&caller)),
        Op::Watch { pids } => shared.watch(&caller, account, same_ns, pids),
        Op::Unwatch { pids } => shared.unwatch(&caller, pids),
        Op::EbpfSnapshot { pids } => shared.snapshot(&caller, same_ns, pids),
        Op::Act(act) => {
            let r = shared.act(&caller, account, same_ns, act);
            shared.audit(&caller, act, r.as_ref().err(), false);
            r
        }
    };
    match result {
        Ok(v) => Response::ok(req.id, v),
        Err(e) => Response::error(Some(req.id), e.code, e.message),
    }
}

/// Opens a pidfd on `pid` (checked against `start` when given) and reads
/// the process's identity through it: the identity is of the process the
/// pidfd holds, since it was still alive after the read.
fn pin(pid: u32, start: Option<u64>) -> Result<(Pidfd, Target), WireError> {
    let gone = |m: String| refusal(ErrorCode::Gone, m);
    let fd = Pidfd::open(pid, start).map_err(|e| match &e {
        PidfdError::Gone { .. } => gone(format!("pid {pid} is not running")),
        PidfdError::Reused { .. } => gone(e.to_string()),
        PidfdError::Open { source, .. }
            if matches!(source.raw_os_error(), Some(libc::EINVAL | libc::ENOENT)) =>
        {
            refusal(
                ErrorCode::BadRequest,
                format!("pid {pid} is not a process (a thread id?)"),
            )
        }
        PidfdError::Open { .. } => refusal(ErrorCode::Failed, e.to_string()),
    })?;
    let target = read_target(pid).ok_or_else(|| gone(format!("pid {pid} is not running")))?;
    if !fd.is_alive() {
        return Err(gone(format!("pid {pid} exited")));
    }
    Ok((fd, target))
}

/// The pid namespace of process `pid` (`"self"` for ours).
fn pid_namespace(pid: &str) -> Option<(u64, u64)> {
    std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|md| (md.dev(), md.ino()))
}

/// What `/proc/self/fdinfo/N` of a pidfd says of its process (pure): its
/// pid in our pid namespace (`Pid:`; -1 once reaped, 0 when not visible
/// here) and how many pid namespaces deep it is, counted from ours
/// (`NSpid:` has one number per level: 1 means ours).
pub fn parse_pidfd_fdinfo(text: &str) -> (Option<i64>, Option<usize>) {
    let mut pid = None;
    let mut levels = None;
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("Pid:") {
            pid = v.trim().parse().ok();
        } else if let Some(v) = line.strip_prefix("NSpid:") {
            let n: Vec<&str> = v.split_whitespace().collect();
            if !n.is_empty() && n.iter().all(|x| x.parse::<i64>().is_ok()) {
                levels = Some(n.len());
            }
        }
    }
    (pid, levels)
}

/// A pidfd of `pid`, if it runs.
pub(crate) fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: a plain syscall; the fd it returns is owned below.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    // SAFETY: a fresh fd we own.
    (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw as i32) })
}

/// Whether the process behind `fd` (a pidfd) has exited.
fn pidfd_exited(fd: BorrowedFd<'_>) -> bool {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n != 0
}

/// The process that opened a connection, pinned at accept: a pidfd of it
/// (`SO_PEERPIDFD`, or `pidfd_open` of the `SO_PEERCRED` pid where the
/// kernel lacks it) and its start time. Every request is checked through
/// it: the connector must still run, under the same pid and start time.
/// A connection is not passed on: a process that received one from its
/// (exited) connector is refused, so the credentials of a dead process,
/// whose pid another process may hold by now, never authorize anything.
struct Connector {
    /// `SO_PEERCRED` at accept.
    caller: Caller,
    /// `None` when the connector was gone already, or its pid is not
    /// visible in our pid namespace (then no pid it names is ours).
    pidfd: Option<OwnedFd>,
    start_ticks: Option<u64>,
    /// How the pidfd was had (`SO_PEERPIDFD`, `pidfd_open`), for messages.
    how: &'static str,
}

impl Connector {
    fn pin(stream: &UnixStream, caller: Caller, peer_pidfd: bool) -> Connector {
        let kernel = if peer_pidfd {
            let mut fd: libc::c_int = -1;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: getsockopt into a local int of the given size.
            let r = unsafe {
                libc::getsockopt(
                    stream.as_raw_fd(),
                    libc::SOL_SOCKET,
                    SO_PEERPIDFD,
                    (&mut fd as *mut libc::c_int).cast(),
                    &mut len,
                )
            };
            if r == 0 && fd >= 0 {
                // SAFETY: a fresh fd the kernel gave us to own.
                Some(Ok(unsafe { OwnedFd::from_raw_fd(fd) }))
            } else {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    // The kernel does not know the option: the fallback.
                    Some(libc::ENOPROTOOPT) => None,
                    // The connector is gone (no task to make a pidfd of).
                    _ => Some(Err(e)),
                }
            }
        } else {
            None
        };
        let (pidfd, how) = match kernel {
            Some(Ok(fd)) => (Some(fd), "SO_PEERPIDFD"),
            Some(Err(_)) => (None, "SO_PEERPIDFD"),
            None if caller.pid == 0 => (None, "pidfd_open"),
            None => (pidfd_open(caller.pid), "pidfd_open"),
        };
        let start_ticks = pidfd.as_ref().and_then(|fd| {
            let st = start_ticks(caller.pid)?;
            // Read while it lived: the start time is its own.
            (!pidfd_exited(fd.as_fd())).then_some(st)
        });
        Connector {
            caller,
            pidfd,
            start_ticks,
            how,
        }
    }

    /// The caller of a request on this connection, and whether it is in
    /// the helper's pid namespace; refused when the process that connected
    /// has exited (or its pid names another process now).
    fn verify(&self) -> Result<(Caller, bool), WireError> {
        let gone = || {
            refusal(
                ErrorCode::Forbidden,
                format!(
                    "the process that opened this connection has exited (checked by {}): \
                     a connection is not passed on; connect again",
                    self.how
                ),
            )
        };
        if self.caller.pid == 0 {
            // Not visible here: another pid namespace. Its pids are not
            // ours; queries that name none are still answered.
            return Ok((self.caller, false));
        }
        let (Some(fd), Some(start)) = (&self.pidfd, self.start_ticks) else {
            return Err(gone());
        };
        if pidfd_exited(fd.as_fd()) {
            return Err(gone());
        }
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))
            .map_err(|e| {
                refusal(
                    ErrorCode::Failed,
                    format!("cannot read the connecting process's pidfd: {e}"),
                )
            })?;
        let (pid, levels) = parse_pidfd_fdinfo(&info);
        if pid != Some(i64::from(self.caller.pid)) {
            return Err(gone());
        }
        // The pid is the connector's while it lives (checked last): what
        // is read under it is the connector's.
        let same_ns = match levels {
            Some(n) => n == 1,
            None => {
                pid_namespace(&self.caller.pid.to_string()) == pid_namespace("self")
                    && pid_namespace("self").is_some()
            }
        };
        if start_ticks(self.caller.pid) != Some(start) || pidfd_exited(fd.as_fd()) {
            return Err(gone());
        }
        Ok((self.caller, same_ns))
    }
}

/// Refuses an fd that is not a socket before anything duplicates it: a
/// file (on a FUSE mount its owner serves, say) could block `fstat` or
/// `close` of the duplicate forever. Reading the link names the file
/// without calling into its filesystem.
fn check_socket_fd(pid: u32, fd: i32) -> Result<(), WireError> {
    match std::fs::read_link(format!("/proc/{pid}/fd/{fd}")) {
        Ok(link) if crate::proc::socket_inode_of_target(&link.to_string_lossy()).is_some() => {
            Ok(())
        }
        Ok(_) => Err(refusal(
            ErrorCode::Failed,
            format!("fd {fd} of pid {pid} is not a socket: left alone"),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(refusal(
            ErrorCode::Failed,
            format!("pid {pid} has no fd {fd}"),
        )),
        Err(e) => Err(refusal(
            ErrorCode::Failed,
            format!("cannot read fd {fd} of pid {pid}: {e}"),
        )),
    }
}

/// Who `target` is now: its uids, start time and executable, read while
/// the pidfd says it lives.
fn identity(target: &Pidfd) -> Option<Identity> {
    let pid = target.pid();
    let t = read_target(pid)?;
    let start = start_ticks(pid)?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    target.is_alive().then_some(Identity {
        target: t,
        start_ticks: start,
        exe,
    })
}

/// Pids a query may name: (pid, start ticks) of those it may, those that
/// do not exist (told apart only to callers that may see every process),
/// and those it may not.
struct Authorized {
    ok: Vec<(u32, u64)>,
    gone: Vec<u32>,
    refused: Vec<u32>,
}

/// Gives back an owner's reserved room for one escalation.
struct EscalationRoom<'a>(&'a Shared, u32);

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
    fn hello(&self, caller: &Caller) -> Value {
        let hello = HelloResult {
            protocol: PROTOCOL_VERSION,
            helper_version: env!("CARGO_PKG_VERSION").into(),
            helper_pid: self.helper_pid,
            caller: *caller,
            ebpf: self.ebpf.clone(),
            limits: Limits {
                max_request_bytes: MAX_REQUEST_BYTES,
                request_timeout_ms: self.request_timeout.as_millis() as u64,
                max_pids: MAX_PIDS,
            },
        };
        serde_json::to_value(hello).unwrap_or(Value::Null)
    }

    fn no_tracer(&self) -> WireError {
        refusal(
            ErrorCode::Unavailable,
            format!(
                "no eBPF tracer: {}",
                self.ebpf.error.as_deref().unwrap_or("not attached")
            ),
        )
    }

    /// Pids in requests are read in the helper's pid namespace: a caller in
    /// another one (a container) would name other processes than it means.
    fn check_pid_namespace(&self, caller: &Caller, same_ns: bool) -> Result<(), WireError> {
        let forbidden = |m: String| refusal(ErrorCode::Forbidden, m);
        if caller.pid == 0 {
            return Err(forbidden(
                "the caller's pid is not visible to the helper (another pid namespace): \
                 the pids it names are not the helper's"
                    .into(),
            ));
        }
        if !same_ns || self.pid_ns.is_none() {
            return Err(forbidden(format!(
                "the caller (pid {}) is not in the helper's pid namespace: \
                 the pids it names are not the helper's",
                caller.pid
            )));
        }
        Ok(())
    }

    /// The one answer a caller gets for a pid it may not reach, whether the
    /// pid exists or not and whatever its start time: nothing in it tells
    /// one case from another.
    fn out_of_reach(caller: &Caller, verb: &str, pid: u32) -> WireError {
        refusal(
            ErrorCode::Forbidden,
            format!(
                "uid {} may not {verb} pid {pid}: no process it may reach has that pid and start time",
                caller.uid
            ),
        )
    }

    /// Pins `pid` for `caller` and checks that the caller may reach it.
    /// For a caller that may not reach every process, every case it may
    /// not know of (no such pid, another uid's process, a start time that
    /// is not its process's) is [`Shared::out_of_reach`]; and nothing is
    /// opened before the policy allows it.
    fn pin_for(
        &self,
        caller: &Caller,
        verb: &str,
        pid: u32,
        start: Option<u64>,
    ) -> Result<(Pidfd, Target), WireError> {
        if caller.uid == 0 {
            return pin(pid, start);
        }
        let hidden = || Self::out_of_reach(caller, verb, pid);
        let reachable = |t: &Target| t.uids.iter().all(|u| self.policy.may_reach(caller.uid, *u));
        let before = read_target(pid).ok_or_else(hidden)?;
        if !reachable(&before) {
            return Err(hidden());
        }
        let (fd, after) = match pin(pid, start) {
            Ok(v) => v,
            // The pid names another process than the one asked for: say so
            // only when that one is the caller's too.
            Err(e) if e.code == ErrorCode::Gone => {
                return Err(match read_target(pid) {
                    Some(t) if reachable(&t) && start_ticks(pid).is_some() => refusal(
                        ErrorCode::Gone,
                        format!("pid {pid} is no longer the process that was judged"),
                    ),
                    _ => hidden(),
                });
            }
            Err(e) if e.code == ErrorCode::BadRequest => return Err(e),
            Err(_) => return Err(hidden()),
        };
        if !reachable(&after) {
            return Err(hidden());
        }
        Ok((fd, after))
    }

    /// Pins and authorizes `pids` for a query, pid by pid.
    fn authorize_query(
        &self,
        caller: &Caller,
        same_ns: bool,
        pids: &[u32],
    ) -> Result<Authorized, WireError> {
        self.check_pid_namespace(caller, same_ns)?;
        let mut out = Authorized {
            ok: Vec::new(),
            gone: Vec::new(),
            refused: Vec::new(),
        };
        for &pid in pids {
            let pinned = self
                .pin_for(caller, "query", pid, None)
                .and_then(|(fd, t)| {
                    self.policy
                        .check_query(caller, &t)
                        .map_err(|_| Self::out_of_reach(caller, "query", pid))?;
                    // Which thread waits on which socket is what the
                    // process's /proc/PID/fd tells: only for a caller the
                    // kernel would let read it (ptrace access).
                    Authority::check(caller, &fd, &self.policy)
                        .map_err(|_| Self::out_of_reach(caller, "query", pid))?;
                    Ok(fd)
                });
            match pinned {
                Ok(fd) => out.ok.push((pid, fd.start_ticks())),
                Err(e) if e.code == ErrorCode::Gone => out.gone.push(pid),
                Err(e) if e.code == ErrorCode::Forbidden => out.refused.push(pid),
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    fn watch(
        &self,
        caller: &Caller,
        account: &Account,
        same_ns: bool,
        pids: &[u32],
    ) -> Result<Value, WireError> {
        if lock(&self.tracer).tracer.is_none() {
            return Err(self.no_tracer());
        }
        let Authorized { ok, gone, refused } = self.authorize_query(caller, same_ns, pids)?;
        let mut st = lock(&self.tracer);
        st.prune();
        let TracerState { tracer, watched } = &mut *st;
        let Some(tracer) = tracer.as_mut() else {
            return Err(self.no_tracer());
        };
        // Counted per owner: a pid any uid of the owner watches is one.
        let owner = account.owner;
        let owns = |w: &Watched| w.uids.values().any(|o| *o == owner);
        let held = watched.values().filter(|w| owns(w)).count();
        let new = ok
            .iter()
            .filter(|(pid, start)| {
                !watched
                    .get(pid)
                    .is_some_and(|w| w.start_ticks == *start && owns(w))
            })
            .count();
        if held + new > self.max_watched {
            return Err(refusal(
                ErrorCode::Busy,
                format!(
                    "{account} would watch more than {} pids; unwatch some first",
                    self.max_watched
                ),
            ));
        }
        let mut out = Vec::new();
        for (pid, start) in ok {
            match watched.get_mut(&pid) {
                Some(w) if w.start_ticks == start => {
                    w.uids.insert(caller.uid, owner);
                }
                _ => {
                    // The process's own owner, not the asker's: its
                    // entries in the socket map count against it.
                    let of = self.owners.of_process(pid).owner;
                    tracer.watch(pid, of).map_err(|e| {
                        refusal(ErrorCode::Failed, format!("watch pid {pid}: {}", chain(&e)))
                    })?;
                    watched.insert(
                        pid,
                        Watched {
                            start_ticks: start,
                            uids: BTreeMap::from([(caller.uid, owner)]),
                        },
                    );
                }
            }
            out.push(WatchedPid {
                pid,
                since_ns: tracer.watched_since(pid).unwrap_or(tracer.attached_at_ns()),
            });
        }
        let result = WatchResult {
            attached_at_ns: tracer.attached_at_ns(),
            watched: out,
            gone,
            refused,
        };
        Ok(serde_json::to_value(result).unwrap_or(Value::Null))
    }

    fn unwatch(&self, caller: &Caller, pids: &[u32]) -> Result<Value, WireError> {
        // Withdrawing one's own interest needs no authorization: it cannot
        // take anything from anyone else.
        let mut st = lock(&self.tracer);
        if st.tracer.is_none() {
            return Err(self.no_tracer());
        }
        let TracerState { tracer, watched } = &mut *st;
        let mut unwatched = Vec::new();
        for &pid in pids {
            let Some(w) = watched.get_mut(&pid) else {
                continue;
            };
            if w.uids.remove(&caller.uid).is_none() {
                continue;
            }
            unwatched.push(pid);
            if w.uids.is_empty() {
                watched.remove(&pid);
                if let Some(t) = tracer.as_mut() {
                    t.unwatch(pid).map_err(|e| {
                        refusal(
                            ErrorCode::Failed,
                            format!("unwatch pid {pid}: {}", chain(&e)),
                        )
                    })?;
                }
            }
        }
        Ok(serde_json::to_value(UnwatchResult { unwatched }).unwrap_or(Value::Null))
    }

    fn snapshot(&self, caller: &Caller, same_ns: bool, pids: &[u32]) -> Result<Value, WireError> {
        if lock(&self.tracer).tracer.is_none() {
            return Err(self.no_tracer());
        }
        let Authorized { ok, refused, .. } = self.authorize_query(caller, same_ns, pids)?;
        let allowed: Vec<u32> = ok.iter().map(|(pid, _)| *pid).collect();
        let mut st = lock(&self.tracer);
        // Entries of a pid that exited or was reused go first, so they are
        // never shown to the new process's owner.
        st.prune();
        let Some(tracer) = st.tracer.as_mut() else {
            return Err(self.no_tracer());
        };
        let snap = tracer
            .snapshot()
            .map_err(|e| refusal(ErrorCode::Failed, format!("eBPF snapshot: {}", chain(&e))))?;
        drop(st);
        let mut v = serde_json::to_value(filter_snapshot(snap, &allowed)).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut v {
            m.insert("refused".into(), refused.into());
        }
        Ok(v)
    }

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

    /// Takes room for one more escalation of the owner, if it fits:
    /// root's reserve for root, the owner's fair share of the table for
    /// every other. The room is held until the reservation drops (after
    /// the escalation is in the table, or not needed).
    fn escalation_room(&self, account: &Account) -> Result<EscalationRoom<'_>, WireError> {
        let mut table = lock(&self.escalations);
        let mut pending: BTreeMap<u32, usize> = table.reserved.clone();
        for e in &table.pending {
            *pending.entry(e.owner).or_default() += 1;
        }
        let limits = selfheal_core::owner::EscalationLimits {
            max: table.max,
            per_owner: table.max_per_uid,
            root_reserve: table.root_reserve,
        };
        selfheal_core::owner::escalation_room(&pending, account, &limits).map_err(|why| {
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

    fn act(
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
                forbidden(m)
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
        let executor = self.executor.clone();
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            executor.act_checked(caller, &target, req, &authority)
        }));
        let mut value = match outcome {
            Ok(Ok(v)) => v,
            Ok(Err(ActError::Refused(_))) if !target.is_alive() => return Err(exited()),
            Ok(Err(ActError::Refused(m))) => {
                return Err(forbidden(format!("{}: {m}: nothing was done", req.action)));
            }
            Ok(Err(ActError::Failed(m))) => {
                let exited = if target.is_alive() {
                    ""
                } else {
                    " (the process has exited)"
                };
                return Err(refusal(
                    ErrorCode::Failed,
                    format!("{}: {m}{exited}", req.action),
                ));
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
            let grace = req
                .params
                .get("grace_ms")
                .and_then(Value::as_u64)
                .map_or(DEFAULT_GRACE, Duration::from_millis)
                .min(MAX_GRACE);
            if let Value::Object(m) = &mut value {
                m.insert("escalating".into(), true.into());
                m.insert("grace_ms".into(), (grace.as_millis() as u64).into());
            }
            lock(&self.escalations).pending.push(Escalation {
                caller: *caller,
                owner: account.owner,
                target,
                req: req.clone(),
                due: Instant::now() + grace,
                before,
            });
            let _ = (&self.timer_wake).write(&[1]);
        }
        Ok(value)
    }

    /// Runs one due escalation: SIGKILL, unless the process exited, or is
    /// no longer who it was at SIGTERM (another exe, other uids, another
    /// start time), or the caller may no longer act on it. Audited.
    fn escalate(&self, e: Escalation) {
        let Escalation {
            caller,
            target,
            req,
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
                .and_then(|()| Authority::check(&caller, &target, &self.policy).map(|_| ()))
                .map_err(|m| refuse(format!("{m}: SIGKILL not sent"))),
        };
        let result = checked.and_then(|()| {
            let executor = self.executor.clone();
            match std::panic::catch_unwind(AssertUnwindSafe(|| {
                executor.escalate(&caller, &target, &req)
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

    /// Logs one audit line and keeps the record.
    fn audit(
        &self,
        caller: &Caller,
        req: &ActRequest,
        error: Option<&WireError>,
        escalation: bool,
    ) {
        let record = AuditRecord {
            caller: *caller,
            action: req.action,
            pid: req.pid,
            start_ticks: req.start_ticks,
            fd: req.fd,
            inode: req.inode,
            agent: req.agent.clone(),
            error: error.cloned(),
            escalation,
        };
        // The agent name is validated to [A-Za-z0-9._-]; the message is
        // quoted (Debug) so that nothing in it can forge a log line.
        let fd = req.fd.map_or_else(|| "-".to_string(), |fd| fd.to_string());
        let inode = req.inode.map_or_else(|| "-".to_string(), |i| i.to_string());
        let agent = req.agent.as_deref().unwrap_or("-");
        let stage = if escalation { "escalation" } else { "act" };
        match error {
            None => tracing::info!(
                target: "selfheal::audit",
                caller_uid = caller.uid,
                caller_pid = caller.pid,
                action = %req.action,
                stage = %stage,
                pid = req.pid,
                start_ticks = req.start_ticks,
                fd = %fd,
                inode = %inode,
                agent = %agent,
                outcome = %"ok",
                "act performed"
            ),
            Some(e) => tracing::warn!(
                target: "selfheal::audit",
                caller_uid = caller.uid,
                caller_pid = caller.pid,
                action = %req.action,
                stage = %stage,
                pid = req.pid,
                start_ticks = req.start_ticks,
                fd = %fd,
                inode = %inode,
                agent = %agent,
                outcome = %e.code,
                reason = ?e.message,
                "act refused"
            ),
        }
        let mut audit = lock(&self.audit);
        while audit.len() >= self.audit_capacity.max(1) {
            audit.pop_front();
        }
        audit.push_back(record);
    }
}

/// The escalation timer: waits on every pending target's pidfd (an exit
/// ends its escalation) and the nearest due time, then runs what is due.
/// On shutdown the pending escalations are dropped, each logged and
/// audited.
fn escalation_loop(shared: &Arc<Shared>, wake: &UnixStream) {
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
        // SAFETY: `pfds` is a valid array of `pfds.len()` pollfds.
        unsafe {
            libc::poll(
                pfds.as_mut_ptr(),
                pfds.len() as libc::nfds_t,
                timeout.as_millis().min(i32::MAX as u128) as i32,
            )
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activation_is_read_from_the_environment() {
        assert_eq!(activation(None, None, 10), Ok(None));
        assert_eq!(activation(Some("10"), Some("1"), 10), Ok(Some(1)));
        assert_eq!(activation(Some("10"), Some("3"), 10), Ok(Some(3)));
        assert_eq!(activation(Some("10"), Some("0"), 10), Ok(None));
        // Meant for another process (inherited): ignored.
        assert_eq!(activation(Some("11"), Some("1"), 10), Ok(None));
        assert_eq!(activation(Some("x"), Some("1"), 10), Ok(None));
        assert!(activation(Some("10"), None, 10).is_err());
        assert!(
            activation(Some("10"), Some("two"), 10)
                .unwrap_err()
                .contains("LISTEN_FDS")
        );
    }

    #[test]
    fn pidfd_fdinfo_gives_the_pid_and_its_depth() {
        let ours = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1060\nPid:\t4242\nNSpid:\t4242\n";
        assert_eq!(parse_pidfd_fdinfo(ours), (Some(4242), Some(1)));
        let nested = "Pid:\t5000\nNSpid:\t5000\t2\n";
        assert_eq!(parse_pidfd_fdinfo(nested), (Some(5000), Some(2)));
        // Reaped: -1, and no NSpid numbers to count.
        assert_eq!(
            parse_pidfd_fdinfo("Pid:\t-1\nNSpid:\t-1\n"),
            (Some(-1), Some(1))
        );
        assert_eq!(parse_pidfd_fdinfo("Pid:\t0\n"), (Some(0), None));
        assert_eq!(parse_pidfd_fdinfo(""), (None, None));
        assert_eq!(parse_pidfd_fdinfo("Pid:\tx\nNSpid:\t1 y\n"), (None, None));
    }

    #[test]
    fn the_rate_limit_refills() {
        let r = RateLimiter {
            limit: RateLimit {
                burst: 3,
                per_second: 20,
            },
            buckets: Mutex::default(),
        };
        assert!((0..3).all(|_| r.take(5)));
        assert!(!r.take(5));
        // Another uid has its own bucket.
        assert!(r.take(6));
        std::thread::sleep(Duration::from_millis(120));
        assert!(r.take(5));
    }

    #[test]
    fn a_stale_socket_is_replaced_and_a_live_one_refused() {
        struct Cleanup(PathBuf);
        impl Drop for Cleanup {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let dir = std::env::temp_dir().join(format!("selfheal-helper-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let _cleanup = Cleanup(dir.clone());
        let path = dir.join("sub/helper.sock");
        let (l, b) = bind_path(&path).unwrap();
        let md = std::fs::metadata(dir.join("sub")).unwrap();
        assert_eq!(md.mode() & 0o777, SOCKET_DIR_MODE);
        assert_eq!(
            std::fs::metadata(&path).unwrap().mode() & 0o777,
            SOCKET_MODE
        );
        assert!(matches!(
            bind_path(&path),
            Err(ServerError::AlreadyRunning { .. })
        ));
        drop(l);
        let (_l, b2) = bind_path(&path).unwrap();
        // The old handle no longer names the file: it leaves it alone.
        b.remove();
        assert!(path.exists());
        b2.remove();
        assert!(!path.exists());
        std::fs::write(&path, "x").unwrap();
        assert!(matches!(
            bind_path(&path),
            Err(ServerError::NotASocket { .. })
        ));
    }
}
