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
    inspect::human_ms,
    keepalive::{KeepaliveSettings, ProofKeepalive},
    protocol::{Act, SocketRef},
    sockdiag::TcpInfo,
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

/// What a proof keepalive's socket says of its peer at one reading.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Data arrived since it was armed.
    Data,
    /// The peer acknowledged a probe since it was armed.
    Answered,
    /// `count` probes went unanswered, each given its whole interval.
    Dead {
        /// A sentence for the report.
        why: String,
    },
    /// Neither yet.
    Pending,
}

impl Answer {
    /// Whether the peer showed itself (data or an answered probe).
    pub fn alive(&self) -> bool {
        matches!(self, Answer::Data | Answer::Answered)
    }
}

impl Proof {
    /// The proof armed at `now_ms` on `target` with `ka`, on a socket the
    /// kernel's keepalive timer saw silent for `silent_ms` (so its first
    /// probe goes that much sooner), whose own options were `previous`.
    pub fn armed(
        target: &ProofTarget,
        ka: &ProofKeepalive,
        silent_ms: u64,
        previous: KeepaliveSettings,
        now_ms: u64,
    ) -> Proof {
        Proof {
            pid: target.pid,
            start_ticks: target.start_ticks,
            fd: target.fd,
            inode: target.inode,
            armed_at_ms: now_ms,
            first_probe_ms: (u64::from(ka.idle_s) * 1000).saturating_sub(silent_ms),
            interval_ms: u64::from(ka.interval_s) * 1000,
            count: ka.count,
            previous,
            restore_failures: 0,
            restore_error: None,
        }
    }

    /// How long after arming the peer is proven dead at the latest, if it
    /// answers nothing: the first probe, then `count` intervals.
    pub fn bound_ms(&self) -> u64 {
        self.first_probe_ms
            .saturating_add(u64::from(self.count).saturating_mul(self.interval_ms))
    }

    /// What `info` says of the peer. It was read between `now_ms` (the
    /// check's start) and `read_ms` (a clock reading after the read). The
    /// ages in `tcp_info` count back from the moment of the read, so an
    /// ACK or data younger than the time from arming to `read_ms` came
    /// after arming (counting from `now_ms` instead would miss an answer
    /// that came sooner after arming than the read came after the check's
    /// start). A proof is dead only if it was given its whole bound by
    /// `now_ms`, which is before the probes were counted.
    pub fn answer(&self, info: &TcpInfo, now_ms: u64, read_ms: u64) -> Answer {
        let answered_within = self.armed_for(read_ms.max(now_ms));
        let silent = u64::from(info.last_data_recv_ms);
        if silent < answered_within {
            return Answer::Data;
        }
        if u64::from(info.last_ack_recv_ms) < answered_within {
            return Answer::Answered;
        }
        let armed_for = self.armed_for(now_ms);
        if info.unacked == 0 && self.proves_dead(info.probes, armed_for) {
            return Answer::Dead {
                why: format!(
                    "proof keepalive armed {} ago: {} probe(s) unanswered, {} apart; nothing from the peer for {}",
                    human_ms(armed_for),
                    info.probes,
                    human_ms(self.interval_ms),
                    human_ms(silent)
                ),
            };
        }
        Answer::Pending
    }

    /// How long it has been armed at `now_ms`.
    pub fn armed_for(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.armed_at_ms)
    }

    /// Whether `probes` unanswered probes, `armed_for` after arming, prove
    /// the peer dead: `count` of them, each given its whole interval.
    pub fn proves_dead(&self, probes: u8, armed_for: u64) -> bool {
        u32::from(probes) >= self.count && armed_for >= self.bound_ms()
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

#[cfg(test)]
mod answer_tests {
    use super::*;

    fn armed() -> Proof {
        let ka = ProofKeepalive {
            idle_s: 5,
            interval_s: 5,
            count: 3,
            hold_ms: 120_000,
        };
        let t = ProofTarget {
            pid: 7,
            start_ticks: 1,
            fd: 3,
            inode: 9,
        };
        // Silent 2 s when armed at 100 s: the first probe 3 s later.
        let off = KeepaliveSettings {
            enabled: false,
            idle_s: 7200,
            interval_s: 75,
            count: 9,
            user_timeout_ms: 0,
        };
        Proof::armed(&t, &ka, 2_000, off, 100_000)
    }

    fn info(recv_ago: u32, ack_ago: u32, probes: u8) -> TcpInfo {
        TcpInfo {
            last_data_recv_ms: recv_ago,
            last_ack_recv_ms: ack_ago,
            probes,
            ..TcpInfo::default()
        }
    }

    #[test]
    fn a_proof_is_answered_by_data_or_an_ack_after_arming_and_dead_only_at_its_bound() {
        let p = armed();
        assert_eq!(p.first_probe_ms, 3_000);
        assert_eq!(p.bound_ms(), 18_000);
        // 4 s after arming: data 1 s ago, an ACK 1 s ago, or neither.
        assert_eq!(
            p.answer(&info(1_000, 9_000, 0), 104_000, 104_000),
            Answer::Data
        );
        assert_eq!(
            p.answer(&info(9_000, 1_000, 0), 104_000, 104_000),
            Answer::Answered
        );
        assert_eq!(
            p.answer(&info(9_000, 9_000, 1), 104_000, 104_000),
            Answer::Pending
        );
        // An ACK from before arming is no answer.
        assert_eq!(
            p.answer(&info(30_000, 5_000, 3), 104_000, 104_000),
            Answer::Pending
        );
        // Three probes unanswered, a moment before the bound, then at it.
        assert_eq!(
            p.answer(&info(30_000, 30_000, 3), 117_999, 117_999),
            Answer::Pending
        );
        assert!(matches!(
            p.answer(&info(30_000, 30_000, 3), 118_000, 118_000),
            Answer::Dead { .. }
        ));
        // Fewer probes than asked, however long: not dead.
        assert_eq!(
            p.answer(&info(60_000, 60_000, 2), 160_000, 160_000),
            Answer::Pending
        );
        // Data in flight: its retransmissions, not probes, decide.
        let mut i = info(30_000, 30_000, 3);
        i.unacked = 1;
        assert_eq!(p.answer(&i, 118_000, 118_000), Answer::Pending);
    }

    /// The ages count back from the read, not from the check's start: an
    /// ACK 100 ms after arming, read 300 ms after a check that started
    /// 200 ms after arming, is an answer (from the start, its age of
    /// 400 ms is older than the 200 ms armed); an ACK from before arming is
    /// none however late the read; and dead waits for the whole bound from
    /// the start, however late the read.
    #[test]
    fn a_proof_is_answered_by_ages_counted_from_the_read_and_dead_by_the_start() {
        let p = armed();
        let at = p.armed_at_ms;
        assert_eq!(
            p.answer(&info(9_000, 400, 0), at + 200, at + 500),
            Answer::Answered
        );
        assert_eq!(
            p.answer(&info(400, 9_000, 0), at + 200, at + 500),
            Answer::Data
        );
        assert_eq!(
            p.answer(&info(9_000, 501, 0), at + 200, at + 500),
            Answer::Pending
        );
        assert_eq!(
            p.answer(&info(30_000, 30_000, 3), at + 17_999, at + 19_000),
            Answer::Pending
        );
        // A read stamped before the start (a clock that went back) counts
        // from the start.
        assert_eq!(
            p.answer(&info(9_000, 150, 0), at + 200, at + 100),
            Answer::Answered
        );
    }
}
