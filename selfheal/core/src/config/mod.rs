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

use std::{
    collections::{BTreeMap, HashMap},
    ffi::OsStr,
    fmt,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    ops::Range,
    path::{Path, PathBuf},
    str::FromStr,
    time::Duration,
};

use serde::Serialize;
use toml::{
    Spanned,
    de::{DeTable, DeValue},
};

/// The system-wide config file, the last candidate tried.
pub const SYSTEM_CONFIG: &str = "/etc/selfheal/config.toml";

/// A config file larger than this is refused (it is certainly not one).
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// Default timeout of an HTTP probe.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// `collect_budget`'s default.
pub const DEFAULT_COLLECT_BUDGET: Duration = Duration::from_secs(5);

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

/// A loaded, validated config.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The file it was read from (named in every message about it).
    pub path: PathBuf,
    /// The watched agents, in file order; at least one, names unique.
    pub agents: Vec<AgentConfig>,
}

/// One watched agent: a named set of processes and what it talks to.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentConfig {
    /// Unique, non-empty, of `[A-Za-z0-9._-]`.
    pub name: String,
    /// Which processes are this agent (their descendants belong to it too).
    pub rule: MatchRule,
    /// Whose processes a `cmdline` or `exe` rule may match (`match.uid`).
    pub match_uid: MatchUid,
    /// Its upstreams, in file order (the first that matches a socket wins).
    pub upstreams: Vec<Upstream>,
    /// Its health probes, in file order.
    pub probes: Vec<ProbeConfig>,
    /// When evidence counts as suspect, dead or damaging (`[agent.thresholds]`).
    pub thresholds: Thresholds,
    /// What healing may do for it (`[agent.heal]`).
    pub heal: HealConfig,
    /// How a silent call is proven alive or dead (`[agent.proof]`).
    pub proof: ProofConfig,
}

/// The prove stage's settings for one agent (`[agent.proof]`): a suspect
/// upstream socket with a call in flight gets a *proof keepalive* (short
/// `SO_KEEPALIVE` probes through `pidfd_getfd`). A live peer answers and the
/// socket's own options are put back; a dead one does not, and after
/// `count` unanswered probes, each given `interval` to be answered, the
/// socket is proven dead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProofConfig {
    /// `keepalive`: arm proof keepalives at all. Default true.
    pub keepalive: bool,
    /// `idle`: `TCP_KEEPIDLE` of the proof (the socket is already silent
    /// longer, so the first probe goes at once). Default 5 s.
    pub idle: Duration,
    /// `interval`: between probes, and how long each has to be answered.
    /// Default 5 s.
    pub interval: Duration,
    /// `count`: unanswered probes that prove the peer dead. Default 3.
    pub count: u32,
}

impl Default for ProofConfig {
    fn default() -> Self {
        Self {
            keepalive: true,
            idle: Duration::from_secs(5),
            interval: Duration::from_secs(5),
            count: 3,
        }
    }
}

/// The healing ladder's permissions and limits for one agent
/// (`[agent.heal]`). The socket steps are on by default: they only touch a
/// connection the kernel already shows dead. Signals and restarts act only
/// where the config asks for them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealConfig {
    /// `sockets`: arm keepalive on, then destroy, a dead socket. Default true.
    pub sockets: bool,
    /// `signal`: SIGTERM, then SIGKILL after `grace`. Default false.
    pub signal: bool,
    /// `grace`: between SIGTERM and SIGKILL. Default 10 s.
    pub grace: Duration,
    /// `restart`: the restart command, an argv (never a shell string).
    pub restart: Option<Vec<String>>,
    /// `restart = { runtime = true }`: restart the agent's container through
    /// its runtime's API instead of a command (Docker/Podman: the
    /// container's restart; containerd/Kubernetes: its task is killed so
    /// that its controller replaces it).
    pub restart_runtime: bool,
    /// `restart_timeout`: how long the restart command may run. Default 60 s.
    pub restart_timeout: Duration,
    /// `step_window`: how long a step gets to clear the wedge before the next
    /// one is tried. Default 30 s.
    pub step_window: Duration,
    /// `backoff`: the least time between two actions; it doubles with every
    /// step that did not help, up to an hour. Default 10 s.
    pub backoff: Duration,
    /// `max_actions_per_hour`: all steps together. Default 10.
    pub max_actions_per_hour: u32,
    /// `max_restarts_per_hour`: signal and restart steps. Default 3.
    pub max_restarts_per_hour: u32,
}

impl Default for HealConfig {
    fn default() -> Self {
        Self {
            sockets: true,
            signal: false,
            grace: Duration::from_secs(10),
            restart: None,
            restart_runtime: false,
            restart_timeout: Duration::from_secs(60),
            step_window: Duration::from_secs(30),
            backoff: Duration::from_secs(10),
            max_actions_per_hour: 10,
            max_restarts_per_hour: 3,
        }
    }
}

/// The judge's thresholds for one agent (`[agent.thresholds]`); every key
/// is optional and defaults as documented in the README.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Thresholds {
    /// `suspect_after`: an upstream socket with no data in for this long is
    /// suspect (not dead: that needs proof). Default 60 s; an upstream may
    /// override it.
    pub suspect_after: Duration,
    /// `dead_probes`: this many unanswered keepalive probes prove the peer
    /// dead. Default 2.
    pub dead_probes: u32,
    /// `dead_backoff`: retransmission backoff this deep on unacknowledged
    /// data proves the peer dead. Default 3.
    pub dead_backoff: u32,
    /// `recv_blocked`: a thread blocked in a receive longer than this on a
    /// dead or suspect socket is named. Default 60 s.
    pub recv_blocked: Duration,
    /// `current_task_stale`: a `current_task` unchanged this long while no
    /// upstream moved data contradicts the agent's story. Default 10 min.
    pub current_task_stale: Duration,
    /// `zombies`: more zombies than this is damage. Default 20.
    pub zombies: u32,
    /// `d_state`: a thread in uninterruptible sleep longer than this is
    /// damage. Default 10 s.
    pub d_state: Duration,
    /// `probe_slow`: a probe slower than this is damage. Default 1 s.
    pub probe_slow: Duration,
    /// `collect_budget`: the longest one collection of the agent's
    /// evidence may take; past it the collection stops, the agent is not
    /// judged in that check (`over_budget`) and the other agents are.
    /// Default 5 s.
    pub collect_budget: Duration,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            suspect_after: Duration::from_secs(60),
            dead_probes: 2,
            dead_backoff: 3,
            recv_blocked: Duration::from_secs(60),
            current_task_stale: Duration::from_secs(600),
            zombies: 20,
            d_state: Duration::from_secs(10),
            probe_slow: Duration::from_secs(1),
            collect_budget: DEFAULT_COLLECT_BUDGET,
        }
    }
}

/// How an agent's processes are found (`match = { … }`, exactly one key).
#[derive(Clone, Debug)]
pub enum MatchRule {
    /// `pid = 123`: that process.
    Pid(u32),
    /// `pidfile = "/run/sol.pid"`: the process whose pid the file holds.
    Pidfile(PathBuf),
    /// `cmdline = "regex"`: processes whose argv, joined with spaces, the
    /// regex finds (unanchored search).
    Cmdline(regex::Regex),
    /// `exe = "/usr/bin/x"`: processes running that executable.
    Exe(PathBuf),
    /// `unit = "x.service"`: the processes of a systemd unit, by cgroup. A
    /// name without a unit type gets `.service`, as with systemctl.
    Unit(String),
    /// `container`, `image`, `label`, `pod`, `namespace` (any of them
    /// together, all must hold): the processes of the containers whose
    /// identity matches ([`crate::runtime`]).
    Container(crate::runtime::ContainerRule),
}

impl PartialEq for MatchRule {
    fn eq(&self, other: &Self) -> bool {
        use MatchRule::*;
        match (self, other) {
            (Pid(a), Pid(b)) => a == b,
            (Pidfile(a), Pidfile(b)) | (Exe(a), Exe(b)) => a == b,
            (Cmdline(a), Cmdline(b)) => a.as_str() == b.as_str(),
            (Unit(a), Unit(b)) => a == b,
            (Container(a), Container(b)) => a == b,
            _ => false,
        }
    }
}

impl fmt::Display for MatchRule {
    /// As written in the config: `cmdline = "sol-runner"`, `pid = 123`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MatchRule::Pid(pid) => write!(f, "pid = {pid}"),
            MatchRule::Pidfile(p) => write!(f, "pidfile = {:?}", p.display().to_string()),
            MatchRule::Cmdline(re) => write!(f, "cmdline = {:?}", re.as_str()),
            MatchRule::Exe(p) => write!(f, "exe = {:?}", p.display().to_string()),
            MatchRule::Unit(u) => write!(f, "unit = {u:?}"),
            MatchRule::Container(c) => write!(f, "{c}"),
        }
    }
}

/// Whose processes a `cmdline` or `exe` rule may match (`match.uid`). Any
/// user can start a process with a look-alike command line or run the same
/// executable; by default only the uid that runs selfheal is matched, so
/// another user's look-alike is neither judged nor healed as this agent.
/// For a `unit` rule, `uid` names the user whose manager runs the unit
/// ([`UnitOwner`]). `pid` and `pidfile` rules name their processes exactly
/// and take no `uid`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MatchUid {
    /// No `uid` key: the effective uid that runs the check (the config's
    /// owner, or the user who runs root's shared config).
    #[default]
    Runner,
    /// `uid = 1000`: that uid's processes.
    Uid(u32),
    /// `uid = "any"`: every uid's.
    Any,
}

impl MatchUid {
    /// The uid `rule` is limited to when selfheal runs as `runner`; `None`
    /// for every uid (or a rule the uid does not apply to).
    pub fn filter(self, rule: &MatchRule, runner: u32) -> Option<u32> {
        if !matches!(rule, MatchRule::Cmdline(_) | MatchRule::Exe(_)) {
            return None;
        }
        match self {
            MatchUid::Runner => Some(runner),
            MatchUid::Uid(uid) => Some(uid),
            MatchUid::Any => None,
        }
    }
}

/// Whose manager may run the unit a `unit` rule names: the unit is the
/// process's only where its cgroup is that manager's
/// (`crate::cgroup::unit_of`); the same name in another user's tree is
/// another unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnitOwner {
    /// The system manager's units only (root's check, no `uid`).
    System,
    /// The system manager's units, and user UID's own (a user's check, no
    /// `uid`: its agent may be a system service run as the user, or one of
    /// the user's units).
    SystemOr(u32),
    /// User UID's manager's units only (`uid = UID`).
    User(u32),
}

impl UnitOwner {
    /// Whether a unit of `manager` is one this rule may name.
    pub fn allows(self, manager: crate::cgroup::Manager) -> bool {
        use crate::cgroup::Manager;
        match (self, manager) {
            (UnitOwner::System | UnitOwner::SystemOr(_), Manager::System) => true,
            (UnitOwner::SystemOr(a) | UnitOwner::User(a), Manager::User(b)) => a == b,
            _ => false,
        }
    }
}

impl fmt::Display for UnitOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnitOwner::System => f.write_str("a system unit"),
            UnitOwner::SystemOr(uid) => write!(f, "a system unit or uid {uid}'s user unit"),
            UnitOwner::User(uid) => write!(f, "uid {uid}'s user unit"),
        }
    }
}

/// What an upstream is to the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The dispatch server's attach stream (heartbeats expected).
    Control,
    /// An LLM API: long silences are normal.
    Provider,
}

impl From<Role> for crate::model::SocketRole {
    fn from(r: Role) -> Self {
        match r {
            Role::Control => Self::Control,
            Role::Provider => Self::Provider,
        }
    }
}

impl Role {
    /// `control` or `provider`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Control => "control",
            Role::Provider => "provider",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One `[[agent.upstream]]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upstream {
    pub role: Role,
    pub addr: UpstreamAddr,
    /// Control only: data is expected at least this often.
    pub heartbeat: Option<Duration>,
    /// Overrides the agent's `suspect_after` for this upstream (a provider
    /// that thinks for minutes).
    pub suspect_after: Option<Duration>,
    /// `max_silence`: a call in flight silent longer than this is
    /// `unresponsive` even while its TCP peer answers: keepalive and ACKs
    /// prove one hop only, and a proxy may be answering for a dead upstream.
    /// Default [`DEFAULT_MAX_SILENCE`].
    pub max_silence: Duration,
    /// `connect_timeout`: a connection attempt to this upstream the peer has
    /// not answered for longer (SYN sent, nothing back) is `unresponsive`,
    /// and the heal ends it so the caller's connect fails now. Default
    /// [`DEFAULT_CONNECT_TIMEOUT`].
    pub connect_timeout: Duration,
}

/// The default `connect_timeout`: 30 s, longer than the official SDKs'
/// own connect timeouts (5-10 s) and far shorter than the kernel's SYN
/// retries (about 130 s), which a client without its own timeout waits out.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The default `max_silence`: 10 minutes, the read timeout of the official
/// openai and anthropic SDKs. A call silent longer than any SDK would wait
/// is not thinking.
pub const DEFAULT_MAX_SILENCE: Duration = Duration::from_secs(600);

/// An upstream's address as written.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum UpstreamAddr {
    /// `host:port` with a host name, resolved by `selfheal::config::resolve_upstreams`.
    Host { host: String, port: u16 },
    /// `ip:port` or `[v6]:port`.
    Socket(SocketAddr),
    /// `10.0.0.0/8`, `::1/128`: any port on those addresses.
    Cidr(IpAddr, u8),
    /// `:443`: any address on that port.
    Port(u16),
}

impl fmt::Display for UpstreamAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpstreamAddr::Host { host, port } => write!(f, "{host}:{port}"),
            UpstreamAddr::Socket(sa) => write!(f, "{sa}"),
            UpstreamAddr::Cidr(ip, prefix) => write!(f, "{ip}/{prefix}"),
            UpstreamAddr::Port(port) => write!(f, ":{port}"),
        }
    }
}

impl FromStr for UpstreamAddr {
    type Err = String;

    /// Parses `host:port`, `ip:port`, `[v6]:port`, a CIDR (`10.0.0.0/8`,
    /// `::1/128`) or `:port`. The error says what is wrong and what to write.
    fn from_str(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Err("empty address (write host:port, ip:port, a CIDR or :port)".into());
        }
        if s.chars().any(char::is_whitespace) {
            return Err(format!("bad address {s:?}: contains a space"));
        }
        if let Ok(sa) = s.parse::<SocketAddr>() {
            nonzero_port(sa.port(), s)?;
            return Ok(UpstreamAddr::Socket(sa));
        }
        if let Some((net, prefix)) = s.split_once('/') {
            let ip: IpAddr = net
                .parse()
                .map_err(|_| format!("bad CIDR {s:?}: {net:?} is not an IP address"))?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let prefix = Some(prefix)
                .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|p| p.parse::<u8>().ok())
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("bad CIDR {s:?}: prefix must be 0 to {max}"))?;
            return Ok(UpstreamAddr::Cidr(ip, prefix));
        }
        if let Some(port) = s.strip_prefix(':')
            && !port.is_empty()
            && port.bytes().all(|b| b.is_ascii_digit())
        {
            return Ok(UpstreamAddr::Port(parse_port(port, s)?));
        }
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Err(match ip {
                IpAddr::V4(_) => {
                    format!("bad address {s:?}: no port (write {s}:PORT, or {s}/32 for any port)")
                }
                IpAddr::V6(_) => format!(
                    "bad address {s:?}: no port (write [{s}]:PORT, or {s}/128 for any port)"
                ),
            });
        }
        let Some((host, port)) = s.rsplit_once(':') else {
            return Err(format!("bad address {s:?}: no port (write {s}:PORT)"));
        };
        if host.starts_with('[') || host.contains(':') {
            return Err(format!(
                "bad address {s:?}: not an IPv6 address with a port (write [v6]:PORT)"
            ));
        }
        let port = parse_port(port, s)?;
        if !valid_host(host) {
            return Err(format!("bad address {s:?}: {host:?} is not a host name"));
        }
        Ok(UpstreamAddr::Host {
            host: host.to_string(),
            port,
        })
    }
}

fn parse_port(port: &str, whole: &str) -> Result<u16, String> {
    let p = Some(port)
        .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|p| p.parse::<u16>().ok())
        .ok_or_else(|| format!("bad address {whole:?}: bad port {port:?}"))?;
    nonzero_port(p, whole)?;
    Ok(p)
}

fn nonzero_port(port: u16, whole: &str) -> Result<(), String> {
    if port == 0 {
        return Err(format!("bad address {whole:?}: port 0 is no remote port"));
    }
    Ok(())
}

/// A DNS name: labels of letters, digits, `-` and `_`, separated by dots
/// (one trailing dot allowed).
fn valid_host(host: &str) -> bool {
    let h = host.strip_suffix('.').unwrap_or(host);
    !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// One `[[agent.probe]]`: accepted and validated now, run by a later part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeConfig {
    /// An HTTP status endpoint (`url = …`).
    Http {
        url: String,
        /// Upper case: GET (default), HEAD or POST.
        method: String,
        /// Default [`DEFAULT_PROBE_TIMEOUT`].
        timeout: Duration,
        expect_status: Option<u16>,
        /// Field name → JSON pointer into the response body.
        fields: BTreeMap<String, String>,
        /// Field name (declared in `fields`) → the value expected there.
        expect: BTreeMap<String, String>,
        /// `auth`: a credential sent with the request, read from a file or
        /// the environment when the probe runs (never from the URL, which
        /// may not hold userinfo).
        auth: Option<ProbeAuth>,
        /// `redirects`: which redirects are followed. Default same-origin.
        redirects: Redirects,
        /// `body_excerpt`: whether results keep an excerpt of the body
        /// (secret shapes redacted). Default true.
        body_excerpt: bool,
    },
    /// A file the agent touches (`health_file = …`): stale after `max_age`.
    HealthFile { path: PathBuf, max_age: Duration },
}

/// Where a probe's credential comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretSource {
    /// `bearer_file`: the first line of this file (absolute; owned by root
    /// or the user running selfheal, and not readable by others).
    File(PathBuf),
    /// `bearer_env`: this environment variable of the selfheal process.
    Env(String),
}

/// A probe's `auth = { … }`: a credential sent as a request header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeAuth {
    pub source: SecretSource,
    /// `header`: the header that carries the secret as is (e.g.
    /// `X-Api-Key`). Default: `Authorization: Bearer <secret>`.
    pub header: Option<String>,
}

/// Which redirects a probe follows (`redirects = …`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Redirects {
    /// `"same-origin"`: only to the same scheme, host and port; a redirect
    /// elsewhere fails the probe (`redirect_refused`), unfollowed.
    #[default]
    SameOrigin,
    /// `"none"`: no redirect is followed; the 3xx is the answer.
    None,
}

impl Config {
    /// Validates config `text`; `path` is only used to name it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let cx = Cx { text, path };
        let root = DeTable::parse(text).map_err(|e| cx.syntax(&e))?;
        let root = Fields::new(&cx, root.get_ref(), 0..0, String::new());
        root.only(&["agent"])?;
        let Some(agents) = root.tables("agent", "agent")? else {
            return Err(cx.error(0..0, "no agents: add an [[agent]] table".into()));
        };
        let mut out = Vec::new();
        let mut names: HashMap<String, usize> = HashMap::new();
        for (i, (table, span)) in agents.into_iter().enumerate() {
            let agent = agent(&cx, table, span, i + 1, &mut names)?;
            out.push(agent);
        }
        if out.is_empty() {
            return Err(cx.error(0..0, "no agents: add an [[agent]] table".into()));
        }
        Ok(Config {
            path: path.to_path_buf(),
            agents: out,
        })
    }

    /// The agent called `name`.
    pub fn agent(&self, name: &str) -> Option<&AgentConfig> {
        self.agents.iter().find(|a| a.name == name)
    }
}

/// The text being parsed and its file name, for errors.
struct Cx<'a> {
    text: &'a str,
    path: &'a Path,
}

impl Cx<'_> {
    fn error(&self, span: Range<usize>, message: String) -> ConfigError {
        let (line, column) = line_col(self.text, span.start);
        ConfigError::Invalid {
            path: self.path.to_path_buf(),
            line,
            column,
            message,
        }
    }

    fn syntax(&self, e: &toml::de::Error) -> ConfigError {
        let span = e.span().unwrap_or(0..0);
        let reason: Vec<_> = e
            .message()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let mut message = format!("bad TOML: {}", reason.join("; "));
        // "duplicate key" points at the key: name it.
        if let Some(key) = self.text.get(span.clone())
            && !key.is_empty()
            && key.len() <= 80
            && !key.contains('\n')
            && message.ends_with("duplicate key")
        {
            message.push_str(&format!(" `{}`", key.trim()));
        }
        self.error(span, message)
    }
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.bytes().filter(|b| *b == b'\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

type Value<'i> = Spanned<DeValue<'i>>;

/// The keys of one table, with where it is (for messages) and its scope
/// (`agent "sol" upstream 1`).
struct Fields<'a, 'i> {
    cx: &'a Cx<'a>,
    entries: Vec<(&'a str, Range<usize>, &'a Value<'i>)>,
    span: Range<usize>,
    scope: String,
}

impl<'a, 'i> Fields<'a, 'i> {
    fn new(cx: &'a Cx<'a>, table: &'a DeTable<'i>, span: Range<usize>, scope: String) -> Self {
        let mut entries: Vec<_> = table
            .iter()
            .map(|(k, v)| (k.get_ref().as_ref(), k.span(), v))
            .collect();
        entries.sort_by_key(|(_, span, _)| span.start);
        Fields {
            cx,
            entries,
            span,
            scope,
        }
    }

    fn prefix(&self) -> String {
        if self.scope.is_empty() {
            String::new()
        } else {
            format!("{}: ", self.scope)
        }
    }

    /// An error about `key` at `span`.
    fn key_error(&self, key: &str, span: Range<usize>, what: impl fmt::Display) -> ConfigError {
        // A quoted key may hold anything: keep the message on one line.
        let key = if key.chars().any(char::is_control) {
            format!("{key:?}")
        } else {
            key.to_string()
        };
        self.cx
            .error(span, format!("{}key `{key}`: {what}", self.prefix()))
    }

    /// An error about the table as a whole.
    fn table_error(&self, what: impl fmt::Display) -> ConfigError {
        self.cx
            .error(self.span.clone(), format!("{}{what}", self.prefix()))
    }

    /// Fails on the first key (in file order) not in `allowed`.
    fn only(&self, allowed: &[&str]) -> Result<(), ConfigError> {
        for (key, span, _) in &self.entries {
            if !allowed.contains(key) {
                return Err(self.key_error(
                    key,
                    span.clone(),
                    format!("unknown key (expected {})", allowed.join(", ")),
                ));
            }
        }
        Ok(())
    }

    fn get(&self, key: &str) -> Option<(Range<usize>, &'a Value<'i>)> {
        self.entries
            .iter()
            .find(|(k, _, _)| *k == key)
            .map(|(_, span, v)| (span.clone(), *v))
    }

    fn type_error(&self, key: &str, v: &Value<'_>, expected: &str) -> ConfigError {
        self.key_error(
            key,
            v.span(),
            format!("expected {expected}, found {}", v.get_ref().type_str()),
        )
    }

    /// A string value and its span.
    fn string(&self, key: &str) -> Result<Option<(&'a str, Range<usize>)>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some((_, v)) => match v.get_ref() {
                DeValue::String(s) => Ok(Some((s.as_ref(), v.span()))),
                _ => Err(self.type_error(key, v, "a string")),
            },
        }
    }

    fn integer(&self, key: &str) -> Result<Option<(i64, Range<usize>)>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some((_, v)) => match v.get_ref() {
                DeValue::Integer(i) => i64::from_str_radix(i.as_str(), i.radix())
                    .map(|n| Some((n, v.span())))
                    .map_err(|_| self.key_error(key, v.span(), "integer out of range")),
                _ => Err(self.type_error(key, v, "an integer")),
            },
        }
    }

    fn duration(&self, key: &str) -> Result<Option<Duration>, ConfigError> {
        let Some((s, span)) = self.string(key)? else {
            return Ok(None);
        };
        let d = humantime::parse_duration(s).map_err(|e| {
            self.key_error(
                key,
                span.clone(),
                format!("bad duration {s:?}: {e} (examples: 500ms, 90s, 5m)"),
            )
        })?;
        if d.is_zero() {
            return Err(self.key_error(key, span, format!("duration {s:?} must be more than 0")));
        }
        Ok(Some(d))
    }

    /// A table value (inline or not) as `Fields`.
    fn table(&self, key: &str, scope: String) -> Result<Option<Fields<'a, 'i>>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some((_, v)) => match v.get_ref() {
                DeValue::Table(t) => Ok(Some(Fields::new(self.cx, t, v.span(), scope))),
                _ => Err(self.type_error(key, v, "a table")),
            },
        }
    }

    /// A boolean value.
    fn boolean(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some((_, v)) => match v.get_ref() {
                DeValue::Boolean(b) => Ok(Some(*b)),
                _ => Err(self.type_error(key, v, "true or false")),
            },
        }
    }

    /// An array of strings (an argv).
    fn strings(&self, key: &str) -> Result<Option<WithSpan<Vec<String>>>, ConfigError> {
        let Some((_, v)) = self.get(key) else {
            return Ok(None);
        };
        let DeValue::Array(items) = v.get_ref() else {
            return Err(self.type_error(key, v, "an array of strings"));
        };
        let mut out = Vec::new();
        for item in items.iter() {
            match item.get_ref() {
                DeValue::String(s) => out.push(s.to_string()),
                _ => return Err(self.type_error(key, item, "a string")),
            }
        }
        Ok(Some((out, v.span())))
    }

    /// An array of tables (`[[key]]`, or `key = [{…}, …]`).
    #[allow(clippy::type_complexity)]
    fn tables(
        &self,
        key: &str,
        header: &str,
    ) -> Result<Option<Vec<(&'a DeTable<'i>, Range<usize>)>>, ConfigError> {
        let Some((_, v)) = self.get(key) else {
            return Ok(None);
        };
        let DeValue::Array(items) = v.get_ref() else {
            return Err(self.type_error(key, v, &format!("an array of tables ([[{header}]])")));
        };
        let mut out = Vec::new();
        for item in items.iter() {
            match item.get_ref() {
                DeValue::Table(t) => out.push((t, item.span())),
                _ => return Err(self.type_error(key, item, "an array of tables")),
            }
        }
        Ok(Some(out))
    }
}

/// A value and where it stands in the file.
type WithSpan<T> = (T, Range<usize>);

const AGENT_KEYS: &[&str] = &[
    "name",
    "match",
    "upstream",
    "probe",
    "thresholds",
    "heal",
    "proof",
];
const PROOF_KEYS: &[&str] = &["keepalive", "idle", "interval", "count"];
const HEAL_KEYS: &[&str] = &[
    "sockets",
    "signal",
    "grace",
    "restart",
    "restart_timeout",
    "step_window",
    "backoff",
    "max_actions_per_hour",
    "max_restarts_per_hour",
];
const THRESHOLD_KEYS: &[&str] = &[
    "suspect_after",
    "dead_probes",
    "dead_backoff",
    "recv_blocked",
    "current_task_stale",
    "zombies",
    "d_state",
    "probe_slow",
    "collect_budget",
];
const MATCH_KEYS: &[&str] = &[
    "pid",
    "pidfile",
    "cmdline",
    "exe",
    "unit",
    "container",
    "image",
    "label",
    "pod",
    "namespace",
];
/// The `match` keys on container identity: any of them may combine (all
/// must hold); the others stand alone.
const CONTAINER_MATCH_KEYS: &[&str] = &["container", "image", "label", "pod", "namespace"];
const UPSTREAM_KEYS: &[&str] = &[
    "role",
    "addr",
    "heartbeat",
    "suspect_after",
    "max_silence",
    "connect_timeout",
];
const PROBE_KEYS: &[&str] = &[
    "url",
    "method",
    "timeout",
    "expect_status",
    "fields",
    "expect",
    "health_file",
    "max_age",
    "auth",
    "redirects",
    "body_excerpt",
];
const HTTP_ONLY: &[&str] = &[
    "method",
    "timeout",
    "expect_status",
    "fields",
    "expect",
    "auth",
    "redirects",
    "body_excerpt",
];
const AUTH_KEYS: &[&str] = &["bearer_file", "bearer_env", "header"];
const METHODS: &[&str] = &["GET", "HEAD", "POST"];

fn agent<'a>(
    cx: &'a Cx<'a>,
    table: &'a DeTable<'_>,
    span: Range<usize>,
    index: usize,
    names: &mut HashMap<String, usize>,
) -> Result<AgentConfig, ConfigError> {
    let f = Fields::new(cx, table, span, format!("agent {index}"));
    // The name first, so that every later message can say which agent.
    let Some((name, name_span)) = f.string("name")? else {
        f.only(AGENT_KEYS)?;
        return Err(f.table_error("key `name`: missing (every agent needs a name)"));
    };
    if name.is_empty() {
        return Err(f.key_error("name", name_span, "empty name"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(f.key_error(
            "name",
            name_span,
            format!("bad name {name:?}: use letters, digits, '.', '_' and '-'"),
        ));
    }
    if let Some(first) = names.get(name) {
        return Err(f.key_error(
            "name",
            name_span,
            format!("duplicate agent name {name:?} (first at line {first})"),
        ));
    }
    names.insert(name.to_string(), line_col(cx.text, name_span.start).0);
    let scope = format!("agent {name:?}");
    let f = Fields {
        scope: scope.clone(),
        ..f
    };
    f.only(AGENT_KEYS)?;

    let Some(m) = f.table("match", format!("{scope} match"))? else {
        return Err(f.table_error(format!(
            "key `match`: missing (one of {})",
            MATCH_KEYS.join(", ")
        )));
    };
    let (rule, match_uid) = match_rule(&f, &m)?;

    let mut upstreams = Vec::new();
    for (i, (t, span)) in f
        .tables("upstream", "agent.upstream")?
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        let u = Fields::new(cx, t, span, format!("{scope} upstream {}", i + 1));
        upstreams.push(upstream(&u)?);
    }
    let mut probes = Vec::new();
    for (i, (t, span)) in f
        .tables("probe", "agent.probe")?
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        let p = Fields::new(cx, t, span, format!("{scope} probe {}", i + 1));
        probes.push(probe(&p)?);
    }
    let thresholds = match f.table("thresholds", format!("{scope} thresholds"))? {
        Some(t) => thresholds(&t)?,
        None => Thresholds::default(),
    };
    let heal = match f.table("heal", format!("{scope} heal"))? {
        Some(h) => heal(&h)?,
        None => HealConfig::default(),
    };
    let proof = match f.table("proof", format!("{scope} proof"))? {
        Some(p) => proof(&p)?,
        None => ProofConfig::default(),
    };
    Ok(AgentConfig {
        match_uid,
        name: name.to_string(),
        rule,
        upstreams,
        probes,
        thresholds,
        heal,
        proof,
    })
}

fn proof(p: &Fields<'_, '_>) -> Result<ProofConfig, ConfigError> {
    p.only(PROOF_KEYS)?;
    let d = ProofConfig::default();
    // The kernel's limits (include/net/tcp.h): whole seconds, 1 to 32767;
    // 1 to 127 probes.
    let secs = |key: &str, default: Duration| -> Result<Duration, ConfigError> {
        let Some(v) = p.duration(key)? else {
            return Ok(default);
        };
        if v < Duration::from_secs(1) || v > Duration::from_secs(32767) || v.subsec_nanos() != 0 {
            let (span, _) = p.get(key).expect("the key was read");
            return Err(p.key_error(
                key,
                span,
                format!(
                    "{v:?} is not whole seconds from 1s to 32767s (the kernel's keepalive unit)"
                ),
            ));
        }
        Ok(v)
    };
    let count = match p.integer("count")? {
        None => d.count,
        Some((n, span)) => u32::try_from(n)
            .ok()
            .filter(|n| (1..=127).contains(n))
            .ok_or_else(|| {
                p.key_error(
                    "count",
                    span,
                    format!("{n} is not a probe count from 1 to 127"),
                )
            })?,
    };
    Ok(ProofConfig {
        keepalive: p.boolean("keepalive")?.unwrap_or(d.keepalive),
        idle: secs("idle", d.idle)?,
        interval: secs("interval", d.interval)?,
        count,
    })
}

fn thresholds(t: &Fields<'_, '_>) -> Result<Thresholds, ConfigError> {
    t.only(THRESHOLD_KEYS)?;
    let d = Thresholds::default();
    let count = |key: &str, default: u32| -> Result<u32, ConfigError> {
        match t.integer(key)? {
            None => Ok(default),
            Some((n, span)) => u32::try_from(n)
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| t.key_error(key, span, format!("{n} is not a positive count"))),
        }
    };
    Ok(Thresholds {
        suspect_after: t.duration("suspect_after")?.unwrap_or(d.suspect_after),
        dead_probes: count("dead_probes", d.dead_probes)?,
        dead_backoff: count("dead_backoff", d.dead_backoff)?,
        recv_blocked: t.duration("recv_blocked")?.unwrap_or(d.recv_blocked),
        current_task_stale: t
            .duration("current_task_stale")?
            .unwrap_or(d.current_task_stale),
        zombies: count("zombies", d.zombies)?,
        d_state: t.duration("d_state")?.unwrap_or(d.d_state),
        probe_slow: t.duration("probe_slow")?.unwrap_or(d.probe_slow),
        collect_budget: t.duration("collect_budget")?.unwrap_or(d.collect_budget),
    })
}

fn heal(h: &Fields<'_, '_>) -> Result<HealConfig, ConfigError> {
    h.only(HEAL_KEYS)?;
    let d = HealConfig::default();
    let count = |key: &str, default: u32| -> Result<u32, ConfigError> {
        match h.integer(key)? {
            None => Ok(default),
            Some((n, span)) => {
                u32::try_from(n).map_err(|_| h.key_error(key, span, format!("{n} is not a count")))
            }
        }
    };
    // `restart` is an argv, or `{ runtime = true }`.
    let runtime_table = match h.get("restart") {
        Some((_, v)) => match v.get_ref() {
            DeValue::Table(t) => Some(Fields::new(
                h.cx,
                t,
                v.span(),
                format!("{} restart", h.scope),
            )),
            _ => None,
        },
        None => None,
    };
    let (restart, restart_runtime) = if let Some(r) = runtime_table {
        r.only(&["runtime"])?;
        match r.get("runtime") {
            Some((_, v)) if matches!(v.get_ref(), DeValue::Boolean(true)) => (None, true),
            Some((_, v)) => {
                return Err(r.key_error(
                    "runtime",
                    v.span(),
                    "only `runtime = true` is allowed (leave `restart` out for no restart)",
                ))
            }
            None => {
                return Err(r.table_error(
                    "expected `{ runtime = true }` or an argv, e.g. [\"systemctl\", \"restart\", \"x.service\"]",
                ))
            }
        }
    } else {
        let argv = match h.strings("restart")? {
            None => None,
            Some((argv, span)) => {
                if argv.is_empty() || argv[0].is_empty() {
                    return Err(h.key_error("restart", span, "an empty command"));
                }
                if argv.len() == 1 && argv[0].contains(' ') {
                    return Err(h.key_error(
                        "restart",
                        span,
                        format!("{:?} looks like a shell string: give the argv as a list, e.g. [\"systemctl\", \"restart\", \"x.service\"]", argv[0]),
                    ));
                }
                Some(argv)
            }
        };
        (argv, false)
    };
    Ok(HealConfig {
        sockets: h.boolean("sockets")?.unwrap_or(d.sockets),
        signal: h.boolean("signal")?.unwrap_or(d.signal),
        grace: h.duration("grace")?.unwrap_or(d.grace),
        restart,
        restart_runtime,
        restart_timeout: h.duration("restart_timeout")?.unwrap_or(d.restart_timeout),
        step_window: h.duration("step_window")?.unwrap_or(d.step_window),
        backoff: h.duration("backoff")?.unwrap_or(d.backoff),
        max_actions_per_hour: count("max_actions_per_hour", d.max_actions_per_hour)?,
        max_restarts_per_hour: count("max_restarts_per_hour", d.max_restarts_per_hour)?,
    })
}

fn match_rule(
    agent: &Fields<'_, '_>,
    m: &Fields<'_, '_>,
) -> Result<(MatchRule, MatchUid), ConfigError> {
    let mut allowed = MATCH_KEYS.to_vec();
    allowed.push("uid");
    m.only(&allowed)?;
    let rule = one_match_rule(agent, m)?;
    let match_uid = match m.get("uid") {
        None => MatchUid::Runner,
        Some((_, v)) => {
            let unit = matches!(rule, MatchRule::Unit(_));
            if !unit && !matches!(rule, MatchRule::Cmdline(_) | MatchRule::Exe(_)) {
                return Err(m.key_error(
                    "uid",
                    v.span(),
                    "applies to cmdline, exe and unit rules only (pid and pidfile name their processes)",
                ));
            }
            match v.get_ref() {
                DeValue::String(s) if s.as_ref() == "any" && unit => {
                    return Err(m.key_error(
                        "uid",
                        v.span(),
                        "a unit rule's uid names the user whose manager runs the unit: give a number",
                    ));
                }
                DeValue::String(s) if s.as_ref() == "any" => MatchUid::Any,
                DeValue::Integer(_) => {
                    let (n, span) = m.integer("uid")?.unwrap_or((-1, 0..0));
                    match u32::try_from(n) {
                        Ok(uid) if uid != u32::MAX => MatchUid::Uid(uid),
                        _ => return Err(m.key_error("uid", span, format!("bad uid {n}"))),
                    }
                }
                _ => {
                    return Err(m.key_error(
                        "uid",
                        v.span(),
                        "expected a uid (a number) or \"any\"",
                    ));
                }
            }
        }
    };
    Ok((rule, match_uid))
}

fn one_match_rule(agent: &Fields<'_, '_>, m: &Fields<'_, '_>) -> Result<MatchRule, ConfigError> {
    let keys: Vec<&str> = m
        .entries
        .iter()
        .map(|(k, _, _)| *k)
        .filter(|k| *k != "uid")
        .collect();
    match keys.as_slice() {
        [] => {
            return Err(agent.key_error(
                "match",
                m.span.clone(),
                format!("no rule: give one of {}", MATCH_KEYS.join(", ")),
            ));
        }
        [_] => {}
        many if many.iter().all(|k| CONTAINER_MATCH_KEYS.contains(k)) => {}
        [..] => {
            return Err(agent.key_error(
                "match",
                m.entries[1].1.clone(),
                format!(
                    "more than one rule ({}): give exactly one (only {} may combine)",
                    keys.join(", "),
                    CONTAINER_MATCH_KEYS.join(", ")
                ),
            ));
        }
    }
    let key = keys[0];
    if CONTAINER_MATCH_KEYS.contains(&key) {
        return container_rule(m).map(MatchRule::Container);
    }
    if key == "pid" {
        let (pid, span) = m.integer("pid")?.unwrap_or((0, 0..0));
        return match u32::try_from(pid) {
            Ok(pid) if pid > 0 && pid <= i32::MAX as u32 => Ok(MatchRule::Pid(pid)),
            _ => Err(m.key_error("pid", span, format!("bad pid {pid}"))),
        };
    }
    let (value, span) = m.string(key)?.unwrap_or(("", 0..0));
    if value.is_empty() {
        return Err(m.key_error(key, span, "empty"));
    }
    match key {
        "pidfile" | "exe" => {
            if !Path::new(value).is_absolute() {
                return Err(m.key_error(key, span, format!("{value:?} is not an absolute path")));
            }
            Ok(if key == "exe" {
                MatchRule::Exe(PathBuf::from(value))
            } else {
                MatchRule::Pidfile(PathBuf::from(value))
            })
        }
        "cmdline" => regex::Regex::new(value)
            .map(MatchRule::Cmdline)
            .map_err(|e| {
                m.key_error(
                    key,
                    span,
                    format!("bad regex {value:?}: {}", regex_reason(&e)),
                )
            }),
        _ => {
            if value.contains('/') || value.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(m.key_error(key, span, format!("bad unit name {value:?}")));
            }
            Ok(MatchRule::Unit(if value.contains('.') {
                value.to_string()
            } else {
                format!("{value}.service")
            }))
        }
    }
}

/// A `match` table of container keys (`container`, `image`, `label`, `pod`,
/// `namespace`).
fn container_rule(m: &Fields<'_, '_>) -> Result<crate::runtime::ContainerRule, ConfigError> {
    use crate::runtime::Glob;
    let glob = |key: &str| -> Result<Option<Glob>, ConfigError> {
        match m.string(key)? {
            None => Ok(None),
            Some(("", span)) => Err(m.key_error(key, span, "empty")),
            Some((v, span)) if v.chars().any(char::is_control) => {
                Err(m.key_error(key, span, format!("{v:?} holds a control character")))
            }
            Some((v, _)) => Ok(Some(Glob(v.to_string()))),
        }
    };
    let mut labels = Vec::new();
    if let Some((_, v)) = m.get("label") {
        let items: Vec<(String, Range<usize>)> = match v.get_ref() {
            DeValue::String(s) => vec![(s.to_string(), v.span())],
            DeValue::Array(items) => {
                let mut out = Vec::new();
                for item in items.iter() {
                    match item.get_ref() {
                        DeValue::String(s) => out.push((s.to_string(), item.span())),
                        _ => return Err(m.type_error("label", item, "a \"key=value\" string")),
                    }
                }
                if out.is_empty() {
                    return Err(m.key_error("label", v.span(), "empty list"));
                }
                out
            }
            _ => {
                return Err(m.type_error("label", v, "a \"key=value\" string or a list of them"));
            }
        };
        for (item, span) in items {
            match item.split_once('=') {
                Some((k, val)) if !k.is_empty() => labels.push((k.to_string(), val.to_string())),
                _ => {
                    return Err(m.key_error(
                        "label",
                        span,
                        format!("bad label {item:?}: expected key=value"),
                    ));
                }
            }
        }
    }
    Ok(crate::runtime::ContainerRule {
        container: glob("container")?,
        image: glob("image")?,
        labels,
        pod: glob("pod")?,
        namespace: glob("namespace")?,
    })
}

/// The one-line reason of a regex error (its Display draws a caret diagram
/// over several lines).
fn regex_reason(e: &regex::Error) -> String {
    let text = e.to_string();
    text.lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("error: "))
        .map_or_else(|| text.replace('\n', " "), str::to_string)
}

fn upstream(u: &Fields<'_, '_>) -> Result<Upstream, ConfigError> {
    u.only(UPSTREAM_KEYS)?;
    let role = match u.string("role")? {
        None => return Err(u.table_error("key `role`: missing (control or provider)")),
        Some(("control", _)) => Role::Control,
        Some(("provider", _)) => Role::Provider,
        Some((other, span)) => {
            return Err(u.key_error(
                "role",
                span,
                format!("bad role {other:?} (expected control or provider)"),
            ));
        }
    };
    let addr = match u.string("addr")? {
        None => {
            return Err(u.table_error("key `addr`: missing (host:port, ip:port, a CIDR or :port)"));
        }
        Some((s, span)) => s
            .parse::<UpstreamAddr>()
            .map_err(|e| u.key_error("addr", span, e))?,
    };
    let heartbeat = u.duration("heartbeat")?;
    if heartbeat.is_some() && role != Role::Control {
        let (span, _) = u.get("heartbeat").expect("heartbeat was read");
        return Err(u.key_error(
            "heartbeat",
            span,
            format!("only a control upstream has a heartbeat (this one is {role})"),
        ));
    }
    Ok(Upstream {
        role,
        addr,
        heartbeat,
        suspect_after: u.duration("suspect_after")?,
        max_silence: u.duration("max_silence")?.unwrap_or(DEFAULT_MAX_SILENCE),
        connect_timeout: u
            .duration("connect_timeout")?
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT),
    })
}

fn probe(p: &Fields<'_, '_>) -> Result<ProbeConfig, ConfigError> {
    p.only(PROBE_KEYS)?;
    match (p.get("url"), p.get("health_file")) {
        (Some(_), Some((span, _))) => Err(p.key_error(
            "health_file",
            span,
            "a probe has either url or health_file, not both",
        )),
        (None, None) => Err(p.table_error("no url or health_file: give one")),
        (None, Some(_)) => {
            for key in HTTP_ONLY {
                if let Some((span, _)) = p.get(key) {
                    return Err(p.key_error(key, span, "only with url, not health_file"));
                }
            }
            let (path, span) = p.string("health_file")?.expect("health_file is present");
            if !Path::new(path).is_absolute() {
                return Err(p.key_error(
                    "health_file",
                    span,
                    format!("{path:?} is not an absolute path"),
                ));
            }
            let Some(max_age) = p.duration("max_age")? else {
                return Err(p.table_error(
                    "key `max_age`: missing (how old health_file may get, e.g. \"30s\")",
                ));
            };
            Ok(ProbeConfig::HealthFile {
                path: PathBuf::from(path),
                max_age,
            })
        }
        (Some(_), None) => {
            if let Some((span, _)) = p.get("max_age") {
                return Err(p.key_error("max_age", span, "only with health_file, not url"));
            }
            let (url, span) = p.string("url")?.expect("url is present");
            check_url(url).map_err(|e| p.key_error("url", span, e))?;
            let method = match p.string("method")? {
                None => "GET".to_string(),
                Some((m, span)) => {
                    let upper = m.to_ascii_uppercase();
                    if !METHODS.contains(&upper.as_str()) {
                        return Err(p.key_error(
                            "method",
                            span,
                            format!("bad method {m:?} (expected {})", METHODS.join(", ")),
                        ));
                    }
                    upper
                }
            };
            let timeout = p.duration("timeout")?.unwrap_or(DEFAULT_PROBE_TIMEOUT);
            let expect_status = match p.integer("expect_status")? {
                None => None,
                Some((n, span)) => match u16::try_from(n) {
                    Ok(s) if (100..=599).contains(&s) => Some(s),
                    _ => {
                        return Err(p.key_error(
                            "expect_status",
                            span,
                            format!("bad HTTP status {n} (100 to 599)"),
                        ));
                    }
                },
            };
            let fields = string_map(p, "fields", |name, pointer| {
                check_json_pointer(pointer).map_err(|e| format!("field {name:?}: {e}"))
            })?;
            let expect = string_map(p, "expect", |name, _| {
                if fields.contains_key(name) {
                    Ok(())
                } else {
                    let declared: Vec<_> = fields.keys().map(String::as_str).collect();
                    Err(if declared.is_empty() {
                        format!("field {name:?} is not declared in fields (none are)")
                    } else {
                        format!(
                            "field {name:?} is not declared in fields (declared: {})",
                            declared.join(", ")
                        )
                    })
                }
            })?;
            let auth = match p.table("auth", format!("{} auth", p.scope))? {
                None => None,
                Some(a) => Some(probe_auth(&a)?),
            };
            let redirects = match p.string("redirects")? {
                None => Redirects::default(),
                Some(("same-origin", _)) => Redirects::SameOrigin,
                Some(("none", _)) => Redirects::None,
                Some((other, span)) => {
                    return Err(p.key_error(
                        "redirects",
                        span,
                        format!("bad value {other:?} (expected \"same-origin\" or \"none\")"),
                    ));
                }
            };
            let body_excerpt = p.boolean("body_excerpt")?.unwrap_or(true);
            Ok(ProbeConfig::Http {
                url: url.to_string(),
                method,
                timeout,
                expect_status,
                fields,
                expect,
                auth,
                redirects,
                body_excerpt,
            })
        }
    }
}

/// A probe's `auth` table: exactly one of `bearer_file` (an absolute path)
/// and `bearer_env` (a variable name), and optionally `header`.
fn probe_auth(a: &Fields<'_, '_>) -> Result<ProbeAuth, ConfigError> {
    a.only(AUTH_KEYS)?;
    let source = match (a.string("bearer_file")?, a.string("bearer_env")?) {
        (Some(_), Some((_, span))) => {
            return Err(a.key_error(
                "bearer_env",
                span,
                "give either bearer_file or bearer_env, not both",
            ));
        }
        (None, None) => {
            return Err(a.table_error(
                "give bearer_file = \"/path/to/token\" or bearer_env = \"VARIABLE\"",
            ));
        }
        (Some((path, span)), None) => {
            if !Path::new(path).is_absolute() {
                return Err(a.key_error(
                    "bearer_file",
                    span,
                    format!("{path:?} is not an absolute path"),
                ));
            }
            SecretSource::File(PathBuf::from(path))
        }
        (None, Some((name, span))) => {
            let valid = !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !valid {
                return Err(a.key_error(
                    "bearer_env",
                    span,
                    format!("{name:?} is not an environment variable name (letters, digits, '_')"),
                ));
            }
            SecretSource::Env(name.to_string())
        }
    };
    let header = match a.string("header")? {
        None => None,
        Some((h, span)) => {
            if http::header::HeaderName::from_bytes(h.as_bytes()).is_err() {
                return Err(a.key_error("header", span, format!("bad header name {h:?}")));
            }
            Some(h.to_string())
        }
    };
    Ok(ProbeAuth { source, header })
}

/// A table of strings, each checked by `check(name, value)`; errors name the
/// key as `table.name`.
fn string_map(
    p: &Fields<'_, '_>,
    key: &str,
    check: impl Fn(&str, &str) -> Result<(), String>,
) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut out = BTreeMap::new();
    let Some(t) = p.table(key, p.scope.clone())? else {
        return Ok(out);
    };
    for (name, name_span, v) in &t.entries {
        let full = format!("{key}.{name}");
        let DeValue::String(s) = v.get_ref() else {
            return Err(p.type_error(&full, v, "a string"));
        };
        if name.is_empty() {
            return Err(p.key_error(&full, name_span.clone(), "empty field name"));
        }
        check(name, s).map_err(|e| p.key_error(&full, name_span.clone(), e))?;
        out.insert(name.to_string(), s.to_string());
    }
    Ok(out)
}

/// An RFC 6901 JSON pointer: empty, or `/`-separated tokens in which `~` is
/// only `~0` or `~1`.
pub fn check_json_pointer(p: &str) -> Result<(), String> {
    if !p.is_empty() && !p.starts_with('/') {
        return Err(format!(
            "bad JSON pointer {p:?}: must be empty or start with \"/\" (like \"/{p}\")"
        ));
    }
    let mut chars = p.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return Err(format!(
                "bad JSON pointer {p:?}: \"~\" must be followed by 0 or 1"
            ));
        }
    }
    Ok(())
}

fn check_url(url: &str) -> Result<(), String> {
    let shown = crate::text::redact_url(url);
    let bad = || format!("bad url {shown:?}: expected http://host[:port]/path");
    let lower = url.to_ascii_lowercase();
    let rest = lower
        .strip_prefix("http://")
        .or_else(|| lower.strip_prefix("https://"))
        .ok_or_else(bad)?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.is_empty() || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad());
    }
    if authority.contains('@') {
        return Err(format!(
            "url {shown:?} holds credentials (user:password@), which would show in \
             every output: remove them, put the secret in a file readable only by \
             selfheal's user and set auth = {{ bearer_file = \"/path/to/token\" }} \
             (or auth = {{ bearer_env = \"VARIABLE\" }}; add header = \"X-Api-Key\" \
             for another header than Authorization: Bearer)"
        ));
    }
    Ok(())
}

/// How an upstream's address was resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// Written as addresses (ip:port, CIDR, :port): nothing to look up.
    Literal,
    /// A host name and the addresses it resolved to (never empty).
    Resolved(Vec<SocketAddr>),
    /// A host name that did not resolve: this upstream matches nothing.
    Failed(String),
}

/// An upstream with its host name (if any) resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedUpstream {
    pub upstream: Upstream,
    pub resolution: Resolution,
}

impl ResolvedUpstream {
    /// Whether a socket whose remote end is `remote` talks to this upstream.
    /// IPv4-mapped IPv6 addresses (`::ffff:10.0.0.1`) are the IPv4 address
    /// they map, on either side.
    pub fn matches(&self, remote: SocketAddr) -> bool {
        let ip = canonical(remote.ip());
        let port = remote.port();
        match &self.upstream.addr {
            UpstreamAddr::Port(p) => *p == port,
            UpstreamAddr::Socket(sa) => canonical(sa.ip()) == ip && sa.port() == port,
            UpstreamAddr::Cidr(net, prefix) => cidr_contains(*net, *prefix, ip),
            UpstreamAddr::Host { .. } => match &self.resolution {
                Resolution::Resolved(addrs) => addrs
                    .iter()
                    .any(|sa| canonical(sa.ip()) == ip && sa.port() == port),
                Resolution::Literal | Resolution::Failed(_) => false,
            },
        }
    }
}

/// An agent's upstreams, resolved once, ready to classify sockets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResolvedUpstreams {
    /// In config order.
    pub upstreams: Vec<ResolvedUpstream>,
}

impl ResolvedUpstreams {
    /// The upstream a socket with remote end `remote` talks to: the first in
    /// config order that matches. Pure.
    pub fn upstream_of(&self, remote: SocketAddr) -> Option<&ResolvedUpstream> {
        self.upstreams.iter().find(|u| u.matches(remote))
    }

    /// The role of a socket with remote end `remote`, if any upstream matches.
    pub fn role_of(&self, remote: SocketAddr) -> Option<Role> {
        self.upstream_of(remote).map(|u| u.upstream.role)
    }

    /// One line per host name: what it resolved to, or why it did not.
    pub fn notes(&self) -> Vec<String> {
        let mut out = Vec::new();
        for u in &self.upstreams {
            let addr = &u.upstream.addr;
            match &u.resolution {
                Resolution::Literal => {}
                Resolution::Resolved(addrs) => {
                    let list: Vec<_> = addrs.iter().map(ToString::to_string).collect();
                    out.push(format!("{addr} resolves to {}", list.join(", ")));
                }
                Resolution::Failed(e) => {
                    out.push(format!(
                        "{addr} does not resolve ({e}): it matches no socket"
                    ));
                }
            }
        }
        out
    }
}

impl AgentConfig {
    /// The uid its rule is limited to when selfheal runs as `runner`
    /// ([`MatchUid::filter`]).
    pub fn uid_filter(&self, runner: u32) -> Option<u32> {
        self.match_uid.filter(&self.rule, runner)
    }

    /// Whose units its `unit` rule may name when selfheal runs as `runner`:
    /// root's check names system units unless `uid` names a user; a user's
    /// check names system units and the user's own.
    pub fn unit_owner(&self, runner: u32) -> UnitOwner {
        match self.match_uid {
            MatchUid::Uid(uid) => UnitOwner::User(uid),
            MatchUid::Runner | MatchUid::Any if runner != 0 => UnitOwner::SystemOr(runner),
            MatchUid::Runner | MatchUid::Any => UnitOwner::System,
        }
    }

    /// Resolves the upstreams' host names (once each) with `lookup` (the
    /// system resolver: `selfheal::config::resolve_upstreams`). A name that
    /// does not resolve is not an error: that upstream matches nothing and
    /// [`ResolvedUpstreams::notes`] says why.
    pub fn resolve_upstreams_with(
        &self,
        mut lookup: impl FnMut(&str, u16) -> Result<Vec<SocketAddr>, String>,
    ) -> ResolvedUpstreams {
        let mut cache: HashMap<(String, u16), Resolution> = HashMap::new();
        let upstreams = self
            .upstreams
            .iter()
            .map(|u| {
                let resolution = match &u.addr {
                    UpstreamAddr::Host { host, port } => cache
                        .entry((host.clone(), *port))
                        .or_insert_with(|| match lookup(host, *port) {
                            Ok(mut addrs) => {
                                let mut seen = Vec::new();
                                addrs.retain(|a| {
                                    let key = (a.ip(), a.port());
                                    let new = !seen.contains(&key);
                                    seen.push(key);
                                    new
                                });
                                if addrs.is_empty() {
                                    Resolution::Failed("no addresses".into())
                                } else {
                                    Resolution::Resolved(addrs)
                                }
                            }
                            Err(e) => Resolution::Failed(e),
                        })
                        .clone(),
                    _ => Resolution::Literal,
                };
                ResolvedUpstream {
                    upstream: u.clone(),
                    resolution,
                }
            })
            .collect();
        ResolvedUpstreams { upstreams }
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it maps; others as is.
/// (`::1` stays IPv6: only `::ffff:a.b.c.d` is mapped.)
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Whether `ip` (canonical) is in `net/prefix`. A mapped network
/// (`::ffff:10.0.0.0/104`) is its IPv4 network; an IPv6 network shorter than
/// the mapped range (`::/0`) also holds IPv4 addresses in their mapped form.
fn cidr_contains(net: IpAddr, prefix: u8, ip: IpAddr) -> bool {
    let (net, prefix) = match net {
        IpAddr::V6(n) if prefix >= 96 && n.to_ipv4_mapped().is_some() => (
            IpAddr::V4(n.to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED)),
            prefix - 96,
        ),
        other => (other, prefix),
    };
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            prefix_eq(u32::from(n).into(), u32::from(a).into(), prefix, 32)
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(u128::from(n), u128::from(a), prefix, 128),
        (IpAddr::V6(n), IpAddr::V4(a)) => {
            prefix_eq(u128::from(n), u128::from(a.to_ipv6_mapped()), prefix, 128)
        }
        (IpAddr::V4(_), IpAddr::V6(_)) => false,
    }
}

/// Whether the first `prefix` of `bits` bits of `a` and `b` agree.
fn prefix_eq(a: u128, b: u128, prefix: u8, bits: u32) -> bool {
    let prefix = u32::from(prefix).min(bits);
    if prefix == 0 {
        return true;
    }
    let shift = bits - prefix;
    (a >> shift) == (b >> shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn collect_budget_is_a_duration_with_a_default() {
        let parse = |line: &str| {
            let text = format!(
                "[[agent]]\nname = \"a\"\nmatch = {{ pid = 1 }}\n[agent.thresholds]\n{line}\n"
            );
            Config::parse(&text, Path::new("c.toml")).map(|c| c.agents[0].thresholds.clone())
        };
        assert_eq!(parse("").unwrap().collect_budget, DEFAULT_COLLECT_BUDGET);
        assert_eq!(DEFAULT_COLLECT_BUDGET, Duration::from_secs(5));
        assert_eq!(
            parse("collect_budget = \"250ms\"").unwrap().collect_budget,
            Duration::from_millis(250)
        );
        for (bad, says) in [
            ("collect_budget = \"0s\"", "must be more than 0"),
            ("collect_budget = \"soon\"", "bad duration"),
            ("collect_budget = 5", "expected a string"),
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(
                e.contains("collect_budget") && e.contains(says),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn restart_is_an_argv_or_the_runtime() {
        let parse = |restart: &str| {
            let text = format!(
                "[[agent]]\nname = \"a\"\nmatch = {{ pid = 1 }}\n[agent.heal]\nrestart = {restart}\n"
            );
            Config::parse(&text, Path::new("c.toml")).map(|c| c.agents[0].heal.clone())
        };
        let h = parse("{ runtime = true }").unwrap();
        assert!(h.restart_runtime && h.restart.is_none());
        let h = parse("[\"systemctl\", \"restart\", \"x\"]").unwrap();
        assert!(!h.restart_runtime && h.restart.unwrap().len() == 3);
        for (bad, says) in [
            ("{ runtime = false }", "only `runtime = true`"),
            ("{ runtime = \"yes\" }", "only `runtime = true`"),
            ("{}", "expected `{ runtime = true }` or an argv"),
            (
                "{ runtime = true, argv = [] }",
                "key `argv`: unknown key (expected runtime)",
            ),
            ("\"docker restart x\"", "expected an array of strings"),
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains("c.toml:5"), "{bad}: {e}");
        }
    }

    #[test]
    fn line_col_counts_from_one() {
        assert_eq!(line_col("", 0), (1, 1));
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
        assert_eq!(line_col("ab\ncd", 99), (2, 3));
        assert_eq!(line_col("é\nx", 1), (1, 1));
    }

    #[test]
    fn upstream_addr_forms() {
        use UpstreamAddr::*;
        let ok = [
            ("127.0.0.1:7443", Socket(addr("127.0.0.1:7443"))),
            ("[::1]:443", Socket(addr("[::1]:443"))),
            ("10.0.0.0/8", Cidr("10.0.0.0".parse().unwrap(), 8)),
            ("::1/128", Cidr("::1".parse().unwrap(), 128)),
            (":443", Port(443)),
            (
                "api.example.com:443",
                Host {
                    host: "api.example.com".into(),
                    port: 443,
                },
            ),
            (
                "localhost:80",
                Host {
                    host: "localhost".into(),
                    port: 80,
                },
            ),
            (
                "fqdn.example.:443",
                Host {
                    host: "fqdn.example.".into(),
                    port: 443,
                },
            ),
        ];
        for (text, want) in ok {
            let got: UpstreamAddr = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(got, want, "{text}");
            assert_eq!(got.to_string(), text);
        }
        for bad in [
            "",
            "127.0.0.1",
            "::1",
            "host",
            "host:",
            "host:99999",
            "host:0",
            ":0",
            ":",
            "1.2.3.4/33",
            "::/129",
            "x/8",
            "h:+80",
            "1.2.3.4/+8",
            "..:80",
            "a..b:1",
            "a.:1x",
            "::1:80",
            "[::1]",
            "[::1:80",
            "a b:80",
            "bad..name:80",
            "-:x",
            ":abc",
        ] {
            assert!(bad.parse::<UpstreamAddr>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn json_pointers() {
        for ok in ["", "/", "/a", "/a/0", "/a~0b/~1c"] {
            assert!(check_json_pointer(ok).is_ok(), "{ok}");
        }
        for bad in ["a", "a/b", "/a~", "/a~2"] {
            assert!(check_json_pointer(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cidr_edges() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(cidr_contains(ip("0.0.0.0"), 0, ip("1.2.3.4")));
        assert!(cidr_contains(ip("10.1.2.3"), 8, ip("10.9.9.9")));
        assert!(!cidr_contains(ip("10.0.0.0"), 8, ip("11.0.0.0")));
        assert!(cidr_contains(ip("1.2.3.4"), 32, ip("1.2.3.4")));
        assert!(!cidr_contains(ip("1.2.3.4"), 32, ip("1.2.3.5")));
        assert!(cidr_contains(ip("::"), 0, ip("::1")));
        assert!(cidr_contains(ip("::"), 0, ip("1.2.3.4")));
        assert!(cidr_contains(ip("::ffff:10.0.0.0"), 104, ip("10.1.1.1")));
        assert!(!cidr_contains(ip("10.0.0.0"), 8, ip("::1")));
        assert!(cidr_contains(ip("fd00::"), 8, ip("fdff::1")));
        assert!(!cidr_contains(ip("fd00::"), 8, ip("fe00::1")));
    }
}
