//! Generates envd's protobuf messages from `proto/`: protox compiles the `.proto` files in
//! pure Rust (CI machines have no `protoc`), prost-build writes the Rust types, and
//! pbjson-build writes their serde impls following proto3's canonical JSON mapping, the
//! form E2B's SDKs speak over Connect's JSON codec.

use std::error::Error;
use std::path::PathBuf;

use prost::Message as _;

/// The `.proto` files, relative to `proto/`.
const FILES: [&str; 2] = ["process/process.proto", "filesystem/filesystem.proto"];

/// The protobuf packages warren generates code for (their modules in `src/envd/proto.rs`).
const PACKAGES: [&str; 2] = [".process", ".filesystem"];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=proto");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);

    // protox carries the well-known types (google/protobuf/timestamp.proto) itself.
    let descriptors = protox::compile(FILES, ["proto"])?;
    let encoded = descriptors.encode_to_vec();

    let mut prost = prost_build::Config::new();
    prost.out_dir(&out_dir);
    // Timestamp from pbjson-types: prost's own has no serde impls, pbjson's maps to an
    // RFC 3339 string as proto3's JSON mapping says. (Replacing prost's default path for
    // the well-known types takes `compile_well_known_types` first; nothing of
    // `google.protobuf` is generated here, the extern path wins.)
    prost.compile_well_known_types();
    prost.extern_path(".google.protobuf", "::pbjson_types");
    prost.compile_fds(descriptors)?;

    pbjson_build::Builder::new()
        .out_dir(&out_dir)
        .register_descriptors(&encoded)?
        // Newer SDKs send fields an older server does not know; proto3 says to skip them.
        .ignore_unknown_fields()
        .build(&PACKAGES)?;
    Ok(())
}
