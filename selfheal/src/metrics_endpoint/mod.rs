//! The HTTP endpoint `watch --metrics-addr` serves: `GET /metrics` (the
//! last complete check's exposition text, behind an optional bearer token)
//! and `GET /healthz` (a liveness answer that reads nothing).
//!
//! Hardened against the clients it cannot trust (any local user, any pod
//! that can route to it):
//!
//! - **Request heads are read by one thread, cheaply.** A connection costs
//!   a file descriptor, not a thread, until its whole head has arrived: one
//!   thread `poll`s every pending connection. A peer (an IP address) has at
//!   most [`MAX_PENDING_PER_PEER`] pending (an IPv6 /64 is one peer), all
//!   peers [`MAX_PENDING`]; past that the peer's oldest pending connection
//!   (the table full: the oldest of all) is dropped for the new one. A flood of idle or slowloris connections
//!   thus churns its own share while a scraper's head, sent at once, is
//!   read within one round of the loop.
//! - **A short request head.** The head must arrive complete within
//!   [`HEAD_DEADLINE`] and [`MAX_REQUEST`] bytes; the answer must be
//!   written within [`WRITE_DEADLINE`].
//! - **Answer slots per peer.** A complete request is answered on its own
//!   thread: at most [`MAX_CONNS`] at once, [`MAX_PER_PEER`] for one peer,
//!   and the last [`RESERVED`] only for a peer holding none, so a peer
//!   that reads its answers slowly holds [`MAX_PER_PEER`] threads, never
//!   the one a scraper at another address needs. A request over its
//!   peer's share is answered `503` without blocking and closed.
//! - **A bearer token** ([`TokenFile`], a file that only its owner and
//!   group may read, looked at again every [`TOKEN_RECHECK_EVERY`]). A scrape without it, or with another, gets `401`
//!   and a log line naming the peer, never the token; the lines are
//!   limited to one per [`UNAUTHORIZED_LOG_EVERY`] (with the count of the
//!   others), so a flood of bad scrapes cannot flood the log. Tokens are
//!   compared in constant time ([`ct_eq`]).
//!
//! `/healthz` takes no token: it says only that the endpoint answers.

use std::{
    collections::HashMap,
    io::{Read as _, Write as _},
    net::{IpAddr, TcpListener, TcpStream},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

mod token;

pub use token::{MAX_TOKEN_FILE, TOKEN_RECHECK_EVERY, Token, TokenError, TokenFile, ct_eq};

/// Connections whose request head is still arriving, all peers.
pub const MAX_PENDING: usize = 256;

/// Connections whose request head is still arriving, one peer address.
pub const MAX_PENDING_PER_PEER: usize = 128;

/// New connections accepted per round of the head loop (then every
/// pending connection is read again).
const ACCEPT_BATCH: usize = 16;

/// Requests answered at once.
pub const MAX_CONNS: usize = 64;

/// Requests answered at once for one peer address.
pub const MAX_PER_PEER: usize = 4;

/// Slots kept for peers that hold none: a peer already holding one gets
/// another only while more than this many are free.
pub const RESERVED: usize = 16;

/// How long the request head may take to arrive, from accept.
pub const HEAD_DEADLINE: Duration = Duration::from_secs(1);

/// How long the answer may take to be written.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(5);

/// The longest request head read.
pub const MAX_REQUEST: usize = 8192;

/// At most one log line about refused scrapes per this long.
pub const UNAUTHORIZED_LOG_EVERY: Duration = Duration::from_secs(10);

/// Who holds the slots.
#[derive(Default)]
struct Slots {
    total: usize,
    by_peer: HashMap<IpAddr, usize>,
}

impl Slots {
    /// Takes a slot for `peer` if its share allows.
    fn admit(&mut self, peer: IpAddr) -> bool {
        let held = self.by_peer.get(&peer).copied().unwrap_or(0);
        let free = MAX_CONNS.saturating_sub(self.total);
        let ok = if held == 0 {
            free > 0
        } else {
            held < MAX_PER_PEER && free > RESERVED
        };
        if ok {
            self.total += 1;
            *self.by_peer.entry(peer).or_default() += 1;
        }
        ok
    }

    fn release(&mut self, peer: IpAddr) {
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.by_peer.get_mut(&peer) {
            *n -= 1;
            if *n == 0 {
                self.by_peer.remove(&peer);
            }
        }
    }
}

/// Gives a slot back when its connection ends.
struct Held {
    slots: Arc<Mutex<Slots>>,
    peer: IpAddr,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Ok(mut s) = self.slots.lock() {
            s.release(self.peer);
        }
    }
}

/// The refused scrapes not yet logged.
struct Refusals {
    last_line: Option<Instant>,
    unlogged: u64,
}

/// What the connection threads share.
struct Shared {
    metrics: Arc<Mutex<String>>,
    token: Option<TokenFile>,
    refusals: Mutex<Refusals>,
}

/// The address peers are counted by: an IPv4 address (an IPv4-mapped IPv6
/// one as the IPv4 one), or an IPv6 address's /64 (one host's usual
/// allocation: a peer does not get a share per address it can pick).
fn peer_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
        v4 => v4,
    }
}

/// Serves `listener` from a background thread (the head loop) and one
/// thread per request being answered: `/metrics` answers the text in
/// `metrics` as it is when the request arrives, behind `token` when there
/// is one.
pub fn serve(
    listener: TcpListener,
    metrics: Arc<Mutex<String>>,
    token: Option<TokenFile>,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let shared = Arc::new(Shared {
        metrics,
        token,
        refusals: Mutex::new(Refusals {
            last_line: None,
            unlogged: 0,
        }),
    });
    let slots = Arc::new(Mutex::new(Slots::default()));
    std::thread::Builder::new()
        .name("selfheal-metrics".into())
        .spawn(move || head_loop(&listener, &shared, &slots))?;
    Ok(())
}

/// A connection whose request head is still arriving.
struct Pending {
    stream: TcpStream,
    peer: IpAddr,
    since: Instant,
    head: Vec<u8>,
}

/// Whether `head` holds a whole request head.
fn complete(head: &[u8]) -> bool {
    head.windows(4).any(|w| w == b"\r\n\r\n")
}

/// Accepts connections and reads their heads, forever: each complete head
/// goes to [`answer`] on its own thread (within the peer's slots).
fn head_loop(listener: &TcpListener, shared: &Arc<Shared>, slots: &Arc<Mutex<Slots>>) {
    use std::os::fd::AsRawFd as _;
    let mut pending: Vec<Pending> = Vec::new();
    let mut by_peer: HashMap<IpAddr, usize> = HashMap::new();
    let mut fds: Vec<libc::pollfd> = Vec::new();
    let mut chunk = [0u8; 2048];
    loop {
        // Drop what is past its head deadline; wake for the next one.
        let now = Instant::now();
        let mut i = 0;
        while i < pending.len() {
            if now.duration_since(pending[i].since) >= HEAD_DEADLINE {
                forget(&mut by_peer, pending.swap_remove(i).peer);
            } else {
                i += 1;
            }
        }
        let wake = pending
            .iter()
            .map(|p| (p.since + HEAD_DEADLINE).saturating_duration_since(now))
            .min()
            .unwrap_or(Duration::from_secs(1));
        fds.clear();
        fds.push(libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        fds.extend(pending.iter().map(|p| libc::pollfd {
            fd: p.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }));
        let timeout_ms = i32::try_from(wake.as_millis().max(1)).unwrap_or(1000);
        if let Err(e) = crate::sys::poll::poll(&mut fds, timeout_ms) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::debug!("metrics: poll: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
            continue;
        }
        // Read the pending connections that have something (before
        // accepting more: a head that arrived is served first).
        let ready: Vec<bool> = fds[1..].iter().map(|f| f.revents != 0).collect();
        let mut i = ready.len();
        while i > 0 {
            i -= 1;
            if !ready[i] {
                continue;
            }
            let done = match pending[i].stream.read(&mut chunk) {
                Ok(0) => Some(false),
                Ok(k) => {
                    let p = &mut pending[i];
                    p.head.extend_from_slice(&chunk[..k]);
                    if complete(&p.head) {
                        Some(true)
                    } else if p.head.len() >= MAX_REQUEST {
                        Some(false)
                    } else {
                        None
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                    ) =>
                {
                    None
                }
                Err(_) => Some(false),
            };
            if let Some(whole) = done {
                let p = pending.swap_remove(i);
                forget(&mut by_peer, p.peer);
                if whole {
                    dispatch(p, shared, slots);
                }
            }
        }
        if fds[0].revents != 0 {
            accept_some(listener, &mut pending, &mut by_peer);
        }
    }
}

/// One fewer pending connection for `peer`.
fn forget(by_peer: &mut HashMap<IpAddr, usize>, peer: IpAddr) {
    if let Some(n) = by_peer.get_mut(&peer) {
        *n -= 1;
        if *n == 0 {
            by_peer.remove(&peer);
        }
    }
}

/// Accepts up to [`ACCEPT_BATCH`] connections into `pending`, each in
/// place of its peer's oldest pending one when the peer (or the table) is
/// full.
fn accept_some(
    listener: &TcpListener,
    pending: &mut Vec<Pending>,
    by_peer: &mut HashMap<IpAddr, usize>,
) {
    for _ in 0..ACCEPT_BATCH {
        let (stream, addr) = match listener.accept() {
            Ok(a) => a,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // EMFILE and the like: make room, do not spin.
                tracing::debug!("metrics: accept: {e}");
                if let Some(oldest) = oldest_of(pending, None) {
                    forget(by_peer, pending.swap_remove(oldest).peer);
                }
                std::thread::sleep(Duration::from_millis(10));
                return;
            }
        };
        if stream.set_nonblocking(true).is_err() {
            continue;
        }
        let peer = peer_key(addr.ip());
        let held = by_peer.get(&peer).copied().unwrap_or(0);
        let evict = if held >= MAX_PENDING_PER_PEER {
            oldest_of(pending, Some(peer))
        } else if pending.len() >= MAX_PENDING {
            // Full with many peers: the oldest of all (a head that should
            // have come long ago), whoever's it is.
            oldest_of(pending, None)
        } else {
            None
        };
        if let Some(i) = evict {
            forget(by_peer, pending.swap_remove(i).peer);
        }
        if pending.len() >= MAX_PENDING {
            continue;
        }
        *by_peer.entry(peer).or_default() += 1;
        pending.push(Pending {
            stream,
            peer,
            since: Instant::now(),
            head: Vec::new(),
        });
    }
}

/// The index of the oldest pending connection (of `peer`, if given).
fn oldest_of(pending: &[Pending], peer: Option<IpAddr>) -> Option<usize> {
    pending
        .iter()
        .enumerate()
        .filter(|(_, p)| peer.is_none_or(|peer| p.peer == peer))
        .min_by_key(|(_, p)| p.since)
        .map(|(i, _)| i)
}

/// A complete request: answered on its own thread if its peer's slots
/// allow, else `503`.
fn dispatch(p: Pending, shared: &Arc<Shared>, slots: &Arc<Mutex<Slots>>) {
    let admitted = slots.lock().map(|mut s| s.admit(p.peer)).unwrap_or(false);
    if !admitted {
        refuse_busy(p.stream);
        return;
    }
    let held = Held {
        slots: Arc::clone(slots),
        peer: p.peer,
    };
    let shared = Arc::clone(shared);
    let spawned = std::thread::Builder::new()
        .name("selfheal-metrics-conn".into())
        .stack_size(256 * 1024)
        .spawn(move || answer(p.stream, p.peer, &p.head, &shared, held));
    if let Err(e) = spawned {
        tracing::warn!("metrics: cannot start a connection thread: {e}");
    }
}

/// A request over its peer's share: `503` if the socket takes it at
/// once, then closed. Never blocks.
fn refuse_busy(mut stream: TcpStream) {
    if stream.set_nonblocking(true).is_ok() {
        let _ = stream.write_all(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 5\r\nConnection: close\r\n\r\nbusy\n",
        );
    }
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
enum Asked {
    Metrics { authorization: Option<Vec<u8>> },
    Healthz,
    NotFound,
    BadMethod,
    Malformed,
}

/// Parses a complete request head.
fn parse(head: &[u8]) -> Asked {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return Asked::Malformed,
    }
    let path = req.path.unwrap_or("");
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    if !matches!(req.method, Some("GET") | Some("HEAD")) {
        return Asked::BadMethod;
    }
    match path {
        "/metrics" => Asked::Metrics {
            authorization: req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("authorization"))
                .map(|h| h.value.to_vec()),
        },
        "/healthz" => Asked::Healthz,
        _ => Asked::NotFound,
    }
}

/// Why a scrape was refused, for the log (never the token itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unauthorized {
    Missing,
    NotBearer,
    Wrong,
}

impl Unauthorized {
    fn as_str(self) -> &'static str {
        match self {
            Self::Missing => "no Authorization header",
            Self::NotBearer => "an Authorization header that is not a bearer token",
            Self::Wrong => "a wrong bearer token",
        }
    }
}

/// Whether `authorization` carries `token`.
fn authorize(token: &Token, authorization: Option<&[u8]>) -> Result<(), Unauthorized> {
    let value = authorization.ok_or(Unauthorized::Missing)?;
    let value = value.trim_ascii();
    let (scheme, rest) = match value.iter().position(|&b| b == b' ') {
        Some(i) => (&value[..i], &value[i + 1..]),
        None => (value, &b""[..]),
    };
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return Err(Unauthorized::NotBearer);
    }
    if token.matches(rest.trim_ascii()) {
        Ok(())
    } else {
        Err(Unauthorized::Wrong)
    }
}

/// Answers one complete request head, within [`WRITE_DEADLINE`], holding
/// its peer's slot (`held`) until the answer is written.
fn answer(mut stream: TcpStream, peer: IpAddr, buf: &[u8], shared: &Shared, held: Held) {
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    let head_only = buf.starts_with(b"HEAD ");
    let (status, extra, body) = match parse(buf) {
        Asked::Healthz => ("200 OK", "", "ok\n".to_string()),
        Asked::Metrics { authorization } => {
            let verdict = match shared.token.as_ref().map(TokenFile::current) {
                None => Ok(()),
                Some(Some(t)) => authorize(&t, authorization.as_deref()),
                // A poisoned lock: refuse rather than serve unguarded.
                Some(None) => Err(Unauthorized::Wrong),
            };
            match verdict {
                Ok(()) => (
                    "200 OK",
                    "",
                    shared.metrics.lock().map(|m| m.clone()).unwrap_or_default(),
                ),
                Err(why) => {
                    log_refusal(shared, peer, why);
                    (
                        "401 Unauthorized",
                        "WWW-Authenticate: Bearer realm=\"selfheal\"\r\n",
                        "a bearer token is required\n".to_string(),
                    )
                }
            }
        }
        Asked::NotFound => (
            "404 Not Found",
            "",
            "only /metrics and /healthz here\n".to_string(),
        ),
        Asked::BadMethod => (
            "405 Method Not Allowed",
            "Allow: GET, HEAD\r\n",
            "only GET\n".to_string(),
        ),
        Asked::Malformed => ("400 Bad Request", "", "bad request\n".to_string()),
    };
    if stream.set_write_timeout(Some(WRITE_DEADLINE)).is_err() {
        return;
    }
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    if !head_only {
        let _ = stream.write_all(body.as_bytes());
    }
    // The slot is free before the peer sees the connection end: a client
    // asking again once answered never finds its own answered requests
    // holding its share (`503`), however late this thread runs on.
    drop(held);
    drop(stream);
}

/// Logs a refused scrape, at most one line per [`UNAUTHORIZED_LOG_EVERY`].
fn log_refusal(shared: &Shared, peer: IpAddr, why: Unauthorized) {
    let Ok(mut r) = shared.refusals.lock() else {
        return;
    };
    let now = Instant::now();
    if r.last_line
        .is_some_and(|t| now.duration_since(t) < UNAUTHORIZED_LOG_EVERY)
    {
        r.unlogged += 1;
        return;
    }
    let others = std::mem::take(&mut r.unlogged);
    r.last_line = Some(now);
    drop(r);
    if others > 0 {
        tracing::warn!(
            "metrics: refused a scrape from {peer} ({}); {others} more refused since the last \
             such line",
            why.as_str()
        );
    } else {
        tracing::warn!("metrics: refused a scrape from {peer} ({})", why.as_str());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_peer_cannot_take_the_slots_kept_for_others() {
        let mut s = Slots::default();
        let flood: IpAddr = [10, 0, 0, 1].into();
        let admitted = (0..100).filter(|_| s.admit(flood)).count();
        assert_eq!(admitted, MAX_PER_PEER);
        // Many peers: each gets its first slot until the table is full;
        // second slots stop while only the reserve is left.
        let mut firsts = 0;
        for i in 0..200u8 {
            if s.admit([10, 1, 0, i].into()) {
                firsts += 1;
            }
        }
        assert_eq!(firsts, MAX_CONNS - MAX_PER_PEER);
        assert!(!s.admit([10, 2, 0, 1].into()));
        s.release(flood);
        assert!(
            s.admit([10, 2, 0, 1].into()),
            "a released slot is free again"
        );
        assert!(
            !s.admit([10, 2, 0, 1].into()),
            "a second slot is refused while only the reserve is free"
        );
        for _ in 0..MAX_PER_PEER {
            s.release(flood);
        }
        assert_eq!(s.by_peer.get(&flood), None);
    }

    #[test]
    fn peers_are_addresses_and_ipv6_slash_64s() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        for (a, key) in [
            ("10.0.0.1", "10.0.0.1"),
            ("::ffff:10.0.0.1", "10.0.0.1"),
            ("2001:db8:1:2:aaaa:bbbb:cccc:dddd", "2001:db8:1:2::"),
            ("2001:db8:1:2::1", "2001:db8:1:2::"),
            ("::1", "::"),
        ] {
            assert_eq!(peer_key(ip(a)), ip(key), "{a}");
        }
    }

    #[test]
    fn authorization_headers() {
        let t = Token(b"s3cr3t".to_vec());
        for (h, want) in [
            (None, Err(Unauthorized::Missing)),
            (Some(&b"Bearer s3cr3t"[..]), Ok(())),
            (Some(b"bearer s3cr3t "), Ok(())),
            (Some(b"Bearer wrong"), Err(Unauthorized::Wrong)),
            (Some(b"Bearer "), Err(Unauthorized::Wrong)),
            (Some(b"Basic czNjcjN0"), Err(Unauthorized::NotBearer)),
            (Some(b"s3cr3t"), Err(Unauthorized::NotBearer)),
        ] {
            assert_eq!(authorize(&t, h), want, "{h:?}");
        }
        assert_eq!(format!("{t:?}"), "Token(6 bytes)");
    }

    #[test]
    fn request_heads() {
        for (head, want) in [
            (
                &b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"[..],
                Asked::Metrics {
                    authorization: None,
                },
            ),
            (
                b"GET /metrics?x=1 HTTP/1.1\r\nauthorization: Bearer a\r\n\r\n",
                Asked::Metrics {
                    authorization: Some(b"Bearer a".to_vec()),
                },
            ),
            (b"GET /healthz HTTP/1.1\r\n\r\n", Asked::Healthz),
            (b"HEAD /healthz HTTP/1.0\r\n\r\n", Asked::Healthz),
            (b"GET / HTTP/1.1\r\n\r\n", Asked::NotFound),
            (b"POST /metrics HTTP/1.1\r\n\r\n", Asked::BadMethod),
            (b"\x1b[2J\r\n\r\n", Asked::Malformed),
        ] {
            assert_eq!(parse(head), want, "{:?}", String::from_utf8_lossy(head));
        }
    }
}
