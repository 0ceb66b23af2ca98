//! The step's balance on the real core and caches (issue 32 item 1): the
//! replica's step-time fit learns from the seconds each step reports at
//! `Step::finish`; while a step decodes, its prefill chunks are capped by
//! the fit so each output token waits at most `1 / (1 - prefill_share)`
//! decode steps; and a new program waits while the prefill queued on the
//! replica would take longer than `admit_prefill_s`.

mod common;

use std::collections::BTreeMap;

use agentd_scheduler::{
    Contexts, ProgramId, ProgramScheduler, ReplicaSet, SchedulerConfig, StepPlan, StepWork,
    MIN_PREFILL_CHUNK,
};
use common::{config, pid};

const BS: usize = 16;

/// Contexts and generated counts, lent to the core.
#[derive(Default)]
struct Ctx {
    tokens: BTreeMap<ProgramId, Vec<u32>>,
    generated: BTreeMap<ProgramId, usize>,
}

impl Contexts for Ctx {
    fn context(&self, p: ProgramId) -> Option<&[u32]> {
        self.tokens.get(&p).map(Vec::as_slice)
    }
    fn generated(&self, p: ProgramId) -> usize {
        self.generated.get(&p).copied().unwrap_or(0)
    }
}

impl Ctx {
    fn grow(&mut self, p: ProgramId, n: usize) {
        let c = self.tokens.entry(p).or_default();
        let from = c.len() as u32;
        c.extend((0..n as u32).map(|i| (p.0 as u32 + 1) * 1_000_000 + from + i));
    }
}

/// One replica of `blocks` blocks under `cfg`, invariants checked.
fn set(cfg: SchedulerConfig, blocks: usize) -> ReplicaSet<ProgramScheduler> {
    let policy = ProgramScheduler::new(cfg.clone(), 1);
    ReplicaSet::new(policy, 1, blocks, BS, 0, true).with_step_balance(&cfg)
}

/// The "true" step time the driver reports: 10 ms fixed, 1 ms a sampled
/// row, 0.2 ms a token, 50 ns an attention pair, 0.5 µs a decode context
/// token (the CPU bench's terms, rounded).
fn seconds(w: &StepWork) -> f64 {
    10e-3
        + 1e-3 * w.rows as f64
        + 0.2e-3 * w.tokens as f64
        + 50e-9 * w.prefill_pairs
        + 0.5e-6 * w.decode_context as f64
}

/// Runs one step at `now` under `budget`: plans, commits every planned
/// sequence (a sequence reaching its context's end samples a token, which
/// joins its context), finishes with the modelled time. Returns the plan,
/// that time and the step's work.
fn step(
    core: &mut ReplicaSet<ProgramScheduler>,
    ctx: &mut Ctx,
    now: f64,
    budget: usize,
) -> (StepPlan, f64, StepWork) {
    let mut step = core.begin_step(0, now, ctx).expect("no step open");
    let (plan, _) = step.plan(core, budget, ctx).expect("planned");
    for s in &plan.seqs {
        let toks = ctx.tokens[&s.program][s.num_computed..s.num_computed + s.num_new].to_vec();
        step.commit(core, s.program, &toks).expect("slots");
        if s.wants_logits {
            ctx.grow(s.program, 1);
            *ctx.generated.entry(s.program).or_default() += 1;
        }
    }
    let work = *step.work();
    let dt = seconds(&work);
    step.finish(core, Some(dt)).expect("invariants hold");
    (plan, dt, work)
}

fn prefill_tokens(plan: &StepPlan) -> usize {
    plan.seqs
        .iter()
        .filter(|s| !s.decoding)
        .map(|s| s.num_new)
        .sum()
}

#[test]
fn the_fit_caps_prefill_chunks_while_decoding() {
    for share in [1.0, 0.9, 0.6] {
        let mut cfg = config(0.95, 1.0);
        cfg.prefill_share = share;
        let (mut core, mut ctx) = (set(cfg, 4096), Ctx::default());
        // Four programs that decode from their second step on.
        for d in 1..=4 {
            ctx.grow(pid(d), 200 + 50 * d as usize);
            core.on_request(pid(d), 0.0, &ctx);
        }
        let mut now = 0.0;
        let mut next = 10;
        let mut capped = Vec::new();
        for i in 0..120 {
            // A steady stream of 1-3k-token prompts keeps prefill pending.
            if core.running(0).len() < 6 {
                ctx.grow(pid(next), 1000 + 97 * (i % 23));
                core.on_request(pid(next), now, &ctx);
                next += 1;
            }
            let (plan, dt, _) = step(&mut core, &mut ctx, now, 2048);
            now += dt;
            // Eight tokens answer a turn; the program ends.
            let done: Vec<ProgramId> = ctx
                .generated
                .iter()
                .filter(|(_, &g)| g >= 8)
                .map(|(p, _)| *p)
                .collect();
            for p in done {
                let len = ctx.tokens.remove(&p).map_or(0, |c| c.len());
                ctx.generated.remove(&p);
                core.finish_request(p, now, len);
                core.terminate(p);
            }
            let decodes: Vec<_> = plan.seqs.iter().filter(|s| s.decoding).collect();
            if i >= 40 && !decodes.is_empty() && prefill_tokens(&plan) > 0 {
                let mut dw = StepWork::default();
                for s in &decodes {
                    dw.add_decode(s.num_computed);
                    dw.rows += 1;
                }
                capped.push((prefill_tokens(&plan), dt, seconds(&dw)));
            }
        }
        assert!(core.rates(0).steps() >= 100, "every step was fitted");
        assert!(
            capped.len() > 20,
            "share {share}: {} mixed steps",
            capped.len()
        );
        for &(n, dt, decode_s) in &capped {
            if share >= 1.0 {
                // No cap: the budget less the decodes (or the prompt's end).
                continue;
            }
            // At most 1/(1-share) decode steps (10% for the fit), or the
            // floor chunk when even that allows less.
            let bound = decode_s / (1.0 - share) * 1.1;
            assert!(
                dt <= bound || n <= MIN_PREFILL_CHUNK,
                "share {share}: {n} prefill tokens made a {dt:.4} s step, decodes alone {decode_s:.4} s"
            );
        }
        assert!(next > 20, "share {share}: prompts kept finishing ({next})");
        let largest = capped.iter().map(|c| c.0).max().unwrap_or(0);
        if share >= 1.0 {
            assert!(largest > 1500, "uncapped chunks fill the budget: {largest}");
        } else {
            assert!(
                largest < 1500,
                "share {share}: capped below the budget: {largest}"
            );
        }
    }
}

#[test]
fn a_new_program_waits_while_the_queued_prefill_would_take_too_long() {
    for bound in [f64::INFINITY, 0.5] {
        let mut cfg = config(0.95, 1.0);
        cfg.admit_prefill_s = bound;
        let (mut core, mut ctx) = (set(cfg, 4096), Ctx::default());
        // Warm the fit: a decoding program beside a stream of prompts.
        ctx.grow(pid(1), 300);
        core.on_request(pid(1), 0.0, &ctx);
        let mut now = 0.0;
        for i in 0..30 {
            if i % 5 == 0 {
                let p = pid(100 + i as u64);
                ctx.grow(p, 200 + 40 * i);
                core.on_request(p, now, &ctx);
            }
            now += step(&mut core, &mut ctx, now, 512).1;
        }
        assert!(core.rates(0).prefill_s(0, 1000).is_some(), "warm");
        // An 8k-token prompt, prefilled 256 tokens a step: seconds of
        // queued prefill (0.2 ms a token and the pairs).
        ctx.grow(pid(2), 8000);
        core.on_request(pid(2), now, &ctx);
        now += step(&mut core, &mut ctx, now, 256).1;
        assert!(core.is_running(pid(2)));
        ctx.grow(pid(3), 2000);
        core.on_request(pid(3), now, &ctx);
        now += step(&mut core, &mut ctx, now, 256).1;
        if bound.is_infinite() {
            assert!(core.is_running(pid(3)), "no bound: admitted at once");
            continue;
        }
        assert!(!core.is_running(pid(3)), "waits behind 7.7k queued tokens");
        assert_eq!(core.kv(0).blocks_held(pid(3)), 0, "holding nothing");
        // Once the big prompt is computed the new one is admitted.
        let mut admitted_at = None;
        for i in 0..100 {
            now += step(&mut core, &mut ctx, now, 256).1;
            if core.is_running(pid(3)) {
                admitted_at = Some(i);
                break;
            }
        }
        let left = ctx.tokens[&pid(2)].len() - core.kv(0).num_computed(pid(2));
        assert!(admitted_at.is_some(), "admitted in the end");
        assert!(
            left < 2000,
            "only once little of the big prompt was left: {left}"
        );
    }
}

/// `CoreStats` sums what every step that ran a forward computed (the
/// engine's `/metrics` exports the sums), and a step finished without a
/// forward adds nothing.
#[test]
fn core_stats_sum_the_work_of_finished_steps() {
    let (mut core, mut ctx) = (set(config(0.95, 1.0), 1024), Ctx::default());
    for d in 1..=3 {
        ctx.grow(pid(d), 100 + 200 * d as usize);
        core.on_request(pid(d), 0.0, &ctx);
    }
    let (mut pairs, mut context, mut decoded) = (0.0f64, 0u64, 0usize);
    let mut now = 0.0;
    for _ in 0..10 {
        let (plan, dt, w) = step(&mut core, &mut ctx, now, 512);
        pairs += w.prefill_pairs.round();
        context += w.decode_context as u64;
        decoded += plan.seqs.iter().filter(|s| s.decoding).count();
        now += dt;
    }
    assert!(
        decoded > 0 && pairs > 0.0,
        "the steps decoded ({decoded}) and prefilled ({pairs} pairs)"
    );
    let stats = core.stats();
    assert_eq!(stats.prefill_attention_pairs, pairs as u64);
    assert_eq!(stats.decode_context_tokens, context);
    // The three contexts (300, 500, 700 tokens) were decoding: each row
    // read at least its prompt.
    assert!(context >= 300 * decoded as u64);
    let step = core.begin_step(0, now, &ctx).expect("no step open");
    step.finish(&mut core, None).expect("invariants hold");
    assert_eq!(core.stats(), stats);
}
