//! The engine over the `StepRunner` seam: runners must match the
//! configuration, and a backend failure mid-step ends only that step's
//! requests while the engine keeps serving with its blocks intact.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use agentd_engine::{Engine, EngineConfig, Event, FinishReason, GenerateRequest, StartError};
use agentd_models::{CpuRunner, Model};
use agentd_runtime::{BatchInput, Logits, ModelError, SamplingParams, StepRunner};

fn model() -> Arc<Model> {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/golden/gqa2-untied");
    Arc::new(Model::load(&dir).expect("fixture loads"))
}

fn config() -> EngineConfig {
    EngineConfig {
        num_blocks: 64,
        block_size: 16,
        max_num_batched_tokens: 64,
        ..EngineConfig::default()
    }
}

/// The CPU runner, failing its `fail_at`-th step (a backend error: a CUDA
/// launch failure, say).
struct FlakyRunner {
    inner: CpuRunner,
    steps: Arc<AtomicUsize>,
    fail_at: usize,
}

impl StepRunner for FlakyRunner {
    fn step(&mut self, batch: &BatchInput) -> agentd_runtime::Result<Logits> {
        if self.steps.fetch_add(1, Ordering::SeqCst) == self.fail_at {
            return Err(ModelError::Backend {
                backend: "test",
                message: "injected launch failure".into(),
            });
        }
        self.inner.step(batch)
    }
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
    fn num_blocks(&self) -> usize {
        self.inner.num_blocks()
    }
    fn device(&self) -> String {
        "flaky cpu".into()
    }
}

fn run(engine: &Engine, program: &str, prompt: Vec<u32>) -> (Vec<u32>, FinishReason) {
    let mut s = engine
        .submit(GenerateRequest {
            program: Some(program.into()),
            prompt,
            sampling: SamplingParams {
                max_tokens: 8,
                ignore_eos: true,
                ..SamplingParams::greedy()
            },
            ..GenerateRequest::default()
        })
        .expect("accepted");
    let mut toks = Vec::new();
    loop {
        match s.blocking_next() {
            Some(Event::Token(t)) => toks.push(t.token_id),
            Some(Event::Finished { reason, .. }) => return (toks, reason),
            None => panic!("stream ended without Finished"),
        }
    }
}

#[test]
fn runners_must_match_the_configuration() {
    let m = model();
    let cfg = config();
    let wrong =
        CpuRunner::new(m.clone(), cfg.num_blocks / 2, cfg.block_size, 1, "t").expect("runner");
    let err = Engine::with_runners(m.config().clone(), vec![Box::new(wrong)], cfg.clone())
        .err()
        .expect("a runner with the wrong pool size is refused");
    assert!(matches!(err, StartError::Config(_)), "{err}");
    let err = Engine::with_runners(m.config().clone(), Vec::new(), cfg)
        .err()
        .expect("no runner for the replica is refused");
    assert!(matches!(err, StartError::Config(_)), "{err}");
}

#[test]
fn a_failed_step_ends_its_requests_and_the_engine_keeps_serving() {
    let m = model();
    let cfg = config();
    let prompt: Vec<u32> = (1..40).collect();
    // Reference: the same request on a healthy engine.
    let healthy = Engine::with_model(m.clone(), cfg.clone()).expect("engine");
    let (want, reason) = run(&healthy, "ref", prompt.clone());
    assert_eq!((want.len(), reason), (8, FinishReason::Length));
    healthy.shutdown();

    let steps = Arc::new(AtomicUsize::new(0));
    let runner = FlakyRunner {
        inner: CpuRunner::new(m.clone(), cfg.num_blocks, cfg.block_size, 1, "t").expect("runner"),
        steps: steps.clone(),
        fail_at: 0,
    };
    let engine =
        Engine::with_runners(m.config().clone(), vec![Box::new(runner)], cfg).expect("engine");
    let (_, reason) = run(&engine, "a", prompt.clone());
    assert_eq!(
        reason,
        FinishReason::Error,
        "the failed step's request ends with an error"
    );
    // The next request of another program (and of the same one) completes
    // with the uncontended tokens.
    assert_eq!(
        run(&engine, "b", prompt.clone()),
        (want.clone(), FinishReason::Length)
    );
    assert_eq!(run(&engine, "a", prompt), (want, FinishReason::Length));
    assert!(engine.release("a") && engine.release("b"));
    assert!(steps.load(Ordering::SeqCst) > 2);
    let m = engine.snapshot_blocking().metrics.clone();
    assert_eq!(m.kv_cache_usage, 0.0, "no block leaked by the failed step");
}
