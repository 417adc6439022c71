//! Directory-relative file calls (`openat`, `fstatat`, `statx`, `readlinkat`,
//! `renameat`, `unlinkat`, `mkdirat`) and the mode, owner and sync of an
//! open fd. `dir` is a directory fd or `AT_FDCWD`; names are single path
//! components, NUL-terminated.

use std::{
    ffi::{CStr, OsString},
    io,
    os::{
        fd::{FromRawFd as _, OwnedFd},
        unix::ffi::OsStringExt as _,
    },
};

use super::check;

/// `fstat(fd)`.
pub fn fstat(fd: i32) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid, writable stat.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`.
pub fn lstatat(dir: i32, name: &CStr) -> io::Result<libc::stat> {
    // SAFETY: as in `fstat`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is NUL-terminated, `st` valid.
    if unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// Device and inode of what `name` (under `dir`) leads to, links
/// followed (`/proc/PID/exe`: the executable), without asking the file's
/// filesystem to refresh what it cached (`AT_STATX_DONT_SYNC`: a FUSE
/// server is never called).
pub fn dev_ino_at(dir: i32, name: &CStr) -> io::Result<(u64, u64)> {
    // SAFETY: an all-zero statx is a valid value; statx fills it.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is NUL-terminated, `st` valid.
    let rc = unsafe {
        libc::statx(
            dir,
            name.as_ptr(),
            libc::AT_STATX_DONT_SYNC,
            libc::STATX_INO,
            &mut st,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((
        libc::makedev(st.stx_dev_major, st.stx_dev_minor),
        st.stx_ino,
    ))
}

/// `openat(dir, name, flags | O_CLOEXEC, mode)`.
pub fn openat(dir: i32, name: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: `name` is NUL-terminated; the result is checked.
    let fd = unsafe { libc::openat(dir, name.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `readlinkat(dir, name)`: the link's target.
pub fn readlinkat(dir: i32, name: &CStr) -> io::Result<OsString> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: `buf` is writable for its length.
    let n = unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(OsString::from_vec(buf))
}

/// `renameat(dir, from, dir, to)`.
pub fn renameat(dir: i32, from: &CStr, to: &CStr) -> io::Result<()> {
    // SAFETY: NUL-terminated names; the kernel only reads them.
    check(unsafe { libc::renameat(dir, from.as_ptr(), dir, to.as_ptr()) })
}

/// `unlinkat(dir, name, 0)`.
pub fn unlinkat(dir: i32, name: &CStr) -> io::Result<()> {
    // SAFETY: a NUL-terminated name; the kernel only reads it.
    check(unsafe { libc::unlinkat(dir, name.as_ptr(), 0) })
}

/// `mkdirat(dir, name, mode)`.
pub fn mkdirat(dir: i32, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: a NUL-terminated name; the kernel only reads it.
    check(unsafe { libc::mkdirat(dir, name.as_ptr(), mode) })
}

/// `fsync(fd)`.
pub fn fsync(fd: i32) -> io::Result<()> {
    // SAFETY: a plain syscall on an fd; it touches no memory of ours.
    check(unsafe { libc::fsync(fd) })
}

/// `fchmod(fd, mode)`.
pub fn fchmod(fd: i32, mode: u32) -> io::Result<()> {
    // SAFETY: a plain syscall on an fd; it touches no memory of ours.
    check(unsafe { libc::fchmod(fd, mode) })
}

/// `fchown(fd, -1, gid)`: the group only, the owner left as it is.
pub fn fchown_group(fd: i32, gid: u32) -> io::Result<()> {
    // SAFETY: a plain syscall on an fd; -1 leaves the owner as it is.
    check(unsafe { libc::fchown(fd, u32::MAX, gid) })
}

/// The entries of the open directory `dir` and each one's owner (links not
/// followed), listed through the descriptor (`/proc/self/fd/N`), never
/// through a path another user could swap meanwhile.
pub fn entry_owners(dir: std::os::fd::BorrowedFd<'_>) -> io::Result<Vec<(OsString, u32)>> {
    use std::os::{fd::AsRawFd as _, unix::ffi::OsStrExt as _};
    let fd = dir.as_raw_fd();
    let mut owners = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/self/fd/{fd}"))? {
        let name = entry?.file_name();
        let c = std::ffi::CString::new(name.as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        match lstatat(fd, &c) {
            Ok(st) => owners.push((name, st.st_uid)),
            // Gone since it was listed: nothing of it is left to own.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(owners)
}
