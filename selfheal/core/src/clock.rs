//! Ages on the one clock selfheal measures with (`CLOCK_BOOTTIME`, read by
//! `selfheal::sys::clock`): pure arithmetic on its readings.

/// Milliseconds from `since_ns` to `now_ns`, 0 if `since_ns` is later.
pub fn age_ms(now_ns: u64, since_ns: u64) -> u64 {
    now_ns.saturating_sub(since_ns) / 1_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_never_go_negative() {
        assert_eq!(age_ms(5_000_000, 1_000_000), 4);
        assert_eq!(age_ms(1_000_000, 5_000_000), 0);
    }
}
