//! The helper's answers: the response line, its error, and each op's result.

use super::*;

/// A response's error object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireError {
    pub code: ErrorCode,
    pub message: String,
}

/// One response line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub v: u32,
    pub id: Option<u64>,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<WireError>,
}

impl Response {
    pub fn ok(id: u64, result: Value) -> Self {
        Self {
            v: PROTOCOL_VERSION,
            id: Some(id),
            ok: true,
            result: Some(result),
            error: None,
        }
    }

    pub fn error(id: Option<u64>, code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            v: PROTOCOL_VERSION,
            id,
            ok: false,
            result: None,
            error: Some(WireError {
                code,
                message: message.into(),
            }),
        }
    }

    pub fn from_error(e: ProtoError) -> Self {
        Self::error(e.id, e.code, e.message)
    }

    /// The response as one line, `\n` included.
    pub fn to_line(&self) -> Vec<u8> {
        line(self)
    }

    /// Parses one response line.
    pub fn parse(line: &[u8]) -> Result<Response, String> {
        let r: Response =
            serde_json::from_slice(line).map_err(|e| format!("malformed response: {e}"))?;
        if r.v != PROTOCOL_VERSION {
            return Err(format!(
                "response of protocol version {} (this client speaks {PROTOCOL_VERSION})",
                r.v
            ));
        }
        if r.ok != r.result.is_some() || r.ok == r.error.is_some() {
            return Err(
                "malformed response: exactly one of `result` and `error` is expected".into(),
            );
        }
        Ok(r)
    }
}

/// Who is asking, as the kernel says (`SO_PEERCRED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// The result of `hello`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloResult {
    pub protocol: u32,
    pub helper_version: String,
    pub helper_pid: u32,
    pub caller: Caller,
    pub ebpf: EbpfStatus,
    pub limits: Limits,
}

/// The helper's tracer: which strategy runs, or why none does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EbpfStatus {
    /// The attached strategy's name (`kprobe`, `fentry`, `tp_btf`,
    /// `tracepoint`), or null.
    pub strategy: Option<String>,
    /// Every strategy tried, with why it failed (`error` null for the one
    /// that attached).
    pub attempts: Vec<AttemptWire>,
    /// Why there is no tracer, when there is none.
    pub error: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptWire {
    pub strategy: String,
    pub error: Option<String>,
}

/// The helper's limits, for clients to respect.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub max_request_bytes: usize,
    pub request_timeout_ms: u64,
    pub max_pids: usize,
}

/// The result of `watch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchResult {
    /// When the tracer was attached (`CLOCK_BOOTTIME` ns).
    pub attached_at_ns: u64,
    /// The watched pids and since when each is (receives begun earlier are
    /// invisible to the tracer).
    pub watched: Vec<WatchedPid>,
    /// Requested pids that do not exist (told only to callers that may
    /// see every process).
    pub gone: Vec<u32>,
    /// Requested pids the caller may not query, or that do not exist (a
    /// caller that may not see every process is not told which): a gap in
    /// its evidence, the rest of the request is answered. Absent from
    /// helpers before it was added: read as none.
    #[serde(default)]
    pub refused: Vec<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchedPid {
    pub pid: u32,
    /// `CLOCK_BOOTTIME` ns.
    pub since_ns: u64,
}

/// An answer about each requested pid the caller may query: what was
/// read of each (`T`), and the pids that were not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PerPid<T> {
    pub processes: Vec<T>,
    /// Requested pids that do not exist (told only to callers that may
    /// see every process).
    pub gone: Vec<u32>,
    /// Requested pids the caller may not query, or that do not exist (a
    /// caller that may not see every process is not told which).
    pub refused: Vec<u32>,
}

/// The result of `iterate`: one pass of the task iterators over each pid
/// the caller may query.
pub type IterateResult = PerPid<IteratedProcess>;

/// The result of `namespaces`.
pub type NamespacesResult = PerPid<ProcessNamespaces>;

/// One process's pass, and which process it was: the pid and its start
/// time (clock ticks after boot), so a reader can tell a reused pid.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IteratedProcess {
    pub pid: u32,
    pub start_ticks: u64,
    #[serde(flatten)]
    pub pass: crate::ebpf::iter::IterProcess,
}

/// The result of `collect`: each pid the caller may query, read as a check
/// reads it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectResult {
    pub processes: Vec<CollectedProcess>,
    /// As in [`PerPid::gone`].
    pub gone: Vec<u32>,
    /// As in [`PerPid::refused`].
    pub refused: Vec<u32>,
    /// The pids not read because the budget was spent first.
    pub over_budget: Vec<u32>,
}

/// What [`CollectedProcess::read_by`] says of a process the task iterators
/// read.
pub const READ_BY_ITERATORS: &str = "iterators";

/// One process as the helper read it, and which process it was.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectedProcess {
    pub pid: u32,
    /// The start time of the process the authorization pinned (clock
    /// ticks after boot); the read is of that process.
    pub start_ticks: u64,
    pub process: crate::proc::ProcessInfo,
    /// `iterators` when the task iterators read it, else why procfs did.
    pub read_by: String,
    /// Its network namespace (the inode of `/proc/PID/ns/net`), where
    /// readable.
    pub net_ns: Option<u64>,
    /// Its TCP sockets, from its network namespace's sock_diag dump, in
    /// the dump's order; `None` when the dump failed (`tcp_error` says why)
    /// or it holds no socket.
    pub tcp: Option<Vec<crate::sockdiag::TcpSocket>>,
    pub tcp_error: Option<String>,
}

/// One process's namespaces, as the inode numbers of its `/proc/PID/ns/*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessNamespaces {
    pub pid: u32,
    pub start_ticks: u64,
    pub pid_ns: Option<u64>,
    pub net_ns: Option<u64>,
}

/// The result of `unwatch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnwatchResult {
    pub unwatched: Vec<u32>,
}
