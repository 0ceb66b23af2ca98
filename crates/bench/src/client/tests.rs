//! Tests of `client.rs`.

use super::*;

#[test]
fn sse_event_boundaries() {
    assert_eq!(find_event_end(b"data: x\n\ndata: y"), Some((7, 2)));
    assert_eq!(find_event_end(b"data: x\r\n\r\n"), Some((7, 4)));
    assert_eq!(find_event_end(b"data: x\n"), None);
}

#[test]
fn absorbs_vllm_and_agentd_shapes() {
    let mut r = StepReply::default();
    absorb(
        &mut r,
        &json!({"choices":[{"text":"ab","token_ids":[5,6]}],"usage":null}),
    );
    absorb(&mut r, &json!({"choices":[{"text":"c","token_ids":[7]}]}));
    absorb(
        &mut r,
        &json!({"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":3,
                "prompt_tokens_details":{"cached_tokens":8}}}),
    );
    assert_eq!(r.token_ids, vec![5, 6, 7]);
    assert_eq!(r.text, "abc");
    assert_eq!((r.prompt_tokens, r.completion_tokens), (10, 3));
    assert_eq!(r.cached_tokens, Some(8));
    // vLLM may send `prompt_tokens_details: null`.
    let mut r = StepReply::default();
    absorb(
        &mut r,
        &json!({"choices":[{"message":{"content":"hi"}}],
                "usage":{"prompt_tokens":4,"completion_tokens":1,"prompt_tokens_details":null}}),
    );
    assert_eq!(r.cached_tokens, None);
    assert_eq!(r.text, "hi");
    assert!(finish(r, true, 1, "u").is_err(), "token mode needs ids");
}

#[test]
fn absorbs_dynamo_engine_data_and_worker() {
    // Shapes of Dynamo 1.6.1's frontend: per-chunk text, the worker on
    // every chunk, the generated ids on the final one.
    let mut r = StepReply::default();
    let w = json!({"prefill_worker_id": 7, "decode_worker_id": 7});
    absorb(
        &mut r,
        &json!({"choices":[{"text":"a","index":0}],"nvext":{"worker_id":w}}),
    );
    absorb(
        &mut r,
        &json!({"choices":[{"text":"b","index":0,"finish_reason":"length"}],
                "nvext":{"worker_id":w,"engine_data":{"completion_token_ids":[11,12],"finished":true}}}),
    );
    absorb(
        &mut r,
        &json!({"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}),
    );
    assert_eq!(r.token_ids, vec![11, 12]);
    assert_eq!(r.worker, Some(7));
    assert_eq!(r.text, "ab");
    let r = finish(r, true, 2, "u").expect("ids present");
    assert_eq!(r.completion_tokens, 2);
    assert_eq!(
        "terminal".parse::<SessionFinal>(),
        Ok(SessionFinal::Terminal)
    );
    assert!("sometimes".parse::<SessionFinal>().is_err());
}

#[test]
fn long_error_bodies_are_cut_on_char_boundaries() {
    let s = "é".repeat(400);
    let t = truncate(&s);
    assert!(t.len() < 310 && t.ends_with('…'));
}
