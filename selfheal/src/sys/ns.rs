//! Namespace fds (linux/nsfs.h): a namespace's owner and parent, and the
//! user namespace of a process behind a pidfd.

use std::{
    io,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
};

/// `PIDFD_GET_USER_NAMESPACE` (`_IO(0xFF, 9)`, Linux 6.11).
const PIDFD_GET_USER_NAMESPACE: libc::c_ulong = 0xFF09;
/// `NS_GET_PARENT` (`_IO(0xb7, 0x2)`).
const NS_GET_PARENT: libc::c_ulong = 0xb702;
/// `NS_GET_OWNER_UID` (`_IO(0xb7, 0x4)`).
const NS_GET_OWNER_UID: libc::c_ulong = 0xb704;

/// An ioctl without argument that returns a new fd.
fn ioctl_fd(fd: BorrowedFd<'_>, request: libc::c_ulong) -> io::Result<OwnedFd> {
    // SAFETY: an ioctl whose argument the kernel ignores (0); a
    // non-negative result is a new fd we own.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), request as _, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd the kernel gave us to own.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

/// The parent of user namespace `ns` (`NS_GET_PARENT`); `EPERM` when the
/// parent is outside this process's user namespace.
pub fn parent(ns: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    ioctl_fd(ns, NS_GET_PARENT)
}

/// The uid that created user namespace `ns` (`NS_GET_OWNER_UID`).
pub fn owner_uid(ns: BorrowedFd<'_>) -> io::Result<u32> {
    let mut owner: libc::uid_t = u32::MAX;
    // SAFETY: NS_GET_OWNER_UID writes one uid_t to the pointer.
    let r = unsafe { libc::ioctl(ns.as_raw_fd(), NS_GET_OWNER_UID as _, &mut owner) };
    if r != 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(owner)
    }
}

/// The user namespace of the process behind `pidfd`, asked of the pidfd
/// (`PIDFD_GET_USER_NAMESPACE`; `ENOTTY` or `EINVAL` where the kernel
/// lacks it).
pub fn userns_of_pidfd(pidfd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    ioctl_fd(pidfd, PIDFD_GET_USER_NAMESPACE)
}
