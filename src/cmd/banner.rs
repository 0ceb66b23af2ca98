//! The block `agentd serve` prints once it listens: what a vLLM user looks
//! for at a glance (model, dtype, device, KV capacity, scheduler, routes),
//! each line naming the flag that changes it.

use std::path::Path;

use agentd_models::LoadDtype;
use agentd_runtime::ModelConfig;
use agentd_scheduler::PolicyKind;

use super::generation::Defaults;
use super::kv_size::KvPlan;

pub struct Banner<'a> {
    pub model: &'a str,
    pub name: &'a str,
    pub dir: &'a Path,
    pub config: &'a ModelConfig,
    pub dtype: LoadDtype,
    pub device: &'a str,
    pub replicas: usize,
    pub threads: usize,
    pub kv: &'a KvPlan,
    pub max_model_len: usize,
    pub host_blocks: usize,
    pub scheduler: PolicyKind,
    pub sampling: &'a Defaults,
    pub keys: usize,
}

impl Banner<'_> {
    /// The banner text; `{address}` stands for the bound address.
    pub fn render(&self) -> String {
        let scheduler = match self.scheduler {
            PolicyKind::Program => "program (agent programs keep their KV between turns)",
            PolicyKind::Request => "request (vLLM-like, per request)",
        };
        let auth = if self.keys == 0 {
            "none (--api-key)".to_owned()
        } else {
            format!("{} API key(s)", self.keys)
        };
        let rows = [
            ("model", format!("{} as {:?}", self.model, self.name)),
            ("files", self.dir.display().to_string()),
            ("arch", self.arch()),
            ("dtype", self.dtype()),
            (
                "device",
                format!(
                    "{} x {} replica(s), {} threads each",
                    self.device, self.replicas, self.threads
                ),
            ),
            ("KV cache", self.kv_cache()),
            ("host tier", self.host_tier()),
            ("scheduler", scheduler.to_owned()),
            ("prefix cache", "always on".to_owned()),
            (
                "sampling",
                format!("{} ({})", self.sampling.summary(), self.sampling.source),
            ),
            ("auth", auth),
            (
                "routes",
                "http://{address}/v1/chat/completions /v1/completions /v1/responses \
                 /v1/models /metrics /health /programs"
                    .to_owned(),
            ),
        ];
        let mut out = format!(
            "\nagentd {} serving {}\n",
            env!("CARGO_PKG_VERSION"),
            self.model
        );
        for (k, v) in rows {
            out.push_str(&format!("  {k:<13}{v}\n"));
        }
        out.push('\n');
        out
    }

    fn arch(&self) -> String {
        let c = self.config;
        format!(
            "{} ({} layers, hidden {}, vocab {}, window {})",
            c.family, c.num_hidden_layers, c.hidden_size, c.vocab_size, c.max_position_embeddings
        )
    }

    fn dtype(&self) -> String {
        let dtype = match self.dtype {
            LoadDtype::Auto => format!(
                "auto ({} as stored)",
                LoadDtype::Cast(self.config.torch_dtype)
            ),
            d => d.to_string(),
        };
        let compute = if self.device == "cuda" {
            "16-bit"
        } else {
            "f32 compute and KV"
        };
        format!("{dtype}, {compute} (--dtype)")
    }

    fn kv_cache(&self) -> String {
        let kv = self.kv;
        format!(
            "{} tokens per replica, {:.2} GiB, {} blocks of {} ({}); max model len {}, \
             max concurrency {:.2}x",
            kv.tokens(),
            kv.gib(),
            kv.num_blocks,
            kv.block_size,
            kv.source,
            self.max_model_len,
            kv.tokens() as f64 / self.max_model_len.max(1) as f64
        )
    }

    fn host_tier(&self) -> String {
        if self.host_blocks == 0 {
            "off (--kv-offloading-size GiB)".to_owned()
        } else {
            format!(
                "{} tokens per replica ({} blocks)",
                self.host_blocks.saturating_mul(self.kv.block_size),
                self.host_blocks
            )
        }
    }
}
