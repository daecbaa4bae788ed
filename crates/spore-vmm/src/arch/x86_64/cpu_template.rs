//! Applying a CPU template (see [`crate::config::CpuConfig`]) to what a
//! vCPU is given: the CPUID table, the MSRs set at vCPU setup, and the KVM
//! capabilities the VM needs. Firecracker's rules: a modifier naming a CPUID
//! leaf or an MSR KVM does not have is an error, not a silent no-op; a
//! static template is checked against the host CPU's vendor and model
//! before anything else.

use kvm_bindings::{kvm_cpuid_entry2, kvm_msr_entry, CpuId, Msrs};
use kvm_ioctls::{Kvm, VcpuFd};

use crate::config::{CpuConfig, CpuidRegister, KvmCapability, MachineConfig, StaticCpuTemplate};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CpuTemplateError {
    /// Firecracker's words for a static template on the wrong CPU.
    #[error(
        "Failed to get CPU template: CPU vendor mismatched between actual CPU and CPU template."
    )]
    VendorMismatched,
    #[error("Failed to get CPU template: The current CPU model is not permitted to apply the CPU template.")]
    InvalidCpuModel,
    #[error("static CPU template {0:?}: spore does not carry its modifiers; give them as PUT /cpu-config")]
    StaticNotCarried(StaticCpuTemplate),
    #[error("Template changes a CPUID entry not supported by KVM: Leaf: {0:#x}, Subleaf: {1:#x}")]
    CpuidNotSupported(u32, u32),
    #[error("Template changes an MSR entry not supported by KVM: Register Address: {0:#x}")]
    MsrNotSupported(u32),
    #[error("Missing KVM capabilities: {0:?}")]
    MissingCapabilities(Vec<u32>),
    #[error("cpu_template: {0}")]
    Config(String),
}

/// What shapes every vCPU's CPU beyond spore's defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuSetup {
    /// Two threads per core (`machine-config.smt`).
    pub smt: bool,
    /// The resolved template (see [`resolve`]).
    pub template: Option<CpuConfig>,
}

/// A CPU's family/model/stepping fields from CPUID leaf 1 EAX.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CpuModel {
    extended_family: u8,
    extended_model: u8,
    family: u8,
    model: u8,
    stepping: u8,
}

impl CpuModel {
    const fn from_eax(eax: u32) -> Self {
        CpuModel {
            extended_family: ((eax >> 20) & 0xff) as u8,
            extended_model: ((eax >> 16) & 0xf) as u8,
            family: ((eax >> 8) & 0xf) as u8,
            model: ((eax >> 4) & 0xf) as u8,
            stepping: (eax & 0xf) as u8,
        }
    }
}

// The CPUs each static template was made for (leaf 1 EAX signatures).
const SKYLAKE: CpuModel = CpuModel::from_eax(0x0005_0654);
const CASCADE_LAKE: CpuModel = CpuModel::from_eax(0x0005_0657);
const ICE_LAKE: CpuModel = CpuModel::from_eax(0x0006_06a6);
const MILAN: CpuModel = CpuModel::from_eax(0x00a0_0f11);

/// The vendor and models a static template may be applied on.
fn supported_on(t: StaticCpuTemplate) -> (&'static [u8; 12], &'static [CpuModel]) {
    const INTEL: &[u8; 12] = b"GenuineIntel";
    const AMD: &[u8; 12] = b"AuthenticAMD";
    match t {
        StaticCpuTemplate::C3 | StaticCpuTemplate::T2 => {
            (INTEL, &[SKYLAKE, CASCADE_LAKE, ICE_LAKE])
        }
        StaticCpuTemplate::T2S => (INTEL, &[SKYLAKE, CASCADE_LAKE]),
        StaticCpuTemplate::T2CL => (INTEL, &[CASCADE_LAKE, ICE_LAKE]),
        StaticCpuTemplate::T2A => (AMD, &[MILAN]),
        StaticCpuTemplate::None => (b"            ", &[]),
    }
}

fn host_vendor() -> [u8; 12] {
    let r = std::arch::x86_64::__cpuid(0);
    let mut id = [0u8; 12];
    id[0..4].copy_from_slice(&r.ebx.to_le_bytes());
    id[4..8].copy_from_slice(&r.edx.to_le_bytes());
    id[8..12].copy_from_slice(&r.ecx.to_le_bytes());
    id
}

/// The template a VM's vCPUs get: the custom one, the static one if the
/// host CPU is one it was made for, or none.
pub fn resolve(
    machine: &MachineConfig,
    custom: Option<&CpuConfig>,
) -> Result<Option<CpuConfig>, CpuTemplateError> {
    let st = machine
        .static_cpu_template()
        .map_err(|e| CpuTemplateError::Config(e.to_string()))?;
    if st != StaticCpuTemplate::None {
        return check_static(st, &host_vendor(), std::arch::x86_64::__cpuid(1).eax);
    }
    Ok(custom.filter(|c| !c.is_empty()).cloned())
}

/// Firecracker's order: the vendor, then the model.
fn check_static(
    t: StaticCpuTemplate,
    vendor: &[u8; 12],
    leaf1_eax: u32,
) -> Result<Option<CpuConfig>, CpuTemplateError> {
    let (want_vendor, models) = supported_on(t);
    if vendor != want_vendor {
        return Err(CpuTemplateError::VendorMismatched);
    }
    if !models.contains(&CpuModel::from_eax(leaf1_eax)) {
        return Err(CpuTemplateError::InvalidCpuModel);
    }
    Err(CpuTemplateError::StaticNotCarried(t))
}

/// Checks the capabilities the template adds are there (removing one only
/// means spore need not check it: spore requires none beyond what it uses).
pub fn check_capabilities(kvm: &Kvm, t: &CpuConfig) -> Result<(), CpuTemplateError> {
    let missing: Vec<u32> = t
        .kvm_capabilities
        .iter()
        .filter_map(|c| match c {
            KvmCapability::Add(n) if kvm.check_extension_raw(u64::from(*n)) <= 0 => Some(*n),
            _ => None,
        })
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(CpuTemplateError::MissingCapabilities(missing))
    }
}

/// Applies the CPUID modifiers to a vCPU's table (after spore's own
/// identity and topology rewrite, so the template has the last word).
pub fn apply_cpuid(cpuid: &mut CpuId, t: &CpuConfig) -> Result<(), CpuTemplateError> {
    let entries = cpuid.as_mut_slice();
    for m in &t.cpuid_modifiers {
        let e: &mut kvm_cpuid_entry2 = entries
            .iter_mut()
            .find(|e| e.function == m.leaf && e.index == m.subleaf)
            .ok_or(CpuTemplateError::CpuidNotSupported(m.leaf, m.subleaf))?;
        e.flags = m.flags;
        for r in &m.modifiers {
            let reg = match r.register {
                CpuidRegister::Eax => &mut e.eax,
                CpuidRegister::Ebx => &mut e.ebx,
                CpuidRegister::Ecx => &mut e.ecx,
                CpuidRegister::Edx => &mut e.edx,
            };
            // The bitmap holds 32 bits: the value fits.
            *reg = (r.bitmap.apply(u64::from(*reg)) & 0xffff_ffff) as u32;
        }
    }
    Ok(())
}

/// Applies the MSR modifiers to the MSRs a vCPU is set up with: an MSR in
/// `msrs` is changed there; another is read from the vCPU (KVM refusing it
/// means KVM does not have it), changed, and added.
pub fn apply_msrs(
    vcpu: &VcpuFd,
    msrs: &mut Vec<kvm_msr_entry>,
    t: &CpuConfig,
) -> Result<(), CpuTemplateError> {
    for m in &t.msr_modifiers {
        if let Some(e) = msrs.iter_mut().find(|e| e.index == m.addr) {
            e.data = m.bitmap.apply(e.data);
            continue;
        }
        let mut one = Msrs::from_entries(&[kvm_msr_entry {
            index: m.addr,
            ..Default::default()
        }])
        .map_err(|_| CpuTemplateError::MsrNotSupported(m.addr))?;
        match vcpu.get_msrs(&mut one) {
            Ok(1) => {}
            _ => return Err(CpuTemplateError::MsrNotSupported(m.addr)),
        }
        let current = one.as_slice().first().map_or(0, |e| e.data);
        msrs.push(kvm_msr_entry {
            index: m.addr,
            data: m.bitmap.apply(current),
            ..Default::default()
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn custom(json: &str) -> CpuConfig {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn static_templates_are_checked_as_firecracker_checks_them() {
        let milan = 0x00a0_0f11;
        let genoa = 0x00a1_0f11;
        assert_eq!(
            check_static(StaticCpuTemplate::T2, b"AuthenticAMD", milan),
            Err(CpuTemplateError::VendorMismatched)
        );
        assert_eq!(
            check_static(StaticCpuTemplate::T2A, b"AuthenticAMD", genoa),
            Err(CpuTemplateError::InvalidCpuModel)
        );
        assert_eq!(
            check_static(StaticCpuTemplate::C3, b"GenuineIntel", 0x0005_0657),
            Err(CpuTemplateError::StaticNotCarried(StaticCpuTemplate::C3))
        );
        assert_eq!(
            check_static(StaticCpuTemplate::T2S, b"GenuineIntel", 0x0006_06a6),
            Err(CpuTemplateError::InvalidCpuModel)
        );
        // No template, or a custom one, goes through.
        let m = MachineConfig::default();
        assert_eq!(resolve(&m, None), Ok(None));
        let c = custom(r#"{"msr_modifiers":[{"addr":"0x10","bitmap":"0b0"}]}"#);
        assert_eq!(resolve(&m, Some(&c)), Ok(Some(c)));
    }

    #[test]
    fn cpuid_modifiers_force_bits_of_existing_leaves_only() {
        let mut cpuid = CpuId::from_entries(&[kvm_cpuid_entry2 {
            function: 1,
            index: 0,
            ecx: 0xffff_ffff,
            edx: 0x10,
            ..Default::default()
        }])
        .unwrap();
        let t = custom(
            r#"{"cpuid_modifiers":[{"leaf":"0x1","subleaf":"0x0","flags":1,"modifiers":[
                {"register":"ecx","bitmap":"0b0xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx0"},
                {"register":"edx","bitmap":"0b1x0xxxx"}]}]}"#,
        );
        apply_cpuid(&mut cpuid, &t).unwrap();
        let e = cpuid.as_slice()[0];
        assert_eq!(e.ecx, 0x7fff_fffe);
        assert_eq!(e.edx, 0x40);
        assert_eq!(e.flags, 1);
        let missing = custom(
            r#"{"cpuid_modifiers":[{"leaf":"0x77","subleaf":"0x2","flags":0,"modifiers":[]}]}"#,
        );
        let err = apply_cpuid(&mut cpuid, &missing).unwrap_err();
        assert_eq!(err, CpuTemplateError::CpuidNotSupported(0x77, 2));
        assert!(err.to_string().contains("Leaf: 0x77, Subleaf: 0x2"));
    }

    #[test]
    fn kvm_template_reaches_the_vcpu() {
        // Named kvm_*: `make test` skips these, and says so, without /dev/kvm.
        let kvm = Kvm::new().expect("this test needs /dev/kvm");
        let vm = kvm.create_vm().unwrap();
        let vcpu = vm.create_vcpu(0).unwrap();
        let mut cpuid = kvm
            .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
            .unwrap();
        let t = custom(
            r#"{"cpuid_modifiers":[{"leaf":"0x1","subleaf":"0x0","flags":0,"modifiers":[
                {"register":"ecx","bitmap":"0b1x"}]}],
                "msr_modifiers":[{"addr":"0x174","bitmap":"0b1x1"}]}"#,
        );
        apply_cpuid(&mut cpuid, &t).unwrap();
        let l1 = |c: &CpuId| {
            c.as_slice()
                .iter()
                .find(|e| e.function == 1 && e.index == 0)
                .unwrap()
                .ecx
        };
        assert_eq!(l1(&cpuid) & 2, 2);
        // KVM takes the table. (kvm_pvm's KVM_GET_CPUID2 answers the host's
        // table whatever was set, so the read-back is checked in the nested
        // tier, where a Linux guest reads it.)
        vcpu.set_cpuid2(&cpuid).unwrap();
        // SYSENTER_CS (0x174): not in the list, read from the vCPU (0),
        // bits 0 and 2 forced, set, and read back.
        let mut msrs = Vec::new();
        apply_msrs(&vcpu, &mut msrs, &t).unwrap();
        assert_eq!((msrs[0].index, msrs[0].data), (0x174, 0b101));
        let set = Msrs::from_entries(&msrs).unwrap();
        assert_eq!(vcpu.set_msrs(&set).unwrap(), msrs.len());
        let mut back = Msrs::from_entries(&[kvm_msr_entry {
            index: 0x174,
            ..Default::default()
        }])
        .unwrap();
        assert_eq!(vcpu.get_msrs(&mut back).unwrap(), 1);
        assert_eq!(back.as_slice()[0].data, 0b101);
        let bad = custom(r#"{"msr_modifiers":[{"addr":"0x12345","bitmap":"0b0"}]}"#);
        assert_eq!(
            apply_msrs(&vcpu, &mut Vec::new(), &bad),
            Err(CpuTemplateError::MsrNotSupported(0x12345))
        );
    }
}
