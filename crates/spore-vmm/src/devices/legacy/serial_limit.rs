//! The serial console's output rate limit (`PUT /serial` `rate_limiter`):
//! a token bucket of bytes; what the guest writes beyond it is dropped and
//! counted, as Firecracker does, so a chatty guest cannot fill the host's
//! disk or stall on a slow sink.

use std::io::{self, Write};
use std::time::Instant;

use crate::config::TokenBucketConfig;
use crate::host_usize;

/// A byte bucket: `size` tokens refilled over `refill_ms`, plus a one-time
/// burst spent first.
#[derive(Debug)]
pub struct TokenBucket {
    size: u64,
    refill_ms: u64,
    tokens: u64,
    burst: u64,
    last: Instant,
}

impl TokenBucket {
    /// `None` for a bucket Firecracker treats as no limit.
    pub fn new(c: &TokenBucketConfig) -> Option<Self> {
        c.is_active().then(|| TokenBucket {
            size: c.size,
            refill_ms: c.refill_time,
            tokens: c.size,
            burst: c.one_time_burst.unwrap_or(0),
            last: Instant::now(),
        })
    }

    fn refill(&mut self, now: Instant) {
        let ms = now.saturating_duration_since(self.last).as_millis();
        let add = ms.saturating_mul(u128::from(self.size)) / u128::from(self.refill_ms);
        if add > 0 {
            self.tokens = u64::try_from(add)
                .unwrap_or(u64::MAX)
                .saturating_add(self.tokens)
                .min(self.size);
            self.last = now;
        }
    }

    /// Takes up to `want` tokens; returns how many it got.
    pub fn take(&mut self, want: u64, now: Instant) -> u64 {
        let from_burst = want.min(self.burst);
        self.burst -= from_burst;
        let rest = want - from_burst;
        self.refill(now);
        let got = rest.min(self.tokens);
        self.tokens -= got;
        from_burst + got
    }
}

/// A serial sink behind a bucket; `dropped` counts what did not fit.
pub struct RateLimitedOut<W> {
    inner: W,
    bucket: TokenBucket,
    pub dropped: u64,
}

impl<W: Write> RateLimitedOut<W> {
    pub fn new(inner: W, bucket: TokenBucket) -> Self {
        Self {
            inner,
            bucket,
            dropped: 0,
        }
    }
}

impl<W: Write> Write for RateLimitedOut<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let allowed = host_usize::from_u64(self.bucket.take(buf.len() as u64, Instant::now()));
        if allowed > 0 {
            self.inner.write_all(&buf[..allowed])?;
        }
        self.dropped += (buf.len() - allowed) as u64;
        // The guest's bytes are consumed either way: dropping is the limit.
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn bucket_spends_burst_then_refills_over_time() {
        let c = TokenBucketConfig {
            size: 100,
            one_time_burst: Some(50),
            refill_time: 1000,
        };
        let mut b = TokenBucket::new(&c).unwrap();
        let t0 = b.last;
        assert_eq!(b.take(120, t0), 120);
        assert_eq!(b.take(100, t0), 30);
        assert_eq!(b.take(10, t0), 0);
        assert_eq!(b.take(100, t0 + Duration::from_millis(500)), 50);
        assert!(TokenBucket::new(&TokenBucketConfig::default()).is_none());
    }

    #[test]
    fn writer_drops_what_does_not_fit() {
        let c = TokenBucketConfig {
            size: 10,
            one_time_burst: None,
            refill_time: 60_000,
        };
        let mut w = RateLimitedOut::new(Vec::new(), TokenBucket::new(&c).unwrap());
        assert_eq!(w.write(b"0123456789abcdef").unwrap(), 16);
        assert_eq!(w.inner, b"0123456789");
        assert_eq!(w.dropped, 6);
    }
}
