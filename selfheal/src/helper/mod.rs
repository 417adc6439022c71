//! `selfheal helper`, the privileged long-running process, as a library:
//! its wire protocol (`selfheal_core::protocol`, the contract), who may do
//! what and whom each caller's use counts against ([`access`]), the server that checks every request and hands actions to an
//! [`Performer`] ([`server`]), and the client `selfheal check` talks to it
//! with ([`client`]). The actions themselves live elsewhere and are plugged
//! in through [`Performer`].

pub mod access;
pub mod client;
pub mod server;

pub use self::access::policy::DEFAULT_POLICY;
pub use self::client::{ClientError, ClientOptions, HelperClient, RemoteError, SnapshotWithGaps};
pub use self::server::{
    Listen, Performer, RateLimit, ServerError, ServerHandle, ServerOptions, StopReason, Stopper,
    acts::{DryCall, DryPerformer},
    audit::AuditRecord,
    listen::{DEFAULT_SOCKET, SOCKET_MODE},
    serve,
};
