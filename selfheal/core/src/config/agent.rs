//! One `[[agent]]` table: its name, its `match` rule (and whose processes
//! it may match), and its `thresholds`, `heal` and `proof` tables, each
//! checked key by key.

use std::{
    collections::HashMap,
    ops::Range,
    path::{Path, PathBuf},
    time::Duration,
};

use toml::de::{DeTable, DeValue};

use super::{
    AgentConfig, ConfigError, HealConfig, MatchRule, MatchUid, ProofConfig, Thresholds,
    upstream::{probe, upstream},
    walk::{Cx, Fields, line_col},
};

const AGENT_KEYS: &[&str] = &[
    "name",
    "match",
    "upstream",
    "probe",
    "thresholds",
    "heal",
    "proof",
];
const PROOF_KEYS: &[&str] = &["keepalive", "idle", "interval", "count"];
const HEAL_KEYS: &[&str] = &[
    "sockets",
    "signal",
    "grace",
    "restart",
    "restart_timeout",
    "step_window",
    "backoff",
    "max_actions_per_hour",
    "max_restarts_per_hour",
];
const THRESHOLD_KEYS: &[&str] = &[
    "suspect_after",
    "dead_probes",
    "dead_backoff",
    "recv_blocked",
    "current_task_stale",
    "zombies",
    "d_state",
    "probe_slow",
    "collect_budget",
];
const MATCH_KEYS: &[&str] = &[
    "pid",
    "pidfile",
    "cmdline",
    "exe",
    "unit",
    "container",
    "image",
    "label",
    "pod",
    "namespace",
];
/// The `match` keys on container identity: any of them may combine (all
/// must hold); the others stand alone.
const CONTAINER_MATCH_KEYS: &[&str] = &["container", "image", "label", "pod", "namespace"];

/// The `index`th `[[agent]]` table at `span`; `names` holds the names seen
/// so far, with where each stands (its byte offset).
pub(super) fn agent<'a>(
    cx: &'a Cx<'a>,
    table: &'a DeTable<'_>,
    span: Range<usize>,
    index: usize,
    names: &mut HashMap<String, usize>,
) -> Result<AgentConfig, ConfigError> {
    let f = Fields::new(cx, table, span, format!("agent {index}"));
    // The name first, so that every later message can say which agent.
    let Some((name, name_span)) = f.string("name")? else {
        f.only(AGENT_KEYS)?;
        return Err(f.table_error("key `name`: missing (every agent needs a name)"));
    };
    if name.is_empty() {
        return Err(f.key_error("name", name_span, "empty name"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(f.key_error(
            "name",
            name_span,
            format!("bad name {name:?}: use letters, digits, '.', '_' and '-'"),
        ));
    }
    if name.starts_with(super::auto::PREFIX) {
        return Err(f.key_error(
            "name",
            name_span,
            format!(
                "bad name {name:?}: names starting with {:?} are the [auto] section's agents'",
                super::auto::PREFIX
            ),
        ));
    }
    if let Some(&first) = names.get(name) {
        // The line counted only here: counting each name's would scan the
        // file once an agent.
        let first = line_col(cx.text, first).0;
        return Err(f.key_error(
            "name",
            name_span,
            format!("duplicate agent name {name:?} (first at line {first})"),
        ));
    }
    names.insert(name.to_string(), name_span.start);
    let scope = format!("agent {name:?}");
    let f = Fields {
        scope: scope.clone(),
        ..f
    };
    f.only(AGENT_KEYS)?;

    let Some(m) = f.table("match", format!("{scope} match"))? else {
        return Err(f.table_error(format!(
            "key `match`: missing (one of {})",
            MATCH_KEYS.join(", ")
        )));
    };
    let (rule, match_uid) = match_rule(&f, &m)?;

    let upstreams = each_table(&f, "upstream", upstream)?;
    let probes = each_table(&f, "probe", probe)?;
    let thresholds = match f.table("thresholds", format!("{scope} thresholds"))? {
        Some(t) => thresholds(&t)?,
        None => Thresholds::default(),
    };
    let heal = match f.table("heal", format!("{scope} heal"))? {
        Some(h) => heal(&h)?,
        None => HealConfig::default(),
    };
    let proof = match f.table("proof", format!("{scope} proof"))? {
        Some(p) => proof(&p)?,
        None => ProofConfig::default(),
    };
    Ok(AgentConfig {
        match_uid,
        name: name.to_string(),
        rule,
        upstreams,
        probes,
        thresholds,
        heal,
        proof,
        roles: super::Roles::ByAddress,
    })
}

/// Each table of the agent's array `[[agent.KEY]]`, parsed by `parse`;
/// the first is named "agent \"NAME\" KEY 1" in messages.
fn each_table<T>(
    f: &Fields<'_, '_>,
    key: &str,
    parse: fn(&Fields<'_, '_>) -> Result<T, ConfigError>,
) -> Result<Vec<T>, ConfigError> {
    f.tables(key, &format!("agent.{key}"))?
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, (t, span))| {
            parse(&Fields::new(
                f.cx,
                t,
                span,
                format!("{} {key} {}", f.scope, i + 1),
            ))
        })
        .collect()
}

pub(super) fn proof(p: &Fields<'_, '_>) -> Result<ProofConfig, ConfigError> {
    p.only(PROOF_KEYS)?;
    let d = ProofConfig::default();
    // The kernel's limits (include/net/tcp.h): whole seconds, 1 to 32767;
    // 1 to 127 probes.
    let secs = |key: &str, default: Duration| -> Result<Duration, ConfigError> {
        let Some(v) = p.duration(key)? else {
            return Ok(default);
        };
        if v < Duration::from_secs(1) || v > Duration::from_secs(32767) || v.subsec_nanos() != 0 {
            let (span, _) = p.get(key).expect("the key was read");
            return Err(p.key_error(
                key,
                span,
                format!(
                    "{v:?} is not whole seconds from 1s to 32767s (the kernel's keepalive unit)"
                ),
            ));
        }
        Ok(v)
    };
    let count = match p.integer("count")? {
        None => d.count,
        Some((n, span)) => u32::try_from(n)
            .ok()
            .filter(|n| (1..=127).contains(n))
            .ok_or_else(|| {
                p.key_error(
                    "count",
                    span,
                    format!("{n} is not a probe count from 1 to 127"),
                )
            })?,
    };
    Ok(ProofConfig {
        keepalive: p.boolean("keepalive")?.unwrap_or(d.keepalive),
        idle: secs("idle", d.idle)?,
        interval: secs("interval", d.interval)?,
        count,
    })
}

/// The count `key`, else `default`; 0 is refused when `positive`.
fn read_count(
    f: &Fields<'_, '_>,
    key: &str,
    default: u32,
    positive: bool,
) -> Result<u32, ConfigError> {
    let Some((n, span)) = f.integer(key)? else {
        return Ok(default);
    };
    u32::try_from(n)
        .ok()
        .filter(|n| *n > 0 || !positive)
        .ok_or_else(|| {
            let what = if positive {
                "a positive count"
            } else {
                "a count"
            };
            f.key_error(key, span, format!("{n} is not {what}"))
        })
}

pub(super) fn thresholds(t: &Fields<'_, '_>) -> Result<Thresholds, ConfigError> {
    t.only(THRESHOLD_KEYS)?;
    let d = Thresholds::default();
    let count = |key: &str, default: u32| read_count(t, key, default, true);
    Ok(Thresholds {
        suspect_after: t.duration("suspect_after")?.unwrap_or(d.suspect_after),
        dead_probes: count("dead_probes", d.dead_probes)?,
        dead_backoff: count("dead_backoff", d.dead_backoff)?,
        recv_blocked: t.duration("recv_blocked")?.unwrap_or(d.recv_blocked),
        current_task_stale: t
            .duration("current_task_stale")?
            .unwrap_or(d.current_task_stale),
        zombies: count("zombies", d.zombies)?,
        d_state: t.duration("d_state")?.unwrap_or(d.d_state),
        probe_slow: t.duration("probe_slow")?.unwrap_or(d.probe_slow),
        collect_budget: t.duration("collect_budget")?.unwrap_or(d.collect_budget),
    })
}

pub(super) fn heal(h: &Fields<'_, '_>) -> Result<HealConfig, ConfigError> {
    h.only(HEAL_KEYS)?;
    let d = HealConfig::default();
    let count = |key: &str, default: u32| read_count(h, key, default, false);
    // `restart` is an argv, or `{ runtime = true }`.
    let runtime_table = match h.get("restart") {
        Some((_, v)) => match v.get_ref() {
            DeValue::Table(t) => Some(Fields::new(
                h.cx,
                t,
                v.span(),
                format!("{} restart", h.scope),
            )),
            _ => None,
        },
        None => None,
    };
    let (restart, restart_runtime) = if let Some(r) = runtime_table {
        r.only(&["runtime"])?;
        match r.get("runtime") {
            Some((_, v)) if matches!(v.get_ref(), DeValue::Boolean(true)) => (None, true),
            Some((_, v)) => {
                return Err(r.key_error(
                    "runtime",
                    v.span(),
                    "only `runtime = true` is allowed (leave `restart` out for no restart)",
                ))
            }
            None => {
                return Err(r.table_error(
                    "expected `{ runtime = true }` or an argv, e.g. [\"systemctl\", \"restart\", \"x.service\"]",
                ))
            }
        }
    } else {
        let argv = match h.strings("restart")? {
            None => None,
            Some((argv, span)) => {
                if argv.is_empty() || argv[0].is_empty() {
                    return Err(h.key_error("restart", span, "an empty command"));
                }
                if argv.len() == 1 && argv[0].contains(' ') {
                    return Err(h.key_error(
                        "restart",
                        span,
                        format!("{:?} looks like a shell string: give the argv as a list, e.g. [\"systemctl\", \"restart\", \"x.service\"]", argv[0]),
                    ));
                }
                Some(argv)
            }
        };
        (argv, false)
    };
    Ok(HealConfig {
        sockets: h.boolean("sockets")?.unwrap_or(d.sockets),
        signal: h.boolean("signal")?.unwrap_or(d.signal),
        grace: h.duration("grace")?.unwrap_or(d.grace),
        restart,
        restart_runtime,
        restart_timeout: h.duration("restart_timeout")?.unwrap_or(d.restart_timeout),
        step_window: h.duration("step_window")?.unwrap_or(d.step_window),
        backoff: h.duration("backoff")?.unwrap_or(d.backoff),
        max_actions_per_hour: count("max_actions_per_hour", d.max_actions_per_hour)?,
        max_restarts_per_hour: count("max_restarts_per_hour", d.max_restarts_per_hour)?,
    })
}

fn match_rule(
    agent: &Fields<'_, '_>,
    m: &Fields<'_, '_>,
) -> Result<(MatchRule, MatchUid), ConfigError> {
    let mut allowed = MATCH_KEYS.to_vec();
    allowed.push("uid");
    m.only(&allowed)?;
    let rule = one_match_rule(agent, m)?;
    let match_uid = match m.get("uid") {
        None => MatchUid::Runner,
        Some((_, v)) => {
            let unit = matches!(rule, MatchRule::Unit(_));
            if !unit && !matches!(rule, MatchRule::Cmdline(_) | MatchRule::Exe(_)) {
                return Err(m.key_error(
                    "uid",
                    v.span(),
                    "applies to cmdline, exe and unit rules only (pid and pidfile name their processes)",
                ));
            }
            match v.get_ref() {
                DeValue::String(s) if s.as_ref() == "any" && unit => {
                    return Err(m.key_error(
                        "uid",
                        v.span(),
                        "a unit rule's uid names the user whose manager runs the unit: give a number",
                    ));
                }
                DeValue::String(s) if s.as_ref() == "any" => MatchUid::Any,
                DeValue::Integer(_) => {
                    let (n, span) = m.integer("uid")?.unwrap_or((-1, 0..0));
                    match u32::try_from(n) {
                        Ok(uid) if uid != u32::MAX => MatchUid::Uid(uid),
                        _ => return Err(m.key_error("uid", span, format!("bad uid {n}"))),
                    }
                }
                _ => {
                    return Err(m.key_error(
                        "uid",
                        v.span(),
                        "expected a uid (a number) or \"any\"",
                    ));
                }
            }
        }
    };
    Ok((rule, match_uid))
}

fn one_match_rule(agent: &Fields<'_, '_>, m: &Fields<'_, '_>) -> Result<MatchRule, ConfigError> {
    let keys: Vec<&str> = m
        .entries
        .iter()
        .map(|(k, _, _)| *k)
        .filter(|k| *k != "uid")
        .collect();
    match keys.as_slice() {
        [] => {
            return Err(agent.key_error(
                "match",
                m.span.clone(),
                format!("no rule: give one of {}", MATCH_KEYS.join(", ")),
            ));
        }
        [_] => {}
        many if many.iter().all(|k| CONTAINER_MATCH_KEYS.contains(k)) => {}
        [..] => {
            return Err(agent.key_error(
                "match",
                m.entries[1].1.clone(),
                format!(
                    "more than one rule ({}): give exactly one (only {} may combine)",
                    keys.join(", "),
                    CONTAINER_MATCH_KEYS.join(", ")
                ),
            ));
        }
    }
    let key = keys[0];
    if CONTAINER_MATCH_KEYS.contains(&key) {
        return container_rule(m).map(MatchRule::Container);
    }
    if key == "pid" {
        let (pid, span) = m.integer("pid")?.unwrap_or((0, 0..0));
        return match u32::try_from(pid) {
            Ok(pid) if pid > 0 && pid <= i32::MAX as u32 => Ok(MatchRule::Pid(pid)),
            _ => Err(m.key_error("pid", span, format!("bad pid {pid}"))),
        };
    }
    let (value, span) = m.string(key)?.unwrap_or(("", 0..0));
    if value.is_empty() {
        return Err(m.key_error(key, span, "empty"));
    }
    match key {
        "pidfile" | "exe" => {
            if !Path::new(value).is_absolute() {
                return Err(m.key_error(key, span, format!("{value:?} is not an absolute path")));
            }
            Ok(if key == "exe" {
                MatchRule::Exe(PathBuf::from(value))
            } else {
                MatchRule::Pidfile(PathBuf::from(value))
            })
        }
        "cmdline" => regex::Regex::new(value)
            .map(MatchRule::Cmdline)
            .map_err(|e| {
                m.key_error(
                    key,
                    span,
                    format!("bad regex {value:?}: {}", regex_reason(&e)),
                )
            }),
        _ => unit_name(value)
            .map(MatchRule::Unit)
            .map_err(|e| m.key_error(key, span, e)),
    }
}

/// A unit's name as written, with `.service` added where it names no
/// type; or why it is not one.
pub(super) fn unit_name(value: &str) -> Result<String, String> {
    if value.is_empty() {
        return Err("empty".into());
    }
    if value.contains('/') || value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("bad unit name {value:?}"));
    }
    Ok(if value.contains('.') {
        value.to_string()
    } else {
        format!("{value}.service")
    })
}

/// A `match` table of container keys (`container`, `image`, `label`, `pod`,
/// `namespace`).
fn container_rule(m: &Fields<'_, '_>) -> Result<crate::runtime::ContainerRule, ConfigError> {
    use crate::runtime::Glob;
    let glob = |key: &str| -> Result<Option<Glob>, ConfigError> {
        match m.string(key)? {
            None => Ok(None),
            Some(("", span)) => Err(m.key_error(key, span, "empty")),
            Some((v, span)) if v.chars().any(char::is_control) => {
                Err(m.key_error(key, span, format!("{v:?} holds a control character")))
            }
            Some((v, _)) => Ok(Some(Glob(v.to_string()))),
        }
    };
    let mut labels = Vec::new();
    if let Some((_, v)) = m.get("label") {
        let items: Vec<(String, Range<usize>)> = match v.get_ref() {
            DeValue::String(s) => vec![(s.to_string(), v.span())],
            DeValue::Array(items) => {
                let mut out = Vec::new();
                for item in items.iter() {
                    match item.get_ref() {
                        DeValue::String(s) => out.push((s.to_string(), item.span())),
                        _ => return Err(m.type_error("label", item, "a \"key=value\" string")),
                    }
                }
                if out.is_empty() {
                    return Err(m.key_error("label", v.span(), "empty list"));
                }
                out
            }
            _ => {
                return Err(m.type_error("label", v, "a \"key=value\" string or a list of them"));
            }
        };
        for (item, span) in items {
            match item.split_once('=') {
                Some((k, val)) if !k.is_empty() => labels.push((k.to_string(), val.to_string())),
                _ => {
                    return Err(m.key_error(
                        "label",
                        span,
                        format!("bad label {item:?}: expected key=value"),
                    ));
                }
            }
        }
    }
    Ok(crate::runtime::ContainerRule {
        container: glob("container")?,
        image: glob("image")?,
        labels,
        pod: glob("pod")?,
        namespace: glob("namespace")?,
    })
}

/// The one-line reason of a regex error (its Display draws a caret diagram
/// over several lines).
fn regex_reason(e: &regex::Error) -> String {
    let text = e.to_string();
    text.lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("error: "))
        .map_or_else(|| text.replace('\n', " "), str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, DEFAULT_COLLECT_BUDGET};

    /// The one agent of a config `c.toml` whose agent `a` (pid 1) has
    /// `tail` (lines 4 on) after its `match`.
    fn agent_with(tail: &str) -> Result<AgentConfig, ConfigError> {
        let text = format!("[[agent]]\nname = \"a\"\nmatch = {{ pid = 1 }}\n{tail}\n");
        Config::parse(&text, Path::new("c.toml")).map(|mut c| c.agents.remove(0))
    }

    #[test]
    fn collect_budget_is_a_duration_with_a_default() {
        let parse =
            |line: &str| agent_with(&format!("[agent.thresholds]\n{line}")).map(|a| a.thresholds);
        assert_eq!(parse("").unwrap().collect_budget, DEFAULT_COLLECT_BUDGET);
        assert_eq!(DEFAULT_COLLECT_BUDGET, Duration::from_secs(5));
        assert_eq!(
            parse("collect_budget = \"250ms\"").unwrap().collect_budget,
            Duration::from_millis(250)
        );
        for (bad, says) in [
            ("collect_budget = \"0s\"", "must be more than 0"),
            ("collect_budget = \"soon\"", "bad duration"),
            ("collect_budget = 5", "expected a string"),
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(
                e.contains("collect_budget") && e.contains(says),
                "{bad}: {e}"
            );
        }
    }

    /// A duration too long to count in ms parses, and is compared as
    /// forever (`clock::ms` saturates); one too long for a `Duration` is a
    /// clear error, never a panic.
    #[test]
    fn huge_durations_parse_or_are_refused_without_a_panic() {
        let parse =
            |line: &str| agent_with(&format!("[agent.thresholds]\n{line}")).map(|a| a.thresholds);
        for huge in [
            "18446744073709557s",
            "500000000000y",
            "18446744073709551615s",
        ] {
            let t = parse(&format!("suspect_after = \"{huge}\"")).expect(huge);
            assert_eq!(crate::clock::ms(t.suspect_after), u64::MAX, "{huge}");
        }
        for (bad, says) in [
            ("d_state = \"18446744073709551616s\"", "bad duration"),
            ("d_state = \"600000000000y\"", "bad duration"),
            (
                "d_state = \"99999999999999999999999999999ms\"",
                "bad duration",
            ),
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains("d_state") && e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn restart_is_an_argv_or_the_runtime() {
        let parse = |restart: &str| {
            agent_with(&format!("[agent.heal]\nrestart = {restart}")).map(|a| a.heal)
        };
        let h = parse("{ runtime = true }").unwrap();
        assert!(h.restart_runtime && h.restart.is_none());
        let h = parse("[\"systemctl\", \"restart\", \"x\"]").unwrap();
        assert!(!h.restart_runtime && h.restart.unwrap().len() == 3);
        for (bad, says) in [
            ("{ runtime = false }", "only `runtime = true`"),
            ("{ runtime = \"yes\" }", "only `runtime = true`"),
            ("{}", "expected `{ runtime = true }` or an argv"),
            (
                "{ runtime = true, argv = [] }",
                "key `argv`: unknown key (expected runtime)",
            ),
            ("\"docker restart x\"", "expected an array of strings"),
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(says) && e.contains("c.toml:5"), "{bad}: {e}");
        }
    }

    #[test]
    fn key_lists_are_the_fields() {
        use crate::config::walk::assert_keys_are_fields;
        let config = Config::parse(
            "[[agent]]\nname = \"a\"\nmatch = { pid = 1 }\n",
            Path::new("c.toml"),
        )
        .unwrap();
        assert_keys_are_fields(
            &format!("{:?}", config.agents[0]),
            AGENT_KEYS,
            &[
                ("rule", &["match"]),
                ("match_uid", &["match"]),
                ("upstreams", &["upstream"]),
                ("probes", &["probe"]),
                ("roles", &[]),
            ],
        );
        assert_keys_are_fields(&format!("{:?}", ProofConfig::default()), PROOF_KEYS, &[]);
        // `restart = { runtime = true }` sets `restart_runtime`.
        assert_keys_are_fields(
            &format!("{:?}", HealConfig::default()),
            HEAL_KEYS,
            &[("restart_runtime", &[])],
        );
        assert_keys_are_fields(&format!("{:?}", Thresholds::default()), THRESHOLD_KEYS, &[]);
        assert_keys_are_fields(
            &format!("{:?}", crate::runtime::ContainerRule::default()),
            CONTAINER_MATCH_KEYS,
            &[("labels", &["label"])],
        );
        for key in CONTAINER_MATCH_KEYS {
            assert!(MATCH_KEYS.contains(key), "{key}");
        }
    }
}
