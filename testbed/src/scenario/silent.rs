//! Silent calls: a caller's provider flow cut while the LLM thinks, found
//! only by the proof; and a live call that thinks, which the proof must
//! leave alone.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use super::{
    bed::{Bed, Options},
    callers::{CallLine, Caller, Calls, start_caller},
    checks::{Event, Report, begin, checks, count_ok, is_wedged, ms_since, proofs, set_up, watch},
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
    let scenario = match model {
        None => format!("silent_cut_{}", caller.name()),
        Some(m) => format!("silent_cut_{}_{m}", caller.name()),
    };
    let (mut report, mut bed) = begin(opts, &scenario, "sil", Duration::from_millis(500))?;
    let provider = bed.provider();
    let models = model.map(|m| vec![m.to_string()]);
    start_caller(&mut bed, name, caller, provider, "", models, &[])?;
    set_up(
        &bed,
        say,
        format!(
            "caller {} calls the provider {provider} with a model that thinks 600 s; suspect after 2 s, proof keepalive 1 s idle + 3 × 1 s",
            caller.name(),
        ),
    );
    let pid = bed.pid(name)?;
    let Cut {
        at: fault,
        mut calls,
    } = cut_while_thinking(&mut bed, &mut report, name, pid, pid, provider, say)?;
    checks(
        &bed,
        &mut report,
        say,
        Duration::from_secs(60),
        |bed, run, report, say| {
            report.detect(run, name, "wedged", ms_since(fault), is_wedged);
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
    // The connection follows the call's start as soon as the client and
    // the machine allow (litellm imports its provider code in its first
    // call): given 10 s, or as long as this run took from the bed's start
    // to that call if longer (38 s once, at a load of 10 on 2 cores).
    let pace = Duration::from_millis(bed.at_ms()).max(Duration::from_secs(10));
    let flows = bed.wait_connections("the provider connection", pace, holder, remote, 1)?;
    // About a second of checks while the call is in flight, before the cut.
    watch(bed, report, say, Duration::from_millis(1000))?;
    let before = report.verdicts.get(caller).cloned().unwrap_or_default();
    report.fact("verdicts_before_cut", serde_json::to_value(before)?);
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
    report.fact("waits", serde_json::to_value(waits(pid, &fds))?);
    // The caller's own keepalive options on its provider socket (the
    // anthropic SDK sets SO_KEEPALIVE itself), before any proof.
    if let (Some(&fd), Some(start)) = (fds.first(), selfheal::sys::pidfd::start_ticks(pid)) {
        let ka = selfheal::actions::guard::open_target(pid, start)
            .and_then(|t| selfheal::actions::keepalive::read_keepalive(&t, fd));
        let ka = match ka {
            Ok(k) => serde_json::to_value(k)?,
            Err(e) => e.to_string().into(),
        };
        report.fact("caller_keepalive", ka);
    }
    let (at, locals) = bed.cut_provider_flows(&flows)?;
    report.fact("cut", serde_json::to_value(&flows)?);
    say(Event::Fault {
        at_ms: bed.at_ms(),
        what: format!(
            "the gateway drops the provider flow(s) {locals} ↔ {remote} both ways, without a FIN or RST, while the LLM thinks"
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
        report.fact("call_failed_ms", *ms);
        report.fact("call_failed_error", e.clone());
        report.fact("call_failed_id", id.clone());
    }
    if let Some((id, ms)) = &calls.next_started {
        report.fact("next_call_started_ms", *ms);
        report.fact("next_call_id", id.clone());
    }
    if let Some((_, tokens, ms)) = &calls.next_done {
        report.next_call_done(*ms);
        report.fact("next_call_tokens", *tokens);
    }
    report.fact("pid", pid);
    report.fact("same_pid", bed.still_runs(name, pid)?);
    report.fact("ran_ms", ms_since(fault));
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
    let scenario = format!("thinking_{}", caller.name());
    let (mut report, mut bed) = begin(opts, &scenario, "thk", Duration::from_millis(500))?;
    let provider = bed.provider();
    let models = vec!["think-15000-gap-100-tokens-20-first-early-lag-300".into()];
    start_caller(&mut bed, name, caller, provider, "", Some(models), &[])?;
    set_up(
        &bed,
        say,
        format!(
            "caller {} calls {provider}: head and first event at once, 15 s of thinking, then 20 tokens",
            caller.name(),
        ),
    );
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
            armed += count_ok(&proofs(run, name), "arm");
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
    report.fact("proofs_armed", armed);
    report.fact_if("tokens", done);
    report.fact_if("failed", failed);
    report.fact("ran_ms", ms_since(start));
    Ok(report)
}
