//! Device MoE (`--device-moe`, kernels/moe.cu), below the golden models'
//! end-to-end check: on each MoE fixture's first sparse layer, random
//! router logits for 1, 37 and 300 tokens routed on the device against the
//! CPU router (`agentd_runtime::router::route`: the same experts, weights
//! within f32 rounding) and the pair layout against
//! [`agentd_cuda::moe_plan::align`] (offsets, blocks, sorted pairs and
//! rows equal).

use std::path::Path;
use std::sync::Arc;

use agentd_cuda::moe_plan::align;
use agentd_cuda::{Dtype, Gpu, GpuModel, Result};
use agentd_models::loader::Weights;
use agentd_runtime::router::route;
use agentd_runtime::Qwen3Config;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{rel_l2, Report};

pub fn run(gpu: &Arc<Gpu>, fixtures: &Path, report: &mut Report) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(29);
    for name in [
        "qwen3moe-gqa2",
        "qwen3moe-gqa1-tied",
        "glm4moe-gqa2",
        "glm4moe-gqa1-tied",
    ] {
        let dir = fixtures.join(name);
        let cfg = Qwen3Config::from_dir(&dir)?;
        let Some(moe) = cfg.moe.clone() else {
            report.fail(&format!("device moe {name}"), "not a MoE config");
            continue;
        };
        let Some(layer) = (0..cfg.num_hidden_layers).find(|&i| moe.is_sparse(i)) else {
            report.fail(&format!("device moe {name}"), "no sparse layer");
            continue;
        };
        let weights = Weights::from_dir(&dir, &candle_core::Device::Cpu)?;
        let e = moe.num_experts;
        let bias_name = format!("model.layers.{layer}.mlp.gate.e_score_correction_bias");
        let bias = weights.get_f32(&bias_name, &[e]).ok();
        let model = GpuModel::from_weights(gpu.clone(), cfg.clone(), &weights, Dtype::Bf16)?;
        for t in [1usize, 37, 300] {
            let logits: Vec<f32> = (0..t * e).map(|_| rng.gen_range(-4.0..4.0)).collect();
            let got = model.route_for_check(layer, &gpu.upload(&logits)?, t)?;
            let (mut ids, mut w) = (Vec::new(), Vec::new());
            for row in logits.chunks_exact(e) {
                for c in route(row, bias.as_deref(), &moe) {
                    ids.push(c.expert as i32);
                    w.push(c.weight);
                }
            }
            let tag = format!("device moe {name} t{t}");
            let differing = ids.iter().zip(&got.ids).filter(|(a, b)| a != b).count();
            report.check(&format!("{tag}: experts differing"), differing as f64, 0.0);
            report.check(&format!("{tag}: weights"), rel_l2(&got.weights, &w), 1e-5);
            let want = align(&got.ids, e);
            let same = want.offsets == got.offsets
                && want.block_expert == got.block_expert
                && want.sorted == got.sorted
                && want.row_of == got.row_of;
            report.check(
                &format!("{tag}: layout vs align"),
                f64::from(u8::from(!same)),
                0.0,
            );
        }
    }
    Ok(())
}
