//! The Prometheus exposition text: pure functions from one
//! check's outcomes and the history to the text `check --metrics-file`
//! writes and `watch --metrics-addr` serves.
//!
//! Written by hand: the text format is write-only and small, and a crate
//! would add a registry whose state this module would have to mirror from
//! the history anyway. The output is checked by `promtool check metrics`
//! (`tests/tests/it/alerting.rs`) and by the fixtures below.
//!
//! Counters are derived from the history ([`Counters`], saved with it), so
//! they stay monotonic across the restarts of a timer-driven `check`; they
//! reset only with the history (a new boot), which Prometheus's `rate` and
//! `increase` handle as a counter reset.
//!
//! Every label value is escaped ([`label`]); label values come from a
//! bounded set (verdicts, reason codes, step names, strategies) except the
//! agent name (bounded by the config), the probe target (the config) and
//! the last snapshot id (one series per agent at a time: an info metric).

use std::{collections::BTreeMap, fmt::Write as _};

use crate::{
    history::{Counters, History},
    judge::Verdict,
    outcome::Outcome,
    probe::ProbeKind,
};

/// The eBPF strategies a host can report, `none` last.
pub const STRATEGIES: [&str; 5] = ["tp_btf", "fentry", "kprobe", "tracepoint", "none"];

/// Folds one agent's outcome into its counters (called once per check).
pub fn observe(c: &mut Counters, o: &Outcome) {
    let now: Vec<String> = {
        let mut v: Vec<String> = o.reasons.iter().map(|r| r.code.to_string()).collect();
        v.sort();
        v.dedup();
        v
    };
    for r in &now {
        if !c.last_reasons.contains(r) {
            *c.reasons.entry(r.clone()).or_default() += 1;
        }
    }
    c.last_reasons = now;
    if let Some(h) = &o.heal
        && !h.dry_run
    {
        for a in &h.actions {
            let key = format!("{}/{}", a.step.name(), if a.ok { "ok" } else { "failed" });
            *c.heals.entry(key).or_default() += 1;
        }
    }
    for p in &o.proofs {
        let key = format!("{}/{}", code(p.action), if p.ok { "ok" } else { "failed" });
        *c.proofs.entry(key).or_default() += 1;
    }
    if o.transition {
        c.episode_snapshot = false;
    }
    if !o.verdict.is_ok() {
        c.not_ok_checks = c.not_ok_checks.saturating_add(1);
        if let Some(id) = &o.snapshot
            && !c.episode_snapshot
        {
            c.last_snapshot = Some((id.clone(), o.verdict.as_str().to_string()));
            c.episode_snapshot = true;
        }
    }
}

/// The strategy label of eBPF evidence that came from the kernel's task
/// iterators alone, with no receive tracer.
pub const ITERATORS: &str = "iterators";

/// Why a host has no eBPF evidence: a bounded set of label values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoEbpf {
    /// No helper answered (`check` loads no eBPF itself).
    NoHelper,
    /// The helper answered but its tracer did not (no strategy attached,
    /// or the snapshot failed).
    HelperTracer,
    /// This build has no eBPF programs.
    NotBuiltIn,
    /// No agent had a process to watch.
    NoProcesses,
}

impl NoEbpf {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoHelper => "no_helper",
            Self::HelperTracer => "helper_tracer_failed",
            Self::NotBuiltIn => "not_built_in",
            Self::NoProcesses => "no_processes",
        }
    }
}

/// What one check knew about itself, beside the outcomes.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckInfo {
    /// When the check finished (Unix seconds).
    pub finished_unix_s: f64,
    /// How long the check took.
    pub duration_s: f64,
    /// Whether the root helper answered this check.
    pub helper_up: bool,
    /// The eBPF strategy in use, or why there is none.
    pub ebpf: Result<&'static str, NoEbpf>,
}

impl CheckInfo {
    /// The host-level facts of a check from its outcomes: the strategy is
    /// the one any agent's evidence came from. `ebpf_built_in`: whether
    /// this build has eBPF programs (`selfheal::ebpf::BUILT_IN`).
    pub fn from_outcomes(
        outcomes: &[Outcome],
        ebpf_built_in: bool,
        helper_up: bool,
        finished_unix_s: f64,
        duration_s: f64,
    ) -> Self {
        let strategy = outcomes.iter().find_map(|o| o.evidence.strategy);
        let ebpf = match strategy {
            Some(s) => Ok(s),
            // No tracer (the helper as shipped runs none), but the kernel's
            // task iterators read the threads and sockets.
            None if outcomes.iter().any(|o| o.evidence.iterated > 0) => Ok(ITERATORS),
            None if !ebpf_built_in => Err(NoEbpf::NotBuiltIn),
            None if !helper_up => Err(NoEbpf::NoHelper),
            None if outcomes.iter().all(|o| o.evidence.processes == 0) => Err(NoEbpf::NoProcesses),
            None => Err(NoEbpf::HelperTracer),
        };
        Self {
            finished_unix_s,
            duration_s,
            helper_up,
            ebpf,
        }
    }
}

/// The whole exposition text of one check.
pub fn render(outcomes: &[Outcome], history: &History, info: &CheckInfo) -> String {
    let mut o = String::new();
    let counters = |agent: &str| history.agents.get(agent).map(|r| &r.metrics);

    head(
        &mut o,
        "selfheal_agent_verdict",
        "gauge",
        "1 for the agent's current verdict, 0 for the others (a state-set).",
    );
    for a in outcomes {
        for v in Verdict::ALL {
            let _ = writeln!(
                o,
                "selfheal_agent_verdict{{agent=\"{}\",verdict=\"{v}\"}} {}",
                label(&a.agent),
                u8::from(a.verdict == v)
            );
        }
    }

    per_agent(
        &mut o,
        outcomes,
        "selfheal_agent_wedges_total",
        "counter",
        "Transitions into wedged since the history began.",
        |a| history.agents.get(&a.agent).map_or(0, |r| r.wedges),
    );

    per_agent(
        &mut o,
        outcomes,
        "selfheal_agent_not_ok_checks_total",
        "counter",
        "Checks whose verdict for the agent was degraded, unresponsive, wedged or down.",
        |a| counters(&a.agent).map_or(0, |c| c.not_ok_checks),
    );

    head(
        &mut o,
        "selfheal_agent_reason",
        "gauge",
        "1 for each reason the agent's current verdict has.",
    );
    for a in outcomes {
        let mut codes: Vec<String> = a.reasons.iter().map(|r| r.code.to_string()).collect();
        codes.sort();
        codes.dedup();
        for c in codes {
            let _ = writeln!(
                o,
                "selfheal_agent_reason{{agent=\"{}\",reason=\"{c}\"}} 1",
                label(&a.agent)
            );
        }
    }

    head(
        &mut o,
        "selfheal_agent_reasons_total",
        "counter",
        "Times each reason code appeared for the agent (absent the check before).",
    );
    for a in outcomes {
        for (c, n) in counters(&a.agent).into_iter().flat_map(|c| &c.reasons) {
            let _ = writeln!(
                o,
                "selfheal_agent_reasons_total{{agent=\"{}\",reason=\"{}\"}} {n}",
                label(&a.agent),
                label(c)
            );
        }
    }

    by_outcome(
        &mut o,
        outcomes,
        ("selfheal_heals_total", "action"),
        "Healing steps taken, by action and outcome (ok or failed).",
        |a| counters(&a.agent).map(|c| &c.heals),
    );

    per_agent(
        &mut o,
        outcomes,
        "selfheal_agent_heal_steps_current_wedge",
        "gauge",
        "Healing steps taken on the agent's current wedge (0 when not being healed): \
         above 0 while still wedged, a heal did not help.",
        |a| {
            history
                .agents
                .get(&a.agent)
                .map_or(0, |r| r.heal.steps_this_wedge)
        },
    );

    per_agent(
        &mut o,
        outcomes,
        "selfheal_agent_breaker_open",
        "gauge",
        "1 when healing gave up on the agent (the breaker is open until it recovers).",
        |a| {
            u8::from(
                history
                    .agents
                    .get(&a.agent)
                    .is_some_and(|r| r.heal.gave_up.is_some()),
            )
        },
    );

    by_outcome(
        &mut o,
        outcomes,
        ("selfheal_proof_keepalives_total", "event"),
        "Proof keepalives: event arm (armed on a suspect connection) or restore (the \
         connection's own options put back: the peer answered), by outcome.",
        |a| counters(&a.agent).map(|c| &c.proofs),
    );

    per_agent(
        &mut o,
        outcomes,
        "selfheal_agent_proof_keepalives_armed",
        "gauge",
        "Proof keepalives armed on the agent's connections now, waiting for the peer.",
        |a| {
            history
                .agents
                .get(&a.agent)
                .map_or(0, |r| r.judge.proofs.len())
        },
    );

    head(
        &mut o,
        "selfheal_agent_last_snapshot_info",
        "gauge",
        "The snapshot of the agent's last not-ok verdict (read it with `selfheal snapshots \
         show ID`).",
    );
    for a in outcomes {
        if let Some((id, verdict)) = counters(&a.agent).and_then(|c| c.last_snapshot.as_ref()) {
            let _ = writeln!(
                o,
                "selfheal_agent_last_snapshot_info{{agent=\"{}\",snapshot=\"{}\",verdict=\"{}\"}} 1",
                label(&a.agent),
                label(id),
                label(verdict)
            );
        }
    }

    per_agent(
        &mut o,
        outcomes,
        "selfheal_agent_zombie_processes",
        "gauge",
        "Zombie processes in the agent's process tree.",
        |a| a.evidence.zombies,
    );

    per_agent(
        &mut o,
        outcomes,
        "selfheal_agent_processes",
        "gauge",
        "Processes found for the agent (0: down or not matched).",
        |a| a.evidence.processes,
    );

    per_agent(
        &mut o,
        outcomes,
        "selfheal_agent_evidence_gaps",
        "gauge",
        "Things the last check could not see for the agent (see `selfheal inspect NAME`).",
        |a| a.gaps.len(),
    );

    head(
        &mut o,
        "selfheal_probe_latency_seconds",
        "gauge",
        "Latency of the last probe, when it answered.",
    );
    for a in outcomes {
        for p in &a.probes {
            if let Some(ms) = p.latency_ms {
                let _ = writeln!(
                    o,
                    "selfheal_probe_latency_seconds{{agent=\"{}\",probe=\"{}\"}} {}",
                    label(&a.agent),
                    label(&match p.kind {
                        // Redacted already when the result was made; again
                        // here, so no label can ever carry a query token.
                        ProbeKind::Http => crate::text::redact_url(&p.target),
                        ProbeKind::HealthFile => p.target.clone(),
                    }),
                    ms as f64 / 1000.0
                );
            }
        }
    }

    container_info(&mut o, outcomes);

    head(
        &mut o,
        "selfheal_ebpf_strategy_info",
        "gauge",
        "The eBPF strategy the evidence came from, or none and why (no_helper, \
         helper_tracer_failed, not_built_in, no_processes).",
    );
    let (strategy, why) = match info.ebpf {
        Ok(s) => (s, ""),
        Err(w) => ("none", w.as_str()),
    };
    let _ = writeln!(
        o,
        "selfheal_ebpf_strategy_info{{strategy=\"{}\",why_none=\"{why}\"}} 1",
        label(strategy)
    );
    head(
        &mut o,
        "selfheal_ebpf_up",
        "gauge",
        "1 when the last check had eBPF evidence.",
    );
    let _ = writeln!(o, "selfheal_ebpf_up {}", u8::from(info.ebpf.is_ok()));

    head(
        &mut o,
        "selfheal_helper_up",
        "gauge",
        "1 when the root helper answered the last check.",
    );
    let _ = writeln!(o, "selfheal_helper_up {}", u8::from(info.helper_up));

    head(
        &mut o,
        "selfheal_check_duration_seconds",
        "gauge",
        "How long the last check took.",
    );
    let _ = writeln!(o, "selfheal_check_duration_seconds {:.6}", info.duration_s);

    head(
        &mut o,
        "selfheal_last_check_timestamp_seconds",
        "gauge",
        "When the last complete check finished (Unix time).",
    );
    let _ = writeln!(
        o,
        "selfheal_last_check_timestamp_seconds {:.3}",
        info.finished_unix_s
    );
    o
}

fn head(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(o, "# HELP {name} {}", help_text(help));
    let _ = writeln!(o, "# TYPE {name} {kind}");
}

/// A metric with one sample per agent, `NAME{agent="…"} VALUE`.
fn per_agent<V: std::fmt::Display>(
    o: &mut String,
    outcomes: &[Outcome],
    name: &str,
    kind: &str,
    help: &str,
    value: impl Fn(&Outcome) -> V,
) {
    head(o, name, kind, help);
    for a in outcomes {
        let _ = writeln!(o, "{name}{{agent=\"{}\"}} {}", label(&a.agent), value(a));
    }
}

/// A counter per agent from its history's `what/outcome` counts:
/// `NAME{agent="…",WHAT="…",outcome="…"} N`.
fn by_outcome<'h>(
    o: &mut String,
    outcomes: &[Outcome],
    (name, what): (&str, &str),
    help: &str,
    counts: impl Fn(&Outcome) -> Option<&'h BTreeMap<String, u64>>,
) {
    head(o, name, "counter", help);
    for a in outcomes {
        for (k, n) in counts(a).into_iter().flatten() {
            let (first, outcome) = k.split_once('/').unwrap_or((k, ""));
            let _ = writeln!(
                o,
                "{name}{{agent=\"{}\",{what}=\"{}\",outcome=\"{}\"}} {n}",
                label(&a.agent),
                label(first),
                label(outcome)
            );
        }
    }
}

/// `selfheal_agent_container_info{agent,runtime,id,name,image,pod,namespace} 1`
/// for each container an agent's processes are in: an info
/// metric, so the verdict series keep their labels and are joined to the
/// identity with `on(agent) group_left(...)`.
fn container_info(o: &mut String, outcomes: &[Outcome]) {
    if outcomes.iter().all(|a| a.containers.is_empty()) {
        return;
    }
    let _ = writeln!(
        o,
        "# HELP selfheal_agent_container_info The containers (and pods) an agent's processes are in."
    );
    let _ = writeln!(o, "# TYPE selfheal_agent_container_info gauge");
    for a in outcomes {
        for c in &a.containers {
            let opt = |v: &Option<String>| label(v.as_deref().unwrap_or(""));
            let _ = writeln!(
                o,
                "selfheal_agent_container_info{{agent=\"{}\",runtime=\"{}\",id=\"{}\",name=\"{}\",\
                 image=\"{}\",pod=\"{}\",namespace=\"{}\"}} 1",
                label(&a.agent),
                c.runtime,
                label(&c.id),
                opt(&c.name),
                opt(&c.image),
                opt(&c.pod),
                opt(&c.namespace),
            );
        }
    }
}

/// A Prometheus label value: safe on a terminal and valid text format.
///
/// Line feeds become the format's `\n` (the value keeps its line feed);
/// every other control character (ESC, BEL, CR, tab, DEL, C1: legal raw in
/// the format, but acted on by a terminal that shows a scrape) is written
/// as [`crate::text::escape`] writes it (`\u{1b}`), and then
/// backslash and double quote are escaped as the format says, so the value
/// Prometheus reads holds that visible `\u{1b}`, never the raw byte.
pub fn label(s: &str) -> String {
    s.split('\n')
        .map(|line| {
            crate::text::escape(line)
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
        })
        .collect::<Vec<_>>()
        .join("\\n")
}

/// A `# HELP` text, escaped (backslash and line feed).
fn help_text(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A reason or event code as a bounded label value: lower-case letters,
/// digits and `_` only, at most 64 bytes.
fn code(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}

#[cfg(test)]
mod tests;
