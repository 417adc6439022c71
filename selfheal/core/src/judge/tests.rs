//! The judge on fixtures: every proof rule, the agent's story against the
//! kernel, damage, and history across runs.

use std::time::Duration;

use super::*;
use crate::{
    config::{Config, Upstream},
    ebpf::Overflow,
    fixture,
    inspect::{InitDiagnosis, ThreadReport, Zombie},
    model::{Gap, RecvSource},
    sockdiag::TcpInfo,
};

const MIN: u64 = 60_000;

fn agent(extra: &str) -> AgentConfig {
    let text = format!(
        "[[agent]]\nname = \"sol\"\nmatch = {{ cmdline = \"sol\" }}\n\
         [[agent.upstream]]\nrole = \"control\"\naddr = \"10.0.0.1:7443\"\nheartbeat = \"10s\"\n\
         [[agent.upstream]]\nrole = \"provider\"\naddr = \":443\"\n{extra}"
    );
    Config::parse(&text, std::path::Path::new("/test.toml"))
        .expect("fixture config")
        .agents
        .remove(0)
}

fn info(last_recv_ms: u64, last_ack_ms: u64, last_sent_ms: u64) -> TcpInfo {
    TcpInfo {
        rtt_us: 200,
        rto_us: 204_000,
        unacked: 0,
        retransmits: 0,
        backoff: 0,
        probes: 0,
        last_data_recv_ms: last_recv_ms as u32,
        last_data_sent_ms: last_sent_ms as u32,
        last_ack_recv_ms: last_ack_ms as u32,
        bytes_received: 1000,
        bytes_acked: 1000,
        data_segs_in: 0,
        data_segs_out: 0,
    }
}

fn socket(inode: u64, role: &'static str, i: TcpInfo) -> SocketReport {
    SocketReport {
        pid: 100,
        fd: Some(inode as i32 + 2),
        inode,
        cookie: inode + 5000,
        local: "10.0.0.2:40000".into(),
        remote: if role == "control" {
            "10.0.0.1:7443".into()
        } else {
            "10.9.9.9:443".into()
        },
        state: TcpState::Established,
        role: match role {
            "control" => SocketRole::Control,
            "provider" => SocketRole::Provider,
            _ => SocketRole::Other,
        },
        upstream: match role {
            "control" => Some(0),
            "provider" => Some(1),
            _ => None,
        },
        timer: None,
        tcp_info: Some(i),
        ebpf: None,
        anomalies: vec![],
    }
}

fn thread(tid: u32, state: char, recv: Option<(u64, u64)>) -> ThreadReport {
    ThreadReport {
        tid,
        name: "t".into(),
        state,
        wchan: Some("wait_woken".into()),
        cpu_ticks: 1,
        syscall: recv.map(|_| "recvfrom".into()),
        idle_ms: Some(recv.map_or(20_000, |(_, age)| age)),
        kstack: vec![],
        recv_blocked_ms: recv.map(|(_, age)| age),
        recv_inode: recv.map(|(inode, _)| inode),
        recv_syscall: recv.map(|_| "recvfrom".into()),
        recv_source: recv.map(|_| RecvSource::Procfs),
        wait_syscall: None,
        wait_inodes: vec![],
        wait_event_loop: false,
        anomalies: vec![],
    }
}

/// `sol` (pid 100, started at tick 4242) with `threads`, holding
/// `sockets`, and a tracer that lost nothing.
fn report(threads: Vec<ThreadReport>, sockets: Vec<SocketReport>) -> Report {
    let mut process = fixture::process('S', threads, sockets.iter().map(|s| s.inode).collect());
    process.start_ticks = Some(4242);
    let mut r = fixture::report_of(process, sockets);
    r.rule = "cmdline = \"sol\"".into();
    r.ebpf.overflow = Some(Overflow::default());
    r
}

fn ok_probe(claims: bool) -> ProbeView {
    ProbeView {
        target: "http://127.0.0.1:8080/status".into(),
        error: None,
        expectations_met: true,
        makes_claims: claims,
        latency_ms: Some(3),
        fields: BTreeMap::new(),
    }
}

fn alive_control() -> SocketReport {
    socket(1, "control", info(2_000, 2_000, 2_000))
}

fn codes(j: &Judgement) -> Vec<&str> {
    j.reasons.iter().map(|r| r.code.as_str()).collect()
}

/// One case: evidence in, verdict and the codes that must be among the reasons.
struct Case {
    name: &'static str,
    config: &'static str,
    report: Report,
    probes: Vec<ProbeView>,
    history: AgentHistory,
    verdict: Verdict,
    codes: &'static [&'static str],
}

impl Case {
    /// `report` judged under the fixture config, with no probe and no
    /// history.
    fn new(
        name: &'static str,
        report: Report,
        verdict: Verdict,
        codes: &'static [&'static str],
    ) -> Case {
        Case {
            name,
            config: "",
            report,
            probes: vec![],
            history: AgentHistory::default(),
            verdict,
            codes,
        }
    }
}

fn check(case: Case) {
    let cfg = agent(case.config);
    let (j, _) = judge(&cfg, &case.report, &case.probes, &case.history, 100 * MIN);
    assert_eq!(j.verdict, case.verdict, "{}: {:#?}", case.name, j.reasons);
    for code in case.codes {
        assert!(
            codes(&j).contains(code),
            "{}: no {code} in {:?}",
            case.name,
            codes(&j)
        );
    }
    assert_eq!(
        j.verdict, j.reasons[0].verdict,
        "{}: worst reason first",
        case.name
    );
}

#[test]
fn verdicts_on_fixtures() {
    let mut dead_keepalive = info(10 * MIN, 10 * MIN, 10 * MIN);
    dead_keepalive.probes = 3;
    let mut backoff = info(3 * MIN, 3 * MIN, 1_000);
    backoff.unacked = 2;
    backoff.backoff = 4;
    let mut close_wait = socket(2, "provider", info(5_000, 5_000, 5_000));
    close_wait.state = TcpState::CloseWait;
    let mut zombies = report(vec![thread(100, 'S', None)], vec![alive_control()]);
    zombies.zombies = (0..25)
        .map(|i| Zombie {
            pid: 200 + i,
            ppid: 100,
            name: "opencode".into(),
        })
        .collect();
    zombies.init = InitDiagnosis {
        root_is_pid1: true,
        pid1: Some(100),
        zombies: 25,
        diagnosis: Some(
            "25 zombie(s) under pid 100 (PID 1 of its pid namespace), which does not reap".into(),
        ),
    };
    let mut no_process = report(vec![], vec![]);
    no_process.processes.clear();
    no_process.gaps.push(Gap::new(
        GapKind::NoProcess,
        "no process matched: no process's command line matches \"sol\"",
    ));
    // The same, with a command line the rule had to match unread: not
    // judged (one of those may be the agent), never `down`.
    let mut unread = no_process.clone();
    unread.gaps.push(Gap::new(
        GapKind::Unread,
        "the command line of 1 process(es) could not be read, so this rule cannot tell \
         whether they match: pid 7 of uid 1000 (its read did not finish in time)",
    ));
    // A live process matched beside an unread one: judged as usual.
    let mut unread_beside_match = report(vec![thread(101, 'S', None)], vec![alive_control()]);
    unread_beside_match.gaps.push(unread.gaps[1].clone());
    // A live process of an agent whose upstreams are what its connections
    // do, its namespace's listeners unread: none of its connections got a
    // role, so it is not judged (without the rule it would pass as healthy).
    let mut listeners_unread = report(vec![thread(101, 'S', None)], vec![]);
    listeners_unread.gaps.push(Gap::new(
        GapKind::Listening,
        "listening sockets of pid 101's network namespace (net:[4026531840]) unreadable: \
         cannot enter the network namespace of pid 101: Operation not permitted; its \
         connections cannot be told accepted from made, none was judged",
    ));
    // The same live process with its socket table unread instead: judged.
    let mut sockets_unread = report(vec![thread(101, 'S', None)], vec![]);
    sockets_unread.gaps.push(Gap::new(
        GapKind::Sockets,
        "TCP sockets of pid 101's network namespace unavailable: EPERM",
    ));
    let timeout = ProbeView {
        error: Some("timeout".into()),
        latency_ms: None,
        ..ok_probe(false)
    };
    let said_disconnected = ProbeView {
        expectations_met: false,
        ..ok_probe(true)
    };
    let slow = ProbeView {
        latency_ms: Some(1_500),
        ..ok_probe(false)
    };
    let mut d_state = thread(101, 'D', None);
    d_state.idle_ms = Some(30_000);

    let cases = vec![
        Case::new(
            "provider silent 10 min, peer ACKs keepalives: busy",
            report(
                vec![thread(101, 'S', Some((2, 10 * MIN)))],
                vec![
                    alive_control(),
                    socket(2, "provider", info(10 * MIN, 500, 10 * MIN)),
                ],
            ),
            Verdict::Busy,
            &["call_in_flight"],
        ),
        Case::new(
            "the same with keepalive probes unanswered: wedged",
            report(
                vec![thread(101, 'S', Some((2, 10 * MIN)))],
                vec![alive_control(), socket(2, "provider", dead_keepalive)],
            ),
            Verdict::Wedged,
            &["peer_unresponsive", "recv_blocked"],
        ),
        Case::new(
            "retransmission backoff on unacknowledged data: wedged",
            report(
                vec![],
                vec![alive_control(), socket(2, "provider", backoff)],
            ),
            Verdict::Wedged,
            &["peer_unresponsive"],
        ),
        Case::new(
            "control silent 4 × heartbeat: wedged",
            report(
                vec![thread(101, 'S', Some((1, 40_000)))],
                vec![socket(1, "control", info(40_000, 40_000, 40_000))],
            ),
            Verdict::Wedged,
            &["control_silent"],
        ),
        Case::new(
            "control silent 2 × heartbeat: not yet",
            report(
                vec![thread(101, 'S', Some((1, 20_000)))],
                vec![socket(1, "control", info(20_000, 20_000, 20_000))],
            ),
            Verdict::Idle,
            &["idle"],
        ),
        Case {
            probes: vec![ok_probe(true)],
            history: AgentHistory {
                control_absent_since_ms: Some(100 * MIN - 5 * MIN),
                ..AgentHistory::default()
            },
            ..Case::new(
                "status says connected while the control socket is gone: wedged",
                report(vec![thread(100, 'S', None)], vec![]),
                Verdict::Wedged,
                &["status_contradicts_kernel", "control_absent"],
            )
        },
        Case::new(
            "peer closed, the agent did not: wedged",
            report(vec![], vec![alive_control(), close_wait]),
            Verdict::Wedged,
            &["peer_closed"],
        ),
        Case::new(
            "zombies over threshold under PID 1: degraded, missing init",
            zombies,
            Verdict::Degraded,
            &["zombies"],
        ),
        Case {
            probes: vec![timeout],
            ..Case::new(
                "probe timeout on a live process: unresponsive",
                report(vec![thread(100, 'S', None)], vec![alive_control()]),
                Verdict::Unresponsive,
                &["probe_failed"],
            )
        },
        Case {
            probes: vec![said_disconnected],
            ..Case::new(
                "the agent's status answers, but says something unexpected: degraded",
                report(vec![thread(100, 'S', None)], vec![alive_control()]),
                Verdict::Degraded,
                &["probe_unexpected"],
            )
        },
        Case {
            probes: vec![slow],
            ..Case::new(
                "slow probe: degraded",
                report(vec![thread(100, 'S', None)], vec![alive_control()]),
                Verdict::Degraded,
                &["probe_slow"],
            )
        },
        Case::new(
            "thread in D state for 30 s: degraded",
            report(vec![d_state], vec![alive_control()]),
            Verdict::Degraded,
            &["d_state"],
        ),
        Case::new(
            "no process: down",
            no_process,
            Verdict::Down,
            &["no_process"],
        ),
        Case::new(
            "no process, a command line unread: not judged",
            unread,
            Verdict::Unresponsive,
            &["over_budget"],
        ),
        Case::new(
            "a live process, its namespace's listeners unread: not judged",
            listeners_unread,
            Verdict::Unresponsive,
            &["over_budget"],
        ),
        Case::new(
            "a live process, its namespace's socket table unread: judged",
            sockets_unread,
            Verdict::Healthy,
            &["healthy"],
        ),
        Case::new(
            "a process, another's command line unread: judged",
            unread_beside_match,
            Verdict::Idle,
            &["idle"],
        ),
        Case {
            probes: vec![ok_probe(true)],
            ..Case::new(
                "control alive, nothing in flight: idle",
                report(
                    vec![thread(101, 'S', Some((1, 2_000)))],
                    vec![
                        alive_control(),
                        // The answer came after the request: nothing is out.
                        socket(2, "provider", info(30 * MIN, 30 * MIN, 30 * MIN + 40)),
                    ],
                ),
                Verdict::Idle,
                &["idle"],
            )
        },
        Case::new(
            "a provider thinking silently, no proof either way: busy, suspect",
            report(
                vec![thread(101, 'S', Some((2, 5 * MIN)))],
                vec![
                    alive_control(),
                    socket(2, "provider", info(5 * MIN, 5 * MIN, 5 * MIN)),
                ],
            ),
            Verdict::Busy,
            &["suspect"],
        ),
        Case {
            config: "[[agent.upstream]]\nrole = \"provider\"\naddr = \":8443\"\nsuspect_after = \"10m\"\n",
            ..Case::new(
                "a per-upstream suspect_after keeps a slow provider out of suspicion",
                {
                    let mut s = socket(3, "provider", info(5 * MIN, 5 * MIN, 5 * MIN));
                    s.upstream = Some(2);
                    report(
                        vec![thread(101, 'S', Some((3, 5 * MIN)))],
                        vec![alive_control(), s],
                    )
                },
                Verdict::Busy,
                &["call_in_flight"],
            )
        },
    ];
    for case in cases {
        check(case);
    }
}

fn task_probe(task: &str) -> ProbeView {
    let mut p = ok_probe(false);
    p.fields
        .insert(CURRENT_TASK.into(), serde_json::Value::String(task.into()));
    p
}

#[test]
fn current_task_unchanged_without_progress_is_a_contradiction() {
    let cfg = agent("[agent.thresholds]\ncurrent_task_stale = \"10m\"\n");
    let history = AgentHistory {
        current_task: Some(("WI-42".into(), 100 * MIN - 15 * MIN)),
        ..AgentHistory::default()
    };
    // No upstream socket received anything for 20 minutes.
    let stuck = report(
        vec![thread(101, 'S', Some((2, 20 * MIN)))],
        vec![
            socket(1, "control", info(20 * MIN, 20 * MIN, 20 * MIN)),
            socket(2, "provider", info(20 * MIN, 20 * MIN, 20 * MIN)),
        ],
    );
    let (j, h) = judge(&cfg, &stuck, &[task_probe("WI-42")], &history, 100 * MIN);
    assert!(
        codes(&j).contains(&"status_contradicts_kernel"),
        "{:?}",
        codes(&j)
    );
    assert_eq!(j.verdict, Verdict::Wedged);
    assert_eq!(h.current_task, Some(("WI-42".into(), 100 * MIN - 15 * MIN)));

    // A stream still delivering is progress, whatever the task says.
    let streaming = report(
        vec![],
        vec![
            socket(1, "control", info(8_000, 8_000, 8_000)),
            socket(2, "provider", info(3_000, 3_000, 15 * MIN)),
        ],
    );
    let (j, _) = judge(
        &cfg,
        &streaming,
        &[task_probe("WI-42")],
        &history,
        100 * MIN,
    );
    assert!(
        !codes(&j).contains(&"status_contradicts_kernel"),
        "{:?}",
        codes(&j)
    );
    assert_eq!(j.verdict, Verdict::Busy);

    // A new task resets the clock.
    let (j, h) = judge(&cfg, &stuck, &[task_probe("WI-43")], &history, 100 * MIN);
    assert!(!codes(&j).contains(&"status_contradicts_kernel"));
    assert_eq!(h.current_task, Some(("WI-43".into(), 100 * MIN)));
}

#[test]
fn flapping_evidence_across_runs() {
    let cfg = agent("");
    let silent = || {
        report(
            vec![thread(101, 'S', Some((2, 2 * MIN)))],
            vec![
                alive_control(),
                socket(2, "provider", info(2 * MIN, 2 * MIN, 2 * MIN)),
            ],
        )
    };
    let moving = || {
        report(
            vec![thread(101, 'S', Some((2, 1_000)))],
            vec![
                alive_control(),
                socket(2, "provider", info(1_000, 1_000, 1_000)),
            ],
        )
    };
    let mut dead = silent();
    dead.sockets[1].tcp_info.as_mut().unwrap().probes = 2;

    let mut h = AgentHistory::default();
    let mut verdicts = Vec::new();
    let mut since = Vec::new();
    for (t, r) in [
        (1, silent()),
        (2, silent()),
        (3, moving()),
        (4, silent()),
        (5, dead.clone()),
        (6, dead),
        (7, moving()),
    ] {
        let (j, next) = judge(&cfg, &r, &[], &h, t * MIN);
        verdicts.push(j.verdict);
        since.push((
            next.suspect_since_ms.get(&5002).copied(),
            next.verdict_since_ms,
        ));
        h = next;
    }
    use Verdict::*;
    assert_eq!(verdicts, [Busy, Busy, Busy, Busy, Wedged, Wedged, Busy]);
    // The suspect clock starts at the first silent run, survives the next,
    // and restarts after data moved.
    assert_eq!(since[0].0, Some(MIN));
    assert_eq!(since[1].0, Some(MIN));
    assert_eq!(since[2].0, None);
    assert_eq!(since[3].0, Some(4 * MIN));
    // The verdict's clock moves only on transitions.
    assert_eq!(
        since.iter().map(|s| s.1).collect::<Vec<_>>(),
        [MIN, MIN, MIN, MIN, 5 * MIN, 5 * MIN, 7 * MIN]
    );
}

#[test]
fn thresholds_parse_and_default() {
    let cfg = agent("[agent.thresholds]\nsuspect_after = \"30s\"\nzombies = 5\n");
    assert_eq!(cfg.thresholds.suspect_after, Duration::from_secs(30));
    assert_eq!(cfg.thresholds.zombies, 5);
    assert_eq!(
        cfg.thresholds.dead_probes,
        Thresholds::default().dead_probes
    );
    let u: &Upstream = &cfg.upstreams[0];
    assert_eq!(u.suspect_after, None);
}

/// Found by fuzzing: a heartbeat at the edge of what a duration holds.
#[test]
fn a_huge_heartbeat_does_not_overflow() {
    let text = "[[agent]]\nname = \"sol\"\nmatch = { pid = 1 }\n[[agent.upstream]]\nrole = \"control\"\naddr = \"10.0.0.1:7443\"\nheartbeat = \"500000000000y\"\n";
    let cfg = Config::parse(text, std::path::Path::new("/t.toml"))
        .expect("parses")
        .agents
        .remove(0);
    let r = report(
        vec![],
        vec![socket(
            1,
            "control",
            info(u32::MAX as u64, u32::MAX as u64, 0),
        )],
    );
    let (j, _) = judge(&cfg, &r, &[], &AgentHistory::default(), u64::MAX);
    assert!(j.verdict.rank() >= Verdict::Idle.rank());
}

/// A config with every threshold, bound and timeout the judge compares
/// set to `bound`, on the evidence of an agent stuck every way at once,
/// judged every 10 minutes for a week with its history carried: under an
/// ordinary bound it is wedged; under one too long to count in ms it never
/// is, however long the history (`as u64` wrapped 18446744073709557 s to
/// 5.4 s).
#[test]
fn huge_thresholds_never_judge_early() {
    const STUCK: &[&str] = &[
        "control_silent",
        "stream_stalled",
        "d_state",
        "status_contradicts_kernel",
        "silence_exceeded",
        "probe_slow",
        "recv_blocked",
        "peer_unresponsive",
    ];
    let judged = |bound: &str| -> Vec<Judgement> {
        let keys = format!(
            "suspect_after = \"{bound}\"\nmax_silence = \"{bound}\"\n\
             connect_timeout = \"{bound}\"\nstall_after = \"{bound}\"\n"
        );
        let text = format!(
            "[[agent]]\nname = \"sol\"\nmatch = {{ cmdline = \"sol\" }}\n\
             [agent.thresholds]\nsuspect_after = \"{bound}\"\nrecv_blocked = \"{bound}\"\n\
             current_task_stale = \"{bound}\"\nd_state = \"{bound}\"\nprobe_slow = \"{bound}\"\n\
             [[agent.upstream]]\nrole = \"control\"\naddr = \"10.0.0.1:7443\"\nheartbeat = \"{bound}\"\n{keys}\
             [[agent.upstream]]\nrole = \"provider\"\naddr = \":443\"\n{keys}"
        );
        let cfg = Config::parse(&text, std::path::Path::new("/test.toml"))
            .expect("a bound too long for ms still parses")
            .agents
            .remove(0);
        let mut history = AgentHistory::default();
        (1..=7 * 24 * 6u64)
            .map(|c| {
                let now = c * 10 * MIN;
                let silent = now.min(u64::from(u32::MAX));
                let mut stuck = thread(101, 'D', None);
                stuck.idle_ms = Some(now);
                // The provider call: its request at 0, a 42-byte ping
                // arriving every 10 minutes since, the last 1 s ago.
                let mut pings = info(1_000, 1_000, silent);
                pings.bytes_received = 1_000 + 42 * c;
                pings.data_segs_in = 2 + c as u32;
                pings.data_segs_out = 1;
                let r = report(
                    vec![stuck, thread(102, 'S', Some((2, now)))],
                    vec![
                        socket(1, "control", info(silent, silent, 0)),
                        socket(2, "provider", pings),
                    ],
                );
                let mut probe = task_probe("thinking");
                probe.latency_ms = Some(now);
                let (j, next) = judge(&cfg, &r, &[probe], &history, now);
                history = next;
                j
            })
            .collect()
    };
    let stuck_codes = |js: &[Judgement]| -> BTreeSet<String> {
        js.iter()
            .flat_map(codes)
            .filter(|c| STUCK.contains(c))
            .map(str::to_string)
            .collect()
    };
    // The evidence is stuck: an ordinary bound judges it.
    let ordinary = judged("60s");
    assert!(ordinary.iter().any(|j| j.verdict == Verdict::Wedged));
    for code in ["control_silent", "stream_stalled", "d_state", "probe_slow"] {
        assert!(stuck_codes(&ordinary).contains(code), "{code}");
    }
    // Past what ms can count: never, at any check of the week.
    for bound in ["18446744073709557s", "18446744073709552s", "500000000000y"] {
        let huge = judged(bound);
        assert!(
            huge.iter()
                .all(|j| j.verdict.rank() < Verdict::Unresponsive.rank()),
            "{bound}: {:#?}",
            huge.iter()
                .find(|j| j.verdict.rank() >= Verdict::Unresponsive.rank())
        );
        assert!(
            stuck_codes(&huge).is_empty(),
            "{bound}: {:?}",
            stuck_codes(&huge)
        );
    }
}

#[test]
fn control_silence_says_whether_the_peer_still_acknowledges() {
    let cfg = agent("");
    let message = |i: TcpInfo| {
        let r = report(
            vec![thread(101, 'S', Some((1, 40_000)))],
            vec![socket(1, "control", i)],
        );
        let (j, _) = judge(&cfg, &r, &[], &AgentHistory::default(), 100 * MIN);
        assert_eq!(j.verdict, Verdict::Wedged);
        j.reasons
            .iter()
            .find(|r| r.code.as_str() == "control_silent")
            .expect("control_silent")
            .message
            .clone()
    };
    // A stopped server: its kernel ACKed a heartbeat 500 ms ago.
    let hung = message(info(40_000, 500, 500));
    assert!(
        hung.contains("still acknowledges (last ACK 500ms ago)"),
        "{hung}"
    );
    // A vanished server: nothing acknowledged since the silence began.
    let gone = message(info(40_000, 40_000, 500));
    assert!(
        gone.contains("nothing acknowledged for 40.0s either"),
        "{gone}"
    );
}

#[test]
fn an_event_loop_waiting_on_a_silent_provider_is_busy_when_it_reports_a_task() {
    let cfg = agent("[agent.thresholds]\nsuspect_after = \"2s\"\n");
    // No thread blocked in a receive (an event loop); the provider sent the
    // response head, then nothing for 5 s; its kernel ACKs.
    let r = report(
        vec![thread(101, 'S', None)],
        vec![
            alive_control(),
            socket(2, "provider", info(5_000, 4_000, 5_100)),
        ],
    );
    let (j, _) = judge(
        &cfg,
        &r,
        &[task_probe("WI-9")],
        &AgentHistory::default(),
        100 * MIN,
    );
    assert_eq!(j.verdict, Verdict::Busy, "{:?}", codes(&j));
    let suspect = j
        .reasons
        .iter()
        .find(|r| r.code.as_str() == "suspect")
        .expect("suspect");
    assert!(
        suspect.message.contains("current_task \"WI-9\""),
        "{}",
        suspect.message
    );
    // Without the claim, the same socket is nobody's call: idle.
    let (j, _) = judge(&cfg, &r, &[], &AgentHistory::default(), 100 * MIN);
    assert_eq!(j.verdict, Verdict::Idle, "{:?}", codes(&j));
    // An empty or null task claims nothing.
    let (j, _) = judge(
        &cfg,
        &r,
        &[task_probe("")],
        &AgentHistory::default(),
        100 * MIN,
    );
    assert_eq!(j.verdict, Verdict::Idle, "{:?}", codes(&j));
}

#[test]
fn a_status_contradicts_an_absent_control_only_once_the_absence_persists() {
    let cfg = agent("[agent.thresholds]\nsuspect_after = \"2s\"\n");
    let r = report(vec![thread(100, 'S', None)], vec![]);
    // Just noticed (a reconnect in progress): no verdict yet.
    let (j, h) = judge(
        &cfg,
        &r,
        &[ok_probe(true)],
        &AgentHistory::default(),
        100 * MIN,
    );
    assert!(j.verdict.is_ok(), "{:?}", codes(&j));
    // Still absent 3 s later: both the absence and the contradiction.
    let (j, _) = judge(&cfg, &r, &[ok_probe(true)], &h, 100 * MIN + 3_000);
    assert_eq!(j.verdict, Verdict::Wedged);
    let c = codes(&j);
    assert!(
        c.contains(&"status_contradicts_kernel") && c.contains(&"control_absent"),
        "{c:?}"
    );
}

#[test]
fn a_connection_attempt_is_an_absent_control_not_a_silent_one() {
    let cfg = agent("[agent.thresholds]\nsuspect_after = \"2s\"\n");
    // SYN sent, never answered: tcp_info's "last received" is meaningless
    // (the time since boot), and must not read as hours of silence.
    let mut syn = socket(1, "control", info(10_000_000, 10_000_000, 500));
    syn.state = TcpState::SynSent;
    let r = report(vec![thread(100, 'S', None)], vec![syn]);
    let (j, h) = judge(&cfg, &r, &[], &AgentHistory::default(), 100 * MIN);
    assert!(
        j.verdict.is_ok(),
        "a reconnect in progress: {:?}",
        codes(&j)
    );
    let (j, _) = judge(&cfg, &r, &[], &h, 100 * MIN + 3_000);
    assert_eq!(codes(&j), ["control_absent"]);
    assert!(
        j.reasons[0]
            .message
            .contains("1 connection attempt(s) unanswered"),
        "{}",
        j.reasons[0].message
    );
}

/// A proof keepalive armed `armed_for` before `100 * MIN` on socket 2.
fn armed(armed_for: u64) -> AgentHistory {
    let mut h = AgentHistory::default();
    h.proofs.insert(
        5002,
        Proof {
            pid: 100,
            start_ticks: 4242,
            fd: 4,
            inode: 2,
            armed_at_ms: 100 * MIN - armed_for,
            first_probe_ms: 0,
            interval_ms: 1_000,
            count: 3,
            previous: crate::keepalive::KeepaliveSettings {
                enabled: false,
                idle_s: 7200,
                interval_s: 75,
                count: 9,
                user_timeout_ms: 0,
            },
            restore_failures: 0,
            restore_error: None,
        },
    );
    h
}

/// A thread waiting in poll on socket `inode` for `age` ms (as a Python SDK
/// with a timeout does).
fn poll_thread(tid: u32, inode: u64, age: u64) -> ThreadReport {
    let mut t = thread(tid, 'S', None);
    t.syscall = Some("poll".into());
    t.idle_ms = Some(age);
    t.wait_syscall = Some("poll".into());
    t.wait_inodes = vec![inode];
    t
}

fn work_of(j: &Judgement) -> Vec<&'static str> {
    j.work
        .iter()
        .map(|w| match w {
            ProofWork::Arm { .. } => "arm",
            ProofWork::Restore { .. } => "restore",
        })
        .collect()
}

/// The prove stage's cases: which silent calls get a proof keepalive, and
/// what its probes prove.
#[test]
fn silent_calls_are_proven() {
    const S: u64 = 2 * MIN; // silent past the default suspect_after (60 s)
    let provider = |i: TcpInfo| socket(2, "provider", i);
    let silent = info(S, S, S); // request out, nothing back for a minute
    let probes = |n: u8, ack_ms: u64| {
        let mut i = info(S, ack_ms, S);
        i.probes = n;
        i
    };
    let mut unacked = info(S, S, 90_000); // the request 90 s ago, unacknowledged
    unacked.unacked = 1;
    let mut answered_before = info(S, S, S + 30);
    answered_before.bytes_received = 4000;
    let mut carried = AgentHistory::default();
    carried.pending.insert(5002, 4000);
    struct P {
        name: &'static str,
        config: &'static str,
        threads: Vec<ThreadReport>,
        socket: SocketReport,
        history: AgentHistory,
        verdict: Verdict,
        code: &'static str,
        work: &'static [&'static str],
    }
    let cases = vec![
        P {
            name: "a call awaited in poll (the SDKs), request out, silent a minute: arm",
            config: "",
            threads: vec![poll_thread(101, 2, S)],
            socket: provider(silent.clone()),
            history: AgentHistory::default(),
            verdict: Verdict::Busy,
            code: "suspect",
            work: &["arm"],
        },
        P {
            name: "no thread waits (futex, event loop); the last thing was a send (tie): arm",
            config: "",
            threads: vec![],
            socket: provider(silent.clone()),
            history: AgentHistory::default(),
            verdict: Verdict::Busy,
            code: "suspect",
            work: &["arm"],
        },
        P {
            name: "an answer came after the request, no thread waits: idle, proven all the same",
            config: "",
            threads: vec![],
            socket: provider(answered_before.clone()),
            history: AgentHistory::default(),
            verdict: Verdict::Idle,
            code: "idle",
            work: &["arm"],
        },
        P {
            name: "a request seen out earlier, no byte received since: still in flight",
            config: "",
            threads: vec![],
            socket: provider(answered_before.clone()),
            history: carried,
            verdict: Verdict::Busy,
            code: "suspect",
            work: &["arm"],
        },
        P {
            name: "data in flight: its retransmissions are the proof, nothing armed",
            config: "",
            threads: vec![thread(101, 'S', Some((2, S)))],
            socket: provider(unacked),
            history: AgentHistory::default(),
            verdict: Verdict::Busy,
            code: "suspect",
            work: &[],
        },
        P {
            name: "proof keepalives turned off: watched only",
            config: "[agent.proof]\nkeepalive = false\n",
            threads: vec![poll_thread(101, 2, S)],
            socket: provider(silent.clone()),
            history: AgentHistory::default(),
            verdict: Verdict::Busy,
            code: "suspect",
            work: &[],
        },
        P {
            name: "armed 1.5 s ago, 2 probes out: not yet proven, nothing new armed",
            config: "",
            threads: vec![poll_thread(101, 2, S)],
            socket: provider(probes(2, S)),
            history: armed(1_500),
            verdict: Verdict::Busy,
            code: "suspect",
            work: &[],
        },
        P {
            name: "armed 3 s ago, 3 probes unanswered, each given 1 s: dead",
            config: "",
            threads: vec![poll_thread(101, 2, S)],
            socket: provider(probes(3, S)),
            history: armed(3_000),
            verdict: Verdict::Wedged,
            code: "peer_unresponsive",
            work: &[],
        },
        P {
            name: "3 probes out but the third only just sent: not yet",
            config: "",
            threads: vec![poll_thread(101, 2, S)],
            socket: provider(probes(3, S)),
            history: armed(2_100),
            verdict: Verdict::Busy,
            code: "suspect",
            work: &[],
        },
        P {
            name: "the peer ACKed after arming: alive, options put back",
            config: "",
            threads: vec![poll_thread(101, 2, S)],
            socket: provider(probes(0, 300)),
            history: armed(1_200),
            verdict: Verdict::Busy,
            code: "call_in_flight",
            work: &["restore"],
        },
        P {
            name: "the agent's own keepalive with 2 probes out is not our proof: dead by dead_probes",
            config: "",
            threads: vec![poll_thread(101, 2, S)],
            socket: provider(probes(2, S)),
            history: AgentHistory::default(),
            verdict: Verdict::Wedged,
            code: "peer_unresponsive",
            work: &[],
        },
        P {
            name: "a new call on a keep-alive connection idle 30 min: its silence starts with the request",
            config: "",
            threads: vec![poll_thread(101, 2, 500)],
            socket: provider(info(30 * MIN, 30 * MIN, 500)),
            history: AgentHistory::default(),
            verdict: Verdict::Busy,
            code: "call_in_flight",
            work: &[],
        },
        P {
            name: "a call answered within one tick, idle 11 min, nobody waiting: never unresponsive",
            config: "",
            threads: vec![],
            socket: provider(info(11 * MIN, 11 * MIN, 11 * MIN)),
            history: AgentHistory::default(),
            verdict: Verdict::Busy,
            code: "suspect",
            work: &["arm"],
        },
        P {
            name: "a proxy answers the probes, silent past max_silence: unresponsive",
            config: "",
            threads: vec![poll_thread(101, 2, 11 * MIN)],
            socket: provider(info(11 * MIN, 500, 11 * MIN)),
            history: AgentHistory::default(),
            verdict: Verdict::Unresponsive,
            code: "silence_exceeded",
            work: &[],
        },
    ];
    for c in cases {
        let cfg = agent(c.config);
        let r = report(c.threads, vec![alive_control(), c.socket]);
        let (j, next) = judge(&cfg, &r, &[], &c.history, 100 * MIN);
        assert_eq!(j.verdict, c.verdict, "{}: {:#?}", c.name, j.reasons);
        assert!(codes(&j).contains(&c.code), "{}: {:?}", c.name, codes(&j));
        assert_eq!(work_of(&j), c.work, "{}", c.name);
        // An armed proof is kept while its socket lives.
        assert_eq!(
            next.proofs.keys().collect::<Vec<_>>(),
            c.history.proofs.keys().collect::<Vec<_>>(),
            "{}",
            c.name
        );
    }
}

/// What the ladder acts on comes from the judge as typed findings, one per
/// dead socket whose holder and fd were read: never re-read from the
/// reasons' JSON evidence.
#[test]
fn dead_sockets_are_typed_findings_for_the_ladder() {
    let cfg = agent("");
    let mut proven = info(2 * MIN, 2 * MIN, 2 * MIN);
    proven.probes = 3;
    let mut retrans = info(2 * MIN, 2 * MIN, 500);
    retrans.unacked = 2;
    retrans.backoff = 9;
    let silent = socket(1, "control", info(40_000, 40_000, 500));
    let r = report(
        vec![thread(101, 'S', Some((1, 40_000)))],
        vec![
            silent,
            socket(2, "provider", proven),
            socket(3, "provider", retrans),
        ],
    );
    let (j, _) = judge(&cfg, &r, &[], &armed(5_000), 100 * MIN);
    assert_eq!(j.verdict, Verdict::Wedged);
    let found: Vec<(u64, i32, u64, u32, bool)> = j
        .dead
        .iter()
        .map(|d| (d.inode, d.fd, d.cookie, d.unacked, d.by_proof))
        .collect();
    assert_eq!(
        found,
        [
            (1, 3, 5001, 0, false),
            (2, 4, 5002, 0, true),
            (3, 5, 5003, 2, false)
        ],
        "{:#?}",
        j.reasons
    );
    assert!(j.dead.iter().all(|d| d.pid == 100 && d.start_ticks == 4242));
    // A dead socket whose fd could not be read is a reason, not a finding:
    // no action can address it.
    let mut no_fd = socket(1, "control", info(40_000, 40_000, 500));
    no_fd.fd = None;
    let (j, _) = judge(
        &cfg,
        &report(vec![], vec![no_fd]),
        &[],
        &AgentHistory::default(),
        100 * MIN,
    );
    assert!(codes(&j).contains(&"control_silent"), "{:?}", codes(&j));
    assert!(j.dead.is_empty());
}

/// The proof's dead reason carries the mark the ladder ends it by; a proof
/// whose socket went (or whose fd now holds another socket) is forgotten.
#[test]
fn proofs_are_marked_and_forgotten_with_their_socket() {
    let cfg = agent("");
    let mut dead = info(2 * MIN, 2 * MIN, 2 * MIN);
    dead.probes = 3;
    let r = report(vec![], vec![alive_control(), socket(2, "provider", dead)]);
    let (j, _) = judge(&cfg, &r, &[], &armed(5_000), 100 * MIN);
    let reason = j
        .reasons
        .iter()
        .find(|r| r.code.as_str() == "peer_unresponsive")
        .expect("dead");
    assert_eq!(reason.evidence["proof"], true);
    assert!(
        reason.message.contains("proof keepalive armed 5.0s ago"),
        "{}",
        reason.message
    );

    // The socket missing from a report while its process lives (a socket
    // table that could not be read): the proof is kept, for a while.
    let gone = report(vec![], vec![alive_control()]);
    let (_, next) = judge(&cfg, &gone, &[], &armed(5_000), 100 * MIN);
    assert_eq!(next.proofs.len(), 1, "kept while its process lives");
    let (_, next) = judge(&cfg, &gone, &[], &armed(11 * MIN), 100 * MIN);
    assert!(next.proofs.is_empty(), "not forever");
    // Its process gone: forgotten.
    let mut no_process = report(vec![], vec![]);
    no_process.processes.clear();
    let (_, next) = judge(&cfg, &no_process, &[], &armed(5_000), 100 * MIN);
    assert!(next.proofs.is_empty());
}

/// A socket the proof found alive still needs its threads read: whether
/// its call is in flight may rest on a thread waiting on it (a client that
/// sent nothing has no request on the wire).
#[test]
fn a_socket_alive_by_its_proof_still_has_its_threads_read() {
    let cfg = agent("");
    let mut answered_just_now = info(2 * MIN, 300, 2 * MIN);
    answered_just_now.bytes_acked = 1; // only the SYN: nothing sent
    let r = report(
        vec![],
        vec![alive_control(), socket(2, "provider", answered_just_now)],
    );
    assert!(!needs_thread_detail(
        &cfg,
        &r,
        &AgentHistory::default(),
        100 * MIN
    ));
    let mut h = AgentHistory::default();
    h.answered.insert(
        5002,
        Answered {
            at_ms: 100 * MIN - 300,
            rounds: 1,
        },
    );
    assert!(needs_thread_detail(&cfg, &r, &h, 100 * MIN));
    assert!(needs_thread_detail(&cfg, &r, &armed(1_000), 100 * MIN));
}

/// The keepalive rung ends a `control_silent` socket about 5 s
/// after arming, so what the judge calls dead must be dead. A slow but live
/// link (a 3 s round trip, heartbeats arriving late, a retransmission or
/// two) is never `wedged`; only silence past 3 × the heartbeat is.
#[test]
fn a_slow_but_live_control_link_is_never_dead_and_the_limit_is_pinned() {
    let cfg = agent(""); // control heartbeat 10 s: the limit is 30 s
    let verdict = |i: TcpInfo| {
        let r = report(
            vec![thread(101, 'S', Some((1, 40_000)))],
            vec![socket(1, "control", i)],
        );
        let (j, _) = judge(&cfg, &r, &[], &AgentHistory::default(), 100 * MIN);
        (
            j.verdict,
            codes(&j).iter().map(|c| c.to_string()).collect::<Vec<_>>(),
        )
    };
    // Slow: a 3 s round trip, a heartbeat 25 s late, one retransmission
    // of the agent's own heartbeat with an ACK 4 s ago.
    let mut slow = info(25_000, 4_000, 500);
    slow.rtt_us = 3_000_000;
    slow.rto_us = 6_000_000;
    slow.unacked = 1;
    slow.retransmits = 1;
    slow.backoff = 1;
    let (v, c) = verdict(slow.clone());
    assert_ne!(v, Verdict::Wedged, "{c:?}");
    assert!(
        !c.iter()
            .any(|c| c == "control_silent" || c == "peer_unresponsive"),
        "{c:?}"
    );
    // At the limit (30 s of silence): still not dead; just past it: dead.
    let (v, _) = verdict(info(30_000, 30_000, 500));
    assert_ne!(v, Verdict::Wedged);
    let (v, c) = verdict(info(30_001, 30_001, 500));
    assert_eq!(v, Verdict::Wedged);
    assert!(c.iter().any(|c| c == "control_silent"), "{c:?}");
}

/// What a dead connection means rests on whether a call may wait on it: an
/// idle pooled one is `idle_connection_dead` (degraded, ended before a
/// request is sent into it); one in the epoll set of a waiting event loop,
/// or with a request out, is a wedge.
#[test]
fn a_proven_dead_connection_means_what_may_wait_on_it() {
    let cfg = agent("");
    const S: u64 = 2 * MIN;
    // The answer came after the request: nothing known to be in flight.
    let mut idle = info(S, S, S + 30);
    idle.probes = 3;
    let event_loop = |inode: u64| {
        let mut t = thread(102, 'S', None);
        t.syscall = Some("epoll_wait".into());
        t.wait_syscall = Some("epoll_wait".into());
        t.wait_inodes = vec![inode];
        t.wait_event_loop = true;
        t
    };
    let mut request_out = idle.clone();
    request_out.last_data_sent_ms = (S - 1_000) as u32;
    struct C {
        name: &'static str,
        threads: Vec<ThreadReport>,
        info: TcpInfo,
        verdict: Verdict,
        code: &'static str,
        kind: DeadKind,
    }
    for c in [
        C {
            name: "idle pooled, nobody waits: its own verdict, ended",
            threads: vec![thread(101, 'S', None)],
            info: idle.clone(),
            verdict: Verdict::Degraded,
            code: "idle_connection_dead",
            kind: DeadKind::Idle,
        },
        C {
            name: "in the epoll set of a waiting event loop: a call may wait, wedged",
            threads: vec![event_loop(2)],
            info: idle.clone(),
            verdict: Verdict::Wedged,
            code: "peer_unresponsive",
            kind: DeadKind::Awaited,
        },
        C {
            name: "another socket in the event loop's set: this one is still idle",
            threads: vec![event_loop(9)],
            info: idle.clone(),
            verdict: Verdict::Degraded,
            code: "idle_connection_dead",
            kind: DeadKind::Idle,
        },
        C {
            name: "a request went out after the last answer: wedged",
            threads: vec![],
            info: request_out,
            verdict: Verdict::Wedged,
            code: "peer_unresponsive",
            kind: DeadKind::Awaited,
        },
    ] {
        let r = report(
            c.threads,
            vec![alive_control(), socket(2, "provider", c.info)],
        );
        let (j, _) = judge(&cfg, &r, &[], &armed(5_000), 100 * MIN);
        assert_eq!(
            (j.verdict, codes(&j)[0]),
            (c.verdict, c.code),
            "{}: {:#?}",
            c.name,
            j.reasons
        );
        let kinds: Vec<_> = j
            .dead
            .iter()
            .map(|d| (d.inode, d.kind, d.by_proof))
            .collect();
        assert_eq!(kinds, [(2, c.kind, true)], "{}", c.name);
    }
    // Not proven by our keepalive (the agent's own, 9 probes unanswered):
    // its meaning stays what it was, a wedge.
    let mut own = info(S, S, S + 30);
    own.probes = 9;
    let r = report(vec![], vec![alive_control(), socket(2, "provider", own)]);
    let (j, _) = judge(&cfg, &r, &[], &AgentHistory::default(), 100 * MIN);
    assert_eq!(j.verdict, Verdict::Wedged, "{:?}", codes(&j));
    // Alive (the probe answered): idle, its options put back.
    let mut answered = info(S, 300, S + 30);
    answered.probes = 0;
    let r = report(
        vec![],
        vec![alive_control(), socket(2, "provider", answered)],
    );
    let (j, _) = judge(&cfg, &r, &[], &armed(5_000), 100 * MIN);
    assert_eq!((j.verdict, work_of(&j)), (Verdict::Idle, vec!["restore"]));
    assert!(j.dead.is_empty());
}

/// A silent idle socket is proven without making the agent busy, and says
/// so; one whose peer answered within `suspect_after` is not asked again.
#[test]
fn an_idle_silent_connection_is_proven_without_changing_the_verdict() {
    let cfg = agent("");
    const S: u64 = 2 * MIN;
    let r = report(
        vec![],
        vec![alive_control(), socket(2, "provider", info(S, S, S + 30))],
    );
    let (j, _) = judge(&cfg, &r, &[], &AgentHistory::default(), 100 * MIN);
    assert_eq!(j.verdict, Verdict::Idle);
    assert_eq!(work_of(&j), ["arm"]);
    let suspect = j
        .reasons
        .iter()
        .find(|r| r.code == ReasonCode::Suspect)
        .expect("a reason");
    assert_eq!(suspect.verdict, Verdict::Healthy);
    assert!(
        suspect.message.contains("no call known to wait on it"),
        "{}",
        suspect.message
    );
    // Without a control upstream the base verdict is still said.
    let no_control = agent("").upstreams.split_off(1);
    let mut cfg2 = agent("");
    cfg2.upstreams = no_control;
    let mut s = socket(2, "provider", info(S, S, S + 30));
    s.upstream = Some(0);
    let (j, _) = judge(
        &cfg2,
        &report(vec![], vec![s]),
        &[],
        &AgentHistory::default(),
        100 * MIN,
    );
    assert_eq!(
        (j.verdict, codes(&j)),
        (Verdict::Healthy, vec!["suspect", "healthy"])
    );
    // The peer answered a proof 20 s ago (its ACK is 20 s old): alive, not
    // proven again until silent another suspect_after.
    let r = report(
        vec![],
        vec![
            alive_control(),
            socket(2, "provider", info(S, 20_000, S + 30)),
        ],
    );
    let (j, _) = judge(&cfg, &r, &[], &AgentHistory::default(), 100 * MIN);
    assert!(work_of(&j).is_empty(), "{:?}", j.reasons);
}

/// A SYN-SENT socket with `retransmits` SYNs resent, `backoff` doublings
/// and its RTO now (seconds), as `tcp_info` shows it.
fn syn(retransmits: u8, backoff: u8, rto_s: u32) -> SocketReport {
    let mut i = info(10_000_000, 10_000_000, 500);
    i.retransmits = retransmits;
    i.backoff = backoff;
    i.rto_us = rto_s * 1_000_000;
    i.unacked = 1;
    let mut s = socket(2, "provider", i);
    s.state = TcpState::SynSent;
    s
}

/// The age a connect's own timers prove is never more than its real age,
/// on both schedules: (resent, backoff, RTO now in s) as `tcp_info` showed
/// them on 6.18 (`tcp_syn_linear_timeouts` 4: SYNs resent at 1, 2, 3, 4,
/// 5, 7, 11, 19 s) and as a kernel before 6.5 shows them (1, 3, 7, 15, 31,
/// 63, 127 s, the RTO capped at 120 s), each with the time of its last
/// resend, which is what it proves.
#[test]
fn a_connects_age_by_its_own_timers_is_the_time_of_its_last_resend() {
    let age = |n: u8, b: u8, rto_s: u32| {
        sockets::syn_waited_ms(syn(n, b, rto_s).tcp_info.as_ref().unwrap())
    };
    let linear = [
        (0, 0, 1, 0),
        (1, 0, 1, 1),
        (4, 0, 1, 4),
        (5, 1, 2, 5),
        (6, 2, 4, 7),
        (7, 3, 8, 11),
        (8, 4, 16, 19),
    ];
    let exponential = [(1, 1, 2, 1), (2, 2, 4, 3), (5, 5, 32, 31), (6, 6, 64, 63)];
    for (n, b, rto, resent_at) in linear.into_iter().chain(exponential) {
        assert_eq!(
            age(n, b, rto),
            resent_at * 1000,
            "{n} resent, backoff {b}, rto {rto} s"
        );
    }
    // The RTO at its 120 s ceiling: understated, never overstated (127 s).
    let capped = age(7, 7, 120);
    assert!((100_000..=127_000).contains(&capped), "{capped}");
    // A backoff past the resends (never from the kernel) is no lever.
    assert!(age(2, 200, 1) <= 2_000);
    assert!(age(255, 255, u32::MAX / 1_000_000) <= u64::from(u32::MAX / 1000) * 255);
}

/// A connection attempt the peer never answers is `unresponsive` past its
/// upstream's `connect_timeout`, by the time first seen or by its own
/// retransmission timeouts, never by an assumed schedule, and is a finding
/// the ladder ends.
#[test]
fn a_connect_that_hangs_is_unresponsive_past_its_connect_timeout() {
    let cfg = agent("");
    let at = 100 * MIN;
    // First seen, 2 SYNs resent (2 s at least): nothing yet.
    let (j, h) = judge(
        &cfg,
        &report(vec![], vec![alive_control(), syn(2, 0, 1)]),
        &[],
        &AgentHistory::default(),
        at,
    );
    assert!(j.verdict.is_ok() && j.dead.is_empty(), "{:?}", codes(&j));
    assert_eq!(h.connecting_since_ms.get(&5002), Some(&at));
    // Seen 31 s later, still unanswered: past the 30 s default.
    let (j, _) = judge(
        &cfg,
        &report(vec![], vec![alive_control(), syn(3, 0, 1)]),
        &[],
        &h,
        at + 31_000,
    );
    assert_eq!(
        (j.verdict, codes(&j)[0]),
        (Verdict::Unresponsive, "connect_timeout")
    );
    assert_eq!(
        j.reasons[0].message,
        "provider connection to 10.9.9.9:443: the peer never answered the handshake (first seen 31.0s ago; 3 SYN(s) resent), past its connect_timeout of 30.0s; ending the attempt so the connect fails now"
    );
    assert_eq!(
        j.dead.iter().map(|d| (d.inode, d.kind)).collect::<Vec<_>>(),
        [(2, DeadKind::Connecting)]
    );
    // First seen with 5 SYNs resent on the linear schedule (Linux 6.5 on):
    // 5 s old, not 31 s: nothing.
    let (j, _) = judge(
        &cfg,
        &report(vec![], vec![alive_control(), syn(5, 1, 2)]),
        &[],
        &AgentHistory::default(),
        at,
    );
    assert!(j.dead.is_empty(), "{:?}", j.reasons);
    // The same count on the exponential schedule (before 6.5): 31 s.
    let (j, _) = judge(
        &cfg,
        &report(vec![], vec![alive_control(), syn(5, 5, 32)]),
        &[],
        &AgentHistory::default(),
        at,
    );
    assert_eq!(codes(&j)[0], "connect_timeout");
    assert!(
        j.reasons[0].message.contains(
            "(at least 31.0s by its own retransmission timeouts (RTO now 32.0s); 5 SYN(s) resent)"
        ),
        "{}",
        j.reasons[0].message
    );
    // Linear, 8 resent: 19 s, past a connect_timeout of 10 s.
    let short = agent("connect_timeout = \"10s\"\n");
    let (j, _) = judge(
        &short,
        &report(vec![], vec![alive_control(), syn(8, 4, 16)]),
        &[],
        &AgentHistory::default(),
        at,
    );
    assert_eq!(codes(&j)[0], "connect_timeout");
    assert_eq!(
        j.reasons[0].evidence.get("waited_ms"),
        Some(&serde_json::json!(19_000))
    );
    // A longer connect_timeout on the upstream holds it.
    let patient = agent("connect_timeout = \"2m\"\n");
    let (j, _) = judge(
        &patient,
        &report(vec![], vec![alive_control(), syn(5, 5, 32)]),
        &[],
        &AgentHistory::default(),
        at,
    );
    assert!(j.dead.is_empty(), "{:?}", codes(&j));
}

/// One connection, several calls: the threads waiting on a dead socket are
/// counted in its reason (`waiters`), the longest wait named.
#[test]
fn the_threads_waiting_on_one_dead_connection_are_counted() {
    let cfg = agent("");
    let mut proven = info(2 * MIN, 2 * MIN, 2 * MIN);
    proven.probes = 3;
    let threads = vec![
        poll_thread(101, 2, 100_000),
        poll_thread(102, 2, 110_000),
        poll_thread(103, 2, 90_000),
    ];
    let r = report(
        threads,
        vec![alive_control(), socket(2, "provider", proven.clone())],
    );
    let (j, _) = judge(&cfg, &r, &[], &armed(5_000), 100 * MIN);
    let w = j
        .reasons
        .iter()
        .find(|r| r.code == ReasonCode::WaitBlocked)
        .unwrap_or_else(|| panic!("{:#?}", j.reasons));
    assert_eq!(w.evidence["waiters"], 3);
    assert_eq!(w.evidence["tid"], 102);
    assert!(
        w.message.ends_with("with 2 other thread(s) waiting on it"),
        "{}",
        w.message
    );
    // One waiter: the message as it always was.
    let r = report(
        vec![poll_thread(101, 2, 100_000)],
        vec![alive_control(), socket(2, "provider", proven)],
    );
    let (j, _) = judge(&cfg, &r, &[], &armed(5_000), 100 * MIN);
    let w = j
        .reasons
        .iter()
        .find(|r| r.code == ReasonCode::WaitBlocked)
        .unwrap();
    assert!(
        w.message.ends_with("on that dead connection"),
        "{}",
        w.message
    );
    assert_eq!(w.evidence["waiters"], 1);
}

/// A proof armed 20 ms before this check started, answered 15 ms after
/// arming, on a socket read 30 ms into the check: the ACK's age (35 ms)
/// counts back from the read, so it is an answer and the options are put
/// back. Judged against the check's start alone, the same ACK looked older
/// than the proof and the options were left armed (a socket read later in
/// a check than its proof was armed in the check before: a benchmark of
/// 1,000 proofs left 87 armed).
#[test]
fn a_proof_answer_is_timed_from_when_its_socket_was_read() {
    // Suspect after 10 ms, so an ACK 35 ms ago is no sign of life alone.
    let cfg = agent("[agent.thresholds]\nsuspect_after = \"10ms\"\n");
    let sockets = || {
        vec![
            alive_control(),
            socket(2, "provider", info(2 * MIN, 35, 2 * MIN)),
        ]
    };
    let threads = || vec![poll_thread(101, 2, 2 * MIN)];
    let mut r = report(threads(), sockets());
    r.read_ms = Some(100 * MIN + 30);
    let (j, h) = judge(&cfg, &r, &[], &armed(20), 100 * MIN);
    assert_eq!(work_of(&j), ["restore"], "{:?}", j.reasons);
    assert!(
        matches!(j.work[0], ProofWork::Restore { answered: true, .. }),
        "{:?}",
        j.work
    );
    assert!(h.answered.contains_key(&5002) || h.proofs.contains_key(&5002));
    // Unstamped (the check's start stands for the read): no answer yet.
    let (j, _) = judge(
        &cfg,
        &report(threads(), sockets()),
        &[],
        &armed(20),
        100 * MIN,
    );
    assert!(work_of(&j).is_empty(), "{:?}", j.work);
}

/// A peer that closed while a proof keepalive was armed on its silent
/// call: its leftover FIN-WAIT-2 socket answers the probes (for up to 60 s),
/// so the socket's last ACK stays fresh. The close is already the evidence:
/// the proof is put back at once (not as an answer), no new one is armed,
/// and the wait is `wedged` (`peer_closed`) once a check has seen it closed
/// past the grace, however fresh the ACKs.
#[test]
fn a_peer_that_closed_under_a_proof_is_judged_without_waiting_for_it() {
    let cfg = agent("");
    let closed = |ack_ms: u64| {
        let mut s = socket(2, "provider", info(2 * MIN, ack_ms, 2 * MIN + 1_000));
        s.state = TcpState::CloseWait;
        s
    };
    let threads = || vec![poll_thread(101, 2, 2 * MIN)];
    // Just closed, the probe answered 300 ms ago: within the grace, the
    // proof is put back (not an answer), nothing armed, nothing dead yet.
    let (j, h) = judge(
        &cfg,
        &report(threads(), vec![alive_control(), closed(300)]),
        &[],
        &armed(10_000),
        100 * MIN,
    );
    assert_eq!(work_of(&j), ["restore"], "{:?}", j.reasons);
    assert!(
        matches!(
            j.work[0],
            ProofWork::Restore {
                answered: false,
                ..
            }
        ),
        "{:?}",
        j.work
    );
    assert!(h.answered.is_empty(), "{:?}", h.answered);
    assert!(j.dead.is_empty(), "{:?}", j.reasons);
    assert_eq!(h.closed_since_ms.get(&5002), Some(&(100 * MIN)));
    // 2.5 s later, still answered 300 ms ago: wedged by the close.
    let mut h2 = h.clone();
    h2.proofs.clear(); // put back
    let (j, h3) = judge(
        &cfg,
        &report(threads(), vec![alive_control(), closed(300)]),
        &[],
        &h2,
        100 * MIN + 2_500,
    );
    assert_eq!(j.verdict, Verdict::Wedged, "{:?}", j.reasons);
    assert!(codes(&j).contains(&"peer_closed"), "{:?}", codes(&j));
    assert!(work_of(&j).is_empty(), "{:?}", j.work);
    assert_eq!(
        j.dead
            .iter()
            .map(|d| (d.inode, d.by_proof))
            .collect::<Vec<_>>(),
        [(2, false)]
    );
    assert_eq!(h3.closed_since_ms.get(&5002), Some(&(100 * MIN)));
    // The same with the proof still held (its restore failed): the same
    // verdict, and its options put back again.
    let (j, _) = judge(
        &cfg,
        &report(threads(), vec![alive_control(), closed(300)]),
        &[],
        &AgentHistory {
            proofs: armed(12_500).proofs,
            ..h.clone()
        },
        100 * MIN + 2_500,
    );
    assert_eq!(j.verdict, Verdict::Wedged, "{:?}", j.reasons);
    assert_eq!(work_of(&j), ["restore"]);
}
