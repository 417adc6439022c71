//! `selfheal helper`, the privileged long-running process, as a library:
//! its wire protocol ([`protocol`], the contract), who may do what
//! ([`policy`], and [`authority`]: no more than the kernel would let the
//! caller do itself), whom each caller's use counts against ([`owner`]),
//! the server that checks every request and hands actions to an
//! [`Executor`] ([`server`]), and the client `selfheal check` talks to it
//! with ([`client`]). The actions themselves live elsewhere and are plugged
//! in through [`Executor`].

pub mod authority;
pub mod client;
pub mod owner;
pub mod policy;
pub use selfheal_core::protocol;
pub mod server;

pub use self::client::{ClientError, ClientOptions, HelperClient, RemoteError, SnapshotWithGaps};
pub use self::policy::DEFAULT_POLICY;
pub use self::protocol::{
    ActRequest, Action, Caller, ErrorCode, HelloResult, PROTOCOL_VERSION, parse_request,
};
pub use self::server::{
    Executor, Listen, RateLimit, ServerError, ServerHandle, ServerOptions, StopReason, Stopper,
    acts::{DryCall, DryExecutor},
    audit::AuditRecord,
    listen::{DEFAULT_SOCKET, SOCKET_MODE},
    serve,
};
