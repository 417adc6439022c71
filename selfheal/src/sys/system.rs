//! What the acts ask of the kernel, as one trait: [`System`]. The acts
//! (`actions/`), the guard and the direct executor are generic over it;
//! [`Kernel`] is the real one (today's free functions of this module's
//! siblings, called as they always were), and a test's
//! `FakeKernel` (`sys/fake.rs`, built for tests only) holds processes,
//! sockets and their options as plain data and records every call, so the
//! races an act must survive (a pid reused, an fd replaced, a process gone
//! mid-act, a refused `SOCK_DESTROY`) are tested without root.
//!
//! Processes are held by [`System::Process`] (a pidfd for the kernel),
//! sockets by [`System::Sock`] (a `pidfd_getfd` duplicate), network
//! namespaces by [`System::Netns`].

use std::{
    net::SocketAddr,
    os::fd::{AsFd as _, AsRawFd as _, OwnedFd},
    time::{Duration, Instant},
};

use super::{
    pidfd::{Pidfd, PidfdError},
    sockdiag::SockDiagError,
};

/// A process handle: the process it was opened on and checked against.
pub trait Handle {
    fn pid(&self) -> u32;
    /// Start time of the process, in clock ticks after boot.
    fn start_ticks(&self) -> u64;
}

impl Handle for Pidfd {
    fn pid(&self) -> u32 {
        Pidfd::pid(self)
    }

    fn start_ticks(&self) -> u64 {
        Pidfd::start_ticks(self)
    }
}

/// The fields of a process's `/proc/PID/stat` the guard reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcStat {
    /// Field 22: start time in clock ticks after boot.
    pub start_ticks: u64,
    pub ppid: i32,
    /// Field 9: the kernel's `PF_*` flags.
    pub flags: u32,
}

/// What a process's fd link (`/proc/PID/fd/FD`) names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FdLink {
    /// `socket:[inode]`.
    Socket(u64),
    /// Something else (a file, a pipe).
    Other,
    /// No such fd (or no such process).
    Missing,
}

/// The fields of a socket's `tcp_info` the acts read, when the kernel
/// filled in at least those up to `tcpi_last_ack_recv`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpInfoSeen {
    /// `tcpi_state` (include/net/tcp_states.h).
    pub state: u8,
    /// Keepalive probes sent and unanswered.
    pub probes: u8,
    /// Segments sent and not yet acknowledged.
    pub unacked: u32,
    pub last_data_recv_ms: u32,
    pub last_ack_recv_ms: u32,
}

/// Why [`System::shutdown`] did not shut the socket down.
#[derive(Debug)]
pub enum ShutdownError {
    /// The socket could not be duplicated to be shut down.
    Dup(std::io::Error),
    /// `shutdown(SHUT_RDWR)` failed.
    Shutdown(std::io::Error),
}

/// Addresses of a connection, each when the socket said.
pub type Addrs = (Option<SocketAddr>, Option<SocketAddr>);

/// What the acts ask of the kernel.
pub trait System {
    /// A process handle pinned to one process ([`Pidfd`]).
    type Process: Handle;
    /// A socket duplicated into this process (`pidfd_getfd`).
    type Sock;
    /// An open network namespace.
    type Netns;

    /// This process's pid.
    fn own_pid(&self) -> u32;
    /// `/proc/PID/stat`'s fields, if `pid` runs.
    fn stat(&self, pid: u32) -> Option<ProcStat>;
    /// A handle on `pid`, refused when `expect_start` is given and the pid
    /// names a process started at another time ([`Pidfd::open`]).
    fn open(&self, pid: u32, expect_start: Option<u64>) -> Result<Self::Process, PidfdError>;
    /// Whether the process behind the handle still runs.
    fn is_alive(&self, p: &Self::Process) -> bool;
    /// Waits up to `timeout` for the process to exit; true if it did.
    fn wait_exit(&self, p: &Self::Process, timeout: Duration) -> bool;
    /// Sends `signal` through the handle (never to a recycled pid).
    fn send_signal(&self, p: &Self::Process, signal: libc::c_int) -> std::io::Result<()>;

    /// What fd `fd` of `pid` is, read from its link (no call reaches the
    /// file's own filesystem).
    fn fd_link(&self, pid: u32, fd: i32) -> FdLink;
    /// Duplicates fd `fd` of the process into this one (`pidfd_getfd`).
    fn get_fd(&self, p: &Self::Process, fd: i32) -> std::io::Result<Self::Sock>;
    /// The socket inode the duplicate's own link names; `None` when it is
    /// no socket.
    fn sock_inode(&self, s: &Self::Sock) -> Option<u64>;
    /// Closes a duplicate that is no socket without waiting on its
    /// filesystem.
    fn close_aside(&self, s: Self::Sock);
    fn get_int(
        &self,
        s: &Self::Sock,
        level: libc::c_int,
        name: libc::c_int,
    ) -> std::io::Result<i32>;
    fn set_int(
        &self,
        s: &Self::Sock,
        level: libc::c_int,
        name: libc::c_int,
        value: libc::c_int,
    ) -> std::io::Result<()>;
    /// `SO_COOKIE`.
    fn cookie(&self, s: &Self::Sock) -> Option<u64>;
    /// `tcp_info`, when the kernel filled in the fields read.
    fn tcp_info(&self, s: &Self::Sock) -> Option<TcpInfoSeen>;
    /// Reads the addresses and shuts the socket down (`SHUT_RDWR`).
    fn shutdown(&self, s: &Self::Sock) -> Result<Addrs, ShutdownError>;

    /// The network namespace the socket lives in (`SIOCGSKNS`).
    fn socket_netns(&self, s: &Self::Sock) -> std::io::Result<Self::Netns>;
    /// The network namespace of `pid` (`/proc/PID/ns/net`).
    fn netns_of_pid(&self, pid: u32) -> std::io::Result<Self::Netns>;
    /// `SOCK_DESTROY` of the TCP socket `inode` in `ns`: its local and
    /// remote addresses and its cookie.
    fn destroy_by_inode_in(
        &self,
        ns: &Self::Netns,
        families: &[u8],
        inode: u64,
    ) -> Result<(SocketAddr, SocketAddr, u64), SockDiagError>;

    /// The monotonic clock.
    fn now(&self) -> Instant;
    fn sleep(&self, d: Duration);
}

/// The kernel itself.
#[derive(Clone, Copy, Debug, Default)]
pub struct Kernel;

impl System for Kernel {
    type Process = Pidfd;
    type Sock = OwnedFd;
    type Netns = OwnedFd;

    fn own_pid(&self) -> u32 {
        std::process::id()
    }

    fn stat(&self, pid: u32) -> Option<ProcStat> {
        let s = super::procfs::ProcRoot::default().stat(pid).ok()?;
        Some(ProcStat {
            start_ticks: s.starttime,
            ppid: s.ppid,
            flags: s.flags,
        })
    }

    fn open(&self, pid: u32, expect_start: Option<u64>) -> Result<Pidfd, PidfdError> {
        Pidfd::open(pid, expect_start)
    }

    fn is_alive(&self, p: &Pidfd) -> bool {
        p.is_alive()
    }

    fn wait_exit(&self, p: &Pidfd, timeout: Duration) -> bool {
        p.wait_exit(timeout)
    }

    fn send_signal(&self, p: &Pidfd, signal: libc::c_int) -> std::io::Result<()> {
        p.send_signal(signal)
    }

    fn fd_link(&self, pid: u32, fd: i32) -> FdLink {
        let link = super::procfs::ProcRoot::default().of_pid(pid, &format!("fd/{fd}"));
        match super::procfs::socket_inode_of_link(&link) {
            Some(inode) => FdLink::Socket(inode),
            None if std::fs::symlink_metadata(&link).is_err() => FdLink::Missing,
            None => FdLink::Other,
        }
    }

    fn get_fd(&self, p: &Pidfd, fd: i32) -> std::io::Result<OwnedFd> {
        p.get_fd(fd)
    }

    fn sock_inode(&self, s: &OwnedFd) -> Option<u64> {
        let link = super::procfs::ProcRoot::default().of_self(&format!("fd/{}", s.as_raw_fd()));
        super::procfs::socket_inode_of_link(&link)
    }

    fn close_aside(&self, s: OwnedFd) {
        close_aside(s)
    }

    fn get_int(&self, s: &OwnedFd, level: libc::c_int, name: libc::c_int) -> std::io::Result<i32> {
        super::socket::get_int(s.as_fd(), level, name)
    }

    fn set_int(
        &self,
        s: &OwnedFd,
        level: libc::c_int,
        name: libc::c_int,
        value: libc::c_int,
    ) -> std::io::Result<()> {
        super::socket::set_int(s.as_fd(), level, name, value)
    }

    fn cookie(&self, s: &OwnedFd) -> Option<u64> {
        super::socket::cookie(s.as_fd())
    }

    fn tcp_info(&self, s: &OwnedFd) -> Option<TcpInfoSeen> {
        let (i, len) = super::socket::tcp_info(s.as_fd())?;
        let needed = std::mem::offset_of!(libc::tcp_info, tcpi_last_ack_recv) + 4;
        (len >= needed).then_some(TcpInfoSeen {
            state: i.tcpi_state,
            probes: i.tcpi_probes,
            unacked: i.tcpi_unacked,
            last_data_recv_ms: i.tcpi_last_data_recv,
            last_ack_recv_ms: i.tcpi_last_ack_recv,
        })
    }

    fn shutdown(&self, s: &OwnedFd) -> Result<Addrs, ShutdownError> {
        // A second duplicate as a std TcpStream: its addresses and
        // `shutdown` are the socket's (dropping it closes only that
        // duplicate).
        let stream = s
            .try_clone()
            .map(std::net::TcpStream::from)
            .map_err(ShutdownError::Dup)?;
        let addrs = (stream.local_addr().ok(), stream.peer_addr().ok());
        stream
            .shutdown(std::net::Shutdown::Both)
            .map_err(ShutdownError::Shutdown)?;
        Ok(addrs)
    }

    fn socket_netns(&self, s: &OwnedFd) -> std::io::Result<OwnedFd> {
        super::socket::netns_of(s.as_fd())
    }

    fn netns_of_pid(&self, pid: u32) -> std::io::Result<OwnedFd> {
        super::netns::of_pid(pid).map(OwnedFd::from)
    }

    fn destroy_by_inode_in(
        &self,
        ns: &OwnedFd,
        families: &[u8],
        inode: u64,
    ) -> Result<(SocketAddr, SocketAddr, u64), SockDiagError> {
        super::sockdiag::destroy_by_inode_in(ns, families, inode)
    }

    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep(&self, d: Duration) {
        std::thread::sleep(d)
    }
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
