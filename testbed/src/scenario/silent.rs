//! Silent calls: a caller's provider flow cut while the LLM thinks, found
//! only by the proof; and a live call that thinks, which the proof must
//! leave alone.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use super::{
    bed::{Bed, Options},
    callers::{CallLine, Caller, Calls, start_caller, start_caller_with},
    checks::{Event, Report, checks},
    cuts::PROXY_PORT,
    sockets::{connections_to, waits},
};

/// The silent call: caller `caller` waits for an LLM that never answers;
/// 1 s into the wait the gateway drops the provider flow both ways without
/// a FIN or RST. Only the proof can tell: a live peer would ACK the proof
/// keepalive's probes, a dead one does not. selfheal must call it
/// `wedged`, heal it so that the caller's own call fails (same process),
/// and the caller's next call must start and complete.
pub fn silent_cut(
    opts: &Options,
    caller: Caller,
    say: &mut dyn FnMut(Event),
) -> anyhow::Result<Report> {
    silent_cut_of(opts, caller, None, say)
}

/// [`silent_cut`] with the SDK caller's first call on `model` (how the
/// provider paces its head and first event: [`Pacing`](crate::provider::Pacing)),
/// named after it.
pub fn silent_cut_of(
    opts: &Options,
    caller: Caller,
    model: Option<&str>,
    say: &mut dyn FnMut(Event),
) -> anyhow::Result<Report> {
    let name = "caller";
    let mut report = Report::new(&match model {
        None => format!("silent_cut_{}", caller.name()),
        Some(m) => format!("silent_cut_{}_{m}", caller.name()),
    });
    let mut bed = Bed::new(opts, "sil", Duration::from_millis(500))?;
    let provider = bed.provider();
    start_caller(
        &mut bed,
        name,
        caller,
        provider,
        "",
        model.map(|m| vec![m.to_string()]),
    )?;
    say(Event::Setup {
        what: format!(
            "caller {} calls the provider {provider} with a model that thinks 600 s; suspect after 2 s, proof keepalive 1 s idle + 3 × 1 s; a check every {} ms",
            caller.name(),
            opts.check_every.as_millis()
        ),
    });
    let pid = bed.pid(name)?;
    let cut = cut_while_thinking(&mut bed, &mut report, name, pid, pid, provider, say)?;
    let mut calls = cut.calls;
    let fault = cut.at;
    checks(
        &bed,
        &mut report,
        say,
        Duration::from_secs(60),
        |bed, run, report, say| {
            let verdict = run.of(name).map(|o| o["verdict"].clone());
            if report.detect_ms.is_none() && verdict.as_ref().is_some_and(|v| v == "wedged") {
                report.detect_ms = Some(fault.elapsed().as_millis() as u64);
                if let Some(o) = run.of(name) {
                    report.facts.insert("wedged".into(), o.clone());
                }
            }
            calls.read(bed, name, Some(fault), say);
            Ok(calls.failed.is_some() && calls.next_done.is_some())
        },
    )?;
    finish_calls(&mut bed, &mut report, name, pid, &calls, fault)?;
    Ok(report)
}

/// What [`cut_while_thinking`] did.
pub(super) struct Cut {
    pub(super) at: Instant,
    pub(super) calls: Calls,
}

/// Waits for `caller`'s call to be in flight, checks for about a second,
/// then drops every established flow of `holder` (the caller, or a proxy
/// in front of it) to `remote`. Records the verdicts before the cut, what
/// the caller waits in, and the flows cut.
pub(super) fn cut_while_thinking(
    bed: &mut Bed,
    report: &mut Report,
    caller: &str,
    pid: u32,
    holder: u32,
    remote: SocketAddr,
    say: &mut dyn FnMut(Event),
) -> anyhow::Result<Cut> {
    let mut calls = Calls::default();
    bed.wait("the caller's first call", Duration::from_secs(30), || {
        calls.read(bed, caller, None, say);
        Ok(calls.started.first().cloned())
    })?;
    calls.cut = calls.started.first().cloned();
    let flows = bed.wait("the provider connection", Duration::from_secs(10), || {
        let c = connections_to(holder, remote);
        Ok((!c.is_empty()).then_some(c))
    })?;
    // About a second of checks while the call is in flight, before the cut.
    checks(
        bed,
        report,
        say,
        Duration::from_millis(1000),
        |_, _, _, _| Ok(false),
    )?;
    report.facts.insert(
        "verdicts_before_cut".into(),
        serde_json::to_value(report.verdicts.get(caller).cloned().unwrap_or_default())?,
    );
    let fds: Vec<i32> = connections_to(
        pid,
        if pid == holder {
            remote
        } else {
            SocketAddr::from(([127, 0, 0, 1], PROXY_PORT))
        },
    )
    .iter()
    .map(|s| s.fd)
    .collect();
    report
        .facts
        .insert("waits".into(), serde_json::to_value(waits(pid, &fds))?);
    // The caller's own keepalive options on its provider socket (the
    // anthropic SDK sets SO_KEEPALIVE itself), before any proof.
    if let (Some(&fd), Some(start)) = (fds.first(), selfheal::pidfd::start_ticks(pid)) {
        let ka = selfheal::actions::guard::open_target(pid, start)
            .and_then(|t| selfheal::actions::keepalive::read_keepalive(&t, fd));
        report.facts.insert(
            "caller_keepalive".into(),
            match ka {
                Ok(k) => serde_json::to_value(k)?,
                Err(e) => e.to_string().into(),
            },
        );
    }
    for f in &flows {
        bed.topo.drop_provider_flow(f.local)?;
    }
    let at = Instant::now();
    report
        .facts
        .insert("cut".into(), serde_json::to_value(&flows)?);
    say(Event::Fault {
        at_ms: bed.at_ms(),
        what: format!(
            "the gateway drops the provider flow(s) {} ↔ {remote} both ways, without a FIN or RST, while the LLM thinks",
            flows
                .iter()
                .map(|f| f.local.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    });
    Ok(Cut { at, calls })
}

/// Records what the caller's calls did after the cut, and that it is the
/// same process.
pub(super) fn finish_calls(
    bed: &mut Bed,
    report: &mut Report,
    name: &str,
    pid: u32,
    calls: &Calls,
    fault: Instant,
) -> anyhow::Result<()> {
    if let Some((id, e, ms)) = &calls.failed {
        report.facts.insert("call_failed_ms".into(), (*ms).into());
        report
            .facts
            .insert("call_failed_error".into(), e.clone().into());
        report
            .facts
            .insert("call_failed_id".into(), id.clone().into());
    }
    if let Some((id, ms)) = &calls.next_started {
        report
            .facts
            .insert("next_call_started_ms".into(), (*ms).into());
        report
            .facts
            .insert("next_call_id".into(), id.clone().into());
    }
    if let Some((_, tokens, ms)) = &calls.next_done {
        report
            .facts
            .insert("next_call_done_ms".into(), (*ms).into());
        report
            .facts
            .insert("next_call_tokens".into(), (*tokens).into());
        if report.recover_ms.is_none() {
            report.recover_ms = Some(*ms);
        }
    }
    report.facts.insert("pid".into(), pid.into());
    let same = bed.running(name)? && bed.pid(name)? == pid;
    report.facts.insert("same_pid".into(), same.into());
    report
        .facts
        .insert("ran_ms".into(), (fault.elapsed().as_millis() as u64).into());
    Ok(())
}

/// A live call that thinks: `caller` calls a provider that sends the head
/// and first event at once (300 ms after the request), thinks 15 s, then
/// streams 20 tokens; a check every `opts.check_every` until the call is
/// done. Proof keepalives ask the peer while it thinks (it answers); the
/// call must never be `wedged`, never healed, and complete with its tokens.
pub fn thinking(
    opts: &Options,
    caller: Caller,
    say: &mut dyn FnMut(Event),
) -> anyhow::Result<Report> {
    let name = "thinker";
    let mut report = Report::new(&format!("thinking_{}", caller.name()));
    let mut bed = Bed::new(opts, "thk", Duration::from_millis(500))?;
    let provider = bed.provider();
    start_caller_with(
        &mut bed,
        name,
        caller,
        provider,
        "",
        Some(vec![
            "think-15000-gap-100-tokens-20-first-early-lag-300".into(),
        ]),
        &[],
    )?;
    say(Event::Setup {
        what: format!(
            "caller {} calls {provider}: head and first event at once, 15 s of thinking, then 20 tokens; a check every {} ms",
            caller.name(),
            opts.check_every.as_millis()
        ),
    });
    let mut done: Option<u64> = None;
    let mut failed: Option<String> = None;
    let mut armed = 0u64;
    let start = Instant::now();
    checks(
        &bed,
        &mut report,
        say,
        Duration::from_secs(60),
        |bed, run, _, say| {
            armed += run
                .of(name)
                .and_then(|o| o["proofs"].as_array().cloned())
                .unwrap_or_default()
                .iter()
                .filter(|e| e["action"] == "arm" && e["ok"] == true)
                .count() as u64;
            for line in bed.lines(name).unwrap_or_default() {
                say(Event::Note {
                    at_ms: bed.at_ms(),
                    text: format!("{name}: {line}"),
                });
                match CallLine::parse(&line) {
                    Some(CallLine::Done(_, tokens)) if done.is_none() => done = Some(tokens),
                    Some(CallLine::Failed(_, e)) => failed = Some(e),
                    _ => {}
                }
            }
            Ok(done.is_some() || failed.is_some())
        },
    )?;
    report.facts.insert("proofs_armed".into(), armed.into());
    if let Some(t) = done {
        report.facts.insert("tokens".into(), t.into());
    }
    if let Some(e) = failed {
        report.facts.insert("failed".into(), e.into());
    }
    report
        .facts
        .insert("ran_ms".into(), (start.elapsed().as_millis() as u64).into());
    Ok(report)
}
