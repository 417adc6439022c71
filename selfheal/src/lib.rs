//! selfheal: finds wedged AI-agent processes from outside, proves the wedge
//! with kernel evidence, and heals them with the gentlest action that works.
//!
//! This library holds everything but the command line (`src/cli`). What
//! decides lives in the pure crate `selfheal-core` and is re-exported here
//! under the same paths: [`judge`], [`ladder`], [`model`] and [`text`]
//! whole; the plain types (and the pure parts) of [`config`], [`inspect`],
//! [`prove`], [`proc`], [`sockdiag`], [`ebpf`], [`runtime`] and the
//! helper's protocol beside this crate's I/O in the modules of the same
//! names. The modules, in the order of one check's flow (ARCHITECTURE.md
//! draws it):
//!
//! - **config**: [`config`] (the TOML schema and its validation), [`trust`]
//!   (whether a file that steers privileged work may be believed);
//! - **discover**: [`agents`] (which processes are an agent), [`runtime`]
//!   (which container and pod they are in), [`pidfd`] (a handle that pid
//!   reuse cannot fool);
//! - **collect**: [`proc`] (threads, waits, fds from procfs), [`sockdiag`]
//!   (TCP sockets and `tcp_info`; also `SOCK_DESTROY`), [`netns`] (entering
//!   another network namespace), [`ebpf`] (the receive tracer), [`probe`]
//!   (HTTP probes), [`clock`] (the one clock ages use), joined by
//!   [`inspect`] into a report;
//! - **judge**: [`judge`] (pure: evidence and history to a verdict), with
//!   [`prove`] (the proof keepalive's model);
//! - **heal**: [`ladder`] (pure: the next step), [`healer`] (who carries it
//!   out), [`actions`] (the privileged acts themselves), [`helper`] (the
//!   root helper: server, client, protocol, policy);
//! - **report and keep**: [`check`] (one check of every agent, the pipeline
//!   behind `check` and `watch`), [`store`] (history between runs),
//!   [`snapshots`] (the forensic log), [`selfheal_core::metrics`] (the
//!   Prometheus text), [`text`] (escaping and redaction of everything
//!   shown), [`fs`] (the one rule for directories selfheal writes into);
//! - [`model`]: the typed vocabulary the layers pass (roles, TCP states,
//!   reason codes, gaps, findings).

pub mod actions;
pub mod agents;
pub mod check;
pub mod clock;
pub mod config;
pub mod ebpf;
pub mod fs;
pub mod healer;
pub mod helper;
pub mod inspect;
pub mod memread;
pub mod metrics_endpoint;
pub mod netns;
pub mod pidfd;
pub mod probe;
pub mod proc;
pub mod prove;
pub mod runtime;
pub mod snapshots;
pub mod sockdiag;
pub mod store;
pub mod trust;

#[cfg(test)]
mod layers;

pub use selfheal_core::{judge, ladder, model, text}; // TRANSITION
