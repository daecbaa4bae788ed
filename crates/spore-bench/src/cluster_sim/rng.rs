//! The simulation's random numbers and its rendezvous hash.
//!
//! The bench crate depends on no random number crate, and the simulation
//! needs no more than a small deterministic generator: SplitMix64 (Steele,
//! Lea and Flood, 2014; the generator Java's `SplittableRandom` uses and
//! xoshiro's authors recommend for seeding), seeded from `--seed`, so a run
//! is reproducible bit for bit. Each function's memory comes from a stream
//! of its own, the order of the functions' rates, the trace (arrivals,
//! execution times) and the random policies' choices from one each, so every
//! policy sees the same trace whatever it does with it.

/// SplitMix64's output function: a bijection of 64-bit values in which
/// every input bit changes every output bit with probability about 1/2.
pub(super) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// SplitMix64's increment (2^64 / the golden ratio, odd).
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The rendezvous (highest-random-weight) weight of `host` for `function`:
/// the SplitMix64 output function of `function << 32 | host`. Fixed: it
/// does not depend on `--seed`, as a deployment's hash of a function's name
/// and a node's id would not.
pub(super) fn rendezvous_weight(function: u32, host: u32) -> u64 {
    mix64((u64::from(function) << 32) | u64::from(host))
}

/// A SplitMix64 generator (and the second normal variate of the last
/// Box-Muller pair, not yet given).
#[derive(Clone, Debug)]
pub(super) struct SplitMix64 {
    state: u64,
    spare: Option<f64>,
}

impl SplitMix64 {
    /// Stream `stream` of the run seeded with `seed`: streams of one seed
    /// start far apart in the sequence and do not overlap in practice.
    pub(super) fn stream(seed: u64, stream: u64) -> SplitMix64 {
        SplitMix64 {
            state: mix64(seed ^ mix64(stream.wrapping_add(GOLDEN))),
            spare: None,
        }
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix64(self.state)
    }

    /// Uniform in (0, 1): never 0, so its logarithm is finite.
    pub(super) fn open01(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (Lemire's multiply-shift; `n` > 0).
    pub(super) fn below(&mut self, n: u32) -> u32 {
        let wide = (u128::from(self.next_u64()) * u128::from(n)) >> 64;
        #[allow(
            clippy::cast_possible_truncation,
            reason = "(x * n) >> 64 for a 64-bit x is below n, a u32"
        )]
        let v = wide as u32;
        v
    }

    /// A standard normal variate (Box-Muller: every other call makes a
    /// pair).
    pub(super) fn normal(&mut self) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        let (u, v) = (self.open01(), self.open01());
        let r = (-2.0 * u.ln()).sqrt();
        let (sin, cos) = (std::f64::consts::TAU * v).sin_cos();
        self.spare = Some(r * sin);
        r * cos
    }

    /// An exponential variate of mean `mean`.
    pub(super) fn exponential(&mut self, mean: f64) -> f64 {
        -self.open01().ln() * mean
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: Vec<u64> = (0..4)
            .map(|_| SplitMix64::stream(7, 1).next_u64())
            .collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(
            SplitMix64::stream(7, 1).next_u64(),
            SplitMix64::stream(7, 2).next_u64()
        );
        let mut r = SplitMix64::stream(1, 0);
        let n = 100_000;
        let mean = (0..n).map(|_| r.normal()).sum::<f64>() / f64::from(n);
        assert!(mean.abs() < 0.02, "{mean}");
        assert!((0..1000).all(|_| r.below(7) < 7));
    }
}
