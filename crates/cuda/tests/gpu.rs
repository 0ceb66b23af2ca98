//! The CUDA backend on a real GPU: the golden tiny model's logits against the
//! CPU runtime, through prefill and decode steps over the paged cache. Built
//! only with `--features cuda`; on a machine without a GPU each test says so
//! and returns (scripts/gpu-check.sh is the full device-side check).
#![cfg(feature = "cuda")]

use std::path::PathBuf;
use std::sync::Arc;

use agentd_cuda::{Dtype, Gpu, GpuModel};
use agentd_models::Qwen3Model;
use agentd_runtime::loader::Weights;
use agentd_runtime::{BatchBuilder, LogitsFor, Qwen3Config};

fn gpu() -> Option<Arc<Gpu>> {
    if !Gpu::available() {
        eprintln!("SKIPPED: no CUDA device on this machine (run scripts/gpu-check.sh on one)");
        return None;
    }
    Some(Arc::new(Gpu::new(0).expect("the CUDA device opens")))
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

#[test]
fn golden_model_on_the_gpu_matches_the_cpu_runtime() {
    let Some(gpu) = gpu() else { return };
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/golden/gqa2-untied");
    let cfg = Qwen3Config::from_dir(&dir).expect("config");
    let weights = Weights::from_dir(&dir, &candle_core::Device::Cpu).expect("weights");
    let cpu = Qwen3Model::from_weights(cfg.clone(), &weights).expect("cpu model");
    let model = GpuModel::from_weights(gpu, cfg, &weights, Dtype::F16).expect("gpu model");
    let (mut gc, mut cc) = (
        model.new_cache(8, 16).expect("cache"),
        cpu.new_cache(8, 16).expect("cache"),
    );
    let table: Vec<u32> = vec![5, 2, 7, 0];
    let mut tokens: Vec<u32> = (3..40).collect();
    let mut cached = 0;
    for _ in 0..4 {
        let mut b = BatchBuilder::new(16);
        b.push(&tokens[cached..], cached, &table, LogitsFor::Last);
        let batch = b.build();
        let g = model.forward(&batch, &mut gc).expect("gpu forward");
        let c: Vec<f32> = cpu
            .forward(&batch, &mut cc)
            .expect("cpu forward")
            .flatten_all()
            .and_then(|t| t.to_vec1())
            .expect("logits");
        let e = rel_l2(&g, &c);
        assert!(e < 1e-2, "f16 logits rel err {e}");
        cached = tokens.len();
        let next = g
            .iter()
            .enumerate()
            .fold((0, f32::MIN), |m, (i, &x)| if x > m.1 { (i, x) } else { m })
            .0;
        tokens.push(next as u32);
    }
}
