//! What the tracer saw, as plain Rust types, and the pure rules that turn
//! raw map entries into it. No I/O here: resolving a file descriptor is
//! passed in as a function.

use std::collections::{BTreeMap, BTreeSet};

use selfheal_common::{
    InRecv, MAX_IN_RECV, MAX_IN_SEND, MAX_SOCKS, RECV_HAS_INODE, RECV_NONBLOCKING, SockActivity,
};
use serde::{Deserialize, Serialize};

use super::Strategy;
use crate::clock::age_ms;

/// A thread of a watched process inside a blocking receive on a socket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BlockedRecv {
    pub tgid: u32,
    pub tid: u32,
    /// The socket's inode (as in `/proc/PID/fd` and sock_diag), when known.
    pub inode: Option<u64>,
    /// The file descriptor, when the entry hook saw it (syscall strategies).
    pub fd: Option<i32>,
    /// The syscall, when the entry hook was a syscall tracepoint.
    pub syscall: Option<&'static str>,
    /// Whether the hook itself guarantees a TCP socket (`tcp_recvmsg`);
    /// otherwise the caller must check the inode against sock_diag.
    pub tcp_checked: bool,
    /// When the receive began (`CLOCK_BOOTTIME` ns).
    pub since_ns: u64,
    /// How long it has been blocked at snapshot time.
    pub age_ms: u64,
}

/// Receive/send activity of one socket of a watched process (read back
/// from the helper's wire as it is written).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketActivity {
    pub inode: u64,
    pub tgid: u32,
    /// Age of the last receive that returned data.
    pub last_recv_ms: Option<u64>,
    pub last_recv_bytes: u64,
    /// Age of the last send that returned a byte count.
    pub last_send_ms: Option<u64>,
    pub last_send_bytes: u64,
    pub recv_data: u64,
    pub recv_empty: u64,
    pub recv_error: u64,
    pub sends: u64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
}

/// Events the kernel side could not record: non-zero means the picture is
/// incomplete (a map was full, a pointer unreadable).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overflow {
    pub in_recv_full: u64,
    pub socks_full: u64,
    pub read_failed: u64,
    pub in_send_full: u64,
    /// Socket events of the asked processes' owners not recorded, or
    /// recorded and then evicted, because the owner was at its share of
    /// `SOCKS` (the map is shared by every watched owner: see
    /// [`socks_share`]). Absent from a helper older than the per-owner
    /// share: none.
    #[serde(default)]
    pub over_share: u64,
}

impl Overflow {
    /// The report's line for a non-zero overflow: what went unrecorded, in
    /// which map, and how big that map is; `None` when nothing was lost.
    /// The counters run from when the tracer was loaded (a long-running
    /// helper's reach back to its start).
    pub fn describe(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.in_recv_full > 0 {
            parts.push(format!(
                "{} receive(s) not timed (IN_RECV full at {MAX_IN_RECV} threads)",
                self.in_recv_full
            ));
        }
        if self.socks_full > 0 {
            parts.push(format!(
                "{} socket event(s) not recorded (SOCKS full at {MAX_SOCKS} sockets)",
                self.socks_full
            ));
        }
        if self.in_send_full > 0 {
            parts.push(format!(
                "{} send(s) not recorded (IN_SEND full at {MAX_IN_SEND} threads)",
                self.in_send_full
            ));
        }
        if self.over_share > 0 {
            parts.push(format!(
                "{} socket event(s) not recorded or evicted (its owner at its share of SOCKS; \
                 the {MAX_SOCKS} entries are shared by every watched owner)",
                self.over_share
            ));
        }
        if self.read_failed > 0 {
            parts.push(format!("{} socket identities unreadable", self.read_failed));
        }
        (!parts.is_empty()).then(|| {
            format!(
                "eBPF evidence incomplete since the tracer loaded: {}",
                parts.join("; ")
            )
        })
    }
}

/// Entries of the socket map whose socket is no longer open in the process
/// that last used it: `open` gives a process's open socket inodes, or
/// `None` when the process is gone. Each process is asked once.
pub fn closed_sockets(
    entries: &[(u64, u32)],
    open: &mut dyn FnMut(u32) -> Option<BTreeSet<u64>>,
) -> Vec<u64> {
    let mut by_tgid: BTreeMap<u32, Option<BTreeSet<u64>>> = BTreeMap::new();
    entries
        .iter()
        .filter(|(inode, tgid)| {
            by_tgid
                .entry(*tgid)
                .or_insert_with(|| open(*tgid))
                .as_ref()
                .is_none_or(|o| !o.contains(inode))
        })
        .map(|(inode, _)| *inode)
        .collect()
}

/// One reading of the tracer's maps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TracerSnapshot {
    pub strategy: Strategy,
    /// When the reading was taken (`CLOCK_BOOTTIME` ns).
    pub taken_at_ns: u64,
    pub blocked: Vec<BlockedRecv>,
    pub sockets: Vec<SocketActivity>,
    pub overflow: Overflow,
    /// Use of `SOCKS` by owner. Never sent: [`crate::protocol::filter_snapshot`]
    /// turns it into the asked processes' `overflow.over_share`.
    #[serde(skip)]
    pub shares: BTreeMap<u32, ShareUse>,
    /// Pids whose evidence the helper refused to this user (not theirs, or
    /// not running): each is a gap, the rest of the snapshot stands.
    #[serde(skip)]
    pub refused: Vec<u32>,
}

/// One owner's use of the socket map at a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShareUse {
    /// Its watched processes.
    pub tgids: BTreeSet<u32>,
    /// Entries it holds.
    pub socks: u64,
    /// Events lost at its share since the tracer loaded (refused by the
    /// kernel side, or evicted by [`over_share`]).
    pub lost: u64,
}

/// The most `SOCKS` entries one owner may hold when `owners` owners are
/// watched: an equal share each, so one owner's processes that open
/// thousands of sockets leave the others their part. One owner alone has
/// the whole map.
pub fn socks_share(owners: usize) -> u64 {
    u64::from(MAX_SOCKS) / owners.max(1) as u64
}

/// Entries to evict so that no owner holds more than `share`: from each
/// owner above it, its least recently active entries. `entries` are
/// `(inode, owner, last activity in ns)`. Pure.
pub fn over_share(entries: &[(u64, u32, u64)], share: u64) -> Vec<u64> {
    let mut by_owner: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
    for &(inode, owner, last) in entries {
        by_owner.entry(owner).or_default().push((last, inode));
    }
    let mut out = Vec::new();
    for (_, mut list) in by_owner {
        let excess = (list.len() as u64).saturating_sub(share) as usize;
        if excess > 0 {
            list.sort_unstable();
            out.extend(list[..excess].iter().map(|&(_, inode)| inode));
        }
    }
    out
}

/// What a file descriptor of a watched process is, as far as the tracer
/// cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FdKind {
    Socket {
        inode: u64,
        nonblocking: bool,
    },
    NotSocket,
    /// The fd or the process is gone.
    Gone,
}

/// Syscall numbers (x86_64) the syscall strategies record.
pub fn syscall_name(nr: u32) -> Option<&'static str> {
    match nr {
        0 => Some("read"),
        19 => Some("readv"),
        45 => Some("recvfrom"),
        47 => Some("recvmsg"),
        _ => None,
    }
}

/// Turns one `IN_RECV` entry into a blocked receive, or `None` when it is
/// not one: a non-blocking read (an event loop polling), a read of a file or
/// pipe, or a descriptor that is gone.
pub fn blocked_recv(
    now_ns: u64,
    tid: u32,
    rec: &InRecv,
    resolve_fd: &mut dyn FnMut(u32, i32) -> FdKind,
) -> Option<BlockedRecv> {
    if rec.flags & RECV_NONBLOCKING != 0 {
        return None;
    }
    let (inode, fd, tcp_checked) = if rec.flags & RECV_HAS_INODE != 0 {
        ((rec.inode != 0).then_some(rec.inode), None, true)
    } else {
        match resolve_fd(rec.tgid, rec.fd) {
            FdKind::Socket {
                nonblocking: true, ..
            }
            | FdKind::NotSocket
            | FdKind::Gone => {
                return None;
            }
            FdKind::Socket {
                inode,
                nonblocking: false,
            } => (Some(inode), Some(rec.fd), false),
        }
    };
    Some(BlockedRecv {
        tgid: rec.tgid,
        tid,
        inode,
        fd,
        syscall: syscall_name(rec.syscall),
        tcp_checked,
        since_ns: rec.since_ns,
        age_ms: age_ms(now_ns, rec.since_ns),
    })
}

/// Turns one `SOCKS` entry into plain activity with ages.
pub fn socket_activity(now_ns: u64, inode: u64, a: &SockActivity) -> SocketActivity {
    let age = |t: u64| (t != 0).then(|| age_ms(now_ns, t));
    SocketActivity {
        inode,
        tgid: a.tgid,
        last_recv_ms: age(a.last_recv_ns),
        last_recv_bytes: a.last_recv_bytes,
        last_send_ms: age(a.last_send_ns),
        last_send_bytes: a.last_send_bytes,
        recv_data: a.recv_data,
        recv_empty: a.recv_empty,
        recv_error: a.recv_error,
        sends: a.sends,
        bytes_received: a.bytes_received,
        bytes_sent: a.bytes_sent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_splits_the_map_and_eviction_takes_the_oldest_of_the_uid_above_it() {
        assert_eq!(socks_share(0), u64::from(MAX_SOCKS));
        assert_eq!(socks_share(1), u64::from(MAX_SOCKS));
        assert_eq!(socks_share(2), u64::from(MAX_SOCKS) / 2);
        assert_eq!(socks_share(3), u64::from(MAX_SOCKS) / 3);
        // uid 7 holds 5 entries with a share of 3: its 2 oldest go; uid 9
        // (2 entries) keeps both, however old.
        let entries = [
            (1, 7, 50),
            (2, 7, 10),
            (3, 9, 1),
            (4, 7, 40),
            (5, 7, 20),
            (6, 9, 2),
            (7, 7, 30),
        ];
        let mut evicted = over_share(&entries, 3);
        evicted.sort_unstable();
        assert_eq!(evicted, vec![2, 5]);
        assert!(over_share(&entries, 5).is_empty());
        assert_eq!(over_share(&entries, 0).len(), entries.len());
        // Equal ages: the lower inode goes first, so the rule is stable.
        assert_eq!(over_share(&[(8, 1, 5), (6, 1, 5)], 1), vec![6]);
    }

    #[test]
    fn overflow_is_described_only_when_something_was_lost() {
        assert_eq!(Overflow::default().describe(), None);
        let line = Overflow {
            socks_full: 616,
            ..Overflow::default()
        }
        .describe()
        .unwrap();
        assert!(
            line.contains("616 socket event(s) not recorded (SOCKS full at 16384 sockets)"),
            "{line}"
        );
        assert!(!line.contains("IN_RECV"), "{line}");
        let all = Overflow {
            in_recv_full: 1,
            socks_full: 2,
            read_failed: 3,
            in_send_full: 4,
            over_share: 5,
        }
        .describe()
        .unwrap();
        for part in [
            "1 receive(s)",
            "2 socket event(s)",
            "3 socket identities",
            "4 send(s)",
            "5 socket event(s) not recorded or evicted (its owner at its share of SOCKS",
        ] {
            assert!(all.contains(part), "{all}");
        }
    }

    #[test]
    fn closed_sockets_are_those_no_longer_open_or_of_gone_processes() {
        let entries = [(10, 1), (11, 1), (12, 1), (20, 2), (30, 3)];
        let mut asked = Vec::new();
        let closed = closed_sockets(&entries, &mut |tgid| {
            asked.push(tgid);
            match tgid {
                1 => Some([10, 12].into()),
                2 => None, // exited
                _ => Some([30].into()),
            }
        });
        assert_eq!(closed, vec![11, 20]);
        assert_eq!(asked, vec![1, 2, 3], "each process read once");
    }

    const NOW: u64 = 10_000_000_000;

    fn rec(flags: u32, inode: u64, fd: i32, syscall: u32) -> InRecv {
        InRecv {
            since_ns: NOW - 2_500_000_000,
            inode,
            tgid: 7,
            fd,
            flags,
            syscall,
        }
    }

    fn check(r: InRecv, fd_kind: FdKind, expected: Option<(Option<u64>, Option<i32>, bool)>) {
        let got = blocked_recv(NOW, 8, &r, &mut |tgid, fd| {
            assert_eq!((tgid, fd), (7, r.fd));
            fd_kind
        });
        match (got, expected) {
            (None, None) => {}
            (Some(b), Some((inode, fd, tcp))) => {
                assert_eq!((b.inode, b.fd, b.tcp_checked), (inode, fd, tcp));
                assert_eq!((b.tgid, b.tid, b.age_ms), (7, 8, 2500));
            }
            (got, expected) => panic!("{r:?} {fd_kind:?}: got {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn entries_become_blocked_receives_only_when_they_can_block() {
        let sock = FdKind::Socket {
            inode: 99,
            nonblocking: false,
        };
        let nb_sock = FdKind::Socket {
            inode: 99,
            nonblocking: true,
        };
        // tcp_recvmsg hooks: inode known, TCP by construction.
        check(
            rec(RECV_HAS_INODE, 42, -1, 0),
            FdKind::Gone,
            Some((Some(42), None, true)),
        );
        check(
            rec(RECV_HAS_INODE | RECV_NONBLOCKING, 42, -1, 0),
            FdKind::Gone,
            None,
        );
        // an unreadable socket pointer still reports the blocked thread
        check(
            rec(RECV_HAS_INODE, 0, -1, 0),
            FdKind::Gone,
            Some((None, None, true)),
        );
        // syscall hooks: the fd decides.
        check(rec(0, 0, 3, 45), sock, Some((Some(99), Some(3), false)));
        check(rec(0, 0, 3, 0), nb_sock, None);
        check(rec(0, 0, 3, 0), FdKind::NotSocket, None);
        check(rec(0, 0, 3, 0), FdKind::Gone, None);
        check(rec(RECV_NONBLOCKING, 0, 3, 45), sock, None);
    }

    #[test]
    fn activity_ages_are_relative_to_the_snapshot() {
        let a = SockActivity {
            last_recv_ns: NOW - 1_000_000_000,
            last_recv_bytes: 5,
            recv_data: 1,
            ..SockActivity::default()
        };
        let s = socket_activity(NOW, 3, &a);
        assert_eq!(s.last_recv_ms, Some(1000));
        assert_eq!(s.last_send_ms, None);
    }
}
