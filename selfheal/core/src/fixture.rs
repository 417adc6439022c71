//! Evidence to judge and heal on, for tests and the fuzz targets: agent
//! `sol`, pid 100 (started at tick 777), whose control connection is
//! socket 42 on fd 7. Tests change what their case needs on the values
//! these return. Built for this crate's tests and with the feature
//! `fixtures`, never into the product.

use std::collections::BTreeMap;

use crate::{
    inspect::{EbpfReport, InitDiagnosis, ProcessReport, Report, SocketReport, ThreadReport},
    judge::{Judgement, Reason, Verdict},
    ladder::HealHistory,
    model::{DeadKind, DeadSocket, ReasonCode, SocketRole, TcpState},
    protocol::{Act, SocketRef},
};

/// The watched process: pid 100, `sol`, in `state`, holding `sockets`.
pub fn process(state: char, threads: Vec<ThreadReport>, sockets: Vec<u64>) -> ProcessReport {
    ProcessReport {
        pid: 100,
        ppid: 1,
        name: "sol".into(),
        state,
        start_ticks: Some(777),
        uid: Some(0),
        pid_ns_init: false,
        threads,
        sockets,
    }
}

/// The control connection: socket 42 on fd 7 of pid 100, to
/// 10.0.0.1:7443 (upstream 0), established, nothing read of it yet.
pub fn control_socket() -> SocketReport {
    SocketReport {
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
    }
}

/// No pid 1 of its own, no zombies.
pub fn no_init() -> InitDiagnosis {
    InitDiagnosis {
        root_is_pid1: false,
        pid1: None,
        zombies: 0,
        diagnosis: None,
    }
}

/// A tracer built in that did not run.
pub fn ebpf_idle() -> EbpfReport {
    EbpfReport {
        built_in: true,
        strategy: None,
        attempts: vec![],
        error: None,
        watched_ms: None,
        overflow: None,
    }
}

/// The report of agent `sol` (rule `pid = 100`): `process` and the
/// `sockets` it holds, nothing left out, no gaps.
pub fn report_of(process: ProcessReport, sockets: Vec<SocketReport>) -> Report {
    Report {
        agent: Some("sol".into()),
        rule: "pid = 100".into(),
        roots: vec![process.pid],
        upstreams: vec![],
        containers: vec![],
        processes: vec![process],
        sockets,
        zombies: vec![],
        init: no_init(),
        ebpf: ebpf_idle(),
        collection: Default::default(),
        gaps: vec![],
        left_out: Default::default(),
        read_ms: None,
    }
}

/// A live `sol` holding its control connection (upstream named
/// `control 10.0.0.1:7443`).
pub fn report() -> Report {
    let mut r = report_of(process('S', vec![], vec![42]), vec![control_socket()]);
    r.upstreams = vec!["control 10.0.0.1:7443".into()];
    r
}

/// The judge's finding that socket `inode` (on fd 7 of pid 100) is dead,
/// awaited by the agent.
pub fn dead_socket(inode: u64) -> DeadSocket {
    DeadSocket {
        pid: 100,
        start_ticks: 777,
        fd: 7,
        inode,
        cookie: 9,
        unacked: 0,
        by_proof: false,
        peer_alive: false,
        kind: DeadKind::Awaited,
    }
}

/// A wedged judgement for `code`, with the finding of a dead socket
/// `inode` if given (its evidence names the inode).
pub fn wedged_by(code: ReasonCode, inode: Option<u64>) -> Judgement {
    let mut evidence = BTreeMap::new();
    if let Some(i) = inode {
        evidence.insert("inode".to_string(), serde_json::json!(i));
    }
    Judgement {
        verdict: Verdict::Wedged,
        reasons: vec![Reason {
            code,
            verdict: Verdict::Wedged,
            message: String::new(),
            evidence,
        }],
        work: vec![],
        dead: inode.map(dead_socket).into_iter().collect(),
    }
}

/// The judgement that sends the ladder up from its first rung: the
/// control connection (socket 42) silent.
pub fn wedged() -> Judgement {
    wedged_by(ReasonCode::ControlSilent, Some(42))
}

/// A ladder that armed keepalive on socket 42 at `at_ms`.
pub fn after_first_step(at_ms: u64) -> HealHistory {
    let mut h = HealHistory::default();
    h.record(
        at_ms,
        Act::ArmKeepalive {
            pid: 100,
            start_ticks: 777,
            socket: SocketRef { fd: 7, inode: 42 },
        },
        true,
        String::new(),
    );
    h
}

/// Asserts that `parse` rejects each of `inputs`; one it accepts is named
/// in the failure (as lossy UTF-8).
pub fn assert_all_rejected<'a, T, E>(
    inputs: &[&'a [u8]],
    parse: impl Fn(&'a [u8]) -> Result<T, E>,
) {
    for input in inputs {
        assert!(
            parse(input).is_err(),
            "{:?}",
            String::from_utf8_lossy(input)
        );
    }
}
