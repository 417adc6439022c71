//! The incident testbed's scenarios, end to end as root: real dispatch
//! server, provider and runners (`selfheal-testbed …`) in their own network
//! namespaces, a real `selfheal helper`, and `selfheal check` run every
//! second as a timer would. Each prints its measured times.
//!
//! Thresholds are scaled down (heartbeat 1 s, suspect after 2 s) so that
//! each scenario runs in well under a minute.

use std::{sync::atomic::AtomicU8, time::Duration};

use selfheal_testbed::{
    runner::Mode,
    scenario::{self, Caller, Event, Options, Report},
};
use tests::{need_root, selfheal_bin, testbed_bin};

/// Options with subnets distinct for every scenario of this process.
fn options() -> Options {
    static NEXT: AtomicU8 = AtomicU8::new(0);
    let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Options {
        selfheal: selfheal_bin(),
        testbed: testbed_bin(),
        heartbeat: Duration::from_secs(1),
        check_every: Duration::from_secs(1),
        // 50 subnets a process: a long scenario (330 s) runs beside many
        // short ones, which must not come back round to its subnet.
        net: ((std::process::id() % 5) as u8) * 50 + k % 50 + 1,
        keep_snapshots: None,
        env: Vec::new(),
        check_args: Vec::new(),
    }
}

/// Logs every event on stderr, prefixed with the scenario.
fn log(name: &'static str) -> impl FnMut(Event) {
    move |e| eprintln!("[{name}] {}", serde_json::to_string(&e).unwrap_or_default())
}

/// Logs the report, and keeps it where `cargo xtask test` prints the
/// scenarios' measured times from (libtest hides a passing test's output).
fn summary(r: &Report, name: &str) {
    eprintln!(
        "SCENARIO {}: detect {:?} ms, recover {:?} ms, {} checks, heals {:?}, verdicts {:?}",
        r.scenario, r.detect_ms, r.recover_ms, r.checks, r.heals, r.verdicts
    );
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("scenarios");
    std::fs::create_dir_all(&dir).expect("scenario report dir");
    let mut v = serde_json::to_value(r).expect("report as JSON");
    v["test"] = name.into();
    std::fs::write(dir.join(format!("{name}.json")), v.to_string()).expect("write scenario report");
}

fn incident(mode: Mode, name: &'static str) {
    incident_with(options(), mode, name);
}

fn incident_with(opts: Options, mode: Mode, name: &'static str) {
    if !need_root(name) {
        return;
    }
    let r = scenario::incident(&opts, mode, true, &mut log(name)).expect("the scenario ran");
    summary(&r, name);
    let detect = r.detect_ms.expect("the half-open runner was found wedged");
    // At most 3 × heartbeat plus one check interval and the check's own
    // run time: a second, or the longest check's where one took longer
    // (procfs checks on a loaded machine).
    let took = check_ms(&r);
    let bound = wedge_bound(&opts, &r);
    assert!(
        detect <= bound,
        "detected after {detect} ms (bound {bound} ms, checks took up to {took} ms)"
    );
    assert!(
        r.saw_reason("runner", "status_contradicts_kernel"),
        "{:?}",
        r.reasons
    );
    assert!(!r.snapshots.is_empty(), "a snapshot was recorded");
    let recover = r
        .recover_ms
        .expect("the runner reattached and took work again");
    // Healed by the socket steps only: never a signal or a restart.
    assert!(!r.heals.is_empty());
    for h in &r.heals {
        assert!(
            h == "runner: arm_keepalive" || h == "runner: destroy_socket",
            "unexpected step {h}"
        );
    }
    // Same process, reattached: attaches went up, the pid never changed.
    assert!(
        r.facts["runner_status"]["attaches"].as_u64() >= Some(2),
        "{:?}",
        r.facts
    );
    assert_eq!(r.facts["row"]["status"], "connected");
    // The runner waiting on a thinking provider beside it: left alone.
    assert_eq!(
        r.verdicts_outside("thinker", &["busy", "idle", "healthy"]),
        Vec::<String>::new()
    );
    assert!(!r.heals.iter().any(|h| h.starts_with("thinker")));
    eprintln!("incident ({name}): time to detect {detect} ms, time to recover {recover} ms");
}

#[test]
fn the_incident_with_a_blocking_runner_is_detected_and_healed_without_a_restart() {
    let _area = tests::area(module_path!());
    incident(Mode::Blocking, "incident_blocking");
}

#[test]
fn the_incident_with_a_tokio_runner_is_detected_and_healed_without_a_restart() {
    let _area = tests::area(module_path!());
    incident(Mode::Tokio, "incident_tokio");
}

#[test]
fn a_provider_thinking_past_the_suspect_threshold_is_busy_and_never_healed() {
    let _area = tests::area(module_path!());
    if !need_root("busy_provider") {
        return;
    }
    let r = scenario::busy_provider(&options(), &mut log("busy")).expect("the scenario ran");
    summary(&r, "busy_provider");
    for agent in ["thinker", "thinker-tokio"] {
        let v = &r.verdicts[agent];
        assert!(v.iter().any(|v| v == "busy"), "{agent}: {v:?}");
        assert_eq!(
            r.verdicts_outside(agent, &["busy", "idle", "healthy"]),
            Vec::<String>::new()
        );
        // It did think past the threshold: the judge called it suspect.
        assert!(r.saw_reason(agent, "suspect"), "{agent}: {:?}", r.reasons);
    }
    assert_eq!(r.heals, Vec::<String>::new());
    assert!(
        r.snapshots.is_empty(),
        "nothing to snapshot: {:?}",
        r.snapshots
    );
    // And the work got done: the provider's answers arrived.
    assert!(r.facts["thinker_done"].as_u64() >= Some(1), "{:?}", r.facts);
}

#[test]
fn a_stopped_server_whose_kernel_still_acks_is_told_apart_from_a_vanished_one() {
    let _area = tests::area(module_path!());
    if !need_root("peer_stopped") {
        return;
    }
    let opts = options();
    let r = scenario::peer_stopped(&opts, &mut log("stopped")).expect("the scenario ran");
    summary(&r, "peer_stopped");
    let detect = r.detect_ms.expect("wedged");
    let bound = wedge_bound(&opts, &r);
    assert!(
        detect <= bound,
        "detected after {detect} ms (bound {bound} ms, checks took up to {} ms)",
        check_ms(&r)
    );
    let w = &r.facts["wedged"];
    let silent = w["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["code"] == "control_silent")
        .unwrap_or_else(|| panic!("control_silent: {w:#}"));
    let msg = silent["message"].as_str().unwrap();
    assert!(msg.contains("still acknowledges"), "{msg}");
    // Not the vanished-peer proofs.
    assert!(!w.to_string().contains("peer_unresponsive"), "{w:#}");
    // The snapshot's kernel evidence: the control socket was ACKed recently.
    let snap = &r.facts["snapshot"];
    let control = tests::control_socket(snap);
    let ack = control["tcp_info"]["last_ack_recv_ms"].as_u64().unwrap();
    let data = control["tcp_info"]["last_data_recv_ms"].as_u64().unwrap();
    assert!(
        ack < data && ack <= 3000,
        "last ACK {ack} ms, last data {data} ms"
    );
    eprintln!(
        "stopped peer: wedged after {detect} ms; last ACK {ack} ms ago vs data {data} ms ago"
    );
}

#[test]
fn a_runner_as_pid_1_leaking_zombies_is_degraded_with_the_missing_init_diagnosis() {
    let _area = tests::area(module_path!());
    if !need_root("zombie_leak") {
        return;
    }
    let limit = 150;
    let r =
        scenario::zombie_leak(&options(), limit, &mut log("zombies")).expect("the scenario ran");
    summary(&r, "zombie_leak");
    let d = &r.facts["degraded"];
    let z = d["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["code"] == "zombies")
        .unwrap_or_else(|| panic!("zombies reason: {d:#}"));
    let msg = z["message"].as_str().unwrap();
    assert!(msg.contains("missing init"), "{msg}");
    let n = z["evidence"]["zombies"].as_u64().unwrap();
    assert!(n > 10 && n < u64::from(limit), "{n} zombies");
    eprintln!("zombie leak: degraded at {n} zombies (threshold 10, limit {limit}): {msg}");
}

#[test]
fn a_table_saying_connected_while_the_control_socket_is_gone_contradicts_the_kernel() {
    let _area = tests::area(module_path!());
    if !need_root("table_lies") {
        return;
    }
    let r = scenario::table_lies(&options(), &mut log("table")).expect("the scenario ran");
    summary(&r, "table_lies");
    let detect = r.detect_ms.expect("status_contradicts_kernel seen");
    assert_eq!(
        r.facts["row"]["status"], "connected",
        "the table still lies"
    );
    let w = &r.facts["wedged"];
    assert_eq!(w["verdict"], "wedged");
    assert!(w.to_string().contains("control_absent"), "{w:#}");
    eprintln!("table lies: status_contradicts_kernel {detect} ms after the socket went");
}

#[test]
fn ten_runners_streaming_under_load_are_never_wedged_nor_healed() {
    let _area = tests::area(module_path!());
    if !need_root("load") {
        return;
    }
    let r = scenario::load(&options(), 10, Duration::from_secs(20), &mut log("load"))
        .expect("the scenario ran");
    summary(&r, "load");
    assert_eq!(r.verdicts.len(), 10, "{:?}", r.verdicts);
    for agent in r.verdicts.keys() {
        assert_eq!(
            r.verdicts_outside(agent, &["busy", "idle", "healthy"]),
            Vec::<String>::new(),
            "{agent}: {:?}",
            r.reasons.get(agent)
        );
    }
    assert_eq!(r.heals, Vec::<String>::new());
    assert!(r.checks >= 10, "{} checks", r.checks);
    assert!(r.facts["work_done"].as_u64() >= Some(10), "{:?}", r.facts);
    eprintln!(
        "load: {} checks over 10 runners, {} work items done, no false positive",
        r.checks, r.facts["work_done"]
    );
}

/// The longest `selfheal check` run of a scenario (the bounds allow for it).
fn check_ms(r: &Report) -> u64 {
    r.facts
        .get("check_ms_max")
        .and_then(|v| v.as_u64())
        .unwrap_or(0)
}

/// [`tests::wedge_bound_ms`] of a scenario run with `opts`.
fn wedge_bound(opts: &Options, r: &Report) -> u64 {
    tests::wedge_bound_ms(opts.heartbeat, opts.check_every, check_ms(r))
}

/// How late after a check's verdict the scenario can see what that check's
/// heal did to the caller: by the next check round, one interval plus the
/// longest check's own time (the scenario reads the caller's log after
/// each check).
fn next_round_ms(r: &Report) -> u64 {
    options().check_every.as_millis() as u64 + check_ms(r)
}

fn fact_ms(r: &Report, key: &str) -> Option<u64> {
    r.facts.get(key).and_then(|v| v.as_u64())
}

/// A provider flow cut while the LLM thinks (no FIN, no RST): the proof
/// keepalive goes unanswered, so `wedged`; the heal fails the caller's own
/// call (same process) and its next call starts and completes.
fn silent_cut(caller: Caller, name: &'static str) {
    silent_cut_with(options(), caller, None, name);
}

fn silent_cut_of(caller: Caller, model: Option<&str>, name: &'static str) {
    silent_cut_with(options(), caller, model, name);
}

fn silent_cut_with(opts: Options, caller: Caller, model: Option<&str>, name: &'static str) {
    if !need_root(name) {
        return;
    }
    let r =
        scenario::silent_cut_of(&opts, caller, model, &mut log(name)).expect("the scenario ran");
    summary(&r, name);
    eprintln!(
        "{name}: facts {}",
        serde_json::to_string(&r.facts).unwrap_or_default()
    );
    let before = &r.facts["verdicts_before_cut"];
    assert!(
        !before.to_string().contains("wedged"),
        "wedged before the cut: {before}"
    );
    // suspect_after 2 s + proof idle 1 s + 3 probes × 1 s + one check
    // interval, plus the longest check's own run time.
    let took = check_ms(&r);
    let bound = 2000 + 1000 + 3 * 1000 + 1000 + took;
    let detect = r.detect_ms.unwrap_or_else(|| {
        panic!(
            "never wedged after the cut: verdicts {:?}, reasons {:?}",
            r.verdicts, r.reasons
        )
    });
    assert!(
        detect <= bound,
        "wedged {detect} ms after the cut (bound {bound} ms, checks took up to {took} ms)"
    );
    // By selfheal's own proof keepalive, not the caller's keepalive.
    let wedged = r.facts["wedged"].to_string();
    assert!(
        wedged.contains("\"proof\":true"),
        "not by the proof: {wedged}"
    );
    assert!(
        r.heals
            .iter()
            .any(|h| h.starts_with("caller: ") && !h.contains("failed")),
        "no heal action ran: {:?}",
        r.heals
    );
    let failed = fact_ms(&r, "call_failed_ms")
        .unwrap_or_else(|| panic!("the caller's own call never failed: {:?}", r.facts));
    assert!(
        failed >= detect,
        "the call failed ({failed} ms) before the wedge was found ({detect} ms)"
    );
    let started = fact_ms(&r, "next_call_started_ms").expect("the next call started");
    assert!(
        started >= failed,
        "next call at {started} ms, failure at {failed} ms"
    );
    assert!(fact_ms(&r, "next_call_done_ms").is_some(), "{:?}", r.facts);
    assert!(fact_ms(&r, "next_call_tokens") >= Some(1), "{:?}", r.facts);
    assert_eq!(r.facts["same_pid"], true, "{:?}", r.facts);
    eprintln!(
        "{name}: wedged {detect} ms after the cut (bound {bound}), call failed at {failed} ms with {}, next call done at {:?} ms; waits {}",
        r.facts["call_failed_error"],
        fact_ms(&r, "next_call_done_ms"),
        r.facts["waits"]
    );
}

#[test]
fn a_blocking_call_on_a_cut_provider_flow_is_proven_dead_and_fails() {
    let _area = tests::area(module_path!());
    silent_cut(Caller::Blocking, "silent_cut_blocking");
}

/// Options whose checks read every process from procfs (`check
/// --no-iterators`), the reader of a kernel that refuses the task
/// iterators: the scenarios below must end as on the iterators. (A
/// check's outputs do not say which reader ran: its snapshots are full
/// reads, which are procfs's either way.)
fn on_procfs() -> Options {
    Options {
        check_args: vec!["--no-iterators"],
        ..options()
    }
}

#[test]
fn the_incident_read_by_procfs_is_detected_and_healed_alike() {
    let _area = tests::area(module_path!());
    incident_with(on_procfs(), Mode::Blocking, "incident_blocking_procfs");
}

#[test]
fn an_async_openai_call_read_by_procfs_is_proven_dead_and_fails_alike() {
    let _area = tests::area(module_path!());
    silent_cut_with(
        on_procfs(),
        Caller::AsyncOpenAi,
        None,
        "silent_cut_openai_async_procfs",
    );
}

#[test]
fn a_tokio_call_on_a_cut_provider_flow_is_proven_dead_and_fails() {
    let _area = tests::area(module_path!());
    silent_cut(Caller::Tokio, "silent_cut_tokio");
}

#[test]
fn an_openai_sdk_call_on_a_cut_provider_flow_is_proven_dead_and_fails() {
    let _area = tests::area(module_path!());
    silent_cut(Caller::OpenAi, "silent_cut_openai");
}

#[test]
fn an_anthropic_sdk_call_on_a_cut_provider_flow_is_proven_dead_and_fails() {
    let _area = tests::area(module_path!());
    silent_cut(Caller::Anthropic, "silent_cut_anthropic");
}

/// The event-loop SDKs, whose provider sent the head and the first event
/// at once: nothing shows a call in flight, the proof finds it all the
/// same, before the SDK's own keepalive (AsyncAnthropic arms one: 60 s).
#[test]
fn an_async_openai_call_whose_first_event_came_at_once_is_proven_dead_and_fails() {
    let _area = tests::area(module_path!());
    silent_cut(Caller::AsyncOpenAi, "silent_cut_openai_async");
}

#[test]
fn an_async_anthropic_call_whose_first_event_came_at_once_is_proven_dead_and_fails() {
    let _area = tests::area(module_path!());
    silent_cut(Caller::AsyncAnthropic, "silent_cut_anthropic_async");
}

#[test]
fn a_litellm_call_whose_first_event_came_at_once_is_proven_dead_and_fails() {
    let _area = tests::area(module_path!());
    silent_cut(Caller::Litellm, "silent_cut_litellm");
}

#[test]
fn a_node_openai_call_whose_first_event_came_at_once_is_proven_dead_and_fails() {
    let _area = tests::area(module_path!());
    silent_cut(Caller::NodeOpenAi, "silent_cut_node_openai");
}

#[test]
fn a_node_anthropic_call_whose_first_event_came_at_once_is_proven_dead_and_fails() {
    let _area = tests::area(module_path!());
    silent_cut(Caller::NodeAnthropic, "silent_cut_node_anthropic");
}

/// A live call of each event-loop client, thinking 15 s after its head and
/// first event: asked by the proof while it thinks, never `wedged`, never
/// healed, done with its tokens.
fn thinking(caller: Caller, name: &'static str) {
    if !need_root(name) {
        return;
    }
    let r = scenario::thinking(&options(), caller, &mut log(name)).expect("the scenario ran");
    summary(&r, name);
    eprintln!(
        "{name}: facts {}",
        serde_json::to_string(&r.facts).unwrap_or_default()
    );
    assert_eq!(
        r.verdicts_outside("thinker", &["busy", "idle", "healthy"]),
        Vec::<String>::new(),
        "{:?}",
        r.reasons
    );
    assert_eq!(r.heals, Vec::<String>::new());
    assert!(!r.facts.contains_key("failed"), "{:?}", r.facts);
    assert_eq!(r.facts["tokens"], 20, "{:?}", r.facts);
    assert!(
        fact_ms(&r, "proofs_armed") >= Some(1),
        "never asked: {:?}",
        r.facts
    );
}

#[test]
fn a_thinking_async_openai_call_is_never_wedged_and_completes() {
    let _area = tests::area(module_path!());
    thinking(Caller::AsyncOpenAi, "thinking_openai_async");
}

#[test]
fn a_thinking_async_anthropic_call_is_never_wedged_and_completes() {
    let _area = tests::area(module_path!());
    thinking(Caller::AsyncAnthropic, "thinking_anthropic_async");
}

#[test]
fn a_thinking_litellm_call_is_never_wedged_and_completes() {
    let _area = tests::area(module_path!());
    thinking(Caller::Litellm, "thinking_litellm");
}

#[test]
fn a_thinking_node_openai_call_is_never_wedged_and_completes() {
    let _area = tests::area(module_path!());
    thinking(Caller::NodeOpenAi, "thinking_node_openai");
}

#[test]
fn a_thinking_node_anthropic_call_is_never_wedged_and_completes() {
    let _area = tests::area(module_path!());
    thinking(Caller::NodeAnthropic, "thinking_node_anthropic");
}

/// The head and first event in the same kernel tick as the request.
#[test]
fn an_async_call_whose_head_came_in_the_requests_tick_is_proven_dead_and_fails() {
    let _area = tests::area(module_path!());
    silent_cut_of(
        Caller::AsyncOpenAi,
        Some("think-600000-gap-100-tokens-20-first-early"),
        "silent_cut_openai_async_same_tick",
    );
}

/// The head 300 ms after the request, and no first event before thinking.
#[test]
fn an_async_call_with_a_head_and_no_first_event_is_proven_dead_and_fails() {
    let _area = tests::area(module_path!());
    silent_cut_of(
        Caller::AsyncOpenAi,
        Some("think-600000-gap-100-tokens-20-lag-300"),
        "silent_cut_openai_async_head_only",
    );
}

/// An idle pooled connection whose peer was cut is proven dead with no
/// call waiting on it, said as such (not `wedged`), and ended before the
/// agent's next call, which goes out on a fresh connection at once.
#[test]
fn an_idle_pooled_connection_cut_is_ended_before_the_next_call() {
    let _area = tests::area(module_path!());
    let name = "pooled_cut";
    if !need_root(name) {
        return;
    }
    let r = scenario::pooled_cut(&options(), &mut log(name)).expect("the scenario ran");
    summary(&r, name);
    eprintln!(
        "{name}: facts {}",
        serde_json::to_string(&r.facts).unwrap_or_default()
    );
    let detect = r
        .detect_ms
        .unwrap_or_else(|| panic!("never found: {:?} {:?}", r.verdicts, r.reasons));
    // suspect_after 2 s (from the last answer, ~1 s before the cut) + proof
    // idle 1 s + 3 probes × 1 s + one check interval + the check's own time.
    let bound = 2000 + 1000 + 3 * 1000 + 1000 + check_ms(&r);
    assert!(
        detect <= bound,
        "found {detect} ms after the cut (bound {bound})"
    );
    assert_eq!(
        r.verdicts_outside("pooled", &["healthy", "idle", "busy", "degraded"]),
        Vec::<String>::new(),
        "{:?}",
        r.reasons
    );
    let ended = &r.facts["ended"];
    assert_eq!(ended["verdict"], "degraded", "{ended}");
    assert!(ended["snapshot"].is_string(), "no snapshot first: {ended}");
    assert!(
        r.heals.iter().any(|h| h == "pooled: expire_keepalive"),
        "{:?}",
        r.heals
    );
    let started = fact_ms(&r, "next_call_started_ms").expect("the next call started");
    assert!(
        started > detect,
        "the next call ({started} ms) went out before the end ({detect} ms)"
    );
    let done = fact_ms(&r, "next_call_done_ms").expect("the next call done");
    assert!(
        done - started < 5_000,
        "the next call took {} ms",
        done - started
    );
    assert_eq!(r.facts["calls_failed"], 0, "{:?}", r.facts);
    let cut_local = r.facts["cut"][0]["local"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_ne!(
        r.facts["next_call_local"].as_str(),
        Some(cut_local.as_str()),
        "the next call reused the dead connection"
    );
    assert_eq!(r.facts["same_pid"], true);
    eprintln!(
        "{name}: ended {detect} ms after the cut (bound {bound}); next call at {started} ms, done at {done} ms, on {} (cut: {cut_local})",
        r.facts["next_call_local"]
    );
}

/// A connect the provider never answers is `unresponsive` by the
/// upstream's `connect_timeout`, and ended: litellm's connect fails at
/// once instead of after the kernel's SYN retries, same pid, and its next
/// call completes once the provider answers.
#[test]
fn a_hanging_connect_is_unresponsive_by_connect_timeout_and_fails_now() {
    let _area = tests::area(module_path!());
    let name = "hanging_connect";
    if !need_root(name) {
        return;
    }
    let r = scenario::hanging_connect(&options(), &mut log(name)).expect("the scenario ran");
    summary(&r, name);
    eprintln!(
        "{name}: facts {}",
        serde_json::to_string(&r.facts).unwrap_or_default()
    );
    // When a check first saw the attempt in SYN-SENT (litellm takes a few
    // seconds from its call to its connect).
    let started = fact_ms(&r, "syn_sent_seen_ms").expect("the connection attempt seen");
    let detect = r
        .detect_ms
        .unwrap_or_else(|| panic!("never unresponsive: {:?} {:?}", r.verdicts, r.reasons));
    // connect_timeout 3 s + one check interval + the check's own time.
    let bound = started + 3000 + 1000 + check_ms(&r);
    assert!(detect <= bound, "found at {detect} ms (bound {bound})");
    assert_eq!(r.facts["unresponsive"]["verdict"], "unresponsive");
    assert!(
        r.heals.iter().any(|h| h == "connecting: destroy_socket"),
        "{:?}",
        r.heals
    );
    let failed = fact_ms(&r, "call_failed_ms").expect("the connect failed");
    let next = next_round_ms(&r);
    assert!(
        failed >= detect && failed <= detect + next,
        "failed at {failed} ms, found at {detect} ms (bound: the next round, {next} ms)"
    );
    assert!(fact_ms(&r, "next_call_done_ms").is_some(), "{:?}", r.facts);
    assert_eq!(r.facts["same_pid"], true);
    eprintln!(
        "{name}: unresponsive {} ms after its SYN-SENT socket was first seen (bound {}), its connect failed at {failed} ms with {}",
        detect - started,
        bound - started,
        r.facts["call_failed_error"]
    );
}

/// One HTTP/2 connection carrying three calls: the proof is of the
/// connection, and every call on it fails in the SDK once it is ended.
#[test]
fn three_http2_calls_on_one_cut_connection_are_proven_dead_together() {
    let _area = tests::area(module_path!());
    let name = "http2_cut";
    if !need_root(name) {
        return;
    }
    let r = scenario::http2_cut(&options(), 3, &mut log(name)).expect("the scenario ran");
    summary(&r, name);
    eprintln!(
        "{name}: facts {}",
        serde_json::to_string(&r.facts).unwrap_or_default()
    );
    assert_eq!(
        r.facts["connections"], 1,
        "the calls did not share one connection"
    );
    let detect = r
        .detect_ms
        .unwrap_or_else(|| panic!("never wedged: {:?} {:?}", r.verdicts, r.reasons));
    let bound = 2000 + 1000 + 3 * 1000 + 1000 + check_ms(&r);
    assert!(
        detect <= bound,
        "wedged {detect} ms after the cut (bound {bound})"
    );
    assert!(r.facts["wedged"].to_string().contains("\"proof\":true"));
    assert_eq!(r.facts["calls_failed"], 3, "{:?}", r.facts);
    let last = fact_ms(&r, "last_failed_ms").expect("failures");
    let next = next_round_ms(&r);
    assert!(
        last <= detect + next,
        "the last call failed at {last} ms, the wedge at {detect} ms (bound: the next round, {next} ms)"
    );
    assert!(fact_ms(&r, "next_call_done_ms").is_some(), "{:?}", r.facts);
    assert_eq!(r.facts["same_pid"], true);
    assert_eq!(r.heals.len(), 1, "one connection, one heal: {:?}", r.heals);
    eprintln!(
        "{name}: 3 calls on 1 connection, wedged {detect} ms after the cut (bound {bound}); all 3 failed by {last} ms; next call done at {:?} ms",
        fact_ms(&r, "next_call_done_ms")
    );
}

/// Behind a local proxy the proof says alive (the proxy's kernel ACKs),
/// so a cut proxy→provider flow is `unresponsive` by `max_silence`, never
/// `wedged`.
#[test]
fn a_cut_behind_a_local_proxy_is_unresponsive_by_max_silence_never_wedged() {
    let _area = tests::area(module_path!());
    let name = "proxy_cut";
    if !need_root(name) {
        return;
    }
    let r = scenario::proxy_cut(&options(), &mut log(name)).expect("the scenario ran");
    summary(&r, name);
    eprintln!(
        "{name}: facts {}",
        serde_json::to_string(&r.facts).unwrap_or_default()
    );
    let wedged: Vec<&String> = r
        .verdicts
        .get("caller")
        .into_iter()
        .flatten()
        .filter(|v| *v == "wedged")
        .collect();
    assert!(
        wedged.is_empty(),
        "wedged behind the proxy: {:?}",
        r.verdicts
    );
    // max_silence 8 s + one check interval + the longest check's run time.
    let took = check_ms(&r);
    let bound = 8000 + 1000 + took;
    let detect = r.detect_ms.unwrap_or_else(|| {
        panic!(
            "never unresponsive with silence_exceeded: verdicts {:?}, reasons {:?}",
            r.verdicts, r.reasons
        )
    });
    assert!(
        detect <= bound,
        "unresponsive {detect} ms after the cut (bound {bound} ms)"
    );
    eprintln!("{name}: unresponsive (silence_exceeded) {detect} ms after the cut (bound {bound})");
}

/// 50 calls in one agent thinking 30–300 s: never wedged, never healed,
/// and the proof leaves every socket's keepalive options as it found them.
#[test]
fn fifty_thinking_calls_are_never_wedged_and_keep_their_keepalive_options() {
    let _area = tests::area(module_path!());
    many_thinking(Caller::OpenAi, "many_thinking");
}

/// The same with 50 concurrent calls on one asyncio event loop
/// (`AsyncOpenAI`), half of whose heads and first events came at once.
#[test]
fn fifty_async_thinking_calls_are_never_wedged_and_keep_their_keepalive_options() {
    let _area = tests::area(module_path!());
    many_thinking(Caller::AsyncOpenAi, "many_thinking_async");
}

fn many_thinking(caller: Caller, name: &'static str) {
    if !need_root(name) {
        return;
    }
    let r = scenario::many_thinking(
        &options(),
        caller,
        50,
        Duration::from_secs(330),
        &mut log(name),
    )
    .expect("the scenario ran");
    summary(&r, name);
    eprintln!(
        "{name}: facts {}",
        serde_json::to_string(&r.facts).unwrap_or_default()
    );
    assert_eq!(
        r.verdicts_outside("thinkers", &["busy", "idle", "healthy"]),
        Vec::<String>::new(),
        "{:?}",
        r.reasons
    );
    assert_eq!(r.heals, Vec::<String>::new());
    assert!(r.checks >= 200, "{} checks", r.checks);
    // Every thinking call was asked (a proof keepalive each), and every
    // socket read back right after its options were put back is as before.
    assert!(fact_ms(&r, "proofs_armed") >= Some(50), "{:?}", r.facts);
    assert!(
        fact_ms(&r, "keepalive_compared") >= Some(50),
        "{:?}",
        r.facts
    );
    assert_eq!(
        r.facts["keepalive_mismatches"],
        serde_json::json!([]),
        "the proof changed keepalive options"
    );
    assert_eq!(r.facts["same_pid"], true);
    assert!(fact_ms(&r, "calls_done") >= Some(40), "{:?}", r.facts);
}

/// The provider paces as asked: the response head at once, the first token
/// after `first_ms`, then `tokens` events; with `hang=1`, the head and then
/// silence on an open connection.
#[test]
fn the_provider_thinks_streams_and_hangs_as_asked() {
    let _area = tests::area(module_path!());
    use std::io::{BufRead as _, Read as _};
    use std::time::Instant;

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let mut cmd = std::process::Command::new(testbed_bin());
    cmd.args(["provider", "--listen", &addr.to_string()]);
    let p = tests::Peer::spawn(cmd);
    p.expect("listening", Duration::from_secs(10));
    let get = selfheal_testbed::http::get_streaming;

    let start = Instant::now();
    let resp = get(
        addr,
        "/v1/stream?first_ms=700&gap_ms=10&tokens=4",
        Some(Duration::from_secs(5)),
    )
    .expect("stream");
    assert_eq!(resp.status, 200);
    let head_after = start.elapsed();
    let events: Vec<String> = resp
        .body
        .lines()
        .map_while(Result::ok)
        .filter(|l| l.starts_with("data: "))
        .collect();
    assert_eq!(events.len(), 5, "{events:?}");
    assert_eq!(events[4], "data: [DONE]");
    assert!(
        head_after < Duration::from_millis(500),
        "head after {head_after:?}"
    );
    assert!(
        start.elapsed() >= Duration::from_millis(700),
        "thought {:?}",
        start.elapsed()
    );

    let mut hung = get(addr, "/v1/stream?hang=1", Some(Duration::from_millis(1500))).expect("head");
    assert_eq!(hung.status, 200);
    let mut buf = [0u8; 64];
    let err = hung
        .body
        .read(&mut buf)
        .expect_err("silence, not data or EOF");
    assert!(
        matches!(
            err.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
        "{err}"
    );

    let missing =
        selfheal_testbed::http::get_json(addr, "/nope", Duration::from_secs(2)).expect("404");
    assert_eq!(missing.0, 404);
}

/// The OpenAI- and Anthropic-compatible endpoints serve the real SDKs
/// (`tests/py/sdk_runner.py`), with the response head early and late.
#[test]
fn the_compatible_provider_serves_the_real_openai_and_anthropic_sdks() {
    let _area = tests::area(module_path!());
    let Ok((python, script)) = scenario::sdk_runner() else {
        tests::skip(
            "compatible_provider",
            "python3 cannot import openai and anthropic (`cargo xtask setup` installs them)",
        );
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut cmd = std::process::Command::new(testbed_bin());
    cmd.args(["provider", "--listen", &addr]);
    let p = tests::Peer::spawn(cmd);
    p.expect("listening", Duration::from_secs(10));
    for (sdk, base) in [
        ("openai", format!("http://{addr}/v1")),
        ("anthropic", format!("http://{addr}")),
    ] {
        let out = std::process::Command::new(&python)
            .arg(&script)
            .args(["--name", "compat", "--sdk", sdk, "--base-url", &base])
            .args(["--model", "think-300-gap-10-tokens-7-head-late"])
            .args(["--then-model", "think-100-gap-10-tokens-3"])
            .args(["--calls", "2"])
            .output()
            .expect("run the SDK runner");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{sdk}: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("call 1 done tokens=7"), "{sdk}: {text}");
        assert!(text.contains("call 2 done tokens=3"), "{sdk}: {text}");
    }
}
