//! A TCP socket as the kernel's sock_diag reports it, with `tcp_info`: the
//! plain types. Dumping and destroying is the I/O edge (`selfheal::sys::sockdiag`).

use std::net::SocketAddr;

use serde::{Deserialize, Deserializer, Serialize};

/// A TCP socket as sock_diag reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpSocket {
    /// Inode, as in `/proc/PID/fd/N` → `socket:[inode]`.
    pub inode: u64,
    /// The kernel's socket cookie.
    pub cookie: u64,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub state: crate::model::TcpState,
    pub uid: u32,
    pub recv_queue: u32,
    pub send_queue: u32,
    /// The socket's pending timer, if one is armed.
    pub timer: Option<TimerInfo>,
    /// Absent when the kernel did not attach it (e.g. listening sockets of
    /// some kernels).
    pub tcp_info: Option<TcpInfo>,
}

/// The kinds of a socket's timer, as sock_diag's `idiag_timer` numbers
/// them (1 to 4).
pub const TIMER_KINDS: [&str; 4] = ["retransmit", "keepalive", "time_wait", "zero_window_probe"];

/// A timer's kind on the wire, as the one of [`TIMER_KINDS`] it names.
fn known_timer<'de, D: Deserializer<'de>>(d: D) -> Result<&'static str, D::Error> {
    let kind = String::deserialize(d)?;
    TIMER_KINDS
        .iter()
        .find(|k| **k == kind)
        .copied()
        .ok_or_else(|| serde::de::Error::custom(format!("unknown timer kind {kind:?}")))
}

/// A TCP socket's armed timer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimerInfo {
    /// One of [`TIMER_KINDS`].
    #[serde(deserialize_with = "known_timer")]
    pub kind: crate::proc::Named,
    /// Milliseconds until it fires.
    pub expires_ms: u64,
    /// Retransmissions so far (retransmit timer only).
    pub retransmits: u8,
}

/// The `tcp_info` fields selfheal reasons with.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpInfo {
    pub rtt_us: u32,
    pub rto_us: u32,
    pub unacked: u32,
    pub retransmits: u8,
    pub backoff: u8,
    /// Unanswered keepalive (or zero-window) probes.
    pub probes: u8,
    pub last_data_recv_ms: u32,
    pub last_data_sent_ms: u32,
    pub last_ack_recv_ms: u32,
    pub bytes_received: u64,
    pub bytes_acked: u64,
    /// Segments that carried data, received and sent (retransmissions
    /// included): with the bytes, how large the arrivals between two checks
    /// were ([`crate::progress`]). 0 where the kernel does not count them.
    #[serde(default)]
    pub data_segs_in: u32,
    #[serde(default)]
    pub data_segs_out: u32,
}
