//! u64 to usize without truncation. Guest addresses, region sizes and file
//! offsets are u64; host slices, pointers and indexes take usize. spore runs
//! on 64-bit hosts only (x86_64, aarch64), where every u64 fits a usize: a
//! build for another pointer width stops here instead of truncating.

#[cfg(not(target_pointer_width = "64"))]
compile_error!("spore-vmm needs a 64-bit host: it converts u64 sizes to usize (src/host_usize.rs)");

/// `x` as a usize, losslessly (usize is 64 bits: checked above).
#[allow(
    clippy::cast_possible_truncation,
    reason = "usize is 64 bits on every target this crate builds for (compile_error above)"
)]
#[inline]
pub const fn from_u64(x: u64) -> usize {
    x as usize
}
