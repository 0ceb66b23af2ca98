//! bf16 weights kept in bf16 (`Model::load_with(dir, true)`): the golden
//! fixtures rewritten as bf16 checkpoints, for every family. The bf16 load
//! gives bit for bit the logits of the f32 load of the same file (the
//! kernels widen exactly and keep their FMA order), its rows stay
//! batch-invariant, and (dense families) its logits stay within bf16
//! tolerance of transformers' f32 goldens.

mod common;

use agentd_models::{LogitsFor, Model};
use candle_core::{DType, Device};
use common::*;
use std::path::Path;

fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `fixture` rewritten with every tensor in bf16, into `out`.
fn bf16_copy(fixture: &Path, out: &Path) {
    std::fs::copy(fixture.join("config.json"), out.join("config.json")).unwrap();
    let tensors = candle_core::safetensors::load(fixture.join("model.safetensors"), &Device::Cpu)
        .expect("fixture weights");
    let bf16: std::collections::HashMap<_, _> = tensors
        .into_iter()
        .map(|(k, t)| (k, t.to_dtype(DType::BF16).unwrap()))
        .collect();
    candle_core::safetensors::save(&bf16, out.join("model.safetensors")).unwrap();
}

fn prefill_last(model: &Model, prompts: &[&[u32]]) -> Vec<Vec<f32>> {
    let mut cache = model.new_cache(128, 16).unwrap();
    let mut pool = BlockPool::new(128, 3);
    let mut seqs: Vec<Seq> = prompts.iter().map(|p| Seq::new(p)).collect();
    let chunks: Vec<_> = seqs
        .iter()
        .map(|s| (s.tokens.len(), LogitsFor::Last))
        .collect();
    let mut refs: Vec<&mut Seq> = seqs.iter_mut().collect();
    step(model, &mut cache, &mut pool, &mut refs, &chunks)
}

#[test]
fn bf16_load_equals_f32_load_of_the_same_weights() {
    for name in MODELS {
        let dir = tempfile::tempdir().unwrap();
        bf16_copy(&fixture_dir(name), dir.path());
        let widened = Model::load(dir.path()).expect("f32 load of bf16 file");
        let kept = Model::load_with(dir.path(), true).expect("bf16 load");
        let cases = golden(name);
        let prompts: Vec<&[u32]> = cases.iter().map(|c| &c.input_ids[..]).collect();
        let (a, b) = (
            prefill_last(&widened, &prompts),
            prefill_last(&kept, &prompts),
        );
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            if avx512() {
                assert!(
                    x == y,
                    "{name} seq {i}: bf16 load != f32 load of the same weights"
                );
            } else {
                assert!(rel_err(x, y) < 1e-5, "{name} seq {i}");
            }
        }
        if avx512() {
            for (i, p) in prompts.iter().enumerate() {
                let alone = prefill_last(&kept, &[p]);
                assert!(alone[0] == b[i], "{name} seq {i}: bf16 batched != alone");
            }
        }
        // Against transformers' f32 weights: bf16 has 8 mantissa bits. Not
        // for MoE: the fixtures' near-tied router scores (made to test ties)
        // pick other experts once rounded, a discontinuous change.
        if name.contains("moe") {
            continue;
        }
        for (i, c) in cases.iter().enumerate() {
            let want = &c.prefill_logits[c.prefill_logits.len() - 1];
            let e = rel_err(&b[i], want);
            assert!(e < 5e-2, "{name} seq {i}: rel err {e} vs f32 golden");
        }
    }
}
