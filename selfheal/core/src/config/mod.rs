//! The TOML configuration's shape and its validation (every error names the
//! file, the line and the key), and the resolution of an agent's upstream
//! addresses into a pure matcher that tells a socket's role by its remote
//! address. Finding the file, reading it (and refusing one another user
//! could have written) and asking the resolver are the I/O edge
//! (`selfheal::config`).
//!
//! The file is read as a spanned TOML tree (`toml::de::DeTable`) and walked
//! by hand rather than through serde: that way every check — unknown keys,
//! wrong types, bad regexes, durations and addresses, rules that depend on
//! other keys — knows the key's position and the agent it belongs to.
//!
//! The rooms: `schema` (the types a validated config is made of), [`walk`]
//! (the spanned walker, shared with the helper's policy parser), `agent`
//! (an `[[agent]]` table, its `match` rule and its `thresholds`, `heal` and
//! `proof` tables), `auto` (the `[auto]` section: what is watched without
//! an agent table), `upstream` (upstream addresses and probes) and
//! `resolve` (resolved upstreams as a matcher). This module holds the
//! errors, the candidate files and [`Config::parse`], and names every item
//! under `selfheal_core::config`.

mod agent;
mod auto;
mod resolve;
mod schema;
mod upstream;
pub mod walk;

use std::{
    collections::HashMap,
    ffi::OsStr,
    path::{Path, PathBuf},
};

use toml::de::DeTable;

use self::walk::{Cx, Fields};
pub use self::{
    auto::PREFIX as AUTO_PREFIX,
    resolve::{Resolution, ResolvedUpstream, ResolvedUpstreams},
    schema::{
        AgentConfig, AutoConfig, Config, DEFAULT_COLLECT_BUDGET, DEFAULT_CONNECT_TIMEOUT,
        DEFAULT_MAX_SILENCE, DEFAULT_PROBE_TIMEOUT, DEFAULT_STALL_AFTER, HealConfig, MatchRule,
        MatchUid, ProbeAuth, ProbeConfig, ProofConfig, Redirects, Role, Roles, SecretSource,
        Thresholds, UnitOwner, Upstream, UpstreamAddr,
    },
    upstream::check_json_pointer,
    walk::line_col,
};

/// The system-wide config file, the last candidate tried.
pub const SYSTEM_CONFIG: &str = "/etc/selfheal/config.toml";

/// A config file larger than this is refused (it is certainly not one).
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// Why a config could not be found, read or accepted.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file was named or found but cannot be read.
    #[error("cannot read config {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// Someone untrusted could have written or replaced the file (see
    /// `selfheal::trust`): it decides which processes are signalled and which
    /// commands run, with our privileges.
    #[error("refusing config {}: {reason}", path.display())]
    Untrusted { path: PathBuf, reason: String },
    /// No `--config` was given and no candidate exists.
    #[error(
        "no config file: tried {} (give one with --config PATH)",
        list_paths(tried)
    )]
    NotFound { tried: Vec<PathBuf> },
    /// The file was read but is not a valid config. `line` and `column` are
    /// 1-based; `message` names the agent, the key and what is wrong.
    #[error("{}:{line}: {message}", path.display())]
    Invalid {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
}

impl ConfigError {
    /// The 1-based line an `Invalid` error points at.
    pub fn line(&self) -> Option<usize> {
        match self {
            ConfigError::Invalid { line, .. } => Some(*line),
            _ => None,
        }
    }
}

fn list_paths(paths: &[PathBuf]) -> String {
    let v: Vec<_> = paths.iter().map(|p| p.display().to_string()).collect();
    v.join(", ")
}

/// The config files tried when no `--config` is given, in order:
/// `$XDG_CONFIG_HOME/selfheal/config.toml` when `XDG_CONFIG_HOME` is set to an
/// absolute path, else `$HOME/.config/selfheal/config.toml` when `HOME` is
/// set, then [`SYSTEM_CONFIG`].
pub fn candidates(xdg_config_home: Option<&OsStr>, home: Option<&OsStr>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    fn absolute(v: Option<&OsStr>) -> Option<&Path> {
        v.map(Path::new).filter(|p| p.is_absolute())
    }
    if let Some(xdg) = absolute(xdg_config_home) {
        out.push(xdg.join("selfheal/config.toml"));
    } else if let Some(home) = absolute(home) {
        out.push(home.join(".config/selfheal/config.toml"));
    }
    out.push(PathBuf::from(SYSTEM_CONFIG));
    out
}

impl Config {
    /// Validates config `text`; `path` is only used to name it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let cx = Cx::new(text, path);
        let root = DeTable::parse(text).map_err(|e| cx.syntax(&e))?;
        let root = Fields::new(&cx, root.get_ref(), 0..0, String::new());
        root.only(&["agent", "auto"])?;
        let auto = match root.table("auto", "auto".into())? {
            Some(t) => auto::auto(&t)?,
            None => AutoConfig::default(),
        };
        let agents = root.tables("agent", "agent")?.unwrap_or_default();
        let mut out = Vec::new();
        let mut names: HashMap<String, usize> = HashMap::new();
        for (i, (table, span)) in agents.into_iter().enumerate() {
            let agent = agent::agent(&cx, table, span, i + 1, &mut names)?;
            out.push(agent);
        }
        if out.is_empty() && !auto.is_on() {
            return Err(cx.error(
                0..0,
                "no agents: add an [[agent]] table, or an [auto] section that watches something"
                    .into(),
            ));
        }
        Ok(Config {
            path: path.to_path_buf(),
            agents: out,
            auto,
        })
    }

    /// The agent called `name`.
    pub fn agent(&self, name: &str) -> Option<&AgentConfig> {
        self.agents.iter().find(|a| a.name == name)
    }
}
