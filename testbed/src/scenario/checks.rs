//! The running of checks: a check every interval, each outcome recorded
//! in the [`Report`] and narrated as [`Event`]s; the stop flag and the
//! pause that heeds it.

use std::{
    collections::BTreeMap,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::bail;
use serde::Serialize;
use serde_json::Value;

use super::bed::{Bed, CheckRun, Options};

/// Set (by a signal handler) to stop a scenario at its next pause; the bed
/// is then dropped, which kills its processes and deletes its namespaces.
pub static STOP: AtomicBool = AtomicBool::new(false);

/// One thing a person watching should see.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The bed is up.
    Setup { what: String },
    /// A runner's own story (`GET /status`) and the dispatch server's row.
    Story {
        at_ms: u64,
        runner: String,
        status: Value,
        table: Value,
    },
    /// The fault was injected.
    Fault { at_ms: u64, what: String },
    /// One agent's verdict in one check (printed on a change, or when it
    /// carries a snapshot or a heal).
    Verdict(Verdict),
    /// A runner is back at work: time from the fault to the verdict and to
    /// the first work item done after reattaching.
    Recovered {
        agent: String,
        detect_ms: u64,
        recover_ms: u64,
    },
    /// Anything else worth a line.
    Note { at_ms: u64, text: String },
}

/// One agent's verdict in one check, as [`Event::Verdict`] tells it.
#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    pub at_ms: u64,
    pub agent: String,
    pub verdict: String,
    pub reasons: Vec<Value>,
    pub snapshot: Option<String>,
    pub heal: Vec<String>,
    /// Whether the verdict or its reasons' codes differ from this agent's
    /// previous ones.
    pub changed: bool,
}

/// What a scenario saw.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub scenario: String,
    /// Every verdict of every agent, in check order.
    pub verdicts: BTreeMap<String, Vec<String>>,
    /// Every reason code seen per agent.
    pub reasons: BTreeMap<String, Vec<String>>,
    /// Healing steps taken, as "agent: action".
    pub heals: Vec<String>,
    /// Snapshot ids written.
    pub snapshots: Vec<String>,
    /// Fault to the first `wedged` verdict.
    pub detect_ms: Option<u64>,
    /// Fault to the runner's first work item done after it reattached.
    pub recover_ms: Option<u64>,
    pub checks: u32,
    /// Facts a scenario wants to keep (its own assertions' inputs).
    pub facts: BTreeMap<String, Value>,
}

impl Report {
    pub(super) fn new(scenario: &str) -> Report {
        Report {
            scenario: scenario.into(),
            ..Report::default()
        }
    }

    /// Keeps fact `key`.
    pub(super) fn fact(&mut self, key: &str, value: impl Into<Value>) {
        self.facts.insert(key.into(), value.into());
    }

    /// Keeps fact `key` when there is one.
    pub(super) fn fact_if(&mut self, key: &str, value: Option<impl Into<Value>>) {
        if let Some(v) = value {
            self.fact(key, v);
        }
    }

    /// The first check whose outcome for `agent` is `found`: `at` ms after
    /// the fault, its outcome kept as fact `key`. Later ones change
    /// nothing. Whether it has been found, now or before.
    pub(super) fn detect(
        &mut self,
        run: &CheckRun,
        agent: &str,
        key: &str,
        at: u64,
        found: impl Fn(&Value) -> bool,
    ) -> bool {
        if self.detect_ms.is_none()
            && let Some(o) = run.of(agent).filter(|o| found(o))
        {
            self.detect_ms = Some(at);
            self.fact(key, o.clone());
        }
        self.detect_ms.is_some()
    }

    /// The caller's next call done `ms` after the fault: its recovery,
    /// unless one was recorded before.
    pub(super) fn next_call_done(&mut self, ms: u64) {
        self.fact("next_call_done_ms", ms);
        self.recover_ms.get_or_insert(ms);
    }

    /// Verdicts of `agent` other than those in `allowed`.
    pub fn verdicts_outside(&self, agent: &str, allowed: &[&str]) -> Vec<String> {
        self.verdicts
            .get(agent)
            .into_iter()
            .flatten()
            .filter(|v| !allowed.contains(&v.as_str()))
            .cloned()
            .collect()
    }

    pub fn saw_reason(&self, agent: &str, code: &str) -> bool {
        self.reasons
            .get(agent)
            .is_some_and(|c| c.iter().any(|x| x == code))
    }
}

/// A scenario's report and its bed (`tag` names its namespaces, work is
/// dispatched every `work_every`).
pub(super) fn begin(
    opts: &Options,
    scenario: &str,
    tag: &str,
    work_every: Duration,
) -> anyhow::Result<(Report, Bed)> {
    Ok((Report::new(scenario), Bed::new(opts, tag, work_every)?))
}

/// The bed is up: `what`, and how often it is checked.
pub(super) fn set_up(bed: &Bed, say: &mut dyn FnMut(Event), what: String) {
    say(Event::Setup {
        what: format!(
            "{what}; a check every {} ms",
            bed.opts.check_every.as_millis()
        ),
    });
}

/// Milliseconds since `t` (the fault, mostly).
pub(super) fn ms_since(t: Instant) -> u64 {
    t.elapsed().as_millis() as u64
}

/// Whether outcome `o` gives reason `code`.
pub(super) fn has_reason(o: &Value, code: &str) -> bool {
    o["reasons"]
        .as_array()
        .is_some_and(|r| r.iter().any(|r| r["code"] == code))
}

/// Whether outcome `o` is `wedged`.
pub(super) fn is_wedged(o: &Value) -> bool {
    o["verdict"] == "wedged"
}

/// The proof events of `agent`'s outcome in `run`.
pub(super) fn proofs(run: &CheckRun, agent: &str) -> Vec<Value> {
    run.of(agent)
        .and_then(|o| o["proofs"].as_array().cloned())
        .unwrap_or_default()
}

/// How many of `events` are a successful `action` (`arm`, `restore`).
pub(super) fn count_ok(events: &[Value], action: &str) -> u64 {
    events
        .iter()
        .filter(|e| e["action"] == action && e["ok"] == true)
        .count() as u64
}

/// Sleeps `d` in short slices; fails at once when [`STOP`] is set.
pub fn pause(d: Duration) -> anyhow::Result<()> {
    let end = Instant::now() + d;
    loop {
        if STOP.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

/// Runs checks every `check_every` for at most `limit`, recording and
/// narrating every outcome, until `done` says so (given the bed and the
/// latest check).
pub(super) fn checks(
    bed: &Bed,
    report: &mut Report,
    say: &mut dyn FnMut(Event),
    limit: Duration,
    done: impl FnMut(&Bed, &CheckRun, &mut Report, &mut dyn FnMut(Event)) -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    checks_with(bed, report, say, limit, |_, _| {}, done)
}

/// [`checks`] for `limit`, whatever they find.
pub(super) fn watch(
    bed: &Bed,
    report: &mut Report,
    say: &mut dyn FnMut(Event),
    limit: Duration,
) -> anyhow::Result<()> {
    checks(bed, report, say, limit, |_, _, _, _| Ok(false))
}

/// [`checks`], with `first` told about each check before its outcomes are
/// narrated (to narrate what stood before it).
pub(super) fn checks_with(
    bed: &Bed,
    report: &mut Report,
    say: &mut dyn FnMut(Event),
    limit: Duration,
    mut first: impl FnMut(&CheckRun, &mut dyn FnMut(Event)),
    mut done: impl FnMut(&Bed, &CheckRun, &mut Report, &mut dyn FnMut(Event)) -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let end = Instant::now() + limit;
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    while Instant::now() < end {
        let tick = Instant::now();
        let run = bed.check()?;
        note_check_time(report, tick.elapsed());
        if run.outcomes.is_empty() {
            bail!(
                "selfheal check printed nothing (exit {}): {}",
                run.code,
                run.stderr.trim()
            );
        }
        report.checks += 1;
        first(&run, say);
        for o in &run.outcomes {
            record(bed, o, report, &mut last, say);
        }
        if done(bed, &run, report, say)? {
            return Ok(());
        }
        pause(bed.opts.check_every.saturating_sub(tick.elapsed()))?;
    }
    Ok(())
}

pub(super) fn record(
    bed: &Bed,
    o: &Value,
    report: &mut Report,
    last: &mut BTreeMap<String, String>,
    say: &mut dyn FnMut(Event),
) {
    let agent = o["agent"].as_str().unwrap_or("?").to_string();
    let verdict = o["verdict"].as_str().unwrap_or("?").to_string();
    report
        .verdicts
        .entry(agent.clone())
        .or_default()
        .push(verdict.clone());
    let reasons = o["reasons"].as_array().cloned().unwrap_or_default();
    let codes = report.reasons.entry(agent.clone()).or_default();
    for r in &reasons {
        if let Some(c) = r["code"].as_str().filter(|c| !codes.iter().any(|x| x == c)) {
            codes.push(c.to_string());
        }
    }
    let snapshot = o["snapshot"].as_str().map(str::to_string);
    if let Some(id) = &snapshot {
        report.snapshots.push(id.clone());
    }
    let heal: Vec<String> = o["heal"]["actions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            let action = a["step"]["action"].as_str().unwrap_or("?");
            match a["error"].as_str() {
                Some(e) => format!("{action} (failed: {e})"),
                None => action.to_string(),
            }
        })
        .collect();
    for h in &heal {
        report.heals.push(format!("{agent}: {h}"));
    }
    // A change of verdict or of the reasons' codes is news.
    let now: Vec<&str> = reasons.iter().filter_map(|r| r["code"].as_str()).collect();
    let key = format!("{verdict} {}", now.join(","));
    let changed = last.insert(agent.clone(), key.clone()).as_ref() != Some(&key);
    if changed || snapshot.is_some() || !heal.is_empty() {
        say(Event::Verdict(Verdict {
            at_ms: bed.at_ms(),
            agent,
            verdict,
            reasons,
            snapshot,
            heal,
            changed,
        }));
    }
}

pub(super) fn story(bed: &Bed, runner: &str, say: &mut dyn FnMut(Event)) -> anyhow::Result<()> {
    say(told(bed, runner)?);
    Ok(())
}

/// A runner's story and the table's row, now.
pub(super) fn told(bed: &Bed, runner: &str) -> anyhow::Result<Event> {
    Ok(Event::Story {
        at_ms: bed.at_ms(),
        runner: runner.into(),
        status: bed.runner_status(runner).unwrap_or(Value::Null),
        table: bed.row(runner)?,
    })
}

/// Records the longest `selfheal check` run so far.
fn note_check_time(report: &mut Report, took: Duration) {
    let ms = took.as_millis() as u64;
    let max = report
        .facts
        .entry("check_ms_max".into())
        .or_insert(0.into());
    if max.as_u64() < Some(ms) {
        *max = ms.into();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A verdict event is one flat JSON object, tagged `verdict` (what
    /// `selfheal-testbed demo --json` prints).
    #[test]
    fn a_verdict_event_is_one_flat_object() {
        let e = Event::Verdict(Verdict {
            at_ms: 1500,
            agent: "runner".into(),
            verdict: "wedged".into(),
            reasons: vec![serde_json::json!({"code": "recv_blocked"})],
            snapshot: Some("S".into()),
            heal: vec!["destroy_socket".into()],
            changed: true,
        });
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"event":"verdict","at_ms":1500,"agent":"runner","verdict":"wedged","reasons":[{"code":"recv_blocked"}],"snapshot":"S","heal":["destroy_socket"],"changed":true}"#
        );
    }
}
