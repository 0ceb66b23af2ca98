//! SGLang's `GenerateReqInput` and `SamplingParams`
//! (`python/sglang/srt/managers/io_struct.py`,
//! `python/sglang/srt/sampling/sampling_params.py`) as agentd reads them.
//! SGLang's sampling names map onto the OpenAI/vLLM fields the other
//! routes take ([`CommonParams`]), so one validation
//! ([`crate::sampling::build`], [`crate::controls::apply`]) checks them all.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value as Json};

use crate::error::ApiError;
use crate::protocol::{CommonParams, StopSpec};

/// SGLang's `max_new_tokens` default.
pub const DEFAULT_MAX_NEW_TOKENS: u64 = 128;

/// A field given once for the whole batch or once per prompt.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

impl<T: Clone> OneOrMany<T> {
    /// The value for prompt `i` of `n`; a list must have `n` entries.
    pub fn get(&self, i: usize, n: usize, field: &'static str) -> Result<T, ApiError> {
        match self {
            OneOrMany::One(v) => Ok(v.clone()),
            OneOrMany::Many(v) if v.len() == n => Ok(v[i].clone()),
            OneOrMany::Many(v) => Err(ApiError::invalid(
                field,
                format!("{field} has {} entries for {n} prompts", v.len()),
            )),
        }
    }
}

/// `input_ids`: one prompt or a batch.
#[derive(Debug, Clone, Deserialize)]
#[serde(
    untagged,
    expecting = "a list of token ids or a list of token-id lists"
)]
pub enum IdsSpec {
    One(Vec<u32>),
    Many(Vec<Vec<u32>>),
}

/// `POST /generate`'s body.
#[derive(Debug, Deserialize)]
pub struct GenerateBody {
    pub text: Option<OneOrMany<String>>,
    pub input_ids: Option<IdsSpec>,
    /// One `SamplingParams` dict, or one per prompt ([`GenerateBody::sampling`]).
    pub sampling_params: Option<Json>,
    pub rid: Option<OneOrMany<String>>,
    pub return_logprob: Option<OneOrMany<bool>>,
    pub logprob_start_len: Option<OneOrMany<i64>>,
    pub top_logprobs_num: Option<OneOrMany<u32>>,
    #[serde(default)]
    pub return_text_in_logprobs: bool,
    #[serde(default)]
    pub stream: bool,
    /// agentd's program id (the session headers name it too).
    pub program_id: Option<String>,
    /// SGLang's stable session identity: the program.
    pub session_id: Option<String>,
    /// SGLang's cache namespace (`cache_salt`).
    pub extra_key: Option<String>,
    /// Everything else: refused when SGLang gives it a meaning agentd does
    /// not implement ([`GenerateBody::check_unsupported`]), else ignored.
    #[serde(flatten)]
    pub extra: Map<String, Json>,
}

/// Top-level `GenerateReqInput` fields that change the output and that
/// agentd does not implement: refused unless null, false or empty.
const UNSUPPORTED: &[&str] = &[
    "input_embeds",
    "image_data",
    "video_data",
    "audio_data",
    "lora_path",
    "lora_id",
    "session_params",
    "custom_logit_processor",
    "token_ids_logprob",
    "return_hidden_states",
    "return_routed_experts",
    "return_entropy",
    "positional_embed_overrides",
];

fn asks_nothing(v: &Json) -> bool {
    match v {
        Json::Null | Json::Bool(false) => true,
        Json::Array(a) => a.iter().all(asks_nothing),
        Json::String(s) => s.is_empty(),
        _ => false,
    }
}

impl GenerateBody {
    /// `sampling_params`, each dict read with an error naming what is wrong.
    pub fn sampling(&self) -> Result<OneOrMany<SglSampling>, ApiError> {
        let one = |v: &Json| {
            SglSampling::deserialize(v)
                .map_err(|e| ApiError::invalid("sampling_params", format!("sampling_params: {e}")))
        };
        match &self.sampling_params {
            None | Some(Json::Null) => Ok(OneOrMany::One(SglSampling::default())),
            Some(Json::Array(list)) => Ok(OneOrMany::Many(
                list.iter().map(one).collect::<Result<_, _>>()?,
            )),
            Some(v) => Ok(OneOrMany::One(one(v)?)),
        }
    }

    pub fn check_unsupported(&self) -> Result<(), ApiError> {
        for (k, v) in &self.extra {
            if UNSUPPORTED.contains(&k.as_str()) {
                if !asks_nothing(v) {
                    return Err(ApiError::InvalidParam {
                        param: None,
                        message: format!("`{k}` is not supported by this server"),
                    });
                }
            } else {
                tracing::debug!(field = %k, "ignored /generate field");
            }
        }
        if let Some(starts) = &self.logprob_start_len {
            let all = match starts {
                OneOrMany::One(v) => vec![*v],
                OneOrMany::Many(v) => v.clone(),
            };
            if all.iter().any(|&s| s < -1) {
                return Err(ApiError::invalid(
                    "logprob_start_len",
                    "logprob_start_len must be -1 (the last prompt token) or a prompt position",
                ));
            }
        }
        Ok(())
    }
}

/// SGLang's `SamplingParams`, by its names.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SglSampling {
    pub max_new_tokens: Option<u64>,
    pub min_new_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub stop: Option<StopSpec>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub ignore_eos: Option<bool>,
    pub skip_special_tokens: Option<bool>,
    pub spaces_between_special_tokens: Option<bool>,
    pub no_stop_trim: Option<bool>,
    pub n: Option<u64>,
    pub sampling_seed: Option<u64>,
    pub logit_bias: Option<BTreeMap<String, f32>>,
    pub json_schema: Option<Json>,
    pub regex: Option<Json>,
    pub ebnf: Option<Json>,
    pub structural_tag: Option<Json>,
    /// Read by custom logit processors only (refused): ignored.
    pub custom_params: Option<Json>,
    /// How often SGLang streams; every token is streamed here.
    pub stream_interval: Option<u64>,
    #[serde(flatten)]
    pub extra: Map<String, Json>,
}

impl SglSampling {
    /// The OpenAI/vLLM form, for a prompt of `prompt_len` tokens in a
    /// window of `max_model_len`. `max_new_tokens` (default 128) is capped
    /// by the room the window leaves, as SGLang's scheduler does.
    pub fn to_common(
        &self,
        prompt_len: usize,
        max_model_len: usize,
    ) -> Result<CommonParams, ApiError> {
        if let Some(k) = self.extra.keys().next() {
            return Err(ApiError::InvalidParam {
                param: None,
                message: format!("sampling_params has an unknown field `{k}`"),
            });
        }
        for (field, v) in [
            ("json_schema", &self.json_schema),
            ("regex", &self.regex),
            ("ebnf", &self.ebnf),
            ("structural_tag", &self.structural_tag),
        ] {
            if v.as_ref().is_some_and(|v| !v.is_null()) {
                return Err(ApiError::invalid(
                    field,
                    format!("sampling_params.{field} is not supported; use /v1/chat/completions with response_format"),
                ));
            }
        }
        if self.spaces_between_special_tokens == Some(false) {
            return Err(ApiError::invalid(
                "spaces_between_special_tokens",
                "spaces_between_special_tokens: false is not supported",
            ));
        }
        let room = max_model_len.saturating_sub(prompt_len) as u64;
        let max_new = self.max_new_tokens.unwrap_or(DEFAULT_MAX_NEW_TOKENS);
        Ok(CommonParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            max_tokens: Some(if room > 0 { max_new.min(room) } else { max_new }),
            stop: self.stop.clone(),
            seed: self.sampling_seed,
            n: self.n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repetition_penalty: self.repetition_penalty,
            ignore_eos: self.ignore_eos,
            stop_token_ids: self.stop_token_ids.clone(),
            logit_bias: self.logit_bias.clone(),
            min_tokens: self.min_new_tokens,
            include_stop_str_in_output: self.no_stop_trim,
            ..CommonParams::default()
        })
    }
}

/// A refusal of the shared validation, renamed to SGLang's field.
pub fn sglang_names(e: ApiError) -> ApiError {
    match e {
        ApiError::InvalidParam {
            param: Some(p),
            message,
        } => {
            let param = match p {
                "max_tokens" => "max_new_tokens",
                "min_tokens" => "min_new_tokens",
                "seed" => "sampling_seed",
                "include_stop_str_in_output" => "no_stop_trim",
                other => other,
            };
            ApiError::InvalidParam {
                param: Some(param),
                message: message.replace(p, param),
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sglang_names_map_onto_the_shared_fields() {
        let s: SglSampling = serde_json::from_str(
            r#"{"max_new_tokens":8,"temperature":0,"stop":["x"],"no_stop_trim":true,"sampling_seed":3,"min_new_tokens":2}"#,
        )
        .unwrap();
        let c = s.to_common(10, 100).unwrap();
        assert_eq!(c.max_tokens, Some(8));
        assert_eq!(c.seed, Some(3));
        assert_eq!(c.min_tokens, Some(2));
        assert_eq!(c.include_stop_str_in_output, Some(true));
        // The default and an oversized value are capped by the window.
        let c = SglSampling::default().to_common(90, 100).unwrap();
        assert_eq!(c.max_tokens, Some(10));
        let s: SglSampling = serde_json::from_str(r#"{"max_new_tokens":1000}"#).unwrap();
        assert_eq!(s.to_common(10, 100).unwrap().max_tokens, Some(90));
        let s: SglSampling = serde_json::from_str(r#"{"bogus":1}"#).unwrap();
        assert!(s.to_common(1, 100).is_err());
        let s: SglSampling = serde_json::from_str(r#"{"regex":"a+"}"#).unwrap();
        assert!(s.to_common(1, 100).is_err());
    }

    #[test]
    fn unsupported_fields_are_refused_unless_they_ask_nothing() {
        let b: GenerateBody =
            serde_json::from_str(r#"{"text":"a","image_data":null,"lora_path":[null]}"#).unwrap();
        assert!(b.check_unsupported().is_ok());
        let b: GenerateBody = serde_json::from_str(r#"{"text":"a","image_data":"x.png"}"#).unwrap();
        assert!(b.check_unsupported().is_err());
        let b: GenerateBody =
            serde_json::from_str(r#"{"text":"a","logprob_start_len":0}"#).unwrap();
        assert!(b.check_unsupported().is_ok());
        let b: GenerateBody =
            serde_json::from_str(r#"{"text":"a","logprob_start_len":[0,-2]}"#).unwrap();
        assert!(b.check_unsupported().is_err());
    }
}
