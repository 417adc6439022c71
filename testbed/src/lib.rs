//! The incident testbed: real programs that replay the 2026-07-23 outage
//! (`../shared/context/incident-pr-358.txt`) so that the demo (`cargo xtask
//! demo`) and the scenario tests can show selfheal finding and healing it.
//!
//! - [`dispatch`]: the dispatch server runners attach to; its runners table
//!   keeps saying `connected` for a runner whose stream is dead.
//! - [`provider`]: an LLM provider streaming server-sent events, which can
//!   think silently, stream slowly, or go silent with the connection open.
//! - [`runner`]: an agent runner with the incident's bug (no keepalive on its
//!   attach stream), a blocking-thread and a tokio variant, and a PID-1 mode
//!   that leaks zombies.
//! - [`proxy`]: a local TCP proxy between a caller and the provider.
//! - [`topology`]: network namespaces joined by veth, and the "gateway drops
//!   the flow without a FIN" fault.
//! - [`scenario`]: the scenarios, driving real `selfheal helper` and
//!   `selfheal check` processes as a timer would, measuring time to detect
//!   and to recover; the demo narrates them and the tests assert on them.
//!
//! The programs run as `selfheal-testbed ROLE` (`src/bin/selfheal-testbed/`),
//! a binary of this crate, never of the product: `selfheal`, which runs
//! as root in the helper, carries no test servers. The scenarios drive the
//! real `selfheal` binary for `helper`, `check` and `snapshots`.

pub mod dispatch;
pub mod http;
pub mod provider;
pub mod proxy;
pub mod runner;
pub mod scenario;
pub mod topology;
pub mod wire;

/// The testbed's programs (`selfheal-testbed ROLE …`).
#[derive(clap::Subcommand, Debug)]
pub enum Role {
    /// The dispatch server: attach streams, heartbeats, work, runners table.
    Dispatch(dispatch::Args),
    /// The LLM provider: server-sent events with configurable pacing.
    Provider(provider::Args),
    /// An agent runner with the incident's bug.
    Runner(runner::Args),
    /// A local TCP proxy: copies bytes both ways to an upstream.
    Proxy(proxy::Args),
}

/// Runs one testbed program until it is killed.
pub fn run(role: Role) -> anyhow::Result<()> {
    match role {
        Role::Dispatch(a) => dispatch::run(a),
        Role::Provider(a) => provider::run(a),
        Role::Runner(a) => runner::run(a),
        Role::Proxy(a) => proxy::run(a),
    }
}

/// One line of a testbed program's story on stdout (the scenario driver
/// reads them), flushed at once.
pub fn say(line: impl std::fmt::Display) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// A current-thread tokio runtime with I/O and timers.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}
