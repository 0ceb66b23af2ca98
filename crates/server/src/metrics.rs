//! `/metrics`: the engine's snapshot in Prometheus text exposition format
//! (0.0.4), under vLLM's metric names (so dashboards and `agentd bench`
//! read agentd and vLLM alike) plus agentd's program gauges.
//!
//! Every family is one row of a table (name, type, help, how its samples
//! are read) and the text is generated from the tables by one loop. Why a
//! table and not a Prometheus library (checked 2026-12-03 against the
//! crates' sources):
//! - `prometheus-client` 0.26, the Prometheus project's Rust client, cannot
//!   write vLLM's counters byte for byte: it appends `_total` to a
//!   counter's samples itself and refuses a registered name that ends in
//!   `_total`, so `# TYPE vllm:prompt_tokens_total counter` comes out as
//!   `# TYPE vllm:prompt_tokens counter`; it appends "." to every help
//!   text, writes floats with `dtoa` (`le="1.0"` where this text has
//!   `le="1"`) and ends with OpenMetrics' `# EOF`. Colons it accepts.
//! - `prometheus` 0.14 (TiKV's) writes the names as given, but sorts the
//!   families by name and puts a registry's labels on every family
//!   (`vllm:cache_config_info` has no `model_name`); and most values here
//!   are not events the engine sees but state read when a snapshot is
//!   built (running and waiting requests, KV usage, programs by phase, the
//!   policy's and the pools' own counters), which it would read through a
//!   custom collector over the same snapshot: it would only format text.
//!
//! The engine records its own counts where they happen
//! ([`agentd_engine::Counters`]); each count has one field, read by its
//! rows here (vLLM's `num_preemptions_total` and agentd's
//! `program_pauses_total` are the same count, every pause).

use std::fmt::Write;

use agentd_engine::{Histogram, MetricsSnapshot};
use agentd_tools::ToolMetrics;

/// How a family's samples are read from its source `S`.
enum Get<S: ?Sized> {
    /// One sample, labelled with the model.
    Value(fn(&S) -> f64),
    /// A histogram, labelled with the model.
    Histogram(fn(&S) -> &Histogram),
    /// Samples with labels of their own (`name="value",...`), after the
    /// model's label when `model` is set.
    Series {
        model: bool,
        get: fn(&S) -> Vec<(String, f64)>,
    },
}

/// One metric family: a row of a table.
struct Family<S: ?Sized> {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    get: Get<S>,
}

const fn value<S: ?Sized>(
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    get: fn(&S) -> f64,
) -> Family<S> {
    Family {
        name,
        kind,
        help,
        get: Get::Value(get),
    }
}

const fn histogram<S: ?Sized>(
    name: &'static str,
    help: &'static str,
    get: fn(&S) -> &Histogram,
) -> Family<S> {
    Family {
        name,
        kind: "histogram",
        help,
        get: Get::Histogram(get),
    }
}

const GAUGE: &str = "gauge";
const COUNTER: &str = "counter";

/// The engine's families, in the order they are written.
#[rustfmt::skip]
const ENGINE: &[Family<MetricsSnapshot>] = &[
    value("vllm:num_requests_running", GAUGE, "Number of requests in model execution batches.", |m| m.num_requests_running as f64),
    value("vllm:num_requests_waiting", GAUGE, "Number of requests waiting to be processed.", |m| m.num_requests_waiting as f64),
    value("vllm:kv_cache_usage_perc", GAUGE, "KV-cache usage. 1 means 100 percent usage.", |m| m.kv_cache_usage),
    value("vllm:prefix_cache_queries_total", COUNTER, "Prefix cache queries, in terms of number of queried tokens.", |m| m.prefix_cache_queries as f64),
    value("vllm:prefix_cache_hits_total", COUNTER, "Prefix cache hits, in terms of number of cached tokens.", |m| m.prefix_cache_hits as f64),
    value("vllm:num_preemptions_total", COUNTER, "Cumulative number of preemptions from the engine.", |m| m.pauses() as f64),
    value("vllm:prompt_tokens_total", COUNTER, "Number of prefill tokens processed.", |m| m.counters.prompt_tokens as f64),
    value("vllm:generation_tokens_total", COUNTER, "Number of generation tokens processed.", |m| m.counters.generation_tokens as f64),
    value("agentd:requests_finished_total", COUNTER, "Requests finished (any reason).", |m| m.counters.requests_finished as f64),
    value("agentd:program_pauses_total", COUNTER, "Programs paused by the scheduler (their KV released).", |m| m.pauses() as f64),
    value("agentd:program_restores_total", COUNTER, "Paused programs restored.", |m| m.restores as f64),
    value("agentd:recomputed_tokens_total", COUNTER, "Prompt tokens prefilled again because their KV had been lost.", |m| m.recomputed_tokens as f64),
    value("agentd:step_decode_context_tokens_total", COUNTER, "Context tokens read by decode rows, summed over the steps that ran a forward (over the decode tokens: the mean context a decode row attends over).", |m| m.decode_context_tokens as f64),
    value("agentd:step_prefill_attention_pairs_total", COUNTER, "Attention (query, key) pairs of prefill chunks, summed over the steps that ran a forward.", |m| m.prefill_attention_pairs as f64),
    value("agentd:kv_offloaded_blocks_total", COUNTER, "Cached KV blocks copied to the host tier as the device pool evicted them.", |m| m.kv_offloaded_blocks as f64),
    value("agentd:kv_onloaded_blocks_total", COUNTER, "KV blocks copied back from the host tier by a prefix match (not recomputed).", |m| m.kv_onloaded_blocks as f64),
    value("agentd:kv_host_usage_perc", GAUGE, "Fraction of the host tier's blocks holding cached content (0 without one).", |m| m.host_blocks_used as f64 / m.host_blocks.max(1) as f64),
    value("agentd:fit_prefill_tokens_per_second", GAUGE, "Prefill rate the engine measured on its own steps (a 1024-token chunk after 1024 cached tokens; 0 until enough steps were seen).", |m| m.fit_prefill_tokens_per_s),
    value("agentd:fit_decode_step_seconds", GAUGE, "Time of a one-sequence decode step at a 1024-token context, from the engine's fit of its own steps (0 until enough steps were seen).", |m| m.fit_decode_step_s),
    value("agentd:exhaustion_preemptions_total", COUNTER, "Programs paused because KV blocks ran out while planning a step.", |m| m.exhaustion_preemptions() as f64),
    value("agentd:batch_tokens_total", COUNTER, "Tokens planned into engine steps (prefill chunks and decode).", |m| m.counters.batch_tokens as f64),
    value("agentd:batch_budget_tokens_total", COUNTER, "Token budget of the engine steps that ran (batch fill = tokens / budget).", |m| m.counters.batch_budget as f64),
    Family {
        name: "vllm:cache_config_info",
        kind: GAUGE,
        help: "Information of the LLMEngine CacheConfig",
        get: Get::Series {
            model: false,
            get: |m| vec![(format!("block_size=\"{}\",num_gpu_blocks=\"{}\"", m.block_size, m.num_gpu_blocks), 1.0)],
        },
    },
    Family {
        name: "agentd:park_decisions_total",
        kind: COUNTER,
        help: "What the program policy did with a program's KV when memory was wanted (keep resident, swap to the host tier, recompute), by choice.",
        get: Get::Series {
            model: true,
            get: |m| m.parks.iter().map(|&(k, n)| (format!("choice=\"{}\"", escape(k)), n as f64)).collect(),
        },
    },
    Family {
        name: "agentd:program_pauses_by_cause_total",
        kind: COUNTER,
        help: "Programs paused by the scheduler, by cause (thrashing, work_conserving, tier_swap, overdue, kv_exhausted, retracted, yielded); they sum to agentd:program_pauses_total.",
        get: Get::Series {
            model: true,
            get: |m| m.pause_causes.iter().map(|&(k, n)| (format!("cause=\"{}\"", escape(k)), n as f64)).collect(),
        },
    },
    Family {
        name: "agentd:programs",
        kind: GAUGE,
        help: "Live programs by phase and state.",
        get: Get::Series {
            model: true,
            get: programs,
        },
    },
    histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", |m| &m.counters.ttft_s),
    histogram("vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", |m| &m.counters.e2e_s),
    histogram("vllm:request_queue_time_seconds", "Histogram of time from a request's arrival to its first start on a replica.", |m| &m.counters.queue_wait_s),
    histogram("agentd:engine_lock_hold_seconds", "Histogram of how long each critical section held the engine lock (plans with work, commits, releases; idle re-plans excluded).", |m| &m.counters.lock_hold_s),
    histogram("agentd:engine_lock_idle_hold_seconds", "Histogram of how long idle re-plans (nothing to run, nothing changed) held the engine lock.", |m| &m.counters.lock_idle_hold_s),
    histogram("agentd:step_forward_seconds", "Histogram of each step's model forward (logits included).", |m| &m.counters.forward_s),
    histogram("agentd:step_sampling_seconds", "Histogram of each step's sampling of its logits rows (outside the engine lock).", |m| &m.counters.sample_s),
];

/// The tool-resource counters (docs/design.md §10), after the engine's.
#[rustfmt::skip]
const TOOLS: &[Family<ToolMetrics>] = &[
    value("agentd:tool_resources_reclaimed_total", COUNTER, "Tool resources reclaimed after their last owner program ended.", |m| m.reclaimed_total as f64),
    value("agentd:tool_resources_failed_total", COUNTER, "Tool resources whose reclaim failed after every retry.", |m| m.failed_total as f64),
    value("agentd:tool_resources_live", GAUGE, "Declared tool resources not yet reclaimed (live or reclaiming).", |m| m.live as f64),
];

/// The CPU kernel path (a string the binary hands in, so the server knows
/// nothing of the kernels), as an info gauge.
const CPU_KERNELS: &[Family<str>] = &[Family {
    name: "agentd:cpu_kernels_info",
    kind: GAUGE,
    help: "The CPU kernel path the model runs on (AGENTD_CPU_KERNELS or detected).",
    get: Get::Series {
        model: false,
        get: |path| vec![(format!("path=\"{}\"", escape(path)), 1.0)],
    },
}];

/// Live programs by phase and state: the main combinations always, so a
/// scrape sees zeros rather than gaps.
fn programs(m: &MetricsSnapshot) -> Vec<(String, f64)> {
    let mut rows: Vec<(&str, &str, usize)> = vec![
        ("reasoning", "active", 0),
        ("acting", "active", 0),
        ("reasoning", "paused", 0),
        ("acting", "paused", 0),
    ];
    for &(phase, state, n) in &m.programs {
        match rows.iter_mut().find(|r| r.0 == phase && r.1 == state) {
            Some(r) => r.2 += n,
            None => rows.push((phase, state, n)),
        }
    }
    rows.into_iter()
        .map(|(phase, state, n)| {
            let labels = format!("phase=\"{}\",state=\"{}\"", escape(phase), escape(state));
            (labels, n as f64)
        })
        .collect()
}

/// Renders `m` for the served model `model`.
pub fn render(m: &MetricsSnapshot, model: &str) -> String {
    write_families(ENGINE, m, model)
}

/// The tool-resource counters, appended after the engine's.
pub fn render_tools(m: &ToolMetrics, model: &str) -> String {
    write_families(TOOLS, m, model)
}

/// The CPU kernel path the model runs on.
pub fn render_cpu_kernels(path: &str) -> String {
    write_families(CPU_KERNELS, path, "")
}

/// The text of `table`'s families read from `src`: `# HELP`, `# TYPE`,
/// then the samples, each labelled `model_name` unless the row says not.
fn write_families<S: ?Sized>(table: &[Family<S>], src: &S, model: &str) -> String {
    let mut out = String::with_capacity(256 * table.len());
    let model = format!("model_name=\"{}\"", escape(model));
    for f in table {
        let name = f.name;
        let _ = writeln!(out, "# HELP {name} {}\n# TYPE {name} {}", f.help, f.kind);
        match &f.get {
            Get::Value(get) => sample(&mut out, name, &model, get(src)),
            Get::Histogram(get) => {
                let h = get(src);
                let bucket = format!("{name}_bucket");
                for &(le, count) in &h.buckets {
                    let labels = format!("{model},le=\"{}\"", num(le));
                    sample(&mut out, &bucket, &labels, count as f64);
                }
                sample(
                    &mut out,
                    &bucket,
                    &format!("{model},le=\"+Inf\""),
                    h.count as f64,
                );
                sample(&mut out, &format!("{name}_sum"), &model, h.sum);
                sample(&mut out, &format!("{name}_count"), &model, h.count as f64);
            }
            Get::Series { model: with, get } => {
                for (own, v) in get(src) {
                    let labels = if *with { format!("{model},{own}") } else { own };
                    sample(&mut out, name, &labels, v);
                }
            }
        }
    }
    out
}

fn sample(out: &mut String, name: &str, labels: &str, v: f64) {
    let _ = writeln!(out, "{name}{{{labels}}} {}", num(v));
}

/// Prometheus number formatting (Rust prints `inf`/`NaN` differently).
fn num(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        // Display prints integers without a fraction (`100`, not `100.0`).
        format!("{v}")
    }
}

/// Label values escape backslash, quote and newline.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use agentd_engine::Counters;

    use super::*;

    fn snapshot() -> MetricsSnapshot {
        let mut counters = Counters {
            prompt_tokens: 100,
            generation_tokens: 7,
            batch_tokens: 90,
            batch_budget: 100,
            requests_finished: 1,
            ..Counters::default()
        };
        counters.ttft_s.observe(0.02);
        MetricsSnapshot {
            counters,
            num_requests_running: 1,
            num_requests_waiting: 2,
            kv_cache_usage: 0.25,
            prefix_cache_queries: 100,
            prefix_cache_hits: 40,
            block_size: 16,
            num_gpu_blocks: 64,
            programs: vec![("acting", "active", 2), ("reasoning", "terminated", 1)],
            restores: 5,
            recomputed_tokens: 6,
            decode_context_tokens: 9000,
            prefill_attention_pairs: 12,
            kv_offloaded_blocks: 7,
            kv_onloaded_blocks: 3,
            host_blocks_used: 1,
            host_blocks: 4,
            fit_prefill_tokens_per_s: 2500.0,
            fit_decode_step_s: 0.015,
            parks: vec![("keep", 1), ("swap", 8), ("recompute", 0)],
            pause_causes: vec![("thrashing", 1), ("tier_swap", 1), ("kv_exhausted", 2)],
        }
    }

    #[test]
    fn vllm_names_and_labels() {
        let text = render(&snapshot(), "tiny\"q");
        let l = "model_name=\"tiny\\\"q\"";
        for line in [
            format!("vllm:num_requests_running{{{l}}} 1"),
            format!("vllm:num_requests_waiting{{{l}}} 2"),
            format!("vllm:kv_cache_usage_perc{{{l}}} 0.25"),
            format!("vllm:prefix_cache_queries_total{{{l}}} 100"),
            format!("vllm:prefix_cache_hits_total{{{l}}} 40"),
            format!("vllm:num_preemptions_total{{{l}}} 4"),
            format!("vllm:prompt_tokens_total{{{l}}} 100"),
            format!("vllm:generation_tokens_total{{{l}}} 7"),
            "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"64\"} 1".to_string(),
            format!("agentd:programs{{{l},phase=\"acting\",state=\"active\"}} 2"),
            format!("agentd:programs{{{l},phase=\"reasoning\",state=\"terminated\"}} 1"),
            format!("agentd:programs{{{l},phase=\"reasoning\",state=\"paused\"}} 0"),
            format!("agentd:program_pauses_total{{{l}}} 4"),
            format!("agentd:requests_finished_total{{{l}}} 1"),
            format!("agentd:program_restores_total{{{l}}} 5"),
            format!("agentd:recomputed_tokens_total{{{l}}} 6"),
            format!("agentd:step_decode_context_tokens_total{{{l}}} 9000"),
            format!("agentd:step_prefill_attention_pairs_total{{{l}}} 12"),
            format!("agentd:kv_offloaded_blocks_total{{{l}}} 7"),
            format!("agentd:kv_onloaded_blocks_total{{{l}}} 3"),
            format!("agentd:kv_host_usage_perc{{{l}}} 0.25"),
            format!("agentd:fit_prefill_tokens_per_second{{{l}}} 2500"),
            format!("agentd:fit_decode_step_seconds{{{l}}} 0.015"),
            format!("agentd:park_decisions_total{{{l},choice=\"keep\"}} 1"),
            format!("agentd:park_decisions_total{{{l},choice=\"swap\"}} 8"),
            format!("agentd:park_decisions_total{{{l},choice=\"recompute\"}} 0"),
            format!("agentd:program_pauses_by_cause_total{{{l},cause=\"tier_swap\"}} 1"),
            format!("agentd:program_pauses_by_cause_total{{{l},cause=\"kv_exhausted\"}} 2"),
            format!("vllm:time_to_first_token_seconds_bucket{{{l},le=\"0.01\"}} 0"),
            format!("vllm:time_to_first_token_seconds_bucket{{{l},le=\"0.04\"}} 1"),
            format!("vllm:time_to_first_token_seconds_bucket{{{l},le=\"+Inf\"}} 1"),
            format!("vllm:time_to_first_token_seconds_count{{{l}}} 1"),
            format!("vllm:e2e_request_latency_seconds_count{{{l}}} 0"),
        ] {
            assert!(
                text.lines().any(|x| x == line),
                "missing line {line}\n{text}"
            );
        }
        assert!(text.contains("# TYPE vllm:e2e_request_latency_seconds histogram"));
    }

    #[test]
    fn cpu_kernels_info_gauge() {
        let text = render_cpu_kernels("avx2");
        assert!(text
            .lines()
            .any(|l| l == "agentd:cpu_kernels_info{path=\"avx2\"} 1"));
        assert!(text.contains("# TYPE agentd:cpu_kernels_info gauge"));
    }
}
