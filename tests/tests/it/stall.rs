//! Streams stalled behind keepalive pings, end to end as root, over TLS:
//! the real SDKs (Python `openai` and `anthropic`, sync and async,
//! `litellm`; Node `openai` and `@anthropic-ai/sdk`) call the testbed
//! provider through a TLS edge whose CA they trust through their own
//! environment (`SSL_CERT_FILE`, `NODE_EXTRA_CA_CERTS`), with a real `selfheal helper` and `selfheal check` run
//! every second as a timer would. A call whose provider sends the head and
//! a first event and then only keepalive pings is `wedged`
//! (`stream_stalled`) within `stall_after` plus two check intervals and
//! ended by the socket rung, the SDK failing it in its own error path in
//! the same process; a call that pings then answers within the bound,
//! content that comes slowly past the bound and a silent thinking call
//! past it are never touched.
//!
//! `stall_after` is five check intervals; the provider pings every second
//! (a check interval: most intervals between two checks see one ping).

use std::{sync::atomic::AtomicU8, time::Duration};

use selfheal_testbed::scenario::{self, Caller, Event, Options, Plan, Report};
use tests::{need_root, selfheal_bin, testbed_bin};

/// How often `selfheal check` runs.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Options with subnets distinct for every scenario of this process.
fn options() -> Options {
    static NEXT: AtomicU8 = AtomicU8::new(0);
    let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Options {
        selfheal: selfheal_bin(),
        testbed: testbed_bin(),
        heartbeat: Duration::from_secs(1),
        check_every: CHECK_EVERY,
        net: ((std::process::id() % 5) as u8) * 50 + k % 50 + 1,
        keep_snapshots: None,
        env: Vec::new(),
        check_args: Vec::new(),
    }
}

/// The bound a stalled call is given: five check intervals.
fn stall_after() -> Duration {
    CHECK_EVERY * 5
}

fn log(name: &'static str) -> impl FnMut(Event) {
    move |e| eprintln!("[{name}] {}", serde_json::to_string(&e).unwrap_or_default())
}

/// Checks run at most this long: long enough for the slowest case
/// (content for twice the bound) and the next call after it.
fn limit() -> Duration {
    stall_after() * 3 + Duration::from_secs(30)
}

/// Runs [`scenario::stream`] for `caller` on `model` with `bound` as
/// `stall_after`, checking for at most `limit`; None (skipped) unless root.
fn run(
    caller: Caller,
    model: &str,
    bound: Option<Duration>,
    limit: Duration,
    name: &'static str,
) -> Option<Report> {
    planned(caller, model, bound, limit, &Plan::default(), name)
}

/// [`run`] as `plan` says ([`scenario::stream_planned`]).
fn planned(
    caller: Caller,
    model: &str,
    bound: Option<Duration>,
    limit: Duration,
    plan: &Plan,
    name: &'static str,
) -> Option<Report> {
    if !need_root(name) {
        return None;
    }
    let r = scenario::stream_planned(
        &options(),
        caller,
        model,
        bound,
        limit,
        plan,
        &mut log(name),
    )
    .expect("the scenario ran");
    eprintln!(
        "SCENARIO {name}: detect {:?} ms, {} checks, heals {:?}, verdicts {:?}, facts {}",
        r.detect_ms,
        r.checks,
        r.heals,
        r.verdicts,
        serde_json::to_string(&r.facts).unwrap_or_default()
    );
    Some(r)
}

fn fact(r: &Report, key: &str) -> Option<u64> {
    r.facts.get(key).and_then(|v| v.as_u64())
}

/// The longest `selfheal check` run of a scenario.
fn check_ms(r: &Report) -> u64 {
    fact(r, "check_ms_max").unwrap_or(0)
}

/// A call stalled behind pings: wedged (`stream_stalled`) within
/// `stall_after` plus two check intervals (each the longer of the timer's
/// interval and the longest check's own run, plus one check's run for
/// the check that finds it) of its first ping (the provider's ping period
/// after its first event: the count starts there), ended by the socket
/// rung without a proof keepalive, failed in the SDK, the next call done,
/// same pid.
fn stalled(caller: Caller, model: &str, name: &'static str) -> Option<Report> {
    stalled_planned(caller, model, &Plan::default(), Duration::ZERO, name)
}

/// [`stalled`] as `plan` says, for a call whose pings begin `late` after
/// its first event: its bounds are that much later.
fn stalled_planned(
    caller: Caller,
    model: &str,
    plan: &Plan,
    late: Duration,
    name: &'static str,
) -> Option<Report> {
    let r = planned(
        caller,
        model,
        Some(stall_after()),
        limit() + late,
        plan,
        name,
    )?;
    let took = check_ms(&r);
    let interval = (CHECK_EVERY.as_millis() as u64).max(took);
    let late_ms = late.as_millis() as u64;
    let ping = selfheal_testbed::provider::Pacing::parse(model)
        .ping
        .unwrap_or_default()
        .as_millis() as u64;
    let bound = late_ms + ping + stall_after().as_millis() as u64 + 2 * interval + took;
    let detect = r.detect_ms.unwrap_or_else(|| {
        panic!(
            "never wedged: verdicts {:?}, reasons {:?}",
            r.verdicts, r.reasons
        )
    });
    assert!(
        detect <= bound,
        "wedged {detect} ms after its connection was up (bound {bound} ms, checks took up to {took} ms)"
    );
    // Not before the bound either: only keepalive for stall_after.
    assert!(
        detect >= late_ms + stall_after().as_millis() as u64,
        "wedged after {detect} ms, before stall_after (its pings began {late_ms} ms in)"
    );
    let w = &r.facts["wedged"];
    let stall = w["reasons"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["code"] == "stream_stalled")
        .unwrap_or_else(|| panic!("no stream_stalled reason: {w:#}"));
    let e = &stall["evidence"];
    assert!(e["keepalives"].as_u64() >= Some(2), "{stall:#}");
    assert!(
        e["keepalive_bytes_max"].as_u64() <= Some(128),
        "keepalive-sized: {stall:#}"
    );
    assert!(
        e["stalled_ms"].as_u64() >= Some(stall_after().as_millis() as u64),
        "{stall:#}"
    );
    let msg = stall["message"].as_str().unwrap_or_default();
    assert!(msg.contains("the peer is alive"), "{msg}");
    // Healed by ending the connection: no proof keepalive (the peer
    // answers it), never a signal or a restart.
    assert!(
        r.heals.iter().any(|h| h == "caller: destroy_socket"),
        "{:?}",
        r.heals
    );
    for h in &r.heals {
        assert_eq!(
            h, "caller: destroy_socket",
            "unexpected step in {:?}",
            r.heals
        );
    }
    let failed = fact(&r, "first_failed_ms")
        .unwrap_or_else(|| panic!("the stalled call never failed: {:?}", r.facts));
    assert!(
        failed >= detect,
        "the call failed ({failed} ms) before it was found stalled ({detect} ms)"
    );
    assert!(fact(&r, "next_call_done_ms").is_some(), "{:?}", r.facts);
    assert_eq!(r.facts["same_pid"], true, "{:?}", r.facts);
    eprintln!(
        "{name}: wedged {detect} ms after its connection was up (stall_after {} ms, bound {bound} ms), the SDK failed it at {failed} ms with {}",
        stall_after().as_millis(),
        r.facts["first_failed_error"]
    );
    Some(r)
}

/// A call selfheal must leave alone: never wedged nor healed, its tokens
/// all in, no `stream_stalled` ever; it ran past `stall_after`.
fn untouched(caller: Caller, model: &str, tokens: u64, name: &'static str) -> Option<Report> {
    let r = run(caller, model, Some(stall_after()), limit(), name)?;
    assert_eq!(
        r.verdicts_outside("caller", &["busy", "idle", "healthy"]),
        Vec::<String>::new(),
        "{:?}",
        r.reasons
    );
    assert!(!r.saw_reason("caller", "stream_stalled"), "{:?}", r.reasons);
    assert_eq!(r.heals, Vec::<String>::new());
    assert!(!r.facts.contains_key("first_failed_error"), "{:?}", r.facts);
    assert_eq!(fact(&r, "first_tokens"), Some(tokens), "{:?}", r.facts);
    assert_eq!(r.facts["same_pid"], true, "{:?}", r.facts);
    Some(r)
}

/// Pings every second forever after the head and first event, in chunked
/// encoding on a kept connection, as real providers send a stream. (With
/// a body that ends at the connection's close instead, the sync SDKs over
/// TLS take the ended connection for the end of the answer and return it
/// empty: no error to fail in.)
const STALL: &str = "ping-1000-pool";

#[test]
fn an_async_openai_stream_stalled_behind_ping_comments_is_wedged_and_ended() {
    let _area = tests::area(module_path!());
    stalled(Caller::AsyncOpenAi, STALL, "stall_openai_async");
}

#[test]
fn an_async_anthropic_stream_stalled_behind_ping_events_is_wedged_and_ended() {
    let _area = tests::area(module_path!());
    stalled(Caller::AsyncAnthropic, STALL, "stall_anthropic_async");
}

#[test]
fn a_sync_openai_stream_stalled_behind_ping_comments_is_wedged_and_ended() {
    let _area = tests::area(module_path!());
    stalled(Caller::OpenAi, STALL, "stall_openai");
}

#[test]
fn a_sync_anthropic_stream_stalled_behind_ping_events_is_wedged_and_ended() {
    let _area = tests::area(module_path!());
    stalled(Caller::Anthropic, STALL, "stall_anthropic");
}

#[test]
fn a_litellm_stream_stalled_behind_ping_comments_is_wedged_and_ended() {
    let _area = tests::area(module_path!());
    stalled(Caller::Litellm, STALL, "stall_litellm");
}

/// Node's SDKs trust the bed's CA through `NODE_EXTRA_CA_CERTS`.
#[test]
fn a_node_openai_stream_stalled_behind_ping_comments_is_wedged_and_ended() {
    let _area = tests::area(module_path!());
    stalled(Caller::NodeOpenAi, STALL, "stall_node_openai");
}

#[test]
fn a_node_anthropic_stream_stalled_behind_ping_events_is_wedged_and_ended() {
    let _area = tests::area(module_path!());
    stalled(Caller::NodeAnthropic, STALL, "stall_node_anthropic");
}

/// The head and first event, then silence past the bound (a call that
/// thought), then pings: wedged only `stall_after` after its first ping,
/// never counted from the head. The upstream's `suspect_after` (20 s) is
/// longer than the silence, so the call's record is kept through it (a
/// shorter one drops the record of a quiet connection, and the count
/// starts afresh with the pings whatever the rule).
#[test]
fn a_stream_whose_first_keepalive_comes_late_is_counted_from_it_not_from_the_head() {
    let _area = tests::area(module_path!());
    let late = stall_after() + CHECK_EVERY * 2;
    let plan = Plan {
        upstream: "suspect_after = \"20s\"\n".into(),
        ..Plan::default()
    };
    stalled_planned(
        Caller::AsyncOpenAi,
        &format!("ping-1000-hush-{}-pool", late.as_millis()),
        &plan,
        late,
        "stall_late_first_keepalive",
    );
}

/// Pings for three fifths of the bound, then the answer, on a kept
/// connection.
fn ping_then_answer_pooled() -> String {
    format!("{}-pool", ping_then_answer())
}

/// A call stalled and ended, then three calls on one kept connection,
/// each pinging for three fifths of the bound before its answer: the
/// pings of the three add up to past the bound, but each request and
/// answer starts the count again, so none is stalled: one heal (the
/// stall's), all three done, on one connection reused.
#[test]
fn a_connection_reused_for_new_calls_counts_each_call_afresh() {
    let _area = tests::area(module_path!());
    let plan = Plan {
        then_model: Some(ping_then_answer_pooled()),
        then_done: 3,
        ..Plan::default()
    };
    let limit = limit() + stall_after() * 3;
    let Some(r) = planned(
        Caller::AsyncOpenAi,
        STALL,
        Some(stall_after()),
        limit,
        &plan,
        "stall_reused_connection",
    ) else {
        return;
    };
    assert!(
        r.detect_ms.is_some(),
        "the first call was never wedged: {:?}",
        r.reasons
    );
    assert_eq!(r.heals, ["caller: destroy_socket"], "{:?}", r.reasons);
    assert_eq!(fact(&r, "then_done"), Some(3), "{:?}", r.facts);
    assert_eq!(r.facts["then_tokens"], serde_json::json!([5, 5, 5]));
    // The stalled call's connection, then one for the three calls.
    let ports = r.facts["local_ports"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(ports.len(), 2, "connections by local port: {ports:?}");
    assert_eq!(r.facts["same_pid"], true, "{:?}", r.facts);
}

/// The caller killed (SIGKILL) while its stream stalls behind pings,
/// before the bound: the next checks say `down` (`no_process`), nothing
/// is healed on the gone pid, and the history keeps no progress record
/// of its connection.
#[test]
fn a_process_that_exits_mid_call_while_stalled_is_down_and_forgotten() {
    let _area = tests::area(module_path!());
    let plan = Plan {
        kill_at: Some(stall_after() * 3 / 5),
        name: Some("exiting".into()),
        ..Plan::default()
    };
    let Some(r) = planned(
        Caller::AsyncOpenAi,
        STALL,
        Some(stall_after()),
        limit(),
        &plan,
        "stall_process_exits",
    ) else {
        return;
    };
    assert!(
        fact(&r, "killed_ms").is_some(),
        "never killed: {:?}",
        r.facts
    );
    assert_eq!(r.detect_ms, None, "wedged before the kill: {:?}", r.reasons);
    let after = r.facts["after_kill"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(after.len() as u32, scenario::AFTER_KILL, "{after:?}");
    for o in &after {
        assert_eq!(o["verdict"], "down", "{after:?}");
        assert!(
            o["codes"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c == "no_process")),
            "{after:?}"
        );
    }
    assert_eq!(fact(&r, "heals_after_kill"), Some(0), "{:?}", r.heals);
    // Its pings were counted before the kill, and are forgotten.
    assert!(fact(&r, "progress_before_kill") >= Some(1), "{:?}", r.facts);
    assert_eq!(fact(&r, "progress_after_kill"), Some(0), "{:?}", r.facts);
}

/// A relay that stamps its pings with the time: their sizes vary.
#[test]
fn a_stream_stalled_behind_pings_of_varying_size_is_wedged_and_ended() {
    let _area = tests::area(module_path!());
    let Some(r) = stalled(
        Caller::AsyncAnthropic,
        "ping-1000-stamp-pool",
        "stall_anthropic_async_stamped",
    ) else {
        return;
    };
    // They did vary.
    let e = r.facts["wedged"]["reasons"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["code"] == "stream_stalled")
        .map(|r| r["evidence"].clone())
        .unwrap_or_default();
    assert!(
        e["keepalive_bytes_max"].as_u64() > e["keepalive_bytes_min"].as_u64(),
        "{e:#}"
    );
}

/// With `stall_after = "off"` a stalled call is what it was before the
/// rule: `busy` for as long as it pings, never touched.
#[test]
fn a_stalled_stream_whose_bound_is_off_stays_busy() {
    let _area = tests::area(module_path!());
    // The bound the other tests are judged by, and as long again.
    let watch = stall_after() * 2 + CHECK_EVERY * 2;
    let name = "stall_off_openai_async";
    let Some(r) = run(Caller::AsyncOpenAi, STALL, None, watch, name) else {
        return;
    };
    assert!(
        r.checks as u128 >= watch.as_millis() / CHECK_EVERY.as_millis() / 2,
        "{} checks",
        r.checks
    );
    assert_eq!(
        r.verdicts_outside("caller", &["busy", "idle", "healthy"]),
        Vec::<String>::new(),
        "{:?}",
        r.reasons
    );
    assert!(r.verdicts["caller"].iter().any(|v| v == "busy"));
    assert_eq!(r.heals, Vec::<String>::new());
    assert!(!r.facts.contains_key("first_done_ms"), "{:?}", r.facts);
    assert!(!r.facts.contains_key("first_failed_ms"), "{:?}", r.facts);
}

/// Pings for three fifths of the bound, then the answer.
fn ping_then_answer() -> String {
    format!(
        "ping-1000-for-{}-gap-100-tokens-5",
        stall_after().as_millis() * 3 / 5
    )
}

#[test]
fn an_async_openai_call_that_pings_then_answers_within_the_bound_completes_untouched() {
    let _area = tests::area(module_path!());
    untouched(
        Caller::AsyncOpenAi,
        &ping_then_answer(),
        5,
        "ping_answer_openai_async",
    );
}

#[test]
fn an_async_anthropic_call_that_pings_then_answers_within_the_bound_completes_untouched() {
    let _area = tests::area(module_path!());
    untouched(
        Caller::AsyncAnthropic,
        &ping_then_answer(),
        5,
        "ping_answer_anthropic_async",
    );
}

/// A word every 1.5 s, for twice the bound: the model, and its words.
fn slow_content() -> (String, u64) {
    let gap = 1500;
    let tokens = (stall_after().as_millis() as u64 * 2).div_ceil(gap);
    (
        format!("first-early-think-0-gap-{gap}-tokens-{tokens}"),
        tokens,
    )
}

/// A word every 1.5 s, for twice the bound.
#[test]
fn a_stream_whose_content_comes_slowly_past_the_bound_is_never_stalled() {
    let _area = tests::area(module_path!());
    let (model, tokens) = slow_content();
    if let Some(r) = untouched(Caller::AsyncOpenAi, &model, tokens, "slow_openai_async") {
        let ran = fact(&r, "first_done_ms").unwrap_or(0);
        assert!(
            ran > stall_after().as_millis() as u64,
            "the content lasted {ran} ms, not past stall_after"
        );
    }
}

/// No traffic at all past the bound: silence is the proof keepalive's to
/// judge, as before (the edge answers it): busy, never stalled.
#[test]
fn a_silent_thinking_call_past_the_bound_is_busy_and_asked_by_the_proof() {
    let _area = tests::area(module_path!());
    let think = stall_after().as_millis() as u64 * 2;
    let model = format!("think-{think}-first-early-gap-100-tokens-5");
    if let Some(r) = untouched(Caller::AsyncOpenAi, &model, 5, "thinking_openai_async") {
        assert!(
            fact(&r, "proofs_armed") >= Some(1),
            "never asked: {:?}",
            r.facts
        );
        assert!(r.verdicts["caller"].iter().any(|v| v == "busy"));
    }
}

/// Runs [`scenario::stream_inspected`] with `inspect` at `at` after the
/// call's connection was up; None (skipped) unless root.
fn inspected(
    model: &str,
    limit: Duration,
    at: Duration,
    name: &'static str,
) -> Option<(Report, serde_json::Value, String)> {
    if !need_root(name) {
        return None;
    }
    let r = scenario::stream_inspected(
        &options(),
        Caller::AsyncOpenAi,
        model,
        Some(stall_after()),
        limit,
        Some(at),
        &mut log(name),
    )
    .expect("the scenario ran");
    let doc = r
        .facts
        .get("inspect_json")
        .cloned()
        .unwrap_or_else(|| panic!("inspect never ran: {:?}", r.facts.keys()));
    let text = r.facts["inspect_text"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    eprintln!(
        "SCENARIO {name}: inspect at {:?} ms: progress {:#}\n{text}",
        fact(&r, "inspect_ms"),
        doc["progress"]
    );
    Some((r, doc, text))
}

/// `inspect` of a call stalled behind pings, before the bound: its
/// connection's keepalive-only arrivals (how many, their size and
/// spacing, since when) and the time left of `stall_after`, in the text
/// and in `--json`; the check after the bound then finds it stalled.
#[test]
fn inspect_shows_a_stalled_streams_keepalives_counting_down_to_its_bound() {
    let _area = tests::area(module_path!());
    let at = stall_after() * 3 / 5;
    let Some((r, doc, text)) = inspected(STALL, limit(), at, "inspect_stalled_openai_async") else {
        return;
    };
    let progress = doc["progress"].as_array().cloned().unwrap_or_default();
    assert_eq!(progress.len(), 1, "one pinging connection: {doc:#}");
    let p = &progress[0];
    assert_eq!(p["role"], "provider", "{p:#}");
    let n = p["keepalives"].as_u64().unwrap_or(0);
    assert!(n >= 2, "pings every second, counted for {at:?}: {p:#}");
    assert!(p["keepalive_bytes_max"].as_u64() <= Some(128), "{p:#}");
    assert!(p["keepalive_bytes_min"].as_u64() >= Some(1), "{p:#}");
    // Sizes and spacing as the kernel dated them: one ping a second,
    // each dated within a check's own run.
    let took = check_ms(&r);
    let spacing = p["keepalive_spacing_ms"].as_u64().expect("spacing");
    assert!(
        spacing.abs_diff(1_000) <= 2 * took + 20,
        "spacing {spacing} ms, checks took up to {took} ms: {p:#}"
    );
    let bound = stall_after().as_millis() as u64;
    assert_eq!(p["stall_after_ms"], bound, "{p:#}");
    let only = p["only_keepalive_ms"].as_u64().unwrap_or(0);
    assert!(only > 0 && only < bound, "{p:#}");
    assert_eq!(p["left_ms"].as_u64(), Some(bound - only), "{p:#}");
    assert_eq!(p["stalled"], false, "{p:#}");
    // The words for a person (printed by a run of its own, a moment
    // apart: the counts may have moved on, the bound not).
    let line = text
        .lines()
        .skip_while(|l| *l != "progress:")
        .nth(1)
        .unwrap_or_else(|| panic!("no progress in the text:\n{text}"));
    for words in [
        "only keepalive for ".to_string(),
        " arrival(s) of ".to_string(),
        " apart, the last ".to_string(),
        format!("stall_after {}, ", human(bound)),
    ] {
        assert!(line.contains(&words), "{words:?} in {line:?}");
    }
    // The check past the bound finds what inspect counted down to.
    let detect = r.detect_ms.expect("wedged after the inspect");
    assert!(detect >= bound, "{detect}");
    let seen = r.facts["wedged"]["reasons"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["code"] == "stream_stalled")
        .map(|r| r["evidence"]["keepalives"].as_u64().unwrap_or(0));
    assert!(
        seen >= Some(n),
        "{seen:?} keepalives when stalled, {n} before"
    );
}

/// `inspect` of a call thinking in silence past the bound: no progress
/// evidence (nothing arrived to count), in the text or in `--json`.
#[test]
fn inspect_shows_no_progress_evidence_for_a_silent_call() {
    let _area = tests::area(module_path!());
    let think = stall_after().as_millis() as u64 * 2;
    let model = format!("think-{think}-first-early-gap-100-tokens-5");
    let at = stall_after() + CHECK_EVERY;
    let Some((r, doc, text)) = inspected(&model, limit(), at, "inspect_silent_openai_async") else {
        return;
    };
    assert!(
        fact(&r, "inspect_ms") < Some(think),
        "inspected after the thinking: {:?}",
        r.facts
    );
    assert_eq!(doc["progress"], serde_json::json!([]), "{doc:#}");
    assert!(!text.contains("progress:"), "{text}");
    // The connection was there and inspected: its socket is in the report.
    assert!(
        doc["sockets"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s["role"] == "provider")),
        "{doc:#}"
    );
    assert!(!r.saw_reason("caller", "stream_stalled"), "{:?}", r.reasons);
}

/// Milliseconds as `inspect` words them.
fn human(ms: u64) -> String {
    selfheal_core::inspect::human_ms(ms)
}

// ---------------------------------------------------------------------------
// A gRPC control stream: grpcio on both ends (tests/py/grpc_control.py),
// on loopback, the client with channel keepalive, checked by a real
// `selfheal check` every second; in the clear, and over TLS as a provider
// serves it (a CA made with the `openssl` command, which the client
// trusts through `grpc.ssl_channel_credentials(root_certificates=...)`).

/// The configured heartbeat of the control stream.
const BEAT: Duration = Duration::from_millis(500);

/// A grpcio program of tests/py/grpc_control.py, killed on drop, with
/// its stdout lines.
struct Py {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Py {
    fn start(args: &[String]) -> Py {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/py/grpc_control.py");
        let mut child = std::process::Command::new("python3")
            .arg(script)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Py { child, lines }
    }

    /// Waits at most `limit` for a line equal to `want`.
    fn expect(&self, want: &str, limit: Duration) {
        let end = std::time::Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l == want => return,
                Ok(_) => {}
                Err(e) => panic!("no {want:?} within {limit:?}: {e}"),
            }
        }
    }
}

impl Drop for Py {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the checks saw of a grpcio control stream whose server sends a
/// heartbeat every `every_ms`, `beats` of them (0: forever), over TLS if
/// `tls`: per check, when it ran (ms after the last heartbeat was
/// received, or after the first when `beats` is 0), how long it took, and
/// its outcome.
fn grpc_control(
    name: &str,
    every_ms: u64,
    beats: u32,
    checks: u32,
    tls: bool,
) -> Vec<(u64, u64, serde_json::Value)> {
    let have = std::process::Command::new("python3")
        .args(["-c", "import grpc"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        have,
        "{name}: python3 has no grpcio (cargo xtask setup installs it)"
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let dir = tests::Scratch::new(name);
    let certs = tls.then(|| {
        scenario::make_certs(&dir.0.join("ca"), &[std::net::Ipv4Addr::LOCALHOST.into()])
            .expect("a CA and a certificate for 127.0.0.1")
    });
    let path = |p: &std::path::Path| p.to_string_lossy().into_owned();
    let mut args = vec![
        "server".into(),
        port.to_string(),
        every_ms.to_string(),
        beats.to_string(),
    ];
    args.extend(
        certs
            .iter()
            .flat_map(|(_, leaf, key)| [path(leaf), path(key)]),
    );
    let server = Py::start(&args);
    server.expect("listening", Duration::from_secs(20));
    // Channel keepalive as often as grpcio pings (it waits at least 1 s).
    let mut args = vec!["client".into(), port.to_string(), "500".into()];
    args.extend(certs.iter().map(|(ca, _, _)| path(ca)));
    let client = Py::start(&args);
    let tag = format!("grpc_control.py client {port}");
    let config = dir.0.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[[agent]]\nname = \"ctl\"\nmatch = {{ cmdline = \"{tag}\" }}\n\
             [[agent.upstream]]\nrole = \"control\"\naddr = \"127.0.0.1:{port}\"\n\
             heartbeat = \"{}ms\"\n",
            BEAT.as_millis()
        ),
    )
    .expect("write the config");
    let last = if beats == 0 { 1 } else { beats };
    client.expect(&format!("beat {last}"), Duration::from_secs(30));
    let start = std::time::Instant::now();
    let mut seen = Vec::new();
    for _ in 0..checks {
        let tick = std::time::Instant::now();
        let out = std::process::Command::new(tests::selfheal_bin())
            .args(["check", "--json", "--dry-run", "--config"])
            .arg(&config)
            .arg("--state-dir")
            .arg(dir.0.join("state"))
            .arg("--snapshot-dir")
            .arg(dir.0.join("snapshots"))
            .output()
            .expect("selfheal check runs");
        let took = tick.elapsed().as_millis() as u64;
        let text = String::from_utf8_lossy(&out.stdout);
        let o: serde_json::Value = serde_json::from_str(text.trim())
            .unwrap_or_else(|e| panic!("{name}: check printed {text:?}: {e}"));
        eprintln!(
            "[{name}] {} ms: {o}",
            tick.duration_since(start).as_millis()
        );
        seen.push((tick.duration_since(start).as_millis() as u64, took, o));
        std::thread::sleep(CHECK_EVERY.saturating_sub(tick.elapsed()));
    }
    seen
}

fn control_silent(o: &serde_json::Value) -> Option<&serde_json::Value> {
    o["reasons"]
        .as_array()?
        .iter()
        .find(|r| r["code"] == "control_silent")
}

/// The server's application stops after its heartbeats while its HTTP/2
/// stack answers the client's keepalive PINGs: data keeps arriving on the
/// connection (a PING ACK a second), yet the heartbeat rule counts only
/// application data and finds it `control_silent` within 3 × the
/// heartbeat plus two check intervals.
#[test]
fn a_grpc_control_stream_alive_only_by_keepalive_pings_is_control_silent() {
    let _area = tests::area(module_path!());
    keepalive_only("grpc_control_stalled", false);
}

/// The same over TLS: each PING and its ACK a TLS record (39 bytes in TLS
/// 1.3, grpcio's), still mirrored, still no heartbeat.
#[test]
fn a_grpc_control_stream_over_tls_alive_only_by_keepalive_pings_is_control_silent() {
    let _area = tests::area(module_path!());
    keepalive_only("grpc_control_stalled_tls", true);
}

fn keepalive_only(name: &str, tls: bool) {
    let seen = grpc_control(name, BEAT.as_millis() as u64, 4, 10, tls);
    let (at, took, o) = seen
        .iter()
        .find(|(_, _, o)| control_silent(o).is_some())
        .unwrap_or_else(|| panic!("{name}: never control_silent: {seen:#?}"));
    let longest = seen.iter().map(|(_, t, _)| *t).max().unwrap_or(0);
    let interval = (CHECK_EVERY.as_millis() as u64).max(longest);
    let bound = 3 * BEAT.as_millis() as u64 + 2 * interval + took;
    assert!(
        at + took <= bound,
        "{name}: found at {at} ms (+{took}), bound {bound} ms"
    );
    assert_eq!(o["verdict"], "wedged", "{o:#}");
    let r = control_silent(o).expect("found");
    let msg = r["message"].as_str().unwrap_or_default();
    assert!(msg.contains("no application data for"), "{msg}");
    assert!(msg.contains("the peer's transport still answers"), "{msg}");
    // The keepalive the rule saw through: data arrived within the
    // heartbeat limit (a PING ACK), so counting any arrival would call it
    // alive, as selfheal did before.
    let recv = r["evidence"]["last_data_recv_ms"]
        .as_u64()
        .expect("evidence");
    assert!(recv <= 3 * BEAT.as_millis() as u64, "{r:#}");
}

/// The hard variant: the server's heartbeats come slowly (twice the
/// configured heartbeat apart, within its limit of 3 ×) but really, with
/// the PINGs between them: never `control_silent`.
#[test]
fn a_grpc_control_streams_slow_real_heartbeats_are_never_control_silent() {
    let _area = tests::area(module_path!());
    slow_heartbeats("grpc_control_slow", false);
}

/// The same over TLS.
#[test]
fn a_grpc_control_streams_slow_real_heartbeats_over_tls_are_never_control_silent() {
    let _area = tests::area(module_path!());
    slow_heartbeats("grpc_control_slow_tls", true);
}

fn slow_heartbeats(name: &str, tls: bool) {
    let seen = grpc_control(name, 2 * BEAT.as_millis() as u64, 0, 12, tls);
    for (at, _, o) in &seen {
        assert!(control_silent(o).is_none(), "{name}: at {at} ms: {o:#}");
        assert_ne!(o["verdict"], "wedged", "{o:#}");
    }
}

/// The jump of `CLOCK_BOOTTIME` a host's suspend and resume makes
/// between two timer runs of `check`: 3 hours.
const JUMP_S: i64 = 3 * 3600;

/// The caller of the boottime jump tests.
const JUMPER: &str = "jumper";

/// One check of a boottime jump run: its clock's offset, when it started
/// and ended (ms after the call's connection was up), the caller's
/// verdict and reason codes, the suspend its `stream_stalled` reason says
/// it did not count and the pings' spacing it gives, if any, and its
/// healing steps.
#[derive(Debug)]
struct Jumped {
    offset_s: i64,
    start_ms: u64,
    end_ms: u64,
    verdict: String,
    codes: Vec<String>,
    suspended_ms: Option<u64>,
    spacing_ms: Option<u64>,
    heals: Vec<String>,
}

/// A boottime jump run: its checks, the caller's call lines, whether the
/// caller's pid is the one that started, and `inspect` after the check it
/// was asked after, with that check's offset.
struct JumpRun {
    seen: Vec<Jumped>,
    lines: Vec<scenario::CallLine>,
    same_pid: bool,
    inspected: Option<Inspected>,
}

/// `inspect` of the caller in a boottime jump run: its text and document,
/// when it started and ended (ms after the call's connection was up).
struct Inspected {
    text: String,
    doc: serde_json::Value,
    start_ms: u64,
    end_ms: u64,
}

/// The async OpenAI SDK streaming `model` over TLS through the bed's edge,
/// its provider upstream's `stall_after` the stall tests' bound; checked
/// every [`CHECK_EVERY`] with `CLOCK_BOOTTIME` moved by `offset(n)`
/// seconds at the `n`th check (a time namespace of the check's own:
/// [`scenario::Bed::check_with_boottime_offset`]), for at most `limit`,
/// until `done` says so (given the checks so far and the caller's call
/// lines), with `inspect` of the caller after check `inspect_after`, if
/// any, on that check's clock. None (skipped) unless root.
fn across_a_boottime_jump(
    model: &str,
    limit: Duration,
    offset: impl Fn(usize) -> i64,
    inspect_after: Option<usize>,
    done: impl Fn(&[Jumped], &[scenario::CallLine]) -> bool,
    name: &'static str,
) -> Option<JumpRun> {
    use std::time::Instant;
    if !need_root(name) {
        return None;
    }
    let mut bed = scenario::Bed::new(&options(), "cj", Duration::from_millis(500)).expect("bed");
    let edge = scenario::tls_edge(&mut bed).expect("the TLS edge");
    let (program, script) = scenario::sdk_runner().expect("the SDK runner");
    let ca = bed.tls_ca().expect("the edge's CA").to_path_buf();
    // The SDK runners' status port in the runners' namespace.
    let status = "127.0.0.1:9101";
    let mut cmd = bed.topo.runners.command(&program);
    cmd.env("SSL_CERT_FILE", &ca)
        .arg(&script)
        .args(["--name", JUMPER, "--sdk", "openai-async", "--base-url"])
        .arg(format!("https://{edge}/v1"))
        .args(["--status", status, "--then-model", scenario::FAST_MODEL])
        .args(["--model", model]);
    let script_name = script
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let block = format!(
        "[[agent]]\nname = \"{JUMPER}\"\nmatch = {{ cmdline = \"{script_name} --name {JUMPER} \" }}\n\
         [[agent.upstream]]\nrole = \"provider\"\naddr = \"{edge}\"\nstall_after = \"{}ms\"\n\
         [[agent.probe]]\nurl = \"http://{status}/status\"\ntimeout = \"1s\"\n\
         [agent.thresholds]\nsuspect_after = \"2s\"\nrecv_blocked = \"2s\"\n\
         [agent.heal]\nstep_window = \"5s\"\nbackoff = \"1s\"\n{}",
        stall_after().as_millis(),
        scenario::PROOF
    );
    bed.spawn(JUMPER, cmd, Some(block)).expect("the caller");
    let pid = bed.pid(JUMPER).expect("the caller's pid");
    // Its call's connection up (an SDK's import and connect take seconds).
    let up = Instant::now() + Duration::from_secs(60);
    while !scenario::tcp_sockets(pid)
        .unwrap_or_default()
        .iter()
        .any(|s| s.remote == edge && s.state == 1)
    {
        assert!(Instant::now() < up, "the caller never connected to {edge}");
        scenario::pause(Duration::from_millis(50)).expect("not interrupted");
    }
    let start = Instant::now();
    let ms = |t: Instant| t.duration_since(start).as_millis() as u64;
    let mut seen = Vec::new();
    let mut lines = Vec::new();
    let mut inspected = None;
    while start.elapsed() < limit {
        scenario::pause(CHECK_EVERY).expect("not interrupted");
        let off = offset(seen.len());
        let t = Instant::now();
        let run = if off == 0 {
            bed.check()
        } else {
            bed.check_with_boottime_offset(off)
        }
        .expect("check ran");
        let o = run
            .of(JUMPER)
            .unwrap_or_else(|| panic!("no outcome for {JUMPER}: {run:?}"));
        let stalled = o["reasons"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["code"] == "stream_stalled");
        let j = Jumped {
            offset_s: off,
            start_ms: ms(t),
            end_ms: ms(Instant::now()),
            verdict: o["verdict"].as_str().unwrap_or("?").into(),
            codes: o["reasons"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r["code"].as_str().map(str::to_string))
                .collect(),
            suspended_ms: stalled.and_then(|r| r["evidence"]["suspended_ms"].as_u64()),
            spacing_ms: stalled.and_then(|r| r["evidence"]["keepalive_spacing_ms"].as_u64()),
            heals: o["heal"]["actions"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| {
                    let action = a["step"]["action"].as_str().unwrap_or("?");
                    if a["ok"] == false {
                        let why = a["error"].as_str().or(a["detail"].as_str());
                        format!("{action} (failed: {})", why.unwrap_or("?"))
                    } else {
                        action.to_string()
                    }
                })
                .collect(),
        };
        eprintln!("[{name}] {j:?}");
        if !j.heals.is_empty() {
            eprintln!("[{name}] heal {}", o["heal"]);
        }
        seen.push(j);
        if inspect_after == Some(seen.len() - 1) {
            let start_ms = ms(Instant::now());
            let (text, doc) = if off == 0 {
                bed.inspect(JUMPER)
            } else {
                bed.inspect_with_boottime_offset(JUMPER, off)
            }
            .expect("inspect ran");
            let end_ms = ms(Instant::now());
            eprintln!(
                "[{name}] inspect after check {} ({} ms): progress {:#}\n{text}",
                seen.len() - 1,
                end_ms - start_ms,
                doc["progress"]
            );
            inspected = Some(Inspected {
                text,
                doc,
                start_ms,
                end_ms,
            });
        }
        // Each read gives the lines printed since the last.
        lines.extend(
            bed.lines(JUMPER)
                .expect("the caller's lines")
                .iter()
                .filter_map(|l| scenario::CallLine::parse(l)),
        );
        if done(&seen, &lines) {
            break;
        }
    }
    let same_pid = bed.pid(JUMPER).ok() == Some(pid) && bed.running(JUMPER).unwrap_or(false);
    eprintln!("SCENARIO {name}: {} checks, calls {lines:?}", seen.len());
    Some(JumpRun {
        seen,
        lines,
        same_pid,
        inspected,
    })
}

/// The first check that found the caller wedged, `stream_stalled`.
fn first_stalled(seen: &[Jumped]) -> Option<&Jumped> {
    seen.iter()
        .find(|j| j.verdict == "wedged" && j.codes.iter().any(|c| c == "stream_stalled"))
}

/// The checks' longest run.
fn longest(seen: &[Jumped]) -> u64 {
    seen.iter()
        .map(|j| j.end_ms - j.start_ms)
        .max()
        .unwrap_or(0)
}

/// A stream stalled behind pings, checked across a jump of
/// `CLOCK_BOOTTIME` at check `at` (from the offset before it to the one
/// after; `CLOCK_MONOTONIC` does not move: to the judge, a jump forward is
/// a suspend): wedged within `stall_after` of the check the count starts
/// after plus a ping and two check intervals (and `inspect`'s run, where
/// it ran between them), never before `stall_after` has passed in real
/// time since that check. The count starts at the first ping after the
/// first check (a suspend is not the call's silence, whether it comes
/// before the first ping or amid the pings), or after the jump's check
/// for a jump back (the record starts afresh there). Where the pings were counted before a jump forward (`at` past
/// the check after the first), the stall's reason names the jump as the
/// suspend it did not count, to the ms each clock is read in; else none.
/// Checked in the helper's clock after the jump, it is ended by the socket
/// rung and failed in the SDK; checked in a time namespace, the helper
/// refuses (its start times differ by the offset) and nothing ends it.
/// Same pid. The run, for more to be asked of it.
fn stalled_across(
    before: i64,
    after: i64,
    at: usize,
    inspect_after: Option<usize>,
    name: &'static str,
) -> Option<JumpRun> {
    let run = across_a_boottime_jump(
        "ping-1000-pool",
        limit(),
        |n| if n < at { before } else { after },
        inspect_after,
        |seen, lines| {
            first_stalled(seen).is_some()
                && (after != 0
                    || lines
                        .iter()
                        .any(|l| matches!(l, scenario::CallLine::Done(..))))
        },
        name,
    )?;
    let (seen, lines) = (&run.seen, &run.lines);
    let first = if after < before { &seen[at] } else { &seen[0] };
    let took = longest(seen);
    let interval = (CHECK_EVERY.as_millis() as u64).max(took);
    let bound_ms = stall_after().as_millis() as u64;
    let w = first_stalled(seen).unwrap_or_else(|| panic!("never stalled: {seen:#?}"));
    let since = w.end_ms - first.start_ms;
    let inspect_ms = run.inspected.as_ref().map_or(0, |i| i.end_ms - i.start_ms);
    eprintln!(
        "{name}: boottime {before:+} s then {after:+} s at check {at}: stalled {since} ms after the check the count starts after (stall_after {bound_ms} ms, checks took up to {took} ms, inspect {inspect_ms} ms), suspended_ms {:?}",
        w.suspended_ms
    );
    assert!(
        since >= bound_ms,
        "stalled {since} ms after the check the count starts after, with a {} s jump at check {at}, before stall_after ({bound_ms} ms): the jump was counted as the call's silence: {seen:#?}",
        after - before
    );
    let most = 1_000 + bound_ms + 2 * interval + took + inspect_ms;
    assert!(
        since <= most,
        "stalled {since} ms after the check the count starts after, not within {most} ms: {seen:#?}"
    );
    assert_eq!(w.offset_s, after, "{seen:#?}");
    // One ping a second, each dated within a check's own run, whatever
    // the clock did between them.
    let spacing = w.spacing_ms.unwrap_or(0);
    assert!(
        spacing.abs_diff(1_000) <= 2 * took + 20,
        "spacing {spacing} ms, checks took up to {took} ms: {w:?}"
    );
    if at > 1 && after > before {
        let jump_ms = (after - before) as u64 * 1_000;
        let s = w.suspended_ms.unwrap_or(0);
        assert!(
            s.abs_diff(jump_ms) <= 1,
            "the {jump_ms} ms jump amid the pings named as not counted: {s} ms: {w:?}"
        );
    } else {
        assert_eq!(w.suspended_ms, None, "no suspend in the span: {w:?}");
    }
    let heals: Vec<&String> = seen.iter().flat_map(|j| &j.heals).collect();
    let failed = lines
        .iter()
        .any(|l| matches!(l, scenario::CallLine::Failed(..)));
    if after == 0 {
        assert!(
            !heals.is_empty() && heals.iter().all(|h| *h == "destroy_socket"),
            "ended by the socket rung alone: {heals:?}"
        );
        assert!(failed, "the stalled call failed in the SDK: {lines:?}");
    } else {
        // A check in a time namespace reads its processes' start times
        // (`/proc/PID/stat`) moved by the offset; the helper, outside it,
        // does not, and refuses to act on a process that is not the one
        // judged. A host's suspend moves both alike.
        assert!(
            !heals.is_empty()
                && heals.iter().all(|h| {
                    h.starts_with("destroy_socket (failed: ")
                        && h.contains("is no longer the process that was judged")
                }),
            "refused by the helper: {heals:?}"
        );
        assert!(!failed, "nothing ended the call: {lines:?}");
    }
    assert!(run.same_pid, "same pid");
    Some(run)
}

/// A stalled stream checked once, then with `CLOCK_BOOTTIME` 3 hours on
/// (a host's suspend between two timer runs): stalled `stall_after` after
/// the jump, not at once.
#[test]
fn a_stalled_stream_across_a_boottime_jump_forward_is_counted_from_after_it() {
    let _area = tests::area(module_path!());
    stalled_across(0, JUMP_S, 1, None, "stall_boottime_forward");
}

/// A stalled stream checked once with `CLOCK_BOOTTIME` 3 hours on, then
/// with it back (the clock 3 hours behind the history's last check): the
/// record starts afresh and the stall is found `stall_after` later, not
/// never.
#[test]
fn a_stalled_stream_across_a_boottime_jump_back_is_counted_afresh() {
    let _area = tests::area(module_path!());
    stalled_across(JUMP_S, 0, 1, None, "stall_boottime_back");
}

/// The check at which a suspend comes amid a stream's pings: the check
/// before it counted the first ping (one a second, each check interval a
/// second and its run), and with that check's own interval at least
/// `MIN_KEEPALIVES` are counted, short of the five intervals of the
/// bound: judged on `CLOCK_BOOTTIME` alone, it would be stalled at once.
const SUSPEND_AT: usize = 2;

/// A stream stalled behind pings, the first counted, then a suspend of 3
/// hours (`CLOCK_BOOTTIME` on, `CLOCK_MONOTONIC` not) before the next
/// check: that check, right after the resume, finds the call busy, not
/// stalled (its keepalive-only span is the seconds awake, not 3 hours of
/// them), and `inspect` then shows those seconds, the bound's rest and the
/// suspend named apart; the pings that go on awake are wedged
/// (`stream_stalled`) within `stall_after` of the first check plus a ping
/// and two check intervals, the reason naming the suspend it did not
/// count ([`stalled_across`]).
#[test]
fn a_stalled_stream_across_a_suspend_amid_its_pings_is_counted_awake() {
    let _area = tests::area(module_path!());
    let Some(run) = stalled_across(
        0,
        JUMP_S,
        SUSPEND_AT,
        Some(SUSPEND_AT),
        "stall_suspend_amid_pings",
    ) else {
        return;
    };
    let bound = stall_after().as_millis() as u64;
    let resumed = &run.seen[SUSPEND_AT];
    assert_eq!(resumed.offset_s, JUMP_S, "{resumed:?}");
    // The span began after the first check: short of the bound at the
    // check after the resume and at `inspect`, if they ran in time.
    let i = run.inspected.as_ref().expect("inspect ran");
    let awake = i.end_ms - run.seen[0].start_ms;
    assert!(
        awake < bound,
        "the checks (up to {} ms) and inspect ran {awake} ms from the first: too slow to tell the span short of the bound ({bound} ms): {:#?}",
        longest(&run.seen),
        run.seen
    );
    assert_eq!(
        resumed.verdict, "busy",
        "right after the resume: {resumed:?}"
    );
    assert!(
        run.seen[..=SUSPEND_AT]
            .iter()
            .all(|j| !j.codes.iter().any(|c| c == "stream_stalled")),
        "{:#?}",
        run.seen
    );
    let progress = i.doc["progress"].as_array().cloned().unwrap_or_default();
    assert_eq!(progress.len(), 1, "one pinging connection: {:#}", i.doc);
    let p = &progress[0];
    let jump_ms = JUMP_S as u64 * 1_000;
    let suspended = p["suspended_ms"].as_u64().unwrap_or(0);
    assert!(
        suspended.abs_diff(jump_ms) <= 1,
        "the suspend named apart: {p:#}"
    );
    let n = p["keepalives"].as_u64().unwrap_or(0);
    assert!(
        n >= u64::from(selfheal_core::progress::MIN_KEEPALIVES),
        "pings counted before and across the suspend: {p:#}"
    );
    // The seconds awake since the first check, at most: never the hours.
    let only = p["only_keepalive_ms"].as_u64().unwrap_or(u64::MAX);
    assert!(only > 0 && only <= awake, "at most {awake} ms: {p:#}");
    assert_eq!(p["left_ms"].as_u64(), Some(bound - only), "{p:#}");
    assert_eq!(p["stalled"], false, "{p:#}");
    // One ping a second, the suspend between two of them not counted.
    let took = longest(&run.seen);
    let spacing = p["keepalive_spacing_ms"].as_u64().unwrap_or(0);
    assert!(
        spacing.abs_diff(1_000) <= 2 * took + 20,
        "spacing {spacing} ms, checks took up to {took} ms: {p:#}"
    );
    let line = i
        .text
        .lines()
        .skip_while(|l| *l != "progress:")
        .nth(1)
        .unwrap_or_else(|| panic!("no progress in the text:\n{}", i.text));
    assert!(
        line.contains(", not counting 3h00m suspended: "),
        "{line:?}"
    );
}

/// Content every 1.5 s for twice the bound, checked once, then with
/// `CLOCK_BOOTTIME` 3 hours on for four checks, then back: never
/// wedged, never healed, every word in, same pid.
#[test]
fn a_streaming_call_across_boottime_jumps_is_untouched() {
    let _area = tests::area(module_path!());
    let (model, tokens) = slow_content();
    let Some(JumpRun {
        seen,
        lines,
        same_pid,
        ..
    }) = across_a_boottime_jump(
        &model,
        limit(),
        |n| if (1..=4).contains(&n) { JUMP_S } else { 0 },
        None,
        |_, lines| {
            lines
                .iter()
                .filter(|l| matches!(l, scenario::CallLine::Done(..)))
                .count()
                >= 2
        },
        "stream_boottime_jumps",
    )
    else {
        return;
    };
    assert!(
        seen.iter().any(|j| j.offset_s == JUMP_S) && seen.iter().skip(5).any(|j| j.offset_s == 0),
        "checked before, across and after the jump: {seen:#?}"
    );
    for j in &seen {
        assert!(
            ["busy", "idle", "healthy"].contains(&j.verdict.as_str()),
            "{j:?}"
        );
        assert!(!j.codes.iter().any(|c| c == "stream_stalled"), "{j:?}");
        assert!(j.heals.is_empty(), "{j:?}");
    }
    let first = lines.iter().find_map(|l| match l {
        scenario::CallLine::Done(_, t) => Some(*t),
        _ => None,
    });
    assert_eq!(first, Some(tokens), "every word in: {lines:?}");
    assert!(
        !lines
            .iter()
            .any(|l| matches!(l, scenario::CallLine::Failed(..))),
        "{lines:?}"
    );
    assert!(same_pid, "same pid");
}
