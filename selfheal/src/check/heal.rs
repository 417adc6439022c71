//! The healing ladder's steps for one agent: the decision, the steps taken
//! through the executor (only with a snapshot written), and for a unit agent
//! the checks made right before them (still in the unit, not stopped on
//! purpose).

use selfheal_core::{
    config::AgentConfig,
    inspect::Report,
    judge::{Judgement, Verdict},
    ladder::{self, Decision, HealHistory},
    outcome::{ActionOutcome, HealReport, Outcome},
    protocol::Act,
};

use super::Acting;
use crate::agents;

/// Runs the ladder for a wedged agent (or one with dead connections to
/// end): decides, and (unless the check only decides, and only with a
/// snapshot written) takes the steps through the check's executor.
pub(super) fn heal(
    acting: &Acting<'_>,
    agent: &AgentConfig,
    j: &Judgement,
    report: &Report,
    hist: &mut HealHistory,
    outcome: &Outcome,
) -> HealReport {
    let &Acting {
        executor,
        dry_run,
        now_ms,
        ..
    } = acting;
    if let selfheal_core::config::MatchRule::Unit(unit) = &agent.rule
        && let Some((manager, state)) = unit_stopping(unit, report)
    {
        // Stopped (or being stopped) on purpose: not ours to heal.
        let why = format!("unit {unit} of {manager} is {state}: stopped on purpose, left alone");
        return HealReport {
            decision: Decision::Nothing { why },
            dry_run,
            actions: Vec::new(),
            newly_gave_up: false,
        };
    }
    let had_given_up = hist.gave_up.is_some();
    let decision = ladder::decide(&agent.heal, j, report, hist, now_ms);
    let newly_gave_up = !had_given_up && hist.gave_up.is_some();
    let mut actions = Vec::new();
    if let Decision::Act { steps } = &decision {
        for step in steps {
            let result = if dry_run {
                continue;
            } else if outcome.snapshot.is_none() {
                // No snapshot, no action: the evidence must survive the cure.
                Err("not taken: its forensic snapshot could not be written".to_string())
            } else if let Err(why) = unit_recheck(agent, step, report) {
                Err(format!("not taken: {why}"))
            } else if let Some(h) = executor {
                h.act(&agent.name, step).map_err(|e| e.to_string())
            } else {
                Err("not taken: no helper and no permission to act directly".to_string())
            };
            let (ok, detail) = match result {
                Ok(d) => (true, d.to_string()),
                Err(e) => (false, e),
            };
            if outcome.snapshot.is_some() {
                if j.verdict == Verdict::Wedged {
                    hist.record(now_ms, step.clone(), ok, detail.clone());
                } else {
                    // Not a wedge's rung: a dead connection nobody waits
                    // on, or a hung connect, ended.
                    hist.record_ending(now_ms, step.clone(), ok, detail.clone());
                }
            }
            actions.push(ActionOutcome {
                step: step.clone(),
                ok,
                detail,
            });
        }
    }
    HealReport {
        decision,
        dry_run,
        actions,
        newly_gave_up,
    }
}

/// For a unit agent, right before `step` is taken: the processes it
/// touches (the step's own, or for a restart command the agent's roots)
/// are still in the unit, as their cgroups say now
/// ([`agents::still_in_unit`]). Other agents: nothing to re-check here
/// (a container restart re-checks its container where it acts).
fn unit_recheck(agent: &AgentConfig, step: &Act, report: &Report) -> Result<(), agents::NotInUnit> {
    let selfheal_core::config::MatchRule::Unit(unit) = &agent.rule else {
        return Ok(());
    };
    let owner = agent.unit_owner(crate::sys::creds::euid());
    let pids: Vec<(u32, u64)> = match step.process() {
        Some(process) => vec![process],
        // The command names the unit, not a pid: a root that has exited
        // since is no reason to hold it back, one that moved is.
        None => report
            .processes
            .iter()
            .filter(|p| report.roots.contains(&p.pid))
            .filter_map(|p| Some((p.pid, p.start_ticks?)))
            .filter(|(pid, start)| crate::sys::pidfd::start_ticks(*pid) == Some(*start))
            .collect(),
    };
    pids.into_iter()
        .try_for_each(|(pid, start)| agents::still_in_unit(unit, owner, pid, start))
}

/// The manager and state of `unit` when its manager says it is being
/// stopped, or stopped with none of the agent's root processes alive;
/// `None` otherwise, or when no manager can say (no systemd here: nothing
/// is assumed). The manager asked is the one each root process's cgroup
/// says runs the unit (the system's, or that user's), never a guess from
/// who runs the check; and a manager that has no such unit has not
/// stopped it.
fn unit_stopping(unit: &str, report: &Report) -> Option<(selfheal_core::cgroup::Manager, String)> {
    let managers = unit_managers(unit, &report.roots);
    let alive = report.processes.iter().any(|p| {
        report.roots.contains(&p.pid)
            && p.start_ticks.is_some()
            && crate::sys::pidfd::start_ticks(p.pid) == p.start_ticks
    });
    managers.into_iter().find_map(|m| {
        let (load, active) = unit_state(unit, m)?;
        stopped_on_purpose(&load, &active, alive).then(|| (m, selfheal_core::text::escape(&active)))
    })
}

/// What each manager that runs `unit` for the processes `roots` says of
/// it (`LoadState`, `ActiveState`), asked as the heal's stopped-on-purpose check asks:
/// `None` for a manager that cannot be asked. For people
/// (`config check`).
pub fn unit_states(
    unit: &str,
    roots: &[u32],
) -> Vec<(selfheal_core::cgroup::Manager, Option<(String, String)>)> {
    unit_managers(unit, roots)
        .into_iter()
        .map(|m| (m, unit_state(unit, m)))
        .collect()
}

/// Whether a unit whose manager says `load` and `active` was stopped on
/// purpose, given whether the agent's processes still live: only a unit
/// the manager has (`loaded`) that it is stopping, or that it stopped and
/// whose processes are gone. No such unit (`not-found`), a masked or bad
/// one, or an "inactive" unit whose processes live, was not.
fn stopped_on_purpose(load: &str, active: &str, alive: bool) -> bool {
    load == "loaded"
        && (active == "deactivating" || (matches!(active, "inactive" | "failed") && !alive))
}

/// The managers whose unit `unit` the processes `roots` are in, by their
/// cgroups now (anchored: [`selfheal_core::cgroup::unit_of`]).
fn unit_managers(unit: &str, roots: &[u32]) -> Vec<selfheal_core::cgroup::Manager> {
    let root = selfheal_core::cgroup::manager_root(agents::cgroup_of(1).as_deref());
    let mut out = Vec::new();
    for pid in roots {
        let Some(path) = agents::cgroup_of(*pid) else {
            continue;
        };
        let Some(place) = selfheal_core::cgroup::unit_of(&path, &root) else {
            continue;
        };
        let manager = match place.manager {
            _ if place.unit == unit => place.manager,
            // A user's manager runs inside the system's user@UID.service.
            selfheal_core::cgroup::Manager::User(uid) if unit == format!("user@{uid}.service") => {
                selfheal_core::cgroup::Manager::System
            }
            _ => continue,
        };
        if !out.contains(&manager) {
            out.push(manager);
        }
    }
    out
}

/// `LoadState` and `ActiveState` of `unit` as `manager` tells them
/// (`systemctl show`; for a user's manager, `systemctl --user` run as
/// that user); `None` when it cannot be asked.
fn unit_state(unit: &str, manager: selfheal_core::cgroup::Manager) -> Option<(String, String)> {
    use std::os::unix::process::CommandExt as _;
    let euid = crate::sys::creds::euid();
    let mut cmd = std::process::Command::new("systemctl");
    match manager {
        selfheal_core::cgroup::Manager::System => {}
        selfheal_core::cgroup::Manager::User(uid) if uid == euid => {
            cmd.arg("--user");
        }
        selfheal_core::cgroup::Manager::User(uid) if euid == 0 => {
            // Root asks the user's manager as that user (its bus admits
            // its owner), with the user's own runtime directory.
            let gid = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                .ok()
                .flatten()?
                .gid
                .as_raw();
            cmd.arg("--user")
                .env("XDG_RUNTIME_DIR", format!("/run/user/{uid}"))
                .env_remove("DBUS_SESSION_BUS_ADDRESS")
                .gid(gid)
                .uid(uid);
        }
        selfheal_core::cgroup::Manager::User(_) => return None,
    }
    let out = cmd
        .args(["show", "--property=LoadState,ActiveState", "--", unit])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let get = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(|v| v.trim().to_string())
    };
    Some((get("LoadState")?, get("ActiveState")?))
}

#[cfg(test)]
mod tests {
    use super::stopped_on_purpose;

    #[test]
    fn only_a_unit_its_manager_stopped_is_stopped_on_purpose() {
        for (load, active, alive, want) in [
            ("loaded", "deactivating", true, true),
            ("loaded", "inactive", false, true),
            ("loaded", "failed", false, true),
            // Its processes live: whatever the manager says, not stopped.
            ("loaded", "inactive", true, false),
            ("loaded", "failed", true, false),
            // No such unit (another manager's, or none): never stopped.
            ("not-found", "inactive", false, false),
            ("not-found", "inactive", true, false),
            ("masked", "inactive", false, false),
            ("loaded", "active", true, false),
            ("loaded", "activating", false, false),
            ("", "", false, false),
        ] {
            assert_eq!(
                stopped_on_purpose(load, active, alive),
                want,
                "{load} {active} alive={alive}"
            );
        }
    }
}
