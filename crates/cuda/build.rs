//! With the `cuda` feature, compiles every `kernels/*.cu` into a fat binary
//! (machine code for sm_90a and sm_120, plus compute_90 PTX for anything newer)
//! that the crate embeds. Without the feature this does nothing, so builds and
//! tests need no CUDA toolkit.
//!
//! nvcc is taken from `$NVCC`, then `$CUDA_HOME/bin/nvcc`, then `PATH`.
//! `AGENTD_CUDA_GENCODE` replaces the target list (space-separated `-gencode`
//! values, e.g. `arch=compute_90a,code=sm_90a`).

use std::path::{Path, PathBuf};
use std::process::Command;

const KERNELS: [&str; 6] = ["layers", "cache", "attention", "decode_1p", "moe", "sample"];
const DEFAULT_GENCODE: [&str; 3] = [
    "arch=compute_90a,code=sm_90a",
    "arch=compute_120,code=sm_120",
    "arch=compute_90,code=compute_90",
];

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
    println!("cargo:rerun-if-changed={}", dir.display());
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    println!("cargo:rerun-if-env-changed=AGENTD_CUDA_GENCODE");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let nvcc = find_nvcc();
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let gencode: Vec<String> = match std::env::var("AGENTD_CUDA_GENCODE") {
        Ok(v) => v.split_whitespace().map(str::to_string).collect(),
        Err(_) => DEFAULT_GENCODE.iter().map(|s| s.to_string()).collect(),
    };
    for k in KERNELS {
        let src = dir.join(format!("{k}.cu"));
        let dst = out.join(format!("{k}.fatbin"));
        let mut cmd = Command::new(&nvcc);
        cmd.args(["-fatbin", "-O3", "-std=c++17"]);
        for g in &gencode {
            cmd.arg(format!("-gencode={g}"));
        }
        cmd.arg("-I").arg(&dir).arg("-o").arg(&dst).arg(&src);
        let status = cmd.status().unwrap_or_else(|e| {
            panic!(
                "agentd-cuda: could not run nvcc ({}): {e}. Install a CUDA 13 nvcc \
                 (scripts/cuda-toolchain.sh) or build without --features cuda",
                nvcc.display()
            )
        });
        assert!(
            status.success(),
            "agentd-cuda: nvcc failed on {}",
            src.display()
        );
    }
}

fn find_nvcc() -> PathBuf {
    if let Some(p) = std::env::var_os("NVCC") {
        return PathBuf::from(p);
    }
    if let Some(home) = std::env::var_os("CUDA_HOME") {
        let p = PathBuf::from(home).join("bin/nvcc");
        if p.exists() {
            return p;
        }
    }
    PathBuf::from("nvcc")
}
