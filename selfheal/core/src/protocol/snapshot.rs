//! The tracer's snapshot on the wire: what `ebpf_snapshot` answers, filtered to the pids the caller may see.

use super::*;

/// [`TracerSnapshot`] as it is read back from the wire (the tracer's types
/// only serialize). [`SnapshotWire::into_snapshot`] checks and converts.
#[derive(Clone, Debug, Deserialize)]
pub struct SnapshotWire {
    pub strategy: String,
    pub taken_at_ns: u64,
    pub blocked: Vec<BlockedWire>,
    pub sockets: Vec<SocketActivity>,
    pub overflow: Overflow,
    /// Requested pids the caller may not query (or that do not exist):
    /// their evidence is a gap. Absent from older helpers: none.
    #[serde(default)]
    pub refused: Vec<u32>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct BlockedWire {
    pub tgid: u32,
    pub tid: u32,
    pub inode: Option<u64>,
    pub fd: Option<i32>,
    pub syscall: Option<String>,
    pub tcp_checked: bool,
    pub since_ns: u64,
    pub age_ms: u64,
}

impl SnapshotWire {
    /// The snapshot, or what is wrong with it.
    pub fn into_snapshot(self) -> Result<TracerSnapshot, String> {
        let strategy = Strategy::from_name(&self.strategy)
            .ok_or_else(|| format!("unknown eBPF strategy {:?}", truncate(&self.strategy, 40)))?;
        let blocked = self
            .blocked
            .into_iter()
            .map(|b| BlockedRecv {
                tgid: b.tgid,
                tid: b.tid,
                inode: b.inode,
                fd: b.fd,
                // The tracer's names are static; a name it does not know is
                // dropped rather than invented.
                syscall: b.syscall.as_deref().and_then(static_syscall_name),
                tcp_checked: b.tcp_checked,
                since_ns: b.since_ns,
                age_ms: b.age_ms,
            })
            .collect();
        Ok(TracerSnapshot {
            strategy,
            taken_at_ns: self.taken_at_ns,
            blocked,
            sockets: self.sockets,
            overflow: self.overflow,
            shares: Default::default(),
            refused: Vec::new(),
        })
    }
}

/// The tracer's static name for syscall `name`.
pub(super) fn static_syscall_name(name: &str) -> Option<&'static str> {
    // The syscall numbers the tracer names are all below 512 (x86_64).
    (0..512).find_map(|nr| crate::ebpf::snapshot::syscall_name(nr).filter(|n| *n == name))
}

/// The result of `ebpf_snapshot` restricted to `pids` (pure). Of the
/// per-owner losses at the socket map's share, only those of the owners
/// of `pids` remain (as `overflow.over_share`).
pub fn filter_snapshot(mut snap: TracerSnapshot, pids: &[u32]) -> TracerSnapshot {
    snap.blocked.retain(|b| pids.binary_search(&b.tgid).is_ok());
    snap.sockets.retain(|s| pids.binary_search(&s.tgid).is_ok());
    snap.overflow.over_share = snap
        .shares
        .values()
        .filter(|u| u.tgids.iter().any(|t| pids.binary_search(t).is_ok()))
        .map(|u| u.lost)
        .sum();
    snap.shares.clear();
    snap.refused.retain(|p| pids.binary_search(p).is_ok());
    snap
}
