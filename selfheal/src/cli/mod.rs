//! Subcommands, one file each.

pub mod check;
pub mod config;
pub mod helper;
pub mod inspect;
pub mod install;
pub mod scan;
pub mod snapshots;

pub mod error;
pub use error::{Error, Finished};

/// Parses a duration like `500ms`, `2s`, `5m`.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("bad duration {s:?}: {e} (examples: 500ms, 2s, 5m)"))
}

/// The agent `name` of `config`, or the error that lists the configured
/// ones (a usage error: `check --agent`, `inspect NAME`).
pub fn configured_agent<'a>(
    config: &'a selfheal_core::config::Config,
    name: &str,
) -> Result<&'a selfheal_core::config::AgentConfig, Error> {
    config.agent(name).ok_or_else(|| Error::NoSuchAgent {
        name: name.to_string(),
        path: config.path.clone(),
        configured: config.agents.iter().map(|a| a.name.clone()).collect(),
    })
}
