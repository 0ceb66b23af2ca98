//! The engine end to end on a real (tiny, random-weight) Qwen3 checked against
//! transformers: greedy tokens, prefix reuse between a program's turns, pause
//! and restore under memory pressure (with and without a host KV tier),
//! cancellation, release, bad input.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentd_engine::{
    Engine, EngineConfig, EngineError, Event, FinishReason, GenerateRequest, Usage,
};
use agentd_models::Model;
use agentd_runtime::SamplingParams;
use agentd_scheduler::{PolicyKind, SchedulerConfig};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/golden")
        .join(name)
}

/// (prompt, transformers' greedy continuation) of the fixture's cases.
fn golden(name: &str) -> Vec<(Vec<u32>, Vec<u32>)> {
    let text = std::fs::read_to_string(fixture(name).join("golden.json")).expect("fixture");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    v["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            let ids = |x: &serde_json::Value| -> Vec<u32> {
                x.as_array()
                    .expect("array")
                    .iter()
                    .map(|t| t.as_u64().expect("id") as u32)
                    .collect()
            };
            let greedy: Vec<u32> = c["greedy"]
                .as_array()
                .expect("greedy")
                .iter()
                .map(|g| g["token"].as_u64().expect("token") as u32)
                .collect();
            (ids(&c["input_ids"]), greedy)
        })
        .collect()
}

fn engine(policy: PolicyKind, num_blocks: usize) -> Engine {
    engine_with_host(policy, num_blocks, 0)
}

/// [`engine`] with a host KV tier of `host_blocks` blocks behind the pool.
fn engine_with_host(policy: PolicyKind, num_blocks: usize, host_blocks: usize) -> Engine {
    let cfg = EngineConfig {
        num_blocks,
        block_size: 16,
        max_num_batched_tokens: 64,
        scheduler: SchedulerConfig {
            policy,
            ..SchedulerConfig::default()
        },
        host_blocks,
        ..EngineConfig::default()
    };
    Engine::with_model(
        Arc::new(Model::load(&fixture("gqa2-untied")).expect("model")),
        cfg,
    )
    .expect("engine starts")
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        max_tokens,
        ignore_eos: true,
        ..SamplingParams::greedy()
    }
}

fn request(program: Option<&str>, prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        program: program.map(str::to_string),
        prompt,
        sampling: greedy(max_tokens),
        ..GenerateRequest::default()
    }
}

/// Drains a stream: generated tokens, finish reason, usage.
fn collect(mut s: agentd_engine::RequestStream) -> (Vec<u32>, FinishReason, Usage) {
    let mut toks = Vec::new();
    loop {
        match s.blocking_next() {
            Some(Event::Token(t)) => toks.push(t.token_id),
            Some(Event::Finished { reason, usage }) => return (toks, reason, usage),
            None => panic!("stream ended without Finished"),
        }
    }
}

#[test]
fn concurrent_requests_match_transformers_greedy() {
    for policy in [PolicyKind::Program, PolicyKind::Request] {
        let e = engine(policy, 256);
        let cases = golden("gqa2-untied");
        let streams: Vec<_> = cases
            .iter()
            .enumerate()
            .map(|(i, (prompt, want))| {
                let name = format!("p{i}");
                e.submit(request(Some(&name), prompt.clone(), want.len()))
                    .expect("accepted")
            })
            .collect();
        for (s, (prompt, want)) in streams.into_iter().zip(&cases) {
            let (got, reason, usage) = collect(s);
            assert_eq!(&got, want, "{policy}: prompt of {} tokens", prompt.len());
            assert_eq!(reason, FinishReason::Length);
            assert_eq!(usage.prompt_tokens, prompt.len());
            assert_eq!(usage.completion_tokens, want.len());
        }
    }
}

#[test]
fn a_programs_next_turn_reuses_its_kv() {
    let e = engine(PolicyKind::Program, 256);
    let prompt: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 500).collect();
    let (gen, _, u1) = collect(
        e.submit(request(Some("agent"), prompt.clone(), 10))
            .expect("ok"),
    );
    assert_eq!(u1.cached_tokens, 0);
    let mut next = prompt.clone();
    next.extend(&gen);
    next.extend([11, 12, 13, 14, 15]);
    let mut s2 = e
        .submit(request(Some("agent"), next.clone(), 4))
        .expect("ok");
    // Readable as soon as the request starts, before the final usage (a
    // server that stops early on a stop string reports it from here).
    assert!(matches!(s2.blocking_next(), Some(Event::Token(_))));
    assert_eq!(s2.cached_tokens(), prompt.len() + gen.len() - 1);
    let (_, _, u2) = collect(s2);
    // Everything computed before is reused, including the partial last block;
    // only the last sampled token (never fed back) and the new tokens are new.
    assert_eq!(u2.cached_tokens, prompt.len() + gen.len() - 1);
    let m = e.snapshot_blocking().metrics.clone();
    assert!(m.prefix_cache_hits >= u2.cached_tokens as u64);
    let progs = e.snapshot_blocking().programs.clone();
    assert_eq!(progs.len(), 1);
    assert_eq!(progs[0].id, "agent");
    assert_eq!(progs[0].steps, 2);
    assert_eq!(progs[0].phase, "acting");
    // Resident between turns, its tool running.
    assert_eq!(progs[0].lifecycle, "acting");
}

/// Also with a host KV tier: the paused programs restore by copying their
/// blocks back, with the same tokens and less recomputed than without it.
#[test]
fn paused_programs_finish_with_the_uncontended_tokens() {
    // Short prompts are admitted together, then outgrow the cache while decoding.
    let cases: Vec<Vec<u32>> = (0..4u32)
        .map(|k| (0..20).map(|i| (i * 13 + k * 101) % 500).collect())
        .collect();
    // Alone, with plenty of memory.
    let roomy = engine(PolicyKind::Program, 256);
    let want: Vec<Vec<u32>> = cases
        .iter()
        .map(|p| collect(roomy.submit(request(None, p.clone(), 90)).expect("ok")).0)
        .collect();
    let mut recomputed = Vec::new();
    for host in [0, 128] {
        // Together, in 14 blocks (224 tokens) while each needs 7 (110 tokens):
        // reasoning programs must be paused mid-request and restored.
        let tight = engine_with_host(PolicyKind::Program, 14, host);
        let streams: Vec<_> = cases
            .iter()
            .enumerate()
            .map(|(i, p)| {
                tight
                    .submit(request(Some(&format!("t{i}")), p.clone(), 90))
                    .expect("ok")
            })
            .collect();
        for (s, w) in streams.into_iter().zip(&want) {
            assert_eq!(&collect(s).0, w, "host {host}: same tokens as uncontended");
        }
        let m = tight.snapshot_blocking().metrics.clone();
        assert!(m.pauses() > 0, "memory pressure paused someone: {m:?}");
        assert!(m.restores > 0, "{m:?}");
        if host == 0 {
            assert!(
                m.recomputed_tokens > 0,
                "restores recomputed what was evicted: {m:?}"
            );
        } else {
            assert!(m.kv_onloaded_blocks > 0, "{m:?}");
        }
        recomputed.push(m.recomputed_tokens);
    }
    assert!(
        recomputed[1] < recomputed[0],
        "recomputed without / with the host tier: {recomputed:?}"
    );
}

#[test]
fn dropping_a_stream_cancels_and_frees() {
    let e = engine(PolicyKind::Program, 256);
    let prompt: Vec<u32> = (0..30).collect();
    let mut s = e.submit(request(None, prompt.clone(), 60)).expect("ok");
    // Wait for the first token, then hang up.
    assert!(matches!(s.blocking_next(), Some(Event::Token(_))));
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(10);
    while e.snapshot_blocking().metrics.num_requests_running > 0 {
        assert!(Instant::now() < deadline, "cancelled request still running");
        std::thread::sleep(Duration::from_millis(5));
    }
    // A one-off program is released with its request: nothing stays referenced.
    assert_eq!(e.snapshot_blocking().metrics.kv_cache_usage, 0.0);
    let (toks, _, _) = collect(e.submit(request(None, prompt, 3)).expect("ok"));
    assert_eq!(toks.len(), 3);
}

#[test]
fn a_request_cancelled_while_it_waits_leaves_the_queue_unadmitted() {
    // 8 blocks of 16; an acting program keeps its blocks (no work
    // conservation), so b waits for as long as a holds its 6 blocks.
    let cfg = EngineConfig {
        num_blocks: 8,
        block_size: 16,
        max_num_batched_tokens: 64,
        scheduler: SchedulerConfig {
            idle_reclaim_after_s: 1e9,
            ..SchedulerConfig::default()
        },
        ..EngineConfig::default()
    };
    let model = Arc::new(Model::load(&fixture("gqa2-untied")).expect("model"));
    let e = Engine::with_model(model, cfg).expect("engine starts");
    let (toks, _, _) = collect(
        e.submit(request(Some("a"), (0..90).collect(), 4))
            .expect("ok"),
    );
    assert_eq!(toks.len(), 4);
    let b = e
        .submit(request(Some("b"), (300..340).collect(), 5))
        .expect("ok");
    let deadline = Instant::now() + Duration::from_secs(10);
    while e.snapshot_blocking().metrics.num_requests_waiting == 0 {
        assert!(Instant::now() < deadline, "b never queued");
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(b);
    while e.snapshot_blocking().metrics.num_requests_waiting > 0 {
        assert!(Instant::now() < deadline, "b still queued");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Only a ever started on a replica: b left the queue without being
    // admitted (no room counted, no prefix matched, nobody paused for it).
    let snap = e.snapshot_blocking();
    assert_eq!(snap.metrics.counters.queue_wait_s.count, 1);
    assert_eq!(snap.metrics.pauses(), 0);
    // b's program lives on: once a is released, its next request runs.
    assert!(e.release("a"));
    let (toks, _, _) = collect(
        e.submit(request(Some("b"), (300..340).collect(), 2))
            .expect("ok"),
    );
    assert_eq!(toks.len(), 2);
}

#[test]
fn release_ends_a_program_and_frees_its_blocks() {
    let e = engine(PolicyKind::Program, 256);
    collect(
        e.submit(request(Some("r"), (0..40).collect(), 5))
            .expect("ok"),
    );
    assert!(
        e.snapshot_blocking().metrics.kv_cache_usage > 0.0,
        "kept between requests"
    );
    assert!(e.release("r"));
    assert!(!e.release("r"), "already gone");
    assert!(e.snapshot_blocking().programs.is_empty());
    assert_eq!(e.snapshot_blocking().metrics.kv_cache_usage, 0.0);
}

#[test]
fn bad_requests_are_refused_with_a_reason() {
    let e = engine(PolicyKind::Program, 256);
    let err = |r| e.submit(r).err().expect("refused");
    assert!(matches!(
        err(request(None, vec![], 4)),
        EngineError::Invalid(_)
    ));
    assert!(
        matches!(err(request(None, vec![1, 2, 999_999], 4)), EngineError::Invalid(m) if m.contains("999999"))
    );
    assert!(matches!(
        err(request(None, vec![1; 100], 100)),
        EngineError::ContextTooLong {
            prompt: 100,
            max_tokens: 100,
            max: 128
        }
    ));
    let capped = Engine::with_model(
        Arc::new(Model::load(&fixture("gqa2-untied")).expect("model")),
        EngineConfig {
            max_model_len: Some(64),
            ..EngineConfig::default()
        },
    )
    .expect("starts");
    assert_eq!(capped.max_model_len(), 64);
    assert!(matches!(
        capped.submit(request(None, vec![1; 60], 8)).err(),
        Some(EngineError::ContextTooLong { max: 64, .. })
    ));
}

/// Blocks are allocated as a sequence grows; the window a request may use is
/// what one replica's pool holds, so no request is refused (or stuck) for a
/// window the operator never asked for (vLLM's semantics).
#[test]
fn the_window_is_capped_by_the_pool_not_refused() {
    // 2 blocks of 16 tokens: the model's 128-token window is lowered to 32.
    let small = engine(PolicyKind::Program, 2);
    assert_eq!(small.max_model_len(), 32);
    assert!(matches!(
        small.submit(request(None, vec![1; 40], 8)).err(),
        Some(EngineError::ContextTooLong { max: 32, .. })
    ));
    // Up to the window, generation runs to its end.
    let (out, reason, _) = collect(
        small
            .submit(request(None, vec![1; 20], 12))
            .expect("fits the pool"),
    );
    assert_eq!((out.len(), reason), (12, FinishReason::Length));
    // An explicit window the pool cannot hold is an error naming both.
    let err = Engine::with_model(
        Arc::new(Model::load(&fixture("gqa2-untied")).expect("model")),
        EngineConfig {
            num_blocks: 2,
            max_model_len: Some(64),
            ..EngineConfig::default()
        },
    )
    .err()
    .expect("refused at start")
    .to_string();
    assert!(err.contains("64") && err.contains("32 tokens"), "{err}");
}

#[test]
fn overload_gets_back_pressure() {
    let cfg = EngineConfig {
        num_blocks: 8,
        max_waiting: 2,
        ..EngineConfig::default()
    };
    let e = Engine::with_model(
        Arc::new(Model::load(&fixture("gqa2-untied")).expect("model")),
        cfg,
    )
    .expect("starts");
    let mut held = Vec::new();
    let mut refused = None;
    for i in 0..20 {
        match e.submit(request(Some(&format!("o{i}")), vec![5; 60], 40)) {
            Ok(s) => held.push(s),
            Err(err) => {
                refused = Some(err);
                break;
            }
        }
    }
    assert!(
        matches!(refused, Some(EngineError::Overloaded { limit: 2, .. })),
        "{refused:?}"
    );
}

#[test]
fn two_replicas_share_one_queue_and_match_greedy() {
    let cfg = EngineConfig {
        replicas: 2,
        num_blocks: 64,
        max_num_batched_tokens: 64,
        threads_per_replica: Some(1),
        ..EngineConfig::default()
    };
    let e = Engine::with_model(
        Arc::new(Model::load(&fixture("gqa2-untied")).expect("model")),
        cfg,
    )
    .expect("engine starts");
    let cases = golden("gqa2-untied");
    let streams: Vec<_> = cases
        .iter()
        .enumerate()
        .map(|(i, (prompt, want))| {
            e.submit(request(Some(&format!("r{i}")), prompt.clone(), want.len()))
                .expect("accepted")
        })
        .collect();
    for (s, (_, want)) in streams.into_iter().zip(&cases) {
        assert_eq!(&collect(s).0, want);
    }
    let replicas: std::collections::BTreeSet<Option<usize>> = e
        .snapshot_blocking()
        .programs
        .iter()
        .map(|p| p.replica)
        .collect();
    assert_eq!(
        replicas.len(),
        2,
        "programs were placed on both replicas: {:?}",
        e.snapshot_blocking().programs
    );
}

// The host KV tier on the real model (CPU runner): blocks the pool evicts
// are copied to host memory and back, and the tokens come out exactly as
// without memory pressure.

/// One request of `program` to its end (by length), with its usage.
fn run(e: &Engine, program: &str, prompt: &[u32], max_tokens: usize) -> (Vec<u32>, Usage) {
    let s = e
        .submit(request(Some(program), prompt.to_vec(), max_tokens))
        .expect("accepted");
    let (toks, reason, usage) = collect(s);
    assert_eq!(reason, FinishReason::Length);
    (toks, usage)
}

fn prompt(k: u32, len: u32) -> Vec<u32> {
    (0..len).map(|i| (i * 13 + k * 101) % 500).collect()
}

/// A program's second turn after two others took the whole pool while it
/// acted: its context comes back from the host tier (every full block
/// cached, nothing recomputed) and it generates what it would have alone.
#[test]
fn a_turn_after_eviction_is_served_from_the_host_tier() {
    let (a1, fill) = (prompt(0, 100), [prompt(1, 120), prompt(2, 120)]);
    let turn2 = |gen: &[u32]| {
        let mut t = a1.clone();
        t.extend(gen);
        t.extend([7, 8, 9, 10]);
        t
    };
    // Alone, with room for everything.
    let roomy = engine(PolicyKind::Program, 256);
    let (g1, _) = run(&roomy, "a", &a1, 12);
    let (want, _) = run(&roomy, "a", &turn2(&g1), 12);

    // 10 blocks of 16: each of the other two programs' 120-token prompts
    // needs 8, so a (acting) is paused and its 6 full blocks evicted; the
    // host tier keeps them.
    let e = engine_with_host(PolicyKind::Program, 10, 64);
    let (got1, _) = run(&e, "a", &a1, 12);
    assert_eq!(got1, g1);
    for (i, p) in fill.iter().enumerate() {
        run(&e, &format!("fill{i}"), p, 4);
    }
    let m = e.snapshot_blocking().metrics.clone();
    assert!(
        m.kv_offloaded_blocks >= 6,
        "a's blocks went to the host: {m:?}"
    );
    let ctx = turn2(&g1);
    let (got, usage) = run(&e, "a", &ctx, 12);
    assert_eq!(got, want, "same tokens as with no eviction");
    let full = (a1.len() + g1.len() - 1) / 16 * 16;
    assert!(
        usage.cached_tokens >= full,
        "{} of {} cached",
        usage.cached_tokens,
        full
    );
    let m = e.snapshot_blocking().metrics.clone();
    assert!(m.kv_onloaded_blocks >= 6, "{m:?}");
    assert!(m.host_blocks_used > 0 && m.host_blocks == 64, "{m:?}");
}
