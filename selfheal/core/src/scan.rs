//! `selfheal scan`'s census, pure: each TCP connection a process holds,
//! with what its threads wait in, becomes a finding with a passive verdict
//! ([`judge`]); [`census`] sorts them by severity, [`render`] writes the
//! table a person reads. The edge (`selfheal::scan`) reads the evidence.
//!
//! A connection is listed when:
//!
//! - it is established and a thread of its process waits on it (in a
//!   receive on it, or in a poll/select/epoll wait whose set holds it with
//!   read interest): `suspect` once it has carried no data either way for
//!   `silent_for`, else `alive`;
//! - it is in SYN-SENT for at least `silent_for`: `connecting`;
//! - it is in CLOSE-WAIT (the peer closed, the process still holds it):
//!   `peer_closed`.
//!
//! An established connection no thread waits on (an idle pooled one) is
//! not listed. `dead` needs a proof: `scan --prove` asks each suspect's
//! peer with a proof keepalive (the edge arms it and reads the answer,
//! [`crate::prove::Proof::answer`] judges it) and [`with_proofs`] turns
//! each suspect `dead` or `alive` by what the peer answered.

use serde::Serialize;

use crate::{model::TcpState, sockdiag::TcpSocket, text::escape};

/// A connection's verdict, most severe first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Proven dead (not produced without a proof).
    Dead,
    /// Established, waited on, silent past the threshold, no proof.
    Suspect,
    /// SYN-SENT past the threshold.
    Connecting,
    /// CLOSE-WAIT, still held.
    PeerClosed,
    /// Waited on, data within the threshold.
    Alive,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Dead => "dead",
            Verdict::Suspect => "suspect",
            Verdict::Connecting => "connecting",
            Verdict::PeerClosed => "peer_closed",
            Verdict::Alive => "alive",
        }
    }
}

display_as_str!(Verdict);

/// A thread waiting on a connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Waiter {
    pub tid: u32,
    /// The syscall it waits in (`recvfrom`, `epoll_wait`, `connect`, …).
    pub syscall: String,
    /// An epoll wait: an event loop, whose set holds every connection it
    /// serves (not all calls in flight).
    pub event_loop: bool,
    /// How long it has waited, where known.
    pub waited_ms: Option<u64>,
}

/// Who a process is, where its cgroup says (no runtime is asked).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Owner {
    pub pid: u32,
    /// `comm`: the process's own name, which it controls.
    pub comm: String,
    pub uid: Option<u32>,
    /// The systemd unit its cgroup is in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// The innermost container its cgroup names (the runtime and the id).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// The Kubernetes pod uid its cgroup names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// Its start time (clock ticks after boot), which an act on it names
    /// (a reused pid is another process).
    #[serde(skip)]
    pub start_ticks: Option<u64>,
}

/// One connection of one process, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connection {
    pub owner: Owner,
    pub fd: i32,
    pub socket: TcpSocket,
    /// The threads of `owner` that wait on it.
    pub waiters: Vec<Waiter>,
}

/// One line of the census (`scan --json`: one object each).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Its process (`pid`, `comm`, and the identity fields where known).
    #[serde(flatten)]
    pub owner: Owner,
    pub fd: i32,
    pub inode: u64,
    pub local: String,
    pub remote: String,
    pub state: TcpState,
    pub verdict: Verdict,
    /// How long the connection has carried no data (for SYN-SENT: how
    /// long it has been connecting, at least), where known.
    pub silent_ms: Option<u64>,
    /// The threads waiting on it.
    pub waiting: Vec<Waiter>,
    /// Retransmissions and unanswered keepalive probes, from `tcp_info`.
    pub retransmits: u8,
    pub probes: u8,
    /// What `--prove` learned of the peer; null without it, and for
    /// connections that were not suspect.
    pub proof: Option<ProofResult>,
}

/// What a proof keepalive said of a suspect's peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProofVerdict {
    /// Its probes went unanswered: the peer is gone.
    Dead,
    /// It answered a probe, or sent data.
    Alive,
    /// No answer either way: the proof could not be armed, its connection
    /// ended, or its time ran out.
    Unproven,
}

/// One suspect's proof, as `scan --prove` ran it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProofResult {
    pub result: ProofVerdict,
    /// What showed it, or why there is no answer.
    pub detail: String,
    /// When the answer came, after arming (none where never armed).
    pub after_ms: Option<u64>,
    /// The latest a dead peer is proven dead, after arming.
    pub bound_ms: Option<u64>,
    /// Whether the socket's own keepalive options were put back and read
    /// back equal (false where never armed: nothing to put back).
    pub restored: bool,
}

/// How long `s` has carried no data, either way: the smaller of
/// `tcp_info`'s ages of the last data received and sent. `None` without
/// `tcp_info`.
pub fn silence_ms(s: &TcpSocket) -> Option<u64> {
    let i = s.tcp_info.as_ref()?;
    Some(u64::from(i.last_data_recv_ms.min(i.last_data_sent_ms)))
}

/// How long a SYN-SENT socket has been connecting, at least, from its
/// retransmit timer and `tcp_info`: of its `retransmits` SYN
/// retransmissions, the last `backoff` each doubled the RTO (so waited
/// `rto >> k`), the others (the kernel's linear SYN timeouts) waited the
/// base RTO `rto >> backoff`; the current wait has run `rto - expires`. A
/// lower bound; `None` without `tcp_info` or an armed retransmit timer.
pub fn connecting_ms(s: &TcpSocket) -> Option<u64> {
    let i = s.tcp_info.as_ref()?;
    let timer = s.timer.as_ref().filter(|t| t.kind == "retransmit")?;
    let rto_ms = u64::from(i.rto_us) / 1000;
    let backoff = u32::from(i.backoff).min(63);
    let doubled: u64 = (1..=backoff).map(|k| rto_ms >> k).sum();
    let linear = u64::from(i.retransmits.saturating_sub(i.backoff)) * (rto_ms >> backoff);
    Some(doubled + linear + rto_ms.saturating_sub(timer.expires_ms))
}

/// The verdict on `c` with the threshold `silent_for_ms`, and the age it
/// is judged by; `None` for a connection the census does not list.
pub fn judge(c: &Connection, silent_for_ms: u64) -> Option<(Verdict, Option<u64>)> {
    match c.socket.state {
        TcpState::Established if !c.waiters.is_empty() => {
            let silent = silence_ms(&c.socket);
            // Without tcp_info the silence is unknown: not suspect on that.
            let verdict = match silent {
                Some(ms) if ms >= silent_for_ms => Verdict::Suspect,
                _ => Verdict::Alive,
            };
            Some((verdict, silent))
        }
        TcpState::SynSent => {
            // A thread blocked in connect() has waited as long as the
            // connect: the longer of that and the timer's bound.
            let waited = c.waiters.iter().filter_map(|w| w.waited_ms).max();
            let age = connecting_ms(&c.socket).max(waited);
            matches!(age, Some(ms) if ms >= silent_for_ms).then_some((Verdict::Connecting, age))
        }
        TcpState::CloseWait => Some((Verdict::PeerClosed, silence_ms(&c.socket))),
        _ => None,
    }
}

/// The findings among `connections`, most severe first (then the longest
/// silent, then by pid and inode).
pub fn census(connections: &[Connection], silent_for_ms: u64) -> Vec<Finding> {
    let mut out = census_unsorted(connections, silent_for_ms);
    sort(&mut out);
    out
}

/// Most severe first, then the longest silent, then by pid and inode.
fn sort(findings: &mut [Finding]) {
    findings.sort_by(|a, b| {
        a.verdict
            .cmp(&b.verdict)
            .then(b.silent_ms.cmp(&a.silent_ms))
            .then(a.owner.pid.cmp(&b.owner.pid))
            .then(a.inode.cmp(&b.inode))
    });
}

/// The suspects among `findings`: the connections `--prove` asks about.
pub fn suspects(findings: &[Finding]) -> impl Iterator<Item = &Finding> {
    findings.iter().filter(|f| f.verdict == Verdict::Suspect)
}

/// `findings` with each proof in `proofs` (by socket inode) on its
/// suspect: `dead` or `alive` as the peer answered, `suspect` still where
/// unproven; sorted again.
pub fn with_proofs(mut findings: Vec<Finding>, proofs: Vec<(u64, ProofResult)>) -> Vec<Finding> {
    for (inode, proof) in proofs {
        let Some(f) = findings
            .iter_mut()
            .find(|f| f.inode == inode && f.verdict == Verdict::Suspect)
        else {
            continue;
        };
        f.verdict = match proof.result {
            ProofVerdict::Dead => Verdict::Dead,
            ProofVerdict::Alive => Verdict::Alive,
            ProofVerdict::Unproven => Verdict::Suspect,
        };
        f.proof = Some(proof);
    }
    sort(&mut findings);
    findings
}

fn census_unsorted(connections: &[Connection], silent_for_ms: u64) -> Vec<Finding> {
    connections
        .iter()
        .filter_map(|c| {
            let (verdict, silent_ms) = judge(c, silent_for_ms)?;
            let info = c.socket.tcp_info.as_ref();
            Some(Finding {
                owner: c.owner.clone(),
                fd: c.fd,
                inode: c.socket.inode,
                local: c.socket.local.to_string(),
                remote: c.socket.remote.to_string(),
                state: c.socket.state,
                verdict,
                silent_ms,
                waiting: c.waiters.clone(),
                retransmits: info.map_or(0, |i| i.retransmits),
                probes: info.map_or(0, |i| i.probes),
                proof: None,
            })
        })
        .collect()
}

/// The exit code of a census, as `check`'s: 2 when something is dead, 1
/// when something is suspect, connecting or peer-closed, else 0.
pub fn exit_code(findings: &[Finding]) -> u8 {
    match findings.iter().map(|f| f.verdict).min() {
        Some(Verdict::Dead) => 2,
        Some(Verdict::Alive) | None => 0,
        Some(_) => 1,
    }
}

/// What the census could not see, for the line under the table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Coverage {
    /// Processes read.
    pub processes: usize,
    /// Processes left out because the caller may not read them (not root:
    /// other users'), counted only.
    pub not_yours: usize,
    /// Processes of the caller's whose fds it may not read (not dumpable,
    /// or read refused), counted only.
    pub unreadable: usize,
    /// Processes that ended during the scan.
    pub gone: usize,
    /// Processes whose read ran past its budget (their threads are partly
    /// read).
    pub over_budget: usize,
    /// Network namespaces whose sockets could not be dumped, with why.
    pub netns_errors: Vec<String>,
}

fn age(ms: Option<u64>) -> String {
    match ms {
        None => "-".into(),
        Some(ms) if ms < 10_000 => format!("{:.1}s", ms as f64 / 1000.0),
        Some(ms) if ms < 3_600_000 => format!("{}s", ms / 1000),
        Some(ms) => format!("{}h{}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

fn waiting_text(w: &[Waiter]) -> String {
    match w {
        [] => "-".into(),
        [one] => format!(
            "{}{} tid {}",
            one.syscall,
            if one.event_loop { " (event loop)" } else { "" },
            one.tid
        ),
        [one, rest @ ..] => format!("{} tid {} +{}", one.syscall, one.tid, rest.len()),
    }
}

/// The census as a table for a person, most severe first, each row with
/// the `inspect` command to run next; every name a process controls
/// (comm, unit, container) escaped.
pub fn render(findings: &[Finding], coverage: &Coverage, silent_for_ms: u64) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let rows: Vec<[String; 9]> = findings
        .iter()
        .map(|f| {
            let who = match (&f.owner.container, &f.owner.unit) {
                (Some(c), _) => format!("container {}", escape(c)),
                (None, Some(u)) => escape(u),
                (None, None) => "-".into(),
            };
            [
                f.verdict.to_string(),
                f.owner.pid.to_string(),
                escape(&f.owner.comm),
                who,
                format!("{} -> {}", f.local, f.remote),
                f.state.to_string(),
                age(f.silent_ms),
                waiting_text(&f.waiting),
                format!("selfheal inspect --pid {}", f.owner.pid),
            ]
        })
        .collect();
    let head = [
        "VERDICT",
        "PID",
        "COMM",
        "UNIT",
        "CONNECTION",
        "STATE",
        "SILENT",
        "WAITING",
        "NEXT",
    ];
    let mut width = head.map(|h| h.chars().count());
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |o: &mut String, cells: &[&str]| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                let _ = write!(s, "{c:<w$}  ", w = width[i]);
            }
        }
        let _ = writeln!(o, "{}", s.trim_end());
    };
    if rows.is_empty() {
        let _ = writeln!(
            o,
            "no connection waited on, connecting or peer-closed (silent-for {})",
            age(Some(silent_for_ms))
        );
    } else {
        line(&mut o, &head);
        for r in &rows {
            let cells: Vec<&str> = r.iter().map(String::as_str).collect();
            line(&mut o, &cells);
        }
    }
    let proved: Vec<&Finding> = findings.iter().filter(|f| f.proof.is_some()).collect();
    if !proved.is_empty() {
        let _ = writeln!(o, "\nproofs:");
    }
    for f in proved {
        let Some(p) = &f.proof else { continue };
        let when = match (p.after_ms, p.bound_ms) {
            (Some(a), Some(b)) => format!(" after {} (bound {})", age(Some(a)), age(Some(b))),
            _ => String::new(),
        };
        let back = match (p.after_ms, p.restored) {
            (None, _) => "",
            (Some(_), true) => "; its own options put back",
            (Some(_), false) => "; its own options NOT put back",
        };
        let _ = writeln!(
            o,
            "  pid {} fd {} -> {}: {}{when}: {}{back}",
            f.owner.pid,
            f.fd,
            f.remote,
            match p.result {
                ProofVerdict::Dead => "dead",
                ProofVerdict::Alive => "alive",
                ProofVerdict::Unproven => "unproven",
            },
            escape(&p.detail)
        );
    }
    let count = |v: Verdict| findings.iter().filter(|f| f.verdict == v).count();
    let dead = match count(Verdict::Dead) {
        0 => String::new(),
        n => format!("{n} dead, "),
    };
    let _ = write!(
        o,
        "\n{dead}{} suspect, {} connecting, {} peer_closed, {} alive; {} processes read",
        count(Verdict::Suspect),
        count(Verdict::Connecting),
        count(Verdict::PeerClosed),
        count(Verdict::Alive),
        coverage.processes
    );
    if coverage.not_yours > 0 {
        let _ = write!(
            o,
            ", {} of other users not read (run as root to see them)",
            coverage.not_yours
        );
    }
    if coverage.unreadable > 0 {
        let _ = write!(o, ", {} not readable", coverage.unreadable);
    }
    if coverage.gone > 0 {
        let _ = write!(o, ", {} ended during the scan", coverage.gone);
    }
    if coverage.over_budget > 0 {
        let _ = write!(
            o,
            ", {} read only in part (past their budget)",
            coverage.over_budget
        );
    }
    let _ = writeln!(o);
    for e in &coverage.netns_errors {
        let _ = writeln!(o, "sockets not read: {}", escape(e));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sockdiag::{TcpInfo, TimerInfo};

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
        let text = render(&f, &Coverage::default(), 30_000);
        assert!(
            !text.chars().any(|ch| ch.is_control() && ch != '\n'),
            "{text:?}"
        );
        assert!(text.contains("selfheal inspect --pid 42"), "{text}");
        assert!(text.starts_with("VERDICT"), "{text}");
        assert!(text.contains("1 suspect"), "{text}");
        let empty = render(&[], &Coverage::default(), 30_000);
        assert!(empty.starts_with("no connection"), "{empty}");
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
        let text = render(&f, &Coverage::default(), 30_000);
        assert!(text.contains("1 dead, 1 suspect"), "{text}");
        assert!(
            text.contains("pid 3 fd 5 -> 10.0.0.2:443: dead after 4.0s (bound 15s): 3 probes unanswered; its own options put back"),
            "{text}"
        );
    }
}
