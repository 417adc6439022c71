//! A process and its threads as procfs shows them: the plain types.
//! Reading them is the I/O edge (`selfheal::proc`).

use serde::{Deserialize, Deserializer, Serialize};

/// One process of an agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyscallInfo {
    pub nr: i64,
    /// Its name ([`syscall_name`]).
    #[serde(deserialize_with = "known_name", default)]
    pub name: Option<Named>,
    pub arg0: u64,
}

/// A thread inside a receive syscall on a socket, as procfs shows it: seen
/// with or without eBPF, including receives that began before any tracer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcRecv {
    #[serde(deserialize_with = "known_syscall")]
    pub syscall: Named,
    pub fd: i32,
    pub inode: u64,
    /// How long it has waited (the thread's `idle_ms`).
    pub idle_ms: Option<u64>,
}

/// A thread waiting for readiness (poll, ppoll, select, pselect6, epoll_wait,
/// epoll_pwait, epoll_pwait2) on a set that includes sockets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcWait {
    #[serde(deserialize_with = "known_syscall")]
    pub syscall: Named,
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

/// A name from a fixed table (a syscall's, a timer's). Under this alias
/// serde's derive does not take the field for text borrowed from its input
/// (it reads one of the table's names instead).
pub type Named = &'static str;

/// x86_64 syscall numbers and the names worth showing (what a waiting
/// agent sits in).
const SYSCALLS: [(i64, &str); 21] = [
    (0, "read"),
    (1, "write"),
    (7, "poll"),
    (19, "readv"),
    (23, "select"),
    (35, "nanosleep"),
    (43, "accept"),
    (44, "sendto"),
    (45, "recvfrom"),
    (46, "sendmsg"),
    (47, "recvmsg"),
    (61, "wait4"),
    (202, "futex"),
    (230, "clock_nanosleep"),
    (232, "epoll_wait"),
    (270, "pselect6"),
    (271, "ppoll"),
    (281, "epoll_pwait"),
    (288, "accept4"),
    (299, "recvmmsg"),
    (441, "epoll_pwait2"),
];

/// The name of x86_64 syscall `nr`, where it is one worth showing.
pub fn syscall_name(nr: i64) -> Option<&'static str> {
    SYSCALLS
        .iter()
        .find(|(n, _)| *n == nr)
        .map(|(_, name)| *name)
}

/// An optional syscall name on the wire, as the entry of [`SYSCALLS`] it
/// names (a name not there is an error).
fn known_name<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'static str>, D::Error> {
    let name: Option<String> = Option::deserialize(d)?;
    match name {
        None => Ok(None),
        Some(n) => SYSCALLS
            .iter()
            .find(|(_, s)| *s == n)
            .map(|(_, s)| Some(*s))
            .ok_or_else(|| serde::de::Error::custom(format!("unknown syscall name {n:?}"))),
    }
}

/// A syscall's name on the wire, as the one of [`SYSCALLS`] it names.
fn known_syscall<'de, D: Deserializer<'de>>(d: D) -> Result<&'static str, D::Error> {
    known_name(d)?.ok_or_else(|| serde::de::Error::custom("a syscall name is required"))
}

/// How much to read per thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
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

/// The pid in a pidfile's text: its first line, trimmed, a positive decimal
/// number (later lines, which some daemons add, are ignored).
pub fn parse_pidfile(text: &str) -> Result<u32, String> {
    let line = text.trim_start().lines().next().unwrap_or("").trim();
    if line.is_empty() {
        return Err("empty (no pid)".into());
    }
    let shown: String = line.chars().take(40).collect();
    if !line.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("not a pid: {shown:?}"));
    }
    match line.parse::<u32>() {
        Ok(pid) if pid > 0 && pid <= i32::MAX as u32 => Ok(pid),
        _ => Err(format!("not a pid: {shown:?}")),
    }
}

/// Most pollfds read from a poll/ppoll set (32 KiB); a larger set is cut
/// here and the cut is a gap.
pub const MAX_POLLFDS: usize = 4096;
/// Most bytes read of an epoll set's `fdinfo` (about 100,000 registered
/// fds at ~80 bytes a line); a larger set is cut here at a line and the
/// cut is a gap.
pub const MAX_EPOLL_FDINFO: usize = 8 << 20;
/// Most fds read from a select/pselect6 read set: glibc's `FD_SETSIZE`.
pub const MAX_SELECT_FDS: usize = 1024;

/// `sizeof(struct pollfd)`: `int fd; short events; short revents;`.
pub const POLLFD_SIZE: usize = 8;
/// Read interest in a pollfd's `events`: POLLIN, POLLPRI, POLLRDNORM,
/// POLLRDBAND.
pub const POLL_READ: i16 = 0x1 | 0x2 | 0x40 | 0x80;
/// Read interest in an epoll item's events: EPOLLIN, EPOLLPRI, EPOLLRDNORM,
/// EPOLLRDBAND.
pub const EPOLL_READ: u32 = 0x1 | 0x2 | 0x40 | 0x80;

/// `(fd, events)` of each whole `struct pollfd` in `bytes` (x86_64: native
/// little-endian); negative fds (ignored by poll) are left out. A trailing
/// partial entry is ignored.
pub fn decode_pollfds(bytes: &[u8]) -> impl Iterator<Item = (i32, i16)> + '_ {
    bytes.chunks_exact(POLLFD_SIZE).filter_map(|c| {
        let fd = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        let events = i16::from_le_bytes([c[4], c[5]]);
        (fd >= 0).then_some((fd, events))
    })
}

/// The fds below `nfds` set in an `fd_set` bitmap (x86_64: fd `i` is bit
/// `i % 8` of byte `i / 8`); bits past the end of `bytes` count as clear.
pub fn decode_fd_set(bytes: &[u8], nfds: usize) -> impl Iterator<Item = i32> + '_ {
    (0..nfds.min(bytes.len() * 8))
        .filter(|i| bytes[i / 8] & (1 << (i % 8)) != 0)
        .map(|i| i as i32)
}

/// One item of an epoll set, from its fdinfo.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpollItem {
    pub tfd: i32,
    pub events: u32,
    /// The registered file's inode (kernels since 3.15 print it).
    pub ino: Option<u64>,
}

/// The items of `/proc/PID/fdinfo/EPFD`'s `tfd:` lines:
/// `tfd:        7 events:       19 data:                7  pos:0 ino:2a sdev:8`
/// (events, data and ino in hex). Lines that do not parse are skipped.
pub fn epoll_items(text: &str) -> impl Iterator<Item = EpollItem> + '_ {
    text.lines().filter_map(|line| {
        let mut words = line.split_whitespace();
        if words.next()? != "tfd:" {
            return None;
        }
        let tfd: i32 = words.next()?.parse().ok().filter(|fd| *fd >= 0)?;
        let mut events = None;
        let mut ino = None;
        while let Some(w) = words.next() {
            if w == "events:" {
                events = u32::from_str_radix(words.next()?, 16).ok();
            } else if let Some(hex) = w.strip_prefix("ino:") {
                ino = u64::from_str_radix(hex, 16).ok();
            }
        }
        Some(EpollItem {
            tfd,
            events: events?,
            ino,
        })
    })
}

/// `(tfd, events)` of every item of an epoll fd's fdinfo text
/// (`/proc/PID/fdinfo/EPFD`), in file order. Hand-parsed: the `procfs`
/// crate (0.18) has no parser for epoll fdinfo. Junk lines are skipped.
pub fn parse_epoll_tfds(text: &str) -> Vec<(i32, u32)> {
    epoll_items(text).map(|i| (i.tfd, i.events)).collect()
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

    #[test]
    fn pidfile_text() {
        for (text, want) in [
            ("123", Ok(123)),
            ("123\n", Ok(123)),
            ("  42  \n", Ok(42)),
            ("\n\n7\nport=80\n", Ok(7)),
            ("2147483647", Ok(2147483647)),
        ] {
            assert_eq!(parse_pidfile(text), want, "{text:?}");
        }
        for (text, says) in [
            ("", "empty"),
            ("   \n\t", "empty"),
            ("abc", "not a pid: \"abc\""),
            ("-5", "not a pid: \"-5\""),
            ("+5", "not a pid"),
            ("123abc", "not a pid: \"123abc\""),
            ("12 34", "not a pid"),
            ("0", "not a pid: \"0\""),
            ("2147483648", "not a pid"),
            ("99999999999999999999999", "not a pid"),
            ("１２３", "not a pid"),
            ("\u{0}", "not a pid"),
        ] {
            let err = parse_pidfile(text).expect_err(text);
            assert!(err.contains(says), "{text:?}: {err}");
        }
    }

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

    /// `/proc/PID/fdinfo/EPFD` of an epoll fd (kernel 6.18): a socket with
    /// EPOLLIN, a pipe with EPOLLIN|EPOLLPRI, a socket with EPOLLOUT|EPOLLET
    /// (EPOLLERR and EPOLLHUP are always added).
    const EPOLL_FDINFO: &str = "pos:\t0\nflags:\t02000002\nmnt_id:\t17\nino:\t1038\n\
        tfd:        5 events: 8000001c data:                5  pos:0 ino:7c76 sdev:9\n\
        tfd:        6 events:       1b data:                6  pos:0 ino:7c77 sdev:f\n\
        tfd:        4 events:       19 data:                4  pos:0 ino:7c75 sdev:9\n";

    #[test]
    fn parses_epoll_fdinfo() {
        assert_eq!(
            parse_epoll_tfds(EPOLL_FDINFO),
            [(5, 0x8000_001c), (6, 0x1b), (4, 0x19)]
        );
        assert_eq!(
            epoll_items(EPOLL_FDINFO).map(|i| i.ino).collect::<Vec<_>>(),
            [Some(0x7c76), Some(0x7c77), Some(0x7c75)]
        );
        // Older kernels: no pos/ino/sdev.
        assert_eq!(
            epoll_items("tfd:        9 events:       19 data: 7f0000000009\n").collect::<Vec<_>>(),
            [EpollItem {
                tfd: 9,
                events: 0x19,
                ino: None
            }]
        );
        // Huge values: the largest fd and events, a 64-bit ino; one past
        // them is junk and skipped.
        assert_eq!(
            epoll_items(
                "tfd: 2147483647 events: ffffffff data: ffffffffffffffff pos:0 ino:ffffffffffffffff sdev:0\n\
                 tfd: 2147483648 events: 19\n\
                 tfd: 3 events: 100000000\n"
            )
            .collect::<Vec<_>>(),
            [EpollItem {
                tfd: i32::MAX,
                events: u32::MAX,
                ino: Some(u64::MAX)
            }]
        );
        for junk in [
            "",
            "\n\n",
            "tfd:",
            "tfd: x events: 19",
            "tfd: -1 events: 19",
            "tfd: 5",
            "tfd: 5 events:",
            "tfd: 5 events: zz",
            "tfd5 events: 19",
            " eventfd-count: 0",
            "\u{0}\u{ffff}",
            "events: 19 tfd: 5",
        ] {
            assert_eq!(parse_epoll_tfds(junk), [], "{junk:?}");
        }
        // A bad ino is dropped, the item kept; junk lines between items too.
        assert_eq!(
            epoll_items("tfd: 7 events: 1 ino:zz\ngarbage\ntfd: 8 events: 2\n")
                .map(|i| (i.tfd, i.events, i.ino))
                .collect::<Vec<_>>(),
            [(7, 1, None), (8, 2, None)]
        );
    }

    #[test]
    fn decodes_pollfd_arrays() {
        let mut bytes = Vec::new();
        for (fd, events, revents) in [(5i32, 1i16, 0i16), (-1, 1, 0), (7, 4, 0), (9, 0x43, 1)] {
            bytes.extend(fd.to_le_bytes());
            bytes.extend(events.to_le_bytes());
            bytes.extend(revents.to_le_bytes());
        }
        assert_eq!(
            decode_pollfds(&bytes).collect::<Vec<_>>(),
            [(5, 1), (7, 4), (9, 0x43)]
        );
        // Read interest: POLLIN, POLLPRI, POLLRDNORM, POLLRDBAND; not POLLOUT.
        let read: Vec<i32> = decode_pollfds(&bytes)
            .filter(|(_, e)| e & POLL_READ != 0)
            .map(|(fd, _)| fd)
            .collect();
        assert_eq!(read, [5, 9]);
        // A trailing partial entry and empty input.
        assert_eq!(decode_pollfds(&bytes[..11]).count(), 1);
        assert_eq!(decode_pollfds(&[]).count(), 0);
        // Extremes.
        let mut big = i32::MAX.to_le_bytes().to_vec();
        big.extend(i16::MIN.to_le_bytes());
        big.extend([0xff, 0xff]);
        assert_eq!(
            decode_pollfds(&big).collect::<Vec<_>>(),
            [(i32::MAX, i16::MIN)]
        );
    }

    #[test]
    fn decodes_fd_set_bitmaps() {
        let mut set = [0u8; 128];
        for fd in [0usize, 3, 8, 63, 64, 1023] {
            set[fd / 8] |= 1 << (fd % 8);
        }
        assert_eq!(
            decode_fd_set(&set, 1024).collect::<Vec<_>>(),
            [0, 3, 8, 63, 64, 1023]
        );
        // Only fds below nfds count.
        assert_eq!(decode_fd_set(&set, 64).collect::<Vec<_>>(), [0, 3, 8, 63]);
        assert_eq!(decode_fd_set(&set, 0).count(), 0);
        // nfds past the bytes read: bits beyond count as clear, no panic.
        assert_eq!(
            decode_fd_set(&set[..1], 100_000).collect::<Vec<_>>(),
            [0, 3]
        );
        assert_eq!(decode_fd_set(&[], usize::MAX).count(), 0);
    }
}
