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
//!
//! Beside the connections, what is wrong with a process itself, as
//! `inspect` shows it ([`process_findings`]): children that exited and
//! that it has not reaped (zombies), with the missing-init diagnosis when
//! it is PID 1 of its pid namespace, and threads in uninterruptible sleep
//! (D state) for at least `silent_for`, with their wait channel.

use serde::Serialize;

use crate::{
    inspect::missing_init, model::TcpState, proc::ThreadInfo, sockdiag::TcpSocket, text::escape,
};

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

/// The most zombies one process finding lists (all are counted).
pub const MAX_ZOMBIES_LISTED: usize = 32;
/// The most D-state threads one process finding lists (all are counted).
pub const MAX_D_STATE_LISTED: usize = 32;

/// A process as the census read it, for its own findings: who, whether it
/// is PID 1 of its pid namespace, its threads (their state, wait channel
/// and age) and its unreaped children.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessState {
    pub owner: Owner,
    pub pid_ns_init: bool,
    pub threads: Vec<ThreadInfo>,
    /// Its children in state Z, by pid and comm.
    pub zombies: Vec<Zombie>,
}

/// A child that exited and that its parent has not reaped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Zombie {
    pub pid: u32,
    /// Its `comm`, which it controlled.
    pub comm: String,
}

/// A thread in uninterruptible sleep.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DStateThread {
    pub tid: u32,
    /// The thread's own name, which the process controls.
    pub name: String,
    /// The kernel function it sleeps in, where read.
    pub wchan: Option<String>,
    /// How long it has not run, where known.
    pub blocked_ms: Option<u64>,
}

/// What is wrong with one process itself (`scan --json`: one object each,
/// `"kind": "process"`, after the connections).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProcessFinding {
    /// Always `process`: tells these lines from the connections'.
    pub kind: &'static str,
    /// The process (`pid`, `comm`, and the identity fields where known).
    #[serde(flatten)]
    pub owner: Owner,
    /// Whether it is PID 1 of its own pid namespace (the init that must
    /// reap orphans).
    pub pid_ns_init: bool,
    /// Its unreaped children, the first [`MAX_ZOMBIES_LISTED`].
    pub zombies: Vec<Zombie>,
    /// All of them, counted.
    pub zombie_count: usize,
    /// Set when it is PID 1 of its pid namespace and leaves zombies:
    /// `inspect`'s missing-init diagnosis.
    pub missing_init: Option<String>,
    /// Its threads in D state for at least the threshold (or for an age
    /// not known), the first [`MAX_D_STATE_LISTED`].
    pub d_state: Vec<DStateThread>,
    /// All of them, counted.
    pub d_state_count: usize,
}

/// The findings of each process in `processes` that has unreaped children
/// or a thread in D state for at least `silent_for_ms` (or for an age not
/// known), by pid.
pub fn process_findings(processes: &[ProcessState], silent_for_ms: u64) -> Vec<ProcessFinding> {
    let mut out: Vec<ProcessFinding> = processes
        .iter()
        .filter_map(|p| {
            let d_state: Vec<DStateThread> = p
                .threads
                .iter()
                .filter(|t| t.state == 'D' && t.idle_ms.is_none_or(|ms| ms >= silent_for_ms))
                .map(|t| DStateThread {
                    tid: t.tid,
                    name: t.name.clone(),
                    wchan: t.wchan.clone(),
                    blocked_ms: t.idle_ms,
                })
                .collect();
            if d_state.is_empty() && p.zombies.is_empty() {
                return None;
            }
            let zombie_count = p.zombies.len();
            let missing_init = (p.pid_ns_init && zombie_count > 0)
                .then(|| missing_init(zombie_count, p.owner.pid));
            Some(ProcessFinding {
                kind: "process",
                owner: p.owner.clone(),
                pid_ns_init: p.pid_ns_init,
                zombies: p.zombies.iter().take(MAX_ZOMBIES_LISTED).cloned().collect(),
                zombie_count,
                missing_init,
                d_state_count: d_state.len(),
                d_state: d_state.into_iter().take(MAX_D_STATE_LISTED).collect(),
            })
        })
        .collect();
    out.sort_by_key(|f| f.owner.pid);
    out
}

/// One process finding in words, for the table's `processes:` section.
fn process_text(f: &ProcessFinding) -> String {
    let mut parts = Vec::new();
    if f.zombie_count > 0 {
        let pids: Vec<String> = f
            .zombies
            .iter()
            .map(|z| format!("{} {}", z.pid, escape(&z.comm)))
            .collect();
        let more = f.zombie_count - f.zombies.len();
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        parts.push(format!(
            "{} zombie child(ren) not reaped ({}{more})",
            f.zombie_count,
            pids.join(", ")
        ));
    }
    if let Some(d) = &f.missing_init {
        parts.push(escape(d));
    }
    for t in &f.d_state {
        let wchan = t
            .wchan
            .as_deref()
            .map_or(String::new(), |w| format!(" in {}", escape(w)));
        parts.push(format!(
            "thread {} ({}) in D state (uninterruptible) for {}{wchan}",
            t.tid,
            escape(&t.name),
            age(t.blocked_ms)
        ));
    }
    let more = f.d_state_count - f.d_state.len();
    if more > 0 {
        parts.push(format!("{more} more thread(s) in D state"));
    }
    format!(
        "  pid {} {}: {}; next: selfheal inspect --pid {}",
        f.owner.pid,
        escape(&f.owner.comm),
        parts.join("; "),
        f.owner.pid
    )
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
pub fn render(
    findings: &[Finding],
    processes: &[ProcessFinding],
    coverage: &Coverage,
    silent_for_ms: u64,
) -> String {
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
    if !processes.is_empty() {
        let _ = writeln!(o, "\nprocesses:");
    }
    for f in processes {
        let _ = writeln!(o, "{}", process_text(f));
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
    let zombies = processes.iter().filter(|f| f.zombie_count > 0).count();
    let d_state = processes.iter().filter(|f| f.d_state_count > 0).count();
    if zombies > 0 {
        let _ = write!(o, ", {zombies} with unreaped zombies");
    }
    if d_state > 0 {
        let _ = write!(o, ", {d_state} with threads in D state");
    }
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

    fn process(
        pid: u32,
        pid_ns_init: bool,
        threads: Vec<ThreadInfo>,
        zombies: usize,
    ) -> ProcessState {
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
}
