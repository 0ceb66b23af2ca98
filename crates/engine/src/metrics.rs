//! Counters and histograms the server exposes on `/metrics`.

/// A cumulative histogram (Prometheus semantics).
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// `(upper bound, cumulative count)`, ascending; `+Inf` is `count`.
    pub buckets: Vec<(f64, u64)>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    /// vLLM's latency buckets (seconds).
    pub fn latency() -> Self {
        let bounds = [
            0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
            10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
        ];
        Self {
            buckets: bounds.iter().map(|&b| (b, 0)).collect(),
            sum: 0.0,
            count: 0,
        }
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

/// A point-in-time view of the engine for `/metrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsSnapshot {
    pub num_requests_running: usize,
    pub num_requests_waiting: usize,
    /// Referenced blocks / all blocks, over all replicas (0..1).
    pub kv_cache_usage: f64,
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub num_preemptions: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub block_size: usize,
    /// Blocks per replica.
    pub num_gpu_blocks: usize,
    pub ttft_s: Histogram,
    pub e2e_s: Histogram,
    /// `(phase, state, count)` of live programs.
    pub programs: Vec<(&'static str, &'static str, usize)>,
    pub pauses: u64,
    pub restores: u64,
    pub recomputed_tokens: u64,
    pub requests_finished: u64,
}

/// Counters kept by the engine core.
#[derive(Debug, Clone)]
pub(crate) struct Counters {
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub recomputed_tokens: u64,
    pub requests_finished: u64,
    pub ttft_s: Histogram,
    pub e2e_s: Histogram,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            prompt_tokens: 0,
            generation_tokens: 0,
            recomputed_tokens: 0,
            requests_finished: 0,
            ttft_s: Histogram::latency(),
            e2e_s: Histogram::latency(),
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
