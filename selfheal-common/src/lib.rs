//! Map layouts shared by the eBPF programs (`selfheal-ebpf`) and the loader
//! (`selfheal::ebpf`). `#![no_std]`, `#[repr(C)]`, no padding surprises: every
//! struct is laid out so that both sides agree byte for byte.
//!
//! Times are `bpf_ktime_get_boot_ns()`, i.e. `CLOCK_BOOTTIME` in nanoseconds:
//! monotonic, counts suspend, immune to wall-clock jumps.
#![no_std]

/// Size of the pid filter (`WATCHED`), a bitmap over every possible pid:
/// `u64` words for pids below 2^22, the kernel's largest `pid_max`. An array
/// lookup is inlined by the verifier, which keeps the cost for unwatched
/// processes to a few instructions.
pub const WATCHED_WORDS: u32 = (1 << 22) / 64;
/// Capacity of `IN_RECV`: threads of watched processes inside a receive.
pub const MAX_IN_RECV: u32 = 16384;
/// Capacity of `SOCKS`: sockets of watched processes seen receiving or sending.
pub const MAX_SOCKS: u32 = 16384;
/// Capacity of `IN_SEND` (kprobe strategy only: send entry stash).
pub const MAX_IN_SEND: u32 = 16384;
/// Capacity of `OWNER_SOCKS`: owners whose watched processes hold `SOCKS`
/// entries.
pub const MAX_OWNERS: u32 = 4096;
/// Capacity of `OWNER_OF`: watched thread-group ids with the owner user
/// space gave them. User space refuses a watch beyond it.
pub const MAX_OWNED: u32 = 65536;

/// `flags` bit: the receive was non-blocking (`MSG_DONTWAIT`, set by the kernel
/// for `O_NONBLOCK` files too), so it cannot wait for data.
pub const RECV_NONBLOCKING: u32 = 1 << 0;
/// `flags` bit: the entry hook knew the socket (`inode` is valid); otherwise
/// only `fd` is known (syscall-tracepoint strategy).
pub const RECV_HAS_INODE: u32 = 1 << 1;

/// Linux `MSG_DONTWAIT`.
pub const MSG_DONTWAIT: u32 = 0x40;
/// Linux `EAGAIN` (== `EWOULDBLOCK`).
pub const EAGAIN: i64 = 11;
/// Linux `IPPROTO_TCP`.
pub const IPPROTO_TCP: u16 = 6;

/// Value of `IN_RECV`, keyed by tid: a thread of a watched process that is
/// inside a receive right now.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InRecv {
    /// When the receive began (`CLOCK_BOOTTIME` ns).
    pub since_ns: u64,
    /// Socket inode, valid when `flags & RECV_HAS_INODE`.
    pub inode: u64,
    /// Thread-group id (the pid).
    pub tgid: u32,
    /// File descriptor, or -1 where the entry hook does not see it.
    pub fd: i32,
    /// `RECV_*` bits.
    pub flags: u32,
    /// Syscall number (syscall-tracepoint strategy) or 0.
    pub syscall: u32,
}

/// Value of `SOCKS`, keyed by socket inode: receive and send activity of one
/// socket of a watched process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockActivity {
    /// Last receive that returned data (`CLOCK_BOOTTIME` ns), 0 if none.
    pub last_recv_ns: u64,
    /// Bytes that receive returned.
    pub last_recv_bytes: u64,
    /// Last send that returned a byte count (`CLOCK_BOOTTIME` ns), 0 if none.
    pub last_send_ns: u64,
    /// Bytes that send returned.
    pub last_send_bytes: u64,
    /// Receives that returned data.
    pub recv_data: u64,
    /// Receives that returned nothing: 0 (end of stream) or `EAGAIN`.
    pub recv_empty: u64,
    /// Receives that failed with another error.
    pub recv_error: u64,
    /// Sends that returned a byte count.
    pub sends: u64,
    /// Sum of bytes received.
    pub bytes_received: u64,
    /// Sum of bytes sent.
    pub bytes_sent: u64,
    /// Thread-group id that last touched the socket.
    pub tgid: u32,
    /// Whom the entry counts against (`OWNER_SOCKS`): the owner user space
    /// gave the adding thread's process in `OWNER_OF` (the uid that owns
    /// its uid: itself, its user namespace's maker, or its subordinate
    /// range's user), or the thread's real uid when it has none there.
    pub owner: u32,
}

/// Value of `OWNER_SOCKS`, keyed by owner: that owner's use of `SOCKS`.
///
/// `SOCKS` is shared by every owner whose processes are watched; without a
/// share, one owner's processes that open thousands of sockets would leave
/// no room for anyone else's. An owner is a person, not a kernel uid: the
/// uids of a user's namespaces and subordinate ranges are one owner, so
/// that many uids cannot take many shares. The kernel side refuses a new
/// entry to an owner that holds `SOCKS_SHARE` of them already; user space
/// recounts `socks` from the map on every snapshot (the kernel's
/// increments are plain adds) and sets the share from how many owners are
/// watched.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwnerShare {
    /// `SOCKS` entries this owner holds.
    pub socks: u64,
    /// Socket events not recorded because this owner was at its share.
    pub over_share: u64,
}

/// One record of the `iter/task` program, written with `bpf_seq_write` for
/// every thread of the process the iterator's link names: what procfs's
/// `task/TID/stat`, `task/TID/syscall` and `task/TID/sched` say of it, and
/// for the process's leader what its `stat` and `status` say of the
/// process ([`TASK_HEAD`]), read in one pass.
///
/// Values are the kernel's raw fields, unconverted: `state` is
/// `task_struct.__state` (the letter procfs shows also depends on
/// `exit_state`), `runtime_ns` the thread's `se.sum_exec_runtime` (the
/// total procfs splits into utime and stime), and `exec_start_ns` the task
/// clock of `cpu`, which is not comparable with another CPU's clock or with
/// `CLOCK_BOOTTIME`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IterTaskRecord {
    /// Thread-group id (the pid).
    pub tgid: u32,
    /// Thread id.
    pub tid: u32,
    /// `task_struct.__state`: 0 running, 1 interruptible sleep, 2
    /// uninterruptible, … (`TASK_*` of `include/linux/sched.h`).
    pub state: u32,
    /// `task_struct.exit_state`: `EXIT_ZOMBIE` (0x20), `EXIT_DEAD` (0x10) or 0.
    pub exit_state: u32,
    /// `task_struct.se.sum_exec_runtime`: CPU time, nanoseconds.
    pub runtime_ns: u64,
    /// The syscall number saved in the thread's user registers
    /// (`orig_ax`), `u64::MAX` (-1) outside a syscall. Only meaningful for
    /// a thread that is not running: a running thread's registers change
    /// under the read.
    pub syscall: u64,
    /// The syscall's first two arguments (`di`, `si`): the fd of a `read`
    /// or `recvfrom`; a poll set's address and length.
    pub arg0: u64,
    pub arg1: u64,
    /// `task_struct.se.exec_start`: when the thread last ran, on the task
    /// clock of `cpu` (ns).
    pub exec_start_ns: u64,
    /// The CPU the thread last ran on (`task_cpu()`).
    pub cpu: u32,
    /// [`TASK_HEAD`] where the fields below were read (the thread leads
    /// its process and the loader found their offsets); 0 otherwise, and
    /// they are zero.
    pub flags: u32,
    /// `task_struct.comm`, NUL-padded.
    pub comm: [u8; 16],
    /// The process's parent: `real_parent->tgid`.
    pub ppid: u32,
    /// Its real uid: `real_cred->uid`, the kernel's (initial user
    /// namespace's) number.
    pub ruid: u32,
    /// When it started: `start_boottime`, ns since boot.
    pub start_ns: u64,
    /// The depth of its pid namespace (`thread_pid->level`: 0 in the
    /// initial one).
    pub pid_level: u32,
    /// Its pid in its own pid namespace (`thread_pid->numbers[level].nr`);
    /// 0 where that could not be read.
    pub ns_pid: u32,
}

/// [`IterTaskRecord::flags`]: the thread is its process's leader and the
/// record carries what procfs's `stat` and `status` say of the process
/// (`ppid` … `ns_pid`).
pub const TASK_HEAD: u32 = 1;

/// Size of one [`IterTaskRecord`] in the iterator's output.
pub const ITER_TASK_RECORD_SIZE: usize = 104;
const _: () = assert!(core::mem::size_of::<IterTaskRecord>() == ITER_TASK_RECORD_SIZE);

/// One record of the `iter/task_file` program: a socket the process holds,
/// and, for a TCP socket of an IPv4 or IPv6 family (`flags &
/// SOCK_TCP`), what sock_diag would report of it, read from the socket
/// itself in the same pass, whatever its network namespace.
///
/// Values are the kernel's raw fields: times in jiffies
/// (`tcp_jiffies32`, the low 32 bits of `jiffies`) with the pass's
/// `now_jiffies` beside them, so user space derives `tcp_info`'s ages as
/// the kernel's `tcp_get_info` does (`jiffies_to_msecs(now - stamp)`);
/// `rto_jiffies` is `icsk_rto`; the queues' sequence numbers as
/// `tcp_diag_get_info` subtracts them. Zero where not `SOCK_TCP`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IterSockRecord {
    /// Thread-group id (the pid).
    pub tgid: u32,
    /// The fd.
    pub fd: u32,
    /// The socket's inode number (what `/proc/PID/fd/N` names as
    /// `socket:[inode]`).
    pub inode: u64,
    /// `SOCK_*` bits.
    pub flags: u32,
    /// `skc_family` (`AF_INET` 2, `AF_INET6` 10).
    pub family: u16,
    /// `skc_state` (`TCP_ESTABLISHED` 1 … of `include/net/tcp_states.h`).
    pub state: u8,
    /// `icsk_retransmits`, `icsk_backoff`, `icsk_probes_out`.
    pub retransmits: u8,
    pub backoff: u8,
    pub probes: u8,
    /// `skc_num`: the local port, host order.
    pub local_port: u16,
    /// `skc_dport`: the remote port, network order.
    pub remote_port_be: u16,
    pub pad: u16,
    /// The local and remote addresses, network order: the first 4 bytes
    /// for `AF_INET`, all 16 for `AF_INET6` (v4-mapped included).
    pub local_addr: [u8; 16],
    pub remote_addr: [u8; 16],
    /// `skc_cookie`: 0 until something asked for it (sock_diag, `SO_COOKIE`).
    pub cookie: u64,
    /// The inode number of the socket's network namespace (`net.ns.inum`).
    pub netns: u32,
    /// `sk_uid`.
    pub uid: u32,
    /// `tcp_jiffies32` when the record was written.
    pub now_jiffies: u32,
    /// `lsndtime`, `icsk_ack.lrcvtime`, `rcv_tstamp` (jiffies).
    pub lsndtime: u32,
    pub lrcvtime: u32,
    pub rcv_tstamp: u32,
    /// `icsk_rto` (jiffies), `srtt_us` (µs, ×8), `packets_out`.
    pub rto_jiffies: u32,
    pub srtt_us: u32,
    pub packets_out: u32,
    /// `rcv_nxt`, `copied_seq`, `write_seq`, `snd_una`.
    pub rcv_nxt: u32,
    pub copied_seq: u32,
    pub write_seq: u32,
    pub snd_una: u32,
    /// `data_segs_in`, `data_segs_out`.
    pub data_segs_in: u32,
    pub data_segs_out: u32,
    /// [`ITER_SOCK_MAGIC`]: what tells this build's records from another
    /// build's program's output of a size that happens to divide alike.
    pub magic: u32,
    /// `bytes_received`, `bytes_acked`.
    pub bytes_received: u64,
    pub bytes_acked: u64,
}

/// `IterSockRecord::flags` bit: the socket is a TCP socket of an IPv4 or
/// IPv6 family, and its fields were read.
pub const SOCK_TCP: u32 = 1 << 0;
/// `IterSockRecord::flags` bit: the program was loaded without the TCP
/// fields (this kernel's BTF lacks one): only `fd` and `inode` are set.
pub const SOCK_NO_TCP_LAYOUT: u32 = 1 << 1;

/// [`IterSockRecord::magic`] of this record layout.
pub const ITER_SOCK_MAGIC: u32 = 0x5348_5331;

/// Size of one [`IterSockRecord`] in the iterator's output.
pub const ITER_SOCK_RECORD_SIZE: usize = 152;

/// The most bytes of a `tcp_sock` the file iterator reads onto its stack
/// at once (one window), and the most windows: where the fields it reads
/// fit that many, each window is one `bpf_probe_read_kernel`, not one a
/// field.
pub const TCP_WINDOW: usize = 192;
pub const TCP_WINDOWS: usize = 4;
const _: () = assert!(core::mem::size_of::<IterSockRecord>() == ITER_SOCK_RECORD_SIZE);

/// Indexes of the `COUNTERS` array: events the programs could not record.
pub mod counter {
    /// `IN_RECV` was full: a receive went unrecorded.
    pub const IN_RECV_FULL: u32 = 0;
    /// `SOCKS` was full: a socket's activity went unrecorded.
    pub const SOCKS_FULL: u32 = 1;
    /// A kernel pointer could not be read (socket identity unknown).
    pub const READ_FAILED: u32 = 2;
    /// `IN_SEND` was full (kprobe strategy).
    pub const IN_SEND_FULL: u32 = 3;
    /// `OWNER_SOCKS` was full: an entry was added without a share to count
    /// it against.
    pub const OWNERS_FULL: u32 = 4;
    /// Number of counters.
    pub const LEN: u32 = 5;
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: both are `#[repr(C)]`, made only of integers, with no implicit
    // padding (checked by the size assertions below), so every bit pattern is
    // a valid value.
    unsafe impl aya::Pod for super::InRecv {}
    unsafe impl aya::Pod for super::SockActivity {}
    unsafe impl aya::Pod for super::OwnerShare {}

    const _: () = assert!(core::mem::size_of::<super::InRecv>() == 32);
    const _: () = assert!(core::mem::size_of::<super::SockActivity>() == 88);
    const _: () = assert!(core::mem::size_of::<super::OwnerShare>() == 16);
}
