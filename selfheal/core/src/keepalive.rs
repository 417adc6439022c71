//! A socket's keepalive options, in the kernel's units: what the proof
//! keepalive found on a socket and puts back, and what a proof keepalive
//! asks of one ([`ProofKeepalive`]). Setting them is the I/O edge
//! (`selfheal::actions`).

use serde::{Deserialize, Serialize};

/// A socket's keepalive options, in the kernel's units.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeepaliveSettings {
    /// `SO_KEEPALIVE`.
    pub enabled: bool,
    /// `TCP_KEEPIDLE`, seconds.
    pub idle_s: u32,
    /// `TCP_KEEPINTVL`, seconds.
    pub interval_s: u32,
    /// `TCP_KEEPCNT`.
    pub count: u32,
    /// `TCP_USER_TIMEOUT`, milliseconds (0: off).
    pub user_timeout_ms: u32,
}

impl KeepaliveSettings {
    /// The options in a few words, for a report.
    pub fn words(&self) -> String {
        format!(
            "SO_KEEPALIVE {} idle {} s interval {} s count {} user timeout {} ms",
            if self.enabled { "on" } else { "off" },
            self.idle_s,
            self.interval_s,
            self.count,
            self.user_timeout_ms
        )
    }
}

/// The kernel's limits (include/net/tcp.h).
pub const MAX_TCP_KEEPIDLE: u32 = 32767;
pub const MAX_TCP_KEEPINTVL: u32 = 32767;
pub const MAX_TCP_KEEPCNT: u32 = 127;

/// A *proof keepalive*: probes that ask a silent socket's peer whether it
/// is there, without ending anything while the question is open.
///
/// The kernel is told to give up only `hold` after the last probe the
/// judge counts (`TCP_USER_TIMEOUT` = silence so far + `idle` + `count` ×
/// `interval` + `hold`): the check that sees the probes unanswered writes
/// its snapshot first and then ends the connection itself
/// (`selfheal::actions::keepalive::expire_keepalive`); the kernel's own deadline only matters if no
/// check comes back. A live peer answers the first probe, and the options
/// are put back (`selfheal::actions::keepalive::restore_keepalive`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProofKeepalive {
    /// `TCP_KEEPIDLE`, seconds (1 to 32767).
    pub idle_s: u32,
    /// `TCP_KEEPINTVL`, seconds (1 to 32767).
    pub interval_s: u32,
    /// Probes the judge waits for (1 to 127; also `TCP_KEEPCNT`).
    pub count: u32,
    /// How long past the judged probes the kernel waits before it gives up
    /// by itself, in milliseconds.
    pub hold_ms: u32,
}

impl ProofKeepalive {
    /// The options it sets on a socket that has been silent `silent_ms`,
    /// or why they are out of the kernel's range.
    pub fn settings(&self, silent_ms: Option<u32>) -> Result<KeepaliveSettings, String> {
        let bad = |m: String| Err(m);
        if !(1..=MAX_TCP_KEEPIDLE).contains(&self.idle_s) {
            return bad(format!(
                "idle must be 1 to {MAX_TCP_KEEPIDLE} s, not {}",
                self.idle_s
            ));
        }
        if !(1..=MAX_TCP_KEEPINTVL).contains(&self.interval_s) {
            return bad(format!(
                "interval must be 1 to {MAX_TCP_KEEPINTVL} s, not {}",
                self.interval_s
            ));
        }
        if !(1..=MAX_TCP_KEEPCNT).contains(&self.count) {
            return bad(format!(
                "count must be 1 to {MAX_TCP_KEEPCNT}, not {}",
                self.count
            ));
        }
        let timeout = u64::from(silent_ms.unwrap_or(0))
            + 1000 * u64::from(self.idle_s)
            + 1000 * u64::from(self.count) * u64::from(self.interval_s)
            + u64::from(self.hold_ms);
        Ok(KeepaliveSettings {
            enabled: true,
            idle_s: self.idle_s,
            interval_s: self.interval_s,
            count: self.count,
            user_timeout_ms: timeout.min(i32::MAX as u64) as u32,
        })
    }

    /// Whether `s` are options this proof sets: another prover's proof of
    /// the same probes (a check's, another scan's) is armed on the socket,
    /// and `s` are not the socket's own.
    pub fn is_armed_as(&self, s: &KeepaliveSettings) -> bool {
        let least = 1000 * u64::from(self.idle_s)
            + 1000 * u64::from(self.count) * u64::from(self.interval_s)
            + u64::from(self.hold_ms);
        s.enabled
            && s.idle_s == self.idle_s
            && s.interval_s == self.interval_s
            && s.count == self.count
            && u64::from(s.user_timeout_ms) >= least.min(i32::MAX as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proofs_options_are_told_from_a_sockets_own() {
        let ka = ProofKeepalive {
            idle_s: 5,
            interval_s: 5,
            count: 3,
            hold_ms: 120_000,
        };
        for silent in [None, Some(0), Some(40_000)] {
            assert!(ka.is_armed_as(&ka.settings(silent).unwrap()), "{silent:?}");
        }
        let system = KeepaliveSettings {
            enabled: false,
            idle_s: 7200,
            interval_s: 75,
            count: 9,
            user_timeout_ms: 0,
        };
        assert!(!ka.is_armed_as(&system));
        // An application's own keepalive of the same probes, no user timeout.
        let own = KeepaliveSettings {
            enabled: true,
            idle_s: 5,
            interval_s: 5,
            count: 3,
            user_timeout_ms: 0,
        };
        assert!(!ka.is_armed_as(&own));
        // Another proof's probes.
        let other = ProofKeepalive {
            interval_s: 10,
            ..ka.clone()
        };
        assert!(!ka.is_armed_as(&other.settings(None).unwrap()));
    }
}
