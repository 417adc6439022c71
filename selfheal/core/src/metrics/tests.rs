//! The exposition text against fixtures: families, labels, counters.

use super::*;
use crate::{
    history::AgentRecord,
    judge::Reason,
    ladder::Decision,
    outcome::{ActionOutcome, EvidenceSummary, HealReport},
    protocol::{Act, SocketRef},
    prove::ProofEvent,
};

fn outcome(agent: &str, verdict: Verdict, reasons: &[&str]) -> Outcome {
    Outcome {
        agent: agent.into(),
        containers: vec![],
        verdict,
        reasons: reasons
            .iter()
            .map(|c| Reason {
                code: serde_json::from_value(serde_json::json!(c)).expect("a reason code"),
                verdict,
                message: "m".into(),
                evidence: Default::default(),
            })
            .collect(),
        snapshot: None,
        snapshot_error: None,
        previous: None,
        transition: false,
        previous_for_ms: None,
        probes: vec![],
        gaps: vec![],
        proofs: vec![],
        heal: None,
        evidence: EvidenceSummary {
            strategy: None,
            processes: 1,
            iterated: 0,
            zombies: 0,
        },
    }
}

fn info() -> CheckInfo {
    CheckInfo {
        finished_unix_s: 1_700_000_000.5,
        duration_s: 0.25,
        helper_up: true,
        ebpf: Ok("tp_btf"),
    }
}

fn history_of(outs: &[Outcome]) -> History {
    let mut h = History::default();
    for o in outs {
        let r = h.agents.entry(o.agent.clone()).or_default();
        observe(&mut r.metrics, o);
    }
    h
}

/// Every sample line: `name{labels} value`.
fn samples(text: &str) -> Vec<&str> {
    text.lines().filter(|l| !l.starts_with('#')).collect()
}

#[test]
fn a_healthy_agent_has_a_one_hot_verdict_and_host_facts() {
    let outs = [outcome("a", Verdict::Healthy, &[])];
    let t = render(&outs, &history_of(&outs), &info());
    let verdicts: Vec<_> = samples(&t)
        .into_iter()
        .filter(|l| l.starts_with("selfheal_agent_verdict{"))
        .collect();
    assert_eq!(verdicts.len(), 7);
    assert!(t.contains("selfheal_agent_verdict{agent=\"a\",verdict=\"healthy\"} 1\n"));
    assert!(t.contains("selfheal_agent_verdict{agent=\"a\",verdict=\"wedged\"} 0\n"));
    assert!(t.contains("selfheal_ebpf_strategy_info{strategy=\"tp_btf\",why_none=\"\"} 1\n"));
    assert!(t.contains("selfheal_ebpf_up 1\n"));
    assert!(t.contains("selfheal_helper_up 1\n"));
    assert!(t.contains("selfheal_check_duration_seconds 0.250000\n"));
    assert!(t.contains("selfheal_last_check_timestamp_seconds 1700000000.500\n"));
    assert!(t.contains("selfheal_agent_breaker_open{agent=\"a\"} 0\n"));
    assert!(!t.contains("selfheal_agent_last_snapshot_info{"));
}

#[test]
fn every_family_has_help_and_type_once_and_names_follow_the_conventions() {
    let outs = [outcome("a", Verdict::Wedged, &["recv_blocked"])];
    let t = render(&outs, &history_of(&outs), &info());
    let mut seen = std::collections::BTreeSet::new();
    for l in t.lines().filter(|l| l.starts_with("# TYPE ")) {
        let mut w = l.split(' ').skip(2);
        let (name, kind) = (w.next().unwrap(), w.next().unwrap());
        assert!(seen.insert(name.to_string()), "{name} twice");
        assert!(name.starts_with("selfheal_"), "{name}");
        assert_eq!(kind == "counter", name.ends_with("_total"), "{name} {kind}");
        assert!(t.contains(&format!("# HELP {name} ")), "{name} has no HELP");
    }
    for s in samples(&t) {
        let name = s.split(['{', ' ']).next().unwrap();
        assert!(seen.contains(name), "{s} has no TYPE");
    }
}

#[test]
fn label_values_escape_backslash_quote_and_newline() {
    assert_eq!(label("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
    let name = "we\"ird\\agent\nname é\t";
    let outs = [outcome(name, Verdict::Healthy, &[])];
    let t = render(&outs, &history_of(&outs), &info());
    assert!(t.contains(
        "selfheal_agent_verdict{agent=\"we\\\"ird\\\\agent\\nname é\\\\t\",verdict=\"healthy\"} 1\n"
    ));
    // No sample is split over lines.
    for s in samples(&t) {
        assert!(s.starts_with("selfheal_"), "{s:?}");
    }
}

#[test]
fn label_values_carry_no_control_character() {
    for (raw, want) in [
        ("plain é", "plain é"),
        ("\u{1b}]0;pwned\u{7}", "\\\\u{1b}]0;pwned\\\\u{7}"),
        ("a\rb", "a\\\\rb"),
        ("a\nb", "a\\nb"),
        ("\u{9b}31m", "\\\\u{9b}31m"),
        ("q\"\\", "q\\\"\\\\"),
    ] {
        let got = label(raw);
        assert_eq!(got, want, "{raw:?}");
        assert!(!got.chars().any(char::is_control), "{got:?}");
    }
}

/// `promtool check metrics` (when installed) accepts the text with
/// hostile label values: ESC, BEL, CR, C1, quotes and backslashes in an
/// agent name and a container's labels.
#[test]
fn hostile_label_values_keep_the_exposition_valid_for_promtool() {
    let evil = "ag\u{1b}[2J\u{7}\r\"x\\y\nz\u{9b}";
    let mut o = outcome(evil, Verdict::Wedged, &["recv_blocked"]);
    o.containers = vec![crate::runtime::Identity {
        runtime: crate::runtime::Runtime::Docker,
        id: format!("id{evil}"),
        name: Some(format!("name{evil}")),
        image: Some(evil.into()),
        pod: Some(evil.into()),
        namespace: Some(evil.into()),
        pod_uid: None,
        labels: Default::default(),
        resolved: true,
        pod_refused: None,
    }];
    let outs = [o];
    let t = render(&outs, &history_of(&outs), &info());
    assert!(
        !t.chars().any(|c| c.is_control() && c != '\n'),
        "a raw control character: {t:?}"
    );
    let Ok(mut child) = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    else {
        eprintln!("SKIPPED promtool check: no promtool on PATH");
        return;
    };
    use std::io::Write as _;
    child.stdin.take().unwrap().write_all(t.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    eprintln!("promtool check metrics: {:?} {}", out.status, said.trim());
    assert!(out.status.success(), "{said}\n{t}");
    assert!(!said.contains("error"), "{said}");
}

#[test]
fn reasons_count_appearances_not_checks() {
    let mut c = Counters::default();
    let w = outcome("a", Verdict::Wedged, &["recv_blocked", "probe_failed"]);
    observe(&mut c, &w);
    observe(&mut c, &w);
    observe(&mut c, &w);
    assert_eq!(c.reasons["recv_blocked"], 1);
    assert_eq!(c.not_ok_checks, 3);
    observe(&mut c, &outcome("a", Verdict::Healthy, &[]));
    observe(&mut c, &w);
    assert_eq!(c.reasons["recv_blocked"], 2);
    assert_eq!(c.reasons["probe_failed"], 2);
    assert_eq!(c.not_ok_checks, 4);
}

#[test]
fn heals_proofs_and_the_last_snapshot_are_counted_and_rendered() {
    let mut w = outcome("a", Verdict::Wedged, &["recv_blocked"]);
    w.snapshot = Some("20261130T180000Z-a-1".into());
    w.heal = Some(HealReport {
        decision: Decision::Act { steps: vec![] },
        dry_run: false,
        actions: vec![
            ActionOutcome {
                step: Act::DestroySocket {
                    pid: 1,
                    start_ticks: 1,
                    socket: SocketRef { fd: 3, inode: 9 },
                },
                ok: true,
                detail: String::new(),
            },
            ActionOutcome {
                step: Act::Signal {
                    pid: 1,
                    start_ticks: 1,
                    grace_ms: Some(100),
                },
                ok: false,
                detail: String::new(),
            },
        ],
        newly_gave_up: false,
    });
    w.proofs = vec![ProofEvent {
        action: "arm",
        inode: 9,
        remote: "r".into(),
        ok: true,
        detail: String::new(),
    }];
    let mut h = History::default();
    let r: &mut AgentRecord = h.agents.entry("a".into()).or_default();
    observe(&mut r.metrics, &w);
    r.heal.gave_up = Some("budget".into());
    r.heal.steps_this_wedge = 2;
    let t = render(&[w], &h, &info());
    assert!(t.contains(
        "selfheal_heals_total{agent=\"a\",action=\"destroy_socket\",outcome=\"ok\"} 1\n"
    ));
    assert!(
        t.contains("selfheal_heals_total{agent=\"a\",action=\"signal\",outcome=\"failed\"} 1\n")
    );
    assert!(
        t.contains("selfheal_proof_keepalives_total{agent=\"a\",event=\"arm\",outcome=\"ok\"} 1\n")
    );
    assert!(t.contains(
        "selfheal_agent_last_snapshot_info{agent=\"a\",snapshot=\"20261130T180000Z-a-1\",verdict=\"wedged\"} 1\n"
    ));
    assert!(t.contains("selfheal_agent_breaker_open{agent=\"a\"} 1\n"));
    assert!(t.contains("selfheal_agent_heal_steps_current_wedge{agent=\"a\"} 2\n"));
    assert!(t.contains("selfheal_agent_reason{agent=\"a\",reason=\"recv_blocked\"} 1\n"));
    assert!(t.contains("selfheal_agent_reasons_total{agent=\"a\",reason=\"recv_blocked\"} 1\n"));
}

#[test]
fn the_snapshot_info_names_the_episode_first_snapshot() {
    let mut c = Counters::default();
    let mut w = outcome("a", Verdict::Wedged, &[]);
    w.transition = true;
    w.snapshot = Some("s1".into());
    observe(&mut c, &w);
    w.transition = false;
    w.snapshot = Some("s2".into());
    observe(&mut c, &w);
    assert_eq!(c.last_snapshot, Some(("s1".into(), "wedged".into())));
    let mut h = outcome("a", Verdict::Healthy, &[]);
    h.transition = true;
    observe(&mut c, &h);
    assert_eq!(c.last_snapshot, Some(("s1".into(), "wedged".into())));
    w.transition = true;
    w.snapshot = Some("s3".into());
    observe(&mut c, &w);
    assert_eq!(c.last_snapshot, Some(("s3".into(), "wedged".into())));
}

#[test]
fn a_dry_run_heal_counts_nothing() {
    let mut w = outcome("a", Verdict::Wedged, &[]);
    w.heal = Some(HealReport {
        decision: Decision::Act { steps: vec![] },
        dry_run: true,
        actions: vec![ActionOutcome {
            step: Act::Signal {
                pid: 1,
                start_ticks: 1,
                grace_ms: Some(100),
            },
            ok: true,
            detail: String::new(),
        }],
        newly_gave_up: false,
    });
    let mut c = Counters::default();
    observe(&mut c, &w);
    assert!(c.heals.is_empty());
}

#[test]
fn no_ebpf_says_why_with_a_bounded_value() {
    let outs = [outcome("a", Verdict::Healthy, &[])];
    for built_in in [true, false] {
        let i = CheckInfo::from_outcomes(&outs, built_in, false, 1.0, 0.1);
        if built_in {
            assert_eq!(i.ebpf, Err(NoEbpf::NoHelper));
        } else {
            assert_eq!(i.ebpf, Err(NoEbpf::NotBuiltIn));
        }
        let t = render(&outs, &history_of(&outs), &i);
        assert!(t.contains("selfheal_ebpf_strategy_info{strategy=\"none\",why_none=\""));
        assert!(t.contains("selfheal_ebpf_up 0\n"));
        assert!(t.contains("selfheal_helper_up 0\n"));
    }
    // The helper as shipped runs no tracer: the task iterators' reads are
    // the eBPF evidence, and the host is not degraded.
    let mut iterated = outcome("a", Verdict::Healthy, &[]);
    iterated.evidence.iterated = 1;
    let i = CheckInfo::from_outcomes(std::slice::from_ref(&iterated), true, true, 1.0, 0.1);
    assert_eq!(i.ebpf, Ok(ITERATORS));
    let t = render(
        std::slice::from_ref(&iterated),
        &history_of(&[iterated.clone()]),
        &i,
    );
    assert!(t.contains("selfheal_ebpf_strategy_info{strategy=\"iterators\",why_none=\"\"} 1\n"));
    assert!(t.contains("selfheal_ebpf_up 1\n"));
    let mut with = outcome("a", Verdict::Healthy, &[]);
    with.evidence.strategy = Some("kprobe");
    assert_eq!(
        CheckInfo::from_outcomes(&[with], true, true, 1.0, 0.1).ebpf,
        Ok("kprobe")
    );
}

#[test]
fn reason_codes_are_bounded_label_values() {
    assert_eq!(code("Recv-Stalled\n\"x\""), "recv_stalled__x_");
    assert_eq!(code(&"x".repeat(500)).len(), 64);
}

#[test]
fn old_history_without_counters_loads() {
    let r: AgentRecord =
        serde_json::from_str(r#"{"judge":{"verdict":null,"verdict_since_ms":0},"wedges":3}"#)
            .expect("old record loads");
    assert_eq!(r.wedges, 3);
    assert_eq!(r.metrics, Counters::default());
}
