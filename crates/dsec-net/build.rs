//! Compiles the eBPF programs (bpf/*.bpf.c) with clang `-target bpf`
//! against libbpf-dev's headers (scripts/deps.sh installs both): the
//! programs need no nightly Rust toolchain this way.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "bpf/egress.bpf.c";
    println!("cargo:rerun-if-changed={src}");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("egress.bpf.o");
    let clang = std::env::var("DSEC_BPF_CLANG").unwrap_or_else(|_| "clang".into());
    let arch_include = format!("/usr/include/{}-linux-gnu", std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default());
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror", "-I", &arch_include, "-c", src, "-o"])
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("running {clang} to build the eBPF programs (install clang and libbpf-dev: scripts/deps.sh): {e}"));
    assert!(status.success(), "{clang} failed to compile {src}");
}
