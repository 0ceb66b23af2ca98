//! Per-step samples and the summary row of one level.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::Value;
use tokio::time::Instant;

/// One completed model call.
#[derive(Debug, Clone)]
pub struct Sample {
    pub started: Instant,
    pub finished: Instant,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: Option<usize>,
    pub ideal_hit_tokens: usize,
    pub ttft_s: Option<f64>,
    /// The program's index in the level.
    pub program: u64,
    /// The worker that served it, when a Dynamo frontend says
    /// (`nvext.worker_id`).
    pub worker: Option<u64>,
    /// The program's first request in this level (turn 0, or the turn a
    /// stationary start joins at): its latency includes the admission of a
    /// program the server has not seen, later ones a restore's wait.
    pub first: bool,
}

impl Sample {
    /// The step's latency, seconds: sent to last token.
    pub fn latency_s(&self) -> f64 {
        (self.finished - self.started).as_secs_f64()
    }
}

/// Where a Dynamo frontend sent the window's steps.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Placement {
    /// Steps per worker id.
    pub steps: BTreeMap<String, usize>,
    /// Programs per worker id (a split program counts on each).
    pub programs: BTreeMap<String, usize>,
    /// Programs whose steps landed on more than one worker (session
    /// affinity broken).
    pub split_programs: usize,
}

impl Placement {
    /// `None` when no step named its worker (not a Dynamo target).
    pub fn of(samples: &[Sample]) -> Option<Placement> {
        let mut by_program: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
        let mut steps: BTreeMap<String, usize> = BTreeMap::new();
        for s in samples {
            let Some(w) = s.worker else { continue };
            *steps.entry(w.to_string()).or_default() += 1;
            by_program.entry(s.program).or_default().insert(w);
        }
        if steps.is_empty() {
            return None;
        }
        let mut programs: BTreeMap<String, usize> = BTreeMap::new();
        for ws in by_program.values() {
            for w in ws {
                *programs.entry(w.to_string()).or_default() += 1;
            }
        }
        let split_programs = by_program.values().filter(|ws| ws.len() > 1).count();
        Some(Placement {
            steps,
            programs,
            split_programs,
        })
    }
}

/// One (target, concurrency) result: the JSON row.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LevelRow {
    pub target: String,
    pub concurrency: usize,
    pub steps_per_min: f64,
    /// From `/metrics` deltas over the window when the server exposes
    /// them, else from `usage.prompt_tokens_details.cached_tokens`.
    pub prefix_hit_rate: f64,
    /// The fraction of prompt tokens an unlimited cache would hit.
    pub ideal_hit_rate: f64,
    pub p50_step_s: f64,
    pub p90_step_s: f64,
    pub p99_step_s: f64,
    pub output_tok_s: f64,
    pub preemptions: Option<f64>,
    pub errors: usize,
    /// Where `prefix_hit_rate` came from: "metrics" or "usage".
    pub hit_rate_source: &'static str,
    pub metrics_hit_rate: Option<f64>,
    pub usage_hit_rate: Option<f64>,
    pub ttft_p50_s: Option<f64>,
    pub ttft_p99_s: Option<f64>,
    /// Step latency split by [`Sample::first`]: where the tail comes from,
    /// admissions of new programs or the waits of programs already
    /// running (`None` when the window has no such step).
    pub first_step_p99_s: Option<f64>,
    pub later_step_p99_s: Option<f64>,
    pub first_steps: usize,
    /// Steps still in flight when the window closed (waiting, typically):
    /// they are not in the percentiles above, so a window shorter than the
    /// longest wait hides the very tail it should show. Their ages so far
    /// are lower bounds of their latencies; `p99_with_open_s` is the p99
    /// over the finished steps and these bounds together (itself a lower
    /// bound of the true p99, and equal to `p99_step_s` when none is open).
    pub open_steps: usize,
    pub oldest_open_s: Option<f64>,
    pub p99_with_open_s: f64,
    pub steps: usize,
    pub window_s: f64,
    pub prompt_tokens: usize,
    pub programs_finished: usize,
    /// agentd only: prompt tokens prefilled again, program pauses.
    pub recomputed_tokens: Option<f64>,
    pub pauses: Option<f64>,
    /// The level was stopped by errors (or the target was unreachable).
    pub aborted: bool,
    pub error_messages: Vec<String>,
    /// Dynamo targets: the workers that served the steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
}

/// Nearest-rank percentile of sorted values (0 when empty).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The values in ascending order, for [`percentile`].
fn sorted(values: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    v
}

fn ratio(num: f64, den: f64) -> Option<f64> {
    (den > 0.0).then(|| num / den)
}

impl LevelRow {
    /// A row for a level that could not run at all.
    pub fn failed(target: &str, concurrency: usize, message: String) -> LevelRow {
        LevelRow::summarise(
            target,
            concurrency,
            0.0,
            &[],
            &[],
            None,
            1,
            0,
            true,
            vec![message],
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub fn summarise(
        target: &str,
        concurrency: usize,
        window_s: f64,
        samples: &[Sample],
        open_ages_s: &[f64],
        counters: Option<Value>,
        errors: usize,
        programs_finished: usize,
        aborted: bool,
        error_messages: Vec<String>,
    ) -> LevelRow {
        let steps = samples.len();
        let lat = sorted(samples.iter().map(Sample::latency_s));
        let p99_of = |first: bool| {
            let v = sorted(
                samples
                    .iter()
                    .filter(|s| s.first == first)
                    .map(Sample::latency_s),
            );
            (!v.is_empty()).then(|| percentile(&v, 0.99))
        };
        let with_open = sorted(lat.iter().chain(open_ages_s).copied());
        let ttft = sorted(samples.iter().filter_map(|s| s.ttft_s));
        let prompt: usize = samples.iter().map(|s| s.prompt_tokens).sum();
        let output: usize = samples.iter().map(|s| s.completion_tokens).sum();
        let ideal: usize = samples.iter().map(|s| s.ideal_hit_tokens).sum();
        let usage_hit_rate = if samples.iter().all(|s| s.cached_tokens.is_some()) {
            let cached: usize = samples.iter().filter_map(|s| s.cached_tokens).sum();
            ratio(cached as f64, prompt as f64)
        } else {
            None
        };
        let get = |k: &str| counters.as_ref().and_then(|c| c[k].as_f64());
        let metrics_hit_rate = match (get("hits"), get("queries")) {
            (Some(h), Some(q)) => ratio(h, q),
            _ => None,
        };
        let (prefix_hit_rate, hit_rate_source) = match (metrics_hit_rate, usage_hit_rate) {
            (Some(m), _) => (m, "metrics"),
            (None, Some(u)) => (u, "usage"),
            (None, None) => (0.0, "none"),
        };
        let per_s = |n: f64| ratio(n, window_s).unwrap_or(0.0);
        LevelRow {
            target: target.to_string(),
            concurrency,
            steps_per_min: per_s(steps as f64) * 60.0,
            prefix_hit_rate,
            ideal_hit_rate: ratio(ideal as f64, prompt as f64).unwrap_or(0.0),
            p50_step_s: percentile(&lat, 0.50),
            p90_step_s: percentile(&lat, 0.90),
            p99_step_s: percentile(&lat, 0.99),
            output_tok_s: per_s(output as f64),
            preemptions: get("preemptions"),
            errors,
            hit_rate_source,
            metrics_hit_rate,
            usage_hit_rate,
            ttft_p50_s: (!ttft.is_empty()).then(|| percentile(&ttft, 0.50)),
            ttft_p99_s: (!ttft.is_empty()).then(|| percentile(&ttft, 0.99)),
            first_step_p99_s: p99_of(true),
            later_step_p99_s: p99_of(false),
            first_steps: samples.iter().filter(|s| s.first).count(),
            open_steps: open_ages_s.len(),
            oldest_open_s: open_ages_s.iter().copied().reduce(f64::max),
            p99_with_open_s: percentile(&with_open, 0.99),
            steps,
            window_s,
            prompt_tokens: prompt,
            programs_finished,
            recomputed_tokens: get("recomputed"),
            pauses: get("pauses"),
            aborted,
            error_messages,
            placement: Placement::of(samples),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    fn sample(t0: Instant, lat_ms: u64, prompt: usize, cached: usize, ideal: usize) -> Sample {
        Sample {
            started: t0,
            finished: t0 + Duration::from_millis(lat_ms),
            prompt_tokens: prompt,
            completion_tokens: 10,
            cached_tokens: Some(cached),
            ideal_hit_tokens: ideal,
            ttft_s: Some(lat_ms as f64 / 2000.0),
            program: 0,
            worker: None,
            first: false,
        }
    }

    #[test]
    fn percentiles_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
        assert_eq!(percentile(&[3.0], 0.01), 3.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn summary_rates() {
        let t0 = Instant::now();
        let s = vec![sample(t0, 100, 100, 50, 90), sample(t0, 300, 300, 150, 270)];
        let r = LevelRow::summarise("a", 2, 30.0, &s, &[], None, 0, 1, false, vec![]);
        assert_eq!(r.steps, 2);
        assert!((r.steps_per_min - 4.0).abs() < 1e-9);
        assert!((r.output_tok_s - 20.0 / 30.0).abs() < 1e-9);
        assert_eq!(r.hit_rate_source, "usage");
        assert!((r.prefix_hit_rate - 0.5).abs() < 1e-9);
        assert!((r.ideal_hit_rate - 0.9).abs() < 1e-9);
        assert!((r.p50_step_s - 0.1).abs() < 1e-6);
        assert!((r.p99_step_s - 0.3).abs() < 1e-6);
        // Metrics take precedence when the server has them.
        let c = json!({"hits": 30.0, "queries": 40.0, "preemptions": 2.0});
        let r = LevelRow::summarise("a", 2, 30.0, &s, &[], Some(c), 0, 1, false, vec![]);
        assert_eq!(r.hit_rate_source, "metrics");
        assert!((r.prefix_hit_rate - 0.75).abs() < 1e-9);
        assert_eq!(r.preemptions, Some(2.0));
        let v = serde_json::to_value(&r).unwrap();
        for k in [
            "target",
            "concurrency",
            "steps_per_min",
            "prefix_hit_rate",
            "ideal_hit_rate",
            "p50_step_s",
            "p99_step_s",
            "output_tok_s",
            "preemptions",
            "errors",
        ] {
            assert!(v.get(k).is_some(), "{k}");
        }
        let f = LevelRow::failed("b", 4, "down".into());
        assert!(f.aborted && f.errors == 1 && f.steps_per_min == 0.0);
        assert!(r.placement.is_none() && v.get("placement").is_none());
    }

    #[test]
    fn the_tail_splits_into_first_and_later_steps() {
        let t0 = Instant::now();
        let first = |ms| Sample {
            first: true,
            ..sample(t0, ms, 10, 0, 0)
        };
        let s = vec![
            first(9000),
            sample(t0, 100, 10, 0, 0),
            sample(t0, 200, 10, 0, 0),
        ];
        let r = LevelRow::summarise("a", 2, 30.0, &s, &[], None, 0, 1, false, vec![]);
        assert_eq!(r.first_steps, 1);
        assert!((r.first_step_p99_s.unwrap() - 9.0).abs() < 1e-6);
        assert!((r.later_step_p99_s.unwrap() - 0.2).abs() < 1e-6);
        assert!((r.p99_step_s - 9.0).abs() < 1e-6);
        let none = LevelRow::summarise("a", 2, 30.0, &s[1..], &[], None, 0, 1, false, vec![]);
        assert_eq!((none.first_steps, none.first_step_p99_s), (0, None));
    }

    #[test]
    fn steps_open_at_the_end_count_in_the_tail_by_their_age() {
        let t0 = Instant::now();
        let s: Vec<Sample> = (1..=99).map(|ms| sample(t0, ms, 10, 0, 0)).collect();
        let r = LevelRow::summarise("a", 2, 30.0, &s, &[], None, 0, 1, false, vec![]);
        assert_eq!((r.open_steps, r.oldest_open_s), (0, None));
        assert!((r.p99_with_open_s - r.p99_step_s).abs() < 1e-12);
        // Two programs still waiting at the end, 50 s and 70 s so far.
        let open = [50.0, 70.0];
        let r = LevelRow::summarise("a", 2, 30.0, &s, &open, None, 0, 1, false, vec![]);
        assert_eq!((r.open_steps, r.oldest_open_s), (2, Some(70.0)));
        assert!(
            (r.p99_step_s - 0.099).abs() < 1e-6,
            "finished steps unchanged"
        );
        assert!(
            (r.p99_with_open_s - 50.0).abs() < 1e-9,
            "{}",
            r.p99_with_open_s
        );
    }

    #[test]
    fn placement_counts_workers_and_split_programs() {
        let t0 = Instant::now();
        let on = |program, worker| Sample {
            program,
            worker: Some(worker),
            ..sample(t0, 100, 10, 0, 0)
        };
        // Programs 0 and 1 stay on their workers; program 2 moves.
        let s = vec![on(0, 7), on(0, 7), on(1, 9), on(2, 7), on(2, 9)];
        let p = Placement::of(&s).expect("workers named");
        assert_eq!(p.steps["7"], 3);
        assert_eq!(p.steps["9"], 2);
        assert_eq!(p.programs["7"], 2);
        assert_eq!(p.programs["9"], 2);
        assert_eq!(p.split_programs, 1);
    }
}
