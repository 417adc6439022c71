//! The procfs root every `/proc` path of the library is built from. The
//! system's is `/proc` ([`ProcRoot::default`]); a test points one at a
//! directory it made (a made-up `PID/stat`, `PID/fd/N` links, …) and runs a
//! real collector over it. Files the `procfs` crate parses are read through
//! [`ProcRoot::process`], which hands procfs this root.

use std::path::{Path, PathBuf};

/// Where procfs is mounted: `/proc`, or a fixture directory in tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcRoot {
    root: PathBuf,
}

impl Default for ProcRoot {
    /// The system's procfs, `/proc`.
    fn default() -> Self {
        Self::at("/proc")
    }
}

impl ProcRoot {
    /// A procfs root at `root` (a test's fixture tree).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The root itself.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// `ROOT/NAME`: a file of procfs itself (`sys/kernel/random/boot_id`).
    pub fn file(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// `ROOT/PID`: a process's directory.
    pub fn pid(&self, pid: u32) -> PathBuf {
        self.root.join(pid.to_string())
    }

    /// `ROOT/PID/NAME`: a file of a process (`status`, `ns/net`, `fd/3`).
    pub fn of_pid(&self, pid: u32, name: &str) -> PathBuf {
        self.pid(pid).join(name)
    }

    /// The inode of `ROOT/PID/ns/KIND` (`pid`, `net`): which namespace of
    /// that kind the process is in. Another user's needs `CAP_SYS_PTRACE`.
    pub fn namespace(&self, pid: u32, kind: &str) -> std::io::Result<u64> {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(self.of_pid(pid, &format!("ns/{kind}"))).map(|m| m.ino())
    }

    /// `ROOT/self/NAME`: a file of this process.
    pub fn of_self(&self, name: &str) -> PathBuf {
        self.root.join("self").join(name)
    }

    /// `ROOT/thread-self/NAME`: a file of the calling thread.
    pub fn of_thread_self(&self, name: &str) -> PathBuf {
        self.root.join("thread-self").join(name)
    }

    /// The process `pid` as the `procfs` crate reads it, under this root.
    pub fn process(&self, pid: u32) -> procfs::ProcResult<procfs::process::Process> {
        procfs::process::Process::new_with_root(self.pid(pid))
    }

    /// Every process under this root, as the `procfs` crate lists them.
    pub fn all_processes(&self) -> procfs::ProcResult<procfs::process::ProcessesIter> {
        procfs::process::all_processes_with_root(&self.root)
    }
}

/// The socket inode an fd link's target names (`socket:[inode]`, parsed by
/// procfs); `None` for anything else.
pub fn socket_inode_of_target(target: &str) -> Option<u64> {
    use std::str::FromStr as _;
    match procfs::process::FDTarget::from_str(target) {
        Ok(procfs::process::FDTarget::Socket(inode)) => Some(inode),
        _ => None,
    }
}

/// The socket inode the fd link at `link` (`/proc/PID/fd/N`) names; `None`
/// for anything else or a link gone. Reading the link calls nothing of the
/// file's own filesystem (no `fstat`, which a FUSE server could leave
/// unanswered).
pub fn socket_inode_of_link(link: &Path) -> Option<u64> {
    socket_inode_of_target(&std::fs::read_link(link).ok()?.to_string_lossy())
}

/// The running kernel's `(major, minor)` version (`/proc/sys/kernel/osrelease`
/// through the `procfs` crate), or `None` where it cannot be read.
pub fn kernel_version() -> Option<(u8, u8)> {
    procfs::sys::kernel::Version::current()
        .ok()
        .map(|v| (v.major, v.minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_built_under_the_root() {
        let sys = ProcRoot::default();
        assert_eq!(sys.of_pid(42, "ns/net"), Path::new("/proc/42/ns/net"));
        assert_eq!(sys.of_self("fdinfo/7"), Path::new("/proc/self/fdinfo/7"));
        assert_eq!(
            sys.of_thread_self("sched"),
            Path::new("/proc/thread-self/sched")
        );
        assert_eq!(
            sys.file("sys/kernel/random/boot_id"),
            Path::new("/proc/sys/kernel/random/boot_id")
        );
        let fake = ProcRoot::at("/tmp/fake");
        assert_eq!(fake.pid(7), Path::new("/tmp/fake/7"));
    }
}
