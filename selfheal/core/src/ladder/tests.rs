//! The ladder on fixtures: escalation, windows, backoff, budgets, the
//! circuit breaker, a stopped process left alone, recovery resetting it.

use std::{collections::BTreeMap, time::Duration};

use super::*;
use crate::{fixture, judge::ReasonCode};

const SEC: u64 = 1_000;

fn heal(signal: bool, restart: bool) -> HealConfig {
    HealConfig {
        signal,
        restart: restart.then(|| vec!["systemctl".into(), "restart".into(), "sol.service".into()]),
        step_window: Duration::from_secs(30),
        backoff: Duration::from_secs(10),
        ..HealConfig::default()
    }
}

fn report(state: char, with_socket: bool) -> Report {
    let sockets = if with_socket { vec![42] } else { vec![] };
    let held = if with_socket {
        vec![fixture::control_socket()]
    } else {
        vec![]
    };
    fixture::report_of(fixture::process(state, vec![], sockets), held)
}

/// A wedged judgement for `code`, with the judge's finding of a dead
/// socket `inode` held by pid 100 at fd 7 (as `report` has it), if given.
fn wedged(code: ReasonCode, inode: Option<u64>) -> Judgement {
    fixture::wedged_by(code, inode)
}

/// A history holding one action, a keepalive armed on a socket of pid 1,
/// taken at `at_ms`.
fn one_action_at(at_ms: u64) -> HealHistory {
    let mut h = HealHistory::default();
    h.record(
        at_ms,
        Act::ArmKeepalive {
            pid: 1,
            start_ticks: 1,
            socket: SocketRef { fd: 1, inode: 1 },
        },
        true,
        String::new(),
    );
    h
}

/// The steps of `d`, which must act.
fn acts(d: Decision) -> Vec<Act> {
    let Decision::Act { steps } = d else {
        panic!("{d:?}")
    };
    steps
}

/// The decision at time 0 on a fresh history, under `cfg`, on a wedge by
/// `code` (on socket `inode`) of the process in `state`; and the history
/// after it.
fn first_decision(
    cfg: &HealConfig,
    code: ReasonCode,
    inode: Option<u64>,
    state: char,
) -> (Decision, HealHistory) {
    let mut h = HealHistory::default();
    let d = decide(cfg, &wedged(code, inode), &report(state, true), &mut h, 0);
    (d, h)
}

/// The same wedge by `code` on socket 42 of a sleeping process, at each
/// of `secs`.
fn wedged_at(code: ReasonCode, secs: &[u64]) -> Vec<(u64, Judgement, Report)> {
    secs.iter()
        .map(|t| (t * SEC, wedged(code, Some(42)), report('S', true)))
        .collect()
}

/// Asserts that `d` gave up, saying `what`.
fn assert_gave_up(d: &Decision, what: &str) {
    assert!(
        matches!(d, Decision::GaveUp { why } if why.contains(what)),
        "{d:?}"
    );
}

fn busy() -> Judgement {
    Judgement {
        verdict: Verdict::Busy,
        reasons: vec![],
        work: vec![],
        dead: vec![],
    }
}

/// Runs the ladder over a timeline, executing every Act (recording ok), and
/// returns what it decided at each time, as short words.
fn timeline(cfg: &HealConfig, events: &[(u64, Judgement, Report)]) -> Vec<String> {
    let mut h = HealHistory::default();
    let mut out = Vec::new();
    for (t, j, r) in events {
        let d = decide(cfg, j, r, &mut h, *t);
        out.push(match &d {
            Decision::Act { steps } => {
                for s in steps {
                    h.record(*t, s.clone(), true, String::new());
                }
                steps.iter().map(Act::name).collect::<Vec<_>>().join("+")
            }
            Decision::Wait { .. } => "wait".into(),
            Decision::GaveUp { .. } => "gave_up".into(),
            Decision::Nothing { .. } => "nothing".into(),
        });
    }
    out
}

#[test]
fn a_dead_socket_climbs_the_socket_rungs_then_the_process_rungs() {
    let cfg = heal(true, true);
    let events = wedged_at(
        ReasonCode::ControlSilent,
        &[0, 5, 31, 40, 62, 105, 140, 190, 200],
    );
    assert_eq!(
        timeline(&cfg, &events),
        [
            "arm_keepalive",
            "wait",
            "destroy_socket",
            "wait",
            "signal",
            "restart",
            "wait",
            "gave_up",
            "gave_up"
        ]
    );
}

#[test]
fn defaults_act_only_on_sockets() {
    // No signal, no restart configured: after the socket rungs, give up.
    let cfg = HealConfig::default();
    let events = wedged_at(ReasonCode::PeerUnresponsive, &[0, 31, 70]);
    assert_eq!(
        timeline(&cfg, &events),
        ["arm_keepalive", "destroy_socket", "gave_up"]
    );
    // A wedge with no socket to blame and nothing enabled: give up at once,
    // and say why.
    let mut h = HealHistory::default();
    let d = decide(
        &cfg,
        &wedged(ReasonCode::StatusContradictsKernel, None),
        &report('S', false),
        &mut h,
        0,
    );
    assert_gave_up(&d, "no step fits");
}

#[test]
fn recovery_resets_the_ladder() {
    let cfg = heal(true, true);
    let events = vec![
        (
            0,
            wedged(ReasonCode::ControlSilent, Some(42)),
            report('S', true),
        ),
        (31 * SEC, busy(), report('S', true)),
        (
            40 * SEC,
            wedged(ReasonCode::ControlSilent, Some(42)),
            report('S', true),
        ),
    ];
    // After recovery the next wedge starts at the bottom again — after the
    // backoff from the last action (10 s) has passed.
    assert_eq!(
        timeline(&cfg, &events),
        ["arm_keepalive", "nothing", "arm_keepalive"]
    );
}

#[test]
fn backoff_doubles_with_every_step_that_did_not_help() {
    let cfg = HealConfig {
        backoff: Duration::from_secs(40),
        step_window: Duration::from_secs(30),
        ..heal(true, true)
    };
    let events = wedged_at(ReasonCode::ControlSilent, &[0, 31, 41, 70, 121, 200, 281]);
    // Window 30 s; backoff 40 s, then 80 s, then 160 s.
    let got = timeline(&cfg, &events);
    assert_eq!(
        got,
        [
            "arm_keepalive",
            "wait",
            "destroy_socket",
            "wait",
            "signal",
            "wait",
            "restart"
        ]
    );
}

#[test]
fn budgets_open_the_breaker() {
    let cfg = HealConfig {
        max_restarts_per_hour: 1,
        ..heal(true, true)
    };
    let mut h = HealHistory::default();
    // One restart already this hour, from an earlier wedge.
    h.record(
        0,
        Act::Restart {
            argv: vec!["x".into()],
            timeout_ms: 1,
        },
        true,
        String::new(),
    );
    h.rung = None;
    let d = decide(
        &cfg,
        &wedged(ReasonCode::StatusContradictsKernel, None),
        &report('S', false),
        &mut h,
        100 * SEC,
    );
    assert_gave_up(&d, "restart budget");
    // The breaker stays open while the agent stays wedged...
    assert!(matches!(
        decide(
            &cfg,
            &wedged(ReasonCode::StatusContradictsKernel, None),
            &report('S', false),
            &mut h,
            200 * SEC
        ),
        Decision::GaveUp { .. }
    ));
    // ...and closes when it recovers.
    assert!(matches!(
        decide(&cfg, &busy(), &report('S', false), &mut h, 300 * SEC),
        Decision::Nothing { .. }
    ));
    assert_eq!(h.gave_up, None);

    let cfg = HealConfig {
        max_actions_per_hour: 1,
        ..heal(false, false)
    };
    let mut h = one_action_at(0);
    h.rung = None;
    let d = decide(
        &cfg,
        &wedged(ReasonCode::ControlSilent, Some(42)),
        &report('S', true),
        &mut h,
        100 * SEC,
    );
    assert_gave_up(&d, "action budget");
}

#[test]
fn a_stopped_process_is_left_alone() {
    let (d, h) = first_decision(&heal(true, true), ReasonCode::ControlSilent, Some(42), 'T');
    assert!(
        matches!(&d, Decision::Nothing { why } if why.contains("stopped")),
        "{d:?}"
    );
    assert!(h.actions.is_empty());
}

#[test]
fn steps_carry_the_process_identity() {
    let (d, _) = first_decision(
        &heal(false, false),
        ReasonCode::PeerUnresponsive,
        Some(42),
        'S',
    );
    let steps = acts(d);
    assert_eq!(
        steps,
        [Act::ArmKeepalive {
            pid: 100,
            start_ticks: 777,
            socket: SocketRef { fd: 7, inode: 42 },
        }]
    );
    // A socket the judgement names but the evidence no longer has is skipped.
    let (d, _) = first_decision(
        &heal(false, false),
        ReasonCode::PeerUnresponsive,
        Some(4242),
        'S',
    );
    assert!(matches!(d, Decision::GaveUp { .. }), "{d:?}");
}

#[test]
fn old_actions_leave_the_hour() {
    let mut h = one_action_at(0);
    let _ = decide(
        &HealConfig::default(),
        &busy(),
        &report('S', false),
        &mut h,
        2 * HOUR_MS,
    );
    assert!(h.actions.is_empty());
}

/// Found by fuzzing (fuzz/regressions/ladder, state_file, config): a history
/// from a state file or settings from a config at the edges of their types
/// must not overflow.
#[test]
fn extreme_history_and_settings_do_not_overflow() {
    let huge = HealConfig {
        step_window: Duration::from_secs(u64::MAX / 1000),
        backoff: Duration::from_secs(u64::MAX / 1000),
        ..heal(true, true)
    };
    let mut h = HealHistory {
        actions: vec![ActionRecord {
            at_ms: u64::MAX,
            step: Act::ArmKeepalive {
                pid: 1,
                start_ticks: 1,
                socket: SocketRef { fd: 1, inode: 1 },
            },
            ok: true,
            detail: String::new(),
        }],
        rung: Some(255),
        steps_this_wedge: u32::MAX,
        gave_up: None,
    };
    for now in [0, 1, u64::MAX - 1, u64::MAX] {
        let _ = decide(
            &huge,
            &wedged(ReasonCode::ControlSilent, Some(42)),
            &report('S', true),
            &mut h.clone(),
            now,
        );
        let _ = decide(
            &HealConfig::default(),
            &wedged(ReasonCode::ControlSilent, Some(42)),
            &report('S', true),
            &mut h,
            now,
        );
    }
    h.record(
        u64::MAX,
        Act::Restart {
            argv: vec!["x".into()],
            timeout_ms: u64::MAX,
        },
        true,
        String::new(),
    );
    assert_eq!(h.steps_this_wedge, u32::MAX);
}

/// A step window past what ms can count holds the ladder as long as the
/// history keeps the step, its hour (`as u64` wrapped 18446744073709557 s
/// to 5.4 s and stepped again at 6 s), and a grace or restart timeout as long goes into the step as `u64::MAX`
/// ms, not wrapped short.
#[test]
fn huge_windows_hold_and_huge_timeouts_saturate() {
    const HUGE: Duration = Duration::from_secs(18_446_744_073_709_557);
    let held = HealConfig {
        step_window: HUGE,
        backoff: Duration::from_millis(1),
        ..heal(true, true)
    };
    let hour = 3_599;
    let events = wedged_at(ReasonCode::ControlSilent, &[0, 6, 60, hour]);
    assert_eq!(
        timeline(&held, &events),
        ["arm_keepalive", "wait", "wait", "wait"]
    );
    let mut h = one_action_at(0);
    h.rung = Some(0);
    h.steps_this_wedge = 1;
    match decide(
        &held,
        &wedged(ReasonCode::ControlSilent, Some(42)),
        &report('S', true),
        &mut h,
        hour * SEC,
    ) {
        Decision::Wait { until_ms, .. } => assert_eq!(until_ms, u64::MAX),
        d => panic!("{d:?}"),
    }
    // A huge backoff holds as long: capped at an hour, not wrapped short.
    let backed_off = HealConfig {
        backoff: HUGE,
        ..heal(true, true)
    };
    let events = wedged_at(ReasonCode::ControlSilent, &[0, 31, 600, 3_599, 3_601]);
    assert_eq!(
        timeline(&backed_off, &events),
        ["arm_keepalive", "wait", "wait", "wait", "destroy_socket"]
    );
    // Grace and restart timeout: saturated into the steps.
    let slow = HealConfig {
        grace: HUGE,
        restart_timeout: HUGE,
        ..heal(true, true)
    };
    let step_at = |rung: u8| {
        let mut h = HealHistory {
            rung: Some(rung),
            ..HealHistory::default()
        };
        acts(decide(
            &slow,
            &wedged(ReasonCode::ControlSilent, Some(42)),
            &report('S', true),
            &mut h,
            100 * SEC,
        ))
    };
    assert!(
        matches!(
            step_at(1).as_slice(),
            [Act::Signal {
                grace_ms: Some(u64::MAX),
                ..
            }]
        ),
        "{:?}",
        step_at(1)
    );
    assert!(
        matches!(
            step_at(2).as_slice(),
            [Act::Restart {
                timeout_ms: u64::MAX,
                ..
            }]
        ),
        "{:?}",
        step_at(2)
    );
}

#[test]
fn a_dead_socket_with_data_in_flight_skips_keepalive_for_destroy() {
    // A runner heartbeating into a half-open stream: its writes sit
    // unacknowledged, so the kernel would never send a keepalive probe.
    let cfg = heal(false, false);
    let mut r = report('S', true);
    r.sockets[0].tcp_info = Some(crate::sockdiag::TcpInfo {
        rtt_us: 200,
        rto_us: 3_200_000,
        unacked: 2,
        retransmits: 4,
        backoff: 4,
        probes: 0,
        last_data_recv_ms: 5_000,
        last_data_sent_ms: 900,
        last_ack_recv_ms: 5_000,
        bytes_received: 10,
        bytes_acked: 10,
        data_segs_in: 0,
        data_segs_out: 0,
    });
    let events = [
        (0, wedged(ReasonCode::PeerUnresponsive, Some(42)), r.clone()),
        (40 * SEC, wedged(ReasonCode::PeerUnresponsive, Some(42)), r),
    ];
    assert_eq!(timeline(&cfg, &events), ["destroy_socket", "gave_up"]);
    // An idle dead socket still gets the gentler keepalive first.
    let idle = [(
        0,
        wedged(ReasonCode::ControlSilent, Some(42)),
        report('S', true),
    )];
    assert_eq!(timeline(&cfg, &idle), ["arm_keepalive"]);
}

#[test]
fn an_unanswered_proof_keepalive_is_ended_first_then_the_ladder_goes_on() {
    let cfg = HealConfig::default();
    let proven = || {
        let mut j = wedged(ReasonCode::PeerUnresponsive, Some(42));
        j.reasons[0]
            .evidence
            .insert("proof".into(), serde_json::Value::Bool(true));
        j.dead[0].by_proof = true;
        j
    };
    let events: Vec<_> = [0, 31, 70]
        .iter()
        .map(|t| (t * SEC, proven(), report('S', true)))
        .collect();
    assert_eq!(
        timeline(&cfg, &events),
        ["expire_keepalive", "destroy_socket", "gave_up"]
    );
    let d = decide(
        &cfg,
        &proven(),
        &report('S', true),
        &mut HealHistory::default(),
        0,
    );
    assert_eq!(
        d,
        Decision::Act {
            steps: vec![Act::ExpireKeepalive {
                pid: 100,
                start_ticks: 777,
                socket: SocketRef { fd: 7, inode: 42 },
            }]
        }
    );
}

fn container(id: &str) -> crate::runtime::Identity {
    crate::runtime::Identity {
        runtime: crate::runtime::Runtime::Docker,
        id: id.into(),
        name: Some("runner".into()),
        image: None,
        pod: None,
        namespace: None,
        pod_uid: None,
        labels: BTreeMap::new(),
        resolved: true,
        pod_refused: None,
    }
}

#[test]
fn runtime_restart_names_the_one_container_and_its_root() {
    let cfg = HealConfig {
        sockets: false,
        restart_runtime: true,
        grace: Duration::from_secs(3),
        ..HealConfig::default()
    };
    let id = "a".repeat(64);
    let mut r = report('S', false);
    r.containers = vec![container(&id)];
    let mut h = HealHistory::default();
    let d = decide(
        &cfg,
        &wedged(ReasonCode::StatusContradictsKernel, None),
        &r,
        &mut h,
        100 * SEC,
    );
    let steps = acts(d);
    assert_eq!(
        steps,
        vec![Act::RestartContainer(ContainerRestart {
            runtime: crate::runtime::Runtime::Docker,
            id: id.clone(),
            pid: 100,
            start_ticks: 777,
            grace_ms: 3_000,
            timeout_ms: 60_000,
        })]
    );
    assert!(steps[0].is_disruptive());
    assert_eq!(steps[0].name(), "restart_container");
    // The step survives the state file.
    let json = serde_json::to_string(&steps[0]).unwrap();
    assert_eq!(serde_json::from_str::<Act>(&json).unwrap(), steps[0]);

    // On the host, or across two containers, there is no container to
    // restart: no step fits.
    for containers in [vec![], vec![container(&id), container(&"b".repeat(64))]] {
        let mut r = report('S', false);
        r.containers = containers;
        let d = decide(
            &cfg,
            &wedged(ReasonCode::StatusContradictsKernel, None),
            &r,
            &mut HealHistory::default(),
            100 * SEC,
        );
        assert!(matches!(d, Decision::GaveUp { .. }), "{d:?}");
    }
    // The restart budget counts it like any restart.
    let cfg = HealConfig {
        max_restarts_per_hour: 1,
        ..cfg
    };
    h.record(100 * SEC, steps[0].clone(), true, String::new());
    h.rung = None;
    let d = decide(
        &cfg,
        &wedged(ReasonCode::StatusContradictsKernel, None),
        &r,
        &mut h,
        200 * SEC,
    );
    assert_gave_up(&d, "restart budget");
}

/// A control stream proven dead by its heartbeat, with nothing in
/// flight, gets the keepalive rung at the first `wedged` verdict; the rung
/// ends it within seconds (see `actions::keepalive::Keepalive`), so the next run finds
/// the agent recovered and the ladder reset. A slow but live link, which
/// the judge calls busy or idle, is never acted on.
#[test]
fn a_proven_dead_stream_heals_on_the_first_rung_and_a_slow_live_one_is_never_cut() {
    let cfg = HealConfig::default();
    let idle = || Judgement {
        verdict: Verdict::Idle,
        reasons: vec![],
        work: vec![],
        dead: vec![],
    };
    let events = [
        (
            0,
            wedged(ReasonCode::ControlSilent, Some(42)),
            report('S', true),
        ),
        (30 * SEC, idle(), report('S', true)),
        (60 * SEC, idle(), report('S', true)),
    ];
    assert_eq!(
        timeline(&cfg, &events),
        ["arm_keepalive", "nothing", "nothing"]
    );
    // Slow but live (busy by the judge, whatever its socket shows): never cut.
    let mut slow = report('S', true);
    slow.sockets[0].tcp_info = Some(crate::sockdiag::TcpInfo {
        rtt_us: 3_000_000,
        rto_us: 6_000_000,
        unacked: 1,
        retransmits: 1,
        backoff: 1,
        probes: 0,
        last_data_recv_ms: 25_000,
        last_data_sent_ms: 500,
        last_ack_recv_ms: 4_000,
        bytes_received: 10,
        bytes_acked: 10,
        data_segs_in: 0,
        data_segs_out: 0,
    });
    let events: Vec<_> = (0..10)
        .map(|t| (t * 30 * SEC, busy(), slow.clone()))
        .collect();
    assert!(timeline(&cfg, &events).iter().all(|d| d == "nothing"));
}

/// The ladder acts on the judge's typed findings alone. A reason
/// whose JSON evidence names an inode is words for a person, not an
/// address: without a finding there is no socket step.
#[test]
fn socket_steps_come_from_findings_not_from_reason_evidence() {
    let mut words_only = wedged(ReasonCode::PeerUnresponsive, Some(42));
    words_only.dead.clear();
    let d = decide(
        &heal(false, false),
        &words_only,
        &report('S', true),
        &mut HealHistory::default(),
        0,
    );
    assert!(matches!(d, Decision::GaveUp { .. }), "{d:?}");
    // The finding addresses the socket as the (fresher) evidence has it now.
    let mut moved = report('S', true);
    moved.sockets[0].fd = Some(11);
    let steps = acts(decide(
        &heal(false, false),
        &wedged(ReasonCode::PeerUnresponsive, Some(42)),
        &moved,
        &mut HealHistory::default(),
        0,
    ));
    assert_eq!(
        steps,
        [Act::ArmKeepalive {
            pid: 100,
            start_ticks: 777,
            socket: SocketRef { fd: 11, inode: 42 },
        }]
    );
}

/// The signal rung goes to the root above the process that holds the dead
/// socket, not to the lowest-numbered root the rule matched; with no dead
/// socket and several roots, to none (the restart rung is next).
#[test]
fn the_signal_goes_to_the_holder_of_the_dead_socket() {
    let mut r = report('S', true);
    // Root 50 (matched first) holds nothing; root 100's child 101 holds
    // the dead socket.
    let mut first = r.processes[0].clone();
    first.pid = 50;
    first.start_ticks = Some(555);
    first.sockets = vec![];
    let mut child = r.processes[0].clone();
    child.pid = 101;
    child.ppid = 100;
    child.start_ticks = Some(888);
    r.processes[0].sockets = vec![];
    r.processes.push(first);
    r.processes.push(child);
    r.roots = vec![50, 100];
    r.sockets[0].pid = 101;
    let j = wedged(ReasonCode::ControlSilent, Some(42));
    let cfg = heal(true, true);
    let mut hist = HealHistory {
        rung: Some(1),
        ..HealHistory::default()
    };
    match decide(&cfg, &j, &r, &mut hist, 100 * SEC) {
        Decision::Act { steps } => assert_eq!(
            steps,
            [Act::Signal {
                pid: 100,
                start_ticks: 777,
                grace_ms: Some(cfg.grace.as_millis() as u64),
            }]
        ),
        d => panic!("{d:?}"),
    }
    // No dead socket, two roots: which one is wedged is not known, so the
    // next step is the restart, not a signal to either.
    let j = wedged(ReasonCode::StatusContradictsKernel, None);
    let mut hist = HealHistory {
        rung: Some(1),
        ..HealHistory::default()
    };
    match decide(&cfg, &j, &r, &mut hist, 100 * SEC) {
        Decision::Act { steps } => {
            assert!(
                matches!(steps.as_slice(), [Act::Restart { .. }]),
                "{steps:?}"
            )
        }
        d => panic!("{d:?}"),
    }
}

/// A dead connection nobody waits on, or a hung connect, in an agent that is
/// not wedged: ended at once (an unanswered proof expired, an attempt
/// destroyed), within the budget, once per step window, never touching the
/// wedge ladder's rungs; `sockets = false` leaves them.
#[test]
fn dead_connections_nobody_waits_on_are_ended_outside_the_ladder() {
    use crate::model::DeadKind;
    let cfg = heal(true, true);
    let finding = |kind: DeadKind, by_proof: bool, verdict: Verdict| {
        let mut j = wedged(ReasonCode::IdleConnectionDead, Some(42));
        j.verdict = verdict;
        j.reasons[0].verdict = verdict;
        j.dead[0].kind = kind;
        j.dead[0].by_proof = by_proof;
        j
    };
    let r = report('S', true);
    // `j` decided on `r` under `cfg`, with `h`, at `now_ms`.
    let on_r = |cfg: &HealConfig, j: &Judgement, h: &mut HealHistory, now_ms: u64| {
        decide(cfg, j, &r, h, now_ms)
    };
    let proven_idle = finding(DeadKind::Idle, true, Verdict::Degraded);
    let mut h = HealHistory::default();
    let steps = acts(on_r(&cfg, &proven_idle, &mut h, 1_000 * SEC));
    assert_eq!(
        steps.iter().map(Act::name).collect::<Vec<_>>(),
        ["expire_keepalive"]
    );
    assert_eq!(h.rung, None);
    h.record_ending(1_000 * SEC, steps[0].clone(), true, String::new());
    assert_eq!((h.rung, h.steps_this_wedge), (None, 0));
    // Within the step window: given its time.
    let d = on_r(&cfg, &proven_idle, &mut h, 1_010 * SEC);
    assert_eq!(
        d,
        Decision::Wait {
            why: "giving the dead connection(s) already ended their window".into(),
            until_ms: 1_030 * SEC
        }
    );
    // Past it, still there: ended again.
    let d = on_r(&cfg, &proven_idle, &mut h, 1_031 * SEC);
    assert!(matches!(d, Decision::Act { .. }), "{d:?}");
    // A hung connect: destroyed.
    let hung = finding(DeadKind::Connecting, false, Verdict::Unresponsive);
    let steps = acts(on_r(&cfg, &hung, &mut HealHistory::default(), 1_000 * SEC));
    assert_eq!(
        steps.iter().map(Act::name).collect::<Vec<_>>(),
        ["destroy_socket"]
    );
    // An awaited dead socket in an agent that is not wedged (impossible from
    // the judge, but the rule is the verdict's): nothing.
    let awaited = finding(DeadKind::Awaited, true, Verdict::Degraded);
    let d = on_r(&cfg, &awaited, &mut HealHistory::default(), 1_000 * SEC);
    assert!(matches!(d, Decision::Nothing { .. }), "{d:?}");
    // Socket steps off, or the budget spent: left open, and said.
    let off = HealConfig {
        sockets: false,
        ..heal(true, true)
    };
    let d = on_r(&off, &proven_idle, &mut HealHistory::default(), 1_000 * SEC);
    assert!(matches!(d, Decision::Nothing { .. }), "{d:?}");
    let spent = HealConfig {
        max_actions_per_hour: 0,
        ..heal(true, true)
    };
    let d = on_r(
        &spent,
        &proven_idle,
        &mut HealHistory::default(),
        1_000 * SEC,
    );
    let Decision::Nothing { why } = d else {
        panic!("{d:?}")
    };
    assert!(why.contains("budget"), "{why}");
}
