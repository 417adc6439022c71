//! Command lines, read through the bounded reader: each within its deadline,
//! and a uid whose reads stall is not asked again in the same snapshot.

use super::*;

/// The most of a command line read: enough for any rule to match on, and
/// what a process table costs per process whatever its argv's size (the
/// procfs crate's reader takes the whole argv, so it is not used).
pub const MAX_CMDLINE_BYTES: usize = 4096;

/// The longest one command-line read may take. Reading
/// `/proc/PID/cmdline` waits for the process's `mmap_lock`, which any
/// process can keep taken for writing for as long as it likes (an `mmap`
/// of a file of its own FUSE server that waits on a page the server
/// holds): the read is made by an abandonable reader child
/// ([`crate::sys::memread`]) and given this long.
pub const CMDLINE_DEADLINE: Duration = Duration::from_millis(250);

/// The most time one table may spend on command-line reads that time out,
/// whoever's: past it no more are waited for (each unread one is said).
pub const CMDLINE_STALLS: Duration = Duration::from_secs(1);

/// Reads command lines, their first [`MAX_CMDLINE_BYTES`], by the reader
/// child: one read that times out is the last of that uid's in this table
/// (its other processes are the same owner's, who holds the lock), and all
/// that time out together take at most [`CMDLINE_STALLS`].
#[derive(Default)]
pub(super) struct CmdlineReader {
    pub(super) reader: crate::sys::memread::Reader,
    pub(super) stalled: BTreeSet<Option<u32>>,
    pub(super) stalls: Duration,
    pub(super) unread: Vec<UnreadCmdline>,
}

impl CmdlineReader {
    /// argv of `pid` (of `uid`), split at NULs (a cut last argument kept as
    /// far as it was read); empty when it cannot be read or did not come
    /// in time (then noted in `unread`).
    pub(super) fn read(&mut self, pid: u32, uid: Option<u32>) -> Vec<String> {
        let skip = if self.stalled.contains(&uid) {
            Some("a read of another process of its uid timed out")
        } else if self.stalls >= CMDLINE_STALLS {
            Some("the time for command-line reads that time out ran out")
        } else {
            None
        };
        if let Some(why) = skip {
            self.unread.push(UnreadCmdline { pid, uid, why });
            return Vec::new();
        }
        let started = Instant::now();
        let wait = CMDLINE_DEADLINE.min(CMDLINE_STALLS - self.stalls);
        match self
            .reader
            .read_cmdline(pid, MAX_CMDLINE_BYTES, started + wait)
        {
            Ok(bytes) => split_argv(&bytes),
            Err(crate::sys::memread::ReadError::Timeout) => {
                self.stalls += started.elapsed();
                self.stalled.insert(uid);
                self.unread.push(UnreadCmdline {
                    pid,
                    uid,
                    why: "its read did not finish in time",
                });
                Vec::new()
            }
            // The reader broke off: the process may be the rule's, unread.
            Err(crate::sys::memread::ReadError::Reader(_)) => {
                self.unread.push(UnreadCmdline {
                    pid,
                    uid,
                    why: "its reader process failed",
                });
                Vec::new()
            }
            // Gone, or not readable: no command line.
            Err(crate::sys::memread::ReadError::Errno(_)) => Vec::new(),
        }
    }
}

/// argv from the NUL-separated bytes of `/proc/PID/cmdline`.
pub fn split_argv(bytes: &[u8]) -> Vec<String> {
    let bytes = bytes.strip_suffix(b"\0").unwrap_or(bytes);
    if bytes.is_empty() {
        return Vec::new();
    }
    bytes
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}
