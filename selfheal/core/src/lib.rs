//! selfheal's pure core: everything that decides, and nothing that looks.
//!
//! The evidence and report types, the config schema and its parser, the
//! join of collected evidence into a report and its renderer, the judge,
//! the healing ladder and the helper's wire protocol. This crate depends on
//! no aya, netlink, nix, procfs, reqwest or tokio: that the core does no I/O
//! is a fact of Cargo's dependency graph, not a convention. The `selfheal`
//! crate gathers the evidence and acts, and names what it uses of this
//! crate by path (`selfheal_core::judge::…`), never through a re-export.
//!
//! The modules, in the order of one check's flow:
//!
//! - **vocabulary**: [`model`] (roles, TCP states, reason codes, gaps, the
//!   judge's findings), [`text`] (escaping and redaction of everything
//!   shown), [`clock`] (ages on the boot clock);
//! - **config**: [`config`] (the TOML schema, its validation, upstream
//!   matching), [`auto`] (the `[auto]` section's agents: labelled
//!   containers and named units), [`discovery`] (what finding the agents
//!   must read of the host, by their rules);
//! - **evidence**: [`proc`], [`sockdiag`], [`ebpf`], [`runtime`] (what the
//!   collectors read, as plain types, and the parsers of what procfs and
//!   the container runtimes answer), [`cgroup`] (which unit, manager and
//!   container a cgroup path anchors), [`probe`] (a probe's result and the
//!   judgement of an answer), joined by [`inspect`] into a report;
//! - **judge**: [`judge`] (evidence and history to a verdict), with
//!   [`prove`] (the proof keepalive's model), [`keepalive`] (a socket's
//!   keepalive options) and [`progress`] (whether a talking call makes
//!   progress);
//! - **report**: [`outcome`] (one agent's check, and how it reads for
//!   people), [`history`] (what `check` remembers between runs),
//!   [`metrics`] (the Prometheus text);
//! - **heal**: [`ladder`] (the next step), [`protocol`] (what the root
//!   helper and its clients say to each other), and [`access`] (who may
//!   query and act on which process through the helper: its policy file,
//!   what the kernel would let a caller do itself, and whom a caller counts
//!   against, with each owner's fair share);
//! - **keep**: [`state`] (the state file's envelope and its decoding).

/// `Display` for each of the types named: each prints its `as_str()`.
macro_rules! display_as_str {
    ($($t:ty),+ $(,)?) => {$(
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )+};
}

pub mod access;
pub mod auto;
pub mod cgroup;
pub mod clock;
pub mod config;
pub mod discovery;
pub mod ebpf;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixture;
pub mod history;
pub mod inspect;
pub mod judge;
pub mod keepalive;
pub mod ladder;
pub mod metrics;
pub mod model;
pub mod outcome;
pub mod probe;
pub mod proc;
pub mod progress;
pub mod protocol;
pub mod prove;
pub mod runtime;
pub mod scan;
pub mod sockdiag;
pub mod state;
pub mod text;
