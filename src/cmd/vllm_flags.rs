//! vLLM's common `serve` flags that agentd does not have, so that a vLLM
//! command line gets a one-line answer instead of clap's "unexpected
//! argument": accepted where they change nothing here (said in a log line),
//! else refused with `not supported: FLAG` and what to use instead.

use anyhow::{bail, Result};
use clap::Args;

/// Listed in `agentd serve --help` (after the options).
pub const HELP: &str = "\
vLLM flags: a model id, --revision, --download-dir, --tokenizer, --dtype, --max-model-len,
  --served-model-name, --api-key, --block-size, --max-num-seqs, --max-num-batched-tokens, --kv-cache-memory
  (-bytes), --kv-offloading-size, --generation-config, --tool-call-parser, --reasoning-parser,
  --kv-events-config and --data-parallel-size (= --replicas) mean what they mean in vLLM.
  Accepted, no effect here: --enable-prefix-caching (always on), --enable-chunked-prefill
  (always on), --enable-auto-tool-choice (tool calls are always parsed), --trust-remote-code
  (no remote code runs), --enforce-eager, --disable-log-requests, --disable-log-stats,
  --tensor-parallel-size 1, --pipeline-parallel-size 1, --gpu-memory-utilization on the CPU
  (the CPU KV cache is VLLM_CPU_KVCACHE_SPACE GiB, 4 by default). On CUDA
  --gpu-memory-utilization (0.9) sizes the KV cache from the device's memory, as in vLLM.
  Refused with \"not supported\": --tensor-parallel-size/--pipeline-parallel-size (-tp/-pp) > 1,
  --no-enable-prefix-caching, --quantization,
  --kv-cache-dtype other than auto, --enable-lora, --speculative-config, --chat-template,
  --seed.
Environment: HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE, HF_HOME, HF_HUB_CACHE (as huggingface_hub);
  VLLM_CPU_KVCACHE_SPACE (GiB of KV cache per replica on the CPU).";

#[derive(Args, Debug, Default)]
pub struct VllmFlags {
    #[arg(long, hide = true)]
    enable_prefix_caching: bool,
    #[arg(long, hide = true)]
    no_enable_prefix_caching: bool,
    #[arg(long, hide = true)]
    enable_chunked_prefill: bool,
    #[arg(long, hide = true)]
    enable_auto_tool_choice: bool,
    #[arg(long, hide = true)]
    trust_remote_code: bool,
    /// vLLM's: no CUDA graphs (wins over `--cuda-graphs`).
    #[arg(long, hide = true)]
    pub enforce_eager: bool,
    #[arg(long, hide = true)]
    disable_log_requests: bool,
    #[arg(long, hide = true)]
    disable_log_stats: bool,
    #[arg(long, hide = true)]
    tensor_parallel_size: Option<u32>,
    #[arg(long, hide = true)]
    pipeline_parallel_size: Option<u32>,
    #[arg(long, hide = true)]
    gpu_memory_utilization: Option<f64>,
    #[arg(long, hide = true)]
    quantization: Option<String>,
    #[arg(long, hide = true)]
    kv_cache_dtype: Option<String>,
    #[arg(long, hide = true)]
    enable_lora: bool,
    #[arg(long, hide = true)]
    speculative_config: Option<String>,
    #[arg(long, hide = true)]
    chat_template: Option<String>,
    #[arg(long, hide = true)]
    seed: Option<u64>,
}

/// vLLM's default `--gpu-memory-utilization`.
pub const DEFAULT_GPU_MEMORY_UTILIZATION: f64 = 0.9;

impl VllmFlags {
    /// `--gpu-memory-utilization`, or vLLM's default 0.9 (read on CUDA,
    /// where it sizes the KV cache).
    pub fn gpu_memory_utilization(&self) -> f64 {
        self.gpu_memory_utilization
            .unwrap_or(DEFAULT_GPU_MEMORY_UTILIZATION)
    }

    /// Logs the accepted no-ops; the first refused flag is the error.
    pub fn check(&self, device: &str) -> Result<()> {
        if let Some((flag, why)) = self.refused() {
            bail!("not supported: {flag} ({why})");
        }
        for what in self.ignored(device) {
            tracing::info!("accepted, no effect: {what}");
        }
        Ok(())
    }

    /// The first flag given that agentd cannot honour, and why.
    fn refused(&self) -> Option<(String, &'static str)> {
        let kv_dtype = self.kv_cache_dtype.as_deref().filter(|d| *d != "auto");
        let refused: [(bool, String, &'static str); 9] = [
            (
                self.tensor_parallel_size.is_some_and(|n| n > 1),
                "--tensor-parallel-size".into(),
                "one model copy per replica; --replicas N (--data-parallel-size) scales out",
            ),
            (
                self.pipeline_parallel_size.is_some_and(|n| n > 1),
                "--pipeline-parallel-size".into(),
                "one model copy per replica",
            ),
            (
                self.no_enable_prefix_caching,
                "--no-enable-prefix-caching".into(),
                "the program scheduler is built on the prefix cache",
            ),
            (
                self.quantization.is_some(),
                format!(
                    "--quantization {}",
                    self.quantization.as_deref().unwrap_or("")
                ),
                "weights load as f32, bf16 or f16 (--dtype)",
            ),
            (
                kv_dtype.is_some(),
                format!("--kv-cache-dtype {}", kv_dtype.unwrap_or("")),
                "the KV cache is f32 on the CPU, 16-bit on CUDA",
            ),
            (self.enable_lora, "--enable-lora".into(), "no adapters"),
            (
                self.speculative_config.is_some(),
                "--speculative-config".into(),
                "no speculative decoding",
            ),
            (
                self.chat_template.is_some(),
                "--chat-template".into(),
                "the template comes from tokenizer_config.json (--tokenizer)",
            ),
            (
                self.seed.is_some(),
                "--seed".into(),
                "pass `seed` per request",
            ),
        ];
        refused
            .into_iter()
            .find(|(on, _, _)| *on)
            .map(|(_, flag, why)| (flag, why))
    }

    /// The flags given that change nothing here, each with why.
    fn ignored(&self, device: &str) -> Vec<&'static str> {
        let ignored = [
            (
                self.enable_prefix_caching,
                "--enable-prefix-caching: always on",
            ),
            (
                self.enable_chunked_prefill,
                "--enable-chunked-prefill: always on",
            ),
            (
                self.enable_auto_tool_choice,
                "--enable-auto-tool-choice: tool calls are always parsed",
            ),
            (
                self.trust_remote_code,
                "--trust-remote-code: no remote code runs here",
            ),
            (
                self.enforce_eager,
                "--enforce-eager: no CUDA graphs are captured (graphs are off unless --cuda-graphs)",
            ),
            (
                self.disable_log_requests,
                "--disable-log-requests: requests are logged at debug level",
            ),
            (
                self.disable_log_stats,
                "--disable-log-stats: stats are on /metrics",
            ),
            (
                self.tensor_parallel_size.is_some(),
                "--tensor-parallel-size 1: one copy per replica",
            ),
            (
                self.pipeline_parallel_size.is_some(),
                "--pipeline-parallel-size 1: one copy per replica",
            ),
            (
                self.gpu_memory_utilization.is_some() && device != "cuda",
                "--gpu-memory-utilization on the CPU: the KV cache is VLLM_CPU_KVCACHE_SPACE GiB",
            ),
        ];
        ignored
            .into_iter()
            .filter(|(on, _)| *on)
            .map(|(_, what)| what)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each refused flag is named with its value, the first one given wins,
    /// and the accepted no-ops are listed (the GPU memory share only off CUDA).
    #[test]
    fn refused_and_ignored_flags_are_named() {
        let none = VllmFlags::default();
        assert!(none.check("cpu").is_ok());
        assert!(none.ignored("cpu").is_empty());
        let cases = [
            (
                VllmFlags {
                    tensor_parallel_size: Some(2),
                    ..Default::default()
                },
                "--tensor-parallel-size",
            ),
            (
                VllmFlags {
                    quantization: Some("awq".into()),
                    ..Default::default()
                },
                "--quantization awq",
            ),
            (
                VllmFlags {
                    kv_cache_dtype: Some("fp8".into()),
                    ..Default::default()
                },
                "--kv-cache-dtype fp8",
            ),
            (
                VllmFlags {
                    seed: Some(1),
                    ..Default::default()
                },
                "--seed",
            ),
        ];
        for (flags, name) in cases {
            let err = flags.check("cpu").unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("not supported: {name} (")),
                "{err}"
            );
        }
        let both = VllmFlags {
            enable_lora: true,
            seed: Some(3),
            ..Default::default()
        };
        assert_eq!(
            both.refused().map(|r| r.0),
            Some("--enable-lora".to_string())
        );
        let auto = VllmFlags {
            kv_cache_dtype: Some("auto".into()),
            tensor_parallel_size: Some(1),
            ..Default::default()
        };
        assert!(auto.check("cpu").is_ok());
        assert_eq!(
            auto.ignored("cpu"),
            ["--tensor-parallel-size 1: one copy per replica"]
        );
        let gpu = VllmFlags {
            gpu_memory_utilization: Some(0.5),
            ..Default::default()
        };
        assert_eq!(gpu.ignored("cuda").len(), 0);
        assert_eq!(gpu.ignored("cpu").len(), 1);
    }
}
