//! What one pass of the kernel's task iterator (`iter/task`) said of the
//! threads of the processes asked for, as plain types, and the parser of
//! its output ([`parse_task_records`]). Loading, linking and reading the
//! iterator is the I/O edge (`selfheal::ebpf::iter`).

use selfheal_common::{
    ITER_SOCK_RECORD_SIZE, ITER_TASK_RECORD_SIZE, IterSockRecord, IterTaskRecord,
};

/// Nanoseconds per clock tick as procfs counts CPU time (`USER_HZ`, 100 on
/// every Linux architecture selfheal runs on).
const NS_PER_TICK: u64 = 10_000_000;

/// What one pass read of one process: its threads, in the order the
/// kernel walks them, and `(fd, inode)` of every socket it holds, sorted.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IterProcess {
    pub threads: Vec<IterThread>,
    pub sockets: Vec<(i32, u64)>,
}

/// One thread, as the task iterator read it from its `task_struct`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IterThread {
    /// Thread-group id (the pid).
    pub tgid: u32,
    /// Thread id.
    pub tid: u32,
    /// `task_struct.__state`, raw (`TASK_*` bits).
    pub state: u32,
    /// `task_struct.exit_state`, raw (`EXIT_ZOMBIE`, `EXIT_DEAD` or 0).
    pub exit_state: u32,
    /// CPU time, ns (`se.sum_exec_runtime`: the total procfs splits into
    /// utime and stime, each rounded down to ticks).
    pub runtime_ns: u64,
    /// The syscall the thread is in, from its saved user registers; `None`
    /// outside a syscall. Meaningful only for a thread that is not
    /// running (procfs says `running` rather than read a running thread's
    /// registers).
    pub syscall: Option<u64>,
    /// The syscall's first two arguments: the fd of a `read` or
    /// `recvfrom`; a poll set's address and length.
    pub arg0: u64,
    pub arg1: u64,
    /// `se.exec_start`: when the thread last ran, on the task clock of
    /// `cpu`, ns. CPUs' clocks differ (by seconds on some machines): this
    /// is no age until it is set against that CPU's clock.
    pub exec_start_ns: u64,
    /// The CPU it last ran on.
    pub cpu: u32,
    /// Its name (`comm`), as procfs's `stat` shows it (lossy UTF-8).
    pub comm: String,
}

impl IterThread {
    /// The state letter `/proc/PID/task/TID/stat` shows for this thread,
    /// as the kernel's `task_state_index` derives it (Linux 6.x bits).
    pub fn state_letter(&self) -> char {
        state_letter(self.state, self.exit_state)
    }

    /// CPU time in clock ticks, as procfs's utime + stime count it (which
    /// may be one tick less: procfs rounds each half down).
    pub fn cpu_ticks(&self) -> u64 {
        self.runtime_ns / NS_PER_TICK
    }

    /// `se.exec_start` in milliseconds, as `/proc/…/sched` prints it.
    pub fn exec_start_ms(&self) -> f64 {
        self.exec_start_ns as f64 / 1e6
    }
}

impl From<IterTaskRecord> for IterThread {
    fn from(r: IterTaskRecord) -> Self {
        let name = r.comm.split(|&b| b == 0).next().unwrap_or_default();
        Self {
            tgid: r.tgid,
            tid: r.tid,
            state: r.state,
            exit_state: r.exit_state,
            runtime_ns: r.runtime_ns,
            syscall: (r.syscall != u64::MAX).then_some(r.syscall),
            arg0: r.arg0,
            arg1: r.arg1,
            exec_start_ns: r.exec_start_ns,
            cpu: r.cpu,
            comm: String::from_utf8_lossy(name).into_owned(),
        }
    }
}

/// Why an iterator's output could not be parsed.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum IterParseError {
    /// The output is not a whole number of records: a short read, or a
    /// program and a reader that disagree on the record.
    #[error("iterator output of {len} bytes is not a whole number of {record}-byte records")]
    Truncated { len: usize, record: usize },
}

/// The threads in the task iterator's output: [`IterTaskRecord`]s back to
/// back, in native byte order. Fields are read byte-wise, so the buffer
/// needs no alignment.
pub fn parse_task_records(bytes: &[u8]) -> Result<Vec<IterThread>, IterParseError> {
    Ok(records(bytes, ITER_TASK_RECORD_SIZE)?
        .map(|c| {
            let mut f = Fields(c);
            let (tgid, tid, state, exit_state) = (f.u32(), f.u32(), f.u32(), f.u32());
            let (runtime_ns, syscall, arg0, arg1, exec_start_ns) =
                (f.u64(), f.u64(), f.u64(), f.u64(), f.u64());
            let (cpu, pad) = (f.u32(), f.u32());
            IterThread::from(IterTaskRecord {
                tgid,
                tid,
                state,
                exit_state,
                runtime_ns,
                syscall,
                arg0,
                arg1,
                exec_start_ns,
                cpu,
                pad,
                comm: f.bytes(),
            })
        })
        .collect())
}

/// The sockets in the file iterator's output: [`IterSockRecord`]s back to
/// back, in native byte order.
pub fn parse_sock_records(bytes: &[u8]) -> Result<Vec<IterSockRecord>, IterParseError> {
    Ok(records(bytes, ITER_SOCK_RECORD_SIZE)?
        .map(|c| {
            let mut f = Fields(c);
            IterSockRecord {
                tgid: f.u32(),
                fd: f.u32(),
                inode: f.u64(),
            }
        })
        .collect())
}

/// `bytes` cut into records of `size` bytes.
fn records(bytes: &[u8], size: usize) -> Result<std::slice::ChunksExact<'_, u8>, IterParseError> {
    if !bytes.len().is_multiple_of(size) {
        return Err(IterParseError::Truncated {
            len: bytes.len(),
            record: size,
        });
    }
    Ok(bytes.chunks_exact(size))
}

/// Reads a record's fields in order, byte-wise (no alignment needed). Only
/// given whole records, whose size the record types' assertions fix.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        b.copy_from_slice(&self.0[..N]);
        self.0 = &self.0[N..];
        b
    }
    fn u32(&mut self) -> u32 {
        u32::from_ne_bytes(self.bytes())
    }
    fn u64(&mut self) -> u64 {
        u64::from_ne_bytes(self.bytes())
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
        for v in [r.runtime_ns, r.syscall, r.arg0, r.arg1, r.exec_start_ns] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        for v in [r.cpu, r.pad] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        b.extend_from_slice(&r.comm);
        b
    }

    fn comm(name: &[u8]) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[..name.len()].copy_from_slice(name);
        c
    }

    #[test]
    fn records_are_parsed_field_by_field() {
        let a = IterTaskRecord {
            tgid: 7,
            tid: 9,
            state: 1,
            exit_state: 0,
            runtime_ns: 123_456_789,
            syscall: 45,
            arg0: 3,
            arg1: 4096,
            exec_start_ns: 5_000_123_456,
            cpu: 1,
            pad: 0,
            comm: comm(b"agent"),
        };
        let b = IterTaskRecord {
            tid: 10,
            syscall: u64::MAX,
            comm: comm(b"0123456789abcde"),
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
                    runtime_ns: 123_456_789,
                    syscall: Some(45),
                    arg0: 3,
                    arg1: 4096,
                    exec_start_ns: 5_000_123_456,
                    cpu: 1,
                    comm: "agent".into(),
                },
                IterThread {
                    tid: 10,
                    syscall: None,
                    comm: "0123456789abcde".into(),
                    ..threads[0].clone()
                },
            ]
        );
        assert_eq!(threads[0].cpu_ticks(), 12);
        assert_eq!(threads[0].exec_start_ms(), 5_000.123456);
        // Unaligned input parses the same.
        let mut shifted = vec![0u8];
        shifted.extend(&out);
        assert_eq!(parse_task_records(&shifted[1..]).unwrap(), threads);
    }

    #[test]
    fn a_name_is_lossy_utf8_up_to_its_nul() {
        let mut raw = comm(b"ab\xffc");
        raw[15] = b'z'; // after the NUL: not part of the name
        let rec = IterTaskRecord {
            comm: raw,
            ..IterTaskRecord::default()
        };
        assert_eq!(IterThread::from(rec).comm, "ab\u{fffd}c");
        let full = IterTaskRecord {
            comm: *b"0123456789abcdef",
            ..IterTaskRecord::default()
        };
        assert_eq!(IterThread::from(full).comm, "0123456789abcdef");
    }

    #[test]
    fn socket_records_are_parsed() {
        let mut out = Vec::new();
        for (tgid, fd, inode) in [(7u32, 3u32, 99u64), (7, 12, 1 << 40)] {
            out.extend_from_slice(&tgid.to_ne_bytes());
            out.extend_from_slice(&fd.to_ne_bytes());
            out.extend_from_slice(&inode.to_ne_bytes());
        }
        assert_eq!(
            parse_sock_records(&out).unwrap(),
            vec![
                IterSockRecord {
                    tgid: 7,
                    fd: 3,
                    inode: 99
                },
                IterSockRecord {
                    tgid: 7,
                    fd: 12,
                    inode: 1 << 40
                },
            ]
        );
        assert_eq!(
            parse_sock_records(&out[..17]),
            Err(IterParseError::Truncated {
                len: 17,
                record: ITER_SOCK_RECORD_SIZE
            })
        );
    }

    #[test]
    fn short_or_odd_output_is_an_error() {
        assert_eq!(parse_task_records(&[]), Ok(Vec::new()));
        for len in [1, 79, 81, 159] {
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
