//! What `check` remembers between runs, per agent: the judge's and the
//! ladder's memory, the metrics' counters ([`Counters`], folded in by
//! [`crate::metrics::observe`]) and the last snapshot written.
//! The edge loads and stores it (`selfheal::store`); a history from another
//! boot is started afresh.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{judge::AgentHistory, ladder::HealHistory};

/// What `check` remembers between runs, per agent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct History {
    /// The boot the times below belong to (`CLOCK_BOOTTIME` restarts at
    /// boot); a different boot starts a fresh history.
    pub boot_id: String,
    pub agents: BTreeMap<String, AgentRecord>,
}

/// One agent's memory: the judge's, the ladder's, plus counters for metrics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentRecord {
    pub judge: AgentHistory,
    #[serde(default)]
    pub heal: HealHistory,
    /// Transitions into `wedged` since the history began.
    #[serde(default)]
    pub wedges: u64,
    /// The metrics' counters: reasons, heals, proofs, the last snapshot.
    #[serde(default)]
    pub metrics: Counters,
    /// The last snapshot written for the agent ([`SNAPSHOT_REPEAT_MS`]).
    #[serde(default)]
    pub last_snapshot: Option<SnapshotMark>,
}

/// A snapshot written: its id, verdict, when, and the snapshot directory
/// it is in (a repeat names it only while checks write there).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotMark {
    pub id: String,
    pub verdict: String,
    pub at_ms: u64,
    #[serde(default)]
    pub dir: String,
}

/// An agent that stays in one verdict that is not ok, with no healing step
/// to take, gets a snapshot when it enters that verdict and then at most
/// one per this long; its check's `snapshot` names the last one written.
/// A check that may act always writes one ("no action without a snapshot").
pub const SNAPSHOT_REPEAT_MS: u64 = 10 * 60 * 1000;

/// One agent's counters, kept in its history record so they survive the
/// process (`#[serde(default)]`: history files from before them load).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Counters {
    /// Reason code → times it appeared (was absent from the check before).
    #[serde(default)]
    pub reasons: BTreeMap<String, u64>,
    /// `action/outcome` → healing steps taken.
    #[serde(default)]
    pub heals: BTreeMap<String, u64>,
    /// `event/outcome` → proof keepalive events (`arm`, `restore`).
    #[serde(default)]
    pub proofs: BTreeMap<String, u64>,
    /// The reason codes of the last check (to count appearances).
    #[serde(default)]
    pub last_reasons: Vec<String>,
    /// The snapshot of the last not-ok episode's first check: (id,
    /// verdict). Not every check's (each not-ok check writes one): the
    /// info series changes once per episode, not once per check.
    #[serde(default)]
    pub last_snapshot: Option<(String, String)>,
    /// Whether the current not-ok episode has set `last_snapshot`.
    #[serde(default)]
    pub episode_snapshot: bool,
    /// Checks of this agent whose verdict was not ok.
    #[serde(default)]
    pub not_ok_checks: u64,
}
