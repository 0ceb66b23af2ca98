//! `agentd-gpu-check`: the device-side check of the CUDA backend, meant to run
//! on a GPU machine from a binary built elsewhere (scripts/gpu-check.sh).
//!
//! 1. every kernel against its CPU reference (and the fused prologue
//!    against the launches it replaces) on fresh random inputs, outputs
//!    poisoned first so unwritten elements are caught (both bf16 and f16);
//! 2. the golden tiny models (tests/fixtures/golden) end to end: GPU logits
//!    against the CPU runtime and transformers, greedy tokens, on the
//!    validated kernels and again with every flagged kernel on; the device
//!    MoE routing and layout against the CPU router (`--skip-golden`);
//! 3. the device sampler against its reference, and its time against the
//!    logits download it replaces (`--skip-sampling`);
//! 4. the host KV tier: a round trip bit-exact and its copy bandwidth
//!    (`--skip-tier`);
//! 5. decode CUDA graphs against the eager step, and both timed
//!    (`--skip-graphs`);
//! 6. decode step time at Qwen3-0.6B and -8B shapes, batch 1/32/128, against
//!    the HBM roofline (weight + KV bytes / measured copy bandwidth).
//!
//! Exits non-zero when any check fails.

mod golden;
mod graphs;
mod kernels;
mod moe;
mod prologue;
mod sampling;
mod tier;
mod timing;

use std::path::PathBuf;
use std::sync::Arc;

use agentd_cuda::Gpu;

pub struct Report {
    pub lines: Vec<String>,
    pub failures: usize,
}

impl Report {
    pub fn check(&mut self, what: &str, err: f64, tol: f64) {
        let ok = err.is_finite() && err <= tol;
        if !ok {
            self.failures += 1;
        }
        let line = format!(
            "{:<52} rel err {err:.2e} (tol {tol:.0e}) {}",
            what,
            if ok { "ok" } else { "FAIL" }
        );
        println!("{line}");
        self.lines.push(line);
    }

    pub fn fail(&mut self, what: &str, why: &str) {
        self.failures += 1;
        let line = format!("{what:<52} FAIL: {why}");
        println!("{line}");
        self.lines.push(line);
    }
}

/// ‖a − b‖₂ / ‖b‖₂ in f64.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let (mut num, mut den) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (*x as f64, *y as f64);
        num += (x - y) * (x - y);
        den += y * y;
    }
    (num / den.max(1e-30)).sqrt()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| args.iter().any(|a| a == name);
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let fixtures =
        PathBuf::from(value("--fixtures").unwrap_or_else(|| "tests/fixtures/golden".into()));
    if !Gpu::available() {
        eprintln!("agentd-gpu-check: no CUDA device here (driver library missing or no GPU); nothing to check");
        std::process::exit(2);
    }
    let gpu = match Gpu::new(0) {
        Ok(g) => Arc::new(g),
        Err(e) => {
            eprintln!("agentd-gpu-check: {e}");
            std::process::exit(1);
        }
    };
    println!(
        "device: {} (compute capability {:?})",
        gpu.name(),
        gpu.compute_capability().ok()
    );
    let mut report = Report {
        lines: Vec::new(),
        failures: 0,
    };
    if !flag("--skip-kernels") {
        if let Err(e) = kernels::run(&gpu, &mut report) {
            report.fail("kernel checks", &e.to_string());
        }
        if let Err(e) = prologue::run(&gpu, &mut report) {
            report.fail("fused prologue", &e.to_string());
        }
    }
    if !flag("--skip-sampling") {
        if let Err(e) = sampling::run(&gpu, &mut report) {
            report.fail("device sampling", &e.to_string());
        }
    }
    if !flag("--skip-tier") {
        if let Err(e) = tier::run(&gpu, &mut report) {
            report.fail("host KV tier", &e.to_string());
        }
    }
    if !flag("--skip-graphs") {
        if let Err(e) = graphs::run(&mut report) {
            report.fail("decode graphs", &e.to_string());
        }
    }
    if !flag("--skip-golden") {
        if let Err(e) = golden::run(&gpu, &fixtures, &mut report) {
            report.fail("golden models", &e.to_string());
        }
        if let Err(e) = moe::run(&gpu, &fixtures, &mut report) {
            report.fail("device moe", &e.to_string());
        }
    }
    if !flag("--skip-timing") {
        let batches: Vec<usize> = value("--batches")
            .map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
            .unwrap_or_else(|| vec![1, 32, 128]);
        let context: usize = value("--context")
            .and_then(|s| s.parse().ok())
            .unwrap_or(1024);
        if let Err(e) = timing::run(&gpu, &batches, context, &mut report) {
            report.fail("timing", &e.to_string());
        }
    }
    println!("\n{} checks failed", report.failures);
    std::process::exit(if report.failures == 0 { 0 } else { 1 });
}
