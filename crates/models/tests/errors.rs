//! Bad model directories and bad inputs end in errors that name the file,
//! tensor or field at fault, never in a panic.

mod common;

use std::path::Path;

use agentd_models::{BatchBuilder, LogitsFor, Model, ModelError};
use common::*;

fn copy_fixture(name: &str, to: &Path) {
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture_dir(name).join(f), to.join(f)).unwrap();
    }
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&p, v.to_string()).unwrap();
}

fn load_err(dir: &Path) -> String {
    match Model::load(dir) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn missing_config_or_weights() {
    let d = tempfile::tempdir().unwrap();
    let msg = load_err(d.path());
    assert!(msg.contains("config.json"), "{msg}");
    std::fs::copy(
        fixture_dir("gqa4-tied").join("config.json"),
        d.path().join("config.json"),
    )
    .unwrap();
    let msg = load_err(d.path());
    assert!(msg.contains("model.safetensors"), "{msg}");
}

#[test]
fn unknown_architecture_and_bad_fields() {
    let d = tempfile::tempdir().unwrap();
    copy_fixture("gqa4-tied", d.path());
    edit_config(d.path(), |v| {
        v["architectures"] = serde_json::json!(["LlamaForCausalLM"])
    });
    let msg = load_err(d.path());
    assert!(
        msg.contains("LlamaForCausalLM") && msg.contains("config.json"),
        "{msg}"
    );

    copy_fixture("gqa4-tied", d.path());
    edit_config(d.path(), |v| v["model_type"] = serde_json::json!("llama"));
    let msg = load_err(d.path());
    assert!(
        msg.contains("model_type") && msg.contains("\"llama\"") && msg.contains("glm4_moe"),
        "{msg}"
    );

    // A MoE config without its expert count names the field.
    copy_fixture("qwen3moe-gqa2", d.path());
    edit_config(d.path(), |v| {
        v.as_object_mut().unwrap().remove("num_local_experts");
    });
    let msg = load_err(d.path());
    assert!(
        msg.contains("num_experts") && msg.contains("missing"),
        "{msg}"
    );

    copy_fixture("glm4moe-gqa2", d.path());
    edit_config(d.path(), |v| v["n_group"] = serde_json::json!(3));
    let msg = load_err(d.path());
    assert!(msg.contains("n_group"), "{msg}");

    copy_fixture("gqa4-tied", d.path());
    edit_config(d.path(), |v| v["hidden_size"] = serde_json::json!("wide"));
    let msg = load_err(d.path());
    assert!(msg.contains("hidden_size"), "{msg}");

    copy_fixture("gqa4-tied", d.path());
    edit_config(d.path(), |v| {
        v.as_object_mut().unwrap().remove("vocab_size");
    });
    let msg = load_err(d.path());
    assert!(
        msg.contains("vocab_size") && msg.contains("missing"),
        "{msg}"
    );

    copy_fixture("gqa4-tied", d.path());
    edit_config(d.path(), |v| {
        v["num_key_value_heads"] = serde_json::json!(3)
    });
    let msg = load_err(d.path());
    assert!(msg.contains("num_key_value_heads"), "{msg}");

    copy_fixture("gqa4-tied", d.path());
    edit_config(d.path(), |v| {
        v["rope_parameters"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0})
    });
    let msg = load_err(d.path());
    assert!(
        msg.contains("rope_scaling") && msg.contains("yarn"),
        "{msg}"
    );

    std::fs::write(d.path().join("config.json"), "{not json").unwrap();
    let msg = load_err(d.path());
    assert!(msg.contains("config.json") && msg.contains("JSON"), "{msg}");
}

#[test]
fn shape_mismatch_and_missing_tensor_name_the_tensor() {
    let d = tempfile::tempdir().unwrap();
    copy_fixture("gqa2-untied", d.path());
    edit_config(d.path(), |v| {
        v["intermediate_size"] = serde_json::json!(100)
    });
    let msg = load_err(d.path());
    assert!(
        msg.contains("model.layers.0.mlp.gate_proj.weight")
            && msg.contains("model.safetensors")
            && msg.contains("[100, 64]"),
        "{msg}"
    );

    copy_fixture("gqa2-untied", d.path());
    edit_config(d.path(), |v| v["num_hidden_layers"] = serde_json::json!(3));
    let msg = load_err(d.path());
    assert!(
        msg.contains("model.layers.2.") && msg.contains("not found"),
        "{msg}"
    );

    // An untied config over a tied checkpoint lacks lm_head.weight.
    copy_fixture("gqa4-tied", d.path());
    edit_config(d.path(), |v| {
        v["tie_word_embeddings"] = serde_json::json!(false)
    });
    let msg = load_err(d.path());
    assert!(msg.contains("lm_head.weight"), "{msg}");

    // A truncated weights file.
    copy_fixture("gqa4-tied", d.path());
    std::fs::write(d.path().join("model.safetensors"), b"\x10\x00\x00\x00").unwrap();
    let msg = load_err(d.path());
    assert!(msg.contains("model.safetensors"), "{msg}");
}

#[test]
fn prompt_longer_than_max_positions_is_an_error() {
    let model = load("gqa4-tied");
    let max = model.config().max_position_embeddings;
    let prompt: Vec<u32> = (0..max as u32 + 1).map(|i| 3 + i % 500).collect();
    let mut cache = model.new_cache(max / 16 + 2, 16).unwrap();
    let table: Vec<u32> = (0..(max / 16 + 2) as u32).collect();
    let mut b = BatchBuilder::new(16);
    b.push(&prompt, 0, &table, LogitsFor::Last);
    let err = model.forward(&b.build(), &mut cache).unwrap_err();
    assert!(matches!(err, ModelError::ContextTooLong { .. }), "{err}");
    assert!(err.to_string().contains("max_position_embeddings"), "{err}");
}

#[test]
fn malformed_batches_are_errors() {
    let model = load("gqa4-tied");
    let mut cache = model.new_cache(4, 16).unwrap();
    let run = |b: agentd_models::BatchInput, cache: &mut agentd_models::PagedKvCache| {
        model.forward(&b, cache).unwrap_err().to_string()
    };
    // Block table too short for the tokens.
    let mut b = BatchBuilder::new(16);
    b.push(&[5; 20], 0, &[1], LogitsFor::Last);
    assert!(run(b.build(), &mut cache).contains("block"));
    // Block id beyond the cache.
    let mut b = BatchBuilder::new(16);
    b.push(&[5; 3], 0, &[9], LogitsFor::Last);
    assert!(run(b.build(), &mut cache).contains("block id 9"));
    // Token id beyond the vocabulary.
    let mut b = BatchBuilder::new(16);
    b.push(&[9999], 0, &[0], LogitsFor::Last);
    assert!(run(b.build(), &mut cache).contains("vocab_size"));
    // Slot that disagrees with the block table.
    let mut b = BatchBuilder::new(16);
    b.push(&[5, 6], 0, &[0], LogitsFor::Last);
    let mut batch = b.build();
    batch.slot_mapping[1] = 40;
    assert!(run(batch, &mut cache).contains("slot"));
    // Empty batch.
    assert!(run(BatchBuilder::new(16).build(), &mut cache).contains("no tokens"));
    // Cache of another model's geometry.
    let other = load("gqa2-untied");
    let mut wrong = other.new_cache(4, 16).unwrap();
    let mut b = BatchBuilder::new(16);
    b.push(&[5], 0, &[0], LogitsFor::Last);
    assert!(run(b.build(), &mut wrong).contains("KV cache"));
}

/// The same checkpoint split over two shards with an index loads to the same
/// logits; a missing shard is named.
#[test]
fn sharded_checkpoint_loads() {
    use safetensors::SafeTensors;
    let src = std::fs::read(fixture_dir("gqa2-untied").join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&src).unwrap();
    let d = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture_dir("gqa2-untied").join("config.json"),
        d.path().join("config.json"),
    )
    .unwrap();
    let names: Vec<String> = {
        let mut n: Vec<String> = st.names().into_iter().map(str::to_owned).collect();
        n.sort();
        n
    };
    let mut map = serde_json::Map::new();
    for (i, part) in names.chunks(names.len() / 2 + 1).enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i + 1);
        let views: Vec<(String, safetensors::tensor::TensorView)> = part
            .iter()
            .map(|n| (n.clone(), st.tensor(n).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &d.path().join(&file)).unwrap();
        for n in part {
            map.insert(n.clone(), serde_json::Value::String(file.clone()));
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(
        d.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();

    let sharded = Model::load(d.path()).unwrap();
    let single = load("gqa2-untied");
    let prompt = &golden("gqa2-untied")[2].input_ids;
    let run = |m: &Model| {
        let mut cache = m.new_cache(4, 16).unwrap();
        let mut pool = BlockPool::new(4, 0);
        let mut s = Seq::new(prompt);
        step(
            m,
            &mut cache,
            &mut pool,
            &mut [&mut s],
            &[(prompt.len(), LogitsFor::Last)],
        )
    };
    assert_eq!(run(&sharded), run(&single));

    std::fs::remove_file(d.path().join("model-00002-of-00002.safetensors")).unwrap();
    let msg = load_err(d.path());
    assert!(msg.contains("model-00002-of-00002.safetensors"), "{msg}");
}

/// `fixture`'s weights with tensor `bad` rewritten in `dtype` (one byte per
/// element, same shape), into `to/model.safetensors`.
fn with_tensor_as(fixture: &str, bad: &str, dtype: safetensors::Dtype, to: &Path) {
    use safetensors::SafeTensors;
    let src = std::fs::read(fixture_dir(fixture).join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&src).unwrap();
    let shape = st.tensor(bad).unwrap().shape().to_vec();
    let bytes = vec![0x38u8; shape.iter().product()];
    let mut views: Vec<(String, safetensors::tensor::TensorView)> = st
        .names()
        .into_iter()
        .filter(|n| *n != bad)
        .map(|n| (n.to_owned(), st.tensor(n).unwrap()))
        .collect();
    views.push((
        bad.to_owned(),
        safetensors::tensor::TensorView::new(dtype, shape, &bytes).unwrap(),
    ));
    safetensors::serialize_to_file(views, None, &to.join("model.safetensors")).unwrap();
}

/// A tensor stored in a dtype the CPU runtime cannot run (int8, fp8) stops
/// the load with one error naming the file, the tensor and the dtype,
/// whatever `--dtype` asks for.
#[test]
fn a_dtype_the_cpu_cannot_run_names_file_and_tensor() {
    use agentd_models::LoadDtype;
    let bad = "model.layers.1.self_attn.k_proj.weight";
    for dtype in [safetensors::Dtype::I8, safetensors::Dtype::F8_E4M3] {
        let d = tempfile::tempdir().unwrap();
        copy_fixture("gqa2-untied", d.path());
        with_tensor_as("gqa2-untied", bad, dtype, d.path());
        for load_dtype in [LoadDtype::Auto, LoadDtype::parse("float32").unwrap()] {
            let msg = match Model::load_as(d.path(), load_dtype) {
                Ok(_) => panic!("{dtype:?} tensor loaded"),
                Err(e) => e.to_string(),
            };
            assert!(
                msg.contains(&d.path().join("model.safetensors").display().to_string())
                    && msg.contains(bad)
                    && msg.contains(&format!("{dtype:?}"))
                    && !msg.contains('\n'),
                "{msg}"
            );
        }
    }
}
