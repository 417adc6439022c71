//! Signals that are not sent through a pidfd: to a whole process group
//! selfheal started itself; and SIGINT/SIGTERM caught as a flag
//! ([`catch_stop`]) where a command must put things back before it ends.

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn stop(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// From now on SIGINT and SIGTERM set the flag returned instead of ending
/// the process (whichever thread takes them).
pub fn catch_stop() -> nix::Result<&'static AtomicBool> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action = SigAction::new(
        SigHandler::Handler(stop),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe.
        unsafe { sigaction(sig, &action) }?;
    }
    Ok(&STOP)
}

/// Sends `SIGKILL` to process group `pgid` (`kill(-pgid, SIGKILL)`), one
/// this process created (its leader a child not yet reaped, so the group
/// id is not reused). Best effort: a group already gone is no error.
pub fn kill_group(pgid: libc::pid_t) {
    // SAFETY: a plain syscall; it touches no memory of ours.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
}
