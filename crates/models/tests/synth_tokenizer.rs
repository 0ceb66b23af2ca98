//! Random checkpoints from model cards (bf16 / f16 / f32 loading) and the real
//! Qwen3 tokenizer with the streaming detokenizer.

mod common;

use std::path::PathBuf;

use agentd_models::config::WeightDtype;
use agentd_models::synth::{write_random_model, ModelCard};
use agentd_models::{IncrementalDecoder, LogitsFor, Model, Tokenizer};
use common::*;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tiny_card() -> ModelCard {
    ModelCard::from_file(&repo().join("models/qwen3-tiny.json")).unwrap()
}

fn small(card: &mut ModelCard) {
    // Keep the test light: the real vocabulary is not needed here.
    card.config.vocab_size = 1000;
}

#[test]
fn random_models_are_deterministic_and_load_in_every_dtype() {
    let run = |dtype: WeightDtype, seed: u64| {
        let mut card = tiny_card();
        small(&mut card);
        card.config.torch_dtype = dtype;
        let d = tempfile::tempdir().unwrap();
        write_random_model(&card.config, d.path(), seed, None).unwrap();
        let model = Model::load(d.path()).unwrap();
        let rows = prefill_five(&model);
        let bytes = std::fs::read(d.path().join("model.safetensors")).unwrap();
        (rows, bytes)
    };
    let (a, fa) = run(WeightDtype::F32, 7);
    let (b, fb) = run(WeightDtype::F32, 7);
    assert_eq!(fa, fb, "same seed, same file");
    assert_eq!(a, b);
    let (c, _) = run(WeightDtype::F32, 8);
    assert_ne!(a, c, "another seed, other weights");
    for dt in [WeightDtype::Bf16, WeightDtype::F16] {
        let (h, _) = run(dt, 7);
        assert!(h.iter().all(|x| x.is_finite()));
        // Rounding the weights to 16 bits moves the logits only a little.
        assert!(rel_err(&h, &a) < 0.05, "{dt:?}: {}", rel_err(&h, &a));
    }
}

#[test]
fn card_copies_the_tokenizer() {
    let card = tiny_card();
    assert_eq!(card.config.vocab_size, 151936);
    let d = tempfile::tempdir().unwrap();
    let mut cfg = card.config.clone();
    cfg.num_hidden_layers = 1;
    write_random_model(&cfg, d.path(), 0, card.tokenizer_dir.as_deref()).unwrap();
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(d.path().join(f).is_file(), "{f}");
    }
    let tok = Tokenizer::from_dir(d.path()).unwrap();
    assert!(tok.vocab_size() <= cfg.vocab_size);
    assert_eq!(tok.token_to_id("<|im_end|>"), Some(151645));
}

#[test]
fn streaming_detokenizer_never_splits_characters() {
    let tok = Tokenizer::from_dir(&repo().join("models/qwen3")).unwrap();
    let text = "Hello, 世界! Ünïcödé façade — emoji 🦀🚀👩‍👩‍👧 and code `let x = 1;`\n\tend";
    let ids = tok.encode(text, false).unwrap();
    assert!(ids.len() > 10);
    let mut dec = IncrementalDecoder::new(true);
    let mut out = String::new();
    for &id in &ids {
        if let Some(piece) = dec.push(&tok, id).unwrap() {
            assert!(!piece.contains('\u{FFFD}'), "broken piece {piece:?}");
            out.push_str(&piece);
        }
    }
    if let Some(rest) = dec.flush(&tok).unwrap() {
        out.push_str(&rest);
    }
    assert_eq!(out, tok.decode(&ids, true).unwrap());
    assert_eq!(out, text);
}

/// Every card in models/ (each family) parses, and a narrowed copy of it
/// (same family, heads and experts; small hidden size and vocabulary) is
/// generated, loads and runs a step.
#[test]
fn every_model_card_generates_a_model_that_runs() {
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(repo().join("models")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let mut card = ModelCard::from_file(&path).unwrap();
        let c = &mut card.config;
        (c.vocab_size, c.hidden_size, c.intermediate_size) = (1000, 64, 64);
        c.num_hidden_layers = c.num_hidden_layers.min(2);
        if let Some(moe) = c.moe.as_mut() {
            moe.moe_intermediate_size = 16;
        }
        c.torch_dtype = WeightDtype::F32;
        let d = tempfile::tempdir().unwrap();
        write_random_model(&card.config, d.path(), 3, None).unwrap();
        let model = Model::load(d.path()).unwrap();
        assert_eq!(model.family(), card.config.family);
        let rows = prefill_five(&model);
        assert!(rows.iter().all(|x| x.is_finite()), "{}", path.display());
        seen.push(card.config.family);
    }
    for f in ["qwen3", "glm4", "qwen3_moe", "glm4_moe"] {
        assert!(seen.iter().any(|s| s.model_type() == f), "no card for {f}");
    }
}

/// The last-position logits of the prompt 1..=5.
fn prefill_five(model: &Model) -> Vec<f32> {
    let mut cache = model.new_cache(8, 16).unwrap();
    let mut pool = BlockPool::new(8, 0);
    let mut s = Seq::new(&[1, 2, 3, 4, 5]);
    let rows = step(
        model,
        &mut cache,
        &mut pool,
        &mut [&mut s],
        &[(5, LogitsFor::Last)],
    );
    rows.into_iter().next().unwrap()
}
