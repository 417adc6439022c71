//! One check of every configured agent — the pipeline behind `selfheal
//! check` (one shot, run by a timer) and `selfheal watch` (a loop): find
//! each agent's processes, collect evidence, run the probes concurrently,
//! judge with the history, write a forensic snapshot for every agent that
//! is not fine, and report transitions.
//!
//! The history it needs between runs is [`History`]; the caller loads and
//! stores it (`store`). Snapshots go to a [`SnapshotLog`] before anything
//! else is reported, so nothing later can lose them.

use std::collections::BTreeMap;

use selfheal_core::config::{AgentConfig, Config};
use serde::{Deserialize, Serialize};

use crate::{
    actions::{KeepaliveOutcome, KeepaliveSettings, ProofKeepalive},
    agents::{self, ProcessTable},
    inspect::{self, CollectOptions, Collector, Report, Target},
    judge::{self, AgentHistory, Judgement, ProbeView, Reason, Verdict},
    ladder::{self, Decision, HealHistory, Step},
    probe::{self, ProbeResult},
    prove::{self, Proof, ProofEvent, ProofTarget, ProofWork},
    snapshots::SnapshotLog,
};

/// What `check` remembers between runs, per agent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct History {
    /// The boot the times below belong to (`CLOCK_BOOTTIME` restarts at
    /// boot); a different boot starts a fresh history.
    pub boot_id: String,
    pub agents: BTreeMap<String, AgentRecord>,
}

/// One agent's memory: the judge's, the ladder's, plus counters for metrics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentRecord {
    pub judge: AgentHistory,
    #[serde(default)]
    pub heal: HealHistory,
    /// Transitions into `wedged` since the history began.
    #[serde(default)]
    pub wedges: u64,
    /// The metrics' counters (issue 14): reasons, heals, proofs, the last
    /// snapshot.
    #[serde(default)]
    pub metrics: crate::metrics::Counters,
    /// The last snapshot written for the agent ([`SNAPSHOT_REPEAT_MS`]).
    #[serde(default)]
    pub last_snapshot: Option<SnapshotMark>,
}

/// A snapshot written: its id, verdict, when, and the snapshot directory
/// it is in (a repeat names it only while checks write there).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotMark {
    pub id: String,
    pub verdict: String,
    pub at_ms: u64,
    #[serde(default)]
    pub dir: String,
}

/// An agent that stays in one verdict that is not ok, with no healing step
/// to take, gets a snapshot when it enters that verdict and then at most
/// one per this long; its check's `snapshot` names the last one written.
/// A check that may act always writes one ("no action without a snapshot").
pub const SNAPSHOT_REPEAT_MS: u64 = 10 * 60 * 1000;

/// The result of checking one agent.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub agent: String,
    /// The containers the agent's processes are in (absent on the host).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<crate::runtime::Identity>,
    pub verdict: Verdict,
    pub reasons: Vec<judge::Reason>,
    /// The forensic snapshot's id, when one was written.
    pub snapshot: Option<String>,
    /// Why the snapshot could not be written, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_error: Option<String>,
    /// The previous verdict, when this check changed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous: Option<Verdict>,
    #[serde(skip)]
    pub transition: bool,
    /// Milliseconds the agent had been in its previous verdict, on a transition.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_for_ms: Option<u64>,
    pub probes: Vec<ProbeResult>,
    /// What could not be seen.
    pub gaps: Vec<String>,
    /// What the prove stage did in this check (proof keepalives armed and
    /// options put back).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub proofs: Vec<ProofEvent>,
    /// What the healing ladder decided and did, for a wedged agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heal: Option<HealReport>,
    /// What the metrics need of the evidence (not in the JSON: `inspect`
    /// has all of it).
    #[serde(skip)]
    pub evidence: Evidence,
}

/// The facts of an agent's evidence the metrics carry.
#[derive(Clone, Debug, Default)]
pub struct Evidence {
    /// The eBPF strategy the evidence came from, if any.
    pub strategy: Option<&'static str>,
    /// The agent's processes (0: none found).
    pub processes: usize,
    /// Zombies in its tree.
    pub zombies: usize,
}

/// The ladder's decision for one agent in one check, and the actions taken.
#[derive(Clone, Debug, Serialize)]
pub struct HealReport {
    pub decision: Decision,
    /// `true` when the steps were only decided (`--dry-run`).
    pub dry_run: bool,
    pub actions: Vec<ActionOutcome>,
    /// The breaker opened in this check (log it once, not every check).
    #[serde(skip)]
    pub newly_gave_up: bool,
}

/// One step and how it went.
#[derive(Clone, Debug, Serialize)]
pub struct ActionOutcome {
    pub step: Step,
    pub ok: bool,
    /// The executor's result, or the error.
    pub detail: String,
}

/// Where eBPF evidence comes from when `check` does not attach a tracer of
/// its own: the helper's, which stays loaded between checks.
pub trait TracerSource {
    /// Watches `pids` (from now on, if not yet) and returns the tracer's
    /// picture of them, with since when they are all watched.
    fn snapshot(
        &mut self,
        pids: &[u32],
    ) -> Result<(crate::ebpf::TracerSnapshot, Option<u64>), String>;
}

/// Who performs healing steps: the privileged helper, or this process
/// directly where it has the permission.
pub trait Healer {
    /// Performs `step` for `agent`; the result's text goes into the audit
    /// trail and the report.
    fn act(&self, agent: &str, step: &Step) -> Result<String, String>;

    /// The prove stage: arms a proof keepalive on socket `t` of `agent`,
    /// returning the options it had and those set.
    fn arm_proof(
        &self,
        agent: &str,
        t: &ProofTarget,
        ka: &ProofKeepalive,
    ) -> Result<KeepaliveOutcome, String> {
        let _ = (agent, t, ka);
        Err("this healer cannot arm proof keepalives".into())
    }

    /// The prove stage: puts `previous` back on socket `t` of `agent`,
    /// returning the options as read back.
    fn restore_proof(
        &self,
        agent: &str,
        t: &ProofTarget,
        previous: &KeepaliveSettings,
    ) -> Result<KeepaliveSettings, String> {
        let _ = (agent, t, previous);
        Err("this healer cannot restore keepalive options".into())
    }
}

/// Knobs of one check.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Only these agents (all when empty).
    pub only: Vec<String>,
    /// Evidence collection (eBPF off for a one-shot check: receives that
    /// began before it attached would be invisible anyway, and procfs times
    /// them).
    pub collect: CollectOptions,
    /// Decide healing steps but take none.
    pub dry_run: bool,
}

/// The kernel's id of this boot.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Checks every agent of `config` once. `history` is updated in place.
///
/// One pass discovers every agent and attaches (or reads) the tracer once,
/// runs every probe at once, then checks each agent in turn
/// (`check_agent`): collect, judge, prove, and for a verdict that is not
/// ok, snapshot and heal (`Acting::not_ok`).
pub fn run(
    config: &Config,
    history: &mut History,
    snapshots: Option<&SnapshotLog>,
    healer: Option<&dyn Healer>,
    tracer: Option<&mut dyn TracerSource>,
    opts: &Options,
    now_ms: u64,
) -> Vec<Outcome> {
    let boot = boot_id();
    if history.boot_id != boot {
        *history = History {
            boot_id: boot,
            agents: BTreeMap::new(),
        };
    }
    let agents: Vec<&AgentConfig> = config
        .agents
        .iter()
        .filter(|a| opts.only.is_empty() || opts.only.contains(&a.name))
        .collect();
    let table = ProcessTable::read_for(&agents, crate::trust::euid());
    let table = crate::agents::enrich_for(table, &agents, &crate::runtime::Sources::from_env());
    let targets: Vec<Target> = agents.iter().map(|a| target(a, &table)).collect();
    let all_pids: Vec<u32> = targets
        .iter()
        .flat_map(|t| t.pids.iter().copied())
        .collect();
    let mut collector = match tracer {
        Some(source) => Collector::from_snapshot(source.snapshot(&all_pids), opts.collect.detail),
        None => Collector::new(&opts.collect, &all_pids),
    };

    // Every agent's probes at once, each bounded by its own timeout.
    let probe_configs: Vec<_> = agents.iter().flat_map(|a| a.probes.iter()).collect();
    let mut results = probe::run_all(&probe_configs).into_iter();

    let acting = Acting {
        snapshots,
        healer,
        dry_run: opts.dry_run,
        now_ms,
    };
    let mut outcomes = Vec::new();
    for (agent, target) in agents.iter().zip(&targets) {
        let probes: Vec<ProbeResult> = results.by_ref().take(agent.probes.len()).collect();
        let record = history.agents.entry(agent.name.clone()).or_default();
        outcomes.push(check_agent(
            &acting,
            agent,
            target,
            &mut collector,
            opts.collect.detail,
            probes,
            record,
        ));
    }
    history
        .agents
        .retain(|name, _| config.agents.iter().any(|a| &a.name == name));
    outcomes
}

/// Where a check writes and through whom it acts, and when.
struct Acting<'a> {
    snapshots: Option<&'a SnapshotLog>,
    healer: Option<&'a dyn Healer>,
    /// Decide, but take no step.
    dry_run: bool,
    now_ms: u64,
}

/// Checks one agent: its evidence (minimal thread detail first, more only
/// where the judge needs it), the judgement, the prove stage, and for a
/// verdict that is not ok the snapshot and the ladder. Updates `record`.
fn check_agent(
    acting: &Acting<'_>,
    agent: &AgentConfig,
    target: &Target,
    collector: &mut Collector,
    detail: crate::proc::Detail,
    probes: Vec<ProbeResult>,
    record: &mut AgentRecord,
) -> Outcome {
    let now_ms = acting.now_ms;
    // Each collection has the agent's budget; evidence cut at it is not
    // judged (`over_budget`), and the check goes on with the next agent.
    collector.set_budget(agent.thresholds.collect_budget);
    // Minimal thread evidence first; the threads' syscalls and waits are
    // read only where the sockets or thread states call for them.
    let evidence = collector.collect(target);
    if let Some(why) = &evidence.over_budget {
        return over_budget(
            agent,
            target,
            &inspect::build(&evidence),
            why,
            probes,
            record,
            now_ms,
        );
    }
    let mut report = inspect::build(&evidence);
    let mut detail = detail;
    if detail == crate::proc::Detail::Minimal
        && judge::needs_thread_detail(agent, &report, &record.judge, now_ms)
    {
        detail = crate::proc::Detail::Light;
        let evidence = collector.collect_with(target, detail);
        if let Some(why) = &evidence.over_budget {
            return over_budget(
                agent,
                target,
                &inspect::build(&evidence),
                why,
                probes,
                record,
                now_ms,
            );
        }
        report = inspect::build(&evidence);
    }
    let views: Vec<ProbeView> = agent
        .probes
        .iter()
        .zip(&probes)
        .map(|(c, r)| view(c, r))
        .collect();
    let before = record.judge.clone();
    let (judgement, next) = judge::judge(agent, &report, &views, &before, now_ms);
    let transition = before.verdict != Some(judgement.verdict);
    if transition && judgement.verdict == Verdict::Wedged {
        record.wedges = record.wedges.saturating_add(1);
    }
    record.judge = next;
    let (proofs, proof_gaps) = prove_stage(
        agent,
        &judgement.work,
        &mut record.judge,
        acting.healer,
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
        evidence: Evidence {
            strategy: report.ebpf.strategy.map(|s| s.name()),
            processes: report.processes.len(),
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
        let reread = (detail != crate::proc::Detail::Full)
            .then(|| collector.collect_with(target, crate::proc::Detail::Full));
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
    crate::metrics::observe(&mut record.metrics, &outcome);
    outcome
}

/// An agent whose collection ran past its budget: not judged on the
/// partial evidence. Its verdict is `unresponsive` (its processes could not
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
            code: crate::model::ReasonCode::OverBudget,
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
        evidence: Evidence {
            strategy: partial.ebpf.strategy.map(|s| s.name()),
            processes: partial.processes.len(),
            zombies: partial.init.zombies,
        },
    };
    crate::metrics::observe(&mut record.metrics, &outcome);
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
            .any(|d| d.kind != crate::model::DeadKind::Awaited)
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
            agent,
            judgement,
            full,
            &mut record.heal,
            outcome,
            self.healer,
            self.dry_run,
            self.now_ms,
        ));
        if let Some(Decision::GaveUp { why }) = outcome.heal.as_ref().map(|h| &h.decision) {
            outcome.reasons.push(Reason {
                code: crate::model::ReasonCode::GaveUp,
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
                self.healer,
                self.dry_run,
                self.now_ms,
            );
            outcome.proofs.extend(events);
            outcome.gaps.extend(gaps);
        }
    }
}

/// The prove stage: carries out the judge's proof work for one agent
/// through `healer` (the helper, or this process for its own uid), and
/// records it in the agent's history. Returns what was done, and what could
/// not be (as gaps: a proof that could not be armed is evidence not seen).
/// With `dry_run` nothing is touched: the work is only reported.
fn prove_stage(
    agent: &AgentConfig,
    work: &[ProofWork],
    hist: &mut AgentHistory,
    healer: Option<&dyn Healer>,
    dry_run: bool,
    now_ms: u64,
) -> (Vec<ProofEvent>, Vec<String>) {
    let mut events = Vec::new();
    let mut gaps = Vec::new();
    let ka = prove::keepalive(&agent.proof);
    for w in work {
        match w {
            ProofWork::Arm {
                cookie,
                target,
                silent_ms,
                remote,
            } => {
                let what = format!(
                    "a proof keepalive on the connection to {remote} (fd {} of pid {})",
                    target.fd, target.pid
                );
                let result = match healer {
                    _ if dry_run => {
                        events.push(ProofEvent {
                            action: "arm",
                            inode: target.inode,
                            remote: remote.clone(),
                            ok: false,
                            detail: "not armed: --dry-run".into(),
                        });
                        continue;
                    }
                    Some(h) => h.arm_proof(&agent.name, target, &ka),
                    None => Err("no helper and no permission to act directly".into()),
                };
                match result {
                    Ok(out) => {
                        tracing::info!(
                            agent = %agent.name, pid = target.pid, fd = target.fd,
                            inode = target.inode, remote = %remote,
                            "proof keepalive armed: idle {} s, interval {} s, {} probes (options before: {:?})",
                            ka.idle_s, ka.interval_s, ka.count, out.previous
                        );
                        // Timed from this check's start, the clock the
                        // next check's tcp_info ages are compared with (the
                        // ages are read after it starts: an ACK right after
                        // arming must count as after it), and from the
                        // silence the kernel's keepalive timer counts (data
                        // or ACK). Any ACK after this check's judgement
                        // proves the peer there.
                        let armed_at_ms = now_ms;
                        let kernel_silent = out.silent_ms.map_or(*silent_ms, u64::from);
                        hist.proofs.insert(
                            *cookie,
                            Proof {
                                pid: target.pid,
                                start_ticks: target.start_ticks,
                                fd: target.fd,
                                inode: target.inode,
                                armed_at_ms,
                                first_probe_ms: (u64::from(ka.idle_s) * 1000)
                                    .saturating_sub(kernel_silent),
                                interval_ms: u64::from(ka.interval_s) * 1000,
                                count: ka.count,
                                previous: out.previous.clone(),
                                restore_failures: 0,
                                restore_error: None,
                            },
                        );
                        events.push(ProofEvent {
                            action: "arm",
                            inode: target.inode,
                            remote: remote.clone(),
                            ok: true,
                            detail: format!(
                                "armed: {} probes {} s apart (user timeout {} ms); the socket's own options were {}",
                                ka.count,
                                ka.interval_s,
                                out.applied.user_timeout_ms,
                                settings_words(&out.previous)
                            ),
                        });
                    }
                    Err(e) => {
                        gaps.push(format!("could not arm {what}: {e}"));
                        events.push(ProofEvent {
                            action: "arm",
                            inode: target.inode,
                            remote: remote.clone(),
                            ok: false,
                            detail: e,
                        });
                    }
                }
            }
            ProofWork::Restore {
                cookie,
                target,
                remote,
                answered,
            } => {
                let Some(p) = hist.proofs.get(cookie).cloned() else {
                    continue;
                };
                let result = match healer {
                    _ if dry_run => continue,
                    Some(h) => h.restore_proof(&agent.name, target, &p.previous),
                    None => Err("no helper and no permission to act directly".into()),
                };
                // Read back and compared: a live call keeps no trace.
                let result = result.and_then(|back| {
                    if back == p.previous {
                        Ok(back)
                    } else {
                        Err(format!(
                            "put back {}, but read back {}",
                            settings_words(&p.previous),
                            settings_words(&back)
                        ))
                    }
                });
                match result {
                    Ok(back) => {
                        hist.proofs.remove(cookie);
                        let why = if *answered {
                            let a = hist.answered.entry(*cookie).or_default();
                            a.at_ms = now_ms;
                            a.rounds = a.rounds.saturating_add(1);
                            "the peer answered"
                        } else {
                            "the proof is withdrawn (proofs off, or the ladder does not end this connection)"
                        };
                        tracing::info!(
                            agent = %agent.name, pid = p.pid, fd = p.fd, inode = p.inode,
                            remote = %remote,
                            "proof keepalive: {why}; options put back and read back: {}",
                            settings_words(&back)
                        );
                        events.push(ProofEvent {
                            action: "restore",
                            inode: p.inode,
                            remote: remote.clone(),
                            ok: true,
                            detail: format!(
                                "{why}; options put back and read back: {}",
                                settings_words(&back)
                            ),
                        });
                    }
                    Err(e) => {
                        let failures = p.restore_failures.saturating_add(1);
                        if let Some(q) = hist.proofs.get_mut(cookie) {
                            q.restore_failures = failures;
                            q.restore_error = Some(e.clone());
                        }
                        // Given up, the record stays (never retried, never
                        // re-armed: a new proof would read these options as
                        // the socket's own).
                        let gap = if failures >= prove::MAX_RESTORE_FAILURES {
                            format!(
                                "gave up putting back the keepalive options of the connection to {remote} (fd {} of pid {}) after {failures} attempts, {}: {e}",
                                p.fd,
                                p.pid,
                                settings_words(&p.previous)
                            )
                        } else {
                            format!(
                                "could not put back the keepalive options of the connection to {remote} (fd {} of pid {}; attempt {failures}, tried again next check): {e}",
                                p.fd, p.pid
                            )
                        };
                        tracing::warn!(agent = %agent.name, "{gap}");
                        gaps.push(gap);
                        events.push(ProofEvent {
                            action: "restore",
                            inode: p.inode,
                            remote: remote.clone(),
                            ok: false,
                            detail: e,
                        });
                    }
                }
            }
        }
    }
    (events, gaps)
}

/// Restores for the proven-dead sockets the ladder neither ended in this
/// check nor is waiting to (its decision is to do nothing, or it gave up, or
/// its step failed, e.g. for want of a snapshot).
fn unended_proofs(j: &Judgement, report: &Report, heal: Option<&HealReport>) -> Vec<ProofWork> {
    if heal.is_some_and(|h| matches!(h.decision, Decision::Wait { .. })) {
        return Vec::new();
    }
    let ended = |inode: u64| {
        heal.is_some_and(|h| {
            h.actions.iter().any(|a| {
                a.ok && matches!(a.step, Step::ExpireKeepalive { inode: i, .. } | Step::DestroySocket { inode: i, .. } if i == inode)
            })
        })
    };
    j.dead
        .iter()
        .filter(|d| d.by_proof && !ended(d.inode))
        .filter_map(|d| {
            let inode = d.inode;
            let s = report.sockets.iter().find(|s| s.inode == inode)?;
            let start_ticks = report
                .processes
                .iter()
                .find(|p| p.pid == s.pid)?
                .start_ticks?;
            Some(ProofWork::Restore {
                cookie: s.cookie,
                target: ProofTarget {
                    pid: s.pid,
                    start_ticks,
                    fd: s.fd?,
                    inode,
                },
                remote: s.remote.clone(),
                answered: false,
            })
        })
        .collect()
}

/// Keepalive options in a few words.
fn settings_words(s: &KeepaliveSettings) -> String {
    format!(
        "SO_KEEPALIVE {} idle {} s interval {} s count {} user timeout {} ms",
        if s.enabled { "on" } else { "off" },
        s.idle_s,
        s.interval_s,
        s.count,
        s.user_timeout_ms
    )
}

/// Runs the ladder for a wedged agent (or one with dead connections to
/// end): decides, and (unless `dry_run`, and
/// only with a snapshot written) takes the steps through `healer`.
#[allow(clippy::too_many_arguments)]
fn heal(
    agent: &AgentConfig,
    j: &Judgement,
    report: &Report,
    hist: &mut HealHistory,
    outcome: &Outcome,
    healer: Option<&dyn Healer>,
    dry_run: bool,
    now_ms: u64,
) -> HealReport {
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
            } else if let Some(h) = healer {
                h.act(&agent.name, step)
            } else {
                Err("not taken: no helper and no permission to act directly".to_string())
            };
            let (ok, detail) = match result {
                Ok(d) => (true, d),
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
fn unit_recheck(agent: &AgentConfig, step: &Step, report: &Report) -> Result<(), String> {
    let selfheal_core::config::MatchRule::Unit(unit) = &agent.rule else {
        return Ok(());
    };
    let owner = agent.unit_owner(crate::trust::euid());
    let pids: Vec<(u32, u64)> = match step {
        Step::ArmKeepalive {
            pid, start_ticks, ..
        }
        | Step::ExpireKeepalive {
            pid, start_ticks, ..
        }
        | Step::DestroySocket {
            pid, start_ticks, ..
        }
        | Step::Signal {
            pid, start_ticks, ..
        }
        | Step::RestartContainer {
            pid, start_ticks, ..
        } => vec![(*pid, *start_ticks)],
        // The command names the unit, not a pid: a root that has exited
        // since is no reason to hold it back, one that moved is.
        Step::Restart { .. } => report
            .processes
            .iter()
            .filter(|p| report.roots.contains(&p.pid))
            .filter_map(|p| Some((p.pid, p.start_ticks?)))
            .filter(|(pid, start)| crate::pidfd::start_ticks(*pid) == Some(*start))
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
fn unit_stopping(unit: &str, report: &Report) -> Option<(crate::runtime::cgroup::Manager, String)> {
    let managers = unit_managers(unit, &report.roots);
    let alive = report.processes.iter().any(|p| {
        report.roots.contains(&p.pid)
            && p.start_ticks.is_some()
            && crate::pidfd::start_ticks(p.pid) == p.start_ticks
    });
    managers.into_iter().find_map(|m| {
        let (load, active) = unit_state(unit, m)?;
        stopped_on_purpose(&load, &active, alive).then(|| (m, crate::text::escape(&active)))
    })
}

/// What each manager that runs `unit` for the processes `roots` says of
/// it (`LoadState`, `ActiveState`), asked as the heal's stopped-on-purpose check asks:
/// `None` for a manager that cannot be asked. For people
/// (`config check`).
pub fn unit_states(
    unit: &str,
    roots: &[u32],
) -> Vec<(crate::runtime::cgroup::Manager, Option<(String, String)>)> {
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
/// cgroups now (anchored: [`crate::runtime::cgroup::unit_of`]).
fn unit_managers(unit: &str, roots: &[u32]) -> Vec<crate::runtime::cgroup::Manager> {
    let read = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .ok()
            .and_then(|t| agents::cgroup_path(&t))
    };
    let root = crate::runtime::cgroup::manager_root(read(1).as_deref());
    let mut out = Vec::new();
    for pid in roots {
        let Some(path) = read(*pid) else { continue };
        let Some(place) = crate::runtime::cgroup::unit_of(&path, &root) else {
            continue;
        };
        let manager = match place.manager {
            _ if place.unit == unit => place.manager,
            // A user's manager runs inside the system's user@UID.service.
            crate::runtime::cgroup::Manager::User(uid) if unit == format!("user@{uid}.service") => {
                crate::runtime::cgroup::Manager::System
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
fn unit_state(unit: &str, manager: crate::runtime::cgroup::Manager) -> Option<(String, String)> {
    use std::os::unix::process::CommandExt as _;
    let euid = crate::trust::euid();
    let mut cmd = std::process::Command::new("systemctl");
    match manager {
        crate::runtime::cgroup::Manager::System => {}
        crate::runtime::cgroup::Manager::User(uid) if uid == euid => {
            cmd.arg("--user");
        }
        crate::runtime::cgroup::Manager::User(uid) if euid == 0 => {
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
        crate::runtime::cgroup::Manager::User(_) => return None,
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

/// The processes of `agent`, and how to tell its upstreams (with their
/// heartbeats and what host names resolved to, for people).
pub fn target(agent: &AgentConfig, table: &ProcessTable) -> Target {
    let matched = agents::find_for(agent, crate::trust::euid(), table);
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
    container_gaps.extend(table.cmdline_gap(agent, crate::trust::euid()));
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
        containers,
        container_gaps,
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

/// Judges `agent` now on `report`, running its probes, against `history`
/// (read only).
pub fn diagnose(
    agent: &AgentConfig,
    report: &Report,
    history: &AgentHistory,
    now_ms: u64,
) -> Diagnosis {
    let configs: Vec<_> = agent.probes.iter().collect();
    let results = probe::run_all(&configs);
    let views: Vec<ProbeView> = agent
        .probes
        .iter()
        .zip(&results)
        .map(|(c, r)| view(c, r))
        .collect();
    let (j, _) = judge::judge(agent, report, &views, history, now_ms);
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
    }
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

/// The exit code of `check` for these outcomes (design's contract): 0 all
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
            let names: Vec<String> = steps.iter().map(step_words).collect();
            format!(" [would heal: {}]", names.join(", "))
        }
        Decision::Act { .. } => {
            let done: Vec<String> = h
                .actions
                .iter()
                .map(|a| {
                    format!(
                        "{}: {}",
                        step_words(&a.step),
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

/// A step as people say it.
pub fn step_words(s: &Step) -> String {
    match s {
        Step::ArmKeepalive { pid, fd, .. } => format!("arm keepalive on pid {pid} fd {fd}"),
        Step::ExpireKeepalive { pid, fd, .. } => {
            format!("end the unanswered keepalive on pid {pid} fd {fd} (ETIMEDOUT)")
        }
        Step::DestroySocket { pid, fd, .. } => format!("destroy socket pid {pid} fd {fd}"),
        Step::Signal { pid, grace_ms, .. } => {
            format!("SIGTERM pid {pid} (SIGKILL after {grace_ms} ms)")
        }
        Step::Restart { argv, .. } => format!("restart: {}", argv.join(" ")),
        Step::RestartContainer {
            runtime,
            id,
            grace_ms,
            ..
        } => format!(
            "restart {runtime} container {} (grace {grace_ms} ms)",
            &id[..id.len().min(12)]
        ),
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
    // The containers' identity (issue 13), before the snapshot id.
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
