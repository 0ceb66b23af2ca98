//! `/metrics`: the engine's snapshot in Prometheus text exposition format,
//! under vLLM's metric names (so dashboards and `agentd bench` read agentd
//! and vLLM alike) plus agentd's program gauges.

use std::fmt::Write;

use agentd_engine::{Histogram, MetricsSnapshot};
use agentd_tools::ToolMetrics;

/// Renders `m` for the served model `model`.
pub fn render(m: &MetricsSnapshot, model: &str) -> String {
    let mut out = String::with_capacity(4096);
    let label = format!("model_name=\"{}\"", escape(model));
    let mut scalar = |name: &str, kind: &str, help: &str, value: f64| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let _ = writeln!(out, "{name}{{{label}}} {}", num(value));
    };
    scalar(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        m.num_requests_running as f64,
    );
    scalar(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        m.num_requests_waiting as f64,
    );
    scalar(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        m.kv_cache_usage,
    );
    scalar(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        m.prefix_cache_queries as f64,
    );
    scalar(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        m.prefix_cache_hits as f64,
    );
    scalar(
        "vllm:num_preemptions_total",
        "counter",
        "Cumulative number of preemptions from the engine.",
        m.num_preemptions as f64,
    );
    scalar(
        "vllm:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        m.prompt_tokens as f64,
    );
    scalar(
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        m.generation_tokens as f64,
    );
    scalar(
        "agentd:requests_finished_total",
        "counter",
        "Requests finished (any reason).",
        m.requests_finished as f64,
    );
    scalar(
        "agentd:program_pauses_total",
        "counter",
        "Programs paused by the scheduler (their KV released).",
        m.pauses as f64,
    );
    scalar(
        "agentd:program_restores_total",
        "counter",
        "Paused programs restored.",
        m.restores as f64,
    );
    scalar(
        "agentd:recomputed_tokens_total",
        "counter",
        "Prompt tokens prefilled again because their KV had been lost.",
        m.recomputed_tokens as f64,
    );
    scalar(
        "agentd:kv_offloaded_blocks_total",
        "counter",
        "Cached KV blocks copied to the host tier as the device pool evicted them.",
        m.kv_offloaded_blocks as f64,
    );
    scalar(
        "agentd:kv_onloaded_blocks_total",
        "counter",
        "KV blocks copied back from the host tier by a prefix match (not recomputed).",
        m.kv_onloaded_blocks as f64,
    );
    scalar(
        "agentd:kv_host_usage_perc",
        "gauge",
        "Fraction of the host tier's blocks holding cached content (0 without one).",
        m.host_blocks_used as f64 / m.host_blocks.max(1) as f64,
    );
    scalar(
        "agentd:exhaustion_preemptions_total",
        "counter",
        "Programs paused because KV blocks ran out while planning a step.",
        m.exhaustion_preemptions as f64,
    );
    scalar(
        "agentd:batch_tokens_total",
        "counter",
        "Tokens planned into engine steps (prefill chunks and decode).",
        m.batch_tokens as f64,
    );
    scalar(
        "agentd:batch_budget_tokens_total",
        "counter",
        "Token budget of the engine steps that ran (batch fill = tokens / budget).",
        m.batch_budget as f64,
    );

    let _ = writeln!(
        out,
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig"
    );
    let _ = writeln!(out, "# TYPE vllm:cache_config_info gauge");
    let _ = writeln!(
        out,
        "vllm:cache_config_info{{block_size=\"{}\",num_gpu_blocks=\"{}\"}} 1",
        m.block_size, m.num_gpu_blocks
    );

    let _ = writeln!(
        out,
        "# HELP agentd:programs Live programs by phase and state."
    );
    let _ = writeln!(out, "# TYPE agentd:programs gauge");
    // Always show the main combinations so a scrape sees zeros, not gaps.
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
    for (phase, state, n) in rows {
        let _ = writeln!(
            out,
            "agentd:programs{{{label},phase=\"{}\",state=\"{}\"}} {n}",
            escape(phase),
            escape(state)
        );
    }

    histogram(
        &mut out,
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &label,
        &m.ttft_s,
    );
    histogram(
        &mut out,
        "vllm:e2e_request_latency_seconds",
        "Histogram of end to end request latency in seconds.",
        &label,
        &m.e2e_s,
    );
    histogram(
        &mut out,
        "vllm:request_queue_time_seconds",
        "Histogram of time from a request's arrival to its first start on a replica.",
        &label,
        &m.queue_wait_s,
    );
    histogram(
        &mut out,
        "agentd:engine_lock_hold_seconds",
        "Histogram of how long each critical section held the engine lock (plans with work, commits, releases; idle re-plans excluded).",
        &label,
        &m.lock_hold_s,
    );
    histogram(
        &mut out,
        "agentd:engine_lock_idle_hold_seconds",
        "Histogram of how long idle re-plans (nothing to run, nothing changed) held the engine lock.",
        &label,
        &m.lock_idle_hold_s,
    );
    histogram(
        &mut out,
        "agentd:step_forward_seconds",
        "Histogram of each step's model forward (logits included).",
        &label,
        &m.forward_s,
    );
    histogram(
        &mut out,
        "agentd:step_sampling_seconds",
        "Histogram of each step's sampling of its logits rows (outside the engine lock).",
        &label,
        &m.sample_s,
    );
    out
}

/// The tool-resource counters (docs/design.md §10), appended after the engine's.
pub fn render_tools(m: &ToolMetrics, model: &str) -> String {
    let mut out = String::with_capacity(512);
    let label = format!("model_name=\"{}\"", escape(model));
    for (name, kind, help, v) in [
        (
            "agentd:tool_resources_reclaimed_total",
            "counter",
            "Tool resources reclaimed after their last owner program ended.",
            m.reclaimed_total,
        ),
        (
            "agentd:tool_resources_failed_total",
            "counter",
            "Tool resources whose reclaim failed after every retry.",
            m.failed_total,
        ),
        (
            "agentd:tool_resources_live",
            "gauge",
            "Declared tool resources not yet reclaimed (live or reclaiming).",
            m.live as u64,
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let _ = writeln!(out, "{name}{{{label}}} {v}");
    }
    out
}

/// The CPU kernel path the model runs on, as an info gauge (a string the
/// binary hands in, so the server knows nothing of the kernels).
pub fn render_cpu_kernels(path: &str) -> String {
    let name = "agentd:cpu_kernels_info";
    format!(
        "# HELP {name} The CPU kernel path the model runs on (AGENTD_CPU_KERNELS or detected).\n\
         # TYPE {name} gauge\n\
         {name}{{path=\"{}\"}} 1\n",
        escape(path)
    )
}

fn histogram(out: &mut String, name: &str, help: &str, label: &str, h: &Histogram) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    for &(le, count) in &h.buckets {
        let _ = writeln!(out, "{name}_bucket{{{label},le=\"{}\"}} {count}", num(le));
    }
    let _ = writeln!(out, "{name}_bucket{{{label},le=\"+Inf\"}} {}", h.count);
    let _ = writeln!(out, "{name}_sum{{{label}}} {}", num(h.sum));
    let _ = writeln!(out, "{name}_count{{{label}}} {}", h.count);
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
    use super::*;

    fn snapshot() -> MetricsSnapshot {
        let mut ttft = Histogram::latency();
        ttft.observe(0.02);
        MetricsSnapshot {
            num_requests_running: 1,
            num_requests_waiting: 2,
            kv_cache_usage: 0.25,
            prefix_cache_queries: 100,
            prefix_cache_hits: 40,
            num_preemptions: 3,
            prompt_tokens: 100,
            generation_tokens: 7,
            block_size: 16,
            num_gpu_blocks: 64,
            ttft_s: ttft,
            e2e_s: Histogram::latency(),
            queue_wait_s: Histogram::latency(),
            lock_hold_s: Histogram::lock_hold(),
            lock_idle_hold_s: Histogram::lock_hold(),
            forward_s: Histogram::step_phase(),
            sample_s: Histogram::step_phase(),
            batch_tokens: 90,
            batch_budget: 100,
            exhaustion_preemptions: 2,
            programs: vec![("acting", "active", 2), ("reasoning", "terminated", 1)],
            pauses: 4,
            restores: 5,
            recomputed_tokens: 6,
            kv_offloaded_blocks: 7,
            kv_onloaded_blocks: 3,
            host_blocks_used: 1,
            host_blocks: 4,
            requests_finished: 1,
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
            format!("vllm:num_preemptions_total{{{l}}} 3"),
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
            format!("agentd:kv_offloaded_blocks_total{{{l}}} 7"),
            format!("agentd:kv_onloaded_blocks_total{{{l}}} 3"),
            format!("agentd:kv_host_usage_perc{{{l}}} 0.25"),
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
