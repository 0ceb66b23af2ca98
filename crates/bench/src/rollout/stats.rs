//! One iteration's outcome and its summary row: wall time, generation
//! throughput, group makespans, and the weight swap before it (timed
//! apart from the generation).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::result::percentile;

/// One sample's run, times in seconds from the iteration's start.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgramOutcome {
    pub group: usize,
    pub sample: usize,
    pub started_s: f64,
    pub finished_s: f64,
    /// Every turn answered with the exact token counts asked for.
    pub ok: bool,
    pub turns_done: usize,
    pub output_tokens: usize,
    pub prompt_tokens: usize,
    /// `usage.prompt_tokens_details.cached_tokens`, summed (when sent).
    pub cached_tokens: Option<usize>,
    /// Each answered turn's latency (sent to answer).
    pub step_s: Vec<f64>,
    pub error: Option<String>,
}

/// The weight swap between two iterations, as the trainer sees it: pause,
/// load the next checkpoint, continue. `read_s` is the same checkpoint read
/// from disk by the driver just before (the baseline the swap is judged
/// against).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SwapTimes {
    pub pause_s: f64,
    /// `/update_weights_from_disk`'s answer time (None: no weights swapped,
    /// only paused and resumed).
    pub update_s: Option<f64>,
    pub continue_s: f64,
    /// Pause to continued.
    pub total_s: f64,
    pub checkpoint: Option<String>,
    /// Bytes of the checkpoint's `*.safetensors` files and the seconds the
    /// driver took to read them.
    pub checkpoint_bytes: Option<u64>,
    pub read_s: Option<f64>,
    /// Whether the checkpoint was evicted from the page cache before the
    /// read and again before the swap (`posix_fadvise(DONTNEED)`); false:
    /// read once untimed first, so the read and the swap find it cached.
    pub cold_cache: bool,
}

impl SwapTimes {
    /// The update's time over the read's.
    pub fn update_over_read(&self) -> Option<f64> {
        match (self.update_s, self.read_s) {
            (Some(u), Some(r)) if r > 0.0 => Some(u / r),
            _ => None,
        }
    }
}

/// One row of the report: one iteration on one target.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IterationRow {
    pub target: String,
    pub iteration: usize,
    /// What the server said its weights were when the iteration started.
    pub weight_version: Option<String>,
    pub programs: usize,
    pub programs_finished: usize,
    pub errors: usize,
    /// First request sent to last answer (the swap before it excluded).
    pub wall_s: f64,
    pub output_tokens: usize,
    /// Output tokens per second of wall time.
    pub gen_tok_s: f64,
    pub steps: usize,
    pub step_p50_s: f64,
    pub step_p99_s: f64,
    /// Per group: its first member's start to its last member's end; over
    /// the groups whose members all finished.
    pub groups_finished: usize,
    pub group_makespan_p50_s: f64,
    pub group_makespan_max_s: f64,
    /// Each sample's first answer (its first turn, sent to answered), over
    /// the samples that got one: a burst's fairness (issue 32: the max
    /// within 3× the median).
    pub first_response_p50_s: f64,
    pub first_response_max_s: f64,
    pub usage_hit_rate: Option<f64>,
    /// The server's `/metrics` deltas over the iteration (prefix hits and
    /// queries, preemptions, recomputed tokens, pauses, restores; agentd's
    /// names where vLLM has none), when it serves them.
    pub counters: Option<serde_json::Value>,
    /// The swap before this iteration (None for the first).
    pub swap: Option<SwapTimes>,
    pub update_over_read: Option<f64>,
    pub error_messages: Vec<String>,
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

impl IterationRow {
    pub fn summarise(
        target: &str,
        iteration: usize,
        weight_version: Option<String>,
        swap: Option<SwapTimes>,
        programs: &[ProgramOutcome],
    ) -> IterationRow {
        let start = programs
            .iter()
            .map(|p| p.started_s)
            .fold(f64::INFINITY, f64::min);
        let end = programs.iter().map(|p| p.finished_s).fold(0.0, f64::max);
        let wall_s = if start.is_finite() {
            (end - start).max(0.0)
        } else {
            0.0
        };
        let output_tokens: usize = programs.iter().map(|p| p.output_tokens).sum();
        let prompt_tokens: usize = programs.iter().map(|p| p.prompt_tokens).sum();
        let cached: Vec<usize> = programs.iter().filter_map(|p| p.cached_tokens).collect();
        let steps = sorted(programs.iter().flat_map(|p| p.step_s.clone()).collect());
        let mut groups: BTreeMap<usize, (f64, f64, bool)> = BTreeMap::new();
        for p in programs {
            let g = groups.entry(p.group).or_insert((f64::INFINITY, 0.0, true));
            g.0 = g.0.min(p.started_s);
            g.1 = g.1.max(p.finished_s);
            g.2 &= p.ok;
        }
        let makespans = sorted(
            groups
                .values()
                .filter(|g| g.2)
                .map(|g| (g.1 - g.0).max(0.0))
                .collect(),
        );
        let firsts = sorted(
            programs
                .iter()
                .filter_map(|p| p.step_s.first().copied())
                .collect(),
        );
        let update_over_read = swap.as_ref().and_then(SwapTimes::update_over_read);
        IterationRow {
            target: target.to_string(),
            iteration,
            weight_version,
            programs: programs.len(),
            programs_finished: programs.iter().filter(|p| p.ok).count(),
            errors: programs.iter().filter(|p| p.error.is_some()).count(),
            wall_s,
            output_tokens,
            gen_tok_s: if wall_s > 0.0 {
                output_tokens as f64 / wall_s
            } else {
                0.0
            },
            steps: steps.len(),
            step_p50_s: percentile(&steps, 0.5),
            step_p99_s: percentile(&steps, 0.99),
            groups_finished: makespans.len(),
            group_makespan_p50_s: percentile(&makespans, 0.5),
            group_makespan_max_s: percentile(&makespans, 1.0),
            first_response_p50_s: percentile(&firsts, 0.5),
            first_response_max_s: percentile(&firsts, 1.0),
            usage_hit_rate: (cached.len() == programs.len() && prompt_tokens > 0)
                .then(|| cached.iter().sum::<usize>() as f64 / prompt_tokens as f64),
            counters: None,
            swap,
            update_over_read,
            error_messages: programs
                .iter()
                .filter_map(|p| p.error.clone())
                .take(5)
                .collect(),
        }
    }

    /// A target that failed before or between iterations.
    pub fn failed(target: &str, iteration: usize, message: String) -> IterationRow {
        let mut r = IterationRow::summarise(target, iteration, None, None, &[]);
        r.errors = 1;
        r.error_messages = vec![message];
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(group: usize, sample: usize, start: f64, end: f64, ok: bool) -> ProgramOutcome {
        ProgramOutcome {
            group,
            sample,
            started_s: start,
            finished_s: end,
            ok,
            turns_done: 2,
            output_tokens: 10,
            prompt_tokens: 100,
            cached_tokens: Some(40),
            step_s: vec![end - start - 1.0, 1.0],
            error: (!ok).then(|| "HTTP 500".to_string()),
        }
    }

    #[test]
    fn makespans_throughput_and_steps() {
        // Group 0: 0..4 and 0.5..6 -> 6 s; group 1: 0..3, 0..9 -> 9 s;
        // group 2: 1..2 and 1..5 -> 4 s.
        let ps = vec![
            program(0, 0, 0.0, 4.0, true),
            program(0, 1, 0.5, 6.0, true),
            program(1, 0, 0.0, 3.0, true),
            program(1, 1, 0.0, 9.0, true),
            program(2, 0, 1.0, 2.0, true),
            program(2, 1, 1.0, 5.0, true),
        ];
        let r = IterationRow::summarise("program", 1, Some("v1".into()), None, &ps);
        assert_eq!(r.programs, 6);
        assert_eq!(r.programs_finished, 6);
        assert_eq!(r.errors, 0);
        assert_eq!(r.wall_s, 9.0);
        assert_eq!(r.output_tokens, 60);
        assert!((r.gen_tok_s - 60.0 / 9.0).abs() < 1e-12);
        assert_eq!(r.groups_finished, 3);
        assert_eq!(r.group_makespan_p50_s, 6.0);
        assert_eq!(r.group_makespan_max_s, 9.0);
        assert_eq!(r.steps, 12);
        assert_eq!(r.step_p50_s, 1.0);
        assert_eq!(r.step_p99_s, 8.0);
        // First turns: 3, 4.5, 2, 8, 0, 3.
        assert_eq!(r.first_response_p50_s, 3.0);
        assert_eq!(r.first_response_max_s, 8.0);
        assert_eq!(r.usage_hit_rate, Some(0.4));
        assert_eq!(r.weight_version.as_deref(), Some("v1"));
        assert!(r.swap.is_none() && r.update_over_read.is_none());
    }

    #[test]
    fn a_failed_member_drops_its_group_from_the_makespans() {
        let ps = vec![
            program(0, 0, 0.0, 4.0, true),
            program(0, 1, 0.0, 2.0, false),
            program(1, 0, 0.0, 3.0, true),
        ];
        let mut swap = SwapTimes {
            pause_s: 0.01,
            update_s: Some(3.0),
            continue_s: 0.01,
            total_s: 3.02,
            read_s: Some(2.0),
            checkpoint_bytes: Some(1 << 30),
            ..SwapTimes::default()
        };
        let r = IterationRow::summarise("request", 2, None, Some(swap.clone()), &ps);
        assert_eq!(r.programs_finished, 2);
        assert_eq!(r.errors, 1);
        assert_eq!(r.error_messages, ["HTTP 500"]);
        assert_eq!(r.groups_finished, 1);
        assert_eq!(r.group_makespan_max_s, 3.0);
        assert_eq!(r.update_over_read, Some(1.5));
        swap.update_s = None;
        assert_eq!(swap.update_over_read(), None);
    }

    #[test]
    fn an_empty_or_failed_iteration_has_zero_rates() {
        let r = IterationRow::failed("vllm", 0, "unreachable".into());
        assert_eq!((r.wall_s, r.gen_tok_s, r.programs), (0.0, 0.0, 0));
        assert_eq!(r.errors, 1);
        assert_eq!(r.usage_hit_rate, None);
        // Missing cached_tokens on any program: no usage hit rate.
        let mut p = program(0, 0, 0.0, 1.0, true);
        p.cached_tokens = None;
        let r = IterationRow::summarise("x", 0, None, None, &[p]);
        assert_eq!(r.usage_hit_rate, None);
    }
}
