//! Load without false positives: many runners streaming at once, and many
//! callers of one process thinking for minutes while proofs ask their
//! peers.

use std::{collections::BTreeMap, time::Duration};

use anyhow::Context as _;

use super::{
    bed::{CheckRun, Options, RunnerSpec},
    callers::{Caller, Calls, start_caller},
    checks::{Event, Report, begin, checks, count_ok, proofs, watch},
    sockets::connections_to,
};
use crate::runner::Mode;

/// No false positives under load: `n` runners (alternately blocking and
/// tokio) streaming from the provider back to back for `length`.
pub fn load(
    opts: &Options,
    n: usize,
    length: Duration,
    say: &mut dyn FnMut(Event),
) -> anyhow::Result<Report> {
    let (mut report, mut bed) = begin(opts, "load", "load", Duration::from_millis(200))?;
    for i in 0..n {
        let mode = if i % 2 == 0 {
            Mode::Blocking
        } else {
            Mode::Tokio
        };
        let mut spec = RunnerSpec::new(&format!("r{i}"), mode);
        // 50 tokens 100 ms apart: each call streams for 5 s.
        spec.provider_path = "/v1/stream?first_ms=300&gap_ms=100&tokens=50".into();
        bed.add_runner(spec)?;
    }
    say(Event::Setup {
        what: format!("{n} runners streaming from the provider back to back for {length:?}"),
    });
    for i in 0..n {
        bed.wait_working(&format!("r{i}"), 0)?;
    }
    watch(&bed, &mut report, say, length)?;
    let mut done = 0;
    for i in 0..n {
        done += bed.row(&format!("r{i}"))?["done"].as_u64().unwrap_or(0);
    }
    report.fact("work_done", done);
    Ok(report)
}
/// No false heals at scale: one agent (an SDK runner, one process) with `n`
/// callers (`caller`: threads of the sync SDK, or tasks of one event loop),
/// each calling a model that thinks between 30 and 300 s (spread evenly;
/// every other one sends the response head only with the first token, the
/// others at once, and for an event loop with the first event too) and
/// then streams, checked every `opts.check_every` for `length`. Every provider socket's keepalive options are read before
/// the first check and again while it thinks, every 15 s (through pidfd,
/// as root): the proof must put back what it changed.
pub fn many_thinking(
    opts: &Options,
    caller: Caller,
    n: usize,
    length: Duration,
    say: &mut dyn FnMut(Event),
) -> anyhow::Result<Report> {
    use selfheal::actions::{guard::open_target, keepalive::read_keepalive};
    let name = "thinkers";
    let scenario = format!("many_thinking_{}", caller.name());
    let (mut report, mut bed) = begin(opts, &scenario, "many", Duration::from_secs(1))?;
    let provider = bed.provider();
    let models: Vec<String> = (0..n)
        .map(|i| {
            let think = 30_000 + (270_000 * i as u64) / (n.max(2) as u64 - 1);
            // Half send the response head at once, half with the first token.
            let head = match (i % 2, caller.event_loop()) {
                (0, true) => "early-first-early",
                (0, false) => "early",
                _ => "late",
            };
            format!("think-{think}-gap-100-tokens-20-head-{head}")
        })
        .collect();
    start_caller(&mut bed, name, caller, provider, "", Some(models), &[])?;
    say(Event::Setup {
        what: format!(
            "one {} SDK process, {n} callers, each calling a model that thinks 30–300 s then streams 20 tokens; a check every {} ms for {length:?}",
            caller.name(),
            opts.check_every.as_millis()
        ),
    });
    let pid = bed.pid(name)?;
    let start = selfheal::sys::pidfd::start_ticks(pid).context("the caller's start time")?;
    let baseline = bed.wait_connections(
        "every call's connection",
        Duration::from_secs(60),
        pid,
        provider,
        n,
    )?;
    let read = |fd: i32| -> anyhow::Result<selfheal_core::keepalive::KeepaliveSettings> {
        let target = open_target(pid, start)?;
        Ok(read_keepalive(&target, fd)?)
    };
    let mut before = BTreeMap::new();
    for s in &baseline {
        before.insert(s.inode, (s.fd, read(s.fd)?));
    }
    let first = before.values().map(|(_, k)| k).next();
    report.fact("keepalive_before", serde_json::to_value(first)?);
    // A socket's options are compared right after the check that put them
    // back (its `proofs` say which): between proofs they must be the
    // socket's own again. While a proof is armed they are the proof's.
    let mut compared = 0u64;
    let (mut armed, mut restored) = (0u64, 0u64);
    let mut mismatches: Vec<String> = Vec::new();
    let mut compare = |report: &mut Report, run: &CheckRun| -> anyhow::Result<()> {
        let events = proofs(run, name);
        armed += count_ok(&events, "arm");
        let back: Vec<u64> = events
            .iter()
            .filter(|e| e["action"] == "restore" && e["ok"] == true)
            .filter_map(|e| e["inode"].as_u64())
            .collect();
        restored += back.len() as u64;
        for s in connections_to(pid, provider)
            .into_iter()
            .filter(|s| back.contains(&s.inode))
        {
            let Some((fd, old)) = before.get(&s.inode) else {
                continue;
            };
            if *fd != s.fd {
                continue;
            }
            let now = read(s.fd)?;
            compared += 1;
            if now != *old {
                mismatches.push(format!("fd {fd}: before {old:?}, now {now:?}"));
            }
        }
        report.fact("keepalive_compared", compared);
        report.fact("proofs_armed", armed);
        report.fact("proofs_restored", restored);
        report.fact("keepalive_mismatches", serde_json::to_value(&mismatches)?);
        Ok(())
    };
    let mut calls = Calls::default();
    checks(&bed, &mut report, say, length, |bed, run, report, say| {
        calls.read(bed, name, None, say);
        compare(report, run)?;
        Ok(false)
    })?;
    calls.read(&bed, name, None, say);
    report.fact("calls_started", calls.started.len());
    report.fact("calls_done", calls.done);
    report.fact("calls_failed", calls.failed_total);
    report.fact("pid", pid);
    report.fact("same_pid", bed.still_runs(name, pid)?);
    Ok(report)
}
