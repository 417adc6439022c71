//! selfheal's eBPF receive tracer: which threads of watched processes are
//! inside a TCP receive right now (and since when), and per socket the time
//! and size of the last receive and send.
//!
//! Four attach strategies share the same maps and helpers; user space
//! (`selfheal::ebpf`) loads and attaches exactly one of them:
//!
//! | strategy   | receive entry              | receive exit / accounting     | send          |
//! |------------|----------------------------|-------------------------------|---------------|
//! | kprobe     | kprobe `tcp_recvmsg`       | kretprobe `tcp_recvmsg`       | k(ret)probe `tcp_sendmsg` |
//! | fentry     | fentry `tcp_recvmsg`       | fexit `tcp_recvmsg`           | fexit `tcp_sendmsg` |
//! | tp_btf     | tp_btf `sched_switch` (fd) | tp_btf `sock_recv_length`     | tp_btf `sock_send_length` |
//! | tracepoint | syscall tracepoints (fd)   | tracepoint `sock:sock_recv_length` | tracepoint `sock:sock_send_length` |
//!
//! Every program first looks the current tgid up in `WATCHED` (a bitmap) and
//! returns at once for other processes: that lookup is the whole cost for
//! the rest of the host.
//!
//! The tp_btf strategy has no receive-entry tracepoint to hook. Rather than
//! the syscall tracepoints (which put every syscall of every process on the
//! slow path), it notes a receive when a watched thread goes to sleep inside
//! one (`sched_switch`, reading the syscall and its fd from the thread's
//! saved registers), and clears it when the receive returns
//! (`sock_recv_length`). A receive that never sleeps never blocked.
//!
//! Beside the tracer, two programs that hook nothing: the task iterators,
//! run by user space when it reads an iterator's file, each linked to one
//! process. `iter/task` writes one `IterTaskRecord` for every thread of it
//! (state, CPU time, name, the syscall and arguments saved in its
//! registers, when and on which CPU it last ran); `iter/task_file` one
//! `IterSockRecord` for every socket it holds: a process's evidence in one
//! in-kernel pass, without procfs.
//!
//! Rust eBPF has no CO-RE field relocations, so the few struct offsets needed
//! (sock → socket → inode number, sock → protocol, the task_struct fields
//! the iterator reads) are read from the running kernel's BTF by the loader
//! and passed in as read-only globals. aya freezes `.rodata`, so the
//! verifier sees each offset as a constant: the iterators load fields
//! directly through the pointers it knows the type of (checking each
//! access against that type's BTF), instead of a `bpf_probe_read_kernel`
//! call per field. The `tcp_sock` fields behind a socket's `struct sock`
//! (a type the verifier does not know the pointer to be) are read a
//! window at a time onto the stack: the loader finds windows that hold
//! them all (`TCP_WINDOW_START`, `TCP_WINDOW_LEN`), one helper call each.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{seq_file, task_struct},
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_uid_gid, bpf_jiffies64, bpf_ktime_get_boot_ns,
        bpf_probe_read_kernel, bpf_seq_write, bpf_sock_from_file, bpf_task_pt_regs,
    },
    macros::{btf_tracepoint, fentry, fexit, kprobe, kretprobe, map, tracepoint},
    maps::{Array, HashMap},
    programs::{
        BtfTracePointContext, FEntryContext, FExitContext, ProbeContext, RetProbeContext,
        TracePointContext,
    },
};
use selfheal_common::{
    EAGAIN, IPPROTO_TCP, ITER_SOCK_MAGIC, ITER_SOCK_RECORD_SIZE, InRecv, IterSockRecord,
    IterTaskRecord, MAX_IN_RECV, MAX_IN_SEND, MAX_OWNED, MAX_OWNERS, MAX_SOCKS, MSG_DONTWAIT,
    OwnerShare, RECV_HAS_INODE, RECV_NONBLOCKING, SOCK_NO_TCP_LAYOUT, SOCK_TCP, SockActivity,
    TASK_HEAD, TCP_WINDOW, TCP_WINDOWS, WATCHED_WORDS, counter,
};

// ---- configuration, written by the loader before load ----------------------

/// `offsetof(struct sock, sk_socket)`.
#[unsafe(no_mangle)]
static OFF_SK_SOCKET: u64 = 0;
/// Offset from a `struct socket *` to its inode's `i_ino`
/// (`struct socket_alloc { struct socket socket; struct inode vfs_inode; }`).
#[unsafe(no_mangle)]
static OFF_SOCKET_INO: u64 = 0;
/// `offsetof(struct sock, sk_protocol)` (a plain `u16` since Linux 5.6).
#[unsafe(no_mangle)]
static OFF_SK_PROTOCOL: u64 = 0;
/// Index of `flags` among `tcp_recvmsg`'s parameters.
#[unsafe(no_mangle)]
static RECVMSG_FLAGS_ARG: u64 = 3;
/// Index of `nonblock` among `tcp_recvmsg`'s parameters (before 5.19), or
/// `u64::MAX` when the kernel folds it into `flags`.
#[unsafe(no_mangle)]
static RECVMSG_NONBLOCK_ARG: u64 = u64::MAX;
/// `offsetof(struct pt_regs, orig_ax)`: the syscall number.
#[unsafe(no_mangle)]
static OFF_REGS_SYSCALL: u64 = 120;
/// `offsetof(struct pt_regs, di)`: the syscall's first argument.
#[unsafe(no_mangle)]
static OFF_REGS_ARG0: u64 = 112;

/// `offsetof(struct task_struct, tgid)`.
#[unsafe(no_mangle)]
static OFF_TASK_TGID: u64 = 0;
/// `offsetof(struct task_struct, pid)`: the thread id.
#[unsafe(no_mangle)]
static OFF_TASK_PID: u64 = 0;
/// `offsetof(struct task_struct, __state)` (`state` before 5.14).
#[unsafe(no_mangle)]
static OFF_TASK_STATE: u64 = 0;
/// `offsetof(struct task_struct, exit_state)`.
#[unsafe(no_mangle)]
static OFF_TASK_EXIT_STATE: u64 = 0;
/// `offsetof(struct task_struct, se.sum_exec_runtime)`.
#[unsafe(no_mangle)]
static OFF_TASK_RUNTIME: u64 = 0;
/// `offsetof(struct task_struct, se.exec_start)`.
#[unsafe(no_mangle)]
static OFF_TASK_EXEC_START: u64 = 0;
/// Where `task_cpu()` reads: `thread_info.cpu` (or `cpu`).
#[unsafe(no_mangle)]
static OFF_TASK_CPU: u64 = 0;
/// `offsetof(struct task_struct, comm)`.
#[unsafe(no_mangle)]
static OFF_TASK_COMM: u64 = 0;
/// 1 when the `OFF_HEAD_*` offsets below are set: the task iterator then
/// reads, for each process's leader, what its `stat` and `status` say of
/// the process (`TASK_HEAD`).
#[unsafe(no_mangle)]
static HEAD_ON: u64 = 0;
/// `offsetof(struct task_struct, real_parent)`.
#[unsafe(no_mangle)]
static OFF_HEAD_REAL_PARENT: u64 = 0;
/// `offsetof(struct task_struct, real_cred)`.
#[unsafe(no_mangle)]
static OFF_HEAD_REAL_CRED: u64 = 0;
/// `offsetof(struct cred, uid)`.
#[unsafe(no_mangle)]
static OFF_HEAD_CRED_UID: u64 = 0;
/// `offsetof(struct task_struct, start_boottime)`.
#[unsafe(no_mangle)]
static OFF_HEAD_START: u64 = 0;
/// `offsetof(struct task_struct, thread_pid)`.
#[unsafe(no_mangle)]
static OFF_HEAD_THREAD_PID: u64 = 0;
/// `offsetof(struct pid, level)`.
#[unsafe(no_mangle)]
static OFF_HEAD_PID_LEVEL: u64 = 0;
/// `offsetof(struct pid, numbers) + offsetof(struct upid, nr)`.
#[unsafe(no_mangle)]
static OFF_HEAD_PID_NR: u64 = 0;
/// `sizeof(struct upid)`.
#[unsafe(no_mangle)]
static HEAD_UPID_SIZE: u64 = 0;
/// `offsetof(struct pt_regs, si)`: the second syscall argument (x86_64).
#[unsafe(no_mangle)]
static OFF_REGS_ARG1: u64 = 104;
/// `offsetof(struct file, f_inode)`.
#[unsafe(no_mangle)]
static OFF_FILE_INODE: u64 = 0;
/// `offsetof(struct inode, i_mode)`.
#[unsafe(no_mangle)]
static OFF_INODE_MODE: u64 = 0;
/// `offsetof(struct inode, i_ino)`.
#[unsafe(no_mangle)]
static OFF_INODE_INO: u64 = 0;

/// 1 when the `OFF_TCP_*` offsets below are set (the kernel's BTF has
/// every field): the file iterator then reads TCP sockets' fields.
#[unsafe(no_mangle)]
static TCP_ON: u64 = 0;
/// Where the loader found every `OFF_TCP_*` field behind the `struct
/// sock` in at most `TCP_WINDOWS` windows of at most `TCP_WINDOW` bytes,
/// each window's start (8-aligned) and length; a length of 0 ends them.
/// With none, each field is its own `bpf_probe_read_kernel`.
#[unsafe(no_mangle)]
static TCP_WINDOW_START: [u64; TCP_WINDOWS] = [0; TCP_WINDOWS];
#[unsafe(no_mangle)]
static TCP_WINDOW_LEN: [u64; TCP_WINDOWS] = [0; TCP_WINDOWS];
/// `offsetof(struct socket, sk)`.
#[unsafe(no_mangle)]
static OFF_SOCKET_SK: u64 = 0;
/// Offsets from a `struct sock *` (see `selfheal::ebpf::layout::TcpLayout`).
#[unsafe(no_mangle)]
static OFF_TCP_FAMILY: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_STATE: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_NUM: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_DPORT: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_RCV_SADDR: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_DADDR: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_V6_RCV_SADDR: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_V6_DADDR: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_COOKIE: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_NET: u64 = 0;
/// `offsetof(struct net, ns.inum)`.
#[unsafe(no_mangle)]
static OFF_NET_INUM: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_TYPE: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_PROTOCOL: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_UID: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_RTO: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_RETRANSMITS: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_BACKOFF: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_PROBES: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_LRCVTIME: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_LSNDTIME: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_RCV_TSTAMP: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_SRTT: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_PACKETS_OUT: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_RCV_NXT: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_COPIED_SEQ: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_WRITE_SEQ: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_SND_UNA: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_BYTES_RECEIVED: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_BYTES_ACKED: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_SEGS_IN: u64 = 0;
#[unsafe(no_mangle)]
static OFF_TCP_SEGS_OUT: u64 = 0;

#[inline(always)]
fn config(v: &'static u64) -> u64 {
    // SAFETY: reading a static; volatile so the loader's value is used
    // instead of the compile-time one.
    unsafe { core::ptr::read_volatile(v) }
}

// ---- maps -----------------------------------------------------------------

/// The pid filter: bit `tgid % 64` of word `tgid / 64` is set for every
/// thread-group id user space watches.
#[map]
static WATCHED: Array<u64> = Array::with_max_entries(WATCHED_WORDS, 0);

/// tid → the receive that thread is in now.
#[map]
static IN_RECV: HashMap<u32, InRecv> = HashMap::with_max_entries(MAX_IN_RECV, 0);

/// socket inode → its receive/send activity.
#[map]
static SOCKS: HashMap<u64, SockActivity> = HashMap::with_max_entries(MAX_SOCKS, 0);

/// `BPF_F_NO_PREALLOC`: entries are allocated when user space adds them.
const BPF_F_NO_PREALLOC: u32 = 1;

/// Watched tgid → its owner, the key of its share of `SOCKS`. Written by
/// user space only (on watch and unwatch), so it needs no preallocation.
#[map]
static OWNER_OF: HashMap<u32, u32> = HashMap::with_max_entries(MAX_OWNED, BPF_F_NO_PREALLOC);

/// Owner → how many `SOCKS` entries it holds, and what it lost at its share.
#[map]
static OWNER_SOCKS: HashMap<u32, OwnerShare> = HashMap::with_max_entries(MAX_OWNERS, 0);

/// Element 0: the most `SOCKS` entries one owner may hold (0: no limit).
/// User space sets it from how many owners are watched.
#[map]
static SOCKS_SHARE: Array<u64> = Array::with_max_entries(1, 0);

/// tid → socket inode of the `tcp_sendmsg` in progress (kprobe strategy).
#[map]
static IN_SEND: HashMap<u32, u64> = HashMap::with_max_entries(MAX_IN_SEND, 0);

/// Events that could not be recorded, indexed by `selfheal_common::counter`.
#[map]
static COUNTERS: Array<u64> = Array::with_max_entries(counter::LEN, 0);

// ---- helpers ----------------------------------------------------------------

/// `(tgid, tid)` of the current task if its process is watched.
#[inline(always)]
fn watched() -> Option<(u32, u32)> {
    let id = bpf_get_current_pid_tgid();
    let tgid = (id >> 32) as u32;
    let word = WATCHED.get(tgid >> 6).copied().unwrap_or(0);
    if word & (1 << (tgid & 63)) != 0 {
        Some((tgid, id as u32))
    } else {
        None
    }
}

#[inline(always)]
fn bump(index: u32) {
    if let Some(c) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: the pointer comes from the map and is valid for this program run.
        unsafe { *c += 1 };
    }
}

#[inline(always)]
fn now() -> u64 {
    // SAFETY: helper without preconditions.
    unsafe { bpf_ktime_get_boot_ns() }
}

/// Inode number of the socket that owns `sk`, or 0 when it cannot be read.
#[inline(always)]
fn sock_inode(sk: u64) -> u64 {
    if sk == 0 {
        return 0;
    }
    // SAFETY: bpf_probe_read_kernel checks the address; offsets come from BTF.
    let socket = match unsafe { bpf_probe_read_kernel((sk + config(&OFF_SK_SOCKET)) as *const u64) }
    {
        Ok(s) if s != 0 => s,
        _ => {
            bump(counter::READ_FAILED);
            return 0;
        }
    };
    // SAFETY: as above.
    match unsafe { bpf_probe_read_kernel((socket + config(&OFF_SOCKET_INO)) as *const u64) } {
        Ok(ino) => ino,
        Err(_) => {
            bump(counter::READ_FAILED);
            0
        }
    }
}

/// Whether `sk` is a TCP socket (for hooks that see every protocol).
#[inline(always)]
fn sock_is_tcp(sk: u64) -> bool {
    // SAFETY: bpf_probe_read_kernel checks the address; offset comes from BTF.
    matches!(
        unsafe { bpf_probe_read_kernel((sk + config(&OFF_SK_PROTOCOL)) as *const u16) },
        Ok(IPPROTO_TCP)
    )
}

#[inline(always)]
fn recv_begin(tgid: u32, tid: u32, entry_flags: u32, inode: u64, fd: i32, syscall: u32) {
    let rec = InRecv {
        since_ns: now(),
        inode,
        tgid,
        fd,
        flags: entry_flags,
        syscall,
    };
    if IN_RECV.insert(&tid, &rec, 0).is_err() {
        bump(counter::IN_RECV_FULL);
    }
}

/// Removes and returns the receive `tid` was in.
#[inline(always)]
fn recv_end(tid: u32) -> Option<InRecv> {
    // SAFETY: the value is copied out before the entry is removed.
    let rec = unsafe { IN_RECV.get(&tid) }.copied();
    if rec.is_some() {
        let _ = IN_RECV.remove(&tid);
    }
    rec
}

/// `BPF_NOEXIST`: insert only if the key is absent.
const BPF_NOEXIST: u64 = 1;

/// `owner`'s entry in `OWNER_SOCKS`, made if missing; `None` (counted) when
/// the map of owners is full, and the new socket then counts against no
/// share.
#[inline(always)]
fn owner_share(owner: u32) -> Option<*mut OwnerShare> {
    if let Some(u) = OWNER_SOCKS.get_ptr_mut(&owner) {
        return Some(u);
    }
    // BPF_NOEXIST: another CPU may have made it meanwhile; keep theirs.
    let _ = OWNER_SOCKS.insert(&owner, &OwnerShare::default(), BPF_NOEXIST);
    let u = OWNER_SOCKS.get_ptr_mut(&owner);
    if u.is_none() {
        bump(counter::OWNERS_FULL);
    }
    u
}

/// Whom `tgid`'s new entries count against: the owner user space gave it,
/// else the current thread's real uid.
#[inline(always)]
fn owner_of(tgid: u32) -> u32 {
    // SAFETY: a map value read by copy.
    match unsafe { OWNER_OF.get(&tgid) } {
        Some(o) => *o,
        None => bpf_get_current_uid_gid() as u32,
    }
}

#[inline(always)]
fn activity(tgid: u32, inode: u64) -> Option<&'static mut SockActivity> {
    if inode == 0 {
        return None;
    }
    if let Some(a) = SOCKS.get_ptr_mut(&inode) {
        // SAFETY: map value pointer, valid for this program run.
        return Some(unsafe { &mut *a });
    }
    // A new entry counts against its owner's share, so that one owner's
    // processes cannot fill the map for everyone.
    let owner = owner_of(tgid);
    let share = owner_share(owner);
    if let Some(u) = share {
        let cap = SOCKS_SHARE.get(0).copied().unwrap_or(0);
        // SAFETY: map value pointer, valid for this program run.
        let u = unsafe { &mut *u };
        if cap != 0 && u.socks >= cap {
            u.over_share += 1;
            return None;
        }
    }
    let fresh = SockActivity {
        tgid,
        owner,
        ..SockActivity::default()
    };
    if SOCKS.insert(&inode, &fresh, 0).is_err() {
        bump(counter::SOCKS_FULL);
        return None;
    }
    if let Some(u) = share {
        // SAFETY: as above. A plain add (another CPU's may be lost): user
        // space recounts from the map on every snapshot.
        unsafe { (*u).socks += 1 };
    }
    // SAFETY: as above.
    SOCKS.get_ptr_mut(&inode).map(|a| unsafe { &mut *a })
}

/// Accounts a finished receive on the socket with `inode`. Counters are
/// plain adds: two threads of one process receiving on the same socket at
/// the same instant may lose an increment, which the consumers tolerate.
#[inline(always)]
fn account_recv(tgid: u32, inode: u64, ret: i64) {
    let Some(a) = activity(tgid, inode) else {
        return;
    };
    a.tgid = tgid;
    if ret > 0 {
        a.last_recv_ns = now();
        a.last_recv_bytes = ret as u64;
        a.recv_data += 1;
        a.bytes_received += ret as u64;
    } else if ret == 0 || ret == -EAGAIN {
        a.recv_empty += 1;
    } else {
        a.recv_error += 1;
    }
}

#[inline(always)]
fn account_send(tgid: u32, inode: u64, ret: i64) {
    if ret <= 0 {
        return;
    }
    let Some(a) = activity(tgid, inode) else {
        return;
    };
    a.tgid = tgid;
    a.last_send_ns = now();
    a.last_send_bytes = ret as u64;
    a.sends += 1;
    a.bytes_sent += ret as u64;
}

/// `(flags, nonblock)` of a `tcp_recvmsg` call from its 4th and 5th
/// arguments: `(sk, msg, len, flags, addr_len)` since 5.19,
/// `(sk, msg, len, nonblock, flags, addr_len)` before.
#[inline(always)]
fn recvmsg_flags_nonblock(a3: u64, a4: u64) -> (u64, u64) {
    let pick = |i: u64| {
        if i == 3 {
            a3
        } else if i == 4 {
            a4
        } else {
            0
        }
    };
    (
        pick(config(&RECVMSG_FLAGS_ARG)),
        pick(config(&RECVMSG_NONBLOCK_ARG)),
    )
}

/// Records the start of `tcp_recvmsg(sk, …)` given its 4th and 5th arguments.
#[inline(always)]
fn tcp_recvmsg_entry(tgid: u32, tid: u32, sk: u64, a3: u64, a4: u64) {
    let (flags, nonblock) = recvmsg_flags_nonblock(a3, a4);
    recv_begin(
        tgid,
        tid,
        tcp_recvmsg_flags(flags, nonblock),
        sock_inode(sk),
        -1,
        0,
    );
}

/// Entry flags of a `tcp_recvmsg` call from its `flags` (and, before 5.19,
/// `nonblock`) argument.
#[inline(always)]
fn tcp_recvmsg_flags(flags: u64, nonblock: u64) -> u32 {
    let nb = flags as u32 & MSG_DONTWAIT != 0 || nonblock != 0;
    RECV_HAS_INODE | if nb { RECV_NONBLOCKING } else { 0 }
}

// ---- strategy "kprobe" -------------------------------------------------------

#[kprobe]
pub fn kprobe_tcp_recvmsg(ctx: ProbeContext) -> u32 {
    let Some((tgid, tid)) = watched() else {
        return 0;
    };
    // The verifier wants constant context offsets: read both candidate
    // registers, then pick by the kernel's signature.
    tcp_recvmsg_entry(
        tgid,
        tid,
        ctx.arg(0).unwrap_or(0),
        ctx.arg(3).unwrap_or(0),
        ctx.arg(4).unwrap_or(0),
    );
    0
}

#[kretprobe]
pub fn kretprobe_tcp_recvmsg(ctx: RetProbeContext) -> u32 {
    let Some((tgid, tid)) = watched() else {
        return 0;
    };
    let ret: i32 = ctx.ret();
    if let Some(rec) = recv_end(tid) {
        account_recv(tgid, rec.inode, i64::from(ret));
    }
    0
}

#[kprobe]
pub fn kprobe_tcp_sendmsg(ctx: ProbeContext) -> u32 {
    let Some((_, tid)) = watched() else { return 0 };
    let sk: u64 = ctx.arg(0).unwrap_or(0);
    if IN_SEND.insert(&tid, &sock_inode(sk), 0).is_err() {
        bump(counter::IN_SEND_FULL);
    }
    0
}

#[kretprobe]
pub fn kretprobe_tcp_sendmsg(ctx: RetProbeContext) -> u32 {
    let Some((tgid, tid)) = watched() else {
        return 0;
    };
    let ret: i32 = ctx.ret();
    // SAFETY: copied out before removal.
    if let Some(inode) = unsafe { IN_SEND.get(&tid) }.copied() {
        let _ = IN_SEND.remove(&tid);
        account_send(tgid, inode, i64::from(ret));
    }
    0
}

// ---- strategy "fentry" -------------------------------------------------------

#[fentry(function = "tcp_recvmsg")]
pub fn fentry_tcp_recvmsg(ctx: FEntryContext) -> i32 {
    let Some((tgid, tid)) = watched() else {
        return 0;
    };
    tcp_recvmsg_entry(tgid, tid, ctx.arg(0), ctx.arg(3), ctx.arg(4));
    0
}

#[fexit(function = "tcp_recvmsg")]
pub fn fexit_tcp_recvmsg(ctx: FExitContext) -> i32 {
    let Some((tgid, tid)) = watched() else {
        return 0;
    };
    let ret: i32 = ctx.ret().unwrap_or(0);
    let inode = match recv_end(tid) {
        Some(rec) => rec.inode,
        None => sock_inode(ctx.arg(0)),
    };
    account_recv(tgid, inode, i64::from(ret));
    0
}

#[fexit(function = "tcp_sendmsg")]
pub fn fexit_tcp_sendmsg(ctx: FExitContext) -> i32 {
    let Some((tgid, _)) = watched() else { return 0 };
    let ret: i32 = ctx.ret().unwrap_or(0);
    account_send(tgid, sock_inode(ctx.arg(0)), i64::from(ret));
    0
}

// ---- strategy "tp_btf" -------------------------------------------------------

#[btf_tracepoint(function = "sock_recv_length")]
pub fn tp_btf_sock_recv_length(ctx: BtfTracePointContext) -> i32 {
    let Some((tgid, tid)) = watched() else {
        return 0;
    };
    // The receive returned: the thread is no longer waiting in it.
    if IN_RECV.get_ptr(&tid).is_some() {
        let _ = IN_RECV.remove(&tid);
    }
    let sk: u64 = ctx.arg(0);
    if sock_is_tcp(sk) {
        let ret: i32 = ctx.arg(1);
        account_recv(tgid, sock_inode(sk), i64::from(ret));
    }
    0
}

#[btf_tracepoint(function = "sock_send_length")]
pub fn tp_btf_sock_send_length(ctx: BtfTracePointContext) -> i32 {
    let Some((tgid, _)) = watched() else { return 0 };
    let sk: u64 = ctx.arg(0);
    if sock_is_tcp(sk) {
        let ret: i32 = ctx.arg(1);
        account_send(tgid, sock_inode(sk), i64::from(ret));
    }
    0
}

/// x86_64 receive syscalls: read, readv, recvfrom, recvmsg.
#[inline(always)]
fn is_recv_syscall(nr: u64) -> bool {
    matches!(nr, 0 | 19 | 45 | 47)
}

/// A watched thread goes to sleep: if inside a receive syscall, note the
/// receive (once: it keeps its first `since` across spurious wake-ups);
/// if inside anything else, any receive it was in is over.
#[btf_tracepoint(function = "sched_switch")]
pub fn tp_btf_sched_switch(ctx: BtfTracePointContext) -> i32 {
    // At sched_switch `current` is still `prev`, the thread leaving the CPU.
    let Some((tgid, tid)) = watched() else {
        return 0;
    };
    let preempt: u64 = ctx.arg(0);
    let prev_state: u64 = ctx.arg(3);
    if preempt & 0xff != 0 || prev_state as u32 == 0 {
        return 0; // preempted or still runnable: not waiting for anything
    }
    let prev: *mut task_struct = ctx.arg(1);
    // SAFETY: `prev` is the tracepoint's trusted task pointer.
    let regs = unsafe { bpf_task_pt_regs(prev) } as u64;
    if regs == 0 {
        return 0;
    }
    // SAFETY: bpf_probe_read_kernel checks the address; offsets come from BTF.
    let (nr, arg0) = unsafe {
        (
            bpf_probe_read_kernel((regs + config(&OFF_REGS_SYSCALL)) as *const u64)
                .unwrap_or(u64::MAX),
            bpf_probe_read_kernel((regs + config(&OFF_REGS_ARG0)) as *const u64)
                .unwrap_or(u64::MAX),
        )
    };
    // SAFETY: the value is copied out at once.
    let known = unsafe { IN_RECV.get(&tid) }.copied();
    if is_recv_syscall(nr) {
        // The same receive sleeping again keeps its start. A different one
        // began since: a read of a pipe or file returns without any socket
        // hook clearing its entry, and must not hide the socket receive
        // that follows it.
        let same = match known {
            Some(r) => r.fd == arg0 as i32 && r.syscall == nr as u32,
            None => false,
        };
        if !same {
            recv_begin(tgid, tid, 0, 0, arg0 as i32, nr as u32);
        }
    } else if known.is_some() {
        let _ = IN_RECV.remove(&tid);
    }
    0
}

// ---- strategy "tracepoint" (classic sock:* events) ---------------------------

/// Field offsets of `sock:sock_{recv,send}_length` (checked against the
/// tracefs format file by the loader).
mod sock_tp {
    pub const SK: usize = 8;
    pub const PROTOCOL: usize = 18;
    pub const RET: usize = 20;
}

#[inline(always)]
fn sock_tp_fields(ctx: &TracePointContext) -> Option<(u64, i64)> {
    // SAFETY: offsets of the tracepoint's fixed record, verified at load.
    unsafe {
        let proto: u16 = ctx.read_at(sock_tp::PROTOCOL).ok()?;
        if proto != IPPROTO_TCP {
            return None;
        }
        let sk: u64 = ctx.read_at(sock_tp::SK).ok()?;
        let ret: i32 = ctx.read_at(sock_tp::RET).ok()?;
        Some((sk, i64::from(ret)))
    }
}

#[tracepoint(category = "sock", name = "sock_recv_length")]
pub fn tp_sock_recv_length(ctx: TracePointContext) -> u32 {
    let Some((tgid, _)) = watched() else { return 0 };
    if let Some((sk, ret)) = sock_tp_fields(&ctx) {
        account_recv(tgid, sock_inode(sk), ret);
    }
    0
}

#[tracepoint(category = "sock", name = "sock_send_length")]
pub fn tp_sock_send_length(ctx: TracePointContext) -> u32 {
    let Some((tgid, _)) = watched() else { return 0 };
    if let Some((sk, ret)) = sock_tp_fields(&ctx) {
        account_send(tgid, sock_inode(sk), ret);
    }
    0
}

// ---- receive entry/exit by syscall (tracepoint strategy) -------------------

/// Field offsets of `syscalls:sys_enter_*` / `sys_exit_*` records.
mod sys_tp {
    pub const NR: usize = 8;
    pub const ARG0: usize = 16;
}

/// Records that the current thread entered a receive syscall on `fd`.
/// `flags_at` is the offset of the call's `flags` argument, if it has one.
#[inline(always)]
fn sys_recv_enter(ctx: &TracePointContext, flags_at: Option<usize>) -> u32 {
    let Some((tgid, tid)) = watched() else {
        return 0;
    };
    // SAFETY: fixed layout of syscall tracepoint records, verified at load.
    let (nr, fd, flags) = unsafe {
        let nr: i32 = ctx.read_at(sys_tp::NR).unwrap_or(-1);
        let fd: u64 = ctx.read_at(sys_tp::ARG0).unwrap_or(u64::MAX);
        let flags: u64 = match flags_at {
            Some(off) => ctx.read_at(off).unwrap_or(0),
            None => 0,
        };
        (nr, fd, flags)
    };
    let nb = if flags as u32 & MSG_DONTWAIT != 0 {
        RECV_NONBLOCKING
    } else {
        0
    };
    recv_begin(tgid, tid, nb, 0, fd as i32, nr as u32);
    0
}

#[inline(always)]
fn sys_recv_exit() -> u32 {
    let Some((_, tid)) = watched() else { return 0 };
    let _ = IN_RECV.remove(&tid);
    0
}

#[tracepoint(category = "syscalls", name = "sys_enter_recvfrom")]
pub fn sys_enter_recvfrom(ctx: TracePointContext) -> u32 {
    sys_recv_enter(&ctx, Some(40))
}

#[tracepoint(category = "syscalls", name = "sys_enter_recvmsg")]
pub fn sys_enter_recvmsg(ctx: TracePointContext) -> u32 {
    sys_recv_enter(&ctx, Some(32))
}

#[tracepoint(category = "syscalls", name = "sys_enter_read")]
pub fn sys_enter_read(ctx: TracePointContext) -> u32 {
    sys_recv_enter(&ctx, None)
}

#[tracepoint(category = "syscalls", name = "sys_enter_readv")]
pub fn sys_enter_readv(ctx: TracePointContext) -> u32 {
    sys_recv_enter(&ctx, None)
}

#[tracepoint(category = "syscalls", name = "sys_exit_recvfrom")]
pub fn sys_exit_recvfrom(_ctx: TracePointContext) -> u32 {
    sys_recv_exit()
}

#[tracepoint(category = "syscalls", name = "sys_exit_recvmsg")]
pub fn sys_exit_recvmsg(_ctx: TracePointContext) -> u32 {
    sys_recv_exit()
}

#[tracepoint(category = "syscalls", name = "sys_exit_read")]
pub fn sys_exit_read(_ctx: TracePointContext) -> u32 {
    sys_recv_exit()
}

#[tracepoint(category = "syscalls", name = "sys_exit_readv")]
pub fn sys_exit_readv(_ctx: TracePointContext) -> u32 {
    sys_recv_exit()
}

// ---- the task iterator ---------------------------------------------------------

/// The kernel's `struct bpf_iter_meta`.
#[repr(C)]
pub struct BpfIterMeta {
    pub seq: *mut seq_file,
    pub session_id: u64,
    pub seq_num: u64,
}

/// The kernel's `struct bpf_iter__task`, the task iterator's context.
#[repr(C)]
pub struct BpfIterTask {
    pub meta: *mut BpfIterMeta,
    /// NULL in the last call, after every task.
    pub task: *mut task_struct,
}

/// Reads a `T` at `base + off` of a pointer the verifier knows the type
/// of (the iterator's context, a helper's typed result, or a pointer field
/// loaded from one): a direct load. The offset comes from frozen
/// read-only data, so the verifier sees a constant, checks that the access
/// lies inside a field of that type, and lets a fault on an untrusted
/// pointer read as 0 instead of a helper call per field.
#[inline(always)]
fn load<T>(base: *const u8, off: u64) -> T {
    // SAFETY: the verifier checked `off` and the size against the BTF type
    // of `base`; loads through BTF pointers are fault-handled.
    unsafe { core::ptr::read_volatile(base.wrapping_add(off as usize) as *const T) }
}

/// Reads a `T` at `base + off` where the verifier cannot type the access
/// (a `tcp_sock` field behind a `struct sock *`): 0 where it cannot be read.
#[inline(always)]
fn probe_at<T: Default>(base: *const u8, off: u64) -> T {
    // SAFETY: bpf_probe_read_kernel checks the address; offsets come from BTF.
    unsafe { bpf_probe_read_kernel(base.wrapping_add(off as usize) as *const T) }
        .unwrap_or_default()
}

/// The kernel's `struct bpf_iter__task_file`, the file iterator's context.
#[repr(C)]
pub struct BpfIterTaskFile {
    pub meta: *mut BpfIterMeta,
    /// NULL in the last call, after every file.
    pub task: *mut task_struct,
    /// `u32 fd __aligned(8)`.
    pub fd: u64,
    pub file: *mut core::ffi::c_void,
}

/// `S_IFMT` and `S_IFSOCK` of `i_mode`.
const S_IFMT: u16 = 0o170000;
const S_IFSOCK: u16 = 0o140000;

/// Writes `rec` to the iterator's output.
#[inline(always)]
fn seq_write<T>(meta: *mut BpfIterMeta, rec: &T) {
    // SAFETY: `meta` is the iterator's context; `rec` is initialised stack
    // memory of the length given.
    unsafe {
        bpf_seq_write(
            (*meta).seq,
            rec as *const T as *const core::ffi::c_void,
            core::mem::size_of::<T>() as u32,
        )
    };
}

/// `iter/task`: one `IterTaskRecord` for each thread the link's walk
/// reaches (user space links it to one process). aya-ebpf has no macro for
/// iterators: the section and the context are written out.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task")]
pub extern "C" fn iter_task(ctx: *mut BpfIterTask) -> i32 {
    // SAFETY: the kernel passes its iterator context.
    let (meta, task) = unsafe { ((*ctx).meta, (*ctx).task) };
    if task.is_null() {
        return 0;
    }
    let t = task as *const u8;
    // SAFETY: `task` is the iterator's trusted, non-NULL task pointer.
    let regs = unsafe { bpf_task_pt_regs(task) } as *const u8;
    let (syscall, arg0, arg1) = if regs.is_null() {
        (u64::MAX, 0, 0)
    } else {
        (
            load::<u64>(regs, config(&OFF_REGS_SYSCALL)),
            load::<u64>(regs, config(&OFF_REGS_ARG0)),
            load::<u64>(regs, config(&OFF_REGS_ARG1)),
        )
    };
    let mut rec = IterTaskRecord {
        tgid: load(t, config(&OFF_TASK_TGID)),
        tid: load(t, config(&OFF_TASK_PID)),
        state: load(t, config(&OFF_TASK_STATE)),
        exit_state: load(t, config(&OFF_TASK_EXIT_STATE)),
        runtime_ns: load(t, config(&OFF_TASK_RUNTIME)),
        syscall,
        arg0,
        arg1,
        exec_start_ns: load(t, config(&OFF_TASK_EXEC_START)),
        cpu: load(t, config(&OFF_TASK_CPU)),
        flags: 0,
        comm: load(t, config(&OFF_TASK_COMM)),
        ppid: 0,
        ruid: 0,
        start_ns: 0,
        pid_level: 0,
        ns_pid: 0,
    };
    if config(&HEAD_ON) != 0 && rec.tid == rec.tgid {
        head(t, &mut rec);
    }
    seq_write(meta, &rec);
    0
}

/// What procfs's `stat` and `status` say of the process `t` leads: its
/// parent, real uid, start time and pid namespace. The pointers are read
/// with `bpf_probe_read_kernel` (each verifier since 6.1 types them
/// differently; a NULL one reads as 0), `pid->numbers[level]` at an
/// offset known only here.
#[inline(always)]
fn head(t: *const u8, rec: &mut IterTaskRecord) {
    let parent: u64 = probe_at(t, config(&OFF_HEAD_REAL_PARENT));
    let cred: u64 = probe_at(t, config(&OFF_HEAD_REAL_CRED));
    let pid: u64 = probe_at(t, config(&OFF_HEAD_THREAD_PID));
    if parent == 0 || cred == 0 || pid == 0 {
        return;
    }
    rec.ppid = probe_at(parent as *const u8, config(&OFF_TASK_TGID));
    rec.ruid = probe_at(cred as *const u8, config(&OFF_HEAD_CRED_UID));
    rec.start_ns = load(t, config(&OFF_HEAD_START));
    rec.pid_level = probe_at(pid as *const u8, config(&OFF_HEAD_PID_LEVEL));
    let nr = config(&OFF_HEAD_PID_NR) + u64::from(rec.pid_level) * config(&HEAD_UPID_SIZE);
    rec.ns_pid = probe_at(pid as *const u8, nr);
    rec.flags = TASK_HEAD;
}

/// `iter/task_file`: one `IterSockRecord` for each socket among the files
/// the link's walk reaches (one process's: the kernel skips threads that
/// share the leader's file table), with a TCP socket's fields.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task_file")]
pub extern "C" fn iter_task_file(ctx: *mut BpfIterTaskFile) -> i32 {
    // SAFETY: the kernel passes its iterator context.
    let (meta, task, fd, file) = unsafe { ((*ctx).meta, (*ctx).task, (*ctx).fd, (*ctx).file) };
    if task.is_null() || file.is_null() {
        return 0;
    }
    let inode: *const u8 = load(file as *const u8, config(&OFF_FILE_INODE));
    if inode.is_null() {
        return 0;
    }
    let mode: u16 = load(inode, config(&OFF_INODE_MODE));
    if mode & S_IFMT != S_IFSOCK {
        return 0;
    }
    let mut zeroed = core::mem::MaybeUninit::<IterSockRecord>::uninit();
    let words = zeroed.as_mut_ptr() as *mut u64;
    for i in 0..ITER_SOCK_RECORD_SIZE / 8 {
        // SAFETY: the record is ITER_SOCK_RECORD_SIZE bytes, 8-aligned.
        // Zeroed a word at a time: `..Default::default()` calls the
        // object's `memset`, one store a byte.
        unsafe { core::ptr::write_volatile(words.add(i), 0) };
    }
    // SAFETY: every byte was just written (the record has no padding
    // past its size, which is a multiple of 8).
    let rec: &mut IterSockRecord = unsafe { &mut *zeroed.as_mut_ptr() };
    rec.tgid = load(task as *const u8, config(&OFF_TASK_TGID));
    rec.fd = fd as u32;
    rec.inode = load(inode, config(&OFF_INODE_INO));
    rec.magic = ITER_SOCK_MAGIC;
    if config(&TCP_ON) == 0 {
        rec.flags = SOCK_NO_TCP_LAYOUT;
    } else {
        tcp_fields(file, rec);
    }
    seq_write::<IterSockRecord>(meta, rec);
    0
}

/// `AF_INET`, `AF_INET6`, `SOCK_STREAM`.
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
const SOCK_STREAM: u16 = 1;

/// An IPv4 address as read from memory (network order), in the first 4
/// of 16 bytes.
#[inline(always)]
fn v4(a: u32) -> [u8; 16] {
    let b = a.to_ne_bytes();
    [b[0], b[1], b[2], b[3], 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
}

/// Fills `rec` with what sock_diag reports of the socket of `file`, and
/// sets `SOCK_TCP`, when it is a TCP socket of an IPv4 or IPv6 family.
/// The kernel finds the socket: `bpf_sock_from_file` answers only for a
/// file whose operations are a socket's (an `O_PATH` descriptor of a
/// socket's path has the mode of a socket but no socket behind it). The
/// `struct sock` fields are direct loads; the verifier types the pointer
/// as a `struct sock` only (and as untrusted, so `bpf_skc_to_tcp_sock`
/// refuses it), so the `inet_connection_sock` and `tcp_sock` fields after
/// it are read with `bpf_probe_read_kernel`: a window at a time where the
/// loader set windows, else a field at a time.
#[inline(always)]
fn tcp_fields(file: *mut core::ffi::c_void, rec: &mut IterSockRecord) {
    // SAFETY: `file` is the iterator's non-NULL file pointer.
    let socket = unsafe { bpf_sock_from_file(file as *mut _) } as *const u8;
    if socket.is_null() {
        return;
    }
    let sk: *const u8 = load(socket, config(&OFF_SOCKET_SK));
    if sk.is_null() {
        return;
    }
    let family: u16 = load(sk, config(&OFF_TCP_FAMILY));
    if (family != AF_INET && family != AF_INET6)
        || load::<u16>(sk, config(&OFF_TCP_TYPE)) != SOCK_STREAM
        || load::<u16>(sk, config(&OFF_TCP_PROTOCOL)) != IPPROTO_TCP
    {
        return;
    }
    rec.family = family;
    if family == AF_INET {
        rec.local_addr = v4(load(sk, config(&OFF_TCP_RCV_SADDR)));
        rec.remote_addr = v4(load(sk, config(&OFF_TCP_DADDR)));
    } else {
        rec.local_addr = load(sk, config(&OFF_TCP_V6_RCV_SADDR));
        rec.remote_addr = load(sk, config(&OFF_TCP_V6_DADDR));
    }
    rec.state = load(sk, config(&OFF_TCP_STATE));
    rec.local_port = load(sk, config(&OFF_TCP_NUM));
    rec.remote_port_be = load(sk, config(&OFF_TCP_DPORT));
    rec.cookie = load(sk, config(&OFF_TCP_COOKIE));
    let net: *const u8 = load(sk, config(&OFF_TCP_NET));
    rec.netns = if net.is_null() {
        0
    } else {
        load(net, config(&OFF_NET_INUM))
    };
    rec.uid = load(sk, config(&OFF_TCP_UID));
    if config(&TCP_WINDOW_LEN[0]) == 0 {
        tcp_sock_probed(sk, rec);
    } else {
        tcp_sock_windows(sk, rec);
    }
    // SAFETY: bpf_jiffies64 has no preconditions. Read last, as
    // `tcp_get_info` reads `tcp_jiffies32` after the stamps it ages.
    rec.now_jiffies = unsafe { bpf_jiffies64() } as u32;
    rec.flags = SOCK_TCP;
}

/// The `inet_connection_sock` and `tcp_sock` fields of `rec`, one
/// `bpf_probe_read_kernel` each.
#[inline(always)]
fn tcp_sock_probed(sk: *const u8, rec: &mut IterSockRecord) {
    rec.retransmits = probe_at(sk, config(&OFF_TCP_RETRANSMITS));
    rec.backoff = probe_at(sk, config(&OFF_TCP_BACKOFF));
    rec.probes = probe_at(sk, config(&OFF_TCP_PROBES));
    rec.rto_jiffies = probe_at(sk, config(&OFF_TCP_RTO));
    rec.lsndtime = probe_at(sk, config(&OFF_TCP_LSNDTIME));
    rec.lrcvtime = probe_at(sk, config(&OFF_TCP_LRCVTIME));
    rec.rcv_tstamp = probe_at(sk, config(&OFF_TCP_RCV_TSTAMP));
    rec.srtt_us = probe_at(sk, config(&OFF_TCP_SRTT));
    rec.packets_out = probe_at(sk, config(&OFF_TCP_PACKETS_OUT));
    rec.rcv_nxt = probe_at(sk, config(&OFF_TCP_RCV_NXT));
    rec.copied_seq = probe_at(sk, config(&OFF_TCP_COPIED_SEQ));
    rec.write_seq = probe_at(sk, config(&OFF_TCP_WRITE_SEQ));
    rec.snd_una = probe_at(sk, config(&OFF_TCP_SND_UNA));
    rec.bytes_received = probe_at(sk, config(&OFF_TCP_BYTES_RECEIVED));
    rec.bytes_acked = probe_at(sk, config(&OFF_TCP_BYTES_ACKED));
    rec.data_segs_in = probe_at(sk, config(&OFF_TCP_SEGS_IN));
    rec.data_segs_out = probe_at(sk, config(&OFF_TCP_SEGS_OUT));
}

/// The same fields, read a window at a time (`TCP_WINDOW_START`,
/// `TCP_WINDOW_LEN`): one `bpf_probe_read_kernel` a window onto the
/// stack, each field then taken from the window that holds it. Every
/// window's bounds and every field's offset are frozen constants, so the
/// verifier follows one path and checks each stack read against the
/// bytes the helper wrote. A window the kernel cannot read reads as
/// zeros, as a field read alone does.
#[inline(always)]
fn tcp_sock_windows(sk: *const u8, rec: &mut IterSockRecord) {
    let mut buf = core::mem::MaybeUninit::<[u64; TCP_WINDOW / 8]>::uninit();
    let at = buf.as_mut_ptr() as *mut u8;
    for w in 0..TCP_WINDOWS {
        let (start, len) = (config(&TCP_WINDOW_START[w]), config(&TCP_WINDOW_LEN[w]));
        if len == 0 || len > TCP_WINDOW as u64 {
            return;
        }
        // SAFETY: `at` has TCP_WINDOW bytes and `len` is at most that; the
        // helper checks the source address (and zeroes `at` on a fault).
        unsafe {
            aya_ebpf::helpers::generated::bpf_probe_read_kernel(
                at as *mut core::ffi::c_void,
                len as u32,
                sk.wrapping_add(start as usize) as *const core::ffi::c_void,
            )
        };
        let window = Window { at, start, len };
        window.take(&mut rec.retransmits, config(&OFF_TCP_RETRANSMITS));
        window.take(&mut rec.backoff, config(&OFF_TCP_BACKOFF));
        window.take(&mut rec.probes, config(&OFF_TCP_PROBES));
        window.take(&mut rec.rto_jiffies, config(&OFF_TCP_RTO));
        window.take(&mut rec.lsndtime, config(&OFF_TCP_LSNDTIME));
        window.take(&mut rec.lrcvtime, config(&OFF_TCP_LRCVTIME));
        window.take(&mut rec.rcv_tstamp, config(&OFF_TCP_RCV_TSTAMP));
        window.take(&mut rec.srtt_us, config(&OFF_TCP_SRTT));
        window.take(&mut rec.packets_out, config(&OFF_TCP_PACKETS_OUT));
        window.take(&mut rec.rcv_nxt, config(&OFF_TCP_RCV_NXT));
        window.take(&mut rec.copied_seq, config(&OFF_TCP_COPIED_SEQ));
        window.take(&mut rec.write_seq, config(&OFF_TCP_WRITE_SEQ));
        window.take(&mut rec.snd_una, config(&OFF_TCP_SND_UNA));
        window.take(&mut rec.bytes_received, config(&OFF_TCP_BYTES_RECEIVED));
        window.take(&mut rec.bytes_acked, config(&OFF_TCP_BYTES_ACKED));
        window.take(&mut rec.data_segs_in, config(&OFF_TCP_SEGS_IN));
        window.take(&mut rec.data_segs_out, config(&OFF_TCP_SEGS_OUT));
    }
}

/// One window of a `tcp_sock` read onto the stack: `len` bytes from
/// offset `start`, at `at`.
struct Window {
    at: *const u8,
    start: u64,
    len: u64,
}

impl Window {
    /// Sets `field` to the value at offset `off` of the socket, where this
    /// window holds all of it.
    #[inline(always)]
    fn take<T: Copy>(&self, field: &mut T, off: u64) {
        let size = core::mem::size_of::<T>() as u64;
        if off >= self.start && off + size <= self.start + self.len {
            // SAFETY: inside the `len` bytes the helper wrote; aligned, as
            // the window starts 8-aligned and the kernel aligns its fields.
            *field = unsafe {
                core::ptr::read_volatile(
                    self.at.wrapping_add((off - self.start) as usize) as *const T
                )
            };
        }
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
