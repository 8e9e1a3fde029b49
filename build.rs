//! Generates the C header for the public C ABI with cbindgen.
//!
//! The header is written to `$OUT_DIR/nvshmem_efa_gda.h`; the committed copy in `include/` is checked
//! against it by `tests/header_fresh.rs`. Set `NVSHMEM_EFA_GDA_WRITE_HEADER=1` to refresh the committed
//! copy. The build also records where libfabric's library directory is, so that binaries built here
//! find the same libfabric they were linked against (RUNPATH; `LD_LIBRARY_PATH` still wins).
use std::path::PathBuf;

fn main() {
    let crate_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-env-changed=NVSHMEM_EFA_GDA_WRITE_HEADER");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let generated = out_dir.join("nvshmem_efa_gda.h");
    cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen failed to generate the header")
        .write_to_file(&generated);
    println!(
        "cargo:rustc-env=NVSHMEM_EFA_GDA_GENERATED_HEADER={}",
        generated.display()
    );
    if std::env::var_os("NVSHMEM_EFA_GDA_WRITE_HEADER").is_some_and(|v| v == "1") {
        std::fs::copy(&generated, crate_dir.join("include/nvshmem_efa_gda.h"))
            .expect("copy header");
    }

    // RUNPATH: $ORIGIN (installed layout keeps libfabric next to the plugin if the user wants) and the
    // libfabric the build linked against.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvshmem_efa_gda.so");
    println!("cargo:rustc-link-arg=-Wl,-rpath,$ORIGIN");
    if let Ok(out) = std::process::Command::new("pkg-config")
        .args(["--variable=libdir", "libfabric"])
        .output()
    {
        if out.status.success() {
            let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !dir.is_empty() {
                println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
            }
        }
    }
}
