use super::*;

fn code(line: &str) -> (Option<u64>, ErrorCode, String) {
    let e = parse_request(line.as_bytes()).unwrap_err();
    (e.id, e.code, e.message)
}

#[test]
fn good_requests_parse() {
    assert_eq!(
        parse_request(br#"{"v":1,"id":7,"op":"hello"}"#).unwrap(),
        Request {
            id: 7,
            op: Op::Hello
        }
    );
    assert_eq!(
        parse_request(b"{\"op\":\"watch\",\"pids\":[9,3,9],\"v\":1,\"id\":1}\r\n").unwrap(),
        Request {
            id: 1,
            op: Op::Watch { pids: vec![3, 9] }
        }
    );
    let r = parse_request(
            br#"{"v":1,"id":11,"op":"act","action":"arm_keepalive","pid":1234,"start_ticks":5170,"fd":7,"inode":4242,"agent":"sol","params":{"idle_s":10}}"#,
        )
        .unwrap();
    let Op::Act(act) = r.op else {
        panic!("not act: {r:?}")
    };
    assert_eq!(act.action, Action::ArmKeepalive);
    let r = parse_request(
            br#"{"v":1,"id":12,"op":"act","action":"prove_keepalive","pid":1234,"start_ticks":5170,"fd":7,"inode":4242,"agent":"sol","params":{"idle_s":1,"interval_s":1,"count":3,"hold_ms":120000}}"#,
        )
        .unwrap();
    let Op::Act(prove) = r.op else {
        panic!("not act: {r:?}")
    };
    assert_eq!(
        (prove.action, prove.fd, prove.inode),
        (Action::ProveKeepalive, Some(7), Some(4242))
    );
    assert_eq!((act.pid, act.start_ticks, act.fd), (1234, 5170, Some(7)));
    assert_eq!(act.agent.as_deref(), Some("sol"));
    assert_eq!(act.params["idle_s"], 10);
}

#[test]
fn requests_round_trip_through_to_line() {
    let mut act = ActRequest::new(Action::Signal, 42, 99);
    act.agent = Some("a.b-c_d".into());
    act.params.insert("grace_ms".into(), 500.into());
    for op in [
        Op::Hello,
        Op::Watch { pids: vec![1, 2] },
        Op::Unwatch { pids: vec![] },
        Op::EbpfSnapshot { pids: vec![5] },
        Op::Iterate { pids: vec![7, 9] },
        Op::Collect(CollectRequest {
            pids: vec![7, 9],
            detail: crate::proc::Detail::Full,
            budget_ms: MAX_COLLECT_BUDGET_MS,
        }),
        Op::Namespaces { pids: vec![3] },
        Op::Act(act),
    ] {
        let req = Request { id: u64::MAX, op };
        assert_eq!(parse_request(&req.to_line()).unwrap(), req);
    }
}

#[test]
fn an_iterate_result_round_trips_with_its_threads_and_sockets() {
    use crate::ebpf::iter::{IterProcess, IterThread};
    let result = IterateResult {
        processes: vec![IteratedProcess {
            pid: 42,
            start_ticks: 5170,
            pass: IterProcess {
                threads: vec![IterThread {
                    tgid: 42,
                    tid: 43,
                    state: 1,
                    exit_state: 0,
                    runtime_ns: 12_000_000,
                    syscall: Some(45),
                    arg0: 7,
                    arg1: u64::MAX,
                    exec_start_ns: 1 << 50,
                    cpu: 1,
                    comm: "agent \u{1b}[31m".into(),
                    head: None,
                }],
                sockets: vec![(7, 4242)],
                tcp: crate::ebpf::iter::TcpPass::Read(vec![crate::ebpf::iter::IterTcp {
                    netns: 4_026_531_840,
                    socket: crate::sockdiag::TcpSocket {
                        inode: 4242,
                        cookie: 9,
                        local: "127.0.0.1:40000".parse().unwrap(),
                        remote: "[::ffff:10.0.0.1]:443".parse().unwrap(),
                        state: crate::model::TcpState::Established,
                        uid: 0,
                        recv_queue: 0,
                        send_queue: 0,
                        timer: None,
                        tcp_info: Some(crate::sockdiag::TcpInfo::default()),
                    },
                }]),
            },
        }],
        gone: vec![],
        refused: vec![9],
    };
    let wire = serde_json::to_string(&result).unwrap();
    assert!(wire.contains(r#""sockets":[[7,4242]]"#), "{wire}");
    assert_eq!(
        serde_json::from_str::<IterateResult>(&wire).unwrap(),
        result
    );
}

#[test]
fn every_malformed_request_is_a_bad_request() {
    // No id can be read from these: the answer has none.
    let no_id: &[(&str, &str)] = &[
        ("", "empty request"),
        ("{", "malformed JSON"),
        ("\u{0}\u{ff}", "malformed JSON"),
        ("[1]", "not a JSON object"),
        (r#"{"v":1,"op":"hello"}"#, "missing field `id`"),
        (r#"{"v":1,"id":-1,"op":"hello"}"#, "`id`"),
    ];
    // These carry id 3, and the answer echoes it.
    let id_3: &[(&str, &str)] = &[
        (r#"{"id":3,"op":"hello"}"#, "missing field `v`"),
        (r#"{"v":2,"id":3,"op":"hello"}"#, "version 2"),
        (r#"{"v":"1","id":3,"op":"hello"}"#, "version"),
        (r#"{"v":1,"id":3}"#, "missing field `op`"),
        (r#"{"v":1,"id":3,"op":7}"#, "`op`"),
        (r#"{"v":1,"id":3,"op":"reboot"}"#, "unknown op \"reboot\""),
        (r#"{"v":1,"id":3,"op":"hello","x":1}"#, "unknown field `x`"),
        (r#"{"v":1,"id":3,"op":"watch"}"#, "missing field `pids`"),
        (
            r#"{"v":1,"id":3,"op":"watch","pids":[-1]}"#,
            "invalid value",
        ),
        (r#"{"v":1,"id":3,"op":"watch","pids":[0]}"#, "pid 0"),
        (r#"{"v":1,"id":3,"op":"watch","pids":"1"}"#, "invalid type"),
        (
            r#"{"v":1,"id":3,"op":"act","pid":5,"start_ticks":1}"#,
            "missing field `action`",
        ),
        (
            r#"{"v":1,"id":3,"op":"act","action":"reboot","pid":5,"start_ticks":1}"#,
            "unknown variant",
        ),
        (
            r#"{"v":1,"id":3,"op":"act","action":"signal","pid":5}"#,
            "missing field `start_ticks`",
        ),
        (
            r#"{"v":1,"id":3,"op":"act","action":"signal","pid":0,"start_ticks":1}"#,
            "pid 0",
        ),
        (
            r#"{"v":1,"id":3,"op":"act","action":"destroy_socket","pid":5,"start_ticks":1}"#,
            "missing field `fd`",
        ),
        (
            r#"{"v":1,"id":3,"op":"act","action":"prove_keepalive","pid":5,"start_ticks":1,"fd":4}"#,
            "missing field `inode` (required by prove_keepalive)",
        ),
        (
            r#"{"v":1,"id":3,"op":"act","action":"expire_keepalive","pid":5,"start_ticks":1,"inode":9}"#,
            "missing field `fd`",
        ),
        (
            r#"{"v":1,"id":3,"op":"act","action":"destroy_socket","pid":5,"start_ticks":1,"fd":-3}"#,
            "fd -3",
        ),
        (
            r#"{"v":1,"id":3,"op":"act","action":"signal","pid":5,"start_ticks":1,"agent":"a b\n"}"#,
            "bad agent name",
        ),
        (
            r#"{"v":1,"id":3,"op":"act","action":"signal","pid":5,"start_ticks":1,"params":[1]}"#,
            "invalid type",
        ),
        (
            r#"{"v":1,"id":3,"op":"act","action":"signal","pid":5,"start_ticks":1,"extra":1}"#,
            "unknown field `extra`",
        ),
    ];
    let cases = no_id
        .iter()
        .map(|(line, needle)| (line, None, needle))
        .chain(id_3.iter().map(|(line, needle)| (line, Some(3), needle)));
    for (line, id, needle) in cases {
        let (got_id, got_code, message) = code(line);
        assert_eq!(
            (got_id, got_code),
            (id, ErrorCode::BadRequest),
            "{line}: {message}"
        );
        assert!(
            message.contains(needle),
            "{line}: {message:?} lacks {needle:?}"
        );
    }
}

#[test]
fn limits_are_enforced() {
    let mut big = br#"{"v":1,"id":1,"op":"hello","x":""#.to_vec();
    big.resize(MAX_REQUEST_BYTES + 1, b'a');
    assert_eq!(parse_request(&big).unwrap_err().code, ErrorCode::TooLarge);
    let pids: Vec<String> = (1..=MAX_PIDS as u32 + 1).map(|p| p.to_string()).collect();
    let line = format!(
        r#"{{"v":1,"id":1,"op":"watch","pids":[{}]}}"#,
        pids.join(",")
    );
    assert!(code(&line).2.contains("more than"));
    // Deep nesting is refused by the JSON parser, not by the stack.
    let deep = format!("{}{}", "[".repeat(30_000), "]".repeat(30_000));
    assert_eq!(code(&deep).1, ErrorCode::BadRequest);
}

#[test]
fn arbitrary_bytes_never_panic() {
    // A cheap deterministic fuzz until the real fuzz target exists.
    let seeds: &[&[u8]] = &[
            br#"{"v":1,"id":11,"op":"act","action":"arm_keepalive","pid":1234,"start_ticks":5170,"fd":7}"#,
            br#"{"v":1,"id":8,"op":"watch","pids":[1234,1240]}"#,
        ];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for seed in seeds {
        for _ in 0..3000 {
            let mut s = seed.to_vec();
            for _ in 0..4 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = (x as usize) % s.len();
                match x % 3 {
                    0 => s[i] = (x >> 8) as u8,
                    1 => {
                        s.remove(i);
                    }
                    _ => s.insert(i, (x >> 16) as u8),
                }
            }
            let _ = parse_request(&s);
        }
    }
}

#[test]
fn responses_parse_and_are_checked() {
    let ok = Response::ok(3, serde_json::json!({"a":1}));
    assert_eq!(Response::parse(&ok.to_line()).unwrap(), ok);
    let err = Response::error(None, ErrorCode::Busy, "slow down");
    assert_eq!(Response::parse(&err.to_line()).unwrap(), err);
    assert!(Response::parse(br#"{"v":1,"id":1,"ok":true}"#).is_err());
    assert!(Response::parse(br#"{"v":2,"id":1,"ok":true,"result":{}}"#).is_err());
    let r =
        Response::parse(br#"{"v":1,"id":1,"ok":false,"error":{"code":"new_code","message":"m"}}"#)
            .unwrap();
    assert_eq!(r.error.unwrap().code, ErrorCode::Unknown);
}

#[test]
fn snapshots_survive_the_wire() {
    let snap = TracerSnapshot {
        strategy: Strategy::TpBtf,
        taken_at_ns: 123,
        blocked: vec![
            BlockedRecv {
                tgid: 10,
                tid: 11,
                inode: Some(99),
                fd: Some(4),
                syscall: Some("recvfrom"),
                tcp_checked: false,
                since_ns: 5,
                age_ms: 6,
            },
            BlockedRecv {
                tgid: 20,
                tid: 21,
                inode: None,
                fd: None,
                syscall: None,
                tcp_checked: true,
                since_ns: 7,
                age_ms: 8,
            },
        ],
        sockets: vec![SocketActivity {
            inode: 99,
            tgid: 10,
            last_recv_ms: Some(1),
            last_recv_bytes: 2,
            last_send_ms: None,
            last_send_bytes: 3,
            recv_data: 4,
            recv_empty: 5,
            recv_error: 6,
            sends: 7,
            bytes_received: 8,
            bytes_sent: 9,
        }],
        overflow: Overflow {
            in_recv_full: 1,
            socks_full: 2,
            read_failed: 3,
            in_send_full: 4,
            over_share: 5,
        },
        shares: Default::default(),
        refused: Vec::new(),
    };
    let json = serde_json::to_vec(&snap).unwrap();
    let wire: SnapshotWire = serde_json::from_slice(&json).unwrap();
    assert_eq!(wire.into_snapshot().unwrap(), snap);
    // A helper older than the share sends no `over_share`.
    let mut old: serde_json::Value = serde_json::from_slice(&json).unwrap();
    old["overflow"]
        .as_object_mut()
        .unwrap()
        .remove("over_share");
    let wire: SnapshotWire = serde_json::from_value(old).unwrap();
    assert_eq!(wire.into_snapshot().unwrap().overflow.over_share, 0);

    // The shares never cross the wire; filtering keeps the losses of
    // the uids that own the pids asked for, and only those.
    let mut shared = snap.clone();
    shared.shares.insert(
        1000,
        crate::ebpf::snapshot::ShareUse {
            tgids: [10].into(),
            socks: 4,
            lost: 7,
        },
    );
    shared.shares.insert(
        2000,
        crate::ebpf::snapshot::ShareUse {
            tgids: [20, 30].into(),
            socks: 8192,
            lost: 900,
        },
    );
    let sent = serde_json::to_value(&shared).unwrap();
    assert!(sent.get("shares").is_none(), "{sent}");
    let only_10 = filter_snapshot(shared.clone(), &[10]);
    assert_eq!(only_10.blocked.len(), 1);
    assert_eq!(only_10.sockets.len(), 1);
    assert_eq!(only_10.overflow.over_share, 7);
    assert!(only_10.shares.is_empty());
    let only_30 = filter_snapshot(shared.clone(), &[30]);
    assert!(only_30.blocked.is_empty());
    assert_eq!(only_30.overflow.over_share, 900);
    assert_eq!(filter_snapshot(shared, &[10, 20]).overflow.over_share, 907);
}

#[test]
fn a_collect_result_round_trips_with_its_waits_timers_and_tcp_info() {
    use crate::proc::{ProcRecv, ProcWait, ProcessInfo, SyscallInfo, ThreadInfo};
    use crate::sockdiag::{TcpInfo, TcpSocket, TimerInfo};
    let thread = |tid: u32, nr: i64| ThreadInfo {
        tid,
        name: "agent \u{1b}[31m".into(),
        state: 'S',
        wchan: None,
        cpu_ticks: 3,
        syscall: Some(SyscallInfo {
            nr,
            name: crate::proc::syscall_name(nr),
            arg0: 7,
        }),
        idle_ms: Some(1500),
        kstack: vec![],
        recv: (nr == 45).then_some(ProcRecv {
            syscall: "recvfrom",
            fd: 7,
            inode: 4242,
            idle_ms: Some(1500),
        }),
        wait: (nr == 7).then(|| ProcWait {
            syscall: "poll",
            sockets: vec![(7, 4242)],
            epoll_fd: None,
            idle_ms: Some(1500),
        }),
    };
    let socket = TcpSocket {
        inode: 4242,
        cookie: 1,
        local: "127.0.0.1:40000".parse().unwrap(),
        remote: "127.0.0.1:443".parse().unwrap(),
        state: crate::model::TcpState::Established,
        uid: 65534,
        recv_queue: 0,
        send_queue: 0,
        timer: Some(TimerInfo {
            kind: "keepalive",
            expires_ms: 900,
            retransmits: 0,
        }),
        tcp_info: Some(TcpInfo {
            rtt_us: 30,
            rto_us: 201_000,
            unacked: 0,
            retransmits: 0,
            backoff: 0,
            probes: 2,
            last_data_recv_ms: 1500,
            last_data_sent_ms: 1500,
            last_ack_recv_ms: 1500,
            bytes_received: 0,
            bytes_acked: 30,
            data_segs_in: 0,
            data_segs_out: 0,
        }),
    };
    let result = CollectResult {
        processes: vec![CollectedProcess {
            pid: 42,
            start_ticks: 5170,
            process: ProcessInfo {
                pid: 42,
                ppid: 1,
                name: "agent".into(),
                state: 'S',
                start_ticks: 5170,
                uid: Some(65534),
                pid_ns_init: false,
                threads: vec![thread(42, 45), thread(43, 7), thread(44, 202)],
                sockets: vec![(7, 4242)],
                gaps: vec![],
            },
            read_by: "iterators".into(),
            net_ns: Some(4026531840),
            tcp: Some(vec![socket]),
            tcp_error: None,
        }],
        gone: vec![],
        refused: vec![9],
        over_budget: vec![11],
    };
    let wire = serde_json::to_string(&result).unwrap();
    assert_eq!(
        serde_json::from_str::<CollectResult>(&wire).unwrap(),
        result
    );
    // A name outside the tables is refused, not taken for text.
    for (known, unknown) in [
        (r#""poll""#, r#""reboot""#),
        (r#""keepalive""#, r#""forever""#),
    ] {
        let bad = wire.replace(known, unknown);
        assert!(
            serde_json::from_str::<CollectResult>(&bad).is_err(),
            "{unknown}"
        );
    }
}
