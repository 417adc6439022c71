//! The eBPF receive tracer, from user space: loads the object built from
//! `selfheal-ebpf`, picks the first attach strategy the kernel accepts
//! (keeping why the others failed), fills the pid filter, and reads the maps
//! into the plain types of [`snapshot`]. No aya type leaves this module.
//!
//! Entry hooks cannot see a receive that began before they were attached (or
//! before its process was watched): [`Tracer::watched_since`] says from when
//! the picture is complete, and callers fill the gap from procfs.

pub mod iter;
pub mod layout;
pub mod tracefs;

#[cfg(selfheal_ebpf)]
mod loader;

use selfheal_common::MAX_SOCKS;
use selfheal_core::ebpf::{
    Attempt, FdKind, Overflow, SocketActivity, TracerSnapshot, snapshot, strategy,
    strategy::Strategy,
};

/// Once `SOCKS` holds this many entries, a snapshot drops those of sockets
/// no longer open. The kernel side adds an entry for every socket a watched
/// process receives or sends on and never removes one (only unwatching its
/// process does), so a long-lived agent that opens a connection per request
/// would fill the map in time, and every later socket would go unrecorded.
/// Below this the map has room, and the snapshot skips the cost (one
/// `readlink` per open fd of each watched process).
pub const PRUNE_SOCKS_AT: usize = MAX_SOCKS as usize / 2;

/// Whether this binary carries the eBPF object (it does not when it was built
/// without the eBPF toolchain).
pub const BUILT_IN: bool = cfg!(selfheal_ebpf);

/// How to attach.
#[derive(Clone, Debug)]
pub struct TracerOptions {
    /// Strategies to try, in order.
    pub strategies: Vec<Strategy>,
    /// Kernel BTF to read struct offsets from.
    pub btf_path: std::path::PathBuf,
}

impl Default for TracerOptions {
    fn default() -> Self {
        Self {
            strategies: Strategy::ALL.to_vec(),
            btf_path: layout::VMLINUX_BTF.into(),
        }
    }
}

/// Why the tracer is not available.
#[derive(Debug, thiserror::Error)]
pub enum TracerError {
    /// The binary was built without the eBPF toolchain.
    #[error(
        "eBPF was not built into this binary (build with the eBPF toolchain: `cargo xtask setup`)"
    )]
    NotBuiltIn,
    /// The kernel layout could not be read, so no strategy can run.
    #[error("cannot read the kernel's struct layout")]
    Layout(#[from] layout::LayoutError),
    /// The object could not be loaded (maps refused, no permission).
    #[error("cannot load the eBPF object: {0}")]
    Load(String),
    /// Every strategy failed; each reason is in `attempts`.
    #[error("no attach strategy worked: {}", summary(.attempts))]
    NoStrategy { attempts: Vec<Attempt> },
    /// A map operation failed.
    #[error("eBPF map {map}: {reason}")]
    Map { map: &'static str, reason: String },
}

fn summary(attempts: &[Attempt]) -> String {
    attempts
        .iter()
        .map(|a| format!("{}: {}", a.strategy, a.error.as_deref().unwrap_or("ok")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Formats an error with its chain of sources, `outer: inner: root`.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let next = c.to_string();
        if !s.contains(&next) {
            s.push_str(": ");
            s.push_str(&next);
        }
        cur = c.source();
    }
    s
}

#[cfg(selfheal_ebpf)]
pub use self::loader::Tracer;

/// Stand-in when eBPF is not built in: attaching always fails with
/// [`TracerError::NotBuiltIn`].
#[cfg(not(selfheal_ebpf))]
pub struct Tracer(std::convert::Infallible);

#[cfg(not(selfheal_ebpf))]
impl Tracer {
    pub fn attach(_opts: &TracerOptions) -> Result<Self, TracerError> {
        Err(TracerError::NotBuiltIn)
    }
    pub fn strategy(&self) -> Strategy {
        match self.0 {}
    }
    pub fn attempts(&self) -> &[Attempt] {
        match self.0 {}
    }
    pub fn attached_at_ns(&self) -> u64 {
        match self.0 {}
    }
    pub fn watched_since(&self, _tgid: u32) -> Option<u64> {
        match self.0 {}
    }
    pub fn watch(&mut self, _tgid: u32, _owner: u32) -> Result<(), TracerError> {
        match self.0 {}
    }
    pub fn unwatch(&mut self, _tgid: u32) -> Result<(), TracerError> {
        match self.0 {}
    }
    pub fn snapshot(&mut self) -> Result<TracerSnapshot, TracerError> {
        match self.0 {}
    }
}
