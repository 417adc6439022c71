//! The configuration's shape: a validated config, its agents, and what each
//! agent's tables (`match`, `upstream`, `probe`, `thresholds`, `heal`,
//! `proof`) hold once checked, with the defaults of every optional key.

use std::{
    collections::BTreeMap,
    fmt,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use serde::Serialize;

/// Default timeout of an HTTP probe.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// `collect_budget`'s default.
pub const DEFAULT_COLLECT_BUDGET: Duration = Duration::from_secs(5);

/// A loaded, validated config.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The file it was read from (named in every message about it).
    pub path: PathBuf,
    /// The watched agents, in file order; names unique, none starting with
    /// `auto.`. At least one, unless `[auto]` watches something.
    pub agents: Vec<AgentConfig>,
    /// `[auto]`: the containers and units watched without an agent table.
    pub auto: AutoConfig,
}

/// What `[auto]` opts in: every container its runtime labels
/// `selfheal.enable=true` (`containers = true`) and the systemd units named
/// in `units`, each watched as an agent of its own (`crate::auto`), with
/// these thresholds, healing and proof settings.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AutoConfig {
    /// `containers`: watch labelled containers. Default false.
    pub containers: bool,
    /// `units`: system units to watch (a name without a type gets
    /// `.service`).
    pub units: Vec<String>,
    /// `[auto.thresholds]`, as an agent's.
    pub thresholds: Thresholds,
    /// `[auto.heal]`, as an agent's.
    pub heal: HealConfig,
    /// `[auto.proof]`, as an agent's.
    pub proof: ProofConfig,
}

impl AutoConfig {
    /// Whether it watches anything.
    pub fn is_on(&self) -> bool {
        self.containers || !self.units.is_empty()
    }
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
    /// How its sockets get their roles: by the upstreams' addresses (a
    /// configured agent), or every outbound connection a provider (an
    /// `[auto]` agent).
    pub roles: Roles,
}

/// How an agent's sockets get their roles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Roles {
    /// By the remote address, against the upstreams as configured.
    #[default]
    ByAddress,
    /// Every connection the agent made is a provider upstream (its one
    /// upstream matches every address); a connection it accepted (whose
    /// local address a socket of its network namespace listens on) has no
    /// role.
    Outbound,
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

display_as_str!(Role);

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
    /// `stall_after`: a call in flight whose connection has carried only
    /// keepalive (pings, no content, no new request) for longer than this
    /// is `wedged` (`stream_stalled`), and the heal ends the connection.
    /// `None` (`"off"`): never. Default [`DEFAULT_STALL_AFTER`] for a
    /// provider, off for a control upstream.
    pub stall_after: Option<Duration>,
}

/// The default `connect_timeout`: 30 s, longer than the official SDKs'
/// own connect timeouts (5-10 s) and far shorter than the kernel's SYN
/// retries (about 130 s), which a client without its own timeout waits out.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The default `max_silence`: 10 minutes, the read timeout of the official
/// openai and anthropic SDKs. A call silent longer than any SDK would wait
/// is not thinking.
pub const DEFAULT_MAX_SILENCE: Duration = Duration::from_secs(600);

/// The default `stall_after` of a provider upstream: 10 minutes, the read
/// timeout of the official openai and anthropic SDKs. Providers and
/// gateways ping while a model thinks (a reasoning model may think for
/// minutes before its first token); a call that has made no progress for
/// as long as an SDK would wait for a silent one is not thinking, and only
/// the pings keep the SDK's own timeout from ending it.
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(600);

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
}
