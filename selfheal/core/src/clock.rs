//! Ages on the one clock selfheal measures with (`CLOCK_BOOTTIME`, read by
//! `selfheal::sys::clock`): pure arithmetic on its readings, and the one
//! conversion of a configured duration to the milliseconds it is compared
//! in.

use std::time::Duration;

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
