//! The pure half of probes: what a probe's result is ([`ProbeResult`],
//! [`ProbeError`]) and how a complete answer is judged: an HTTP response
//! ([`evaluate_response`]: status, JSON fields at pointers, expectations)
//! or a health file's stat ([`health_file_result`]). Sending requests and
//! reading files is the edge's (`selfheal::probe`).
//!
//! A result never holds the URL as written: its target is
//! [`redact_url`]'s form, and a body excerpt passes [`redact_secrets`].

use std::{
    collections::BTreeMap,
    io,
    time::{Duration, SystemTime},
};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    config::ProbeConfig,
    text::{redact_secrets, redact_url},
};

/// The most of a response body that is read; a larger body fails the probe
/// with [`ProbeError::TooLarge`] and is not read further.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// How much of a body a result keeps ([`ProbeResult::body_excerpt`]), so
/// snapshots stay bounded.
pub const EXCERPT_BYTES: usize = 4 << 10;

/// Redirects followed before [`ProbeError::RedirectLoop`].
pub const MAX_REDIRECTS: usize = 5;

/// Which kind of probe a result is from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeKind {
    /// An HTTP request (`url = …`).
    Http,
    /// A file's modification time (`health_file = …`).
    HealthFile,
}

/// Why a probe failed: a stable code (`refused`, `timeout`, …) in JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "snake_case")]
pub enum ProbeError {
    /// Nothing listens on the port (the connection was refused).
    #[error("connection refused")]
    Refused,
    /// No complete answer within the probe's timeout (connecting, waiting
    /// for the response, or reading its body).
    #[error("timed out")]
    Timeout,
    /// Another failure to connect: name resolution, unreachable network,
    /// TLS handshake.
    #[error("cannot connect")]
    Connect,
    /// The status is not the expected one (any 2xx when none is set).
    #[error("unexpected status")]
    UnexpectedStatus,
    /// Fields are wanted but the body is not JSON.
    #[error("body is not json")]
    BadJson,
    /// The body is larger than [`MAX_BODY_BYTES`].
    #[error("body too large")]
    TooLarge,
    /// More than [`MAX_REDIRECTS`] redirects (a loop, or a chain too long).
    #[error("too many redirects")]
    RedirectLoop,
    /// A redirect to another origin (scheme, host or port), which a probe
    /// does not follow: the answer would not be the agent's.
    #[error("redirect to another origin refused")]
    RedirectRefused,
    /// The probe cannot be sent as configured (a URL or method the HTTP
    /// client refuses), or the HTTP client cannot be built.
    #[error("probe cannot be sent")]
    Invalid,
    /// Another I/O failure: the connection closed or reset mid-answer, a
    /// health file that cannot be read.
    #[error("i/o error")]
    Io,
    /// The health file does not exist.
    #[error("health file missing")]
    Missing,
    /// The health file is older than its maximum age.
    #[error("health file stale")]
    Stale,
}

impl ProbeError {
    /// The stable code, as in JSON: `refused`, `timeout`, `bad_json`, …
    pub fn code(self) -> &'static str {
        match self {
            ProbeError::Refused => "refused",
            ProbeError::Timeout => "timeout",
            ProbeError::Connect => "connect",
            ProbeError::UnexpectedStatus => "unexpected_status",
            ProbeError::BadJson => "bad_json",
            ProbeError::TooLarge => "too_large",
            ProbeError::RedirectLoop => "redirect_loop",
            ProbeError::RedirectRefused => "redirect_refused",
            ProbeError::Invalid => "invalid",
            ProbeError::Io => "io",
            ProbeError::Missing => "missing",
            ProbeError::Stale => "stale",
        }
    }
}

/// One `expect` entry checked against the extracted field.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expectation {
    /// The field name (declared in the probe's `fields`).
    pub field: String,
    /// The value expected, as written in the config.
    pub expected: String,
    /// The field's value rendered as a string (a JSON string without its
    /// quotes, other values as JSON text); `None` when the pointer found
    /// nothing.
    pub actual: Option<String>,
    /// Whether `actual` equals `expected`.
    pub met: bool,
}

/// The outcome of one probe.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeResult {
    /// The URL with its userinfo, query values and fragment redacted
    /// ([`redact_url`]: this is the only form any output gets), or the
    /// health file's path, as text.
    pub target: String,
    pub kind: ProbeKind,
    /// Every check passed: no `error`, and every expectation met.
    pub ok: bool,
    /// HTTP: from sending the request to the outcome (body read, or the
    /// failure). `None` for health files.
    pub latency_ms: Option<u64>,
    /// HTTP: the final status (after redirects), when a response came.
    pub status: Option<u16>,
    /// Field name → the JSON value at its pointer. A pointer that finds
    /// nothing leaves its field out (absent, not an error).
    pub fields: BTreeMap<String, Value>,
    /// The expectations in name order, each with what was found.
    pub expectations: Vec<Expectation>,
    /// Why the probe got no usable answer. `None` when it got one, even if
    /// an expectation is unmet: the agent answered, and what it says is the
    /// judge's to weigh against the kernel (then `ok` is false and `detail`
    /// names the unmet fields).
    pub error: Option<ProbeError>,
    /// A human message: the failure, the unmet expectations, or an oddity
    /// (a health file modified in the future).
    pub detail: Option<String>,
    /// The first [`EXCERPT_BYTES`] of the body (UTF-8, lossily), known
    /// secret shapes redacted ([`redact_secrets`]), when there was one and
    /// the probe's `body_excerpt` is on.
    pub body_excerpt: Option<String>,
    /// Health file: how long ago it was last modified.
    pub age_ms: Option<u64>,
}

impl ProbeResult {
    /// A result that is so far ok, with nothing found yet.
    pub fn new(target: String, kind: ProbeKind) -> ProbeResult {
        ProbeResult {
            target,
            kind,
            ok: true,
            latency_ms: None,
            status: None,
            fields: BTreeMap::new(),
            expectations: Vec::new(),
            error: None,
            detail: None,
            body_excerpt: None,
            age_ms: None,
        }
    }

    /// Marks the result failed with `error` (keeping an earlier error).
    pub fn fail(&mut self, error: ProbeError, detail: String) {
        if self.error.is_none() {
            self.error = Some(error);
            self.detail = Some(detail);
        }
        self.ok = false;
    }

    /// A result for `probe` that failed before anything was learned.
    pub fn failed(probe: &ProbeConfig, error: ProbeError, detail: String) -> ProbeResult {
        let (target, kind) = target_of(probe);
        let mut r = ProbeResult::new(target, kind);
        r.fail(error, detail);
        r
    }
}

/// The target text and kind of a probe.
pub fn target_of(probe: &ProbeConfig) -> (String, ProbeKind) {
    match probe {
        ProbeConfig::Http { url, .. } => (redact_url(url), ProbeKind::Http),
        ProbeConfig::HealthFile { path, .. } => (path.display().to_string(), ProbeKind::HealthFile),
    }
}

/// `1 MiB`, `4 KiB`, or bytes.
pub fn size_text(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} bytes")
    }
}

/// What a complete response amounts to.
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluation {
    /// No error and every expectation met.
    pub ok: bool,
    /// The first failure found: status, then JSON.
    pub error: Option<ProbeError>,
    /// The failure's message, else the unmet expectations'.
    pub detail: Option<String>,
    /// Fields found (absent pointers left out).
    pub fields: BTreeMap<String, Value>,
    /// Every expectation, in name order.
    pub expectations: Vec<Expectation>,
}

/// Judges a complete response (pure): the status against `expect_status`
/// (any 2xx when `None`); when `fields` is not empty, the body as JSON and
/// each field at its pointer; then each expectation (unmet ones are no
/// error, but make the result not ok). Fields are extracted
/// even from a response with an unexpected status when its body is JSON (a
/// 503 may still say why).
pub fn evaluate_response(
    status: u16,
    body: &[u8],
    expect_status: Option<u16>,
    fields: &BTreeMap<String, String>,
    expect: &BTreeMap<String, String>,
) -> Evaluation {
    let mut error = None;
    if !status_ok(status, expect_status) {
        let wanted = match expect_status {
            Some(s) => s.to_string(),
            None => "2xx".to_string(),
        };
        error = Some((
            ProbeError::UnexpectedStatus,
            format!("status {status}, expected {wanted}"),
        ));
    }
    let mut found = BTreeMap::new();
    if !fields.is_empty() {
        match serde_json::from_slice::<Value>(body) {
            Ok(doc) => found = extract_fields(&doc, fields),
            Err(e) => {
                if error.is_none() {
                    let what = if body.is_empty() {
                        "body is empty, expected json".to_string()
                    } else {
                        format!("body is not json: {e}")
                    };
                    error = Some((ProbeError::BadJson, what));
                }
            }
        }
    }
    let expectations = evaluate_expectations(&found, expect);
    let all_met = expectations.iter().all(|x| x.met);
    let detail = match error {
        Some((_, ref detail)) => Some(detail.clone()),
        None if all_met => None,
        None => Some(
            expectations
                .iter()
                .filter(|x| !x.met)
                .map(|x| match &x.actual {
                    Some(actual) => {
                        format!("field {} is {actual:?}, expected {:?}", x.field, x.expected)
                    }
                    None => format!("field {} is absent, expected {:?}", x.field, x.expected),
                })
                .collect::<Vec<_>>()
                .join("; "),
        ),
    };
    Evaluation {
        ok: error.is_none() && all_met,
        error: error.map(|(e, _)| e),
        detail,
        fields: found,
        expectations,
    }
}

/// Whether `status` is as expected: equal to `expect` when set, else 2xx.
fn status_ok(status: u16, expect: Option<u16>) -> bool {
    match expect {
        Some(want) => status == want,
        None => (200..300).contains(&status),
    }
}

/// Each field's value at its JSON pointer; pointers that find nothing are
/// left out.
fn extract_fields(doc: &Value, pointers: &BTreeMap<String, String>) -> BTreeMap<String, Value> {
    pointers
        .iter()
        .filter_map(|(name, pointer)| doc.pointer(pointer).map(|v| (name.clone(), v.clone())))
        .collect()
}

/// A field's value as compared with an expectation: a JSON string without
/// its quotes, anything else as JSON text (`42`, `true`, `null`, `{"a":1}`).
fn render(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Every expectation checked against the fields found.
fn evaluate_expectations(
    fields: &BTreeMap<String, Value>,
    expect: &BTreeMap<String, String>,
) -> Vec<Expectation> {
    expect
        .iter()
        .map(|(field, expected)| {
            let actual = fields.get(field).map(render);
            Expectation {
                field: field.clone(),
                expected: expected.clone(),
                met: actual.as_deref() == Some(expected.as_str()),
                actual,
            }
        })
        .collect()
}

/// The first [`EXCERPT_BYTES`] of a body as text with known secret shapes
/// redacted ([`redact_secrets`]), `None` when empty. Twice as much is
/// redacted before the cut, so that a secret straddling it is still
/// recognised. A multi-byte character cut at the end is dropped rather
/// than shown as a replacement character; other invalid bytes are
/// replaced.
pub fn excerpt(body: &[u8]) -> Option<String> {
    if body.is_empty() {
        return None;
    }
    let mut cut = &body[..body.len().min(2 * EXCERPT_BYTES)];
    if cut.len() < body.len() {
        cut = &cut[..whole_chars(cut)];
    }
    let mut text = redact_secrets(&String::from_utf8_lossy(cut));
    if text.len() > EXCERPT_BYTES {
        let mut end = EXCERPT_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    Some(text)
}

/// The length of `bytes` without a UTF-8 sequence cut short at its end.
fn whole_chars(bytes: &[u8]) -> usize {
    let n = bytes.len();
    for back in 1..=n.min(4) {
        let b = bytes[n - back];
        if b & 0xC0 != 0x80 {
            // The last lead byte (or ASCII): how long its sequence should be.
            let need = match b {
                0xF0.. => 4,
                0xE0.. => 3,
                0xC0.. => 2,
                _ => 1,
            };
            return if need > back { n - back } else { n };
        }
    }
    n
}

/// What went wrong on the way, as reqwest tells it, reduced to what the
/// probe's error kind depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// A timeout fired (connect or total).
    Timeout,
    /// Connecting failed; the underlying I/O error kind, if one was given.
    Connect(Option<io::ErrorKind>),
    /// The redirect policy stopped the chain.
    Redirect,
    /// The redirect policy refused a redirect to another origin.
    CrossOrigin,
    /// The request could not be built (URL, method, headers).
    Builder,
    /// Anything else (connection closed or reset mid-answer, protocol
    /// errors); the I/O error kind, if one was given.
    Other(Option<io::ErrorKind>),
}

/// The probe error kind of a transport failure (pure).
pub fn classify(failure: Failure) -> ProbeError {
    match failure {
        Failure::Timeout
        | Failure::Connect(Some(io::ErrorKind::TimedOut))
        | Failure::Other(Some(io::ErrorKind::TimedOut)) => ProbeError::Timeout,
        Failure::Connect(Some(io::ErrorKind::ConnectionRefused)) => ProbeError::Refused,
        Failure::Connect(_) => ProbeError::Connect,
        Failure::Redirect => ProbeError::RedirectLoop,
        Failure::CrossOrigin => ProbeError::RedirectRefused,
        Failure::Builder => ProbeError::Invalid,
        Failure::Other(_) => ProbeError::Io,
    }
}

/// Judges a health file from its stat (pure): `missing` when it does not
/// exist, `io` when it cannot be read, `stale` when `now − mtime` exceeds
/// `max_age`.
///
/// The age is measured in wall-clock time (`SystemTime`), unlike every other
/// age in selfheal (`CLOCK_BOOTTIME`, see [`crate::clock`]): a file's mtime
/// is wall-clock by nature. So a clock step changes the age; an mtime in the
/// future (clock skew, or the clock set back) counts as age 0 and is noted
/// in `detail`.
pub fn health_file_result(
    target: String,
    max_age: Duration,
    stat: io::Result<SystemTime>,
    now: SystemTime,
) -> ProbeResult {
    let mut r = ProbeResult::new(target, ProbeKind::HealthFile);
    let mtime = match stat {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let detail = format!("health file {} does not exist", r.target);
            r.fail(ProbeError::Missing, detail);
            return r;
        }
        Err(e) => {
            let detail = format!("cannot stat health file {}: {e}", r.target);
            r.fail(ProbeError::Io, detail);
            return r;
        }
    };
    let age = match now.duration_since(mtime) {
        Ok(age) => age,
        Err(ahead) => {
            r.detail = Some(format!(
                "health file {} was modified {} in the future (clock skew?)",
                r.target,
                humantime::format_duration(round_ms(ahead.duration()))
            ));
            Duration::ZERO
        }
    };
    r.age_ms = Some(crate::clock::ms(age));
    if age > max_age {
        let detail = format!(
            "health file {} last modified {} ago, more than its max age {}",
            r.target,
            humantime::format_duration(round_ms(age)),
            humantime::format_duration(max_age)
        );
        r.fail(ProbeError::Stale, detail);
    }
    r
}

/// A duration cut to whole milliseconds (for messages).
fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(crate::clock::ms(d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn status_rules() {
        assert!(status_ok(200, None));
        assert!(status_ok(204, None));
        assert!(status_ok(299, None));
        assert!(!status_ok(301, None));
        assert!(!status_ok(500, None));
        assert!(!status_ok(199, None));
        assert!(status_ok(503, Some(503)));
        assert!(!status_ok(200, Some(204)));
    }

    #[test]
    fn fields_by_pointer_absent_is_left_out() {
        let doc = json!({"status": "connected", "task": {"id": 7}, "list": [1, 2], "n": null});
        let got = extract_fields(
            &doc,
            &map(&[
                ("status", "/status"),
                ("id", "/task/id"),
                ("second", "/list/1"),
                ("nothing", "/missing"),
                ("null", "/n"),
                ("whole", ""),
            ]),
        );
        assert_eq!(got["status"], json!("connected"));
        assert_eq!(got["id"], json!(7));
        assert_eq!(got["second"], json!(2));
        assert_eq!(got["null"], Value::Null);
        assert_eq!(got["whole"], doc);
        assert!(!got.contains_key("nothing"));
    }

    #[test]
    fn rendering_for_expectations() {
        assert_eq!(render(&json!("connected")), "connected");
        assert_eq!(render(&json!(42)), "42");
        assert_eq!(render(&json!(true)), "true");
        assert_eq!(render(&Value::Null), "null");
        assert_eq!(render(&json!({"a": 1})), r#"{"a":1}"#);
        assert_eq!(render(&json!("say \"hi\"")), "say \"hi\"");
    }

    #[test]
    fn expectations_met_unmet_absent() {
        let fields: BTreeMap<String, Value> = [
            ("status".to_string(), json!("connected")),
            ("count".to_string(), json!(3)),
        ]
        .into();
        let got = evaluate_expectations(
            &fields,
            &map(&[("status", "connected"), ("count", "4"), ("gone", "x")]),
        );
        assert_eq!(
            got,
            vec![
                Expectation {
                    field: "count".into(),
                    expected: "4".into(),
                    actual: Some("3".into()),
                    met: false
                },
                Expectation {
                    field: "gone".into(),
                    expected: "x".into(),
                    actual: None,
                    met: false
                },
                Expectation {
                    field: "status".into(),
                    expected: "connected".into(),
                    actual: Some("connected".into()),
                    met: true
                },
            ]
        );
    }

    #[test]
    fn evaluation_order_and_details() {
        let fields = map(&[("s", "/status")]);
        let expect = map(&[("s", "connected")]);
        let ok = evaluate_response(200, br#"{"status":"connected"}"#, None, &fields, &expect);
        assert!(ok.ok);
        assert_eq!(ok.error, None);
        assert_eq!(ok.detail, None);
        assert_eq!(ok.fields["s"], json!("connected"));

        // An unmet expectation is an answer, not an error: not ok all the same.
        let unmet = evaluate_response(200, br#"{"status":"gone"}"#, None, &fields, &expect);
        assert!(!unmet.ok);
        assert_eq!(unmet.error, None);
        let detail = unmet.detail.unwrap();
        assert!(
            detail.contains(r#"field s is "gone", expected "connected""#),
            "{detail}"
        );

        let absent = evaluate_response(200, b"{}", None, &fields, &expect);
        assert!(!absent.ok);
        assert_eq!(absent.error, None);
        let detail = absent.detail.unwrap();
        assert!(detail.contains("absent"), "{detail}");

        let bad = evaluate_response(200, b"<html>", None, &fields, &expect);
        assert!(!bad.ok);
        assert_eq!(bad.error, Some(ProbeError::BadJson));
        let detail = bad.detail.unwrap();
        assert!(detail.starts_with("body is not json: "), "{detail}");
        assert!(bad.fields.is_empty());
        assert!(!bad.expectations[0].met);

        let empty = evaluate_response(200, b"", None, &fields, &BTreeMap::new());
        assert_eq!(empty.error.unwrap(), ProbeError::BadJson);

        // Status first, but fields still read from a JSON error body.
        let status = evaluate_response(503, br#"{"status":"draining"}"#, None, &fields, &expect);
        assert_eq!(status.error, Some(ProbeError::UnexpectedStatus));
        assert_eq!(status.detail.as_deref(), Some("status 503, expected 2xx"));
        assert_eq!(status.fields["s"], json!("draining"));

        let wanted = evaluate_response(200, b"", Some(204), &BTreeMap::new(), &BTreeMap::new());
        assert_eq!(wanted.detail.as_deref(), Some("status 200, expected 204"));

        // No fields wanted: the body need not be JSON.
        let plain = evaluate_response(200, b"ok", None, &BTreeMap::new(), &BTreeMap::new());
        assert!(plain.ok);
        assert_eq!(plain.error, None);
    }

    #[test]
    fn hostile_json_is_an_error_not_a_crash() {
        let deep = "[".repeat(100_000);
        let got = evaluate_response(
            200,
            deep.as_bytes(),
            None,
            &map(&[("a", "/a")]),
            &BTreeMap::new(),
        );
        assert_eq!(got.error, Some(ProbeError::BadJson));
        let got = evaluate_response(
            200,
            &[0xff, 0xfe, 0x00],
            None,
            &map(&[("a", "/a")]),
            &BTreeMap::new(),
        );
        assert_eq!(got.error, Some(ProbeError::BadJson));
    }

    #[test]
    fn classification() {
        use io::ErrorKind as K;
        let cases = [
            (Failure::Timeout, ProbeError::Timeout),
            (
                Failure::Connect(Some(K::ConnectionRefused)),
                ProbeError::Refused,
            ),
            (Failure::Connect(Some(K::TimedOut)), ProbeError::Timeout),
            (
                Failure::Connect(Some(K::HostUnreachable)),
                ProbeError::Connect,
            ),
            (Failure::Connect(None), ProbeError::Connect),
            (Failure::Redirect, ProbeError::RedirectLoop),
            (Failure::Builder, ProbeError::Invalid),
            (Failure::Other(Some(K::ConnectionReset)), ProbeError::Io),
            (Failure::Other(Some(K::TimedOut)), ProbeError::Timeout),
            (Failure::Other(None), ProbeError::Io),
        ];
        for (failure, want) in cases {
            assert_eq!(classify(failure), want, "{failure:?}");
        }
    }

    #[test]
    fn excerpts_are_bounded_and_cut_on_characters() {
        assert_eq!(excerpt(b""), None);
        assert_eq!(excerpt(b"hello").as_deref(), Some("hello"));
        let big = vec![b'a'; 10 * EXCERPT_BYTES];
        assert_eq!(excerpt(&big).unwrap().len(), EXCERPT_BYTES);
        // A 3-byte character straddling the cut is dropped whole.
        let mut split = vec![b'a'; EXCERPT_BYTES - 1];
        split.extend_from_slice("€€".as_bytes());
        let got = excerpt(&split).unwrap();
        assert_eq!(got.len(), EXCERPT_BYTES - 1);
        assert!(!got.contains('\u{fffd}'));
        // Invalid bytes are replaced, not refused.
        assert_eq!(excerpt(&[b'o', 0xff, b'k']).as_deref(), Some("o\u{fffd}k"));
    }

    #[test]
    fn health_file_rules() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let max = Duration::from_secs(30);
        let result = |modified| health_file_result("/h".into(), max, modified, now);
        let fresh = result(Ok(now - Duration::from_secs(5)));
        assert!(fresh.ok);
        assert_eq!(fresh.age_ms, Some(5_000));
        assert_eq!(fresh.kind, ProbeKind::HealthFile);
        assert_eq!(fresh.error, None);

        let edge = result(Ok(now - max));
        assert!(edge.ok, "exactly max_age is not stale");

        let stale = result(Ok(now - Duration::from_secs(31)));
        assert_eq!(stale.error, Some(ProbeError::Stale));
        assert!(!stale.ok);
        assert_eq!(stale.age_ms, Some(31_000));
        assert!(stale.detail.unwrap().contains("31s ago"));

        let future = result(Ok(now + Duration::from_secs(9)));
        assert!(future.ok);
        assert_eq!(future.age_ms, Some(0));
        assert!(future.detail.unwrap().contains("future"));

        let missing = result(Err(io::Error::from(io::ErrorKind::NotFound)));
        assert_eq!(missing.error, Some(ProbeError::Missing));
        assert_eq!(missing.age_ms, None);

        let denied = result(Err(io::Error::from(io::ErrorKind::PermissionDenied)));
        assert_eq!(denied.error, Some(ProbeError::Io));
    }

    #[test]
    fn error_codes_serialize_snake_case() {
        for e in [
            ProbeError::Refused,
            ProbeError::Timeout,
            ProbeError::Connect,
            ProbeError::UnexpectedStatus,
            ProbeError::BadJson,
            ProbeError::TooLarge,
            ProbeError::RedirectLoop,
            ProbeError::RedirectRefused,
            ProbeError::Invalid,
            ProbeError::Io,
            ProbeError::Missing,
            ProbeError::Stale,
        ] {
            assert_eq!(serde_json::to_value(e).unwrap(), json!(e.code()));
        }
        assert_eq!(
            serde_json::to_value(ProbeKind::HealthFile).unwrap(),
            json!("health_file")
        );
    }

    #[test]
    fn result_round_trips_through_json() {
        let mut r = ProbeResult::new("http://localhost/".into(), ProbeKind::Http);
        r.fail(ProbeError::Refused, "connection refused".into());
        r.fields.insert("a".into(), json!([1, "x"]));
        let text = serde_json::to_string(&r).unwrap();
        let back: ProbeResult = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"], json!("refused"));
        assert_eq!(v["kind"], json!("http"));
        assert_eq!(v["ok"], json!(false));
    }

    #[test]
    fn sizes_in_messages() {
        assert_eq!(size_text(MAX_BODY_BYTES), "1 MiB");
        assert_eq!(size_text(EXCERPT_BYTES), "4 KiB");
        assert_eq!(size_text(10), "10 bytes");
    }
}
