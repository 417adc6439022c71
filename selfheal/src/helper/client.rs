//! The client side of the helper protocol: one connection, reused while it
//! is fresh, with connect and read timeouts. A helper that is not there is
//! [`ClientError::Unavailable`] (callers go on without it); a connection
//! lost mid-request is retried once on a fresh connection for the
//! idempotent ops (`hello`, `watch`, `unwatch`, `ebpf_snapshot`), after a
//! pause for a dying helper to let go of its socket and waiting up to the
//! connect timeout for a helper being restarted, and logged; never for
//! `act`, which may have been performed.

use std::{
    io::{self, Read as _, Write as _},
    os::{fd::AsRawFd as _, unix::net::UnixStream},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use nix::{
    errno::Errno,
    sys::socket::{
        AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr, connect, getsockopt, recv, socket,
        sockopt,
    },
};
use serde::de::DeserializeOwned;
use serde_json::Value;

use selfheal_core::ebpf::TracerSnapshot;
use selfheal_core::protocol::{
    ActRequest, CollectRequest, CollectResult, ErrorCode, HelloResult, IterateResult,
    NamespacesResult, Op, Request, Response, SnapshotWire, UnwatchResult, WatchResult,
};

/// The longest response accepted (a snapshot of many sockets is large).
const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// A connection idle longer than this is replaced before use: the helper
/// closes idle connections after its request timeout.
const REUSE_IDLE: Duration = Duration::from_millis(500);

/// Between attempts to reach a helper that went away mid-request.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Before the retry: time for a dying helper to close its listener.
const DYING_PAUSE: Duration = Duration::from_millis(100);

/// Names one more uid trusted to serve the helper socket (besides root and
/// this process's own uid).
pub const HELPER_UID_ENV: &str = "SELFHEAL_HELPER_UID";

/// The uids a client accepts as the helper: root, this process's effective
/// uid (a private helper a user runs for their own processes) and the uid
/// in [`HELPER_UID_ENV`], if set and a number.
pub fn trusted_server_uids() -> Vec<u32> {
    let me = crate::sys::creds::euid();
    let mut uids = vec![0, me];
    if let Some(u) = std::env::var(HELPER_UID_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
    {
        uids.push(u);
    }
    uids.sort_unstable();
    uids.dedup();
    uids
}

/// An `ebpf_snapshot` answer: the evidence of the pids the caller may
/// query, and the others.
#[derive(Clone, Debug, PartialEq)]
pub struct SnapshotWithGaps {
    pub snapshot: TracerSnapshot,
    /// Pids the helper refused (not the caller's, or not running): no
    /// evidence of them, a gap.
    pub refused: Vec<u32>,
}

/// The helper answered with an error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("helper refused: {code}: {message}")]
pub struct RemoteError {
    pub code: ErrorCode,
    pub message: String,
}

/// Why a request got no result.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No helper to talk to (no socket, nobody listening, no permission):
    /// go on without it.
    #[error("helper at {} is unavailable: {reason}", path.display())]
    Unavailable { path: PathBuf, reason: String },
    /// The connection broke before the answer (the helper died or closed
    /// it).
    #[error("helper at {}: {reason}", path.display())]
    Broken { path: PathBuf, reason: String },
    /// No answer in time.
    #[error("helper at {} did not answer within {} ms", path.display(), timeout.as_millis())]
    Timeout { path: PathBuf, timeout: Duration },
    /// An answer this client cannot read.
    #[error("helper at {} sent a bad response: {reason}", path.display())]
    Protocol { path: PathBuf, reason: String },
    /// The socket is served by a uid that is not trusted to be the helper.
    #[error(
        "refusing the helper at {}: it is served by uid {uid} (pid {pid}), not by {}; \
         if that is your helper, set {HELPER_UID_ENV}={uid}, else remove the socket and \
         start the real helper",
        path.display(),
        allowed.iter().map(|u| format!("uid {u}")).collect::<Vec<_>>().join(" or ")
    )]
    Untrusted {
        path: PathBuf,
        uid: u32,
        pid: i32,
        allowed: Vec<u32>,
    },
    /// The helper refused the request.
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

impl ClientError {
    /// The helper's error code, when the helper answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Remote(r) => Some(r.code),
            _ => None,
        }
    }
}

/// Timeouts of a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientOptions {
    /// To get a connection (a helper whose backlog is full).
    pub connect_timeout: Duration,
    /// For the answer to a query.
    pub timeout: Duration,
    /// For the answer to `act` (actions wait for grace periods and restart
    /// commands).
    pub act_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(1),
            timeout: Duration::from_secs(10),
            act_timeout: Duration::from_secs(120),
        }
    }
}

struct Conn {
    stream: UnixStream,
    buf: Vec<u8>,
    last_used: Instant,
}

/// A client of `selfheal helper`.
pub struct HelperClient {
    path: PathBuf,
    opts: ClientOptions,
    conn: Option<Conn>,
    next_id: u64,
}

/// How one attempt failed.
enum Failure {
    /// Worth one retry on a fresh connection (for an idempotent op).
    Broken(String),
    Final(ClientError),
}

impl HelperClient {
    /// Connects to the helper at `path` with the default timeouts.
    pub fn connect(path: impl AsRef<Path>) -> Result<HelperClient, ClientError> {
        Self::connect_with(path, ClientOptions::default())
    }

    pub fn connect_with(
        path: impl AsRef<Path>,
        opts: ClientOptions,
    ) -> Result<HelperClient, ClientError> {
        let mut c = HelperClient {
            path: path.as_ref().to_path_buf(),
            opts,
            conn: None,
            next_id: 1,
        };
        c.conn = Some(c.open()?);
        Ok(c)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Protocol and helper versions, the caller as the helper sees it, the
    /// eBPF strategy or why there is none, the limits.
    pub fn hello(&mut self) -> Result<HelloResult, ClientError> {
        self.typed(Op::Hello, true)
    }

    /// Adds `pids` to the helper's tracer; says since when each is watched.
    pub fn watch(&mut self, pids: &[u32]) -> Result<WatchResult, ClientError> {
        self.typed(
            Op::Watch {
                pids: pids.to_vec(),
            },
            true,
        )
    }

    /// Withdraws this uid's interest in `pids`.
    pub fn unwatch(&mut self, pids: &[u32]) -> Result<UnwatchResult, ClientError> {
        self.typed(
            Op::Unwatch {
                pids: pids.to_vec(),
            },
            true,
        )
    }

    /// The tracer's snapshot, holding only those of `pids` this caller may
    /// query (see [`HelperClient::ebpf_snapshot_with_gaps`]).
    pub fn ebpf_snapshot(&mut self, pids: &[u32]) -> Result<TracerSnapshot, ClientError> {
        self.ebpf_snapshot_with_gaps(pids).map(|g| g.snapshot)
    }

    /// The tracer's snapshot of `pids`, with the pids the helper refused
    /// (this caller may not query them, or they do not exist): per-pid
    /// gaps in the evidence, the rest answered.
    pub fn ebpf_snapshot_with_gaps(
        &mut self,
        pids: &[u32],
    ) -> Result<SnapshotWithGaps, ClientError> {
        let mut wire: SnapshotWire = self.typed(
            Op::EbpfSnapshot {
                pids: pids.to_vec(),
            },
            true,
        )?;
        let refused = std::mem::take(&mut wire.refused);
        let snapshot = wire
            .into_snapshot()
            .map_err(|reason| ClientError::Protocol {
                path: self.path.clone(),
                reason,
            })?;
        Ok(SnapshotWithGaps { snapshot, refused })
    }

    /// One pass of the helper's task iterators over each of `pids` this
    /// caller may query (the others `refused`, or `gone` to root).
    pub fn iterate(&mut self, pids: &[u32]) -> Result<IterateResult, ClientError> {
        self.typed(
            Op::Iterate {
                pids: pids.to_vec(),
            },
            true,
        )
    }

    /// Each of `req.pids` this caller may query, read by the helper as a
    /// check reads it (the others `refused`, or `gone` to root).
    pub fn collect(&mut self, req: &CollectRequest) -> Result<CollectResult, ClientError> {
        self.typed(Op::Collect(req.clone()), true)
    }

    /// The pid and network namespaces of each of `pids` this caller may
    /// query.
    pub fn namespaces(&mut self, pids: &[u32]) -> Result<NamespacesResult, ClientError> {
        self.typed(
            Op::Namespaces {
                pids: pids.to_vec(),
            },
            true,
        )
    }

    /// Asks the helper to act; the result is what the action reports. Never
    /// retried: a lost connection may have lost only the answer.
    pub fn act(&mut self, req: &ActRequest) -> Result<Value, ClientError> {
        self.call(Op::Act(req.clone()), false)
    }

    fn typed<T: DeserializeOwned>(&mut self, op: Op, idempotent: bool) -> Result<T, ClientError> {
        let name = op.name();
        let v = self.call(op, idempotent)?;
        serde_json::from_value(v).map_err(|e| ClientError::Protocol {
            path: self.path.clone(),
            reason: format!("{name} result: {e}"),
        })
    }

    /// Sends one request and reads its answer, retrying once on a fresh
    /// connection when `idempotent` and the connection broke.
    fn call(&mut self, op: Op, idempotent: bool) -> Result<Value, ClientError> {
        let timeout = if matches!(op, Op::Act(_)) {
            self.opts.act_timeout
        } else {
            self.opts.timeout
        };
        let req = Request {
            id: self.next_id,
            op,
        };
        self.next_id = self.next_id.wrapping_add(1);
        let line = req.to_line();
        match self.attempt(req.id, &line, timeout) {
            Ok(v) => Ok(v),
            Err(Failure::Final(e)) => Err(e),
            Err(Failure::Broken(reason)) if !idempotent => Err(ClientError::Broken {
                path: self.path.clone(),
                reason,
            }),
            Err(Failure::Broken(first)) => {
                self.conn = None;
                tracing::warn!(
                    "helper at {}: {first}; retrying the {} request once on a new connection",
                    self.path.display(),
                    req.op.name()
                );
                // A dying helper closes our connection before its
                // listener (its fds close in order): a retry at once could
                // land in the listener's queue and be reset with it. So the
                // retry waits a moment first, and then, for a helper being
                // restarted (systemd's Restart=on-failure) that does not
                // listen yet, up to the connect timeout. Safe to repeat: a
                // connection that could not be opened carried no request.
                std::thread::sleep(DYING_PAUSE);
                let deadline = Instant::now() + self.opts.connect_timeout;
                let second = loop {
                    match self.attempt(req.id, &line, timeout) {
                        Err(Failure::Final(ClientError::Unavailable { .. }))
                            if Instant::now() < deadline =>
                        {
                            std::thread::sleep(RETRY_PAUSE);
                        }
                        other => break other,
                    }
                };
                match second {
                    Ok(v) => Ok(v),
                    Err(Failure::Final(ClientError::Unavailable { reason, .. })) => {
                        Err(ClientError::Broken {
                            path: self.path.clone(),
                            reason: format!(
                                "{first}; the retry found no helper within {} ms: {reason}",
                                self.opts.connect_timeout.as_millis()
                            ),
                        })
                    }
                    Err(Failure::Final(e)) => Err(e),
                    Err(Failure::Broken(reason)) => Err(ClientError::Broken {
                        path: self.path.clone(),
                        reason: format!("{reason} (and before the retry: {first})"),
                    }),
                }
            }
        }
    }

    fn attempt(&mut self, id: u64, line: &[u8], timeout: Duration) -> Result<Value, Failure> {
        let mut conn = match self.conn.take() {
            Some(c) if is_fresh(&c) => c,
            _ => self.open().map_err(Failure::Final)?,
        };
        let result = self.exchange(&mut conn, id, line, timeout);
        // A connection is kept only after a complete exchange.
        if matches!(result, Ok(_) | Err(Failure::Final(ClientError::Remote(_)))) {
            conn.last_used = Instant::now();
            self.conn = Some(conn);
        }
        result
    }

    fn exchange(
        &self,
        conn: &mut Conn,
        id: u64,
        line: &[u8],
        timeout: Duration,
    ) -> Result<Value, Failure> {
        let broken = |what: &str, e: io::Error| Failure::Broken(format!("{what}: {e}"));
        let mut deadline = Instant::now() + timeout;
        conn.stream
            .set_write_timeout(Some(timeout))
            .map_err(|e| broken("set the write timeout", e))?;
        // A helper that refused the connection (busy) answered and closed
        // before reading: the write then fails, but its answer is there to
        // be read. So a failed write is reported only if no answer follows.
        let mut write_error = None;
        if let Err(e) = conn.stream.write_all(line) {
            if is_timeout(&e) {
                return Err(Failure::Final(self.timeout(timeout)));
            }
            deadline = Instant::now() + Duration::from_millis(100);
            write_error = Some(e);
        }
        let broken_write = |write_error: Option<io::Error>, f: Failure| match write_error {
            Some(e) => broken("send the request", e),
            None => f,
        };
        let line = loop {
            if let Some(pos) = conn.buf.iter().position(|b| *b == b'\n') {
                break conn.buf.drain(..=pos).collect::<Vec<u8>>();
            }
            if conn.buf.len() > MAX_RESPONSE_BYTES {
                return Err(Failure::Final(self.protocol(format!(
                    "response longer than {} MiB",
                    MAX_RESPONSE_BYTES >> 20
                ))));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(broken_write(
                    write_error,
                    Failure::Final(self.timeout(timeout)),
                ));
            }
            conn.stream
                .set_read_timeout(Some(left))
                .map_err(|e| broken("set the read timeout", e))?;
            let mut chunk = [0u8; 16384];
            match conn.stream.read(&mut chunk) {
                Ok(0) => {
                    return Err(broken_write(
                        write_error,
                        Failure::Broken("the helper closed the connection before answering".into()),
                    ));
                }
                Ok(n) => conn.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) => {}
                Err(e) => return Err(broken_write(write_error, broken("read the answer", e))),
            }
        };
        let resp = Response::parse(&line).map_err(|r| Failure::Final(self.protocol(r)))?;
        match (resp.id, resp.ok) {
            (Some(got), _) if got != id => {
                return Err(Failure::Final(
                    self.protocol(format!("answer to request {got}, not {id}")),
                ));
            }
            // `id` null: refused before it was read (busy, too large).
            _ => {}
        }
        match (resp.result, resp.error) {
            (Some(v), None) if resp.ok => Ok(v),
            (_, Some(e)) => Err(Failure::Final(ClientError::Remote(RemoteError {
                code: e.code,
                message: e.message,
            }))),
            _ => Err(Failure::Final(
                self.protocol("neither result nor error".into()),
            )),
        }
    }

    fn timeout(&self, timeout: Duration) -> ClientError {
        ClientError::Timeout {
            path: self.path.clone(),
            timeout,
        }
    }

    fn protocol(&self, reason: String) -> ClientError {
        ClientError::Protocol {
            path: self.path.clone(),
            reason,
        }
    }

    /// A new connection, within the connect timeout.
    fn open(&self) -> Result<Conn, ClientError> {
        let unavailable = |reason: String| ClientError::Unavailable {
            path: self.path.clone(),
            reason,
        };
        let addr = UnixAddr::new(self.path.as_path())
            .map_err(|e| unavailable(format!("bad socket path: {}", e.desc())))?;
        let fd = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .map_err(|e| unavailable(format!("socket: {}", e.desc())))?;
        let deadline = Instant::now() + self.opts.connect_timeout;
        loop {
            match connect(fd.as_raw_fd(), &addr) {
                Ok(()) => break,
                Err(Errno::EINTR) => {}
                // The backlog is full (a unix socket does not connect in
                // the background): wait a little.
                Err(Errno::EAGAIN) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(Errno::EAGAIN) => {
                    return Err(unavailable(format!(
                        "not accepting connections (waited {} ms)",
                        self.opts.connect_timeout.as_millis()
                    )));
                }
                Err(Errno::ENOENT) => {
                    return Err(unavailable(
                        "no socket there (is the helper running?)".into(),
                    ));
                }
                Err(Errno::ECONNREFUSED) => {
                    return Err(unavailable(
                        "nobody listens on the socket (the helper is not running)".into(),
                    ));
                }
                Err(e) => return Err(unavailable(format!("connect: {}", e.desc()))),
            }
        }
        // Who serves the socket: root, this user (a private helper), or the
        // uid named in SELFHEAL_HELPER_UID. Anyone else could have put a
        // socket there to answer for the helper.
        let peer = getsockopt(&fd, sockopt::PeerCredentials)
            .map_err(|e| unavailable(format!("cannot tell who serves the socket: {}", e.desc())))?;
        let allowed = trusted_server_uids();
        if !allowed.contains(&peer.uid()) {
            return Err(ClientError::Untrusted {
                path: self.path.clone(),
                uid: peer.uid(),
                pid: peer.pid(),
                allowed,
            });
        }
        let stream = UnixStream::from(fd);
        stream
            .set_nonblocking(false)
            .map_err(|e| unavailable(format!("set the socket blocking: {e}")))?;
        Ok(Conn {
            stream,
            buf: Vec::new(),
            last_used: Instant::now(),
        })
    }
}

/// Whether a kept connection may be used again: recently used, and not
/// closed by the helper meanwhile (nothing to read, no end of stream).
fn is_fresh(c: &Conn) -> bool {
    if c.last_used.elapsed() > REUSE_IDLE || !c.buf.is_empty() {
        return false;
    }
    let mut byte = [0u8; 1];
    matches!(
        recv(
            c.stream.as_raw_fd(),
            &mut byte,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT
        ),
        Err(Errno::EAGAIN)
    )
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}
