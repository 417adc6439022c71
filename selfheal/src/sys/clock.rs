//! The one clock selfheal measures ages with: `CLOCK_BOOTTIME`, the clock of
//! `bpf_ktime_get_boot_ns()`. Monotonic, counts time in suspend, and does not
//! jump when someone sets the wall clock.

/// Nanoseconds of `CLOCK_BOOTTIME` now.
pub fn boot_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME) {
        Ok(ts) => (ts.tv_sec() as u64).saturating_mul(1_000_000_000) + ts.tv_nsec() as u64,
        // CLOCK_BOOTTIME exists on every kernel selfheal supports (2.6.39+);
        // fall back to the monotonic clock rather than failing.
        Err(_) => {
            let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
                .unwrap_or(nix::sys::time::TimeSpec::new(0, 0));
            (ts.tv_sec() as u64).saturating_mul(1_000_000_000) + ts.tv_nsec() as u64
        }
    }
}

/// Milliseconds of `CLOCK_BOOTTIME` now: the `now_ms` judgements and
/// proofs are timed with.
pub fn boot_ms() -> u64 {
    boot_ns() / 1_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_clock_moves_forward() {
        let a = boot_ns();
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert!(boot_ns() >= a + 4_000_000);
    }
}
