//! selfheal: finds wedged AI-agent processes from outside, proves the wedge
//! with kernel evidence, and heals them with the gentlest action that works.
//!
//! This library is the I/O edge: it reads the system, acts on it, and keeps
//! files. Everything that decides (the evidence and report types, the
//! config schema, the judge, the ladder, the helper's protocol, the
//! renderers) is in the pure crate `selfheal-core`, and the edge names it
//! by path (`selfheal_core::judge::…`): an import says whether code can do
//! I/O. The command line is the binary's (`src/cli`). The modules, in the
//! order of one check's flow (ARCHITECTURE.md draws it), lowest layer
//! first within each step (a unit test holds the layers):
//!
//! - **the system**: [`sys`] (the one seam to it: the procfs root,
//!   process handles, namespaces, reading another process's memory, socket
//!   options, directory-relative file calls, the clock ages are measured
//!   with, this process's credentials; every `unsafe` block and every
//!   `/proc` path of the library is there);
//! - **config**: [`config`] (finding and reading the TOML file), [`trust`]
//!   (whether a file that steers privileged work may be believed);
//! - **discover**: [`agents`] (which processes are an agent), [`runtime`]
//!   (which container and pod they are in), [`sys::pidfd`] (a handle that
//!   pid reuse cannot fool);
//! - **collect**: [`proc`] (threads, waits, fds from procfs),
//!   [`sys::memread`] (reading another process's memory, abandonably),
//!   [`sys::sockdiag`] (TCP sockets and `tcp_info`; also `SOCK_DESTROY`),
//!   [`sys::netns`] (entering another network namespace), [`ebpf`] (the
//!   receive tracer), [`probe`] (HTTP and health-file probes),
//!   [`sys::clock`] (the one clock ages use), gathered by [`inspect`];
//!   and, with no config, [`scan`] (every TCP connection of every process
//!   the caller may read, with what waits on it);
//! - **heal**: [`prove`] (the proof keepalive the config asks for),
//!   [`heal`] (who carries an act out: directly or through the helper), [`actions`] (the privileged acts
//!   themselves), [`helper`] (the root helper: server, client, policy);
//! - **report and keep**: [`check`] (one check of every agent, the pipeline
//!   behind `check` and `watch`), [`store`] (history between runs),
//!   [`snapshots`] (the forensic log), [`metrics_endpoint`] (`watch`'s
//!   HTTP endpoint), [`fs`] (the one rule for directories selfheal writes
//!   into).

pub mod actions;
pub mod agents;
pub mod check;
pub mod config;
pub mod ebpf;
pub mod fs;
pub mod heal;
pub mod helper;
pub mod inspect;
pub mod metrics_endpoint;
pub mod probe;
pub mod proc;
pub mod prove;
pub mod runtime;
pub mod scan;
pub mod snapshots;
pub mod store;
pub mod sys;
pub mod trust;

#[cfg(test)]
mod layers;
