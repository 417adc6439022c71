//! Entering another network namespace, in one place. Work that must see
//! another namespace's sockets (a sock_diag dump or `SOCK_DESTROY` of a
//! containerised agent's socket) runs through [`run_in`]: on a short-lived
//! thread that enters the namespace and ends with the work, so no other
//! thread of selfheal ever changes namespace. Where the namespace is the
//! caller's own, the work runs on the calling thread and nothing is entered.

use std::os::fd::AsFd;

/// Why the namespace could not be entered.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("{0}")]
    Enter(nix::Error),
    #[error("the thread in the namespace panicked")]
    Panicked,
}

/// `/proc/PID/ns/net`, opened: the network namespace of `pid`.
pub fn of_pid(pid: u32) -> std::io::Result<std::fs::File> {
    std::fs::File::open(format!("/proc/{pid}/ns/net"))
}

/// Whether `ns` (an open namespace file, or an fd from `SIOCGSKNS`) is the
/// calling thread's network namespace. False when either cannot be read, so
/// a caller enters it, which is always correct.
pub fn is_ours(ns: impl AsFd) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let (Ok(theirs), Ok(ours)) = (
        nix::sys::stat::fstat(ns.as_fd()),
        std::fs::metadata("/proc/thread-self/ns/net"),
    ) else {
        return false;
    };
    (theirs.st_dev, theirs.st_ino) == (ours.dev(), ours.ino())
}

/// Runs `f` in the network namespace `ns`: on this thread if it is ours,
/// else on a scoped thread that enters it first (`setns(CLONE_NEWNET)`,
/// which needs `CAP_SYS_ADMIN`) and exits after `f`. The new thread
/// inherits this thread's capabilities.
pub fn run_in<T: Send>(
    ns: &(impl AsFd + Sync),
    f: impl FnOnce() -> T + Send,
) -> Result<T, NetnsError> {
    if is_ours(ns) {
        return Ok(f());
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(NetnsError::Enter)?;
            Ok(f())
        })
        .join()
        .unwrap_or(Err(NetnsError::Panicked))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_namespace_runs_on_this_thread() {
        let ns = of_pid(std::process::id()).unwrap();
        assert!(is_ours(&ns));
        let here = std::thread::current().id();
        assert_eq!(run_in(&ns, || std::thread::current().id()).unwrap(), here);
    }

    #[test]
    fn a_file_that_is_no_namespace_is_not_ours_and_cannot_be_entered() {
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(!is_ours(&f));
        let e = run_in(&f, || ()).unwrap_err();
        assert!(matches!(e, NetnsError::Enter(nix::Error::EINVAL)), "{e}");
    }
}
