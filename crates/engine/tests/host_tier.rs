//! The host KV tier end to end on the real tiny Qwen3 (CPU runner): blocks
//! the pool evicts are copied to host memory and back, and the tokens come
//! out exactly as without memory pressure.

use std::path::PathBuf;

use agentd_engine::{Engine, EngineConfig, Event, FinishReason, GenerateRequest, Usage};
use agentd_models::SamplingParams;
use agentd_scheduler::{PolicyKind, SchedulerConfig};

fn model() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/golden/gqa2-untied")
}

fn engine(policy: PolicyKind, num_blocks: usize, host_blocks: usize) -> Engine {
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
    Engine::start(&model(), cfg).expect("engine starts")
}

fn request(program: &str, prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        program: Some(program.to_string()),
        prompt,
        sampling: SamplingParams {
            max_tokens,
            ignore_eos: true,
            ..SamplingParams::greedy()
        },
        final_request: false,
        parent_program: None,
        cache_salt: 0,
        group: None,
        tool: None,
    }
}

fn run(e: &Engine, program: &str, prompt: &[u32], max_tokens: usize) -> (Vec<u32>, Usage) {
    let mut s = e
        .submit(request(program, prompt.to_vec(), max_tokens))
        .expect("accepted");
    let mut toks = Vec::new();
    loop {
        match s.blocking_next() {
            Some(Event::Token(t)) => toks.push(t.token_id),
            Some(Event::Finished { reason, usage }) => {
                assert_eq!(reason, FinishReason::Length);
                return (toks, usage);
            }
            None => panic!("stream ended without Finished"),
        }
    }
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
    let roomy = engine(PolicyKind::Program, 256, 0);
    let (g1, _) = run(&roomy, "a", &a1, 12);
    let (want, _) = run(&roomy, "a", &turn2(&g1), 12);

    // 10 blocks of 16: each of the other two programs' 120-token prompts
    // needs 8, so a (acting) is paused and its 6 full blocks evicted; the
    // host tier keeps them.
    let e = engine(PolicyKind::Program, 10, 64);
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

/// Programs paused mid-request under memory pressure restore from the host
/// tier: same tokens as uncontended, less recomputed than without the tier.
#[test]
fn paused_programs_restore_by_copy_instead_of_recompute() {
    let cases: Vec<Vec<u32>> = (0..4).map(|k| prompt(k, 20)).collect();
    let roomy = engine(PolicyKind::Program, 256, 0);
    let want: Vec<Vec<u32>> = cases
        .iter()
        .enumerate()
        .map(|(i, p)| run(&roomy, &format!("r{i}"), p, 90).0)
        .collect();
    let mut recomputed = Vec::new();
    for host in [0, 128] {
        let tight = engine(PolicyKind::Program, 14, host);
        let streams: Vec<_> = cases
            .iter()
            .enumerate()
            .map(|(i, p)| {
                tight
                    .submit(request(&format!("t{i}"), p.clone(), 90))
                    .expect("ok")
            })
            .collect();
        for (mut s, w) in streams.into_iter().zip(&want) {
            let mut got = Vec::new();
            while let Some(Event::Token(t)) = s.blocking_next() {
                got.push(t.token_id);
            }
            assert_eq!(&got, w, "host {host}: same tokens as uncontended");
        }
        let m = tight.snapshot_blocking().metrics.clone();
        assert!(m.pauses > 0, "memory pressure paused someone: {m:?}");
        if host > 0 {
            assert!(m.kv_onloaded_blocks > 0, "{m:?}");
        }
        recomputed.push(m.recomputed_tokens);
    }
    assert!(
        recomputed[1] < recomputed[0],
        "recomputed without / with the host tier: {recomputed:?}"
    );
}
