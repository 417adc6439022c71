//! What may leave selfheal as text: every output passes through here.
//!
//! - [`escape`] and [`escape_lines`]: control characters (C0 but the line
//!   ends [`escape_lines`] keeps, DEL, C1) shown as Rust escapes (`\u{1b}`),
//!   so a process name, an argv, a probe body or a path cannot drive the
//!   operator's terminal. Every text renderer (check's lines, inspect,
//!   snapshots, config check) and the log stream's writer use them.
//! - [`redact_url`]: a probe URL as it may be shown or stored: userinfo and
//!   every query value and fragment replaced by [`REDACTED`]. Probe results
//!   carry only this form, so text, log lines, `--json`, snapshots, state
//!   and metric labels never see the original.
//! - [`redact_urls_in`]: the same for every URL inside a message (an HTTP
//!   client's error names the URL it failed on).
//! - [`redact_secrets`]: a probe body's excerpt with known secret shapes
//!   replaced: bearer and basic credentials, JSON or form values of keys
//!   named like secrets, `sk-…` API keys, JWTs, AWS access keys, GitHub and
//!   Slack tokens, private key blocks.
//!
//! All pure: no I/O, no failure.

use std::{borrow::Cow, sync::LazyLock};

use regex::Regex;

/// What stands in place of a secret.
pub const REDACTED: &str = "REDACTED";

/// `s` with every control character (`char::is_control`: C0, DEL, C1)
/// escaped as Rust does (`\n`, `\u{1b}`); other text unchanged.
pub fn escape(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// `text` escaped line by line: its `\n` kept as line ends, every other
/// control character escaped.
pub fn escape_lines(text: &str) -> String {
    if !text.chars().any(|c| c.is_control() && c != '\n') {
        return text.to_string();
    }
    text.split('\n').map(escape).collect::<Vec<_>>().join("\n")
}

/// JSON text with DEL and the C1 controls (which JSON allows raw in
/// strings, and which some terminals act on) written as `\u` escapes; the
/// C0 controls are escaped by every JSON writer already. Still the same
/// JSON value.
pub fn escape_json(json: &str) -> String {
    if !json.chars().any(|c| ('\u{7f}'..='\u{9f}').contains(&c)) {
        return json.to_string();
    }
    json.chars()
        .map(|c| {
            if ('\u{7f}'..='\u{9f}').contains(&c) {
                format!("\\u{:04x}", u32::from(c))
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A URL as it may be shown: userinfo (`user:pass@`) and every query value
/// and fragment replaced by [`REDACTED`]; query names kept (so
/// `?access_token=REDACTED&v=REDACTED` still says which parameters were
/// sent). Text that is no `scheme://` URL is returned unchanged but for a
/// query or fragment, which are redacted all the same.
pub fn redact_url(url: &str) -> String {
    // Scheme and authority.
    let (head, rest) = match url.find("://") {
        Some(i) => {
            let after = &url[i + 3..];
            let end = after.find(['/', '?', '#']).unwrap_or(after.len());
            let authority = &after[..end];
            let authority = match authority.rfind('@') {
                Some(at) => Cow::Owned(format!("{REDACTED}@{}", &authority[at + 1..])),
                None => Cow::Borrowed(authority),
            };
            (format!("{}://{authority}", &url[..i]), &after[end..])
        }
        None => (String::new(), url),
    };
    let (before_fragment, fragment) = match rest.find('#') {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let (path, query) = match before_fragment.find('?') {
        Some(i) => (&before_fragment[..i], Some(&before_fragment[i + 1..])),
        None => (before_fragment, None),
    };
    let mut out = head;
    out.push_str(path);
    if let Some(q) = query {
        out.push('?');
        let parts: Vec<String> = q
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, "")) => format!("{name}="),
                Some((name, _)) => format!("{name}={REDACTED}"),
                // A bare item may be a token itself (`?sk-…`).
                None if pair.is_empty() => String::new(),
                None => REDACTED.to_string(),
            })
            .collect();
        out.push_str(&parts.join("&"));
    }
    if let Some(f) = fragment {
        out.push('#');
        if !f.is_empty() {
            out.push_str(REDACTED);
        }
    }
    out
}

/// `text` with every `http://` or `https://` URL in it passed through
/// [`redact_url`]. A URL ends at whitespace or at one of `"'<>()` and
/// backtick.
pub fn redact_urls_in(text: &str) -> String {
    // Every URL the pattern matches holds `://`: a text without it (most
    // log lines) is returned as it is, and the pattern is built only for
    // one that has it.
    if !text.contains("://") {
        return text.to_string();
    }
    static URL: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r#"(?i)https?://[^\s"'<>()`]+"#).expect("url regex"));
    URL.replace_all(text, |c: &regex::Captures<'_>| redact_url(&c[0]))
        .into_owned()
}

/// The secret shapes [`redact_secrets`] knows, each with its replacement
/// (which keeps a key's name, a scheme word, the quotes around a JSON
/// string: the excerpt stays readable, and JSON stays JSON).
static SECRETS: LazyLock<Vec<(Regex, String)>> = LazyLock::new(|| {
    // A key named like a secret, then `:` or `=`: "api_key": …,
    // password=…, 'x-auth-token': …
    const KEY: &str = r#"(?i)((?:"|')?[\w.-]*(?:api[_-]?key|apikey|token|secret|passw(?:or)?d|pwd|credential|authorization|auth|private[_-]?key|session[_-]?id|cookie)[\w.-]*(?:"|')?\s*[:=]\s*)"#;
    let r = REDACTED;
    [
        // Private key blocks, to their end (or the end of the text).
        (
            r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?s:.*?)(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\z)".to_string(),
            r.to_string(),
        ),
        // HTTP credentials: Bearer …, Basic …, Token …
        (
            r"(?i)(\b(?:bearer|basic|token)\s+)[A-Za-z0-9._~+/=-]{6,}".to_string(),
            format!("${{1}}{r}"),
        ),
        // Its value: a JSON string (perhaps cut off by the excerpt's end),
        // a single-quoted one, or a bare word.
        (format!(r#"{KEY}"(?:[^"\\]|\\.)*(?:"|\z)"#), format!("${{1}}\"{r}\"")),
        (format!(r#"{KEY}'[^']*(?:'|\z)"#), format!("${{1}}'{r}'")),
        (format!(r#"{KEY}[^\s"',;&}}\]][^\s,;&}}\]]*"#), format!("${{1}}{r}")),
        // Provider API keys: sk-…, sk-ant-…, sk-proj-…
        (r"\bsk-[A-Za-z0-9_-]{12,}".to_string(), r.to_string()),
        // JWTs: three base64url parts, the first a JSON header.
        (
            r"\beyJ[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]*".to_string(),
            r.to_string(),
        ),
        // AWS access key ids.
        (
            r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[A-Z0-9]{16}\b".to_string(),
            r.to_string(),
        ),
        // GitHub and Slack tokens.
        (
            r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})".to_string(),
            r.to_string(),
        ),
        (r"\bxox[abprs]-[A-Za-z0-9-]{10,}".to_string(), r.to_string()),
    ]
    .into_iter()
    .map(|(re, with)| (Regex::new(&re).expect("secret regex"), with))
    .collect()
});

/// `text` with known secret shapes replaced by [`REDACTED`] (see the
/// module doc), and every URL in it redacted by [`redact_url`].
pub fn redact_secrets(text: &str) -> String {
    let mut out = redact_urls_in(text);
    for (re, with) in SECRETS.iter() {
        if re.is_match(&out) {
            out = re.replace_all(&out, with.as_str()).into_owned();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_every_control_character() {
        for (input, want) in [
            ("plain name", "plain name"),
            ("a\u{1b}[2Jb", "a\\u{1b}[2Jb"),
            ("bell\u{7}", "bell\\u{7}"),
            ("del\u{7f}", "del\\u{7f}"),
            ("csi\u{9b}31m", "csi\\u{9b}31m"),
            ("nel\u{85}", "nel\\u{85}"),
            ("tab\tnl\n", "tab\\tnl\\n"),
            ("ünïcödé ✓", "ünïcödé ✓"),
        ] {
            assert_eq!(escape(input), want, "{input:?}");
        }
        assert_eq!(escape_lines("a\u{1b}\nb\r\n"), "a\\u{1b}\nb\\r\n");
        assert_eq!(escape_lines("ok\nok\n"), "ok\nok\n");
        let json = serde_json::to_string(&serde_json::json!({"n": "a\u{7f}\u{9b}\u{1b}"})).unwrap();
        let safe = escape_json(&json);
        assert_eq!(safe, r#"{"n":"a\u007f\u009b\u001b"}"#);
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back["n"], "a\u{7f}\u{9b}\u{1b}");
    }

    #[test]
    fn urls_lose_userinfo_query_values_and_fragments() {
        for (input, want) in [
            (
                "http://127.0.0.1:8080/status",
                "http://127.0.0.1:8080/status",
            ),
            ("http://user:pw@host:1/s", "http://REDACTED@host:1/s"),
            ("https://tok@host", "https://REDACTED@host"),
            (
                "http://h/s?access_token=abc&v=1&empty=&flag",
                "http://h/s?access_token=REDACTED&v=REDACTED&empty=&REDACTED",
            ),
            ("http://h/s#frag", "http://h/s#REDACTED"),
            ("http://h/s?#", "http://h/s?#"),
            ("http://a:b@h?x=@y", "http://REDACTED@h?x=REDACTED"),
            ("/path?token=1", "/path?token=REDACTED"),
            ("", ""),
        ] {
            assert_eq!(redact_url(input), want, "{input:?}");
        }
        assert_eq!(
            redact_urls_in("error sending request for url (http://u:p@h/x?t=s): refused"),
            "error sending request for url (http://REDACTED@h/x?t=REDACTED): refused"
        );
        // Without `://` nothing is a URL; with it, every URL is redacted,
        // whatever its case.
        for plain in ["agent a0: healthy", "http:/h?token=s", "https//u:p@h", ""] {
            assert_eq!(redact_urls_in(plain), plain);
        }
        assert_eq!(
            redact_urls_in("HTTPS://u:p@h/ and http://h/?k=v"),
            "HTTPS://REDACTED@h/ and http://h/?k=REDACTED"
        );
    }

    #[test]
    fn known_secret_shapes_are_redacted() {
        let body = r#"{"status":"ok","api_key":"k123456","auth":"Bearer abcdefghij","openai":"sk-abcdefghijklmnop","jwt":"eyJhbGciOi.eyJzdWIiOi.sig","aws":"AKIAABCDEFGHIJKLMNOP","password":"hunter2","gh":"ghp_abcdefghijklmnopqrstuvwxyz","note":"hello"}"#;
        let got = redact_secrets(body);
        for secret in [
            "k123456",
            "abcdefghij",
            "sk-abcdefghijklmnop",
            "eyJhbGciOi",
            "AKIAABCDEFGHIJKLMNOP",
            "hunter2",
            "ghp_abcdefghijklmnopqrstuvwxyz",
        ] {
            assert!(!got.contains(secret), "{secret} in {got}");
        }
        assert!(got.contains(r#""status":"ok""#), "{got}");
        assert!(got.contains(r#""note":"hello""#), "{got}");
        assert!(got.contains(r#""api_key":"REDACTED"#), "{got}");
        // Form and header shapes, and a value cut off by the excerpt's end.
        let got = redact_secrets(
            "password=hunter2&user=me\nAuthorization: Basic dXNlcjpwYXNz\n{\"token\":\"abc",
        );
        assert!(!got.contains("hunter2"), "{got}");
        assert!(!got.contains("dXNlcjpwYXNz"), "{got}");
        assert!(!got.contains("abc"), "{got}");
        assert!(got.contains("user=me"), "{got}");
        let key = "x\n-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\ny";
        assert_eq!(redact_secrets(key), "x\nREDACTED\ny");
        assert_eq!(
            redact_secrets("see http://h/cb?code=xyz"),
            "see http://h/cb?code=REDACTED"
        );
        // Nothing secret: unchanged.
        assert_eq!(redact_secrets("all good, 3 tasks"), "all good, 3 tasks");
    }
}
