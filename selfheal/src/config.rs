//! The configuration's I/O edge: where the file is found, reading it (and
//! refusing one that another user could have written: the rule is
//! [`crate::trust`]'s), and resolving upstream host names with the system
//! resolver. Its shape, validation and matching are the core's
//! ([`selfheal_core::config`]).

use std::{
    io::Read as _,
    net::ToSocketAddrs as _,
    path::{Path, PathBuf},
};

use selfheal_core::config::{
    AgentConfig, Config, ConfigError, MAX_CONFIG_BYTES, ResolvedUpstreams, candidates, line_col,
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
    let read_err = |error| ConfigError::Read {
        path: path.to_path_buf(),
        error,
    };
    let file = crate::trust::open_trusted(
        path,
        crate::sys::creds::euid(),
        crate::trust::Sticky::AlsoItsOwn,
    )
    .map_err(|e| match e {
        crate::trust::TrustError::Read { path, error } => ConfigError::Read { path, error },
        crate::trust::TrustError::Untrusted { reason } => ConfigError::Untrusted {
            path: path.to_path_buf(),
            reason,
        },
    })?;
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(ConfigError::Invalid {
            path: path.to_path_buf(),
            line: 1,
            column: 1,
            message: format!("file larger than {} MiB", MAX_CONFIG_BYTES >> 20),
        });
    }
    match String::from_utf8(bytes) {
        Ok(text) => Config::parse(&text, path),
        Err(e) => {
            let valid = e.utf8_error().valid_up_to();
            let text = String::from_utf8_lossy(&e.as_bytes()[..valid]);
            let (line, column) = line_col(&text, valid);
            Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                line,
                column,
                message: "not UTF-8 text".into(),
            })
        }
    }
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
