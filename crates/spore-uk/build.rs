//! Links spore-uk binaries with `link.ld` (image at 2 MiB, a PT_NOTE segment
//! for the spore note). Only for the bare-metal target: host builds (unit
//! tests with `--target x86_64-unknown-linux-gnu`) link normally.

fn main() {
    println!("cargo:rerun-if-changed=link.ld");
    println!("cargo:rerun-if-changed=build.rs");
    let target = std::env::var("TARGET").unwrap_or_default();
    if target == "x86_64-unknown-none" {
        let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
        println!("cargo:rustc-link-arg=-T{dir}/link.ld");
        // In case RUSTFLAGS from the environment replaced relocation-model=static:
        // the image must not be linked as a static PIE that needs self-relocation.
        println!("cargo:rustc-link-arg=--no-pie");
    }
}
