//! The `[[agent.upstream]]` and `[[agent.probe]]` tables: upstream
//! addresses as written (`host:port`, `ip:port`, a CIDR, `:port`), and HTTP
//! and health-file probes with their credentials, fields and redirects.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    str::FromStr,
};

use toml::de::DeValue;

use super::{
    ConfigError, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_SILENCE, DEFAULT_PROBE_TIMEOUT,
    DEFAULT_STALL_AFTER, ProbeAuth, ProbeConfig, Redirects, Role, SecretSource, Upstream,
    UpstreamAddr, walk::Fields,
};

const UPSTREAM_KEYS: &[&str] = &[
    "role",
    "addr",
    "heartbeat",
    "suspect_after",
    "max_silence",
    "connect_timeout",
    "stall_after",
];
const PROBE_KEYS: &[&str] = &[
    "url",
    "method",
    "timeout",
    "expect_status",
    "fields",
    "expect",
    "health_file",
    "max_age",
    "auth",
    "redirects",
    "body_excerpt",
];
const HTTP_ONLY: &[&str] = &[
    "method",
    "timeout",
    "expect_status",
    "fields",
    "expect",
    "auth",
    "redirects",
    "body_excerpt",
];
const AUTH_KEYS: &[&str] = &["bearer_file", "bearer_env", "header"];
const METHODS: &[&str] = &["GET", "HEAD", "POST"];

impl FromStr for UpstreamAddr {
    type Err = String;

    /// Parses `host:port`, `ip:port`, `[v6]:port`, a CIDR (`10.0.0.0/8`,
    /// `::1/128`) or `:port`. The error says what is wrong and what to write.
    fn from_str(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Err("empty address (write host:port, ip:port, a CIDR or :port)".into());
        }
        if s.chars().any(char::is_whitespace) {
            return Err(format!("bad address {s:?}: contains a space"));
        }
        if let Ok(sa) = s.parse::<SocketAddr>() {
            nonzero_port(sa.port(), s)?;
            return Ok(UpstreamAddr::Socket(sa));
        }
        if let Some((net, prefix)) = s.split_once('/') {
            let ip: IpAddr = net
                .parse()
                .map_err(|_| format!("bad CIDR {s:?}: {net:?} is not an IP address"))?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let prefix = Some(prefix)
                .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|p| p.parse::<u8>().ok())
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("bad CIDR {s:?}: prefix must be 0 to {max}"))?;
            return Ok(UpstreamAddr::Cidr(ip, prefix));
        }
        if let Some(port) = s.strip_prefix(':')
            && !port.is_empty()
            && port.bytes().all(|b| b.is_ascii_digit())
        {
            return Ok(UpstreamAddr::Port(parse_port(port, s)?));
        }
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Err(match ip {
                IpAddr::V4(_) => {
                    format!("bad address {s:?}: no port (write {s}:PORT, or {s}/32 for any port)")
                }
                IpAddr::V6(_) => format!(
                    "bad address {s:?}: no port (write [{s}]:PORT, or {s}/128 for any port)"
                ),
            });
        }
        let Some((host, port)) = s.rsplit_once(':') else {
            return Err(format!("bad address {s:?}: no port (write {s}:PORT)"));
        };
        if host.starts_with('[') || host.contains(':') {
            return Err(format!(
                "bad address {s:?}: not an IPv6 address with a port (write [v6]:PORT)"
            ));
        }
        let port = parse_port(port, s)?;
        if !valid_host(host) {
            return Err(format!("bad address {s:?}: {host:?} is not a host name"));
        }
        Ok(UpstreamAddr::Host {
            host: host.to_string(),
            port,
        })
    }
}

fn parse_port(port: &str, whole: &str) -> Result<u16, String> {
    let p = Some(port)
        .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|p| p.parse::<u16>().ok())
        .ok_or_else(|| format!("bad address {whole:?}: bad port {port:?}"))?;
    nonzero_port(p, whole)?;
    Ok(p)
}

fn nonzero_port(port: u16, whole: &str) -> Result<(), String> {
    if port == 0 {
        return Err(format!("bad address {whole:?}: port 0 is no remote port"));
    }
    Ok(())
}

/// A DNS name: labels of letters, digits, `-` and `_`, separated by dots
/// (one trailing dot allowed).
fn valid_host(host: &str) -> bool {
    let h = host.strip_suffix('.').unwrap_or(host);
    !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// One `[[agent.upstream]]` table.
pub(super) fn upstream(u: &Fields<'_, '_>) -> Result<Upstream, ConfigError> {
    u.only(UPSTREAM_KEYS)?;
    let roles = [("control", Role::Control), ("provider", Role::Provider)];
    let Some(role) = choice(u, "role", &roles, |other| {
        format!("bad role {other:?} (expected control or provider)")
    })?
    else {
        return Err(u.table_error("key `role`: missing (control or provider)"));
    };
    let addr = match u.string("addr")? {
        None => {
            return Err(u.table_error("key `addr`: missing (host:port, ip:port, a CIDR or :port)"));
        }
        Some((s, span)) => s
            .parse::<UpstreamAddr>()
            .map_err(|e| u.key_error("addr", span, e))?,
    };
    let heartbeat = u.duration("heartbeat")?;
    if heartbeat.is_some() && role != Role::Control {
        let (span, _) = u.get("heartbeat").expect("heartbeat was read");
        return Err(u.key_error(
            "heartbeat",
            span,
            format!("only a control upstream has a heartbeat (this one is {role})"),
        ));
    }
    Ok(Upstream {
        role,
        addr,
        heartbeat,
        suspect_after: u.duration("suspect_after")?,
        max_silence: u.duration("max_silence")?.unwrap_or(DEFAULT_MAX_SILENCE),
        connect_timeout: u
            .duration("connect_timeout")?
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT),
        stall_after: u.duration_or_off("stall_after")?.unwrap_or(match role {
            Role::Provider => Some(DEFAULT_STALL_AFTER),
            Role::Control => None,
        }),
    })
}

/// One `[[agent.probe]]` table.
pub(super) fn probe(p: &Fields<'_, '_>) -> Result<ProbeConfig, ConfigError> {
    p.only(PROBE_KEYS)?;
    match (p.get("url"), p.get("health_file")) {
        (Some(_), Some((span, _))) => Err(p.key_error(
            "health_file",
            span,
            "a probe has either url or health_file, not both",
        )),
        (None, None) => Err(p.table_error("no url or health_file: give one")),
        (None, Some(_)) => {
            for key in HTTP_ONLY {
                if let Some((span, _)) = p.get(key) {
                    return Err(p.key_error(key, span, "only with url, not health_file"));
                }
            }
            let (path, span) = p.string("health_file")?.expect("health_file is present");
            if !Path::new(path).is_absolute() {
                return Err(p.key_error(
                    "health_file",
                    span,
                    format!("{path:?} is not an absolute path"),
                ));
            }
            let Some(max_age) = p.duration("max_age")? else {
                return Err(p.table_error(
                    "key `max_age`: missing (how old health_file may get, e.g. \"30s\")",
                ));
            };
            Ok(ProbeConfig::HealthFile {
                path: PathBuf::from(path),
                max_age,
            })
        }
        (Some(_), None) => {
            if let Some((span, _)) = p.get("max_age") {
                return Err(p.key_error("max_age", span, "only with health_file, not url"));
            }
            let (url, span) = p.string("url")?.expect("url is present");
            check_url(url).map_err(|e| p.key_error("url", span, e))?;
            let method = match p.string("method")? {
                None => "GET".to_string(),
                Some((m, span)) => {
                    let upper = m.to_ascii_uppercase();
                    if !METHODS.contains(&upper.as_str()) {
                        return Err(p.key_error(
                            "method",
                            span,
                            format!("bad method {m:?} (expected {})", METHODS.join(", ")),
                        ));
                    }
                    upper
                }
            };
            let timeout = p.duration("timeout")?.unwrap_or(DEFAULT_PROBE_TIMEOUT);
            let expect_status = match p.integer("expect_status")? {
                None => None,
                Some((n, span)) => match u16::try_from(n) {
                    Ok(s) if (100..=599).contains(&s) => Some(s),
                    _ => {
                        return Err(p.key_error(
                            "expect_status",
                            span,
                            format!("bad HTTP status {n} (100 to 599)"),
                        ));
                    }
                },
            };
            let fields = string_map(p, "fields", |name, pointer| {
                check_json_pointer(pointer).map_err(|e| format!("field {name:?}: {e}"))
            })?;
            let expect = string_map(p, "expect", |name, _| {
                if fields.contains_key(name) {
                    Ok(())
                } else {
                    let declared: Vec<_> = fields.keys().map(String::as_str).collect();
                    Err(if declared.is_empty() {
                        format!("field {name:?} is not declared in fields (none are)")
                    } else {
                        format!(
                            "field {name:?} is not declared in fields (declared: {})",
                            declared.join(", ")
                        )
                    })
                }
            })?;
            let auth = match p.table("auth", format!("{} auth", p.scope))? {
                None => None,
                Some(a) => Some(probe_auth(&a)?),
            };
            let choices = [
                ("same-origin", Redirects::SameOrigin),
                ("none", Redirects::None),
            ];
            let redirects = choice(p, "redirects", &choices, |other| {
                format!("bad value {other:?} (expected \"same-origin\" or \"none\")")
            })?
            .unwrap_or_default();
            let body_excerpt = p.boolean("body_excerpt")?.unwrap_or(true);
            Ok(ProbeConfig::Http {
                url: url.to_string(),
                method,
                timeout,
                expect_status,
                fields,
                expect,
                auth,
                redirects,
                body_excerpt,
            })
        }
    }
}

/// The value named by the string `key` among `choices`, or `None` when
/// `key` is not set; another name is an error worded by `bad`.
fn choice<T: Copy>(
    f: &Fields<'_, '_>,
    key: &str,
    choices: &[(&str, T)],
    bad: impl FnOnce(&str) -> String,
) -> Result<Option<T>, ConfigError> {
    let Some((name, span)) = f.string(key)? else {
        return Ok(None);
    };
    match choices.iter().find(|(n, _)| *n == name) {
        Some((_, value)) => Ok(Some(*value)),
        None => Err(f.key_error(key, span, bad(name))),
    }
}

/// A probe's `auth` table: exactly one of `bearer_file` (an absolute path)
/// and `bearer_env` (a variable name), and optionally `header`.
fn probe_auth(a: &Fields<'_, '_>) -> Result<ProbeAuth, ConfigError> {
    a.only(AUTH_KEYS)?;
    let source = match (a.string("bearer_file")?, a.string("bearer_env")?) {
        (Some(_), Some((_, span))) => {
            return Err(a.key_error(
                "bearer_env",
                span,
                "give either bearer_file or bearer_env, not both",
            ));
        }
        (None, None) => {
            return Err(a.table_error(
                "give bearer_file = \"/path/to/token\" or bearer_env = \"VARIABLE\"",
            ));
        }
        (Some((path, span)), None) => {
            if !Path::new(path).is_absolute() {
                return Err(a.key_error(
                    "bearer_file",
                    span,
                    format!("{path:?} is not an absolute path"),
                ));
            }
            SecretSource::File(PathBuf::from(path))
        }
        (None, Some((name, span))) => {
            let valid = !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !valid {
                return Err(a.key_error(
                    "bearer_env",
                    span,
                    format!("{name:?} is not an environment variable name (letters, digits, '_')"),
                ));
            }
            SecretSource::Env(name.to_string())
        }
    };
    let header = match a.string("header")? {
        None => None,
        Some((h, span)) => {
            if http::header::HeaderName::from_bytes(h.as_bytes()).is_err() {
                return Err(a.key_error("header", span, format!("bad header name {h:?}")));
            }
            Some(h.to_string())
        }
    };
    Ok(ProbeAuth { source, header })
}

/// A table of strings, each checked by `check(name, value)`; errors name the
/// key as `table.name`.
fn string_map(
    p: &Fields<'_, '_>,
    key: &str,
    check: impl Fn(&str, &str) -> Result<(), String>,
) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut out = BTreeMap::new();
    let Some(t) = p.table(key, p.scope.clone())? else {
        return Ok(out);
    };
    for (name, name_span, v) in &t.entries {
        let full = format!("{key}.{name}");
        let DeValue::String(s) = v.get_ref() else {
            return Err(p.type_error(&full, v, "a string"));
        };
        if name.is_empty() {
            return Err(p.key_error(&full, name_span.clone(), "empty field name"));
        }
        check(name, s).map_err(|e| p.key_error(&full, name_span.clone(), e))?;
        out.insert(name.to_string(), s.to_string());
    }
    Ok(out)
}

/// An RFC 6901 JSON pointer: empty, or `/`-separated tokens in which `~` is
/// only `~0` or `~1`.
pub fn check_json_pointer(p: &str) -> Result<(), String> {
    if !p.is_empty() && !p.starts_with('/') {
        return Err(format!(
            "bad JSON pointer {p:?}: must be empty or start with \"/\" (like \"/{p}\")"
        ));
    }
    let mut chars = p.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return Err(format!(
                "bad JSON pointer {p:?}: \"~\" must be followed by 0 or 1"
            ));
        }
    }
    Ok(())
}

fn check_url(url: &str) -> Result<(), String> {
    let shown = crate::text::redact_url(url);
    let bad = || format!("bad url {shown:?}: expected http://host[:port]/path");
    let lower = url.to_ascii_lowercase();
    let rest = lower
        .strip_prefix("http://")
        .or_else(|| lower.strip_prefix("https://"))
        .ok_or_else(bad)?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.is_empty() || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad());
    }
    if authority.contains('@') {
        return Err(format!(
            "url {shown:?} holds credentials (user:password@), which would show in \
             every output: remove them, put the secret in a file readable only by \
             selfheal's user and set auth = {{ bearer_file = \"/path/to/token\" }} \
             (or auth = {{ bearer_env = \"VARIABLE\" }}; add header = \"X-Api-Key\" \
             for another header than Authorization: Bearer)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn upstream_addr_forms() {
        use UpstreamAddr::*;
        let ok = [
            ("127.0.0.1:7443", Socket(addr("127.0.0.1:7443"))),
            ("[::1]:443", Socket(addr("[::1]:443"))),
            ("10.0.0.0/8", Cidr("10.0.0.0".parse().unwrap(), 8)),
            ("::1/128", Cidr("::1".parse().unwrap(), 128)),
            (":443", Port(443)),
            (
                "api.example.com:443",
                Host {
                    host: "api.example.com".into(),
                    port: 443,
                },
            ),
            (
                "localhost:80",
                Host {
                    host: "localhost".into(),
                    port: 80,
                },
            ),
            (
                "fqdn.example.:443",
                Host {
                    host: "fqdn.example.".into(),
                    port: 443,
                },
            ),
        ];
        for (text, want) in ok {
            let got: UpstreamAddr = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(got, want, "{text}");
            assert_eq!(got.to_string(), text);
        }
        for bad in [
            "",
            "127.0.0.1",
            "::1",
            "host",
            "host:",
            "host:99999",
            "host:0",
            ":0",
            ":",
            "1.2.3.4/33",
            "::/129",
            "x/8",
            "h:+80",
            "1.2.3.4/+8",
            "..:80",
            "a..b:1",
            "a.:1x",
            "::1:80",
            "[::1]",
            "[::1:80",
            "a b:80",
            "bad..name:80",
            "-:x",
            ":abc",
        ] {
            assert!(bad.parse::<UpstreamAddr>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn json_pointers() {
        for ok in ["", "/", "/a", "/a/0", "/a~0b/~1c"] {
            assert!(check_json_pointer(ok).is_ok(), "{ok}");
        }
        for bad in ["a", "a/b", "/a~", "/a~2"] {
            assert!(check_json_pointer(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn key_lists_are_the_fields() {
        use crate::config::walk::assert_keys_are_fields;
        let upstream = Upstream {
            role: Role::Control,
            addr: UpstreamAddr::Port(443),
            heartbeat: None,
            suspect_after: None,
            max_silence: DEFAULT_MAX_SILENCE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            stall_after: None,
        };
        assert_keys_are_fields(&format!("{upstream:?}"), UPSTREAM_KEYS, &[]);
        let http = ProbeConfig::Http {
            url: String::new(),
            method: "GET".into(),
            timeout: DEFAULT_PROBE_TIMEOUT,
            expect_status: None,
            fields: BTreeMap::new(),
            expect: BTreeMap::new(),
            auth: None,
            redirects: Redirects::default(),
            body_excerpt: true,
        };
        let file = ProbeConfig::HealthFile {
            path: PathBuf::from("/h"),
            max_age: DEFAULT_PROBE_TIMEOUT,
        };
        assert_keys_are_fields(&format!("{http:?}"), HTTP_ONLY, &[("url", &[])]);
        assert_keys_are_fields(
            &format!("{http:?} {file:?}").replace("} HealthFile {", ","),
            PROBE_KEYS,
            &[("path", &["health_file"])],
        );
        let auth = ProbeAuth {
            source: SecretSource::Env("T".into()),
            header: None,
        };
        assert_keys_are_fields(
            &format!("{auth:?}"),
            AUTH_KEYS,
            &[("source", &["bearer_file", "bearer_env"])],
        );
    }
}
