//! `selfheal scan`'s edge: reads, with no config, every process the caller
//! may read (root: the host, every network namespace; anyone else: their
//! own processes only), each one's TCP connections from its network
//! namespace's sock_diag dump, and, for a process holding one, what its
//! threads wait in (procfs, light detail: the same reader as `check`'s,
//! with its bounds). The census is the core's
//! ([`selfheal_core::scan::census`]).
//!
//! Containment: a process's threads are read only when it holds a TCP
//! connection; each such read has its own deadline
//! ([`PROCESS_BUDGET`], the memory reads of a poll set in a reader that
//! can be abandoned, as `check`'s), so a hostile process costs at most
//! that. A process that ends mid-scan is counted, never an error.

use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant},
};

use selfheal_core::{
    proc::{Detail, ProcessInfo},
    scan::{Connection, Coverage, Owner, Waiter},
    sockdiag::TcpSocket,
};

use crate::{
    agents::ProcessTable,
    proc,
    sys::{procfs::ProcRoot, sockdiag},
};

/// How long one process's threads may take to read before the read stops
/// (its threads not yet read are left out, and the census says so).
pub const PROCESS_BUDGET: Duration = Duration::from_secs(2);

/// What one scan read.
pub struct Scan {
    pub connections: Vec<Connection>,
    pub coverage: Coverage,
}

/// One network namespace's TCP sockets by inode, or why they could not be
/// dumped.
type Dump = Result<HashMap<u64, TcpSocket>, String>;

/// Reads every process `euid` may read (all of them for root; else only
/// those whose uid is `euid`: another user's are counted, never read).
pub fn scan(euid: u32) -> Scan {
    let root = ProcRoot::default();
    let table = ProcessTable::read_for(&[], euid);
    let own = std::process::id();
    let mut coverage = Coverage::default();
    let mut dumps: BTreeMap<u64, Dump> = BTreeMap::new();
    let mut reader = crate::sys::memread::Reader::default();
    let clocks = proc::task_clocks();
    let mut connections = Vec::new();
    for entry in table.entries() {
        if !entry.has_argv || entry.pid == own {
            continue;
        }
        if euid != 0 && entry.uid != Some(euid) {
            coverage.not_yours += 1;
            continue;
        }
        let pid = entry.pid;
        // Its socket fds first (one readlink each): most processes hold no
        // TCP connection, and their threads are then never read.
        let fds = match proc::socket_fds(&root, pid) {
            Ok(fds) => fds,
            Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ESRCH) => {
                coverage.gone += 1;
                continue;
            }
            Err(_) => {
                coverage.unreadable += 1;
                continue;
            }
        };
        if fds.is_empty() {
            coverage.processes += 1;
            continue;
        }
        let netns = match root.namespace(pid, "net") {
            Ok(ns) => ns,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                coverage.gone += 1;
                continue;
            }
            Err(_) => {
                coverage.unreadable += 1;
                continue;
            }
        };
        let dump = dumps.entry(netns).or_insert_with(|| {
            sockdiag::dump_tcp_in_netns_of(pid)
                .map(|all| all.into_iter().map(|s| (s.inode, s)).collect())
                .map_err(|e| format!("network namespace {netns} (via pid {pid}): {e}"))
        });
        let Ok(sockets) = dump else {
            coverage.processes += 1;
            continue;
        };
        if !fds.iter().any(|(_, ino)| sockets.contains_key(ino)) {
            coverage.processes += 1;
            continue;
        }
        let mut access = proc::MemAccess {
            reader: &mut reader,
            deadline: Instant::now() + PROCESS_BUDGET,
            over: false,
        };
        let p = match proc::process_in(&root, pid, Detail::Light, &clocks, &mut access) {
            Ok(p) => p,
            Err(_) => {
                coverage.gone += 1;
                continue;
            }
        };
        coverage.processes += 1;
        coverage.over_budget += usize::from(access.over);
        let owner = owner_of(&table, &p);
        let waiters = waiters_of(&p);
        // The sockets as this read saw them (a pid reused since the fd
        // list is another process, read whole here).
        for &(fd, inode) in &p.sockets {
            let Some(socket) = sockets.get(&inode) else {
                continue;
            };
            connections.push(Connection {
                owner: owner.clone(),
                fd,
                socket: socket.clone(),
                waiters: waiters.get(&inode).cloned().unwrap_or_default(),
            });
        }
    }
    coverage.netns_errors = dumps.into_values().filter_map(|d| d.err()).collect();
    Scan {
        connections,
        coverage,
    }
}

/// Who `p` is: its name, uid, and the unit, container and pod its cgroup
/// names (the runtimes are not asked).
fn owner_of(table: &ProcessTable, p: &ProcessInfo) -> Owner {
    let entry = table.get(p.pid);
    let container = entry.and_then(|e| e.containers.last());
    Owner {
        pid: p.pid,
        comm: p.name.clone(),
        uid: p.uid,
        unit: table.unit_of(p.pid).map(|u| u.unit.to_string()),
        container: container.map(|c| format!("{}:{}", c.runtime, &c.id[..c.id.len().min(12)])),
        pod_uid: container.and_then(|c| c.pod_uid.clone()),
    }
}

/// Each socket inode of `p` and the threads that wait on it: in a receive
/// on it, in a poll/select/epoll wait whose set holds it with read
/// interest, or blocked in `connect` on it.
fn waiters_of(p: &ProcessInfo) -> HashMap<u64, Vec<Waiter>> {
    let mut out: HashMap<u64, Vec<Waiter>> = HashMap::new();
    for t in &p.threads {
        if let Some(r) = &t.recv {
            out.entry(r.inode).or_default().push(Waiter {
                tid: t.tid,
                syscall: r.syscall.to_string(),
                event_loop: false,
                waited_ms: r.idle_ms,
            });
        }
        if let Some(w) = &t.wait {
            for (_, inode) in &w.sockets {
                out.entry(*inode).or_default().push(Waiter {
                    tid: t.tid,
                    syscall: w.syscall.to_string(),
                    event_loop: w.epoll_fd.is_some(),
                    waited_ms: w.idle_ms,
                });
            }
        }
        if let Some(s) = t.syscall.as_ref().filter(|s| s.nr == libc::SYS_connect)
            && let Some((_, inode)) = p
                .sockets
                .iter()
                .find(|(fd, _)| i64::from(*fd) as u64 == s.arg0)
        {
            out.entry(*inode).or_default().push(Waiter {
                tid: t.tid,
                syscall: "connect".into(),
                event_loop: false,
                waited_ms: t.idle_ms,
            });
        }
    }
    out
}
