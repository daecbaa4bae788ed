//! The cluster catalogue against a real etcd (`super::super::test_etcd`).

use super::super::test_etcd::fresh_cluster;
use super::super::tests::sample;
use super::super::Catalog;
use super::*;

fn member(cluster: &ClusterConfig, node: &str) -> Catalog {
    let mut c = cluster.clone();
    c.node_id = node.into();
    Catalog::in_memory_member(&c).unwrap()
}

/// Polls `check` for up to 1 s (the bound for a write to reach
/// every member).
fn within_a_second(mut check: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    loop {
        if check() {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_write_on_one_member_is_read_on_another_within_a_second() {
    let cluster = fresh_cluster("a");
    let (a, b) = (member(&cluster, "a"), member(&cluster, "b"));
    let mut changes = b.take_remote_changes().unwrap();
    assert!(b.take_remote_changes().is_none(), "taken once");
    assert!(a.insert(&sample("f")).unwrap());
    // The writer reads its own write at once.
    assert_eq!(a.get("f").unwrap(), Some(sample("f")));
    assert!(within_a_second(|| b.get("f").unwrap().is_some()));
    assert_eq!(changes.try_recv().unwrap(), "f");
    let v = b.publish(&sample("f"), "from b").unwrap();
    assert_eq!(v.published, Some(1));
    assert!(within_a_second(|| a.version("f", 1).unwrap().is_some()));
    // An outcome is the same everywhere: b cannot take a's name.
    assert!(!b.insert(&sample("f")).unwrap());
    assert!(b.delete("f").unwrap());
    assert!(within_a_second(|| a.get("f").unwrap().is_none()));
    assert!(a.versions("f").unwrap().is_empty());
}

#[test]
fn concurrent_writers_agree_on_one_order() {
    let cluster = fresh_cluster("a");
    let members = [member(&cluster, "a"), member(&cluster, "b")];
    let won: Vec<usize> = std::thread::scope(|s| {
        let handles: Vec<_> = members
            .iter()
            .enumerate()
            .map(|(i, m)| {
                s.spawn(move || {
                    let mut won = 0;
                    for n in 0..15 {
                        assert!(m.insert(&sample(&format!("m{i}-{n}"))).unwrap());
                        // Both race for the same names: one wins each.
                        won += usize::from(m.insert(&sample(&format!("both-{n}"))).unwrap());
                    }
                    won
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        won.iter().sum::<usize>(),
        15,
        "each shared name inserted once"
    );
    let names =
        |c: &Catalog| -> Vec<String> { c.list().unwrap().into_iter().map(|f| f.name).collect() };
    assert!(within_a_second(
        || names(&members[0]).len() == 45 && names(&members[1]).len() == 45
    ));
    assert_eq!(names(&members[0]), names(&members[1]));
}

#[test]
fn a_restarted_member_resumes_from_its_copy() {
    let dir = std::env::temp_dir().join(format!("spore-etcd-copy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("catalog.db");
    let cluster = fresh_cluster("a");
    let a = member(&cluster, "a");
    a.insert(&sample("one")).unwrap();
    let mut c_cfg = cluster.clone();
    c_cfg.node_id = "c".into();
    {
        let c = Catalog::open_member(&path, &c_cfg).unwrap();
        assert!(c.get("one").unwrap().is_some(), "caught up on joining");
    }
    a.insert(&sample("two")).unwrap();
    a.delete("one").unwrap();
    let c = Catalog::open_member(&path, &c_cfg).unwrap();
    let names: Vec<_> = c.list().unwrap().into_iter().map(|f| f.name).collect();
    assert_eq!(names, ["two"]);
    let applied = copy_value(&c.db(), "applied").unwrap();
    assert_eq!(applied.as_deref(), Some("3"));
    drop(c);
    // A copy is not a single daemon's catalogue, nor another cluster's.
    let e = Catalog::open(&path).err().expect("refused").to_string();
    assert!(e.contains("start it with --cluster"), "{e}");
    let e = Catalog::open_member(&path, &fresh_cluster("c"))
        .err()
        .expect("refused");
    assert!(e.to_string().contains("another --state-dir"), "{e}");
    // A single daemon's functions are not silently hidden by a cluster's.
    let single = dir.join("single.db");
    Catalog::open(&single)
        .unwrap()
        .insert(&sample("mine"))
        .unwrap();
    let e = Catalog::open_member(&single, &c_cfg)
        .err()
        .expect("refused");
    assert!(e.to_string().contains("single daemon's catalogue"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Keys under `dir` in etcd.
fn keys_under(cluster: &ClusterConfig, dir: &str) -> i64 {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let mut client = cluster.connect().await.unwrap();
            let opts = GetOptions::new().with_prefix().with_count_only();
            client.get(dir, Some(opts)).await.unwrap().count()
        })
}

#[test]
fn a_compacted_log_still_brings_every_member_everything() {
    let dir = std::env::temp_dir().join(format!("spore-etcd-compact-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cluster = fresh_cluster("a");
    let a = member(&cluster, "a");
    let mut behind_cfg = cluster.clone();
    behind_cfg.node_id = "behind".into();
    let behind_path = dir.join("behind.db");
    // A member that stops early (a snapshot of its own recorded), and
    // comes back after the compaction.
    let own = crate::catalog::SnapshotRecord {
        function: "f1".into(),
        version: 1,
        dir: "/x".into(),
    };
    Catalog::open_member(&behind_path, &behind_cfg)
        .unwrap()
        .put_snapshot(&own, 1)
        .unwrap();
    for i in 0..30 {
        assert!(a.insert(&sample(&format!("f{i}"))).unwrap());
    }
    a.publish(&sample("f3"), "v1").unwrap();
    assert!(a.delete("f5").unwrap());
    assert_eq!(keys_under(&cluster, &cluster.log_dir()), 32);
    assert!(a.compact_log().unwrap());
    assert_eq!(
        keys_under(&cluster, &cluster.log_dir()),
        0,
        "the log before the base is gone"
    );
    assert!(!a.compact_log().unwrap(), "nothing new to compact");
    assert!(a.insert(&sample("after")).unwrap());
    let names =
        |c: &Catalog| -> Vec<String> { c.list().unwrap().into_iter().map(|f| f.name).collect() };
    // A new member loads the base, then the log after it.
    let fresh = member(&cluster, "fresh");
    assert_eq!(names(&fresh), names(&a));
    assert_eq!(fresh.versions("f3").unwrap(), a.versions("f3").unwrap());
    // One that was behind the base too, keeping its own tables.
    let behind = Catalog::open_member(&behind_path, &behind_cfg).unwrap();
    assert_eq!(names(&behind), names(&a));
    assert_eq!(behind.snapshots().unwrap(), vec![own]);
    assert_eq!(names(&a).len(), 30);
    // And they follow what comes next.
    assert!(a.delete("f0").unwrap());
    assert!(within_a_second(
        || fresh.get("f0").unwrap().is_none() && behind.get("f0").unwrap().is_none()
    ));
    // A second compaction replaces the first base.
    assert!(a.compact_log().unwrap());
    assert_eq!(
        keys_under(&cluster, &format!("{}catalog/chunks/", cluster.prefix)),
        1
    );
    drop(behind);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_unreachable_etcd_is_a_clear_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = ClusterConfig::parse(&format!("etcd://127.0.0.1:{port}"), "n").unwrap();
    let t = std::time::Instant::now();
    let e = Catalog::in_memory_member(&cfg)
        .err()
        .expect("no etcd there");
    assert!(e.to_string().contains("etcd"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
}

#[test]
fn cluster_urls_are_parsed_or_refused() {
    let c = ClusterConfig::parse("etcd://h1:2379,10.0.0.2:2380", "n1").unwrap();
    assert_eq!(c.endpoints, ["http://h1:2379", "http://10.0.0.2:2380"]);
    assert_eq!(c.prefix, "/spore/");
    assert_eq!(c.log_key(7), "/spore/catalog/log/00000000000000000007");
    assert!(c.log_key(u64::MAX) < c.log_end());
    let c = ClusterConfig::parse("etcd://h:1/team-a/prod", "n_2").unwrap();
    assert_eq!(c.prefix, "/team-a/prod/");
    for bad in [
        "http://h:1",
        "etcd://h",
        "etcd://h:0",
        "etcd://:1",
        "etcd://h:1/a b",
    ] {
        assert!(ClusterConfig::parse(bad, "n").is_err(), "{bad}");
    }
    for bad in ["", "a/b", "x y", &"n".repeat(65)] {
        assert!(ClusterConfig::parse("etcd://h:1", bad).is_err(), "{bad:?}");
    }
}
