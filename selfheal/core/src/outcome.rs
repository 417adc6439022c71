//! The result of checking one agent ([`Outcome`]): its verdict and
//! reasons, the snapshot, the probes, the prove stage's events and what
//! the ladder decided and did. `check --json` prints it; [`render`] writes
//! it for people, and [`crate::metrics`] counts it.

pub mod render;

use serde::Serialize;

use crate::{
    judge::{self, Verdict},
    ladder::Decision,
    probe::ProbeResult,
    protocol::Act,
    prove::ProofEvent,
    runtime::Identity,
};

/// The result of checking one agent.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub agent: String,
    /// The containers the agent's processes are in (absent on the host).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<Identity>,
    pub verdict: Verdict,
    pub reasons: Vec<judge::Reason>,
    /// The forensic snapshot's id, when one was written.
    pub snapshot: Option<String>,
    /// Why the snapshot could not be written, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_error: Option<String>,
    /// The previous verdict, when this check changed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous: Option<Verdict>,
    #[serde(skip)]
    pub transition: bool,
    /// Milliseconds the agent had been in its previous verdict, on a transition.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_for_ms: Option<u64>,
    pub probes: Vec<ProbeResult>,
    /// What could not be seen.
    pub gaps: Vec<String>,
    /// What the prove stage did in this check (proof keepalives armed and
    /// options put back).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub proofs: Vec<ProofEvent>,
    /// What the healing ladder decided and did, for a wedged agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heal: Option<HealReport>,
    /// What the metrics need of the evidence (not in the JSON: `inspect`
    /// has all of it).
    #[serde(skip)]
    pub evidence: EvidenceSummary,
}

/// The facts of an agent's evidence the metrics carry.
#[derive(Clone, Debug, Default)]
pub struct EvidenceSummary {
    /// The eBPF strategy the evidence came from, if any.
    pub strategy: Option<&'static str>,
    /// The agent's processes (0: none found).
    pub processes: usize,
    /// Of those, the processes the kernel's task iterators read.
    pub iterated: usize,
    /// Zombies in its tree.
    pub zombies: usize,
}

/// The ladder's decision for one agent in one check, and the actions taken.
#[derive(Clone, Debug, Serialize)]
pub struct HealReport {
    pub decision: Decision,
    /// `true` when the steps were only decided (`--dry-run`).
    pub dry_run: bool,
    pub actions: Vec<ActionOutcome>,
    /// The breaker opened in this check (log it once, not every check).
    #[serde(skip)]
    pub newly_gave_up: bool,
}

/// One step and how it went.
#[derive(Clone, Debug, Serialize)]
pub struct ActionOutcome {
    pub step: Act,
    pub ok: bool,
    /// The executor's result, or the error.
    pub detail: String,
}
