//! The checked-in gRPC code (`src/generated/commscope.v1.rs`) must match `proto/commscope.proto`.
//! Regenerate with `COMMSCOPE_BLESS=1 cargo test -p commscope-wire --test generated_code`.

use std::path::Path;

#[test]
fn generated_grpc_code_is_fresh() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = tempfile::tempdir().expect("tempdir");
    tonic_prost_build::configure()
        .out_dir(out.path())
        .emit_rerun_if_changed(false)
        .compile_protos(&[root.join("proto/commscope.proto")], &[root.join("proto")])
        .expect("protoc (the protobuf-compiler package; scripts/setup.sh installs it) failed to compile the proto");
    let fresh =
        std::fs::read_to_string(out.path().join("commscope.v1.rs")).expect("generated file");
    let checked_in = root.join("src/generated/commscope.v1.rs");
    let current = std::fs::read_to_string(&checked_in).unwrap_or_default();
    if std::env::var_os("COMMSCOPE_BLESS").is_some() {
        std::fs::write(&checked_in, &fresh).expect("write generated code");
        return;
    }
    assert!(
        current == fresh,
        "{} is stale: regenerate with `COMMSCOPE_BLESS=1 cargo test -p commscope-wire --test generated_code`",
        checked_in.display()
    );
}
