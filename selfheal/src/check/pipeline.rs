//! One agent's check, from its evidence to its outcome: collection within
//! the agent's budget, the judgement, the prove stage, and for a verdict
//! that is not ok the forensic snapshot and the ladder; and the same
//! judgement, read only, for `inspect` ([`diagnose`]).

use selfheal_core::{
    config::AgentConfig,
    history::{AgentRecord, SNAPSHOT_REPEAT_MS, SnapshotMark},
    inspect::{self, Report},
    judge::{self, AgentHistory, Judgement, ProbeView, Reason, Verdict},
    ladder::{self, Decision},
    metrics,
    outcome::{EvidenceSummary, Outcome},
    probe::ProbeResult,
    proc::Detail,
    prove::ProofWork,
};
use serde::Serialize;

use super::{
    Acting,
    heal::heal,
    prove::{prove_stage, unended_proofs},
};
use crate::{
    agents::{self, ProcessTable},
    inspect::{Collector, Target},
    probe,
};

/// Checks one agent: its evidence (minimal thread detail first, more only
/// where the judge needs it), the judgement, the prove stage, and for a
/// verdict that is not ok the snapshot and the ladder. Updates `record`.
pub(super) fn check_agent(
    acting: &Acting<'_>,
    agent: &AgentConfig,
    target: &Target,
    collector: &mut Collector,
    detail: Detail,
    probes: Vec<ProbeResult>,
    record: &mut AgentRecord,
) -> Outcome {
    let now_ms = acting.now_ms;
    // Each collection has the agent's budget; evidence cut at it is not
    // judged (`over_budget`), and the check goes on with the next agent.
    collector.set_budget(agent.thresholds.collect_budget);
    // Minimal thread evidence first; the threads' syscalls and waits are
    // read only where the sockets or thread states call for them.
    let mut evidence = collector.collect(target);
    let mut report = inspect::build(&evidence);
    let mut detail = detail;
    if evidence.over_budget.is_none()
        && detail == Detail::Minimal
        && judge::needs_thread_detail(agent, &report, &record.judge, now_ms)
    {
        detail = Detail::Light;
        evidence = collector.collect_with(target, detail);
        report = inspect::build(&evidence);
    }
    // The sockets' ages count back from their read, which came after
    // `now_ms`: a proof's answer is timed against this reading.
    report.read_ms = Some(acting.clock_ms());
    if let Some(why) = &evidence.over_budget {
        return over_budget(agent, target, &report, why, probes, record, now_ms);
    }
    if let Some(why) = judge::unjudgeable(&report) {
        return over_budget(agent, target, &report, &why, probes, record, now_ms);
    }
    let views = views(agent, &probes);
    let before = record.judge.clone();
    let (judgement, next) = judge::judge(agent, &report, &views, &before, acting.now);
    let transition = before.verdict != Some(judgement.verdict);
    if transition && judgement.verdict == Verdict::Wedged {
        record.wedges = record.wedges.saturating_add(1);
    }
    record.judge = next;
    let (proofs, proof_gaps) = prove_stage(
        agent,
        &judgement.work,
        &mut record.judge,
        acting.executor,
        acting.dry_run,
        now_ms,
    );

    let mut outcome = Outcome {
        agent: agent.name.clone(),
        containers: target.containers.clone(),
        verdict: judgement.verdict,
        reasons: judgement.reasons.clone(),
        snapshot: None,
        snapshot_error: None,
        previous: if transition { before.verdict } else { None },
        transition,
        previous_for_ms: (transition && before.verdict.is_some())
            .then(|| now_ms.saturating_sub(before.verdict_since_ms)),
        gaps: report
            .gaps
            .iter()
            .map(ToString::to_string)
            .chain(proof_gaps)
            .collect(),
        probes,
        proofs,
        heal: None,
        evidence: EvidenceSummary {
            strategy: report.ebpf.strategy.map(|s| s.name()),
            processes: report.processes.len(),
            iterated: report.collection.iterators,
            zombies: report.init.zombies,
        },
    };
    if judgement.verdict.is_ok() {
        let _ = ladder::decide(&agent.heal, &judgement, &report, &mut record.heal, now_ms);
    } else {
        // The snapshot gets the full evidence (kernel stacks of every
        // thread), re-read now if the check itself read light. A re-read
        // cut at the budget goes into the snapshot as it is (its gap says
        // so); healing then goes by the whole evidence judged.
        let reread = (detail != Detail::Full).then(|| collector.collect_with(target, Detail::Full));
        let full = reread.as_ref().map(inspect::build);
        let cut = reread.as_ref().and_then(|ev| ev.over_budget.clone());
        acting.snapshot(
            agent,
            &judgement,
            full.as_ref().unwrap_or(&report),
            record,
            &mut outcome,
        );
        let heal_from = match (&full, cut) {
            (Some(full), None) => full,
            (_, Some(cut)) => {
                outcome.gaps.push(cut);
                &report
            }
            (None, None) => &report,
        };
        acting.not_ok(agent, &judgement, heal_from, record, &mut outcome);
    }
    metrics::observe(&mut record.metrics, &outcome);
    outcome
}

/// An agent whose collection ran past its budget, or whose rule matched
/// nothing while command lines it had to match went unread
/// ([`judge::unjudgeable`]): not judged on the partial evidence. Its verdict is `unresponsive` (its processes could not
/// be examined in time) with the reason `over_budget`; nothing is proven,
/// snapshotted or healed for it in this check, and its judge's history
/// keeps everything but the verdict for the next check.
fn over_budget(
    agent: &AgentConfig,
    target: &Target,
    partial: &Report,
    why: &str,
    probes: Vec<ProbeResult>,
    record: &mut AgentRecord,
    now_ms: u64,
) -> Outcome {
    let verdict = Verdict::Unresponsive;
    let before = record.judge.verdict;
    let since = record.judge.verdict_since_ms;
    let transition = before != Some(verdict);
    if transition {
        record.judge.verdict = Some(verdict);
        record.judge.verdict_since_ms = now_ms;
    }
    let outcome = Outcome {
        agent: agent.name.clone(),
        containers: target.containers.clone(),
        verdict,
        reasons: vec![Reason {
            code: selfheal_core::model::ReasonCode::OverBudget,
            verdict,
            message: format!("not judged: {why}"),
            evidence: Default::default(),
        }],
        snapshot: None,
        snapshot_error: None,
        previous: if transition { before } else { None },
        transition,
        previous_for_ms: (transition && before.is_some()).then(|| now_ms.saturating_sub(since)),
        probes,
        gaps: partial.gaps.iter().map(ToString::to_string).collect(),
        proofs: Vec::new(),
        heal: None,
        evidence: EvidenceSummary {
            strategy: partial.ebpf.strategy.map(|s| s.name()),
            processes: partial.processes.len(),
            iterated: partial.collection.iterators,
            zombies: partial.init.zombies,
        },
    };
    metrics::observe(&mut record.metrics, &outcome);
    outcome
}

/// Whether a not-ok judgement goes to the ladder: a wedge, or a dead
/// connection nobody waits on or a hung connect, whatever the verdict
/// (they are ended).
fn may_act(judgement: &Judgement) -> bool {
    judgement.verdict == Verdict::Wedged
        || judgement
            .dead
            .iter()
            .any(|d| d.kind != selfheal_core::model::DeadKind::Awaited)
}

impl Acting<'_> {
    /// A verdict that is not ok, first: its forensic snapshot.
    /// An agent stuck in one verdict it takes no step for writes one on
    /// entering it and then at most one per [`SNAPSHOT_REPEAT_MS`]; the
    /// checks between name the last.
    fn snapshot(
        &self,
        agent: &AgentConfig,
        judgement: &Judgement,
        full: &Report,
        record: &mut AgentRecord,
        outcome: &mut Outcome,
    ) {
        let may_act = may_act(judgement);
        let verdict = judgement.verdict.as_str();
        let dir = self.snapshots.map(|log| log.dir().display().to_string());
        let repeat = record.last_snapshot.as_ref().filter(|m| {
            !may_act
                && !outcome.transition
                && m.verdict == verdict
                && Some(&m.dir) == dir.as_ref()
                && self.now_ms.saturating_sub(m.at_ms) < SNAPSHOT_REPEAT_MS
        });
        match (self.snapshots, repeat) {
            (Some(_), Some(m)) => outcome.snapshot = Some(m.id.clone()),
            (Some(log), None) => match log.append(
                &agent.name,
                verdict,
                &snapshot_body(judgement, full, &outcome.probes),
            ) {
                Ok(id) => {
                    record.last_snapshot = Some(SnapshotMark {
                        id: id.clone(),
                        verdict: verdict.to_string(),
                        at_ms: self.now_ms,
                        dir: dir.clone().unwrap_or_default(),
                    });
                    outcome.snapshot = Some(id);
                }
                Err(e) => outcome.snapshot_error = Some(e.to_string()),
            },
            (None, _) => outcome.snapshot_error = Some("no snapshot log".into()),
        }
    }

    /// A verdict that is not ok, after its snapshot ([`Acting::snapshot`]):
    /// for a wedge (or a dead connection nobody waits on, a hung connect)
    /// the ladder's step (only with the snapshot written) and the restores
    /// of proofs the ladder does not end, going by `full` (the full
    /// re-read, or the evidence judged when the re-read was cut at the
    /// budget).
    fn not_ok(
        &self,
        agent: &AgentConfig,
        judgement: &Judgement,
        full: &Report,
        record: &mut AgentRecord,
        outcome: &mut Outcome,
    ) {
        if !may_act(judgement) {
            return;
        }
        outcome.heal = Some(heal(
            self,
            agent,
            judgement,
            full,
            &mut record.heal,
            outcome,
        ));
        if let Some(Decision::GaveUp { why }) = outcome.heal.as_ref().map(|h| &h.decision) {
            outcome.reasons.push(Reason {
                code: selfheal_core::model::ReasonCode::GaveUp,
                verdict: Verdict::Wedged,
                message: format!("healing gave up: {why}"),
                evidence: Default::default(),
            });
        }
        // Proving never ends a connection by itself: where the ladder did
        // not end a proven-dead socket now and will not (nothing to do, gave
        // up, not allowed, no snapshot), its own options go back instead of
        // the proof's user timeout.
        let work = unended_proofs(judgement, full, outcome.heal.as_ref());
        if !work.is_empty() {
            let (events, gaps) = prove_stage(
                agent,
                &work,
                &mut record.judge,
                self.executor,
                self.dry_run,
                self.now_ms,
            );
            outcome.proofs.extend(events);
            outcome.gaps.extend(gaps);
        }
    }
}

/// The processes of `agent`, and how to tell its upstreams (with their
/// heartbeats and what host names resolved to, for people).
pub fn target(agent: &AgentConfig, table: &ProcessTable) -> Target {
    let matched = agents::find_for(agent, crate::sys::creds::euid(), table);
    let upstreams = crate::config::resolve_upstreams(agent);
    let mut lines: Vec<String> = agent
        .upstreams
        .iter()
        .map(|u| match u.heartbeat {
            Some(hb) => format!(
                "{} {} (heartbeat {})",
                u.role,
                u.addr,
                humantime::format_duration(hb)
            ),
            None => format!("{} {}", u.role, u.addr),
        })
        .collect();
    lines.extend(upstreams.notes());
    let containers = table.identities(&matched.all);
    let mut container_gaps = table.inventory().gaps(
        &containers,
        matches!(agent.rule, selfheal_core::config::MatchRule::Container(_)),
    );
    container_gaps.extend(table.refusals(&matched.all));
    Target {
        agent: Some(agent.name.clone()),
        rule: agent.rule.to_string(),
        roots: matched.roots,
        pids: matched.all,
        problem: matched.problem,
        upstream_of: Box::new(move |remote| {
            let i = upstreams.upstreams.iter().position(|u| u.matches(remote))?;
            Some((upstreams.upstreams[i].upstream.role.into(), i))
        }),
        upstreams: lines,
        roles: agent.roles,
        containers,
        container_gaps,
        unread_cmdlines: table.cmdline_gap(agent, crate::sys::creds::euid()),
    }
}

/// What `inspect` shows of the judge for one agent: the verdict and
/// reasons its evidence gives now, against the history `check` keeps
/// (read, never written: inspecting arms nothing and heals nothing), and the
/// prove stage's state per socket.
#[derive(Clone, Debug, Serialize)]
pub struct Diagnosis {
    pub verdict: Verdict,
    pub reasons: Vec<Reason>,
    /// The proof keepalives `check` has armed, by socket inode.
    pub proofs: Vec<ProofState>,
    /// What the next `check` would have the prove stage do.
    pub proof_work: Vec<ProofWork>,
    /// The connections only keepalive has arrived on lately: their
    /// progress evidence and how close it is to `stall_after`.
    pub progress: Vec<judge::ConnectionProgress>,
}

/// One socket's proof, as `inspect` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct ProofState {
    pub inode: u64,
    pub remote: String,
    /// `armed` or `answered`.
    pub state: &'static str,
    /// In words: "keepalive armed 4s ago: 2 probes unanswered", "the peer
    /// answered 3 proof rounds, the last 2s ago".
    pub detail: String,
}

/// Judges `agent` at `now` (both clocks, as `check` judges) on `report`,
/// running its probes, against `history` (read only).
pub fn diagnose(
    agent: &AgentConfig,
    report: &Report,
    history: &AgentHistory,
    now: selfheal_core::clock::Now,
) -> Diagnosis {
    let now_ms = now.boot_ms;
    let configs: Vec<_> = agent.probes.iter().collect();
    let results = probe::run_all(&configs);
    let views = views(agent, &results);
    let (j, next) = judge::judge(agent, report, &views, history, now);
    let progress = judge::progress_of(agent, report, &next, now_ms);
    let mut proofs = Vec::new();
    for s in &report.sockets {
        let probes = s.tcp_info.as_ref().map_or(0, |i| i.probes);
        if let Some(p) = history.proofs.get(&s.cookie).filter(|p| p.inode == s.inode) {
            let armed_for = p.armed_for(now_ms);
            let answered = s
                .tcp_info
                .as_ref()
                .is_some_and(|i| u64::from(i.last_ack_recv_ms) < armed_for);
            proofs.push(ProofState {
                inode: s.inode,
                remote: s.remote.clone(),
                state: "armed",
                detail: if answered {
                    format!(
                        "keepalive armed {} ago: the peer answered; the next check puts its options back",
                        inspect::human_ms(armed_for)
                    )
                } else {
                    format!(
                        "keepalive armed {} ago: {probes} probe(s) unanswered ({} needed, {} apart)",
                        inspect::human_ms(armed_for),
                        p.count,
                        inspect::human_ms(p.interval_ms)
                    )
                },
            });
        } else if let Some(a) = history.answered.get(&s.cookie) {
            proofs.push(ProofState {
                inode: s.inode,
                remote: s.remote.clone(),
                state: "answered",
                detail: format!(
                    "the peer answered {} proof keepalive round(s), the last {} ago; its options were put back",
                    a.rounds,
                    inspect::human_ms(now_ms.saturating_sub(a.at_ms))
                ),
            });
        }
    }
    Diagnosis {
        verdict: j.verdict,
        reasons: j.reasons,
        proofs,
        proof_work: j.work,
        progress,
    }
}

/// What the judge needs of the agent's probe results, one per probe.
fn views(agent: &AgentConfig, results: &[ProbeResult]) -> Vec<ProbeView> {
    agent
        .probes
        .iter()
        .zip(results)
        .map(|(c, r)| view(c, r))
        .collect()
}

/// What the judge needs of a probe result.
fn view(config: &selfheal_core::config::ProbeConfig, r: &ProbeResult) -> ProbeView {
    let makes_claims = match config {
        selfheal_core::config::ProbeConfig::Http { expect, .. } => !expect.is_empty(),
        selfheal_core::config::ProbeConfig::HealthFile { .. } => false,
    };
    ProbeView {
        target: r.target.clone(),
        error: r.error.as_ref().map(|e| {
            serde_json::to_value(e)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| format!("{e:?}"))
        }),
        expectations_met: r.ok || r.error.is_some(),
        makes_claims,
        latency_ms: r.latency_ms,
        fields: r.fields.clone(),
    }
}

/// The forensic snapshot: everything the verdict rests on.
fn snapshot_body(j: &Judgement, report: &Report, probes: &[ProbeResult]) -> serde_json::Value {
    serde_json::json!({
        "verdict": j.verdict,
        "reasons": j.reasons,
        "evidence": report,
        "probes": probes,
    })
}
