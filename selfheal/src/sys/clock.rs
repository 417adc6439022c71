//! The one clock selfheal measures ages with: `CLOCK_BOOTTIME`, the clock of
//! `bpf_ktime_get_boot_ns()`. Monotonic, counts time in suspend, and does not
//! jump when someone sets the wall clock. Beside it, [`now`] reads
//! `CLOCK_MONOTONIC`, which stops in suspend: the judge tells from the two
//! how long the machine was suspended between checks.

use selfheal_core::clock::Now;

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

/// Milliseconds of `CLOCK_MONOTONIC` now, if it can be read.
pub fn mono_ms() -> Option<u64> {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).ok()?;
    let ns = (ts.tv_sec() as u64).saturating_mul(1_000_000_000) + ts.tv_nsec() as u64;
    Some(ns / 1_000_000)
}

/// The most times [`now`] reads its pair.
const PAIR_TRIES: usize = 4;

/// A check's time on both clocks, read one right after the other
/// (`CLOCK_MONOTONIC` first: never ahead of the `CLOCK_BOOTTIME` read after
/// it), and `CLOCK_MONOTONIC` once more after: where that has moved to
/// another millisecond (the thread was preempted between the reads, or a
/// millisecond ended), the pair is read again, up to `PAIR_TRIES` times,
/// so the suspend two checks' pairs tell is the clocks' rounding alone,
/// not a preemption's length. A `CLOCK_MONOTONIC` that cannot be read, or
/// reads ahead, is left out ([`Now::both`]).
pub fn now() -> Now {
    let mut tries = 0;
    loop {
        let Some(mono) = mono_ms() else {
            return Now::boot(boot_ms());
        };
        let boot = boot_ms();
        tries += 1;
        if mono_ms() == Some(mono) || tries >= PAIR_TRIES {
            return Now::both(boot, mono);
        }
    }
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

    /// Both clocks move alike while awake (a test is not suspended), and
    /// `CLOCK_MONOTONIC` is never ahead of `CLOCK_BOOTTIME`.
    #[test]
    fn both_clocks_are_read_and_move_together() {
        let a = now();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = now();
        let (ma, mb) = (a.mono_ms.expect("monotonic"), b.mono_ms.expect("monotonic"));
        assert!(ma <= a.boot_ms && mb <= b.boot_ms, "{a:?} {b:?}");
        assert!(mb >= ma + 19, "{a:?} {b:?}");
        let suspended = selfheal_core::clock::suspended_between(a, b);
        // Each reading is cut to whole ms on its own: 1 ms either way.
        assert!(suspended.is_none_or(|s| s <= 1), "{suspended:?}");
    }
}
