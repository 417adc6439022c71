//! The accept loop and one connection: admission against the connection
//! limits (in all, per owner, root's reserve), one thread per connection,
//! framing with size and time limits, and the dispatch of each request
//! (the connector verified, the owner's rate limit taken, then the verb's
//! room); on shutdown, the grace the connections in flight still get.

use std::{
    io::{self, Read as _, Write as _},
    os::{
        fd::{AsFd, BorrowedFd},
        unix::net::{UnixListener, UnixStream},
    },
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use selfheal_core::{
    access::owner::{Account, ConnLimits},
    protocol::{Caller, ErrorCode, MAX_REQUEST_BYTES, Op, Response, parse_request},
};

use super::{ServerError, Shared, StopReason, listen::BoundSocket, lock, refusal};
use crate::helper::access::{authz::Connector, owner::ConnSet};

pub(super) struct Conns {
    /// The open connections, by owner.
    pub(super) set: ConnSet,
    /// When a connection last opened or closed (the idle clock).
    pub(super) last_change: Instant,
}

pub(super) struct LoopLimits {
    pub(super) idle_timeout: Option<Duration>,
    pub(super) max_connections: usize,
    pub(super) max_per_uid: usize,
    pub(super) root_reserve: usize,
    pub(super) shutdown_grace: Duration,
}

/// Waits up to `timeout` for any of `fds` to be readable.
fn wait_readable(fds: &[BorrowedFd<'_>], timeout: Duration) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| crate::sys::poll::readable(*fd))
        .collect();
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    if let Err(e) = crate::sys::poll::poll(&mut pfds, ms) {
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![false; pfds.len()]);
        }
        return Err(e);
    }
    Ok(pfds.iter().map(|p| p.revents != 0).collect())
}

pub(super) fn accept_loop(
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
                // Idle, unless the performer holds what an exit would lose
                // (proofs armed, not yet put back): then it waits on.
                Some(left) if left.is_zero() && !shared.performer.holds_state() => {
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
pub(super) fn refuse(stream: &UnixStream, message: String) {
    let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
    let _ = (&*stream).write_all(&Response::error(None, ErrorCode::Busy, message).to_line());
}

/// Counts a connection out when its thread ends, however it ends.
pub(super) struct ConnGuard(Arc<Shared>, u64);

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

pub(super) fn connection(
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
    let c = crate::sys::socket::peer_credentials(stream.as_fd())?;
    Ok(Caller {
        uid: c.uid(),
        gid: c.gid(),
        pid: u32::try_from(c.pid()).unwrap_or(0),
    })
}

/// Answers one request line; `true` with it when the connection must
/// close (its connecting process is gone).
pub(super) fn handle(
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
        Op::Iterate { pids } => shared.iterate(&caller, same_ns, pids),
        Op::Collect(req) => shared.collect(&caller, same_ns, req),
        Op::Namespaces { pids } => shared.namespaces(&caller, same_ns, pids),
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
