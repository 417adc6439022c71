//! A call whose connection carries only keepalive: the peer is alive, the
//! call makes no progress ([`crate::progress`]).

use super::*;
use crate::{
    config::Upstream,
    progress::{Closeness, Progress, Rule, Stall},
};

/// One connection's progress evidence and how close it is to its bound,
/// as `inspect` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConnectionProgress {
    pub pid: u32,
    pub inode: u64,
    /// The peer's address, as the kernel reports it.
    pub remote: String,
    pub role: SocketRole,
    #[serde(flatten)]
    pub closeness: Closeness,
}

/// The progress evidence of every connection of `report` that `history`
/// (the one [`judge`] returned for `now_ms`) has counted keepalive on,
/// against its upstream's `stall_after`: none for a connection that
/// talks, is silent, or has no bound.
pub fn progress_of(
    cfg: &AgentConfig,
    report: &Report,
    history: &AgentHistory,
    now_ms: u64,
) -> Vec<ConnectionProgress> {
    report
        .sockets
        .iter()
        .filter_map(|s| {
            let bound = s
                .upstream
                .and_then(|i| cfg.upstreams.get(i))
                .and_then(|u| u.stall_after)?;
            let closeness = history
                .progress
                .get(&s.cookie)?
                .closeness(now_ms, crate::clock::ms(bound))?;
            Some(ConnectionProgress {
                pid: s.pid,
                inode: s.inode,
                remote: s.remote.clone(),
                role: s.role,
                closeness,
            })
        })
        .collect()
}

impl<'a> Judging<'a> {
    /// Carries socket `s`'s progress record into the next history, and
    /// its stall past its upstream's `stall_after`, if any, with how long
    /// only keepalive has arrived (the control heartbeat rule's measure of
    /// application silence). An upstream with neither a `stall_after` nor
    /// a control `heartbeat` keeps no record: nothing would read it. Nor
    /// does a connection quiet past `suspect_after_ms` with no keepalive
    /// counted (an idle pooled connection, a call thinking in silence: the
    /// proof's to judge, and most of an agent's connections): when it
    /// talks again, its record starts afresh. A control stream's arrivals
    /// are told keepalive by [`Rule::Mirrored`].
    pub(super) fn progress(
        &mut self,
        s: &SocketReport,
        upstream: Option<&Upstream>,
        suspect_after_ms: u64,
    ) -> (Option<Stall>, Option<u64>) {
        let Some(u) = upstream else {
            return (None, None);
        };
        let heartbeat = u.role == Role::Control && u.heartbeat.is_some();
        if u.stall_after.is_none() && !heartbeat {
            return (None, None);
        }
        let Some(i) = s.tcp_info.as_ref() else {
            return (None, None);
        };
        if s.state != TcpState::Established {
            return (None, None);
        }
        let rule = if s.role == SocketRole::Control {
            Rule::Mirrored
        } else {
            Rule::Stream
        };
        let p = match self.history.progress.get(&s.cookie) {
            Some(p) => p.advance_as(i, self.now, rule).0,
            None => Progress::start(i, self.now),
        };
        if p.keepalives == 0 && u64::from(i.last_data_recv_ms) > suspect_after_ms {
            return (None, None);
        }
        let stall = u
            .stall_after
            .and_then(|b| p.stalled(self.now_ms, crate::clock::ms(b)));
        let only = p.keepalive_only_ms(self.now_ms);
        self.next.progress.insert(s.cookie, p);
        (stall, only)
    }

    /// A call stalled behind keepalive: `wedged`, and the connection is
    /// the ladder's to end (no proof keepalive: the peer answers it).
    pub(super) fn stalled_socket(
        &mut self,
        v: &SocketView<'_>,
        stall: Stall,
        upstream: Option<&Upstream>,
    ) {
        let s = v.s;
        let bound = upstream
            .and_then(|u| u.stall_after)
            .map_or(0, crate::clock::ms);
        let sizes = if stall.smallest == stall.largest {
            format!("{} bytes", stall.smallest)
        } else {
            format!("{}-{} bytes", stall.smallest, stall.largest)
        };
        let spacing = stall.spacing_ms.map_or(String::new(), |ms| {
            format!(", about {} apart", human_ms(ms))
        });
        let suspended = if stall.suspended_ms > 0 {
            format!(
                ", not counting {} the machine was suspended",
                human_ms(stall.suspended_ms)
            )
        } else {
            String::new()
        };
        let last = s.tcp_info.as_ref().map_or(String::new(), |i| {
            format!(
                ", the last {} ago",
                human_ms(u64::from(i.last_data_recv_ms))
            )
        });
        let r = reason(
            ReasonCode::StreamStalled,
            Verdict::Wedged,
            format!(
                "{} call to {}: only keepalive for at least {}{suspended} ({} arrival(s) of {sizes}{spacing}{last}), past its stall_after of {}; the peer is alive, the call makes no progress",
                s.role,
                s.remote,
                human_ms(stall.for_ms),
                stall.keepalives,
                human_ms(bound),
            ),
        );
        let r = with(
            with(
                with(
                    with(
                        with(socket_reason(r, s), "stalled_ms", stall.for_ms),
                        "keepalives",
                        stall.keepalives,
                    ),
                    "keepalive_bytes_min",
                    stall.smallest,
                ),
                "keepalive_bytes_max",
                stall.largest,
            ),
            "stall_after_ms",
            bound,
        );
        let r = match stall.spacing_ms {
            Some(ms) => with(r, "keepalive_spacing_ms", ms),
            None => r,
        };
        self.reasons.push(if stall.suspended_ms > 0 {
            with(r, "suspended_ms", stall.suspended_ms)
        } else {
            r
        });
        if !self.dead.iter().any(|d| d.inode == s.inode)
            && let Some(d) = self.finding(s, false, DeadKind::Awaited)
        {
            self.dead.push(DeadSocket {
                peer_alive: true,
                ..d
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        clock::Now,
        config::{Config, HealConfig},
        fixture,
        ladder::{Decision, HealHistory, decide},
        protocol::Act,
        sockdiag::TcpInfo,
    };

    /// `sol` with one provider upstream at :443 and `extra` keys on it.
    fn agent(extra: &str) -> AgentConfig {
        let text = format!(
            "[[agent]]\nname = \"sol\"\nmatch = {{ cmdline = \"sol\" }}\n\
             [[agent.upstream]]\nrole = \"provider\"\naddr = \":443\"\n{extra}"
        );
        Config::parse(&text, std::path::Path::new("/test.toml"))
            .expect("fixture config")
            .agents
            .remove(0)
    }

    /// Pid 100's provider socket 2 (fd 9) with `info`, in the epoll set of
    /// its waiting event loop (as the async SDKs wait).
    fn report(info: TcpInfo) -> Report {
        let mut loop_thread = fixture::process('S', vec![], vec![]).threads;
        loop_thread.push(crate::inspect::ThreadReport {
            tid: 100,
            name: "python3".into(),
            state: 'S',
            wchan: Some("ep_poll".into()),
            cpu_ticks: 1,
            syscall: Some("epoll_wait".into()),
            idle_ms: Some(1_000),
            kstack: vec![],
            recv_blocked_ms: None,
            recv_inode: None,
            recv_syscall: None,
            recv_source: None,
            wait_syscall: Some("epoll_wait".into()),
            wait_inodes: vec![2],
            wait_event_loop: true,
            anomalies: vec![],
        });
        let socket = SocketReport {
            fd: Some(9),
            inode: 2,
            cookie: 77,
            remote: "10.9.9.9:443".into(),
            role: SocketRole::Provider,
            tcp_info: Some(info),
            ..fixture::control_socket()
        };
        fixture::report_of(fixture::process('S', loop_thread, vec![2]), vec![socket])
    }

    /// The counters of a call whose request (600 bytes) went out and whose
    /// head and first event (500 bytes) came back at time 0, `bytes` and
    /// `segs` more arrived since, the last `ago` ms before the check at
    /// `now`.
    fn counters(bytes: u64, segs: u32, ago: u64, now: u64) -> TcpInfo {
        TcpInfo {
            rtt_us: 100,
            rto_us: 204_000,
            unacked: 0,
            retransmits: 0,
            backoff: 0,
            probes: 0,
            last_data_recv_ms: ago as u32,
            last_data_sent_ms: now as u32,
            last_ack_recv_ms: ago as u32,
            bytes_received: 500 + bytes,
            bytes_acked: 601,
            data_segs_in: 2 + segs,
            data_segs_out: 1,
        }
    }

    /// Checks every 2 s for `secs` s of a call on which `arrival(n)`
    /// bytes arrive every `every` ms; the judgement of each, in order.
    fn checks(
        cfg: &AgentConfig,
        secs: u64,
        every: u64,
        arrival: impl Fn(u32) -> u64,
    ) -> Vec<Judgement> {
        let mut history = AgentHistory::default();
        let (mut bytes, mut segs, mut last) = (0, 0, 0);
        (1..=secs / 2)
            .map(|c| {
                let now = c * 2_000;
                while last + every <= now {
                    last += every;
                    segs += 1;
                    bytes += arrival(segs);
                }
                let (j, next) = judge(
                    cfg,
                    &report(counters(bytes, segs, now - last, now)),
                    &[],
                    &history,
                    now,
                );
                history = next;
                j
            })
            .collect()
    }

    fn first_stalled(js: &[Judgement]) -> Option<usize> {
        js.iter().position(|j| {
            j.reasons
                .iter()
                .any(|r| r.code == ReasonCode::StreamStalled)
        })
    }

    #[test]
    fn a_stream_of_pings_alone_is_wedged_past_stall_after_and_ended_first() {
        let cfg = agent("stall_after = \"20s\"");
        let js = checks(&cfg, 40, 5_000, |_| 42);
        let at = first_stalled(&js).expect("a stall");
        // Check k is at 2(k+1) s; the call was first seen at 2 s, its
        // first ping came at 5 s: wedged at the first check 20 s after
        // that (26 s).
        assert_eq!(at, 12, "{:#?}", js[at].reasons);
        assert!(js[..at].iter().all(|j| j.verdict == Verdict::Busy));
        let j = &js[at];
        assert_eq!(j.verdict, Verdict::Wedged);
        let r = &j.reasons[0];
        assert_eq!(r.code, ReasonCode::StreamStalled);
        for words in [
            "only keepalive for at least 21.0s",
            "5 arrival(s) of 42 bytes",
            "5.0s apart",
            "the peer is alive",
        ] {
            assert!(r.message.contains(words), "{words:?} in {}", r.message);
        }
        assert_eq!(r.evidence["keepalives"], 5);
        assert_eq!(r.evidence["keepalive_spacing_ms"], 5_000);
        assert!(j.work.is_empty(), "no proof for a live peer: {:?}", j.work);
        assert_eq!(j.dead.len(), 1);
        assert!(j.dead[0].peer_alive && j.dead[0].kind == DeadKind::Awaited);
        // The ladder destroys it at once: keepalive cannot end a live link.
        let heal = HealConfig {
            sockets: true,
            ..HealConfig::default()
        };
        let d = decide(
            &heal,
            j,
            &report(counters(0, 0, 0, 40_000)),
            &mut HealHistory::default(),
            40_000,
        );
        let Decision::Act { steps } = d else {
            panic!("{d:?}")
        };
        assert_eq!(
            steps.iter().map(Act::name).collect::<Vec<_>>(),
            ["destroy_socket"]
        );
    }

    /// What `inspect` shows of a pinging call: its pings counted down to
    /// the bound, the same numbers the stall's reason gives once past it;
    /// nothing for a silent call, content, or a bound that is off.
    #[test]
    fn progress_of_a_pinging_call_counts_down_to_its_bound() {
        let cfg = agent("stall_after = \"20s\"");
        let mut history = AgentHistory::default();
        let (mut bytes, mut segs, mut last) = (0, 0, 0);
        let mut shown = Vec::new();
        for c in 1..=13u64 {
            let now = c * 2_000;
            while last + 5_000 <= now {
                last += 5_000;
                segs += 1;
                bytes += 42;
            }
            let r = report(counters(bytes, segs, now - last, now));
            let (j, next) = judge(&cfg, &r, &[], &history, now);
            let p = progress_of(&cfg, &r, &next, now);
            shown.push((p.clone(), j));
            history = next;
        }
        // Nothing before the second ping is counted (the first check saw
        // the connection first; one ping may be the content's straggler).
        assert!(shown[0].0.is_empty(), "{:?}", shown[0].0);
        let (p, _) = &shown[5];
        assert_eq!(p.len(), 1, "{p:?}");
        let c = &p[0];
        assert_eq!((c.inode, c.remote.as_str()), (2, "10.9.9.9:443"));
        // Counted from the first ping (5 s).
        assert_eq!(c.closeness.only_keepalive_ms, 7_000);
        assert_eq!(c.closeness.keepalives, 2);
        assert_eq!(c.closeness.keepalive_bytes_max, 42);
        assert_eq!(c.closeness.stall_after_ms, 20_000);
        assert_eq!(c.closeness.left_ms, 13_000);
        assert!(!c.closeness.stalled);
        // Past the bound: what the reason says, nothing left.
        let (p, j) = &shown[12];
        let r = j
            .reasons
            .iter()
            .find(|r| r.code == ReasonCode::StreamStalled)
            .expect("stalled");
        let c = &p[0].closeness;
        assert!(c.stalled && c.left_ms == 0, "{c:?}");
        assert_eq!(r.evidence["keepalives"], c.keepalives);
        assert_eq!(r.evidence["stalled_ms"], c.only_keepalive_ms);
        assert_eq!(r.evidence["keepalive_spacing_ms"], 5_000);
        assert_eq!(c.keepalive_spacing_ms, Some(5_000));
        // In JSON, flat beside the connection's address.
        let v = serde_json::to_value(&p[0]).expect("json");
        assert_eq!(v["left_ms"], 0);
        assert_eq!(v["remote"], "10.9.9.9:443");
        // Silent after its first event: nothing to show.
        let r = report(counters(0, 0, 30_000, 30_000));
        let (_, quiet) = judge(&cfg, &r, &[], &AgentHistory::default(), 2_000);
        let (_, quiet) = judge(&cfg, &r, &[], &quiet, 30_000);
        assert_eq!(progress_of(&cfg, &r, &quiet, 30_000), []);
        // A bound that is off: nothing either, whatever the history holds.
        let off = agent("stall_after = \"off\"");
        assert_eq!(
            progress_of(
                &off,
                &report(counters(bytes, segs, 0, 24_000)),
                &history,
                24_000
            ),
            []
        );
    }

    /// A gRPC control stream (heartbeat 1 s) checked every second, with
    /// the counters measured of grpcio with channel keepalive: `beat(c)`
    /// says whether the server's application sent a heartbeat before check
    /// `c` (47 bytes in and 69 out in 2 segments each way), else only a
    /// PING and its ACK went by (17 bytes, 1 segment, each way). The
    /// control reasons of each check.
    fn control_checks(secs: u32, beat: impl Fn(u32) -> bool) -> Vec<Vec<Reason>> {
        let text = "[[agent]]\nname = \"sol\"\nmatch = { cmdline = \"sol\" }\n\
                    [[agent.upstream]]\nrole = \"control\"\naddr = \"10.0.0.1:7443\"\nheartbeat = \"1s\"\n";
        let cfg = Config::parse(text, std::path::Path::new("/test.toml"))
            .expect("fixture config")
            .agents
            .remove(0);
        let mut history = AgentHistory::default();
        let (mut bin, mut sin, mut bout, mut sout) = (219u64, 5u32, 445u64, 6u32);
        (1..=secs)
            .map(|c| {
                if beat(c) {
                    (bin, sin, bout, sout) = (bin + 47, sin + 2, bout + 69, sout + 2);
                } else {
                    (bin, sin, bout, sout) = (bin + 17, sin + 1, bout + 17, sout + 1);
                }
                let mut i = counters(0, 0, 800, 800);
                (
                    i.bytes_received,
                    i.data_segs_in,
                    i.bytes_acked,
                    i.data_segs_out,
                ) = (bin, sin, bout, sout);
                let socket = SocketReport {
                    tcp_info: Some(i),
                    ..fixture::control_socket()
                };
                let r = fixture::report_of(fixture::process('S', vec![], vec![42]), vec![socket]);
                let (j, next) = judge(&cfg, &r, &[], &history, u64::from(c) * 1_000);
                history = next;
                j.reasons
                    .into_iter()
                    .filter(|r| r.code == ReasonCode::ControlSilent)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn a_control_stream_with_only_transport_keepalive_is_control_silent() {
        // Beats for 5 s, then only PINGs: data "arrives" every second,
        // yet no heartbeat after 5 s. Dead once 3 × 1 s passed since the
        // check that last saw a beat (the first check past 3 s of pings
        // counted: 9 s).
        let js = control_checks(14, |c| c <= 5);
        let first = js
            .iter()
            .position(|r| !r.is_empty())
            .expect("control_silent");
        assert_eq!(first + 1, 9, "{js:#?}");
        let m = &js[first][0].message;
        for words in [
            "no application data for 4.0s",
            "only transport keepalive",
            "the peer's transport still answers",
        ] {
            assert!(m.contains(words), "{words:?} in {m}");
        }
        // Heartbeats slow but real, one every 2 s (within 3 × 1 s), with
        // the PINGs between: never.
        let slow = control_checks(30, |c| c % 2 == 0);
        assert!(slow.iter().all(Vec::is_empty), "{slow:#?}");
        // Every 3 s, at the limit: never either.
        let slow = control_checks(30, |c| c % 3 == 0);
        assert!(slow.iter().all(Vec::is_empty), "{slow:#?}");
    }

    #[test]
    fn what_must_never_stall() {
        let cfg = agent("stall_after = \"20s\"");
        // A word (a 150-byte delta) every 3 s for 80 s.
        let slow = checks(&cfg, 80, 3_000, |_| 150);
        assert_eq!(first_stalled(&slow), None);
        assert!(slow.iter().all(|j| j.verdict == Verdict::Busy));
        // Pings every 5 s for 16 s, then an answer streams (a word every
        // 500 ms): never past the bound.
        let then_answer = checks(&cfg, 60, 500, |n| if n < 32 { 0 } else { 150 });
        assert_eq!(first_stalled(&then_answer), None);
        // With the default bound (10 minutes), 80 s of pings is thinking.
        assert_eq!(first_stalled(&checks(&agent(""), 80, 5_000, |_| 42)), None);
        // A bound past what ms can count is forever, not wrapped to 384 ms.
        assert_eq!(
            first_stalled(&checks(
                &agent("stall_after = \"18446744073709552s\""),
                80,
                5_000,
                |_| 42
            )),
            None
        );
        // Off: never.
        assert_eq!(
            first_stalled(&checks(&agent("stall_after = \"off\""), 80, 5_000, |_| 42)),
            None
        );
    }

    /// The progress records are the report's connections' and no others:
    /// as many as the report's socket cap at most, and a connection gone
    /// from the report is gone from the history at the next check.
    #[test]
    fn the_progress_history_holds_only_the_connections_in_the_report() {
        let cfg = agent("stall_after = \"20s\"");
        let one = report(counters(0, 0, 0, 2_000));
        let many = |n: u64| {
            let mut r = one.clone();
            let s = r.sockets[0].clone();
            r.sockets = (0..n)
                .map(|i| SocketReport {
                    inode: 1_000 + i,
                    cookie: 5_000 + i,
                    fd: Some(100 + i as i32),
                    ..s.clone()
                })
                .collect();
            r
        };
        let cap = crate::inspect::MAX_SOCKETS as u64;
        let (_, next) = judge(&cfg, &many(cap), &[], &AgentHistory::default(), 2_000);
        assert_eq!(next.progress.len() as u64, cap);
        // Ten remain: the rest drop out.
        let (_, next) = judge(&cfg, &many(10), &[], &next, 4_000);
        assert_eq!(
            next.progress.keys().copied().collect::<Vec<_>>(),
            (5_000..5_010).collect::<Vec<u64>>()
        );
        // Quiet past suspect_after (60 s) with no keepalive counted: no
        // record either.
        let mut quiet = many(cap);
        for s in &mut quiet.sockets {
            if let Some(i) = s.tcp_info.as_mut() {
                i.last_data_recv_ms = 61_000;
            }
        }
        let (_, none) = judge(&cfg, &quiet, &[], &next, 5_000);
        assert!(none.progress.is_empty(), "{}", none.progress.len());
        // A bound off: no record at all.
        let off = agent("stall_after = \"off\"");
        let (_, none) = judge(&off, &many(cap), &[], &next, 6_000);
        assert!(none.progress.is_empty());
        // None remain: nothing is kept.
        let mut gone = one.clone();
        gone.sockets.clear();
        let (_, next) = judge(&cfg, &gone, &[], &next, 6_000);
        assert!(next.progress.is_empty());
    }

    /// An agent that opens and closes thousands of pinging connections
    /// over many checks (a quarter of them new at each check, each living
    /// four checks: 13,568 in 50 checks): at every check the history holds
    /// at most the report's socket cap of progress records, each one of a
    /// connection in that check's report, and its saved size stays flat.
    #[test]
    fn a_history_over_thousands_of_connections_and_many_checks_stays_bounded() {
        let cfg = agent("stall_after = \"20s\"");
        let cap = crate::inspect::MAX_SOCKETS as u64;
        let base = report(counters(0, 0, 0, 2_000));
        let s = base.sockets[0].clone();
        let mut history = AgentHistory::default();
        let mut sizes = Vec::new();
        let mut seen = 0;
        for c in 0..50u64 {
            let now = (c + 1) * 2_000;
            let first = 5_000 + c * cap / 4;
            let mut r = base.clone();
            r.sockets = (first..first + cap)
                .map(|cookie| SocketReport {
                    inode: cookie,
                    cookie,
                    fd: i32::try_from(cookie).ok(),
                    tcp_info: Some(counters(42 * c, c as u32, 1_000, now)),
                    ..s.clone()
                })
                .collect();
            seen = first + cap - 5_000;
            let (_, next) = judge(&cfg, &r, &[], &history, now);
            assert!(next.progress.len() as u64 <= cap, "{}", next.progress.len());
            assert!(
                next.progress
                    .keys()
                    .all(|k| (first..first + cap).contains(k)),
                "a record of a connection gone at check {c}"
            );
            assert!(next.suspect_since_ms.len() as u64 <= cap);
            assert!(next.pending.len() as u64 <= cap);
            sizes.push(serde_json::to_string(&next).map_or(0, |t| t.len()));
            history = next;
        }
        assert_eq!(seen, 13_568);
        // Flat from the check where every record's connection has been
        // seen four times on (a few more digits in the numbers at most).
        let steady = sizes[4];
        assert!(
            sizes[4..].iter().all(|&n| n <= steady + steady / 10),
            "{sizes:?}"
        );
    }

    /// An hour suspended.
    const HOUR: u64 = 3_600_000;

    /// [`checks`] of a 42-byte ping every 5 s, in time awake, for `secs`
    /// s awake, the machine suspended for `asleep` ms after `awake` ms
    /// (between two checks), judged on both clocks (or,
    /// `mono` false, `CLOCK_BOOTTIME` alone); `forget` drops what the
    /// history knows of `CLOCK_MONOTONIC` before each check (a history
    /// saved by an older build). Each judgement, with what `inspect`
    /// shows after it.
    fn pinging_across(
        cfg: &AgentConfig,
        secs: u64,
        awake: u64,
        asleep: u64,
        mono: bool,
        forget: impl Fn(u64) -> bool,
    ) -> Vec<(Judgement, Vec<ConnectionProgress>)> {
        let mut history = AgentHistory::default();
        let (mut bytes, mut segs, mut last) = (0, 0, 0);
        (1..=secs / 2)
            .map(|c| {
                let t = c * 2_000;
                while last + 5_000 <= t {
                    last += 5_000;
                    segs += 1;
                    bytes += 42;
                }
                let boot = if t > awake { t + asleep } else { t };
                let now = if mono {
                    Now::both(boot, t)
                } else {
                    Now::boot(boot)
                };
                if forget(t) {
                    let text = serde_json::to_string(&history)
                        .expect("json")
                        .replace("\"checked_mono_ms\":", "\"dropped\":");
                    assert!(!text.contains("checked_mono_ms"));
                    history = serde_json::from_str(&text).expect("an old history loads");
                }
                let r = report(counters(bytes, segs, t - last, t));
                let (j, next) = judge(cfg, &r, &[], &history, now);
                let p = progress_of(cfg, &r, &next, boot);
                history = next;
                (j, p)
            })
            .collect()
    }

    fn stalled_at(js: &[(Judgement, Vec<ConnectionProgress>)]) -> Option<usize> {
        first_stalled(&js.iter().map(|(j, _)| j.clone()).collect::<Vec<_>>())
    }

    /// Pings from 5 s, the machine suspended for an hour after the check
    /// at 14 s (9 s of pings): the check right after the resume finds the
    /// call busy, 11 s of pings shown with 9 s left; it is wedged at the
    /// same check as with no suspend (26 s awake), its reason naming the
    /// hour it did not count. Judged on `CLOCK_BOOTTIME` alone it would be
    /// wedged right after the resume.
    #[test]
    fn a_suspend_inside_a_streams_keepalive_span_is_not_counted() {
        let cfg = agent("stall_after = \"20s\"");
        let plain = pinging_across(&cfg, 40, u64::MAX, 0, true, |_| false);
        let js = pinging_across(&cfg, 40, 14_000, HOUR, true, |_| false);
        assert_eq!(stalled_at(&plain), Some(12));
        assert_eq!(stalled_at(&js), Some(12), "{:#?}", js[7]);
        let (j, p) = &js[7];
        assert_eq!(j.verdict, Verdict::Busy, "{:#?}", j.reasons);
        let c = &p[0].closeness;
        assert_eq!(
            (c.only_keepalive_ms, c.suspended_ms, c.left_ms, c.stalled),
            (11_000, HOUR, 9_000, false)
        );
        let v = serde_json::to_value(&p[0]).expect("json");
        assert_eq!(v["suspended_ms"], HOUR);
        // No suspend: no such field.
        let v = serde_json::to_value(&plain[7].1[0]).expect("json");
        assert!(v.get("suspended_ms").is_none(), "{v}");
        let (j, p) = &js[12];
        assert_eq!(j.verdict, Verdict::Wedged);
        let r = &j.reasons[0];
        assert_eq!(r.code, ReasonCode::StreamStalled);
        assert!(
            r.message.contains(
                "only keepalive for at least 21.0s, not counting 1h00m the machine was suspended"
            ),
            "{}",
            r.message
        );
        assert_eq!(r.evidence["stalled_ms"], 21_000);
        assert_eq!(r.evidence["suspended_ms"], HOUR);
        // Pings 5 s apart awake, the hour between two of them not counted.
        assert_eq!(r.evidence["keepalive_spacing_ms"], 5_000);
        assert_eq!(r.evidence["stalled_ms"], p[0].closeness.only_keepalive_ms);
        // Without a suspend the reason is as it was.
        let r = &plain[12].0.reasons[0];
        assert!(!r.evidence.contains_key("suspended_ms"), "{r:?}");
        assert!(!r.message.contains("suspended"), "{}", r.message);
        // `CLOCK_BOOTTIME` alone counts the hour: wedged at once.
        let boot = pinging_across(&cfg, 40, 14_000, HOUR, false, |_| false);
        assert_eq!(stalled_at(&boot), Some(7));
    }

    /// A history saved by a build that read no `CLOCK_MONOTONIC` loads,
    /// and the interval from it counts whole (the hour's suspend counted,
    /// wedged right after the resume, as that build did); a suspend after
    /// a check that read both clocks is not counted.
    #[test]
    fn a_history_without_the_monotonic_clock_counts_as_before() {
        let cfg = agent("stall_after = \"20s\"");
        let old = pinging_across(&cfg, 40, 14_000, HOUR, true, |t| t == 16_000);
        assert_eq!(stalled_at(&old), Some(7));
        // Forgotten before a check without a suspend: nothing changes.
        let js = pinging_across(&cfg, 40, 14_000, HOUR, true, |t| t == 10_000);
        assert_eq!(stalled_at(&js), Some(12));
    }

    #[test]
    fn silence_past_stall_after_is_the_proofs_to_judge() {
        let cfg = agent("stall_after = \"20s\"");
        // Nothing arrives after the first event, for 80 s.
        let js = checks(&cfg, 80, u64::MAX / 4, |_| 0);
        assert_eq!(first_stalled(&js), None);
        assert!(
            js.iter().any(|j| j
                .work
                .iter()
                .any(|w| matches!(w, crate::prove::ProofWork::Arm { .. }))),
            "silence is proven as today: {:#?}",
            js.last()
        );
    }
}
