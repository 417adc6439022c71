//! One thread's view: its stat and status, wchan, kernel stack and syscall,
//! and how long it has slept, measured against its own CPU's task clock.

use super::*;
use selfheal_core::proc::{
    Detail, ProcRecv, SyscallInfo, TaskClocks, ThreadInfo, parse_exec_start, parse_kstack,
    syscall_name,
};

/// What a check reads of each thread's `stat`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ThreadStat {
    pub(super) comm: String,
    pub(super) state: char,
    /// utime + stime, in clock ticks.
    pub(super) cpu_ticks: u64,
    /// The CPU it last ran on (field 39), whose task clock its
    /// `se.exec_start` counts in; `None` where the line is shorter.
    pub(super) processor: Option<u32>,
}

/// The four fields of a thread's `stat` a check uses: its name, state, CPU
/// ticks and the CPU it last ran on, read as procfs's `Stat` reads them (the name between the
/// first `(` and the last `)`, lossy UTF-8; then space-separated fields),
/// without parsing the other 48 fields: on 5,100 threads that parse was a
/// fifth of `check`'s user time. `None` for a malformed line.
pub(super) fn parse_thread_stat(raw: &[u8]) -> Option<ThreadStat> {
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
pub(super) struct StatusIds {
    /// The real uid (first field of `Uid:`).
    pub(super) ruid: u32,
    /// `NSpid:`: the pid in each nested pid namespace, outermost first
    /// (empty where the kernel has no such line).
    pub(super) nspid: Vec<u32>,
}

/// `Uid:` and `NSpid:` of a `status` file, the two lines a check uses (the
/// whole file through procfs's `Status` costs a hash map per process).
/// `None` without a readable `Uid:` line.
pub(super) fn parse_status(raw: &[u8]) -> Option<StatusIds> {
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

/// What was read of a thread before its wait is interpreted: from its
/// procfs files ([`thread`]) or from the task iterator ([`iterated`]).
pub(super) struct Facts {
    pub(super) tid: u32,
    pub(super) comm: String,
    pub(super) state: char,
    pub(super) cpu_ticks: u64,
    /// The CPU it last ran on.
    pub(super) processor: Option<u32>,
    /// The syscall it sleeps in, and the syscall's second argument.
    pub(super) blocked: Option<(SyscallInfo, u64)>,
    /// The top frames of its kernel stack (read in full detail only).
    pub(super) kstack: Vec<String>,
}

/// Where the rest of a thread's evidence comes from, read only when its
/// wait needs it: `wchan`, and `se.exec_start` (ms).
pub(super) trait More {
    fn wchan(&mut self, buf: &mut [u8]) -> Option<String>;
    fn exec_start_ms(&mut self, buf: &mut [u8]) -> Option<f64>;
}

/// A thread's own procfs directory.
struct ThreadDir<'f>(std::os::fd::BorrowedFd<'f>);

impl More for ThreadDir<'_> {
    fn wchan(&mut self, buf: &mut [u8]) -> Option<String> {
        read_at(self.0, "wchan", buf)
            .map(|b| String::from_utf8_lossy(b).trim().to_string())
            .filter(|w| !w.is_empty() && w != "0")
    }
    fn exec_start_ms(&mut self, buf: &mut [u8]) -> Option<f64> {
        read_at(self.0, "sched", buf).and_then(|b| parse_exec_start(&String::from_utf8_lossy(b)))
    }
}

/// The syscall `nr` with its first argument, when it is one (not `-1`, the
/// number outside any syscall).
fn syscall_info(nr: i64, arg0: u64) -> Option<SyscallInfo> {
    (nr >= 0).then(|| SyscallInfo {
        nr,
        name: syscall_name(nr),
        arg0,
    })
}

/// What reading each thread of a process shares: the process's socket
/// fds, the CPUs' task clocks, the detail asked for, a read buffer, the
/// process's memory and the gaps found so far.
pub(super) struct Threads<'t, 'a, 'r> {
    pub(super) sockets: &'t [(i32, u64)],
    pub(super) clocks: &'t TaskClocks,
    pub(super) detail: Detail,
    pub(super) buf: &'t mut [u8],
    pub(super) mem: &'t mut Mem<'a, 'r>,
    pub(super) gaps: &'t mut Vec<String>,
}

pub(super) fn thread(
    task: std::os::fd::BorrowedFd<'_>,
    tid: u32,
    cx: &mut Threads<'_, '_, '_>,
) -> Option<ThreadInfo> {
    use procfs::FromRead as _;
    use std::os::fd::AsFd as _;
    let detail = cx.detail;
    let Threads { buf, gaps, .. } = &mut *cx;
    if detail == Detail::Minimal {
        // One file: open it relative to the task directory.
        let stat = parse_thread_stat(read_at(task, format!("{tid}/stat").as_str(), buf)?)?;
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
                }) => syscall_info(syscall_number, argument_registers[0])
                    .map(|s| (s, argument_registers[1])),
                _ => None,
            },
        }
    } else {
        None
    };
    let facts = Facts {
        tid,
        comm: stat.comm,
        state: stat.state,
        cpu_ticks: stat.cpu_ticks,
        processor: stat.processor,
        blocked,
        kstack,
    };
    Some(interpret(facts, &mut ThreadDir(dir), cx))
}

/// A thread as the task iterator read it, with the same reading of its
/// wait as [`thread`]'s at `detail` (minimal or light: a full read is
/// procfs's). `wchan`, which the iterator does not read, comes from procfs
/// for the D-state threads that need it.
pub(super) fn iterated(
    t: &selfheal_core::ebpf::iter::IterThread,
    cx: &mut Threads<'_, '_, '_>,
) -> ThreadInfo {
    let detail = cx.detail;
    let state = t.state_letter();
    let sleeping = matches!(state, 'S' | 'D' | 'I');
    if detail == Detail::Minimal {
        return ThreadInfo {
            tid: t.tid,
            name: t.comm.clone(),
            state,
            wchan: None,
            cpu_ticks: t.cpu_ticks(),
            syscall: None,
            idle_ms: None,
            kstack: Vec::new(),
            recv: None,
            wait: None,
        };
    }
    // A running thread's registers change under the read: procfs says
    // `running` instead, and so does this.
    let blocked = t
        .syscall
        .filter(|_| sleeping)
        .and_then(|nr| syscall_info(i64::try_from(nr).ok()?, t.arg0))
        .map(|s| (s, t.arg1));
    let facts = Facts {
        tid: t.tid,
        comm: t.comm.clone(),
        state,
        cpu_ticks: t.cpu_ticks(),
        processor: Some(t.cpu),
        blocked,
        kstack: Vec::new(),
    };
    let mut more = Iterated {
        wchan: cx
            .mem
            .root
            .of_pid(cx.mem.pid, &format!("task/{}/wchan", t.tid)),
        exec_start_ms: t.exec_start_ms(),
    };
    interpret(facts, &mut more, cx)
}

/// The rest of an iterated thread: `exec_start` read already, `wchan` by
/// path.
struct Iterated {
    wchan: std::path::PathBuf,
    exec_start_ms: f64,
}

impl More for Iterated {
    fn wchan(&mut self, buf: &mut [u8]) -> Option<String> {
        read_at(nix::fcntl::AT_FDCWD, self.wchan.as_path(), buf)
            .map(|b| String::from_utf8_lossy(b).trim().to_string())
            .filter(|w| !w.is_empty() && w != "0")
    }
    fn exec_start_ms(&mut self, _buf: &mut [u8]) -> Option<f64> {
        Some(self.exec_start_ms)
    }
}

/// What a thread waits in, from what was read of it: its wait channel,
/// the receive or readiness wait its syscall is (reading the wait's set
/// through `mem`), and how long it has slept, in its own CPU's clock.
fn interpret(facts: Facts, more: &mut dyn More, cx: &mut Threads<'_, '_, '_>) -> ThreadInfo {
    let (sockets, clocks, detail) = (cx.sockets, cx.clocks, cx.detail);
    let Threads { buf, mem, gaps, .. } = &mut *cx;
    let Facts {
        tid,
        comm,
        state,
        cpu_ticks,
        processor,
        blocked,
        kstack,
    } = facts;
    let sleeping = matches!(state, 'S' | 'D' | 'I');
    let full = detail == Detail::Full;
    let arg1 = blocked.as_ref().map_or(0, |(_, arg1)| *arg1);
    let syscall = blocked.map(|(s, _)| s);
    // The kernel stack skips scheduler functions as `wchan` does, so its top
    // frame is the wait channel; read `wchan` only when the stack is not
    // readable (not root), or in light mode for D-state threads.
    let wchan = match kstack.first() {
        Some(top) if state != 'R' => Some(top.clone()),
        _ if full || (state == 'D' && detail == Detail::Light) => more.wchan(buf),
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
    let idle_ms = if full || in_recv || wait.is_some() || (state == 'D' && detail == Detail::Light)
    {
        more.exec_start_ms(buf).and_then(|start| {
            match clocks.age_ms(processor, start, monotonic_ms()) {
                Ok(age) => Some(age),
                Err(why) => {
                    gaps.push(format!(
                        "tid {tid}: how long it has waited is unknown: {why}"
                    ));
                    None
                }
            }
        })
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
    ThreadInfo {
        tid,
        name: comm,
        state,
        wchan,
        cpu_ticks,
        syscall,
        idle_ms,
        kstack,
        recv,
        wait,
    }
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
            Ok(()) => clock_offset_here(cpu).map_err(|e| e.to_string()),
        });
    }
    // Best effort: the set was this thread's own a moment ago.
    let _ = sched_setaffinity(this, &allowed);
    TaskClocks { cpus }
}

/// Why a CPU's task clock was not taken on it.
#[derive(Debug, thiserror::Error)]
pub(super) enum CpuClockError {
    /// The thread pinned to it ran on this other CPU (-1: unknown).
    #[error("pinned there, this reader ran on cpu {0}")]
    RanElsewhere(i64),
    /// Its `sched` file could not be read.
    #[error("{} unreadable: {source}", path.display())]
    Unreadable {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// Its `sched` file holds no `se.exec_start`.
    #[error("{} has no se.exec_start", path.display())]
    NoExecStart { path: std::path::PathBuf },
}

/// This CPU's task clock minus `CLOCK_MONOTONIC`, in milliseconds, for a
/// thread pinned to `cpu`.
pub(super) fn clock_offset_here(cpu: usize) -> Result<f64, CpuClockError> {
    // Yielding makes the kernel set our own exec_start to this CPU's task
    // clock as it schedules us back in.
    let _ = nix::sched::sched_yield();
    let mono = monotonic_ms();
    let here = nix::sched::sched_getcpu().map_or(-1, |c| c as i64);
    if usize::try_from(here).ok() != Some(cpu) {
        return Err(CpuClockError::RanElsewhere(here));
    }
    let path = crate::sys::procfs::ProcRoot::default().of_thread_self("sched");
    let sched = match std::fs::read_to_string(&path) {
        Ok(sched) => sched,
        Err(source) => return Err(CpuClockError::Unreadable { path, source }),
    };
    let start = parse_exec_start(&sched).ok_or(CpuClockError::NoExecStart { path })?;
    Ok(start - mono)
}

/// `CLOCK_MONOTONIC` now, in milliseconds.
pub(super) fn monotonic_ms() -> f64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map_or(0.0, |t| t.tv_sec() as f64 * 1e3 + t.tv_nsec() as f64 / 1e6)
}
