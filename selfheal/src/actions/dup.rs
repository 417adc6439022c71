//! Sockets through `pidfd_getfd`: the duplicate of a target's socket an
//! action works on, checked by its `/proc` link (never `fstat`), the
//! [`SocketGate`] checked on it right before anything changes, and the
//! socket options read and written through it.

use super::ActionError;
use crate::sys::system::{FdLink, Handle as _, Kernel, System};

/// A duplicate of a target's socket fd, with the socket's inode.
pub(super) struct DupSocket<S: System> {
    pub(super) fd: S::Sock,
    pub(super) inode: u64,
}

/// The socket an action is about to change, as its duplicate shows it:
/// what a [`SocketGate`] decides on.
pub struct SocketSeen<'a, S: System = Kernel> {
    /// The duplicate (`pidfd_getfd`): the target's own socket.
    pub fd: &'a S::Sock,
    pub inode: u64,
    /// `SO_COOKIE`: the socket's identity, never reused while the system
    /// runs; `None` where the kernel does not say.
    pub cookie: Option<u64>,
}

/// Checked on the duplicate after `pidfd_getfd` and the inode comparison,
/// right before an action changes anything: its `Err` refuses it, with
/// nothing changed. The helper's authority re-checks the
/// target's credentials and the socket's state here.
pub type SocketGate<'g, S = Kernel> = &'g dyn Fn(&SocketSeen<'_, S>) -> Result<(), ActionError>;

/// The gate that lets everything through (a caller acting for itself).
pub fn open_gate<S: System>(_: &SocketSeen<'_, S>) -> Result<(), ActionError> {
    Ok(())
}

impl<S: System> DupSocket<S> {
    /// What a gate sees of the duplicate.
    pub(super) fn seen<'a>(&'a self, sys: &S) -> SocketSeen<'a, S> {
        SocketSeen {
            fd: &self.fd,
            inode: self.inode,
            cookie: sys.cookie(&self.fd),
        }
    }
}

/// Runs `gate` on a duplicate.
pub(super) fn pass<S: System>(
    sys: &S,
    gate: SocketGate<'_, S>,
    dup: &DupSocket<S>,
) -> Result<(), ActionError> {
    gate(&dup.seen(sys))
}

/// Duplicates `fd` of the target and checks that it is a socket (the inode
/// is the one `/proc/PID/fd/FD` names: `socket:[inode]`). The target's fd
/// is checked before it is duplicated, and the duplicate after (the target
/// may swap it meanwhile), both by their `/proc` links: no call on the
/// duplicate reaches a file's filesystem, and one that is not a socket is
/// closed aside ([`System::close_aside`]).
fn dup_socket<S: System>(
    sys: &S,
    target: &S::Process,
    fd: i32,
) -> Result<DupSocket<S>, ActionError> {
    let pid = target.pid();
    if fd < 0 {
        return Err(ActionError::NoSuchFd { pid, fd });
    }
    match sys.fd_link(pid, fd) {
        FdLink::Socket(_) => {}
        FdLink::Missing => return Err(ActionError::NoSuchFd { pid, fd }),
        FdLink::Other => return Err(ActionError::NotASocket { pid, fd }),
    }
    let dup = sys.get_fd(target, fd).map_err(|e| match e.raw_os_error() {
        Some(libc::EBADF) => ActionError::NoSuchFd { pid, fd },
        Some(libc::ESRCH) => ActionError::Gone { pid },
        _ => ActionError::io(format!("pidfd_getfd fd {fd} of pid {pid}"), e),
    })?;
    match sys.sock_inode(&dup) {
        Some(inode) => Ok(DupSocket { fd: dup, inode }),
        None => {
            sys.close_aside(dup);
            Err(ActionError::NotASocket { pid, fd })
        }
    }
}

/// [`dup_socket`], refusing anything but TCP over IPv4/IPv6, and, when
/// `expect` names the judged socket's inode, any other socket the fd holds
/// now: the check is made on the duplicate itself, after `pidfd_getfd`, so
/// what is acted on is what was compared.
pub(super) fn dup_tcp_socket<S: System>(
    sys: &S,
    target: &S::Process,
    fd: i32,
    expect: Option<u64>,
) -> Result<DupSocket<S>, ActionError> {
    let pid = target.pid();
    let dup = dup_socket(sys, target, fd)?;
    if let Some(expected) = expect.filter(|i| *i != dup.inode) {
        return Err(ActionError::Replaced {
            pid,
            fd,
            expected,
            found: dup.inode,
        });
    }
    let domain = sys.get_int(&dup.fd, libc::SOL_SOCKET, libc::SO_DOMAIN);
    let protocol = sys.get_int(&dup.fd, libc::SOL_SOCKET, libc::SO_PROTOCOL);
    match (domain, protocol) {
        (Ok(libc::AF_INET | libc::AF_INET6), Ok(libc::IPPROTO_TCP)) => Ok(dup),
        _ => Err(ActionError::NotTcp { pid, fd }),
    }
}
