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

use crate::{model::TcpState, sockdiag::TcpSocket};

mod process;
mod render;
#[cfg(test)]
mod tests;

pub use process::{
    DStateThread, MAX_D_STATE_LISTED, MAX_ZOMBIES_LISTED, ProcessFinding, ProcessState, Zombie,
    process_findings,
};
pub use render::{Coverage, render};

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
