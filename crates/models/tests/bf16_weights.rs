//! 16-bit weights kept as stored (`Model::load_as(dir, LoadDtype::Auto)`):
//! the golden fixtures rewritten as bf16 and as f16 checkpoints, for every
//! family. The kept load gives bit for bit the logits of the f32 load of the
//! same file (the kernels widen exactly and keep their FMA order), holds
//! about half the f32 load's bytes, its rows stay batch-invariant, and
//! (dense families) its logits stay within 16-bit tolerance of transformers'
//! f32 goldens. `--dtype` casts (f32 file loaded as bf16) round like torch.

mod common;

use agentd_models::{LoadDtype, LogitsFor, Model, WeightDtype};
use candle_core::{DType, Device};
use common::*;
use std::path::Path;

/// Everything below again under each other kernel path the CPU has.
#[test]
fn every_kernel_path() {
    rerun_under_other_kernel_paths("every_kernel_path");
}

/// `fixture` rewritten with every tensor in `dtype`, into `out`.
fn converted_copy(fixture: &Path, out: &Path, dtype: DType) {
    std::fs::copy(fixture.join("config.json"), out.join("config.json")).unwrap();
    let tensors = candle_core::safetensors::load(fixture.join("model.safetensors"), &Device::Cpu)
        .expect("fixture weights");
    let narrow: std::collections::HashMap<_, _> = tensors
        .into_iter()
        .map(|(k, t)| (k, t.to_dtype(dtype).unwrap()))
        .collect();
    candle_core::safetensors::save(&narrow, out.join("model.safetensors")).unwrap();
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

fn kept_load_equals_f32_load(dtype: DType, tolerance: f32) {
    for name in MODELS {
        let dir = tempfile::tempdir().unwrap();
        converted_copy(&fixture_dir(name), dir.path(), dtype);
        let widened = Model::load(dir.path()).expect("f32 load of a 16-bit file");
        let kept = Model::load_as(dir.path(), LoadDtype::Auto).expect("16-bit load");
        // Matrices are 2 bytes instead of 4; norms and biases stay f32.
        let ratio = kept.weight_bytes() as f64 / widened.weight_bytes() as f64;
        assert!(
            (0.5..0.55).contains(&ratio),
            "{name} {dtype:?}: kept {} vs widened {} bytes",
            kept.weight_bytes(),
            widened.weight_bytes()
        );
        let cases = golden(name);
        let prompts: Vec<&[u32]> = cases.iter().map(|c| &c.input_ids[..]).collect();
        let (a, b) = (
            prefill_last(&widened, &prompts),
            prefill_last(&kept, &prompts),
        );
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            if vectorised_kernels() {
                assert!(
                    x == y,
                    "{name} {dtype:?} seq {i}: kept load != f32 load of the same weights"
                );
            } else {
                assert!(rel_err(x, y) < 1e-5, "{name} {dtype:?} seq {i}");
            }
        }
        if vectorised_kernels() {
            for (i, p) in prompts.iter().enumerate() {
                let alone = prefill_last(&kept, &[p]);
                assert!(
                    alone[0] == b[i],
                    "{name} {dtype:?} seq {i}: batched != alone"
                );
            }
        }
        // Against transformers' f32 weights. Not for MoE: the fixtures'
        // near-tied router scores (made to test ties) pick other experts
        // once rounded, a discontinuous change.
        if name.contains("moe") {
            continue;
        }
        for (i, c) in cases.iter().enumerate() {
            let want = &c.prefill_logits[c.prefill_logits.len() - 1];
            let e = rel_err(&b[i], want);
            assert!(
                e < tolerance,
                "{name} {dtype:?} seq {i}: rel err {e} vs f32 golden"
            );
        }
    }
}

#[test]
fn bf16_load_equals_f32_load_of_the_same_weights() {
    // bf16 keeps 8 mantissa bits.
    kept_load_equals_f32_load(DType::BF16, 5e-2);
}

#[test]
fn f16_load_equals_f32_load_of_the_same_weights() {
    // f16 keeps 11.
    kept_load_equals_f32_load(DType::F16, 1e-2);
}

/// `--dtype bfloat16` on an f32 checkpoint rounds every matrix to bf16 at
/// load: the same logits as loading a file whose matrices were rounded to
/// bf16 beforehand (norms and biases f32 in both).
#[test]
fn cast_at_load_equals_a_rounded_checkpoint() {
    let name = "glm4-gqa2";
    let dir = tempfile::tempdir().unwrap();
    converted_copy(&fixture_dir(name), dir.path(), DType::BF16);
    let rounded = Model::load_as(dir.path(), LoadDtype::Auto).unwrap();
    let cast = Model::load_as(&fixture_dir(name), LoadDtype::Cast(WeightDtype::Bf16)).unwrap();
    assert_eq!(cast.weight_bytes(), rounded.weight_bytes());
    let cases = golden(name);
    let prompts: Vec<&[u32]> = cases.iter().map(|c| &c.input_ids[..]).collect();
    let (a, b) = (
        prefill_last(&rounded, &prompts),
        prefill_last(&cast, &prompts),
    );
    // The rounded file also rounded norms and biases: close, not equal.
    for (x, y) in a.iter().zip(&b) {
        assert!(rel_err(x, y) < 2e-2, "{}", rel_err(x, y));
    }
    let f32_load = load(name);
    let c = prefill_last(&f32_load, &prompts);
    assert!(
        a.iter().zip(&c).any(|(x, y)| x != y),
        "the cast changed nothing"
    );
}
