//! The golden tiny Qwen3 and GLM-4 models (tests/fixtures/golden, made by
//! scripts/make_golden.py) end to end on the GPU: prefill and greedy decode
//! steps through the paged cache, logits against the CPU runtime (f32) and
//! against transformers, in bf16 and f16.

use std::path::Path;
use std::sync::Arc;

use agentd_cuda::{CudaError, Dtype, Gpu, GpuModel, Kernels, Result, StepOpts};
use agentd_models::loader::Weights;
use agentd_models::Qwen3Model;
use agentd_runtime::{BatchBuilder, LogitsFor, Qwen3Config};
use serde_json::Value;

use crate::{rel_l2, Report};

const BLOCK: usize = 16;

struct Case {
    ids: Vec<u32>,
    all_positions: bool,
    greedy: Vec<(u32, Vec<f32>)>,
}

fn cases(dir: &Path) -> Option<Vec<Case>> {
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).ok()?).ok()?;
    let floats = |v: &Value| -> Vec<f32> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_f64())
                    .map(|x| x as f32)
                    .collect()
            })
            .unwrap_or_default()
    };
    v["cases"]
        .as_array()?
        .iter()
        .map(|c| {
            Some(Case {
                ids: c["input_ids"]
                    .as_array()?
                    .iter()
                    .filter_map(|x| x.as_u64())
                    .map(|x| x as u32)
                    .collect(),
                all_positions: c["prefill_logits_all_positions"].as_bool()?,
                greedy: c["greedy"]
                    .as_array()?
                    .iter()
                    .map(|s| {
                        (
                            s["token"].as_u64().unwrap_or(0) as u32,
                            floats(&s["logits"]),
                        )
                    })
                    .collect(),
            })
        })
        .collect()
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &x)| if x > b.1 { (i, x) } else { b },
        )
        .0 as u32
}

pub fn run(gpu: &Arc<Gpu>, fixtures: &Path, report: &mut Report) -> Result<()> {
    // Every fixture directory: Qwen3 dense, GLM-4-0414 dense, Qwen3-MoE,
    // GLM-4.5, tied and untied, GQA 1-4.
    let mut names: Vec<String> = std::fs::read_dir(fixtures)
        .map_err(|e| CudaError::Unsupported(format!("{}: {e}", fixtures.display())))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for name in &names {
        let dir = fixtures.join(name);
        let Some(cases) = cases(&dir) else {
            report.fail(
                &format!("golden {name}"),
                &format!("cannot read {}", dir.join("golden.json").display()),
            );
            continue;
        };
        let cfg = Qwen3Config::from_dir(&dir)?;
        let weights = Weights::from_dir(&dir, &candle_core::Device::Cpu)?;
        let cpu = Qwen3Model::from_weights(cfg.clone(), &weights)?;
        for dt in [Dtype::Bf16, Dtype::F16] {
            let model = GpuModel::from_weights(gpu.clone(), cfg.clone(), &weights, dt)?;
            // The validated kernels, then every kernel behind a flag
            // (--fused-prologue, --single-pass-decode, --device-moe).
            let all = Kernels {
                fused_prologue: true,
                single_pass_decode: true,
                device_moe: true,
            };
            for (label, kernels) in [("", Kernels::default()), (" +new kernels", all)] {
                let w = replay(&model, &cpu, &cases, kernels)?;
                let tag = format!("golden {name} {}{label}", dt.suffix());
                let tol = match dt {
                    Dtype::Bf16 => 5e-2,
                    Dtype::F16 => 1e-2,
                };
                report.check(&format!("{tag}: logits vs CPU runtime"), w.cpu, tol);
                report.check(&format!("{tag}: logits vs transformers"), w.hf, tol);
                println!(
                    "{tag}: greedy token equal to transformers at {}/{} steps",
                    w.same, w.steps
                );
            }
        }
    }
    Ok(())
}

/// The worst relative errors over a fixture's cases and the greedy agreement.
struct Worst {
    cpu: f64,
    hf: f64,
    same: usize,
    steps: usize,
}

/// Prefill then teacher-forced decode steps of every case on the GPU (with
/// `kernels`) and on the CPU runtime.
fn replay(model: &GpuModel, cpu: &Qwen3Model, cases: &[Case], kernels: Kernels) -> Result<Worst> {
    let mut w = Worst {
        cpu: 0.0,
        hf: 0.0,
        same: 0,
        steps: 0,
    };
    let opts = StepOpts {
        tier: None,
        kernels,
    };
    let v = model.config().vocab_size;
    for case in cases {
        let nb = (case.ids.len() + case.greedy.len()).div_ceil(BLOCK) + 1;
        let table: Vec<u32> = (0..nb as u32).rev().collect();
        let mut gcache = model.new_cache(nb, BLOCK)?;
        let mut ccache = cpu.new_cache(nb, BLOCK)?;
        let mut tokens = case.ids.clone();
        let mut cached = 0;
        for (i, (want_tok, want_logits)) in case.greedy.iter().enumerate() {
            let lf = if i == 0 && case.all_positions {
                LogitsFor::All
            } else {
                LogitsFor::Last
            };
            let mut b = BatchBuilder::new(BLOCK);
            b.push(&tokens[cached..], cached, &table, lf);
            let batch = b.build();
            let g = model.forward_after(&batch, &mut gcache, opts)?;
            let c = cpu
                .forward(&batch, &mut ccache)?
                .flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(agentd_runtime::ModelError::from)?;
            w.cpu = w.cpu.max(rel_l2(&g, &c));
            let last = &g[g.len() - v..];
            w.hf = w.hf.max(rel_l2(last, want_logits));
            w.same += usize::from(argmax(last) == *want_tok);
            w.steps += 1;
            cached = tokens.len();
            tokens.push(*want_tok); // teacher-forced: later steps stay comparable
        }
    }
    Ok(w)
}
