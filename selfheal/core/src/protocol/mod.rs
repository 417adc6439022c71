//! The helper's wire protocol, version 1 — the contract between
//! `selfheal helper` and its clients. This module owns the message shapes,
//! the error codes, the limits, and the pure request parser
//! ([`parse_request`]); it does no I/O.
//!
//! # Framing
//!
//! JSON lines over a unix stream socket: every request and every response is
//! one JSON object on one line, ended by `\n` (a trailing `\r` is ignored).
//! A connection carries any number of requests, answered in order, one
//! response per request. A request line longer than
//! [`MAX_REQUEST_BYTES`] is answered `too_large` and the connection is
//! closed. A request must be complete within the helper's request timeout
//! (5 s by default, counted from when the helper starts waiting for it): a
//! partial line is then answered `timeout` and the connection closed; an idle
//! connection is closed silently.
//!
//! # Requests
//!
//! ```json
//! {"v":1,"id":7,"op":"hello"}
//! {"v":1,"id":8,"op":"watch","pids":[1234,1240]}
//! {"v":1,"id":9,"op":"unwatch","pids":[1240]}
//! {"v":1,"id":10,"op":"ebpf_snapshot","pids":[1234]}
//! {"v":1,"id":12,"op":"iterate","pids":[1234]}
//! {"v":1,"id":13,"op":"collect","pids":[1234],"detail":"light","budget_ms":5000}
//! {"v":1,"id":14,"op":"namespaces","pids":[1234]}
//! {"v":1,"id":11,"op":"act","action":"arm_keepalive","pid":1234,"start_ticks":5170,"fd":7,"inode":4242,"agent":"sol","params":{"idle_s":10}}
//! ```
//!
//! - `v` (required): the protocol version, `1`.
//! - `id` (required): an unsigned 64-bit integer chosen by the client,
//!   echoed in the response.
//! - `op` (required): one of the ops below. Keys an op does not define are
//!   errors.
//!
//! | op | fields | result |
//! |----|--------|--------|
//! | `hello` | — | `protocol`, `helper_version`, `helper_pid`, `caller` {`uid`,`gid`,`pid`} as the helper sees it, `ebpf` {`strategy` or null, `attempts`, `error` or null}, `limits` |
//! | `watch` | `pids` | adds the pids to the tracer's pid filter: `attached_at_ns`, `watched` \[{`pid`,`since_ns`}\], `gone` [pids that do not exist], `refused` [pids it may not query] |
//! | `unwatch` | `pids` | withdraws the caller's interest: `unwatched` \[pids\]; a pid leaves the filter when no uid wants it any more |
//! | `ebpf_snapshot` | `pids` | the tracer's snapshot (`strategy`, `taken_at_ns`, `blocked`, `sockets`, `overflow`) holding only those pids, and `refused` [pids it may not query] |
//! | `iterate` | `pids` | one pass of the helper's pinned task iterators over each pid: `processes` \[{`pid`, `start_ticks`, `threads` \[{`tgid`, `tid`, `state`, `exit_state`, `runtime_ns`, `syscall`, `arg0`, `arg1`, `exec_start_ns`, `cpu`, `comm`}\], `sockets` \[\[fd, inode\]\]}\], `gone`, `refused`; `unavailable` when the helper has no iterators |
//! | `collect` | `pids` (at most [`MAX_COLLECT_PIDS`]), `detail` (`minimal`, `light`, `full`), `budget_ms` (at most [`MAX_COLLECT_BUDGET_MS`]) | each pid read as a check reads it, for a check that may not read other processes itself: `processes` \[{`pid`, `start_ticks`, `process` (the process, its threads and the wait each is in, its sockets; kernel stacks for root only), `read_by` (`iterators` or why procfs), `net_ns`, `tcp` (its TCP sockets from its network namespace's sock_diag dump) or `tcp_error`}\], `gone`, `refused`, `over_budget` (the pids not reached within the budget) |
//! | `namespaces` | `pids` | each pid's namespaces: `processes` \[{`pid`, `start_ticks`, `pid_ns`, `net_ns`}\] (inode numbers, null where unreadable), `gone`, `refused` |
//! | `act` | `action`, `pid`, `start_ticks`, `fd`?, `inode`? (both for socket actions), `agent`?, `params`? | what the action did (its own JSON object); `signal` answers after SIGTERM (see below) |
//!
//! `pids` is a list of at most [`MAX_PIDS`] process ids (> 0). A pid the
//! caller may not query does not fail the request: it is listed in
//! `refused`, a per-pid gap, and the rest is answered. To a caller that may not see every process (any but root), a
//! pid that does not exist is `refused` too: the answer never tells
//! whether another user's pid exists. To root it is `gone` (`watch`) or
//! contributes nothing (`ebpf_snapshot`).
//!
//! `signal` (params `grace_ms`, default 10000, at most 120000) sends
//! SIGTERM and answers at once, without waiting out the grace: the result is `pid`, `sent` (`["SIGTERM"]`), `exited`,
//! `exited_after_ms`, `grace_ms`, and `escalating: true` when the process
//! still lives. The helper then sends SIGKILL on its own timer when the
//! grace runs out — unless the process exited, or is no longer who it was
//! at SIGTERM (its uids, start time or executable changed: a setuid
//! `exec`), or the caller may no longer act on it; each escalation is
//! audited. The caller learns what happened from the process (its pidfd,
//! the next check), not from the helper. Pending escalations are bounded
//! (1024, 64 per uid): beyond them a `signal` is `busy` and nothing is sent.
//!
//! `act`: `action` is `arm_keepalive`, `destroy_socket`, `signal`,
//! `restart`, or one of the prove stage's `prove_keepalive` (params
//! `idle_s`, `interval_s`, `count`, `hold_ms`), `restore_keepalive` (puts
//! back the options the helper read when it armed the proof on that socket,
//! kept by socket cookie, and forgets them; params `enabled`, `idle_s`,
//! `interval_s`, `count`, `user_timeout_ms`, optional, are used only for
//! root and only for a socket the helper has no record of — a helper
//! restarted since the arming; to anyone else such a socket is
//! `forbidden`) and `expire_keepalive` (only on a proof the helper armed,
//! but for root); `pid` and `start_ticks` (the process's start time in clock
//! ticks after boot, `/proc/PID/stat` field 22) name the process — a pid now
//! held by another process is `gone`; `fd` (required for the socket actions)
//! is the target's file descriptor; `inode` (required with `fd` by every
//! socket action) is the judged socket's inode:
//! the fd is duplicated and the duplicate's inode compared before anything
//! is done, so a connection that replaced the judged one under the same fd
//! number is never touched; `agent` is the agent's name, for the
//! audit log (`[A-Za-z0-9._-]`, at most [`MAX_AGENT_NAME`] bytes); `params`
//! is an object the action reads its own options from. Each request is
//! one [`Act`]; [`ActRequest::act`] and [`ActRequest::from_act`] are the
//! one mapping between the two.
//!
//! # Responses
//!
//! ```json
//! {"v":1,"id":7,"ok":true,"result":{...}}
//! {"v":1,"id":7,"ok":false,"error":{"code":"forbidden","message":"uid 1000 may not act on pid 1"}}
//! ```
//!
//! `id` is `null` when the request's id could not be read (malformed JSON,
//! no id) or the connection is refused before any request (`busy`).
//!
//! # Error codes (stable)
//!
//! | code | meaning |
//! |------|---------|
//! | `bad_request` | malformed JSON, a missing or unknown field, an unknown op, an unsupported version, a bad value |
//! | `too_large` | the request line is longer than the limit (the connection is closed) |
//! | `timeout` | the request did not arrive in time (the connection is closed) |
//! | `forbidden` | the caller may not query or act on that process, or nobody may (pid 1, the helper, kernel threads); to a caller other than root the same code and message whether the pid exists or not, whatever its start time; or the kernel would not let the caller ptrace it (checked before the act and right before it), or the socket is not a connection the act is for, or no proof the helper armed is there to restore or expire; or the process that opened the connection has exited (the connection is then closed) |
//! | `gone` | the process exited, or its pid now names another process |
//! | `failed` | the action was tried and failed |
//! | `busy` | rate limited (a token bucket per uid), too many acts in flight for that uid (4), too many escalations pending, or too many connections (in all, of that uid, or of all uids but root, which keeps a reserve: answered with `id` null and closed): try again later |
//! | `unavailable` | the helper cannot do that here (no eBPF tracer) |
//!
//! # Authorization
//!
//! Every request is authorized by the caller's `SO_PEERCRED`, and the
//! process that connected is pinned at accept by a pidfd (`SO_PEERPIDFD`;
//! `pidfd_open` and its start time where the kernel lacks it): on every
//! request it must still run, under the same pid and start time, or the
//! request is `forbidden` and the connection closed — a connection handed
//! to another process outlives its credentials. A caller may query and act
//! on processes all of whose uids (real, effective, saved) are its own, or
//! granted to it by the helper's policy; root on all. Nobody may act on pid
//! 1, the helper itself, or kernel threads. A caller other than root
//! queries (`watch`, `ebpf_snapshot`: which thread waits on which socket)
//! and acts only where the kernel would let it itself (`ptrace` access: every
//! uid and gid of the target its own or one granted uid's, the target
//! dumpable, no capability the caller lacks), on a connection only
//! (`ESTAB`; `CLOSE-WAIT` too for `arm_keepalive`, `destroy_socket`,
//! `expire_keepalive`, `restore_keepalive`; `SYN-SENT` too for
//! `destroy_socket`, a connect past its timeout; never a listener), checked
//! before the target's fds are read and again, on the duplicated socket,
//! right before the act; its refusals name no fd or inode of the target.
//! Pids are the helper's: a caller
//! in another pid namespace is `forbidden` to name any. Socket actions are
//! refused on an fd that `/proc/PID/fd/FD` does not show as a socket,
//! before anything is duplicated.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::ebpf::{BlockedRecv, Overflow, SocketActivity, Strategy, TracerSnapshot};

mod act;
mod response;
mod snapshot;

pub use self::act::{Act, Action, ContainerRestart, DEFAULT_GRACE, MAX_GRACE, SocketRef};
pub use self::response::{
    AttemptWire, Caller, CollectResult, CollectedProcess, EbpfStatus, HelloResult, IterateResult,
    IteratedProcess, Limits, NamespacesResult, PerPid, ProcessNamespaces, READ_BY_ITERATORS,
    Response, UnwatchResult, WatchResult, WatchedPid, WireError,
};
pub use self::snapshot::{BlockedWire, SnapshotWire, filter_snapshot};

/// The protocol version this module speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// The longest request line accepted, without its `\n`.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// The most pids one request may name.
pub const MAX_PIDS: usize = 4096;

/// The most pids one `collect` asks for: its answer holds every thread of
/// each.
pub const MAX_COLLECT_PIDS: usize = 256;

/// The longest budget one `collect` may have: its answer comes well within
/// a client's request timeout.
pub const MAX_COLLECT_BUDGET_MS: u64 = 8_000;

/// The longest agent name accepted in `act`.
pub const MAX_AGENT_NAME: usize = 64;

/// A stable error code (the `error.code` of a response).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    BadRequest,
    TooLarge,
    Timeout,
    Forbidden,
    Gone,
    Failed,
    Busy,
    Unavailable,
    /// A code this client does not know (a newer helper). Never sent.
    #[serde(other)]
    Unknown,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BadRequest => "bad_request",
            Self::TooLarge => "too_large",
            Self::Timeout => "timeout",
            Self::Forbidden => "forbidden",
            Self::Gone => "gone",
            Self::Failed => "failed",
            Self::Busy => "busy",
            Self::Unavailable => "unavailable",
            Self::Unknown => "unknown",
        }
    }
}

display_as_str!(ErrorCode);

/// A request that is refused, with the code and message of its response.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ProtoError {
    /// The request's id, when it could be read.
    pub id: Option<u64>,
    pub code: ErrorCode,
    pub message: String,
}

impl ProtoError {
    pub fn new(id: Option<u64>, code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            id,
            code,
            message: message.into(),
        }
    }

    fn bad(id: Option<u64>, message: impl Into<String>) -> Self {
        Self::new(id, ErrorCode::BadRequest, message)
    }
}

/// One parsed, validated request.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub id: u64,
    pub op: Op,
}

/// What a request asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Hello,
    /// Pids sorted, without duplicates.
    Watch {
        pids: Vec<u32>,
    },
    Unwatch {
        pids: Vec<u32>,
    },
    EbpfSnapshot {
        pids: Vec<u32>,
    },
    /// One pass of the helper's task iterators over each pid.
    Iterate {
        pids: Vec<u32>,
    },
    /// Each pid read as a check reads it.
    Collect(CollectRequest),
    /// Each pid's namespaces.
    Namespaces {
        pids: Vec<u32>,
    },
    Act(ActRequest),
}

impl Op {
    /// The op's name on the wire.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Hello => "hello",
            Op::Watch { .. } => "watch",
            Op::Unwatch { .. } => "unwatch",
            Op::EbpfSnapshot { .. } => "ebpf_snapshot",
            Op::Iterate { .. } => "iterate",
            Op::Collect(_) => "collect",
            Op::Namespaces { .. } => "namespaces",
            Op::Act(_) => "act",
        }
    }
}

/// The fields of an `act` request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActRequest {
    pub action: Action,
    pub pid: u32,
    /// The process's start time in clock ticks after boot: with `pid`, its
    /// identity.
    pub start_ticks: u64,
    /// The target's file descriptor (socket actions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fd: Option<i32>,
    /// The judged socket's inode: the action refuses an fd that now holds
    /// another socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inode: Option<u64>,
    /// The agent's name, for the audit log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The action's own options, read by [`ActRequest::act`].
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub params: Map<String, Value>,
}

impl ActRequest {
    /// A request with no fd, agent or params.
    pub fn new(action: Action, pid: u32, start_ticks: u64) -> Self {
        Self {
            action,
            pid,
            start_ticks,
            fd: None,
            inode: None,
            agent: None,
            params: Map::new(),
        }
    }

    fn validate(&self, id: u64) -> Result<(), ProtoError> {
        if self.pid == 0 {
            return Err(ProtoError::bad(Some(id), "pid 0 is not a process"));
        }
        match self.fd {
            Some(fd) if fd < 0 => {
                return Err(ProtoError::bad(
                    Some(id),
                    format!("fd {fd} is not a file descriptor"),
                ));
            }
            None if self.action.needs_fd() => {
                return Err(ProtoError::bad(
                    Some(id),
                    format!("missing field `fd` (required by {})", self.action),
                ));
            }
            _ => {}
        }
        if self.inode.is_none() && self.action.needs_inode() {
            return Err(ProtoError::bad(
                Some(id),
                format!("missing field `inode` (required by {})", self.action),
            ));
        }
        if let Some(agent) = &self.agent {
            let ok = !agent.is_empty()
                && agent.len() <= MAX_AGENT_NAME
                && agent
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !ok {
                return Err(ProtoError::bad(
                    Some(id),
                    format!(
                        "bad agent name (1 to {MAX_AGENT_NAME} of A-Z a-z 0-9 . _ -): {:?}",
                        truncate(agent, 80)
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Keys of the envelope, common to every request.
const ENVELOPE: [&str; 3] = ["v", "id", "op"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PidsFields {
    pids: Vec<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoFields {}

/// A `collect` request's fields.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectRequest {
    /// Sorted, without duplicates.
    pub pids: Vec<u32>,
    pub detail: crate::proc::Detail,
    /// How long the whole read may take, ms.
    pub budget_ms: u64,
}

/// Parses and validates one request line (without or with its `\n`). Pure;
/// never panics.
pub fn parse_request(line: &[u8]) -> Result<Request, ProtoError> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.len() > MAX_REQUEST_BYTES {
        return Err(ProtoError::new(
            None,
            ErrorCode::TooLarge,
            format!("request longer than {MAX_REQUEST_BYTES} bytes"),
        ));
    }
    if line.iter().all(u8::is_ascii_whitespace) {
        return Err(ProtoError::bad(None, "empty request"));
    }
    let value: Value = serde_json::from_slice(line)
        .map_err(|e| ProtoError::bad(None, format!("malformed JSON: {e}")))?;
    let Value::Object(mut obj) = value else {
        return Err(ProtoError::bad(None, "request is not a JSON object"));
    };
    let id = match obj.get("id") {
        None => return Err(ProtoError::bad(None, "missing field `id`")),
        Some(v) => v
            .as_u64()
            .ok_or_else(|| ProtoError::bad(None, "field `id` is not an unsigned integer"))?,
    };
    let some = Some(id);
    match obj.get("v") {
        None => return Err(ProtoError::bad(some, "missing field `v`")),
        Some(v) if v.as_u64() == Some(u64::from(PROTOCOL_VERSION)) => {}
        Some(v) => {
            return Err(ProtoError::bad(
                some,
                format!(
                    "unsupported protocol version {} (this helper speaks {PROTOCOL_VERSION})",
                    truncate(&v.to_string(), 40)
                ),
            ));
        }
    }
    let op = match obj.get("op") {
        None => return Err(ProtoError::bad(some, "missing field `op`")),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(ProtoError::bad(some, "field `op` is not a string")),
    };
    for key in ENVELOPE {
        obj.remove(key);
    }
    let fields = Value::Object(obj);
    let op = match op.as_str() {
        "hello" => {
            fields_of::<NoFields>(fields, id, "hello")?;
            Op::Hello
        }
        "watch" => Op::Watch {
            pids: pids(fields, id, "watch")?,
        },
        "unwatch" => Op::Unwatch {
            pids: pids(fields, id, "unwatch")?,
        },
        "ebpf_snapshot" => Op::EbpfSnapshot {
            pids: pids(fields, id, "ebpf_snapshot")?,
        },
        "iterate" => Op::Iterate {
            pids: pids(fields, id, "iterate")?,
        },
        "collect" => {
            let mut c: CollectRequest = fields_of(fields, id, "collect")?;
            c.pids = checked_pids(c.pids, MAX_COLLECT_PIDS, id, "collect")?;
            if c.budget_ms == 0 || c.budget_ms > MAX_COLLECT_BUDGET_MS {
                return Err(ProtoError::bad(
                    some,
                    format!("collect: budget_ms must be from 1 to {MAX_COLLECT_BUDGET_MS}"),
                ));
            }
            Op::Collect(c)
        }
        "namespaces" => Op::Namespaces {
            pids: pids(fields, id, "namespaces")?,
        },
        "act" => {
            let act: ActRequest = fields_of(fields, id, "act")?;
            act.validate(id)?;
            Op::Act(act)
        }
        other => {
            return Err(ProtoError::bad(
                some,
                format!(
                    "unknown op {:?} (expected hello, watch, unwatch, ebpf_snapshot, iterate, collect, namespaces, act)",
                    truncate(other, 40)
                ),
            ));
        }
    };
    Ok(Request { id, op })
}

fn fields_of<T: serde::de::DeserializeOwned>(
    fields: Value,
    id: u64,
    op: &str,
) -> Result<T, ProtoError> {
    serde_json::from_value(fields).map_err(|e| ProtoError::bad(Some(id), format!("{op}: {e}")))
}

fn pids(fields: Value, id: u64, op: &str) -> Result<Vec<u32>, ProtoError> {
    let PidsFields { pids } = fields_of(fields, id, op)?;
    checked_pids(pids, MAX_PIDS, id, op)
}

/// `pids` sorted and without duplicates, or why they are not a request's:
/// more than `max`, or a pid 0.
fn checked_pids(mut pids: Vec<u32>, max: usize, id: u64, op: &str) -> Result<Vec<u32>, ProtoError> {
    if pids.len() > max {
        return Err(ProtoError::bad(
            Some(id),
            format!("{op}: more than {max} pids"),
        ));
    }
    if pids.contains(&0) {
        return Err(ProtoError::bad(
            Some(id),
            format!("{op}: pid 0 is not a process"),
        ));
    }
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl Request {
    /// The request as one line, `\n` included.
    pub fn to_line(&self) -> Vec<u8> {
        let mut obj = Map::new();
        obj.insert("v".into(), PROTOCOL_VERSION.into());
        obj.insert("id".into(), self.id.into());
        obj.insert("op".into(), self.op.name().into());
        match &self.op {
            Op::Hello => {}
            Op::Watch { pids }
            | Op::Unwatch { pids }
            | Op::EbpfSnapshot { pids }
            | Op::Iterate { pids }
            | Op::Namespaces { pids } => {
                obj.insert("pids".into(), pids.clone().into());
            }
            Op::Collect(c) => {
                if let Ok(Value::Object(fields)) = serde_json::to_value(c) {
                    obj.extend(fields);
                }
            }
            Op::Act(act) => {
                if let Ok(Value::Object(fields)) = serde_json::to_value(act) {
                    obj.extend(fields);
                }
            }
        }
        line(&Value::Object(obj))
    }
}

fn line<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing plain data into a Vec cannot fail; an empty object is the
    // harmless answer if it ever did.
    let mut out = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests;
