//! One check of every configured agent — the pipeline behind `selfheal
//! check` (one shot, run by a timer) and `selfheal watch` (a loop): find
//! each agent's processes, collect evidence, run the probes concurrently,
//! judge with the history, write a forensic snapshot for every agent that
//! is not fine, and report transitions.
//!
//! The history it needs between runs is [`History`]; the caller loads and
//! stores it (`store`). Snapshots go to a [`SnapshotLog`] before anything
//! else is reported, so nothing later can lose them. What a check finds,
//! and how it reads for people, is pure and lives in the core
//! ([`selfheal_core::outcome`], [`selfheal_core::history`]).
//!
//! The rooms: [`pipeline`] (one agent's check: collect, judge, snapshot,
//! and the evidence `inspect` shows), [`prove`] (the prove stage) and
//! [`heal`] (the ladder's steps, and the unit checks before them).

pub mod heal;
pub mod pipeline;
pub mod prove;
pub mod through_helper;

use std::collections::BTreeMap;

use selfheal_core::{
    config::{AgentConfig, Config},
    ebpf::TracerSnapshot,
    history::History,
    outcome::Outcome,
    probe::ProbeResult,
};

use self::pipeline::{check_agent, target};
use crate::{
    agents::ProcessTable,
    heal::Executor,
    inspect::{CollectOptions, Collector, Target},
    probe,
    snapshots::SnapshotLog,
};

/// What one check acts with: where it writes snapshots, through whom it
/// acts, whether it only decides, and when it runs. The context every room
/// of the check shares.
struct Acting<'a> {
    snapshots: Option<&'a SnapshotLog>,
    executor: Option<&'a dyn Executor>,
    /// Decide, but take no step.
    dry_run: bool,
    now_ms: u64,
    /// `now_ms` with `CLOCK_MONOTONIC` beside it, for the judge.
    now: selfheal_core::clock::Now,
    /// When `now_ms` was read, to tell later moments on its clock
    /// ([`Acting::clock_ms`]).
    started: std::time::Instant,
}

impl Acting<'_> {
    /// This moment on the check's clock: `now_ms` and the time since.
    fn clock_ms(&self) -> u64 {
        let since = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.now_ms.saturating_add(since)
    }
}

/// Where eBPF evidence comes from when `check` does not attach a tracer of
/// its own: the helper's, which stays loaded between checks.
pub trait TracerSource {
    /// Watches `pids` (from now on, if not yet) and returns the tracer's
    /// picture of them, with since when they are all watched.
    fn snapshot(
        &mut self,
        pids: &[u32],
    ) -> Result<(TracerSnapshot, Option<u64>), crate::helper::ClientError>;

    /// Where the task iterators' passes come from for a check that may
    /// not link them itself (the helper), if anywhere.
    fn passes(&self) -> Option<Box<dyn crate::inspect::HelperReads>> {
        None
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
    std::fs::read_to_string(
        crate::sys::procfs::ProcRoot::default().file("sys/kernel/random/boot_id"),
    )
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
    executor: Option<&dyn Executor>,
    tracer: Option<&mut dyn TracerSource>,
    opts: &Options,
    now: selfheal_core::clock::Now,
) -> Vec<Outcome> {
    let started = std::time::Instant::now();
    let now_ms = now.boot_ms;
    let boot = boot_id();
    if history.boot_id != boot {
        *history = History {
            boot_id: boot,
            agents: BTreeMap::new(),
        };
    }
    let wanted = |a: &&AgentConfig| opts.only.is_empty() || opts.only.contains(&a.name);
    let configured: Vec<&AgentConfig> = config.agents.iter().filter(wanted).collect();
    // The `[auto]` agents are found in the table read for their rules.
    let auto_wanted = opts.only.is_empty()
        || opts
            .only
            .iter()
            .any(|n| n.starts_with(selfheal_core::auto::PREFIX));
    let reading = if auto_wanted && config.auto.is_on() {
        crate::agents::auto::reading(config)
    } else {
        Vec::new()
    };
    let agents: Vec<&AgentConfig> = configured.iter().copied().chain(&reading).collect();
    // The helper's reads, where it answers; a root check that may not read
    // other users' processes (a `watch` holding no CAP_SYS_PTRACE or
    // CAP_DAC_READ_SEARCH) has it read every process.
    let mut reads = tracer.as_ref().and_then(|t| t.passes());
    let through_helper =
        reads.is_some() && crate::sys::creds::euid() == 0 && !crate::sys::creds::reads_others();
    // What the rules need read, no more (`ProcessTable::read_check`); the
    // runtimes asked before the helper, so the container inits they name
    // are read in full when it is asked for pid namespaces.
    let table = ProcessTable::read_check(&agents, crate::sys::creds::euid());
    let mut table = crate::agents::enrich_for(table, &agents, &crate::runtime::Sources::from_env());
    let auto = if reading.is_empty() {
        Vec::new()
    } else {
        crate::agents::auto::agents(config, &table)
    };
    let agents: Vec<&AgentConfig> = configured
        .into_iter()
        .chain(auto.iter().filter(wanted))
        .collect();
    if let Some(r) = reads.as_mut().filter(|_| through_helper) {
        table = table.with_pid_namespaces(&mut |pids| r.namespaces(pids));
    }
    let targets: Vec<Target> = agents.iter().map(|a| target(a, &table)).collect();
    let all_pids: Vec<u32> = targets
        .iter()
        .flat_map(|t| t.pids.iter().copied())
        .collect();
    let mut collector = match tracer {
        Some(source) => Collector::from_snapshot(
            source.snapshot(&all_pids).map_err(|e| e.to_string()),
            opts.collect.detail,
        ),
        None => Collector::new(&opts.collect, &all_pids),
    };
    if let Some(why) = &opts.collect.no_iterators {
        collector.without_iterators(why);
    }
    collector.load_iterators(opts.collect.load_iterators);
    match reads {
        Some(reads) if through_helper => collector.reads_from(reads),
        // After `without_iterators`: turned off, they are not asked for.
        Some(mut passes) => collector.passes_from(passes.as_mut(), &all_pids),
        None => {}
    }

    // Every agent's probes at once, each bounded by its own timeout.
    let probe_configs: Vec<_> = agents.iter().flat_map(|a| a.probes.iter()).collect();
    let mut results = probe::run_all(&probe_configs).into_iter();

    let acting = Acting {
        snapshots,
        executor,
        dry_run: opts.dry_run,
        now_ms,
        started,
        now,
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
    history.agents.retain(|name, _| {
        config.agents.iter().chain(&auto).any(|a| &a.name == name)
                // Not looked for in this check: kept for the next.
                || (!auto_wanted && name.starts_with(selfheal_core::auto::PREFIX))
    });
    outcomes
}
