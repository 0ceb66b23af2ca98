//! vLLM's `POST /tokenize` and `POST /detokenize` (RL trainers tokenize
//! through the server so their token ids match the engine's exactly).
//!
//! Bodies and responses as vLLM's `vllm/entrypoints/serve/tokenize/protocol.py`:
//! a tokenize body is either a completion (`prompt`, `add_special_tokens`
//! default true) or a chat (`messages` rendered by the model's chat template,
//! `add_generation_prompt` default true, `continue_final_message`,
//! `chat_template_kwargs`, `tools`; `add_special_tokens` default false); both
//! answer `{count, max_model_len, tokens, token_strs}` (`token_strs` is
//! `null` unless `return_token_strs`). Detokenize takes `{tokens}` and
//! answers `{prompt}`, special tokens kept (vLLM decodes without skipping).

use agentd_chat::ChatMessage;
use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::app::{parse_json, SharedState};
use crate::chat_prompt::{self, ChatInput};
use crate::error::ApiError;

#[derive(Debug, Deserialize)]
struct CompletionForm {
    model: Option<String>,
    prompt: String,
    #[serde(default = "yes")]
    add_special_tokens: bool,
    #[serde(default)]
    return_token_strs: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct ChatForm {
    model: Option<String>,
    messages: Vec<ChatMessage>,
    #[serde(default = "yes")]
    add_generation_prompt: bool,
    #[serde(default)]
    continue_final_message: bool,
    #[serde(default)]
    add_special_tokens: bool,
    #[serde(default)]
    return_token_strs: Option<bool>,
    chat_template: Option<String>,
    chat_template_kwargs: Option<Map<String, Value>>,
    tools: Option<Vec<Value>>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Serialize)]
pub struct TokenizeResponse {
    pub count: usize,
    pub max_model_len: usize,
    pub tokens: Vec<u32>,
    pub token_strs: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
struct DetokenizeRequest {
    model: Option<String>,
    tokens: Vec<u32>,
}

#[derive(Debug, Serialize)]
pub struct DetokenizeResponse {
    pub prompt: String,
}

/// The tokens of a tokenize body, and whether it asked for their strings.
fn tokenize_body(state: &SharedState, body: &Bytes) -> Result<(Vec<u32>, bool), ApiError> {
    let v: Value = parse_json(body)?;
    // vLLM's request is a union tried in order: a completion (`prompt`),
    // then a chat (`messages`).
    if v.get("prompt").is_some() {
        let req: CompletionForm = parse_json(body)?;
        state.check_model(req.model.as_deref())?;
        let tokens = state
            .tokenizer
            .encode(&req.prompt, req.add_special_tokens)?;
        return Ok((tokens, req.return_token_strs.unwrap_or(false)));
    }
    if v.get("messages").is_none() {
        return Err(ApiError::BadJson(
            "invalid request body: a tokenize request needs `prompt` or `messages`".into(),
        ));
    }
    let req: ChatForm = parse_json(body)?;
    state.check_model(req.model.as_deref())?;
    if req.continue_final_message && req.add_generation_prompt {
        return Err(ApiError::invalid(
            "continue_final_message",
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
        ));
    }
    if req.chat_template.is_some() {
        return Err(ApiError::invalid(
            "chat_template",
            "a request's own chat_template is not supported; the model's template is used",
        ));
    }
    let input = ChatInput {
        messages: &req.messages,
        tools: req.tools.as_deref(),
        tool_choice: None,
        chat_template_kwargs: req.chat_template_kwargs.clone().unwrap_or_default(),
        add_generation_prompt: Some(req.add_generation_prompt),
        continue_final_message: req.continue_final_message,
        add_special_tokens: req.add_special_tokens,
    };
    let (text, _) = chat_prompt::render_text(state, &input)?;
    let tokens = state.tokenizer.encode(&text, req.add_special_tokens)?;
    Ok((tokens, req.return_token_strs.unwrap_or(false)))
}

pub async fn tokenize(
    State(state): State<SharedState>,
    body: Bytes,
) -> Result<Json<TokenizeResponse>, ApiError> {
    // Rendering and tokenizing a long conversation is CPU work: off the runtime.
    let st = state.clone();
    let response = crate::offload::run(move || {
        let (tokens, strs) = tokenize_body(&st, &body)?;
        let token_strs = strs.then(|| {
            tokens
                .iter()
                .map(|&t| st.tokenizer.id_to_token(t).unwrap_or_default())
                .collect()
        });
        Ok(TokenizeResponse {
            count: tokens.len(),
            max_model_len: st.max_model_len,
            tokens,
            token_strs,
        })
    })
    .await?;
    Ok(Json(response))
}

pub async fn detokenize(
    State(state): State<SharedState>,
    body: Bytes,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let req: DetokenizeRequest = parse_json(&body)?;
    state.check_model(req.model.as_deref())?;
    let vocab = state.engine.model_config().vocab_size;
    if let Some(bad) = req.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid(
            "tokens",
            format!("token id {bad} is outside the vocabulary (size {vocab})"),
        ));
    }
    let st = state.clone();
    let prompt = crate::offload::run(move || Ok(st.tokenizer.decode(&req.tokens, false)?)).await?;
    Ok(Json(DetokenizeResponse { prompt }))
}
