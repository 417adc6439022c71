//! Socket options read and set on a socket fd (often a duplicate of
//! another process's socket): ints, `SO_COOKIE`, `tcp_info`, a receive
//! timeout, the socket's network namespace.

use std::{
    io,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
};

/// `ioctl` giving a socket's network namespace as a new fd (linux/sockios.h).
const SIOCGSKNS: libc::c_ulong = 0x894C;

/// `getsockopt` into `value`: how many bytes of it the kernel filled in.
///
/// # Safety
///
/// Every byte pattern must be a valid `T` (an int, a `u64`, `tcp_info`).
unsafe fn getsockopt<T>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: &mut T,
) -> io::Result<usize> {
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `value` and `len` are valid for writes of `len` bytes; the
    // kernel writes at most that much, and any bytes are a valid `T`
    // (the caller's promise).
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *mut T).cast(),
            &mut len,
        )
    };
    super::check(r)?;
    Ok(len as usize)
}

/// `setsockopt` to `value`.
fn setsockopt<T>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    // SAFETY: `value` is valid for reads of its size; the kernel only
    // reads it.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    super::check(r)
}

/// An int socket option.
pub fn get_int(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int) -> io::Result<i32> {
    let mut value: libc::c_int = 0;
    // SAFETY: any bytes are a valid int.
    unsafe { getsockopt(fd, level, name, &mut value) }?;
    Ok(value)
}

/// Sets an int socket option.
pub fn set_int(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    setsockopt(fd, level, name, &value)
}

/// `SO_COOKIE` of a socket.
pub fn cookie(fd: BorrowedFd<'_>) -> Option<u64> {
    let mut cookie: u64 = 0;
    // SAFETY: any bytes are a valid u64.
    let len = unsafe { getsockopt(fd, libc::SOL_SOCKET, libc::SO_COOKIE, &mut cookie) }.ok()?;
    (len == std::mem::size_of::<u64>()).then_some(cookie)
}

/// A TCP socket's `tcp_info` and how many bytes of it the kernel filled
/// in; `None` when it gave none.
pub fn tcp_info(fd: BorrowedFd<'_>) -> Option<(libc::tcp_info, usize)> {
    // SAFETY: tcp_info is plain old data; all zeroes is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    // SAFETY: tcp_info is plain old data: any bytes are a valid value.
    let len = unsafe { getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_INFO, &mut info) }.ok()?;
    Some((info, len))
}

/// Sets `SO_RCVTIMEO` to whole seconds.
pub fn set_receive_timeout(fd: BorrowedFd<'_>, secs: u64) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: secs as libc::time_t,
        tv_usec: 0,
    };
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv)
}

/// The network namespace a socket lives in, as a new fd (`SIOCGSKNS`).
pub fn netns_of(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    // SAFETY: an ioctl without argument; a non-negative result is a new fd
    // we own.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), SIOCGSKNS as _) };
    if r >= 0 {
        // SAFETY: a fresh fd we own.
        Ok(unsafe { OwnedFd::from_raw_fd(r) })
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `SO_PEERPIDFD` (Linux 6.5): a pidfd of a Unix socket's peer.
const SO_PEERPIDFD: libc::c_int = 77;

/// A pidfd of the process that connected Unix socket `fd`
/// (`SO_PEERPIDFD`): `ENOPROTOOPT` where the kernel lacks the option, and
/// an error when the peer is gone.
pub fn peer_pidfd(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let mut pidfd: libc::c_int = -1;
    // SAFETY: any bytes are a valid int.
    unsafe { getsockopt(fd, libc::SOL_SOCKET, SO_PEERPIDFD, &mut pidfd) }?;
    if pidfd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd the kernel gave us to own.
    Ok(unsafe { OwnedFd::from_raw_fd(pidfd) })
}

/// The credentials of the process that connected Unix socket `fd`, as the
/// kernel recorded them at `connect` (`SO_PEERCRED`).
pub fn peer_credentials(fd: BorrowedFd<'_>) -> io::Result<nix::sys::socket::UnixCredentials> {
    nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(io::Error::from)
}
