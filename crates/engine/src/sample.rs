//! A step's forward and its sampling, outside the engine lock: either the
//! runner's logits rows read in place by each sequence's sampler on the
//! replica's pool, or, where the runner samples on its device
//! ([`StepRunner::draws_on_device`]), each row's plan handed to the runner
//! and only the drawn tokens taken back (docs/design.md §8).

use std::time::Instant;

use agentd_kv::BlockCopy;
use agentd_runtime::sampling::device::{Drawn, RowPlan};
use agentd_runtime::sampling::prompt_logprob;
use agentd_runtime::{BatchBuilder, BatchInput, Logits, LogitsFor, SequenceSampler, StepRunner};
use rayon::prelude::*;
use tracing::error;

use crate::core::{Sampled, SeqPlan};
use crate::prompt_lp::PromptRows;
use crate::FinishReason;

/// Below this many rows to sample, the worker does it alone: handing rows
/// to the pool costs a few µs, a greedy row ~0.1 ms, a temperature row ~1 ms.
const PARALLEL_SAMPLING_MIN_ROWS: usize = 4;

/// How long a step's forward and sampling took (`/metrics`).
#[derive(Clone, Copy)]
pub(crate) struct StepTiming {
    pub forward_s: f64,
    /// `None` when the step sampled no row.
    pub sample_s: Option<f64>,
}

/// What one step needs besides its plan.
pub(crate) struct StepEnv<'a> {
    pub eos: &'a [u32],
    pub vocab: usize,
    /// The worker's sampling pool when the runner lends none
    /// ([`StepRunner::compute_pool`]).
    pub own_pool: Option<&'a rayon::ThreadPool>,
}

/// Runs `plan` after `copies` and samples it: the result is aligned with
/// `plan` (`None` where no logits were asked for). Rows are drawn on the
/// runner's device when it can and no sequence scores prompt positions
/// (those need every row of their chunk on the host).
pub(crate) fn run_step(
    runner: &mut dyn StepRunner,
    copies: &[BlockCopy],
    plan: &mut [SeqPlan],
    env: &StepEnv<'_>,
) -> (agentd_runtime::Result<Vec<Option<Sampled>>>, StepTiming) {
    let batch = batch_of(runner.block_size(), plan);
    if runner.draws_on_device() && plan.iter().all(|s| s.prompt.is_none()) {
        return draw_on_runner(runner, copies, &batch, plan, env);
    }
    let t = Instant::now();
    let result = runner.step_after_copies(copies, &batch);
    let forward_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let pool = runner.compute_pool().or(env.own_pool);
    let mut rows = 0;
    let sampled = result.and_then(|logits| {
        rows = logits.rows();
        sample(plan, &logits, env.eos, pool)
    });
    let timing = StepTiming {
        forward_s,
        sample_s: (rows > 0).then(|| t.elapsed().as_secs_f64()),
    };
    (sampled, timing)
}

/// The batch of `plan`, in plan order: one logits row per sequence that
/// samples, or one per new token for a chunk that scores prompt positions
/// ([`SeqPlan::prompt`]).
fn batch_of(block_size: usize, plan: &[SeqPlan]) -> BatchInput {
    let mut b = BatchBuilder::new(block_size);
    for s in plan {
        let logits = if s.prompt.is_some() {
            LogitsFor::All
        } else if s.wants_logits() {
            LogitsFor::Last
        } else {
            LogitsFor::None
        };
        b.push(&s.new_tokens, s.num_cached, &s.block_table, logits);
    }
    b.build()
}

/// The step with its rows drawn by the runner from each sampler's plan
/// (`sample_s` is the planning and the accepting, on the host). A sampler
/// that cannot plan (a grammar failure) ends its request; its row is drawn
/// greedily and dropped.
fn draw_on_runner(
    runner: &mut dyn StepRunner,
    copies: &[BlockCopy],
    batch: &BatchInput,
    plan: &mut [SeqPlan],
    env: &StepEnv<'_>,
) -> (agentd_runtime::Result<Vec<Option<Sampled>>>, StepTiming) {
    let t = Instant::now();
    let mut outs: Vec<Option<Sampled>> = plan.iter().map(|_| None).collect();
    let mut rows: Vec<RowPlan> = Vec::new();
    for (s, out) in plan.iter_mut().zip(outs.iter_mut()) {
        let Some(sampler) = s.sampler.as_mut() else {
            continue;
        };
        rows.push(sampler.plan_row(env.vocab, env.eos).unwrap_or_else(|e| {
            *out = Some(failed(&e));
            RowPlan::greedy()
        }));
    }
    let mut sample_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let result = runner.step_and_draw(copies, batch, &rows);
    let forward_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let sampled = result.map(|drawn| {
        let mut drawn = drawn.into_iter();
        for (s, out) in plan.iter_mut().zip(outs.iter_mut()) {
            let Some(sampler) = s.sampler.as_mut() else {
                continue;
            };
            let d = drawn.next();
            if out.is_none() {
                *out = Some(accept(sampler, d, env.eos));
            }
        }
        outs
    });
    sample_s += t.elapsed().as_secs_f64();
    let timing = StepTiming {
        forward_s,
        sample_s: (!rows.is_empty()).then_some(sample_s),
    };
    (sampled, timing)
}

/// A drawn token taken by its sampler (a missing one ends the request).
fn accept(sampler: &mut SequenceSampler, drawn: Option<Drawn>, eos: &[u32]) -> Sampled {
    let Some(drawn) = drawn else {
        return failed(&"the runner drew fewer rows than planned");
    };
    match sampler.accept(drawn, eos) {
        Ok(output) => Sampled {
            finish: sampler.finish_reason(output.token_id, eos),
            output: Some(output),
        },
        Err(e) => failed(&e),
    }
}

/// A row whose sampling failed: the request ends with an error.
fn failed(e: &dyn std::fmt::Display) -> Sampled {
    error!(error = %e, "sampling failed; ending the request");
    Sampled {
        output: None,
        finish: Some(FinishReason::Error),
    }
}

/// Samples each sequence's next token from its logits row (borrowed in
/// place from the runner's output) with its own sampler, outside the engine
/// lock, in parallel across sequences on the replica's pool (each sampler
/// owns its RNG, so the result does not depend on the split). The result is
/// aligned with `plan`: `None` where no logits were asked for. A chunk that
/// scores prompt positions gets its entries in [`SeqPlan::prompt`]; its
/// last row samples when it ends the context.
fn sample(
    plan: &mut [SeqPlan],
    logits: &Logits,
    eos: &[u32],
    pool: Option<&rayon::ThreadPool>,
) -> agentd_runtime::Result<Vec<Option<Sampled>>> {
    let vocab = logits.vocab().max(1);
    logits.with_flat(|flat| {
        let mut outs: Vec<Option<Sampled>> = plan.iter().map(|_| None).collect();
        let mut rows = flat.chunks_exact(vocab);
        let mut jobs: Vec<Job<'_>> = Vec::with_capacity(plan.len());
        for (s, out) in plan.iter_mut().zip(outs.iter_mut()) {
            if let Some(p) = s.prompt.as_mut() {
                let chunk: Vec<&[f32]> = rows.by_ref().take(s.new_tokens.len()).collect();
                score_prompt(p, &chunk, pool);
                if let Some(sampler) = s.sampler.as_mut() {
                    jobs.push((sampler, chunk.last().copied().unwrap_or(&[]), out));
                }
            } else if let Some(sampler) = s.sampler.as_mut() {
                let row = rows.next().unwrap_or(&[]);
                jobs.push((sampler, row, out));
            }
        }
        match pool {
            Some(pool)
                if jobs.len() >= PARALLEL_SAMPLING_MIN_ROWS && pool.current_num_threads() > 1 =>
            {
                pool.install(|| jobs.par_iter_mut().for_each(|j| sample_one(j, eos)));
            }
            _ => jobs.iter_mut().for_each(|j| sample_one(j, eos)),
        }
        outs
    })
}

/// The prompt logprobs of one chunk's rows (row `i` scores `targets[i]`),
/// on the pool when there is one: each row is four passes over the
/// vocabulary (max, exp-sum, top-k, rank), and a chunk has up to
/// `max_num_batched_tokens` of them.
fn score_prompt(p: &mut PromptRows, chunk: &[&[f32]], pool: Option<&rayon::ThreadPool>) {
    let k = p.k;
    let score = |(row, &t): (&&[f32], &u32)| prompt_logprob(row, t, k);
    p.out = match pool {
        Some(pool) if p.targets.len() > 1 => pool.install(|| {
            chunk
                .par_iter()
                .zip(p.targets.par_iter())
                .map(score)
                .collect()
        }),
        _ => chunk.iter().zip(&p.targets).map(score).collect(),
    };
}

type Job<'a> = (
    &'a mut agentd_runtime::SequenceSampler,
    &'a [f32],
    &'a mut Option<Sampled>,
);

/// One row. A sampler error (or a missing row) ends the request.
fn sample_one((sampler, row, out): &mut Job<'_>, eos: &[u32]) {
    **out = Some(match sampler.sample(row, eos) {
        Ok(output) => {
            let finish = sampler.finish_reason(output.token_id, eos);
            Sampled {
                output: Some(output),
                finish,
            }
        }
        Err(e) => failed(&e),
    });
}
