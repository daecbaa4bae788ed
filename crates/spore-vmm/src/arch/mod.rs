//! Architecture-specific code. Only x86_64 today.

pub mod x86_64;
