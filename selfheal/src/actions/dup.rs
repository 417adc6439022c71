//! Sockets through `pidfd_getfd`: the duplicate of a target's socket an
//! action works on, checked by its `/proc` link (never `fstat`), the
//! [`SocketGate`] checked on it right before anything changes, and the
//! socket options read and written through it.

use std::os::fd::{AsFd, AsRawFd as _, BorrowedFd, OwnedFd};

use super::ActionError;
use crate::sys::pidfd::Pidfd;

/// A duplicate of a target's socket fd, with the socket's inode.
pub(super) struct DupSocket {
    pub(super) fd: OwnedFd,
    pub(super) inode: u64,
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
/// right before an action changes anything: its `Err` refuses it, with
/// nothing changed. The helper's authority re-checks the
/// target's credentials and the socket's state here.
pub type SocketGate<'g> = &'g dyn Fn(&SocketSeen<'_>) -> Result<(), ActionError>;

/// The gate that lets everything through (a caller acting for itself).
pub fn open_gate(_: &SocketSeen<'_>) -> Result<(), ActionError> {
    Ok(())
}

/// Runs `gate` on a duplicate.
pub(super) fn pass(gate: SocketGate<'_>, dup: &DupSocket) -> Result<(), ActionError> {
    let seen = SocketSeen {
        fd: dup.fd.as_fd(),
        inode: dup.inode,
        cookie: crate::sys::socket::cookie(dup.fd.as_fd()),
    };
    gate(&seen)
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
    let theirs = crate::sys::procfs::ProcRoot::default().of_pid(pid, &format!("fd/{fd}"));
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
    let ours = crate::sys::procfs::ProcRoot::default().of_self(&format!("fd/{}", dup.as_raw_fd()));
    match crate::proc::socket_inode_of_link(&ours) {
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
pub(super) fn dup_tcp_socket(
    target: &Pidfd,
    fd: i32,
    expect: Option<u64>,
) -> Result<DupSocket, ActionError> {
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
    let domain = crate::sys::socket::get_int(dup.fd.as_fd(), libc::SOL_SOCKET, libc::SO_DOMAIN);
    let protocol = crate::sys::socket::get_int(dup.fd.as_fd(), libc::SOL_SOCKET, libc::SO_PROTOCOL);
    match (domain, protocol) {
        (Ok(libc::AF_INET | libc::AF_INET6), Ok(libc::IPPROTO_TCP)) => Ok(dup),
        _ => Err(ActionError::NotTcp { pid, fd }),
    }
}
