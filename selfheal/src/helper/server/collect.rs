//! The reads of a check, made by the helper for a check that may not make
//! them itself (a `watch` holding no capability to read other users'
//! processes): `collect` reads each pid as the check would (the task
//! iterators' pass where they are pinned, else procfs; each thread's wait
//! and its set; the process's TCP sockets from its network namespace's
//! sock_diag dump), and `namespaces` tells each pid's pid and network
//! namespace. Each pid is authorized first and read on the pidfd the
//! authorization pinned; a read whose start time is not that process's is
//! of a reused pid, and the pid is gone. After the reads each process is
//! authorized again and held to what was seen of it before (credentials,
//! dumpable, capabilities, executable, address space): one that exec'd
//! in between is `refused`, as one the caller may not read. Memory is read by an abandonable
//! reader child within the request's budget, as in a check. A caller other
//! than root gets no kernel stacks (the kernel shows them to
//! `CAP_SYS_ADMIN` only).

use std::{
    collections::{BTreeMap, BTreeSet},
    os::fd::AsFd as _,
    time::{Duration, Instant},
};

use selfheal_core::{
    inspect::FULL_IS_PROCFS,
    proc::{Detail, TaskClocks},
    protocol::{
        Caller, CollectRequest, CollectResult, CollectedProcess, NamespacesResult,
        ProcessNamespaces, READ_BY_ITERATORS, WireError,
    },
    sockdiag::TcpSocket,
};
use serde_json::Value;

use super::{Shared, lock};
use crate::helper::access::authz::masked;
use crate::{
    ebpf::{chain, iter::IterError},
    proc::{self, MemAccess},
    sys::{
        memread::Reader,
        procfs::ProcRoot,
        sockdiag::{self, SockDiagError},
    },
};

impl Shared {
    /// Reads each pid the caller may query as a check reads it, within
    /// `req.budget_ms` for all of them.
    pub(super) fn collect(
        &self,
        caller: &Caller,
        same_ns: bool,
        req: &CollectRequest,
    ) -> Result<Value, WireError> {
        let deadline = Instant::now() + Duration::from_millis(req.budget_ms);
        let clocks = if req.detail == Detail::Minimal {
            TaskClocks::default()
        } else {
            proc::task_clocks()
        };
        let root = ProcRoot::default();
        let mut reader = Reader::default();
        let mut dumps: BTreeMap<u64, Result<Vec<TcpSocket>, SockDiagError>> = BTreeMap::new();
        let mut result = CollectResult {
            processes: Vec::new(),
            gone: Vec::new(),
            refused: Vec::new(),
            over_budget: Vec::new(),
        };
        for (i, &pid) in req.pids.iter().enumerate() {
            if Instant::now() >= deadline {
                result.over_budget.extend_from_slice(&req.pids[i..]);
                break;
            }
            let mut one = self.authorize_query_pinned(caller, same_ns, &[pid])?;
            result.gone.append(&mut one.gone);
            result.refused.append(&mut one.refused);
            let Some(pinned) = one.ok.pop() else {
                continue;
            };
            let fd = &pinned.fd;
            // The pass under the iterators' lock; the reads after it without.
            let pass = if req.detail == Detail::Full {
                Err(FULL_IS_PROCFS.to_string())
            } else {
                match &mut *lock(&self.iterators) {
                    Ok(it) => match it.process(fd.as_fd()) {
                        Ok(pass) => Ok(pass),
                        Err(IterError::Gone) => {
                            result.gone.push(pid);
                            continue;
                        }
                        Err(e) => Err(format!("the helper's task iterators: {}", chain(&e))),
                    },
                    Err(why) => Err(format!("the helper has no task iterators: {why}")),
                }
            };
            let mut access = MemAccess {
                reader: &mut reader,
                deadline,
                over: false,
            };
            let (read, read_by) = match pass {
                Ok(pass) => (
                    proc::process_iterated(
                        &root,
                        pid,
                        &pass.threads,
                        &pass.sockets,
                        req.detail,
                        &clocks,
                        &mut access,
                    ),
                    READ_BY_ITERATORS.to_string(),
                ),
                Err(why) => (
                    proc::process_in(&root, pid, req.detail, &clocks, &mut access),
                    why,
                ),
            };
            let over = access.over;
            let net_ns = root.namespace(pid, "net").ok();
            match read {
                Ok(mut process) if process.start_ticks == fd.start_ticks() && fd.is_alive() => {
                    if caller.uid != 0 {
                        withhold_kernel_stacks(&mut process);
                    }
                    let (tcp, tcp_error) = match (net_ns, process.sockets.is_empty()) {
                        (Some(ns), false) => {
                            let dump = dumps
                                .entry(ns)
                                .or_insert_with(|| sockdiag::dump_tcp_in_netns_of(pid));
                            held(dump, &process.sockets)
                        }
                        (None, false) => (
                            None,
                            Some(format!("cannot read pid {pid}'s network namespace")),
                        ),
                        (_, true) => (None, None),
                    };
                    // Authorized again after every read: an exec during
                    // them (a setuid one keeps the pid and start time)
                    // makes the whole answer another program's.
                    if !pinned.still_readable() {
                        result.refused.push(pid);
                        continue;
                    }
                    if over {
                        result.over_budget.push(pid);
                    }
                    result.processes.push(CollectedProcess {
                        pid,
                        start_ticks: fd.start_ticks(),
                        process,
                        read_by,
                        net_ns,
                        tcp,
                        tcp_error,
                    });
                }
                // Exited, or a reused pid read by its path: gone.
                _ => result.gone.push(pid),
            }
        }
        let (gone, refused) = masked(caller, result.gone, result.refused);
        result.gone = gone;
        result.refused = refused;
        Ok(serde_json::to_value(result).unwrap_or(Value::Null))
    }

    /// Each pid's pid and network namespace, for each pid the caller may
    /// query.
    pub(super) fn namespaces(
        &self,
        caller: &Caller,
        same_ns: bool,
        pids: &[u32],
    ) -> Result<Value, WireError> {
        let root = ProcRoot::default();
        let authorized = self.authorize_query_pinned(caller, same_ns, pids)?;
        let mut gone = authorized.gone;
        let mut refused = authorized.refused;
        let mut processes = Vec::new();
        for pinned in authorized.ok {
            let fd = &pinned.fd;
            let pid = fd.pid();
            let read = ProcessNamespaces {
                pid,
                start_ticks: fd.start_ticks(),
                pid_ns: root.namespace(pid, "pid").ok(),
                net_ns: root.namespace(pid, "net").ok(),
            };
            // Read by the pid's path: only while the pinned process lives
            // is it that process's.
            if !(fd.is_alive() && crate::sys::pidfd::start_ticks(pid) == Some(fd.start_ticks())) {
                gone.push(pid);
            } else if pinned.still_readable() {
                processes.push(read);
            } else {
                refused.push(pid);
            }
        }
        let (gone, refused) = masked(caller, gone, refused);
        let result = NamespacesResult {
            processes,
            gone,
            refused,
        };
        Ok(serde_json::to_value(result).unwrap_or(Value::Null))
    }
}

/// What the kernel shows no caller without `CAP_SYS_ADMIN`, even of its
/// own processes: their kernel stacks (`/proc/PID/stack`). Taken out of a
/// read for a caller other than root, with a gap that says so.
fn withhold_kernel_stacks(process: &mut selfheal_core::proc::ProcessInfo) {
    let mut had = false;
    for t in &mut process.threads {
        had |= !t.kstack.is_empty();
        t.kstack.clear();
    }
    if had {
        process
            .gaps
            .push("kernel stacks are root's to read (the kernel asks CAP_SYS_ADMIN)".into());
    }
}

/// The sockets of `dump` among `sockets` (`(fd, inode)`), in the dump's
/// order; or why the dump failed.
fn held(
    dump: &Result<Vec<TcpSocket>, SockDiagError>,
    sockets: &[(i32, u64)],
) -> (Option<Vec<TcpSocket>>, Option<String>) {
    match dump {
        Ok(all) => {
            let inodes: BTreeSet<u64> = sockets.iter().map(|(_, ino)| *ino).collect();
            let mine = all
                .iter()
                .filter(|s| inodes.contains(&s.inode))
                .cloned()
                .collect();
            (Some(mine), None)
        }
        Err(why) => (None, Some(why.to_string())),
    }
}
