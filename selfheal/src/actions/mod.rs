//! The privileged actions of the healing ladder, and nothing else: arming
//! TCP keepalive on an agent's socket, destroying a socket, signalling a
//! process (SIGTERM, then SIGKILL), running a restart command — plus the
//! [`guard`] every one of them passes first.
//!
//! Processes are addressed by [`Pidfd`] (opened when the decision was taken,
//! checked against the judged process's start time), so a pid reused between
//! decision and action is never hit. Sockets are reached through
//! `pidfd_getfd`: the agent's own socket, duplicated into this process, is
//! changed and the duplicate closed; the agent's fd table is never touched.
//!
//! A socket fd is duplicated only when `/proc/PID/fd/FD` names a socket,
//! and the duplicate is checked by its own `/proc` link, never `fstat`: a
//! file on a FUSE mount could block such calls forever. Each socket action
//! has a `_gated` form that checks a [`SocketGate`] on the duplicate, after
//! the inode comparison and right before anything changes: the helper's
//! authority re-checks the target and the socket's state there
//! ([`restore_keepalive_chosen`] lets it choose the options too). The
//! helper signals in two halves ([`signal_term`] now, [`signal_kill`] on
//! its timer); [`signal_escalate`] does both in one call for acting
//! directly.
//!
//! Every outcome is a plain `Serialize`/`Deserialize` value, fit for the
//! helper's JSON protocol and for audit lines. Deciding *whether* to act is
//! the ladder's job, not this module's.

use std::{
    io::Read,
    net::SocketAddr,
    os::fd::{AsFd, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6};
use serde::{Deserialize, Serialize};

pub use selfheal_core::keepalive::KeepaliveSettings;

use crate::{
    netns,
    pidfd::{Pidfd, PidfdError},
    sockdiag,
};

/// Why an action was not taken, or failed.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    /// The guard refused the target (pid 1, ourselves, an ancestor of ours,
    /// a kernel thread).
    #[error("refusing to act on pid {pid}: {why}")]
    Forbidden { pid: u32, why: String },
    #[error("pid {pid} is not running")]
    Gone { pid: u32 },
    #[error(
        "pid {pid} is no longer the process that was judged (started at tick {expected}, now {found})"
    )]
    Reused { pid: u32, expected: u64, found: u64 },
    #[error("pid {pid} has no fd {fd}")]
    NoSuchFd { pid: u32, fd: i32 },
    #[error("fd {fd} of pid {pid} is not a socket")]
    NotASocket { pid: u32, fd: i32 },
    #[error("fd {fd} of pid {pid} is not a TCP socket")]
    NotTcp { pid: u32, fd: i32 },
    /// The fd now holds another socket than the one judged (the agent
    /// closed it and the number was reused): nothing was done to it. The
    /// message names only the inode the caller gave: the one found is the
    /// target's, not the caller's to learn.
    #[error(
        "fd {fd} of pid {pid} no longer holds the judged socket (inode {expected}): left alone"
    )]
    Replaced {
        pid: u32,
        fd: i32,
        expected: u64,
        found: u64,
    },
    /// The socket is not in a state the action is for; nothing was done.
    #[error("fd {fd} of pid {pid}: {why}")]
    NotApplicable { pid: u32, fd: i32, why: String },
    /// The [`SocketGate`] refused the socket, or the target, right before
    /// the action: nothing was done.
    #[error("{why}")]
    Refused { why: String },
    #[error("invalid keepalive settings: {0}")]
    InvalidKeepalive(String),
    #[error("the restart command is empty")]
    EmptyCommand,
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    /// A system call failed; `action` names it with its pid and fd.
    #[error("{action}: {source}")]
    Io {
        action: String,
        source: std::io::Error,
    },
    /// sock_diag could not find or destroy the socket.
    #[error("sock_diag for fd {fd} of pid {pid}: {reason}")]
    Netlink { pid: u32, fd: i32, reason: String },
}

impl ActionError {
    fn io(action: String, source: std::io::Error) -> ActionError {
        ActionError::Io { action, source }
    }
}

impl From<PidfdError> for ActionError {
    fn from(e: PidfdError) -> ActionError {
        match e {
            PidfdError::Gone { pid } => ActionError::Gone { pid },
            PidfdError::Reused {
                pid,
                expected,
                found,
            } => ActionError::Reused {
                pid,
                expected,
                found,
            },
            PidfdError::Open { pid, source } => {
                ActionError::io(format!("pidfd_open {pid}"), source)
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The guard

/// `PF_KTHREAD` in `/proc/PID/stat`'s flags field (include/linux/sched.h).
const PF_KTHREAD: u32 = 0x0020_0000;

/// How far up our own parent chain [`guard`] looks (a chain is never this
/// long; the bound only makes the walk finite on any input).
const MAX_ANCESTORS: usize = 4096;

/// Refuses targets no action may touch: pid 0 and pids out of range, pid 1
/// (init: of the host, or of the pid namespace we run in — the host's as far
/// as we can see), this process, any ancestor of this process (a signal
/// there could take us down with it), and kernel threads (`PF_KTHREAD`).
/// A pid that does not exist is [`ActionError::Gone`].
pub fn guard(pid: u32) -> Result<(), ActionError> {
    guard_stat(pid).map(|_| ())
}

/// [`guard`], returning the target's stat for the identity check.
fn guard_stat(pid: u32) -> Result<procfs::process::Stat, ActionError> {
    let forbid = |why: &str| ActionError::Forbidden {
        pid,
        why: why.to_string(),
    };
    if pid == 0 || pid > i32::MAX as u32 {
        return Err(forbid("not a valid pid"));
    }
    if pid == 1 {
        return Err(forbid("it is init (pid 1)"));
    }
    let me = std::process::id();
    if pid == me {
        return Err(forbid("it is this process"));
    }
    let stat = procfs::process::Process::new(pid as i32)
        .and_then(|p| p.stat())
        .map_err(|_| ActionError::Gone { pid })?;
    if stat.flags & PF_KTHREAD != 0 {
        return Err(forbid("it is a kernel thread"));
    }
    if is_ancestor(pid, me) {
        return Err(forbid("it is an ancestor of this process"));
    }
    Ok(stat)
}

/// Whether `pid` is on the parent chain of `me`.
fn is_ancestor(pid: u32, me: u32) -> bool {
    let mut cur = me;
    for _ in 0..MAX_ANCESTORS {
        let Some(ppid) = procfs::process::Process::new(cur as i32)
            .and_then(|p| p.stat())
            .ok()
            .and_then(|s| u32::try_from(s.ppid).ok())
        else {
            return false;
        };
        if ppid == pid {
            return true;
        }
        if ppid <= 1 {
            return false;
        }
        cur = ppid;
    }
    false
}

/// The guard for an open handle: [`guard`] on its pid, then proof that the
/// pid still names the handle's process (same start time, not exited).
fn check_target(target: &Pidfd) -> Result<(), ActionError> {
    let pid = target.pid();
    let stat = guard_stat(pid)?;
    if stat.starttime != target.start_ticks() {
        return Err(ActionError::Reused {
            pid,
            expected: target.start_ticks(),
            found: stat.starttime,
        });
    }
    if !target.is_alive() {
        return Err(ActionError::Gone { pid });
    }
    Ok(())
}

/// Opens the handle every action takes: [`guard`] first, then a pidfd
/// checked against `expect_start` (the start time, in clock ticks after
/// boot, of the process that was judged). A pid that now names another
/// process is [`ActionError::Reused`]; one that names none, [`ActionError::Gone`].
pub fn open_target(pid: u32, expect_start: u64) -> Result<Pidfd, ActionError> {
    guard(pid)?;
    Ok(Pidfd::open(pid, Some(expect_start))?)
}

// ---------------------------------------------------------------------------
// Sockets through pidfd_getfd

/// A duplicate of a target's socket fd, with the socket's inode.
struct DupSocket {
    fd: OwnedFd,
    inode: u64,
}

/// The socket an action is about to change, as its duplicate shows it:
/// what a [`SocketGate`] decides on.
pub struct SocketSeen<'a> {
    /// The duplicate (`pidfd_getfd`): the target's own socket.
    pub fd: BorrowedFd<'a>,
    pub inode: u64,
    /// `SO_COOKIE`: the socket's identity, never reused while the system
    /// runs; `None` where the kernel does not say.
    pub cookie: Option<u64>,
}

/// Checked on the duplicate after `pidfd_getfd` and the inode comparison,
/// right before an action changes anything: `Err` refuses it
/// ([`ActionError::Refused`]). The helper's authority re-checks the
/// target's credentials and the socket's state here.
pub type SocketGate<'g> = &'g dyn Fn(&SocketSeen<'_>) -> Result<(), String>;

/// The gate that lets everything through (a caller acting for itself).
pub fn open_gate(_: &SocketSeen<'_>) -> Result<(), String> {
    Ok(())
}

/// `SO_COOKIE` of a socket.
pub fn socket_cookie(fd: BorrowedFd<'_>) -> Option<u64> {
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `cookie` and `len` are valid for writes of a u64's size.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    (r == 0 && len as usize == std::mem::size_of::<u64>()).then_some(cookie)
}

/// Runs `gate` on a duplicate.
fn pass(gate: SocketGate<'_>, dup: &DupSocket) -> Result<(), ActionError> {
    let seen = SocketSeen {
        fd: dup.fd.as_fd(),
        inode: dup.inode,
        cookie: socket_cookie(dup.fd.as_fd()),
    };
    gate(&seen).map_err(|why| ActionError::Refused { why })
}

/// Closes `fd` on a thread of its own: a file a caller chose may sit on a
/// FUSE mount whose server never answers the `flush` that `close` sends.
/// At most [`MAX_DEFERRED_CLOSES`] wait at once; beyond that an fd is
/// leaked (logged) rather than risk the caller's thread.
fn close_aside(fd: OwnedFd) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static WAITING: AtomicUsize = AtomicUsize::new(0);
    if WAITING.fetch_add(1, Ordering::SeqCst) >= MAX_DEFERRED_CLOSES {
        WAITING.fetch_sub(1, Ordering::SeqCst);
        tracing::warn!("{MAX_DEFERRED_CLOSES} closes already hang; leaking a duplicated fd");
        std::mem::forget(fd);
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("selfheal-close".into())
        .spawn(move || {
            drop(fd);
            WAITING.fetch_sub(1, Ordering::SeqCst);
        });
    if spawned.is_err() {
        WAITING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Most duplicated non-socket fds [`close_aside`] closes at once.
const MAX_DEFERRED_CLOSES: usize = 64;

/// Duplicates `fd` of the target and checks that it is a socket (the inode
/// is the one `/proc/PID/fd/FD` names: `socket:[inode]`). The target's fd
/// is checked before it is duplicated, and the duplicate after (the target
/// may swap it meanwhile), both by their `/proc` links: no call on the
/// duplicate reaches a file's filesystem, and one that is not a socket is
/// closed aside ([`close_aside`]).
fn dup_socket(target: &Pidfd, fd: i32) -> Result<DupSocket, ActionError> {
    let pid = target.pid();
    if fd < 0 {
        return Err(ActionError::NoSuchFd { pid, fd });
    }
    let theirs = std::path::PathBuf::from(format!("/proc/{pid}/fd/{fd}"));
    if crate::proc::socket_inode_of_link(&theirs).is_none() {
        return Err(match std::fs::symlink_metadata(&theirs) {
            Err(_) => ActionError::NoSuchFd { pid, fd },
            Ok(_) => ActionError::NotASocket { pid, fd },
        });
    }
    let dup = target.get_fd(fd).map_err(|e| match e.raw_os_error() {
        Some(libc::EBADF) => ActionError::NoSuchFd { pid, fd },
        Some(libc::ESRCH) => ActionError::Gone { pid },
        _ => ActionError::io(format!("pidfd_getfd fd {fd} of pid {pid}"), e),
    })?;
    let ours = format!("/proc/self/fd/{}", dup.as_raw_fd());
    match crate::proc::socket_inode_of_link(std::path::Path::new(&ours)) {
        Some(inode) => Ok(DupSocket { fd: dup, inode }),
        None => {
            close_aside(dup);
            Err(ActionError::NotASocket { pid, fd })
        }
    }
}

/// [`dup_socket`], refusing anything but TCP over IPv4/IPv6, and, when
/// `expect` names the judged socket's inode, any other socket the fd holds
/// now: the check is made on the duplicate itself, after `pidfd_getfd`, so
/// what is acted on is what was compared.
fn dup_tcp_socket(target: &Pidfd, fd: i32, expect: Option<u64>) -> Result<DupSocket, ActionError> {
    let pid = target.pid();
    let dup = dup_socket(target, fd)?;
    if let Some(expected) = expect.filter(|i| *i != dup.inode) {
        return Err(ActionError::Replaced {
            pid,
            fd,
            expected,
            found: dup.inode,
        });
    }
    let domain = get_int(dup.fd.as_fd(), libc::SOL_SOCKET, libc::SO_DOMAIN);
    let protocol = get_int(dup.fd.as_fd(), libc::SOL_SOCKET, libc::SO_PROTOCOL);
    match (domain, protocol) {
        (Ok(libc::AF_INET | libc::AF_INET6), Ok(libc::IPPROTO_TCP)) => Ok(dup),
        _ => Err(ActionError::NotTcp { pid, fd }),
    }
}

fn get_int(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int) -> std::io::Result<i32> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are valid for writes of an int's size.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r != 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(value)
    }
}

fn set_int(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> std::io::Result<()> {
    // SAFETY: `value` is valid for reads of an int's size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Keepalive

/// What [`arm_keepalive`] asks of a socket: the keepalive rung.
///
/// The rung only ever touches a connection the judge has already called
/// *dead* (`control_silent`: silent past 3 × the heartbeat the upstream
/// promises; `peer_unresponsive`; `peer_closed`) with nothing in flight (a
/// socket with unacknowledged data goes straight to `destroy_socket`). The
/// silence is the proof; the probes are the last chance for a live peer to
/// say so. The defaults (idle 1 s, interval 1 s, count 4, user timeout
/// 5 s) end such a connection about 5 s after arming, well inside a 30 s
/// timer's beat (issue 16; before, a 60 s floor left a connection silent
/// for 15 s another 45 s to live, and the heal waited for the next run's
/// `destroy_socket`):
///
/// - `idle` 1 s: the connection has been silent far longer, so probing
///   starts at once (the kernel counts idleness from the last segment
///   received, not from arming).
/// - `interval` 1 s, `count` 4: five probes, at 0, 1, 2, 3 and 4 s. A live
///   peer's kernel answers a probe with an ACK whatever its application
///   does, and *any* segment from it — the ACK of any probe, data — resets
///   the count and the clock. So a live link is cut only if not one ACK of
///   five probes comes back within 5 s of the first: a round trip above 5 s,
///   or five losses in a row. A satellite link's round trip is ~0.6 s, a
///   congested mobile link's a few seconds; and this link has already
///   delivered nothing for 3 × its heartbeat.
/// - `user_timeout` 5 s, derived from the proof rather than fixed: once
///   set, the kernel ignores `count` and drops the connection at the first
///   unanswered probe once nothing was heard for `user_timeout`.
///   [`arm_keepalive`] sets it to the silence already observed plus
///   `idle + count × interval` ([`effective_user_timeout_ms`]), so the
///   probes above all get their time, and the 5 s is only the floor when
///   the silence cannot be read. What stays on a peer that answered: for
///   data in flight later, the kernel gives up after that much
///   unacknowledged retransmission — never less than the silence the judge
///   already calls dead for this connection, plus 5 s. Zero leaves
///   `TCP_USER_TIMEOUT` off (the kernel's retransmission limits apply).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Keepalive {
    /// `TCP_KEEPIDLE`: silence before the first probe (whole seconds,
    /// rounded up; 1 s to 32767 s).
    pub idle: Duration,
    /// `TCP_KEEPINTVL`: between probes (whole seconds, rounded up; 1 s to
    /// 32767 s).
    pub interval: Duration,
    /// `TCP_KEEPCNT`: unanswered probes before the connection is dropped
    /// (1 to 127).
    pub count: u32,
    /// `TCP_USER_TIMEOUT` (milliseconds; see above for how it is raised).
    pub user_timeout: Duration,
}

impl Default for Keepalive {
    fn default() -> Keepalive {
        Keepalive {
            idle: Duration::from_secs(1),
            interval: Duration::from_secs(1),
            count: 4,
            user_timeout: Duration::from_secs(5),
        }
    }
}

/// The kernel's limits (include/net/tcp.h).
const MAX_TCP_KEEPIDLE: u32 = 32767;
const MAX_TCP_KEEPINTVL: u32 = 32767;
const MAX_TCP_KEEPCNT: u32 = 127;

impl Keepalive {
    /// The settings in the kernel's units, or why they cannot be set.
    pub fn to_settings(&self) -> Result<KeepaliveSettings, ActionError> {
        let secs = |what: &str, d: Duration, max: u32| {
            let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
            if s == 0 || s > u64::from(max) {
                Err(ActionError::InvalidKeepalive(format!(
                    "{what} must be 1 s to {max} s, not {d:?}"
                )))
            } else {
                Ok(s as u32)
            }
        };
        let idle_s = secs("idle", self.idle, MAX_TCP_KEEPIDLE)?;
        let interval_s = secs("interval", self.interval, MAX_TCP_KEEPINTVL)?;
        if self.count == 0 || self.count > MAX_TCP_KEEPCNT {
            return Err(ActionError::InvalidKeepalive(format!(
                "count must be 1 to {MAX_TCP_KEEPCNT}, not {}",
                self.count
            )));
        }
        let user_timeout_ms = u32::try_from(self.user_timeout.as_millis())
            .ok()
            .filter(|ms| *ms <= i32::MAX as u32)
            .ok_or_else(|| {
                ActionError::InvalidKeepalive(format!(
                    "user timeout {:?} is too long",
                    self.user_timeout
                ))
            })?;
        Ok(KeepaliveSettings {
            enabled: true,
            idle_s,
            interval_s,
            count: self.count,
            user_timeout_ms,
        })
    }
}

/// The user timeout [`arm_keepalive`] sets, derived from the proof: the
/// silence already observed plus `idle + count × interval`, so that a
/// connection silent for `silent_ms` still gets its probes and their time
/// (and is ended right after), and never below the asked one (the floor
/// when the silence is unknown). Zero stays zero (off).
pub fn effective_user_timeout_ms(wanted: &KeepaliveSettings, silent_ms: Option<u32>) -> u32 {
    if wanted.user_timeout_ms == 0 {
        return 0;
    }
    let needed = u64::from(silent_ms.unwrap_or(0))
        + 1000 * u64::from(wanted.idle_s)
        + 1000 * u64::from(wanted.count) * u64::from(wanted.interval_s);
    u64::from(wanted.user_timeout_ms)
        .max(needed)
        .min(i32::MAX as u64) as u32
}

/// What [`arm_keepalive`] did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeepaliveOutcome {
    pub pid: u32,
    pub fd: i32,
    /// The socket's inode (`socket:[inode]`).
    pub inode: u64,
    /// The options before: hand them to [`restore_keepalive`] once the peer
    /// proves alive.
    pub previous: KeepaliveSettings,
    /// The options set (the user timeout as raised, see [`Keepalive`]).
    pub applied: KeepaliveSettings,
    /// How long the socket had heard nothing from its peer when armed
    /// (`tcp_info`), if the kernel said.
    pub silent_ms: Option<u32>,
}

fn read_settings(dup: BorrowedFd<'_>, what: &str) -> Result<KeepaliveSettings, ActionError> {
    use nix::sys::socket::{getsockopt, sockopt::KeepAlive};
    let enabled = getsockopt(&dup, KeepAlive).map_err(|e| {
        ActionError::io(
            format!("getsockopt SO_KEEPALIVE on {what}"),
            std::io::Error::from(e),
        )
    })?;
    let get = |name: libc::c_int, label: &str| {
        get_int(dup, libc::IPPROTO_TCP, name)
            .map(|v| v.max(0) as u32)
            .map_err(|e| ActionError::io(format!("getsockopt {label} on {what}"), e))
    };
    Ok(KeepaliveSettings {
        enabled,
        idle_s: get(libc::TCP_KEEPIDLE, "TCP_KEEPIDLE")?,
        interval_s: get(libc::TCP_KEEPINTVL, "TCP_KEEPINTVL")?,
        count: get(libc::TCP_KEEPCNT, "TCP_KEEPCNT")?,
        user_timeout_ms: get(libc::TCP_USER_TIMEOUT, "TCP_USER_TIMEOUT")?,
    })
}

/// Sets `s` on the socket. Order matters: the timing options first, then
/// `SO_KEEPALIVE`, and `TCP_KEEPIDLE` last — setting it on a socket with
/// keepalive on re-arms the timer from the connection's real idle time, with
/// every other option already in place.
fn write_settings(
    dup: BorrowedFd<'_>,
    s: &KeepaliveSettings,
    what: &str,
) -> Result<(), ActionError> {
    use nix::sys::socket::{setsockopt, sockopt::KeepAlive};
    let set = |name: libc::c_int, label: &str, v: u32| {
        set_int(
            dup,
            libc::IPPROTO_TCP,
            name,
            i32::try_from(v).unwrap_or(i32::MAX),
        )
        .map_err(|e| ActionError::io(format!("setsockopt {label}={v} on {what}"), e))
    };
    set(
        libc::TCP_USER_TIMEOUT,
        "TCP_USER_TIMEOUT",
        s.user_timeout_ms,
    )?;
    set(libc::TCP_KEEPINTVL, "TCP_KEEPINTVL", s.interval_s)?;
    set(libc::TCP_KEEPCNT, "TCP_KEEPCNT", s.count)?;
    setsockopt(&dup, KeepAlive, &s.enabled).map_err(|e| {
        ActionError::io(
            format!("setsockopt SO_KEEPALIVE={} on {what}", s.enabled),
            std::io::Error::from(e),
        )
    })?;
    set(libc::TCP_KEEPIDLE, "TCP_KEEPIDLE", s.idle_s)?;
    Ok(())
}

/// The socket's `tcp_info`, when the kernel filled in at least the fields
/// up to `tcpi_last_ack_recv` (every kernel with `pidfd_getfd` fills far more).
fn tcp_info(dup: BorrowedFd<'_>) -> Option<libc::tcp_info> {
    // SAFETY: tcp_info is plain old data; all zeroes is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` and `len` are valid for writes of `len` bytes; the
    // kernel writes at most that much.
    let r = unsafe {
        libc::getsockopt(
            dup.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    let needed = std::mem::offset_of!(libc::tcp_info, tcpi_last_ack_recv) + 4;
    (r == 0 && len as usize >= needed).then_some(info)
}

/// How long the socket has heard nothing from its peer, as the keepalive
/// timer counts it (the later of the last data and the last ACK received).
fn silent_ms(dup: BorrowedFd<'_>) -> Option<u32> {
    tcp_info(dup).as_ref().map(silence)
}

/// [`silent_ms`] of a `tcp_info` already read.
fn silence(i: &libc::tcp_info) -> u32 {
    i.tcpi_last_data_recv.min(i.tcpi_last_ack_recv)
}

/// Arms TCP keepalive on socket `fd` of the target: duplicates it with
/// `pidfd_getfd`, reads its current options (returned as `previous`), sets
/// `ka` (see [`Keepalive`] for the user timeout), closes the duplicate. A
/// live peer answers the probes and nothing changes for the agent; a dead
/// one does not, and the kernel fails the agent's blocked read
/// (`ETIMEDOUT`) so its own reconnect logic runs. If setting fails midway,
/// the previous options are put back (best effort) and the error returned.
pub fn arm_keepalive(
    target: &Pidfd,
    fd: i32,
    inode: Option<u64>,
    ka: &Keepalive,
) -> Result<KeepaliveOutcome, ActionError> {
    arm_keepalive_gated(target, fd, inode, ka, &open_gate)
}

/// [`arm_keepalive`], with `gate` checked on the duplicate first.
pub fn arm_keepalive_gated(
    target: &Pidfd,
    fd: i32,
    inode: Option<u64>,
    ka: &Keepalive,
    gate: SocketGate<'_>,
) -> Result<KeepaliveOutcome, ActionError> {
    check_target(target)?;
    let mut wanted = ka.to_settings()?;
    let pid = target.pid();
    let dup = dup_tcp_socket(target, fd, inode)?;
    pass(gate, &dup)?;
    let what = format!("fd {fd} of pid {pid}");
    let previous = read_settings(dup.fd.as_fd(), &what)?;
    let silent = silent_ms(dup.fd.as_fd());
    wanted.user_timeout_ms = effective_user_timeout_ms(&wanted, silent);
    apply(pid, fd, &dup, previous, wanted, silent, &what)
}

/// Sets `applied` on the duplicate, putting `previous` back (best effort)
/// if that fails midway: what [`arm_keepalive`] and
/// [`arm_proof_keepalive`] share once they know what to set.
fn apply(
    pid: u32,
    fd: i32,
    dup: &DupSocket,
    previous: KeepaliveSettings,
    applied: KeepaliveSettings,
    silent_ms: Option<u32>,
    what: &str,
) -> Result<KeepaliveOutcome, ActionError> {
    if let Err(e) = write_settings(dup.fd.as_fd(), &applied, what) {
        let _ = write_settings(dup.fd.as_fd(), &previous, what);
        return Err(e);
    }
    Ok(KeepaliveOutcome {
        pid,
        fd,
        inode: dup.inode,
        previous,
        applied,
        silent_ms,
    })
}

/// Puts back keepalive options on socket `fd` of the target (the `previous`
/// of an [`arm_keepalive`] outcome) and returns them as read back. Options
/// that were the system defaults become explicit values equal to them.
pub fn restore_keepalive(
    target: &Pidfd,
    fd: i32,
    inode: Option<u64>,
    previous: &KeepaliveSettings,
) -> Result<KeepaliveSettings, ActionError> {
    restore_keepalive_chosen(target, fd, inode, &|_| Ok(previous.clone()))
}

/// [`restore_keepalive`] of the options `choose` picks for the socket seen
/// on the duplicate (the helper: those it recorded under the socket's
/// cookie when it armed the proof); an `Err` refuses
/// ([`ActionError::Refused`]) with nothing changed.
pub fn restore_keepalive_chosen(
    target: &Pidfd,
    fd: i32,
    inode: Option<u64>,
    choose: &dyn Fn(&SocketSeen<'_>) -> Result<KeepaliveSettings, String>,
) -> Result<KeepaliveSettings, ActionError> {
    check_target(target)?;
    let dup = dup_tcp_socket(target, fd, inode)?;
    let seen = SocketSeen {
        fd: dup.fd.as_fd(),
        inode: dup.inode,
        cookie: socket_cookie(dup.fd.as_fd()),
    };
    let previous = choose(&seen).map_err(|why| ActionError::Refused { why })?;
    let what = format!("fd {fd} of pid {}", target.pid());
    write_settings(dup.fd.as_fd(), &previous, &what)?;
    read_settings(dup.fd.as_fd(), &what)
}

/// The keepalive options of socket `fd` of the target, read through a
/// duplicate.
pub fn read_keepalive(target: &Pidfd, fd: i32) -> Result<KeepaliveSettings, ActionError> {
    check_target(target)?;
    let dup = dup_tcp_socket(target, fd, None)?;
    read_settings(dup.fd.as_fd(), &format!("fd {fd} of pid {}", target.pid()))
}

/// A *proof keepalive*: probes that ask a silent socket's peer whether it
/// is there, without ending anything while the question is open.
///
/// The kernel is told to give up only `hold` after the last probe the
/// judge counts (`TCP_USER_TIMEOUT` = silence so far + `idle` + `count` ×
/// `interval` + `hold`): the check that sees the probes unanswered writes
/// its snapshot first and then ends the connection itself
/// ([`expire_keepalive`]); the kernel's own deadline only matters if no
/// check comes back. A live peer answers the first probe, and the options
/// are put back ([`restore_keepalive`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProofKeepalive {
    /// `TCP_KEEPIDLE`, seconds (1 to 32767).
    pub idle_s: u32,
    /// `TCP_KEEPINTVL`, seconds (1 to 32767).
    pub interval_s: u32,
    /// Probes the judge waits for (1 to 127; also `TCP_KEEPCNT`).
    pub count: u32,
    /// How long past the judged probes the kernel waits before it gives up
    /// by itself, in milliseconds.
    pub hold_ms: u32,
}

/// `TCP_ESTABLISHED` and `TCP_CLOSE` (include/net/tcp_states.h), as
/// `tcpi_state` holds them.
const TCP_ESTABLISHED: u8 = 1;
const TCP_CLOSE: u8 = 7;

/// How long a proof keepalive holds a dead connection open for the next
/// check to see it ([`ProofKeepalive::hold_ms`]): two minutes covers a
/// timer running `check` every 30 s (and 60 s) with room to spare.
pub const PROOF_HOLD: Duration = Duration::from_secs(120);

impl ProofKeepalive {
    fn settings(&self, silent_ms: Option<u32>) -> Result<KeepaliveSettings, ActionError> {
        let bad = |m: String| Err(ActionError::InvalidKeepalive(m));
        if !(1..=MAX_TCP_KEEPIDLE).contains(&self.idle_s) {
            return bad(format!(
                "idle must be 1 to {MAX_TCP_KEEPIDLE} s, not {}",
                self.idle_s
            ));
        }
        if !(1..=MAX_TCP_KEEPINTVL).contains(&self.interval_s) {
            return bad(format!(
                "interval must be 1 to {MAX_TCP_KEEPINTVL} s, not {}",
                self.interval_s
            ));
        }
        if !(1..=MAX_TCP_KEEPCNT).contains(&self.count) {
            return bad(format!(
                "count must be 1 to {MAX_TCP_KEEPCNT}, not {}",
                self.count
            ));
        }
        let timeout = u64::from(silent_ms.unwrap_or(0))
            + 1000 * u64::from(self.idle_s)
            + 1000 * u64::from(self.count) * u64::from(self.interval_s)
            + u64::from(self.hold_ms);
        Ok(KeepaliveSettings {
            enabled: true,
            idle_s: self.idle_s,
            interval_s: self.interval_s,
            count: self.count,
            user_timeout_ms: timeout.min(i32::MAX as u64) as u32,
        })
    }
}

/// Arms a proof keepalive ([`ProofKeepalive`]) on socket `fd` of the
/// target, which must still be the judged socket `inode`. Its own options
/// are read first and returned as `previous` (a socket whose options cannot
/// be read is not touched). A socket with unacknowledged data is refused:
/// the kernel sends no keepalive probe while data is in flight, and its
/// retransmissions already prove the peer alive or dead.
pub fn arm_proof_keepalive(
    target: &Pidfd,
    fd: i32,
    inode: u64,
    proof: &ProofKeepalive,
) -> Result<KeepaliveOutcome, ActionError> {
    arm_proof_keepalive_gated(target, fd, inode, proof, &open_gate)
}

/// [`arm_proof_keepalive`], with `gate` checked on the duplicate first.
pub fn arm_proof_keepalive_gated(
    target: &Pidfd,
    fd: i32,
    inode: u64,
    proof: &ProofKeepalive,
    gate: SocketGate<'_>,
) -> Result<KeepaliveOutcome, ActionError> {
    check_target(target)?;
    let pid = target.pid();
    let dup = dup_tcp_socket(target, fd, Some(inode))?;
    pass(gate, &dup)?;
    let what = format!("fd {fd} of pid {pid}");
    let previous = read_settings(dup.fd.as_fd(), &what)?;
    let info = tcp_info(dup.fd.as_fd());
    if let Some(i) = &info {
        if i.tcpi_unacked > 0 {
            return Err(ActionError::NotApplicable {
                pid,
                fd,
                why: format!(
                    "{} segment(s) unacknowledged: the kernel probes no connection with data in flight (its retransmissions are the proof)",
                    i.tcpi_unacked
                ),
            });
        }
        if i.tcpi_state != TCP_ESTABLISHED {
            return Err(ActionError::NotApplicable {
                pid,
                fd,
                why: format!("not established (TCP state {})", i.tcpi_state),
            });
        }
    }
    let silent = info.as_ref().map(silence);
    let applied = proof.settings(silent)?;
    apply(pid, fd, &dup, previous, applied, silent, &what)
}

/// What [`expire_keepalive`] did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpireOutcome {
    pub pid: u32,
    pub fd: i32,
    pub inode: u64,
    /// Unanswered probes when it was ended.
    pub probes: u8,
    /// Whether the connection was seen closed within 200 ms (the kernel ends
    /// it from its timer, a moment after the call).
    pub ended: bool,
}

/// Ends a connection whose keepalive probes went unanswered, the way the
/// kernel ends one by itself: a keepalive timeout, so the agent's blocked
/// read fails with `ETIMEDOUT` and its own error path runs. It sets
/// `TCP_USER_TIMEOUT` to 1 ms and re-arms the keepalive timer
/// (`TCP_KEEPIDLE`): the timer fires at once, finds a probe unanswered past
/// the user timeout, and gives up. Refused (nothing changed) when keepalive
/// is off, or when no probe is outstanding: a peer that answered since the
/// judgement is alive.
pub fn expire_keepalive(target: &Pidfd, fd: i32, inode: u64) -> Result<ExpireOutcome, ActionError> {
    expire_keepalive_gated(target, fd, inode, &open_gate)
}

/// [`expire_keepalive`], with `gate` checked on the duplicate first.
pub fn expire_keepalive_gated(
    target: &Pidfd,
    fd: i32,
    inode: u64,
    gate: SocketGate<'_>,
) -> Result<ExpireOutcome, ActionError> {
    check_target(target)?;
    let pid = target.pid();
    let dup = dup_tcp_socket(target, fd, Some(inode))?;
    pass(gate, &dup)?;
    let what = format!("fd {fd} of pid {pid}");
    let now = read_settings(dup.fd.as_fd(), &what)?;
    let probes = tcp_info(dup.fd.as_fd()).map_or(0, |i| i.tcpi_probes);
    if !now.enabled || probes == 0 {
        return Err(ActionError::NotApplicable {
            pid,
            fd,
            why: if now.enabled {
                "no keepalive probe is outstanding: the peer answered since it was judged".into()
            } else {
                "keepalive is off on it".into()
            },
        });
    }
    // The user timeout as it was: put back if the connection is not seen
    // ended (the peer's ACK came in between), so that a live connection
    // never keeps a 1 ms user timeout.
    let put_back = || {
        let _ = set_int(
            dup.fd.as_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            i32::try_from(now.user_timeout_ms).unwrap_or(i32::MAX),
        );
    };
    set_int(dup.fd.as_fd(), libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, 1)
        .map_err(|e| ActionError::io(format!("setsockopt TCP_USER_TIMEOUT=1 on {what}"), e))?;
    if let Err(e) = set_int(
        dup.fd.as_fd(),
        libc::IPPROTO_TCP,
        libc::TCP_KEEPIDLE,
        i32::try_from(now.idle_s.max(1)).unwrap_or(1),
    ) {
        put_back();
        return Err(ActionError::io(
            format!("setsockopt TCP_KEEPIDLE on {what}"),
            e,
        ));
    }
    let deadline = Instant::now() + Duration::from_millis(200);
    let ended = loop {
        let closed = tcp_info(dup.fd.as_fd()).is_none_or(|i| i.tcpi_state == TCP_CLOSE);
        if closed || Instant::now() >= deadline {
            break closed;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    if !ended {
        put_back();
    }
    Ok(ExpireOutcome {
        pid,
        fd,
        inode: dup.inode,
        probes,
        ended,
    })
}

// ---------------------------------------------------------------------------
// Destroying a socket

/// How [`destroy_socket`] ended the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DestroyMethod {
    /// `SOCK_DESTROY` over sock_diag (as `ss -K`): the kernel aborts the
    /// socket; the agent's blocked read fails with `ECONNABORTED` and the
    /// peer gets a RST.
    SockDestroy,
    /// `shutdown(SHUT_RDWR)` through a duplicate: the agent's blocked read
    /// returns end-of-file (0 bytes) and the peer gets a FIN.
    Shutdown,
}

/// What [`destroy_socket`] did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DestroyOutcome {
    pub method: DestroyMethod,
    /// In words, with why `SOCK_DESTROY` was not used when it was not.
    pub detail: String,
    pub pid: u32,
    pub fd: i32,
    pub inode: u64,
    /// The connection's addresses, as sock_diag or the socket reported them.
    pub local: Option<SocketAddr>,
    pub remote: Option<SocketAddr>,
}

/// `SIOCGSKNS` (linux/sockios.h): a socket's network namespace as an fd.
const SIOCGSKNS: libc::c_ulong = 0x894C;

/// Ends the connection of socket `fd` of the target. First `SOCK_DESTROY`:
/// the socket is found by inode in a sock_diag dump of *its own* network
/// namespace (`SIOCGSKNS`; the target's `/proc/PID/ns/net` if that fails),
/// entered from a short-lived thread, and destroyed by its 4-tuple, interface
/// and cookie (the cookie makes sure it is this socket and no other). Where
/// the kernel refuses (`EOPNOTSUPP` without `CONFIG_INET_DIAG_DESTROY`,
/// `EPERM` without `CAP_NET_ADMIN` over that namespace, or any failure), it
/// falls back to [`shutdown_socket`]'s method. The outcome says which.
pub fn destroy_socket(
    target: &Pidfd,
    fd: i32,
    inode: Option<u64>,
) -> Result<DestroyOutcome, ActionError> {
    destroy_socket_gated(target, fd, inode, &open_gate)
}

/// [`destroy_socket`], with `gate` checked on the duplicate first.
pub fn destroy_socket_gated(
    target: &Pidfd,
    fd: i32,
    inode: Option<u64>,
    gate: SocketGate<'_>,
) -> Result<DestroyOutcome, ActionError> {
    check_target(target)?;
    let pid = target.pid();
    let dup = dup_tcp_socket(target, fd, inode)?;
    pass(gate, &dup)?;
    match sock_destroy(target, fd, &dup) {
        Ok((local, remote, cookie)) => Ok(DestroyOutcome {
            method: DestroyMethod::SockDestroy,
            detail: format!(
                "SOCK_DESTROY of inode {} (cookie {cookie:#x}) in the socket's network namespace",
                dup.inode
            ),
            pid,
            fd,
            inode: dup.inode,
            local: Some(local),
            remote: Some(remote),
        }),
        Err(refused) => shutdown_dup(pid, fd, &dup, Some(refused.to_string())),
    }
}

/// Ends the connection of socket `fd` of the target with `shutdown(SHUT_RDWR)`
/// on a `pidfd_getfd` duplicate, without trying `SOCK_DESTROY`: the agent's
/// blocked read returns end-of-file. [`destroy_socket`]'s fallback, callable
/// on its own.
pub fn shutdown_socket(
    target: &Pidfd,
    fd: i32,
    inode: Option<u64>,
) -> Result<DestroyOutcome, ActionError> {
    check_target(target)?;
    let dup = dup_tcp_socket(target, fd, inode)?;
    shutdown_dup(target.pid(), fd, &dup, None)
}

fn shutdown_dup(
    pid: u32,
    fd: i32,
    dup: &DupSocket,
    refused: Option<String>,
) -> Result<DestroyOutcome, ActionError> {
    // A second duplicate as a std TcpStream: its addresses and `shutdown`
    // are the socket's (dropping it closes only that duplicate).
    let stream = dup
        .fd
        .try_clone()
        .map(std::net::TcpStream::from)
        .map_err(|e| ActionError::io(format!("dup fd {fd} of pid {pid}"), e))?;
    let (local, remote) = (stream.local_addr().ok(), stream.peer_addr().ok());
    if let Err(e) = stream.shutdown(std::net::Shutdown::Both) {
        let action = match &refused {
            Some(why) => format!("shutdown fd {fd} of pid {pid} (SOCK_DESTROY failed: {why})"),
            None => format!("shutdown fd {fd} of pid {pid}"),
        };
        return Err(ActionError::io(action, e));
    }
    let detail = match refused {
        Some(why) => format!(
            "SOCK_DESTROY failed ({why}); shut down (SHUT_RDWR) through a duplicate of the fd"
        ),
        None => "shut down (SHUT_RDWR) through a duplicate of the fd".to_string(),
    };
    Ok(DestroyOutcome {
        method: DestroyMethod::Shutdown,
        detail,
        pid,
        fd,
        inode: dup.inode,
        local,
        remote,
    })
}

/// The network namespace the socket lives in, as an fd.
fn socket_netns(target: &Pidfd, dup: &DupSocket) -> Result<OwnedFd, String> {
    // SAFETY: an ioctl without argument; a non-negative result is a new fd
    // we own.
    let r = unsafe { libc::ioctl(dup.fd.as_raw_fd(), SIOCGSKNS as _) };
    if r >= 0 {
        // SAFETY: a fresh fd we own.
        return Ok(unsafe { OwnedFd::from_raw_fd(r) });
    }
    let pid = target.pid();
    netns::of_pid(pid)
        .map(OwnedFd::from)
        .map_err(|e| format!("cannot open the network namespace of pid {pid}: {e}"))
}

/// Runs the sock_diag lookup and `SOCK_DESTROY` in the socket's network
/// namespace. Returns the addresses and cookie of the destroyed socket.
fn sock_destroy(
    target: &Pidfd,
    fd: i32,
    dup: &DupSocket,
) -> Result<(SocketAddr, SocketAddr, u64), ActionError> {
    let pid = target.pid();
    let nl_err = |reason: String| ActionError::Netlink { pid, fd, reason };
    let families: &[u8] = match get_int(dup.fd.as_fd(), libc::SOL_SOCKET, libc::SO_DOMAIN) {
        Ok(libc::AF_INET) => &[AF_INET],
        Ok(libc::AF_INET6) => &[AF_INET6],
        _ => &[AF_INET, AF_INET6],
    };
    let ns = socket_netns(target, dup).map_err(nl_err)?;
    sockdiag::destroy_by_inode_in(&ns, families, dup.inode).map_err(|e| nl_err(e.to_string()))
}

// ---------------------------------------------------------------------------
// Signals

/// A signal [`signal_escalate`] sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Signal {
    #[serde(rename = "SIGTERM")]
    Term,
    #[serde(rename = "SIGKILL")]
    Kill,
}

/// What [`signal_escalate`] did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalOutcome {
    pub pid: u32,
    /// In order: `SIGTERM`, then `SIGKILL` if the grace ran out.
    pub sent: Vec<Signal>,
    /// Whether the process was seen to exit.
    pub exited: bool,
    /// When it exited, counted from the SIGTERM.
    pub exited_after_ms: Option<u64>,
    pub grace_ms: u64,
    /// Only SIGTERM was sent so far: the helper sends SIGKILL on its own
    /// timer after `grace_ms` if the process still lives then (and is
    /// still who it was). Absent (false) from a synchronous escalation.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub escalating: bool,
}

/// How long [`signal_escalate`] waits after SIGKILL (a process in
/// uninterruptible sleep dies only when it leaves it).
pub const KILL_WAIT: Duration = Duration::from_secs(3);

/// `from + d`, saturating at a year ahead (an absurd duration must not
/// panic).
fn deadline(from: Instant, d: Duration) -> Instant {
    from.checked_add(d)
        .or_else(|| from.checked_add(Duration::from_secs(365 * 86_400)))
        .unwrap_or(from)
}

/// Waits (bounded by `timeout`) for the target to exit; retries after
/// interrupted polls.
fn wait_exit(target: &Pidfd, timeout: Duration) -> bool {
    let end = deadline(Instant::now(), timeout);
    // Each wait either sees the exit or ends at the deadline; an early
    // return (EINTR) only costs one more round.
    for _ in 0..1000 {
        let left = end.saturating_duration_since(Instant::now());
        if target.wait_exit(left) {
            return true;
        }
        if left.is_zero() {
            return false;
        }
    }
    !target.is_alive()
}

/// Sends `sig` through the target's pidfd.
fn send_signal(target: &Pidfd, sig: libc::c_int, name: &str) -> Result<(), ActionError> {
    let pid = target.pid();
    target.send_signal(sig).map_err(|e| match e.raw_os_error() {
        Some(libc::ESRCH) => ActionError::Gone { pid },
        _ => ActionError::io(format!("pidfd_send_signal {name} to pid {pid}"), e),
    })
}

/// How long [`signal_term`] watches for a quick exit before it answers.
pub const TERM_WATCH: Duration = Duration::from_millis(200);

/// The first half of [`signal_escalate`], for the helper: SIGTERM through
/// the pidfd, then up to [`TERM_WATCH`] to see the process exit. It never
/// waits out the grace: the helper's timer sends SIGKILL (see
/// [`signal_kill`]). `grace` is only reported.
pub fn signal_term(target: &Pidfd, grace: Duration) -> Result<SignalOutcome, ActionError> {
    check_target(target)?;
    let start = Instant::now();
    send_signal(target, libc::SIGTERM, "SIGTERM")?;
    let exited = wait_exit(target, TERM_WATCH.min(grace));
    Ok(SignalOutcome {
        pid: target.pid(),
        sent: vec![Signal::Term],
        exited,
        exited_after_ms: exited.then(|| start.elapsed().as_millis() as u64),
        grace_ms: grace.as_millis() as u64,
        escalating: !exited,
    })
}

/// The second half, on the helper's timer: SIGKILL through the pidfd
/// (never to a recycled pid), without waiting. The caller has checked that
/// the process is still the one that got SIGTERM, and still allowed.
pub fn signal_kill(target: &Pidfd) -> Result<SignalOutcome, ActionError> {
    check_target(target)?;
    send_signal(target, libc::SIGKILL, "SIGKILL")?;
    Ok(SignalOutcome {
        pid: target.pid(),
        sent: vec![Signal::Kill],
        exited: false,
        exited_after_ms: None,
        grace_ms: 0,
        escalating: false,
    })
}

/// SIGTERM through the pidfd, up to `grace` for the process to exit, then
/// SIGKILL and up to [`KILL_WAIT`]. A target that is already gone is
/// [`ActionError::Gone`] and nothing is sent.
pub fn signal_escalate(target: &Pidfd, grace: Duration) -> Result<SignalOutcome, ActionError> {
    check_target(target)?;
    let send = |sig: libc::c_int, name: &str| send_signal(target, sig, name);
    let pid = target.pid();
    let start = Instant::now();
    send(libc::SIGTERM, "SIGTERM")?;
    let mut sent = vec![Signal::Term];
    let mut exited = wait_exit(target, grace);
    if !exited {
        match send(libc::SIGKILL, "SIGKILL") {
            Ok(()) => sent.push(Signal::Kill),
            // It exited between the wait and the kill.
            Err(ActionError::Gone { .. }) => {}
            Err(e) => return Err(e),
        }
        exited = wait_exit(target, KILL_WAIT);
    }
    Ok(SignalOutcome {
        pid,
        sent,
        exited,
        exited_after_ms: exited.then(|| start.elapsed().as_millis() as u64),
        grace_ms: grace.as_millis() as u64,
        escalating: false,
    })
}

// ---------------------------------------------------------------------------
// Restart

/// Bytes of each output stream kept by [`restart`]: the first and last
/// halves when there is more.
pub const OUTPUT_LIMIT: usize = 16 * 1024;

/// How long [`restart`] keeps reading output after the command exited (a
/// child it left running may hold the pipes open).
const OUTPUT_GRACE: Duration = Duration::from_millis(500);

/// What [`restart`] did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartOutcome {
    /// The exit code, if it exited normally.
    pub exit_code: Option<i32>,
    /// The signal that ended it, if one did (SIGKILL after a timeout).
    pub signal: Option<i32>,
    /// Exited with code 0, in time.
    pub success: bool,
    /// Killed (with its process group) at the timeout.
    pub timed_out: bool,
    pub duration_ms: u64,
    /// Output excerpts (lossy UTF-8; see [`OUTPUT_LIMIT`]).
    pub stdout: String,
    pub stderr: String,
    /// More was written than kept, or reading stopped before the stream
    /// ended.
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

/// An output excerpt: the first and last `limit / 2` bytes.
#[derive(Clone, Debug, Default)]
struct Excerpt {
    head: Vec<u8>,
    tail: Vec<u8>,
    total: u64,
    limit: usize,
}

impl Excerpt {
    fn new(limit: usize) -> Excerpt {
        Excerpt {
            limit,
            ..Excerpt::default()
        }
    }

    fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        let half = self.limit / 2;
        let room = half.saturating_sub(self.head.len());
        let take = room.min(data.len());
        self.head.extend_from_slice(&data[..take]);
        data = &data[take..];
        let keep = self.limit - half;
        self.tail.extend_from_slice(data);
        if self.tail.len() > 2 * keep.max(1) {
            let cut = self.tail.len() - keep;
            self.tail.drain(..cut);
        }
    }

    /// The text, with a marker where bytes were left out; whether any were.
    fn finish(mut self) -> (String, bool) {
        let keep = self.limit - self.limit / 2;
        if self.tail.len() > keep {
            let cut = self.tail.len() - keep;
            self.tail.drain(..cut);
        }
        let kept = (self.head.len() + self.tail.len()) as u64;
        let left_out = self.total - kept;
        let mut text = String::from_utf8_lossy(&self.head).into_owned();
        if left_out > 0 {
            text.push_str(&format!("\n[… {left_out} bytes left out …]\n"));
        }
        text.push_str(&String::from_utf8_lossy(&self.tail));
        (text, left_out > 0)
    }
}

/// An output stream being read on its own thread: the excerpt so far, and
/// a signal when the stream ended.
struct Capture {
    excerpt: std::sync::Arc<std::sync::Mutex<Excerpt>>,
    done: mpsc::Receiver<()>,
}

/// Reads `r` to its end into an excerpt, on its own thread (so one stream
/// filling up never blocks the other, nor the command).
fn capture(mut r: impl Read + Send + 'static) -> Capture {
    let excerpt = std::sync::Arc::new(std::sync::Mutex::new(Excerpt::new(OUTPUT_LIMIT)));
    let (tx, done) = mpsc::channel();
    let shared = std::sync::Arc::clone(&excerpt);
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        loop {
            match r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => match shared.lock() {
                    Ok(mut e) => e.push(&buf[..n]),
                    Err(p) => p.into_inner().push(&buf[..n]),
                },
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        let _ = tx.send(());
    });
    Capture { excerpt, done }
}

/// Runs the restart command `argv` (`argv[0]` found on `PATH` unless it has
/// a slash; the rest passed verbatim — never through a shell) in a new
/// process group, stdin from /dev/null, stdout and stderr captured
/// concurrently (a chatty command cannot block). At `timeout` the whole
/// process group is killed. A command that exits in time is not killed, and
/// nor are the children it leaves (a restarted service may be one).
pub fn restart(argv: &[String], timeout: Duration) -> Result<RestartOutcome, ActionError> {
    use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
    let (program, args) = argv.split_first().ok_or(ActionError::EmptyCommand)?;
    if program.is_empty() {
        return Err(ActionError::EmptyCommand);
    }
    let start = Instant::now();
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|source| ActionError::Spawn {
            program: program.clone(),
            source,
        })?;
    let pgid = child.id() as libc::pid_t;
    let out = child.stdout.take().map(capture);
    let err = child.stderr.take().map(capture);
    let kill_at = deadline(start, timeout);
    let mut step = Duration::from_millis(1);
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) => {}
            Err(e) => {
                // Cannot wait for it: do not leave it running.
                // SAFETY: a plain syscall on the group we created.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
                if wait_bounded(&mut child, KILL_WAIT).is_none() {
                    std::thread::spawn(move || {
                        let _ = child.wait();
                    });
                }
                return Err(ActionError::io(format!("wait for {program}"), e));
            }
        }
        let now = Instant::now();
        if now >= kill_at {
            timed_out = true;
            // SAFETY: a plain syscall on the group we created (pgid = the
            // child's pid, not yet reaped, so not reused).
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
            break wait_bounded(&mut child, KILL_WAIT);
        }
        std::thread::sleep(step.min(kill_at - now));
        step = (step * 2).min(Duration::from_millis(20));
    };
    let read_end = Instant::now() + OUTPUT_GRACE;
    let collect = |c: Option<Capture>| {
        c.map_or((String::new(), false), |c| {
            let ended = c
                .done
                .recv_timeout(read_end.saturating_duration_since(Instant::now()))
                .is_ok();
            let excerpt = c
                .excerpt
                .lock()
                .map(|e| e.clone())
                .unwrap_or_else(|p| p.into_inner().clone());
            let (mut text, truncated) = excerpt.finish();
            if !ended {
                if !text.is_empty() && !text.ends_with('\n') {
                    text.push('\n');
                }
                text.push_str("[… still open: not read to its end]\n");
            }
            (text, truncated || !ended)
        })
    };
    let (stdout, stdout_truncated) = collect(out);
    let (stderr, stderr_truncated) = collect(err);
    if status.is_none() {
        // Killed but not dead yet (uninterruptible sleep): reap it whenever
        // it dies, rather than leave a zombie.
        std::thread::spawn(move || {
            let _ = child.wait();
        });
    }
    let exit_code = status.and_then(|s| s.code());
    Ok(RestartOutcome {
        exit_code,
        signal: status.and_then(|s| s.signal()),
        success: !timed_out && exit_code == Some(0),
        timed_out,
        duration_ms: start.elapsed().as_millis() as u64,
        stdout,
        stderr,
        stdout_truncated,
        stderr_truncated,
    })
}

/// Reaps `child` within `timeout`; `None` if it has not died by then.
fn wait_bounded(
    child: &mut std::process::Child,
    timeout: Duration,
) -> Option<std::process::ExitStatus> {
    let end = deadline(Instant::now(), timeout);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(5)),
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_keepalive_is_valid_and_gentle() {
        let s = Keepalive::default().to_settings().unwrap();
        assert_eq!(
            s,
            KeepaliveSettings {
                enabled: true,
                idle_s: 1,
                interval_s: 1,
                count: 4,
                user_timeout_ms: 5_000,
            }
        );
    }

    #[test]
    fn keepalive_limits_are_checked() {
        let ka = |idle, interval, count, ut| Keepalive {
            idle: Duration::from_millis(idle),
            interval: Duration::from_millis(interval),
            count,
            user_timeout: Duration::from_millis(ut),
        };
        assert!(ka(0, 1000, 3, 0).to_settings().is_err());
        assert!(ka(1000, 0, 3, 0).to_settings().is_err());
        assert!(ka(1000, 1000, 0, 0).to_settings().is_err());
        assert!(ka(1000, 1000, 128, 0).to_settings().is_err());
        assert!(ka(32_768_000, 1000, 3, 0).to_settings().is_err());
        assert!(ka(1000, 1000, 3, 1 << 40).to_settings().is_err());
        // Sub-second values round up to the kernel's whole seconds.
        let s = ka(1500, 200, 3, 0).to_settings().unwrap();
        assert_eq!((s.idle_s, s.interval_s, s.user_timeout_ms), (2, 1, 0));
        let e = ka(0, 1000, 3, 0).to_settings().unwrap_err().to_string();
        assert!(e.starts_with("invalid keepalive settings: idle"), "{e}");
    }

    #[test]
    fn user_timeout_covers_the_silence_and_count_probes() {
        let s = Keepalive::default().to_settings().unwrap();
        // The incident of issue 16: a control stream silent for 15 s (3 ×
        // a 5 s heartbeat) is ended 5 s after arming, not 45 s.
        assert_eq!(effective_user_timeout_ms(&s, Some(15_000)), 20_000);
        // Silent for 3 s (3 × a 1 s heartbeat): the same 5 s after arming.
        assert_eq!(effective_user_timeout_ms(&s, Some(3_000)), 8_000);
        // Silent for 10 minutes: silence + 1 s + 4 × 1 s.
        assert_eq!(
            effective_user_timeout_ms(&s, Some(600_000)),
            600_000 + 1_000 + 4_000
        );
        // Unknown silence: the floor, idle + count × interval.
        assert_eq!(effective_user_timeout_ms(&s, None), 5_000);
        // A larger asked timeout is a floor the derived one never goes under.
        let long = KeepaliveSettings {
            user_timeout_ms: 60_000,
            ..s.clone()
        };
        assert_eq!(effective_user_timeout_ms(&long, Some(15_000)), 60_000);
        let off = KeepaliveSettings {
            user_timeout_ms: 0,
            ..s.clone()
        };
        assert_eq!(effective_user_timeout_ms(&off, Some(600_000)), 0);
        assert_eq!(
            effective_user_timeout_ms(&s, Some(u32::MAX)),
            i32::MAX as u32
        );
    }

    /// Whether a peer that answers its first probe only after `rtt_ms` keeps
    /// its connection under the rung's timing: the kernel's keepalive timer
    /// as in `tcp_keepalive_timer` (probe at arming, then every interval;
    /// dropped at the first tick with a probe out and `elapsed >= user
    /// timeout`), any ACK resetting the clock.
    fn survives(s: &KeepaliveSettings, silent_ms: u32, rtt_ms: u64) -> bool {
        let ut = u64::from(effective_user_timeout_ms(s, Some(silent_ms)));
        let mut t = 0u64; // since arming
        let mut probes_out = 0;
        loop {
            if t >= rtt_ms && probes_out > 0 {
                return true; // the first probe's ACK came back before a drop
            }
            if probes_out > 0 && u64::from(silent_ms) + t >= ut {
                return false;
            }
            probes_out += 1;
            t += 1000 * u64::from(s.interval_s);
        }
    }

    #[test]
    fn the_rung_ends_a_dead_stream_in_5_s_and_keeps_a_slow_live_one() {
        let s = Keepalive::default().to_settings().unwrap();
        // Dead (no answer ever): ended 5 s after arming whatever the silence.
        for silent in [3_000, 15_000, 600_000] {
            let ut = u64::from(effective_user_timeout_ms(&s, Some(silent)));
            assert_eq!(ut - u64::from(silent), 5_000);
        }
        // Slow but live: a satellite round trip, a congested mobile link,
        // up to just under 5 s: kept.
        for rtt in [600, 2_500, 4_900] {
            assert!(survives(&s, 15_000, rtt), "rtt {rtt} ms cut");
        }
        assert!(!survives(&s, 15_000, 60_000));
    }

    #[test]
    fn excerpt_keeps_head_and_tail() {
        let mut e = Excerpt::new(8);
        e.push(b"abc");
        assert_eq!(e.finish(), ("abc".to_string(), false));
        let mut e = Excerpt::new(8);
        e.push(b"abcdefgh");
        assert_eq!(e.finish(), ("abcdefgh".to_string(), false));
        let mut e = Excerpt::new(8);
        for chunk in [&b"0123"[..], b"456789", b"ABCDEFGHIJ", b"xyz"] {
            e.push(chunk);
        }
        let (text, truncated) = e.finish();
        assert!(truncated);
        assert_eq!(text, "0123\n[… 15 bytes left out …]\nJxyz");
    }

    #[test]
    fn guard_refuses_init_ourselves_and_our_parent() {
        for pid in [
            0,
            1,
            std::process::id(),
            std::os::unix::process::parent_id(),
        ] {
            let e = guard(pid).unwrap_err();
            assert!(matches!(e, ActionError::Forbidden { .. }), "{pid}: {e}");
            assert!(e.to_string().contains(&format!("pid {pid}")), "{e}");
        }
        assert!(matches!(
            guard(u32::MAX),
            Err(ActionError::Forbidden { .. })
        ));
    }

    #[test]
    fn guard_refuses_kernel_threads_and_allows_a_child() {
        // kthreadd (pid 2) where the pid namespace shows kernel threads.
        let kthread = (2..64u32).find(|pid| {
            procfs::process::Process::new(*pid as i32)
                .and_then(|p| p.stat())
                .is_ok_and(|s| s.flags & PF_KTHREAD != 0)
        });
        match kthread {
            Some(pid) => assert!(matches!(
                guard(pid),
                Err(ActionError::Forbidden { ref why, .. }) if why.contains("kernel thread")
            )),
            None => eprintln!("SKIPPED kernel thread case: none visible in this pid namespace"),
        }
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        let pid = child.id();
        assert!(guard(pid).is_ok());
        let _ = child.kill();
        let _ = child.wait();
        assert!(matches!(guard(pid), Err(ActionError::Gone { .. })));
    }

    #[test]
    fn restart_refuses_an_empty_or_missing_command() {
        assert!(matches!(
            restart(&[], Duration::from_secs(1)),
            Err(ActionError::EmptyCommand)
        ));
        let e = restart(
            &["/nonexistent/selfheal-restart".to_string()],
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(matches!(e, ActionError::Spawn { .. }), "{e}");
        assert!(e.to_string().starts_with("cannot run /nonexistent"), "{e}");
    }

    #[test]
    fn outcomes_round_trip_through_json() {
        let o = SignalOutcome {
            pid: 42,
            sent: vec![Signal::Term, Signal::Kill],
            exited: true,
            exited_after_ms: Some(1200),
            grace_ms: 1000,
            escalating: false,
        };
        let json = serde_json::to_string(&o).unwrap();
        assert!(!json.contains("escalating"), "{json}");
        assert!(json.contains(r#""sent":["SIGTERM","SIGKILL"]"#), "{json}");
        assert_eq!(serde_json::from_str::<SignalOutcome>(&json).unwrap(), o);
        let d = DestroyOutcome {
            method: DestroyMethod::SockDestroy,
            detail: String::new(),
            pid: 1,
            fd: 3,
            inode: 9,
            local: Some("127.0.0.1:1".parse().unwrap()),
            remote: None,
        };
        let json = serde_json::to_string(&d).unwrap();
        assert!(json.contains(r#""method":"sock_destroy""#), "{json}");
        assert_eq!(serde_json::from_str::<DestroyOutcome>(&json).unwrap(), d);
    }
}
