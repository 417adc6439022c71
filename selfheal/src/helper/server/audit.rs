//! The audit: one record of every act and escalation, performed or
//! refused, logged on the `selfheal::audit` target and kept (the last
//! [`ServerOptions::audit_capacity`](super::ServerOptions::audit_capacity))
//! for [`ServerHandle::audit`](super::ServerHandle::audit).

use selfheal_core::protocol::{ActRequest, Action, Caller, WireError};
use serde::Serialize;

use super::{Shared, lock};

/// One audited action request, allowed or refused.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AuditRecord {
    pub caller: Caller,
    pub action: Action,
    pub pid: u32,
    pub start_ticks: u64,
    pub fd: Option<i32>,
    /// The judged socket's inode, when the request named one.
    pub inode: Option<u64>,
    pub agent: Option<String>,
    /// `None` when it was performed.
    pub error: Option<WireError>,
    /// The escalation of an earlier act (SIGKILL on the server's timer),
    /// not the act itself.
    pub escalation: bool,
}

impl Shared {
    /// Logs one audit line and keeps the record.
    pub(super) fn audit(
        &self,
        caller: &Caller,
        req: &ActRequest,
        error: Option<&WireError>,
        escalation: bool,
    ) {
        let record = AuditRecord {
            caller: *caller,
            action: req.action,
            pid: req.pid,
            start_ticks: req.start_ticks,
            fd: req.fd,
            inode: req.inode,
            agent: req.agent.clone(),
            error: error.cloned(),
            escalation,
        };
        // The agent name is validated to [A-Za-z0-9._-]; the message is
        // quoted (Debug) so that nothing in it can forge a log line.
        let fd = req.fd.map_or_else(|| "-".to_string(), |fd| fd.to_string());
        let inode = req.inode.map_or_else(|| "-".to_string(), |i| i.to_string());
        let agent = req.agent.as_deref().unwrap_or("-");
        let stage = if escalation { "escalation" } else { "act" };
        // One line, at `$level`, with the fields every audit line has
        // and then `$rest`.
        macro_rules! audit_line {
            ($level:ident, $($rest:tt)*) => {
                tracing::$level!(
                    target: "selfheal::audit",
                    caller_uid = caller.uid,
                    caller_pid = caller.pid,
                    action = %req.action,
                    stage = %stage,
                    pid = req.pid,
                    start_ticks = req.start_ticks,
                    fd = %fd,
                    inode = %inode,
                    agent = %agent,
                    $($rest)*
                )
            };
        }
        match error {
            None => audit_line!(info, outcome = %"ok", "act performed"),
            Some(e) => audit_line!(
                warn,
                outcome = %e.code,
                reason = ?e.message,
                "act refused"
            ),
        }
        let mut audit = lock(&self.audit);
        while audit.len() >= self.audit_capacity.max(1) {
            audit.pop_front();
        }
        audit.push_back(record);
    }
}
