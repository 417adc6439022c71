//! Signals that are not sent through a pidfd: to a whole process group
//! selfheal started itself.

/// Sends `SIGKILL` to process group `pgid` (`kill(-pgid, SIGKILL)`), one
/// this process created (its leader a child not yet reaped, so the group
/// id is not reused). Best effort: a group already gone is no error.
pub fn kill_group(pgid: libc::pid_t) {
    // SAFETY: a plain syscall; it touches no memory of ours.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
}
