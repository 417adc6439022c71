//! A socket's keepalive options, in the kernel's units: what the proof
//! keepalive found on a socket and puts back. Setting them is the I/O edge
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
