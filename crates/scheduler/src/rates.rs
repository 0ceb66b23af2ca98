//! What a replica's steps cost, learned from its own steps (issue 32 item
//! 1): the engine times each forward, the simulator its cost model, and
//! both hand the seconds to [`crate::Step::finish`]; nothing here reads a
//! clock.
//!
//! A step's time is modelled as linear in what it computed ([`StepWork`]):
//! a fixed part (the weight stream, launch and sampling set-up), a part per
//! sampled row (the LM head row and the sampler: most of a decode row on
//! the CPU), a part per new token (the dense matmuls), a part per prefill
//! attention pair (quadratic in the context: what makes long prefills
//! slow), a part per context token a decode reads, and a part per token
//! copied between the KV tiers. The same six terms the simulator's cost
//! model has (`crates/sim/src/cost.rs`), so the simulator can check that
//! the fit recovers them.
//!
//! The fit is ridge-regularised least squares over exponentially forgotten
//! sums (half-life [`HALF_LIFE_STEPS`] steps): a term no recent step
//! exercised shrinks towards zero instead of winding up, and a change of
//! regime (another model, more threads busy) is followed within a few
//! hundred steps. Predictions use the coefficients clamped at zero and are
//! `None` until [`WARM_STEPS`] steps were seen: callers then fall back to
//! what they did without a model.

/// Steps after which an observation weighs half as much. A decode step is
/// 10-50 ms on the CPU bench and 5-30 ms on an H100, so ~5-25 s of steps.
pub const HALF_LIFE_STEPS: f64 = 500.0;
/// A step that copied more than this many tokens per token it computed
/// is left out of the fit. Where the copies run beside the forward (the
/// CUDA tier's stream) such a step takes about as long as its copies and
/// says nothing of its compute, and the linear fit explained it by the
/// copies alone: in `agentd simulate` swe at 96 programs (H100 costs,
/// where a restore of 20k tokens rides with the 2k-token turn that
/// brought it back) it priced a 2,048-token prefill at 0.2-2 ms against
/// the model's 51 ms, and the park price recomputed 189 contexts. A copy
/// costs a tenth of a computed token or less on every device measured
/// (3 µs against 25 µs on the H100 preset, 3-5 µs against 176 µs on the
/// CPU), so a step under this ratio is still mostly compute.
const COPY_HEAVY: usize = 8;
/// Steps seen before the fit predicts anything.
pub const WARM_STEPS: u64 = 16;

const N: usize = 6;
/// Ridge on each (scaled) coefficient: small against the sums of a few
/// hundred steps, large enough that an unexercised term stays near zero.
const RIDGE: f64 = 1e-6;

/// What one step computed, summed over its sequences.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepWork {
    /// Sequences whose logits were sampled.
    pub rows: usize,
    /// New tokens computed: prefill chunks plus one per decoding sequence.
    pub tokens: usize,
    /// Attention (query, key) pairs of the prefill chunks.
    pub prefill_pairs: f64,
    /// Context tokens read by the decoding sequences.
    pub decode_context: usize,
    /// Tokens copied between the KV tiers for this step.
    pub copied_tokens: usize,
}

impl StepWork {
    /// A prefill chunk of `n` tokens after `cached` ones.
    pub fn add_prefill(&mut self, cached: usize, n: usize) {
        self.tokens += n;
        self.prefill_pairs += n as f64 * (cached as f64 + n as f64 / 2.0);
    }

    /// One decode token of a sequence whose context holds `context` tokens.
    pub fn add_decode(&mut self, context: usize) {
        self.tokens += 1;
        self.decode_context += context;
    }

    /// Whether the step computed anything.
    pub fn is_empty(&self) -> bool {
        self.tokens == 0 && self.copied_tokens == 0
    }

    /// The regression's features, scaled so each is O(1) at typical steps.
    fn features(&self) -> [f64; N] {
        [
            1.0,
            self.rows as f64,
            self.tokens as f64 / 1e3,
            self.prefill_pairs / 1e6,
            self.decode_context as f64 / 1e3,
            self.copied_tokens as f64 / 1e3,
        ]
    }
}

/// The online fit of one replica's step time (see the module docs).
#[derive(Debug, Clone)]
pub struct StepRates {
    /// Forgotten sums of x·xᵀ and x·y.
    xx: [[f64; N]; N],
    xy: [f64; N],
    /// Coefficients (seconds per scaled feature), clamped at zero.
    coef: [f64; N],
    steps: u64,
    /// Steps seen that copied between the tiers: the copy term is not
    /// trusted before [`WARM_STEPS`] of them (on the engine, 1 of 66 pauses
    /// chose recompute off a copy term fitted to a handful of copying steps
    /// whose times other work explained).
    copy_steps: u64,
}

impl Default for StepRates {
    fn default() -> Self {
        Self {
            xx: [[0.0; N]; N],
            xy: [0.0; N],
            coef: [0.0; N],
            steps: 0,
            copy_steps: 0,
        }
    }
}

impl StepRates {
    /// Records that a step of `work` took `seconds`. Non-finite or negative
    /// times, empty steps and copy-heavy ones (`COPY_HEAVY`) are ignored.
    pub fn observe(&mut self, work: &StepWork, seconds: f64) {
        if !seconds.is_finite() || seconds < 0.0 || work.is_empty() {
            return;
        }
        if work.copied_tokens > work.tokens.saturating_mul(COPY_HEAVY) {
            return;
        }
        let keep = 0.5f64.powf(1.0 / HALF_LIFE_STEPS);
        let x = work.features();
        for i in 0..N {
            for j in 0..N {
                self.xx[i][j] = keep * self.xx[i][j] + x[i] * x[j];
            }
            self.xy[i] = keep * self.xy[i] + x[i] * seconds;
        }
        self.steps += 1;
        if work.copied_tokens > 0 {
            self.copy_steps += 1;
        }
        if let Some(c) = solve(&self.xx, &self.xy) {
            self.coef = c.map(|v| v.max(0.0));
        }
    }

    /// Steps observed so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The predicted seconds of a step of `work`, once warm.
    pub fn predict(&self, work: &StepWork) -> Option<f64> {
        if self.steps < WARM_STEPS {
            return None;
        }
        let x = work.features();
        Some(x.iter().zip(&self.coef).map(|(x, c)| x * c).sum())
    }

    /// Seconds a prefill of `n` tokens after `cached` adds to a step (its
    /// tokens and attention pairs, not the step's fixed part), once warm.
    pub fn prefill_s(&self, cached: usize, n: usize) -> Option<f64> {
        let mut w = StepWork::default();
        w.add_prefill(cached, n);
        let x = w.features();
        (self.steps >= WARM_STEPS).then(|| x[2] * self.coef[2] + x[3] * self.coef[3])
    }

    /// Seconds copying `tokens` tokens' KV between the tiers adds to a
    /// step, once [`WARM_STEPS`] steps that copied were seen (before, the
    /// ridge holds the term near zero and a few noisy steps can swing it).
    pub fn copy_s(&self, tokens: usize) -> Option<f64> {
        (self.steps >= WARM_STEPS && self.copy_steps >= WARM_STEPS)
            .then(|| tokens as f64 / 1e3 * self.coef[5])
    }

    /// The most prefill tokens after `cached` that fit in `seconds` of
    /// step time (0 when even one does not), once warm. Solves
    /// `a·n + b·n·(cached + n/2) = seconds` for `n`.
    pub fn prefill_tokens_within(&self, cached: usize, seconds: f64) -> Option<usize> {
        if self.steps < WARM_STEPS {
            return None;
        }
        let a = self.coef[2] / 1e3 + self.coef[3] * cached as f64 / 1e6;
        let b = self.coef[3] / 2e6;
        let s = seconds.max(0.0);
        let n = if b > 0.0 {
            (-a + (a * a + 4.0 * b * s).sqrt()) / (2.0 * b)
        } else if a > 0.0 {
            s / a
        } else {
            return Some(usize::MAX);
        };
        Some(if n.is_finite() {
            n as usize
        } else {
            usize::MAX
        })
    }
}

/// Solves `(xx + ridge·I)·c = xy` by Gaussian elimination with partial
/// pivoting; `None` when singular.
fn solve(xx: &[[f64; N]; N], xy: &[f64; N]) -> Option<[f64; N]> {
    let mut m = [[0.0; N + 1]; N];
    for i in 0..N {
        m[i][..N].copy_from_slice(&xx[i]);
        m[i][i] += RIDGE;
        m[i][N] = xy[i];
    }
    for col in 0..N {
        let pivot = (col..N).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
        if m[pivot][col].abs() < 1e-300 {
            return None;
        }
        m.swap(col, pivot);
        let p = m[col];
        for (row, r) in m.iter_mut().enumerate() {
            if row != col {
                let f = r[col] / p[col];
                for (x, y) in r[col..].iter_mut().zip(&p[col..]) {
                    *x -= f * y;
                }
            }
        }
    }
    let mut c = [0.0; N];
    for i in 0..N {
        c[i] = m[i][N] / m[i][i];
    }
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPU bench's avx512 constants (`crates/sim/src/cost.rs`).
    fn truth(w: &StepWork) -> f64 {
        13.0e-3
            + 0.95e-3 * w.rows as f64
            + 176.0e-6 * w.tokens as f64
            + 50.0e-9 * w.prefill_pairs
            + 0.9e-6 * w.decode_context as f64
            + 3.0e-6 * w.copied_tokens as f64
    }

    fn step(i: usize) -> StepWork {
        let decodes = 1 + i % 17;
        let mut w = StepWork::default();
        for d in 0..decodes {
            w.add_decode(300 + 97 * ((i + d) % 40));
        }
        w.rows = decodes;
        if i % 3 != 0 {
            let cached = 512 * (i % 9);
            w.add_prefill(cached, 64 + 61 * (i % 31));
            w.rows += i % 2;
        }
        w.copied_tokens = 32 * (i % 5);
        w
    }

    #[test]
    fn recovers_a_linear_cost_model() {
        let mut r = StepRates::default();
        assert_eq!(r.predict(&step(1)), None, "not before warm");
        for i in 0..2000 {
            r.observe(&step(i), truth(&step(i)));
        }
        for i in [5, 77, 1234] {
            let (p, t) = (r.predict(&step(i)).unwrap(), truth(&step(i)));
            assert!(
                (p - t).abs() / t < 0.02,
                "step {i}: predicted {p}, true {t}"
            );
        }
        // 1024 tokens after 4096 cached: 176 µs a token + 50 ns a pair.
        let want = 1024.0 * 176.0e-6 + 50.0e-9 * 1024.0 * (4096.0 + 512.0);
        let got = r.prefill_s(4096, 1024).unwrap();
        assert!((got - want).abs() / want < 0.03, "{got} vs {want}");
        let n = r.prefill_tokens_within(4096, want).unwrap();
        assert!((n as f64 - 1024.0).abs() < 40.0, "{n} tokens");
    }

    #[test]
    fn follows_a_change_of_regime() {
        let mut r = StepRates::default();
        for i in 0..1000 {
            r.observe(&step(i), truth(&step(i)));
        }
        // Everything twice as slow (another process took a core).
        for i in 0..4000 {
            r.observe(&step(i), 2.0 * truth(&step(i)));
        }
        let (p, t) = (r.predict(&step(42)).unwrap(), 2.0 * truth(&step(42)));
        assert!((p - t).abs() / t < 0.05, "{p} vs {t}");
    }

    #[test]
    fn ignores_garbage_and_stays_finite() {
        let mut r = StepRates::default();
        for i in 0..100 {
            r.observe(&step(i), f64::NAN);
            r.observe(&step(i), -1.0);
            r.observe(&StepWork::default(), 1.0);
        }
        assert_eq!(r.steps(), 0);
        // Only decode steps: the prefill terms were never exercised.
        for i in 0..100 {
            let mut w = StepWork::default();
            w.add_decode(1000 + i);
            w.rows = 1;
            r.observe(&w, 0.02);
        }
        let s = r.prefill_s(0, 512).unwrap();
        assert!(s.is_finite() && s >= 0.0);
        assert!(r.prefill_tokens_within(0, 0.1).is_some());
    }

    /// Copies that run beside the forward (the H100 preset's rule in
    /// `crates/sim/src/cost.rs`): a step that restores a long context
    /// takes about as long as its copies. The prefill price must stay the
    /// model's, and a swap must stay priced under a recompute. Fitted on
    /// every step, this prefill was priced at 0.73 of its cost.
    #[test]
    fn copies_beside_the_forward_do_not_hide_the_prefill() {
        let gpu = |w: &StepWork| {
            let mut c = *w;
            c.copied_tokens = 0;
            let compute = 5.0e-3
                + 25.0e-6 * c.tokens as f64
                + 1.5e-9 * c.prefill_pairs
                + 22.0e-9 * c.decode_context as f64;
            let copy = 3.0e-6 * w.copied_tokens as f64;
            (compute + copy / 36.0).max(copy + compute / 36.0)
        };
        let mut r = StepRates::default();
        for i in 0..3000 {
            let mut w = step(i);
            // Every third step restores a 5-30k-token context with the
            // turn that brought it back; every fifth copies a little.
            w.copied_tokens = match (i % 3, i % 5) {
                (1, _) => 5_000 + 1_000 * (i % 26),
                (_, 0) => 64,
                _ => 0,
            };
            r.observe(&w, gpu(&w));
        }
        let want = 25.0e-6 * 2048.0 + 1.5e-9 * 2048.0 * 1024.0;
        let got = r.prefill_s(0, 2048).unwrap();
        assert!((got - want).abs() / want < 0.05, "{got} vs {want}");
        let (copies, prefill) = (
            r.copy_s(2 * 20_000).unwrap(),
            r.prefill_s(0, 20_000).unwrap(),
        );
        assert!(
            4.0 * copies < prefill,
            "swap {copies} s, recompute {prefill} s"
        );
    }

    #[test]
    fn prices_copies_only_after_enough_steps_copied() {
        let mut r = StepRates::default();
        // Warm on steps that copy nothing: the copy term is unknown.
        for i in 0..100 {
            let mut w = step(i);
            w.copied_tokens = 0;
            r.observe(&w, truth(&w));
        }
        assert!(r.predict(&step(1)).is_some());
        assert_eq!(r.copy_s(1000), None, "no step copied yet");
        // One step fewer than the floor that copied: still unknown.
        for i in 0..WARM_STEPS as usize - 1 {
            let mut w = step(i);
            w.copied_tokens = 64;
            r.observe(&w, truth(&w));
        }
        assert_eq!(r.copy_s(1000), None);
        for i in 0..2000 {
            r.observe(&step(i), truth(&step(i)));
        }
        // 3 µs a token copied.
        let got = r.copy_s(1000).unwrap();
        assert!((got - 3.0e-3).abs() / 3.0e-3 < 0.05, "{got}");
    }
}
