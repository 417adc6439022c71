//! The prove stage's model: what a proof keepalive is, what history keeps
//! of one, and the work the judge asks of the stage. Pure types; the judge
//! decides ([`crate::judge`]), `check` carries the work out through its
//! executor (`selfheal::heal::Executor`) and records it here.
//!
//! Why a stage of its own: an agent silently awaiting an LLM's first token
//! sends nothing, so nothing but a question put to its peer can prove the
//! connection dead. A suspect upstream socket with a call in flight gets a
//! *proof keepalive* (short `SO_KEEPALIVE` probes through `pidfd_getfd`,
//! `selfheal::actions::keepalive::arm_proof_keepalive`). A live peer answers the first
//! probe; its socket's own options are then put back, read back and
//! compared, so a live call keeps no trace. A dead peer answers none: after
//! `count` probes, each given `interval`, the judge calls the socket dead,
//! the check writes its snapshot, and the ladder's first step ends the
//! connection as a keepalive timeout (`selfheal::actions::keepalive::expire_keepalive`):
//! the agent's blocked read fails with `ETIMEDOUT` and its own error path
//! runs, same pid.
//!
//! Proving is an observation, not a healing step: it needs no `wedged`
//! verdict and no snapshot, takes no budget, and is logged and audited.

use serde::{Deserialize, Serialize};

use crate::{
    keepalive::{KeepaliveSettings, ProofKeepalive},
    protocol::{Act, SocketRef},
};

/// A proof keepalive armed on one socket; history keeps it by socket cookie
/// until the peer answers (options put back) or the socket goes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proof {
    pub pid: u32,
    pub start_ticks: u64,
    pub fd: i32,
    pub inode: u64,
    /// When it was armed (`CLOCK_BOOTTIME` ms).
    pub armed_at_ms: u64,
    /// When the first probe was due, from arming (0 when the socket was
    /// already silent longer than the proof's idle time).
    pub first_probe_ms: u64,
    /// Between probes, and how long each has to be answered.
    pub interval_ms: u64,
    /// Unanswered probes that prove the peer dead.
    pub count: u32,
    /// The socket's own options, to put back.
    pub previous: KeepaliveSettings,
    /// Failed attempts to put them back, and the last error.
    #[serde(default)]
    pub restore_failures: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_error: Option<String>,
}

impl Proof {
    /// How long it has been armed at `now_ms`.
    pub fn armed_for(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.armed_at_ms)
    }

    /// Whether `probes` unanswered probes, `armed_for` after arming, prove
    /// the peer dead: `count` of them, each given its whole interval.
    pub fn proves_dead(&self, probes: u8, armed_for: u64) -> bool {
        u32::from(probes) >= self.count
            && armed_for
                >= self
                    .first_probe_ms
                    .saturating_add(u64::from(self.count).saturating_mul(self.interval_ms))
    }
}

/// A peer that answered its proofs; history keeps it by socket cookie while
/// the socket lives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answered {
    /// When it last answered (`CLOCK_BOOTTIME` ms).
    pub at_ms: u64,
    /// Proof rounds it answered.
    pub rounds: u32,
}

/// Which socket a proof action is for: the holder's identity, the fd, and
/// the inode the fd must still hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProofTarget {
    pub pid: u32,
    pub start_ticks: u64,
    pub fd: i32,
    pub inode: u64,
}

impl ProofTarget {
    fn socket(&self) -> SocketRef {
        SocketRef {
            fd: self.fd,
            inode: self.inode,
        }
    }

    /// The act that arms `keepalive` on this socket.
    pub fn prove(&self, keepalive: &ProofKeepalive) -> Act {
        Act::ProveKeepalive {
            pid: self.pid,
            start_ticks: self.start_ticks,
            socket: self.socket(),
            keepalive: keepalive.clone(),
        }
    }

    /// The act that puts `previous` back on this socket.
    pub fn restore(&self, previous: &KeepaliveSettings) -> Act {
        Act::RestoreKeepalive {
            pid: self.pid,
            start_ticks: self.start_ticks,
            socket: self.socket(),
            previous: Some(previous.clone()),
        }
    }
}

/// Work the judge asks of the prove stage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "work", rename_all = "snake_case")]
pub enum ProofWork {
    /// Arm a proof keepalive on a suspect socket with a call in flight.
    Arm {
        cookie: u64,
        target: ProofTarget,
        /// How long the socket had been silent (for the first probe's time).
        silent_ms: u64,
        remote: String,
    },
    /// The peer answered (or data came): put the socket's options back.
    Restore {
        cookie: u64,
        /// The socket as the report shows it now.
        target: ProofTarget,
        remote: String,
        /// Whether the peer answered (else: proofs were turned off, or the
        /// ladder will not end a dead socket).
        answered: bool,
    },
}

/// Failed restores after which a proof is given up on (and reported).
pub const MAX_RESTORE_FAILURES: u32 = 3;

/// What the prove stage did on one socket in one check, for the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProofEvent {
    /// `arm` or `restore`.
    pub action: &'static str,
    pub inode: u64,
    pub remote: String,
    pub ok: bool,
    /// What was set or put back, or why not.
    pub detail: String,
}
