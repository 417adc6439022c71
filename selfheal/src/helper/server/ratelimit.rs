//! The per-owner token bucket every request takes a token from, malformed
//! ones too.

use std::{collections::HashMap, sync::Mutex, time::Instant};

use super::{RateLimit, lock};

pub(super) struct RateLimiter {
    pub(super) limit: RateLimit,
    pub(super) buckets: Mutex<HashMap<u32, Bucket>>,
}

pub(super) struct Bucket {
    tokens: f64,
    at: Instant,
}

impl RateLimiter {
    /// Takes one token from `uid`'s bucket (an owner's); false when it is
    /// empty.
    pub(super) fn take(&self, uid: u32) -> bool {
        let now = Instant::now();
        let burst = f64::from(self.limit.burst.max(1));
        let rate = f64::from(self.limit.per_second);
        let refill = |b: &mut Bucket| {
            b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * rate).min(burst);
            b.at = now;
        };
        let mut buckets = lock(&self.buckets);
        if buckets.len() > 4096 {
            buckets.retain(|_, b| {
                refill(b);
                b.tokens < burst
            });
        }
        let b = buckets.entry(uid).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        refill(b);
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_rate_limit_refills() {
        let r = RateLimiter {
            limit: RateLimit {
                burst: 3,
                per_second: 20,
            },
            buckets: Mutex::default(),
        };
        assert!((0..3).all(|_| r.take(5)));
        assert!(!r.take(5));
        // Another uid has its own bucket.
        assert!(r.take(6));
        std::thread::sleep(Duration::from_millis(120));
        assert!(r.take(5));
    }
}
