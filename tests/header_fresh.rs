//! The committed C header must equal what cbindgen generates from the current sources.
#[test]
fn committed_header_matches_cbindgen_output() {
    let generated = std::fs::read_to_string(env!("NVSHMEM_EFA_GDA_GENERATED_HEADER"))
        .expect("generated header");
    let committed_path = concat!(env!("CARGO_MANIFEST_DIR"), "/include/nvshmem_efa_gda.h");
    let committed = std::fs::read_to_string(committed_path).unwrap_or_default();
    assert!(
        generated == committed,
        "include/nvshmem_efa_gda.h is stale: regenerate it with `NVSHMEM_EFA_GDA_WRITE_HEADER=1 cargo build` and commit it"
    );
}
