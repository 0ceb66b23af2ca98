//! Concurrent requests of one program (docs/design.md §2): a request that arrives
//! while the program is busy runs at once as a sibling sequence, produces the
//! tokens it would alone, shares the program's prefix through the cache, and
//! ends with the program.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use agentd_engine::{Engine, EngineConfig, Event, FinishReason, GenerateRequest, RequestStream};
use agentd_models::Model;
use agentd_runtime::SamplingParams;

fn engine() -> Engine {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/golden/gqa2-untied");
    let cfg = EngineConfig {
        num_blocks: 128,
        block_size: 16,
        max_num_batched_tokens: 256,
        ..EngineConfig::default()
    };
    Engine::with_model(Arc::new(Model::load(&dir).expect("model")), cfg).expect("engine starts")
}

fn submit(
    e: &Engine,
    program: &str,
    prompt: Vec<u32>,
    max_tokens: usize,
    last: bool,
) -> RequestStream {
    e.submit(GenerateRequest {
        program: Some(program.into()),
        prompt,
        sampling: SamplingParams {
            max_tokens,
            ignore_eos: true,
            ..SamplingParams::greedy()
        },
        final_request: last,
        ..GenerateRequest::default()
    })
    .expect("accepted")
}

fn collect(mut s: RequestStream) -> (Vec<u32>, FinishReason, usize) {
    let mut toks = Vec::new();
    loop {
        match s.blocking_next() {
            Some(Event::Token(t)) => toks.push(t.token_id),
            Some(Event::Finished { reason, usage }) => return (toks, reason, usage.cached_tokens),
            None => panic!("stream ended without Finished"),
        }
    }
}

#[test]
fn a_parallel_request_runs_beside_the_busy_one_with_its_uncontended_tokens() {
    let system: Vec<u32> = (1..65).collect(); // four full blocks shared by both
    let mut a = system.clone();
    a.extend(100..110);
    let mut b = system.clone();
    b.extend(200..205);
    // Reference outputs, each alone on a fresh engine.
    let e = engine();
    let want_a = collect(submit(&e, "ref-a", a.clone(), 50, false)).0;
    let want_b = collect(submit(&e, "ref-b", b.clone(), 3, false)).0;
    e.shutdown();

    let e = engine();
    let long = submit(&e, "agent", a, 50, false);
    let short = submit(&e, "agent", b, 3, false);
    let a_thread = std::thread::spawn(move || {
        let out = collect(long);
        (out, Instant::now())
    });
    let (got_b, reason_b, cached_b) = collect(short);
    let b_done = Instant::now();
    assert_eq!((got_b, reason_b), (want_b, FinishReason::Length));
    let ((got_a, reason_a, _), a_done) = a_thread.join().expect("collector");
    assert_eq!((got_a, reason_a), (want_a, FinishReason::Length));
    // B (3 tokens) finished before A (50): it did not wait behind A.
    assert!(
        b_done < a_done,
        "the parallel request waited for the busy one"
    );
    // B shares the program's system prompt (4 full blocks) unless it was
    // planned in the same step as A's prefill, before A's blocks existed.
    assert!(cached_b == 0 || cached_b == 64, "{cached_b}");
    let agent = e
        .snapshot_blocking()
        .programs
        .iter()
        .find(|p| p.id == "agent")
        .cloned()
        .expect("program");
    assert_eq!(agent.steps, 2, "both requests count as the program's steps");
    assert_eq!(agent.parallel_requests, 0);
    assert!(e.release("agent"));
    assert_eq!(e.snapshot_blocking().metrics.kv_cache_usage, 0.0);
}

#[test]
fn releasing_a_program_cancels_its_parallel_requests() {
    let e = engine();
    let first = submit(&e, "p", (1..40).collect(), 80, false);
    let second = submit(&e, "p", (1..30).collect(), 80, false);
    let third = submit(&e, "p", (5..45).collect(), 80, false);
    let listed = e
        .snapshot_blocking()
        .programs
        .iter()
        .find(|p| p.id == "p")
        .cloned()
        .expect("program");
    // The golden model decodes 80 tokens in tens of milliseconds (its
    // context is capped at 128): a sibling may finish, and leave the list,
    // before the snapshot or the release. Each request either ran to its
    // length or was cancelled by the release; none outlives the program.
    assert!(listed.parallel_requests <= 2, "{listed:?}");
    assert!(e.release("p"));
    let mut cancelled = 0;
    for s in [first, second, third] {
        match collect(s) {
            (_, FinishReason::Cancelled, _) => cancelled += 1,
            (toks, FinishReason::Length, _) => assert_eq!(toks.len(), 80),
            (_, r, _) => panic!("ended {r:?}"),
        }
    }
    eprintln!(
        "listed {} siblings, {cancelled} of 3 cancelled",
        listed.parallel_requests
    );
    assert!(e.snapshot_blocking().programs.iter().all(|p| p.id != "p"));
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(
        e.snapshot_blocking().metrics.kv_cache_usage,
        0.0,
        "no block leaked"
    );
}

#[test]
fn a_final_parallel_request_releases_the_program_when_it_ends() {
    let e = engine();
    let main = submit(&e, "q", (1..40).collect(), 4, false);
    let last = submit(&e, "q", (1..20).collect(), 2, true);
    let (_, r_last, _) = collect(last);
    assert_eq!(r_last, FinishReason::Length);
    // The program is gone with the final request; its main request ends too
    // (cancelled if it was still running, finished if it was done).
    let r_main = collect(main).1;
    assert!(matches!(
        r_main,
        FinishReason::Length | FinishReason::Cancelled
    ));
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(e.snapshot_blocking().programs.iter().all(|p| p.id != "q"));
    assert_eq!(e.snapshot_blocking().metrics.kv_cache_usage, 0.0);
}
