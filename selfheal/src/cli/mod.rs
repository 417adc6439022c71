//! Subcommands, one file each.

pub mod check;
pub mod config;
pub mod helper;
pub mod inspect;
pub mod install;
pub mod snapshots;

/// Parses a duration like `500ms`, `2s`, `5m`.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("bad duration {s:?}: {e} (examples: 500ms, 2s, 5m)"))
}
