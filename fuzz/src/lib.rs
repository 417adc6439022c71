//! Evidence the fuzz targets hand to selfheal's pure cores (judge, ladder)
//! after parsing outside input: a live agent whose control connection the
//! judge has found dead, so the ladder's every rung is reachable.

use std::collections::BTreeMap;

use selfheal_core::{
    inspect::{EbpfStatus, InitDiagnosis, ProcessReport, Report, SocketReport},
    judge::{Judgement, Reason, Verdict},
    ladder::{HealHistory, Step},
    model::{DeadSocket, ReasonCode, SocketRole, TcpState},
};

/// Agent `sol`: pid 100 holding control socket 42 on fd 7.
pub fn report() -> Report {
    Report {
        agent: Some("sol".into()),
        rule: "pid = 100".into(),
        roots: vec![100],
        upstreams: vec!["control 10.0.0.1:7443".into()],
        containers: vec![],
        processes: vec![ProcessReport {
            pid: 100,
            ppid: 1,
            name: "sol".into(),
            state: 'S',
            start_ticks: Some(777),
            uid: Some(0),
            pid_ns_init: false,
            threads: vec![],
            sockets: vec![42],
        }],
        sockets: vec![SocketReport {
            pid: 100,
            fd: Some(7),
            inode: 42,
            cookie: 9,
            local: "10.0.0.2:1".into(),
            remote: "10.0.0.1:7443".into(),
            state: TcpState::Established,
            role: SocketRole::Control,
            upstream: Some(0),
            timer: None,
            tcp_info: None,
            ebpf: None,
            anomalies: vec![],
        }],
        zombies: vec![],
        init: InitDiagnosis {
            root_is_pid1: false,
            pid1: None,
            zombies: 0,
            diagnosis: None,
        },
        ebpf: EbpfStatus {
            built_in: true,
            strategy: None,
            attempts: vec![],
            error: None,
            watched_ms: None,
            overflow: None,
        },
        gaps: vec![],
        left_out: Default::default(),
    }
}

/// The judgement that sends the ladder up from its first rung (socket 42).
pub fn wedged() -> Judgement {
    Judgement {
        verdict: Verdict::Wedged,
        reasons: vec![Reason {
            code: ReasonCode::ControlSilent,
            verdict: Verdict::Wedged,
            message: String::new(),
            evidence: BTreeMap::from([("inode".to_string(), serde_json::json!(42))]),
        }],
        work: vec![],
        dead: vec![DeadSocket {
            pid: 100,
            start_ticks: 777,
            fd: 7,
            inode: 42,
            cookie: 9,
            unacked: 0,
            by_proof: false,
            kind: selfheal_core::model::DeadKind::Awaited,
        }],
    }
}

/// A ladder that armed keepalive on socket 42 at `at_ms`.
pub fn after_first_step(at_ms: u64) -> HealHistory {
    let mut h = HealHistory::default();
    h.record(
        at_ms,
        Step::ArmKeepalive {
            pid: 100,
            start_ticks: 777,
            fd: 7,
            inode: 42,
        },
        true,
        String::new(),
    );
    h
}
