//! Evidence the fuzz targets hand to selfheal's pure cores (judge, ladder)
//! after parsing outside input: a live agent whose control connection the
//! judge has found dead, so the ladder's every rung is reachable. The
//! core's own test fixtures (`selfheal_core::fixture`). And the invariants
//! the targets assert beyond "no panic": JSON that survives its round trip
//! ([`same_json`]) and the ladder's promises ([`check_decision`]).

pub use selfheal_core::fixture::{after_first_step, report, wedged};
use selfheal_core::{
    config::HealConfig,
    judge::{Judgement, Verdict},
    ladder::{Decision, HealHistory},
    protocol::Act,
};
use serde_json::Value;

/// Whether two JSON values are the same, numbers written as floats within
/// a few units in the last place (serde_json's default parser may read a
/// float it wrote one unit off).
pub fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            match (x.as_f64(), y.as_f64()) {
                (Some(x), Some(y)) => {
                    x == y || (x - y).abs() <= 4.0 * f64::EPSILON * x.abs().max(y.abs())
                }
                _ => false,
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((kx, vx), (ky, vy))| kx == ky && same_json(vx, vy))
        }
        _ => a == b,
    }
}

/// The ladder's top rung (restart).
pub const TOP_RUNG: u8 = 3;

/// Asserts what the ladder promises of one `ladder::decide(cfg, j, …)` at
/// `now_ms` that turned history `before` into `after` with `decision`:
///
/// - every step is one `cfg` allows (sockets, signal, restart, a container
///   restart), and none above the top rung;
/// - a wedged agent climbs: all steps of one rung, above the rung this
///   wedge already reached (never one repeated or out of order), none while
///   the breaker is open, and the rung it reached is unchanged by deciding;
/// - an agent that is not wedged gets only socket steps (expire, destroy)
///   and its ladder reset (no rung, no steps this wedge, no breaker);
/// - the hour's budgets hold: the actions kept plus the steps are at most
///   `max_actions_per_hour`, and a disruptive step only with restarts left;
/// - deciding only forgets actions (those older than an hour), never adds;
/// - a wait ends no earlier than now; giving up opens the breaker.
pub fn check_decision(
    cfg: &HealConfig,
    j: &Judgement,
    before: &HealHistory,
    after: &HealHistory,
    decision: &Decision,
    now_ms: u64,
) {
    let mut kept = before.actions.iter();
    assert!(
        after.actions.iter().all(|a| kept.any(|b| b == a)),
        "deciding added or reordered actions: {before:?} → {after:?}"
    );
    let wedged = j.verdict == Verdict::Wedged;
    if !wedged {
        assert!(
            after.rung.is_none() && after.steps_this_wedge == 0 && after.gave_up.is_none(),
            "{} agent's ladder not reset: {after:?}",
            j.verdict
        );
    } else {
        assert_eq!(after.rung, before.rung, "deciding moved the rung");
    }
    match decision {
        Decision::Act { steps } => {
            assert!(!steps.is_empty(), "Act with no step");
            for s in steps {
                assert!(s.rung() <= TOP_RUNG, "above the top rung: {s:?}");
                let allowed = match s {
                    Act::ArmKeepalive { .. }
                    | Act::ExpireKeepalive { .. }
                    | Act::DestroySocket { .. } => cfg.sockets,
                    Act::Signal { .. } => cfg.signal && wedged,
                    Act::Restart { .. } => cfg.restart.is_some() && !cfg.restart_runtime && wedged,
                    Act::RestartContainer(_) => cfg.restart_runtime && wedged,
                    // The prove stage's acts are never the ladder's.
                    Act::ProveKeepalive { .. } | Act::RestoreKeepalive { .. } => false,
                };
                assert!(
                    allowed,
                    "a step the config does not allow: {s:?} under {cfg:?}"
                );
            }
            if wedged {
                let rung = steps[0].rung();
                assert!(
                    steps.iter().all(|s| s.rung() == rung),
                    "steps of several rungs at once: {steps:?}"
                );
                assert!(
                    before.rung.is_none_or(|r| rung > r),
                    "rung {rung} again or out of order after rung {:?}",
                    before.rung
                );
                assert!(before.gave_up.is_none(), "acted with the breaker open");
            }
            let kept = after.actions.len() as u64;
            assert!(
                kept + steps.len() as u64 <= u64::from(cfg.max_actions_per_hour),
                "{kept} actions this hour + {} steps over the budget {}",
                steps.len(),
                cfg.max_actions_per_hour
            );
            if steps.iter().any(Act::is_disruptive) {
                let disruptive = after
                    .actions
                    .iter()
                    .filter(|a| a.step.is_disruptive())
                    .count() as u64;
                assert!(
                    disruptive < u64::from(cfg.max_restarts_per_hour),
                    "{disruptive} restarts this hour, budget {}",
                    cfg.max_restarts_per_hour
                );
            }
        }
        Decision::Wait { until_ms, .. } => {
            assert!(
                *until_ms >= now_ms,
                "a wait that ended already: {decision:?}"
            );
        }
        Decision::GaveUp { .. } => {
            assert!(after.gave_up.is_some(), "gave up with the breaker shut");
        }
        Decision::Nothing { .. } => {}
    }
}
