//! `agentd generate`: offline generation through the runtime and a paged KV
//! cache (block ids allocated trivially here; the engine uses agentd-kv).

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use agentd_models::Model;
use agentd_runtime::{
    BatchBuilder, FinishReason, IncrementalDecoder, LogitsFor, SamplingParams, SequenceSampler,
    Tokenizer,
};
use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// Hugging Face repository id (`owner/name`) or model directory.
    #[arg(long)]
    pub model: String,
    #[command(flatten)]
    pub hub: super::model_arg::HubArgs,
    /// Tokenizer from another repository id or directory (default: the model's).
    #[arg(long)]
    pub tokenizer: Option<String>,
    /// Prompt text (needs tokenizer.json in the model directory).
    #[arg(
        long,
        conflicts_with = "prompt_ids",
        required_unless_present = "prompt_ids"
    )]
    pub prompt: Option<String>,
    /// Prompt as comma-separated token ids.
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    #[arg(long, default_value_t = 16)]
    pub max_tokens: usize,
    /// 0 = greedy. Unset: the generation config's, else 0.
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Unset: the generation config's, else 1.
    #[arg(long)]
    pub top_p: Option<f32>,
    /// 0 or -1 = disabled. Unset: the generation config's, else 0.
    #[arg(long, allow_negative_numbers = true)]
    pub top_k: Option<i64>,
    /// Unset: the generation config's, else 0.
    #[arg(long)]
    pub min_p: Option<f32>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Unset: the generation config's, else 1.
    #[arg(long)]
    pub repetition_penalty: Option<f32>,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Extra stop token ids, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub stop_token_ids: Vec<u32>,
    /// Report logprobs with this many top alternatives per token.
    #[arg(long)]
    pub top_logprobs: Option<usize>,
    /// Keep generating past EOS.
    #[arg(long)]
    pub ignore_eos: bool,
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Prefill at most this many prompt tokens per step (chunked prefill).
    #[arg(long, default_value_t = 512)]
    pub prefill_chunk: usize,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// The defaults of the sampling flags left unset, as `serve`'s flag:
    /// `auto` takes temperature, top_p, top_k, min_p and
    /// repetition_penalty from the model's generation_config.json, a
    /// directory that directory's; `vllm`, or a model that sets none,
    /// leaves this command's own (greedy).
    #[arg(long, default_value = "auto")]
    pub generation_config: String,
    #[command(flatten)]
    pub dtype: super::dtype::DtypeArg,
}

#[derive(Serialize)]
struct TokenLogprob {
    token_id: u32,
    logprob: f32,
    top: Vec<(u32, f32)>,
}

#[derive(Serialize)]
struct Output {
    token_ids: Vec<u32>,
    text: String,
    finish_reason: &'static str,
    prompt_tokens: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<Vec<TokenLogprob>>,
}

/// The sampling of this run: each flag given, else the generation
/// config's default (`--generation-config`), else greedy.
fn sampling(args: &GenerateArgs, dir: &std::path::Path) -> Result<SamplingParams> {
    let d = super::generation::defaults(&args.generation_config, dir)?;
    let base = if d.set_by_model {
        tracing::info!(source = %d.source, "default sampling: {}", d.summary());
        d.params
    } else {
        SamplingParams::greedy()
    };
    Ok(SamplingParams {
        temperature: args.temperature.unwrap_or(base.temperature),
        top_k: args.top_k.unwrap_or(base.top_k),
        top_p: args.top_p.unwrap_or(base.top_p),
        min_p: args.min_p.unwrap_or(base.min_p),
        seed: args.seed,
        repetition_penalty: args.repetition_penalty.unwrap_or(base.repetition_penalty),
        presence_penalty: args.presence_penalty,
        frequency_penalty: args.frequency_penalty,
        stop_token_ids: args.stop_token_ids.clone(),
        ignore_eos: args.ignore_eos,
        max_tokens: args.max_tokens,
        logprobs: args.top_logprobs,
        ..SamplingParams::default()
    })
}

pub fn run(args: GenerateArgs) -> Result<()> {
    if args.block_size == 0 || args.prefill_chunk == 0 {
        bail!("--block-size and --prefill-chunk must be positive");
    }
    let (dir, model, tokenizer) = load(&args)?;
    let prompt: Vec<u32> = match (&args.prompt, &args.prompt_ids, &tokenizer) {
        (Some(text), _, Some(tok)) => tok.encode(text, false)?,
        (_, Some(ids), _) => ids.clone(),
        _ => bail!("give --prompt or --prompt-ids"),
    };
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    let sampler = SequenceSampler::new(sampling(&args, &dir)?, &prompt)?;
    let mut text = Text {
        tokenizer,
        decoder: IncrementalDecoder::new(true),
        text: String::new(),
        echo: !args.json,
    };
    let out = generate(&model, &mut text, &prompt, sampler, &args)?;
    if args.json {
        println!("{}", serde_json::to_string(&out)?);
    } else {
        println!();
    }
    Ok(())
}

/// The model directory, the model and its tokenizer (`None` when it has
/// none and the prompt is token ids).
fn load(args: &GenerateArgs) -> Result<(PathBuf, Model, Option<Tokenizer>)> {
    let t0 = Instant::now();
    let dtype = args.dtype.dtype;
    let dir = args.hub.model_dir(&args.model, args.tokenizer.is_some())?;
    let tok_dir = match &args.tokenizer {
        Some(t) => args.hub.tokenizer_dir(t)?,
        None => dir.clone(),
    };
    tracing::info!(model = %dir.display(), %dtype, "loading model");
    let model = Model::load_as(&dir, dtype)
        .with_context(|| format!("loading model from {}", dir.display()))?;
    let cfg = model.config();
    tracing::info!(
        layers = cfg.num_hidden_layers,
        hidden = cfg.hidden_size,
        vocab = cfg.vocab_size,
        secs = t0.elapsed().as_secs_f32(),
        "model loaded"
    );
    let tokenizer = match Tokenizer::from_dir(&tok_dir) {
        Ok(t) => Some(t),
        Err(e) if args.prompt.is_some() => return Err(e.into()),
        Err(e) => {
            tracing::warn!("no tokenizer, output text will be empty: {e}");
            None
        }
    };
    Ok((dir, model, tokenizer))
}

/// The generated text, detokenized as it comes and echoed to stdout
/// unless `--json`.
struct Text {
    tokenizer: Option<Tokenizer>,
    decoder: IncrementalDecoder,
    text: String,
    echo: bool,
}

impl Text {
    fn push(&mut self, token: u32) -> Result<()> {
        let Some(tok) = &self.tokenizer else {
            return Ok(());
        };
        let piece = self.decoder.push(tok, token)?;
        self.add(piece)
    }

    fn finish(&mut self) -> Result<()> {
        let Some(tok) = &self.tokenizer else {
            return Ok(());
        };
        let piece = self.decoder.flush(tok)?;
        self.add(piece)
    }

    fn add(&mut self, piece: Option<String>) -> Result<()> {
        let Some(piece) = piece else { return Ok(()) };
        if self.echo {
            let mut stdout = std::io::stdout();
            write!(stdout, "{piece}")?;
            stdout.flush()?;
        }
        self.text.push_str(&piece);
        Ok(())
    }
}

/// Prefills `prompt` in chunks of `--prefill-chunk`, then decodes until a
/// stop, `--max-tokens` or the model's window.
fn generate(
    model: &Model,
    text: &mut Text,
    prompt: &[u32],
    mut sampler: SequenceSampler,
    args: &GenerateArgs,
) -> Result<Output> {
    let cfg = model.config();
    // Enough blocks for the whole context; ids simply 0..n.
    let bs = args.block_size;
    let max_ctx =
        (prompt.len() + args.max_tokens).min(cfg.max_position_embeddings.max(prompt.len()));
    let num_blocks = max_ctx.div_ceil(bs).max(1);
    let mut cache = model.new_cache(num_blocks, bs)?;
    let table: Vec<u32> = (0..num_blocks as u32).collect();
    let mut tokens = prompt.to_vec();
    let mut cached = 0;
    let (mut out_ids, mut logprobs) = (Vec::new(), Vec::new());
    let mut finish = FinishReason::Length;
    let t_prefill = Instant::now();
    let mut t_decode = None;
    while sampler.num_generated() < args.max_tokens {
        let pending = tokens.len() - cached;
        let n = pending.min(args.prefill_chunk);
        let last = n == pending;
        let lf = if last {
            LogitsFor::Last
        } else {
            LogitsFor::None
        };
        let mut b = BatchBuilder::new(bs);
        b.push(&tokens[cached..cached + n], cached, &table, lf);
        let logits = model.forward(&b.build(), &mut cache)?;
        cached += n;
        if !last {
            continue;
        }
        if t_decode.is_none() {
            let secs = t_prefill.elapsed().as_secs_f32();
            tracing::info!(prompt_tokens = prompt.len(), secs, "prefill done");
            t_decode = Some(Instant::now());
        }
        let row: Vec<f32> = logits.squeeze(0)?.to_vec1()?;
        let s = sampler.sample(&row, &cfg.eos_token_ids)?;
        out_ids.push(s.token_id);
        if let Some(lp) = s.logprob {
            let (token_id, top) = (s.token_id, s.top);
            logprobs.push(TokenLogprob {
                token_id,
                logprob: lp,
                top,
            });
        }
        text.push(s.token_id)?;
        tokens.push(s.token_id);
        if let Some(r) = sampler.finish_reason(s.token_id, &cfg.eos_token_ids) {
            finish = r;
            break;
        }
        if tokens.len() >= cfg.max_position_embeddings {
            tracing::warn!("reached max_position_embeddings");
            break;
        }
    }
    text.finish()?;
    if let Some(t) = t_decode {
        let secs = t.elapsed().as_secs_f32();
        let tok_per_s = out_ids.len().saturating_sub(1) as f32 / secs.max(1e-9);
        tracing::info!(tokens = out_ids.len(), secs, tok_per_s, "decode done");
    }
    Ok(Output {
        token_ids: out_ids,
        text: std::mem::take(&mut text.text),
        finish_reason: finish.as_openai(),
        prompt_tokens: prompt.len(),
        logprobs: args.top_logprobs.map(|_| logprobs),
    })
}
