use super::*;

/// Counters as a check reads them: bytes and data segments in, bytes
/// acknowledged and data segments out, ms since the last data arrived.
fn at(bytes_in: u64, segs_in: u32, bytes_out: u64, segs_out: u32, recv_ago: u32) -> TcpInfo {
    TcpInfo {
        rtt_us: 100,
        rto_us: 200_000,
        unacked: 0,
        retransmits: 0,
        backoff: 0,
        probes: 0,
        last_data_recv_ms: recv_ago,
        last_data_sent_ms: 0,
        last_ack_recv_ms: recv_ago,
        bytes_received: bytes_in,
        bytes_acked: bytes_out,
        data_segs_in: segs_in,
        data_segs_out: segs_out,
    }
}

/// The record after checks `steps` (time, counters) from a request
/// of 600 bytes and a 400-byte head at time 0; the intervals seen.
fn run(steps: &[(u64, TcpInfo)]) -> (Progress, Vec<Interval>) {
    run_from(at(400, 1, 601, 1, 0), steps)
}

fn run_from(start: TcpInfo, steps: &[(u64, TcpInfo)]) -> (Progress, Vec<Interval>) {
    let mut p = Progress::start(&start, 0);
    let mut seen = Vec::new();
    for (now, info) in steps {
        let (next, i) = p.advance(info, *now);
        p = next;
        seen.push(i);
    }
    (p, seen)
}

/// A stream that sends `ping` bytes every 5 s after its head, checked
/// every 2 s for `checks` checks.
fn pinging(ping: impl Fn(u32) -> u64, checks: u64) -> Vec<(u64, TcpInfo)> {
    let (mut bytes, mut segs) = (400, 1);
    let mut last = 0;
    (1..=checks)
        .map(|c| {
            let now = c * 2_000;
            while last + 5_000 <= now {
                last += 5_000;
                segs += 1;
                bytes += ping(segs);
            }
            (now, at(bytes, segs, 601, 1, (now - last) as u32))
        })
        .collect()
}

#[test]
fn a_record_is_saved_without_its_empty_tally_and_read_back_whole() {
    let info = at(400, 1, 601, 1, 0);
    let quiet = Progress::start(&info, 2_000);
    let text = serde_json::to_string(&quiet).expect("serialize");
    for field in [
        "keepalives",
        "smallest",
        "largest",
        "first_at_ms",
        "last_at_ms",
    ] {
        assert!(!text.contains(field), "{field} in {text}");
    }
    assert_eq!(serde_json::from_str::<Progress>(&text).ok(), Some(quiet));
    // A tally is saved and read back as it was.
    let (p, _) = run(&pinging(|_| 42, 8));
    assert!(p.keepalives > 0 && p.smallest.is_some(), "{p:?}");
    let text = serde_json::to_string(&p).expect("serialize");
    assert_eq!(serde_json::from_str::<Progress>(&text).ok(), Some(p));
}

#[test]
fn pings_alone_stall_past_the_bound_with_their_size_and_spacing() {
    for (style, size) in [("sse comment over tls", 42), ("anthropic ping", 76)] {
        let (p, seen) = run(&pinging(|_| size, 16));
        assert!(
            seen.contains(&Interval::Keepalive {
                segments: 1,
                bytes: size
            }),
            "{style}"
        );
        assert!(!seen.contains(&Interval::Content), "{style}: {seen:?}");
        assert_eq!(p.stalled(32_000, 60_000), None, "{style}: not yet");
        // Counted from the first ping (5 s), not from the head.
        assert_eq!(p.since_ms, 5_000, "{style}");
        let s = p.stalled(32_000, 27_000).expect(style);
        assert_eq!(s.for_ms, 27_000, "{style}");
        assert_eq!(s.keepalives, 6, "{style}");
        assert_eq!((s.smallest, s.largest), (size, size), "{style}");
        assert_eq!(s.spacing_ms, Some(5_000), "{style}");
    }
}

#[test]
fn closeness_counts_down_to_the_bound_and_is_none_without_keepalive() {
    let (p, _) = run(&pinging(|_| 42, 8));
    // 16 s of pings every 5 s from 0: three counted, the first at 5 s,
    // the last at 15 s.
    let c = p.closeness(16_000, 30_000).expect("pings counted");
    assert_eq!(
        c,
        Closeness {
            only_keepalive_ms: 11_000,
            suspended_ms: 0,
            keepalives: 3,
            keepalive_bytes: 126,
            keepalive_bytes_min: 42,
            keepalive_bytes_max: 42,
            keepalive_spacing_ms: Some(5_000),
            last_keepalive_ago_ms: 1_000,
            stall_after_ms: 30_000,
            left_ms: 19_000,
            stalled: false,
        }
    );
    // Past the bound: nothing left, stalled as the judge finds it.
    let c = p.closeness(40_000, 30_000).expect("pings counted");
    assert_eq!((c.left_ms, c.stalled), (0, true));
    assert_eq!(p.stalled(40_000, 30_000).map(|s| s.for_ms), Some(35_000));
    // A clock before the record's start: no underflow.
    assert_eq!(p.closeness(0, 30_000).map(|c| c.left_ms), Some(30_000));
    // Silence, or content: nothing to show.
    let (quiet, _) = run(&[(2_000, at(400, 1, 601, 1, 2_000))]);
    assert_eq!(quiet.closeness(2_000, 30_000), None);
    let (talking, _) = run(&[(2_000, at(700, 2, 601, 1, 10))]);
    assert_eq!(talking.closeness(2_000, 30_000), None);
}

/// Measured on loopback with grpcio 1.85.1, a server-streaming call
/// with channel keepalive (`ss -ti` once a second): while the server's
/// application sends a heartbeat a second, 47 bytes in 2 segments
/// arrive and 69 in 2 go out (its DATA frame and a PING ACK; the
/// client's WINDOW_UPDATE, BDP PING and keepalive PING); once it
/// stopped, 17 in 1 and 17 out 1 (a PING and its ACK).
fn grpc(beats: u32, stuck: u32) -> Vec<(u64, TcpInfo)> {
    let (mut bin, mut sin, mut bout, mut sout) = (219, 5, 445, 6);
    (1..=beats + stuck)
        .map(|c| {
            if c <= beats {
                (bin, sin, bout, sout) = (bin + 47, sin + 2, bout + 69, sout + 2);
            } else {
                (bin, sin, bout, sout) = (bin + 17, sin + 1, bout + 17, sout + 1);
            }
            (u64::from(c) * 1_000, at(bin, sin, bout, sout, 800))
        })
        .collect()
}

fn run_as(rule: Rule, steps: &[(u64, TcpInfo)]) -> (Progress, Vec<Interval>) {
    let mut p = Progress::start(&at(219, 5, 445, 6, 0), 0);
    let mut seen = Vec::new();
    for (now, info) in steps {
        let (next, i) = p.advance_as(info, *now, rule);
        p = next;
        seen.push(i);
    }
    (p, seen)
}

#[test]
fn a_control_streams_heartbeats_are_content_and_its_mirrored_pings_keepalive() {
    // Heartbeats a second for 20 s: content every interval.
    let (p, seen) = run_as(Rule::Mirrored, &grpc(20, 0));
    assert!(seen.iter().all(|i| *i == Interval::Content), "{seen:?}");
    assert_eq!(p.keepalive_only_ms(20_000), None);
    // By the stream rule the same heartbeats are small and alike:
    // keepalive, which is why a control stream has its own rule.
    let (p, _) = run(&grpc(20, 0));
    assert!(p.keepalives > 2, "{p:?}");
    // Four beats, then only PINGs and their ACKs for 8 s.
    let (p, seen) = run_as(Rule::Mirrored, &grpc(4, 8));
    assert_eq!(seen[3], Interval::Content);
    assert!(
        seen[4..].iter().all(|i| *i
            == Interval::Keepalive {
                segments: 1,
                bytes: 17
            }),
        "{seen:?}"
    );
    assert_eq!(p.since_ms, 4_000);
    assert_eq!(p.keepalive_only_ms(12_000), Some(8_000));
    assert_eq!(
        p.keepalive_only_ms(1_000),
        Some(0),
        "a clock behind: none negative"
    );
    // A PING and its ACK split by a check: the ACK's interval is not
    // mirrored and starts the count again (late, never early).
    let mut split = grpc(4, 4);
    let (_, last) = split.last().cloned().unwrap();
    split.push((
        9_000,
        at(
            last.bytes_received,
            last.data_segs_in,
            last.bytes_acked + 17,
            last.data_segs_out + 1,
            900,
        ),
    ));
    split.push((
        10_000,
        at(
            last.bytes_received + 17,
            last.data_segs_in + 1,
            last.bytes_acked + 17,
            last.data_segs_out + 1,
            10,
        ),
    ));
    let (p, seen) = run_as(Rule::Mirrored, &split);
    assert_eq!(seen[8], Interval::Silent);
    assert_eq!(seen[9], Interval::Content);
    assert_eq!(p.keepalive_only_ms(10_000), None);
    // An application's own ping and pong of one size (30 bytes each
    // way, not a PING frame's): alive, content.
    let (p, _) = run_as(Rule::Mirrored, &grpc(4, 8));
    let echo = at(
        p.bytes_received + 30,
        p.data_segs_in + 1,
        p.bytes_acked + 30,
        p.data_segs_out + 1,
        10,
    );
    assert_eq!(
        p.advance_as(&echo, 13_000, Rule::Mirrored).1,
        Interval::Content
    );
    // PINGs over TLS 1.3 (39 bytes each way), two in an interval:
    // keepalive.
    let tls = at(
        p.bytes_received + 78,
        p.data_segs_in + 2,
        p.bytes_acked + 78,
        p.data_segs_out + 2,
        10,
    );
    assert_eq!(
        p.advance_as(&tls, 13_000, Rule::Mirrored).1,
        Interval::Keepalive {
            segments: 2,
            bytes: 78
        }
    );
    // What the agent sends on its control stream restarts nothing.
    let (q, i) = p.advance_as(
        &at(
            p.bytes_received,
            p.data_segs_in,
            p.bytes_acked + 4_000,
            p.data_segs_out + 2,
            10,
        ),
        14_000,
        Rule::Mirrored,
    );
    assert_eq!((i, q.since_ms), (Interval::Silent, p.since_ms));
}

/// A PING and its ACK in each TLS a provider speaks, as measured on
/// the wire (a 17-byte write: 38 bytes in TLS 1.2 ChaCha20-Poly1305,
/// 39 in TLS 1.3, 46 in TLS 1.2 AES-GCM), one to three in an interval:
/// keepalive; a mirrored exchange of a size no PING has: content.
#[test]
fn mirrored_pings_are_keepalive_in_every_tls_record() {
    for ping in HTTP2_PING_WIRE {
        for n in 1..=3 {
            let (p, _) = run_as(Rule::Mirrored, &grpc(4, 8));
            let pings = at(
                p.bytes_received + n * ping,
                p.data_segs_in + n as u32,
                p.bytes_acked + n * ping,
                p.data_segs_out + n as u32,
                10,
            );
            assert_eq!(
                p.advance_as(&pings, 13_000, Rule::Mirrored).1,
                Interval::Keepalive {
                    segments: n as u32,
                    bytes: n * ping
                },
                "{n} x {ping} B"
            );
        }
    }
    assert!(HTTP2_PING_WIRE.contains(&38), "TLS 1.2 ChaCha20-Poly1305");
    for other in [30, 37, 40, 45, 47] {
        let (p, _) = run_as(Rule::Mirrored, &grpc(4, 8));
        let echo = at(
            p.bytes_received + other,
            p.data_segs_in + 1,
            p.bytes_acked + other,
            p.data_segs_out + 1,
            10,
        );
        assert_eq!(
            p.advance_as(&echo, 13_000, Rule::Mirrored).1,
            Interval::Content,
            "{other} B"
        );
    }
}

#[test]
fn pings_whose_size_varies_by_a_timestamp_are_still_keepalive() {
    let (p, seen) = run(&pinging(|n| 60 + u64::from(n * 7 % 20), 16));
    assert!(!seen.contains(&Interval::Content), "{seen:?}");
    assert!(p.stalled(32_000, 27_000).is_some());
}

/// The head and first event, then silence past the bound (a call
/// thinking), then pings: the count starts at the first ping, not at
/// the head, so the call is given its whole bound of pings.
#[test]
fn a_first_keepalive_that_comes_late_starts_the_count_at_it_not_at_the_head() {
    // Checks every 2 s; silence until 40 s (past a 30 s bound), then a
    // 42-byte ping every 5 s from 41 s.
    let (mut bytes, mut segs, mut last) = (400, 1, 0);
    let steps: Vec<_> = (1..=40u64)
        .map(|c| {
            let now = c * 2_000;
            let mut next = if last == 0 { 41_000 } else { last + 5_000 };
            while next <= now {
                (last, segs, bytes) = (next, segs + 1, bytes + 42);
                next += 5_000;
            }
            (now, at(bytes, segs, 601, 1, (now - last) as u32))
        })
        .collect();
    let mut p = Progress::start(&at(400, 1, 601, 1, 0), 0);
    for (now, info) in &steps {
        p = p.advance(info, *now).0;
        // Past the bound from the head at every check, but from the
        // first ping only once 30 s of pings went by.
        let stalled = p.stalled(*now, 30_000).is_some();
        assert_eq!(stalled, *now >= 71_000, "at {now}: {p:?}");
        if *now == 48_000 {
            assert_eq!((p.since_ms, p.keepalives), (41_000, 2), "{p:?}");
            let c = p.closeness(*now, 30_000).expect("pings counted");
            assert_eq!((c.only_keepalive_ms, c.left_ms), (7_000, 23_000));
        }
    }
}

/// The judge's clock (`CLOCK_BOOTTIME`) does not move with the wall
/// clock, but it counts a host's sleep: an hour between two checks.
/// Silence across the jump is no keepalive, so pings after it are
/// counted from the first; content after it restarts the count; a
/// clock that goes back starts the record afresh.
#[test]
fn a_clock_jump_between_checks_is_no_stall() {
    const HOUR: u64 = 3_600_000;
    // The head and first event at 0, a silent check at 2 s, the host
    // asleep for an hour, then a ping 500 ms before the next check
    // and another before the one after.
    let (p, seen) = run(&[
        (2_000, at(400, 1, 601, 1, 2_000)),
        (HOUR + 2_000, at(442, 2, 601, 1, 500)),
        (HOUR + 4_000, at(484, 3, 601, 1, 500)),
    ]);
    assert_eq!(seen[0], Interval::Silent);
    assert!(matches!(seen[2], Interval::Keepalive { .. }), "{seen:?}");
    assert_eq!(p.since_ms, HOUR + 1_500);
    assert_eq!(p.stalled(HOUR + 4_000, 30_000), None, "{p:?}");
    assert!(p.stalled(HOUR + 31_500, 30_000).is_some());
    // Pings, the jump, then a word: content, counted again from it.
    let (p, _) = run(&pinging(|_| 42, 8));
    let (q, i) = p.advance(
        &at(p.bytes_received + 150, p.data_segs_in + 1, 601, 1, 10),
        HOUR,
    );
    assert_eq!((i, q.since_ms, q.keepalives), (Interval::Content, HOUR, 0));
    // Back by an hour: afresh.
    let (q, i) = q.advance(
        &at(q.bytes_received + 42, q.data_segs_in + 1, 601, 1, 10),
        1_000,
    );
    assert_eq!((i, q.since_ms, q.keepalives), (Interval::First, 1_000, 0));
}

#[test]
fn content_however_slow_restarts_the_count() {
    // A word every 2 s (a 145-byte delta): each interval is content.
    let steps: Vec<_> = (1..=40u32)
        .map(|c| {
            (
                u64::from(c) * 2_000,
                at(400 + u64::from(c) * 145, 1 + c, 601, 1, 10),
            )
        })
        .collect();
    let (p, seen) = run(&steps);
    assert!(seen.iter().all(|i| *i == Interval::Content), "{seen:?}");
    assert_eq!(p.stalled(80_000, 1), None);
}

#[test]
fn a_word_beside_a_ping_in_one_interval_is_content() {
    // Pings of 42 bytes learned, then an interval with a 140-byte word
    // and a ping: a mean of 91, under the keepalive maximum, but far
    // from the pings' size.
    let mut steps = pinging(|_| 42, 8);
    let (_, last) = steps.last().cloned().unwrap();
    steps.push((
        18_000,
        at(
            last.bytes_received + 140 + 42,
            last.data_segs_in + 2,
            601,
            1,
            100,
        ),
    ));
    let (p, seen) = run(&steps);
    assert_eq!(seen.last(), Some(&Interval::Content));
    assert_eq!((p.since_ms, p.keepalives), (18_000, 0));
}

#[test]
fn a_new_request_restarts_the_count_and_ping_answers_do_not() {
    let mut steps = pinging(|_| 39, 8);
    let (_, last) = steps.last().cloned().unwrap();
    // An HTTP/2 client's PING answers: 39 bytes a segment out.
    steps.push((
        18_000,
        at(
            last.bytes_received + 39,
            last.data_segs_in + 1,
            601 + 78,
            3,
            100,
        ),
    ));
    let (p, seen) = run(&steps);
    assert!(matches!(seen.last(), Some(Interval::Keepalive { .. })));
    assert!(p.stalled(18_000, 10_000).is_some());
    // A 700-byte request on the same connection.
    let (p, i) = p.advance(
        &at(p.bytes_received, p.data_segs_in, 601 + 78 + 700, 4, 500),
        20_000,
    );
    assert_eq!(i, Interval::Request);
    assert_eq!((p.since_ms, p.keepalives), (20_000, 0));
    assert_eq!(p.stalled(40_000, 10_000), None);
}

#[test]
fn silence_neither_stalls_nor_restarts() {
    let (p, seen) = run(&[
        (2_000, at(400, 1, 601, 1, 2_000)),
        (600_000, at(400, 1, 601, 1, 600_000)),
    ]);
    assert_eq!(seen, [Interval::Silent, Interval::Silent]);
    assert_eq!(p.since_ms, 0);
    assert_eq!(
        p.stalled(600_000, 1),
        None,
        "no keepalive: silence is the proof's"
    );
}

#[test]
fn counters_that_go_back_or_a_clock_that_does_start_afresh() {
    let (p, _) = run(&pinging(|_| 42, 16));
    for (now, info) in [
        (40_000, at(10, 1, 601, 1, 0)),
        (40_000, at(p.bytes_received, p.data_segs_in, 5, 1, 0)),
        (30_000, at(p.bytes_received, p.data_segs_in, 601, 1, 0)),
    ] {
        let (q, i) = p.advance(&info, now);
        assert_eq!(i, Interval::First, "{info:?} at {now}");
        assert_eq!((q.since_ms, q.keepalives), (now, 0));
    }
}

#[test]
fn bytes_without_counted_segments_are_never_keepalive() {
    // A kernel that reports no data segments (before Linux 4.6).
    let (p, seen) = run_from(
        at(400, 0, 601, 0, 0),
        &[
            (2_000, at(442, 0, 601, 0, 0)),
            (7_000, at(484, 0, 601, 0, 0)),
        ],
    );
    assert_eq!(seen, [Interval::Content, Interval::Content]);
    assert_eq!(p.stalled(100_000, 1), None);
}

/// An hour, suspended.
const HOUR: u64 = 3_600_000;

/// A stream that sends a 42-byte ping every 5 s of time awake after its
/// head, checked every 2 s awake for `checks` checks, the machine
/// suspended for `asleep` ms once `awake` ms had passed (between two
/// checks): each check's time on both clocks (`CLOCK_BOOTTIME` moved on
/// by the suspend, `CLOCK_MONOTONIC` not) and its counters, whose ages
/// are the kernel's, in time awake.
fn pinging_across(awake: u64, asleep: u64, checks: u64) -> Vec<(Now, TcpInfo)> {
    pinging(|_| 42, checks)
        .into_iter()
        .map(|(t, info)| {
            let boot = if t > awake { t + asleep } else { t };
            (Now::both(boot, t), info)
        })
        .collect()
}

/// The record after `steps` from the head at 0 on both clocks, and the
/// stall at each check against `bound`.
fn run_at(steps: &[(Now, TcpInfo)], bound: u64) -> (Progress, Vec<Option<Stall>>) {
    let mut p = Progress::start(&at(400, 1, 601, 1, 0), Now::both(0, 0));
    let mut stalls = Vec::new();
    for (now, info) in steps {
        p = p.advance_as(info, *now, Rule::Stream).0;
        stalls.push(p.stalled(now.boot_ms, bound));
    }
    (p, stalls)
}

/// Pings from 5 s, the machine suspended for an hour after the check at
/// 16 s (11 s of pings counted): the check right after the resume finds
/// 13 s of pings, not an hour, and `inspect` the bound's rest; the pings
/// that go on awake are stalled at the same check as with no suspend
/// (31 s of pings at 36 s awake), the hour named and not counted.
#[test]
fn a_suspend_inside_the_keepalive_span_is_not_counted() {
    let bound = 30_000;
    let (p, stalls) = run_at(&pinging_across(16_000, HOUR, 30), bound);
    let (plain, plain_stalls) = run_at(&pinging_across(16_000, 0, 30), bound);
    // Check 9 (18 s awake) is the first after the resume.
    assert_eq!(stalls[8], None, "right after the resume");
    let (after, _) = run_at(&pinging_across(16_000, HOUR, 9), bound);
    assert_eq!(after.checked_ms, HOUR + 18_000);
    assert_eq!(after.suspended_ms, HOUR);
    assert_eq!(after.keepalive_only_ms(HOUR + 18_000), Some(13_000));
    let c = after
        .closeness(HOUR + 18_000, bound)
        .expect("pings counted");
    assert_eq!(
        (c.only_keepalive_ms, c.suspended_ms, c.left_ms, c.stalled),
        (13_000, HOUR, 17_000, false)
    );
    // The last ping (15 s) came before the suspend: 3 s ago, awake.
    assert_eq!(
        (c.keepalive_spacing_ms, c.last_keepalive_ago_ms),
        (Some(5_000), 3_000)
    );
    // Stalled at the same check as without the suspend, for as long.
    let first = |s: &[Option<Stall>]| s.iter().position(Option::is_some);
    assert_eq!(first(&stalls), Some(17), "{p:?}");
    assert_eq!(first(&stalls), first(&plain_stalls));
    let s = stalls[17].expect("stalled");
    assert_eq!((s.for_ms, s.suspended_ms), (31_000, HOUR));
    // Pings 5 s apart awake, the hour between two of them not counted.
    assert_eq!(s.spacing_ms, Some(5_000));
    assert_eq!(
        plain_stalls[17].map(|s| (s.for_ms, s.suspended_ms)),
        Some((31_000, 0))
    );
    assert_eq!(p.since_ms, plain.since_ms);
    assert_eq!(p.keepalives, plain.keepalives);
    // Saved and read back with what it knows of the suspend.
    let text = serde_json::to_string(&p).expect("serialize");
    assert!(text.contains("\"suspended_ms\":3600000"), "{text}");
    assert_eq!(serde_json::from_str::<Progress>(&text).ok(), Some(p));
}

/// A suspend in the interval where the first ping arrives: a span dated
/// by the ping's age (time awake) holds none of it; one dated from the
/// last check (the arrival aged past it) holds all of it.
#[test]
fn a_span_started_across_a_suspend_holds_only_what_follows_its_start() {
    let head = Progress::start(&at(400, 1, 601, 1, 0), Now::both(0, 0));
    let p = head
        .advance_as(
            &at(400, 1, 601, 1, 2_000),
            Now::both(2_000, 2_000),
            Rule::Stream,
        )
        .0;
    // 2 s awake and an hour suspended; a ping 500 ms before the check.
    let (q, i) = p.advance_as(
        &at(442, 2, 601, 1, 500),
        Now::both(HOUR + 4_000, 4_000),
        Rule::Stream,
    );
    assert!(matches!(i, Interval::Keepalive { .. }), "{i:?}");
    assert_eq!((q.since_ms, q.suspended_ms), (HOUR + 3_500, 0));
    // A ping aged past the interval's time awake (it came before the
    // suspend, or before the last check: a reading race): from that
    // check, the whole suspend in the span and not counted.
    let (q, _) = p.advance_as(
        &at(442, 2, 601, 1, 2_000),
        Now::both(HOUR + 4_000, 4_000),
        Rule::Stream,
    );
    assert_eq!((q.since_ms, q.suspended_ms), (2_000, HOUR));
    assert_eq!(q.awake_ms(HOUR + 4_000), 2_000);
    // Content after a suspend restarts the count, with nothing of it.
    let (p, _) = run_at(&pinging_across(16_000, HOUR, 8), 30_000);
    let (q, i) = p.advance_as(
        &at(p.bytes_received + 150, p.data_segs_in + 1, 601, 1, 10),
        Now::both(HOUR + 20_000, 20_000),
        Rule::Stream,
    );
    assert_eq!(
        (i, q.since_ms, q.suspended_ms),
        (Interval::Content, HOUR + 20_000, 0)
    );
}

/// No suspend: both clocks advance alike, and every record, interval
/// and stall is what `CLOCK_BOOTTIME` alone gives.
#[test]
fn without_a_suspend_both_clocks_count_as_boottime_alone() {
    let steps = pinging(|_| 42, 30);
    let (alone, _) = run(&steps);
    // `CLOCK_MONOTONIC` a constant behind (a machine suspended before).
    let both: Vec<_> = steps
        .iter()
        .map(|(t, i)| (Now::both(t + 90_000, *t), i.clone()))
        .collect();
    let mut p = Progress::start(&at(400, 1, 601, 1, 0), Now::both(90_000, 0));
    let mut q = Progress::start(&at(400, 1, 601, 1, 0), 90_000);
    for (now, info) in &both {
        let (np, ip) = p.advance_as(info, *now, Rule::Stream);
        let (nq, iq) = q.advance(info, now.boot_ms);
        assert_eq!(ip, iq);
        assert_eq!(np.suspended_ms, 0);
        assert_eq!(
            np.stalled(now.boot_ms, 30_000),
            nq.stalled(now.boot_ms, 30_000)
        );
        assert_eq!(
            np.closeness(now.boot_ms, 30_000),
            nq.closeness(now.boot_ms, 30_000)
        );
        (p, q) = (np, nq);
    }
    assert_eq!(p.since_ms, alone.since_ms + 90_000);
    assert_eq!(p.stalled(150_000, 30_000).map(|s| s.for_ms), Some(55_000));
}

/// A record saved by a build that read no `CLOCK_MONOTONIC` (no
/// `checked_mono_ms`, no `suspended_ms`) loads; the interval from it
/// counts whole, as `CLOCK_BOOTTIME` says (a suspend in it is counted, as
/// before), and the intervals after it know of suspends.
#[test]
fn a_record_saved_without_the_monotonic_clock_counts_as_before() {
    let old = r#"{"since_ms":5000,"checked_ms":16000,"bytes_received":526,"data_segs_in":4,"bytes_acked":601,"data_segs_out":1,"keepalives":3,"keepalive_bytes":126,"smallest":42,"largest":42,"first_at_ms":5000,"last_at_ms":15000}"#;
    let p: Progress = serde_json::from_str(old).expect("an old record loads");
    assert_eq!((p.checked_mono_ms, p.suspended_ms), (None, 0));
    let (before, _) = run(&pinging(|_| 42, 8));
    assert_eq!(p, before, "what CLOCK_BOOTTIME alone recorded");
    // An hour suspended after it: counted, stalled at once, as before.
    let ping = at(568, 5, 601, 1, 0);
    let (q, _) = p.advance_as(&ping, Now::both(HOUR + 20_000, 20_000), Rule::Stream);
    let (r, _) = p.advance(&ping, HOUR + 20_000);
    assert_eq!(q.suspended_ms, 0);
    assert_eq!(
        q.stalled(HOUR + 20_000, 30_000),
        r.stalled(HOUR + 20_000, 30_000)
    );
    assert!(q.stalled(HOUR + 20_000, 30_000).is_some());
    // The next interval has both readings: its suspend is not counted.
    let (q, _) = q.advance_as(
        &at(610, 6, 601, 1, 0),
        Now::both(3 * HOUR + 22_000, 22_000),
        Rule::Stream,
    );
    assert_eq!(q.suspended_ms, 2 * HOUR);
    assert_eq!(q.keepalive_only_ms(3 * HOUR + 22_000), Some(HOUR + 17_000));
}

/// Readings that contradict each other (`CLOCK_MONOTONIC` back, or ahead
/// of `CLOCK_BOOTTIME`, or moved further than it; the extremes of a
/// `u64`): no panic, and the interval counts whole, as `CLOCK_BOOTTIME`
/// says; `CLOCK_BOOTTIME` back starts the record afresh, as before.
#[test]
fn contradicting_clocks_count_as_boottime_alone() {
    let (p, _) = run_at(&pinging_across(u64::MAX, 0, 8), 30_000);
    assert_eq!(p.checked_mono_ms, Some(16_000));
    let ping = at(p.bytes_received + 42, p.data_segs_in + 1, 601, 1, 0);
    let boot = p.advance(&ping, HOUR + 18_000).0;
    let whole = boot.keepalive_only_ms(HOUR + 18_000);
    assert_eq!(whole, Some(HOUR + 13_000));
    for (now, what) in [
        (Now::both(HOUR + 18_000, 15_000), "monotonic back"),
        (Now::both(HOUR + 18_000, 0), "monotonic back to 0"),
        (
            Now {
                boot_ms: HOUR + 18_000,
                mono_ms: Some(HOUR + 19_000),
            },
            "boottime behind monotonic",
        ),
        (
            Now {
                boot_ms: HOUR + 18_000,
                mono_ms: Some(u64::MAX),
            },
            "monotonic at its most",
        ),
        (Now::boot(HOUR + 18_000), "no monotonic"),
        (
            Now::both(HOUR + 18_000, HOUR + 18_000),
            "monotonic moved further",
        ),
    ] {
        // Monotonic moved further than boottime: from a last check whose
        // monotonic was 6 s behind.
        let from = if what == "monotonic moved further" {
            Progress {
                checked_mono_ms: Some(10_000),
                ..p.clone()
            }
        } else {
            p.clone()
        };
        let (q, i) = from.advance_as(&ping, now, Rule::Stream);
        assert!(matches!(i, Interval::Keepalive { .. }), "{what}: {i:?}");
        assert_eq!(q.suspended_ms, 0, "{what}");
        assert_eq!(q.keepalive_only_ms(HOUR + 18_000), whole, "{what}");
        assert!(q.stalled(HOUR + 18_000, 30_000).is_some(), "{what}");
        // And the next check, from a reading not to trust, does not
        // count a suspend it cannot tell.
        let next = at(q.bytes_received + 42, q.data_segs_in + 1, 601, 1, 0);
        let (r, _) = q.advance_as(&next, Now::both(HOUR + 20_000, 20_000), Rule::Stream);
        assert!(r.suspended_ms <= HOUR, "{what}: {r:?}");
    }
    // A record whose own readings are the ones not to trust.
    let bad = Progress {
        checked_mono_ms: Some(u64::MAX),
        suspended_ms: u64::MAX,
        ..p.clone()
    };
    let (q, _) = bad.advance_as(&ping, Now::both(u64::MAX, 0), Rule::Stream);
    assert_eq!(q.suspended_ms, u64::MAX);
    assert_eq!(q.keepalive_only_ms(u64::MAX), Some(0));
    assert!(q.closeness(u64::MAX, 30_000).is_some());
    // Boottime back: afresh, whatever monotonic says.
    let (q, i) = p.advance_as(&ping, Now::both(10_000, 10_000), Rule::Stream);
    assert_eq!(
        (i, q.since_ms, q.suspended_ms),
        (Interval::First, 10_000, 0)
    );
}
