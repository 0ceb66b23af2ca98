//! Per-tool acting-time statistics: the per-tool decay of
//! docs/design.md §5 rule 3.
//!
//! An acting program's exclusive blocks count in the demand with a weight
//! `f`. Without a tool name it is the global `f(t) = x^(−t/Δ)` of the elapsed
//! acting time `t`. When the program named the tool it runs (a request's
//! `tool_name`, or the tool calls the server just returned), the weight comes
//! from that tool's observed durations instead:
//!
//! `f = x^(−R/Δ)`, with `R` the tool's expected *remaining* time given the
//! `t` already spent, `R(t) = mean(s − t | s > t)` over its last
//! [`SAMPLES`] durations `s`.
//!
//! The weight says how soon the memory will be needed again. A file read
//! (0.1–0.5 s) is back before its blocks could serve anyone else: R ≈ 0.3 s
//! keeps f ≈ 0.98 (x = 2, Δ = 10 s). A test run (20–60 s) holds idle blocks
//! for its whole run: R ≈ 30 s gives f = 2⁻³ at once, where the elapsed-time
//! form keeps 0.87 after 2 s and reaches 1/8 only after 30 s. One global Δ
//! must be wrong for one of them: two tools of one agent differ by 100×.
//!
//! A tool running longer than any duration seen (`t` past every sample) is
//! heavy-tailed: it is expected to run about as long again (`R = t`).

use std::collections::HashMap;

/// A tool, by a stable hash of its name (the engine hashes the name; the
/// scheduler never sees strings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ToolId(pub u64);

/// Durations kept per tool: enough for a stable mean of the tail beyond `t`,
/// small enough to walk per acting program per step (64 comparisons).
pub const SAMPLES: usize = 64;

/// Below this many observed durations the global decay applies.
pub const MIN_SAMPLES: usize = 8;

/// The last [`SAMPLES`] durations of one kind: one tool's acting times, or
/// every program's turn times (`rotation.rs`). A ring.
#[derive(Debug, Clone, Default)]
pub(crate) struct ToolStats {
    durations: Vec<f64>,
    next: usize,
    observed: u64,
}

impl ToolStats {
    pub fn record(&mut self, d: f64) {
        if !d.is_finite() || d < 0.0 {
            return;
        }
        if self.durations.len() < SAMPLES {
            self.durations.push(d);
        } else {
            self.durations[self.next] = d;
            self.next = (self.next + 1) % SAMPLES;
        }
        self.observed += 1;
    }

    /// Expected remaining acting time after `elapsed` seconds, once enough
    /// durations were seen.
    pub fn expected_remaining(&self, elapsed: f64) -> Option<f64> {
        if self.durations.len() < MIN_SAMPLES {
            return None;
        }
        let t = elapsed.max(0.0);
        let (mut sum, mut n) = (0.0, 0usize);
        for &s in &self.durations {
            if s > t {
                sum += s - t;
                n += 1;
            }
        }
        Some(if n == 0 { t } else { sum / n as f64 })
    }

    /// The median duration, once [`MIN_SAMPLES`] were seen.
    pub fn median(&self) -> Option<f64> {
        if self.durations.len() < MIN_SAMPLES {
            return None;
        }
        let mut v = self.durations.clone();
        let mid = v.len() / 2;
        let (_, m, _) = v.select_nth_unstable_by(mid, f64::total_cmp);
        Some(*m)
    }

    #[cfg(test)]
    pub fn observed(&self) -> u64 {
        self.observed
    }
}

/// Statistics of every tool seen.
#[derive(Debug, Clone, Default)]
pub(crate) struct ToolTable {
    tools: HashMap<ToolId, ToolStats>,
}

impl ToolTable {
    pub fn record(&mut self, tool: ToolId, duration: f64) {
        self.tools.entry(tool).or_default().record(duration);
    }

    pub fn expected_remaining(&self, tool: ToolId, elapsed: f64) -> Option<f64> {
        self.tools.get(&tool)?.expected_remaining(elapsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remaining_time_is_the_mean_excess_over_elapsed() {
        let mut s = ToolStats::default();
        for d in [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0] {
            s.record(d);
        }
        assert_eq!(s.expected_remaining(0.0), None, "fewer than MIN_SAMPLES");
        s.record(8.0);
        // mean of 1..=8 = 4.5
        assert!((s.expected_remaining(0.0).unwrap() - 4.5).abs() < 1e-12);
        // past 6: samples 7 and 8 remain, excess 1 and 2
        assert!((s.expected_remaining(6.0).unwrap() - 1.5).abs() < 1e-12);
        // past every sample: as long again
        assert_eq!(s.expected_remaining(10.0), Some(10.0));
    }

    #[test]
    fn the_ring_keeps_the_last_durations() {
        let mut s = ToolStats::default();
        for _ in 0..SAMPLES {
            s.record(100.0);
        }
        for _ in 0..SAMPLES {
            s.record(1.0);
        }
        assert!((s.expected_remaining(0.0).unwrap() - 1.0).abs() < 1e-12);
        assert_eq!(s.observed(), 2 * SAMPLES as u64);
        s.record(f64::NAN);
        s.record(-1.0);
        assert_eq!(s.observed(), 2 * SAMPLES as u64, "nonsense is ignored");
    }
}
