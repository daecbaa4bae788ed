//! Runtimes: how an instance of a function is booted. The instance manager
//! asks a runtime for the VMM API requests that configure a fresh VMM; the
//! start paths (warm, clone, restore, cold) are the same for every runtime.
//!
//! - `spore-uk`: the zip's handler file is a spore unikernel, booted as the
//!   kernel; its guest sends `Ready` as soon as it runs.
//! - `python3`, `provided` (Linux): the guest kernel boots the runtime's
//!   read-only root image (`spore image build RUNTIME`) with `spore-agent` as
//!   PID 1; the function's code disk (its zip unpacked into ext4 at deploy
//!   time) is a second read-only drive. The agent answers a connection with
//!   `Standby`, and the host sends `Configure` ([`Runtime::configure_message`])
//!   before the guest initialises the function and sends `Ready`.

use std::path::Path;

use crate::catalog::Function;

/// One request to a VMM's API.
pub struct ApiCall {
    pub method: &'static str,
    pub path: &'static str,
    pub body: String,
}

/// What a fresh VMM of a function boots from.
pub struct BootFiles<'a> {
    /// `spore-uk`: the handler's unikernel image; Linux: the function's code
    /// disk.
    pub code: &'a Path,
    pub vsock_uds: &'a Path,
    /// Linux runtimes: the guest kernel and the runtime's root image.
    pub linux: Option<LinuxFiles<'a>>,
}

pub struct LinuxFiles<'a> {
    pub kernel: &'a Path,
    pub root_image: &'a Path,
}

/// The block device the guest sees the code disk as: the root image is
/// always the first drive (`/dev/vda`), the code disk the second.
pub const CODE_DEVICE: &str = "/dev/vdb";
/// Where the agent mounts the code disk (Lambda's `LAMBDA_TASK_ROOT`).
pub const CODE_DIR: &str = "/var/task";

pub trait Runtime: Send + Sync {
    /// The `Runtime` name of the Lambda API.
    fn name(&self) -> &'static str;

    /// Whether instances boot the Linux guest kernel with a runtime image
    /// (and so need [`BootFiles::linux`]).
    fn linux(&self) -> bool {
        false
    }

    /// The API calls that configure a fresh VMM for `function` (before
    /// `InstanceStart`): its kernel, drives, memory and vsock.
    fn configure(&self, function: &Function, files: &BootFiles) -> anyhow::Result<Vec<ApiCall>>;

    /// The `Configure` JSON a guest of this runtime gets when it answers a
    /// connection with `Standby`; `None` for guests that never do.
    fn configure_message(&self, _function: &Function) -> Option<Vec<u8>> {
        None
    }
}

/// Every runtime the daemon knows.
pub fn find(name: &str) -> Option<&'static dyn Runtime> {
    match name {
        "spore-uk" => Some(&SporeUk),
        "python3" => Some(&Linux::PYTHON3),
        "provided" => Some(&Linux::PROVIDED),
        _ => None,
    }
}

/// Names of the runtimes, for error messages.
pub const NAMES: &[&str] = &["spore-uk", "python3", "provided"];

fn vsock_call(vsock_uds: &Path) -> ApiCall {
    ApiCall {
        method: "PUT",
        path: "/vsock",
        body: serde_json::json!({ "guest_cid": 3, "uds_path": vsock_uds }).to_string(),
    }
}

/// What a Linux function VM is made of besides its disks and vsock, as
/// recorded with a runtime base: a base made with other devices is made
/// again (a function diff restores the base's devices, not today's).
pub const LINUX_DEVICES: &str = "balloon-free-page-reporting";

/// The balloon every Linux function VM has, for free page reporting: the
/// guest's kernel hands the host the 2 MiB blocks it has had free for a
/// couple of seconds, and the VMM gives their memory back (an idle
/// instance, a clone or a restored one, shrinks to what its guest uses).
/// It never inflates on its own (`amount_mib` 0); the daemon could ask it
/// to later.
fn balloon_call() -> ApiCall {
    ApiCall {
        method: "PUT",
        path: "/balloon",
        body: serde_json::json!({
            "amount_mib": 0,
            "deflate_on_oom": true,
            "free_page_reporting": true,
        })
        .to_string(),
    }
}

fn machine_call(f: &Function) -> ApiCall {
    ApiCall {
        method: "PUT",
        path: "/machine-config",
        body: serde_json::json!({ "vcpu_count": 1, "mem_size_mib": f.memory_mib }).to_string(),
    }
}

/// A spore unikernel: the zip's handler file is the image; the environment
/// goes on its command line.
pub struct SporeUk;

impl Runtime for SporeUk {
    fn name(&self) -> &'static str {
        "spore-uk"
    }

    fn configure(&self, f: &Function, files: &BootFiles) -> anyhow::Result<Vec<ApiCall>> {
        let boot = serde_json::json!({
            "kernel_image_path": files.code,
            "boot_args": command_line(f),
            "boot_protocol": "unikernel",
        });
        let mut calls = vec![
            ApiCall {
                method: "PUT",
                path: "/boot-source",
                body: boot.to_string(),
            },
            machine_call(f),
            vsock_call(files.vsock_uds),
        ];
        if f.network {
            // `tap0` of the instance's own namespace (the VMM runs in it).
            let iface = serde_json::json!({
                "iface_id": "eth0",
                "host_dev_name": crate::network::TAP_NAME,
            });
            calls.push(ApiCall {
                method: "PUT",
                path: "/network-interfaces/eth0",
                body: iface.to_string(),
            });
        }
        Ok(calls)
    }
}

/// A Linux runtime: `spore-agent` starts `name`'s runtime (the kernel
/// command line's `spore.runtime=`), the function's code disk mounted at
/// [`CODE_DIR`].
pub struct Linux {
    name: &'static str,
}

impl Linux {
    pub const PYTHON3: Linux = Linux { name: "python3" };
    pub const PROVIDED: Linux = Linux { name: "provided" };

    /// The guest kernel's command line. `root=` is given (so the VMM adds
    /// none), read-only: the image is shared by every instance of the
    /// runtime; the agent mounts tmpfs where the guest writes.
    pub fn command_line(&self) -> String {
        format!(
            "console=ttyS0 quiet reboot=k panic=1 pci=off root=/dev/vda ro rootfstype=ext4 \
             init=/sbin/spore-agent spore.runtime={}",
            self.name
        )
    }
}

impl Runtime for Linux {
    fn name(&self) -> &'static str {
        self.name
    }

    fn linux(&self) -> bool {
        true
    }

    fn configure(&self, f: &Function, files: &BootFiles) -> anyhow::Result<Vec<ApiCall>> {
        let Some(linux) = &files.linux else {
            anyhow::bail!(
                "the {} runtime needs a guest kernel and a runtime image",
                self.name
            );
        };
        if f.network {
            // The agent does not configure eth0 yet; the API refuses this.
            anyhow::bail!(
                "SporeNetwork is not supported for the {} runtime yet",
                self.name
            );
        }
        let boot = serde_json::json!({
            "kernel_image_path": linux.kernel,
            "boot_args": self.command_line(),
        });
        // The root image first: it is /dev/vda, the code disk /dev/vdb.
        let root = serde_json::json!({
            "drive_id": "rootfs", "path_on_host": linux.root_image,
            "is_root_device": true, "is_read_only": true,
        });
        let code = serde_json::json!({
            "drive_id": "code", "path_on_host": files.code,
            "is_root_device": false, "is_read_only": true,
        });
        Ok(vec![
            ApiCall {
                method: "PUT",
                path: "/boot-source",
                body: boot.to_string(),
            },
            machine_call(f),
            ApiCall {
                method: "PUT",
                path: "/drives/rootfs",
                body: root.to_string(),
            },
            ApiCall {
                method: "PUT",
                path: "/drives/code",
                body: code.to_string(),
            },
            vsock_call(files.vsock_uds),
            balloon_call(),
        ])
    }

    fn configure_message(&self, f: &Function) -> Option<Vec<u8>> {
        let config = serde_json::json!({
            "function_name": crate::accounts::plain_name(&f.name),
            "function_version": "$LATEST",
            "handler": f.handler,
            "memory_mib": f.memory_mib,
            "timeout_s": f.timeout_s,
            "region": crate::config::REGION,
            "env": f.env,
            "code_device": CODE_DEVICE,
            "code_dir": CODE_DIR,
        });
        Some(config.to_string().into_bytes())
    }
}

/// `env.KEY=VALUE` words (VALUE percent-encoded) for the function's
/// environment and Lambda's `AWS_LAMBDA_*` variables.
pub fn command_line(f: &Function) -> String {
    let mut words = vec![
        format!(
            "env.AWS_LAMBDA_FUNCTION_NAME={}",
            crate::percent::encode(crate::accounts::plain_name(&f.name))
        ),
        "env.AWS_LAMBDA_FUNCTION_VERSION=%24LATEST".to_string(),
        format!("env.AWS_LAMBDA_FUNCTION_MEMORY_SIZE={}", f.memory_mib),
    ];
    for (k, v) in &f.env {
        words.push(format!("env.{k}={}", crate::percent::encode(v)));
    }
    if f.network {
        words.push(crate::network::guest_cmdline());
    }
    words.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn function(runtime: &str) -> Function {
        Function {
            name: "hello".into(),
            runtime: runtime.into(),
            handler: "app.handler".into(),
            memory_mib: 256,
            timeout_s: 7,
            env: [("GREETING".to_string(), "hi there".to_string())].into(),
            description: String::new(),
            role: String::new(),
            code_sha256: "00".repeat(32),
            code_size: 1,
            version: 3,
            revision_id: String::new(),
            last_modified: String::new(),
            reserved_concurrency: None,
            network: false,
            published: None,
        }
    }

    fn body(calls: &[ApiCall], path: &str) -> serde_json::Value {
        let call = calls.iter().find(|c| c.path == path).unwrap();
        assert_eq!(call.method, "PUT");
        serde_json::from_str(&call.body).unwrap()
    }

    #[test]
    fn linux_runtimes_boot_the_kernel_with_two_read_only_drives() {
        for name in ["python3", "provided"] {
            let rt = find(name).unwrap();
            assert!(rt.linux());
            let f = function(name);
            let files = BootFiles {
                code: Path::new("/state/code/x/code.ext4"),
                vsock_uds: Path::new("/state/run/r1/v.sock"),
                linux: Some(LinuxFiles {
                    kernel: Path::new("/cache/kernel-x/vmlinux"),
                    root_image: Path::new("/cache/rootfs-x/rootfs.ext4"),
                }),
            };
            let calls = rt.configure(&f, &files).unwrap();
            let paths: Vec<&str> = calls.iter().map(|c| c.path).collect();
            // The root image before the code disk: /dev/vda, then /dev/vdb.
            assert_eq!(
                paths,
                [
                    "/boot-source",
                    "/machine-config",
                    "/drives/rootfs",
                    "/drives/code",
                    "/vsock",
                    "/balloon"
                ]
            );
            assert_eq!(
                body(&calls, "/balloon"),
                serde_json::json!({"amount_mib": 0, "deflate_on_oom": true, "free_page_reporting": true})
            );
            let boot = body(&calls, "/boot-source");
            assert_eq!(boot["kernel_image_path"], "/cache/kernel-x/vmlinux");
            assert!(boot.get("boot_protocol").is_none());
            let args = boot["boot_args"].as_str().unwrap();
            assert_eq!(
                args,
                format!("console=ttyS0 quiet reboot=k panic=1 pci=off root=/dev/vda ro rootfstype=ext4 init=/sbin/spore-agent spore.runtime={name}")
            );
            assert_eq!(
                body(&calls, "/machine-config"),
                serde_json::json!({"vcpu_count": 1, "mem_size_mib": 256})
            );
            let root = body(&calls, "/drives/rootfs");
            assert_eq!(root["path_on_host"], "/cache/rootfs-x/rootfs.ext4");
            assert_eq!(
                (
                    root["is_root_device"].as_bool(),
                    root["is_read_only"].as_bool()
                ),
                (Some(true), Some(true))
            );
            let code = body(&calls, "/drives/code");
            assert_eq!(code["path_on_host"], "/state/code/x/code.ext4");
            assert_eq!(
                (
                    code["is_root_device"].as_bool(),
                    code["is_read_only"].as_bool()
                ),
                (Some(false), Some(true))
            );
            assert_eq!(body(&calls, "/vsock")["uds_path"], "/state/run/r1/v.sock");

            let config: serde_json::Value =
                serde_json::from_slice(&rt.configure_message(&f).unwrap()).unwrap();
            assert_eq!(
                config,
                serde_json::json!({
                    "function_name": "hello", "function_version": "$LATEST",
                    "handler": "app.handler", "memory_mib": 256, "timeout_s": 7,
                    "region": "us-east-1", "env": {"GREETING": "hi there"},
                    "code_device": "/dev/vdb", "code_dir": "/var/task",
                })
            );

            // Without a kernel and image, or with network: refused.
            let bare = BootFiles {
                linux: None,
                ..files
            };
            assert!(rt.configure(&f, &bare).is_err());
        }
    }

    #[test]
    fn spore_uk_is_unchanged() {
        let rt = find("spore-uk").unwrap();
        assert!(!rt.linux());
        let f = function("spore-uk");
        assert!(rt.configure_message(&f).is_none());
        let files = BootFiles {
            code: Path::new("/state/code/x/image-1"),
            vsock_uds: Path::new("/v.sock"),
            linux: None,
        };
        let calls = rt.configure(&f, &files).unwrap();
        let boot = body(&calls, "/boot-source");
        assert_eq!(boot["kernel_image_path"], "/state/code/x/image-1");
        assert_eq!(boot["boot_protocol"], "unikernel");
        assert!(boot["boot_args"]
            .as_str()
            .unwrap()
            .contains("env.GREETING=hi%20there"));
        assert!(calls.iter().all(|c| !c.path.starts_with("/drives")));
    }

    #[test]
    fn environment_is_percent_encoded() {
        assert_eq!(crate::percent::encode("a b/ü"), "a%20b%2F%C3%BC");
        assert_eq!(crate::percent::encode("A-z_0.~"), "A-z_0.~");
    }
}
