//! Prometheus text exposition parsing: the counters the benchmark reads
//! from `/metrics` (vLLM's names, which agentd serves too).

use std::collections::HashMap;

/// Metric name → value summed over all label sets (vLLM labels by model and
/// engine index; the benchmark wants the server's total).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics(pub HashMap<String, f64>);

pub const PREFIX_HITS: &str = "vllm:prefix_cache_hits_total";
pub const PREFIX_QUERIES: &str = "vllm:prefix_cache_queries_total";
pub const PREEMPTIONS: &str = "vllm:num_preemptions_total";
pub const RECOMPUTED: &str = "agentd:recomputed_tokens_total";
pub const PAUSES: &str = "agentd:program_pauses_total";
pub const RESTORES: &str = "agentd:program_restores_total";
pub const EXHAUSTION: &str = "agentd:exhaustion_preemptions_total";
pub const BATCH_TOKENS: &str = "agentd:batch_tokens_total";
pub const BATCH_BUDGET: &str = "agentd:batch_budget_tokens_total";

impl Metrics {
    /// Parses exposition text. Comments, blank lines and lines that do not
    /// parse are skipped (a scrape must never fail the benchmark).
    pub fn parse(text: &str) -> Metrics {
        let mut m = HashMap::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, rest) = match line.find('{') {
                Some(i) => match line[i..].rfind('}') {
                    Some(j) => (&line[..i], &line[i + j + 1..]),
                    None => continue,
                },
                None => match line.split_once(char::is_whitespace) {
                    Some((n, r)) => (n, r),
                    None => continue,
                },
            };
            let Some(value) = rest.split_whitespace().next() else {
                continue;
            };
            let v = match value {
                "NaN" => f64::NAN,
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                s => match s.parse::<f64>() {
                    Ok(v) => v,
                    Err(_) => continue,
                },
            };
            *m.entry(name.trim().to_string()).or_insert(0.0) += v;
        }
        Metrics(m)
    }

    pub fn get(&self, name: &str) -> Option<f64> {
        self.0.get(name).copied()
    }

    /// `self − before` for a counter both scrapes carry.
    pub fn delta(&self, before: &Metrics, name: &str) -> Option<f64> {
        Some(self.get(name)? - before.get(name)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = r#"# HELP vllm:prefix_cache_queries_total Prefix cache queries.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="/m/qwen3"} 12800.0
vllm:prefix_cache_queries_total{engine="1",model_name="/m/qwen3"} 200.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="/m/qwen3"} 9600.0
vllm:num_preemptions_total{engine="0",model_name="a{b}c"} 3
process_cpu_seconds_total 4.5
weird_line_without_value
vllm:some_gauge{x="1"} NaN
vllm:bad{x="1"} abc
vllm:with_ts{x="1"} 7 1700000000000
"#;

    #[test]
    fn sums_label_sets_and_skips_junk() {
        let m = Metrics::parse(VLLM);
        assert_eq!(m.get(PREFIX_QUERIES), Some(13000.0));
        assert_eq!(m.get(PREFIX_HITS), Some(9600.0));
        assert_eq!(m.get(PREEMPTIONS), Some(3.0));
        assert_eq!(m.get("process_cpu_seconds_total"), Some(4.5));
        assert!(m.get("vllm:some_gauge").unwrap().is_nan());
        assert_eq!(m.get("vllm:bad"), None);
        assert_eq!(m.get("vllm:with_ts"), Some(7.0));
        assert_eq!(m.get("weird_line_without_value"), None);
    }

    #[test]
    fn deltas() {
        let a = Metrics::parse("vllm:prefix_cache_hits_total{m=\"x\"} 10\n");
        let b = Metrics::parse("vllm:prefix_cache_hits_total{m=\"x\"} 25\n");
        assert_eq!(b.delta(&a, PREFIX_HITS), Some(15.0));
        assert_eq!(b.delta(&a, PREEMPTIONS), None);
    }

    #[test]
    fn reads_agentd_own_output_shape() {
        let text =
            "# HELP vllm:num_preemptions_total x\n# TYPE vllm:num_preemptions_total counter\n\
                    vllm:num_preemptions_total{model_name=\"tiny\"} 0\n\
                    agentd:recomputed_tokens_total{model_name=\"tiny\"} 1234\n";
        let m = Metrics::parse(text);
        assert_eq!(m.get(PREEMPTIONS), Some(0.0));
        assert_eq!(m.get(RECOMPUTED), Some(1234.0));
    }
}
