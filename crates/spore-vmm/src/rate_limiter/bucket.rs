//! One token bucket: Firecracker's `TokenBucket` semantics.
//!
//! A bucket holds up to `size` tokens and refills at `size / refill_time`
//! (linearly, computed from elapsed time, never by a ticking thread). An
//! optional `one_time_burst` is spent first and never refills. A request
//! for more tokens than the bucket can ever hold is let through when the
//! bucket is full and leaves it in debt: later requests wait until the
//! refill has paid the debt, so the long-run rate is still the configured
//! one (Firecracker lets such a request "over-consume" the same way).

use serde::{Deserialize, Serialize};

use crate::config::TokenBucketConfig;

const NS_PER_MS: u128 = 1_000_000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenBucket {
    size: u64,
    refill_time_ms: u64,
    /// Burst tokens left (never refilled).
    one_time_burst: u64,
    /// Tokens available now; negative while paying back an over-consumption.
    budget: i128,
    /// Time (ns, [`crate::host::monotonic_ns`] scale) the budget was last updated.
    last_update_ns: u64,
    /// Refill remainder (token·ns) so slow refills do not lose fractions.
    carry: u128,
}

/// What a bucket's snapshot keeps: its shape and what was left in it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenBucketState {
    pub size: u64,
    pub refill_time_ms: u64,
    pub one_time_burst: u64,
    pub budget: i64,
}

impl TokenBucket {
    /// `None` when the configuration disables the bucket (size or refill
    /// time 0, as in Firecracker). A fresh bucket starts full.
    pub fn new(cfg: &TokenBucketConfig, now_ns: u64) -> Option<TokenBucket> {
        if cfg.size == 0 || cfg.refill_time == 0 {
            return None;
        }
        Some(TokenBucket {
            size: cfg.size,
            refill_time_ms: cfg.refill_time,
            one_time_burst: cfg.one_time_burst.unwrap_or(0),
            budget: i128::from(cfg.size),
            last_update_ns: now_ns,
            carry: 0,
        })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn one_time_burst(&self) -> u64 {
        self.one_time_burst
    }

    /// Tokens available now (after a refill up to `now_ns`), burst excluded.
    pub fn budget(&mut self, now_ns: u64) -> i128 {
        self.refill(now_ns);
        self.budget
    }

    fn refill(&mut self, now_ns: u64) {
        let elapsed = u128::from(now_ns.saturating_sub(self.last_update_ns));
        self.last_update_ns = self.last_update_ns.max(now_ns);
        if self.budget >= i128::from(self.size) {
            self.carry = 0;
            return;
        }
        // tokens = elapsed_ns * size / refill_ns, with the remainder kept.
        let refill_ns = u128::from(self.refill_time_ms) * NS_PER_MS;
        let scaled = elapsed * u128::from(self.size) + self.carry;
        let tokens = scaled / refill_ns;
        self.carry = scaled % refill_ns;
        let tokens = i128::try_from(tokens).unwrap_or(i128::MAX);
        self.budget = self
            .budget
            .saturating_add(tokens)
            .min(i128::from(self.size));
        if self.budget == i128::from(self.size) {
            self.carry = 0;
        }
    }

    /// Takes `tokens` if available now; `false` leaves the bucket as it was.
    pub fn try_consume(&mut self, tokens: u64, now_ns: u64) -> bool {
        self.refill(now_ns);
        let from_burst = tokens.min(self.one_time_burst);
        let rest = i128::from(tokens - from_burst);
        if rest == 0 {
            self.one_time_burst -= from_burst;
            return true;
        }
        let full = self.budget >= i128::from(self.size);
        if self.budget >= rest || (rest > i128::from(self.size) && full) {
            self.one_time_burst -= from_burst;
            self.budget -= rest;
            return true;
        }
        false
    }

    /// Gives back tokens taken by [`Self::try_consume`] (the request was
    /// refused by another bucket), up to the bucket's size.
    pub fn give_back(&mut self, tokens: u64) {
        self.budget = self
            .budget
            .saturating_add(i128::from(tokens))
            .min(i128::from(self.size));
    }

    /// Nanoseconds until `tokens` can be taken (0 if now), assuming no one
    /// else takes any.
    pub fn wait_ns(&mut self, tokens: u64, now_ns: u64) -> u64 {
        self.refill(now_ns);
        let need =
            i128::from(tokens.saturating_sub(self.one_time_burst)).min(i128::from(self.size));
        let missing = need - self.budget;
        if missing <= 0 {
            return 0;
        }
        let refill_ns = u128::from(self.refill_time_ms) * NS_PER_MS;
        let missing = missing.unsigned_abs();
        let ns = (missing * refill_ns)
            .saturating_sub(self.carry)
            .div_ceil(u128::from(self.size));
        u64::try_from(ns).unwrap_or(u64::MAX)
    }

    pub fn save(&self) -> TokenBucketState {
        TokenBucketState {
            size: self.size,
            refill_time_ms: self.refill_time_ms,
            one_time_burst: self.one_time_burst,
            budget: i64::try_from(self.budget).unwrap_or(i64::MIN),
        }
    }

    /// A bucket as saved; refilling starts again at `now_ns` (time the VM
    /// spent saved does not count, as in Firecracker).
    pub fn restore(state: &TokenBucketState, now_ns: u64) -> Option<TokenBucket> {
        if state.size == 0 || state.refill_time_ms == 0 {
            return None;
        }
        Some(TokenBucket {
            size: state.size,
            refill_time_ms: state.refill_time_ms,
            one_time_burst: state.one_time_burst,
            budget: i128::from(state.budget).min(i128::from(state.size)),
            last_update_ns: now_ns,
            carry: 0,
        })
    }
}
