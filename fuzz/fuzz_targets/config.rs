//! The config parser on any text: `Config::parse` returns a config or an
//! error naming the file, a line of the text, a column and what is wrong
//! (asserted: no other error kind, line in range, the message led by
//! `file:line:`); it must never panic. What a parsed
//! config is then used for by pure code (error and address rendering, the
//! upstream matcher with a fake resolver, the address parser, the judge and
//! the healing ladder on fixed evidence of a wedged agent) must not panic
//! either: its durations, counts and commands are outside input too; and
//! every ladder decision under its heal settings keeps the ladder's
//! promises (`selfheal_fuzz::check_decision`). The `[auto]` section's
//! agents (over a labelled container named from the input) are held to the
//! same, and to names of `[A-Za-z0-9._-]` that no configured agent's
//! starts like.

#![no_main]

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::Path,
    str::FromStr as _,
};

use libfuzzer_sys::fuzz_target;
use selfheal_core::{
    auto,
    config::{Config, ConfigError, UpstreamAddr, check_json_pointer, line_col},
    judge::{self, AgentHistory},
    ladder::{self, HealHistory},
};
use selfheal_fuzz::{after_first_step, check_decision, report, wedged};

/// `CLOCK_BOOTTIME` ms of the first ladder step, and of the checks after it.
const FIRST_STEP_MS: u64 = 6_000;
const NOWS: [u64; 3] = [1_000, 40_000, 604_800_000];

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match Config::parse(&text, Path::new("/fuzz.toml")) {
        Err(e) => {
            // Parsing reads no file: every error is the text's, and names
            // the file, a line of the text (one past the last for an
            // unterminated one), a column and what is wrong.
            let shown = e.to_string();
            let ConfigError::Invalid {
                path,
                line,
                column,
                message,
            } = &e
            else {
                panic!("parse gave a non-parse error: {shown}");
            };
            assert_eq!(path, Path::new("/fuzz.toml"), "{shown}");
            assert_eq!(e.line(), Some(*line));
            let lines = text.lines().count().max(1);
            assert!(
                (1..=lines + 1).contains(line),
                "line {line} outside the text's {lines}: {shown}"
            );
            assert!(*column >= 1, "column 0: {shown}");
            assert!(!message.trim().is_empty(), "no message: {shown}");
            assert!(
                shown.starts_with(&format!("/fuzz.toml:{line}: ")),
                "the message leads with file and line: {shown}"
            );
        }
        Ok(config) => {
            // Sockets to classify: a few fixed ones and one whose address and
            // port come from the input.
            let mut remotes = vec![
                SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 443),
                SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)), 8443),
                SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 443),
                SocketAddr::new(
                    IpAddr::V6(Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped()),
                    7443,
                ),
            ];
            if let Some(b) = data.get(..6) {
                let ip = Ipv4Addr::new(b[0], b[1], b[2], b[3]);
                let port = u16::from_be_bytes([b[4], b[5]]);
                remotes.push(SocketAddr::new(IpAddr::V4(ip), port));
                remotes.push(SocketAddr::new(IpAddr::V6(ip.to_ipv6_mapped()), port));
            }
            let container = selfheal_core::runtime::Identity {
                runtime: selfheal_core::runtime::Runtime::Docker,
                id: "0123456789ab".repeat(5) + "cdef",
                name: Some(text.chars().take(300).collect()),
                image: None,
                pod: None,
                namespace: None,
                pod_uid: None,
                labels: [(auto::LABEL.0.to_string(), auto::LABEL.1.to_string())].into(),
                resolved: true,
                pod_refused: None,
            };
            let auto_agents = auto::agents(&config.auto, &[container], &config.agents);
            for agent in &config.agents {
                assert!(!agent.name.starts_with(auto::PREFIX), "{}", agent.name);
            }
            for agent in &auto_agents {
                assert!(agent.name.starts_with(auto::PREFIX), "{}", agent.name);
                assert!(
                    agent.name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)),
                    "{}",
                    agent.name
                );
            }
            for agent in config.agents.iter().chain(&auto_agents) {
                let _ = config.agent(&agent.name);
                for u in &agent.upstreams {
                    // Rendering an address and parsing it back.
                    let shown = u.addr.to_string();
                    let _ = UpstreamAddr::from_str(&shown);
                }
                let resolved = agent.resolve_upstreams_with(|host, port| match host.len() % 3 {
                    0 => Err("no such host".into()),
                    1 => Ok(Vec::new()),
                    _ => Ok(vec![
                        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
                        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
                        SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), port),
                    ]),
                });
                let _ = resolved.notes();
                for remote in &remotes {
                    let _ = resolved.role_of(*remote);
                }
                for probe in &agent.probes {
                    let _ = format!("{probe:?}");
                }
                // The judge and the ladder under this agent's thresholds and
                // heal settings.
                let report = report();
                for now_ms in NOWS {
                    let (j, next) =
                        judge::judge(agent, &report, &[], &AgentHistory::default(), now_ms);
                    let _ = judge::judge(agent, &report, &[], &next, now_ms.saturating_add(1));
                    for j in [&j, &wedged()] {
                        for h in [HealHistory::default(), after_first_step(FIRST_STEP_MS)] {
                            let mut after = h.clone();
                            let d = ladder::decide(&agent.heal, j, &report, &mut after, now_ms);
                            check_decision(&agent.heal, j, &h, &after, &d, now_ms);
                        }
                    }
                }
            }
        }
    }
    // The helpers the parser's messages and checks use, on the raw text.
    let _ = check_json_pointer(&text);
    let _ = UpstreamAddr::from_str(&text);
    let _ = line_col(&text, data.len() / 2);
    let _ = line_col(&text, usize::MAX);
});
