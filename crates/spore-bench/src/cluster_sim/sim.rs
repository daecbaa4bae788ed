//! The event loop and the placement policies.
//!
//! Events sit in one queue ([`RadixHeap`]) keyed by their time in ns: the
//! next invocation of the workload's trace (one pending: the one after it
//! is drawn when it is taken), an invocation's end, a host's keep-alive
//! check (one pending per host, at its oldest idle instance's expiry) and
//! its zygote check (one pending per host, at its least recently invoked
//! zygote's expiry).

use std::cmp::Reverse;
use std::time::Instant;

use super::hosts::{Cluster, Start};
use super::queue::RadixHeap;
use super::rng::{rendezvous_weight, SplitMix64};
use super::workload::Workload;
use super::{secs_to_ns, Config, Policy, START_MS};

/// Event kinds, in the top bits of an event; the index below them.
const KIND_SHIFT: u32 = 60;
const END: u64 = 0;
const ARRIVAL: u64 = 1;
const HOST_CHECK: u64 = 2;
const ZYGOTE_CHECK: u64 = 3;
const INDEX_MASK: u64 = (1 << KIND_SHIFT) - 1;

/// Random draws before the random policies scan every host for one that
/// can take the start.
const RANDOM_TRIES: u32 = 8;

/// The placement random stream (function streams are 0..functions; the
/// trace's is 1 << 41).
const PLACEMENT_STREAM: u64 = 1 << 40;

/// What one policy's run gave.
#[derive(Clone, Debug)]
pub(super) struct Outcome {
    pub(super) policy: Policy,
    /// Invocations arrived; starts per [`Start`]; invocations no host
    /// could take.
    pub(super) invocations: u64,
    pub(super) starts: [u64; 4],
    pub(super) rejected: u64,
    /// Per host: (held KiB·s, busy KiB·s, peak held KiB).
    pub(super) memory: Vec<(f64, f64, u64)>,
    /// Per function: invocations, and hosts it had an instance on.
    pub(super) invocations_per_function: Vec<u64>,
    pub(super) hosts_per_function: Vec<u32>,
    pub(super) evicted_instances: u64,
    pub(super) evicted_zygotes: u64,
    pub(super) wall_s: f64,
}

struct Sim<'a> {
    cfg: &'a Config,
    w: &'a Workload,
    policy: Policy,
    cluster: Cluster,
    queue: RadixHeap,
    trace: SplitMix64,
    placement: SplitMix64,
    /// Per function, hosts by descending rendezvous weight (made at its
    /// first invocation).
    ranking: Vec<Option<Box<[u32]>>>,
    starts: [u64; 4],
    rejected: u64,
    invocations: Vec<u64>,
    /// Per function, a bitset of the hosts it had an instance on.
    touched: Vec<u64>,
    words: usize,
}

/// Runs one policy over the workload.
pub(super) fn simulate(cfg: &Config, w: &Workload, policy: Policy) -> Outcome {
    let t0 = Instant::now();
    let nf = w.functions.len();
    let words = (cfg.hosts as usize).div_ceil(64);
    let mut sim = Sim {
        cfg,
        w,
        policy,
        cluster: Cluster::new(
            cfg.hosts,
            cfg.host_memory_kib,
            &w.functions,
            cfg.keep_alive_ns,
            cfg.zygote_keep_alive_ns,
        ),
        queue: RadixHeap::new(),
        trace: w.trace(),
        placement: SplitMix64::stream(cfg.seed, PLACEMENT_STREAM),
        ranking: vec![None; nf],
        starts: [0; 4],
        rejected: 0,
        invocations: vec![0; nf],
        touched: vec![0; nf * words],
        words,
    };
    sim.draw_next(0);
    sim.run();
    let hosts_per_function = sim
        .touched
        .chunks(words.max(1))
        .map(|c| c.iter().map(|w| w.count_ones()).sum())
        .collect();
    Outcome {
        policy,
        invocations: sim.invocations.iter().sum(),
        starts: sim.starts,
        rejected: sim.rejected,
        memory: sim.cluster.memory(cfg.duration_ns),
        invocations_per_function: sim.invocations,
        hosts_per_function,
        evicted_instances: sim.cluster.evicted_instances,
        evicted_zygotes: sim.cluster.evicted_zygotes,
        wall_s: t0.elapsed().as_secs_f64(),
    }
}

impl Sim<'_> {
    fn push(&mut self, t: u64, kind: u64, index: usize) {
        self.queue.push(t, (kind << KIND_SHIFT) | index as u64);
    }

    /// Queues the invocation after one at `now`, if it comes before the end.
    fn draw_next(&mut self, now: u64) {
        let (gap, f) = self.w.next_invocation(&mut self.trace);
        let at = now.saturating_add(secs_to_ns(gap));
        if at < self.cfg.duration_ns {
            self.push(at, ARRIVAL, f);
        }
    }

    fn run(&mut self) {
        while let Some((now, ev)) = self.queue.pop() {
            if now > self.cfg.duration_ns {
                break;
            }
            let index = ev & INDEX_MASK;
            #[allow(
                clippy::cast_possible_truncation,
                reason = "an event's index is a function, instance or host index, a usize when pushed"
            )]
            let i = index as usize;
            match ev >> KIND_SHIFT {
                END => {
                    let id = u32::try_from(index).unwrap_or(u32::MAX);
                    if let Some((t, h)) = self.cluster.end_exec(now, id) {
                        self.push(t, HOST_CHECK, h as usize);
                    }
                }
                ARRIVAL => {
                    self.arrival(now, i);
                    self.draw_next(now);
                }
                HOST_CHECK => {
                    let h = u32::try_from(index).unwrap_or(0);
                    if let Some(t) = self.cluster.expire(now, h) {
                        self.push(t, HOST_CHECK, i);
                    }
                }
                _ => {
                    let h = u32::try_from(index).unwrap_or(0);
                    if let Some(t) = self.cluster.expire_zygotes(now, h) {
                        self.push(t, ZYGOTE_CHECK, i);
                    }
                }
            }
        }
    }

    fn arrival(&mut self, now: u64, f: usize) {
        let exec = self.w.exec_s(&mut self.trace);
        self.invocations[f] += 1;
        let fu = u32::try_from(f).unwrap_or(u32::MAX);
        let Some(h) = self.place(fu) else {
            self.rejected += 1;
            return;
        };
        let (kind, id, zygote_check) = match self.cluster.take_warm(now, fu, h) {
            Some(id) => (Start::Warm, id, None),
            None => self.cluster.start_new(now, fu, h),
        };
        self.cluster.invoked(now, fu, h);
        self.starts[kind as usize] += 1;
        self.touched[f * self.words + h as usize / 64] |= 1 << (h % 64);
        let busy = START_MS[kind as usize] / 1e3 + exec;
        self.push(now.saturating_add(secs_to_ns(busy)), END, id as usize);
        if let Some(t) = zygote_check {
            self.push(t, ZYGOTE_CHECK, h as usize);
        }
    }

    /// The host an invocation of `f` starts on; `None` when no host has an
    /// idle instance of it or room for one.
    fn place(&mut self, f: u32) -> Option<u32> {
        match self.policy {
            Policy::Rendezvous => self.place_rendezvous(f),
            Policy::Random => self.place_random(f),
            Policy::TwoChoices => self.place_two_choices(f),
        }
    }

    fn can_take(&self, f: u32, h: u32) -> bool {
        self.cluster.has_idle(f, h) || self.cluster.fits(h, &self.w.functions[f as usize])
    }

    /// The first of the top `--spread` hosts by rendezvous weight with an
    /// idle instance; else the first of them with room; else the first
    /// host further down the ranking with either.
    fn place_rendezvous(&mut self, f: u32) -> Option<u32> {
        let hosts = self.cfg.hosts;
        let ranking = self.ranking[f as usize].get_or_insert_with(|| {
            let mut r: Vec<u32> = (0..hosts).collect();
            r.sort_by_key(|&h| Reverse((rendezvous_weight(f, h), h)));
            r.into_boxed_slice()
        });
        let k = (self.cfg.spread as usize).min(ranking.len());
        let (top, rest) = ranking.split_at(k);
        let function = &self.w.functions[f as usize];
        top.iter()
            .copied()
            .find(|&h| self.cluster.has_idle(f, h))
            .or_else(|| {
                top.iter()
                    .copied()
                    .find(|&h| self.cluster.fits(h, function))
            })
            .or_else(|| {
                rest.iter()
                    .copied()
                    .find(|&h| self.cluster.has_idle(f, h) || self.cluster.fits(h, function))
            })
    }

    /// A uniformly random host of those that can take the start.
    fn place_random(&mut self, f: u32) -> Option<u32> {
        for _ in 0..RANDOM_TRIES {
            let h = self.placement.below(self.cfg.hosts);
            if self.can_take(f, h) {
                return Some(h);
            }
        }
        let able: Vec<u32> = (0..self.cfg.hosts)
            .filter(|&h| self.can_take(f, h))
            .collect();
        let n = u32::try_from(able.len()).ok().filter(|&n| n > 0)?;
        Some(able[self.placement.below(n) as usize])
    }

    /// Two distinct random hosts; the one with more unreserved memory if it
    /// can take the start, else the other; else as `random`.
    fn place_two_choices(&mut self, f: u32) -> Option<u32> {
        let n = self.cfg.hosts;
        let a = self.placement.below(n);
        let b = if n > 1 {
            let b = self.placement.below(n - 1);
            if b >= a {
                b + 1
            } else {
                b
            }
        } else {
            a
        };
        let (first, second) = if self.cluster.unreserved(a) >= self.cluster.unreserved(b) {
            (a, b)
        } else {
            (b, a)
        };
        [first, second]
            .into_iter()
            .find(|&h| self.can_take(f, h))
            .or_else(|| self.place_random(f))
    }
}
