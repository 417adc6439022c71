//! Who this process is: its effective uid, and whether it may read other
//! users' processes.

/// The effective uid of this process.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// `CAP_DAC_READ_SEARCH` and `CAP_SYS_PTRACE` (linux/capability.h).
const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_SYS_PTRACE: u32 = 19;

/// Whether this process may read other users' processes through procfs
/// (their fd tables, syscalls, memory and namespaces): it holds both
/// `CAP_SYS_PTRACE` and `CAP_DAC_READ_SEARCH` in its effective set. A
/// process whose set cannot be read is taken for one that may not.
pub fn reads_others() -> bool {
    procfs::process::Process::myself()
        .and_then(|p| p.status())
        .is_ok_and(|s| {
            [CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE]
                .iter()
                .all(|cap| s.capeff & (1 << cap) != 0)
        })
}
