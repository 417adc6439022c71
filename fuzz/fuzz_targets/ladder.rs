//! The judge and the healing ladder on the values a config and a state file
//! hand them, built field by field from the input (structure-aware: a
//! parser target rarely gets a whole valid history through): durations,
//! counts and flags of `[agent.thresholds]` and `[agent.heal]` (any a
//! config accepts: up to `u64::MAX` seconds), and the judge's and the
//! ladder's history as `check` saves it (times, rung, step counts). Fixed
//! evidence: agent `sol` with its control socket (or without it, or
//! stopped). Never a panic, and every decision keeps the ladder's promises
//! (`selfheal_fuzz::check_decision`: allowed steps only, one rung at a
//! time and only upward, never past the top, within the hour's budgets),
//! again one millisecond after its steps are recorded.

#![no_main]

use std::{path::Path, sync::OnceLock, time::Duration};

use libfuzzer_sys::{
    arbitrary::{Result, Unstructured},
    fuzz_target,
};
use selfheal_core::{
    clock::Now,
    config::{AgentConfig, Config, HealConfig, Thresholds},
    judge::{self, AgentHistory, ProbeView, Verdict},
    ladder::{self, ActionRecord, HealHistory, SocketStep},
    protocol::{Act, ContainerRestart, SocketRef},
};
use selfheal_fuzz::{check_decision, report, wedged};

const CONFIG: &str = r#"
[[agent]]
name = "sol"
match = { pid = 100 }
upstream = [{ role = "control", addr = "10.0.0.1:7443" }]
"#;

fn base() -> &'static AgentConfig {
    static AGENT: OnceLock<AgentConfig> = OnceLock::new();
    AGENT.get_or_init(|| {
        Config::parse(CONFIG, Path::new("/fuzz.toml"))
            .expect("fixture config")
            .agents
            .remove(0)
    })
}

/// Any duration a config may hold: humantime accepts up to `u64::MAX` s.
fn duration(u: &mut Unstructured<'_>) -> Result<Duration> {
    Ok(Duration::new(
        u.arbitrary()?,
        u.int_in_range(0..=999_999_999)?,
    ))
}

fn thresholds(u: &mut Unstructured<'_>) -> Result<Thresholds> {
    Ok(Thresholds {
        suspect_after: duration(u)?,
        dead_probes: u.arbitrary()?,
        dead_backoff: u.arbitrary()?,
        recv_blocked: duration(u)?,
        current_task_stale: duration(u)?,
        zombies: u.arbitrary()?,
        d_state: duration(u)?,
        probe_slow: duration(u)?,
        collect_budget: duration(u)?,
    })
}

fn heal_config(u: &mut Unstructured<'_>) -> Result<HealConfig> {
    Ok(HealConfig {
        sockets: u.arbitrary()?,
        signal: u.arbitrary()?,
        grace: duration(u)?,
        restart: u
            .arbitrary::<bool>()?
            .then(|| vec!["systemctl".into(), "restart".into(), "sol.service".into()]),
        restart_runtime: u.arbitrary()?,
        restart_timeout: duration(u)?,
        step_window: duration(u)?,
        backoff: duration(u)?,
        max_actions_per_hour: u.arbitrary()?,
        max_restarts_per_hour: u.arbitrary()?,
    })
}

fn step(u: &mut Unstructured<'_>) -> Result<Act> {
    let (pid, start_ticks, socket) = (
        u.arbitrary()?,
        u.arbitrary()?,
        SocketRef {
            fd: u.arbitrary()?,
            inode: u.arbitrary()?,
        },
    );
    Ok(match u.int_in_range(0..=5)? {
        5 => Act::RestartContainer(ContainerRestart {
            runtime: selfheal_core::runtime::Runtime::Docker,
            id: "a".repeat(64),
            pid,
            start_ticks,
            grace_ms: u.arbitrary()?,
            timeout_ms: u.arbitrary()?,
        }),
        0 => SocketStep::ArmKeepalive.on(pid, start_ticks, socket),
        4 => SocketStep::ExpireKeepalive.on(pid, start_ticks, socket),
        1 => SocketStep::Destroy.on(pid, start_ticks, socket),
        2 => Act::Signal {
            pid,
            start_ticks,
            grace_ms: Some(u.arbitrary()?),
        },
        _ => Act::Restart {
            argv: vec!["true".into()],
            timeout_ms: u.arbitrary()?,
        },
    })
}

fn heal_history(u: &mut Unstructured<'_>) -> Result<HealHistory> {
    let n = u.int_in_range(0..=12)?;
    let mut actions = Vec::with_capacity(n);
    for _ in 0..n {
        actions.push(ActionRecord {
            at_ms: u.arbitrary()?,
            step: step(u)?,
            ok: u.arbitrary()?,
            detail: String::new(),
        });
    }
    Ok(HealHistory {
        actions,
        rung: u.arbitrary()?,
        steps_this_wedge: u.arbitrary()?,
        gave_up: u.arbitrary::<bool>()?.then(|| "gave up".to_string()),
    })
}

fn agent_history(u: &mut Unstructured<'_>) -> Result<AgentHistory> {
    let verdict = match u.int_in_range(0..=Verdict::ALL.len())? {
        0 => None,
        i => Some(Verdict::ALL[i - 1]),
    };
    Ok(AgentHistory {
        verdict,
        verdict_since_ms: u.arbitrary()?,
        suspect_since_ms: [(9, u.arbitrary()?)]
            .into_iter()
            .take(u.int_in_range(0..=1)?)
            .collect(),
        control_absent_since_ms: u.arbitrary()?,
        current_task: u
            .arbitrary::<bool>()?
            .then(|| u.arbitrary().map(|since| ("summarize".to_string(), since)))
            .transpose()?,
        // A proof armed on the fixture's socket (cookie 9), with any timing.
        proofs: if u.arbitrary::<bool>()? {
            [(
                9,
                selfheal_core::prove::Proof {
                    pid: 100,
                    start_ticks: u.arbitrary()?,
                    fd: 7,
                    inode: if u.arbitrary()? { 42 } else { u.arbitrary()? },
                    armed_at_ms: u.arbitrary()?,
                    first_probe_ms: u.arbitrary()?,
                    interval_ms: u.arbitrary()?,
                    count: u.arbitrary()?,
                    previous: selfheal_core::keepalive::KeepaliveSettings {
                        enabled: u.arbitrary()?,
                        idle_s: u.arbitrary()?,
                        interval_s: u.arbitrary()?,
                        count: u.arbitrary()?,
                        user_timeout_ms: u.arbitrary()?,
                    },
                    restore_failures: u.arbitrary()?,
                    restore_error: None,
                },
            )]
            .into_iter()
            .collect()
        } else {
            Default::default()
        },
        answered: Default::default(),
        pending: [(9, u.arbitrary()?)]
            .into_iter()
            .take(u.int_in_range(0..=1)?)
            .collect(),
        // A connection attempt on the fixture's socket, first seen at any time.
        connecting_since_ms: [(9, u.arbitrary()?)]
            .into_iter()
            .take(u.int_in_range(0..=1)?)
            .collect(),
        // The fixture's socket seen in CLOSE-WAIT, since any time.
        closed_since_ms: [(9, u.arbitrary()?)]
            .into_iter()
            .take(u.int_in_range(0..=1)?)
            .collect(),
        // The fixture's socket's progress record, any counters and times.
        progress: if u.arbitrary::<bool>()? {
            [(
                9,
                selfheal_core::progress::Progress {
                    since_ms: u.arbitrary()?,
                    checked_ms: u.arbitrary()?,
                    checked_mono_ms: u.arbitrary()?,
                    suspended_ms: u.arbitrary()?,
                    bytes_received: u.arbitrary()?,
                    data_segs_in: u.arbitrary()?,
                    bytes_acked: u.arbitrary()?,
                    data_segs_out: u.arbitrary()?,
                    keepalives: u.arbitrary()?,
                    keepalive_bytes: u.arbitrary()?,
                    smallest: u.arbitrary()?,
                    largest: u.arbitrary()?,
                    first_at_ms: u.arbitrary()?,
                    last_at_ms: u.arbitrary()?,
                    suspended_by_first_ms: u.arbitrary()?,
                    suspended_by_last_ms: u.arbitrary()?,
                },
            )]
            .into_iter()
            .collect()
        } else {
            Default::default()
        },
    })
}

fn one(u: &mut Unstructured<'_>) -> Result<()> {
    let mut agent = base().clone();
    agent.thresholds = thresholds(u)?;
    agent.heal = heal_config(u)?;
    if let Some(up) = agent.upstreams.first_mut() {
        up.heartbeat = u.arbitrary::<bool>()?.then(|| duration(u)).transpose()?;
        up.suspect_after = u.arbitrary::<bool>()?.then(|| duration(u)).transpose()?;
        up.stall_after = u.arbitrary::<bool>()?.then(|| duration(u)).transpose()?;
    }
    let judge_history = agent_history(u)?;
    let mut heal_history = heal_history(u)?;
    let now_ms: u64 = u.arbitrary()?;

    let mut report = report();
    match u.int_in_range(0..=2)? {
        0 => {}
        1 => report.sockets.clear(),
        _ => report.processes[0].state = 'T',
    }
    let probes = [ProbeView {
        target: "http://127.0.0.1:8080/status".into(),
        expectations_met: u.arbitrary()?,
        latency_ms: u.arbitrary()?,
        fields: [("current_task".to_string(), serde_json::json!("summarize"))].into(),
        ..ProbeView::default()
    }];
    let probes = &probes[..u.int_in_range(0..=1)?];

    // `CLOCK_MONOTONIC` beside it, any reading (ahead, behind, none).
    let now = Now {
        boot_ms: now_ms,
        mono_ms: u.arbitrary()?,
    };
    let (j, next) = judge::judge(&agent, &report, probes, &judge_history, now);
    let later = Now {
        boot_ms: now_ms.saturating_add(u.arbitrary::<u32>()?.into()),
        mono_ms: now.mono_ms.map(|m| m.saturating_add(1)),
    };
    let _ = judge::judge(&agent, &report, probes, &next, later);
    let j = if u.arbitrary()? { j } else { wedged() };
    let before = heal_history.clone();
    let decision = ladder::decide(&agent.heal, &j, &report, &mut heal_history, now_ms);
    check_decision(&agent.heal, &j, &before, &heal_history, &decision, now_ms);
    if let ladder::Decision::Act { steps } = &decision {
        for s in steps {
            heal_history.record(now_ms, s.clone(), true, String::new());
        }
        if j.verdict == Verdict::Wedged {
            assert_eq!(heal_history.rung, Some(steps[0].rung()), "the rung reached");
        }
        let before = heal_history.clone();
        let later = now_ms.saturating_add(1);
        let again = ladder::decide(&agent.heal, &j, &report, &mut heal_history, later);
        check_decision(&agent.heal, &j, &before, &heal_history, &again, later);
    }
    let _ = serde_json::to_string(&decision);
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = one(&mut Unstructured::new(data));
});
