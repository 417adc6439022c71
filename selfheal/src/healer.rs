//! Who carries out the ladder's steps: [`DirectHealer`] does them from this
//! process (when it has the permission: same uid, or root), and
//! [`step_action`] turns a step into the actions the helper's executor runs.
//! Every step re-opens its target by pidfd against the start time the check
//! saw, so a pid reused since then is never touched.

use std::time::Duration;

use crate::{
    actions::{self, Keepalive},
    check::Healer,
    ladder::Step,
};

/// Runs a step here and now; `Ok` carries the action's outcome as JSON text.
pub fn run_step(step: &Step, keepalive: &Keepalive) -> Result<serde_json::Value, String> {
    let e = |e: actions::ActionError| e.to_string();
    let json = |v: Result<serde_json::Value, serde_json::Error>| v.map_err(|e| e.to_string());
    match step {
        Step::ArmKeepalive {
            pid,
            start_ticks,
            fd,
            ..
        } => {
            let target = actions::open_target(*pid, *start_ticks).map_err(e)?;
            json(serde_json::to_value(
                actions::arm_keepalive(&target, *fd, keepalive).map_err(e)?,
            ))
        }
        Step::DestroySocket {
            pid,
            start_ticks,
            fd,
            ..
        } => {
            let target = actions::open_target(*pid, *start_ticks).map_err(e)?;
            json(serde_json::to_value(
                actions::destroy_socket(&target, *fd).map_err(e)?,
            ))
        }
        Step::Signal {
            pid,
            start_ticks,
            grace_ms,
        } => {
            let target = actions::open_target(*pid, *start_ticks).map_err(e)?;
            json(serde_json::to_value(
                actions::signal_escalate(&target, Duration::from_millis(*grace_ms)).map_err(e)?,
            ))
        }
        Step::Restart { argv, timeout_ms } => {
            let out = actions::restart(argv, Duration::from_millis(*timeout_ms)).map_err(e)?;
            if out.success {
                json(serde_json::to_value(out))
            } else {
                Err(format!(
                    "restart command {argv:?} {}: {}",
                    if out.timed_out {
                        "timed out".to_string()
                    } else {
                        format!("exited with {:?}", out.exit_code)
                    },
                    out.stderr.trim()
                ))
            }
        }
    }
}

/// Acts from this process: for agents of our own uid, or as root without a
/// helper running.
#[derive(Debug, Default)]
pub struct DirectHealer {
    pub keepalive: Keepalive,
}

impl Healer for DirectHealer {
    fn act(&self, _agent: &str, step: &Step) -> Result<String, String> {
        run_step(step, &self.keepalive).map(|v| v.to_string())
    }
}
