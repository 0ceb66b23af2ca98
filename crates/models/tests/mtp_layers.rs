//! GLM-4.5's multi-token-prediction layers: `make-model` writes them for a
//! `glm4_moe` card with `num_nextn_predict_layers > 0` under the names real
//! checkpoints use (`model.layers.{num_hidden_layers}.eh_proj`, `enorm`,
//! `hnorm`, `shared_head.*` and a full MoE decoder layer), and loading skips
//! them: no error, none of their bytes held, the same logits as the same
//! checkpoint without them.

mod common;

use std::path::PathBuf;

use agentd_models::loader::Weights;
use agentd_models::synth::{write_random_model, ModelCard};
use agentd_models::{LoadDtype, LogitsFor, Model, ModelConfig};
use candle_core::Device;
use common::*;

fn card() -> ModelCard {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/glm4.5-air-scaled.json");
    let mut card = ModelCard::from_file(&path).unwrap();
    // Narrowed to test size; heads, experts and routing as the card says.
    let c = &mut card.config;
    (c.vocab_size, c.hidden_size, c.intermediate_size) = (1000, 64, 64);
    c.num_hidden_layers = 2;
    c.moe.as_mut().unwrap().moe_intermediate_size = 16;
    card
}

fn last_logits(model: &Model) -> Vec<f32> {
    let mut cache = model.new_cache(8, 16).unwrap();
    let mut pool = BlockPool::new(8, 0);
    let mut s = Seq::new(&[5, 9, 2, 7, 1, 3]);
    step(
        model,
        &mut cache,
        &mut pool,
        &mut [&mut s],
        &[(6, LogitsFor::Last)],
    )
    .pop()
    .unwrap()
}

#[test]
fn mtp_layers_are_written_and_skipped_at_load() {
    let card = card();
    let n = card.config.num_hidden_layers;
    assert_eq!(
        card.config.moe.as_ref().unwrap().num_nextn_predict_layers,
        1,
        "the GLM-4.5-Air card has one MTP layer, like the real model"
    );
    let with = tempfile::tempdir().unwrap();
    write_random_model(&card.config, with.path(), 5, None).unwrap();
    let mut plain_cfg = card.config.clone();
    plain_cfg.moe.as_mut().unwrap().num_nextn_predict_layers = 0;
    let without = tempfile::tempdir().unwrap();
    write_random_model(&plain_cfg, without.path(), 5, None).unwrap();

    // The config round-trips the field.
    let cfg = ModelConfig::from_dir(with.path()).unwrap();
    assert_eq!(cfg.moe.as_ref().unwrap().num_nextn_predict_layers, 1);

    let weights = Weights::from_dir(with.path(), &Device::Cpu).unwrap();
    let p = format!("model.layers.{n}");
    for t in [
        "eh_proj.weight",
        "enorm.weight",
        "hnorm.weight",
        "shared_head.norm.weight",
        "shared_head.head.weight",
        "self_attn.q_proj.weight",
        "mlp.gate.e_score_correction_bias",
        "mlp.experts.0.down_proj.weight",
        "mlp.shared_experts.up_proj.weight",
    ] {
        assert!(weights.contains(&format!("{p}.{t}")), "no {p}.{t}");
    }

    // Loading reads only layers below num_hidden_layers: the MTP tensors,
    // and only they, are never handed out (so never copied into memory).
    let model = Model::from_weights(cfg, &weights).unwrap();
    let unused = weights.unused();
    assert!(!unused.is_empty());
    assert!(
        unused.iter().all(|t| t.starts_with(&format!("{p}."))),
        "{unused:?}"
    );
    let plain = Model::load_as(without.path(), LoadDtype::Auto).unwrap();
    assert_eq!(model.weight_bytes(), plain.weight_bytes());
    assert!(last_logits(&model) == last_logits(&plain));
}
