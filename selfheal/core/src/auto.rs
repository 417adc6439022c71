//! The `[auto]` agents: each container its runtime labels
//! `selfheal.enable=true` and each unit `[auto] units` names, as an agent
//! of its own, named `auto.RUNTIME.NAME.ID12` and `auto.unit.UNIT`, with
//! the section's thresholds, healing and proof settings. Its sockets get
//! their roles by what they do ([`Roles::Outbound`]): every connection it
//! made is a provider upstream, a connection it accepted has no role.
//!
//! The label is read from what a runtime answered ([`Identity::labels`],
//! never from a process's command line, environment or cgroup name), and
//! the agent's rule names the container by its full id and the label
//! again, so the match and the act-time check hold it to the same identity
//! rules as a configured `container`/`label` rule. Pure: the edge
//! (`selfheal::agents::auto`) hands the identities of the containers it
//! found.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::{
    config::{
        AgentConfig, AutoConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_SILENCE, DEFAULT_STALL_AFTER,
        MatchRule, MatchUid, Role, Roles, Upstream, UpstreamAddr,
    },
    runtime::{ContainerRule, Glob, Identity},
};

/// The label a container opts in with, and its value.
pub const LABEL: (&str, &str) = ("selfheal.enable", "true");

/// What every `[auto]` agent's name starts with.
pub use crate::config::AUTO_PREFIX as PREFIX;

/// The most characters of a container's or unit's name kept in an agent's.
const MAX_NAME: usize = 64;

/// Whether a runtime labels `id` [`LABEL`] (a container no runtime
/// answered for has no labels).
pub fn opted_in(id: &Identity) -> bool {
    id.resolved && id.labels.get(LABEL.0).is_some_and(|v| v == LABEL.1)
}

/// The rule that finds every labelled container: what the edge reads the
/// process table and asks the runtimes for when `[auto] containers` is on.
pub fn label_rule() -> ContainerRule {
    ContainerRule {
        labels: vec![(LABEL.0.to_string(), LABEL.1.to_string())],
        ..ContainerRule::default()
    }
}

/// What a check reads the process table and asks the runtimes for before
/// it knows the containers: the units' agents and, with `auto.containers`,
/// one rule on [`LABEL`] alone (which has every process in a container read
/// and the runtimes asked, as a configured `label` rule does). Only the
/// rules count: the agents of the check are [`agents`].
pub fn reading(auto: &AutoConfig, configured: &[AgentConfig]) -> Vec<AgentConfig> {
    let mut out = agents(auto, &[], configured);
    if auto.containers {
        out.push(agent(
            auto,
            format!("{PREFIX}containers"),
            MatchRule::Container(label_rule()),
        ));
    }
    out
}

/// The `[auto]` agents now: one per unit of `auto.units`, and (with
/// `auto.containers`) one per container of `containers` a runtime labels
/// [`LABEL`], each once, sorted by name. A container or unit a configured
/// agent's rule already names (in `configured`) is left to that agent.
pub fn agents(
    auto: &AutoConfig,
    containers: &[Identity],
    configured: &[AgentConfig],
) -> Vec<AgentConfig> {
    let mut out: Vec<AgentConfig> = Vec::new();
    for unit in &auto.units {
        let named = configured
            .iter()
            .any(|a| matches!(&a.rule, MatchRule::Unit(u) if u == unit));
        if !named {
            out.push(agent(
                auto,
                format!("{PREFIX}unit.{}", name_part(unit)),
                MatchRule::Unit(unit.clone()),
            ));
        }
    }
    if auto.containers {
        let mut seen: Vec<&str> = Vec::new();
        for id in containers.iter().filter(|i| opted_in(i)) {
            if seen.contains(&id.id.as_str()) {
                continue;
            }
            seen.push(&id.id);
            let named = configured
                .iter()
                .any(|a| matches!(&a.rule, MatchRule::Container(r) if r.matches(id)));
            if named {
                continue;
            }
            let mut name = match &id.name {
                Some(n) => format!("{PREFIX}{}.{}.{}", id.runtime, name_part(n), id.short_id()),
                None => format!("{PREFIX}{}.{}", id.runtime, id.short_id()),
            };
            // Two ids alike in their first 12 digits: the full id tells them apart.
            if out.iter().any(|a| a.name == name) {
                name = format!("{PREFIX}{}.{}", id.runtime, name_part(&id.id));
            }
            let rule = ContainerRule {
                container: Some(Glob(id.id.clone())),
                ..label_rule()
            };
            out.push(agent(auto, name, MatchRule::Container(rule)));
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out.dedup_by(|a, b| a.name == b.name);
    out
}

/// Whether a connection whose local end is `local` was accepted: a socket
/// of its network namespace listens on that address (or on every address)
/// and port. IPv4-mapped IPv6 addresses are the IPv4 address they map;
/// a listener on `::` takes IPv4 connections too.
pub fn accepted(local: SocketAddr, listening: &[SocketAddr]) -> bool {
    let canonical = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    let ip = canonical(local.ip());
    listening.iter().any(|l| {
        l.port() == local.port() && {
            let at = canonical(l.ip());
            at == ip
                || at == IpAddr::V6(Ipv6Addr::UNSPECIFIED)
                || (at == IpAddr::V4(Ipv4Addr::UNSPECIFIED) && ip.is_ipv4())
        }
    })
}

/// `name` as part of an agent's name: at most [`MAX_NAME`] characters, each
/// outside `[A-Za-z0-9._-]` written `_` (agent names are used in file names
/// and metrics labels).
fn name_part(name: &str) -> String {
    name.chars()
        .take(MAX_NAME)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The agent `name` of `rule` with `auto`'s settings: one provider upstream
/// that every outbound connection is.
fn agent(auto: &AutoConfig, name: String, rule: MatchRule) -> AgentConfig {
    AgentConfig {
        name,
        rule,
        match_uid: MatchUid::Runner,
        upstreams: vec![Upstream {
            role: Role::Provider,
            addr: UpstreamAddr::Cidr(Ipv6Addr::UNSPECIFIED.into(), 0),
            heartbeat: None,
            suspect_after: None,
            max_silence: DEFAULT_MAX_SILENCE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            stall_after: Some(DEFAULT_STALL_AFTER),
        }],
        probes: Vec::new(),
        thresholds: auto.thresholds.clone(),
        heal: auto.heal.clone(),
        proof: auto.proof.clone(),
        roles: Roles::Outbound,
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, path::Path};

    use super::*;
    use crate::{config::Config, runtime::Runtime};

    fn container(id: &str, name: &str, labels: &[(&str, &str)], resolved: bool) -> Identity {
        Identity {
            runtime: Runtime::Docker,
            id: id.to_string(),
            name: Some(name.to_string()),
            image: None,
            pod: None,
            namespace: None,
            pod_uid: None,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
            resolved,
            pod_refused: None,
        }
    }

    fn config(text: &str) -> Config {
        Config::parse(text, Path::new("c.toml")).unwrap()
    }

    const A: &str = "aaaaaaaaaaaa0000000000000000000000000000000000000000000000000001";
    const B: &str = "bbbbbbbbbbbb0000000000000000000000000000000000000000000000000002";

    #[test]
    fn labelled_containers_and_named_units_become_agents() {
        let c = config("[auto]\ncontainers = true\nunits = [\"sol\"]\n");
        let ids = [
            container(A, "web", &[LABEL], true),
            container(B, "db", &[("selfheal.enable", "yes")], true),
        ];
        let got = agents(&c.auto, &ids, &c.agents);
        let names: Vec<&str> = got.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(
            names,
            ["auto.docker.web.aaaaaaaaaaaa", "auto.unit.sol.service"]
        );
        let web = &got[0];
        assert_eq!(web.roles, Roles::Outbound);
        assert_eq!(web.heal, c.auto.heal);
        let MatchRule::Container(rule) = &web.rule else {
            panic!("{:?}", web.rule)
        };
        assert!(rule.matches(&ids[0]));
        assert!(
            !rule.matches(&container(A, "web", &[], true)),
            "the label again"
        );
        assert!(
            !rule.matches(&container(B, "web", &[LABEL], true)),
            "that id only"
        );
        assert_eq!(got[1].rule, MatchRule::Unit("sol.service".into()));
        // Every address is the one upstream's.
        let r = web.resolve_upstreams_with(|_, _| Err("no".into()));
        for remote in ["1.2.3.4:443", "[2001:db8::1]:80", "127.0.0.1:1"] {
            assert_eq!(r.role_of(remote.parse().unwrap()), Some(Role::Provider));
        }
    }

    /// The label only counts as a runtime said it: not on a container no
    /// runtime answered for, nor in its name; and not at all with
    /// `containers` off.
    #[test]
    fn only_the_runtimes_label_opts_in() {
        let c = config("[auto]\ncontainers = true\n");
        for id in [
            container(A, "web", &[LABEL], false),
            container(A, "selfheal.enable=true", &[], true),
            container(A, "web", &[("selfheal.enable", "TRUE")], true),
            container(A, "web", &[("selfheal.enable=true", "")], true),
        ] {
            assert!(
                agents(&c.auto, std::slice::from_ref(&id), &[]).is_empty(),
                "{id:?}"
            );
        }
        let rules: Vec<MatchRule> = reading(&c.auto, &[]).into_iter().map(|a| a.rule).collect();
        assert_eq!(rules, [MatchRule::Container(label_rule())]);
        let off = config("[auto]\nunits = [\"x\"]\n");
        assert_eq!(reading(&off.auto, &[]).len(), 1);
        let got = agents(&off.auto, &[container(A, "web", &[LABEL], true)], &[]);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].name, "auto.unit.x.service");
    }

    #[test]
    fn what_an_agent_names_is_not_added_twice() {
        let c = config(
            "[auto]\ncontainers = true\nunits = [\"sol\"]\n\
             [[agent]]\nname = \"web\"\nmatch = { container = \"web\" }\n\
             [[agent]]\nname = \"sol\"\nmatch = { unit = \"sol\" }\n",
        );
        let web = container(A, "web", &[LABEL], true);
        assert!(agents(&c.auto, &[web.clone(), web.clone()], &c.agents).is_empty());
        let other = config("[auto]\ncontainers = true\n");
        assert_eq!(agents(&other.auto, &[web.clone(), web], &[]).len(), 1);
    }

    #[test]
    fn a_connection_to_a_listening_address_was_accepted() {
        let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
        let listening = [
            sa("0.0.0.0:80"),
            sa("[::]:8080"),
            sa("127.0.0.1:9000"),
            sa("[::1]:7000"),
        ];
        for (local, yes) in [
            ("10.0.0.2:80", true),
            ("[::ffff:10.0.0.2]:80", true),
            ("[2001:db8::1]:80", false),
            ("10.0.0.2:8080", true),
            ("[2001:db8::1]:8080", true),
            ("127.0.0.1:9000", true),
            ("10.0.0.2:9000", false),
            ("[::1]:7000", true),
            ("127.0.0.1:7000", false),
            ("10.0.0.2:43210", false),
        ] {
            assert_eq!(accepted(sa(local), &listening), yes, "{local}");
        }
        assert!(!accepted(sa("10.0.0.2:80"), &[]));
    }

    #[test]
    fn names_are_kept_to_safe_characters() {
        let c = config("[auto]\ncontainers = true\nunits = [\"a@b\\\\x2d.service\"]\n");
        let long = "n".repeat(200);
        let twin = format!("{}ffff", &A[..60]);
        let ids = [
            container(A, "we b\u{1b}[31m/\u{e9}", &[LABEL], true),
            container(B, &long, &[LABEL], true),
            container(&twin, "we b\u{1b}[31m/\u{e9}", &[LABEL], true),
        ];
        let got = agents(&c.auto, &ids, &[]);
        for a in &got {
            assert!(
                a.name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')),
                "{}",
                a.name
            );
            assert!(a.name.len() <= 100, "{}", a.name);
        }
        let names: Vec<&str> = got.iter().map(|a| a.name.as_str()).collect();
        assert!(
            names.contains(&"auto.docker.we_b__31m__.aaaaaaaaaaaa"),
            "{names:?}"
        );
        assert!(names.contains(&"auto.unit.a_b_x2d.service"), "{names:?}");
        assert_eq!(got.len(), 4, "{names:?}");
    }
}
