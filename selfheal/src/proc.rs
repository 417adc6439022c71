//! Thread evidence from procfs: state, wait channel, the syscall each thread
//! is in and on which fd, and how long since it last ran. A process or
//! thread that exits mid-read is a normal event: it is skipped, not an error.

use procfs::process::{Process, Task};
use serde::Serialize;

/// One thread of a watched process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ThreadInfo {
    pub tid: u32,
    pub name: String,
    /// R, S, D, Z, T, …
    pub state: char,
    /// Kernel function the thread sleeps in, if any.
    pub wchan: Option<String>,
    /// Receive syscall the thread is in, with the socket it reads.
    pub recv: Option<ProcRecv>,
}

/// A thread inside a receive syscall on a socket, as procfs shows it (seen
/// with or without eBPF, including receives that began before any tracer).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProcRecv {
    pub syscall: &'static str,
    pub fd: i32,
    pub inode: u64,
    /// Milliseconds since the thread last ran (`se.exec_start`), where the
    /// kernel exposes it: for a thread asleep in a receive, how long it has
    /// waited.
    pub idle_ms: Option<u64>,
}

/// Threads of `pid`. `Err` only when the process itself cannot be read.
pub fn threads(pid: u32) -> procfs::ProcResult<Vec<ThreadInfo>> {
    let process = Process::new(pid as i32)?;
    let now_ms = monotonic_ms();
    let mut out = Vec::new();
    for task in process.tasks()?.flatten() {
        if let Some(t) = thread(&process, &task, now_ms) {
            out.push(t);
        }
    }
    out.sort_by_key(|t| t.tid);
    Ok(out)
}

fn thread(process: &Process, task: &Task, now_ms: f64) -> Option<ThreadInfo> {
    let stat = task.stat().ok()?;
    let base = format!("/proc/{}/task/{}", task.pid, task.tid);
    let wchan = std::fs::read_to_string(format!("{base}/wchan"))
        .ok()
        .map(|w| w.trim().to_string())
        .filter(|w| !w.is_empty() && w != "0");
    let recv = match task.syscall() {
        Ok(procfs::process::Syscall::Blocked {
            syscall_number,
            argument_registers,
            ..
        }) => recv_syscall(syscall_number).and_then(|name| {
            let fd = argument_registers[0] as i32;
            let target = process.fd_from_fd(fd).ok()?.target;
            match target {
                procfs::process::FDTarget::Socket(inode) => Some(ProcRecv {
                    syscall: name,
                    fd,
                    inode,
                    idle_ms: exec_start_ms(&base).map(|t| (now_ms - t).max(0.0) as u64),
                }),
                _ => None,
            }
        }),
        _ => None,
    };
    Some(ThreadInfo {
        tid: task.tid as u32,
        name: stat.comm,
        state: stat.state,
        wchan,
        recv,
    })
}

/// x86_64 receive syscalls.
fn recv_syscall(nr: i64) -> Option<&'static str> {
    match nr {
        0 => Some("read"),
        19 => Some("readv"),
        45 => Some("recvfrom"),
        47 => Some("recvmsg"),
        299 => Some("recvmmsg"),
        _ => None,
    }
}

/// `se.exec_start` of `/proc/PID/task/TID/sched`, in milliseconds of the
/// scheduler clock.
fn exec_start_ms(task_dir: &str) -> Option<f64> {
    let sched = std::fs::read_to_string(format!("{task_dir}/sched")).ok()?;
    parse_exec_start(&sched)
}

pub(crate) fn parse_exec_start(sched: &str) -> Option<f64> {
    sched.lines().find_map(|l| {
        let (key, value) = l.split_once(':')?;
        (key.trim() == "se.exec_start")
            .then(|| value.trim().parse().ok())
            .flatten()
    })
}

/// The scheduler clock runs with `CLOCK_MONOTONIC` on the kernels selfheal
/// targets (both count from boot, neither counts suspend).
fn monotonic_ms() -> f64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .unwrap_or(nix::sys::time::TimeSpec::new(0, 0));
    ts.tv_sec() as f64 * 1000.0 + ts.tv_nsec() as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_exec_start() {
        let sched = "sleeper (1234, #threads: 1)\n---------\nse.exec_start                                :       5338406.123456\nse.vruntime : 1.0\n";
        assert_eq!(parse_exec_start(sched), Some(5338406.123456));
        assert_eq!(parse_exec_start("se.exec_start : x"), None);
        assert_eq!(parse_exec_start(""), None);
    }

    #[test]
    fn a_vanished_pid_is_an_error_not_a_panic() {
        assert!(threads(u32::MAX - 1).is_err());
    }
}
