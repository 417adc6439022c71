//! systemd socket activation: the `LISTEN_*` variables and the fds passed
//! from fd 3 on.

use std::{
    os::fd::{FromRawFd as _, OwnedFd},
    sync::atomic::{AtomicBool, Ordering},
};

/// Set once the passed listener was taken: fd 3 has one owner.
static TAKEN: AtomicBool = AtomicBool::new(false);

/// `LISTEN_PID` and `LISTEN_FDS` as set, after removing them and
/// `LISTEN_FDNAMES` from the environment, so that no child mistakes them
/// for its own. Changing the environment is sound only while no other
/// thread runs: where one of them is set, refused (`Err`) in a process
/// with more than one thread.
pub fn take_env() -> Result<(Option<String>, Option<String>), String> {
    const VARS: [&str; 3] = ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"];
    if VARS.iter().all(|v| std::env::var_os(v).is_none()) {
        return Ok((None, None));
    }
    let threads = super::procfs::ProcRoot::default()
        .process(std::process::id())
        .and_then(|p| p.status())
        .map(|s| s.threads)
        .map_err(|e| format!("cannot count this process's threads: {e}"))?;
    if threads != 1 {
        return Err(format!(
            "the environment is changed only before any thread starts ({threads} run)"
        ));
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
pub fn take_listener(n: u32) -> Result<Option<OwnedFd>, String> {
    if TAKEN.swap(true, Ordering::SeqCst) {
        return Ok(None);
    }
    for fd in 3..3 + n.min(1024) as i32 {
        // SAFETY: fcntl on any integer is harmless; a closed fd fails EBADF.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if flags < 0 {
            if fd == 3 {
                return Err("LISTEN_FDS is set but fd 3 is not open".into());
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
