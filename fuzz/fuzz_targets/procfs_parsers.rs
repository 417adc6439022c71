//! selfheal's own parsers over kernel and procfs data, on any text: a
//! tracefs event `format` file, a pidfile, `/proc/PID/cgroup`, an epoll fd's
//! fdinfo, the pure rules over raw eBPF map entries, and (on the raw bytes)
//! the pollfd array and `fd_set` decoders. Never a panic.
//!
//! Every parser sees the whole input as (lossy UTF-8) text; the numbers the
//! map-entry rules need come from its first bytes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use selfheal_core::{
    cgroup::{cgroup_path, in_unit},
    ebpf::{
        FdKind,
        snapshot::{blocked_recv, socket_activity, syscall_name},
        tracefs,
    },
    proc::{
        MAX_SELECT_FDS, POLLFD_SIZE, decode_fd_set, decode_pollfds, parse_epoll_tfds,
        parse_pidfile,
    },
};
use selfheal_common::{InRecv, SockActivity};

/// The fields the loader asks tracefs for, and some odd ones.
const TRACEFS_FIELDS: [&str; 7] = ["sk", "protocol", "ret", "common_pid", "", "*", " "];

/// Reads little-endian integers from the input, zeros past its end.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        let n = self.0.len().min(8);
        b[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        u64::from_le_bytes(b)
    }
    fn u32(&mut self) -> u32 {
        self.u64() as u32
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);

    // tracefs `format` files.
    for field in TRACEFS_FIELDS {
        let _ = tracefs::parse_field_offset(&text, field);
    }
    // The field named by the input's first line, so offsets get found too.
    if let Some(first) = text.lines().next() {
        let _ = tracefs::parse_field_offset(&text, first.trim());
    }

    // Pidfiles.
    if let Ok(pid) = parse_pidfile(&text) {
        assert!(pid > 0 && pid <= i32::MAX as u32, "pidfile pid {pid}");
    }

    // /proc/PID/cgroup.
    if let Some(path) = cgroup_path(&text) {
        assert!(!path.is_empty());
        for unit in ["sol.service", "", "/", "user.slice"] {
            let _ = in_unit(&path, unit);
        }
        if let Some(last) = path.rsplit('/').next() {
            let _ = in_unit(&path, last);
        }
    }
    let _ = in_unit(&text, "sol.service");

    // /proc/PID/fdinfo/EPFD of an epoll fd.
    for (tfd, _) in parse_epoll_tfds(&text) {
        assert!(tfd >= 0, "tfd {tfd}");
    }

    // A poll set and a select read set as read from another process.
    let pollfds = decode_pollfds(data).count();
    assert!(pollfds <= data.len() / POLLFD_SIZE);
    for nfds in [data.first().map_or(0, |b| usize::from(*b) * 8), MAX_SELECT_FDS] {
        let fds: Vec<i32> = decode_fd_set(data, nfds).collect();
        assert!(fds.windows(2).all(|w| w[0] < w[1]), "{fds:?}");
        assert!(fds.iter().all(|fd| *fd >= 0 && (*fd as usize) < nfds));
    }

    // Raw eBPF map entries (kernel-written values) through the pure rules.
    let mut b = Bytes(data);
    let now_ns = b.u64();
    let tid = b.u32();
    let rec = InRecv {
        since_ns: b.u64(),
        inode: b.u64(),
        tgid: b.u32(),
        fd: b.u32() as i32,
        flags: b.u32(),
        syscall: b.u32(),
    };
    let kind = b.u32();
    let mut resolve = |_tgid: u32, fd: i32| match (kind % 4, fd) {
        (0, _) => FdKind::Gone,
        (1, _) => FdKind::NotSocket,
        (k, fd) => FdKind::Socket {
            inode: fd as u64,
            nonblocking: k == 3,
        },
    };
    if let Some(blocked) = blocked_recv(now_ns, tid, &rec, &mut resolve) {
        assert_eq!(blocked.since_ns, rec.since_ns);
        let _ = serde_json::to_string(&blocked);
    }
    let _ = syscall_name(rec.syscall);
    let activity = SockActivity {
        last_recv_ns: b.u64(),
        last_recv_bytes: b.u64(),
        last_send_ns: b.u64(),
        last_send_bytes: b.u64(),
        recv_data: b.u64(),
        recv_empty: b.u64(),
        recv_error: b.u64(),
        sends: b.u64(),
        bytes_received: b.u64(),
        bytes_sent: b.u64(),
        tgid: b.u32(),
        owner: b.u32(),
    };
    let _ = serde_json::to_string(&socket_activity(now_ns, rec.inode, &activity));
});
