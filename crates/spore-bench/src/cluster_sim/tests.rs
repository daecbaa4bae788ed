use super::sim::{simulate, Outcome};
use super::workload::{Function, Workload};
use super::*;

fn cfg(hosts: u32, functions: u32, secs: f64, seed: u64) -> Config {
    Config {
        hosts,
        functions,
        duration_ns: secs_to_ns(secs),
        seed,
        host_memory_kib: 24 * 1024 * 1024,
        keep_alive_ns: secs_to_ns(60.0),
        zygote_keep_alive_ns: secs_to_ns(600.0),
        spread: 2,
        exec_sigma: 1.0,
    }
}

/// What a run must reproduce (all but its wall time).
fn figures(o: &Outcome) -> impl PartialEq + std::fmt::Debug {
    (
        o.invocations,
        o.starts,
        o.rejected,
        o.memory.clone(),
        o.hosts_per_function.clone(),
        o.evicted_instances,
        o.evicted_zygotes,
    )
}

#[test]
fn a_seed_gives_the_same_run() {
    let c = cfg(10, 400, 900.0, 7);
    let (_, a) = simulate_all(&c, &Policy::ALL);
    let (_, b) = simulate_all(&c, &Policy::ALL);
    assert_eq!(a.len(), 3);
    for (x, y) in a.iter().zip(&b) {
        assert!(x.invocations > 1000, "{}", x.invocations);
        assert_eq!(figures(x), figures(y));
    }
    // Every policy sees the same trace; another seed makes another.
    assert!(a.iter().all(|o| o.invocations == a[0].invocations));
    let (_, other) = simulate_all(&cfg(10, 400, 900.0, 8), &[Policy::Random]);
    assert_ne!(other[0].invocations, a[0].invocations);
}

#[test]
fn rendezvous_keeps_a_function_on_its_spread_random_spreads_it() {
    // One function, 5 invocations/s of ~0.6 s: a few instances at a time,
    // room for all of them on any host.
    let w = Workload::of(
        vec![Function {
            rate_per_s: 5.0,
            mem_kib: 128 * 1024,
        }],
        3,
        1.0,
    );
    let c = cfg(20, 1, 600.0, 3);
    for spread in [1, 2, 3] {
        let o = simulate(
            &Config {
                spread,
                ..c.clone()
            },
            &w,
            Policy::Rendezvous,
        );
        assert!(o.invocations > 2000);
        assert!(
            o.hosts_per_function[0] <= spread,
            "spread {spread}: {} hosts",
            o.hosts_per_function[0]
        );
        // Its instances stay warm: one cold start per host it touched.
        assert_eq!(o.starts[3], u64::from(o.hosts_per_function[0]));
    }
    for p in [Policy::Random, Policy::TwoChoices] {
        let o = simulate(&c, &w, p);
        assert!(
            o.hosts_per_function[0] >= 15,
            "{p:?}: {}",
            o.hosts_per_function[0]
        );
    }
}

#[test]
fn rates_sum_to_one_and_starts_add_up() {
    let c = cfg(8, 300, 600.0, 11);
    let (_, outcomes) = simulate_all(&c, &Policy::ALL);
    for o in &outcomes {
        assert_eq!(o.starts.iter().sum::<u64>() + o.rejected, o.invocations);
        let j = policy_json(o, &c);
        let sum: f64 = ["warm", "clone", "restore", "cold", "rejected"]
            .iter()
            .map(|k| j["rates"][k].as_f64().unwrap())
            .sum();
        assert!((sum - 1.0).abs() < 1e-9, "{sum}");
        let p50 = j["start_ms"]["p50"].as_f64().unwrap();
        assert!(START_MS.contains(&p50));
    }
}

#[test]
fn a_full_host_evicts_and_never_holds_more_than_its_memory() {
    // 1 GiB hosts: a few instances each, so starts must end idle ones.
    let c = Config {
        host_memory_kib: 1024 * 1024,
        ..cfg(4, 200, 600.0, 5)
    };
    let (_, outcomes) = simulate_all(&c, &Policy::ALL);
    for o in &outcomes {
        assert!(o.evicted_instances > 0, "{:?}", o.policy);
        assert!(o.memory.iter().all(|m| m.2 <= c.host_memory_kib));
        assert_eq!(o.starts.iter().sum::<u64>() + o.rejected, o.invocations);
    }
}

#[test]
fn start_percentiles_by_nearest_rank() {
    assert_eq!(start_percentile(&[99, 0, 0, 1], 0.5), WARM_MS);
    assert_eq!(start_percentile(&[98, 0, 0, 2], 0.99), COLD_MS);
    assert_eq!(start_percentile(&[0, 1, 1, 0], 0.0), CLONE_MS);
    assert!(start_percentile(&[0; 4], 0.5).is_nan());
}

#[test]
fn normal_quantiles() {
    use super::workload::normal_quantile;
    for (p, z) in [
        (0.5, 0.0),
        (0.975, 1.959_963_985),
        (0.01, -2.326_347_874),
        (0.81, 0.877_896_295),
        (1e-5, -4.264_890_794),
    ] {
        assert!(
            (normal_quantile(p) - z).abs() < 1e-8,
            "{p}: {}",
            normal_quantile(p)
        );
    }
}

#[test]
fn the_workload_has_the_published_shape() {
    let w = Workload::generate(20_000, 1, 1.0);
    let s = w.shape();
    let f = |k: &str| s[k].as_f64().unwrap();
    assert!((f("functions_below_1_per_hour") - 0.45).abs() < 0.02);
    assert!((f("functions_below_1_per_minute") - 0.81).abs() < 0.02);
    assert!(f("invocation_share_top_2pct") > 0.85);
    let mems: Vec<u64> = w.functions.iter().map(|f| f.mem_kib / 1024).collect();
    assert!(mems.iter().all(|m| (64..=256).contains(m) && m % 32 == 0));
}

#[test]
fn without_a_mode_it_asks_for_one() {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: ClusterBenchArgs,
    }
    let err = run(Cli::parse_from(["x"]).a).unwrap_err().to_string();
    assert!(
        err.contains("--simulate") && err.contains("--forwarding"),
        "{err}"
    );
    assert!(Cli::try_parse_from(["x", "--simulate", "--forwarding"]).is_err());
    let a = Cli::parse_from(["x", "--simulate", "--spread", "0"]).a;
    assert!(Config::of(&a).is_err());
    let a = Cli::parse_from(["x", "--simulate", "--policy", "two-choices"]).a;
    assert_eq!(a.policy, Some(Policy::TwoChoices));
    assert!(Config::of(&a).is_ok());
}

#[test]
fn zygotes_expire_after_their_keep_alive_unless_kept() {
    // One function invoked every 20 minutes on average, on one host: its
    // zygote outlives most gaps only when zygotes are kept.
    let w = Workload::of(
        vec![Function {
            rate_per_s: 1.0 / 1200.0,
            mem_kib: 64 * 1024,
        }],
        9,
        1.0,
    );
    let c = Config {
        spread: 1,
        ..cfg(4, 1, 100_000.0, 9)
    };
    let expiring = simulate(&c, &w, Policy::Rendezvous);
    assert!(expiring.invocations > 40, "{}", expiring.invocations);
    assert_eq!(expiring.starts[3], 1, "one cold boot, then its snapshot");
    assert!(expiring.starts[2] > 10, "{:?}", expiring.starts);
    let kept = Config {
        zygote_keep_alive_ns: super::hosts::NEVER,
        ..c
    };
    let kept = simulate(&kept, &w, Policy::Rendezvous);
    assert_eq!(kept.starts[2], 0, "{:?}", kept.starts);
    assert_eq!(kept.starts[3], 1);
    assert_eq!(kept.hosts_per_function[0], 1);
}
