//! Ages on the one clock selfheal measures with (`CLOCK_BOOTTIME`, read by
//! `selfheal::sys::clock`): pure arithmetic on its readings, and the one
//! conversion of a configured duration to the milliseconds it is compared
//! in. Beside it, a check reads `CLOCK_MONOTONIC`, which stops while the
//! machine is suspended: the two readings together ([`Now`]) tell how long
//! it was suspended between two checks ([`suspended_between`]), for the
//! one measure that counts only time awake (a stream's keepalive-only
//! span, [`crate::progress`]).

use std::time::Duration;

/// A check's time: `CLOCK_BOOTTIME` ms, what every stamp and age is in,
/// and `CLOCK_MONOTONIC` ms read with it, none where it was not read.
/// While the machine is awake both advance alike; in suspend (a laptop's
/// lid, a paused VM) only `CLOCK_BOOTTIME` does, so its lead over
/// `CLOCK_MONOTONIC` is the time spent suspended since boot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Now {
    pub boot_ms: u64,
    pub mono_ms: Option<u64>,
}

impl Now {
    /// `CLOCK_BOOTTIME` alone: nothing is known of suspends.
    pub fn boot(boot_ms: u64) -> Self {
        Self {
            boot_ms,
            mono_ms: None,
        }
    }

    /// Both readings. A `CLOCK_MONOTONIC` ahead of `CLOCK_BOOTTIME` (which
    /// never is: `CLOCK_BOOTTIME` is `CLOCK_MONOTONIC` plus the time
    /// suspended) is a reading not to trust, and is dropped.
    pub fn both(boot_ms: u64, mono_ms: u64) -> Self {
        Self {
            boot_ms,
            mono_ms: (mono_ms <= boot_ms).then_some(mono_ms),
        }
    }
}

/// `CLOCK_BOOTTIME` ms alone ([`Now::boot`]).
impl From<u64> for Now {
    fn from(boot_ms: u64) -> Self {
        Self::boot(boot_ms)
    }
}

/// How long the machine was suspended between readings `before` and
/// `after`: how much further `CLOCK_BOOTTIME` moved than
/// `CLOCK_MONOTONIC`. None when that cannot be told: either reading lacks
/// `CLOCK_MONOTONIC` or has it ahead of `CLOCK_BOOTTIME`, either clock went
/// back, or `CLOCK_BOOTTIME` moved less than `CLOCK_MONOTONIC` (no machine
/// does that; the caller then counts as if there had been no suspend).
/// A lead under [`SUSPEND_FLOOR_MS`] is 0: the two clocks are read one
/// after the other and each cut to whole ms, so awake they drift apart by a
/// millisecond now and then.
pub fn suspended_between(before: Now, after: Now) -> Option<u64> {
    let (b0, m0) = (before.boot_ms, before.mono_ms?);
    let (b1, m1) = (after.boot_ms, after.mono_ms?);
    if m0 > b0 || m1 > b1 {
        return None;
    }
    let boot = b1.checked_sub(b0)?;
    let mono = m1.checked_sub(m0)?;
    let lead = boot.checked_sub(mono)?;
    Some(if lead < SUSPEND_FLOOR_MS { 0 } else { lead })
}

/// The least lead of `CLOCK_BOOTTIME` over `CLOCK_MONOTONIC` between two
/// checks taken for a suspend. Below it the lead is the readings' rounding
/// (1 ms, read apart by microseconds); a real suspend lasts seconds, and
/// one under a second changes no stall bound (those are tens of seconds).
pub const SUSPEND_FLOOR_MS: u64 = 1_000;

/// Milliseconds from `since_ns` to `now_ns`, 0 if `since_ns` is later.
pub fn age_ms(now_ns: u64, since_ns: u64) -> u64 {
    now_ns.saturating_sub(since_ns) / 1_000_000
}

/// `d` in whole milliseconds, saturating: a duration too long to count in
/// a `u64` of ms (a config value of 18446744073709557s) is `u64::MAX`,
/// forever, never a short one wrapped around. Every threshold, window and
/// timeout is compared in this unit, and every deadline built from one is a
/// saturating add.
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_never_go_negative() {
        assert_eq!(age_ms(5_000_000, 1_000_000), 4);
        assert_eq!(age_ms(1_000_000, 5_000_000), 0);
    }

    #[test]
    fn a_suspend_is_boottimes_lead_over_monotonic_and_bad_readings_none() {
        let at = |b, m| Now::both(b, m);
        // Awake for 2 s: no suspend.
        assert_eq!(
            suspended_between(at(10_000, 9_000), at(12_000, 11_000)),
            Some(0)
        );
        // The readings' rounding (1 or 2 ms), or a pause under the floor:
        // no suspend. At the floor: one.
        for lead in [1, 2, SUSPEND_FLOOR_MS - 1] {
            assert_eq!(
                suspended_between(at(10_000, 9_000), at(12_000 + lead, 11_000)),
                Some(0),
                "{lead}"
            );
        }
        assert_eq!(
            suspended_between(at(10_000, 9_000), at(12_000 + SUSPEND_FLOOR_MS, 11_000)),
            Some(SUSPEND_FLOOR_MS)
        );
        // An hour suspended within 2 s awake.
        assert_eq!(
            suspended_between(at(10_000, 9_000), at(3_612_000, 11_000)),
            Some(3_600_000)
        );
        for (before, after, what) in [
            (Now::boot(10_000), at(12_000, 11_000), "no monotonic before"),
            (at(10_000, 9_000), Now::boot(12_000), "no monotonic now"),
            (at(10_000, 9_000), at(12_000, 8_000), "monotonic went back"),
            (at(10_000, 9_000), at(9_500, 9_500), "boottime went back"),
            (at(10_000, 9_000), at(11_000, 11_000), "boottime moved less"),
            (
                Now {
                    boot_ms: 1_000,
                    mono_ms: Some(9_000),
                },
                at(12_000, 11_000),
                "boottime behind monotonic before",
            ),
            (
                at(10_000, 9_000),
                Now {
                    boot_ms: 12_000,
                    mono_ms: Some(u64::MAX),
                },
                "boottime behind monotonic now",
            ),
            (at(0, 0), at(u64::MAX, 0), "the most there is"),
        ] {
            let got = suspended_between(before, after);
            if what == "the most there is" {
                assert_eq!(got, Some(u64::MAX), "{what}");
            } else {
                assert_eq!(got, None, "{what}");
            }
        }
        // A reading with monotonic ahead is boottime's alone.
        assert_eq!(Now::both(1_000, 2_000), Now::boot(1_000));
    }

    #[test]
    fn durations_in_ms_saturate() {
        for (d, want) in [
            (Duration::ZERO, 0),
            (Duration::from_micros(1_999), 1),
            (Duration::from_secs(90), 90_000),
            (Duration::from_millis(u64::MAX), u64::MAX),
            // 18446744073709557 s is 18446744073709557000 ms: `as u64`
            // wrapped it to 5384 ms.
            (Duration::from_secs(18_446_744_073_709_557), u64::MAX),
            (Duration::MAX, u64::MAX),
        ] {
            assert_eq!(ms(d), want, "{d:?}");
        }
        assert_eq!(
            (Duration::from_secs(18_446_744_073_709_557).as_millis() as u64),
            5_384,
            "the wrap this guards against"
        );
    }
}
