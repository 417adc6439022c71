//! Cuts that are not a lone caller's: behind a local proxy, of an idle
//! pooled connection, of a connect that never completes, and of one
//! HTTP/2 connection carrying many calls.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use serde_json::Value;

use super::{
    bed::Options,
    callers::{
        CallLine, Caller, FAST_MODEL, NEVER_MODEL, count, read_calls, sdk_path, sdk_runner,
        start_caller, wait_calls,
    },
    checks::{Event, Report, begin, checks, has_reason, is_wedged, ms_since, set_up, watch},
    silent::{Cut, cut_while_thinking, finish_calls},
    sockets::{connections_to, tcp_sockets},
};

/// Where `proxy_cut`'s local proxy listens (runners' namespace).
pub(super) const PROXY_PORT: u16 = 18443;

/// One hop: the caller (the openai SDK) talks to a local TCP proxy on
/// loopback, the proxy to the provider; the proxy→provider flow is cut
/// while the LLM thinks. The proxy's kernel answers the proof keepalive's
/// probes, so the proof says alive and the verdict must never be `wedged`;
/// the provider upstream's `max_silence = "8s"` must make it
/// `unresponsive` (`silence_exceeded`) instead.
pub fn proxy_cut(opts: &Options, say: &mut dyn FnMut(Event)) -> anyhow::Result<Report> {
    let name = "caller";
    let (mut report, mut bed) = begin(opts, "proxy_cut", "pxy", Duration::from_millis(500))?;
    let provider = bed.provider();
    let proxy = SocketAddr::from(([127, 0, 0, 1], PROXY_PORT));
    let mut cmd = bed.topo.runners.command(&bed.opts.testbed);
    cmd.args(["proxy", "--listen"])
        .arg(proxy.to_string())
        .arg("--upstream")
        .arg(provider.to_string());
    bed.spawn("proxy", cmd, None)?;
    bed.expect_line("proxy", "listening", Duration::from_secs(10))?;
    let max_silence = "max_silence = \"8s\"\n";
    start_caller(
        &mut bed,
        name,
        Caller::OpenAi,
        proxy,
        max_silence,
        None,
        &[],
    )?;
    set_up(
        &bed,
        say,
        format!(
            "caller openai → proxy {proxy} → provider {provider}, a model that thinks 600 s; max_silence 8 s, suspect after 2 s"
        ),
    );
    let pid = bed.pid(name)?;
    let holder = bed.pid("proxy")?;
    let Cut {
        at: fault,
        mut calls,
    } = cut_while_thinking(&mut bed, &mut report, name, pid, holder, provider, say)?;
    let mut after = 0;
    checks(
        &bed,
        &mut report,
        say,
        Duration::from_secs(30),
        |bed, run, report, say| {
            calls.read(bed, name, Some(fault), say);
            if run.of(name).is_none() {
                return Ok(false);
            }
            let unresponsive =
                |o: &Value| o["verdict"] == "unresponsive" && has_reason(o, "silence_exceeded");
            // A few more checks: it must not turn `wedged` later either.
            if report.detect(run, name, "unresponsive", ms_since(fault), unresponsive) {
                after += 1;
            }
            Ok(after > 3)
        },
    )?;
    finish_calls(&mut bed, &mut report, name, pid, &calls, fault)?;
    Ok(report)
}

/// An idle pooled connection whose peer is cut: the sync openai SDK makes a
/// call that answers at once (not streamed: the SDK closes a streamed
/// answer's connection at `[DONE]`), then pauses 20 s with its connection
/// idle in its pool, and the flow is cut 1 s into the pause. Nobody waits on it, so
/// the proof's answer decides alone: `idle_connection_dead` (degraded, not
/// wedged), a snapshot, and the connection ended before the next call,
/// which goes out on a fresh connection and completes at once.
pub fn pooled_cut(opts: &Options, say: &mut dyn FnMut(Event)) -> anyhow::Result<Report> {
    let name = "pooled";
    let (mut report, mut bed) = begin(opts, "pooled_cut", "pool", Duration::from_millis(500))?;
    let provider = bed.provider();
    start_caller(
        &mut bed,
        name,
        Caller::OpenAi,
        provider,
        "",
        Some(vec![format!("{FAST_MODEL}-pool")]),
        &["--whole", "--pause-ms", "20000"],
    )?;
    set_up(
        &bed,
        say,
        format!(
            "the openai SDK calls {provider} with a model that answers at once, then pauses 20 s with its connection idle in its pool; suspect after 2 s"
        ),
    );
    let pid = bed.pid(name)?;
    let mut lines: Vec<CallLine> = Vec::new();
    wait_calls(&bed, "the first call done", name, &mut lines, say, |l| {
        count(l, CallLine::is_done) > 0
    })?;
    let flows = bed.wait_connection("the pooled connection", pid, provider)?;
    std::thread::sleep(Duration::from_secs(1));
    let (cut, locals) = bed.cut_provider_flows(&flows)?;
    report.fact("cut", serde_json::to_value(&flows)?);
    say(Event::Fault {
        at_ms: bed.at_ms(),
        what: format!(
            "the gateway drops the idle pooled flow(s) {locals} ↔ {provider} both ways, without a FIN or RST"
        ),
    });
    let done_before = count(&lines, CallLine::is_done);
    let (mut next_start, mut next_done): (Option<u64>, Option<u64>) = (None, None);
    let mut next_local: Option<String> = None;
    checks(
        &bed,
        &mut report,
        say,
        Duration::from_secs(40),
        |bed, run, report, say| {
            let at = ms_since(cut);
            report.detect(run, name, "ended", at, |o| {
                has_reason(o, "idle_connection_dead")
            });
            let seen = read_calls(bed, name, &mut lines, say);
            for l in &lines[seen..] {
                match l {
                    CallLine::Start(_) if next_start.is_none() => next_start = Some(at),
                    CallLine::Done(..)
                        if next_done.is_none()
                            && count(&lines, CallLine::is_done) > done_before =>
                    {
                        next_done = Some(at)
                    }
                    _ => {}
                }
            }
            if next_start.is_some() && next_local.is_none() {
                next_local = connections_to(pid, provider)
                    .first()
                    .map(|s| s.local.to_string());
            }
            Ok(next_done.is_some())
        },
    )?;
    report.fact("calls_failed", count(&lines, CallLine::is_failed));
    report.fact_if("next_call_started_ms", next_start);
    if let Some(ms) = next_done {
        report.next_call_done(ms);
    }
    report.fact(
        "next_call_local",
        next_local.map_or(Value::Null, Into::into),
    );
    report.fact("pid", pid);
    report.fact("same_pid", bed.still_runs(name, pid)?);
    Ok(report)
}

/// A connect that never completes: the provider's SYNs go unanswered from
/// the start, and `litellm.acompletion` (which waits out the kernel's SYN
/// retries, about 130 s) calls it. The upstream's `connect_timeout = "3s"`
/// must make it `unresponsive` (`connect_timeout`), the heal end the
/// attempt so the caller's connect fails now (its own error path, same
/// pid); then the provider answers again and the next call completes.
pub fn hanging_connect(opts: &Options, say: &mut dyn FnMut(Event)) -> anyhow::Result<Report> {
    let name = "connecting";
    let (mut report, mut bed) = begin(opts, "hanging_connect", "syn", Duration::from_millis(500))?;
    let provider = bed.provider();
    bed.topo.drop_provider_syns(provider.port())?;
    let fault = Instant::now();
    say(Event::Fault {
        at_ms: bed.at_ms(),
        what: format!("the provider {provider} answers no new connection (its SYNs dropped)"),
    });
    let connect_timeout = "connect_timeout = \"3s\"\n";
    let models = Some(vec![FAST_MODEL.into()]);
    start_caller(
        &mut bed,
        name,
        Caller::Litellm,
        provider,
        connect_timeout,
        models,
        &[],
    )?;
    set_up(
        &bed,
        say,
        format!("litellm calls {provider}; connect_timeout 3 s"),
    );
    let pid = bed.pid(name)?;
    let mut lines: Vec<CallLine> = Vec::new();
    let (mut started, mut failed, mut done): (Option<u64>, Option<(u64, String)>, Option<u64>) =
        (None, None, None);
    let mut syn_sent: Option<u64> = None;
    let mut answering = false;
    checks(
        &bed,
        &mut report,
        say,
        Duration::from_secs(60),
        |bed, run, report, say| {
            let at = ms_since(fault);
            if syn_sent.is_none()
                && tcp_sockets(pid)
                    .unwrap_or_default()
                    .iter()
                    .any(|s| s.remote == provider && s.state == 2)
            {
                syn_sent = Some(at);
            }
            report.detect(run, name, "unresponsive", at, |o| {
                has_reason(o, "connect_timeout")
            });
            read_calls(bed, name, &mut lines, say);
            for l in &lines {
                match l {
                    CallLine::Start(_) if started.is_none() => started = Some(at),
                    CallLine::Failed(_, e) if failed.is_none() => failed = Some((at, e.clone())),
                    CallLine::Done(..) if done.is_none() => done = Some(at),
                    _ => {}
                }
            }
            // Once the attempt has failed, the provider answers again.
            if failed.is_some() && !answering {
                bed.topo.answer_provider_syns(provider.port())?;
                answering = true;
            }
            Ok(done.is_some())
        },
    )?;
    if !answering {
        bed.topo.answer_provider_syns(provider.port())?;
    }
    report.fact_if("syn_sent_seen_ms", syn_sent);
    report.fact_if("call_started_ms", started);
    if let Some((ms, e)) = failed {
        report.fact("call_failed_ms", ms);
        report.fact("call_failed_error", e);
    }
    if let Some(ms) = done {
        report.next_call_done(ms);
    }
    report.fact("same_pid", bed.still_runs(name, pid)?);
    Ok(report)
}

/// Where the HTTP/2 provider listens (the provider's namespace).
pub(super) const H2_PROVIDER_PORT: u16 = 8444;

/// One connection, many calls: `AsyncOpenAI` over HTTP/2 (httpx, prior
/// knowledge) makes `calls` concurrent streaming calls, all on one
/// connection to an HTTP/2 provider (`tests/py/h2_provider.py`) that sends
/// each head and first event at once and then thinks 600 s; the flow is cut
/// while they think. The proof is of the connection: one proof keepalive,
/// `wedged`, and every call on it fails in the SDK, same pid; the next ones
/// (on a fresh connection) complete.
pub fn http2_cut(
    opts: &Options,
    calls: usize,
    say: &mut dyn FnMut(Event),
) -> anyhow::Result<Report> {
    let name = "multiplexed";
    let (mut report, mut bed) = begin(opts, "http2_cut", "h2", Duration::from_millis(500))?;
    let (python, _) = sdk_runner()?;
    let provider = SocketAddr::from((bed.topo.provider_ip, H2_PROVIDER_PORT));
    let mut cmd = bed.topo.provider.command(&python);
    cmd.arg(sdk_path("py/h2_provider.py"))
        .args(["--listen", &provider.to_string()]);
    bed.spawn("h2provider", cmd, None)?;
    bed.expect_line("h2provider", "listening", Duration::from_secs(30))?;
    let models = Some(vec![format!("{NEVER_MODEL}-first-early"); calls]);
    let http2 = ["--http2", "--then-model", FAST_MODEL];
    start_caller(
        &mut bed,
        name,
        Caller::AsyncOpenAi,
        provider,
        "",
        models,
        &http2,
    )?;
    set_up(
        &bed,
        say,
        format!(
            "AsyncOpenAI over HTTP/2 makes {calls} concurrent calls to {provider}, each thinking 600 s after its head and first event; suspect after 2 s"
        ),
    );
    let pid = bed.pid(name)?;
    let mut lines: Vec<CallLine> = Vec::new();
    wait_calls(&bed, "every call thinking", name, &mut lines, say, |l| {
        let thinking = bed
            .lines("h2provider")
            .unwrap_or_default()
            .iter()
            .filter(|l| l.starts_with("call "))
            .count();
        count(l, CallLine::is_start) >= calls && thinking > 0
    })?;
    std::thread::sleep(Duration::from_millis(500));
    let flows = connections_to(pid, provider);
    report.fact("connections", flows.len());
    watch(&bed, &mut report, say, Duration::from_millis(1000))?;
    let (cut, locals) = bed.cut_provider_flows(&flows)?;
    say(Event::Fault {
        at_ms: bed.at_ms(),
        what: format!(
            "the gateway drops the one HTTP/2 flow {locals} ↔ {provider} both ways, without a FIN or RST, while {calls} calls think"
        ),
    });
    let (mut failed_at, mut done_after): (Vec<u64>, Option<u64>) = (Vec::new(), None);
    checks(
        &bed,
        &mut report,
        say,
        Duration::from_secs(60),
        |bed, run, report, say| {
            let at = ms_since(cut);
            report.detect(run, name, "wedged", at, is_wedged);
            let seen = read_calls(bed, name, &mut lines, say);
            for l in &lines[seen..] {
                match l {
                    CallLine::Failed(..) => failed_at.push(at),
                    CallLine::Done(..) if done_after.is_none() => done_after = Some(at),
                    _ => {}
                }
            }
            Ok(failed_at.len() >= calls && done_after.is_some())
        },
    )?;
    report.fact("calls_failed", failed_at.len());
    if let (Some(first), Some(last)) = (failed_at.first(), failed_at.last()) {
        report.fact("first_failed_ms", *first);
        report.fact("last_failed_ms", *last);
    }
    if let Some(ms) = done_after {
        report.next_call_done(ms);
    }
    report.fact("same_pid", bed.still_runs(name, pid)?);
    Ok(report)
}
