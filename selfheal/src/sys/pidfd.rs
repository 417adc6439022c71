//! A process handle that cannot be fooled by pid reuse: a pidfd, opened
//! once and checked against the process's start time, through which every
//! action (signals, duplicating its sockets) is taken.

use std::os::fd::{AsFd, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd};

/// Why a process handle could not be had.
#[derive(Debug, thiserror::Error)]
pub enum PidfdError {
    #[error("pid {pid} is not running")]
    Gone { pid: u32 },
    #[error(
        "pid {pid} is no longer the process that was judged (started at tick {expected}, now {found})"
    )]
    Reused { pid: u32, expected: u64, found: u64 },
    #[error("pidfd_open({pid}): {source}")]
    Open { pid: u32, source: std::io::Error },
}

/// An open pidfd and the identity it was checked against.
#[derive(Debug)]
pub struct Pidfd {
    fd: OwnedFd,
    pid: u32,
    /// Start time of the process, in clock ticks after boot (`/proc/PID/stat`
    /// field 22): with the pid, the process's identity.
    start_ticks: u64,
}

/// Start time of `pid` in clock ticks after boot, if it is running.
pub fn start_ticks(pid: u32) -> Option<u64> {
    super::procfs::ProcRoot::default()
        .stat(pid)
        .ok()
        .map(|s| s.starttime)
}

/// A pidfd of `pid` (`pidfd_open`), unchecked: nothing says it is the
/// process the caller means; [`Pidfd::open`] checks its start time.
pub fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: a plain syscall; the fd it returns is owned below.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(raw as i32) })
}

impl Pidfd {
    /// Opens a pidfd for `pid`. With `expect_start`, refuses when the pid now
    /// names another process than the one started then. The start time is
    /// read after the pidfd is open, so the handle and the check describe
    /// the same process.
    pub fn open(pid: u32, expect_start: Option<u64>) -> Result<Pidfd, PidfdError> {
        let fd = pidfd_open(pid).map_err(|err| match err.raw_os_error() {
            Some(libc::ESRCH) => PidfdError::Gone { pid },
            _ => PidfdError::Open { pid, source: err },
        })?;
        let found = start_ticks(pid).ok_or(PidfdError::Gone { pid })?;
        if let Some(expected) = expect_start
            && expected != found
        {
            return Err(PidfdError::Reused {
                pid,
                expected,
                found,
            });
        }
        Ok(Pidfd {
            fd,
            pid,
            start_ticks: found,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn start_ticks(&self) -> u64 {
        self.start_ticks
    }

    /// Whether the process still runs (its pidfd is not yet readable).
    pub fn is_alive(&self) -> bool {
        !exited(self.fd.as_fd())
    }

    /// Waits up to `timeout` for the process to exit; true if it did.
    pub fn wait_exit(&self, timeout: std::time::Duration) -> bool {
        let mut pfd = [super::poll::readable(self.fd.as_fd())];
        // Whole milliseconds rounded up: a wait never ends before its
        // timeout (rounded down, the last sub-millisecond was a busy loop
        // of zero-timeout polls that a caller's round limit could end
        // early).
        let ms = timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32;
        super::poll::poll(&mut pfd, ms).is_ok_and(|n| n > 0)
    }

    /// Sends `signal` through the pidfd (never to a recycled pid).
    pub fn send_signal(&self, signal: libc::c_int) -> std::io::Result<()> {
        // SAFETY: a plain syscall on our own fd.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.fd.as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Duplicates the process's file descriptor `fd` into ours
    /// (`pidfd_getfd`: needs ptrace access to the process).
    pub fn get_fd(&self, fd: i32) -> std::io::Result<OwnedFd> {
        // SAFETY: a plain syscall; the fd it returns is owned below.
        let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, self.fd.as_raw_fd(), fd, 0) };
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            // SAFETY: a fresh fd we own.
            Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
        }
    }
}

/// Whether the process behind `pidfd` has exited (its pidfd is readable,
/// or cannot be polled).
pub fn exited(pidfd: BorrowedFd<'_>) -> bool {
    let mut pfd = [super::poll::readable(pidfd)];
    !matches!(super::poll::poll(&mut pfd, 0), Ok(0))
}

impl AsFd for Pidfd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_pid_is_refused() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = child.id();
        let start = start_ticks(pid).unwrap();
        let fd = Pidfd::open(pid, Some(start)).unwrap();
        assert!(fd.is_alive());
        // Another process's start time: the handle is refused.
        assert!(matches!(
            Pidfd::open(pid, Some(start + 1)),
            Err(PidfdError::Reused { .. })
        ));
        fd.send_signal(libc::SIGKILL).unwrap();
        assert!(fd.wait_exit(std::time::Duration::from_secs(5)));
        let _ = child.wait();
        assert!(matches!(
            Pidfd::open(pid, Some(start)),
            Err(PidfdError::Gone { .. }) | Err(PidfdError::Reused { .. })
        ));
        // The old handle still names the dead process: signalling it fails
        // rather than hitting whoever gets the pid next.
        assert!(fd.send_signal(libc::SIGTERM).is_err());
    }
}
