//! Process evidence from procfs: per process its threads (state, wait
//! channel, CPU ticks, the syscall each is in and on which fd, how long since
//! it last ran, the top of its kernel stack, the sockets a readiness wait
//! — poll, select, epoll — covers), its socket fds, and whether it is PID 1
//! of its pid namespace. A process or thread that exits mid-read is
//! a normal event: it is skipped, not an error; what could not be read is
//! listed in `gaps`.
//!
//! Ages from `se.exec_start` are measured in the scheduler's own clock:
//! `exec_start` counts in the runqueue's task clock, which excludes interrupt
//! and steal time and so drifts from every user-space clock (by hundreds of
//! milliseconds after an hour on a VM), and each CPU has its own (1.5 s apart
//! on the machines here). [`task_clocks`] runs this thread on each CPU in
//! turn and reads its own `exec_start` right after `sched_yield()` ("now" in
//! that CPU's clock) beside `CLOCK_MONOTONIC`; a thread's age is then taken
//! in the clock of the CPU it last ran on, never across CPUs.

use selfheal_core::ebpf::iter::{IterHead, IterThread};
use selfheal_core::proc::{Detail, ProcessInfo, TaskClocks, ThreadInfo};

use crate::sys::procfs::ProcRoot;

/// Frames of the kernel stack kept per thread.
const KSTACK_FRAMES: usize = 4;

mod thread;
mod wait;

pub use self::thread::task_clocks;
use self::thread::{Threads, iterated, parse_status, thread};
use self::wait::{Mem, read_wait, recv_syscall, wait_syscall};

/// Reads one process. `Err` only when the process itself is gone or its
/// `stat` unreadable; anything finer becomes a gap. Takes the CPUs' task
/// clocks afresh for the waits of a closer look; a caller reading many
/// processes takes them once and calls [`process_at`].
pub fn process(pid: u32, detail: Detail) -> procfs::ProcResult<ProcessInfo> {
    let clocks = if detail == Detail::Minimal {
        TaskClocks::default()
    } else {
        task_clocks()
    };
    process_at(pid, detail, &clocks)
}

/// How long a read of another process's memory made through [`process`]
/// or [`process_at`] may take.
pub const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// [`process`] with wait ages measured against `clocks` (from
/// [`task_clocks`]; the minimal read uses none). Memory reads go through a
/// reader of its own, each given [`READ_TIMEOUT`].
pub fn process_at(
    pid: u32,
    detail: Detail,
    clocks: &TaskClocks,
) -> procfs::ProcResult<ProcessInfo> {
    let mut reader = crate::sys::memread::Reader::default();
    let mut access = MemAccess {
        reader: &mut reader,
        deadline: std::time::Instant::now() + READ_TIMEOUT,
        over: false,
    };
    process_in(&ProcRoot::default(), pid, detail, clocks, &mut access)
}

/// How the reads of one collection reach other processes' memory:
/// through `reader` (a child that can be abandoned), by `deadline`, which
/// also ends the reading of threads.
pub struct MemAccess<'r> {
    pub reader: &'r mut crate::sys::memread::Reader,
    pub deadline: std::time::Instant,
    /// Set when the deadline passed: a read was abandoned or threads were
    /// left unread. The process read is then partial.
    pub over: bool,
}

/// [`process_at`] with the process read under `root` and memory reads
/// made through `access`. When its deadline passes, the threads not yet
/// read are left out and `access.over` is set: the caller says so (the
/// process read is partial).
pub fn process_in(
    root: &ProcRoot,
    pid: u32,
    detail: Detail,
    clocks: &TaskClocks,
    access: &mut MemAccess<'_>,
) -> procfs::ProcResult<ProcessInfo> {
    // A listing that finds the process's directory gone: it exited during
    // the read, which its caller counts as such (not as a gap of a
    // process that was read).
    let vanished = std::cell::Cell::new(false);
    let sockets_of = |gaps: &mut Vec<String>| match socket_fds(root, pid) {
        Ok(v) => v,
        Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ESRCH) => {
            vanished.set(true);
            Vec::new()
        }
        Err(e) => {
            gaps.push(format!("pid {pid}: cannot list fds: {e}"));
            Vec::new()
        }
    };
    // The task directory is opened once; each thread's files are opened
    // relative to it (`TID/stat`), not by a full path walked from `/`.
    let read_threads =
        |cx: &mut Threads<'_, '_, '_>, threads: &mut Vec<ThreadInfo>| match nix::dir::Dir::open(
            &root.of_pid(pid, "task"),
            nix::fcntl::OFlag::O_RDONLY
                | nix::fcntl::OFlag::O_DIRECTORY
                | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        ) {
            Ok(mut dir) => {
                let tids: Vec<u32> = dir
                    .iter()
                    .flatten()
                    .filter_map(|e| e.file_name().to_str().ok()?.parse::<u32>().ok())
                    .collect();
                let task = std::os::fd::AsFd::as_fd(&dir);
                for tid in tids {
                    if cx.mem.out_of_time() {
                        break;
                    }
                    if let Some(t) = thread(task, tid, cx) {
                        threads.push(t);
                    }
                }
            }
            Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ESRCH) => vanished.set(true),
            Err(e) => cx.gaps.push(format!("pid {pid}: cannot list threads: {e}")),
        };
    let read = read_process(
        root,
        pid,
        None,
        detail,
        clocks,
        access,
        sockets_of,
        read_threads,
    )?;
    if vanished.get() {
        return Err(procfs::ProcError::NotFound(Some(root.of_pid(pid, "task"))));
    }
    Ok(read)
}

/// [`process_in`] with the threads and socket fds from one pass of the
/// task iterators over the process (its `threads` and `(fd, inode)` of
/// its `sockets`), read at `detail` (minimal or light), and what its own
/// `stat` and `status` say from its leader's head where the pass read it
/// (`IterThread::head`). What the iterators do not read, that head where
/// they did not, the memory a readiness wait names and a D-state thread's
/// `wchan`, is read as [`process_in`] reads it.
pub fn process_iterated(
    root: &ProcRoot,
    pid: u32,
    threads: &[IterThread],
    sockets: &[(i32, u64)],
    detail: Detail,
    clocks: &TaskClocks,
    access: &mut MemAccess<'_>,
) -> procfs::ProcResult<ProcessInfo> {
    let sockets_of = |_: &mut Vec<String>| sockets.to_vec();
    let read_threads = |cx: &mut Threads<'_, '_, '_>, out: &mut Vec<ThreadInfo>| {
        out.reserve(threads.len());
        for t in threads {
            if cx.mem.out_of_time() {
                break;
            }
            out.push(iterated(t, cx));
        }
    };
    let head = threads
        .iter()
        .find(|t| t.tid == pid)
        .and_then(|t| Some(Head::iterated(pid, t, t.head?)));
    read_process(
        root,
        pid,
        head,
        detail,
        clocks,
        access,
        sockets_of,
        read_threads,
    )
}

/// Process `pid` under `root`: its own `stat` and `status` (unless its
/// `head` is given), its socket fds (`sockets_of`, which may add gaps),
/// and the threads `read_threads` reads with what reading them shares
/// (until `access`'s deadline); the wait sets read from its memory are
/// checked again after.
#[allow(clippy::too_many_arguments)]
fn read_process(
    root: &ProcRoot,
    pid: u32,
    head: Option<Head>,
    detail: Detail,
    clocks: &TaskClocks,
    access: &mut MemAccess<'_>,
    sockets_of: impl FnOnce(&mut Vec<String>) -> Vec<(i32, u64)>,
    read_threads: impl FnOnce(&mut Threads<'_, '_, '_>, &mut Vec<ThreadInfo>),
) -> procfs::ProcResult<ProcessInfo> {
    let mut buf = vec![0u8; 64 << 10];
    let head = match head {
        Some(head) => head,
        None => Head::read(root, pid, &mut buf)?,
    };
    let mut gaps = Vec::new();
    let sockets = sockets_of(&mut gaps);
    let mut threads = Vec::new();
    let mut mem = Mem::new(root, pid, access);
    read_threads(
        &mut Threads {
            sockets: &sockets,
            clocks,
            detail,
            buf: &mut buf,
            mem: &mut mem,
            gaps: &mut gaps,
        },
        &mut threads,
    );
    mem.recheck(&mut threads, &mut gaps);
    Ok(head.process(threads, sockets, gaps))
}

/// What a check reads of the process itself: what its `stat` (parent,
/// name, state, start time) and `status` (real uid, whether it is pid 1
/// of a nested pid namespace) say.
struct Head {
    pid: u32,
    ppid: u32,
    name: String,
    state: char,
    start_ticks: u64,
    uid: Option<u32>,
    pid_ns_init: bool,
}

impl Head {
    /// From procfs: the process's `stat` and `status`.
    fn read(root: &ProcRoot, pid: u32, buf: &mut [u8]) -> procfs::ProcResult<Head> {
        let stat = root.stat(pid)?;
        let status =
            read_at(nix::fcntl::AT_FDCWD, &root.of_pid(pid, "status"), buf).and_then(parse_status);
        Ok(Head {
            pid,
            ppid: stat.ppid.max(0) as u32,
            name: stat.comm,
            state: stat.state,
            start_ticks: stat.starttime,
            pid_ns_init: status
                .as_ref()
                .is_some_and(|s| s.nspid.len() > 1 && s.nspid.last() == Some(&1)),
            uid: status.map(|s| s.ruid),
        })
    }

    /// From a pass of the task iterator: its `leader`'s record, and the
    /// `head` read with it (procfs's `stat` shows the leader's name and
    /// state for the process).
    fn iterated(pid: u32, leader: &IterThread, head: IterHead) -> Head {
        Head {
            pid,
            ppid: head.ppid,
            name: leader.comm.clone(),
            state: leader.state_letter(),
            start_ticks: head.start_ticks,
            uid: Some(head.ruid),
            pid_ns_init: head.pid_ns_init,
        }
    }

    fn process(
        self,
        mut threads: Vec<selfheal_core::proc::ThreadInfo>,
        sockets: Vec<(i32, u64)>,
        gaps: Vec<String>,
    ) -> ProcessInfo {
        threads.sort_by_key(|t| t.tid);
        ProcessInfo {
            pid: self.pid,
            ppid: self.ppid,
            name: self.name,
            state: self.state,
            start_ticks: self.start_ticks,
            uid: self.uid,
            pid_ns_init: self.pid_ns_init,
            threads,
            sockets,
            gaps,
        }
    }
}

/// `(fd, inode)` of every socket `pid` holds, sorted. One `readlinkat` per
/// fd (procfs's iterator also opens and stats each, four syscalls instead
/// of one, which shows on agents with thousands of sockets); the link text
/// is parsed by procfs.
pub fn socket_fds(root: &ProcRoot, pid: u32) -> nix::Result<Vec<(i32, u64)>> {
    let mut dir = nix::dir::Dir::open(
        &root.of_pid(pid, "fd"),
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    let names: Vec<(i32, std::ffi::CString)> = dir
        .iter()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name();
            let fd = name.to_str().ok()?.parse::<i32>().ok()?;
            Some((fd, name.to_owned()))
        })
        .collect();
    let dirfd = std::os::fd::AsFd::as_fd(&dir);
    let mut out = Vec::new();
    for (fd, name) in names {
        let Ok(link) = nix::fcntl::readlinkat(dirfd, name.as_c_str()) else {
            continue;
        }; // closed meanwhile
        if let Some(inode) = socket_inode_of_target(&link.to_string_lossy()) {
            out.push((fd, inode));
        }
    }
    out.sort_unstable();
    Ok(out)
}

pub use crate::sys::procfs::{socket_inode_of_link, socket_inode_of_target};

/// Reads a small procfs file relative to `dir` into `buf` (one `openat`, one
/// or two `read`s; procfs files here are far below 64 KiB).
fn read_at<'b, P: ?Sized + nix::NixPath>(
    dir: std::os::fd::BorrowedFd<'_>,
    name: &P,
    buf: &'b mut [u8],
) -> Option<&'b [u8]> {
    use nix::fcntl::{OFlag, openat};
    let fd = openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .ok()?;
    let len = crate::sys::procfs::read_short(&mut std::fs::File::from(fd), buf).ok()?;
    Some(&buf[..len])
}

/// What tests write into a made-up procfs tree.
#[cfg(test)]
pub(crate) mod fixture {
    /// A `stat` line of 52 fields: `pid (comm) state ppid …` with utime
    /// 7, stime 3, two threads and start time `start`.
    pub(crate) fn stat_line(pid: u32, comm: &str, state: char, ppid: u32, start: u64) -> String {
        let mut fields = vec!["0".to_string(); 52];
        fields[0] = pid.to_string();
        fields[1] = format!("({comm})");
        fields[2] = state.to_string();
        fields[3] = ppid.to_string();
        fields[13] = "7".into();
        fields[14] = "3".into();
        fields[19] = "2".into();
        fields[21] = start.to_string();
        fields[24] = "18446744073709551615".into();
        fields.join(" ") + "\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use super::{
        thread::{ThreadStat, parse_thread_stat},
        wait::WaitKind,
    };
    use selfheal_core::proc::syscall_name;

    /// `read` on the memory of `pid`, through a reader of its own.
    fn with_mem<T>(pid: u32, read: impl FnOnce(&mut Mem<'_, '_>) -> T) -> T {
        let mut reader = crate::sys::memread::Reader::default();
        let mut access = MemAccess {
            reader: &mut reader,
            deadline: std::time::Instant::now() + READ_TIMEOUT,
            over: false,
        };
        let root = ProcRoot::default();
        read(&mut Mem::new(&root, pid, &mut access))
    }

    /// The three fields read by hand are what procfs's full parse gives, on
    /// every thread of this process and on a name with spaces and parens.
    #[test]
    fn thread_stat_matches_procfs() {
        use procfs::FromRead as _;
        let mut n = 0;
        // Other test threads may end between the listing and the read:
        // those are skipped; this thread's own file is always there.
        let paths = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .map(|e| e.path().join("stat"))
            .chain([std::path::PathBuf::from("/proc/thread-self/stat")]);
        for path in paths {
            let Ok(raw) = std::fs::read(path) else {
                continue;
            };
            let ours = parse_thread_stat(&raw).unwrap();
            let theirs = procfs::process::Stat::from_read(&raw[..]).unwrap();
            assert_eq!(ours.comm, theirs.comm);
            assert_eq!(ours.state, theirs.state);
            assert_eq!(ours.cpu_ticks, theirs.utime + theirs.stime);
            assert_eq!(ours.processor, theirs.processor.map(|p| p as u32));
            n += 1;
        }
        assert!(n >= 1);
        let raw = b"42 (a) (b c) S 1 42 42 0 -1 4194560 10 0 0 0 7 5 0 0 20 0 1 0 100 0 0\n";
        let theirs = procfs::process::Stat::from_read(&raw[..]);
        let ours = parse_thread_stat(raw).unwrap();
        assert_eq!(
            ours,
            ThreadStat {
                comm: "a) (b c".into(),
                state: 'S',
                cpu_ticks: 12,
                processor: None,
            }
        );
        if let Ok(t) = theirs {
            assert_eq!((t.comm, t.utime + t.stime), (ours.comm, 12));
        }
        for bad in [
            &b""[..],
            b"42 (x",
            b"42 (x) S 1 2",
            b"42 (x) S 1 2 3 4 5 6 7 8 9 u v",
        ] {
            assert_eq!(
                parse_thread_stat(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn status_ids_match_procfs() {
        let raw = std::fs::read("/proc/self/status").unwrap();
        let ours = parse_status(&raw).unwrap();
        let theirs = procfs::process::Process::myself()
            .unwrap()
            .status()
            .unwrap();
        assert_eq!(ours.ruid, theirs.ruid);
        let ns: Vec<u32> = theirs
            .nspid
            .unwrap_or_default()
            .into_iter()
            .map(|p| p as u32)
            .collect();
        assert_eq!(ours.nspid, ns);
        let nested =
            parse_status(b"Name:\tx\nUid:\t1000\t1000\t1000\t1000\nNSpid:\t4242\t7\t1\n").unwrap();
        assert_eq!((nested.ruid, nested.nspid), (1000, vec![4242, 7, 1]));
        assert_eq!(parse_status(b"Name:\tx\n"), None);
        assert_eq!(parse_status(b"Uid:\t0\nNSpid:\tx\n"), None);
    }

    #[test]
    fn receive_syscalls_are_the_ones_with_a_socket_fd() {
        for (nr, name) in [
            (0, Some("read")),
            (45, Some("recvfrom")),
            (47, Some("recvmsg")),
            (202, None),
            (232, None),
            (-1, None),
        ] {
            assert_eq!(recv_syscall(nr), name, "{nr}");
        }
    }

    #[test]
    fn readiness_waits_are_the_poll_select_and_epoll_syscalls() {
        for (nr, kind) in [
            (7, Some(WaitKind::Poll)),
            (271, Some(WaitKind::Poll)),
            (23, Some(WaitKind::Select)),
            (270, Some(WaitKind::Select)),
            (232, Some(WaitKind::Epoll)),
            (281, Some(WaitKind::Epoll)),
            (441, Some(WaitKind::Epoll)),
            (0, None),
            (45, None),
            (202, None),
            (-1, None),
        ] {
            assert_eq!(wait_syscall(nr), kind, "{nr}");
            if kind.is_some() {
                assert!(syscall_name(nr).is_some(), "{nr} has a name");
            }
        }
    }

    #[test]
    fn an_unreadable_poll_set_is_a_gap_not_a_panic() {
        let me = std::process::id();
        let mut buf = vec![0u8; 64 << 10];
        let mut gaps = Vec::new();
        let sockets = [(3, 42)];
        // Thread `tid` of `pid` waiting in `syscall` (of `kind`) with
        // arguments `arg0` and `arg1`, its gaps put in `gaps`.
        let mut wait = |pid: u32,
                        tid: u32,
                        syscall: &'static str,
                        kind: WaitKind,
                        arg0: u64,
                        arg1: u64,
                        gaps: &mut Vec<String>| {
            with_mem(pid, |mem| {
                read_wait(
                    mem, tid, syscall, kind, arg0, arg1, &sockets, &mut buf, gaps,
                )
            })
        };
        // Address 8: unmapped (EFAULT), twice: one gap.
        for _ in 0..2 {
            let w = wait(me, me, "poll", WaitKind::Poll, 8, 2, &mut gaps);
            assert_eq!(w, None);
        }
        assert_eq!(gaps.len(), 1, "{gaps:?}");
        assert_eq!(
            gaps,
            [
                "tid ME: the poll set at 0x8 is not mapped: not read"
                    .replace("ME", &me.to_string())
            ]
        );
        // A huge nfds is cut at MAX_POLLFDS (and said so); a huge select
        // nfds at FD_SETSIZE.
        let _ = wait(me, me, "poll", WaitKind::Poll, 8, u64::MAX, &mut gaps);
        let _ = wait(me, me, "select", WaitKind::Select, u64::MAX, 8, &mut gaps);
        assert!(
            gaps.iter().any(|g| g.contains("only the first 4096")),
            "{gaps:?}"
        );
        assert!(
            gaps.iter().any(|g| g.contains("only the first 1024")),
            "{gaps:?}"
        );
        // A vanished process (ESRCH) and a closed epoll fd.
        let _ = wait(u32::MAX - 1, 1, "ppoll", WaitKind::Poll, 8, 1, &mut gaps);
        let _ = wait(me, me, "epoll_wait", WaitKind::Epoll, 99_999, 0, &mut gaps);
        assert!(
            gaps.iter().any(|g| g.contains("cannot read its epoll set")),
            "{gaps:?}"
        );
    }

    #[test]
    fn reads_a_poll_set_from_memory() {
        // This process's own memory: a pollfd array naming fd 3 (read) and
        // fd 4 (write only), and a socket table holding both.
        let mut set = Vec::new();
        for (fd, events) in [(3i32, 1i16), (4, 4)] {
            set.extend(fd.to_le_bytes());
            set.extend(events.to_le_bytes());
            set.extend(0i16.to_le_bytes());
        }
        let me = std::process::id();
        let mut buf = vec![0u8; 64 << 10];
        let mut gaps = Vec::new();
        let w = with_mem(me, |mem| {
            read_wait(
                mem,
                me,
                "poll",
                WaitKind::Poll,
                set.as_ptr() as u64,
                2,
                &[(3, 42), (4, 43)],
                &mut buf,
                &mut gaps,
            )
        })
        .expect("a wait on socket 42");
        assert_eq!(
            (w.syscall, w.sockets, w.epoll_fd),
            ("poll", vec![(3, 42)], None)
        );
        assert!(gaps.is_empty(), "{gaps:?}");
    }

    #[test]
    fn a_vanished_pid_is_an_error_not_a_panic() {
        assert!(process(u32::MAX - 1, Detail::Full).is_err());
    }

    #[test]
    fn reads_this_process() {
        let me = process(std::process::id(), Detail::Full).expect("own process");
        assert!(!me.threads.is_empty());
        assert!(me.threads.iter().any(|t| t.tid == std::process::id()));
    }

    fn stat_line(pid: u32, comm: &str, state: char, ppid: u32) -> String {
        fixture::stat_line(pid, comm, state, ppid, 123456)
    }

    /// The fake: a made-up procfs tree with one process (its `stat`,
    /// `status`, two threads and three fd links), read by the real
    /// collector through a [`ProcRoot`] pointed at it.
    #[test]
    fn a_process_is_read_from_a_fake_procfs() {
        use std::os::unix::fs::symlink;
        let dir = std::env::temp_dir().join(format!("selfheal-fake-proc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let p = dir.join("42");
        for d in ["task/42", "task/43", "fd"] {
            std::fs::create_dir_all(p.join(d)).expect("fixture dir");
        }
        std::fs::write(p.join("stat"), stat_line(42, "fake agent", 'S', 1)).expect("stat");
        std::fs::write(
            p.join("status"),
            "Name:\tfake agent\nUid:\t1000\t1000\t1000\t1000\nNSpid:\t42\t1\n",
        )
        .expect("status");
        std::fs::write(p.join("task/42/stat"), stat_line(42, "fake agent", 'S', 1)).expect("stat");
        std::fs::write(p.join("task/43/stat"), stat_line(43, "worker (1)", 'R', 1)).expect("stat");
        symlink("socket:[4242]", p.join("fd/3")).expect("fd link");
        symlink("/dev/null", p.join("fd/1")).expect("fd link");
        symlink("socket:[99]", p.join("fd/7")).expect("fd link");

        let root = ProcRoot::at(&dir);
        assert_eq!(socket_fds(&root, 42), Ok(vec![(3, 4242), (7, 99)]));
        let (got, over) = read_fake(&root, Detail::Minimal);
        let _ = std::fs::remove_dir_all(&dir);
        let got = got.expect("the fake process reads");
        assert_eq!(
            (
                got.pid,
                got.ppid,
                got.name.as_str(),
                got.state,
                got.start_ticks
            ),
            (42, 1, "fake agent", 'S', 123456)
        );
        assert_eq!((got.uid, got.pid_ns_init), (Some(1000), true));
        assert_eq!(got.sockets, [(3, 4242), (7, 99)]);
        let threads: Vec<_> = got
            .threads
            .iter()
            .map(|t| (t.tid, t.name.as_str(), t.state, t.cpu_ticks))
            .collect();
        assert_eq!(
            threads,
            [(42, "fake agent", 'S', 10), (43, "worker (1)", 'R', 10)]
        );
        assert!(got.gaps.is_empty(), "{:?}", got.gaps);
        assert!(!over);
    }

    /// Pid 42 of the fake procfs at `root`, read at `detail` by the real
    /// collector; and whether its read ran past its deadline.
    fn read_fake(root: &ProcRoot, detail: Detail) -> (procfs::ProcResult<ProcessInfo>, bool) {
        let mut reader = crate::sys::memread::Reader::default();
        let mut access = MemAccess {
            reader: &mut reader,
            deadline: std::time::Instant::now() + READ_TIMEOUT,
            over: false,
        };
        let got = process_in(root, 42, detail, &TaskClocks::default(), &mut access);
        (got, access.over)
    }

    /// A process whose `stat` was read but whose task and fd directories
    /// are gone by their listing (it exited mid-read) is an error, which
    /// callers count as a process that exited, not a read with gaps.
    #[test]
    fn a_process_gone_between_its_stat_and_its_listings_is_not_read() {
        let dir = std::env::temp_dir().join(format!("selfheal-fake-gone-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let p = dir.join("42");
        std::fs::create_dir_all(&p).expect("fixture dir");
        std::fs::write(p.join("stat"), stat_line(42, "exiting", 'S', 1)).expect("stat");
        std::fs::write(p.join("status"), "Name:\texiting\nUid:\t0\t0\t0\t0\n").expect("status");
        let root = ProcRoot::at(&dir);
        let (got, _) = read_fake(&root, Detail::Light);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            matches!(got, Err(procfs::ProcError::NotFound(_))),
            "{:?}",
            got.map(|p| p.gaps)
        );
    }
}
