//! The act contract: [`Act`] is what one act does to one process or socket,
//! both the ladder's step ([`crate::ladder::decide`]) and the helper's
//! request. [`ActRequest`] is its wire form, and the one mapping between
//! the two is here ([`ActRequest::from_act`], [`ActRequest::act`]): the
//! `params` keys appear nowhere else.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{ActRequest, ErrorCode, WireError};
use crate::{keepalive::KeepaliveSettings, keepalive::ProofKeepalive, runtime::Runtime};

/// A `signal` act's grace before SIGKILL when the request names none.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// Longest grace a caller may ask the helper to wait before SIGKILL.
pub const MAX_GRACE: Duration = Duration::from_secs(120);

/// One of the target's sockets: its fd, and the inode the fd must still
/// hold (an fd alone may hold a new connection by the time the act comes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketRef {
    pub fd: i32,
    pub inode: u64,
}

/// A container restart ([`Act::RestartContainer`]):
/// container `id` of `runtime`, which must still hold the agent's root
/// process `pid`/`start_ticks`, stopped with `grace_ms`, the whole bounded
/// by `timeout_ms`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRestart {
    pub runtime: Runtime,
    pub id: String,
    pub pid: u32,
    pub start_ticks: u64,
    pub grace_ms: u64,
    pub timeout_ms: u64,
}

/// One act, fully addressed: a process by `pid` and `start_ticks` (its
/// start time in clock ticks after boot), a socket by [`SocketRef`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Act {
    /// Arm TCP keepalive and user timeout on a dead connection's socket.
    ArmKeepalive {
        pid: u32,
        start_ticks: u64,
        #[serde(flatten)]
        socket: SocketRef,
    },
    /// Destroy the socket (`SOCK_DESTROY`, or `shutdown` where missing).
    DestroySocket {
        pid: u32,
        start_ticks: u64,
        #[serde(flatten)]
        socket: SocketRef,
    },
    /// SIGTERM, then SIGKILL after the grace ([`DEFAULT_GRACE`] when
    /// `None`).
    Signal {
        pid: u32,
        start_ticks: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        grace_ms: Option<u64>,
    },
    /// Run the agent's restart command, as the caller.
    Restart { argv: Vec<String>, timeout_ms: u64 },
    /// Restart a container through its runtime, as the caller.
    RestartContainer(ContainerRestart),
    /// The prove stage: arm a proof keepalive on the socket.
    ProveKeepalive {
        pid: u32,
        start_ticks: u64,
        #[serde(flatten)]
        socket: SocketRef,
        keepalive: ProofKeepalive,
    },
    /// The prove stage: put a socket's own keepalive options back; the
    /// helper puts back what it recorded when it armed the proof, and uses
    /// `previous` only for root on a socket it has no record of.
    RestoreKeepalive {
        pid: u32,
        start_ticks: u64,
        #[serde(flatten)]
        socket: SocketRef,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        previous: Option<KeepaliveSettings>,
    },
    /// End a connection whose proof keepalive went unanswered, as a
    /// keepalive timeout (the agent's read fails with `ETIMEDOUT`).
    ExpireKeepalive {
        pid: u32,
        start_ticks: u64,
        #[serde(flatten)]
        socket: SocketRef,
    },
}

/// An act's name on the wire (`ActRequest::action`): every [`Act`] but a
/// container restart, which never crosses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Duplicate the socket `fd` and arm TCP keepalive and user timeout on it.
    ArmKeepalive,
    /// Destroy the socket `fd` (`SOCK_DESTROY`, or `shutdown` where missing).
    DestroySocket,
    /// SIGTERM, then SIGKILL after a grace period.
    Signal,
    /// Run the agent's restart command.
    Restart,
    /// The prove stage: arm a proof keepalive on socket `fd` (`inode`).
    ProveKeepalive,
    /// The prove stage: put a socket's own keepalive options back.
    RestoreKeepalive,
    /// End a connection whose proof keepalive went unanswered, as a
    /// keepalive timeout (the agent's read fails with `ETIMEDOUT`).
    ExpireKeepalive,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ArmKeepalive => "arm_keepalive",
            Self::DestroySocket => "destroy_socket",
            Self::Signal => "signal",
            Self::Restart => "restart",
            Self::ProveKeepalive => "prove_keepalive",
            Self::RestoreKeepalive => "restore_keepalive",
            Self::ExpireKeepalive => "expire_keepalive",
        }
    }

    /// Whether the action works on one of the target's sockets (and so
    /// needs `fd`).
    pub fn needs_fd(self) -> bool {
        !matches!(self, Self::Signal | Self::Restart)
    }

    /// Whether the action must name the judged socket's `inode`: every
    /// socket action, since an fd alone may hold a new connection by the
    /// time the act arrives.
    pub fn needs_inode(self) -> bool {
        self.needs_fd()
    }
}

display_as_str!(Action);

impl Act {
    /// The act's name: the wire's `action`, or `restart_container`.
    pub fn name(&self) -> &'static str {
        match self.action() {
            Some(a) => a.as_str(),
            None => "restart_container",
        }
    }

    /// Which rung of the ladder this act is on (0 gentlest): the prove
    /// stage's keepalive acts are on the keepalive rung.
    pub fn rung(&self) -> u8 {
        match self {
            Self::ArmKeepalive { .. }
            | Self::ExpireKeepalive { .. }
            | Self::ProveKeepalive { .. }
            | Self::RestoreKeepalive { .. } => 0,
            Self::DestroySocket { .. } => 1,
            Self::Signal { .. } => 2,
            Self::Restart { .. } | Self::RestartContainer(_) => 3,
        }
    }

    /// Whether the act ends the process (counted against the restart
    /// budget).
    pub fn is_disruptive(&self) -> bool {
        self.rung() >= 2
    }

    /// The wire's `action` for this act; `None` for one that has none
    /// (a container restart: the caller's to do).
    pub fn action(&self) -> Option<Action> {
        Some(match self {
            Self::ArmKeepalive { .. } => Action::ArmKeepalive,
            Self::DestroySocket { .. } => Action::DestroySocket,
            Self::Signal { .. } => Action::Signal,
            Self::Restart { .. } => Action::Restart,
            Self::RestartContainer(_) => return None,
            Self::ProveKeepalive { .. } => Action::ProveKeepalive,
            Self::RestoreKeepalive { .. } => Action::RestoreKeepalive,
            Self::ExpireKeepalive { .. } => Action::ExpireKeepalive,
        })
    }

    /// The process acted on, as `(pid, start_ticks)`; `None` for a restart
    /// command, which names none.
    pub fn process(&self) -> Option<(u32, u64)> {
        match self {
            Self::ArmKeepalive {
                pid, start_ticks, ..
            }
            | Self::DestroySocket {
                pid, start_ticks, ..
            }
            | Self::Signal {
                pid, start_ticks, ..
            }
            | Self::ProveKeepalive {
                pid, start_ticks, ..
            }
            | Self::RestoreKeepalive {
                pid, start_ticks, ..
            }
            | Self::ExpireKeepalive {
                pid, start_ticks, ..
            } => Some((*pid, *start_ticks)),
            Self::RestartContainer(c) => Some((c.pid, c.start_ticks)),
            Self::Restart { .. } => None,
        }
    }

    /// The socket acted on, for a socket act.
    pub fn socket(&self) -> Option<SocketRef> {
        match self {
            Self::ArmKeepalive { socket, .. }
            | Self::DestroySocket { socket, .. }
            | Self::ProveKeepalive { socket, .. }
            | Self::RestoreKeepalive { socket, .. }
            | Self::ExpireKeepalive { socket, .. } => Some(*socket),
            Self::Signal { .. } | Self::Restart { .. } | Self::RestartContainer(_) => None,
        }
    }

    /// The act as people say it.
    pub fn words(&self) -> String {
        match self {
            Act::ArmKeepalive { pid, socket, .. } => {
                format!("arm keepalive on pid {pid} fd {}", socket.fd)
            }
            Act::ExpireKeepalive { pid, socket, .. } => format!(
                "end the unanswered keepalive on pid {pid} fd {} (ETIMEDOUT)",
                socket.fd
            ),
            Act::DestroySocket { pid, socket, .. } => {
                format!("destroy socket pid {pid} fd {}", socket.fd)
            }
            Act::Signal { pid, .. } => format!(
                "SIGTERM pid {pid} (SIGKILL after {} ms)",
                self.grace().as_millis()
            ),
            Act::Restart { argv, .. } => format!("restart: {}", argv.join(" ")),
            Act::RestartContainer(c) => format!(
                "restart {} container {} (grace {} ms)",
                c.runtime,
                crate::runtime::short_id(&c.id),
                c.grace_ms
            ),
            Act::ProveKeepalive { pid, socket, .. } => {
                format!("arm a proof keepalive on pid {pid} fd {}", socket.fd)
            }
            Act::RestoreKeepalive { pid, socket, .. } => {
                format!("restore the keepalive of pid {pid} fd {}", socket.fd)
            }
        }
    }

    /// A `signal`'s grace before SIGKILL, as asked ([`DEFAULT_GRACE`] when
    /// it names none); zero for any other act.
    pub fn grace(&self) -> Duration {
        match self {
            Self::Signal { grace_ms, .. } => grace_ms.map_or(DEFAULT_GRACE, Duration::from_millis),
            _ => Duration::ZERO,
        }
    }
}

/// The `params` of `value`, an object of known keys.
fn params_of(value: &impl Serialize) -> Map<String, Value> {
    match serde_json::to_value(value) {
        Ok(Value::Object(map)) => map,
        // Plain structs of numbers serialize to objects.
        _ => Map::new(),
    }
}

impl ActRequest {
    /// The wire request for `act` on behalf of `agent`; `None` for an act
    /// that never crosses the wire: a restart command or a container
    /// restart runs as the caller (a command is the caller's own, and the
    /// runtime's socket is the caller's to reach).
    pub fn from_act(act: &Act, agent: &str) -> Option<ActRequest> {
        let action = act.action()?;
        let (pid, start_ticks) = act.process()?;
        let mut req = ActRequest::new(action, pid, start_ticks);
        req.agent = Some(agent.to_string());
        if let Some(socket) = act.socket() {
            req.fd = Some(socket.fd);
            req.inode = Some(socket.inode);
        }
        match act {
            Act::Signal {
                grace_ms: Some(grace_ms),
                ..
            } => {
                req.params.insert("grace_ms".into(), (*grace_ms).into());
            }
            Act::ProveKeepalive { keepalive, .. } => req.params = params_of(keepalive),
            Act::RestoreKeepalive {
                previous: Some(previous),
                ..
            } => req.params = params_of(previous),
            _ => {}
        }
        Some(req)
    }

    /// `params` as a whole object of known keys.
    fn params<T: serde::de::DeserializeOwned>(&self) -> Result<T, WireError> {
        serde_json::from_value(Value::Object(self.params.clone())).map_err(|e| WireError {
            code: ErrorCode::Failed,
            message: format!("{}: bad params: {e}", self.action),
        })
    }

    /// The act this request asks for. A `signal`'s `grace_ms` that is not
    /// an unsigned integer counts as none; the other actions read no
    /// params but the prove stage's, which must be whole objects of known
    /// keys (`restore_keepalive`'s may be empty). The errors are `failed`,
    /// as the helper answers an act it cannot carry out.
    pub fn act(&self) -> Result<Act, WireError> {
        let action = self.action;
        let failed = |message: String| WireError {
            code: ErrorCode::Failed,
            message,
        };
        let socket = || {
            let fd = self
                .fd
                .ok_or_else(|| failed(format!("{action} needs an fd")))?;
            let inode = self
                .inode
                .ok_or_else(|| failed(format!("{action} needs an inode")))?;
            Ok(SocketRef { fd, inode })
        };
        let (pid, start_ticks) = (self.pid, self.start_ticks);
        Ok(match action {
            Action::ArmKeepalive => Act::ArmKeepalive {
                pid,
                start_ticks,
                socket: socket()?,
            },
            Action::DestroySocket => Act::DestroySocket {
                pid,
                start_ticks,
                socket: socket()?,
            },
            Action::Signal => Act::Signal {
                pid,
                start_ticks,
                grace_ms: self.params.get("grace_ms").and_then(Value::as_u64),
            },
            Action::Restart => {
                return Err(failed(
                    "the helper does not run restart commands: the caller runs its own".into(),
                ));
            }
            Action::ProveKeepalive => {
                let keepalive = self.params()?;
                Act::ProveKeepalive {
                    pid,
                    start_ticks,
                    socket: socket()?,
                    keepalive,
                }
            }
            Action::RestoreKeepalive => {
                let previous = if self.params.is_empty() {
                    None
                } else {
                    Some(self.params()?)
                };
                Act::RestoreKeepalive {
                    pid,
                    start_ticks,
                    socket: socket()?,
                    previous,
                }
            }
            Action::ExpireKeepalive => Act::ExpireKeepalive {
                pid,
                start_ticks,
                socket: socket()?,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn socket() -> SocketRef {
        SocketRef { fd: 7, inode: 4242 }
    }

    /// Each act in words; a container id of any characters is cut to 12
    /// of them, never inside one (an id with multi-byte characters once
    /// made the cut at byte 12 panic).
    #[test]
    fn an_act_in_words_cuts_a_container_id_at_a_character() {
        assert_eq!(
            Act::DestroySocket {
                pid: 5,
                start_ticks: 9,
                socket: socket(),
            }
            .words(),
            "destroy socket pid 5 fd 7"
        );
        let restart = |id: &str| {
            Act::RestartContainer(ContainerRestart {
                runtime: Runtime::Containerd,
                id: id.into(),
                pid: 5,
                start_ticks: 9,
                grace_ms: 300,
                timeout_ms: 1_000,
            })
            .words()
        };
        assert_eq!(
            restart("0123456789abcdef"),
            "restart containerd container 0123456789ab (grace 300 ms)"
        );
        assert_eq!(
            restart(&format!("a{}", "é".repeat(13))),
            format!(
                "restart containerd container a{} (grace 300 ms)",
                "é".repeat(11)
            )
        );
    }

    #[test]
    fn every_wire_act_round_trips_through_its_request() {
        let settings: KeepaliveSettings = serde_json::from_value(serde_json::json!({
            "enabled": true, "idle_s": 60, "interval_s": 10, "count": 5, "user_timeout_ms": 0
        }))
        .unwrap();
        let acts = [
            Act::ArmKeepalive {
                pid: 5,
                start_ticks: 9,
                socket: socket(),
            },
            Act::DestroySocket {
                pid: 5,
                start_ticks: 9,
                socket: socket(),
            },
            Act::Signal {
                pid: 5,
                start_ticks: 9,
                grace_ms: Some(300),
            },
            Act::Signal {
                pid: 5,
                start_ticks: 9,
                grace_ms: None,
            },
            Act::ProveKeepalive {
                pid: 5,
                start_ticks: 9,
                socket: socket(),
                keepalive: ProofKeepalive {
                    idle_s: 1,
                    interval_s: 1,
                    count: 3,
                    hold_ms: 120_000,
                },
            },
            Act::RestoreKeepalive {
                pid: 5,
                start_ticks: 9,
                socket: socket(),
                previous: Some(settings),
            },
            Act::RestoreKeepalive {
                pid: 5,
                start_ticks: 9,
                socket: socket(),
                previous: None,
            },
            Act::ExpireKeepalive {
                pid: 5,
                start_ticks: 9,
                socket: socket(),
            },
        ];
        for act in acts {
            let req = ActRequest::from_act(&act, "sol").unwrap();
            assert_eq!(req.action.as_str(), act.name());
            assert_eq!(req.agent.as_deref(), Some("sol"));
            assert_eq!(req.act().unwrap(), act, "{req:?}");
        }
    }

    #[test]
    fn restarts_never_cross_the_wire() {
        let restart = Act::Restart {
            argv: vec!["true".into()],
            timeout_ms: 1000,
        };
        assert_eq!(ActRequest::from_act(&restart, "sol"), None);
        let container = Act::RestartContainer(ContainerRestart {
            runtime: Runtime::Docker,
            id: "abc".into(),
            pid: 5,
            start_ticks: 9,
            grace_ms: 1,
            timeout_ms: 1,
        });
        assert_eq!(ActRequest::from_act(&container, "sol"), None);
        assert_eq!(container.name(), "restart_container");
        let e = ActRequest::new(Action::Restart, 5, 9).act().unwrap_err();
        assert_eq!(e.code, ErrorCode::Failed);
        assert!(e.message.contains("does not run restart commands"), "{e:?}");
    }

    #[test]
    fn wire_params_are_read_as_the_helper_reads_them() {
        let mut signal = ActRequest::new(Action::Signal, 5, 9);
        signal.params.insert("grace_ms".into(), "soon".into());
        assert_eq!(signal.act().unwrap().grace(), DEFAULT_GRACE);
        let mut prove = ActRequest::new(Action::ProveKeepalive, 5, 9);
        prove.fd = Some(7);
        prove.inode = Some(4242);
        prove.params.insert("idle_s".into(), 1.into());
        let e = prove.act().unwrap_err();
        assert_eq!(e.code, ErrorCode::Failed);
        assert!(
            e.message.starts_with("prove_keepalive: bad params: "),
            "{e:?}"
        );
    }
}
