//! The helper protocol's wire bytes, pinned: every request op and act, every
//! response shape and every error code has a representative value here,
//! and the exact line it puts on the wire (`to_line`, `\n` included) is
//! recorded under `tests/golden/`. The test checks that
//!
//! 1. serializing each value gives the recorded bytes;
//! 2. parsing the recorded bytes and serializing again gives them again;
//! 3. request lines clients send (the integration tests' own lines) parse
//!    to the recorded request, or are answered with the recorded error
//!    line, byte for byte.
//!
//! A change that moves one byte of the protocol fails here, naming the
//! case and showing the recorded and the current text.
//!
//! The golden files are written, not edited: `SELFHEAL_RECORD_GOLDEN=1
//! cargo test -p selfheal-core --test protocol_golden` rewrites them from
//! the values below. Record only when the protocol is meant to change (a
//! new version), and review the diff of `tests/golden/` as the change
//! itself.
//!
//! Files (`== NAME` starts a case):
//!
//! - `requests.txt`: the case's request line;
//! - `responses.txt`: the case's response line;
//! - `answers.txt`: `> ` the line a client sent, `< ` the line the parser
//!   makes of it: the request it is (its canonical line) or the helper's
//!   error response to it.

use std::{collections::BTreeMap, fmt::Write as _, path::PathBuf};

use selfheal_core::{
    ebpf::{BlockedRecv, Overflow, SocketActivity, Strategy, TracerSnapshot},
    keepalive::KeepaliveSettings,
    protocol::{
        ActRequest, Action, AttemptWire, Caller, EbpfStatus, ErrorCode, HelloResult, Limits,
        MAX_PIDS, MAX_REQUEST_BYTES, Op, PROTOCOL_VERSION, Request, Response, SnapshotWire,
        UnwatchResult, WatchResult, WatchedPid, parse_request,
    },
};
use serde_json::{Value, json};

const RECORD: &str = "SELFHEAL_RECORD_GOLDEN";

/// A named case: its name and its bytes.
type Cases = Vec<(String, Vec<u8>)>;

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn recording() -> bool {
    std::env::var(RECORD).as_deref() == Ok("1")
}

/// `cases` in the file format: `== NAME` lines, each followed by its text.
fn render(cases: &[(String, Vec<u8>)]) -> String {
    let mut out = String::new();
    for (name, bytes) in cases {
        let text = String::from_utf8(bytes.clone())
            .unwrap_or_else(|e| panic!("case {name} is not UTF-8: {e}"));
        assert!(
            !text.lines().any(|l| l.starts_with("== ")),
            "case {name} holds a line starting `== `"
        );
        let _ = writeln!(out, "== {name}");
        out.push_str(&text);
        if !text.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// The cases of a golden file, by name, in file order.
fn parse_golden(text: &str) -> Vec<(String, String)> {
    let mut cases: Vec<(String, String)> = Vec::new();
    for line in text.split_inclusive('\n') {
        if let Some(name) = line.strip_prefix("== ") {
            cases.push((name.trim_end().to_string(), String::new()));
        } else if let Some((_, body)) = cases.last_mut() {
            body.push_str(line);
        } else {
            panic!("golden text before the first `== ` line: {line:?}");
        }
    }
    cases
}

/// Compares `cases` with the golden file `file` (or writes it when
/// recording) and returns the recorded cases.
fn golden(file: &str, cases: &Cases) -> Vec<(String, String)> {
    let path = golden_dir().join(file);
    let now = render(cases);
    if recording() {
        std::fs::create_dir_all(golden_dir()).expect("create tests/golden");
        // Written aside and renamed: another test may be reading it.
        let aside = path.with_extension("txt.new");
        std::fs::write(&aside, &now)
            .and_then(|()| std::fs::rename(&aside, &path))
            .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        eprintln!("recorded {}", path.display());
    }
    let recorded = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "read {}: {e} (record it with {RECORD}=1, see the top of this file)",
            path.display()
        )
    });
    let old = parse_golden(&recorded);
    let new = parse_golden(&now);
    let old_map: BTreeMap<&str, &str> = old.iter().map(|(n, t)| (n.as_str(), t.as_str())).collect();
    let new_map: BTreeMap<&str, &str> = new.iter().map(|(n, t)| (n.as_str(), t.as_str())).collect();
    let mut failures = Vec::new();
    for (name, text) in &new {
        match old_map.get(name.as_str()) {
            None => failures.push(format!("{file}: case {name} is not recorded; now:\n{text}")),
            Some(rec) if rec != text => failures.push(format!(
                "{file}: case {name} changed\n  recorded: {}\n  now:      {}",
                rec.trim_end(),
                text.trim_end()
            )),
            Some(_) => {}
        }
    }
    for (name, text) in &old {
        if !new_map.contains_key(name.as_str()) {
            failures.push(format!(
                "{file}: recorded case {name} is gone; recorded:\n{text}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "the wire bytes differ from the recording:\n{}",
        failures.join("\n")
    );
    old
}

// ---------------------------------------------------------------------------
// The representative values. When the Rust types change shape, these are
// what is rewritten; the recorded bytes stay.

const PID: u32 = 1234;
const TICKS: u64 = 5170;

fn act(action: Action, fd: Option<i32>, inode: Option<u64>, params: Value) -> ActRequest {
    let mut a = ActRequest::new(action, PID, TICKS);
    a.fd = fd;
    a.inode = inode;
    a.agent = Some("sol".into());
    if let Value::Object(m) = params {
        a.params = m;
    }
    a
}

/// One request per op, and one `act` per action, with the params clients
/// send (`grace_ms` for `signal`; the proof's options for
/// `prove_keepalive`; the saved options, or none, for `restore_keepalive`).
fn requests() -> Vec<(&'static str, Request)> {
    let settings = KeepaliveSettings {
        enabled: false,
        idle_s: 7200,
        interval_s: 75,
        count: 9,
        user_timeout_ms: 0,
    };
    let settings = serde_json::to_value(settings).expect("settings serialize");
    let proof = json!({"idle_s": 1, "interval_s": 1, "count": 3, "hold_ms": 120000});
    let ops: Vec<(&'static str, Op)> = vec![
        ("hello", Op::Hello),
        (
            "watch",
            Op::Watch {
                pids: vec![PID, 1240],
            },
        ),
        ("unwatch", Op::Unwatch { pids: vec![1240] }),
        ("unwatch_none", Op::Unwatch { pids: vec![] }),
        ("ebpf_snapshot", Op::EbpfSnapshot { pids: vec![PID] }),
        (
            "act_arm_keepalive",
            Op::Act(act(Action::ArmKeepalive, Some(7), Some(4242), json!({}))),
        ),
        (
            "act_destroy_socket",
            Op::Act(act(Action::DestroySocket, Some(7), Some(4242), json!({}))),
        ),
        (
            "act_signal",
            Op::Act(act(Action::Signal, None, None, json!({"grace_ms": 10000}))),
        ),
        (
            "act_restart",
            Op::Act(act(Action::Restart, None, None, json!({}))),
        ),
        (
            "act_prove_keepalive",
            Op::Act(act(Action::ProveKeepalive, Some(7), Some(4242), proof)),
        ),
        (
            "act_restore_keepalive",
            Op::Act(act(Action::RestoreKeepalive, Some(7), Some(4242), settings)),
        ),
        (
            "act_restore_keepalive_unsaved",
            Op::Act(act(
                Action::RestoreKeepalive,
                Some(7),
                Some(4242),
                json!({}),
            )),
        ),
        (
            "act_expire_keepalive",
            Op::Act(act(Action::ExpireKeepalive, Some(7), Some(4242), json!({}))),
        ),
        ("act_signal_no_agent", {
            let mut a = ActRequest::new(Action::Signal, PID, TICKS);
            a.params.insert("grace_ms".into(), 500.into());
            Op::Act(a)
        }),
    ];
    ops.into_iter()
        .enumerate()
        .map(|(i, (name, op))| {
            (
                name,
                Request {
                    id: 7 + i as u64,
                    op,
                },
            )
        })
        .collect()
}

fn snapshot() -> TracerSnapshot {
    TracerSnapshot {
        strategy: Strategy::TpBtf,
        taken_at_ns: 123_456_789,
        blocked: vec![
            BlockedRecv {
                tgid: PID,
                tid: 1236,
                inode: Some(4242),
                fd: Some(7),
                syscall: Some("recvfrom"),
                tcp_checked: false,
                since_ns: 5,
                age_ms: 6,
            },
            BlockedRecv {
                tgid: PID,
                tid: 1237,
                inode: None,
                fd: None,
                syscall: None,
                tcp_checked: true,
                since_ns: 7,
                age_ms: 8,
            },
        ],
        sockets: vec![SocketActivity {
            inode: 4242,
            tgid: PID,
            last_recv_ms: Some(1),
            last_recv_bytes: 2,
            last_send_ms: None,
            last_send_bytes: 3,
            recv_data: 4,
            recv_empty: 5,
            recv_error: 6,
            sends: 7,
            bytes_received: 8,
            bytes_sent: 9,
        }],
        overflow: Overflow {
            in_recv_full: 1,
            socks_full: 2,
            read_failed: 3,
            in_send_full: 4,
            over_share: 5,
        },
        shares: Default::default(),
        refused: Vec::new(),
    }
}

/// A value as the helper puts it in `result` (through `serde_json::Value`,
/// whose object keys are sorted).
fn result_of(v: impl serde::Serialize) -> Value {
    serde_json::to_value(v).expect("a result serializes")
}

fn hello_result(ebpf: EbpfStatus) -> HelloResult {
    HelloResult {
        protocol: PROTOCOL_VERSION,
        helper_version: "0.1.0".into(),
        helper_pid: 99,
        caller: Caller {
            uid: 1000,
            gid: 1000,
            pid: 4321,
        },
        ebpf,
        limits: Limits {
            max_request_bytes: MAX_REQUEST_BYTES,
            request_timeout_ms: 5000,
            max_pids: MAX_PIDS,
        },
    }
}

/// One response per result shape and one per error code, with `id` set
/// and, where the helper sends it so, null.
fn responses() -> Vec<(&'static str, Response)> {
    let attached = EbpfStatus {
        strategy: Some("fentry".into()),
        attempts: vec![
            AttemptWire {
                strategy: "kprobe".into(),
                error: Some("attach tcp_recvmsg: permission denied".into()),
            },
            AttemptWire {
                strategy: "fentry".into(),
                error: None,
            },
        ],
        error: None,
    };
    let none = EbpfStatus {
        strategy: None,
        attempts: vec![],
        error: Some("eBPF disabled (--no-ebpf)".into()),
    };
    let mut snap = result_of(snapshot());
    if let Value::Object(m) = &mut snap {
        m.insert("refused".into(), json!([1240]));
    }
    let mut out: Vec<(&'static str, Response)> = vec![
        (
            "hello_with_tracer",
            Response::ok(7, result_of(hello_result(attached))),
        ),
        (
            "hello_without_tracer",
            Response::ok(7, result_of(hello_result(none))),
        ),
        (
            "watch",
            Response::ok(
                8,
                result_of(WatchResult {
                    attached_at_ns: 1_000,
                    watched: vec![
                        WatchedPid {
                            pid: PID,
                            since_ns: 2_000,
                        },
                        WatchedPid {
                            pid: 1240,
                            since_ns: 1_000,
                        },
                    ],
                    gone: vec![999_999_999],
                    refused: vec![1],
                }),
            ),
        ),
        (
            "unwatch",
            Response::ok(
                9,
                result_of(UnwatchResult {
                    unwatched: vec![1240],
                }),
            ),
        ),
        ("ebpf_snapshot", Response::ok(10, snap)),
        (
            "act_dry_run",
            Response::ok(
                11,
                json!({"dry_run": true, "action": Action::Signal, "pid": PID}),
            ),
        ),
        (
            "act_signal_escalating",
            Response::ok(
                11,
                json!({
                    "pid": PID,
                    "sent": ["SIGTERM"],
                    "exited": false,
                    "exited_after_ms": null,
                    "grace_ms": 10000,
                    "escalating": true,
                }),
            ),
        ),
    ];
    let codes = [
        ("bad_request", ErrorCode::BadRequest, "missing field `pids`"),
        (
            "too_large",
            ErrorCode::TooLarge,
            "request longer than 65536 bytes; closing",
        ),
        (
            "timeout",
            ErrorCode::Timeout,
            "request incomplete after 5000 ms; closing",
        ),
        (
            "forbidden",
            ErrorCode::Forbidden,
            "uid 1000 may not act on pid 1",
        ),
        ("gone", ErrorCode::Gone, "pid 1234 is not running"),
        (
            "failed",
            ErrorCode::Failed,
            "eBPF snapshot: map read failed",
        ),
        (
            "busy",
            ErrorCode::Busy,
            "uid 1000 is over its request rate (10 per second, bursts of 20); try again later",
        ),
        (
            "unavailable",
            ErrorCode::Unavailable,
            "no eBPF tracer: eBPF disabled (--no-ebpf)",
        ),
    ];
    for (name, code, message) in codes {
        out.push((name, Response::error(Some(12), code, message)));
    }
    for (name, code, message) in [
        (
            "bad_request_no_id",
            ErrorCode::BadRequest,
            "malformed JSON: EOF while parsing an object at line 1 column 1",
        ),
        (
            "too_large_no_id",
            ErrorCode::TooLarge,
            "request longer than 65536 bytes; closing",
        ),
        (
            "timeout_no_id",
            ErrorCode::Timeout,
            "request incomplete after 5000 ms; closing",
        ),
        (
            "busy_no_id",
            ErrorCode::Busy,
            "too many connections (at most 3)",
        ),
        (
            "message_with_escapes",
            ErrorCode::BadRequest,
            "bad agent name: \"a b\\n\" \u{1} é",
        ),
    ] {
        out.push((name, Response::error(None, code, message)));
    }
    out
}

/// Request lines clients send, from the integration tests of the helper
/// (`tests/tests/helper*.rs`) and the protocol's own examples, each
/// answered by the parser.
fn client_lines() -> Vec<(&'static str, String)> {
    let mut big = r#"{"v":1,"id":1,"op":"hello","pad":""#.to_string();
    big.push_str(&"x".repeat(200 * 1024));
    big.push_str("\"}");
    let flood: String = (0..3)
        .map(|id| format!("{{\"v\":1,\"id\":{id},\"op\":\"hello\"}}"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut v: Vec<(&'static str, String)> = vec![
        ("hello", r#"{"v":1,"id":7,"op":"hello"}"#.into()),
        ("hello_id_10", r#"{"v":1,"id":10,"op":"hello"}"#.into()),
        ("hello_crlf", "{\"v\":1,\"id\":7,\"op\":\"hello\"}\r\n".into()),
        (
            "watch_unsorted_duplicates",
            "{\"op\":\"watch\",\"pids\":[9,3,9],\"v\":1,\"id\":1}".into(),
        ),
        ("watch", r#"{"v":1,"id":8,"op":"watch","pids":[1234,1240]}"#.into()),
        ("unwatch", r#"{"v":1,"id":9,"op":"unwatch","pids":[1240]}"#.into()),
        (
            "ebpf_snapshot",
            r#"{"v":1,"id":10,"op":"ebpf_snapshot","pids":[1234]}"#.into(),
        ),
        (
            "act_arm_keepalive",
            r#"{"v":1,"id":11,"op":"act","action":"arm_keepalive","pid":1234,"start_ticks":5170,"fd":7,"inode":4242,"agent":"sol","params":{"idle_s":10}}"#.into(),
        ),
        (
            "act_prove_keepalive",
            r#"{"v":1,"id":12,"op":"act","action":"prove_keepalive","pid":1234,"start_ticks":5170,"fd":7,"inode":4242,"agent":"sol","params":{"idle_s":1,"interval_s":1,"count":3,"hold_ms":120000}}"#.into(),
        ),
        (
            "act_signal_params_empty",
            r#"{"v":1,"id":13,"op":"act","action":"signal","pid":5,"start_ticks":1,"params":{}}"#.into(),
        ),
        ("not_json", "{not json".into()),
        ("array", "[]".into()),
        ("empty", "".into()),
        ("blank", "  \t".into()),
        ("nul_bytes", "\u{0}\u{7f}".into()),
        ("version_2", r#"{"v":2,"id":5,"op":"hello"}"#.into()),
        ("version_string", r#"{"v":"1","id":3,"op":"hello"}"#.into()),
        ("no_version", r#"{"id":3,"op":"hello"}"#.into()),
        ("no_id", r#"{"v":1,"op":"hello"}"#.into()),
        ("negative_id", r#"{"v":1,"id":-1,"op":"hello"}"#.into()),
        ("no_op", r#"{"v":1,"id":3}"#.into()),
        ("op_not_string", r#"{"v":1,"id":3,"op":7}"#.into()),
        ("unknown_op", r#"{"v":1,"id":6,"op":"reboot"}"#.into()),
        ("unknown_field", r#"{"v":1,"id":3,"op":"hello","x":1}"#.into()),
        ("watch_no_pids", r#"{"v":1,"id":7,"op":"watch"}"#.into()),
        ("watch_negative_pid", r#"{"v":1,"id":3,"op":"watch","pids":[-1]}"#.into()),
        ("watch_pid_0", r#"{"v":1,"id":3,"op":"watch","pids":[0]}"#.into()),
        ("watch_pids_string", r#"{"v":1,"id":3,"op":"watch","pids":"1"}"#.into()),
        (
            "collect",
            r#"{"v":1,"id":3,"op":"collect","pids":[9,7,9],"detail":"light","budget_ms":5000}"#.into(),
        ),
        (
            "collect_no_budget",
            r#"{"v":1,"id":3,"op":"collect","pids":[7],"detail":"light"}"#.into(),
        ),
        (
            "collect_budget_too_long",
            r#"{"v":1,"id":3,"op":"collect","pids":[7],"detail":"full","budget_ms":8001}"#.into(),
        ),
        (
            "collect_unknown_detail",
            r#"{"v":1,"id":3,"op":"collect","pids":[7],"detail":"all","budget_ms":10}"#.into(),
        ),
        ("namespaces", r#"{"v":1,"id":3,"op":"namespaces","pids":[7]}"#.into()),
        ("namespaces_pid_0", r#"{"v":1,"id":3,"op":"namespaces","pids":[0]}"#.into()),
        (
            "act_no_action",
            r#"{"v":1,"id":3,"op":"act","pid":5,"start_ticks":1}"#.into(),
        ),
        (
            "act_unknown_action",
            r#"{"v":1,"id":3,"op":"act","action":"reboot","pid":5,"start_ticks":1}"#.into(),
        ),
        (
            "act_no_start_ticks",
            r#"{"v":1,"id":8,"op":"act","action":"signal","pid":5}"#.into(),
        ),
        (
            "act_pid_0",
            r#"{"v":1,"id":3,"op":"act","action":"signal","pid":0,"start_ticks":1}"#.into(),
        ),
        (
            "act_arm_keepalive_no_fd",
            r#"{"v":1,"id":9,"op":"act","action":"arm_keepalive","pid":5,"start_ticks":1}"#.into(),
        ),
        (
            "act_destroy_socket_no_fd",
            r#"{"v":1,"id":3,"op":"act","action":"destroy_socket","pid":5,"start_ticks":1}"#.into(),
        ),
        (
            "act_prove_keepalive_no_inode",
            r#"{"v":1,"id":3,"op":"act","action":"prove_keepalive","pid":5,"start_ticks":1,"fd":4}"#.into(),
        ),
        (
            "act_expire_keepalive_no_fd",
            r#"{"v":1,"id":3,"op":"act","action":"expire_keepalive","pid":5,"start_ticks":1,"inode":9}"#.into(),
        ),
        (
            "act_negative_fd",
            r#"{"v":1,"id":3,"op":"act","action":"destroy_socket","pid":5,"start_ticks":1,"fd":-3}"#.into(),
        ),
        (
            "act_bad_agent",
            r#"{"v":1,"id":3,"op":"act","action":"signal","pid":5,"start_ticks":1,"agent":"a b\n"}"#.into(),
        ),
        (
            "act_params_not_object",
            r#"{"v":1,"id":3,"op":"act","action":"signal","pid":5,"start_ticks":1,"params":[1]}"#.into(),
        ),
        (
            "act_unknown_field",
            r#"{"v":1,"id":3,"op":"act","action":"signal","pid":5,"start_ticks":1,"extra":1}"#.into(),
        ),
        ("slow_partial", r#"{"v":1,"id":1,"op":"#.into()),
        ("flood_in_one_line", flood),
        ("too_large", big),
    ];
    let pids: Vec<String> = (1..=MAX_PIDS as u32 + 1).map(|p| p.to_string()).collect();
    v.push((
        "watch_too_many_pids",
        format!(
            r#"{{"v":1,"id":1,"op":"watch","pids":[{}]}}"#,
            pids.join(",")
        ),
    ));
    v
}

/// The parser's answer to `line`: the request it is, as its canonical
/// line, or the error response the helper sends for it.
fn answer(line: &str) -> Vec<u8> {
    match parse_request(line.as_bytes()) {
        Ok(req) => req.to_line(),
        Err(e) => Response::from_error(e).to_line(),
    }
}

/// A line shown in a golden file: as it is, or escaped when it holds a
/// control character; long ones are cut, with their length and a digest
/// of the whole, so the file stays readable.
fn shown(line: &str) -> String {
    const MAX: usize = 300;
    let plain = |s: &str| {
        if s.chars().any(char::is_control) {
            s.escape_debug().to_string()
        } else {
            s.to_string()
        }
    };
    if line.len() <= MAX {
        return plain(line);
    }
    let mut end = MAX;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}… ({} bytes, fnv1a {:016x})",
        plain(&line[..end]),
        line.len(),
        fnv1a(line.as_bytes())
    )
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

// ---------------------------------------------------------------------------
// The checks.

#[test]
fn every_request_serializes_to_its_recorded_line() {
    let reqs = requests();
    let cases: Cases = reqs
        .iter()
        .map(|(name, r)| (name.to_string(), r.to_line()))
        .collect();
    let recorded = golden("requests.txt", &cases);
    for ((name, text), (_, value)) in recorded.iter().zip(&reqs) {
        let parsed = parse_request(text.as_bytes())
            .unwrap_or_else(|e| panic!("recorded request {name} does not parse: {e}\n{text}"));
        assert_eq!(
            &parsed, value,
            "recorded request {name} parses to another value"
        );
        assert_eq!(
            String::from_utf8(parsed.to_line()).expect("UTF-8"),
            *text,
            "recorded request {name}: parse then serialize"
        );
    }
    // Every op and every action has a case.
    let ops: std::collections::BTreeSet<&str> = reqs.iter().map(|(_, r)| r.op.name()).collect();
    assert_eq!(ops.len(), 5, "{ops:?}");
    let actions: std::collections::BTreeSet<&str> = reqs
        .iter()
        .filter_map(|(_, r)| match &r.op {
            Op::Act(a) => Some(a.action.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(actions.len(), 7, "{actions:?}");
}

#[test]
fn every_response_serializes_to_its_recorded_line() {
    let resps = responses();
    let cases: Cases = resps
        .iter()
        .map(|(name, r)| (name.to_string(), r.to_line()))
        .collect();
    let recorded = golden("responses.txt", &cases);
    for ((name, text), (_, value)) in recorded.iter().zip(&resps) {
        let parsed = Response::parse(text.as_bytes())
            .unwrap_or_else(|e| panic!("recorded response {name} does not parse: {e}\n{text}"));
        assert_eq!(
            &parsed, value,
            "recorded response {name} parses to another value"
        );
        assert_eq!(
            String::from_utf8(parsed.to_line()).expect("UTF-8"),
            *text,
            "recorded response {name}: parse then serialize"
        );
    }
    // Every error code a helper sends has a case.
    let codes: std::collections::BTreeSet<&str> = resps
        .iter()
        .filter_map(|(_, r)| r.error.as_ref().map(|e| e.code.as_str()))
        .collect();
    assert_eq!(codes.len(), 8, "{codes:?}");
}

#[test]
fn recorded_results_read_back_as_the_client_reads_them() {
    let recorded = parse_golden(
        &std::fs::read_to_string(golden_dir().join("responses.txt")).expect("responses.txt"),
    );
    let by_name: BTreeMap<&str, &str> = recorded
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    let result = |name: &str| -> Value {
        let text = by_name
            .get(name)
            .unwrap_or_else(|| panic!("no recorded response {name}"));
        Response::parse(text.as_bytes())
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .result
            .unwrap_or_else(|| panic!("{name} has no result"))
    };
    let hello: HelloResult =
        serde_json::from_value(result("hello_with_tracer")).expect("hello result");
    assert_eq!(hello.caller.pid, 4321);
    assert_eq!(hello.ebpf.strategy.as_deref(), Some("fentry"));
    let hello: HelloResult =
        serde_json::from_value(result("hello_without_tracer")).expect("hello result");
    assert_eq!(hello.limits.max_pids, MAX_PIDS);
    let watch: WatchResult = serde_json::from_value(result("watch")).expect("watch result");
    assert_eq!(watch.refused, vec![1]);
    let unwatch: UnwatchResult = serde_json::from_value(result("unwatch")).expect("unwatch");
    assert_eq!(unwatch.unwatched, vec![1240]);
    let wire: SnapshotWire =
        serde_json::from_value(result("ebpf_snapshot")).expect("snapshot result");
    assert_eq!(wire.refused, vec![1240]);
    let snap = wire.into_snapshot().expect("a known strategy");
    assert_eq!(snap, snapshot());
    // A code from a newer helper is read as unknown.
    let r =
        Response::parse(br#"{"v":1,"id":1,"ok":false,"error":{"code":"new_code","message":"m"}}"#)
            .expect("a response with a new code");
    assert_eq!(r.error.map(|e| e.code), Some(ErrorCode::Unknown));
}

#[test]
fn client_lines_get_their_recorded_answers() {
    let lines = client_lines();
    let cases: Cases = lines
        .iter()
        .map(|(name, line)| {
            let answer = String::from_utf8(answer(line)).expect("UTF-8 answer");
            (
                name.to_string(),
                format!("> {}\n< {answer}", shown(line)).into_bytes(),
            )
        })
        .collect();
    let recorded = golden("answers.txt", &cases);
    // A recorded answer that is a request parses to what its line does.
    for ((name, text), (_, line)) in recorded.iter().zip(&lines) {
        let answer = text
            .lines()
            .find_map(|l| l.strip_prefix("< "))
            .unwrap_or_else(|| panic!("{name}: no answer line"));
        match parse_request(line.as_bytes()) {
            Ok(req) => assert_eq!(
                parse_request(answer.as_bytes()).as_ref(),
                Ok(&req),
                "{name}: the recorded request"
            ),
            Err(e) => assert_eq!(
                Response::parse(answer.as_bytes()).as_ref(),
                Ok(&Response::from_error(e)),
                "{name}: the recorded error"
            ),
        }
    }
}
