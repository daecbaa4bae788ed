//! Generates the envd messages from proto/ (derived from the e2b SDK's own
//! descriptors by tools/envd-proto/derive.py): prost structs for the binary
//! codec, then pbjson serde impls for proto3's JSON mapping, from the same
//! descriptor set so the two never disagree.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/process/process.proto",
        "proto/filesystem/filesystem.proto",
    ];
    for proto in &protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = out.join("envd-descriptors.bin");
    prost_build::Config::new()
        .file_descriptor_set_path(&descriptors)
        .compile_well_known_types()
        .extern_path(".google.protobuf", "::pbjson_types")
        .compile_protos(&protos, &["proto"])?;
    let set = std::fs::read(&descriptors)?;
    pbjson_build::Builder::new()
        .register_descriptors(&set)?
        .build(&[".process", ".filesystem"])?;
    Ok(())
}
