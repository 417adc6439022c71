//! The configuration's I/O edge: where the file is found, reading it (and
//! refusing one that another user could have written: the rule is
//! [`crate::trust`]'s), and resolving upstream host names with the system
//! resolver. Its shape, validation and matching are the core's
//! ([`selfheal_core::config`]).

use std::{
    net::ToSocketAddrs as _,
    path::{Path, PathBuf},
};

use selfheal_core::config::{
    AgentConfig, Config, ConfigError, MAX_CONFIG_BYTES, ResolvedUpstreams, candidates,
};

/// The config file to load: `cli` (the `--config` argument) when given, which
/// must exist; otherwise the first of [`candidates`] (from the environment)
/// that exists.
pub fn locate(cli: Option<&Path>) -> Result<PathBuf, ConfigError> {
    let xdg = std::env::var_os("XDG_CONFIG_HOME");
    let home = std::env::var_os("HOME");
    locate_among(cli, candidates(xdg.as_deref(), home.as_deref()))
}

/// [`locate`] over an explicit candidate list.
pub fn locate_among(cli: Option<&Path>, candidates: Vec<PathBuf>) -> Result<PathBuf, ConfigError> {
    if let Some(path) = cli {
        return match std::fs::metadata(path) {
            Ok(_) => Ok(path.to_path_buf()),
            Err(error) => Err(ConfigError::Read {
                path: path.to_path_buf(),
                error,
            }),
        };
    }
    for c in &candidates {
        // A candidate whose existence cannot be told (a directory we may not
        // search) is taken: loading it then says why, rather than silently
        // falling through to the next one.
        if c.try_exists().unwrap_or(true) {
            return Ok(c.clone());
        }
    }
    Err(ConfigError::NotFound { tried: candidates })
}

/// Reads and validates the config at `path`, after checking that only
/// root or we could have written it ([`crate::trust::open_trusted`]).
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = crate::trust::read_trusted_text(
        path,
        crate::sys::creds::euid(),
        crate::trust::Sticky::AlsoItsOwn,
        MAX_CONFIG_BYTES,
    )?;
    Config::parse(&text, path)
}

/// Resolves the upstreams' host names (once each, with the system
/// resolver). A name that does not resolve is not an error: that upstream
/// matches nothing and [`ResolvedUpstreams::notes`] says why.
pub fn resolve_upstreams(agent: &AgentConfig) -> ResolvedUpstreams {
    agent.resolve_upstreams_with(|host, port| {
        (host, port)
            .to_socket_addrs()
            .map(Iterator::collect)
            .map_err(|e| e.to_string())
    })
}
