//! What one pass of the kernel's task iterator (`iter/task`) said of the
//! threads of the processes asked for, as plain types, and the parser of
//! its output ([`parse_task_records`]). Loading, linking and reading the
//! iterator is the I/O edge (`selfheal::ebpf::iter`).

use selfheal_common::{ITER_TASK_RECORD_SIZE, IterTaskRecord};

/// One thread, as the task iterator read it from its `task_struct`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IterThread {
    /// Thread-group id (the pid).
    pub tgid: u32,
    /// Thread id.
    pub tid: u32,
    /// `task_struct.__state`, raw (`TASK_*` bits).
    pub state: u32,
    /// `task_struct.exit_state`, raw (`EXIT_ZOMBIE`, `EXIT_DEAD` or 0).
    pub exit_state: u32,
    /// User plus system CPU time, ns (`utime + stime`, unscaled: procfs
    /// scales them by the thread's runtime, so its ticks may differ a
    /// little).
    pub cpu_ns: u64,
    /// The syscall the thread is in, from its saved user registers; `None`
    /// outside a syscall. Meaningful only for a thread that is not
    /// running (procfs says `running` rather than read a running thread's
    /// registers).
    pub syscall: Option<u64>,
    /// The syscall's first argument: the fd of a `read` or `recvfrom`.
    pub arg0: u64,
    /// `sched_info.last_arrival`: when the thread last began to run, on the
    /// run-queue clock of the CPU it ran on, raw. CPUs' clocks differ (by
    /// seconds on some machines) and none is `CLOCK_BOOTTIME`, so this is
    /// no age: it may only be compared with another stamp of the same CPU.
    /// 0 where the kernel keeps no sched_info.
    pub last_arrival_ns: u64,
}

impl IterThread {
    /// The state letter `/proc/PID/task/TID/stat` shows for this thread,
    /// as the kernel's `task_state_index` derives it (Linux 6.x bits).
    pub fn state_letter(&self) -> char {
        state_letter(self.state, self.exit_state)
    }
}

impl From<IterTaskRecord> for IterThread {
    fn from(r: IterTaskRecord) -> Self {
        Self {
            tgid: r.tgid,
            tid: r.tid,
            state: r.state,
            exit_state: r.exit_state,
            cpu_ns: r.cpu_ns,
            syscall: (r.syscall != u64::MAX).then_some(r.syscall),
            arg0: r.arg0,
            last_arrival_ns: r.last_arrival_ns,
        }
    }
}

/// Why the iterator's output could not be parsed.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum IterParseError {
    /// The output is not a whole number of records: a short read, or a
    /// program and a reader that disagree on the record.
    #[error("task iterator output of {len} bytes is not a whole number of {record}-byte records")]
    Truncated { len: usize, record: usize },
}

/// The threads in the task iterator's output: [`IterTaskRecord`]s back to
/// back, in native byte order. Fields are read byte-wise, so the buffer
/// needs no alignment.
pub fn parse_task_records(bytes: &[u8]) -> Result<Vec<IterThread>, IterParseError> {
    if !bytes.len().is_multiple_of(ITER_TASK_RECORD_SIZE) {
        return Err(IterParseError::Truncated {
            len: bytes.len(),
            record: ITER_TASK_RECORD_SIZE,
        });
    }
    Ok(bytes
        .chunks_exact(ITER_TASK_RECORD_SIZE)
        .map(|c| IterThread::from(record(c)))
        .collect())
}

/// One record from exactly [`ITER_TASK_RECORD_SIZE`] bytes.
fn record(c: &[u8]) -> IterTaskRecord {
    let u32_at = |at: usize| u32::from_ne_bytes([c[at], c[at + 1], c[at + 2], c[at + 3]]);
    let u64_at = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&c[at..at + 8]);
        u64::from_ne_bytes(b)
    };
    IterTaskRecord {
        tgid: u32_at(0),
        tid: u32_at(4),
        state: u32_at(8),
        exit_state: u32_at(12),
        cpu_ns: u64_at(16),
        syscall: u64_at(24),
        arg0: u64_at(32),
        last_arrival_ns: u64_at(40),
    }
}

/// The kernel's `TASK_REPORT`: the state bits procfs reports.
const TASK_REPORT: u32 = 0x7f;
/// `TASK_IDLE` (`TASK_UNINTERRUPTIBLE | TASK_NOLOAD`), shown as `I`.
const TASK_IDLE: u32 = 0x402;
/// `TASK_RTLOCK_WAIT` and `TASK_FROZEN`, shown as `D`.
const TASK_RTLOCK_WAIT: u32 = 0x1000;
const TASK_FROZEN: u32 = 0x8000;

/// The procfs state letter of `__state` and `exit_state`: the kernel's
/// `task_state_array[__task_state_index(state, exit_state)]`.
pub fn state_letter(state: u32, exit_state: u32) -> char {
    const LETTERS: [char; 9] = ['R', 'S', 'D', 'T', 't', 'X', 'Z', 'P', 'I'];
    let mut report = (state | exit_state) & TASK_REPORT;
    if state & TASK_IDLE == TASK_IDLE {
        report = TASK_REPORT + 1;
    }
    if state & (TASK_RTLOCK_WAIT | TASK_FROZEN) != 0 {
        report = 2;
    }
    // fls: one past the highest bit set, 0 for none.
    let index = (u32::BITS - report.leading_zeros()) as usize;
    LETTERS.get(index).copied().unwrap_or('?')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(r: &IterTaskRecord) -> Vec<u8> {
        let mut b = Vec::new();
        for v in [r.tgid, r.tid, r.state, r.exit_state] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        for v in [r.cpu_ns, r.syscall, r.arg0, r.last_arrival_ns] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        b
    }

    #[test]
    fn records_are_parsed_field_by_field() {
        let a = IterTaskRecord {
            tgid: 7,
            tid: 9,
            state: 1,
            exit_state: 0,
            cpu_ns: 123_456,
            syscall: 45,
            arg0: 3,
            last_arrival_ns: 99,
        };
        let b = IterTaskRecord {
            tid: 10,
            syscall: u64::MAX,
            ..a
        };
        let mut out = bytes(&a);
        out.extend(bytes(&b));
        assert_eq!(out.len(), 2 * ITER_TASK_RECORD_SIZE);
        let threads = parse_task_records(&out).unwrap();
        assert_eq!(
            threads,
            vec![
                IterThread {
                    tgid: 7,
                    tid: 9,
                    state: 1,
                    exit_state: 0,
                    cpu_ns: 123_456,
                    syscall: Some(45),
                    arg0: 3,
                    last_arrival_ns: 99,
                },
                IterThread {
                    tid: 10,
                    syscall: None,
                    ..threads[0]
                },
            ]
        );
        // Unaligned input parses the same.
        let mut shifted = vec![0u8];
        shifted.extend(&out);
        assert_eq!(parse_task_records(&shifted[1..]).unwrap(), threads);
    }

    #[test]
    fn short_or_odd_output_is_an_error() {
        assert_eq!(parse_task_records(&[]), Ok(Vec::new()));
        for len in [1, 47, 49, 95] {
            assert_eq!(
                parse_task_records(&vec![0u8; len]),
                Err(IterParseError::Truncated {
                    len,
                    record: ITER_TASK_RECORD_SIZE
                }),
                "{len}"
            );
        }
    }

    #[test]
    fn state_letters_follow_the_kernels_index() {
        for (state, exit, letter) in [
            (0, 0, 'R'),
            (1, 0, 'S'),
            (2, 0, 'D'),
            (4, 0, 'T'),
            (8, 0, 't'),
            (0, 0x10, 'X'),
            (0, 0x20, 'Z'),
            (0x40, 0, 'P'),
            (0x402, 0, 'I'),
            (0x1000, 0, 'D'),
            (0x8000 | 1, 0, 'D'),
            (0x100 | 1, 0, 'S'),
        ] {
            assert_eq!(state_letter(state, exit), letter, "{state:#x} {exit:#x}");
        }
    }
}
