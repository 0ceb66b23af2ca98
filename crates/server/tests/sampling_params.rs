//! Every sampling parameter honoured or refused, over a real socket against
//! the real server and the tiny model: OpenAI's `logit_bias`, vLLM's
//! `min_tokens`, `bad_words`, `allowed_token_ids`, `truncate_prompt_tokens`
//! and `include_stop_str_in_output` with vLLM's semantics; fields an API
//! defines but agentd does not implement are a 400 naming them; fields no
//! API defines are ignored; bad values are 400s and the server keeps serving.

mod common;

use std::sync::OnceLock;

use agentd_runtime::Tokenizer;
use common::{post, shared, Resp, MODEL};
use serde_json::{json, Value};

/// The tiny model's EOS (`<|im_end|>`, models/qwen3-tiny.json).
const EOS: u32 = 151645;
const PROMPT: [u32; 12] = [
    785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13, 576, 4226,
];

fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::from_dir(common::model_dir()).expect("tokenizer"))
}

/// A greedy token-id completion of [`PROMPT`] with `extra` merged in.
fn completion(extra: Value) -> Resp {
    let mut body = json!({"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                          "ignore_eos": true, "return_token_ids": true});
    merge(&mut body, extra);
    post(shared(), "/v1/completions", &body)
}

fn merge(body: &mut Value, extra: Value) {
    if let (Some(b), Value::Object(e)) = (body.as_object_mut(), extra) {
        b.extend(e);
    }
}

/// The choice's generated token ids, after checking the request succeeded.
fn ids(r: &Resp) -> Vec<u32> {
    assert_eq!(r.status, 200, "{}", r.body);
    serde_json::from_value(r.json()["choices"][0]["token_ids"].clone()).expect("token_ids")
}

fn text(r: &Resp) -> String {
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_string()
}

/// A 400 in OpenAI's shape naming `field`.
fn assert_refused(r: &Resp, field: &str) {
    assert_eq!(r.status, 400, "{field}: {}", r.body);
    let e = &r.json()["error"];
    assert_eq!(e["type"], "invalid_request_error", "{}", r.body);
    assert_eq!(e["param"], field, "{}", r.body);
    assert!(
        e["message"].as_str().is_some_and(|m| m.contains(field)),
        "{}",
        r.body
    );
}

fn greedy(max_tokens: u64) -> Vec<u32> {
    ids(&completion(json!({"max_tokens": max_tokens})))
}

#[test]
fn logit_bias_forces_and_bans_tokens() {
    let forced = 14990; // "hello"
    let got = ids(&completion(
        json!({"logit_bias": {forced.to_string(): 100}}),
    ));
    assert_eq!(got, [forced; 8]);
    // Seeded sampling at a high temperature is forced as well.
    let got = ids(&completion(
        json!({"logit_bias": {forced.to_string(): 100}, "temperature": 1.5, "seed": 3}),
    ));
    assert_eq!(got, [forced; 8]);
    // -100 on the token greedy picks first: it never appears.
    let plain = greedy(8);
    let banned = plain[0];
    let got = ids(&completion(
        json!({"logit_bias": {banned.to_string(): -100}}),
    ));
    assert_eq!(got.len(), 8);
    assert!(!got.contains(&banned), "{banned} in {got:?}");
    assert_ne!(got, plain);
}

#[test]
fn logit_bias_applies_to_chat_too() {
    let hello = tokenizer().encode("hello", false).unwrap();
    assert_eq!(hello.len(), 1, "one token");
    let body = json!({"model": MODEL, "max_tokens": 3, "temperature": 0, "ignore_eos": true,
                      "messages": [{"role": "user", "content": "hi"}],
                      "logit_bias": {hello[0].to_string(): 100}});
    let r = post(shared(), "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    // Content, or reasoning when the parser reads the output as thinking.
    let m = &v["choices"][0]["message"];
    let out = m["content"].as_str().or(m["reasoning_content"].as_str());
    assert_eq!(out, Some("hellohellohello"), "{m}");
    assert_eq!(v["usage"]["completion_tokens"], 3);
}

#[test]
fn min_tokens_holds_back_eos() {
    // EOS forced by +100: without min_tokens the answer is EOS alone.
    let eos_first = json!({"ignore_eos": false, "logit_bias": {EOS.to_string(): 100}});
    let r = completion(eos_first.clone());
    assert_eq!(ids(&r), [EOS]);
    assert_eq!(r.json()["choices"][0]["finish_reason"], "stop");
    // min_tokens 5: EOS is masked for five tokens, then ends the sixth.
    let mut body = eos_first;
    merge(&mut body, json!({"min_tokens": 5}));
    let r = completion(body);
    let got = ids(&r);
    assert_eq!(got.len(), 6, "{got:?}");
    assert!(!got[..5].contains(&EOS) && got[5] == EOS, "{got:?}");
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], 6);
}

#[test]
fn min_tokens_holds_back_stop_ids_and_stop_strings() {
    let plain = greedy(8);
    // A stop id that would end the answer at its first token.
    let first = plain[0];
    let r = completion(json!({"stop_token_ids": [first]}));
    assert_eq!(ids(&r), [first]);
    let r = completion(json!({"stop_token_ids": [first], "min_tokens": 3}));
    let got = ids(&r);
    assert!(got.len() > 3 && !got[..3].contains(&first), "{got:?}");
    // A stop string that would match the first token's text.
    let whole = text(&completion(json!({})));
    let first_text = tokenizer().decode(&plain[..1], true).unwrap();
    assert!(!first_text.is_empty());
    let stop = json!({"stop": [first_text.clone()]});
    let r = completion(stop.clone());
    assert_eq!(text(&r), "", "stops at once");
    let mut held = stop;
    merge(&mut held, json!({"min_tokens": 3}));
    let r = completion(held);
    let t = text(&r);
    let three = tokenizer().decode(&plain[..3], true).unwrap();
    assert!(
        t.starts_with(&three),
        "{t:?} holds the first three tokens {three:?}"
    );
    assert!(whole.starts_with(&t), "{t:?} is a prefix of {whole:?}");
    // min_tokens above max_tokens is refused (vLLM's check).
    assert_refused(&completion(json!({"min_tokens": 9})), "min_tokens");
}

/// A token of `ids` that is a whole word (with or without a leading space)
/// the tokenizer spells the same way back: `(token, word)`.
fn word_token(ids: &[u32]) -> Option<(u32, String)> {
    let tok = tokenizer();
    ids.iter().find_map(|&id| {
        let text = tok.decode(&[id], false).ok()?;
        let word = text.trim_start().to_string();
        let alpha = !word.is_empty() && word.chars().all(|c| c.is_ascii_alphanumeric());
        let spelled = [word.clone(), format!(" {word}")]
            .iter()
            .any(|w| tok.encode(w, false).ok().as_deref() == Some(&[id][..]));
        (alpha && spelled).then_some((id, word))
    })
}

#[test]
fn bad_words_never_appear() {
    let plain = greedy(24);
    let Some((id, word)) = word_token(&plain) else {
        panic!("no word-like token in the greedy output {plain:?}")
    };
    let got = ids(&completion(json!({"max_tokens": 24, "bad_words": [word]})));
    assert_eq!(got.len(), 24);
    assert!(!got.contains(&id), "{word:?} ({id}) in {got:?}");
    // Both spellings are banned: neither one-token form appears.
    let tok = tokenizer();
    for w in [word.clone(), format!(" {word}")] {
        let seq = tok.encode(&w, false).unwrap();
        if let [single] = seq[..] {
            assert!(!got.contains(&single), "{w:?} ({single}) in {got:?}");
        }
    }
}

#[test]
fn allowed_token_ids_restrict_every_token() {
    let allowed = [100u32, 2000, 30000];
    for extra in [
        json!({"allowed_token_ids": allowed}),
        json!({"allowed_token_ids": allowed, "temperature": 1.0, "seed": 7, "max_tokens": 32}),
    ] {
        let got = ids(&completion(extra));
        assert!(got.iter().all(|t| allowed.contains(t)), "{got:?}");
    }
}

#[test]
fn truncate_prompt_tokens_keeps_the_last_k() {
    let r = completion(json!({"truncate_prompt_tokens": 5}));
    let v = r.json();
    assert_eq!(v["usage"]["prompt_tokens"], 5, "{}", r.body);
    assert_eq!(v["choices"][0]["prompt_token_ids"], json!(PROMPT[7..]));
    let direct = ids(&completion(json!({"prompt": PROMPT[7..]})));
    assert_eq!(ids(&r), direct, "the same as sending the last 5 tokens");
    // -1 is the model's window: the whole (short) prompt stays.
    let r = completion(json!({"truncate_prompt_tokens": -1}));
    assert_eq!(r.json()["usage"]["prompt_tokens"], PROMPT.len());
    // k above the prompt keeps it whole.
    let r = completion(json!({"truncate_prompt_tokens": 100}));
    assert_eq!(r.json()["usage"]["prompt_tokens"], PROMPT.len());
    // Chat: the rendered prompt is cut.
    let body = json!({"model": MODEL, "max_tokens": 2, "temperature": 0,
                      "messages": [{"role": "user", "content": "hello there, how are you"}],
                      "truncate_prompt_tokens": 4});
    let r = post(shared(), "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["prompt_tokens"], 4);
    for k in [json!(0), json!(-2), json!(1_000_000)] {
        assert_refused(
            &completion(json!({"truncate_prompt_tokens": k})),
            "truncate_prompt_tokens",
        );
    }
}

/// Text of a streamed completion and its finish reason.
fn streamed(extra: Value) -> (String, String) {
    let mut body = extra;
    merge(&mut body, json!({"stream": true}));
    let r = completion(body);
    assert_eq!(r.status, 200, "{}", r.body);
    let mut text = String::new();
    let mut reason = String::new();
    for e in r.events().iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).expect("chunk");
        let c = &v["choices"][0];
        text.push_str(c["text"].as_str().unwrap_or_default());
        if let Some(f) = c["finish_reason"].as_str() {
            reason = f.to_string();
        }
    }
    (text, reason)
}

#[test]
fn include_stop_str_in_output_streamed_and_not() {
    let plain = greedy(16);
    let whole = text(&completion(json!({"max_tokens": 16})));
    // A stop string from the middle of the greedy text.
    let chars: Vec<(usize, char)> = whole.char_indices().collect();
    assert!(chars.len() >= 6, "{whole:?}");
    let (a, b) = (chars[chars.len() / 2].0, chars[chars.len() / 2 + 2].0);
    let stop = whole[a..b].to_string();
    let at = whole.find(&stop).expect("present");
    for (include, want) in [(false, &whole[..at]), (true, &whole[..at + stop.len()])] {
        let extra =
            json!({"max_tokens": 16, "stop": [stop], "include_stop_str_in_output": include});
        let r = completion(extra.clone());
        assert_eq!(text(&r), want, "include {include}");
        assert_eq!(r.json()["choices"][0]["finish_reason"], "stop");
        assert_eq!(streamed(extra), (want.to_string(), "stop".to_string()));
    }
    // A stop token's text is left out unless included (vLLM's detokenizer).
    let i = (1..plain.len())
        .find(|&i| !plain[..i].contains(&plain[i]))
        .expect("a fresh token");
    let before = tokenizer().decode(&plain[..i], true).unwrap();
    let through = tokenizer().decode(&plain[..=i], true).unwrap();
    for (include, want) in [(false, &before), (true, &through)] {
        let extra = json!({"max_tokens": 16, "stop_token_ids": [plain[i]],
                           "include_stop_str_in_output": include});
        assert_eq!(text(&completion(extra.clone())), *want, "include {include}");
        assert_eq!(streamed(extra).0, *want, "include {include}, streamed");
    }
}

#[test]
fn defined_but_unimplemented_fields_are_refused_by_name() {
    for (field, value) in [
        ("logits_processors", json!(["x"])),
        ("best_of", json!(2)),
        ("use_beam_search", json!(true)),
        ("guided_json", json!({"type": "object"})),
        ("suffix", json!("x")),
        ("skip_special_tokens", json!(false)),
    ] {
        assert_refused(&completion(json!({field: value})), field);
    }
    let chat = |extra: Value| {
        let mut body = json!({"model": MODEL, "max_tokens": 2, "temperature": 0,
                              "messages": [{"role": "user", "content": "hi"}]});
        merge(&mut body, extra);
        post(shared(), "/v1/chat/completions", &body)
    };
    for (field, value) in [
        ("audio", json!({"voice": "x"})),
        ("echo", json!(true)),
        ("prediction", json!({"type": "content", "content": "x"})),
        ("reasoning_effort", json!("high")),
    ] {
        assert_refused(&chat(json!({field: value})), field);
    }
    // The values that ask for nothing pass, as do metadata and fields no API
    // defines (ignored, as vLLM's extra="allow").
    let r = chat(json!({"best_of": 1, "use_beam_search": false, "user": "u",
                        "no_such_field": {"x": 1}, "prompt_logprobs": null}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(ids(&completion(json!({"made_up": [1, 2, 3]}))), greedy(8));
}

#[test]
fn bad_values_are_400s_and_the_server_keeps_serving() {
    for (extra, field) in [
        (json!({"logit_bias": {"x": 1}}), Some("logit_bias")),
        (json!({"logit_bias": {"-1": 1}}), Some("logit_bias")),
        (json!({"logit_bias": {"5": 100.5}}), Some("logit_bias")),
        // Past f32: refused as out of range or as malformed, either a 400.
        (json!({"logit_bias": {"5": 1e39}}), None),
        (json!({"logit_bias": {"151936": 1}}), Some("logit_bias")),
        (json!({"logit_bias": {"5": "x"}}), None),
        (json!({"logit_bias": [1]}), None),
        (json!({"allowed_token_ids": []}), Some("allowed_token_ids")),
        (
            json!({"allowed_token_ids": [151936]}),
            Some("allowed_token_ids"),
        ),
        (json!({"allowed_token_ids": [-1]}), None),
        (json!({"bad_words": [""]}), Some("bad_words")),
        (json!({"bad_words": "x"}), None),
        (json!({"min_tokens": -1}), None),
        (json!({"min_tokens": "3"}), None),
        (json!({"truncate_prompt_tokens": 1.5}), None),
        (json!({"include_stop_str_in_output": "yes"}), None),
    ] {
        let r = completion(extra.clone());
        match field {
            Some(f) => assert_refused(&r, f),
            None => {
                assert_eq!(r.status, 400, "{extra}: {}", r.body);
                assert_eq!(r.json()["error"]["type"], "invalid_request_error");
            }
        }
    }
    assert_eq!(greedy(4).len(), 4, "still serving");
}

#[test]
fn add_special_tokens_and_one_tool_call_are_honoured() {
    // vLLM's add_special_tokens: the tokenizer's own tokens. Qwen3's adds
    // none (no BOS), so both spellings tokenize the prompt alike.
    let text = "The quick brown fox";
    let prompt_ids = |extra: Value| {
        let mut body = json!({"model": MODEL, "prompt": text, "max_tokens": 1,
                              "return_token_ids": true});
        merge(&mut body, extra);
        let r = post(shared(), "/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["choices"][0]["prompt_token_ids"].clone()
    };
    let with = prompt_ids(json!({"add_special_tokens": true}));
    assert_eq!(with, json!(tokenizer().encode(text, true).unwrap()));
    assert_eq!(prompt_ids(json!({"add_special_tokens": false})), with);
    // parallel_tool_calls: false with a forced call: one call, as asked.
    let tools = json!([{"type": "function", "function": {"name": "set_alarm",
        "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}},
                       "required": ["on"], "additionalProperties": false}}}]);
    let body = json!({"model": MODEL, "max_tokens": 64, "temperature": 0,
                      "messages": [{"role": "user", "content": "weather in Paris?"}],
                      "tools": tools, "tool_choice": "required",
                      "parallel_tool_calls": false, "add_special_tokens": true});
    let r = post(shared(), "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let calls = &r.json()["choices"][0]["message"]["tool_calls"];
    assert_eq!(calls.as_array().map(Vec::len), Some(1), "{}", r.body);
}
