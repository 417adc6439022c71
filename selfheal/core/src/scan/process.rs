//! What is wrong with a process itself, as `inspect` shows it: its
//! unreaped children (with the missing-init diagnosis when it is PID 1 of
//! its pid namespace) and its threads in uninterruptible sleep.

use serde::Serialize;

use super::{Owner, render::age};
use crate::{inspect::missing_init, proc::ThreadInfo, text::escape};

/// The most zombies one process finding lists (all are counted).
pub const MAX_ZOMBIES_LISTED: usize = 32;
/// The most D-state threads one process finding lists (all are counted).
pub const MAX_D_STATE_LISTED: usize = 32;

/// A process as the census read it, for its own findings: who, whether it
/// is PID 1 of its pid namespace, its threads (their state, wait channel
/// and age) and its unreaped children.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessState {
    pub owner: Owner,
    pub pid_ns_init: bool,
    pub threads: Vec<ThreadInfo>,
    /// Its children in state Z, by pid and comm.
    pub zombies: Vec<Zombie>,
}

/// A child that exited and that its parent has not reaped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Zombie {
    pub pid: u32,
    /// Its `comm`, which it controlled.
    pub comm: String,
}

/// A thread in uninterruptible sleep.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DStateThread {
    pub tid: u32,
    /// The thread's own name, which the process controls.
    pub name: String,
    /// The kernel function it sleeps in, where read.
    pub wchan: Option<String>,
    /// How long it has not run, where known.
    pub blocked_ms: Option<u64>,
}

/// What is wrong with one process itself (`scan --json`: one object each,
/// `"kind": "process"`, after the connections).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProcessFinding {
    /// Always `process`: tells these lines from the connections'.
    pub kind: &'static str,
    /// The process (`pid`, `comm`, and the identity fields where known).
    #[serde(flatten)]
    pub owner: Owner,
    /// Whether it is PID 1 of its own pid namespace (the init that must
    /// reap orphans).
    pub pid_ns_init: bool,
    /// Its unreaped children, the first [`MAX_ZOMBIES_LISTED`].
    pub zombies: Vec<Zombie>,
    /// All of them, counted.
    pub zombie_count: usize,
    /// Set when it is PID 1 of its pid namespace and leaves zombies:
    /// `inspect`'s missing-init diagnosis.
    pub missing_init: Option<String>,
    /// Its threads in D state for at least the threshold (or for an age
    /// not known), the first [`MAX_D_STATE_LISTED`].
    pub d_state: Vec<DStateThread>,
    /// All of them, counted.
    pub d_state_count: usize,
}

/// The findings of each process in `processes` that has unreaped children
/// or a thread in D state for at least `silent_for_ms` (or for an age not
/// known), by pid.
pub fn process_findings(processes: &[ProcessState], silent_for_ms: u64) -> Vec<ProcessFinding> {
    let mut out: Vec<ProcessFinding> = processes
        .iter()
        .filter_map(|p| {
            let d_state: Vec<DStateThread> = p
                .threads
                .iter()
                .filter(|t| t.state == 'D' && t.idle_ms.is_none_or(|ms| ms >= silent_for_ms))
                .map(|t| DStateThread {
                    tid: t.tid,
                    name: t.name.clone(),
                    wchan: t.wchan.clone(),
                    blocked_ms: t.idle_ms,
                })
                .collect();
            if d_state.is_empty() && p.zombies.is_empty() {
                return None;
            }
            let zombie_count = p.zombies.len();
            let missing_init = (p.pid_ns_init && zombie_count > 0)
                .then(|| missing_init(zombie_count, p.owner.pid));
            Some(ProcessFinding {
                kind: "process",
                owner: p.owner.clone(),
                pid_ns_init: p.pid_ns_init,
                zombies: p.zombies.iter().take(MAX_ZOMBIES_LISTED).cloned().collect(),
                zombie_count,
                missing_init,
                d_state_count: d_state.len(),
                d_state: d_state.into_iter().take(MAX_D_STATE_LISTED).collect(),
            })
        })
        .collect();
    out.sort_by_key(|f| f.owner.pid);
    out
}

/// One process finding in words, for the table's `processes:` section.
pub(super) fn process_text(f: &ProcessFinding) -> String {
    let mut parts = Vec::new();
    if f.zombie_count > 0 {
        let pids: Vec<String> = f
            .zombies
            .iter()
            .map(|z| format!("{} {}", z.pid, escape(&z.comm)))
            .collect();
        let more = f.zombie_count - f.zombies.len();
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        parts.push(format!(
            "{} zombie child(ren) not reaped ({}{more})",
            f.zombie_count,
            pids.join(", ")
        ));
    }
    if let Some(d) = &f.missing_init {
        parts.push(escape(d));
    }
    for t in &f.d_state {
        let wchan = t
            .wchan
            .as_deref()
            .map_or(String::new(), |w| format!(" in {}", escape(w)));
        parts.push(format!(
            "thread {} ({}) in D state (uninterruptible) for {}{wchan}",
            t.tid,
            escape(&t.name),
            age(t.blocked_ms)
        ));
    }
    let more = f.d_state_count - f.d_state.len();
    if more > 0 {
        parts.push(format!("{more} more thread(s) in D state"));
    }
    format!(
        "  pid {} {}: {}; next: selfheal inspect --pid {}",
        f.owner.pid,
        escape(&f.owner.comm),
        parts.join("; "),
        f.owner.pid
    )
}
