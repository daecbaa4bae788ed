use super::*;

const MS: u64 = 1_000_000;

fn bucket(size: u64, burst: Option<u64>, refill_ms: u64) -> TokenBucketConfig {
    TokenBucketConfig {
        size,
        one_time_burst: burst,
        refill_time: refill_ms,
    }
}

#[test]
fn zero_size_or_refill_disables_a_bucket() {
    assert!(TokenBucket::new(&bucket(0, None, 100), 0).is_none());
    assert!(TokenBucket::new(&bucket(100, None, 0), 0).is_none());
    assert!(TokenBucket::new(&bucket(1, None, 1), 0).is_some());
}

#[test]
fn full_bucket_then_linear_refill() {
    // 1000 tokens per 100 ms: 10 tokens per ms.
    let mut b = TokenBucket::new(&bucket(1000, None, 100), 0).unwrap();
    assert!(b.try_consume(1000, 0));
    assert!(!b.try_consume(1, 0));
    assert_eq!(b.wait_ns(10, 0), MS);
    assert!(!b.try_consume(10, MS - 1));
    assert!(b.try_consume(10, MS));
    // Never above size, however long it waits.
    assert_eq!(b.budget(1_000_000 * MS), 1000);
}

#[test]
fn fractions_are_not_lost_across_many_small_refills() {
    // 3 tokens per 10 ms: looking every 1 ms must still add 3 per 10 ms.
    let mut b = TokenBucket::new(&bucket(3, None, 10), 0).unwrap();
    assert!(b.try_consume(3, 0));
    for t in 1..=10 {
        b.budget(t * MS);
    }
    assert_eq!(b.budget(10 * MS), 3);
}

#[test]
fn one_time_burst_is_spent_first_and_never_refills() {
    let mut b = TokenBucket::new(&bucket(100, Some(500), 1000), 0).unwrap();
    assert!(b.try_consume(500, 0));
    assert_eq!(b.one_time_burst(), 0);
    assert_eq!(b.budget(0), 100);
    assert!(b.try_consume(100, 0));
    assert!(!b.try_consume(1, 0));
    // A partial burst covers part of a request, the budget the rest.
    let mut b = TokenBucket::new(&bucket(100, Some(50), 1000), 0).unwrap();
    assert!(b.try_consume(120, 0));
    assert_eq!((b.one_time_burst(), b.budget(0)), (0, 30));
}

#[test]
fn refused_request_leaves_the_bucket_unchanged() {
    let mut b = TokenBucket::new(&bucket(100, Some(10), 1000), 0).unwrap();
    // The burst goes first: 10 from it, 90 from the budget.
    assert!(b.try_consume(100, 0));
    assert_eq!((b.one_time_burst(), b.budget(0)), (0, 10));
    assert!(!b.try_consume(50, 0));
    assert_eq!((b.one_time_burst(), b.budget(0)), (0, 10));
}

#[test]
fn oversized_request_passes_when_full_and_leaves_debt() {
    // A 4096-token request against a 1024-token bucket refilled every
    // 100 ms: it goes through once the bucket is full, and the next one
    // waits the 300 ms the debt takes to pay back plus its own share.
    let mut b = TokenBucket::new(&bucket(1024, None, 100), 0).unwrap();
    assert!(b.try_consume(4096, 0));
    assert_eq!(b.budget(0), 1024 - 4096);
    assert!(!b.try_consume(4096, 0));
    assert_eq!(b.wait_ns(4096, 0), 400 * MS);
    assert!(!b.try_consume(4096, 399 * MS));
    assert!(b.try_consume(4096, 400 * MS));
}

#[test]
fn limiter_takes_both_buckets_or_neither_and_arms_its_timer() {
    let cfg = RateLimiterConfig {
        bandwidth: Some(bucket(1 << 20, None, 1000)),
        ops: Some(bucket(2, None, 1000)),
    };
    let mut l = RateLimiter::new(Some(&cfg)).unwrap();
    let t = monotonic_ns();
    assert!(l.consume_at(4096, t));
    assert!(l.consume_at(4096, t));
    // Ops are spent: the bytes must be given back, the limiter blocks.
    assert!(!l.consume_at(4096, t));
    assert!(l.is_blocked());
    assert!(l.timer.is_armed().unwrap());
    assert_eq!(l.bandwidth.as_mut().unwrap().budget(t), (1 << 20) - 8192);
    // While blocked, nothing passes, even what the buckets could pay.
    assert!(!l.consume_at(0, t));
}

#[test]
fn timer_fires_and_unblocks() {
    let cfg = RateLimiterConfig {
        bandwidth: None,
        ops: Some(bucket(1, None, 20)),
    };
    let mut l = RateLimiter::new(Some(&cfg)).unwrap();
    assert!(l.consume(0));
    assert!(!l.consume(0));
    let mut pfd = libc::pollfd {
        fd: l.timer_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let start = std::time::Instant::now();
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, 2000) };
    assert_eq!(n, 1);
    assert!(start.elapsed() >= Duration::from_millis(15));
    l.on_timer();
    assert!(!l.is_blocked());
    assert!(l.consume(0));
}

#[test]
fn unlimited_limiter_always_passes() {
    let mut l = RateLimiter::new(None).unwrap();
    assert!(l.is_unlimited());
    for _ in 0..10_000 {
        assert!(l.consume(1 << 30));
    }
    assert!(l.config().is_none());
}

#[test]
fn update_replaces_given_buckets_keeps_others_and_removes_zeroes() {
    let cfg = RateLimiterConfig {
        bandwidth: Some(bucket(1000, None, 100)),
        ops: Some(bucket(10, None, 100)),
    };
    let mut l = RateLimiter::new(Some(&cfg)).unwrap();
    l.update(&RateLimiterConfig {
        bandwidth: Some(bucket(5000, Some(7), 50)),
        ops: None,
    });
    let c = l.config().unwrap();
    assert_eq!(c.bandwidth, Some(bucket(5000, Some(7), 50)));
    assert_eq!(c.ops, Some(bucket(10, None, 100)));
    l.update(&RateLimiterConfig {
        bandwidth: Some(bucket(0, None, 0)),
        ops: Some(bucket(0, None, 100)),
    });
    assert!(l.is_unlimited());
}

#[test]
fn state_round_trips_with_what_was_left() {
    let cfg = RateLimiterConfig {
        bandwidth: Some(bucket(1000, Some(300), 100)),
        ops: None,
    };
    let mut l = RateLimiter::new(Some(&cfg)).unwrap();
    assert!(l.consume(1100));
    let state = l.save();
    assert_eq!(
        state.bandwidth,
        Some(TokenBucketState {
            size: 1000,
            refill_time_ms: 100,
            one_time_burst: 0,
            budget: 200,
        })
    );
    let mut back = RateLimiter::restore(&state).unwrap();
    assert_eq!(back.save(), state);
    assert!(!back.consume(900));
}

#[test]
fn config_parses_firecrackers_shape_and_refuses_the_rest() {
    let c: RateLimiterConfig = serde_json::from_str(
        r#"{"bandwidth":{"size":1048576,"one_time_burst":0,"refill_time":1000},"ops":null}"#,
    )
    .unwrap();
    assert_eq!(c.bandwidth.unwrap().size, 1 << 20);
    assert!(c.ops.is_none());
    for bad in [
        r#"{"bandwidth":{"size":-1,"refill_time":1}}"#,
        r#"{"bandwidth":{"size":1}}"#,
        r#"{"bw":{"size":1,"refill_time":1}}"#,
        r#"{"ops":{"size":1,"refill_time":1,"x":2}}"#,
    ] {
        assert!(
            serde_json::from_str::<RateLimiterConfig>(bad).is_err(),
            "{bad}"
        );
    }
}
