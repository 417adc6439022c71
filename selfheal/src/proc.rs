//! Process evidence from procfs: per process its threads (state, wait
//! channel, CPU ticks, the syscall each is in and on which fd, how long since
//! it last ran, the top of its kernel stack), its socket fds, and whether it
//! is PID 1 of its pid namespace. A process or thread that exits mid-read is
//! a normal event: it is skipped, not an error; what could not be read is
//! listed in `gaps`.
//!
//! Ages from `se.exec_start` are measured against the scheduler clock itself:
//! `exec_start` counts in the runqueue's task clock, which excludes interrupt
//! and steal time and so drifts from every user-space clock (by hundreds of
//! milliseconds after an hour on a VM). The reference is the `exec_start` of
//! our own thread, taken right after `sched_yield()`, which is "now" in that
//! clock to within a tick.

use procfs::process::{FDTarget, Process};
use serde::Serialize;

/// One process of an agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProcessInfo {
    pub pid: u32,
    pub ppid: u32,
    pub name: String,
    /// R, S, D, Z, T, …
    pub state: char,
    /// Start time in clock ticks after boot: with the pid, the process's
    /// identity (a reused pid has another).
    pub start_ticks: u64,
    pub uid: Option<u32>,
    /// Whether this process is PID 1 of its own pid namespace (an init that
    /// must reap orphans).
    pub pid_ns_init: bool,
    pub threads: Vec<ThreadInfo>,
    /// `(fd, inode)` of every socket the process holds.
    pub sockets: Vec<(i32, u64)>,
    /// What could not be read, and why.
    pub gaps: Vec<String>,
}

/// One thread.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ThreadInfo {
    pub tid: u32,
    pub name: String,
    pub state: char,
    /// Kernel function the thread sleeps in, if any.
    pub wchan: Option<String>,
    /// User + system CPU time, in clock ticks.
    pub cpu_ticks: u64,
    /// The syscall the thread is in, if it is blocked in one.
    pub syscall: Option<SyscallInfo>,
    /// Milliseconds since the thread last ran (`se.exec_start`); for a
    /// thread asleep in a syscall, how long it has waited.
    pub idle_ms: Option<u64>,
    /// Top frames of the kernel stack (root only), innermost first.
    pub kstack: Vec<String>,
    /// The receive it is blocked in, when the syscall is a receive on a socket.
    pub recv: Option<ProcRecv>,
}

/// A syscall a thread is blocked in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SyscallInfo {
    pub nr: i64,
    pub name: Option<&'static str>,
    pub arg0: u64,
}

/// A thread inside a receive syscall on a socket, as procfs shows it: seen
/// with or without eBPF, including receives that began before any tracer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProcRecv {
    pub syscall: &'static str,
    pub fd: i32,
    pub inode: u64,
    /// How long it has waited (the thread's `idle_ms`).
    pub idle_ms: Option<u64>,
}

/// Frames of the kernel stack kept per thread.
const KSTACK_FRAMES: usize = 4;

/// Reads one process. `Err` only when the process itself is gone or its
/// `stat` unreadable; anything finer becomes a gap.
pub fn process(pid: u32, detail: Detail) -> procfs::ProcResult<ProcessInfo> {
    let now = SchedNow::take();
    let process = Process::new(pid as i32)?;
    let stat = process.stat()?;
    let mut gaps = Vec::new();
    let status = process.status().ok();
    let pid_ns_init = status
        .as_ref()
        .and_then(|s| s.nspid.as_ref())
        .is_some_and(|ns| ns.len() > 1 && ns.last() == Some(&1));
    let sockets = match socket_fds(pid) {
        Ok(v) => v,
        Err(e) => {
            gaps.push(format!("pid {pid}: cannot list fds: {e}"));
            Vec::new()
        }
    };
    let mut threads = Vec::new();
    match std::fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(entries) => {
            let mut buf = vec![0u8; 64 << 10];
            for tid in entries
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            {
                if let Some(t) = thread(pid, tid, &sockets, now, detail, &mut buf, &mut gaps) {
                    threads.push(t);
                }
            }
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
    use std::str::FromStr as _;
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
        if let Ok(FDTarget::Socket(inode)) = FDTarget::from_str(&link.to_string_lossy()) {
            out.push((fd, inode));
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// How much to read per thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Detail {
    /// Everything: kernel stacks and wait channels of every thread (for a
    /// person, and for forensic snapshots).
    #[default]
    Full,
    /// What judging needs: state, CPU ticks, the syscall of sleeping threads,
    /// how long threads in a receive or in D state have waited, and the wait
    /// channel of D-state threads. A few times cheaper on big agents.
    Light,
    /// Per thread only its state and CPU ticks (`stat`): enough to see that
    /// nothing needs a closer look.
    Minimal,
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

fn thread(
    pid: u32,
    tid: u32,
    sockets: &[(i32, u64)],
    now: SchedNow,
    detail: Detail,
    buf: &mut [u8],
    gaps: &mut Vec<String>,
) -> Option<ThreadInfo> {
    use procfs::FromRead as _;
    use std::os::fd::AsFd as _;
    let path = format!("/proc/{pid}/task/{tid}");
    if detail == Detail::Minimal {
        // One file: open it by path rather than through a directory fd.
        let cwd = nix::fcntl::AT_FDCWD;
        let stat =
            procfs::process::Stat::from_read(read_at(cwd, &format!("{path}/stat"), buf)?).ok()?;
        return Some(ThreadInfo {
            tid,
            name: stat.comm,
            state: stat.state,
            wchan: None,
            cpu_ticks: stat.utime + stat.stime,
            syscall: None,
            idle_ms: None,
            kstack: Vec::new(),
            recv: None,
        });
    }
    let dir = nix::fcntl::open(
        path.as_str(),
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .ok()?; // gone: skip
    let dir = dir.as_fd();
    let stat = procfs::process::Stat::from_read(read_at(dir, "stat", buf)?).ok()?;
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
    let syscall = if full || (sleeping && detail == Detail::Light) {
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
                }) if syscall_number >= 0 => Some(SyscallInfo {
                    nr: syscall_number,
                    name: syscall_name(syscall_number),
                    arg0: argument_registers[0],
                }),
                _ => None,
            },
        }
    } else {
        None
    };
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
    let idle_ms = if full || in_recv || (stat.state == 'D' && detail == Detail::Light) {
        read_at(dir, "sched", buf)
            .and_then(|b| parse_exec_start(&String::from_utf8_lossy(b)))
            .and_then(|start| now.age_ms(start))
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
    Some(ThreadInfo {
        tid,
        name: stat.comm,
        state: stat.state,
        wchan,
        cpu_ticks: stat.utime + stat.stime,
        syscall,
        idle_ms,
        kstack,
        recv,
    })
}

/// "Now" in the scheduler's task clock, in milliseconds.
#[derive(Clone, Copy, Debug)]
struct SchedNow(Option<f64>);

impl SchedNow {
    fn take() -> Self {
        // Yielding makes the kernel update our own exec_start to the current
        // task clock of this CPU.
        let _ = nix::sched::sched_yield();
        SchedNow(
            std::fs::read_to_string("/proc/thread-self/sched")
                .ok()
                .and_then(|s| parse_exec_start(&s)),
        )
    }

    fn age_ms(self, exec_start_ms: f64) -> Option<u64> {
        self.0.map(|now| (now - exec_start_ms).max(0.0) as u64)
    }
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

/// `se.exec_start` of a `/proc/…/sched` file, in milliseconds.
pub fn parse_exec_start(sched: &str) -> Option<f64> {
    sched.lines().find_map(|l| {
        let (key, value) = l.split_once(':')?;
        (key.trim() == "se.exec_start")
            .then(|| value.trim().parse().ok())
            .flatten()
    })
}

/// Function names of the first `n` frames of a `/proc/…/stack` file:
/// `[<0>] wait_woken+0x6d/0x80` → `wait_woken`.
pub fn parse_kstack(stack: &str, n: usize) -> Vec<String> {
    stack
        .lines()
        .filter_map(|l| {
            let line = l.trim();
            let frame = line.split_once(']').map_or(line, |(_, rest)| rest).trim();
            let name = frame.split('+').next()?.trim();
            (!name.is_empty()).then(|| name.to_string())
        })
        .take(n)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_exec_start() {
        let sched = "sleeper (1234, #threads: 1)\n---------\nse.exec_start                                :       5338406.123456\nse.vruntime : 1.0\n";
        assert_eq!(parse_exec_start(sched), Some(5338406.123456));
        for bad in [
            "se.exec_start : x",
            "",
            "se.exec_start",
            "se.exec_start:",
            "\u{0}",
        ] {
            assert_eq!(parse_exec_start(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn parses_kernel_stacks() {
        let stack = "[<0>] wait_woken+0x6d/0x80\n[<0>] sk_wait_data+0x13a/0x150\n[<0>] tcp_recvmsg_locked+0x2c4/0x9a0\n[<0>] tcp_recvmsg+0x7d/0x1d0\n[<0>] inet_recvmsg+0x5b/0x100\n";
        assert_eq!(
            parse_kstack(stack, 3),
            ["wait_woken", "sk_wait_data", "tcp_recvmsg_locked"]
        );
        assert!(parse_kstack("", 3).is_empty());
        assert!(parse_kstack("garbage without frames", 3).len() <= 1);
        assert!(parse_kstack("[<0>] \n\n", 3).is_empty());
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
