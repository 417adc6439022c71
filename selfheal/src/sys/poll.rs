//! Waiting for fds to be ready: `poll(2)` over an array of `pollfd`s.

use std::{
    io,
    os::fd::{AsRawFd as _, BorrowedFd},
};

/// `poll(2)` on `fds` for up to `timeout_ms` milliseconds (`-1`: no
/// limit): how many have events (in their `revents`), or the error
/// (`Interrupted` included, for the caller to judge).
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    // SAFETY: `fds` is a live, exclusively borrowed array of `fds.len()`
    // pollfds; the kernel writes only their `revents`. An fd closed
    // meanwhile is reported as `POLLNVAL`, not a memory error.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// A `pollfd` asking whether `fd` is readable.
pub fn readable(fd: BorrowedFd<'_>) -> libc::pollfd {
    libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }
}
