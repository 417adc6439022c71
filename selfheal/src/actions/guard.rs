//! The guard every action passes first: which pids no action may touch,
//! and the handle ([`Pidfd`]) an action takes, checked against the judged
//! process's start time so that a reused pid is never hit.

use super::ActionError;
use crate::sys::{
    pidfd::Pidfd,
    system::{Handle as _, Kernel, ProcStat, System},
};

/// `PF_KTHREAD` in `/proc/PID/stat`'s flags field (include/linux/sched.h).
const PF_KTHREAD: u32 = 0x0020_0000;

/// How far up our own parent chain [`guard`] looks (a chain is never this
/// long; the bound only makes the walk finite on any input).
const MAX_ANCESTORS: usize = 4096;

/// Refuses targets no action may touch: pid 0 and pids out of range, pid 1
/// (init: of the host, or of the pid namespace we run in — the host's as far
/// as we can see), this process, any ancestor of this process (a signal
/// there could take us down with it), and kernel threads (`PF_KTHREAD`).
/// A pid that does not exist is [`ActionError::Gone`].
pub fn guard(pid: u32) -> Result<(), ActionError> {
    guard_on(&Kernel, pid)
}

/// [`guard`] on `sys`.
pub fn guard_on<S: System>(sys: &S, pid: u32) -> Result<(), ActionError> {
    guard_stat(sys, pid).map(|_| ())
}

/// [`guard`], returning the target's stat for the identity check.
fn guard_stat<S: System>(sys: &S, pid: u32) -> Result<ProcStat, ActionError> {
    let forbid = |why: &str| ActionError::Forbidden {
        pid,
        why: why.to_string(),
    };
    if pid == 0 || pid > i32::MAX as u32 {
        return Err(forbid("not a valid pid"));
    }
    if pid == 1 {
        return Err(forbid("it is init (pid 1)"));
    }
    let me = sys.own_pid();
    if pid == me {
        return Err(forbid("it is this process"));
    }
    let stat = sys.stat(pid).ok_or(ActionError::Gone { pid })?;
    if stat.flags & PF_KTHREAD != 0 {
        return Err(forbid("it is a kernel thread"));
    }
    if is_ancestor(sys, pid, me) {
        return Err(forbid("it is an ancestor of this process"));
    }
    Ok(stat)
}

/// Whether `pid` is on the parent chain of `me`.
fn is_ancestor<S: System>(sys: &S, pid: u32, me: u32) -> bool {
    let mut cur = me;
    for _ in 0..MAX_ANCESTORS {
        let Some(ppid) = sys.stat(cur).and_then(|s| u32::try_from(s.ppid).ok()) else {
            return false;
        };
        if ppid == pid {
            return true;
        }
        if ppid <= 1 {
            return false;
        }
        cur = ppid;
    }
    false
}

/// The guard for an open handle: [`guard`] on its pid, then proof that the
/// pid still names the handle's process (same start time, not exited).
pub(super) fn check_target<S: System>(sys: &S, target: &S::Process) -> Result<(), ActionError> {
    let pid = target.pid();
    let stat = guard_stat(sys, pid)?;
    if stat.start_ticks != target.start_ticks() {
        return Err(ActionError::Reused {
            pid,
            expected: target.start_ticks(),
            found: stat.start_ticks,
        });
    }
    if !sys.is_alive(target) {
        return Err(ActionError::Gone { pid });
    }
    Ok(())
}

/// Opens the handle every action takes: [`guard`] first, then a pidfd
/// checked against `expect_start` (the start time, in clock ticks after
/// boot, of the process that was judged). A pid that now names another
/// process is [`ActionError::Reused`]; one that names none, [`ActionError::Gone`].
pub fn open_target(pid: u32, expect_start: u64) -> Result<Pidfd, ActionError> {
    open_target_on(&Kernel, pid, expect_start)
}

/// [`open_target`] on `sys`.
pub fn open_target_on<S: System>(
    sys: &S,
    pid: u32,
    expect_start: u64,
) -> Result<S::Process, ActionError> {
    guard_on(sys, pid)?;
    Ok(sys.open(pid, Some(expect_start))?)
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    #[test]
    fn guard_refuses_init_ourselves_and_our_parent() {
        for pid in [
            0,
            1,
            std::process::id(),
            std::os::unix::process::parent_id(),
        ] {
            let e = guard(pid).unwrap_err();
            assert!(matches!(e, ActionError::Forbidden { .. }), "{pid}: {e}");
            assert!(e.to_string().contains(&format!("pid {pid}")), "{e}");
        }
        assert!(matches!(
            guard(u32::MAX),
            Err(ActionError::Forbidden { .. })
        ));
    }

    #[test]
    fn guard_refuses_kernel_threads_and_allows_a_child() {
        // kthreadd (pid 2) where the pid namespace shows kernel threads.
        let kthread = (2..64u32).find(|pid| {
            procfs::process::Process::new(*pid as i32)
                .and_then(|p| p.stat())
                .is_ok_and(|s| s.flags & PF_KTHREAD != 0)
        });
        match kthread {
            Some(pid) => assert!(matches!(
                guard(pid),
                Err(ActionError::Forbidden { ref why, .. }) if why.contains("kernel thread")
            )),
            None => eprintln!("SKIPPED kernel thread case: none visible in this pid namespace"),
        }
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        let pid = child.id();
        assert!(guard(pid).is_ok());
        let _ = child.kill();
        let _ = child.wait();
        assert!(matches!(guard(pid), Err(ActionError::Gone { .. })));
    }
}
