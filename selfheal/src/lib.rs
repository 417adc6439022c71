//! selfheal: finds wedged AI-agent processes from outside, proves the wedge
//! with kernel evidence, and heals them with the gentlest action that works.
//!
//! This library holds everything but the command line: the eBPF tracer's
//! user-space side ([`ebpf`]), procfs and sock_diag collectors ([`proc`],
//! [`sockdiag`]), the clock ages are measured with ([`clock`]), and the
//! `inspect` report that joins them ([`inspect`]).

pub mod actions;
pub mod agents;
pub mod check;
pub mod clock;
pub mod config;
pub mod ebpf;
pub mod healer;
pub mod helper;
pub mod inspect;
pub mod judge;
pub mod ladder;
pub mod metrics;
pub mod pidfd;
pub mod probe;
pub mod proc;
pub mod prove;
pub mod runtime;
pub mod safedir;
pub mod snapshots;
pub mod sockdiag;
pub mod store;
pub mod testbed;
pub mod text;
pub mod trust;
