//! The incident and its variants: the half-open attach stream, a busy
//! provider beside it, a stopped peer, a zombie leak, and a dispatch table
//! that lies.

use std::{
    net::SocketAddr,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde_json::Value;

use super::{
    bed::{ATTACH_PORT, Options, RunnerSpec},
    checks::{Event, Report, begin, checks, checks_with, is_wedged, ms_since, story, told, watch},
};
use crate::runner::Mode;

/// A provider that thinks 6 s before its first token (longer than the
/// suspect threshold of 2 s), then streams 20 tokens 100 ms apart.
pub const THINKING: &str = "/v1/stream?first_ms=6000&gap_ms=100&tokens=20";

/// Runner `name` whose provider is [`THINKING`].
fn thinking(name: &str, mode: Mode) -> RunnerSpec {
    RunnerSpec {
        provider_path: THINKING.into(),
        ..RunnerSpec::new(name, mode)
    }
}

/// The 2026-07-23 incident: a runner's attach stream goes half-open (the
/// gateway drops the flow without a FIN) while the dispatch server's table
/// keeps saying `connected`. selfheal must call it `wedged`, snapshot it,
/// heal it without a restart, and the runner must reattach and work again.
/// With `thinker`, a second runner waits on a slow provider beside it and
/// must stay `busy` (the demo runs both side by side).
pub fn incident(
    opts: &Options,
    mode: Mode,
    thinker: bool,
    say: &mut dyn FnMut(Event),
) -> anyhow::Result<Report> {
    let (mut report, mut bed) = begin(opts, "incident", "inc", Duration::from_secs(1))?;
    bed.add_runner(RunnerSpec::new("runner", mode))?;
    if thinker {
        bed.add_runner(thinking("thinker", Mode::Blocking))?;
    }
    say(Event::Setup {
        what: format!(
            "dispatch server {} (namespace {}), provider {} ({}), runners in {} (the wedging one: {}); heartbeat {} ms, a check every {} ms",
            bed.dispatch_addr(),
            bed.topo.dispatch.name,
            bed.provider_addr(),
            bed.topo.provider.name,
            bed.topo.runners.name,
            match mode {
                Mode::Blocking => "a blocking reader thread",
                Mode::Tokio => "a tokio event loop",
            },
            opts.heartbeat.as_millis(),
            opts.check_every.as_millis()
        ),
    });
    let row = bed.wait_working("runner", 1)?;
    story(&bed, "runner", say)?;
    // A first check: all is well.
    checks(
        &bed,
        &mut report,
        say,
        Duration::from_secs(1),
        |_, _, _, _| Ok(true),
    )?;

    let peer: SocketAddr = row["peer"]
        .as_str()
        .and_then(|p| p.parse().ok())
        .context("the table has no peer address for the runner")?;
    let (old_conn, done_before) = (row["conn"].as_u64(), row["done"].as_u64().unwrap_or(0));
    bed.topo.drop_flow(peer)?;
    let fault = Instant::now();
    say(Event::Fault {
        at_ms: bed.at_ms(),
        what: format!(
            "the gateway drops the attach flow {peer} ↔ {} both ways, without a FIN or RST: the stream is half-open",
            bed.dispatch_addr()
        ),
    });

    // The stories as they stood before the check that found the wedge (it
    // may heal at once): both still say all is well.
    let before = std::cell::RefCell::new(None::<Event>);
    checks_with(
        &bed,
        &mut report,
        say,
        Duration::from_secs(60),
        |run, say| {
            let wedged = run.of("runner").is_some_and(|o| o["verdict"] == "wedged");
            if let Some(e) = before.borrow_mut().take().filter(|_| wedged) {
                say(e);
            }
        },
        |bed, run, report, say| {
            let verdict = run.of("runner").map(|o| o["verdict"].clone());
            if report.detect_ms.is_none() && verdict.as_ref().is_some_and(|v| v == "wedged") {
                report.detect_ms = Some(ms_since(fault));
            }
            if report.detect_ms.is_none() {
                *before.borrow_mut() = Some(told(bed, "runner")?);
                return Ok(false);
            }
            let row = bed.row("runner")?;
            let back = row["conn"].as_u64() > old_conn
                && row["done"].as_u64().unwrap_or(0) > done_before
                && row["status"] == "connected";
            if back && report.recover_ms.is_none() {
                report.recover_ms = Some(ms_since(fault));
                story(bed, "runner", say)?;
                say(Event::Recovered {
                    agent: "runner".into(),
                    detect_ms: report.detect_ms.unwrap_or(0),
                    recover_ms: report.recover_ms.unwrap_or(0),
                });
            }
            // One more check after recovery, to see the verdict clear.
            Ok(back && verdict.is_some_and(|v| v != "wedged"))
        },
    )?;
    // The runner's pid did not change: healed, not restarted.
    report.fact(
        "runner_status",
        bed.runner_status("runner").unwrap_or(Value::Null),
    );
    report.fact("row", bed.row("runner")?);
    Ok(report)
}

/// Busy, not wedged: a provider that thinks silently longer than the
/// suspect threshold, then streams. Two think cycles; never healed.
pub fn busy_provider(opts: &Options, say: &mut dyn FnMut(Event)) -> anyhow::Result<Report> {
    let (mut report, mut bed) = begin(opts, "busy_provider", "busy", Duration::from_millis(500))?;
    bed.add_runner(thinking("thinker", Mode::Blocking))?;
    bed.add_runner(thinking("thinker-tokio", Mode::Tokio))?;
    say(Event::Setup {
        what: format!(
            "two runners (blocking, tokio) whose provider thinks 6 s before streaming; suspect after 2 s; heartbeat {} ms",
            opts.heartbeat.as_millis()
        ),
    });
    bed.wait_working("thinker", 0)?;
    watch(&bed, &mut report, say, Duration::from_secs(16))?;
    for r in ["thinker", "thinker-tokio"] {
        report.fact(&format!("{r}_done"), bed.row(r)?["done"].clone());
    }
    Ok(report)
}

/// Peer alive, application silent: the dispatch server is stopped
/// (SIGSTOP); its kernel still ACKs the heartbeats, but nothing comes back.
/// The control upstream's heartbeat rule makes the runner `wedged`, and the
/// evidence says the peer still acknowledges.
pub fn peer_stopped(opts: &Options, say: &mut dyn FnMut(Event)) -> anyhow::Result<Report> {
    let (mut report, mut bed) = begin(opts, "peer_stopped", "stop", Duration::from_secs(1))?;
    bed.add_runner(RunnerSpec::new("runner", Mode::Blocking))?;
    bed.wait_working("runner", 1)?;
    let pid = bed.dispatch_pid().context("no dispatch server")?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .context("SIGSTOP the dispatch server")?;
    let fault = Instant::now();
    say(Event::Fault {
        at_ms: bed.at_ms(),
        what: format!("the dispatch server (pid {pid}) is stopped: its kernel still ACKs"),
    });
    checks(
        &bed,
        &mut report,
        say,
        Duration::from_secs(20),
        |_, run, report, _| Ok(report.detect(run, "runner", "wedged", ms_since(fault), is_wedged)),
    )?;
    if let Some(id) = report.snapshots.last() {
        let out = Command::new(&bed.opts.selfheal)
            .envs(bed.opts.env.iter().map(|(k, v)| (*k, v)))
            .args(["snapshots", "show", id, "--json", "--dir"])
            .arg(bed.snapshot_dir())
            .output()
            .context("selfheal snapshots show")?;
        let snap: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        report.fact("snapshot", snap);
    }
    Ok(report)
}

/// A zombie leak: a runner as PID 1 of its namespace starts a child every
/// 100 ms and never reaps one. It must turn `degraded` with the
/// missing-init diagnosis long before it reaches `limit` zombies.
pub fn zombie_leak(
    opts: &Options,
    limit: u32,
    say: &mut dyn FnMut(Event),
) -> anyhow::Result<Report> {
    let (mut report, mut bed) = begin(opts, "zombie_leak", "zmb", Duration::from_secs(1))?;
    let mut spec = RunnerSpec::new("pid1", Mode::Blocking);
    spec.leak_every = Some(Duration::from_millis(100));
    spec.thresholds = "zombies = 10".into();
    bed.add_runner(spec)?;
    say(Event::Setup {
        what: format!(
            "a runner as PID 1 of its pid namespace, leaking a zombie every 100 ms; threshold 10, limit {limit}"
        ),
    });
    checks(
        &bed,
        &mut report,
        say,
        Duration::from_secs(20),
        |_, run, report, _| {
            let Some(o) = run.of("pid1").filter(|o| o["verdict"] == "degraded") else {
                return Ok(false);
            };
            report.fact("degraded", o.clone());
            Ok(true)
        },
    )?;
    Ok(report)
}

/// The table lies: the runner's control connection is gone (destroyed, and
/// the way to the server's attach port blocked, so it cannot reattach and
/// the server never hears of it), while the server's HTTP view — the
/// agent's probe here — still says `connected`.
pub fn table_lies(opts: &Options, say: &mut dyn FnMut(Event)) -> anyhow::Result<Report> {
    let (mut report, mut bed) = begin(opts, "table_lies", "tbl", Duration::from_secs(1))?;
    let mut spec = RunnerSpec::new("runner", Mode::Tokio);
    spec.probe_table = true;
    bed.add_runner(spec)?;
    bed.wait_working("runner", 1)?;
    bed.topo.drop_port(ATTACH_PORT)?;
    // The runner's socket dies where only the runner sees it.
    let out = bed
        .topo
        .runners
        .command(Path::new("ss"))
        .args(["-K", "dst"])
        .arg(bed.topo.dispatch_ip.to_string())
        .args(["dport", "=", &ATTACH_PORT.to_string()])
        .output()
        .context("cannot run ss -K (Debian package iproute2)")?;
    if !out.status.success() {
        bail!("ss -K: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let fault = Instant::now();
    say(Event::Fault {
        at_ms: bed.at_ms(),
        what: "the runner's control socket is destroyed and the attach port blocked; the server never hears".into(),
    });
    checks(
        &bed,
        &mut report,
        say,
        Duration::from_secs(20),
        |bed, run, report, _| {
            let contradicts = |o: &Value| {
                o["reasons"]
                    .to_string()
                    .contains("status_contradicts_kernel")
            };
            if !report.detect(run, "runner", "wedged", ms_since(fault), contradicts) {
                return Ok(false);
            }
            report.fact("row", bed.row("runner")?);
            Ok(true)
        },
    )?;
    Ok(report)
}
