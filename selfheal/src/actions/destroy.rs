//! Ending a connection: `SOCK_DESTROY` over sock_diag in the socket's own
//! network namespace, or `shutdown(SHUT_RDWR)` through a duplicate where
//! the kernel refuses.

use std::net::SocketAddr;

use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6};
use serde::{Deserialize, Serialize};

use super::{
    ActionError,
    dup::{DupSocket, SocketGate, dup_tcp_socket, open_gate, pass},
    guard::check_target,
};
use crate::sys::{
    pidfd::Pidfd,
    system::{Handle as _, Kernel, ShutdownError, System},
};

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
    destroy_socket_gated(&Kernel, target, fd, inode, &open_gate)
}

/// [`destroy_socket`] on `sys`, with `gate` checked on the duplicate first.
pub fn destroy_socket_gated<S: System>(
    sys: &S,
    target: &S::Process,
    fd: i32,
    inode: Option<u64>,
    gate: SocketGate<'_, S>,
) -> Result<DestroyOutcome, ActionError> {
    check_target(sys, target)?;
    let pid = target.pid();
    let dup = dup_tcp_socket(sys, target, fd, inode)?;
    pass(sys, gate, &dup)?;
    match sock_destroy(sys, target, fd, &dup) {
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
        Err(refused) => shutdown_dup(sys, pid, fd, &dup, Some(refused.to_string())),
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
    shutdown_socket_on(&Kernel, target, fd, inode)
}

/// [`shutdown_socket`] on `sys`.
pub fn shutdown_socket_on<S: System>(
    sys: &S,
    target: &S::Process,
    fd: i32,
    inode: Option<u64>,
) -> Result<DestroyOutcome, ActionError> {
    check_target(sys, target)?;
    let dup = dup_tcp_socket(sys, target, fd, inode)?;
    shutdown_dup(sys, target.pid(), fd, &dup, None)
}

fn shutdown_dup<S: System>(
    sys: &S,
    pid: u32,
    fd: i32,
    dup: &DupSocket<S>,
    refused: Option<String>,
) -> Result<DestroyOutcome, ActionError> {
    let (local, remote) = match sys.shutdown(&dup.fd) {
        Ok(addrs) => addrs,
        Err(ShutdownError::Dup(e)) => {
            return Err(ActionError::io(format!("dup fd {fd} of pid {pid}"), e));
        }
        Err(ShutdownError::Shutdown(e)) => {
            let action = match &refused {
                Some(why) => format!("shutdown fd {fd} of pid {pid} (SOCK_DESTROY failed: {why})"),
                None => format!("shutdown fd {fd} of pid {pid}"),
            };
            return Err(ActionError::io(action, e));
        }
    };
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

/// The socket's network namespace could not be had: neither through the
/// socket (`SIOCGSKNS`) nor through its process.
#[derive(Debug, thiserror::Error)]
#[error("cannot open the network namespace of pid {pid}: {source}")]
struct NetnsUnopened {
    pid: u32,
    source: std::io::Error,
}

/// The network namespace the socket lives in.
fn socket_netns<S: System>(
    sys: &S,
    target: &S::Process,
    dup: &DupSocket<S>,
) -> Result<S::Netns, NetnsUnopened> {
    if let Ok(ns) = sys.socket_netns(&dup.fd) {
        return Ok(ns);
    }
    let pid = target.pid();
    sys.netns_of_pid(pid)
        .map_err(|source| NetnsUnopened { pid, source })
}

/// Runs the sock_diag lookup and `SOCK_DESTROY` in the socket's network
/// namespace. Returns the addresses and cookie of the destroyed socket.
fn sock_destroy<S: System>(
    sys: &S,
    target: &S::Process,
    fd: i32,
    dup: &DupSocket<S>,
) -> Result<(SocketAddr, SocketAddr, u64), ActionError> {
    let pid = target.pid();
    let nl_err = |reason: String| ActionError::Netlink { pid, fd, reason };
    let families: &[u8] = match sys.get_int(&dup.fd, libc::SOL_SOCKET, libc::SO_DOMAIN) {
        Ok(libc::AF_INET) => &[AF_INET],
        Ok(libc::AF_INET6) => &[AF_INET6],
        _ => &[AF_INET, AF_INET6],
    };
    let ns = socket_netns(sys, target, dup).map_err(|e| nl_err(e.to_string()))?;
    sys.destroy_by_inode_in(&ns, families, dup.inode)
        .map_err(|e| nl_err(e.to_string()))
}
