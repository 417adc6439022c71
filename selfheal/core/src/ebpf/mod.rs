//! What the eBPF receive tracer saw, as plain types: the attach strategies
//! and what trying each gave, and a snapshot of its maps; and what one pass
//! of the task iterator read ([`iter`]). Loading and reading the maps and
//! the iterator is the I/O edge (`selfheal::ebpf`).

pub mod iter;
pub mod snapshot;
pub mod strategy;
pub mod tracefs;

use serde::Serialize;

pub use self::snapshot::{
    BlockedRecv, FdKind, Overflow, ShareUse, SocketActivity, TracerSnapshot, socks_share,
};
pub use self::strategy::Strategy;

/// The outcome of trying one strategy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Attempt {
    pub strategy: Strategy,
    /// `None` when it loaded and attached; otherwise why not.
    pub error: Option<String>,
}
