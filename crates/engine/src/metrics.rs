//! Counters and histograms the server exposes on `/metrics`, and the
//! snapshot readers get of them ([`crate::board`]).

use crate::board::Snapshot;
use crate::core::Core;
use agentd_scheduler::PauseCause;

/// A cumulative histogram (Prometheus semantics).
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// `(upper bound, cumulative count)`, ascending; `+Inf` is `count`.
    pub buckets: Vec<(f64, u64)>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    fn with_bounds(bounds: &[f64]) -> Self {
        Self {
            buckets: bounds.iter().map(|&b| (b, 0)).collect(),
            sum: 0.0,
            count: 0,
        }
    }

    /// vLLM's latency buckets (seconds).
    pub fn latency() -> Self {
        Self::with_bounds(&[
            0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
            10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
        ])
    }

    /// Buckets for the phases of a step (the model forward, sampling),
    /// 100 µs to 10 s.
    pub fn step_phase() -> Self {
        Self::with_bounds(&[
            1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5,
            10.0,
        ])
    }

    /// Buckets for how long the engine lock is held, 5 µs to 1 s: the lock
    /// guards bookkeeping only, so its p99 should sit in the first buckets.
    pub fn lock_hold() -> Self {
        Self::with_bounds(&[
            5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 1.0,
        ])
    }

    /// The upper bound of the bucket holding quantile `q` (Prometheus'
    /// `histogram_quantile` without interpolation); `+Inf` past the last.
    pub fn quantile_bound(&self, q: f64) -> f64 {
        let want = (q * self.count as f64).ceil() as u64;
        self.buckets
            .iter()
            .find(|(_, c)| *c >= want.max(1))
            .map_or(f64::INFINITY, |(le, _)| *le)
    }

    pub fn observe(&mut self, v: f64) {
        for (le, c) in &mut self.buckets {
            if v <= *le {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }
}

/// What the engine counts as it happens: each field is updated at the one
/// place its event occurs (a submission routed, a token committed, a lock
/// section ended) and copied whole into each [`MetricsSnapshot`].
#[derive(Debug, Clone, PartialEq)]
pub struct Counters {
    /// Prompt tokens of every request routed.
    pub prompt_tokens: u64,
    /// Tokens sampled and committed.
    pub generation_tokens: u64,
    /// Requests finished, for any reason.
    pub requests_finished: u64,
    /// Time from a request's arrival to its first token.
    pub ttft_s: Histogram,
    /// Time from a request's arrival to its end.
    pub e2e_s: Histogram,
    /// Time from a request's arrival to its first start on a replica.
    pub queue_wait_s: Histogram,
    /// How long each critical section held the engine lock: every plan
    /// that had work (submissions to route, a batch, pauses, restores,
    /// cancellations, lease expiries), every commit, release and
    /// subscription — from acquiring the lock to releasing it, including a
    /// snapshot build done on the way out. Idle re-plans are not in it.
    pub lock_hold_s: Histogram,
    /// The same for idle re-plans: a worker with nothing to run re-checking
    /// leases and decay every 50 ms (or woken for nothing). Kept apart so
    /// they do not dilute `lock_hold_s`'s quantiles with near-empty sections.
    pub lock_idle_hold_s: Histogram,
    /// Each step's model forward (the runner's `step`, logits included).
    pub forward_s: Histogram,
    /// Each step's sampling of its logits rows (steps with rows only).
    pub sample_s: Histogram,
    /// Tokens planned into steps, and the token budget those steps had
    /// (their ratio is the batch fill).
    pub batch_tokens: u64,
    pub batch_budget: u64,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            prompt_tokens: 0,
            generation_tokens: 0,
            requests_finished: 0,
            ttft_s: Histogram::latency(),
            e2e_s: Histogram::latency(),
            queue_wait_s: Histogram::latency(),
            lock_hold_s: Histogram::lock_hold(),
            lock_idle_hold_s: Histogram::lock_hold(),
            forward_s: Histogram::step_phase(),
            sample_s: Histogram::step_phase(),
            batch_tokens: 0,
            batch_budget: 0,
        }
    }
}

/// A point-in-time view of the engine for `/metrics`: the engine's own
/// [`Counters`], and what is read off the KV pools, the policy and the
/// program table when the snapshot is built. The default is an engine that
/// has done nothing yet.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MetricsSnapshot {
    pub counters: Counters,
    pub num_requests_running: usize,
    pub num_requests_waiting: usize,
    /// Referenced blocks / all blocks, over all replicas (0..1).
    pub kv_cache_usage: f64,
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub block_size: usize,
    /// Blocks per replica.
    pub num_gpu_blocks: usize,
    /// `(phase, state, count)` of live programs.
    pub programs: Vec<(&'static str, &'static str, usize)>,
    pub restores: u64,
    pub recomputed_tokens: u64,
    /// What the steps that ran a forward computed, summed
    /// (`agentd_scheduler::CoreStats`): context tokens read by decode
    /// rows, and prefill attention pairs.
    pub decode_context_tokens: u64,
    pub prefill_attention_pairs: u64,
    /// Blocks copied to the host tier, and back, so far; host slots in use
    /// and in all (0 without a host tier).
    pub kv_offloaded_blocks: u64,
    pub kv_onloaded_blocks: u64,
    pub host_blocks_used: usize,
    pub host_blocks: usize,
    /// The step-time fit of replica 0 (`agentd_scheduler::StepRates`; 0
    /// until it has seen enough steps): the prefill rate of a 1024-token
    /// chunk after 1024 cached tokens, and the time of a one-sequence
    /// decode step at a 1024-token context.
    pub fit_prefill_tokens_per_s: f64,
    pub fit_decode_step_s: f64,
    /// The program policy's keep / swap / recompute choices, by name
    /// (`agentd_scheduler::Park`; every choice, zeros included).
    pub parks: Vec<(&'static str, u64)>,
    /// Every pause by its cause (`agentd_scheduler::PauseCause`; zeros
    /// included), the one count of pauses: [`MetricsSnapshot::pauses`] and
    /// [`MetricsSnapshot::exhaustion_preemptions`] are read from it.
    pub pause_causes: Vec<(&'static str, u64)>,
}

impl MetricsSnapshot {
    /// Every pause, whatever its cause (vLLM's preemptions).
    pub fn pauses(&self) -> u64 {
        self.pause_causes.iter().map(|&(_, n)| n).sum()
    }

    /// Programs paused because blocks ran out while planning a step.
    pub fn exhaustion_preemptions(&self) -> u64 {
        self.pauses_by(PauseCause::Exhaustion)
    }

    /// Pauses of one cause.
    pub fn pauses_by(&self, cause: PauseCause) -> u64 {
        let name = cause.as_str();
        self.pause_causes
            .iter()
            .find(|&&(k, _)| k == name)
            .map_or(0, |&(_, n)| n)
    }
}

impl Core {
    /// The engine as readers see it: counters, gauges, histograms and the
    /// program table. O(programs): built only when a reader asks
    /// ([`crate::board::Board::end`]).
    pub(crate) fn snapshot(&self) -> Snapshot {
        let stats = agentd_scheduler::Policy::stats(&self.replicas.policy);
        let pauses = self.replicas.stats().pauses;
        let (mut queries, mut hits, mut referenced, mut total) = (0, 0, 0, 0);
        let (mut offloaded, mut onloaded, mut host_used, mut host_total) = (0, 0, 0, 0);
        for kv in self.replicas.kvs() {
            queries += kv.stats().query_tokens;
            hits += kv.stats().hit_tokens;
            referenced += kv.pool().num_referenced();
            total += kv.pool().num_blocks();
            let (off, on) = kv.host_copies();
            (offloaded, onloaded) = (offloaded + off, onloaded + on);
            if let Some(h) = kv.pool().host() {
                host_used += h.num_used();
                host_total += h.num_slots();
            }
        }
        let table = self.program_status();
        let mut programs: Vec<(&'static str, &'static str, usize)> = Vec::new();
        for s in &table {
            match programs
                .iter_mut()
                .find(|(ph, st, _)| *ph == s.phase && *st == s.state)
            {
                Some(e) => e.2 += 1,
                None => programs.push((s.phase, s.state, 1)),
            }
        }
        let rates = self.replicas.rates(0);
        let fit_prefill_tokens_per_s = rates
            .prefill_s(1024, 1024)
            .filter(|s| *s > 0.0)
            .map_or(0.0, |s| 1024.0 / s);
        let mut decode = agentd_scheduler::StepWork::default();
        decode.add_decode(1024);
        decode.rows = 1;
        let fit_decode_step_s = rates.predict(&decode).unwrap_or(0.0);
        let core = self.replicas.stats();
        let metrics = MetricsSnapshot {
            counters: self.counters.clone(),
            num_requests_running: self.num_running(),
            num_requests_waiting: self.num_waiting(),
            kv_cache_usage: referenced as f64 / total.max(1) as f64,
            prefix_cache_queries: queries,
            prefix_cache_hits: hits,
            block_size: self.cfg.block_size,
            num_gpu_blocks: self.cfg.num_blocks,
            programs,
            restores: stats.restores,
            recomputed_tokens: core.recomputed_tokens,
            decode_context_tokens: core.decode_context_tokens,
            prefill_attention_pairs: core.prefill_attention_pairs,
            kv_offloaded_blocks: offloaded,
            kv_onloaded_blocks: onloaded,
            host_blocks_used: host_used,
            host_blocks: host_total,
            fit_prefill_tokens_per_s,
            fit_decode_step_s,
            parks: agentd_scheduler::Park::ALL
                .iter()
                .map(|&k| (k.as_str(), stats.parks.of(k)))
                .collect(),
            pause_causes: PauseCause::ALL
                .iter()
                .map(|&c| (c.as_str(), pauses.of(c)))
                .collect(),
        };
        Snapshot {
            metrics,
            programs: table,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let mut h = Histogram::latency();
        h.observe(0.003);
        h.observe(0.3);
        assert_eq!(h.count, 2);
        assert!((h.sum - 0.303).abs() < 1e-12);
        let at = |le: f64| h.buckets.iter().find(|b| b.0 == le).map(|b| b.1);
        assert_eq!(at(0.001), Some(0));
        assert_eq!(at(0.005), Some(1));
        assert_eq!(at(0.25), Some(1));
        assert_eq!(at(0.5), Some(2));
    }
}
