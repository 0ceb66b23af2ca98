//! A replica's batch for one step ([`ReplicaSet::plan_batch`]): which
//! running programs compute how many tokens, under the step's token budget
//! and the replica's measured step time (`rates.rs`), with the slots they
//! need reserved ([`ReplicaSet::reserve`]), pausing the policy's victims
//! when blocks run out.

use std::collections::HashSet;

use agentd_kv::{BlockHash, ProgramId};
use tracing::debug;

use super::{Contexts, Planned, ReplicaSet, StepPlan};
use crate::{PauseCause, Policy, Replicas, StepWork};

/// The smallest prefill chunk of a step that decodes (the first prefill of
/// it gets at least this many tokens whatever the cap): 128 tokens are
/// 23-30 ms on the CPU bench (`crates/sim/src/cost.rs`), about one decode
/// step, so a decode-heavy batch still moves a prompt along.
pub const MIN_PREFILL_CHUNK: usize = 128;

/// The step-time balance of one plan: what it decodes so far, and the
/// prefill seconds it still allows.
#[derive(Default)]
struct Balance {
    work: StepWork,
    prefill_left_s: Option<f64>,
    prefills: usize,
}

impl<P: Policy> ReplicaSet<P> {
    /// The batch of `r` for this step under `budget` tokens: decode tokens
    /// first (one each, latency-critical), then prefill chunks, in start
    /// order ([`ReplicaSet::batch_order`]).
    /// While the batch decodes, its prefill chunks are capped by the
    /// measured step time ([`ReplicaSet::with_step_balance`]).
    #[doc(hidden)]
    pub fn plan_batch(
        &mut self,
        r: usize,
        now: f64,
        budget: usize,
        ctx: &impl Contexts,
    ) -> StepPlan {
        let order = self.batch_order(r, ctx);
        let mut plan = StepPlan {
            budget_left: budget,
            ..StepPlan::default()
        };
        let mut balance = Balance::default();
        // Blocks this step's prefills fill, for in-batch prefix sharing.
        let mut filling: HashSet<BlockHash> = HashSet::new();
        for (prefill, p) in order {
            if plan.budget_left == 0 {
                break;
            }
            if !self.running[r].contains(&p) {
                continue; // paused by an earlier allocation of this step
            }
            let Some(tokens) = ctx.context(p) else {
                continue;
            };
            let len = tokens.len();
            if prefill && !ctx.full_prefill(p) {
                // What a program planned earlier computed in a past step
                // (the block it waited on) is cached now: take it.
                self.kv[r].extend_match(p, tokens);
                let next = self.kv[r].next_block_hash(p, tokens);
                if next.is_some_and(|h| filling.contains(&h)) {
                    plan.deferred += 1;
                    continue;
                }
            }
            let computed = self.kv[r].num_computed(p);
            let mut n = len.saturating_sub(computed).min(plan.budget_left);
            if prefill {
                n = self.chunk_cap(r, &mut balance, computed, n);
            }
            if n == 0 || !self.reserve(r, p, n, now, &mut plan.preempted) {
                continue;
            }
            if prefill {
                filling.extend(self.kv[r].blocks_filled_by(p, tokens, n));
                balance.work.add_prefill(computed, n);
            } else {
                balance.work.add_decode(computed);
            }
            let wants_logits = computed + n == len;
            balance.work.rows += usize::from(wants_logits);
            plan.seqs.push(Planned {
                program: p,
                num_computed: computed,
                num_new: n,
                decoding: !prefill,
                wants_logits,
            });
            plan.budget_left -= n;
        }
        // A victim paused after being planned must not run.
        let running = &self.running[r];
        plan.seqs.retain(|s| running.contains(&s.program));
        plan
    }

    /// The running programs of `r` in plan order: decoding ones first, then
    /// those with a prefill to compute, each in start order. Shortest
    /// remaining prefill first (aged by `aging_tokens_per_s`) was tried and
    /// measured worse: the engine (AMD EPYC, avx512 kernels, 48 programs of
    /// ~4k-token contexts joining mid-history, 32,768-token pool, ABBA)
    /// ran 125.5 / 112.5 steps/min against 144.5 / 118.0 in start order
    /// (0.91x; p50 25.7 s against 19.5 / 23.5 s), while `agentd simulate`
    /// saw no difference (long, cpu-avx512: 143.7 -> 144.2 at 48): a long
    /// prompt deferred behind short ones holds its admitted blocks idle,
    /// and in start order an admitted program's whole prompt is computed
    /// and it decodes soonest.
    fn batch_order(&self, r: usize, ctx: &impl Contexts) -> Vec<(bool, ProgramId)> {
        let mut order: Vec<(bool, ProgramId)> = self.running[r]
            .iter()
            .map(|&p| (!self.is_decoding(r, p, ctx), p))
            .collect();
        order.sort_by_key(|&(prefill, _)| prefill);
        order
    }

    /// The prefill tokens (at most `n`) of a sequence with `computed`
    /// tokens in KV that this step still takes: all of them while the step
    /// decodes nothing, or the fit is cold, or the cap is off; else what
    /// fits in the prefill time the decodes allow — `share / (1 − share)`
    /// of their own predicted time — with at least [`MIN_PREFILL_CHUNK`]
    /// tokens for the step's first prefill, so prefill always progresses.
    fn chunk_cap(&self, r: usize, b: &mut Balance, computed: usize, n: usize) -> usize {
        let share = self.prefill_share;
        if share >= 1.0 || b.work.tokens == 0 || n == 0 {
            return n;
        }
        let rates = &self.rates[r];
        if b.prefill_left_s.is_none() {
            let Some(decode_s) = rates.predict(&b.work) else {
                return n;
            };
            b.prefill_left_s = Some(decode_s * share / (1.0 - share));
        }
        let left_s = b.prefill_left_s.unwrap_or(0.0);
        let fits = rates.prefill_tokens_within(computed, left_s).unwrap_or(n);
        let floor = if b.prefills == 0 {
            MIN_PREFILL_CHUNK
        } else {
            0
        };
        let take = n.min(fits.max(floor));
        if take > 0 {
            b.prefills += 1;
            let spent = rates.prefill_s(computed, take).unwrap_or(0.0);
            b.prefill_left_s = Some((left_s - spent).max(0.0));
        }
        take
    }

    /// One definition of "decoding" for every caller: the request has
    /// generated a token and that token is the only one not yet in KV.
    pub fn is_decoding(&self, r: usize, p: ProgramId, ctx: &impl Contexts) -> bool {
        ctx.generated(p) > 0
            && ctx
                .context(p)
                .is_some_and(|c| c.len() == self.kv[r].num_computed(p) + 1)
    }

    /// Allocates slots for `n` tokens of `p` on `r`, pausing the policy's
    /// victims while blocks are short. False when `p` itself was paused (or
    /// nothing can be paused).
    #[doc(hidden)]
    pub fn reserve(
        &mut self,
        r: usize,
        p: ProgramId,
        n: usize,
        now: f64,
        victims: &mut Vec<ProgramId>,
    ) -> bool {
        loop {
            if self.kv[r].allocate_slots(p, n).is_ok() {
                return true;
            }
            let Some(v) = self
                .policy
                .preempt(r, now, &Replicas(&self.kv, &self.rates), p)
            else {
                return false;
            };
            debug!(replica = r, victim = %v, "blocks exhausted: pause");
            self.pause_on(v, r);
            self.stats.pauses.add(PauseCause::Exhaustion);
            victims.push(v);
            if v == p {
                return false;
            }
        }
    }
}
