//! The keepalive rungs: arming TCP keepalive on a dead connection's socket
//! ([`Keepalive`]), the proof keepalive that asks a silent peer whether it
//! is there ([`ProofKeepalive`]), ending a connection whose probes went
//! unanswered ([`expire_keepalive`]), and putting a socket's own options
//! back ([`restore_keepalive`]).

use std::time::Duration;

use selfheal_core::keepalive::{
    KeepaliveSettings, MAX_TCP_KEEPCNT, MAX_TCP_KEEPIDLE, MAX_TCP_KEEPINTVL, ProofKeepalive,
};
use serde::{Deserialize, Serialize};

use super::{
    ActionError,
    dup::{DupSocket, SocketGate, SocketSeen, dup_tcp_socket, open_gate, pass},
    guard::check_target,
};
use crate::sys::{
    pidfd::Pidfd,
    system::{Handle as _, Kernel, System, TcpInfoSeen},
};

/// What [`arm_keepalive`] asks of a socket: the keepalive rung.
///
/// The rung only ever touches a connection the judge has already called
/// *dead* (`control_silent`: silent past 3 × the heartbeat the upstream
/// promises; `peer_unresponsive`; `peer_closed`) with nothing in flight (a
/// socket with unacknowledged data goes straight to `destroy_socket`). The
/// silence is the proof; the probes are the last chance for a live peer to
/// say so. The defaults (idle 1 s, interval 1 s, count 4, user timeout
/// 5 s) end such a connection about 5 s after arming, well inside a 30 s
/// timer's beat, so the heal is done within the run that armed it, not
/// left to the next run's `destroy_socket`:
///
/// - `idle` 1 s: the connection has been silent far longer, so probing
///   starts at once (the kernel counts idleness from the last segment
///   received, not from arming).
/// - `interval` 1 s, `count` 4: five probes, at 0, 1, 2, 3 and 4 s. A live
///   peer's kernel answers a probe with an ACK whatever its application
///   does, and *any* segment from it — the ACK of any probe, data — resets
///   the count and the clock. So a live link is cut only if not one ACK of
///   five probes comes back within 5 s of the first: a round trip above 5 s,
///   or five losses in a row. A satellite link's round trip is ~0.6 s, a
///   congested mobile link's a few seconds; and this link has already
///   delivered nothing for 3 × its heartbeat.
/// - `user_timeout` 5 s, derived from the proof rather than fixed: once
///   set, the kernel ignores `count` and drops the connection at the first
///   unanswered probe once nothing was heard for `user_timeout`.
///   [`arm_keepalive`] sets it to the silence already observed plus
///   `idle + count × interval` ([`effective_user_timeout_ms`]), so the
///   probes above all get their time, and the 5 s is only the floor when
///   the silence cannot be read. What stays on a peer that answered: for
///   data in flight later, the kernel gives up after that much
///   unacknowledged retransmission — never less than the silence the judge
///   already calls dead for this connection, plus 5 s. Zero leaves
///   `TCP_USER_TIMEOUT` off (the kernel's retransmission limits apply).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Keepalive {
    /// `TCP_KEEPIDLE`: silence before the first probe (whole seconds,
    /// rounded up; 1 s to 32767 s).
    pub idle: Duration,
    /// `TCP_KEEPINTVL`: between probes (whole seconds, rounded up; 1 s to
    /// 32767 s).
    pub interval: Duration,
    /// `TCP_KEEPCNT`: unanswered probes before the connection is dropped
    /// (1 to 127).
    pub count: u32,
    /// `TCP_USER_TIMEOUT` (milliseconds; see above for how it is raised).
    pub user_timeout: Duration,
}

impl Default for Keepalive {
    fn default() -> Keepalive {
        Keepalive {
            idle: Duration::from_secs(1),
            interval: Duration::from_secs(1),
            count: 4,
            user_timeout: Duration::from_secs(5),
        }
    }
}

impl Keepalive {
    /// The settings in the kernel's units, or why they cannot be set.
    pub fn to_settings(&self) -> Result<KeepaliveSettings, ActionError> {
        let secs = |what: &str, d: Duration, max: u32| {
            let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
            if s == 0 || s > u64::from(max) {
                Err(ActionError::InvalidKeepalive(format!(
                    "{what} must be 1 s to {max} s, not {d:?}"
                )))
            } else {
                Ok(s as u32)
            }
        };
        let idle_s = secs("idle", self.idle, MAX_TCP_KEEPIDLE)?;
        let interval_s = secs("interval", self.interval, MAX_TCP_KEEPINTVL)?;
        if self.count == 0 || self.count > MAX_TCP_KEEPCNT {
            return Err(ActionError::InvalidKeepalive(format!(
                "count must be 1 to {MAX_TCP_KEEPCNT}, not {}",
                self.count
            )));
        }
        let user_timeout_ms = u32::try_from(self.user_timeout.as_millis())
            .ok()
            .filter(|ms| *ms <= i32::MAX as u32)
            .ok_or_else(|| {
                ActionError::InvalidKeepalive(format!(
                    "user timeout {:?} is too long",
                    self.user_timeout
                ))
            })?;
        Ok(KeepaliveSettings {
            enabled: true,
            idle_s,
            interval_s,
            count: self.count,
            user_timeout_ms,
        })
    }
}

/// The user timeout [`arm_keepalive`] sets, derived from the proof: the
/// silence already observed plus `idle + count × interval`, so that a
/// connection silent for `silent_ms` still gets its probes and their time
/// (and is ended right after), and never below the asked one (the floor
/// when the silence is unknown). Zero stays zero (off).
pub fn effective_user_timeout_ms(wanted: &KeepaliveSettings, silent_ms: Option<u32>) -> u32 {
    if wanted.user_timeout_ms == 0 {
        return 0;
    }
    let needed = u64::from(silent_ms.unwrap_or(0))
        + 1000 * u64::from(wanted.idle_s)
        + 1000 * u64::from(wanted.count) * u64::from(wanted.interval_s);
    u64::from(wanted.user_timeout_ms)
        .max(needed)
        .min(i32::MAX as u64) as u32
}

/// What [`arm_keepalive`] did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeepaliveOutcome {
    pub pid: u32,
    pub fd: i32,
    /// The socket's inode (`socket:[inode]`).
    pub inode: u64,
    /// The options before: hand them to [`restore_keepalive`] once the peer
    /// proves alive.
    pub previous: KeepaliveSettings,
    /// The options set (the user timeout as raised, see [`Keepalive`]).
    pub applied: KeepaliveSettings,
    /// How long the socket had heard nothing from its peer when armed
    /// (`tcp_info`), if the kernel said.
    pub silent_ms: Option<u32>,
}

fn read_settings<S: System>(
    sys: &S,
    dup: &S::Sock,
    what: &str,
) -> Result<KeepaliveSettings, ActionError> {
    let get = |level: libc::c_int, name: libc::c_int, label: &str| {
        sys.get_int(dup, level, name)
            .map_err(|e| ActionError::io(format!("getsockopt {label} on {what}"), e))
    };
    let enabled = get(libc::SOL_SOCKET, libc::SO_KEEPALIVE, "SO_KEEPALIVE")? != 0;
    let tcp = |name: libc::c_int, label: &str| {
        get(libc::IPPROTO_TCP, name, label).map(|v| v.max(0) as u32)
    };
    Ok(KeepaliveSettings {
        enabled,
        idle_s: tcp(libc::TCP_KEEPIDLE, "TCP_KEEPIDLE")?,
        interval_s: tcp(libc::TCP_KEEPINTVL, "TCP_KEEPINTVL")?,
        count: tcp(libc::TCP_KEEPCNT, "TCP_KEEPCNT")?,
        user_timeout_ms: tcp(libc::TCP_USER_TIMEOUT, "TCP_USER_TIMEOUT")?,
    })
}

/// Sets `s` on the socket. Order matters: the timing options first, then
/// `SO_KEEPALIVE`, and `TCP_KEEPIDLE` last — setting it on a socket with
/// keepalive on re-arms the timer from the connection's real idle time, with
/// every other option already in place.
fn write_settings<S: System>(
    sys: &S,
    dup: &S::Sock,
    s: &KeepaliveSettings,
    what: &str,
) -> Result<(), ActionError> {
    let set = |name: libc::c_int, label: &str, v: u32| {
        sys.set_int(
            dup,
            libc::IPPROTO_TCP,
            name,
            i32::try_from(v).unwrap_or(i32::MAX),
        )
        .map_err(|e| ActionError::io(format!("setsockopt {label}={v} on {what}"), e))
    };
    set(
        libc::TCP_USER_TIMEOUT,
        "TCP_USER_TIMEOUT",
        s.user_timeout_ms,
    )?;
    set(libc::TCP_KEEPINTVL, "TCP_KEEPINTVL", s.interval_s)?;
    set(libc::TCP_KEEPCNT, "TCP_KEEPCNT", s.count)?;
    sys.set_int(
        dup,
        libc::SOL_SOCKET,
        libc::SO_KEEPALIVE,
        libc::c_int::from(s.enabled),
    )
    .map_err(|e| {
        ActionError::io(
            format!("setsockopt SO_KEEPALIVE={} on {what}", s.enabled),
            e,
        )
    })?;
    set(libc::TCP_KEEPIDLE, "TCP_KEEPIDLE", s.idle_s)?;
    Ok(())
}

/// How long the socket has heard nothing from its peer, as the keepalive
/// timer counts it (the later of the last data and the last ACK received).
fn silent_ms<S: System>(sys: &S, dup: &S::Sock) -> Option<u32> {
    sys.tcp_info(dup).as_ref().map(silence)
}

/// [`silent_ms`] of a `tcp_info` already read.
fn silence(i: &TcpInfoSeen) -> u32 {
    i.last_data_recv_ms.min(i.last_ack_recv_ms)
}

/// Arms TCP keepalive on socket `fd` of the target: duplicates it with
/// `pidfd_getfd`, reads its current options (returned as `previous`), sets
/// `ka` (see [`Keepalive`] for the user timeout), closes the duplicate. A
/// live peer answers the probes and nothing changes for the agent; a dead
/// one does not, and the kernel fails the agent's blocked read
/// (`ETIMEDOUT`) so its own reconnect logic runs. If setting fails midway,
/// the previous options are put back (best effort) and the error returned.
pub fn arm_keepalive(
    target: &Pidfd,
    fd: i32,
    inode: Option<u64>,
    ka: &Keepalive,
) -> Result<KeepaliveOutcome, ActionError> {
    arm_keepalive_gated(&Kernel, target, fd, inode, ka, &open_gate)
}

/// [`arm_keepalive`] on `sys`, with `gate` checked on the duplicate first.
pub fn arm_keepalive_gated<S: System>(
    sys: &S,
    target: &S::Process,
    fd: i32,
    inode: Option<u64>,
    ka: &Keepalive,
    gate: SocketGate<'_, S>,
) -> Result<KeepaliveOutcome, ActionError> {
    check_target(sys, target)?;
    let mut wanted = ka.to_settings()?;
    let pid = target.pid();
    let dup = dup_tcp_socket(sys, target, fd, inode)?;
    pass(sys, gate, &dup)?;
    let what = format!("fd {fd} of pid {pid}");
    let previous = read_settings(sys, &dup.fd, &what)?;
    let silent = silent_ms(sys, &dup.fd);
    wanted.user_timeout_ms = effective_user_timeout_ms(&wanted, silent);
    apply(sys, pid, fd, &dup, previous, wanted, silent, &what)
}

/// Sets `applied` on the duplicate, putting `previous` back (best effort)
/// if that fails midway: what [`arm_keepalive`] and
/// [`arm_proof_keepalive`] share once they know what to set.
#[expect(
    clippy::too_many_arguments,
    reason = "the system, the socket's names and the three settings of one arming"
)]
fn apply<S: System>(
    sys: &S,
    pid: u32,
    fd: i32,
    dup: &DupSocket<S>,
    previous: KeepaliveSettings,
    applied: KeepaliveSettings,
    silent_ms: Option<u32>,
    what: &str,
) -> Result<KeepaliveOutcome, ActionError> {
    if let Err(e) = write_settings(sys, &dup.fd, &applied, what) {
        let _ = write_settings(sys, &dup.fd, &previous, what);
        return Err(e);
    }
    Ok(KeepaliveOutcome {
        pid,
        fd,
        inode: dup.inode,
        previous,
        applied,
        silent_ms,
    })
}

/// Puts back keepalive options on socket `fd` of the target (the `previous`
/// of an [`arm_keepalive`] outcome) and returns them as read back. Options
/// that were the system defaults become explicit values equal to them.
pub fn restore_keepalive(
    target: &Pidfd,
    fd: i32,
    inode: Option<u64>,
    previous: &KeepaliveSettings,
) -> Result<KeepaliveSettings, ActionError> {
    restore_keepalive_chosen(&Kernel, target, fd, inode, &|_| Ok(previous.clone()))
}

/// [`restore_keepalive`] on `sys` of the options `choose` picks for the
/// socket seen on the duplicate (the helper: those it recorded under the
/// socket's cookie when it armed the proof); its `Err` refuses with nothing
/// changed.
pub fn restore_keepalive_chosen<S: System>(
    sys: &S,
    target: &S::Process,
    fd: i32,
    inode: Option<u64>,
    choose: &dyn Fn(&SocketSeen<'_, S>) -> Result<KeepaliveSettings, ActionError>,
) -> Result<KeepaliveSettings, ActionError> {
    check_target(sys, target)?;
    let dup = dup_tcp_socket(sys, target, fd, inode)?;
    let previous = choose(&dup.seen(sys))?;
    let what = format!("fd {fd} of pid {}", target.pid());
    write_settings(sys, &dup.fd, &previous, &what)?;
    read_settings(sys, &dup.fd, &what)
}

/// The keepalive options of socket `fd` of the target, read through a
/// duplicate.
pub fn read_keepalive(target: &Pidfd, fd: i32) -> Result<KeepaliveSettings, ActionError> {
    read_keepalive_on(&Kernel, target, fd)
}

/// [`read_keepalive`] on `sys`.
pub fn read_keepalive_on<S: System>(
    sys: &S,
    target: &S::Process,
    fd: i32,
) -> Result<KeepaliveSettings, ActionError> {
    check_target(sys, target)?;
    let dup = dup_tcp_socket(sys, target, fd, None)?;
    read_settings(sys, &dup.fd, &format!("fd {fd} of pid {}", target.pid()))
}

/// `TCP_ESTABLISHED` and `TCP_CLOSE` (include/net/tcp_states.h), as
/// `tcpi_state` holds them.
const TCP_ESTABLISHED: u8 = 1;
const TCP_CLOSE: u8 = 7;

/// How long a proof keepalive holds a dead connection open for the next
/// check to see it ([`ProofKeepalive::hold_ms`]): two minutes covers a
/// timer running `check` every 30 s (and 60 s) with room to spare.
pub const PROOF_HOLD: Duration = Duration::from_secs(120);

/// Arms a proof keepalive ([`ProofKeepalive`]) on socket `fd` of the
/// target, which must still be the judged socket `inode`. Its own options
/// are read first and returned as `previous` (a socket whose options cannot
/// be read is not touched). A socket with unacknowledged data is refused:
/// the kernel sends no keepalive probe while data is in flight, and its
/// retransmissions already prove the peer alive or dead.
pub fn arm_proof_keepalive(
    target: &Pidfd,
    fd: i32,
    inode: u64,
    proof: &ProofKeepalive,
) -> Result<KeepaliveOutcome, ActionError> {
    arm_proof_keepalive_gated(&Kernel, target, fd, inode, proof, &open_gate)
}

/// [`arm_proof_keepalive`] on `sys`, with `gate` checked on the duplicate
/// first.
pub fn arm_proof_keepalive_gated<S: System>(
    sys: &S,
    target: &S::Process,
    fd: i32,
    inode: u64,
    proof: &ProofKeepalive,
    gate: SocketGate<'_, S>,
) -> Result<KeepaliveOutcome, ActionError> {
    check_target(sys, target)?;
    let pid = target.pid();
    let dup = dup_tcp_socket(sys, target, fd, Some(inode))?;
    pass(sys, gate, &dup)?;
    let what = format!("fd {fd} of pid {pid}");
    let previous = read_settings(sys, &dup.fd, &what)?;
    let info = sys.tcp_info(&dup.fd);
    if let Some(i) = &info {
        if i.unacked > 0 {
            return Err(ActionError::NotApplicable {
                pid,
                fd,
                why: format!(
                    "{} segment(s) unacknowledged: the kernel probes no connection with data in flight (its retransmissions are the proof)",
                    i.unacked
                ),
            });
        }
        if i.state != TCP_ESTABLISHED {
            return Err(ActionError::NotApplicable {
                pid,
                fd,
                why: format!("not established (TCP state {})", i.state),
            });
        }
    }
    let silent = info.as_ref().map(silence);
    let applied = proof
        .settings(silent)
        .map_err(ActionError::InvalidKeepalive)?;
    apply(sys, pid, fd, &dup, previous, applied, silent, &what)
}

/// What [`expire_keepalive`] did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpireOutcome {
    pub pid: u32,
    pub fd: i32,
    pub inode: u64,
    /// Unanswered probes when it was ended.
    pub probes: u8,
    /// Whether the connection was seen closed within 200 ms (the kernel ends
    /// it from its timer, a moment after the call).
    pub ended: bool,
}

/// Ends a connection whose keepalive probes went unanswered, the way the
/// kernel ends one by itself: a keepalive timeout, so the agent's blocked
/// read fails with `ETIMEDOUT` and its own error path runs. It sets
/// `TCP_USER_TIMEOUT` to 1 ms and re-arms the keepalive timer
/// (`TCP_KEEPIDLE`): the timer fires at once, finds a probe unanswered past
/// the user timeout, and gives up. Refused (nothing changed) when keepalive
/// is off, or when no probe is outstanding: a peer that answered since the
/// judgement is alive.
pub fn expire_keepalive(target: &Pidfd, fd: i32, inode: u64) -> Result<ExpireOutcome, ActionError> {
    expire_keepalive_gated(&Kernel, target, fd, inode, &open_gate)
}

/// [`expire_keepalive`] on `sys`, with `gate` checked on the duplicate
/// first.
pub fn expire_keepalive_gated<S: System>(
    sys: &S,
    target: &S::Process,
    fd: i32,
    inode: u64,
    gate: SocketGate<'_, S>,
) -> Result<ExpireOutcome, ActionError> {
    check_target(sys, target)?;
    let pid = target.pid();
    let dup = dup_tcp_socket(sys, target, fd, Some(inode))?;
    pass(sys, gate, &dup)?;
    let what = format!("fd {fd} of pid {pid}");
    let now = read_settings(sys, &dup.fd, &what)?;
    let probes = sys.tcp_info(&dup.fd).map_or(0, |i| i.probes);
    if !now.enabled || probes == 0 {
        return Err(ActionError::NotApplicable {
            pid,
            fd,
            why: if now.enabled {
                "no keepalive probe is outstanding: the peer answered since it was judged".into()
            } else {
                "keepalive is off on it".into()
            },
        });
    }
    let set = |name: libc::c_int, value: libc::c_int| {
        sys.set_int(&dup.fd, libc::IPPROTO_TCP, name, value)
    };
    // The user timeout as it was: put back if the connection is not seen
    // ended (the peer's ACK came in between), so that a live connection
    // never keeps a 1 ms user timeout.
    let put_back = || {
        let _ = set(
            libc::TCP_USER_TIMEOUT,
            i32::try_from(now.user_timeout_ms).unwrap_or(i32::MAX),
        );
    };
    set(libc::TCP_USER_TIMEOUT, 1)
        .map_err(|e| ActionError::io(format!("setsockopt TCP_USER_TIMEOUT=1 on {what}"), e))?;
    if let Err(e) = set(
        libc::TCP_KEEPIDLE,
        i32::try_from(now.idle_s.max(1)).unwrap_or(1),
    ) {
        put_back();
        return Err(ActionError::io(
            format!("setsockopt TCP_KEEPIDLE on {what}"),
            e,
        ));
    }
    let deadline = sys.now() + EXPIRE_WATCH;
    // Bounded by the deadline, and by a count should a clock stand still.
    let mut ended = false;
    for _ in 0..EXPIRE_WATCH.as_millis() / EXPIRE_POLL.as_millis() + 1 {
        ended = sys.tcp_info(&dup.fd).is_none_or(|i| i.state == TCP_CLOSE);
        if ended || sys.now() >= deadline {
            break;
        }
        sys.sleep(EXPIRE_POLL);
    }
    if !ended {
        put_back();
    }
    Ok(ExpireOutcome {
        pid,
        fd,
        inode: dup.inode,
        probes,
        ended,
    })
}

/// How long [`expire_keepalive`] watches for the connection to end, and
/// how often it looks.
const EXPIRE_WATCH: Duration = Duration::from_millis(200);
const EXPIRE_POLL: Duration = Duration::from_millis(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_keepalive_is_valid_and_gentle() {
        let s = Keepalive::default().to_settings().unwrap();
        assert_eq!(
            s,
            KeepaliveSettings {
                enabled: true,
                idle_s: 1,
                interval_s: 1,
                count: 4,
                user_timeout_ms: 5_000,
            }
        );
    }

    #[test]
    fn keepalive_limits_are_checked() {
        let ka = |idle, interval, count, ut| Keepalive {
            idle: Duration::from_millis(idle),
            interval: Duration::from_millis(interval),
            count,
            user_timeout: Duration::from_millis(ut),
        };
        assert!(ka(0, 1000, 3, 0).to_settings().is_err());
        assert!(ka(1000, 0, 3, 0).to_settings().is_err());
        assert!(ka(1000, 1000, 0, 0).to_settings().is_err());
        assert!(ka(1000, 1000, 128, 0).to_settings().is_err());
        assert!(ka(32_768_000, 1000, 3, 0).to_settings().is_err());
        assert!(ka(1000, 1000, 3, 1 << 40).to_settings().is_err());
        // Sub-second values round up to the kernel's whole seconds.
        let s = ka(1500, 200, 3, 0).to_settings().unwrap();
        assert_eq!((s.idle_s, s.interval_s, s.user_timeout_ms), (2, 1, 0));
        let e = ka(0, 1000, 3, 0).to_settings().unwrap_err().to_string();
        assert!(e.starts_with("invalid keepalive settings: idle"), "{e}");
    }

    #[test]
    fn user_timeout_covers_the_silence_and_count_probes() {
        let s = Keepalive::default().to_settings().unwrap();
        // A control stream silent for 15 s (3 × a 5 s heartbeat) is ended
        // 5 s after arming, not 45 s.
        assert_eq!(effective_user_timeout_ms(&s, Some(15_000)), 20_000);
        // Silent for 3 s (3 × a 1 s heartbeat): the same 5 s after arming.
        assert_eq!(effective_user_timeout_ms(&s, Some(3_000)), 8_000);
        // Silent for 10 minutes: silence + 1 s + 4 × 1 s.
        assert_eq!(
            effective_user_timeout_ms(&s, Some(600_000)),
            600_000 + 1_000 + 4_000
        );
        // Unknown silence: the floor, idle + count × interval.
        assert_eq!(effective_user_timeout_ms(&s, None), 5_000);
        // A larger asked timeout is a floor the derived one never goes under.
        let long = KeepaliveSettings {
            user_timeout_ms: 60_000,
            ..s.clone()
        };
        assert_eq!(effective_user_timeout_ms(&long, Some(15_000)), 60_000);
        let off = KeepaliveSettings {
            user_timeout_ms: 0,
            ..s.clone()
        };
        assert_eq!(effective_user_timeout_ms(&off, Some(600_000)), 0);
        assert_eq!(
            effective_user_timeout_ms(&s, Some(u32::MAX)),
            i32::MAX as u32
        );
    }

    /// Whether a peer that answers its first probe only after `rtt_ms` keeps
    /// its connection under the rung's timing: the kernel's keepalive timer
    /// as in `tcp_keepalive_timer` (probe at arming, then every interval;
    /// dropped at the first tick with a probe out and `elapsed >= user
    /// timeout`), any ACK resetting the clock.
    fn survives(s: &KeepaliveSettings, silent_ms: u32, rtt_ms: u64) -> bool {
        let ut = u64::from(effective_user_timeout_ms(s, Some(silent_ms)));
        let mut t = 0u64; // since arming
        let mut probes_out = 0;
        loop {
            if t >= rtt_ms && probes_out > 0 {
                return true; // the first probe's ACK came back before a drop
            }
            if probes_out > 0 && u64::from(silent_ms) + t >= ut {
                return false;
            }
            probes_out += 1;
            t += 1000 * u64::from(s.interval_s);
        }
    }

    #[test]
    fn the_rung_ends_a_dead_stream_in_5_s_and_keeps_a_slow_live_one() {
        let s = Keepalive::default().to_settings().unwrap();
        // Dead (no answer ever): ended 5 s after arming whatever the silence.
        for silent in [3_000, 15_000, 600_000] {
            let ut = u64::from(effective_user_timeout_ms(&s, Some(silent)));
            assert_eq!(ut - u64::from(silent), 5_000);
        }
        // Slow but live: a satellite round trip, a congested mobile link,
        // up to just under 5 s: kept.
        for rtt in [600, 2_500, 4_900] {
            assert!(survives(&s, 15_000, rtt), "rtt {rtt} ms cut");
        }
        assert!(!survives(&s, 15_000, 60_000));
    }
}
