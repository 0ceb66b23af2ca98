//! The RL trainer surfaces' request routes over the real server (issue 31):
//! vLLM's `/tokenize` and `/detokenize` (the ids the engine generates from,
//! the chat form through the model's own template) and SGLang's
//! `/generate` (the same tokens as `/v1/completions`, SGLang's response and
//! stream shapes, logprob triples, stop reasons, program headers); bad
//! bodies are clear 4xx JSON and the server keeps serving.

mod common;

use common::{get, id_list, post, request, shared};
use serde_json::{json, Value};

#[test]
fn tokenize_matches_the_prompt_the_engine_sees_and_detokenize_inverts_it() {
    let addr = shared();
    let prompt = "The quick brown fox jumps over the lazy dog";
    let t = post(addr, "/tokenize", &json!({"prompt": prompt}));
    assert_eq!(t.status, 200, "{}", t.body);
    let t = t.json();
    let tokens = id_list(&t["tokens"]);
    assert_eq!(t["count"].as_u64(), Some(tokens.len() as u64));
    assert!(t["max_model_len"].as_u64().is_some_and(|m| m > 0));
    assert!(t["token_strs"].is_null(), "{t}");
    // The same ids /v1/completions computes for the same text.
    let c = post(
        addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 1, "return_token_ids": true}),
    );
    assert_eq!(c.status, 200, "{}", c.body);
    assert_eq!(id_list(&c.json()["choices"][0]["prompt_token_ids"]), tokens);
    // Token strings, vLLM's `convert_ids_to_tokens`: byte-level spellings.
    let s = post(
        addr,
        "/tokenize",
        &json!({"prompt": prompt, "return_token_strs": true}),
    )
    .json();
    let strs: Vec<&str> = s["token_strs"]
        .as_array()
        .expect("token_strs")
        .iter()
        .map(|v| v.as_str().expect("a string"))
        .collect();
    assert_eq!(strs.len(), tokens.len());
    assert_eq!(strs[1], "Ġquick", "{strs:?}");
    let d = post(addr, "/detokenize", &json!({"tokens": tokens}));
    assert_eq!(d.status, 200, "{}", d.body);
    assert_eq!(d.json(), json!({"prompt": prompt}));
}

#[test]
fn tokenize_messages_renders_the_chat_template() {
    let addr = shared();
    let messages = json!([{"role": "user", "content": "hi there"}]);
    let kwargs = json!({"enable_thinking": false});
    let t = post(
        addr,
        "/tokenize",
        &json!({"messages": messages, "chat_template_kwargs": kwargs}),
    );
    assert_eq!(t.status, 200, "{}", t.body);
    let tokens = id_list(&t.json()["tokens"]);
    // The chat route renders the same prompt: its usage counts these tokens.
    let c = post(
        addr,
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 1, "chat_template_kwargs": kwargs}),
    );
    assert_eq!(c.status, 200, "{}", c.body);
    assert_eq!(
        c.json()["usage"]["prompt_tokens"].as_u64(),
        Some(tokens.len() as u64)
    );
    let text = post(addr, "/detokenize", &json!({"tokens": tokens})).json()["prompt"]
        .as_str()
        .expect("prompt")
        .to_string();
    assert!(
        text.starts_with("<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"),
        "{text:?}"
    );
    // Without the generation prompt the rendering stops after the message.
    let bare = post(
        addr,
        "/tokenize",
        &json!({"messages": messages, "add_generation_prompt": false}),
    )
    .json();
    assert!(id_list(&bare["tokens"]).len() < tokens.len());
}

#[test]
fn bad_tokenize_bodies_are_4xx_json() {
    let addr = shared();
    let cases = [
        ("/tokenize", json!({}), 400),
        ("/tokenize", json!({"prompt": 7}), 400),
        ("/tokenize", json!({"prompt": "x", "model": "nope"}), 404),
        (
            "/tokenize",
            json!({"messages": [{"role": "user", "content": "x"}],
                   "continue_final_message": true, "add_generation_prompt": true}),
            400,
        ),
        ("/tokenize", json!({"messages": []}), 400),
        ("/detokenize", json!({"tokens": [1, -3]}), 400),
        ("/detokenize", json!({"tokens": [4_000_000_000u64]}), 400),
        ("/detokenize", json!({}), 400),
    ];
    for (path, body, status) in cases {
        let r = post(addr, path, &body);
        assert_eq!(r.status, status, "{path} {body}: {}", r.body);
        assert!(r.json()["error"]["message"].is_string(), "{}", r.body);
    }
    // Nothing was lost: the server still answers.
    assert_eq!(
        post(addr, "/tokenize", &json!({"prompt": "ok"})).status,
        200
    );
}

const PROMPT: &str = "Once upon a time in a land far away";

fn generate(body: &Value) -> Value {
    let r = post(shared(), "/generate", body);
    assert_eq!(r.status, 200, "{body}: {}", r.body);
    r.json()
}

#[test]
fn greedy_generate_equals_completions() {
    let addr = shared();
    let c = post(
        addr,
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 12, "temperature": 0,
                "ignore_eos": true, "return_token_ids": true}),
    );
    assert_eq!(c.status, 200, "{}", c.body);
    let c = c.json();
    let want_ids = id_list(&c["choices"][0]["token_ids"]);
    let want_text = c["choices"][0]["text"].as_str().expect("text");
    let g = generate(&json!({
        "text": PROMPT, "rid": "greedy-1",
        "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": true},
    }));
    assert_eq!(id_list(&g["output_ids"]), want_ids, "{g}");
    assert_eq!(g["text"], want_text);
    let m = &g["meta_info"];
    assert_eq!(m["id"], "greedy-1");
    assert_eq!(m["finish_reason"], json!({"type": "length", "length": 12}));
    assert_eq!(m["completion_tokens"], 12);
    assert_eq!(m["prompt_tokens"], c["usage"]["prompt_tokens"]);
    assert!(m["cached_tokens"].is_u64(), "{m}");
    assert_eq!(m["weight_version"], "default");
    assert!(m["e2e_latency"].is_f64(), "{m}");
    // The same prompt as token ids.
    let prompt_ids = id_list(&post(addr, "/tokenize", &json!({"prompt": PROMPT})).json()["tokens"]);
    let g2 = generate(&json!({
        "input_ids": prompt_ids,
        "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": true},
    }));
    assert_eq!(id_list(&g2["output_ids"]), want_ids);
    // A batch answers a list, each with its index; n > 1 too.
    let b = generate(&json!({
        "text": [PROMPT, "Hello"], "rid": ["b-0", "b-1"],
        "sampling_params": {"max_new_tokens": 4, "temperature": 0},
    }));
    let b = b.as_array().expect("a list for a batch");
    assert_eq!(b.len(), 2);
    assert_eq!(b[0]["meta_info"]["id"], "b-0");
    assert_eq!(b[1]["index"], 1);
    assert_eq!(id_list(&b[0]["output_ids"]), want_ids[..4]);
    let n = generate(&json!({"text": PROMPT,
        "sampling_params": {"max_new_tokens": 3, "temperature": 1.0, "n": 3}}));
    assert_eq!(n.as_array().map(Vec::len), Some(3), "{n}");
}

#[test]
fn logprobs_are_sglang_triples_and_stops_say_what_matched() {
    let g = generate(&json!({
        "text": PROMPT, "return_logprob": true, "top_logprobs_num": 2,
        "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": true},
    }));
    let out = id_list(&g["output_ids"]);
    let m = &g["meta_info"];
    let lps = m["output_token_logprobs"]
        .as_array()
        .expect("output_token_logprobs");
    assert_eq!(lps.len(), out.len());
    for (t, id) in lps.iter().zip(&out) {
        assert!(t[0].as_f64().is_some_and(|lp| lp <= 0.0), "{t}");
        assert_eq!(t[1].as_u64(), Some(*id));
        assert!(t[2].is_null());
    }
    let tops = m["output_top_logprobs"]
        .as_array()
        .expect("output_top_logprobs");
    assert_eq!(tops.len(), out.len());
    // Greedy: the best alternative is the token chosen.
    assert_eq!(tops[0][0][1].as_u64(), Some(out[0]));
    assert_eq!(tops[0].as_array().map(Vec::len), Some(2));
    assert_eq!(m["input_token_logprobs"][0][0], Value::Null);
    // A stop token id: the output ends with it, and it is `matched`.
    let stop_id = out[3];
    let g = generate(&json!({
        "text": PROMPT,
        "sampling_params": {"max_new_tokens": 6, "temperature": 0, "stop_token_ids": [stop_id]},
    }));
    let got = id_list(&g["output_ids"]);
    assert_eq!(got.last(), Some(&stop_id), "{g}");
    assert_eq!(
        g["meta_info"]["finish_reason"],
        json!({"type": "stop", "matched": stop_id})
    );
    // A stop string: trimmed from the text unless `no_stop_trim`.
    let full = generate(&json!({"text": PROMPT,
        "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": true}}));
    let text = full["text"].as_str().expect("text");
    let stop: String = text
        .chars()
        .skip(text.chars().count() / 2)
        .take(2)
        .collect();
    if !stop.trim().is_empty() {
        let g = generate(&json!({"text": PROMPT,
            "sampling_params": {"max_new_tokens": 8, "temperature": 0, "stop": [stop]}}));
        assert_eq!(
            g["meta_info"]["finish_reason"]["matched"],
            json!(stop),
            "{g}"
        );
        assert!(
            !g["text"].as_str().unwrap_or_default().contains(&stop),
            "{g}"
        );
    }
}

/// SGLang's input logprobs against vLLM's `prompt_logprobs` of the same
/// prompt on `/v1/completions` (the engine computes both the same way):
/// `input_ids[start:]`, the first `null`, each later one the logprob of
/// the token given those before it, with the k best; streamed too.
#[test]
fn input_logprobs_from_a_start_are_the_prompts_logprobs() {
    let addr = shared();
    let c = post(
        addr,
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 2}),
    );
    assert_eq!(c.status, 200, "{}", c.body);
    let want = c.json()["choices"][0]["prompt_logprobs"].clone();
    let want = want.as_array().expect("prompt_logprobs").clone();
    let ids = id_list(&post(addr, "/tokenize", &json!({"prompt": PROMPT})).json()["tokens"]);
    assert_eq!(want.len(), ids.len());
    let check = |m: &Value, start: usize| {
        let toks = m["input_token_logprobs"]
            .as_array()
            .expect("input_token_logprobs");
        let tops = m["input_top_logprobs"]
            .as_array()
            .expect("input_top_logprobs");
        assert_eq!(
            (toks.len(), tops.len()),
            (ids.len() - start, ids.len() - start),
            "{m}"
        );
        assert_eq!(toks[0], json!([null, ids[start], null]));
        assert!(tops[0].is_null());
        for (i, (t, top)) in toks.iter().zip(tops).enumerate().skip(1) {
            let p = start + i;
            let entry = &want[p][ids[p].to_string()];
            assert_eq!(t[1].as_u64(), Some(ids[p]));
            let (got, exp) = (t[0].as_f64().unwrap(), entry["logprob"].as_f64().unwrap());
            assert!((got - exp).abs() < 1e-5, "position {p}: {got} vs {exp}");
            // The two best, in rank order.
            let top = top.as_array().expect("alternatives");
            assert_eq!(top.len(), 2);
            for (r, alt) in top.iter().enumerate() {
                let id = alt[1].as_u64().unwrap().to_string();
                assert_eq!(
                    want[p][&id]["rank"].as_u64(),
                    Some(r as u64 + 1),
                    "{p}: {alt}"
                );
            }
        }
    };
    for start in [0usize, 3] {
        let g = generate(&json!({
            "input_ids": ids, "return_logprob": true, "logprob_start_len": start,
            "top_logprobs_num": 2, "sampling_params": {"max_new_tokens": 2, "temperature": 0},
        }));
        check(&g["meta_info"], start);
    }
    // Streamed: every event carries them.
    let r = post(
        addr,
        "/generate",
        &json!({"input_ids": ids, "return_logprob": true, "logprob_start_len": 1,
                "top_logprobs_num": 2, "stream": true,
                "sampling_params": {"max_new_tokens": 3, "temperature": 0}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let events = r.events();
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).expect("JSON event");
        check(&v["meta_info"], 1);
    }
    // With their text when asked; n > 1 outputs share them.
    let g = generate(&json!({
        "input_ids": ids, "return_logprob": true, "logprob_start_len": 0,
        "return_text_in_logprobs": true,
        "sampling_params": {"max_new_tokens": 1, "temperature": 1.0, "n": 2},
    }));
    let outs = g.as_array().expect("n = 2: a list");
    for o in outs {
        let toks = o["meta_info"]["input_token_logprobs"].as_array().unwrap();
        assert_eq!(toks.len(), ids.len());
        let entry = &want[1][ids[1].to_string()];
        assert_eq!(toks[1][2], entry["decoded_token"], "{o}");
    }
}

#[test]
fn generate_streams_the_output_so_far() {
    let body = json!({"text": PROMPT, "stream": true,
        "sampling_params": {"max_new_tokens": 10, "temperature": 0, "ignore_eos": true}});
    let r = post(shared(), "/generate", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("JSON event"))
        .collect();
    assert!(chunks.len() >= 2, "{events:?}");
    let mut prev = 0;
    for c in &chunks[..chunks.len() - 1] {
        assert!(c["meta_info"]["finish_reason"].is_null(), "{c}");
        let n = id_list(&c["output_ids"]).len();
        assert!(n >= prev, "cumulative ids");
        prev = n;
    }
    let last = chunks.last().expect("a last event");
    assert_eq!(last["meta_info"]["finish_reason"]["type"], "length");
    let whole = generate(&json!({"text": PROMPT,
        "sampling_params": {"max_new_tokens": 10, "temperature": 0, "ignore_eos": true}}));
    assert_eq!(last["text"], whole["text"]);
    assert_eq!(last["output_ids"], whole["output_ids"]);
}

#[test]
fn a_session_header_names_the_program() {
    let addr = shared();
    for (header, id) in [
        ("X-SMG-Routing-Key", "rl-smg-1"),
        ("X-Session-ID", "rl-session-1"),
    ] {
        let body = json!({"text": "hi", "sampling_params": {"max_new_tokens": 2}});
        let r = request(
            addr,
            "POST",
            "/generate",
            &[(header, id)],
            Some(&body.to_string()),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let programs = get(addr, "/programs").json();
        assert!(programs.to_string().contains(id), "{header}: {programs}");
    }
    let r = post(
        addr,
        "/generate",
        &json!({"text": "hi", "program_id": "rl-body-1", "sampling_params": {"max_new_tokens": 2}}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(get(addr, "/programs").body.contains("rl-body-1"));
}

#[test]
fn bad_generate_bodies_are_4xx_json() {
    let addr = shared();
    let cases = [
        json!({}),
        json!({"text": "a", "input_ids": [1]}),
        json!({"input_ids": [4_000_000_000u64]}),
        json!({"input_ids": [9_999_999]}),
        json!({"input_ids": []}),
        json!({"text": []}),
        json!({"text": "a", "sampling_params": {"temperature": -1}}),
        json!({"text": "a", "sampling_params": {"temperature": "hot"}}),
        json!({"text": "a", "sampling_params": {"bogus": 1}}),
        json!({"text": "a", "sampling_params": {"max_new_tokens": 0}}),
        json!({"text": "a", "sampling_params": {"regex": "a+"}}),
        json!({"text": "a", "sampling_params": {"n": 0}}),
        json!({"text": "a", "image_data": "cat.png"}),
        json!({"text": "a", "logprob_start_len": -2}),
        json!({"text": "a b", "return_logprob": true, "logprob_start_len": 99}),
        json!({"text": "a b c", "return_logprob": true, "logprob_start_len": 0,
               "stream": true, "sampling_params": {"n": 2}}),
        json!({"text": "a", "return_logprob": true, "top_logprobs_num": 99}),
        json!({"text": ["a", "b"], "rid": ["only-one"]}),
        json!({"text": ["a", "b"], "sampling_params": [{}]}),
        json!({"text": "a", "rid": ""}),
    ];
    for body in cases {
        let r = post(addr, "/generate", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert!(r.json()["error"]["message"].is_string(), "{}", r.body);
    }
    let r = post(
        addr,
        "/generate",
        &json!({"text": "a", "sampling_params": {"max_new_tokens": 0}}),
    );
    assert_eq!(r.json()["error"]["param"], "max_new_tokens", "{}", r.body);
    let r = request(addr, "POST", "/generate", &[], Some("{not json"));
    assert_eq!(r.status, 400);
    // Nothing was lost.
    generate(&json!({"text": "ok", "sampling_params": {"max_new_tokens": 1}}));
}
