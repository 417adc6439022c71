//! systemd socket activation: the `LISTEN_*` variables and the fds passed
//! from fd 3 on.

use std::{
    os::fd::{FromRawFd as _, OwnedFd},
    sync::atomic::{AtomicBool, Ordering},
};

/// Why the socket systemd passed cannot be taken or used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ActivationError {
    /// This process's threads could not be counted.
    #[error("cannot count this process's threads: {reason}")]
    Threads { reason: String },
    /// More than one thread runs, so the environment may not be changed.
    #[error("the environment is changed only before any thread starts ({threads} run)")]
    Threaded { threads: u64 },
    /// `LISTEN_FDS` is set, but nothing was passed at fd 3.
    #[error("LISTEN_FDS is set but fd 3 is not open")]
    NoListener,
    /// `LISTEN_PID` names this process but `LISTEN_FDS` is missing.
    #[error("LISTEN_PID is set but LISTEN_FDS is not")]
    NoFds,
    /// `LISTEN_FDS` is not a number.
    #[error("LISTEN_FDS={value:?} is not a number")]
    BadFds { value: String },
    /// The passed fd is a socket of another type (`kind`).
    #[error("fd {fd}: a {kind} socket, not a stream socket")]
    NotStream { fd: i32, kind: String },
    /// The passed fd is not a socket.
    #[error("fd {fd}: not a socket ({errno})")]
    NotSocket { fd: i32, errno: nix::errno::Errno },
    /// The passed socket does not listen.
    #[error("fd {fd}: not a listening socket")]
    NotListening { fd: i32 },
    /// The passed socket has no unix address.
    #[error("not a unix socket ({reason})")]
    NotUnix { reason: String },
}

/// Set once the passed listener was taken: fd 3 has one owner.
static TAKEN: AtomicBool = AtomicBool::new(false);

/// `LISTEN_PID` and `LISTEN_FDS` as set, after removing them and
/// `LISTEN_FDNAMES` from the environment, so that no child mistakes them
/// for its own. Changing the environment is sound only while no other
/// thread runs: where one of them is set, refused (`Err`) in a process
/// with more than one thread.
pub fn take_env() -> Result<(Option<String>, Option<String>), ActivationError> {
    const VARS: [&str; 3] = ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"];
    if VARS.iter().all(|v| std::env::var_os(v).is_none()) {
        return Ok((None, None));
    }
    let threads = super::procfs::ProcRoot::default()
        .process(std::process::id())
        .and_then(|p| p.status())
        .map(|s| s.threads)
        .map_err(|e| ActivationError::Threads {
            reason: e.to_string(),
        })?;
    if threads != 1 {
        return Err(ActivationError::Threaded { threads });
    }
    let pid = std::env::var("LISTEN_PID").ok();
    let fds = std::env::var("LISTEN_FDS").ok();
    for var in VARS {
        // SAFETY: this process has one thread (checked above), so no other
        // thread reads or writes the environment meanwhile.
        unsafe { std::env::remove_var(var) };
    }
    Ok((pid, fds))
}

/// The listening socket of `n` passed fds (fd 3), taken once: every passed
/// fd is made close-on-exec; fds after the first are left unused. `None`
/// when it was taken already.
pub fn take_listener(n: u32) -> Result<Option<OwnedFd>, ActivationError> {
    if TAKEN.swap(true, Ordering::SeqCst) {
        return Ok(None);
    }
    for fd in 3..3 + n.min(1024) as i32 {
        // SAFETY: fcntl on any integer is harmless; a closed fd fails EBADF.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if flags < 0 {
            if fd == 3 {
                return Err(ActivationError::NoListener);
            }
            continue;
        }
        // SAFETY: as above, on an fd we were handed.
        unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
    }
    // SAFETY: fd 3 is open (checked above), was passed to us to own, and
    // is taken only once (`TAKEN`).
    Ok(Some(unsafe { OwnedFd::from_raw_fd(3) }))
}
