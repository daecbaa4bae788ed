//! x86_64: boot protocols, CPU setup and firmware tables.

pub mod layout;
pub mod unikernel;
