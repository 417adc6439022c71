//! The typed vocabulary the layers pass to each other: a socket's role and
//! TCP state, where a receive's timing came from, the reason codes of the
//! `check --json` contract, what could not be seen (gaps, with their kind),
//! and the judge's findings the ladder acts on.
//!
//! Each serializes as the string the contract has always carried (`"ESTAB"`,
//! `"control"`, `"peer_unresponsive"`, …), so the JSON outputs keep their
//! field names and values; inside the program they are compared as values,
//! never as text.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What an agent's TCP socket is to it: one of its configured upstreams, by
/// role, or anything else.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SocketRole {
    /// The dispatch server's attach stream (heartbeats expected).
    Control,
    /// An LLM API: long silences are normal.
    Provider,
    /// Not a configured upstream.
    Other,
}

impl SocketRole {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Control => "control",
            Self::Provider => "provider",
            Self::Other => "other",
        }
    }

    /// Whether it is one of the agent's configured upstreams.
    pub fn is_upstream(self) -> bool {
        self != Self::Other
    }
}

display_as_str!(SocketRole);

/// A TCP state, named as `ss` names it (the kernel's `TCP_*` numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TcpState {
    #[serde(rename = "ESTAB")]
    Established,
    #[serde(rename = "SYN-SENT")]
    SynSent,
    #[serde(rename = "SYN-RECV")]
    SynRecv,
    #[serde(rename = "FIN-WAIT-1")]
    FinWait1,
    #[serde(rename = "FIN-WAIT-2")]
    FinWait2,
    #[serde(rename = "TIME-WAIT")]
    TimeWait,
    #[serde(rename = "CLOSE")]
    Close,
    #[serde(rename = "CLOSE-WAIT")]
    CloseWait,
    #[serde(rename = "LAST-ACK")]
    LastAck,
    #[serde(rename = "LISTEN")]
    Listen,
    #[serde(rename = "CLOSING")]
    Closing,
    /// A number this program does not know (a newer kernel's).
    #[serde(rename = "UNKNOWN")]
    Unknown,
}

impl TcpState {
    /// From the kernel's number (`idiag_state`).
    pub fn from_kernel(state: u8) -> Self {
        match state {
            1 => Self::Established,
            2 => Self::SynSent,
            3 => Self::SynRecv,
            4 => Self::FinWait1,
            5 => Self::FinWait2,
            6 => Self::TimeWait,
            7 => Self::Close,
            8 => Self::CloseWait,
            9 => Self::LastAck,
            10 => Self::Listen,
            11 => Self::Closing,
            _ => Self::Unknown,
        }
    }

    /// The name `ss` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Established => "ESTAB",
            Self::SynSent => "SYN-SENT",
            Self::SynRecv => "SYN-RECV",
            Self::FinWait1 => "FIN-WAIT-1",
            Self::FinWait2 => "FIN-WAIT-2",
            Self::TimeWait => "TIME-WAIT",
            Self::Close => "CLOSE",
            Self::CloseWait => "CLOSE-WAIT",
            Self::LastAck => "LAST-ACK",
            Self::Listen => "LISTEN",
            Self::Closing => "CLOSING",
            Self::Unknown => "UNKNOWN",
        }
    }
}

display_as_str!(TcpState);

/// Where a blocked receive's timing came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecvSource {
    /// The tracer saw the receive begin: timed from its start.
    Ebpf,
    /// Only procfs: timed from when the thread last ran.
    Procfs,
}

impl RecvSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ebpf => "ebpf",
            Self::Procfs => "procfs",
        }
    }
}

display_as_str!(RecvSource);

/// The stable code of a verdict's reason: the `reasons[].code` of
/// `check --json`, which scripts and alert rules match on. Every code the
/// program can give is a variant here and nowhere else.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasonCode {
    /// Nothing suspicious (the base verdict `healthy`).
    Healthy,
    /// No call in flight; the control connection is alive (base `idle`).
    Idle,
    /// A call is in flight (base `busy`).
    Busy,
    /// No process matches the agent's rule.
    NoProcess,
    /// The peer closed; the agent has not (CLOSE-WAIT past a grace).
    PeerClosed,
    /// Keepalive probes or retransmissions unanswered.
    PeerUnresponsive,
    /// A control connection silent past 3 × its heartbeat.
    ControlSilent,
    /// A thread blocked in a receive on a dead connection.
    RecvBlocked,
    /// A thread waiting in poll/select on a dead connection.
    WaitBlocked,
    /// An upstream silent past its threshold, unproven either way.
    Suspect,
    /// A provider call alive and in flight.
    CallInFlight,
    /// A call silent past `max_silence` while its TCP peer still answers.
    SilenceExceeded,
    /// A call whose connection has carried only keepalive (pings) for
    /// longer than its upstream's `stall_after`: the peer is alive, the
    /// call makes no progress.
    StreamStalled,
    /// No connection to the configured control upstream.
    ControlAbsent,
    ProbeFailed,
    ProbeUnexpected,
    ProbeSlow,
    /// The agent's own story (a probe, `current_task`) against the kernel's.
    StatusContradictsKernel,
    Zombies,
    /// A thread in uninterruptible sleep past its threshold.
    DState,
    /// The healing ladder's breaker opened.
    GaveUp,
    /// A connection no call can be waiting on (an idle pooled one) proven
    /// dead: ended before a request is sent into it.
    IdleConnectionDead,
    /// A connection attempt the peer never answered, past the upstream's
    /// `connect_timeout`.
    ConnectTimeout,
    /// The agent's evidence could not be collected within its budget
    /// (`collect_budget`), or its rule matched nothing while command lines
    /// it had to match could not be read within theirs: it is not judged
    /// in this check.
    OverBudget,
}

impl ReasonCode {
    /// Every code, for documentation and exhaustive tests.
    pub const ALL: [ReasonCode; 24] = [
        Self::Healthy,
        Self::Idle,
        Self::Busy,
        Self::NoProcess,
        Self::PeerClosed,
        Self::PeerUnresponsive,
        Self::ControlSilent,
        Self::RecvBlocked,
        Self::WaitBlocked,
        Self::Suspect,
        Self::CallInFlight,
        Self::SilenceExceeded,
        Self::StreamStalled,
        Self::ControlAbsent,
        Self::ProbeFailed,
        Self::ProbeUnexpected,
        Self::ProbeSlow,
        Self::StatusContradictsKernel,
        Self::Zombies,
        Self::DState,
        Self::GaveUp,
        Self::IdleConnectionDead,
        Self::ConnectTimeout,
        Self::OverBudget,
    ];

    /// The contract's string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Idle => "idle",
            Self::Busy => "busy",
            Self::NoProcess => "no_process",
            Self::PeerClosed => "peer_closed",
            Self::PeerUnresponsive => "peer_unresponsive",
            Self::ControlSilent => "control_silent",
            Self::RecvBlocked => "recv_blocked",
            Self::WaitBlocked => "wait_blocked",
            Self::Suspect => "suspect",
            Self::CallInFlight => "call_in_flight",
            Self::SilenceExceeded => "silence_exceeded",
            Self::StreamStalled => "stream_stalled",
            Self::ControlAbsent => "control_absent",
            Self::ProbeFailed => "probe_failed",
            Self::ProbeUnexpected => "probe_unexpected",
            Self::ProbeSlow => "probe_slow",
            Self::StatusContradictsKernel => "status_contradicts_kernel",
            Self::Zombies => "zombies",
            Self::DState => "d_state",
            Self::GaveUp => "gave_up",
            Self::IdleConnectionDead => "idle_connection_dead",
            Self::ConnectTimeout => "connect_timeout",
            Self::OverBudget => "over_budget",
        }
    }
}

display_as_str!(ReasonCode);

/// What kind of thing could not be seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GapKind {
    /// The agent's rule matched no process.
    NoProcess,
    /// Command lines a `cmdline` rule had to match could not be read (in
    /// time, or at all): the rule cannot tell whether those processes are
    /// the agent's.
    Unread,
    /// A process exited before it could be read.
    Vanished,
    /// A process's files (threads, fds) could not be read.
    Process,
    /// A network namespace's socket table could not be dumped.
    Sockets,
    /// The listening sockets of a network namespace could not be read, so
    /// an agent whose upstreams are what its connections do
    /// ([`crate::config::Roles::Outbound`]) cannot tell the connections it
    /// accepted from those it made: none of them got a role.
    Listening,
    /// No eBPF evidence, or the tracer lost events.
    Ebpf,
    /// A container runtime could not tell about a container.
    Container,
    /// The collection ran past its time budget: the evidence is partial.
    Budget,
    /// What the report leaves out past its per-agent caps (processes,
    /// threads, sockets, zombies), counted.
    LeftOut,
}

/// Something that could not be seen, in words, with its kind. Serializes
/// as its words alone (the `gaps` of `inspect --json` are strings).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gap {
    pub kind: GapKind,
    pub text: String,
}

impl Gap {
    pub fn new(kind: GapKind, text: impl Into<String>) -> Self {
        Gap {
            kind,
            text: text.into(),
        }
    }
}

impl fmt::Display for Gap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Serialize for Gap {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

/// A socket the judge proved dead, addressed for an action on it: its
/// holder (pid and start time, which together name one process), its fd
/// there and its inode (which the helper checks against the fd before it
/// acts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeadSocket {
    pub pid: u32,
    pub start_ticks: u64,
    pub fd: i32,
    pub inode: u64,
    pub cookie: u64,
    /// Segments unacknowledged. The kernel sends keepalive probes only on
    /// an idle connection, so arming them cannot help here (a runner
    /// heartbeating into a half-open stream): the gentlest step that works
    /// is destroying it.
    pub unacked: u32,
    /// Proven by the prove stage's own keepalive, which went unanswered.
    pub by_proof: bool,
    /// The peer is alive (a stream stalled behind its keepalive): arming
    /// keepalive cannot end the connection, so the ladder starts by
    /// destroying it.
    pub peer_alive: bool,
    /// What ending it is for: a connection a call is or may be waiting on
    /// (the agent is wedged), one nobody waits on (ended before a request
    /// is sent into it), or an attempt that never connected.
    pub kind: DeadKind,
}

/// Why a dead socket is ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeadKind {
    /// A call is or may be waiting on it: a thread waits on it (a receive,
    /// poll, select, or the epoll set of a waiting thread), a request is
    /// out, or the agent reports a task.
    Awaited,
    /// Nobody can be waiting on it: an idle pooled connection.
    Idle,
    /// A connection attempt (SYN sent) the peer never answered.
    Connecting,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_codes_serialize_as_their_strings_and_back() {
        let mut seen = std::collections::BTreeSet::new();
        for c in ReasonCode::ALL {
            let v = serde_json::to_value(c).unwrap();
            assert_eq!(v, serde_json::json!(c.as_str()));
            assert_eq!(serde_json::from_value::<ReasonCode>(v).unwrap(), c);
            assert!(seen.insert(c.as_str()), "{c} twice");
        }
    }

    #[test]
    fn tcp_states_match_the_kernel_numbers_and_ss_names() {
        for n in 0..=12u8 {
            let s = TcpState::from_kernel(n);
            assert_eq!(
                serde_json::to_value(s).unwrap(),
                serde_json::json!(s.as_str())
            );
        }
        assert_eq!(TcpState::from_kernel(1), TcpState::Established);
        assert_eq!(TcpState::from_kernel(8).as_str(), "CLOSE-WAIT");
        assert_eq!(TcpState::from_kernel(200), TcpState::Unknown);
    }

    #[test]
    fn roles_sources_and_gaps_serialize_as_before() {
        assert_eq!(serde_json::to_value(SocketRole::Other).unwrap(), "other");
        assert_eq!(serde_json::to_value(RecvSource::Procfs).unwrap(), "procfs");
        let g = Gap::new(GapKind::NoProcess, "no process matched: x");
        assert_eq!(serde_json::to_value(&g).unwrap(), "no process matched: x");
    }
}
