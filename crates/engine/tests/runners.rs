//! The engine over the `StepRunner` seam: runners must match the
//! configuration, and a backend failure mid-step ends only that step's
//! requests while the engine keeps serving with its blocks intact.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use agentd_engine::{Engine, EngineConfig, Event, FinishReason, GenerateRequest, StartError};
use agentd_models::runner::CpuLoader;
use agentd_models::{CpuRunner, LoadDtype, Model};
use agentd_runtime::sampling::device::{draw_rows, Drawn, RowPlan};
use agentd_runtime::{BatchInput, Logits, ModelError, SamplingParams, StepRunner, TokenControls};

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

/// The CPU runner telling the engine it draws on its device: the engine
/// hands it each row's plan and takes tokens back, and the runner draws by
/// the reference the CUDA kernel follows (`StepRunner::step_and_draw`'s
/// default). Counts the rows it drew.
struct PlanningRunner {
    inner: CpuRunner,
    rows: Arc<AtomicUsize>,
}

impl StepRunner for PlanningRunner {
    fn step(&mut self, batch: &BatchInput) -> agentd_runtime::Result<Logits> {
        self.inner.step(batch)
    }
    fn step_and_draw(
        &mut self,
        copies: &[agentd_runtime::BlockCopy],
        batch: &BatchInput,
        plans: &[RowPlan],
    ) -> agentd_runtime::Result<Vec<Drawn>> {
        self.rows.fetch_add(plans.len(), Ordering::SeqCst);
        let logits = self.step_after_copies(copies, batch)?;
        draw_rows(&logits, plans)
    }
    fn draws_on_device(&self) -> bool {
        true
    }
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
    fn num_blocks(&self) -> usize {
        self.inner.num_blocks()
    }
    fn device(&self) -> String {
        "planning cpu".into()
    }
}

type Output = (Vec<(u32, Option<f32>, Vec<(u32, f32)>)>, FinishReason);

/// Four programs at once (so steps batch several rows), each with its own
/// sampling; every stream's tokens, logprobs and finish reason.
fn run_four(engine: &Engine, sampling: &[SamplingParams; 4]) -> Vec<Output> {
    let streams: Vec<_> = sampling
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let prompt: Vec<u32> = (1..30).map(|t| t * (i as u32 + 3) % 250).collect();
            engine
                .submit(GenerateRequest {
                    program: Some(format!("p{i}")),
                    prompt,
                    sampling: p.clone(),
                    ..GenerateRequest::default()
                })
                .expect("accepted")
        })
        .collect();
    streams
        .into_iter()
        .map(|mut s| {
            let mut toks = Vec::new();
            loop {
                match s.blocking_next() {
                    Some(Event::Token(t)) => toks.push((t.token_id, t.logprob, t.top)),
                    Some(Event::Finished { reason, .. }) => return (toks, reason),
                    None => panic!("stream ended without Finished"),
                }
            }
        })
        .collect()
}

#[test]
fn rows_drawn_by_plan_match_the_host_sampler() {
    let m = model();
    let cfg = config();
    let greedy = |p: SamplingParams| SamplingParams {
        max_tokens: 12,
        ..p
    };
    let sampling = [
        greedy(SamplingParams {
            logprobs: Some(3),
            ignore_eos: true,
            ..SamplingParams::greedy()
        }),
        greedy(SamplingParams {
            repetition_penalty: 1.5,
            frequency_penalty: 0.7,
            presence_penalty: 0.3,
            ..SamplingParams::greedy()
        }),
        greedy(SamplingParams {
            stop_token_ids: vec![17],
            controls: TokenControls {
                logit_bias: vec![(17, 4.0), (3, -2.0)],
                bad_words: vec![vec![17, 17]],
                min_tokens: 3,
                allowed_token_ids: Some((0..120).collect()),
            },
            ..SamplingParams::greedy()
        }),
        greedy(SamplingParams {
            top_k: 5,
            logprobs: Some(1),
            ..SamplingParams::greedy()
        }),
    ];
    let host = Engine::with_model(m.clone(), cfg.clone()).expect("engine");
    let want = run_four(&host, &sampling);
    host.shutdown();

    let rows = Arc::new(AtomicUsize::new(0));
    let planning = |rows: &Arc<AtomicUsize>| {
        let runner = PlanningRunner {
            inner: CpuRunner::new(m.clone(), cfg.num_blocks, cfg.block_size, 1, "t")
                .expect("runner"),
            rows: rows.clone(),
        };
        Engine::with_runners(m.config().clone(), vec![Box::new(runner)], cfg.clone())
            .expect("engine")
    };
    let engine = planning(&rows);
    let got = run_four(&engine, &sampling);
    assert_eq!(got, want, "greedy rows drawn by plan equal the host's");
    assert!(want.iter().all(|(t, _)| !t.is_empty()));
    let drawn = rows.load(Ordering::SeqCst);
    let tokens: usize = got.iter().map(|(t, _)| t.len()).sum();
    assert_eq!(drawn, tokens, "every token came from a planned row");

    // Seeded draws at a temperature are reproducible by plan, whatever the
    // batch they share.
    let seeded = |seed| SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        seed: Some(seed),
        max_tokens: 10,
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let sampling = [seeded(1), seeded(2), seeded(3), seeded(1)];
    let a = run_four(&engine, &sampling);
    engine.shutdown();
    let again = planning(&rows);
    let b = run_four(&again, &sampling);
    again.shutdown();
    assert_eq!(a, b, "the same seeds draw the same tokens");
    let vocab = m.config().vocab_size as u32;
    assert!(a.iter().flat_map(|(t, _)| t).all(|t| t.0 < vocab));
    assert_ne!(a[0].0, a[1].0, "other seeds, other draws");
}

/// An engine started from bare runners (how `serve --device cuda` starts
/// one) takes new weights when it is given a loader: the loader loads, the
/// runners swap, and the next request runs on the new weights. Without one
/// a weight update is refused.
#[test]
fn bare_runners_with_a_loader_take_new_weights() {
    let m = model();
    let cfg = config();
    let dir = std::env::temp_dir().join(format!("agentd-swap-bare-{}", std::process::id()));
    agentd_models::synth::write_random_model(m.config(), &dir, 7, None)
        .expect("a second checkpoint");
    let prompt: Vec<u32> = (1..30).collect();
    let fresh = Engine::with_model(Arc::new(Model::load(&dir).expect("it loads")), cfg.clone())
        .expect("engine");
    let want = run(&fresh, "w", prompt.clone());
    fresh.shutdown();

    let runner = |m: &Arc<Model>| -> Box<dyn StepRunner> {
        Box::new(CpuRunner::new(m.clone(), cfg.num_blocks, cfg.block_size, 1, "t").expect("runner"))
    };
    let bare =
        Engine::with_runners(m.config().clone(), vec![runner(&m)], cfg.clone()).expect("engine");
    assert!(bare.load_weights(&dir).is_err(), "no loader: refused");
    bare.shutdown();

    let loader = Arc::new(CpuLoader(LoadDtype::Auto));
    let engine = Engine::with_runners_and_loader(m.config().clone(), vec![runner(&m)], cfg, loader)
        .expect("engine");
    let before = run(&engine, "a", prompt.clone());
    let w = engine.load_weights(&dir).expect("the loader loads");
    engine.swap_weights(w).expect("the runners swap");
    assert_eq!(run(&engine, "b", prompt), want, "the new weights serve");
    assert_ne!(before, want, "the two checkpoints differ");
    engine.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
