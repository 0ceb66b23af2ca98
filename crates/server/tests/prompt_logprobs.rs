//! vLLM's `prompt_logprobs` over a real socket against the real server and
//! the tiny model: each prompt position's entry is the log-softmax of the
//! logits a direct forward of the model computes for the position before
//! it (rank and top-k included), whether the prompt is prefilled in one
//! chunk or several, and even when the prefix cache (or the program's own
//! KV) holds the prompt: such a request recomputes it, as vLLM's does.

mod common;

use std::net::SocketAddr;
use std::sync::OnceLock;

use agentd_engine::EngineConfig;
use agentd_models::Model;
use agentd_runtime::sampling::log_softmax;
use agentd_runtime::{BatchBuilder, Logits, LogitsFor};
use common::{post, shared, Resp, MODEL};
use serde_json::{json, Value};

const BLOCK: usize = 16;

/// 45 tokens: two full blocks the prefix cache can hold, and a tail.
fn prompt() -> Vec<u32> {
    (0..45u32).map(|i| 100 + (i * 7919) % 5000).collect()
}

/// Logits rows of every position of `tokens`, by a direct forward.
fn direct_rows(tokens: &[u32]) -> Vec<Vec<f32>> {
    static MODEL_: OnceLock<Model> = OnceLock::new();
    let model = MODEL_.get_or_init(|| Model::load(common::model_dir()).expect("model"));
    let blocks = tokens.len().div_ceil(BLOCK);
    let mut cache = model.new_cache(blocks, BLOCK).expect("cache");
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut b = BatchBuilder::new(BLOCK);
    b.push(tokens, 0, &table, LogitsFor::All);
    let out = model.forward(&b.build(), &mut cache).expect("forward");
    Logits::from_tensor(out)
        .expect("logits")
        .to_rows()
        .expect("rows")
}

/// A server whose steps take at most 16 tokens: a prompt of 45 is
/// prefilled in three chunks.
fn chunked() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        common::start_with(
            None,
            EngineConfig {
                max_num_batched_tokens: 16,
                ..common::test_config()
            },
        )
    })
}

fn completion(addr: SocketAddr, tokens: &[u32], extra: Value) -> Resp {
    let mut body = json!({"model": MODEL, "prompt": tokens, "max_tokens": 2,
                          "temperature": 0, "ignore_eos": true});
    if let (Some(b), Value::Object(e)) = (body.as_object_mut(), extra) {
        b.extend(e);
    }
    post(addr, "/v1/completions", &body)
}

/// Checks `got` (the response field) against the direct forward of
/// `tokens` with `k` alternatives a position.
fn check(got: &Value, tokens: &[u32], k: usize) {
    let list = got.as_array().expect("prompt_logprobs is a list");
    assert_eq!(list.len(), tokens.len(), "one entry per prompt token");
    assert!(list[0].is_null(), "the first token has none: {}", list[0]);
    let rows = direct_rows(tokens);
    // Batched differently, the server's f32 sums may differ in the last bits.
    let tol = 1e-4;
    for j in 1..tokens.len() {
        let row = &rows[j - 1];
        let want = log_softmax(row);
        let map = list[j].as_object().expect("an object per position");
        let t = tokens[j];
        let e = &map[&t.to_string()];
        let lp = e["logprob"].as_f64().expect("logprob") as f32;
        assert!(
            (lp - want[t as usize]).abs() < tol,
            "position {j}: {lp} vs {}",
            want[t as usize]
        );
        let x = row[t as usize];
        let rank = e["rank"].as_u64().expect("rank") as usize;
        let above = row.iter().filter(|&&y| y > x + tol).count();
        let at_least = row.iter().filter(|&&y| y >= x - tol).count();
        assert!(
            (above + 1..=at_least).contains(&rank),
            "position {j}: rank {rank}, {above} clearly above"
        );
        let decoded = common_tokenizer().decode(&[t], false).unwrap();
        assert_eq!(e["decoded_token"], decoded.as_str());
        // The k best: each entry's logprob is the model's, and the ones
        // ranked 1..=k are at least the k-th best.
        let mut sorted = want.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let kth = if k > 0 { sorted[k - 1] } else { f32::INFINITY };
        let mut ranks: Vec<u64> = Vec::new();
        for (id, v) in map {
            let id: usize = id.parse().expect("token id keys");
            let lp = v["logprob"].as_f64().expect("logprob") as f32;
            assert!((lp - want[id]).abs() < tol, "position {j}, token {id}");
            if id != t as usize || map.len() == k {
                assert!(
                    lp >= kth - tol,
                    "position {j}: {id} is not among the {k} best"
                );
                ranks.push(v["rank"].as_u64().expect("rank"));
            }
        }
        assert!(map.len() == k || map.len() == k + 1, "{}", list[j]);
        // Ranked 1..=k; the prompt's token, when among them, takes its
        // place there (vLLM's dict keeps the later entry).
        ranks.sort_unstable();
        assert_eq!(ranks, (1..=k as u64).collect::<Vec<_>>(), "{}", list[j]);
    }
}

fn common_tokenizer() -> &'static agentd_runtime::Tokenizer {
    static T: OnceLock<agentd_runtime::Tokenizer> = OnceLock::new();
    T.get_or_init(|| agentd_runtime::Tokenizer::from_dir(common::model_dir()).expect("tokenizer"))
}

fn cached(r: &Resp) -> u64 {
    r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached_tokens")
}

#[test]
fn completions_prompt_logprobs_equal_the_models_log_softmax() {
    let tokens = prompt();
    for addr in [shared(), chunked()] {
        // The prompt's blocks in the prefix cache first: a plain request
        // reuses them, a prompt_logprobs one recomputes the whole prompt.
        let warm = completion(addr, &tokens, json!({}));
        assert_eq!(warm.status, 200, "{}", warm.body);
        let again = completion(addr, &tokens, json!({}));
        assert_eq!(cached(&again), 32, "two full blocks reused");
        assert!(again.json()["choices"][0].get("prompt_logprobs").is_none());
        for k in [0, 3] {
            let r = completion(addr, &tokens, json!({"prompt_logprobs": k}));
            assert_eq!(r.status, 200, "{}", r.body);
            assert_eq!(cached(&r), 0, "no prefix-cache hit with prompt_logprobs");
            check(&r.json()["choices"][0]["prompt_logprobs"], &tokens, k);
        }
    }
}

#[test]
fn every_choice_and_every_prompt_carries_its_own() {
    let a = prompt();
    let b: Vec<u32> = a.iter().rev().copied().collect();
    let r = completion(
        shared(),
        &[],
        json!({"prompt": [a, b], "n": 2, "prompt_logprobs": 1}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let choices = v["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 4);
    for c in choices {
        let index = c["index"].as_u64().expect("index") as usize;
        let tokens = if index < 2 { &a } else { &b };
        check(&c["prompt_logprobs"], tokens, 1);
    }
}

#[test]
fn chat_carries_them_on_the_response() {
    let body = json!({"model": MODEL, "max_tokens": 2, "temperature": 0,
                      "messages": [{"role": "user", "content": "Name three colours, briefly."}],
                      "prompt_logprobs": 0});
    let r = post(shared(), "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert!(v["choices"][0].get("prompt_logprobs").is_none());
    let got = &v["prompt_logprobs"];
    let list = got.as_array().expect("a list on the response");
    let n = v["usage"]["prompt_tokens"].as_u64().expect("prompt_tokens") as usize;
    assert_eq!(list.len(), n);
    // With k = 0 each entry holds the prompt's token alone: the rendered
    // prompt reads back from them, after the template's first token.
    let im_start = common_tokenizer().encode("<|im_start|>", false).unwrap();
    assert_eq!(im_start.len(), 1);
    let mut tokens = im_start;
    for e in &list[1..] {
        let m = e.as_object().expect("object");
        assert_eq!(m.len(), 1, "{e}");
        tokens.extend(m.keys().map(|k| k.parse::<u32>().expect("id")));
    }
    check(got, &tokens, 0);
}

#[test]
fn a_programs_next_turn_recomputes_its_own_kv() {
    let tokens = prompt();
    let first = completion(
        shared(),
        &tokens[..30],
        json!({"program_id": "plp-agent", "max_tokens": 1}),
    );
    assert_eq!(first.status, 200, "{}", first.body);
    let next = completion(
        shared(),
        &tokens,
        json!({"program_id": "plp-agent", "prompt_logprobs": 2}),
    );
    assert_eq!(next.status, 200, "{}", next.body);
    assert_eq!(cached(&next), 0, "the program's KV is not reused");
    check(&next.json()["choices"][0]["prompt_logprobs"], &tokens, 2);
    // The turn after reuses what that one computed.
    let after = completion(
        shared(),
        &tokens,
        json!({"program_id": "plp-agent", "final": true}),
    );
    assert_eq!(after.status, 200, "{}", after.body);
    assert!(cached(&after) >= 32, "{}", after.body);
}

#[test]
fn vllms_refusals() {
    let tokens = prompt();
    for extra in [
        json!({"prompt_logprobs": 1, "stream": true}),
        json!({"prompt_logprobs": -1}),
        json!({"prompt_logprobs": -3}),
        json!({"prompt_logprobs": 21}),
    ] {
        let r = completion(shared(), &tokens, extra.clone());
        assert_eq!(r.status, 400, "{extra}: {}", r.body);
        let e = &r.json()["error"];
        assert_eq!(e["param"], "prompt_logprobs", "{}", r.body);
    }
    // 0 with a stream is accepted (nothing to return) and streams as usual.
    let r = completion(
        shared(),
        &tokens,
        json!({"prompt_logprobs": 0, "stream": true}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("[DONE]"));
}
