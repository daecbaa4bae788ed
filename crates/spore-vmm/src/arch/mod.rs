//! Architecture-specific code. Only x86_64 today.

pub mod x86_64;

/// What runs in the VM: a Linux kernel, or a spore unikernel in ring 3;
/// it decides how the VM boots and which legacy devices it gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum GuestKind {
    Linux,
    Unikernel,
}
