//! What a thread waits in: the receive or the poll, select or epoll wait of
//! its syscall, and the sockets it watches, read from the process's memory
//! through the bounded reader.

use super::*;
use selfheal_core::proc::syscall_name;
use selfheal_core::proc::{
    Backing, EPOLL_READ, MAX_EPOLL_FDINFO, MAX_POLLFDS, MAX_SELECT_FDS, Mapping, POLL_READ,
    POLLFD_SIZE, ProcWait, ThreadInfo, anonymous_private, decode_fd_set, decode_pollfds,
    epoll_items,
};

/// x86_64 receive syscalls whose first argument is the socket's fd.
pub(super) fn recv_syscall(nr: i64) -> Option<&'static str> {
    matches!(nr, 0 | 19 | 45 | 47 | 299)
        .then(|| syscall_name(nr))
        .flatten()
}

/// How a readiness wait names its set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WaitKind {
    /// poll, ppoll: arg0 = `struct pollfd *`, arg1 = nfds.
    Poll,
    /// select, pselect6: arg0 = nfds, arg1 = the read `fd_set *`.
    Select,
    /// epoll_wait, epoll_pwait, epoll_pwait2: arg0 = the epoll fd.
    Epoll,
}

/// x86_64 readiness waits.
pub(super) fn wait_syscall(nr: i64) -> Option<WaitKind> {
    Some(match nr {
        7 | 271 => WaitKind::Poll,
        23 | 270 => WaitKind::Select,
        232 | 281 | 441 => WaitKind::Epoll,
        _ => return None,
    })
}

/// Pushes `gap` unless it is there already.
pub(super) fn push_gap(gaps: &mut Vec<String>, gap: String) {
    if !gaps.contains(&gap) {
        gaps.push(gap);
    }
}

/// The sockets a readiness wait covers with read interest, or `None` when
/// it covers none (or its set cannot be read: then a gap says why).
#[allow(clippy::too_many_arguments)]
pub(super) fn read_wait(
    mem: &mut Mem<'_, '_>,
    tid: u32,
    syscall: &'static str,
    kind: WaitKind,
    arg0: u64,
    arg1: u64,
    sockets: &[(i32, u64)],
    buf: &mut [u8],
    gaps: &mut Vec<String>,
) -> Option<ProcWait> {
    let pid = mem.pid;
    let socket_of = |fd: i32| sockets.iter().find(|(f, _)| *f == fd).copied();
    let (found, epoll_fd): (Vec<(i32, u64)>, Option<i32>) = match kind {
        WaitKind::Poll => {
            let nfds = arg1 as usize;
            if nfds > MAX_POLLFDS {
                push_gap(
                    gaps,
                    format!("tid {tid}: poll set of {nfds} fds: only the first {MAX_POLLFDS} read"),
                );
            }
            let len = nfds.min(MAX_POLLFDS) * POLLFD_SIZE;
            let bytes = mem
                .read(tid, "poll", arg0, &mut buf[..len])
                .map_err(|gap| push_gap(gaps, gap.to_string()))
                .ok()?;
            let found = decode_pollfds(bytes)
                .filter(|(_, events)| events & POLL_READ != 0)
                .filter_map(|(fd, _)| socket_of(fd))
                .collect();
            (found, None)
        }
        WaitKind::Select => {
            let nfds = arg0 as usize;
            if arg1 == 0 {
                return None; // no read set
            }
            if nfds > MAX_SELECT_FDS {
                push_gap(
                    gaps,
                    format!(
                        "tid {tid}: select set of {nfds} fds: only the first {MAX_SELECT_FDS} read"
                    ),
                );
            }
            let nfds = nfds.min(MAX_SELECT_FDS);
            // The kernel reads whole `unsigned long`s.
            let len = nfds.div_ceil(64) * 8;
            let bytes = mem
                .read(tid, "select", arg1, &mut buf[..len])
                .map_err(|gap| push_gap(gaps, gap.to_string()))
                .ok()?;
            let found = decode_fd_set(bytes, nfds).filter_map(socket_of).collect();
            (found, None)
        }
        WaitKind::Epoll => {
            let epfd = arg0 as i32;
            let path = mem.root.of_pid(pid, &format!("fdinfo/{epfd}"));
            let Ok((bytes, cut)) = read_capped(&path, MAX_EPOLL_FDINFO) else {
                push_gap(
                    gaps,
                    format!("tid {tid}: cannot read its epoll set (fdinfo of fd {epfd})"),
                );
                return None;
            };
            // A cut may end inside a line: keep whole lines only.
            let bytes = if cut {
                push_gap(
                    gaps,
                    format!(
                        "tid {tid}: epoll set of fd {epfd} larger than {} MiB: only its first part read",
                        MAX_EPOLL_FDINFO >> 20
                    ),
                );
                &bytes[..bytes.iter().rposition(|b| *b == b'\n').unwrap_or(0)]
            } else {
                &bytes[..]
            };
            let text = String::from_utf8_lossy(bytes);
            let found = epoll_items(&text)
                .filter(|item| item.events & EPOLL_READ != 0)
                .filter_map(|item| match (socket_of(item.tfd), item.ino) {
                    // The fd still names the registered file.
                    (Some(s), None) => Some(s),
                    (Some(s), Some(ino)) if s.1 == ino => Some(s),
                    // The registered file is no longer at that fd (closed
                    // after a dup): find it by inode.
                    (_, Some(ino)) => sockets.iter().find(|(_, i)| *i == ino).copied(),
                    (None, None) => None,
                })
                .collect();
            (found, Some(epfd))
        }
    };
    let mut found = found;
    found.sort_unstable();
    found.dedup();
    if found.is_empty() {
        return None;
    }
    Some(ProcWait {
        syscall,
        sockets: found,
        epoll_fd,
        idle_ms: None,
    })
}

/// The file at `path` to its end, or its first `cap` bytes and `true`
/// where it is longer (an epoll set's `fdinfo` holds a line per registered
/// fd: thousands of sockets are hundreds of KiB).
fn read_capped(path: &std::path::Path, cap: usize) -> std::io::Result<(Vec<u8>, bool)> {
    use std::io::Read as _;
    let mut bytes = Vec::with_capacity(64 << 10);
    std::fs::File::open(path)?
        .take(cap as u64 + 1)
        .read_to_end(&mut bytes)?;
    let cut = bytes.len() > cap;
    bytes.truncate(cap);
    Ok((bytes, cut))
}

/// One process's memory reads: its map (read at the first read), and
/// each range read, to be checked against the map again afterwards.
///
/// A poll or select set is read only from private anonymous memory
/// ([`anonymous_private`]): a file-backed page may be served by a FUSE
/// server the process runs itself, which can leave the reader waiting for
/// good. The map is checked before the first read and again after the
/// last, so a set whose mapping was replaced meanwhile is dropped. What
/// remains is the moment between the first check and a read: a process
/// that `munmap`s the set and maps a FUSE file in its place just then
/// makes the read wait on its server. That read is made by a reader child
/// given the collection's deadline ([`crate::sys::memread`]): at worst this
/// agent's collection is cut at its budget and the child is abandoned;
/// the check, the other agents and this process's exit do not wait on it.
pub(super) struct Mem<'a, 'r> {
    /// The procfs the process is read under.
    pub(super) root: &'a crate::sys::procfs::ProcRoot,
    pub(super) pid: u32,
    pub(super) access: &'a mut MemAccess<'r>,
    pub(super) maps: Option<Result<Vec<Mapping>, std::sync::Arc<MapsError>>>,
    /// `(tid, which set, addr, len)` of each set read.
    pub(super) read: Vec<(u32, &'static str, u64, u64)>,
}

impl<'a, 'r> Mem<'a, 'r> {
    /// Memory of process `pid` (under `root`), read through `access`;
    /// nothing read yet.
    pub(super) fn new(
        root: &'a crate::sys::procfs::ProcRoot,
        pid: u32,
        access: &'a mut MemAccess<'r>,
    ) -> Self {
        Mem {
            root,
            pid,
            access,
            maps: None,
            read: Vec::new(),
        }
    }

    /// Whether the read's deadline has passed (then, from now on,
    /// `access.over` says so).
    pub(super) fn out_of_time(&mut self) -> bool {
        if self.access.over || std::time::Instant::now() >= self.access.deadline {
            self.access.over = true;
        }
        self.access.over
    }

    /// Reads `buf.len()` bytes at `addr`, the `what` set of thread `tid`,
    /// if they lie in private anonymous memory; `Err` is the gap.
    pub(super) fn read<'b>(
        &mut self,
        tid: u32,
        what: &'static str,
        addr: u64,
        buf: &'b mut [u8],
    ) -> Result<&'b [u8], SetReadError> {
        let pid = self.pid;
        let len = buf.len() as u64;
        let maps = self
            .maps
            .get_or_insert_with(|| maps(pid, self.access).map_err(std::sync::Arc::new));
        let maps = maps.as_ref().map_err(|e| SetReadError::Maps {
            tid,
            what,
            maps: std::sync::Arc::clone(e),
        })?;
        anonymous_private(maps, addr, len).map_err(|why| SetReadError::NotPrivate {
            tid,
            what,
            addr,
            why,
        })?;
        if std::time::Instant::now() >= self.access.deadline {
            self.access.over = true;
            return Err(SetReadError::OutOfTime { tid, what });
        }
        let bytes = self
            .access
            .reader
            .read(pid, addr, buf, self.access.deadline)
            .map_err(|error| {
                if error == crate::sys::memread::ReadError::Timeout {
                    self.access.over = true;
                }
                SetReadError::Read { tid, what, error }
            })?;
        self.read.push((tid, what, addr, len));
        Ok(bytes)
    }

    /// The map again, after the reads: a set no longer in private
    /// anonymous memory is dropped from its thread's wait, with a gap.
    pub(super) fn recheck(&mut self, threads: &mut [ThreadInfo], gaps: &mut Vec<String>) {
        if self.read.is_empty() {
            return;
        }
        let after = maps(self.pid, self.access);
        for &(tid, what, addr, len) in &self.read {
            let why = match &after {
                Ok(maps) => match anonymous_private(maps, addr, len) {
                    Ok(()) => continue,
                    Err(why) => format!("now {why}"),
                },
                Err(e) => format!("could not be checked again: {e}"),
            };
            if let Some(t) = threads.iter_mut().find(|t| t.tid == tid) {
                t.wait = None;
            }
            push_gap(
                gaps,
                format!(
                    "tid {tid}: the {what} set at {addr:#x} changed under the read ({why}): not used"
                ),
            );
        }
    }
}

/// Why a wait set in the process's memory was not read: the gap, naming
/// the thread and the set.
#[derive(Debug, thiserror::Error)]
pub(super) enum SetReadError {
    /// The process's memory map is unreadable (read once per process,
    /// shared by its sets).
    #[error("tid {tid}: cannot read its {what} set: {maps}")]
    Maps {
        tid: u32,
        what: &'static str,
        maps: std::sync::Arc<MapsError>,
    },
    /// The set is not all in private anonymous memory (why, as
    /// [`anonymous_private`] says): it is not read.
    #[error("tid {tid}: the {what} set at {addr:#x} {why}: not read")]
    NotPrivate {
        tid: u32,
        what: &'static str,
        addr: u64,
        why: String,
    },
    /// The collection's deadline passed before the read.
    #[error("tid {tid}: its {what} set was not read: the collection's time was up")]
    OutOfTime { tid: u32, what: &'static str },
    /// The read itself failed (or was abandoned at the deadline).
    #[error("tid {tid}: cannot read its {what} set: {error}")]
    Read {
        tid: u32,
        what: &'static str,
        error: crate::sys::memread::ReadError,
    },
}

/// Why a process's memory map is unreadable.
#[derive(Debug, thiserror::Error)]
pub(super) enum MapsError {
    /// The reader child did not read it (or was abandoned at the
    /// deadline).
    #[error("its memory map is unreadable: {0}")]
    Read(crate::sys::memread::ReadError),
    /// What it read does not parse.
    #[error("its memory map is unreadable: {0}")]
    Parse(#[source] procfs::ProcError),
}

/// `pid`'s memory map, or why it is unreadable. Read by the reader child
/// too: reading it waits for the process's `mmap_lock`, which the process
/// can keep taken (an `mmap` of its own waiting on its FUSE server).
pub(super) fn maps(pid: u32, access: &mut MemAccess<'_>) -> Result<Vec<Mapping>, MapsError> {
    use procfs::{
        FromRead as _,
        process::{MMPermissions, MMapPath, MemoryMaps},
    };
    let text = access.reader.read_maps(pid, access.deadline).map_err(|e| {
        if e == crate::sys::memread::ReadError::Timeout {
            access.over = true;
        }
        MapsError::Read(e)
    })?;
    let maps = MemoryMaps::from_read(&text[..]).map_err(MapsError::Parse)?;
    Ok(maps
        .into_iter()
        .map(|m| Mapping {
            start: m.address.0,
            end: m.address.1,
            shared: !m.perms.contains(MMPermissions::PRIVATE),
            backing: match m.pathname {
                MMapPath::Anonymous => Backing::Anonymous,
                MMapPath::Heap => Backing::Heap,
                MMapPath::Stack | MMapPath::TStack(_) => Backing::Stack,
                MMapPath::Other(name) if name.starts_with("[anon:") => Backing::Anonymous,
                MMapPath::Path(p) => Backing::File(p.to_string_lossy().into_owned()),
                MMapPath::Vdso => Backing::Special("[vdso]".into()),
                MMapPath::Vvar => Backing::Special("[vvar]".into()),
                MMapPath::Vsyscall => Backing::Special("[vsyscall]".into()),
                MMapPath::Rollup => Backing::Special("[rollup]".into()),
                MMapPath::Vsys(key) => Backing::Special(format!("System V shared memory {key}")),
                MMapPath::Other(name) => Backing::Special(name),
            },
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file past the cap is cut at the cap and says so; one within it is
    /// read whole, however many reads that takes.
    #[test]
    fn read_capped_cuts_at_the_cap_and_says_so() {
        let path = std::env::temp_dir().join(format!("selfheal-capped-{}", std::process::id()));
        let line = b"tfd:        7 events:       19 data:                7  pos:0 ino:1b sdev:8\n";
        let text: Vec<u8> = line
            .iter()
            .copied()
            .cycle()
            .take(line.len() * 5000)
            .collect();
        std::fs::write(&path, &text).unwrap();
        let whole = read_capped(&path, 1 << 20);
        let cut = read_capped(&path, 1000);
        let _ = std::fs::remove_file(&path);
        assert_eq!(whole.unwrap(), (text.clone(), false));
        let (bytes, was_cut) = cut.unwrap();
        assert!(was_cut);
        assert_eq!(bytes, text[..1000]);
    }
}
