//! Several choices per request over a real socket: `n` on both endpoints,
//! prompt lists on `/v1/completions`, streamed choices interleaved with one
//! usage chunk and one `[DONE]`, usage counting each prompt once, seeded
//! choices that differ yet repeat, and the program keeping its one turn.

mod common;

use common::{get, post, shared, MODEL};
use serde_json::{json, Value};

fn texts(v: &Value) -> Vec<(u64, String)> {
    let mut out: Vec<(u64, String)> = v["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .map(|c| {
            let t = c["text"]
                .as_str()
                .or_else(|| c["message"]["content"].as_str())
                .unwrap_or_default();
            (c["index"].as_u64().expect("index"), t.to_string())
        })
        .collect();
    out.sort();
    out
}

#[test]
fn n_greedy_completions_are_n_equal_choices_and_usage_counts_the_prompt_once() {
    let addr = shared();
    let prompt: Vec<u32> = (200..260).collect();
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 5, "temperature": 0,
                      "ignore_eos": true, "n": 3});
    let r = post(addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let t = texts(&v);
    assert_eq!(t.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert!(
        t.iter().all(|x| x.1 == t[0].1),
        "greedy choices agree: {t:?}"
    );
    assert_eq!(v["usage"]["prompt_tokens"], 60);
    assert_eq!(v["usage"]["completion_tokens"], 15);
    assert_eq!(v["usage"]["total_tokens"], 75);
    // The same text as a single-choice request.
    let one = post(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": prompt,
        "max_tokens": 5, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(texts(&one.json())[0].1, t[0].1);
}

#[test]
fn prompt_lists_give_n_choices_per_prompt_in_order() {
    let addr = shared();
    let (a, b): (Vec<u32>, Vec<u32>) = ((300..340).collect(), (500..520).collect());
    let body = json!({"model": MODEL, "prompt": [a, b], "max_tokens": 4, "temperature": 0,
                      "ignore_eos": true, "n": 2});
    let v = post(addr, "/v1/completions", &body).json();
    let t = texts(&v);
    assert_eq!(t.len(), 4);
    let single = |p: &Vec<u32>| {
        let v = post(
            addr,
            "/v1/completions",
            &json!({"model": MODEL, "prompt": p,
            "max_tokens": 4, "temperature": 0, "ignore_eos": true}),
        )
        .json();
        texts(&v)[0].1.clone()
    };
    let (sa, sb) = (single(&a), single(&b));
    assert_eq!(
        (&t[0].1, &t[1].1),
        (&sa, &sa),
        "choices 0 and 1 belong to the first prompt"
    );
    assert_eq!(
        (&t[2].1, &t[3].1),
        (&sb, &sb),
        "choices 2 and 3 to the second"
    );
    assert_eq!(v["usage"]["prompt_tokens"], 60);
    assert_eq!(v["usage"]["completion_tokens"], 16);
}

#[test]
fn seeded_choices_differ_from_each_other_and_repeat() {
    let addr = shared();
    let body = json!({"model": MODEL, "prompt": (700..730).collect::<Vec<u32>>(), "max_tokens": 12,
                      "temperature": 1.0, "seed": 42, "ignore_eos": true, "n": 4});
    let first = texts(&post(addr, "/v1/completions", &body).json());
    let again = texts(&post(addr, "/v1/completions", &body).json());
    assert_eq!(first, again, "a seeded request repeats");
    let distinct: std::collections::HashSet<&String> = first.iter().map(|x| &x.1).collect();
    assert!(
        distinct.len() > 1,
        "choices of a sampled request differ: {first:?}"
    );
}

#[test]
fn streamed_chat_choices_interleave_and_end_with_one_usage_and_done() {
    let addr = shared();
    let body = json!({
        "model": MODEL, "program_id": "choices-stream", "n": 3, "max_tokens": 6, "temperature": 0,
        "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "Count to three."}],
        "chat_template_kwargs": {"enable_thinking": false},
    });
    let r = post(addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let events = r.events();
    assert_eq!(events.iter().filter(|e| *e == "[DONE]").count(), 1);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let mut content = vec![String::new(); 3];
    let mut finished = [0; 3];
    let mut usage = Vec::new();
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).expect("chunk json");
        let choices = v["choices"].as_array().expect("choices");
        if choices.is_empty() {
            usage.push(v["usage"].clone());
            continue;
        }
        assert_eq!(choices.len(), 1, "one choice per chunk");
        let i = choices[0]["index"].as_u64().expect("index") as usize;
        content[i].push_str(choices[0]["delta"]["content"].as_str().unwrap_or_default());
        if choices[0]["finish_reason"].is_string() {
            finished[i] += 1;
        }
    }
    assert_eq!(finished, [1, 1, 1]);
    assert_eq!(usage.len(), 1, "one usage chunk");
    assert_eq!(usage[0]["completion_tokens"], 18);
    assert!(
        content.iter().all(|c| c == &content[0] && !c.is_empty()),
        "{content:?}"
    );
    // Non-streamed, the same greedy content; and the program counts one turn
    // per request (the other choices are one-off sequences).
    let mut whole = body.clone();
    whole["stream"] = json!(false);
    let v = post(addr, "/v1/chat/completions", &whole).json();
    assert!(texts(&v).iter().all(|x| x.1 == content[0]));
    let programs = get(addr, "/programs").json();
    let p = programs
        .as_array()
        .expect("programs")
        .iter()
        .find(|p| p["id"] == "choices-stream")
        .cloned()
        .expect("the program exists");
    assert_eq!(p["steps"], 2, "{p}");
    let rel = post(
        addr,
        "/programs/release",
        &json!({"program_id": "choices-stream"}),
    );
    assert_eq!(rel.status, 200);
}
