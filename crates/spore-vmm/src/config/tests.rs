use super::*;

#[test]
fn machine_config_bounds() {
    let mut m = MachineConfig::default();
    m.validate().unwrap();
    m.vcpu_count = 0;
    assert!(matches!(m.validate(), Err(ConfigError::VcpuCount { .. })));
    m.vcpu_count = 2;
    m.mem_size_mib = 0;
    assert_eq!(m.validate(), Err(ConfigError::MemZero));
    m.mem_size_mib = MAX_MEM_MIB + 1;
    assert!(m.validate().is_err());
    m.mem_size_mib = 256;
    // SMT: 1 or an even number of vCPUs, as Firecracker requires.
    m.smt = true;
    m.validate().unwrap();
    m.vcpu_count = 3;
    assert_eq!(m.validate(), Err(ConfigError::SmtVcpuCount));
    m.vcpu_count = 1;
    m.validate().unwrap();
    m.cpu_template = Some("T2A".into());
    m.validate().unwrap();
    m.cpu_template = Some("V1N1".into());
    assert!(matches!(m.validate(), Err(ConfigError::CpuTemplate(_))));
}

#[test]
fn unknown_fields_refused() {
    let e =
        serde_json::from_str::<MachineConfig>(r#"{"vcpu_count":1,"mem_size_mib":128,"bogus":1}"#);
    assert!(e.is_err());
    let c: VmConfig = serde_json::from_str(
        r#"{"boot-source":{"kernel_image_path":"/k"},"machine-config":{"vcpu_count":2,"mem_size_mib":256},
            "drives":[{"drive_id":"rootfs","path_on_host":"/d","is_root_device":true,"is_read_only":false}]}"#,
    )
    .unwrap();
    c.validate().unwrap();
    assert!(serde_json::from_str::<VmConfig>(r#"{"bogus":{}}"#).is_err());
    // Firecracker's logger section is known (every field optional).
    assert!(serde_json::from_str::<VmConfig>(r#"{"logger":{}}"#).is_ok());
}

#[test]
fn hotplug_memory_rules() {
    let c = |total, block, slot| MemoryHotplugConfig {
        total_size_mib: total,
        block_size_mib: block,
        slot_size_mib: slot,
    };
    c(2048, 2, 128).validate().unwrap();
    c(1024, 128, 128).validate().unwrap();
    for bad in [
        c(2048, 3, 128), // not a power of two
        c(2048, 1, 128), // below 2 MiB
        c(2048, 0, 128),
        c(2048, 2, 0),
        c(2048, 64, 96), // slot not a multiple of the block
        c(2000, 2, 128), // total not a multiple of the slot
        c(0, 2, 128),
        c(MAX_HOTPLUG_MIB * 2, 1024, 1024),
        c(64 * 1024, 2, 2), // too many slots
    ] {
        assert!(
            matches!(bad.validate(), Err(ConfigError::Hotplug(_))),
            "{bad:?}"
        );
    }
    let d: MemoryHotplugConfig = serde_json::from_str(r#"{"total_size_mib":1024}"#).unwrap();
    assert_eq!((d.block_size_mib, d.slot_size_mib), (2, 128));
    assert!(serde_json::from_str::<MemoryHotplugConfig>(r#"{"total_size_mib":-1}"#).is_err());
}

#[test]
fn drives_and_vsock() {
    let mut c = VmConfig {
        boot_source: Some(BootSourceConfig {
            kernel_image_path: "/k".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let d = |id: &str, root| DriveConfig {
        drive_id: id.into(),
        path_on_host: "/x".into(),
        is_root_device: root,
        is_read_only: false,
        partuuid: None,
        cache_type: None,
        io_engine: None,
        cow_overlay: None,
        rate_limiter: None,
        socket: None,
    };
    c.upsert_drive(d("a", true));
    c.upsert_drive(d("a", true));
    assert_eq!(c.drives.len(), 1);
    c.upsert_drive(d("b", true));
    assert!(matches!(c.validate(), Err(ConfigError::TwoRootDevices(..))));
    let v = VsockConfig {
        guest_cid: 2,
        uds_path: "/s".into(),
        vsock_id: None,
    };
    assert_eq!(v.validate(), Err(ConfigError::GuestCid(2)));
}

#[test]
fn tmem_defaults_and_file_section() {
    let c: VmConfig =
        serde_json::from_str(r#"{"boot-source":{"kernel_image_path":"/k"}}"#).unwrap();
    assert_eq!(c.tmem, TmemConfig::default());
    assert!(c.tmem.enabled);
    let c: VmConfig = serde_json::from_str(
        r#"{"boot-source":{"kernel_image_path":"/k"},"tmem":{"quota_bytes":1024,"compression":"lz4"}}"#,
    )
    .unwrap();
    assert_eq!(
        (c.tmem.quota_bytes, c.tmem.compression),
        (1024, Compression::Lz4)
    );
    assert!(serde_json::from_str::<TmemConfig>(r#"{"compression":"zip"}"#).is_err());
    assert!(serde_json::from_str::<TmemConfig>(r#"{"quota":1}"#).is_err());
}

#[test]
fn balloon_section() {
    let c: VmConfig = serde_json::from_str(
        r#"{"boot-source":{"kernel_image_path":"/k"},"machine-config":{"vcpu_count":1,"mem_size_mib":256},
            "balloon":{"amount_mib":64,"deflate_on_oom":true,"stats_polling_interval_s":1}}"#,
    )
    .unwrap();
    c.validate().unwrap();
    let b = c.balloon.clone().unwrap();
    assert!(!b.free_page_reporting);
    let mut big = c.clone();
    big.balloon.as_mut().unwrap().amount_mib = 257;
    assert!(matches!(
        big.validate(),
        Err(ConfigError::BalloonTooLarge { .. })
    ));
    let mut hint = c.clone();
    hint.balloon.as_mut().unwrap().free_page_hinting = true;
    hint.validate().unwrap();
    assert!(serde_json::from_str::<BalloonConfig>(r#"{"amount_mib":1}"#).is_err());
    assert!(
        serde_json::from_str::<BalloonConfig>(r#"{"amount_mib":-1,"deflate_on_oom":false}"#)
            .is_err()
    );
}

#[test]
fn tmem_timing_is_opt_in() {
    assert!(!TmemConfig::default().timing);
    let json = serde_json::to_string(&TmemConfig::default()).unwrap();
    assert!(!json.contains("timing"), "{json}");
    let t: TmemConfig = serde_json::from_str(r#"{"timing":true}"#).unwrap();
    assert!(t.timing && t.enabled);
}

#[test]
fn tmem_host_cap_is_optional() {
    assert_eq!(TmemConfig::default().host_cap_bytes, None);
    let json = serde_json::to_string(&TmemConfig::default()).unwrap();
    assert!(!json.contains("host_cap"), "{json}");
    let t: TmemConfig = serde_json::from_str(r#"{"host_cap_bytes":1073741824}"#).unwrap();
    assert_eq!(t.host_cap_bytes, Some(1 << 30));
    assert!(serde_json::from_str::<TmemConfig>(r#"{"host_cap_bytes":-1}"#).is_err());
    assert!(serde_json::from_str::<TmemConfig>(r#"{"host_cap_bytes":"1G"}"#).is_err());
}

#[test]
fn cow_overlay_shapes() {
    let drive = |overlay: &str, ro: bool| -> Result<DriveConfig, String> {
        let d: DriveConfig = serde_json::from_str(&format!(
            r#"{{"drive_id":"d","path_on_host":"/d","is_read_only":{ro},"cow_overlay":{overlay}}}"#
        ))
        .map_err(|e| e.to_string())?;
        d.validate().map(|()| d).map_err(|e| e.to_string())
    };
    let d = drive(r#"{"path":"/x.cow"}"#, false).unwrap();
    assert_eq!(d.cow_overlay.unwrap().path.as_deref(), Some("/x.cow"));
    assert!(
        drive(r#"{"in_memory":true}"#, false)
            .unwrap()
            .cow_overlay
            .unwrap()
            .in_memory
    );
    assert!(drive(r#"{"path":"/x.cow","in_memory":true}"#, false).is_ok());
    for (bad, ro) in [
        (r#"{}"#, false),
        (r#"{"path":""}"#, false),
        (r#"{"path":"/x.cow"}"#, true),
        (r#"{"path":"/x.cow","size":1}"#, false),
    ] {
        assert!(drive(bad, ro).is_err(), "{bad} ro={ro} accepted");
    }
}

#[test]
fn firecracker_config_files_with_null_keys_load() {
    // What Firecracker's GET /vm/config writes for an unconfigured VM, and
    // what its users' config files carry: nulls and empty lists.
    let text = r#"{
        "boot-source": {"kernel_image_path": "/k", "initrd_path": null, "boot_args": null},
        "drives": [{"drive_id": "root", "path_on_host": "/d", "is_root_device": true,
                    "is_read_only": null, "partuuid": null, "cache_type": null,
                    "io_engine": null, "rate_limiter": null, "socket": null}],
        "machine-config": {"vcpu_count": 1, "mem_size_mib": 128, "smt": null,
                           "track_dirty_pages": null, "huge_pages": null, "cpu_template": null},
        "balloon": null, "vsock": null, "logger": null, "metrics": null,
        "mmds-config": null, "cpu-config": null, "network-interfaces": [],
        "pmem": null, "entropy": {"rate_limiter": null}, "memory-hotplug": null
    }"#;
    let c: VmConfig = serde_json::from_str(text).unwrap();
    c.validate().unwrap();
    assert_eq!(c.boot_source.as_ref().unwrap().initrd_path, None);
    assert!(c.balloon.is_none() && c.vsock.is_none());
    assert!(!c.drives[0].is_read_only && !c.machine.smt);
    let nulls: VmConfig = serde_json::from_str(
        r#"{"boot-source": {"kernel_image_path": "/k"}, "machine-config": null,
            "drives": null, "tmem": null}"#,
    )
    .unwrap();
    assert_eq!(nulls.machine, MachineConfig::default());
    assert!(nulls.drives.is_empty() && nulls.tmem.enabled);
    // Network interfaces load (null limiters too) and are checked.
    let with_net: VmConfig = serde_json::from_str(
        r#"{"boot-source": {"kernel_image_path": "/k"}, "network-interfaces": [
            {"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": null,
             "rx_rate_limiter": null, "tx_rate_limiter": null}]}"#,
    )
    .unwrap();
    with_net.validate().unwrap();
    assert_eq!(with_net.network_interfaces[0].host_dev_name, "tap0");
    let mut two_taps = with_net.clone();
    let mut eth1 = two_taps.network_interfaces[0].clone();
    eth1.iface_id = "eth1".into();
    two_taps.network_interfaces.push(eth1);
    assert!(two_taps.validate().is_err());
    // An MMDS config naming an existing interface passes Firecracker's checks.
    let mut mmds = with_net.clone();
    mmds.mmds_config = serde_json::from_str(r#"{"network_interfaces": ["eth0"]}"#).unwrap();
    mmds.validate().unwrap();
    // What spore does not have is refused when it is really asked for.
    {
        let bad = r#"{"drives": [{"drive_id": "a", "path_on_host": "/d", "socket": "/s"}]}"#;
        let e = serde_json::from_str::<VmConfig>(bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not supported by spore"), "{bad}: {e}");
    }
    // An MMDS config naming an interface the VM lacks: refused with
    // Firecracker's message; a custom CPU template loads.
    let mut c = nulls.clone();
    c.mmds_config = serde_json::from_str(r#"{"network_interfaces": ["eth0"]}"#).unwrap();
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.contains("does not correspond to any existing network interface"),
        "{e}"
    );
    let c: VmConfig = serde_json::from_str(r#"{"boot-source": {"kernel_image_path": "/k"}, "cpu-config": {}, "serial": {"serial_out_path": "/tmp/x"}}"#).unwrap();
    c.validate().unwrap();
    assert_eq!(c.cpu_config, Some(CpuConfig::default()));
}

#[test]
fn huge_pages_2m_needs_an_even_size_and_other_kinds_are_refused() {
    let m = |mib, h: &str| MachineConfig {
        mem_size_mib: mib,
        huge_pages: Some(h.into()),
        ..MachineConfig::default()
    };
    assert!(m(64, "2M").validate().is_ok());
    assert!(m(64, "2M").huge_pages_2m());
    assert!(m(64, "None").validate().is_ok() && !m(64, "None").huge_pages_2m());
    let e = m(65, "2M").validate().unwrap_err().to_string();
    assert!(
        e.contains("not a multiple of the configured page size"),
        "{e}"
    );
    for bad in ["Transparent", "1G", ""] {
        let e = m(64, bad).validate().unwrap_err().to_string();
        assert!(e.contains("huge_pages"), "{bad}: {e}");
    }
}
