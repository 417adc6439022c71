//! A process and its threads as procfs shows them: the plain types.
//! Reading them is the I/O edge (`selfheal::proc`).

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
    /// The wait it sits in when that is a poll/select/epoll wait whose set
    /// includes sockets with read interest.
    pub wait: Option<ProcWait>,
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

/// A thread waiting for readiness (poll, ppoll, select, pselect6, epoll_wait,
/// epoll_pwait, epoll_pwait2) on a set that includes sockets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProcWait {
    pub syscall: &'static str,
    /// The sockets in the set with read interest (POLLIN/POLLPRI, the read
    /// fd_set, EPOLLIN/EPOLLPRI): (fd, inode), sorted. Other fds (pipes,
    /// eventfds, timerfds) are left out.
    pub sockets: Vec<(i32, u64)>,
    /// For epoll waits: the epoll fd (an event loop: its registered sockets
    /// are not all calls in flight).
    pub epoll_fd: Option<i32>,
    /// How long it has waited (the thread's `idle_ms`).
    pub idle_ms: Option<u64>,
}

/// How much to read per thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Detail {
    /// Everything: kernel stacks and wait channels of every thread (for a
    /// person, and for forensic snapshots).
    #[default]
    Full,
    /// What judging needs: state, CPU ticks, the syscall of sleeping threads,
    /// the sockets of their poll/select/epoll waits, how long threads in a
    /// receive, in such a wait or in D state have waited, and the wait
    /// channel of D-state threads. A few times cheaper on big agents.
    Light,
    /// Per thread only its state and CPU ticks (`stat`): enough to see that
    /// nothing needs a closer look.
    Minimal,
}

/// Every CPU's scheduler task clock set against `CLOCK_MONOTONIC`, taken
/// together once per check.
///
/// A thread's `se.exec_start` counts in the task clock of the CPU it last
/// ran on (`processor` in its `stat`), and CPUs' task clocks differ (by
/// 1.5 s on the machines here). A wait age is therefore measured within
/// that one CPU's clock: its offset from `CLOCK_MONOTONIC` brings "now" on
/// that CPU to the moment the thread's `sched` was read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TaskClocks {
    /// Indexed by CPU number: that CPU's task clock minus `CLOCK_MONOTONIC`,
    /// in milliseconds, or why it could not be taken.
    pub cpus: Vec<Result<f64, String>>,
}

impl TaskClocks {
    /// How long a thread had waited at `mono_now_ms` (`CLOCK_MONOTONIC`,
    /// ms), given its `se.exec_start` (ms, in the task clock of `cpu`, the
    /// CPU it last ran on). `Err` says why the age cannot be known: the CPU
    /// was not read, or which one it is is unknown. A stamp later than now
    /// (the thread ran after the reference) is an age of 0.
    pub fn age_ms(
        &self,
        cpu: Option<u32>,
        exec_start_ms: f64,
        mono_now_ms: f64,
    ) -> Result<u64, String> {
        let cpu = cpu.ok_or_else(|| "the CPU it last ran on is unknown".to_string())?;
        let offset = self
            .cpus
            .get(cpu as usize)
            .ok_or_else(|| format!("it last ran on cpu {cpu}, which this reader cannot run on"))?
            .as_ref()
            .map_err(|why| format!("it last ran on cpu {cpu}: {why}"))?;
        Ok((mono_now_ms + offset - exec_start_ms).max(0.0) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each age is taken in the clock of the CPU the thread last ran on:
    /// two CPUs 1,500 ms apart give the same true age of 2,000 ms.
    #[test]
    fn ages_are_measured_in_the_clock_of_the_threads_cpu() {
        let clocks = TaskClocks {
            cpus: vec![
                Ok(-23_896.0),
                Ok(-25_456.0),
                Err("not in this reader's allowed CPUs".into()),
            ],
        };
        let now = 100_000.0;
        for (cpu, offset) in [(0, -23_896.0), (1, -25_456.0)] {
            let stamp = now + offset - 2_000.0;
            assert_eq!(clocks.age_ms(Some(cpu), stamp, now), Ok(2_000), "cpu {cpu}");
        }
        // Stamped after the reference: no negative ages.
        assert_eq!(clocks.age_ms(Some(0), now, now), Ok(0));
        let gap = |cpu| clocks.age_ms(cpu, 0.0, now).unwrap_err();
        assert_eq!(
            gap(Some(2)),
            "it last ran on cpu 2: not in this reader's allowed CPUs"
        );
        assert_eq!(
            gap(Some(7)),
            "it last ran on cpu 7, which this reader cannot run on"
        );
        assert_eq!(gap(None), "the CPU it last ran on is unknown");
        assert!(TaskClocks::default().age_ms(Some(0), 0.0, now).is_err());
    }
}
