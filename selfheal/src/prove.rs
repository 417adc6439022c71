//! The prove stage's model lives in the core ([`selfheal_core::prove`]);
//! this adds what needs the acting side: the proof keepalive the config asks
//! for, in the kernel's units ([`ProofKeepalive`]).

use selfheal_core::keepalive::ProofKeepalive;

/// The proof keepalive the config asks for, in the kernel's units.
pub fn keepalive(cfg: &selfheal_core::config::ProofConfig) -> ProofKeepalive {
    let secs = |d: std::time::Duration| u32::try_from(d.as_secs()).unwrap_or(u32::MAX);
    ProofKeepalive {
        idle_s: secs(cfg.idle),
        interval_s: secs(cfg.interval),
        count: cfg.count,
        hold_ms: u32::try_from(crate::actions::keepalive::PROOF_HOLD.as_millis())
            .unwrap_or(u32::MAX),
    }
}
