//! `agentd make-model`: a deterministic random-weight Hugging Face directory
//! from a model card in `models/` (no real weights can be downloaded here).

use std::path::PathBuf;

use agentd_models::synth::{write_random_model, ModelCard};
use agentd_runtime::WeightDtype;
use anyhow::{bail, Context, Result};
use clap::Args;

#[derive(Args, Debug)]
pub struct MakeModelArgs {
    /// Model card (e.g. models/qwen3-tiny.json).
    #[arg(long)]
    pub config: PathBuf,
    /// Output directory (created).
    #[arg(long)]
    pub out: PathBuf,
    /// Seed of the weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Override the card's weight dtype (float32, bfloat16, float16).
    #[arg(long)]
    pub dtype: Option<String>,
}

pub fn run(args: MakeModelArgs) -> Result<()> {
    let mut card = ModelCard::from_file(&args.config)
        .with_context(|| format!("reading model card {}", args.config.display()))?;
    if let Some(d) = &args.dtype {
        match WeightDtype::parse(d) {
            Some(dt) => card.config.torch_dtype = dt,
            None => bail!("--dtype {d:?}: expected float32, bfloat16 or float16"),
        }
    }
    tracing::info!(card = %args.config.display(), out = %args.out.display(), seed = args.seed, "writing model");
    write_random_model(
        &card.config,
        &args.out,
        args.seed,
        card.tokenizer_dir.as_deref(),
    )?;
    tracing::info!(out = %args.out.display(), "done");
    Ok(())
}
