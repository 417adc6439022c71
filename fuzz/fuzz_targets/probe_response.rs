//! The probe's judgement of a complete HTTP response
//! (`probe::evaluate_response`): status against the expected one, the body
//! as JSON, fields at JSON pointers, expectations on them; then the body
//! through the redaction and escaping every output applies (`text`). Never
//! a panic.
//!
//! Input layout (missing bytes read as 0):
//! - 0..2: status (big endian), 2: flags (bit 0: an `expect_status`; bit 1:
//!   the body starts with one more pointer, up to the first `\n`),
//!   3..5: `expect_status`;
//! - 5..7: which of [`POINTERS`] are fields (bit i: field `fi`);
//! - 7: which fields have an expectation (bit i: `fi`, value
//!   [`EXPECTED`]`[i % len]`; bit 7: one on a field that is not declared);
//! - the rest: the body.

#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use selfheal_core::probe::evaluate_response;

/// Pointers as a config may hold them (checked by `check_json_pointer`) and
/// some it refuses, since the evaluator must not rely on that check.
const POINTERS: [&str; 16] = [
    "",
    "/a",
    "/a/0",
    "/~1x",
    "/~0",
    "/a/b/c",
    "/0",
    "/status",
    "/current_task",
    "/a/-",
    "/a/01",
    "/a/18446744073709551616",
    "//",
    "/é/~01",
    "a",
    "/~",
];

const EXPECTED: [&str; 8] = [
    "connected",
    "1",
    "true",
    "null",
    "",
    "{\"a\":1}",
    "[0]",
    "é",
];

fuzz_target!(|data: &[u8]| {
    let byte = |i: usize| data.get(i).copied().unwrap_or(0);
    let status = u16::from_be_bytes([byte(0), byte(1)]);
    let flags = byte(2);
    let expect_status = (flags & 1 != 0).then(|| u16::from_be_bytes([byte(3), byte(4)]));
    let field_mask = u16::from_be_bytes([byte(5), byte(6)]);
    let expect_mask = byte(7);
    let mut body = data.get(8..).unwrap_or(&[]);

    let mut fields = BTreeMap::new();
    for (i, pointer) in POINTERS.iter().enumerate() {
        if field_mask & (1 << i) != 0 {
            fields.insert(format!("f{i}"), (*pointer).to_string());
        }
    }
    if flags & 2 != 0 {
        let end = body.iter().position(|b| *b == b'\n').unwrap_or(body.len());
        let pointer = String::from_utf8_lossy(&body[..end]).into_owned();
        body = body.get(end + 1..).unwrap_or(&[]);
        fields.insert("extra".to_string(), pointer);
    }
    let mut expect = BTreeMap::new();
    for i in 0..7 {
        if expect_mask & (1 << i) != 0 {
            expect.insert(format!("f{i}"), EXPECTED[i % EXPECTED.len()].to_string());
        }
    }
    if expect_mask & 0x80 != 0 {
        expect.insert("undeclared".to_string(), "x".to_string());
    }

    let e = evaluate_response(status, body, expect_status, &fields, &expect);
    // What the caller does with it: render it.
    let _ = format!("{e:?}");
    assert_eq!(e.expectations.len(), expect.len());
    assert!(!e.ok || e.error.is_none());

    // What every output does with a body and a URL: redact and escape.
    // Never a panic, and what comes out holds no control character.
    let text = String::from_utf8_lossy(body);
    let redacted = selfheal_core::text::redact_secrets(&text);
    let _ = selfheal_core::text::redact_url(&text);
    let shown = selfheal_core::text::escape_lines(&redacted);
    assert!(!shown.chars().any(|c| c.is_control() && c != '\n'));
});
