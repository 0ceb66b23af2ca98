//! vLLM's token-in `GenerateRequest` and the `SamplingParams` it carries
//! (`vllm/entrypoints/scale_out/token_in_token_out/protocol.py`,
//! `vllm/sampling_params.py`), as agentd reads them. The sampling names are
//! vLLM's own, so they map one to one onto the fields the OpenAI routes take
//! ([`CommonParams`]) and one validation ([`crate::sampling::build`],
//! [`crate::controls::apply`]) checks them all.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value as Json};

use crate::error::ApiError;
use crate::protocol::{CommonParams, StopSpec, StreamOptions};

/// `POST /inference/v1/generate`'s body. Top-level fields vLLM does not
/// define are ignored, as its pydantic model ignores them.
#[derive(Debug, Deserialize)]
pub struct TokensRequest {
    /// Echoed as `generate-tokens-{request_id}` (an `X-Request-Id` header
    /// wins, as in vLLM).
    pub request_id: Option<String>,
    /// Signed so that a negative id gets vLLM's message, not serde's.
    pub token_ids: Vec<i64>,
    pub sampling_params: VllmSampling,
    pub model: Option<String>,
    #[serde(default)]
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub cache_salt: Option<String>,
    #[serde(default)]
    pub priority: i64,
    /// Multimodal features: refused unless null (text models only).
    pub features: Option<Json>,
    /// Disaggregated serving's transfer parameters: refused unless null.
    pub kv_transfer_params: Option<Json>,
    pub ec_transfer_params: Option<Json>,
    #[serde(flatten)]
    pub extra: Map<String, Json>,
}

/// vLLM's `SamplingParams` by its field names. A name vLLM does not define
/// is a 400, as vLLM's constructor refuses unknown keywords.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VllmSampling {
    pub n: Option<u64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Option<StopSpec>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub ignore_eos: Option<bool>,
    pub max_tokens: Option<u64>,
    pub min_tokens: Option<u64>,
    /// Alternatives per generated token (0: the sampled token's only).
    pub logprobs: Option<i64>,
    pub prompt_logprobs: Option<i64>,
    pub truncate_prompt_tokens: Option<i64>,
    pub include_stop_str_in_output: Option<bool>,
    pub logit_bias: Option<BTreeMap<String, f32>>,
    pub allowed_token_ids: Option<Vec<u32>>,
    pub bad_words: Option<Vec<String>>,
    // Text-side settings: this route returns token ids only, so they change
    // nothing but where a stop string is looked for (always the plain text).
    pub detokenize: Option<bool>,
    pub skip_special_tokens: Option<bool>,
    pub spaces_between_special_tokens: Option<bool>,
    pub output_kind: Option<Json>,
    pub flat_logprobs: Option<bool>,
    // Defined by vLLM, not implemented: refused unless null.
    pub structured_outputs: Option<Json>,
    pub guided_decoding: Option<Json>,
    pub logits_processors: Option<Json>,
    pub extra_args: Option<Json>,
    pub thinking_token_budget: Option<Json>,
    pub repetition_detection: Option<Json>,
    pub skip_reading_prefix_cache: Option<bool>,
}

impl TokensRequest {
    /// Checks what vLLM defines and agentd does not serve, and the prompt:
    /// non-empty, no negative id, every id inside a vocabulary of `vocab`.
    pub fn check(&self, vocab: usize) -> Result<Vec<u32>, ApiError> {
        for (field, v) in [
            ("features", &self.features),
            ("kv_transfer_params", &self.kv_transfer_params),
            ("ec_transfer_params", &self.ec_transfer_params),
        ] {
            if v.as_ref().is_some_and(|v| !v.is_null()) {
                return Err(ApiError::invalid(
                    field,
                    format!("`{field}` is not supported by this server"),
                ));
            }
        }
        if self.priority != 0 {
            // vLLM's message when the model does not use priority scheduling.
            return Err(ApiError::invalid(
                "priority",
                "Got priority != 0 but the server does not use priority scheduling.",
            ));
        }
        for k in self.extra.keys() {
            tracing::debug!(field = %k, "ignored /inference/v1/generate field");
        }
        if self.token_ids.is_empty() {
            return Err(ApiError::invalid(
                "token_ids",
                "token_ids: List should have at least 1 item after validation, not 0",
            ));
        }
        self.token_ids
            .iter()
            .map(|&t| {
                if t < 0 {
                    return Err(ApiError::invalid(
                        "token_ids",
                        "token_ids must not contain negative values",
                    ));
                }
                match u32::try_from(t) {
                    Ok(id) if (id as usize) < vocab => Ok(id),
                    _ => Err(ApiError::invalid(
                        "token_ids",
                        format!("token id {t} is outside the vocabulary (size {vocab})"),
                    )),
                }
            })
            .collect()
    }
}

impl VllmSampling {
    /// The OpenAI/vLLM request form the shared validation reads, and the
    /// `logprobs` k (vLLM's -1, the whole vocabulary, is refused: at most
    /// [`crate::sampling::MAX_LOGPROBS`] alternatives are served).
    pub fn to_common(&self, stream: bool) -> Result<(CommonParams, Option<u32>), ApiError> {
        for (field, v) in [
            ("structured_outputs", &self.structured_outputs),
            ("guided_decoding", &self.guided_decoding),
            ("logits_processors", &self.logits_processors),
            ("extra_args", &self.extra_args),
            ("thinking_token_budget", &self.thinking_token_budget),
            ("repetition_detection", &self.repetition_detection),
        ] {
            if v.as_ref().is_some_and(|v| !v.is_null()) {
                return Err(ApiError::invalid(
                    field,
                    format!("sampling_params.{field} is not supported by this server"),
                ));
            }
        }
        if self.spaces_between_special_tokens == Some(false) {
            return Err(ApiError::invalid(
                "spaces_between_special_tokens",
                "spaces_between_special_tokens: false is not supported",
            ));
        }
        let logprobs = match self.logprobs {
            None => None,
            Some(k) if k >= 0 => Some(u32::try_from(k).unwrap_or(u32::MAX)),
            Some(k) => {
                return Err(ApiError::invalid(
                    "logprobs",
                    format!(
                        "logprobs must be between 0 and {} here (vLLM's -1, the whole \
                         vocabulary, is not served), got {k}",
                        crate::sampling::MAX_LOGPROBS
                    ),
                ))
            }
        };
        let common = CommonParams {
            stream,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            max_tokens: self.max_tokens,
            stop: self.stop.clone(),
            seed: self.seed,
            n: self.n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repetition_penalty: self.repetition_penalty,
            ignore_eos: self.ignore_eos,
            stop_token_ids: self.stop_token_ids.clone(),
            logit_bias: self.logit_bias.clone(),
            min_tokens: self.min_tokens,
            bad_words: self.bad_words.clone(),
            allowed_token_ids: self.allowed_token_ids.clone(),
            truncate_prompt_tokens: self.truncate_prompt_tokens,
            include_stop_str_in_output: self.include_stop_str_in_output,
            prompt_logprobs: self.prompt_logprobs,
            ..CommonParams::default()
        };
        Ok((common, logprobs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(json: &str) -> Result<TokensRequest, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn vllm_names_map_onto_the_shared_fields() {
        let r = req(
            r#"{"token_ids":[1,2],"sampling_params":{"max_tokens":8,"temperature":0,
            "top_k":-1,"logprobs":2,"stop":null,"min_tokens":1,"include_stop_str_in_output":true,
            "skip_special_tokens":true},"unknown_top_level":1}"#,
        )
        .unwrap();
        assert_eq!(r.check(10).unwrap(), vec![1, 2]);
        let (c, k) = r.sampling_params.to_common(false).unwrap();
        assert_eq!(
            (c.max_tokens, c.top_k, c.min_tokens, k),
            (Some(8), Some(-1), Some(1), Some(2))
        );
        assert_eq!(c.include_stop_str_in_output, Some(true));
    }

    #[test]
    fn what_vllm_refuses_or_agentd_does_not_serve_is_an_error() {
        assert!(req(r#"{"token_ids":[1],"sampling_params":{"bogus":1}}"#).is_err());
        assert!(
            req(r#"{"token_ids":[1]}"#).is_err(),
            "sampling_params is required"
        );
        let bad_ids = ["[]", "[-1]", "[10]", "[5000000000]"];
        for ids in bad_ids {
            let r = req(&format!(r#"{{"token_ids":{ids},"sampling_params":{{}}}}"#)).unwrap();
            assert!(r.check(10).is_err(), "{ids}");
        }
        let r = req(r#"{"token_ids":[1],"sampling_params":{},"priority":1}"#).unwrap();
        assert!(r.check(10).is_err());
        let r =
            req(r#"{"token_ids":[1],"sampling_params":{},"features":{"mm_hashes":{}}}"#).unwrap();
        assert!(r.check(10).is_err());
        let s: VllmSampling = serde_json::from_str(r#"{"logprobs":-1}"#).unwrap();
        assert!(s.to_common(false).is_err());
        let s: VllmSampling =
            serde_json::from_str(r#"{"structured_outputs":{"regex":"a+"}}"#).unwrap();
        assert!(s.to_common(false).is_err());
    }
}
