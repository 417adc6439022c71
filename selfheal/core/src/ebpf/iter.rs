//! What one pass of the kernel's task iterators (`iter/task`,
//! `iter/task_file`) said of the threads and sockets of the processes
//! asked for, as plain types, and the parsers of their output
//! ([`parse_task_records`], [`parse_sock_records`]); a TCP socket's record
//! as sock_diag would report it ([`tcp_socket`]). Loading, linking and
//! reading the iterators is the I/O edge (`selfheal::ebpf::iter`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use selfheal_common::{
    ITER_SOCK_MAGIC, ITER_SOCK_RECORD_SIZE, ITER_TASK_RECORD_SIZE, IterSockRecord, IterTaskRecord,
    SOCK_NO_TCP_LAYOUT, SOCK_TCP, TASK_HEAD,
};

use crate::{
    model::TcpState,
    sockdiag::{TcpInfo, TcpSocket},
};

/// Nanoseconds per clock tick as procfs counts CPU time (`USER_HZ`, 100 on
/// every Linux architecture selfheal runs on).
const NS_PER_TICK: u64 = 10_000_000;

/// What one pass read of one process: its threads, in the order the
/// kernel walks them, `(fd, inode)` of every socket it holds, sorted, and
/// its TCP connections as sock_diag would report them.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IterProcess {
    pub threads: Vec<IterThread>,
    pub sockets: Vec<(i32, u64)>,
    /// Absent from an older helper's answer: then unread, and sock_diag
    /// reads them.
    #[serde(default)]
    pub tcp: TcpPass,
}

/// The TCP connections one pass read of a process, or why it read none.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TcpPass {
    /// Each connection once (a socket two fds name is one), by inode.
    Read(Vec<IterTcp>),
    /// Why not: sock_diag reads them instead.
    Unread(String),
}

impl Default for TcpPass {
    fn default() -> Self {
        TcpPass::Unread("the pass carries no TCP fields (a helper of an older version)".into())
    }
}

/// A TCP connection a pass read, and the network namespace it lives in.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IterTcp {
    /// The inode number of its network namespace (`net.ns.inum`: what
    /// `/proc/PID/ns/net` names as `net:[N]`).
    pub netns: u32,
    pub socket: TcpSocket,
}

/// The TCP states sock_diag is asked for (`selfheal::sys::sockdiag`'s
/// dump): all but LISTEN, TIME_WAIT and CLOSE.
fn dumped_state(state: TcpState) -> bool {
    !matches!(
        state,
        TcpState::Listen | TcpState::TimeWait | TcpState::Close
    )
}

/// Milliseconds in `j` jiffies at `hz` jiffies a second, as the kernel's
/// `jiffies_to_msecs` rounds (down) and truncates them to 32 bits.
pub fn jiffies_to_ms(j: u32, hz: u32) -> u32 {
    (u64::from(j) * 1_000)
        .checked_div(u64::from(hz))
        .unwrap_or(0) as u32
}

/// Microseconds in `j` jiffies (`jiffies_to_usecs`).
pub fn jiffies_to_us(j: u32, hz: u32) -> u32 {
    (u64::from(j) * 1_000_000)
        .checked_div(u64::from(hz))
        .unwrap_or(0) as u32
}

/// What sock_diag would report of the TCP socket `rec` read, with the
/// kernel ticking `hz` jiffies a second; `None` for a record of another
/// kind of socket, or of a state sock_diag is not asked for.
///
/// Derived as the kernel derives its answer: `tcp_get_info`'s ages are
/// `jiffies_to_msecs(tcp_jiffies32 - stamp)` (wrapping 32-bit), with
/// `tcp_jiffies32` read right after the stamps; `rto` is
/// `jiffies_to_usecs(icsk_rto)`, `rtt` is `srtt_us >> 3`; and
/// `tcp_diag_get_info`'s queues are `max(rcv_nxt - copied_seq, 0)` and
/// `write_seq - snd_una`. An IPv6 socket keeps its IPv6 addresses, a
/// v4-mapped one included (`::ffff:a.b.c.d`), as sock_diag's `AF_INET6`
/// dump reports it. The timer sock_diag adds is not read (`timer` is
/// `None`): the judge does not use it.
pub fn tcp_socket(rec: &IterSockRecord, hz: u32) -> Option<IterTcp> {
    if rec.flags & SOCK_TCP == 0 || hz == 0 {
        return None;
    }
    let state = TcpState::from_kernel(rec.state);
    if !dumped_state(state) {
        return None;
    }
    let (local, remote) = match rec.family {
        2 => {
            let ip = |a: &[u8; 16]| IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3]));
            (ip(&rec.local_addr), ip(&rec.remote_addr))
        }
        10 => (
            IpAddr::V6(Ipv6Addr::from(rec.local_addr)),
            IpAddr::V6(Ipv6Addr::from(rec.remote_addr)),
        ),
        _ => return None,
    };
    let age = |stamp: u32| jiffies_to_ms(rec.now_jiffies.wrapping_sub(stamp), hz);
    let recv_queue = (rec.rcv_nxt.wrapping_sub(rec.copied_seq) as i32).max(0) as u32;
    Some(IterTcp {
        netns: rec.netns,
        socket: TcpSocket {
            inode: rec.inode,
            cookie: rec.cookie,
            local: SocketAddr::new(local, rec.local_port),
            remote: SocketAddr::new(remote, u16::from_be(rec.remote_port_be)),
            state,
            uid: rec.uid,
            recv_queue,
            send_queue: rec.write_seq.wrapping_sub(rec.snd_una),
            timer: None,
            tcp_info: Some(TcpInfo {
                rtt_us: rec.srtt_us >> 3,
                rto_us: jiffies_to_us(rec.rto_jiffies, hz),
                unacked: rec.packets_out,
                retransmits: rec.retransmits,
                backoff: rec.backoff,
                probes: rec.probes,
                last_data_recv_ms: age(rec.lrcvtime),
                last_data_sent_ms: age(rec.lsndtime),
                last_ack_recv_ms: age(rec.rcv_tstamp),
                bytes_received: rec.bytes_received,
                bytes_acked: rec.bytes_acked,
                data_segs_in: rec.data_segs_in,
                data_segs_out: rec.data_segs_out,
            }),
        },
    })
}

/// The TCP connections of a pass's socket records: each once, sorted by
/// inode; or why they cannot stand for sock_diag's: the program was
/// loaded without the TCP fields, or a connection has no cookie yet
/// (nothing asked for one: sock_diag's dump gives it one, and the judge's
/// history knows connections by cookie).
pub fn tcp_pass(records: &[IterSockRecord], hz: u32) -> TcpPass {
    let out = match tcp_connections(records, hz) {
        Ok(out) => out,
        Err(why) => return TcpPass::Unread(why),
    };
    let uncookied = out.iter().filter(|t| t.socket.cookie == 0).count();
    if uncookied > 0 {
        return TcpPass::Unread(format!(
            "{uncookied} connection(s) have no socket cookie yet (sock_diag gives them one)"
        ));
    }
    TcpPass::Read(out)
}

/// The TCP connections of a pass's socket records, each once, sorted by
/// inode, cookie or none (a socket nothing asked a cookie of has 0); or
/// why the records cannot say: the program was loaded without the TCP
/// fields, or the tick rate is unknown.
pub fn tcp_connections(records: &[IterSockRecord], hz: u32) -> Result<Vec<IterTcp>, String> {
    if records.iter().any(|r| r.flags & SOCK_NO_TCP_LAYOUT != 0) {
        return Err(
            "the task iterator was loaded without the TCP fields (this kernel's BTF lacks one)"
                .into(),
        );
    }
    if hz == 0 {
        return Err("the kernel's tick rate (HZ) is unknown".into());
    }
    let mut out: Vec<IterTcp> = records.iter().filter_map(|r| tcp_socket(r, hz)).collect();
    out.sort_unstable_by_key(|t| t.socket.inode);
    out.dedup_by_key(|t| t.socket.inode);
    Ok(out)
}

/// One pass of the iterators over the whole host (no process named), cut
/// by process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPass {
    /// Each process the pass met, by pid (the thread-group id): its
    /// threads in the kernel's order and `(fd, inode)` of its sockets,
    /// sorted, each once.
    pub processes: std::collections::BTreeMap<u32, HostProcess>,
    /// Every TCP connection the pass read, once, by inode (with no cookie
    /// where nothing asked the kernel for one); or why none were read.
    pub tcp: Result<std::collections::BTreeMap<u64, IterTcp>, String>,
}

/// What a host pass read of one process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostProcess {
    pub threads: Vec<IterThread>,
    pub sockets: Vec<(i32, u64)>,
}

impl HostPass {
    /// The pass cut by process: `threads` and `records` as the two
    /// iterators wrote them over the host, the kernel ticking `hz` jiffies
    /// a second. A process that holds no socket has none listed; one whose
    /// threads the task walk missed (it started between the walks) has
    /// its sockets alone.
    pub fn of(threads: Vec<IterThread>, records: &[IterSockRecord], hz: u32) -> HostPass {
        let mut processes: std::collections::BTreeMap<u32, HostProcess> =
            std::collections::BTreeMap::new();
        for t in threads {
            processes.entry(t.tgid).or_default().threads.push(t);
        }
        for r in records {
            processes
                .entry(r.tgid)
                .or_default()
                .sockets
                .push((r.fd as i32, r.inode));
        }
        for p in processes.values_mut() {
            one_per_fd(&mut p.sockets);
        }
        let tcp = tcp_connections(records, hz)
            .map(|all| all.into_iter().map(|t| (t.socket.inode, t)).collect());
        HostPass { processes, tcp }
    }
}

/// `(fd, inode)` pairs a walk found, sorted, each once: Linux 6.1's
/// task_file iterator may yield a file of a process more than once (it
/// revisits a file table its threads share), so one entry per fd (and one
/// connection per socket: [`tcp_connections`]).
pub fn one_per_fd(fds: &mut Vec<(i32, u64)>) {
    fds.sort_unstable();
    fds.dedup();
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
    /// Of a process's leader, what procfs's `stat` and `status` say of the
    /// process, where the pass read it. Not sent by the helper: a check
    /// reading through it reads them from procfs.
    #[serde(skip)]
    pub head: Option<IterHead>,
}

/// What the process's `stat` (parent, start time) and `status` (real
/// uid, `NSpid`) say of it, as the task iterator read it from the
/// process's leader: the kernel's own numbers, which are procfs's for a
/// reader in the initial user, pid and time namespaces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IterHead {
    pub ppid: u32,
    pub ruid: u32,
    /// `stat`'s `starttime`: clock ticks since boot.
    pub start_ticks: u64,
    /// Whether it is pid 1 of a pid namespace below the initial one
    /// (`NSpid:` lists more than one pid and the last is 1).
    pub pid_ns_init: bool,
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
        // A nested pid namespace's own pid that could not be read (0)
        // leaves the head unread, not a guess.
        let head =
            (r.flags & TASK_HEAD != 0 && (r.pid_level == 0 || r.ns_pid != 0)).then_some(IterHead {
                ppid: r.ppid,
                ruid: r.ruid,
                start_ticks: r.start_ns / NS_PER_TICK,
                pid_ns_init: r.pid_level > 0 && r.ns_pid == 1,
            });
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
            head,
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
    /// A record without this build's mark: the program is another
    /// build's (a pin this build did not make).
    #[error(
        "the file iterator wrote a record of another build (mark {found:#x}, not {ITER_SOCK_MAGIC:#x})"
    )]
    Foreign { found: u32 },
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
            let (cpu, flags) = (f.u32(), f.u32());
            let comm = f.bytes();
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
                flags,
                comm,
                ppid: f.u32(),
                ruid: f.u32(),
                start_ns: f.u64(),
                pid_level: f.u32(),
                ns_pid: f.u32(),
            })
        })
        .collect())
}

/// The sockets in the file iterator's output: [`IterSockRecord`]s back to
/// back, in native byte order, each with this build's mark.
pub fn parse_sock_records(bytes: &[u8]) -> Result<Vec<IterSockRecord>, IterParseError> {
    let out: Vec<IterSockRecord> = records(bytes, ITER_SOCK_RECORD_SIZE)?
        .map(|c| {
            let mut f = Fields(c);
            IterSockRecord {
                tgid: f.u32(),
                fd: f.u32(),
                inode: f.u64(),
                flags: f.u32(),
                family: f.u16(),
                state: f.u8(),
                retransmits: f.u8(),
                backoff: f.u8(),
                probes: f.u8(),
                local_port: f.u16(),
                remote_port_be: f.u16(),
                pad: f.u16(),
                local_addr: f.bytes(),
                remote_addr: f.bytes(),
                cookie: f.u64(),
                netns: f.u32(),
                uid: f.u32(),
                now_jiffies: f.u32(),
                lsndtime: f.u32(),
                lrcvtime: f.u32(),
                rcv_tstamp: f.u32(),
                rto_jiffies: f.u32(),
                srtt_us: f.u32(),
                packets_out: f.u32(),
                rcv_nxt: f.u32(),
                copied_seq: f.u32(),
                write_seq: f.u32(),
                snd_una: f.u32(),
                data_segs_in: f.u32(),
                data_segs_out: f.u32(),
                magic: f.u32(),
                bytes_received: f.u64(),
                bytes_acked: f.u64(),
            }
        })
        .collect();
    match out.iter().find(|r| r.magic != ITER_SOCK_MAGIC) {
        Some(r) => Err(IterParseError::Foreign { found: r.magic }),
        None => Ok(out),
    }
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
    fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_ne_bytes(self.bytes())
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
        for v in [r.cpu, r.flags] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        b.extend_from_slice(&r.comm);
        for v in [r.ppid, r.ruid] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        b.extend_from_slice(&r.start_ns.to_ne_bytes());
        for v in [r.pid_level, r.ns_pid] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
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
            flags: TASK_HEAD,
            comm: comm(b"agent"),
            ppid: 3,
            ruid: 1000,
            start_ns: 51_700_000_123,
            pid_level: 1,
            ns_pid: 1,
        };
        let b = IterTaskRecord {
            tid: 10,
            syscall: u64::MAX,
            comm: comm(b"0123456789abcde"),
            flags: 0,
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
                    head: Some(IterHead {
                        ppid: 3,
                        ruid: 1000,
                        start_ticks: 5170,
                        pid_ns_init: true,
                    }),
                },
                IterThread {
                    tid: 10,
                    syscall: None,
                    comm: "0123456789abcde".into(),
                    head: None,
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

    /// A leader's head: unread without the flag, or where its pid in a
    /// nested pid namespace could not be read; `pid_ns_init` only for pid 1
    /// of a nested namespace; the start time in whole ticks, as `stat`.
    #[test]
    fn a_head_is_read_only_where_the_pass_read_it_whole() {
        let leader = IterTaskRecord {
            tgid: 40,
            tid: 40,
            flags: TASK_HEAD,
            ppid: 1,
            ruid: 0,
            start_ns: 9_999_999,
            ..IterTaskRecord::default()
        };
        let head = |r: IterTaskRecord| IterThread::from(r).head;
        assert_eq!(
            head(leader),
            Some(IterHead {
                ppid: 1,
                ruid: 0,
                start_ticks: 0,
                pid_ns_init: false,
            })
        );
        assert_eq!(head(IterTaskRecord { flags: 0, ..leader }), None);
        let nested = IterTaskRecord {
            pid_level: 2,
            ..leader
        };
        assert_eq!(head(nested), None, "its own pid unread");
        for (ns_pid, init) in [(1, true), (7, false)] {
            let h = head(IterTaskRecord { ns_pid, ..nested }).expect("read");
            assert_eq!(h.pid_ns_init, init, "{ns_pid}");
        }
        let h = head(IterTaskRecord {
            ns_pid: 1,
            ..leader
        });
        assert!(
            !h.expect("read").pid_ns_init,
            "pid 1 of the initial namespace"
        );
    }

    /// A record's bytes as the program writes them (`#[repr(C)]`, no
    /// padding: its fields back to back).
    fn sock_bytes(r: &IterSockRecord) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&r.tgid.to_ne_bytes());
        b.extend_from_slice(&r.fd.to_ne_bytes());
        b.extend_from_slice(&r.inode.to_ne_bytes());
        b.extend_from_slice(&r.flags.to_ne_bytes());
        b.extend_from_slice(&r.family.to_ne_bytes());
        b.extend_from_slice(&[r.state, r.retransmits, r.backoff, r.probes]);
        for v in [r.local_port, r.remote_port_be, r.pad] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        b.extend_from_slice(&r.local_addr);
        b.extend_from_slice(&r.remote_addr);
        b.extend_from_slice(&r.cookie.to_ne_bytes());
        for v in [
            r.netns,
            r.uid,
            r.now_jiffies,
            r.lsndtime,
            r.lrcvtime,
            r.rcv_tstamp,
            r.rto_jiffies,
            r.srtt_us,
            r.packets_out,
            r.rcv_nxt,
            r.copied_seq,
            r.write_seq,
            r.snd_una,
            r.data_segs_in,
            r.data_segs_out,
            r.magic,
        ] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        b.extend_from_slice(&r.bytes_received.to_ne_bytes());
        b.extend_from_slice(&r.bytes_acked.to_ne_bytes());
        assert_eq!(b.len(), ITER_SOCK_RECORD_SIZE);
        b
    }

    fn tcp_record() -> IterSockRecord {
        let mut r = IterSockRecord {
            tgid: 7,
            fd: 3,
            inode: 99,
            magic: ITER_SOCK_MAGIC,
            flags: SOCK_TCP,
            family: 2,
            state: 1,
            retransmits: 2,
            backoff: 3,
            probes: 4,
            local_port: 40_000,
            remote_port_be: 443u16.to_be(),
            cookie: 0x1234,
            netns: 4_026_531_840,
            uid: 1000,
            now_jiffies: 5,
            lsndtime: u32::MAX - 4, // 10 jiffies ago, across the wrap
            lrcvtime: 5,
            rcv_tstamp: 1,
            rto_jiffies: 51,
            srtt_us: 8 * 1_250,
            packets_out: 6,
            rcv_nxt: 10,
            copied_seq: 4,
            write_seq: 3,
            snd_una: u32::MAX, // 4 unacknowledged bytes, across the wrap
            data_segs_in: 11,
            data_segs_out: 12,
            bytes_received: 1 << 33,
            bytes_acked: 77,
            ..IterSockRecord::default()
        };
        r.local_addr[..4].copy_from_slice(&[10, 0, 0, 1]);
        r.remote_addr[..4].copy_from_slice(&[192, 0, 2, 7]);
        r
    }

    #[test]
    fn socket_records_are_parsed_field_by_field() {
        let a = tcp_record();
        let b = IterSockRecord {
            tgid: 7,
            fd: 12,
            inode: 1 << 40,
            magic: ITER_SOCK_MAGIC,
            ..IterSockRecord::default()
        };
        let mut out = sock_bytes(&a);
        out.extend(sock_bytes(&b));
        assert_eq!(parse_sock_records(&out).unwrap(), vec![a, b]);
        // Unaligned input parses the same.
        let mut shifted = vec![0u8];
        shifted.extend(&out);
        assert_eq!(parse_sock_records(&shifted[1..]).unwrap(), vec![a, b]);
        // Another build's records (16 bytes each, before the TCP fields):
        // 19 of them fill two records of this size, and are refused.
        let old: Vec<u8> = (0..19u64)
            .flat_map(|i| {
                [7u32.to_ne_bytes(), (3 + i as u32).to_ne_bytes()]
                    .concat()
                    .into_iter()
                    .chain((99 + i).to_ne_bytes())
            })
            .collect();
        assert_eq!(old.len(), 2 * ITER_SOCK_RECORD_SIZE);
        assert!(matches!(
            parse_sock_records(&old),
            Err(IterParseError::Foreign { .. })
        ));
        assert_eq!(
            parse_sock_records(&out[..17]),
            Err(IterParseError::Truncated {
                len: 17,
                record: ITER_SOCK_RECORD_SIZE
            })
        );
    }

    #[test]
    fn a_tcp_record_reads_as_sock_diag_reports_it() {
        let t = tcp_socket(&tcp_record(), 250).unwrap();
        assert_eq!(t.netns, 4_026_531_840);
        let s = t.socket;
        assert_eq!(s.local, "10.0.0.1:40000".parse().unwrap());
        assert_eq!(s.remote, "192.0.2.7:443".parse().unwrap());
        assert_eq!((s.inode, s.cookie, s.uid), (99, 0x1234, 1000));
        assert_eq!(s.state, TcpState::Established);
        assert_eq!((s.recv_queue, s.send_queue), (6, 4));
        assert_eq!(
            s.tcp_info.unwrap(),
            TcpInfo {
                rtt_us: 1_250,
                rto_us: 204_000,
                unacked: 6,
                retransmits: 2,
                backoff: 3,
                probes: 4,
                last_data_recv_ms: 0,
                last_data_sent_ms: 40,
                last_ack_recv_ms: 16,
                bytes_received: 1 << 33,
                bytes_acked: 77,
                data_segs_in: 11,
                data_segs_out: 12,
            }
        );
        // The kernel's tick rates: 100, 250, 300 and 1000 a second.
        for (hz, ms, us) in [(100, 100, 510_000), (300, 33, 170_000), (1000, 10, 51_000)] {
            let i = tcp_socket(&tcp_record(), hz)
                .unwrap()
                .socket
                .tcp_info
                .unwrap();
            assert_eq!((i.last_data_sent_ms, i.rto_us), (ms, us), "{hz}");
        }
        // Copied past what arrived (a read racing the pass): no queue.
        let r = IterSockRecord {
            copied_seq: 11,
            ..tcp_record()
        };
        assert_eq!(tcp_socket(&r, 250).unwrap().socket.recv_queue, 0);
    }

    #[test]
    fn ipv6_and_v4_mapped_addresses_stay_ipv6() {
        let mut r = IterSockRecord {
            family: 10,
            ..tcp_record()
        };
        r.local_addr = "::ffff:10.0.0.1".parse::<Ipv6Addr>().unwrap().octets();
        r.remote_addr = "2001:db8::7".parse::<Ipv6Addr>().unwrap().octets();
        let s = tcp_socket(&r, 250).unwrap().socket;
        assert_eq!(s.local, "[::ffff:10.0.0.1]:40000".parse().unwrap());
        assert_eq!(s.remote, "[2001:db8::7]:443".parse().unwrap());
    }

    #[test]
    fn what_sock_diag_would_not_report_is_no_connection() {
        // Not TCP (a unix socket, a UDP one, an O_PATH file of a socket's
        // path: the program sets no SOCK_TCP), another family, a listener,
        // a closed socket, no tick rate.
        for r in [
            IterSockRecord {
                flags: 0,
                ..tcp_record()
            },
            IterSockRecord {
                family: 1,
                ..tcp_record()
            },
            IterSockRecord {
                state: 10,
                ..tcp_record()
            },
            IterSockRecord {
                state: 7,
                ..tcp_record()
            },
        ] {
            assert_eq!(tcp_socket(&r, 250), None, "{r:?}");
        }
        assert_eq!(tcp_socket(&tcp_record(), 0), None);
        assert_eq!(jiffies_to_ms(u32::MAX, 0), 0);
    }

    #[test]
    fn a_pass_is_whole_or_says_why_not() {
        let a = tcp_record();
        let b = IterSockRecord {
            inode: 98,
            fd: 4,
            ..tcp_record()
        };
        // Two fds on one socket: one connection; sorted by inode.
        let again = IterSockRecord { fd: 5, ..a };
        let unix = IterSockRecord {
            flags: 0,
            inode: 5,
            ..a
        };
        match tcp_pass(&[a, again, unix, b], 250) {
            TcpPass::Read(t) => {
                let inodes: Vec<u64> = t.iter().map(|t| t.socket.inode).collect();
                assert_eq!(inodes, [98, 99]);
            }
            other => panic!("{other:?}"),
        }
        let fresh = IterSockRecord { cookie: 0, ..b };
        assert!(
            matches!(tcp_pass(&[a, fresh], 250), TcpPass::Unread(why) if why.contains("1 connection(s) have no socket cookie")),
        );
        let no_layout = IterSockRecord {
            flags: SOCK_NO_TCP_LAYOUT,
            ..IterSockRecord::default()
        };
        assert!(
            matches!(tcp_pass(&[no_layout], 250), TcpPass::Unread(why) if why.contains("without the TCP fields")),
        );
        assert!(matches!(tcp_pass(&[a], 0), TcpPass::Unread(_)));
        // An older helper's pass, without the field, reads as unread.
        let old: IterProcess =
            serde_json::from_str(r#"{"threads":[],"sockets":[[3,99]]}"#).unwrap();
        assert!(matches!(old.tcp, TcpPass::Unread(_)));
    }

    #[test]
    fn a_host_pass_is_cut_by_process_and_keeps_uncookied_connections() {
        let thread = |tgid: u32, tid: u32| IterThread {
            tgid,
            tid,
            state: 1,
            exit_state: 0,
            runtime_ns: 0,
            syscall: None,
            arg0: 0,
            arg1: 0,
            exec_start_ns: 0,
            cpu: 0,
            comm: "t".into(),
            head: None,
        };
        let a = IterSockRecord {
            cookie: 0,
            ..tcp_record()
        };
        // Process 7's file table walked twice (Linux 6.1), its second fd on
        // the same socket; process 9 holds a unix socket; process 11 began
        // between the walks: its sockets, no threads.
        let again = IterSockRecord { fd: 5, ..a };
        let unix = IterSockRecord {
            tgid: 9,
            flags: 0,
            inode: 5,
            ..a
        };
        let late = IterSockRecord {
            tgid: 11,
            inode: 100,
            ..tcp_record()
        };
        let pass = HostPass::of(
            vec![thread(7, 7), thread(7, 8), thread(9, 9)],
            &[a, again, a, unix, late],
            250,
        );
        let p: Vec<String> = pass
            .processes
            .iter()
            .map(|(pid, p)| format!("{pid}: {} {:?}", p.threads.len(), p.sockets))
            .collect();
        assert_eq!(
            p,
            [
                "7: 2 [(3, 99), (5, 99)]",
                "9: 1 [(3, 5)]",
                "11: 0 [(3, 100)]",
            ]
        );
        // The census needs no cookie: the connection without one is read.
        let tcp = pass.tcp.unwrap();
        assert_eq!(tcp.keys().copied().collect::<Vec<_>>(), [99, 100]);
        assert_eq!(tcp[&99].socket.cookie, 0);
        let no_layout = IterSockRecord {
            flags: SOCK_NO_TCP_LAYOUT,
            ..IterSockRecord::default()
        };
        assert!(HostPass::of(Vec::new(), &[no_layout], 250).tcp.is_err());
        assert!(HostPass::of(Vec::new(), &[a], 0).tcp.is_err());
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
