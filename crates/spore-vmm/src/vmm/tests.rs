//! The state machine without KVM: every request a VMM must answer before a
//! VM exists (configuration, reads, refusals), through the same dispatch the
//! API server uses. Nothing here opens `/dev/kvm`.

use hyper::Method;
use serde_json::Value;

use super::Vmm;
use crate::api::{parse_request, ApiError, ApiHandler, ApiResponse};
use crate::config::{Compression, VmConfig};
use crate::vm::RunState;

const NOT_STARTED: &str = "the microVM is not started";

fn vmm() -> Vmm {
    Vmm::new("t".into(), VmConfig::default(), Box::new(std::io::sink()))
}

/// One request through the API's parser and the VMM's dispatch.
fn call(v: &Vmm, method: Method, path: &str, body: &str) -> Result<ApiResponse, ApiError> {
    v.handle(parse_request(&method, path, body.as_bytes())?)
}

fn get(v: &Vmm, path: &str) -> Value {
    match call(v, Method::GET, path, "") {
        Ok(ApiResponse::Json(j)) => j,
        other => panic!("GET {path}: {other:?}"),
    }
}

fn put(v: &Vmm, path: &str, body: &str) {
    assert_eq!(
        call(v, Method::PUT, path, body),
        Ok(ApiResponse::NoContent),
        "PUT {path} {body}"
    );
}

fn refused(r: Result<ApiResponse, ApiError>) -> String {
    match r {
        Err(ApiError::BadRequest(m)) => m,
        other => panic!("expected a 400, got {other:?}"),
    }
}

#[test]
fn every_preboot_setter_lands_in_the_configuration() {
    let v = vmm();
    put(
        &v,
        "/boot-source",
        r#"{"kernel_image_path":"/k","boot_args":"console=ttyS0"}"#,
    );
    put(
        &v,
        "/machine-config",
        r#"{"vcpu_count":2,"mem_size_mib":64}"#,
    );
    assert_eq!(
        call(
            &v,
            Method::PATCH,
            "/machine-config",
            r#"{"mem_size_mib":96}"#
        ),
        Ok(ApiResponse::NoContent)
    );
    put(
        &v,
        "/drives/root",
        r#"{"drive_id":"root","path_on_host":"/d","is_root_device":true,"is_read_only":false}"#,
    );
    put(&v, "/vsock", r#"{"guest_cid":5,"uds_path":"/tmp/v.sock"}"#);
    put(&v, "/hotplug/memory", r#"{"total_size_mib":128}"#);
    put(
        &v,
        "/balloon",
        r#"{"amount_mib":16,"deflate_on_oom":false}"#,
    );
    put(&v, "/tmem", r#"{"quota_bytes":8192}"#);
    let snaps = std::env::temp_dir().display().to_string();
    put(
        &v,
        "/snapshot/guest-triggered",
        &format!(r#"{{"directory":"{snaps}"}}"#),
    );
    let c = get(&v, "/vm/config");
    assert_eq!(c["boot-source"]["kernel_image_path"], "/k");
    assert_eq!(c["machine-config"]["vcpu_count"], 2);
    assert_eq!(c["machine-config"]["mem_size_mib"], 96);
    assert_eq!(c["drives"][0]["drive_id"], "root");
    assert_eq!(c["vsock"]["guest_cid"], 5);
    assert_eq!(c["balloon"]["amount_mib"], 16);
    assert_eq!(c["tmem"]["quota_bytes"], 8192);
    assert_eq!(get(&v, "/machine-config")["mem_size_mib"], 96);
    assert_eq!(
        get(&v, "/snapshot/guest-triggered")["directory"],
        snaps.as_str()
    );
    // The balloon answers from the configuration; as in Firecracker, the
    // hotplug status and the balloon's updates wait for a running VM.
    assert_eq!(get(&v, "/balloon")["amount_mib"], 16);
    assert_eq!(c["memory-hotplug"]["total_size_mib"], 128);
    for (method, path, body) in [
        (Method::GET, "/hotplug/memory", ""),
        (Method::PATCH, "/balloon", r#"{"amount_mib":8}"#),
        (
            Method::PATCH,
            "/balloon/statistics",
            r#"{"stats_polling_interval_s":3}"#,
        ),
    ] {
        assert_eq!(refused(call(&v, method, path, body)), NOT_STARTED, "{path}");
    }
    assert_eq!(get(&v, "/balloon")["amount_mib"], 16);
    assert_eq!(v.state(), RunState::NotStarted);
}

#[test]
fn bad_configuration_is_refused_and_changes_nothing() {
    let v = vmm();
    let before = get(&v, "/vm/config");
    for (method, path, body) in [
        (
            Method::PUT,
            "/machine-config",
            r#"{"vcpu_count":0,"mem_size_mib":64}"#,
        ),
        (Method::PATCH, "/machine-config", r#"{"vcpu_count":0}"#),
        (
            Method::PUT,
            "/vsock",
            r#"{"guest_cid":2,"uds_path":"/tmp/v"}"#,
        ),
        (Method::PUT, "/boot-source", r#"{"kernel_image_path":""}"#),
        // A balloon larger than the machine's memory.
        (
            Method::PUT,
            "/balloon",
            r#"{"amount_mib":1000000,"deflate_on_oom":false}"#,
        ),
    ] {
        refused(call(&v, method.clone(), path, body));
    }
    assert_eq!(get(&v, "/vm/config"), before);
    // Nothing to patch or read before start / before one is configured.
    assert_eq!(
        refused(call(&v, Method::PATCH, "/balloon", r#"{"amount_mib":1}"#)),
        NOT_STARTED
    );
    assert!(refused(call(&v, Method::GET, "/balloon", "")).contains("PUT /balloon"));
    assert_eq!(
        refused(call(&v, Method::GET, "/hotplug/memory", "")),
        NOT_STARTED
    );
    assert!(
        refused(call(&v, Method::GET, "/snapshot/guest-triggered", ""))
            .contains("PUT /snapshot/guest-triggered")
    );
}

#[test]
fn reads_before_start_answer_from_the_configuration() {
    let v = vmm();
    let i = get(&v, "/");
    assert_eq!(
        (i["id"].as_str(), i["state"].as_str()),
        (Some("t"), Some("Not started"))
    );
    assert_eq!(get(&v, "/machine-config")["mem_size_mib"], 128);
    let c = get(&v, "/clone");
    assert_eq!(
        (
            c["zygote"].as_bool(),
            c["served"].as_u64(),
            c["standby"].as_u64()
        ),
        (Some(false), Some(0), Some(0))
    );
    assert!(c["template"].is_null());
    assert_eq!(v.serial_input(b"x"), 0);
}

#[test]
fn tmem_is_configured_before_start() {
    let v = vmm();
    let j = get(&v, "/tmem");
    assert_eq!(j["enabled"], true);
    assert_eq!(j["quota_bytes"], 256u64 << 20);
    assert_eq!(j["compression"], "none");
    assert_eq!(j["objects"], 0);
    assert_eq!(j["puts"], 0);
    put(&v, "/tmem", r#"{"quota_bytes":4096,"compression":"lz4"}"#);
    let j = get(&v, "/tmem");
    assert_eq!(
        (j["quota_bytes"].as_u64(), j["compression"].as_str()),
        (Some(4096), Some("lz4"))
    );
    put(&v, "/tmem", r#"{"enabled":false}"#);
    assert_eq!(get(&v, "/tmem")["enabled"], false);
    assert_eq!(v.lock().config.tmem.compression, Compression::Lz4);
}

#[test]
fn every_running_vm_request_gets_the_one_not_started_answer() {
    let v = vmm();
    let dir = std::env::temp_dir();
    let snap = format!(
        r#"{{"snapshot_path":"{0}/x.state","mem_file_path":"{0}/x.mem"}}"#,
        dir.display()
    );
    for (method, path, body) in [
        (
            Method::PUT,
            "/actions",
            r#"{"action_type":"SendCtrlAltDel"}"#.to_string(),
        ),
        (Method::PATCH, "/vm", r#"{"state":"Paused"}"#.into()),
        (Method::PATCH, "/vm", r#"{"state":"Resumed"}"#.into()),
        (Method::GET, "/balloon/statistics", String::new()),
        (
            Method::PATCH,
            "/hotplug/memory",
            r#"{"requested_size_mib":64}"#.into(),
        ),
        (Method::PUT, "/snapshot/create", snap),
        (Method::PUT, "/clone", r#"{"count":1}"#.into()),
    ] {
        let msg = refused(call(&v, method.clone(), path, &body));
        assert_eq!(msg, NOT_STARTED, "{method} {path}");
    }
    // No snapshot file was written by the refused create.
    assert!(!dir.join("x.state").exists());
}

#[test]
fn clone_requests_before_start_are_refused_or_only_configure() {
    let v = vmm();
    assert!(refused(call(
        &v,
        Method::PUT,
        "/clone/config",
        r#"{"max_clones":0}"#
    ))
    .contains("max_clones"));
    assert!(
        refused(call(&v, Method::PUT, "/clone/config", r#"{"standby":65}"#)).contains("standby")
    );
    put(
        &v,
        "/clone/config",
        r#"{"mode":"continue","fork_count":2,"max_clones":7}"#,
    );
    let c = get(&v, "/clone");
    assert_eq!(
        (
            c["config"]["mode"].as_str(),
            c["config"]["max_clones"].as_u64()
        ),
        (Some("continue"), Some(7))
    );
    assert_eq!(
        refused(call(&v, Method::PUT, "/clone", r#"{"count":1}"#)),
        NOT_STARTED
    );
    // The clone-process side: no clone was restored ahead to start.
    let e = v.go_clone(1, 0).unwrap_err();
    assert!(e.to_string().contains("no restored clone"), "{e}");
}

#[test]
fn snapshot_load_refuses_bad_input_and_leaves_the_vmm_configurable() {
    let v = vmm();
    let dir = std::env::temp_dir().join(format!("spore-vmm-sm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("s.state");
    let garbage = dir.join("g.state");
    std::fs::write(&garbage, b"not a snapshot").unwrap();
    let mem = dir.join("s.mem");
    std::fs::write(&mem, b"").unwrap();
    for body in [
        // No memory source, or two.
        format!(r#"{{"snapshot_path":"{}"}}"#, state.display()),
        format!(
            r#"{{"snapshot_path":"{0}","mem_file_path":"{1}","mem_backend":{{"backend_type":"File","backend_path":"{1}"}}}}"#,
            state.display(),
            mem.display()
        ),
        // A CID without a generation.
        format!(
            r#"{{"snapshot_path":"{}","mem_file_path":"{}","vsock_cid":9}}"#,
            state.display(),
            mem.display()
        ),
        // A state file that is missing, then one that is not a snapshot.
        format!(
            r#"{{"snapshot_path":"{}","mem_file_path":"{}"}}"#,
            state.display(),
            mem.display()
        ),
        format!(
            r#"{{"snapshot_path":"{}","mem_file_path":"{}"}}"#,
            garbage.display(),
            mem.display()
        ),
    ] {
        refused(call(&v, Method::PUT, "/snapshot/load", &body));
    }
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(v.state(), RunState::NotStarted);
    put(
        &v,
        "/machine-config",
        r#"{"vcpu_count":1,"mem_size_mib":32}"#,
    );
}

#[test]
fn a_failed_start_can_be_retried_after_fixing_the_configuration() {
    let v = vmm();
    for _ in 0..2 {
        let msg = refused(call(
            &v,
            Method::PUT,
            "/actions",
            r#"{"action_type":"InstanceStart"}"#,
        ));
        assert!(msg.contains("boot-source"), "{msg}");
    }
    // Still before start: setters work.
    put(&v, "/boot-source", r#"{"kernel_image_path":"/k"}"#);
    assert_eq!(v.state(), RunState::NotStarted);
}

#[test]
fn a_stop_before_start_refuses_start_and_load() {
    let v = vmm();
    v.request_stop();
    assert_eq!(v.state(), RunState::Stopped);
    assert!(matches!(v.start(), Err(super::StartError::AlreadyStarted)));
    assert!(v.shutdown().is_empty());
}

#[test]
fn custom_and_static_cpu_templates_replace_each_other() {
    let v = vmm();
    put(&v, "/cpu-config", r#"{"kvm_capabilities": ["!56"]}"#);
    assert_eq!(
        get(&v, "/vm/config")["cpu-config"]["kvm_capabilities"][0],
        "!56"
    );
    // A static template (PUT or PATCH) replaces the custom one...
    let patch = r#"{"cpu_template": "T2"}"#;
    assert_eq!(
        call(&v, Method::PATCH, "/machine-config", patch),
        Ok(ApiResponse::NoContent)
    );
    let c = get(&v, "/vm/config");
    assert!(c.get("cpu-config").is_none(), "{c}");
    assert_eq!(c["machine-config"]["cpu_template"], "T2");
    // ...and a custom one the static one.
    put(&v, "/cpu-config", "{}");
    let c = get(&v, "/vm/config");
    assert!(c["machine-config"].get("cpu_template").is_none(), "{c}");
    put(
        &v,
        "/machine-config",
        r#"{"vcpu_count": 2, "mem_size_mib": 128, "cpu_template": "C3"}"#,
    );
    assert!(get(&v, "/vm/config").get("cpu-config").is_none());
    // The other pre-boot settings land in the configuration.
    put(&v, "/serial", r#"{"serial_out_path": "/tmp/s"}"#);
    put(
        &v,
        "/entropy",
        r#"{"rate_limiter": {"ops": {"size": 1, "refill_time": 1}}}"#,
    );
    let c = get(&v, "/vm/config");
    assert_eq!(c["serial"]["serial_out_path"], "/tmp/s");
    assert_eq!(c["entropy"]["rate_limiter"]["ops"]["size"], 1);
    let e = refused(call(
        &v,
        Method::PUT,
        "/mmds/config",
        r#"{"network_interfaces": ["eth0"]}"#,
    ));
    assert!(e.contains("existing network interface"), "{e}");
}

#[test]
fn network_interfaces_are_configured_with_firecrackers_refusals() {
    let v = vmm();
    let eth0 = r#"{"iface_id":"eth0","host_dev_name":"tap0","guest_mac":"06:00:AC:10:00:02",
                   "rx_rate_limiter":{"ops":{"size":10,"refill_time":100}}}"#;
    put(&v, "/network-interfaces/eth0", eth0);
    let ifaces = &get(&v, "/vm/config")["network-interfaces"];
    assert_eq!(ifaces[0]["host_dev_name"], "tap0");
    assert_eq!(ifaces[0]["guest_mac"], "06:00:ac:10:00:02");
    assert_eq!(ifaces[0]["rx_rate_limiter"]["ops"]["size"], 10);
    // Another interface on the same tap, or with the same MAC.
    let m = refused(call(
        &v,
        Method::PUT,
        "/network-interfaces/eth1",
        r#"{"iface_id":"eth1","host_dev_name":"tap0"}"#,
    ));
    assert!(m.contains("tap0"), "{m}");
    let m = refused(call(
        &v,
        Method::PUT,
        "/network-interfaces/eth1",
        r#"{"iface_id":"eth1","host_dev_name":"tap1","guest_mac":"06:00:ac:10:00:02"}"#,
    ));
    assert!(m.contains("MAC address is already in use"), "{m}");
    // The same id replaces.
    put(
        &v,
        "/network-interfaces/eth0",
        r#"{"iface_id":"eth0","host_dev_name":"tap9"}"#,
    );
    let ifaces = &get(&v, "/vm/config")["network-interfaces"];
    assert_eq!(ifaces.as_array().unwrap().len(), 1);
    assert_eq!(ifaces[0]["host_dev_name"], "tap9");
    // Bad bodies.
    for (path, body, says) in [
        (
            "/network-interfaces/eth0",
            r#"{"iface_id":"eth0","host_dev_name":"tap0","guest_mac":"06:00:AC:10:00"}"#,
            "invalid MAC address",
        ),
        (
            "/network-interfaces/eth0",
            r#"{"iface_id":"eth0","host_dev_name":"a-very-long-tap-name"}"#,
            "at most 15",
        ),
        (
            "/network-interfaces/eth0",
            r#"{"iface_id":"eth0","host_dev_name":""}"#,
            "host_dev_name must not be empty",
        ),
        (
            "/network-interfaces/eth0",
            r#"{"iface_id":"eth1","host_dev_name":"tap0"}"#,
            "differs from iface_id",
        ),
        (
            "/network-interfaces/e%th",
            r#"{"iface_id":"e%th","host_dev_name":"tap0"}"#,
            "iface_id must be",
        ),
    ] {
        let m = refused(call(&v, Method::PUT, path, body));
        assert!(m.contains(says), "{body}: {m}");
    }
    // PATCH is for a running VM.
    let m = refused(call(
        &v,
        Method::PATCH,
        "/network-interfaces/eth0",
        r#"{"iface_id":"eth0","tx_rate_limiter":null}"#,
    ));
    assert!(m.contains("not supported before starting"), "{m}");
    let m = refused(call(
        &v,
        Method::PUT,
        "/network-interfaces",
        r#"{"iface_id":"eth0","host_dev_name":"tap0"}"#,
    ));
    assert!(m.starts_with("Invalid request method and/or path"), "{m}");
}
