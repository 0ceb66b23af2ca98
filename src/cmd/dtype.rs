//! `--dtype`, the weight dtype of `serve`, `generate` and `bench-model`:
//! one flag, parsed here for the three of them, with vLLM's names and
//! meaning (`auto`: the checkpoint's stored dtype).

use agentd_models::LoadDtype;
use clap::Args;

#[derive(Args, Debug, Clone, Copy)]
pub struct DtypeArg {
    /// Weight dtype (vLLM's names). `auto` keeps the checkpoint's stored
    /// dtype: on the CPU bf16 and f16 matrices stay 16-bit in memory (the
    /// products widen them exactly and accumulate in f32); `float32` widens
    /// every matrix at load; `bfloat16` / `float16` cast them at load. Norms
    /// and biases are f32 whatever it says. On CUDA, `auto` is the
    /// checkpoint's 16-bit dtype (bfloat16 for an f32 checkpoint).
    #[arg(long, default_value = "auto", value_parser = parse_dtype)]
    pub dtype: LoadDtype,
}

fn parse_dtype(s: &str) -> Result<LoadDtype, String> {
    LoadDtype::parse(s).ok_or_else(|| {
        format!(
            "unknown dtype {s:?}; valid: {}",
            LoadDtype::NAMES.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentd_runtime::WeightDtype;

    #[test]
    fn vllm_names() {
        assert_eq!(parse_dtype("auto"), Ok(LoadDtype::Auto));
        assert_eq!(parse_dtype("half"), Ok(LoadDtype::Cast(WeightDtype::F16)));
        assert_eq!(parse_dtype("float"), Ok(LoadDtype::Cast(WeightDtype::F32)));
        assert_eq!(
            parse_dtype("bfloat16"),
            Ok(LoadDtype::Cast(WeightDtype::Bf16))
        );
        let err = parse_dtype("int8").unwrap_err();
        assert!(err.contains("int8") && err.contains("float16"), "{err}");
    }
}
