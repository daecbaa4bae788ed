//! Where a snapshot was made: the host CPU (model and feature flags) and
//! the guest kernel it booted (`origin.json` beside its files). A snapshot
//! holds vCPU state for that CPU and memory of that kernel, so one shipped
//! from another node is restored only where both match; elsewhere the
//! function boots cold.

use std::collections::HashMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::SystemTime;

use sha2::{Digest as _, Sha256};

/// The file in a snapshot's directory that says where it was made.
pub const ORIGIN_RECORD: &str = "origin.json";

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Origin {
    /// `x86_64` or `aarch64`.
    pub arch: String,
    /// The CPU model as `/proc/cpuinfo` names it (vendor, family, model,
    /// stepping on x86; implementer, part, variant, revision on Arm).
    pub cpu: String,
    /// SHA-256 of the CPU's feature flags, sorted.
    pub cpu_features_sha256: String,
    /// SHA-256 of the guest kernel (a unikernel function's image, a Linux
    /// function's kernel).
    pub kernel_sha256: String,
}

impl Origin {
    /// This host's CPU, with the guest kernel at `kernel`.
    pub fn of_this_host(kernel: &Path) -> std::io::Result<Origin> {
        let (cpu, features) = host_cpu();
        Ok(Origin {
            arch: std::env::consts::ARCH.to_string(),
            cpu: cpu.clone(),
            cpu_features_sha256: features.clone(),
            kernel_sha256: file_sha256(kernel)?,
        })
    }

    /// Why a snapshot made at `self` must not be restored `here` (`None`:
    /// it may).
    pub fn mismatch(&self, here: &Origin) -> Option<String> {
        if self.arch != here.arch {
            return Some(format!("made on {}, this node is {}", self.arch, here.arch));
        }
        if self.cpu != here.cpu {
            return Some(format!(
                "made on CPU {:?}, this node's is {:?}",
                self.cpu, here.cpu
            ));
        }
        if self.cpu_features_sha256 != here.cpu_features_sha256 {
            return Some("made on a CPU with other feature flags".into());
        }
        if self.kernel_sha256 != here.kernel_sha256 {
            return Some("made with another guest kernel".into());
        }
        None
    }

    pub fn read(dir: &Path) -> Option<Origin> {
        serde_json::from_slice(&std::fs::read(dir.join(ORIGIN_RECORD)).ok()?).ok()
    }
}

/// `(model, SHA-256 of the sorted flags)` of this host's first CPU, read
/// once.
fn host_cpu() -> &'static (String, String) {
    static CPU: OnceLock<(String, String)> = OnceLock::new();
    CPU.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        parse_cpuinfo(&text)
    })
}

/// The first processor's model and feature digest from `/proc/cpuinfo`.
fn parse_cpuinfo(text: &str) -> (String, String) {
    const MODEL_KEYS: [&str; 9] = [
        "vendor_id",
        "cpu family",
        "model",
        "stepping",
        "CPU implementer",
        "CPU architecture",
        "CPU variant",
        "CPU part",
        "CPU revision",
    ];
    let first = text.split("\n\n").next().unwrap_or("");
    let field = |key: &str| {
        first.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
    };
    let model: Vec<String> = MODEL_KEYS
        .iter()
        .filter_map(|k| field(k).map(|v| format!("{k}={v}")))
        .collect();
    let mut flags: Vec<String> = field("flags")
        .or_else(|| field("Features"))
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    flags.sort();
    flags.dedup();
    (model.join(" "), hex(&Sha256::digest(flags.join(" "))))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of a file, remembered per path while its size and mtime stay
/// (a Linux kernel is hashed once, not at every snapshot).
fn file_sha256(path: &Path) -> std::io::Result<String> {
    type Seen = HashMap<PathBuf, (u64, SystemTime, String)>;
    static SEEN: OnceLock<Mutex<Seen>> = OnceLock::new();
    let meta = std::fs::metadata(path)?;
    let key = (meta.len(), meta.modified()?);
    let seen = SEEN.get_or_init(Default::default);
    if let Some((len, mtime, sha)) = crate::mutex::lock(seen).get(path) {
        if (*len, *mtime) == key {
            return Ok(sha.clone());
        }
    }
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let sha = hex(&hasher.finalize());
    crate::mutex::lock(seen).insert(path.to_path_buf(), (key.0, key.1, sha.clone()));
    Ok(sha)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpuinfo_names_the_model_and_digests_sorted_flags() {
        let x86 = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\n\
                   model name\t: Xeon\nstepping\t: 7\nflags\t\t: sse2 fpu avx\n\nprocessor\t: 1\n";
        let (model, flags) = parse_cpuinfo(x86);
        assert_eq!(
            model,
            "vendor_id=GenuineIntel cpu family=6 model=85 stepping=7"
        );
        let reordered = x86.replace("sse2 fpu avx", "avx sse2 fpu");
        assert_eq!(parse_cpuinfo(&reordered).1, flags, "order does not count");
        let fewer = x86.replace("sse2 fpu avx", "sse2 fpu");
        assert_ne!(parse_cpuinfo(&fewer).1, flags);
        let arm =
            "processor\t: 0\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n";
        assert_eq!(parse_cpuinfo(arm).0, "CPU implementer=0x41 CPU part=0xd0c");
    }

    #[test]
    fn a_snapshot_restores_only_where_cpu_and_kernel_match() {
        let here = Origin {
            arch: "x86_64".into(),
            cpu: "vendor_id=GenuineIntel".into(),
            cpu_features_sha256: "f".into(),
            kernel_sha256: "k".into(),
        };
        assert_eq!(here.mismatch(&here), None);
        let other = |change: &dyn Fn(&mut Origin)| {
            let mut o = here.clone();
            change(&mut o);
            o.mismatch(&here)
        };
        assert!(other(&|o| o.arch = "aarch64".into()).is_some());
        assert!(other(&|o| o.cpu = "vendor_id=AuthenticAMD".into())
            .is_some_and(|why| why.contains("AuthenticAMD")));
        assert!(other(&|o| o.cpu_features_sha256 = "g".into()).is_some());
        assert!(other(&|o| o.kernel_sha256 = "j".into()).is_some_and(|why| why.contains("kernel")));
    }

    #[test]
    fn a_kernel_is_hashed_again_when_it_changes() {
        let dir = std::env::temp_dir().join(format!("spore-origin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let k = dir.join("kernel");
        std::fs::write(&k, b"one").unwrap();
        let first = file_sha256(&k).unwrap();
        assert_eq!(first, hex(&Sha256::digest(b"one")));
        std::fs::write(&k, b"other").unwrap();
        assert_eq!(file_sha256(&k).unwrap(), hex(&Sha256::digest(b"other")));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
