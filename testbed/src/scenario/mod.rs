//! The scenarios: a [`Bed`] (topology, testbed programs, a `selfheal
//! helper`, a config) and the scripts that fault it and watch selfheal
//! answer, by running `selfheal check` as a timer would. Every observation
//! goes to a narrator as an [`Event`] (the demo prints them, the tests log
//! them) and is summed up in a [`Report`] the tests assert on.
//!
//! Checks run inside the runners' network namespace (so the runners'
//! status endpoints on 127.0.0.1 answer the probes) and heal through the
//! helper, which runs in the host's.
//!
//! By story:
//! - `bed`: the bed and one check run; `checks`: the running of checks,
//!   the report and the narration.
//! - `incident`: the incident and its variants (busy provider, stopped
//!   peer, zombie leak, the table that lies).
//! - `callers` and `silent`: the SDK and testbed callers, and their calls
//!   cut (or left alone) while the LLM thinks.
//! - `cuts`: the cut behind a proxy, of a pooled connection, of a connect,
//!   of one HTTP/2 connection.
//! - `load`: many runners streaming, many callers thinking.
//! - `sockets`: a process's TCP sockets and what its threads wait in.
//! - `stalled`: streams over TLS kept alive by keepalive pings, stalled
//!   or not, and the TLS edge before the provider.

mod bed;
mod callers;
mod checks;
mod cuts;
mod incident;
mod load;
mod silent;
mod sockets;
mod stalled;

pub use bed::{Bed, CheckRun, FAST, Options, RunnerSpec};
pub use callers::{
    CallLine, Caller, FAST_MODEL, NEVER, NEVER_MODEL, PROOF, SDK_CALLERS, node_sdk_runner,
    sdk_runner,
};
pub use checks::{Event, Report, STOP, Verdict, pause};
pub use cuts::{hanging_connect, http2_cut, pooled_cut, proxy_cut};
pub use incident::{THINKING, busy_provider, incident, peer_stopped, table_lies, zombie_leak};
pub use load::{load, many_thinking};
pub use silent::{silent_cut, silent_cut_of, thinking};
pub use sockets::{TcpSocket, tcp_sockets, waits};
pub use stalled::{
    AFTER_KILL, Plan, make_certs, stream, stream_inspected, stream_planned, tls_edge,
};
