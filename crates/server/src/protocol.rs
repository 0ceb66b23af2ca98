//! OpenAI wire types: the request bodies the server accepts and the responses
//! and stream chunks it sends.
//!
//! Requests are lenient in what they ignore (clients send many fields we have
//! no use for) and strict in what they read: a field of the wrong type is a
//! 400 naming the field, never a panic.

use agentd_chat::{ChatDelta, ChatMessage, ToolCall};
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged, expecting = "a string or a list of strings")]
pub enum StopSpec {
    One(String),
    Many(Vec<String>),
}

impl StopSpec {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopSpec::One(s) => vec![s],
            StopSpec::Many(v) => v,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// `extra_body` as clients that do not unpack it send it: only the agentd
/// fields are read.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ExtraBody {
    pub program_id: Option<String>,
    #[serde(rename = "final")]
    pub final_request: Option<bool>,
    /// Tool resources the program declares (docs/design.md §10).
    pub tool_resources: Option<Json>,
    pub group_id: Option<String>,
    pub group_size: Option<u64>,
    pub tool_name: Option<String>,
}

/// NVIDIA Dynamo's `nvext.agent_context`: the session (program) a request
/// belongs to and whether it is the trajectory's last.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct AgentContext {
    pub session_id: Option<String>,
    pub trajectory_id: Option<String>,
    pub trajectory_final: Option<bool>,
}

/// Dynamo's `nvext` request extension; only `agent_context` is read.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NvExt {
    pub agent_context: Option<AgentContext>,
}

/// Fields shared by chat and text completions: sampling, program, streaming.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CommonParams {
    pub model: Option<String>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub stop: Option<StopSpec>,
    pub seed: Option<u64>,
    pub n: Option<u64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    // vLLM extras.
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub ignore_eos: Option<bool>,
    pub stop_token_ids: Option<Vec<u32>>,
    /// OpenAI's `logit_bias`: token id (a string) -> bias in [-100, 100].
    pub logit_bias: Option<BTreeMap<String, f32>>,
    /// Stop strings, stop ids and EOS are held back until this many tokens.
    pub min_tokens: Option<u64>,
    /// Words never generated (with and without a leading space).
    pub bad_words: Option<Vec<String>>,
    /// Only these tokens are sampled.
    pub allowed_token_ids: Option<Vec<u32>>,
    /// Keep only the last k prompt tokens; -1 keeps `max_model_len`.
    pub truncate_prompt_tokens: Option<i64>,
    /// The matched stop string (or stop token's text) stays in the output.
    pub include_stop_str_in_output: Option<bool>,
    /// vLLM's `prompt_logprobs`: alternatives per prompt position (see
    /// [`crate::prompt_logprobs`]).
    pub prompt_logprobs: Option<i64>,
    /// vLLM's `cache_salt`: only requests with the same salt (of the same
    /// tenant) share prefix-cache blocks. A non-empty string.
    pub cache_salt: Option<String>,
    // agentd program fields.
    pub program_id: Option<String>,
    #[serde(rename = "final")]
    pub final_request: Option<bool>,
    pub tool_resources: Option<Json>,
    /// The rollout group the program belongs to (GRPO's n samples of one
    /// prompt): admitted and restored together.
    pub group_id: Option<String>,
    /// Members the group will have: admission waits briefly for them.
    pub group_size: Option<u64>,
    /// The tool the program runs once this request finishes (else taken
    /// from the tool calls the response returns).
    pub tool_name: Option<String>,
    pub extra_body: Option<ExtraBody>,
    pub nvext: Option<NvExt>,
    /// Every field no request type reads: checked by [`crate::fields::check`]
    /// (refused when an API defines it and agentd does not implement it,
    /// else logged and ignored).
    #[serde(flatten)]
    pub extra: Map<String, Json>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatCompletionRequest {
    pub messages: Vec<ChatMessage>,
    pub tools: Option<Vec<Json>>,
    pub tool_choice: Option<Json>,
    /// `text`, `json_object` or `json_schema` (see [`crate::structured`]).
    pub response_format: Option<Json>,
    pub chat_template_kwargs: Option<Map<String, Json>>,
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: Option<bool>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u32>,
    /// `false`: at most one tool call is returned (the model's first).
    pub parallel_tool_calls: Option<bool>,
    /// vLLM's `add_special_tokens` (default false for chat: the template
    /// writes them): the tokenizer's own (a BOS) added to the prompt.
    pub add_special_tokens: Option<bool>,
    #[serde(flatten)]
    pub common: CommonParams,
}

/// `prompt` of a text completion.
#[derive(Debug, Clone, Deserialize)]
#[serde(
    untagged,
    expecting = "a string, a list of strings, a list of token ids or a list of token-id lists"
)]
pub enum PromptSpec {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub prompt: PromptSpec,
    /// Number of top alternatives per token (legacy `logprobs: k`).
    pub logprobs: Option<u32>,
    #[serde(default)]
    pub echo: bool,
    /// vLLM's `return_token_ids`: the choice carries `prompt_token_ids`
    /// (first chunk when streaming) and the generated `token_ids`.
    #[serde(default)]
    pub return_token_ids: bool,
    /// vLLM's `add_special_tokens`: the tokenizer's special tokens (a BOS,
    /// where it defines one) added to text prompts. agentd's default is
    /// false, vLLM's true; they agree for tokenizers that add none (Qwen3's).
    pub add_special_tokens: Option<bool>,
    #[serde(flatten)]
    pub common: CommonParams,
}

#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct UsageInfo {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

impl UsageInfo {
    pub fn new(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Self {
        UsageInfo {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}

/// One alternative in chat `logprobs`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    /// The token's id (SGLang's `[logprob, token_id, text]` triples).
    #[serde(skip)]
    pub id: u32,
}

/// One sampled token in chat `logprobs.content`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
    /// The token's id (SGLang's `[logprob, token_id, text]` triples).
    #[serde(skip)]
    pub id: u32,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatLogprobs {
    pub content: Vec<TokenLogprob>,
}

/// Legacy completions `logprobs`.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<Map<String, Json>>,
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// Appends tokens whose text starts at byte `offset` of the choice text.
    pub fn extend(&mut self, tokens: &[TokenLogprob], mut offset: usize) {
        for t in tokens {
            self.tokens.push(t.token.clone());
            self.token_logprobs.push(t.logprob);
            let top = t
                .top_logprobs
                .iter()
                .map(|a| (a.token.clone(), Json::from(a.logprob)))
                .collect();
            self.top_logprobs.push(top);
            self.text_offset.push(offset);
            offset += t.token.len();
        }
    }
}

/// The assistant message of a non-streamed chat choice.
#[derive(Debug, Clone, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: UsageInfo,
    /// vLLM's `prompt_logprobs`, when asked for (the prompt's, once).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<crate::prompt_logprobs::Rendered>,
}

/// `delta` of a chat stream chunk: the role on the first chunk, then the
/// parser's deltas.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChunkDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(flatten)]
    pub delta: ChatDelta,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChunkDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    /// Present (as `null`) on every chunk when usage was asked for, and set
    /// on the final usage-only chunk, as OpenAI does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<UsageInfo>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
    /// With `return_token_ids`: the prompt's ids (whole response, or the
    /// first stream chunk only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// With `return_token_ids`: the ids generated in this response or chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    /// vLLM's `prompt_logprobs` of the choice's prompt, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<crate::prompt_logprobs::Rendered>,
}

/// A text completion, whole or as one stream chunk (same object, as OpenAI).
#[derive(Debug, Clone, Serialize)]
pub struct CompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<UsageInfo>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    pub root: String,
    pub max_model_len: usize,
    /// What a request that leaves these fields unset samples with: the
    /// model's generation_config.json (`--generation-config auto`) or the
    /// neutral defaults.
    pub sampling_defaults: SamplingDefaults,
    /// The serving weights' version (SGLang's `weight_version`; set by
    /// `/update_weights_from_disk`, `/finish_weight_update`,
    /// `/update_weight_version`), so a trainer can tell which policy a
    /// sample came from.
    pub weight_version: String,
}

/// The default sampling fields vLLM takes from `generation_config.json`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct SamplingDefaults {
    pub temperature: f32,
    pub top_p: f32,
    /// 0: no top-k cut.
    pub top_k: i64,
    pub min_p: f32,
    pub repetition_penalty: f32,
}

impl From<&agentd_runtime::SamplingParams> for SamplingDefaults {
    fn from(p: &agentd_runtime::SamplingParams) -> Self {
        SamplingDefaults {
            temperature: p.temperature,
            top_p: p.top_p,
            top_k: p.top_k,
            min_p: p.min_p,
            repetition_penalty: p.repetition_penalty,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ReleaseRequest {
    pub program_id: String,
}

/// Seconds since the Unix epoch (OpenAI's `created`).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_request_reads_common_fields_through_flatten() {
        let req: ChatCompletionRequest = serde_json::from_str(
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stop":"x",
                "max_tokens":3,"temperature":0,"top_k":-1,"extra_body":{"program_id":"p"},
                "final":true,"unknown_field":1}"#,
        )
        .unwrap();
        assert_eq!(req.common.max_tokens, Some(3));
        assert_eq!(req.common.temperature, Some(0.0));
        assert_eq!(req.common.top_k, Some(-1));
        assert_eq!(req.common.final_request, Some(true));
        assert_eq!(
            req.common.extra_body.unwrap().program_id.as_deref(),
            Some("p")
        );
        assert!(matches!(req.common.stop, Some(StopSpec::One(_))));
        // Only the fields nothing read are left for the unknown-field check.
        let keys: Vec<&String> = req.common.extra.keys().collect();
        assert_eq!(keys, ["unknown_field"]);
    }

    #[test]
    fn prompt_shapes() {
        let p: CompletionRequest = serde_json::from_str(r#"{"prompt":[1,2,3]}"#).unwrap();
        assert!(matches!(p.prompt, PromptSpec::Tokens(ref t) if t == &[1, 2, 3]));
        let p: CompletionRequest = serde_json::from_str(r#"{"prompt":["a"]}"#).unwrap();
        assert!(matches!(p.prompt, PromptSpec::Texts(_)));
        assert!(serde_json::from_str::<CompletionRequest>(r#"{"prompt":{}}"#).is_err());
    }

    #[test]
    fn usage_chunk_shape() {
        let c = CompletionResponse {
            id: "x".into(),
            object: "text_completion",
            created: 0,
            model: "m".into(),
            choices: vec![],
            usage: Some(None),
        };
        let v = serde_json::to_value(&c).unwrap();
        assert!(v.get("usage").unwrap().is_null());
        let u = UsageInfo::new(5, 2, 3);
        let v = serde_json::to_value(u).unwrap();
        assert_eq!(v["total_tokens"], 7);
        assert_eq!(v["prompt_tokens_details"]["cached_tokens"], 3);
    }
}
