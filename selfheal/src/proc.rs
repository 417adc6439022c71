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

use procfs::process::{FDTarget, Process};
pub use selfheal_core::proc::*; // TRANSITION

/// Frames of the kernel stack kept per thread.
const KSTACK_FRAMES: usize = 4;

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
    let mut reader = crate::memread::Reader::default();
    let mut access = MemAccess {
        reader: &mut reader,
        deadline: std::time::Instant::now() + READ_TIMEOUT,
        over: false,
    };
    process_in(pid, detail, clocks, &mut access)
}

/// How the reads of one collection reach other processes' memory:
/// through `reader` (a child that can be abandoned), by `deadline`, which
/// also ends the reading of threads.
pub struct MemAccess<'r> {
    pub reader: &'r mut crate::memread::Reader,
    pub deadline: std::time::Instant,
    /// Set when the deadline passed: a read was abandoned or threads were
    /// left unread. The process read is then partial.
    pub over: bool,
}

/// [`process_at`] with memory reads made through `access`. When its
/// deadline passes, the threads not yet read are left out and
/// `access.over` is set: the caller says so (the process read is partial).
pub fn process_in(
    pid: u32,
    detail: Detail,
    clocks: &TaskClocks,
    access: &mut MemAccess<'_>,
) -> procfs::ProcResult<ProcessInfo> {
    let process = Process::new(pid as i32)?;
    let stat = process.stat()?;
    let mut gaps = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let status = read_at(
        nix::fcntl::AT_FDCWD,
        &format!("/proc/{pid}/status"),
        &mut buf,
    )
    .and_then(parse_status);
    let pid_ns_init = status
        .as_ref()
        .is_some_and(|s| s.nspid.len() > 1 && s.nspid.last() == Some(&1));
    let sockets = match socket_fds(pid) {
        Ok(v) => v,
        Err(e) => {
            gaps.push(format!("pid {pid}: cannot list fds: {e}"));
            Vec::new()
        }
    };
    let mut threads = Vec::new();
    // The task directory is opened once; each thread's files are opened
    // relative to it (`TID/stat`), not by a full path walked from `/`.
    match nix::dir::Dir::open(
        format!("/proc/{pid}/task").as_str(),
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) {
        Ok(mut dir) => {
            let task = std::os::fd::AsRawFd::as_raw_fd(&dir);
            let tids: Vec<u32> = dir
                .iter()
                .flatten()
                .filter_map(|e| e.file_name().to_str().ok()?.parse::<u32>().ok())
                .collect();
            // SAFETY: `task` stays open while `dir` lives, i.e. for this loop.
            let task = unsafe { std::os::fd::BorrowedFd::borrow_raw(task) };
            let mut mem = Mem {
                pid,
                access,
                maps: None,
                read: Vec::new(),
            };
            for tid in tids {
                if mem.access.over || std::time::Instant::now() >= mem.access.deadline {
                    mem.access.over = true;
                    break;
                }
                if let Some(t) = thread(
                    task, tid, &sockets, clocks, detail, &mut buf, &mut mem, &mut gaps,
                ) {
                    threads.push(t);
                }
            }
            mem.recheck(&mut threads, &mut gaps);
        }
        Err(e) => gaps.push(format!("pid {pid}: cannot list threads: {e}")),
    }
    threads.sort_by_key(|t| t.tid);
    Ok(ProcessInfo {
        pid,
        ppid: stat.ppid.max(0) as u32,
        name: stat.comm,
        state: stat.state,
        start_ticks: stat.starttime,
        uid: status.map(|s| s.ruid),
        pid_ns_init,
        threads,
        sockets,
        gaps,
    })
}

/// `(fd, inode)` of every socket `pid` holds, sorted. One `readlinkat` per
/// fd (procfs's iterator also opens and stats each, four syscalls instead
/// of one, which shows on agents with thousands of sockets); the link text
/// is parsed by procfs.
pub fn socket_fds(pid: u32) -> nix::Result<Vec<(i32, u64)>> {
    let mut dir = nix::dir::Dir::open(
        format!("/proc/{pid}/fd").as_str(),
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    let dirfd = std::os::fd::AsRawFd::as_raw_fd(&dir);
    let mut out = Vec::new();
    for entry in dir.iter().flatten() {
        let name = entry.file_name();
        let Some(fd) = name.to_str().ok().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        // SAFETY: `dirfd` stays open while `dir` lives, i.e. for this loop.
        let dirfd = unsafe { std::os::fd::BorrowedFd::borrow_raw(dirfd) };
        let Ok(link) = nix::fcntl::readlinkat(dirfd, name) else {
            continue;
        }; // closed meanwhile
        if let Some(inode) = socket_inode_of_target(&link.to_string_lossy()) {
            out.push((fd, inode));
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The socket inode an fd link's target names (`socket:[inode]`, parsed by
/// procfs); `None` for anything else.
pub fn socket_inode_of_target(target: &str) -> Option<u64> {
    use std::str::FromStr as _;
    match FDTarget::from_str(target) {
        Ok(FDTarget::Socket(inode)) => Some(inode),
        _ => None,
    }
}

/// The socket inode the fd link at `link` (`/proc/PID/fd/N`) names; `None`
/// for anything else or a link gone. Reading the link calls nothing of the
/// file's own filesystem (no `fstat`, which a FUSE server could leave
/// unanswered).
pub fn socket_inode_of_link(link: &std::path::Path) -> Option<u64> {
    socket_inode_of_target(&std::fs::read_link(link).ok()?.to_string_lossy())
}

/// Reads a small procfs file relative to `dir` into `buf` (one `openat`, one
/// or two `read`s; procfs files here are far below 64 KiB).
fn read_at<'b>(
    dir: std::os::fd::BorrowedFd<'_>,
    name: &str,
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
    // procfs's seq files hand over their whole text in one read when the
    // buffer is large enough: a short read is the end, no second read needed.
    let mut len = 0;
    while len < buf.len() {
        match nix::unistd::read(&fd, &mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => {
                len += n;
                if len < buf.len() {
                    break;
                }
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return None,
        }
    }
    Some(&buf[..len])
}

/// What a check reads of each thread's `stat`.
#[derive(Debug, PartialEq, Eq)]
struct ThreadStat {
    comm: String,
    state: char,
    /// utime + stime, in clock ticks.
    cpu_ticks: u64,
    /// The CPU it last ran on (field 39), whose task clock its
    /// `se.exec_start` counts in; `None` where the line is shorter.
    processor: Option<u32>,
}

/// The four fields of a thread's `stat` a check uses: its name, state, CPU
/// ticks and the CPU it last ran on, read as procfs's `Stat` reads them (the name between the
/// first `(` and the last `)`, lossy UTF-8; then space-separated fields),
/// without parsing the other 48 fields: on 5,100 threads that parse was a
/// fifth of `check`'s user time. `None` for a malformed line.
fn parse_thread_stat(raw: &[u8]) -> Option<ThreadStat> {
    let line = raw.trim_ascii();
    let open = line.iter().position(|&b| b == b'(')?;
    let close = line.iter().rposition(|&b| b == b')')?;
    // Lossy on the name alone is lossy on the line: `(` and `)` are ASCII,
    // so no invalid sequence spans them.
    let comm = String::from_utf8_lossy(line.get(open + 1..close)?).into_owned();
    let rest = std::str::from_utf8(line.get(close + 2..)?).ok()?;
    // After ") ": state (field 3), then ppid … cmajflt, utime (14), stime (15).
    let mut rest = rest.split(' ');
    let state = rest.next()?.chars().next()?;
    let mut rest = rest.skip(10);
    let utime: u64 = rest.next()?.parse().ok()?;
    let stime: u64 = rest.next()?.parse().ok()?;
    // cutime (16) … exit_signal (38), then processor (39).
    let processor = rest.nth(23).and_then(|p| p.parse().ok());
    Some(ThreadStat {
        comm,
        state,
        cpu_ticks: utime.checked_add(stime)?,
        processor,
    })
}

/// What a check reads of a process's `status`.
#[derive(Debug, PartialEq, Eq)]
struct StatusIds {
    /// The real uid (first field of `Uid:`).
    ruid: u32,
    /// `NSpid:`: the pid in each nested pid namespace, outermost first
    /// (empty where the kernel has no such line).
    nspid: Vec<u32>,
}

/// `Uid:` and `NSpid:` of a `status` file, the two lines a check uses (the
/// whole file through procfs's `Status` costs a hash map per process).
/// `None` without a readable `Uid:` line.
fn parse_status(raw: &[u8]) -> Option<StatusIds> {
    let text = std::str::from_utf8(raw).ok()?;
    let mut ruid = None;
    let mut nspid = Vec::new();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("Uid:") {
            ruid = v.split_whitespace().next().and_then(|u| u.parse().ok());
        } else if let Some(v) = line.strip_prefix("NSpid:") {
            nspid = v
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
        }
    }
    Some(StatusIds { ruid: ruid?, nspid })
}

#[allow(clippy::too_many_arguments)]
fn thread(
    task: std::os::fd::BorrowedFd<'_>,
    tid: u32,
    sockets: &[(i32, u64)],
    clocks: &TaskClocks,
    detail: Detail,
    buf: &mut [u8],
    mem: &mut Mem<'_, '_>,
    gaps: &mut Vec<String>,
) -> Option<ThreadInfo> {
    use procfs::FromRead as _;
    use std::os::fd::AsFd as _;
    if detail == Detail::Minimal {
        // One file: open it relative to the task directory.
        let stat = parse_thread_stat(read_at(task, &format!("{tid}/stat"), buf)?)?;
        return Some(ThreadInfo {
            tid,
            name: stat.comm,
            state: stat.state,
            wchan: None,
            cpu_ticks: stat.cpu_ticks,
            syscall: None,
            idle_ms: None,
            kstack: Vec::new(),
            recv: None,
            wait: None,
        });
    }
    let dir = nix::fcntl::openat(
        task,
        format!("{tid}").as_str(),
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .ok()?; // gone: skip
    let dir = dir.as_fd();
    let stat = parse_thread_stat(read_at(dir, "stat", buf)?)?;
    let sleeping = matches!(stat.state, 'S' | 'D' | 'I');
    let full = detail == Detail::Full;
    let kstack = if full {
        match read_at(dir, "stack", buf) {
            Some(b) => parse_kstack(&String::from_utf8_lossy(b), KSTACK_FRAMES),
            None => {
                let gap = "kernel stacks unreadable (root only)".to_string();
                if !gaps.contains(&gap) {
                    gaps.push(gap);
                }
                Vec::new()
            }
        }
    } else {
        Vec::new()
    };
    // The syscall, and its second argument for the readiness waits (nfds;
    // select's read set).
    let blocked = if full || (sleeping && detail == Detail::Light) {
        match read_at(dir, "syscall", buf) {
            None if full => {
                gaps.push(format!(
                    "tid {tid}: syscall unreadable (needs ptrace access)"
                ));
                None
            }
            None => None,
            Some(b) => match procfs::process::Syscall::from_read(b) {
                Ok(procfs::process::Syscall::Blocked {
                    syscall_number,
                    argument_registers,
                    ..
                }) if syscall_number >= 0 => Some((
                    SyscallInfo {
                        nr: syscall_number,
                        name: syscall_name(syscall_number),
                        arg0: argument_registers[0],
                    },
                    argument_registers[1],
                )),
                _ => None,
            },
        }
    } else {
        None
    };
    let arg1 = blocked.as_ref().map_or(0, |(_, arg1)| *arg1);
    let syscall = blocked.map(|(s, _)| s);
    // The kernel stack skips scheduler functions as `wchan` does, so its top
    // frame is the wait channel; read `wchan` only when the stack is not
    // readable (not root), or in light mode for D-state threads.
    let wchan = match kstack.first() {
        Some(top) if stat.state != 'R' => Some(top.clone()),
        _ if full || (stat.state == 'D' && detail == Detail::Light) => read_at(dir, "wchan", buf)
            .map(|b| String::from_utf8_lossy(b).trim().to_string())
            .filter(|w| !w.is_empty() && w != "0"),
        _ => None,
    };
    let in_recv = syscall
        .as_ref()
        .is_some_and(|s| recv_syscall(s.nr).is_some());
    // Only sleeping threads in a readiness wait, and only in processes with
    // sockets, cost the extra reads (memory or fdinfo).
    let mut wait = match syscall.as_ref() {
        Some(s) if sleeping && !sockets.is_empty() => {
            wait_syscall(s.nr).zip(s.name).and_then(|(kind, name)| {
                read_wait(mem, tid, name, kind, s.arg0, arg1, sockets, buf, gaps)
            })
        }
        _ => None,
    };
    let idle_ms =
        if full || in_recv || wait.is_some() || (stat.state == 'D' && detail == Detail::Light) {
            read_at(dir, "sched", buf)
                .and_then(|b| parse_exec_start(&String::from_utf8_lossy(b)))
                .and_then(
                    |start| match clocks.age_ms(stat.processor, start, monotonic_ms()) {
                        Ok(age) => Some(age),
                        Err(why) => {
                            gaps.push(format!(
                                "tid {tid}: how long it has waited is unknown: {why}"
                            ));
                            None
                        }
                    },
                )
        } else {
            None
        };
    let recv = syscall.as_ref().and_then(|s| {
        let name = recv_syscall(s.nr)?;
        let fd = s.arg0 as i32;
        let inode = sockets.iter().find(|(f, _)| *f == fd)?.1;
        Some(ProcRecv {
            syscall: name,
            fd,
            inode,
            idle_ms,
        })
    });
    if let Some(w) = wait.as_mut() {
        w.idle_ms = idle_ms;
    }
    Some(ThreadInfo {
        tid,
        name: stat.comm,
        state: stat.state,
        wchan,
        cpu_ticks: stat.cpu_ticks,
        syscall,
        idle_ms,
        kstack,
        recv,
        wait,
    })
}

/// Each CPU's task clock against `CLOCK_MONOTONIC`, read by running this
/// thread on every CPU it may run on, one after the other (two syscalls and
/// one small read per CPU), then putting its affinity back. A CPU outside
/// this thread's allowed set (offline, or excluded by its affinity) has a
/// reason instead of an offset, so ages from it are gaps, not wrong numbers.
pub fn task_clocks() -> TaskClocks {
    use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
    let this = nix::unistd::Pid::from_raw(0);
    let allowed = match sched_getaffinity(this) {
        Ok(set) => set,
        Err(e) => {
            return TaskClocks {
                cpus: vec![Err(format!(
                    "this reader's CPU affinity is unreadable: {e}"
                ))],
            };
        }
    };
    let last = (0..CpuSet::count())
        .filter(|&c| allowed.is_set(c).unwrap_or(false))
        .max()
        .unwrap_or(0);
    let mut cpus = Vec::with_capacity(last + 1);
    for cpu in 0..=last {
        if !allowed.is_set(cpu).unwrap_or(false) {
            cpus.push(Err(
                "not in this reader's allowed CPUs (offline, or excluded by its affinity)"
                    .to_string(),
            ));
            continue;
        }
        let mut one = CpuSet::new();
        let pinned = one.set(cpu).and_then(|()| sched_setaffinity(this, &one));
        cpus.push(match pinned {
            Err(e) => Err(format!("this reader cannot run there: {e}")),
            Ok(()) => clock_offset_here(cpu),
        });
    }
    // Best effort: the set was this thread's own a moment ago.
    let _ = sched_setaffinity(this, &allowed);
    TaskClocks { cpus }
}

/// This CPU's task clock minus `CLOCK_MONOTONIC`, in milliseconds, for a
/// thread pinned to `cpu`.
fn clock_offset_here(cpu: usize) -> Result<f64, String> {
    // Yielding makes the kernel set our own exec_start to this CPU's task
    // clock as it schedules us back in.
    let _ = nix::sched::sched_yield();
    let mono = monotonic_ms();
    // SAFETY: sched_getcpu takes no arguments and touches no memory of ours.
    let here = unsafe { libc::sched_getcpu() };
    if usize::try_from(here).ok() != Some(cpu) {
        return Err(format!("pinned there, this reader ran on cpu {here}"));
    }
    let sched = std::fs::read_to_string("/proc/thread-self/sched")
        .map_err(|e| format!("/proc/thread-self/sched unreadable: {e}"))?;
    let start = parse_exec_start(&sched)
        .ok_or_else(|| "/proc/thread-self/sched has no se.exec_start".to_string())?;
    Ok(start - mono)
}

/// `CLOCK_MONOTONIC` now, in milliseconds.
fn monotonic_ms() -> f64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map_or(0.0, |t| t.tv_sec() as f64 * 1e3 + t.tv_nsec() as f64 / 1e6)
}

/// x86_64 syscall names worth showing (what a waiting agent sits in).
pub fn syscall_name(nr: i64) -> Option<&'static str> {
    Some(match nr {
        0 => "read",
        1 => "write",
        7 => "poll",
        19 => "readv",
        23 => "select",
        35 => "nanosleep",
        43 => "accept",
        44 => "sendto",
        45 => "recvfrom",
        46 => "sendmsg",
        47 => "recvmsg",
        61 => "wait4",
        202 => "futex",
        230 => "clock_nanosleep",
        232 => "epoll_wait",
        270 => "pselect6",
        271 => "ppoll",
        281 => "epoll_pwait",
        288 => "accept4",
        299 => "recvmmsg",
        441 => "epoll_pwait2",
        _ => return None,
    })
}

/// x86_64 receive syscalls whose first argument is the socket's fd.
fn recv_syscall(nr: i64) -> Option<&'static str> {
    matches!(nr, 0 | 19 | 45 | 47 | 299)
        .then(|| syscall_name(nr))
        .flatten()
}

/// How a readiness wait names its set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WaitKind {
    /// poll, ppoll: arg0 = `struct pollfd *`, arg1 = nfds.
    Poll,
    /// select, pselect6: arg0 = nfds, arg1 = the read `fd_set *`.
    Select,
    /// epoll_wait, epoll_pwait, epoll_pwait2: arg0 = the epoll fd.
    Epoll,
}

/// x86_64 readiness waits.
fn wait_syscall(nr: i64) -> Option<WaitKind> {
    Some(match nr {
        7 | 271 => WaitKind::Poll,
        23 | 270 => WaitKind::Select,
        232 | 281 | 441 => WaitKind::Epoll,
        _ => return None,
    })
}

/// Pushes `gap` unless it is there already.
fn push_gap(gaps: &mut Vec<String>, gap: String) {
    if !gaps.contains(&gap) {
        gaps.push(gap);
    }
}

/// The sockets a readiness wait covers with read interest, or `None` when
/// it covers none (or its set cannot be read: then a gap says why).
#[allow(clippy::too_many_arguments)]
fn read_wait(
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
                .map_err(|gap| push_gap(gaps, gap))
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
                .map_err(|gap| push_gap(gaps, gap))
                .ok()?;
            let found = decode_fd_set(bytes, nfds).filter_map(socket_of).collect();
            (found, None)
        }
        WaitKind::Epoll => {
            let epfd = arg0 as i32;
            let cwd = nix::fcntl::AT_FDCWD;
            let cap = buf.len();
            let Some(bytes) = read_at(cwd, &format!("/proc/{pid}/fdinfo/{epfd}"), buf) else {
                push_gap(
                    gaps,
                    format!("tid {tid}: cannot read its epoll set (fdinfo of fd {epfd})"),
                );
                return None;
            };
            // A full buffer may end inside a line: keep whole lines only.
            let bytes = if bytes.len() == cap {
                push_gap(
                    gaps,
                    format!(
                        "tid {tid}: epoll set of fd {epfd} larger than {} KiB: only its first part read",
                        cap >> 10
                    ),
                );
                &bytes[..bytes.iter().rposition(|b| *b == b'\n').unwrap_or(0)]
            } else {
                bytes
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
/// given the collection's deadline ([`crate::memread`]): at worst this
/// agent's collection is cut at its budget and the child is abandoned;
/// the check, the other agents and this process's exit do not wait on it.
struct Mem<'a, 'r> {
    pid: u32,
    access: &'a mut MemAccess<'r>,
    maps: Option<Result<Vec<Mapping>, String>>,
    /// `(tid, which set, addr, len)` of each set read.
    read: Vec<(u32, &'static str, u64, u64)>,
}

impl Mem<'_, '_> {
    /// Reads `buf.len()` bytes at `addr`, the `what` set of thread `tid`,
    /// if they lie in private anonymous memory; `Err` is the gap.
    fn read<'b>(
        &mut self,
        tid: u32,
        what: &'static str,
        addr: u64,
        buf: &'b mut [u8],
    ) -> Result<&'b [u8], String> {
        let pid = self.pid;
        let len = buf.len() as u64;
        let maps = self.maps.get_or_insert_with(|| maps(pid, self.access));
        let maps = maps
            .as_ref()
            .map_err(|e| format!("tid {tid}: cannot read its {what} set: {e}"))?;
        anonymous_private(maps, addr, len)
            .map_err(|why| format!("tid {tid}: the {what} set at {addr:#x} {why}: not read"))?;
        if std::time::Instant::now() >= self.access.deadline {
            self.access.over = true;
            return Err(format!(
                "tid {tid}: its {what} set was not read: the collection's time was up"
            ));
        }
        let bytes = self
            .access
            .reader
            .read(pid, addr, buf, self.access.deadline)
            .map_err(|e| {
                if e == crate::memread::ReadError::Timeout {
                    self.access.over = true;
                }
                format!("tid {tid}: cannot read its {what} set: {e}")
            })?;
        self.read.push((tid, what, addr, len));
        Ok(bytes)
    }

    /// The map again, after the reads: a set no longer in private
    /// anonymous memory is dropped from its thread's wait, with a gap.
    fn recheck(&mut self, threads: &mut [ThreadInfo], gaps: &mut Vec<String>) {
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

/// `pid`'s memory map, or why it is unreadable. Read by the reader child
/// too: reading it waits for the process's `mmap_lock`, which the process
/// can keep taken (an `mmap` of its own waiting on its FUSE server).
fn maps(pid: u32, access: &mut MemAccess<'_>) -> Result<Vec<Mapping>, String> {
    use procfs::{
        FromRead as _,
        process::{MMPermissions, MMapPath, MemoryMaps},
    };
    let text = access.reader.read_maps(pid, access.deadline).map_err(|e| {
        if e == crate::memread::ReadError::Timeout {
            access.over = true;
        }
        format!("its memory map is unreadable: {e}")
    })?;
    let maps = MemoryMaps::from_read(&text[..])
        .map_err(|e| format!("its memory map is unreadable: {e}"))?;
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

    /// [`read_wait`] of `pid` through a reader of its own.
    #[allow(clippy::too_many_arguments)]
    fn wait_of(
        pid: u32,
        tid: u32,
        syscall: &'static str,
        kind: WaitKind,
        arg0: u64,
        arg1: u64,
        sockets: &[(i32, u64)],
        buf: &mut [u8],
        gaps: &mut Vec<String>,
    ) -> Option<ProcWait> {
        let mut reader = crate::memread::Reader::default();
        let mut access = MemAccess {
            reader: &mut reader,
            deadline: std::time::Instant::now() + READ_TIMEOUT,
            over: false,
        };
        let mut mem = Mem {
            pid,
            access: &mut access,
            maps: None,
            read: Vec::new(),
        };
        read_wait(&mut mem, tid, syscall, kind, arg0, arg1, sockets, buf, gaps)
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
        // Address 8: unmapped (EFAULT), twice: one gap.
        for _ in 0..2 {
            let w = wait_of(
                me,
                me,
                "poll",
                WaitKind::Poll,
                8,
                2,
                &sockets,
                &mut buf,
                &mut gaps,
            );
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
        let _ = wait_of(
            me,
            me,
            "poll",
            WaitKind::Poll,
            8,
            u64::MAX,
            &sockets,
            &mut buf,
            &mut gaps,
        );
        let _ = wait_of(
            me,
            me,
            "select",
            WaitKind::Select,
            u64::MAX,
            8,
            &sockets,
            &mut buf,
            &mut gaps,
        );
        assert!(
            gaps.iter().any(|g| g.contains("only the first 4096")),
            "{gaps:?}"
        );
        assert!(
            gaps.iter().any(|g| g.contains("only the first 1024")),
            "{gaps:?}"
        );
        // A vanished process (ESRCH) and a closed epoll fd.
        let _ = wait_of(
            u32::MAX - 1,
            1,
            "ppoll",
            WaitKind::Poll,
            8,
            1,
            &sockets,
            &mut buf,
            &mut gaps,
        );
        let _ = wait_of(
            me,
            me,
            "epoll_wait",
            WaitKind::Epoll,
            99_999,
            0,
            &sockets,
            &mut buf,
            &mut gaps,
        );
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
        let w = wait_of(
            me,
            me,
            "poll",
            WaitKind::Poll,
            set.as_ptr() as u64,
            2,
            &[(3, 42), (4, 43)],
            &mut buf,
            &mut gaps,
        )
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
}
