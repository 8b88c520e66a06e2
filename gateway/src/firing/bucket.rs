//! A token bucket per function ([`TokenBucket`]): a trigger's `rate`, in the dispatcher's
//! memory.
//!
//! Must not know: the table, the clock (times are passed in).

/// A token bucket that lends: a request always gets a time, now when a token is there,
/// otherwise when its (reserved) token will be.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenBucket {
    per_s: f64,
    burst: f64,
    /// Tokens at `at_ms`; negative when tokens are lent ahead.
    tokens: f64,
    at_ms: u64,
}

impl TokenBucket {
    /// A full bucket at `now_ms`.
    pub fn new(per_s: f64, burst: u32, now_ms: u64) -> TokenBucket {
        let burst = f64::from(burst.max(1));
        TokenBucket { per_s: per_s.max(1e-9), burst, tokens: burst, at_ms: now_ms }
    }

    /// Takes one token and returns when it may be used: `now_ms`, or later when the bucket
    /// is empty (the token is reserved: the caller waits, and no one else gets it).
    pub fn reserve(&mut self, now_ms: u64) -> u64 {
        if now_ms > self.at_ms {
            let refill = (now_ms - self.at_ms) as f64 / 1000.0 * self.per_s;
            self.tokens = (self.tokens + refill).min(self.burst);
            self.at_ms = now_ms;
        }
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            now_ms
        } else {
            let wait_ms = (-self.tokens / self.per_s * 1000.0).ceil();
            now_ms.saturating_add(if wait_ms.is_finite() { wait_ms as u64 } else { u64::MAX / 2 })
        }
    }

    pub(super) fn same_limit(&self, per_s: f64, burst: u32) -> bool {
        self.per_s.to_bits() == per_s.max(1e-9).to_bits() && self.burst == f64::from(burst.max(1))
    }
}
