//! Whether a call in flight is making progress, judged from what the
//! kernel counts on its connection between checks (`tcp_info`'s bytes and
//! data segments, in and out), never from its content, which TLS hides.
//!
//! A provider whose backend stalled while its edge, a relay or a gateway
//! keeps the stream open sends only keepalive: SSE comment lines
//! (`: ping`), Anthropic's `ping` events, HTTP/2 PING frames. Each is one
//! small record, one small segment: 13 to 80 bytes on the wire with TLS
//! and HTTP framing, where the smallest event that carries content (a
//! one-word delta of OpenAI's or Anthropic's stream) is over 130. So an
//! interval between two checks in which data segments arrived carries
//! only keepalive when
//!
//! - their mean size is at most [`KEEPALIVE_MAX_SEGMENT`] bytes, and
//! - it is within [`KEEPALIVE_SIZE_SPREAD`] bytes of the smallest
//!   keepalive seen on the connection (pings are alike: a relay that
//!   stamps them with the time varies them by a few bytes; a word of
//!   content mixed into an interval with a ping lifts its mean past this).
//!
//! Everything else is content and starts the count again, as does a
//! request: more than keepalive-sized data sent (an HTTP/2 client answers
//! each PING with a PING of its own, which is not a request). An interval
//! where nothing arrived changes nothing: silence is the proof keepalive's
//! to judge, and a call that goes silent is no longer "talking". Nor does
//! silence count towards a stream's stall: its count starts when its
//! first keepalive arrived, however late that comes.
//!
//! A control stream (gRPC, HTTP/2) with an application heartbeat is told
//! by [`Rule::Mirrored`] instead: its transport's keepalive is a PING
//! answered by an ACK of the same size, so an interval carries only
//! keepalive when what arrived mirrors what went out; its application
//! heartbeats are small too, and alike, and would pass the stream rule.
//!
//! The span is counted in time the machine was awake. Its stamps are
//! `CLOCK_BOOTTIME`'s, which goes on counting while the machine is
//! suspended (a laptop's lid, a paused VM); each check also reads
//! `CLOCK_MONOTONIC`, which does not, and the record keeps the suspend
//! seen between checks (how much further the one moved than the other)
//! out of the span. A stream that pinged for a minute before an hour's
//! suspend has pinged for a minute when the machine wakes, and its peer,
//! given the rest of its bound, may yet send what it buffered. A record
//! saved without `CLOCK_MONOTONIC` (by an older build), and readings
//! that contradict each other (`CLOCK_MONOTONIC` back, or ahead of
//! `CLOCK_BOOTTIME`), count the interval whole, as `CLOCK_BOOTTIME` says.
//!
//! Limits, by construction: the evidence is per check, so a stall is
//! dated from the check that last saw content (at most one interval
//! late), and a stream whose every content event is keepalive-sized (a
//! custom protocol sending a few bytes per token) would look stalled; the
//! bound (`stall_after`) is per upstream and can be `"off"`. An HTTP/2
//! connection idle in a client's pool whose server sends PINGs looks the
//! same as a stalled stream; ending it costs the client a reconnect.

use serde::{Deserialize, Serialize};

use crate::{clock::Now, sockdiag::TcpInfo};

/// The largest mean data segment, in bytes, that counts as keepalive.
pub const KEEPALIVE_MAX_SEGMENT: u64 = 128;

/// How much larger than the smallest keepalive seen on a connection, in
/// bytes per segment, later keepalives may be.
pub const KEEPALIVE_SIZE_SPREAD: u64 = 32;

/// The sizes of an HTTP/2 PING frame on the wire, in bytes: in the clear
/// (a 9-byte frame header and 8 bytes of opaque data), in a TLS 1.2
/// ChaCha20-Poly1305 record (+21: header, tag; no explicit nonce), in a
/// TLS 1.3 record of either AEAD (+22: header, content type, tag), in a
/// TLS 1.2 AES-GCM record (+29: header, explicit nonce, tag); each
/// measured with `openssl s_server`/`s_client` on a 17-byte write. A
/// mirrored interval of control keepalive carries a whole number of them.
pub const HTTP2_PING_WIRE: [u64; 4] = [17, 38, 39, 46];

/// Keepalive arrivals a stall needs: one could be a straggler of the
/// content before it.
pub const MIN_KEEPALIVES: u32 = 2;

/// One connection's progress record, kept in the history from check to
/// check. Saved in the state file for every established upstream
/// connection, so what is zero or none (a connection with no keepalive
/// tally, the most) is left out of it and read back as such.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Progress {
    /// Since when (`CLOCK_BOOTTIME` ms, a check's time) nothing but
    /// keepalive has arrived: the check that first saw the connection, or
    /// that saw content or a request on it last.
    pub since_ms: u64,
    /// When the last check was.
    pub checked_ms: u64,
    /// Its `CLOCK_MONOTONIC` ms, where it was read: the next check tells
    /// from it how long the machine was suspended in between.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checked_mono_ms: Option<u64>,
    /// How long the machine was suspended between `since_ms` and the last
    /// check: the part of the keepalive-only span not counted. A record
    /// saved without it reads back as none.
    #[serde(skip_serializing_if = "is_zero")]
    pub suspended_ms: u64,
    /// The counters at the last check.
    pub bytes_received: u64,
    pub data_segs_in: u32,
    pub bytes_acked: u64,
    pub data_segs_out: u32,
    /// Keepalive-sized segments since `since_ms`, and their bytes.
    #[serde(skip_serializing_if = "is_zero")]
    pub keepalives: u32,
    #[serde(skip_serializing_if = "is_zero")]
    pub keepalive_bytes: u64,
    /// The smallest and largest mean keepalive size of an interval (bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub smallest: Option<u64>,
    #[serde(skip_serializing_if = "is_zero")]
    pub largest: u64,
    /// When the first and the last keepalive since `since_ms` arrived
    /// (ms, from each check's `last_data_recv_ms`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_at_ms: Option<u64>,
    #[serde(skip_serializing_if = "is_zero")]
    pub last_at_ms: u64,
    /// How much of `suspended_ms` had passed by the first and by the last
    /// keepalive's arrival: the suspend between the two (not counted in
    /// their spacing), and since the last (not counted in its age).
    #[serde(skip_serializing_if = "is_zero")]
    pub suspended_by_first_ms: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub suspended_by_last_ms: u64,
}

fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

/// What arrived between two checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interval {
    /// The first check of this connection: nothing to compare with.
    First,
    /// Nothing arrived, nothing was sent.
    Silent,
    /// Only keepalive-sized segments arrived: how many, how many bytes.
    Keepalive { segments: u32, bytes: u64 },
    /// Content arrived.
    Content,
    /// A request went out.
    Request,
}

/// How an interval's arrivals are told keepalive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// A provider's stream: small arrivals alike in size, the count
    /// started again by a request.
    Stream,
    /// A control stream (gRPC, HTTP/2) with an application heartbeat:
    /// small arrivals that mirror what went out (PINGs and their ACKs);
    /// what the agent sends starts nothing again.
    Mirrored,
}

/// A stall, as [`Progress::stalled`] finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stall {
    /// How long only keepalive has arrived, the machine awake.
    pub for_ms: u64,
    /// How long the machine was suspended within that span, not counted.
    pub suspended_ms: u64,
    pub keepalives: u32,
    pub smallest: u64,
    pub largest: u64,
    /// The mean time between keepalives, where two or more were dated,
    /// the machine awake.
    pub spacing_ms: Option<u64>,
}

/// How close a connection is to its bound, as `inspect` shows it: the
/// keepalive-only arrivals counted since content or a request last came,
/// against its upstream's `stall_after`. Only numbers: nothing a peer
/// sends is in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Closeness {
    /// How long only keepalive has arrived (since `since_ms`), the machine
    /// awake.
    pub only_keepalive_ms: u64,
    /// How long the machine was suspended within that span, not counted
    /// (absent when it was not).
    #[serde(skip_serializing_if = "is_zero")]
    pub suspended_ms: u64,
    pub keepalives: u32,
    pub keepalive_bytes: u64,
    /// The smallest and largest mean keepalive size (bytes).
    pub keepalive_bytes_min: u64,
    pub keepalive_bytes_max: u64,
    /// The mean time between keepalives, where two or more were dated,
    /// the machine awake.
    pub keepalive_spacing_ms: Option<u64>,
    /// How long ago the last keepalive arrived, the machine awake.
    pub last_keepalive_ago_ms: u64,
    pub stall_after_ms: u64,
    /// What remains of `stall_after` (0 once past it).
    pub left_ms: u64,
    /// Whether the judge finds it stalled now: past the bound with at
    /// least [`MIN_KEEPALIVES`] keepalives.
    pub stalled: bool,
}

impl Progress {
    /// The record of a connection first seen at `now` (a bare `u64`:
    /// `CLOCK_BOOTTIME` ms alone).
    pub fn start(info: &TcpInfo, now: impl Into<Now>) -> Self {
        let now = now.into();
        Self {
            since_ms: now.boot_ms,
            checked_ms: now.boot_ms,
            checked_mono_ms: now.mono_ms,
            bytes_received: info.bytes_received,
            data_segs_in: info.data_segs_in,
            bytes_acked: info.bytes_acked,
            data_segs_out: info.data_segs_out,
            ..Self::default()
        }
    }

    /// The record after the check at `now` read `info`, and what arrived
    /// since the last, by [`Rule::Stream`].
    pub fn advance(&self, info: &TcpInfo, now: impl Into<Now>) -> (Self, Interval) {
        self.advance_as(info, now, Rule::Stream)
    }

    /// The record after the check at `now` read `info`, and what arrived
    /// since the last, by `rule`. Counters that went backwards (another
    /// connection under the same cookie, a kernel that does not count data
    /// segments) or a clock that did start the record afresh. Time the
    /// machine was suspended since the last check (`CLOCK_BOOTTIME` moved
    /// further than `CLOCK_MONOTONIC`) is not counted in the keepalive-only
    /// span. Where that cannot be told (either check without
    /// `CLOCK_MONOTONIC`, as a bare `u64` or a record saved by an older
    /// build is; readings that contradict each other) the interval counts
    /// whole, as `CLOCK_BOOTTIME` says.
    pub fn advance_as(&self, info: &TcpInfo, now: impl Into<Now>, rule: Rule) -> (Self, Interval) {
        let now = now.into();
        let now_ms = now.boot_ms;
        let fresh = || (Self::start(info, now), Interval::First);
        if info.bytes_received < self.bytes_received
            || info.bytes_acked < self.bytes_acked
            || now_ms < self.checked_ms
        {
            return fresh();
        }
        let last = Now {
            boot_ms: self.checked_ms,
            mono_ms: self.checked_mono_ms,
        };
        let suspended = crate::clock::suspended_between(last, now).unwrap_or(0);
        let bytes_in = info.bytes_received - self.bytes_received;
        let segs_in = u64::from(info.data_segs_in.wrapping_sub(self.data_segs_in));
        let bytes_out = info.bytes_acked - self.bytes_acked;
        let segs_out = u64::from(info.data_segs_out.wrapping_sub(self.data_segs_out));
        let mut next = Self {
            checked_ms: now_ms,
            checked_mono_ms: now.mono_ms,
            suspended_ms: self.suspended_ms.saturating_add(suspended),
            bytes_received: info.bytes_received,
            data_segs_in: info.data_segs_in,
            bytes_acked: info.bytes_acked,
            data_segs_out: info.data_segs_out,
            ..self.clone()
        };
        let restart = |mut n: Self, why| {
            n.since_ms = now_ms;
            n.suspended_ms = 0;
            n.keepalives = 0;
            n.keepalive_bytes = 0;
            n.first_at_ms = None;
            n.last_at_ms = 0;
            n.suspended_by_first_ms = 0;
            n.suspended_by_last_ms = 0;
            n.largest = 0;
            (n, why)
        };
        // More sent than keepalive answers: a request (an acknowledged
        // byte is one the peer took). On a control stream what the agent
        // sends says nothing of the peer's application.
        if rule == Rule::Stream && bytes_out > segs_out.max(1) * KEEPALIVE_MAX_SEGMENT {
            return restart(next, Interval::Request);
        }
        if bytes_in == 0 && segs_in == 0 {
            return (next, Interval::Silent);
        }
        // A control stream's keepalive is mirrored: every PING is answered
        // by an ACK of its size, whichever side pings, so what arrived is
        // what went out, byte for byte and segment for segment. An
        // application message is answered, if at all, by frames of other
        // sizes (a WINDOW_UPDATE, a BDP PING).
        // And what mirrors must be PINGs: an application whose own ping
        // and pong are of one size (`{"type":"ping"}`, `{"type":"pong"}`)
        // is alive, and says so.
        let pings = HTTP2_PING_WIRE.iter().any(|p| bytes_in.is_multiple_of(*p));
        if rule == Rule::Mirrored && (bytes_in != bytes_out || segs_in != segs_out || !pings) {
            return restart(next, Interval::Content);
        }
        // Bytes with no data segment counted (a kernel that does not count
        // them), or more segments than bytes (a counter that went back):
        // never called keepalive.
        if segs_in == 0 || segs_in > bytes_in {
            return restart(next, Interval::Content);
        }
        let mean = bytes_in.div_ceil(segs_in);
        let like_pings = next
            .smallest
            .is_none_or(|s| mean <= s + KEEPALIVE_SIZE_SPREAD);
        if mean > KEEPALIVE_MAX_SEGMENT || !like_pings {
            return restart(next, Interval::Content);
        }
        let arrived_at = now_ms.saturating_sub(u64::from(info.last_data_recv_ms));
        // A stream's first keepalive since content or a request: what came
        // before it was silence (the proof's to judge), not keepalive, so
        // the count starts when it arrived, as the kernel dates it (the
        // last arrival of the interval: never early). A call that thought
        // in silence, or a host that slept between two checks, then pings,
        // is given its whole bound from its first ping. A control stream's
        // count is its application's silence, which includes that.
        // The kernel's age of the arrival is in time awake (jiffies): one
        // younger than the interval's time awake dates a span that holds
        // none of the interval's suspend (the latest it can be); an older
        // one starts the span at the last check, with all of it.
        if rule == Rule::Stream && next.keepalives == 0 {
            let awake = (now_ms - self.checked_ms).saturating_sub(suspended);
            let age = u64::from(info.last_data_recv_ms);
            (next.since_ms, next.suspended_ms) = if age >= awake {
                (self.checked_ms, suspended)
            } else {
                (now_ms - age, 0)
            };
        }
        next.keepalives = next.keepalives.saturating_add(segs_in as u32);
        next.keepalive_bytes = next.keepalive_bytes.saturating_add(bytes_in);
        next.smallest = Some(next.smallest.map_or(mean, |s| s.min(mean)));
        next.largest = next.largest.max(mean);
        // An arrival is dated after the interval's suspend (its age is in
        // time awake): all the span's suspend so far had passed by it.
        if next.first_at_ms.is_none() {
            next.first_at_ms = Some(arrived_at);
            next.suspended_by_first_ms = next.suspended_ms;
        }
        next.last_at_ms = arrived_at;
        next.suspended_by_last_ms = next.suspended_ms;
        (
            next,
            Interval::Keepalive {
                segments: segs_in as u32,
                bytes: bytes_in,
            },
        )
    }

    /// The stall this record shows at `now_ms` against the bound
    /// `stall_after_ms`: at least [`MIN_KEEPALIVES`] keepalives and
    /// nothing else for at least that long.
    pub fn stalled(&self, now_ms: u64, stall_after_ms: u64) -> Option<Stall> {
        let for_ms = now_ms
            .checked_sub(self.since_ms)?
            .saturating_sub(self.suspended_ms);
        if self.keepalives < MIN_KEEPALIVES || for_ms < stall_after_ms {
            return None;
        }
        Some(Stall {
            for_ms,
            suspended_ms: self.suspended_ms,
            keepalives: self.keepalives,
            smallest: self.smallest.unwrap_or(0),
            largest: self.largest,
            spacing_ms: self.spacing_ms(),
        })
    }

    /// How long only keepalive has arrived at `now_ms`, once at least
    /// [`MIN_KEEPALIVES`] were counted: the application has sent nothing
    /// since at least then.
    pub fn keepalive_only_ms(&self, now_ms: u64) -> Option<u64> {
        (self.keepalives >= MIN_KEEPALIVES).then(|| self.awake_ms(now_ms))
    }

    /// The keepalive-only span at `now_ms` (a check's time: the last
    /// check's, for what the record knows of suspends), the machine awake:
    /// the time since `since_ms` less what it spent suspended.
    fn awake_ms(&self, now_ms: u64) -> u64 {
        now_ms
            .saturating_sub(self.since_ms)
            .saturating_sub(self.suspended_ms)
    }

    /// The mean time between the keepalives counted, where two or more
    /// were dated apart, the machine awake.
    fn spacing_ms(&self) -> Option<u64> {
        let asleep = self
            .suspended_by_last_ms
            .saturating_sub(self.suspended_by_first_ms);
        self.first_at_ms
            .map(|first| self.last_at_ms.saturating_sub(first).saturating_sub(asleep))
            .filter(|&apart| apart > 0 && self.keepalives > 1)
            .map(|apart| apart / u64::from(self.keepalives - 1))
    }

    /// How close this record is at `now_ms` to the bound `stall_after_ms`;
    /// none when no keepalive has been counted since content or a request
    /// (a connection that talks, or one that is silent: nothing to show).
    pub fn closeness(&self, now_ms: u64, stall_after_ms: u64) -> Option<Closeness> {
        if self.keepalives == 0 {
            return None;
        }
        let only_keepalive_ms = self.awake_ms(now_ms);
        Some(Closeness {
            only_keepalive_ms,
            suspended_ms: self.suspended_ms,
            keepalives: self.keepalives,
            keepalive_bytes: self.keepalive_bytes,
            keepalive_bytes_min: self.smallest.unwrap_or(0),
            keepalive_bytes_max: self.largest,
            keepalive_spacing_ms: self.spacing_ms(),
            last_keepalive_ago_ms: now_ms
                .saturating_sub(self.last_at_ms)
                .saturating_sub(self.suspended_ms.saturating_sub(self.suspended_by_last_ms)),
            stall_after_ms,
            left_ms: stall_after_ms.saturating_sub(only_keepalive_ms),
            stalled: self.stalled(now_ms, stall_after_ms).is_some(),
        })
    }
}

#[cfg(test)]
mod tests;
