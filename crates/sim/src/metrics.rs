//! Counters of one run, restricted to the measurement window.

#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub warmup_s: f64,
    pub steps: u64,
    pub output_tokens: u64,
    pub query_tokens: u64,
    pub hit_tokens: u64,
    pub ideal_hit_tokens: u64,
    pub recomputed_tokens: u64,
    /// Tokens copied between the KV tiers (host tier only).
    pub copied_tokens: u64,
    pub latencies: Vec<f64>,
    /// Latencies of programs' first requests (admission of a new program).
    pub first_latencies: Vec<f64>,
    /// Spawn to last member's end of each rollout group started in the window.
    pub group_makespans: Vec<f64>,
    pub programs_completed: u64,
    pub engine_steps: u64,
    pub sched_calls: u64,
    pub sched_ns: u128,
    imbalance_area: f64,
    usage_area: f64,
    last_t: Option<f64>,
    window_s: f64,
}

impl Metrics {
    pub fn new(warmup_s: f64) -> Self {
        Self {
            warmup_s,
            ..Self::default()
        }
    }

    pub fn in_window(&self, t: f64) -> bool {
        t >= self.warmup_s
    }

    /// Integrates the per-replica KV usage from the last sample up to `t`.
    pub fn sample_usage(&mut self, t: f64, usages: &[f64]) {
        if let Some(last) = self.last_t {
            let from = last.max(self.warmup_s);
            if t > from {
                let dt = t - from;
                let max = usages.iter().copied().fold(f64::MIN, f64::max);
                let min = usages.iter().copied().fold(f64::MAX, f64::min);
                let mean = usages.iter().sum::<f64>() / usages.len().max(1) as f64;
                self.imbalance_area += (max - min) * dt;
                self.usage_area += mean * dt;
                self.window_s += dt;
            }
        }
        self.last_t = Some(t);
    }

    pub fn kv_imbalance(&self) -> f64 {
        self.imbalance_area / self.window_s.max(1e-9)
    }

    pub fn mean_usage(&self) -> f64 {
        self.usage_area / self.window_s.max(1e-9)
    }

    pub fn percentile(&self, q: f64) -> f64 {
        percentile(&self.latencies, q)
    }
}

/// The `q` quantile (nearest rank) of `values`; 0 when empty.
pub(crate) fn percentile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i.min(v.len() - 1)]
}
