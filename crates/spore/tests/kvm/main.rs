//! The integration tests of the `spore` command, one test binary: a module
//! per scenario, each driving the real `spore` binary (VMs on /dev/kvm,
//! the Firecracker drop-in, snapshots, clones, `spore serve`), over the
//! shared helpers of `tests/common/`.
//!
//! Run one scenario or one test by its path:
//! `cargo test -p spore --test kvm kvm_clone::` or
//! `cargo test -p spore --test kvm kvm_clone_of_a_clone_in_continue_mode`.
//!
//! Tests whose own name starts with `kvm_` need /dev/kvm; a host without it
//! runs the rest with `-- --skip ::kvm_` (the `::` keeps the KVM-free tests
//! of a `kvm_*` scenario module, as `make test-host` does).
//!
//! Every test shares this one process: none may change process-wide state
//! (environment, working directory, signal dispositions, rlimits, file
//! descriptors' close-on-exec), and names a test makes for host objects
//! (taps, namespaces, cgroups) must differ between scenarios, since the
//! process id no longer does. Tests that need the host to themselves hold
//! [`common::host::alone`]; every other test that boots VMs runs beside them
//! only through [`common::host::shared`].

#![allow(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is test code as a whole: its tests live in scenario modules, not in a #[cfg(test)] module"
)]

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod bad_input_files;
mod fc_swagger;
mod firecracker_cli;
mod host_kvm;
mod image_build;
mod kvm_balloon;
mod kvm_balloon_hinting;
mod kvm_bench_net;
mod kvm_bench_reclaim;
mod kvm_bench_snapshot;
mod kvm_bench_tmem;
mod kvm_blk_rate;
mod kvm_clone;
mod kvm_clone_identity;
mod kvm_clone_limits;
mod kvm_fc_api;
mod kvm_guest_snapshot;
mod kvm_huge_pages;
mod kvm_jailer;
mod kvm_jailer_sdk;
mod kvm_kvserver;
mod kvm_mem_snapshot;
mod kvm_net;
mod kvm_net_device;
mod kvm_seccomp;
mod kvm_serve;
mod kvm_serve_cgroups;
mod kvm_serve_clients;
mod kvm_serve_cluster;
mod kvm_serve_cluster_hosts;
mod kvm_serve_cluster_limits;
mod kvm_serve_disk_full;
mod kvm_serve_events;
mod kvm_serve_guardian;
mod kvm_serve_jail;
mod kvm_serve_net;
mod kvm_serve_provisioned;
mod kvm_serve_urls;
mod kvm_serve_versions;
mod kvm_snapshot_devices;
mod kvm_snapshot_integrity;
mod kvm_snapshot_layers;
mod kvm_tmem;
mod kvm_tmem_accounting;
mod kvm_uk_mem;
mod kvm_uk_tmem;
mod serve_connections;
mod serve_sandboxes;
mod snapshot;
mod snapshot_restore;
