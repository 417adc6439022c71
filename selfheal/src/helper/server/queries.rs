//! The queries: `hello`, the eBPF tracer the helper keeps attached with
//! the requests on it (`watch`, `unwatch`, `ebpf_snapshot`), and one pass
//! of the pinned task iterators (`iterate`): every pid authorized first,
//! each owner's share of the pid filter bounded, entries of a pid that
//! exited or was reused dropped before anyone sees them, and a pass run
//! on the pidfd the authorization pinned, so it is of the process that
//! was authorized, and answered only when that process is authorized
//! again after it, unchanged (no exec between).

use std::{collections::BTreeMap, os::fd::AsFd as _};

use selfheal_core::{
    access::owner::Account,
    protocol::{
        AttemptWire, Caller, EbpfStatus, ErrorCode, HelloResult, IterateResult, IteratedProcess,
        Limits, MAX_PIDS, MAX_REQUEST_BYTES, PROTOCOL_VERSION, UnwatchResult, WatchResult,
        WatchedPid, WireError, filter_snapshot,
    },
};
use serde_json::Value;

use super::{Shared, lock, refusal};
use crate::helper::access::authz::Authorized;
use crate::{
    ebpf::{Tracer, TracerError, TracerOptions, chain},
    sys::pidfd::start_ticks,
};

/// Why a helper started without `--tracer` has no tracer evidence.
pub(super) const TRACER_OFF: &str =
    "the receive tracer is off (the helper attaches it with --tracer)";

/// Attaches the receive tracer where asked; `iterators` tells, for the
/// status of a helper without it, whether eBPF is off altogether.
pub(super) fn attach(
    opts: Option<&TracerOptions>,
    iterators: bool,
) -> (Option<Tracer>, EbpfStatus) {
    let Some(opts) = opts else {
        let why = if iterators {
            TRACER_OFF
        } else {
            "eBPF is disabled (--no-ebpf)"
        };
        return (
            None,
            EbpfStatus {
                strategy: None,
                attempts: Vec::new(),
                error: Some(why.into()),
            },
        );
    };
    let wire = |a: &selfheal_core::ebpf::Attempt| AttemptWire {
        strategy: a.strategy.name().into(),
        error: a.error.clone(),
    };
    match Tracer::attach(opts) {
        Ok(t) => {
            let status = EbpfStatus {
                strategy: Some(t.strategy().name().into()),
                attempts: t.attempts().iter().map(wire).collect(),
                error: None,
            };
            (Some(t), status)
        }
        Err(e) => {
            let attempts = match &e {
                TracerError::NoStrategy { attempts } => attempts.iter().map(wire).collect(),
                _ => Vec::new(),
            };
            (
                None,
                EbpfStatus {
                    strategy: None,
                    attempts,
                    error: Some(chain(&e)),
                },
            )
        }
    }
}

/// Why the helper has no task iterators, or none pinned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoIterators {
    /// The helper runs with eBPF off.
    #[error("eBPF is disabled (--no-ebpf)")]
    Disabled,
    /// Only root may load or pin them.
    #[error("the helper is not root")]
    NotRoot,
    /// Pinning, opening and loading them failed (`why`: each failure's
    /// chain).
    #[error("{why}")]
    Failed { why: String },
    /// They could not be pinned (`why`), and were loaded for the helper's
    /// own passes.
    #[error("{why}; loaded unpinned for the helper's own passes (`iterate`, `collect`)")]
    Unpinned { why: String },
}

/// Pins the task iterators (root, eBPF on) and opens them from their
/// pins, as a check does; or why not.
pub(super) fn pin_iterators(
    ebpf: bool,
) -> (
    Result<crate::ebpf::iter::TaskIter, NoIterators>,
    Result<std::path::PathBuf, NoIterators>,
) {
    use crate::ebpf::iter;
    if !ebpf {
        return (Err(NoIterators::Disabled), Err(NoIterators::Disabled));
    }
    if crate::sys::creds::euid() != 0 {
        return (Err(NoIterators::NotRoot), Err(NoIterators::NotRoot));
    }
    // This build's pins, made before the helper started (the unit's
    // `ExecStartPre=+`, outside the sandbox that keeps the bpffs
    // read-only), or by the helper now.
    let opened = iter::open_published().or_else(|pinned| {
        iter::publish()
            .and_then(|dir| iter::open_first(std::slice::from_ref(&dir)))
            .map_err(|e| format!("{} (and {})", chain(&e), chain(&pinned)))
    });
    match opened {
        Ok((it, dir)) => (Ok(it), Ok(dir)),
        // Nowhere to pin them (no mount allowed, as under a container
        // runtime's default AppArmor profile): loaded for the helper's own
        // passes, which need no pin.
        Err(why) => match iter::load() {
            Ok(it) => (Ok(it), Err(NoIterators::Unpinned { why })),
            Err(e) => {
                let failed = NoIterators::Failed {
                    why: format!("{} (and {why})", chain(&e)),
                };
                (Err(failed.clone()), Err(failed))
            }
        },
    }
}

pub(super) struct TracerState {
    pub(super) tracer: Option<Tracer>,
    /// Watched pid → the process it was (start time) and the uids that
    /// asked; it leaves the filter when the last uid withdraws or it exits.
    pub(super) watched: BTreeMap<u32, Watched>,
}

pub(super) struct Watched {
    pub(super) start_ticks: u64,
    /// The uids that asked, and the owner each counts against.
    pub(super) uids: BTreeMap<u32, u32>,
}

impl TracerState {
    /// Forgets watched pids that exited or now name another process.
    fn prune(&mut self) {
        let stale: Vec<u32> = self
            .watched
            .iter()
            .filter(|(pid, w)| start_ticks(**pid) != Some(w.start_ticks))
            .map(|(pid, _)| *pid)
            .collect();
        for pid in stale {
            if let Some(t) = self.tracer.as_mut() {
                let _ = t.unwatch(pid);
            }
            self.watched.remove(&pid);
        }
    }
}

impl Shared {
    pub(super) fn hello(&self, caller: &Caller) -> Value {
        let hello = HelloResult {
            protocol: PROTOCOL_VERSION,
            helper_version: env!("CARGO_PKG_VERSION").into(),
            helper_pid: self.helper_pid,
            caller: *caller,
            ebpf: self.ebpf.clone(),
            limits: Limits {
                max_request_bytes: MAX_REQUEST_BYTES,
                request_timeout_ms: self.request_timeout.as_millis() as u64,
                max_pids: MAX_PIDS,
            },
        };
        serde_json::to_value(hello).unwrap_or(Value::Null)
    }

    /// `Err` of [`Self::no_tracer`] when no tracer is attached.
    fn need_tracer(&self) -> Result<(), WireError> {
        if lock(&self.tracer).tracer.is_none() {
            return Err(self.no_tracer());
        }
        Ok(())
    }

    fn no_tracer(&self) -> WireError {
        refusal(
            ErrorCode::Unavailable,
            format!(
                "no eBPF tracer: {}",
                self.ebpf.error.as_deref().unwrap_or("not attached")
            ),
        )
    }

    pub(super) fn watch(
        &self,
        caller: &Caller,
        account: &Account,
        same_ns: bool,
        pids: &[u32],
    ) -> Result<Value, WireError> {
        self.need_tracer()?;
        let Authorized { ok, gone, refused } = self.authorize_query(caller, same_ns, pids)?;
        let mut st = lock(&self.tracer);
        st.prune();
        let TracerState { tracer, watched } = &mut *st;
        let Some(tracer) = tracer.as_mut() else {
            return Err(self.no_tracer());
        };
        // Counted per owner: a pid any uid of the owner watches is one.
        let owner = account.owner;
        let owns = |w: &Watched| w.uids.values().any(|o| *o == owner);
        let held = watched.values().filter(|w| owns(w)).count();
        let new = ok
            .iter()
            .filter(|(pid, start)| {
                !watched
                    .get(pid)
                    .is_some_and(|w| w.start_ticks == *start && owns(w))
            })
            .count();
        if held + new > self.max_watched {
            return Err(refusal(
                ErrorCode::Busy,
                format!(
                    "{account} would watch more than {} pids; unwatch some first",
                    self.max_watched
                ),
            ));
        }
        let mut out = Vec::new();
        for (pid, start) in ok {
            match watched.get_mut(&pid) {
                Some(w) if w.start_ticks == start => {
                    w.uids.insert(caller.uid, owner);
                }
                _ => {
                    // The process's own owner, not the asker's: its
                    // entries in the socket map count against it.
                    let of = self.owners.of_process(pid).owner;
                    tracer.watch(pid, of).map_err(|e| {
                        refusal(ErrorCode::Failed, format!("watch pid {pid}: {}", chain(&e)))
                    })?;
                    watched.insert(
                        pid,
                        Watched {
                            start_ticks: start,
                            uids: BTreeMap::from([(caller.uid, owner)]),
                        },
                    );
                }
            }
            out.push(WatchedPid {
                pid,
                since_ns: tracer.watched_since(pid).unwrap_or(tracer.attached_at_ns()),
            });
        }
        let result = WatchResult {
            attached_at_ns: tracer.attached_at_ns(),
            watched: out,
            gone,
            refused,
        };
        Ok(serde_json::to_value(result).unwrap_or(Value::Null))
    }

    pub(super) fn unwatch(&self, caller: &Caller, pids: &[u32]) -> Result<Value, WireError> {
        // Withdrawing one's own interest needs no authorization: it cannot
        // take anything from anyone else.
        let mut st = lock(&self.tracer);
        if st.tracer.is_none() {
            return Err(self.no_tracer());
        }
        let TracerState { tracer, watched } = &mut *st;
        let mut unwatched = Vec::new();
        for &pid in pids {
            let Some(w) = watched.get_mut(&pid) else {
                continue;
            };
            if w.uids.remove(&caller.uid).is_none() {
                continue;
            }
            unwatched.push(pid);
            if w.uids.is_empty() {
                watched.remove(&pid);
                if let Some(t) = tracer.as_mut() {
                    t.unwatch(pid).map_err(|e| {
                        refusal(
                            ErrorCode::Failed,
                            format!("unwatch pid {pid}: {}", chain(&e)),
                        )
                    })?;
                }
            }
        }
        Ok(serde_json::to_value(UnwatchResult { unwatched }).unwrap_or(Value::Null))
    }

    /// One pass of the task iterators over each pid the caller may query,
    /// on the pidfd its authorization pinned.
    pub(super) fn iterate(
        &self,
        caller: &Caller,
        same_ns: bool,
        pids: &[u32],
    ) -> Result<Value, WireError> {
        let unavailable = |why: &NoIterators| {
            refusal(ErrorCode::Unavailable, format!("no task iterators: {why}"))
        };
        if let Err(why) = &*lock(&self.iterators) {
            return Err(unavailable(why));
        }
        let (mut processes, mut gone, mut refused) = (Vec::new(), Vec::new(), Vec::new());
        // One pid at a time: its pidfd is held only for its own pass, and
        // the iterators are locked only while they walk it (not while the
        // next pid is authorized).
        for &pid in pids {
            let mut one = self.authorize_query_pinned(caller, same_ns, &[pid])?;
            gone.append(&mut one.gone);
            refused.append(&mut one.refused);
            let Some(pinned) = one.ok.pop() else {
                continue;
            };
            let start_ticks = pinned.fd.start_ticks();
            let walked = match &mut *lock(&self.iterators) {
                Ok(it) => it.process(pinned.fd.as_fd()),
                Err(why) => return Err(unavailable(why)),
            };
            match walked {
                // Authorized again after the pass: an exec during it makes
                // it another program's.
                Ok(_) if !pinned.still_readable() => refused.push(pid),
                Ok(pass) => processes.push(IteratedProcess {
                    pid,
                    start_ticks,
                    pass,
                }),
                Err(crate::ebpf::iter::IterError::Gone) => gone.push(pid),
                Err(e) => {
                    return Err(refusal(
                        ErrorCode::Failed,
                        format!("the task iterators on pid {pid}: {}", chain(&e)),
                    ));
                }
            }
        }
        let (gone, refused) = crate::helper::access::authz::masked(caller, gone, refused);
        let result = IterateResult {
            processes,
            gone,
            refused,
        };
        Ok(serde_json::to_value(result).unwrap_or(Value::Null))
    }

    pub(super) fn snapshot(
        &self,
        caller: &Caller,
        same_ns: bool,
        pids: &[u32],
    ) -> Result<Value, WireError> {
        self.need_tracer()?;
        let Authorized { ok, refused, .. } = self.authorize_query(caller, same_ns, pids)?;
        let allowed: Vec<u32> = ok.iter().map(|(pid, _)| *pid).collect();
        let mut st = lock(&self.tracer);
        // Entries of a pid that exited or was reused go first, so they are
        // never shown to the new process's owner.
        st.prune();
        let Some(tracer) = st.tracer.as_mut() else {
            return Err(self.no_tracer());
        };
        let snap = tracer
            .snapshot()
            .map_err(|e| refusal(ErrorCode::Failed, format!("eBPF snapshot: {}", chain(&e))))?;
        drop(st);
        let mut v = serde_json::to_value(filter_snapshot(snap, &allowed)).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut v {
            m.insert("refused".into(), refused.into());
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn why_there_are_no_iterators_is_said_in_the_words_the_log_and_refusals_use() {
        assert_eq!(
            NoIterators::Disabled.to_string(),
            "eBPF is disabled (--no-ebpf)"
        );
        assert_eq!(NoIterators::NotRoot.to_string(), "the helper is not root");
        let unpinned = NoIterators::Unpinned {
            why: "no bpffs".into(),
        };
        assert_eq!(
            unpinned.to_string(),
            "no bpffs; loaded unpinned for the helper's own passes (`iterate`, `collect`)"
        );
        // Not root: neither pinned nor loaded, and nothing is tried.
        if crate::sys::creds::euid() != 0 {
            let (it, at) = pin_iterators(true);
            assert_eq!(it.err(), Some(NoIterators::NotRoot));
            assert_eq!(at.err(), Some(NoIterators::NotRoot));
        }
        let (it, at) = pin_iterators(false);
        assert_eq!(it.err(), Some(NoIterators::Disabled));
        assert_eq!(at.err(), Some(NoIterators::Disabled));
    }
}
