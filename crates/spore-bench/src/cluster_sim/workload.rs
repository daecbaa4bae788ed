//! The simulated functions: a mean invocation rate, a memory size and an
//! execution-time distribution each, drawn to the shape the Azure Functions
//! 2019 trace's published distributions have (Shahrad et al., "Serverless in
//! the Wild", USENIX ATC 2020). The module documentation of
//! [`super`] states the fits.

use super::rng::SplitMix64;

/// The log-normal of per-function mean rates through the paper's "45% of
/// functions are invoked at most once an hour, 81% at most once a minute":
/// (median rate per hour, σ of the natural logarithm). σ = ln 60 / (z₀.₈₁ −
/// z₀.₄₅) ≈ 4.08; median = e^(−z₀.₄₅·σ) ≈ 1.67 invocations an hour.
pub(super) fn rate_fit() -> (f64, f64) {
    let (z45, z81) = (normal_quantile(0.45), normal_quantile(0.81));
    let sigma = 60f64.ln() / (z81 - z45);
    ((-z45 * sigma).exp(), sigma)
}

/// The standard normal quantile (Acklam's rational approximation, relative
/// error below 1.2e-9), `p` in (0, 1).
pub(super) fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    const P_LOW: f64 = 0.024_25;
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < P_LOW {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - P_LOW {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

/// Median execution time of an invocation (s), and its cap.
pub(super) const EXEC_MEDIAN_S: f64 = 0.6;
pub(super) const EXEC_CAP_S: f64 = 60.0;

/// Instance memory: 64 to 256 MiB in steps of 32, uniformly (median 160
/// MiB ≈ 168 MB, the paper's "50% of applications allocate at most 170 MB").
const MEM_MIN_MIB: u64 = 64;
const MEM_STEP_MIB: u64 = 32;
const MEM_STEPS: u32 = 7;

/// What a function's zygote holds on its host, as a fraction of its
/// instance memory: 1/10, an assumption (a zygote is a paused VM that has
/// run its function's initialisation once, not its invocations).
pub(super) const ZYGOTE_DIVISOR: u64 = 10;

/// One simulated function.
#[derive(Clone, Debug)]
pub(super) struct Function {
    /// Mean invocations per second (a Poisson process).
    pub(super) rate_per_s: f64,
    /// Memory of one instance (KiB).
    pub(super) mem_kib: u64,
}

impl Function {
    /// The memory a start on a host with no idle instance must find: the
    /// instance, and its zygote whether it is there (kept) or not (made).
    pub(super) fn start_kib(&self) -> u64 {
        self.mem_kib + self.mem_kib / ZYGOTE_DIVISOR
    }
}

/// The random streams of the trace and of the order of the rates
/// (function streams are 0..functions).
const TRACE_STREAM: u64 = 1 << 41;
const RATE_ORDER_STREAM: u64 = 1 << 42;

/// The functions, and the trace of their invocations: the superposition of
/// the functions' Poisson processes, a Poisson process at the sum of their
/// rates whose every arrival belongs to function f with probability
/// rate_f / sum (Walker's alias method picks it in O(1)). The same process
/// as one per function, with one pending arrival in the event queue instead
/// of one per function.
#[derive(Clone, Debug)]
pub(super) struct Workload {
    pub(super) functions: Vec<Function>,
    /// σ of an invocation's execution time (natural logarithm of seconds).
    pub(super) exec_sigma: f64,
    total_rate: f64,
    /// Alias table: function i is kept with probability `keep[i]`, else
    /// `alias[i]` is taken.
    keep: Vec<f64>,
    alias: Vec<u32>,
    seed: u64,
}

impl Workload {
    /// `n` functions drawn with `seed`. Their rates are the fit's n
    /// quantiles at (i + ½)/n, in an order the seed shuffles (stratified
    /// sampling: i.i.d. draws would make the few busiest functions, and so
    /// the cluster's load, vary twofold from seed to seed); each one's memory
    /// is drawn from its own stream.
    pub(super) fn generate(n: u32, seed: u64, exec_sigma: f64) -> Workload {
        let (median_per_h, sigma) = rate_fit();
        let mut rank: Vec<u32> = (0..n).collect();
        let mut r = SplitMix64::stream(seed, RATE_ORDER_STREAM);
        for i in (1..n).rev() {
            rank.swap(i as usize, r.below(i + 1) as usize);
        }
        let functions = rank
            .iter()
            .zip(0..n)
            .map(|(&q, f)| {
                let z = normal_quantile((f64::from(q) + 0.5) / f64::from(n));
                let mut r = SplitMix64::stream(seed, u64::from(f));
                let mem_mib = MEM_MIN_MIB + MEM_STEP_MIB * u64::from(r.below(MEM_STEPS));
                Function {
                    rate_per_s: median_per_h * (sigma * z).exp() / 3600.0,
                    mem_kib: mem_mib * 1024,
                }
            })
            .collect();
        Workload::of(functions, seed, exec_sigma)
    }

    /// These functions, the trace drawn with `seed`.
    pub(super) fn of(functions: Vec<Function>, seed: u64, exec_sigma: f64) -> Workload {
        let total_rate: f64 = functions.iter().map(|f| f.rate_per_s).sum();
        let (keep, alias) = alias_table(&functions, total_rate);
        Workload {
            functions,
            exec_sigma,
            total_rate,
            keep,
            alias,
            seed,
        }
    }

    /// The trace's random stream, at its start.
    pub(super) fn trace(&self) -> SplitMix64 {
        SplitMix64::stream(self.seed, TRACE_STREAM)
    }

    /// The next invocation: seconds after the last one, and its function.
    pub(super) fn next_invocation(&self, r: &mut SplitMix64) -> (f64, usize) {
        let gap = r.exponential(1.0 / self.total_rate);
        let n = u32::try_from(self.keep.len()).unwrap_or(u32::MAX);
        let i = r.below(n) as usize;
        let f = if r.open01() < self.keep[i] {
            i
        } else {
            self.alias[i] as usize
        };
        (gap, f)
    }

    /// One invocation's execution time (s): log-normal, capped.
    pub(super) fn exec_s(&self, r: &mut SplitMix64) -> f64 {
        (EXEC_MEDIAN_S * (self.exec_sigma * r.normal()).exp()).min(EXEC_CAP_S)
    }

    /// The workload's shape as drawn: the fraction of functions invoked
    /// less than once an hour and once a minute on average, and the share of
    /// the expected invocations that the busiest 1% and 2% of functions
    /// make.
    pub(super) fn shape(&self) -> serde_json::Value {
        let mut rates: Vec<f64> = self.functions.iter().map(|f| f.rate_per_s).collect();
        rates.sort_by(|a, b| b.total_cmp(a));
        let n = rates.len().max(1);
        let total: f64 = rates.iter().sum();
        let below = |per_s: f64| rates.iter().filter(|&&r| r < per_s).count() as f64 / n as f64;
        let top = |pct: usize| {
            let k = (n * pct).div_ceil(100);
            rates[..k.min(rates.len())].iter().sum::<f64>() / total
        };
        let (median_per_h, sigma) = rate_fit();
        serde_json::json!({
            "rate_fit": {
                "distribution": "log-normal of per-function mean invocations/s",
                "median_per_hour": median_per_h,
                "sigma_ln": sigma,
            },
            "expected_invocations_per_s": total,
            "functions_below_1_per_hour": below(1.0 / 3600.0),
            "functions_below_1_per_minute": below(1.0 / 60.0),
            "invocation_share_top_1pct": top(1),
            "invocation_share_top_2pct": top(2),
        })
    }
}

/// Vose's alias table of the functions' shares of `total` rate.
fn alias_table(functions: &[Function], total: f64) -> (Vec<f64>, Vec<u32>) {
    let n = functions.len();
    let mut keep: Vec<f64> = functions
        .iter()
        .map(|f| f.rate_per_s / total * n as f64)
        .collect();
    let mut alias: Vec<u32> = (0..n).map(|i| u32::try_from(i).unwrap_or(0)).collect();
    let (mut small, mut large): (Vec<usize>, Vec<usize>) = (0..n).partition(|&i| keep[i] < 1.0);
    while let (Some(s), Some(&l)) = (small.pop(), large.last()) {
        alias[s] = u32::try_from(l).unwrap_or(0);
        keep[l] -= 1.0 - keep[s];
        if keep[l] < 1.0 {
            large.pop();
            small.push(l);
        }
    }
    // What is left is 1 but for rounding.
    for i in small.into_iter().chain(large) {
        keep[i] = 1.0;
    }
    (keep, alias)
}
