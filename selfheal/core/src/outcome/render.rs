//! What people read of a check: one line per agent, the transition log
//! line, a step in words, and the exit code.

use super::{HealReport, Outcome};
use crate::{inspect, judge::Verdict, ladder::Decision, protocol::Act};

/// The exit code of `check` for these outcomes: 0 all
/// fine, 1 something degraded (or a snapshot could not be written), 2
/// something wedged, unresponsive or down.
pub fn exit_code(outcomes: &[Outcome]) -> u8 {
    let worst = outcomes
        .iter()
        .map(|o| match o.verdict {
            // Wedged but a healing step was taken this check: "healed" (1).
            Verdict::Wedged
                if o.heal
                    .as_ref()
                    .is_some_and(|h| h.actions.iter().any(|a| a.ok)) =>
            {
                1
            }
            Verdict::Wedged | Verdict::Unresponsive | Verdict::Down => 2,
            Verdict::Degraded => 1,
            _ => 0,
        })
        .max()
        .unwrap_or(0);
    let snapshot_failed = outcomes.iter().any(|o| o.snapshot_error.is_some());
    worst.max(u8::from(snapshot_failed))
}

/// One line for a person: verdict, the main reason (control characters
/// escaped, [`crate::text::escape`]).
pub fn summary_line(o: &Outcome) -> String {
    let main = o
        .reasons
        .first()
        .map_or(String::new(), |r| format!(" — {}: {}", r.code, r.message));
    let snap = o
        .snapshot
        .as_ref()
        .map_or(String::new(), |id| format!(" [snapshot {id}]"));
    let err = o
        .snapshot_error
        .as_ref()
        .map_or(String::new(), |e| format!(" [snapshot NOT written: {e}]"));
    let heal = o.heal.as_ref().map_or(String::new(), heal_words);
    crate::text::escape(&format!(
        "{:<16} {:<12}{main}{snap}{err}{heal}",
        o.agent,
        o.verdict.as_str()
    ))
}

/// What the ladder did, in a few words: ` [healed: arm_keepalive pid 7 fd 3: ok]`.
fn heal_words(h: &HealReport) -> String {
    match &h.decision {
        Decision::Act { steps } if h.dry_run => {
            let names: Vec<String> = steps.iter().map(Act::words).collect();
            format!(" [would heal: {}]", names.join(", "))
        }
        Decision::Act { .. } => {
            let done: Vec<String> = h
                .actions
                .iter()
                .map(|a| {
                    format!(
                        "{}: {}",
                        a.step.words(),
                        if a.ok {
                            "ok".to_string()
                        } else {
                            format!("FAILED ({})", a.detail)
                        }
                    )
                })
                .collect();
            format!(" [heal: {}]", done.join(", "))
        }
        Decision::Wait { why, .. } => format!(" [heal: waiting, {why}]"),
        Decision::GaveUp { why } => format!(" [heal: GAVE UP, {why}]"),
        Decision::Nothing { why } => format!(" [heal: nothing, {why}]"),
    }
}

/// The log line for a transition, or `None` when the verdict did not change
/// (control characters escaped).
pub fn transition_line(o: &Outcome) -> Option<String> {
    if !o.transition {
        return None;
    }
    let from = o
        .previous
        .map_or("(first check)".to_string(), |v| v.to_string());
    let held = o.previous_for_ms.map_or(String::new(), |ms| {
        format!(" after {}", inspect::human_ms(ms))
    });
    let why = o
        .reasons
        .first()
        .map_or(String::new(), |r| format!(": {} — {}", r.code, r.message));
    let snap = o
        .snapshot
        .as_ref()
        .map_or(String::new(), |id| format!(" snapshot={id}"));
    // The containers' identity, before the snapshot id.
    let snap = format!("{}{snap}", containers_words(&o.containers));
    let recovered = if o.previous.is_some_and(|p| !p.is_ok()) && o.verdict.is_ok() {
        " (recovered)"
    } else {
        ""
    };
    Some(crate::text::escape(&format!(
        "agent {}: {from} -> {}{held}{recovered}{why}{snap}",
        o.agent, o.verdict
    )))
}

/// ` container=NAME/ID12 pod=NS/POD` for each container (what a runtime
/// said, escaped where it holds control characters); empty on the host.
fn containers_words(containers: &[crate::runtime::Identity]) -> String {
    let mut s = String::new();
    for c in containers {
        let clean = crate::text::escape;
        s.push_str(&format!(" container={}", c.short_id()));
        if let Some(n) = &c.name {
            s.push_str(&format!("/{}", clean(n)));
        }
        if let Some(p) = &c.pod {
            let ns = c
                .namespace
                .as_deref()
                .map_or(String::new(), |n| format!("{}/", clean(n)));
            s.push_str(&format!(" pod={ns}{}", clean(p)));
        }
    }
    s
}
