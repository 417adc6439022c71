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

/// One mapping of a process's address space (a line of `/proc/PID/maps`),
/// as far as reading its memory from outside is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// Mapped `MAP_SHARED` (`s` in its permissions).
    pub shared: bool,
    pub backing: Backing,
}

/// What backs a mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backing {
    /// Anonymous memory: no path, or a name given with `PR_SET_VMA_ANON_NAME`
    /// (`[anon:NAME]`).
    Anonymous,
    /// `[heap]`.
    Heap,
    /// A stack: `[stack]`, `[stack:TID]`.
    Stack,
    /// A file, by its path as the kernel shows it. Memfds
    /// (`/memfd:NAME (deleted)`) and shared anonymous memory
    /// (`/dev/zero (deleted)`) are files too.
    File(String),
    /// Any other kernel-named mapping: `[vvar]`, `[vdso]`, `[vsyscall]`,
    /// System V shared memory, names this list does not know.
    Special(String),
}

/// Whether the `len` bytes at `addr` lie entirely in private anonymous
/// memory (anonymous, heap, stacks), the only memory of another process
/// read from outside: a fault there is served from RAM or swap, never by
/// a file system, so a reader cannot be made to wait on one the process
/// serves itself (FUSE). `Err` says, in words that follow "the set at
/// 0x…", why not: the first byte of the range that is not mapped, or the
/// first mapping it touches that is shared, file-backed or special.
/// `maps` need not be sorted; an empty range is always readable.
pub fn anonymous_private(maps: &[Mapping], addr: u64, len: u64) -> Result<(), String> {
    if len == 0 {
        return Ok(());
    }
    let Some(end) = addr.checked_add(len) else {
        return Err("runs past the end of the address space".into());
    };
    let mut at = addr;
    while at < end {
        let Some(m) = maps.iter().find(|m| m.start <= at && at < m.end) else {
            return Err(if at == addr {
                "is not mapped".into()
            } else {
                format!("runs into unmapped memory at {at:#x}")
            });
        };
        let name = |b: &Backing| match b {
            Backing::Anonymous => "anonymous memory".to_string(),
            Backing::Heap => "[heap]".into(),
            Backing::Stack => "[stack]".into(),
            Backing::File(p) => crate::text::escape(p),
            Backing::Special(n) => crate::text::escape(n),
        };
        if m.shared {
            return Err(format!("lies in a shared mapping ({})", name(&m.backing)));
        }
        match &m.backing {
            Backing::Anonymous | Backing::Heap | Backing::Stack => {}
            Backing::File(_) => {
                return Err(format!(
                    "lies in a file-backed mapping ({})",
                    name(&m.backing)
                ));
            }
            Backing::Special(_) => return Err(format!("lies in {}", name(&m.backing))),
        }
        at = m.end;
    }
    Ok(())
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

    fn map(start: u64, end: u64, shared: bool, backing: Backing) -> Mapping {
        Mapping {
            start,
            end,
            shared,
            backing,
        }
    }

    /// A process's address space: heap, a gap, two adjacent anonymous
    /// mappings, a file, a shared anonymous mapping, a memfd, a stack, the
    /// vvar/vdso pages; listed out of order.
    fn space() -> Vec<Mapping> {
        vec![
            map(0x7000, 0x8000, false, Backing::File("/mnt/fuse/p".into())),
            map(0x1000, 0x3000, false, Backing::Heap),
            map(0x4000, 0x5000, false, Backing::Anonymous),
            map(0x5000, 0x6000, false, Backing::Anonymous),
            map(0x6000, 0x7000, false, Backing::Anonymous),
            map(
                0x8000,
                0x9000,
                true,
                Backing::File("/dev/zero (deleted)".into()),
            ),
            map(
                0x9000,
                0xa000,
                true,
                Backing::File("/memfd:x (deleted)".into()),
            ),
            map(
                0xa000,
                0xb000,
                false,
                Backing::File("/memfd:y (deleted)".into()),
            ),
            map(0xb000, 0xc000, false, Backing::Stack),
            map(0xc000, 0xd000, false, Backing::Special("[vvar]".into())),
            map(0xd000, 0xe000, false, Backing::Special("[vdso]".into())),
            map(0xe000, 0xf000, true, Backing::Anonymous),
            map(0xf000, 0x10000, false, Backing::File("/lib/a\nb".into())),
        ]
    }

    #[test]
    fn only_private_anonymous_memory_is_read() {
        let maps = space();
        let ok = |addr, len| anonymous_private(&maps, addr, len);
        // Inside, and exactly filling, private anonymous mappings.
        assert_eq!(ok(0x1000, 0x2000), Ok(()));
        assert_eq!(ok(0x2ff8, 8), Ok(()));
        assert_eq!(ok(0xb000, 0x1000), Ok(()));
        // Across adjacent anonymous mappings (the kernel splits them at
        // permission changes): still anonymous throughout.
        assert_eq!(ok(0x4ff8, 0x1010), Ok(()));
        assert_eq!(ok(0x4000, 0x3000), Ok(()));
        // Empty ranges read nothing, wherever they point.
        assert_eq!(ok(0, 0), Ok(()));
        assert_eq!(ok(0x7000, 0), Ok(()));
        // One byte past a mapping's end is the next one (or none).
        assert_eq!(ok(0x3000, 1), Err("is not mapped".into()));
        assert_eq!(
            ok(0x2fff, 2),
            Err("runs into unmapped memory at 0x3000".into())
        );
        assert_eq!(ok(0x0fff, 2), Err("is not mapped".into()));
        assert_eq!(ok(0x3ff8, 16), Err("is not mapped".into()));
        // From anonymous memory into a file: the file decides.
        let file = Err("lies in a file-backed mapping (/mnt/fuse/p)".to_string());
        assert_eq!(ok(0x6ff8, 16), file);
        assert_eq!(ok(0x7000, 8), file);
        assert_eq!(ok(0x7ff8, 8), file);
        assert_eq!(ok(0x6000, 0x1001), file);
        // Shared anonymous memory and memfds, shared or private.
        assert_eq!(
            ok(0x8000, 8),
            Err("lies in a shared mapping (/dev/zero (deleted))".into())
        );
        assert_eq!(
            ok(0x9000, 8),
            Err("lies in a shared mapping (/memfd:x (deleted))".into())
        );
        assert_eq!(
            ok(0xa000, 8),
            Err("lies in a file-backed mapping (/memfd:y (deleted))".into())
        );
        assert_eq!(
            ok(0xe000, 8),
            Err("lies in a shared mapping (anonymous memory)".into())
        );
        // From a stack into [vvar]; [vdso].
        assert_eq!(ok(0xbff8, 16), Err("lies in [vvar]".into()));
        assert_eq!(ok(0xd000, 8), Err("lies in [vdso]".into()));
        // A path's control characters are escaped in the words.
        assert_eq!(
            ok(0xf000, 8),
            Err("lies in a file-backed mapping (/lib/a\\nb)".into())
        );
        // Past the end of the address space; beyond every mapping.
        assert_eq!(
            ok(u64::MAX - 4, 8),
            Err("runs past the end of the address space".into())
        );
        assert_eq!(ok(0x10000, 8), Err("is not mapped".into()));
        // No maps at all: nothing is readable but the empty range.
        assert_eq!(
            anonymous_private(&[], 0x1000, 8),
            Err("is not mapped".into())
        );
        assert_eq!(anonymous_private(&[], 0x1000, 0), Ok(()));
    }

    /// Every 8-byte-aligned range of up to 4 pages starting in the space:
    /// readable exactly when each of its bytes is in a private anonymous
    /// mapping (checked byte by byte, the slow way).
    #[test]
    fn the_rule_matches_a_byte_by_byte_walk() {
        let maps = space();
        let byte_ok = |a: u64| {
            maps.iter().any(|m| {
                m.start <= a
                    && a < m.end
                    && !m.shared
                    && matches!(
                        m.backing,
                        Backing::Anonymous | Backing::Heap | Backing::Stack
                    )
            })
        };
        let mut checked = 0;
        for addr in (0..0x11000u64).step_by(0xf8) {
            for len in [1u64, 8, 0x7f8, 0x1000, 0x1008, 0x2000, 0x4000] {
                let want = (addr..addr + len).step_by(8).all(byte_ok) && byte_ok(addr + len - 1);
                assert_eq!(
                    anonymous_private(&maps, addr, len).is_ok(),
                    want,
                    "{addr:#x}+{len:#x}"
                );
                checked += 1;
            }
        }
        assert!(checked > 1000);
    }
}
