use super::*;
use crate::api::{ActionType, VmState};
use crate::config::BootProtocol;

fn parse(method: Method, path: &str, body: &str) -> Result<ApiRequest, ApiError> {
    parse_request(&method, path, body.as_bytes())
}

fn bad_request(method: Method, path: &str, body: &str) -> String {
    match parse(method.clone(), path, body) {
        Err(ApiError::BadRequest(m)) => m,
        other => panic!("{method} {path} {body:?}: expected 400, got {other:?}"),
    }
}

#[test]
fn every_route_parses() {
    let drive = DriveConfig {
        drive_id: "rootfs".into(),
        path_on_host: "/img".into(),
        is_root_device: true,
        is_read_only: false,
        partuuid: None,
        cache_type: None,
        io_engine: None,
        cow_overlay: None,
        rate_limiter: None,
        socket: None,
    };
    let table: Vec<(Method, &str, &str, ApiRequest)> = vec![
        (Method::GET, "/", "", ApiRequest::GetInstanceInfo),
        (
            Method::GET,
            "/machine-config",
            "",
            ApiRequest::GetMachineConfig,
        ),
        (
            Method::GET,
            "/machine-config/",
            "",
            ApiRequest::GetMachineConfig,
        ),
        (Method::GET, "/vm/config", "", ApiRequest::GetVmConfig),
        (Method::GET, "/tmem", "", ApiRequest::GetTmem),
        (
            Method::PUT,
            "/tmem",
            r#"{"quota_bytes":1048576}"#,
            ApiRequest::PutTmem(TmemUpdate {
                quota_bytes: Some(1 << 20),
                ..Default::default()
            }),
        ),
        // A GET body is ignored.
        (Method::GET, "/", "garbage", ApiRequest::GetInstanceInfo),
        (
            Method::PUT,
            "/boot-source",
            r#"{"kernel_image_path":"/k","boot_args":"console=ttyS0","boot_protocol":"unikernel"}"#,
            ApiRequest::PutBootSource(BootSourceConfig {
                kernel_image_path: "/k".into(),
                initrd_path: None,
                boot_args: Some("console=ttyS0".into()),
                boot_protocol: BootProtocol::Unikernel,
            }),
        ),
        (
            Method::PUT,
            "/machine-config",
            r#"{"vcpu_count":2,"mem_size_mib":256,"track_dirty_pages":true}"#,
            ApiRequest::PutMachineConfig(MachineConfig {
                vcpu_count: 2,
                mem_size_mib: 256,
                track_dirty_pages: true,
                ..MachineConfig::default()
            }),
        ),
        (
            Method::PATCH,
            "/machine-config",
            r#"{"mem_size_mib":512}"#,
            ApiRequest::PatchMachineConfig(MachineConfigPatch {
                mem_size_mib: Some(512),
                ..Default::default()
            }),
        ),
        (
            Method::PUT,
            "/drives/rootfs",
            r#"{"drive_id":"rootfs","path_on_host":"/img","is_root_device":true,"is_read_only":false}"#,
            ApiRequest::PutDrive(drive),
        ),
        (
            Method::PUT,
            "/vsock",
            r#"{"guest_cid":3,"uds_path":"/v.sock"}"#,
            ApiRequest::PutVsock(VsockConfig {
                guest_cid: 3,
                uds_path: "/v.sock".into(),
                vsock_id: None,
            }),
        ),
        (
            Method::PUT,
            "/actions",
            r#"{"action_type":"InstanceStart"}"#,
            ApiRequest::Action(ActionType::InstanceStart),
        ),
        (
            Method::PUT,
            "/actions",
            r#" {"action_type":"SendCtrlAltDel"} "#,
            ApiRequest::Action(ActionType::SendCtrlAltDel),
        ),
        (
            Method::PUT,
            "/actions",
            r#"{"action_type":"FlushMetrics"}"#,
            ApiRequest::Action(ActionType::FlushMetrics),
        ),
        (
            Method::PATCH,
            "/vm",
            r#"{"state":"Paused"}"#,
            ApiRequest::PatchVm(VmState::Paused),
        ),
        (
            Method::PATCH,
            "/vm",
            r#"{"state":"Resumed"}"#,
            ApiRequest::PatchVm(VmState::Resumed),
        ),
    ];
    for (method, path, body, want) in table {
        let got = parse(method.clone(), path, body);
        assert_eq!(got, Ok(want), "{method} {path} {body}");
    }
}

#[test]
fn unknown_paths_are_404() {
    for path in [
        "",
        "/nope",
        "/machine-config/x",
        "/drives/a/b",
        "/vm/config/x",
        "//",
        "/actions//",
        "/\u{7}\n",
    ] {
        assert!(
            matches!(parse(Method::GET, path, ""), Err(ApiError::NotFound(_))),
            "{path:?}"
        );
    }
    let Err(ApiError::NotFound(m)) = parse(Method::GET, "/\u{7}\n", "") else {
        unreachable!()
    };
    assert!(!m.contains('\n'), "control characters escaped: {m}");
}

#[test]
fn wrong_methods_are_405() {
    let table = [
        (Method::PUT, "/"),
        (Method::POST, "/machine-config"),
        (Method::DELETE, "/machine-config"),
        (Method::PUT, "/vm/config"),
        (Method::GET, "/boot-source"),
        (Method::PATCH, "/boot-source"),
        (Method::GET, "/drives/rootfs"),
        (Method::DELETE, "/drives/rootfs"),
        (Method::GET, "/vsock"),
        (Method::GET, "/actions"),
        (Method::POST, "/actions"),
        (Method::PUT, "/vm"),
        (Method::GET, "/vm"),
        (Method::HEAD, "/"),
        (Method::from_bytes(b"BREW").unwrap(), "/actions"),
    ];
    for (method, path) in table {
        match parse(method.clone(), path, "{}") {
            Err(ApiError::MethodNotAllowed(m)) => assert!(m.contains(path), "{m}"),
            other => panic!("{method} {path}: expected 405, got {other:?}"),
        }
    }
    assert_eq!(
        allowed_methods("/machine-config"),
        Some(&["GET", "PUT", "PATCH"][..])
    );
    assert_eq!(allowed_methods("/drives/x"), Some(&["PUT", "PATCH"][..]));
    assert_eq!(allowed_methods("/nope"), None);
}

#[test]
fn guest_snapshot_routes() {
    assert_eq!(
        parse(Method::GET, "/snapshot/guest-triggered", ""),
        Ok(ApiRequest::GetGuestSnapshots)
    );
    let dir = std::env::temp_dir();
    let body = format!(r#"{{"directory":"{}","after":"exit"}}"#, dir.display());
    match parse(Method::PUT, "/snapshot/guest-triggered", &body) {
        Ok(ApiRequest::PutGuestSnapshots(c)) => {
            assert_eq!(c.after, crate::config::AfterSnapshot::Exit);
            assert_eq!(c.directory, dir.display().to_string());
        }
        other => panic!("{other:?}"),
    }
    let e = bad_request(
        Method::PUT,
        "/snapshot/guest-triggered",
        r#"{"directory":"/nonexistent/spore-snaps"}"#,
    );
    assert!(e.contains("not a directory"), "{e}");
    bad_request(
        Method::PUT,
        "/snapshot/guest-triggered",
        r#"{"after":"exit"}"#,
    );
    assert!(matches!(
        parse(Method::PATCH, "/snapshot/guest-triggered", "{}"),
        Err(ApiError::MethodNotAllowed(_))
    ));
}

#[test]
fn hotplug_memory_routes() {
    use crate::api::HotplugMemoryUpdate;
    assert_eq!(
        parse(Method::GET, "/hotplug/memory", ""),
        Ok(ApiRequest::GetHotplugMemory)
    );
    assert_eq!(
        parse(Method::PUT, "/hotplug/memory", r#"{"total_size_mib":2048}"#),
        Ok(ApiRequest::PutHotplugMemory(MemoryHotplugConfig {
            total_size_mib: 2048,
            block_size_mib: 2,
            slot_size_mib: 128,
        }))
    );
    assert_eq!(
        parse(
            Method::PATCH,
            "/hotplug/memory",
            r#"{"requested_size_mib":512}"#
        ),
        Ok(ApiRequest::PatchHotplugMemory(HotplugMemoryUpdate {
            requested_size_mib: 512
        }))
    );
    for (method, body) in [
        (Method::PUT, r#"{"total_size_mib":2048,"block_size_mib":3}"#),
        (Method::PUT, r#"{"total_size_mib":2048,"block_size_mib":1}"#),
        (Method::PUT, r#"{"total_size_mib":-1}"#),
        (Method::PUT, r#"{"total_size_mib":2000}"#),
        (Method::PATCH, r#"{"requested_size_mib":-1}"#),
        (Method::PATCH, r#"{"requested_size_mib":1e3}"#),
        (
            Method::PATCH,
            r#"{"requested_size_mib":99999999999999999999999}"#,
        ),
        (Method::PATCH, r#"{"requested_size_mib":"1"}"#),
        (Method::PATCH, r#"{}"#),
        (Method::PATCH, ""),
    ] {
        bad_request(method, "/hotplug/memory", body);
    }
    assert!(matches!(
        parse(Method::DELETE, "/hotplug/memory", ""),
        Err(ApiError::MethodNotAllowed(_))
    ));
}

#[test]
fn malformed_bodies_are_400() {
    let table = [
        (Method::PUT, "/boot-source", "{"),
        (Method::PUT, "/boot-source", "not json"),
        (Method::PUT, "/boot-source", "[]"),
        (Method::PUT, "/boot-source", "null"),
        (
            Method::PUT,
            "/boot-source",
            r#"{"kernel_image_path":"/k"} trailing"#,
        ),
        (
            Method::PUT,
            "/boot-source",
            r#"{"kernel_image_path":"/k"}{}"#,
        ),
        (
            Method::PUT,
            "/machine-config",
            r#"{"vcpu_count":-1,"mem_size_mib":1}"#,
        ),
        (Method::PUT, "/actions", r#"{"action_type":"Reboot"}"#),
        (Method::PUT, "/actions", r#"{"action_type":null}"#),
        (Method::PATCH, "/vm", r#"{"state":"paused"}"#),
        (
            Method::PUT,
            "/vsock",
            r#"{"guest_cid":4294967296,"uds_path":"/s"}"#,
        ),
    ];
    for (method, path, body) in table {
        bad_request(method, path, body);
    }
    let invalid_utf8 = parse_request(&Method::PUT, "/vsock", b"{\"uds_path\":\"\xff\"}");
    assert!(matches!(invalid_utf8, Err(ApiError::BadRequest(_))));
}

#[test]
fn empty_bodies_are_400() {
    for (method, path) in [
        (Method::PUT, "/boot-source"),
        (Method::PUT, "/machine-config"),
        (Method::PATCH, "/machine-config"),
        (Method::PUT, "/drives/rootfs"),
        (Method::PUT, "/vsock"),
        (Method::PUT, "/actions"),
        (Method::PATCH, "/vm"),
    ] {
        for body in ["", " \r\n"] {
            let m = bad_request(method.clone(), path, body);
            assert!(m.contains("needs a JSON body"), "{m}");
        }
    }
    let m = bad_request(Method::PATCH, "/machine-config", "{}");
    assert!(m.contains("changes nothing"), "{m}");
}

#[test]
fn messages_name_the_field() {
    let m = bad_request(
        Method::PUT,
        "/machine-config",
        r#"{"vcpu_count":1,"mem_size_mib":128,"bogus":1}"#,
    );
    assert!(m.contains("bogus"), "{m}");
    let m = bad_request(Method::PUT, "/machine-config", r#"{"vcpu_count":1}"#);
    assert!(m.contains("mem_size_mib"), "{m}");
    let m = bad_request(
        Method::PUT,
        "/machine-config",
        r#"{"vcpu_count":"two","mem_size_mib":128}"#,
    );
    assert!(m.contains("vcpu_count"), "{m}");
    let m = bad_request(Method::PATCH, "/machine-config", r#"{"smt":"yes"}"#);
    assert!(m.contains("smt"), "{m}");
    let m = bad_request(
        Method::PUT,
        "/actions",
        r#"{"action_type":"InstanceStart","x":1}"#,
    );
    assert!(m.contains('x'), "{m}");
    let m = bad_request(Method::PATCH, "/vm", r#"{"state":"Paused","extra":true}"#);
    assert!(m.contains("extra"), "{m}");
    let m = bad_request(
        Method::PUT,
        "/drives/a",
        r#"{"drive_id":"a","path_on_host":"/d","rate_limiter":{"ops":{"size":1}}}"#,
    );
    assert!(m.contains("refill_time"), "{m}");
    let m = bad_request(Method::PUT, "/vsock", r#"{"guest_cid":3,"uds_path":7}"#);
    assert!(m.contains("uds_path"), "{m}");
}

#[test]
fn drive_path_id_must_match_body() {
    let m = bad_request(
        Method::PUT,
        "/drives/other",
        r#"{"drive_id":"rootfs","path_on_host":"/img"}"#,
    );
    assert!(m.contains("other") && m.contains("rootfs"), "{m}");
    let m = bad_request(
        Method::PUT,
        "/drives",
        r#"{"drive_id":"rootfs","path_on_host":"/img"}"#,
    );
    assert!(m.contains("missing"), "{m}");
    let m = bad_request(
        Method::PUT,
        "/drives/",
        r#"{"drive_id":"","path_on_host":"/img"}"#,
    );
    assert!(m.contains("missing"), "{m}");
}

#[test]
fn balloon_routes() {
    assert_eq!(
        parse(
            Method::PUT,
            "/balloon",
            r#"{"amount_mib":64,"deflate_on_oom":true,"stats_polling_interval_s":2}"#
        ),
        Ok(ApiRequest::PutBalloon(BalloonConfig {
            amount_mib: 64,
            deflate_on_oom: true,
            stats_polling_interval_s: 2,
            free_page_reporting: false,
            free_page_hinting: false,
        }))
    );
    assert_eq!(
        parse(Method::PATCH, "/balloon", r#"{"amount_mib":0}"#),
        Ok(ApiRequest::PatchBalloon(BalloonUpdate { amount_mib: 0 }))
    );
    assert_eq!(
        parse(Method::GET, "/balloon", ""),
        Ok(ApiRequest::GetBalloon)
    );
    assert_eq!(
        parse(Method::GET, "/balloon/statistics", ""),
        Ok(ApiRequest::GetBalloonStatistics)
    );
    assert_eq!(
        parse(
            Method::PATCH,
            "/balloon/statistics",
            r#"{"stats_polling_interval_s":5}"#
        ),
        Ok(ApiRequest::PatchBalloonStatistics(BalloonStatsUpdate {
            stats_polling_interval_s: 5
        }))
    );
    assert!(matches!(
        parse(
            Method::PUT,
            "/balloon",
            r#"{"amount_mib":1,"deflate_on_oom":false,"free_page_hinting":true}"#
        ),
        Ok(ApiRequest::PutBalloon(BalloonConfig {
            free_page_hinting: true,
            ..
        }))
    ));
    // Free page hinting: start's body is optional (acknowledge_on_stop
    // defaults to true); stop ignores its body, as Firecracker does.
    for (body, ack) in [
        ("", true),
        ("{}", true),
        (r#"{"acknowledge_on_stop":false}"#, false),
    ] {
        assert_eq!(
            parse(Method::PATCH, "/balloon/hinting/start", body),
            Ok(ApiRequest::StartBalloonHinting(BalloonHintingStart {
                acknowledge_on_stop: ack
            })),
            "{body}"
        );
    }
    assert_eq!(
        parse(Method::GET, "/balloon/hinting/status", ""),
        Ok(ApiRequest::GetBalloonHintingStatus)
    );
    for body in ["", "{}"] {
        assert_eq!(
            parse(Method::PATCH, "/balloon/hinting/stop", body),
            Ok(ApiRequest::StopBalloonHinting)
        );
    }
    for (method, path, body) in [
        (
            Method::PATCH,
            "/balloon/hinting/start",
            r#"{"acknowledge_on_stop":3}"#,
        ),
        (Method::PATCH, "/balloon/hinting/start", r#"{"other":true}"#),
        (Method::PATCH, "/balloon/hinting/start", "{"),
        (Method::PATCH, "/balloon", r#"{"amount_mib":-1}"#),
        (Method::PATCH, "/balloon", r#"{"amount_mib":4294967296}"#),
        (Method::PATCH, "/balloon", r#"{"amount_mib":"1"}"#),
        (Method::PATCH, "/balloon", r#"{"deflate_on_oom":true}"#),
        (Method::PUT, "/balloon", r#"{"amount_mib":1}"#),
        (
            Method::PATCH,
            "/balloon/statistics",
            r#"{"stats_polling_interval_s":70000}"#,
        ),
        (Method::PATCH, "/balloon/statistics", "{}"),
    ] {
        bad_request(method, path, body);
    }
    assert!(matches!(
        parse(Method::PUT, "/balloon/statistics", "{}"),
        Err(ApiError::MethodNotAllowed(_))
    ));
}

#[test]
fn printable_bounds_and_escapes() {
    assert_eq!(printable("/a"), "/a");
    assert_eq!(printable("a\nb"), "a\\nb");
    let long = "x".repeat(1000);
    assert_eq!(printable(&long).chars().count(), 129);
}

#[test]
fn patch_drive_parses_firecrackers_partial_drive() {
    let req = parse(
        Method::PATCH,
        "/drives/rootfs",
        r#"{"drive_id":"rootfs","path_on_host":"/new.img","rate_limiter":{"bandwidth":{"size":1048576,"one_time_burst":0,"refill_time":1000}}}"#,
    )
    .unwrap();
    let ApiRequest::PatchDrive(p) = req else {
        panic!("{req:?}");
    };
    assert_eq!(p.path_on_host.as_deref(), Some("/new.img"));
    assert_eq!(p.rate_limiter.unwrap().bandwidth.unwrap().refill_time, 1000);
    // Only the id: accepted (Firecracker too), it changes nothing.
    assert!(matches!(
        parse(Method::PATCH, "/drives/a", r#"{"drive_id":"a"}"#),
        Ok(ApiRequest::PatchDrive(_))
    ));
    let m = bad_request(Method::PATCH, "/drives/a", r#"{"drive_id":"b"}"#);
    assert!(m.contains("differs"), "{m}");
    let m = bad_request(
        Method::PATCH,
        "/drives/a",
        r#"{"drive_id":"a","is_read_only":true}"#,
    );
    assert!(m.contains("is_read_only"), "{m}");
    let m = bad_request(
        Method::PATCH,
        "/drives/a",
        r#"{"drive_id":"a","rate_limiter":{"ops":{"size":-1,"refill_time":1}}}"#,
    );
    assert!(m.contains("-1"), "{m}");
}
