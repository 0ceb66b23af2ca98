//! `agentd serve`: the OpenAI-compatible server (docs/design.md §9) on the engine.
//!
//! The model is a Hugging Face repository id (`agentd serve Qwen/Qwen3-8B`,
//! fetched into the shared Hugging Face cache as vLLM fetches it, see
//! [`super::model_arg`]) or a local directory; without one it serves the
//! embedded tiny Qwen3 ([`super::default_model`]), so a fresh machine with no
//! network can serve and be benchmarked.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agentd_engine::{Engine, EngineConfig};
use agentd_scheduler::PolicyKind;
use agentd_tools::{CommandPolicy, DockerConfig, ForeignPids, ReclaimConfig, ToolsConfig};
use anyhow::{Context, Result};
use clap::Args;

use super::default_model::{default_model, DEFAULT_MODEL_NAME};
use super::kv_size::{KvArgs, KvPlan};
use super::model_arg::HubArgs;
use super::scheduler_args::SchedulerArgs;
use super::vllm_flags::VllmFlags;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// The model: a Hugging Face repository id (`Qwen/Qwen3-8B`: the local
    /// Hugging Face cache, else downloaded into it) or a model directory
    /// (config.json, *.safetensors, tokenizer.json, tokenizer_config.json).
    /// Default: the embedded tiny Qwen3 (random weights, no network).
    #[arg(long, conflicts_with = "model_path")]
    pub model: Option<String>,
    /// The model, as a positional argument (like `vllm serve MODEL`).
    #[arg(value_name = "MODEL")]
    pub model_path: Option<String>,
    #[command(flatten)]
    pub hub: HubArgs,
    /// Tokenizer and chat template from another repository id or directory
    /// (default: the model's).
    #[arg(long)]
    pub tokenizer: Option<String>,
    /// Default sampling as vLLM's flag: `auto` takes temperature, top_p,
    /// top_k, min_p and repetition_penalty from the model's
    /// generation_config.json (a request's own values win); `vllm` uses
    /// neutral defaults (temperature 1, no top-k/top-p/min-p cut); or a
    /// directory holding a generation_config.json. Its eos_token_id ends
    /// generation either way.
    #[arg(long, default_value = "auto")]
    pub generation_config: String,
    /// Where the model runs: `cpu` (everywhere) or `cuda` (an NVIDIA GPU per
    /// replica; needs a build with `--features cuda`).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    pub device: String,
    /// CUDA: draw each token on the GPU (temperature, top-k/top-p/min-p,
    /// penalties, token controls, grammar masks), so logits never leave the
    /// device. Off until an H200 run has checked it (kernels/NOTES.md).
    #[arg(long)]
    pub device_sampling: bool,
    /// CUDA: Q/K norm + RoPE and the KV cache write as one kernel per layer
    /// (three launches become one). Off until an H200 run has checked it.
    #[arg(long)]
    pub fused_prologue: bool,
    /// CUDA: decode attention in one pass over K and V (online softmax per
    /// token slot) for groups of up to 8 query heads per KV head. Off until
    /// an H200 run has checked it.
    #[arg(long)]
    pub single_pass_decode: bool,
    /// CUDA, MoE models: routing, grouping per expert and the expert
    /// products (a grouped GEMM) on the GPU, with no synchronisation per
    /// sparse layer. Off until an H200 run has checked it.
    #[arg(long)]
    pub device_moe: bool,
    /// CUDA: replay decode steps as CUDA graphs per batch bucket (vLLM's
    /// capture sizes); prefill and mixed steps run eagerly. Off until an
    /// H200 run has checked it; vLLM's --enforce-eager turns it off.
    #[arg(long)]
    pub cuda_graphs: bool,
    #[command(flatten)]
    pub dtype: super::dtype::DtypeArg,
    /// Tool-call output format by vLLM's parser name (default: the model
    /// family's: `glm45` for GLM-4.5 MoE, else `hermes`).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(agentd_chat::TOOL_PARSER_NAMES))]
    pub tool_call_parser: Option<String>,
    /// Reasoning format by vLLM's parser name (default: the model family's:
    /// `glm45` for GLM-4.5 MoE, else `qwen3`).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(agentd_chat::REASONING_PARSER_NAMES))]
    pub reasoning_parser: Option<String>,
    /// CPU threads per replica (default: the cores split between replicas).
    #[arg(long)]
    pub threads_per_replica: Option<usize>,
    /// Cap on prompt + output tokens (default: the model's window).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// 0 picks a free port (the address is logged).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The `model` name clients use; default: the repository id as given,
    /// or the model directory's name.
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Data-parallel engine replicas, each with its own KV pool.
    #[arg(long, default_value_t = 1, visible_alias = "data-parallel-size")]
    pub replicas: usize,
    /// program (agentd's program-level scheduler) or request (vLLM-like baseline).
    #[arg(long, default_value = "program")]
    pub scheduler: PolicyKind,
    /// KV blocks per replica (instead of sizing the pool from memory); a
    /// window longer than the pool is then lowered to it with a warning.
    #[arg(long, conflicts_with = "kv_cache_memory")]
    pub num_kv_blocks: Option<usize>,
    /// KV cache memory per replica in bytes (e.g. 2000000000). Default on
    /// the CPU: VLLM_CPU_KVCACHE_SPACE GiB, 4 when unset, as vLLM. A pool
    /// sized from memory must hold one --max-model-len window.
    #[arg(long, visible_alias = "kv-cache-memory-bytes")]
    pub kv_cache_memory: Option<u64>,
    /// Host-memory KV tier per replica in GiB, as vLLM's flag: cached blocks
    /// the pool evicts are copied there and matched back instead of
    /// recomputed (CPU device only for now). Default on the CPU: a quarter
    /// of available memory, at most 8x the pool; 0 turns it off.
    #[arg(long)]
    pub kv_offloading_size: Option<f64>,
    /// Host-tier blocks per replica (instead of --kv-offloading-size).
    #[arg(long, conflicts_with = "kv_offloading_size")]
    pub num_host_kv_blocks: Option<usize>,
    /// Token budget of one engine step (decode tokens + prefill chunks).
    #[arg(long, default_value_t = EngineConfig::default().max_num_batched_tokens)]
    pub max_num_batched_tokens: usize,
    /// Requests that may wait before new ones get 429.
    #[arg(long, default_value_t = EngineConfig::default().max_waiting)]
    pub max_waiting: usize,
    /// Require `Authorization: Bearer KEY` on every route but /health.
    /// Repeat it (or use --api-key-file) for several tenants: each key sees
    /// and acts on only the programs it created.
    #[arg(long)]
    pub api_key: Vec<String>,
    /// A file of API keys, one per line (one tenant each; blank lines and
    /// lines starting with `#` are skipped). Adds to --api-key.
    #[arg(long)]
    pub api_key_file: Option<PathBuf>,
    /// Seconds a client has to send a request head; also how long an idle
    /// keep-alive connection is kept.
    #[arg(long, default_value_t = agentd_server::ConnectionLimits::default().header_read_timeout.as_secs_f64())]
    pub header_read_timeout_s: f64,
    /// Open client connections at most (lowered to fit the fd limit); more
    /// wait in the listen backlog.
    #[arg(long, default_value_t = agentd_server::ConnectionLimits::default().max_connections)]
    pub max_connections: usize,
    /// vLLM's KV-event publishing, same JSON: e.g. `{"enable_kv_cache_events":
    /// true, "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint":
    /// "tcp://*:5558", "topic": "kv", "buffer_steps": 10000}`; replica r uses
    /// the ports + r and publishes as data-parallel rank r.
    #[arg(long)]
    pub kv_events_config: Option<String>,
    /// vLLM's trace export: each request's span (queue, admission, pauses,
    /// restores, end) and each engine step's span, linked, sent over OTLP
    /// (HTTP, protobuf) to this URL, e.g. `http://localhost:4318/v1/traces`.
    #[arg(long, value_name = "URL")]
    pub otlp_traces_endpoint: Option<String>,
    #[command(flatten)]
    pub sched: SchedulerArgs,
    #[command(flatten)]
    pub tools: ToolArgs,
    #[command(flatten)]
    pub vllm: VllmFlags,
}

/// Tool resources (docs/design.md §10): what programs may declare and how it is
/// reclaimed when they end.
#[derive(Args, Debug)]
pub struct ToolArgs {
    /// Root of the local sandbox: declared directories must resolve inside
    /// it, and prepared local environments get their directory there.
    /// Without it, directories are refused.
    #[arg(long)]
    pub sandbox_root: Option<PathBuf>,
    /// On shutdown, reclaim the resources of every program still live.
    #[arg(long)]
    pub reclaim_on_exit: bool,
    /// The Docker Engine API socket.
    #[arg(long, default_value = "/var/run/docker.sock")]
    pub docker_socket: PathBuf,
    /// Also remove a reclaimed container's anonymous volumes.
    #[arg(long)]
    pub docker_remove_volumes: bool,
    /// Keep a reclaimed container's image even when no container uses it.
    #[arg(long)]
    pub docker_keep_images: bool,
    /// Resources reclaimed at once.
    #[arg(long, default_value_t = ReclaimConfig::default().concurrency)]
    pub reclaim_concurrency: usize,
    /// Attempts per resource before it is marked failed.
    #[arg(long, default_value_t = ReclaimConfig::default().max_attempts)]
    pub reclaim_attempts: u32,
    /// Delay before the first retry, milliseconds (doubles each retry).
    #[arg(long, default_value_t = 200)]
    pub reclaim_backoff_ms: u64,
    /// Between SIGTERM and SIGKILL of a declared process group, milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub kill_grace_ms: u64,
    /// Let clients declare pids agentd did not start (`tool_resources.pids`),
    /// to be signalled on release; only the server's uid's processes.
    #[arg(long)]
    pub allow_foreign_pids: bool,
    /// With --allow-foreign-pids, also other users' processes.
    #[arg(long, requires = "allow_foreign_pids")]
    pub allow_foreign_pids_any_uid: bool,
    /// Run local environment setup commands (`POST /programs/{id}/environment`
    /// with `local`): shell commands from clients, the trust boundary
    /// (README, "Tool resources"). As root, needs --sandbox-user.
    #[arg(long)]
    pub allow_environment_commands: bool,
    /// The unprivileged user environment commands run as (a name or UID[:GID]).
    #[arg(long)]
    pub sandbox_user: Option<String>,
    /// Address-space limit of an environment command and its children, MiB
    /// (0: none).
    #[arg(long, default_value_t = 8192)]
    pub environment_memory_mib: u64,
}

impl ToolArgs {
    fn to_config(&self, lease_s: f64) -> Result<ToolsConfig> {
        let user = self
            .sandbox_user
            .as_deref()
            .map(agentd_tools::resolve_user)
            .transpose()?;
        Ok(ToolsConfig {
            sandbox_root: self.sandbox_root.clone(),
            kill_grace: Duration::from_millis(self.kill_grace_ms),
            docker: DockerConfig {
                socket: self.docker_socket.clone(),
                remove_images: !self.docker_keep_images,
                remove_volumes: self.docker_remove_volumes,
                ..DockerConfig::default()
            },
            reclaim: ReclaimConfig {
                concurrency: self.reclaim_concurrency,
                max_attempts: self.reclaim_attempts,
                backoff: Duration::from_millis(self.reclaim_backoff_ms),
                ..ReclaimConfig::default()
            },
            reclaim_on_exit: self.reclaim_on_exit,
            // Programs the engine never ran get the engine's lease.
            orphan_lease: Duration::try_from_secs_f64(lease_s).ok(),
            foreign_pids: ForeignPids {
                allow: self.allow_foreign_pids,
                any_uid: self.allow_foreign_pids_any_uid,
            },
            commands: CommandPolicy {
                allow: self.allow_environment_commands,
                user,
                memory_max: (self.environment_memory_mib > 0)
                    .then(|| self.environment_memory_mib.saturating_mul(1 << 20)),
            },
        })
    }
}

/// The model being served: where its files are, and what clients call it.
struct ServedModel {
    dir: PathBuf,
    tokenizer_dir: PathBuf,
    /// `model` in requests (`--served-model-name`, else the argument).
    name: String,
    /// The argument as given (`/v1/models` `root`).
    root: String,
}

/// Resolves the model argument (repository id, directory, or the default).
fn served_model(args: &ServeArgs) -> Result<ServedModel> {
    let (dir, default_name, root) = match args.model.as_ref().or(args.model_path.as_ref()) {
        Some(arg) => {
            // A download's KV sizing is checked on its config before the
            // weights come (the same plan `run` makes once they are here).
            let check = |dir: &Path| kv_plan(args, dir).map(|_| ()).map_err(|e| format!("{e:#}"));
            let dir = args
                .hub
                .model_dir_checked(arg, args.tokenizer.is_some(), &check)?;
            // A directory is named by its last component (as before); a
            // repository id by itself, as vLLM names it.
            let name = if Path::new(arg).is_dir() {
                dir.canonicalize()
                    .ok()
                    .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
                    .unwrap_or_else(|| arg.clone())
            } else {
                arg.clone()
            };
            let root = if Path::new(arg).is_dir() {
                dir.display().to_string()
            } else {
                arg.clone()
            };
            (dir, name, root)
        }
        None => {
            let dir = default_model()?;
            let root = dir.display().to_string();
            (dir, DEFAULT_MODEL_NAME.to_string(), root)
        }
    };
    let tokenizer_dir = match &args.tokenizer {
        Some(t) => args.hub.tokenizer_dir(t)?,
        None => dir.clone(),
    };
    Ok(ServedModel {
        name: args.served_model_name.clone().unwrap_or(default_name),
        dir,
        tokenizer_dir,
        root,
    })
}

/// Host-tier blocks per replica (`host_tier.rs`), logged with the reason.
fn host_blocks(args: &ServeArgs, kv: &KvPlan) -> Result<usize> {
    let (blocks, why) = super::host_tier::plan(
        &super::host_tier::TierArgs {
            kv_offloading_size: args.kv_offloading_size,
            num_host_kv_blocks: args.num_host_kv_blocks,
            cuda: args.device == "cuda",
            mem_available: super::host_tier::mem_available(),
        },
        kv,
    )?;
    tracing::info!(
        blocks,
        tokens = blocks.saturating_mul(kv.block_size),
        "host KV tier: {why}"
    );
    Ok(blocks)
}

/// Starts the engine; on CUDA a pool sized from device memory gets its
/// block count in `kv` once measured.
fn start_engine(
    args: &ServeArgs,
    model_dir: &Path,
    cfg: EngineConfig,
    kv: &mut KvPlan,
) -> Result<Engine> {
    if args.device == "cuda" {
        let dtype = args.dtype.dtype;
        let paths = super::device::GpuPaths {
            device_sampling: args.device_sampling,
            kernels: agentd_cuda::Kernels {
                fused_prologue: args.fused_prologue,
                single_pass_decode: args.single_pass_decode,
                device_moe: args.device_moe,
            },
            graphs: args.cuda_graphs && !args.vllm.enforce_eager,
        };
        return super::device::start_cuda(model_dir, cfg, dtype, kv, paths);
    }
    let gpu_only = [
        (args.device_sampling, "--device-sampling"),
        (args.fused_prologue, "--fused-prologue"),
        (args.single_pass_decode, "--single-pass-decode"),
        (args.device_moe, "--device-moe"),
        (args.cuda_graphs, "--cuda-graphs"),
    ];
    if let Some((_, flag)) = gpu_only.iter().find(|(on, _)| *on) {
        anyhow::bail!("{flag} needs --device cuda");
    }
    let dtype = args.dtype.dtype;
    tracing::info!(dir = %model_dir.display(), %dtype, "loading model");
    let mut bar = None;
    let model = agentd_models::Model::load_with_progress(model_dir, dtype, |total| {
        let p = Arc::new(agentd_hub::Progress::bytes("Loading weights", total));
        bar = Some(p.clone());
        Some(Arc::new(move |n| p.inc(n)) as agentd_models::loader::LoadProgress)
    })
    .with_context(|| format!("loading the model in {}", model_dir.display()))?;
    if let Some(b) = bar {
        b.finish();
    }
    Engine::with_model(Arc::new(model), cfg)
        .with_context(|| format!("starting the engine on {}", model_dir.display()))
}

/// The KV cache's size for the model in `model_dir` (`kv_size.rs`).
fn kv_plan(args: &ServeArgs, model_dir: &Path) -> Result<KvPlan> {
    super::kv_size::plan(
        &KvArgs {
            num_kv_blocks: args.num_kv_blocks,
            kv_cache_memory: args.kv_cache_memory,
            max_model_len: args.max_model_len,
            block_size: args.sched.block_size,
            cuda: args.device == "cuda",
            gpu_memory_utilization: args.vllm.gpu_memory_utilization(),
            model_dir,
        },
        std::env::var("VLLM_CPU_KVCACHE_SPACE").ok().as_deref(),
    )
}

pub fn run(args: ServeArgs) -> Result<()> {
    args.vllm.check(&args.device)?;
    // The CPU kernel path, checked before any download or load.
    let cpu_kernels = match args.device.as_str() {
        "cuda" => None,
        _ => Some(super::cpu::kernel_path()?),
    };
    let model = served_model(&args)?;
    let mut kv = kv_plan(&args, &model.dir)?;
    let host_blocks = host_blocks(&args, &kv)?;
    let defaults = super::generation::defaults(&args.generation_config, &model.dir)?;
    let cfg = engine_config(&args, &kv, host_blocks)?;
    tracing::info!(?cfg, "starting engine");
    let threads = cfg.threads_each();
    let engine = start_engine(&args, &model.dir, cfg, &mut kv)?;
    super::kv_size::log_capacity(&kv, engine.max_model_len(), args.replicas);
    let mut state = agentd_server::AppState::with_tokenizer(
        engine,
        &model.dir,
        &model.tokenizer_dir,
        model.name.clone(),
        None,
        args.tools.to_config(args.sched.program_lease_s)?,
    )?;
    state.model_root = model.root.clone();
    state.rl.set_model_path(model.root.clone());
    state.sampling_defaults = defaults.params.clone();
    // vLLM's dev-mode routes (/pause, /sleep, /wake_up, ...) behind its switch.
    state.dev_mode =
        agentd_server::routes::vllm_dev::dev_mode_from_env().map_err(anyhow::Error::msg)?;
    if state.dev_mode {
        tracing::warn!("VLLM_SERVER_DEV_MODE: vLLM's development endpoints are served");
    }
    tracing::info!(source = %defaults.source, "default sampling: {}", defaults.summary());
    state.cpu_kernels = cpu_kernels.map(|p| p.to_string());
    state.set_parsers(
        args.tool_call_parser.as_deref(),
        args.reasoning_parser.as_deref(),
    )?;
    tracing::info!(format = %state.output_format, "output parsers");
    state.api_keys = api_keys(&args.api_key, args.api_key_file.as_deref())?;
    state.connections = agentd_server::ConnectionLimits {
        header_read_timeout: Duration::try_from_secs_f64(args.header_read_timeout_s)
            .ok()
            .filter(|d| !d.is_zero())
            .context("--header-read-timeout-s must be a positive number of seconds")?,
        max_connections: args.max_connections.max(1),
    };
    let banner = super::banner::Banner {
        model: &model.root,
        name: &model.name,
        dir: &model.dir,
        config: state.engine.model_config(),
        dtype: args.dtype.dtype,
        device: &args.device,
        replicas: args.replicas,
        threads,
        kv: &kv,
        max_model_len: state.max_model_len,
        host_blocks,
        scheduler: args.scheduler,
        sampling: &defaults,
        keys: state.api_keys.len(),
    }
    .render();
    listen(&args.host, args.port, state, &banner, &model.name)
}

/// The engine's configuration from the flags and the KV plan.
fn engine_config(args: &ServeArgs, kv: &KvPlan, host_blocks: usize) -> Result<EngineConfig> {
    Ok(EngineConfig {
        replicas: args.replicas,
        num_blocks: kv.num_blocks,
        block_size: args.sched.block_size,
        max_num_batched_tokens: args.max_num_batched_tokens,
        max_waiting: args.max_waiting,
        scheduler: args.sched.to_config(args.scheduler),
        max_model_len: args.max_model_len,
        threads_per_replica: args.threads_per_replica,
        kv_events: super::kv_events::sink(
            args.kv_events_config.as_deref(),
            args.replicas,
            args.sched.block_size,
        )?,
        host_blocks,
        ..EngineConfig::default()
    })
}

/// Serves `state` on `host:port` until a shutdown signal, printing the
/// banner with the bound address once listening.
fn listen(
    host: &str,
    port: u16,
    state: agentd_server::AppState,
    banner: &str,
    name: &str,
) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let addr = format!("{host}:{port}");
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr()?;
        eprint!("{}", banner.replace("{address}", &local.to_string()));
        tracing::info!(address = %local, model = %name, "listening on http://{local}");
        agentd_server::serve(listener, Arc::new(state), shutdown_signal()).await?;
        Ok(())
    })
}

/// The keys of `--api-key` and `--api-key-file`, one tenant each.
fn api_keys(flags: &[String], file: Option<&Path>) -> Result<agentd_server::ApiKeys> {
    let mut keys = flags.to_vec();
    if let Some(f) = file {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        keys.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_string),
        );
        anyhow::ensure!(
            keys.len() > flags.len(),
            "--api-key-file {} holds no key",
            f.display()
        );
    }
    let keys = agentd_server::ApiKeys::new(keys);
    if keys.len() > 1 {
        tracing::info!(
            tenants = keys.len(),
            "several API keys: each is a tenant with its own programs"
        );
    }
    Ok(keys)
}

/// Ctrl-C (or SIGTERM on Unix) starts a graceful shutdown.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!("cannot listen for Ctrl-C: {e}");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutdown signal received");
}
