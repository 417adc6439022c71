//! `selfheal-testbed demo` (`cargo xtask demo`): the 2026-07-23 incident
//! replayed on this machine, beside a runner that is merely busy, narrated as
//! it happens (see [`selfheal_testbed`]). It runs the real `selfheal` binary for
//! the helper and the checks, as a user would.

use std::{path::PathBuf, process::ExitCode, sync::atomic::Ordering, time::Duration};

use anyhow::bail;
use selfheal_testbed::{
    runner::Mode,
    scenario::{self, Caller, Event, Options, Report, Verdict},
};
use serde_json::Value;

/// Replay the 2026-07-23 incident on this machine and watch selfheal find
/// and heal it (needs root).
///
/// In temporary network namespaces: a dispatch server, an LLM provider and
/// two runners; the
/// gateway silently drops one runner's attach stream (half-open, no FIN)
/// while the other waits on a provider that thinks. Watch `selfheal check`
/// (through a `selfheal helper`) tell the wedged runner from the busy one,
/// snapshot it, heal it without a restart, and see it back at work. Then a
/// second scene: an asyncio agent (the official openai SDK's `AsyncOpenAI`)
/// whose provider sent the response head and first event at once, then
/// thinks, cut while it thinks: nothing shows a call in flight, and the
/// proof keepalive finds it dead all the same. Needs
/// root (network namespaces, nftables, the helper); cleans up everything it
/// made, also on Ctrl-C. Exit 0 when the incident was healed and the busy
/// runner left alone. The `selfheal` it runs is the one beside this program
/// (`target/<profile>/selfheal`), or `$SELFHEAL_BIN`.
#[derive(clap::Args)]
pub struct Args {
    /// Print one JSON object per event, then a summary object.
    #[arg(long)]
    json: bool,
    /// The runners' heartbeat (the control upstream's in the config).
    #[arg(long, value_name = "DUR", value_parser = crate::parse_duration, default_value = "1s")]
    heartbeat: Duration,
    /// How often `selfheal check` runs, as a timer would run it.
    #[arg(long, value_name = "DUR", value_parser = crate::parse_duration, default_value = "1s")]
    check_every: Duration,
    /// The wedging runner's flavour: a blocking reader thread or a tokio
    /// event loop.
    #[arg(long, value_enum, default_value_t = Mode::Blocking)]
    mode: Mode,
    /// Keep the run's forensic snapshots in DIR (otherwise removed with
    /// everything else), for `selfheal snapshots show ID --dir DIR`.
    #[arg(long, value_name = "DIR")]
    keep_snapshots: Option<std::path::PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "selfheal demo needs root: it makes network namespaces, veth links and nftables rules, \
             and runs the privileged helper. Run it with sudo."
        );
    }
    for (tool, package) in [("ip", "iproute2"), ("nft", "nftables"), ("ss", "iproute2")] {
        if !on_path(tool) {
            bail!("selfheal demo needs `{tool}` (Debian package {package})");
        }
    }
    for (what, d) in [
        ("--heartbeat", args.heartbeat),
        ("--check-every", args.check_every),
    ] {
        if d < Duration::from_millis(100) || d > Duration::from_secs(60) {
            bail!("{what} {d:?}: give a duration from 100ms to 60s");
        }
    }
    let testbed = std::env::current_exe()?;
    let selfheal = selfheal_binary(&testbed)?;
    install_stop_handler()?;
    let opts = Options {
        selfheal,
        testbed,
        heartbeat: args.heartbeat,
        check_every: args.check_every,
        net: (std::process::id() % 250 + 1) as u8,
        keep_snapshots: args.keep_snapshots.clone(),
        env: Vec::new(),
        check_args: Vec::new(),
    };
    let json = args.json;
    if !json {
        println!(
            "selfheal demo — the 2026-07-23 incident, replayed. A runner attached to its dispatch \
             server with no keepalive;\nthe gateway is about to drop its stream without a FIN. \
             Beside it, a runner waits on a provider that thinks for 6 s.\n"
        );
    }
    let mut say = |e: Event| {
        if json {
            println!("{}", serde_json::to_string(&e).unwrap_or_default());
        } else {
            narrate(&e);
        }
    };
    let report = match scenario::incident(&opts, args.mode, true, &mut say) {
        Ok(r) => r,
        Err(e) if scenario::STOP.load(Ordering::Relaxed) => {
            eprintln!("selfheal demo: interrupted; everything it made is removed");
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    if !json {
        println!(
            "\nSecond scene: an asyncio agent (the official openai SDK's AsyncOpenAI) calls a provider \
             that sends the response head and first event at once, then thinks;\nthe gateway drops \
             the flow while it thinks. Its event loop waits in epoll_wait, and it says nothing of its calls.\n"
        );
    }
    // Its snapshots are kept beside the incident's, in a directory of their
    // own (the log's file names are the same).
    let scene_opts = Options {
        selfheal: opts.selfheal.clone(),
        testbed: opts.testbed.clone(),
        keep_snapshots: opts.keep_snapshots.as_ref().map(|d| d.join("event-loop")),
        env: opts.env.clone(),
        check_args: opts.check_args.clone(),
        ..opts
    };
    let scene = match scenario::silent_cut(&scene_opts, Caller::AsyncOpenAi, &mut say) {
        Ok(r) => r,
        Err(e) if scenario::STOP.load(Ordering::Relaxed) => {
            eprintln!("selfheal demo: interrupted; everything it made is removed");
            return Err(e);
        }
        Err(e) => return Err(e.context("the second scene (an asyncio agent) could not run")),
    };
    let ok = verdict_of_demo(&report).and_then(|()| verdict_of_scene(&scene));
    if json {
        let mut v = serde_json::to_value(&report)?;
        v["event"] = "summary".into();
        v["ok"] = ok.is_ok().into();
        v["event_loop_scene"] = serde_json::to_value(&scene)?;
        println!("{v}");
    } else {
        summary(&report, &opts, &ok);
        scene_summary(&scene);
        if let (Some(dir), Some(id)) = (&args.keep_snapshots, report.snapshots.first()) {
            println!(
                "the snapshots are kept: selfheal snapshots show {id} --dir {}",
                dir.display()
            );
        }
        if let (Some(dir), Some(id)) = (&scene_opts.keep_snapshots, scene.snapshots.first()) {
            println!(
                "the asyncio agent's: selfheal snapshots show {id} --dir {}",
                dir.display()
            );
        }
    }
    Ok(if ok.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Whether the demo showed what it should: the incident detected and
/// recovered, the thinker never wedged nor healed.
fn verdict_of_demo(r: &Report) -> Result<(), String> {
    if r.detect_ms.is_none() {
        return Err("the half-open runner was not found wedged".into());
    }
    if r.recover_ms.is_none() {
        return Err("the runner did not get back to work".into());
    }
    let bad = r.verdicts_outside("thinker", &["busy", "idle", "healthy"]);
    if !bad.is_empty() {
        return Err(format!("the busy runner was judged {bad:?}"));
    }
    if r.heals.iter().any(|h| h.starts_with("thinker:")) {
        return Err("the busy runner was healed".into());
    }
    Ok(())
}

/// Whether the second scene showed what it should: the asyncio agent's cut
/// call proven dead, failed inside its SDK, and its next call done, same pid.
fn verdict_of_scene(r: &Report) -> Result<(), String> {
    if r.detect_ms.is_none() {
        return Err("the asyncio agent's cut call was not found wedged".into());
    }
    if !r.facts.contains_key("call_failed_ms") || !r.facts.contains_key("next_call_done_ms") {
        return Err("the asyncio agent's call did not fail and come back".into());
    }
    if r.facts.get("same_pid") != Some(&Value::Bool(true)) {
        return Err("the asyncio agent was restarted".into());
    }
    Ok(())
}

fn scene_summary(r: &Report) {
    let ms = |k: &str| r.facts.get(k).and_then(Value::as_u64);
    if let (Some(d), Some(failed), Some(done)) =
        (r.detect_ms, ms("call_failed_ms"), ms("next_call_done_ms"))
    {
        println!(
            "the asyncio agent: wedged {} after the cut, by the proof keepalive; its own call failed in the SDK \
             ({}) at {}, its next call done at {}, same pid",
            secs(d),
            r.facts["call_failed_error"].as_str().unwrap_or("?"),
            secs(failed),
            secs(done)
        );
    }
}

fn secs(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

fn narrate(e: &Event) {
    match e {
        Event::Setup { what } => println!("{:>8} set up: {what}", ""),
        Event::Note { at_ms, text } => println!("{} {text}", stamp(*at_ms)),
        Event::Fault { at_ms, what } => println!("{} FAULT: {what}", stamp(*at_ms)),
        Event::Story {
            at_ms,
            runner,
            status,
            table,
        } => {
            let task = match &status["current_task"] {
                Value::Null => "none".to_string(),
                t => t.as_str().unwrap_or("?").to_string(),
            };
            println!(
                "{} {runner}'s own /status:  status={} current_task={task} tasks_done={} attaches={}",
                stamp(*at_ms),
                status["status"].as_str().unwrap_or("?"),
                status["tasks_done"],
                status["attaches"],
            );
            println!(
                "{:>8} dispatch server's table: status={} last_seen={} ago conn={} dispatched={} done={}",
                "",
                table["status"].as_str().unwrap_or("?"),
                table["last_seen_ms_ago"].as_u64().map_or("?".into(), secs),
                table["conn"],
                table["dispatched"],
                table["done"],
            );
        }
        Event::Verdict(v) => narrate_verdict(v),
        Event::Recovered {
            agent,
            detect_ms,
            recover_ms,
        } => println!(
            "{:>8} {agent} is back at work: wedged verdict {} after the fault, work done again {} after it",
            "",
            secs(*detect_ms),
            secs(*recover_ms)
        ),
    }
}

/// A verdict: in full when it changed, else one line with what is new.
fn narrate_verdict(v: &Verdict) {
    let (agent, verdict, stamp) = (&v.agent, &v.verdict, stamp(v.at_ms));
    if !v.changed {
        let mut line = format!("{stamp} check: {agent:<8} still {verdict}");
        if let Some(id) = &v.snapshot {
            line.push_str(&format!(" (snapshot {id})"));
        }
        for h in &v.heal {
            line.push_str(&format!("; heal: {h}"));
        }
        println!("{line}");
        return;
    }
    println!("{stamp} check: {agent:<8} {verdict}");
    for r in &v.reasons {
        println!(
            "{:>8}   {}: {}",
            "",
            r["code"].as_str().unwrap_or("?"),
            r["message"].as_str().unwrap_or("")
        );
    }
    if let Some(id) = &v.snapshot {
        println!("{:>8}   snapshot {id}", "");
    }
    for h in &v.heal {
        println!("{:>8}   heal: {h}", "");
    }
}

/// `[  1.5 s]`: a time since the bed was built.
fn stamp(ms: u64) -> String {
    format!("[{:>6}]", secs(ms))
}

fn summary(r: &Report, opts: &Options, ok: &Result<(), String>) {
    println!();
    let bound = 3 * opts.heartbeat.as_millis() as u64 + opts.check_every.as_millis() as u64;
    match (r.detect_ms, r.recover_ms) {
        (Some(d), Some(rec)) => {
            println!(
                "time to detect:  {} (bound: 3 × heartbeat + one check interval = {})",
                secs(d),
                secs(bound)
            );
            println!(
                "time to recover: {} (healed without a restart: {})",
                secs(rec),
                r.heals.join(", ")
            );
        }
        _ => println!(
            "the incident was not healed: {}",
            ok.as_ref().err().map_or("", |s| s)
        ),
    }
    println!(
        "the busy runner:  {} checks, verdicts {:?}, never healed",
        r.verdicts.get("thinker").map_or(0, Vec::len),
        distinct(r.verdicts.get("thinker"))
    );
    println!(
        "for scale: the incident went unnoticed for 4.5 h; the kernel's default keepalive \
         (7200 s idle + 9 × 75 s probes) would have needed 2 h 11 min, had the runner even enabled it."
    );
    if let Err(why) = ok {
        println!("DEMO FAILED: {why}");
    }
}

fn distinct(v: Option<&Vec<String>>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for x in v.into_iter().flatten() {
        if !out.contains(x) {
            out.push(x.clone());
        }
    }
    out
}

/// The `selfheal` binary the demo drives: `$SELFHEAL_BIN`, else the one
/// cargo built beside this program.
fn selfheal_binary(testbed: &std::path::Path) -> anyhow::Result<PathBuf> {
    let path = match std::env::var_os("SELFHEAL_BIN") {
        Some(p) => PathBuf::from(p),
        None => testbed.with_file_name("selfheal"),
    };
    if !path.is_file() {
        bail!(
            "selfheal demo drives the selfheal binary, and there is none at {} \
             (build it with `cargo build -p selfheal`, or set SELFHEAL_BIN)",
            path.display()
        );
    }
    Ok(path)
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
        || ["/usr/sbin", "/sbin"]
            .iter()
            .any(|d| std::path::Path::new(d).join(tool).is_file())
}

extern "C" fn on_signal(_: libc::c_int) {
    scenario::STOP.store(true, Ordering::Relaxed);
}

/// SIGINT, SIGTERM and SIGHUP stop the scenario at its next pause; the bed
/// is then dropped, which removes everything.
fn install_stop_handler() -> anyhow::Result<()> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { sigaction(sig, &action) }?;
    }
    Ok(())
}
