//! CPU templates: `PUT /cpu-config` (Firecracker's custom CPU template JSON)
//! and `machine-config.cpu_template` (its static templates).
//!
//! A custom template is a list of modifiers: CPUID leaves (by leaf, subleaf,
//! KVM flags) whose registers get some bits forced to 0 or 1, MSRs likewise,
//! and KVM capabilities the VM must (or need not) have. A bitmap is written
//! `0b` + one character per bit, most significant first: `0`/`1` force the
//! bit, `x` keeps it, `_` separates; missing leading bits are kept.
//! Applying is in [`crate::arch::x86_64::cpu_template`]; here is only the
//! shape, checked the way Firecracker checks it (`vcpu_features` and
//! `reg_modifiers` are aarch64's and refused as unknown fields, as
//! Firecracker on x86 refuses them).

use std::fmt;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Firecracker's static templates (x86). Each matches one EC2 instance
/// family and is valid only on that family's CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum StaticCpuTemplate {
    C3,
    T2,
    T2S,
    #[default]
    None,
    T2CL,
    T2A,
}

impl StaticCpuTemplate {
    /// Parses a `cpu_template` value with serde's message for a bad one
    /// (what Firecracker answers).
    pub fn parse(name: &str) -> Result<Self, String> {
        serde_json::from_value(serde_json::Value::String(name.to_string()))
            .map_err(|e| e.to_string())
    }
}

/// A register's forced bits: where `filter` has a 1, the bit becomes the
/// one in `value`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bitmap<const BITS: u32> {
    pub filter: u64,
    pub value: u64,
}

impl<const BITS: u32> Bitmap<BITS> {
    pub fn apply(&self, v: u64) -> u64 {
        (v & !self.filter) | self.value
    }

    fn parse(s: &str) -> Result<Self, String> {
        let digits = s.strip_prefix("0b").unwrap_or(s);
        let (mut filter, mut value, mut bit) = (0u64, 0u64, 0u32);
        for c in digits.bytes().rev() {
            if c == b'_' {
                continue;
            }
            if bit == BITS {
                return Err(format!(
                    "Failed to parse string [{s}] as a bitmap - string is too long"
                ));
            }
            match c {
                b'x' => {}
                b'0' => filter |= 1 << bit,
                b'1' => {
                    filter |= 1 << bit;
                    value |= 1 << bit;
                }
                c => {
                    return Err(format!(
                        "Failed to parse string [{s}] as a bitmap - unknown character: {c}"
                    ))
                }
            }
            bit += 1;
        }
        Ok(Self { filter, value })
    }
}

impl<const BITS: u32> fmt::Display for Bitmap<BITS> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("0b")?;
        for i in (0..BITS).rev() {
            let c = match (self.filter >> i & 1, self.value >> i & 1) {
                (0, _) => 'x',
                (_, 0) => '0',
                _ => '1',
            };
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

impl<const BITS: u32> Serialize for Bitmap<BITS> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de, const BITS: u32> Deserialize<'de> for Bitmap<BITS> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(D::Error::custom)
    }
}

/// A number written `0x…` or `0b…` (Firecracker refuses bare decimals).
fn parse_prefixed(s: &str) -> Result<u32, String> {
    let parsed = if let Some(h) = s.strip_prefix("0x") {
        u32::from_str_radix(h, 16)
    } else if let Some(b) = s.strip_prefix("0b") {
        u32::from_str_radix(b, 2)
    } else {
        return Err(format!(
            "No supported number system prefix found in value [{s}]. Make sure to prefix the number with '0x' for hexadecimal numbers or '0b' for binary numbers."
        ));
    };
    parsed.map_err(|e| format!("Failed to parse string [{s}] as a number for CPU template - {e}"))
}

fn de_prefixed<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let s = String::deserialize(d)?;
    parse_prefixed(&s).map_err(D::Error::custom)
}

fn ser_hex<S: Serializer>(v: &u32, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&format_args!("{v:#x}"))
}

/// A CPUID output register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuidRegister {
    Eax,
    Ebx,
    Ecx,
    Edx,
}

impl Serialize for CpuidRegister {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match self {
            CpuidRegister::Eax => "eax",
            CpuidRegister::Ebx => "ebx",
            CpuidRegister::Ecx => "ecx",
            CpuidRegister::Edx => "edx",
        })
    }
}

impl<'de> Deserialize<'de> for CpuidRegister {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match String::deserialize(d)?.as_str() {
            "eax" => CpuidRegister::Eax,
            "ebx" => CpuidRegister::Ebx,
            "ecx" => CpuidRegister::Ecx,
            "edx" => CpuidRegister::Edx,
            _ => {
                return Err(D::Error::custom(
                    "Invalid CPUID register. Must be one of [eax, ebx, ecx, edx]",
                ))
            }
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuidRegisterModifier {
    pub register: CpuidRegister,
    pub bitmap: Bitmap<32>,
}

/// One CPUID leaf/subleaf to change; `flags` are KVM's
/// (`KVM_CPUID_FLAG_SIGNIFCANT_INDEX` = 1) and replace the entry's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuidLeafModifier {
    #[serde(deserialize_with = "de_prefixed", serialize_with = "ser_hex")]
    pub leaf: u32,
    #[serde(deserialize_with = "de_prefixed", serialize_with = "ser_hex")]
    pub subleaf: u32,
    pub flags: u32,
    pub modifiers: Vec<CpuidRegisterModifier>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MsrModifier {
    #[serde(deserialize_with = "de_prefixed", serialize_with = "ser_hex")]
    pub addr: u32,
    pub bitmap: Bitmap<64>,
}

/// A KVM capability the VM needs (`"171"`) or no longer needs (`"!171"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvmCapability {
    Add(u32),
    Remove(u32),
}

impl Serialize for KvmCapability {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            KvmCapability::Add(c) => s.collect_str(c),
            KvmCapability::Remove(c) => s.collect_str(&format_args!("!{c}")),
        }
    }
}

impl<'de> Deserialize<'de> for KvmCapability {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let (remove, digits) = match s.strip_prefix('!') {
            Some(d) => (true, d),
            None => (false, s.as_str()),
        };
        let n = digits.parse::<u32>().map_err(|e| {
            D::Error::custom(format!(
                "Failed to parse string [{s}] as a kvm capability - can not convert to numeric: {e}"
            ))
        })?;
        Ok(if remove {
            KvmCapability::Remove(n)
        } else {
            KvmCapability::Add(n)
        })
    }
}

/// `PUT /cpu-config` and a config file's `cpu-config`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuConfig {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kvm_capabilities: Vec<KvmCapability>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpuid_modifiers: Vec<CpuidLeafModifier>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub msr_modifiers: Vec<MsrModifier>,
}

impl CpuConfig {
    pub fn is_empty(&self) -> bool {
        self.kvm_capabilities.is_empty()
            && self.cpuid_modifiers.is_empty()
            && self.msr_modifiers.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmaps_force_bits_and_keep_the_rest() {
        let b = Bitmap::<32>::parse("0b1x0").unwrap();
        assert_eq!((b.filter, b.value), (0b101, 0b100));
        assert_eq!(b.apply(0xffff_fff3), 0xffff_fff6);
        let b = Bitmap::<32>::parse("0b1111_0000").unwrap();
        assert_eq!((b.filter, b.value), (0xff, 0xf0));
        assert!(Bitmap::<32>::parse(&format!("0b{}", "x".repeat(33)))
            .unwrap_err()
            .contains("too long"));
        assert!(Bitmap::<64>::parse(&format!("0b{}", "x".repeat(64))).is_ok());
        assert!(Bitmap::<32>::parse("0b12")
            .unwrap_err()
            .contains("unknown character"));
        let s = Bitmap::<32>::parse("0b10x").unwrap().to_string();
        assert_eq!(s, format!("0b{}10x", "x".repeat(29)));
    }

    #[test]
    fn parses_firecrackers_template_json() {
        let c: CpuConfig = serde_json::from_str(
            r#"{"kvm_capabilities":["!56","171"],
                "cpuid_modifiers":[{"leaf":"0x1","subleaf":"0x0","flags":0,
                  "modifiers":[{"register":"ecx","bitmap":"0bxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx0"}]}],
                "msr_modifiers":[{"addr":"0x10a","bitmap":"0b0"}]}"#,
        )
        .unwrap();
        assert_eq!(
            c.kvm_capabilities,
            [KvmCapability::Remove(56), KvmCapability::Add(171)]
        );
        assert_eq!(c.cpuid_modifiers[0].leaf, 1);
        assert_eq!(
            c.cpuid_modifiers[0].modifiers[0].register,
            CpuidRegister::Ecx
        );
        assert_eq!(c.msr_modifiers[0].addr, 0x10a);
        // Round trip through its own serialization (GET /vm/config).
        let again: CpuConfig = serde_json::from_value(serde_json::to_value(&c).unwrap()).unwrap();
        assert_eq!(again, c);
    }

    #[test]
    fn refuses_what_firecracker_refuses_on_x86() {
        for bad in [
            r#"{"vcpu_features":[]}"#,
            r#"{"reg_modifiers":[]}"#,
            r#"{"cpuid_modifiers":[{"leaf":"1","subleaf":"0x0","flags":0,"modifiers":[]}]}"#,
            r#"{"cpuid_modifiers":[{"leaf":"0x1","subleaf":"0x0","flags":0,"modifiers":[{"register":"exx","bitmap":"0b1"}]}]}"#,
            r#"{"kvm_capabilities":["x1"]}"#,
        ] {
            assert!(serde_json::from_str::<CpuConfig>(bad).is_err(), "{bad}");
        }
        assert_eq!(StaticCpuTemplate::parse("T2A"), Ok(StaticCpuTemplate::T2A));
        let e = StaticCpuTemplate::parse("V1N1").unwrap_err();
        assert!(e.contains("unknown variant `V1N1`"), "{e}");
    }
}
