use super::*;
use crate::{
    proc::ThreadInfo,
    sockdiag::{TcpInfo, TimerInfo},
};

fn info(last_recv: u32, last_sent: u32) -> TcpInfo {
    TcpInfo {
        rto_us: 200_000,
        last_data_recv_ms: last_recv,
        last_data_sent_ms: last_sent,
        last_ack_recv_ms: last_recv,
        ..TcpInfo::default()
    }
}

fn conn(pid: u32, state: TcpState, info: Option<TcpInfo>, waiters: Vec<Waiter>) -> Connection {
    Connection {
        owner: Owner {
            pid,
            comm: "agent".into(),
            ..Owner::default()
        },
        fd: 5,
        socket: TcpSocket {
            inode: 1000 + u64::from(pid),
            cookie: 1,
            local: "10.0.0.1:40000".parse().unwrap(),
            remote: "10.0.0.2:443".parse().unwrap(),
            state,
            uid: 0,
            recv_queue: 0,
            send_queue: 0,
            timer: None,
            tcp_info: info,
        },
        waiters,
    }
}

fn recv_waiter(ms: u64) -> Vec<Waiter> {
    vec![Waiter {
        tid: 7,
        syscall: "recvfrom".into(),
        event_loop: false,
        waited_ms: Some(ms),
    }]
}

#[test]
fn a_waited_connection_silent_past_the_threshold_is_suspect() {
    let c = conn(
        1,
        TcpState::Established,
        Some(info(40_000, 31_000)),
        recv_waiter(31_000),
    );
    assert_eq!(judge(&c, 30_000), Some((Verdict::Suspect, Some(31_000))));
}

#[test]
fn recent_data_either_way_is_alive() {
    // A request just sent on an old connection: silent only since then.
    let sent = conn(
        1,
        TcpState::Established,
        Some(info(90_000, 200)),
        recv_waiter(200),
    );
    assert_eq!(judge(&sent, 30_000), Some((Verdict::Alive, Some(200))));
    let got = conn(
        1,
        TcpState::Established,
        Some(info(5, 60_000)),
        recv_waiter(5),
    );
    assert_eq!(judge(&got, 30_000).map(|j| j.0), Some(Verdict::Alive));
}

#[test]
fn exactly_at_the_threshold_is_suspect_one_under_is_alive() {
    let at = conn(
        1,
        TcpState::Established,
        Some(info(1000, 1000)),
        recv_waiter(0),
    );
    assert_eq!(judge(&at, 1000).map(|j| j.0), Some(Verdict::Suspect));
    assert_eq!(judge(&at, 1001).map(|j| j.0), Some(Verdict::Alive));
}

#[test]
fn an_idle_connection_nobody_waits_on_is_not_listed() {
    let c = conn(1, TcpState::Established, Some(info(99_000, 99_000)), vec![]);
    assert_eq!(judge(&c, 30_000), None);
}

#[test]
fn without_tcp_info_a_waited_connection_is_never_suspect() {
    let c = conn(1, TcpState::Established, None, recv_waiter(99_000));
    assert_eq!(judge(&c, 30_000), Some((Verdict::Alive, None)));
}

#[test]
fn close_wait_is_peer_closed_and_listen_time_wait_are_not_listed() {
    let c = conn(1, TcpState::CloseWait, Some(info(10, 10)), vec![]);
    assert_eq!(judge(&c, 30_000).map(|j| j.0), Some(Verdict::PeerClosed));
    for s in [TcpState::Listen, TcpState::TimeWait, TcpState::FinWait2] {
        assert_eq!(
            judge(&conn(1, s, Some(info(1, 1)), recv_waiter(1)), 1),
            None
        );
    }
}

fn syn_sent(rto_ms: u32, backoff: u8, expires_ms: u64) -> Connection {
    syn_sent_after(rto_ms, backoff, backoff, expires_ms)
}

fn syn_sent_after(rto_ms: u32, retransmits: u8, backoff: u8, expires_ms: u64) -> Connection {
    let mut i = info(0, 0);
    i.rto_us = rto_ms * 1000;
    i.retransmits = retransmits;
    i.backoff = backoff;
    let mut c = conn(1, TcpState::SynSent, Some(i), vec![]);
    c.socket.timer = Some(TimerInfo {
        kind: "retransmit",
        expires_ms,
        retransmits: backoff,
    });
    c
}

#[test]
fn connecting_age_is_bounded_from_the_retransmit_timer() {
    // First SYN, RTO 1 s, 700 ms left: 300 ms in.
    assert_eq!(connecting_ms(&syn_sent(1000, 0, 700).socket), Some(300));
    // Two retransmissions (1 s, 2 s waited), RTO now 4 s, 3 s left.
    assert_eq!(connecting_ms(&syn_sent(4000, 2, 3000).socket), Some(4000));
    // Two linear SYN timeouts (6.5+: the RTO not doubled, no backoff)
    // of 1 s, 648 ms left of the third (as `ss` showed one 2.5 s in).
    assert_eq!(
        connecting_ms(&syn_sent_after(1000, 2, 0, 648).socket),
        Some(2352)
    );
    // Four linear, then two doubled: 4 × 1 s, then 2 s and 4 s waited,
    // RTO now 4 s with 1 s left.
    assert_eq!(
        connecting_ms(&syn_sent_after(4000, 6, 2, 1000).socket),
        Some(4000 + 3000 + 3000)
    );
    // No timer: unknown.
    let mut c = syn_sent(1000, 0, 0);
    c.socket.timer = None;
    assert_eq!(connecting_ms(&c.socket), None);
}

#[test]
fn syn_sent_past_the_threshold_is_connecting_a_young_one_not_listed() {
    assert_eq!(
        judge(&syn_sent(2000, 1, 1500), 1000),
        Some((Verdict::Connecting, Some(1500)))
    );
    assert_eq!(judge(&syn_sent(1000, 0, 700), 1000), None);
    // A thread blocked in connect() longer than the timer shows.
    let mut c = syn_sent(1000, 0, 700);
    c.waiters = vec![Waiter {
        tid: 3,
        syscall: "connect".into(),
        event_loop: false,
        waited_ms: Some(5000),
    }];
    assert_eq!(judge(&c, 1000), Some((Verdict::Connecting, Some(5000))));
}

#[test]
fn the_census_is_sorted_by_severity_then_silence() {
    let all = vec![
        conn(
            1,
            TcpState::Established,
            Some(info(10, 10)),
            recv_waiter(10),
        ),
        conn(2, TcpState::CloseWait, Some(info(10, 10)), vec![]),
        conn(
            3,
            TcpState::Established,
            Some(info(40_000, 40_000)),
            recv_waiter(1),
        ),
        conn(
            4,
            TcpState::Established,
            Some(info(90_000, 90_000)),
            recv_waiter(1),
        ),
        syn_sent(60_000, 0, 1000),
        conn(6, TcpState::Established, Some(info(1, 1)), vec![]),
    ];
    let f = census(&all, 30_000);
    let order: Vec<(Verdict, u32)> = f.iter().map(|f| (f.verdict, f.owner.pid)).collect();
    assert_eq!(
        order,
        [
            (Verdict::Suspect, 4),
            (Verdict::Suspect, 3),
            (Verdict::Connecting, 1),
            (Verdict::PeerClosed, 2),
            (Verdict::Alive, 1),
        ]
    );
    assert_eq!(exit_code(&f), 1);
    assert_eq!(exit_code(&f[4..]), 0);
    assert_eq!(exit_code(&[]), 0);
    let mut dead = f[0].clone();
    dead.verdict = Verdict::Dead;
    assert_eq!(exit_code(&[dead]), 2);
}

#[test]
fn a_finding_in_json_has_the_contracts_keys_and_a_null_proof() {
    let f = census(
        &[conn(
            3,
            TcpState::Established,
            Some(info(40_000, 40_000)),
            recv_waiter(1),
        )],
        30_000,
    );
    let v = serde_json::to_value(&f[0]).unwrap();
    for k in [
        "pid",
        "comm",
        "local",
        "remote",
        "state",
        "verdict",
        "silent_ms",
        "waiting",
        "proof",
    ] {
        assert!(v.get(k).is_some(), "{k} missing: {v}");
    }
    assert_eq!(v["verdict"], "suspect");
    assert!(
        v.get("kind").is_none(),
        "a connection's object is as it was: {v}"
    );
    assert_eq!(v["state"], "ESTAB");
    assert!(v["proof"].is_null());
    assert_eq!(v["silent_ms"], 40_000);
}

#[test]
fn the_table_escapes_what_a_process_names_and_says_what_to_run() {
    let mut c = conn(
        42,
        TcpState::Established,
        Some(info(40_000, 40_000)),
        recv_waiter(1),
    );
    c.owner.comm = "evil\x1b[2J".into();
    c.owner.unit = Some("x\x07.service".into());
    let f = census(&[c], 30_000);
    let text = render(&f, &[], &Coverage::default(), 30_000);
    assert!(
        !text.chars().any(|ch| ch.is_control() && ch != '\n'),
        "{text:?}"
    );
    assert!(text.contains("selfheal inspect --pid 42"), "{text}");
    assert!(text.starts_with("VERDICT"), "{text}");
    assert!(text.contains("1 suspect"), "{text}");
    let empty = render(&[], &[], &Coverage::default(), 30_000);
    assert!(empty.starts_with("no connection"), "{empty}");
}

/// Processes read with a gap are counted under the table, with what to
/// run to see the gaps; none, nothing is said.
#[test]
fn processes_read_with_gaps_are_counted() {
    let cover = |with_gaps| Coverage {
        processes: 9,
        with_gaps,
        ..Coverage::default()
    };
    let text = render(&[], &[], &cover(2), 30_000);
    assert!(
        text.contains(
            "9 processes read, 2 read with gaps (`selfheal inspect --pid PID` says what it did not see)"
        ),
        "{text}"
    );
    assert!(!render(&[], &[], &cover(0), 30_000).contains("gaps"));
}

fn proof(result: ProofVerdict, detail: &str) -> ProofResult {
    ProofResult {
        result,
        detail: detail.into(),
        after_ms: Some(4_000),
        bound_ms: Some(15_000),
        restored: true,
    }
}

#[test]
fn proofs_turn_suspects_dead_or_alive_and_leave_the_rest() {
    let silent = || Some(info(40_000, 40_000));
    let cs = [
        conn(1, TcpState::Established, silent(), recv_waiter(1)),
        conn(2, TcpState::Established, silent(), recv_waiter(1)),
        conn(3, TcpState::Established, silent(), recv_waiter(1)),
        conn(4, TcpState::CloseWait, silent(), Vec::new()),
    ];
    let f = census(&cs, 30_000);
    assert_eq!(suspects(&f).count(), 3);
    let f = with_proofs(
        f,
        vec![
            (1002, proof(ProofVerdict::Alive, "the peer answered")),
            (1003, proof(ProofVerdict::Dead, "3 probes unanswered")),
            (1001, proof(ProofVerdict::Unproven, "the connection ended")),
            // Not a suspect: its verdict and proof stay.
            (1004, proof(ProofVerdict::Dead, "never asked")),
        ],
    );
    let by_pid = |pid| f.iter().find(|x| x.owner.pid == pid).unwrap();
    assert_eq!(by_pid(3).verdict, Verdict::Dead);
    assert_eq!(by_pid(2).verdict, Verdict::Alive);
    assert_eq!(by_pid(1).verdict, Verdict::Suspect);
    assert_eq!(
        by_pid(1).proof.as_ref().unwrap().detail,
        "the connection ended"
    );
    assert_eq!(by_pid(4).verdict, Verdict::PeerClosed);
    assert!(by_pid(4).proof.is_none());
    // Sorted again: the dead first, and it sets the exit code.
    assert_eq!(f[0].owner.pid, 3);
    assert_eq!(exit_code(&f), 2);
    let v = serde_json::to_value(&f[0]).unwrap();
    assert_eq!(v["verdict"], "dead");
    assert_eq!(v["proof"]["result"], "dead");
    assert_eq!(v["proof"]["bound_ms"], 15_000);
    let text = render(&f, &[], &Coverage::default(), 30_000);
    assert!(text.contains("1 dead, 1 suspect"), "{text}");
    assert!(
        text.contains("pid 3 fd 5 -> 10.0.0.2:443: dead after 4.0s (bound 15s): 3 probes unanswered; its own options put back"),
        "{text}"
    );
}

fn thread(tid: u32, state: char, idle_ms: Option<u64>) -> ThreadInfo {
    ThreadInfo {
        tid,
        name: "worker\x1b[2J".into(),
        state,
        wchan: (state == 'D').then(|| "fuse_wait_answer".into()),
        cpu_ticks: 0,
        syscall: None,
        idle_ms,
        kstack: Vec::new(),
        recv: None,
        wait: None,
    }
}

fn process(pid: u32, pid_ns_init: bool, threads: Vec<ThreadInfo>, zombies: usize) -> ProcessState {
    ProcessState {
        owner: Owner {
            pid,
            comm: "agent".into(),
            ..Owner::default()
        },
        pid_ns_init,
        threads,
        zombies: (0..zombies)
            .map(|k| Zombie {
                pid: pid + 1 + k as u32,
                comm: "child".into(),
            })
            .collect(),
    }
}

#[test]
fn d_state_threads_past_the_threshold_and_zombies_are_process_findings() {
    let ps = [
        // Fine: running and sleeping threads, no zombies.
        process(
            10,
            false,
            vec![thread(10, 'S', Some(90_000)), thread(11, 'R', None)],
            0,
        ),
        // A D-state thread under the threshold: a disk read, not listed.
        process(20, false, vec![thread(20, 'D', Some(500))], 0),
        // Past it, and one of unknown age: both listed.
        process(
            30,
            false,
            vec![thread(30, 'D', Some(45_000)), thread(31, 'D', None)],
            0,
        ),
        // Zombies under a process that is no init.
        process(40, false, vec![thread(40, 'S', None)], 2),
        // Zombies under PID 1 of a pid namespace: the missing init.
        process(50, true, vec![thread(50, 'S', None)], 3),
    ];
    let f = process_findings(&ps, 30_000);
    let pids: Vec<u32> = f.iter().map(|f| f.owner.pid).collect();
    assert_eq!(pids, [30, 40, 50]);
    assert_eq!(f[0].d_state_count, 2);
    assert_eq!(f[0].d_state[0].wchan.as_deref(), Some("fuse_wait_answer"));
    assert_eq!(f[0].d_state[0].blocked_ms, Some(45_000));
    assert_eq!(f[1].zombie_count, 2);
    assert!(f[1].missing_init.is_none());
    assert_eq!(
        f[2].missing_init.as_deref(),
        Some(crate::inspect::missing_init(3, 50).as_str())
    );
    let v = serde_json::to_value(&f[2]).unwrap();
    assert_eq!(v["kind"], "process");
    assert_eq!(v["pid"], 50);
    assert_eq!(v["zombies"][0]["pid"], 51);
    assert_eq!(v["zombie_count"], 3);
    assert!(v.get("verdict").is_none(), "no connection's keys: {v}");
    let text = render(&[], &f, &Coverage::default(), 30_000);
    assert!(
        !text.chars().any(|ch| ch.is_control() && ch != '\n'),
        "{text:?}"
    );
    assert!(text.contains("\nprocesses:\n"), "{text}");
    assert!(
        text.contains("pid 30 agent: thread 30 (worker\\u{1b}[2J) in D state (uninterruptible) for 45s in fuse_wait_answer"),
        "{text}"
    );
    assert!(text.contains("pid 40 agent: 2 zombie child(ren) not reaped (41 child, 42 child); next: selfheal inspect --pid 40"), "{text}");
    assert!(text.contains("PID 1 of its pid namespace"), "{text}");
    assert!(
        text.contains("2 with unreaped zombies, 1 with threads in D state"),
        "{text}"
    );
}

#[test]
fn a_process_findings_lists_are_capped_and_all_counted() {
    let threads = (0..100).map(|t| thread(t, 'D', None)).collect();
    let f = process_findings(&[process(7, false, threads, 500)], 1000);
    assert_eq!(f[0].d_state.len(), MAX_D_STATE_LISTED);
    assert_eq!(f[0].d_state_count, 100);
    assert_eq!(f[0].zombies.len(), MAX_ZOMBIES_LISTED);
    assert_eq!(f[0].zombie_count, 500);
    let text = render(&[], &f, &Coverage::default(), 1000);
    assert!(
        text.contains(&format!("and {} more)", 500 - MAX_ZOMBIES_LISTED)),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "{} more thread(s) in D state",
            100 - MAX_D_STATE_LISTED
        )),
        "{text}"
    );
}
