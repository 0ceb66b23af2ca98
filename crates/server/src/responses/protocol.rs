//! Wire types of OpenAI's Responses API: the `POST /v1/responses` body and
//! the response object (also the payload of the lifecycle stream events).
//!
//! Input items stay loosely typed (`serde_json::Value`) and are checked one
//! by one in [`super::input`], so that a bad item is a 400 naming its index
//! rather than a generic "did not match any variant".

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

use crate::protocol::CommonParams;

/// `input`: a string (one user message) or a list of items.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged, expecting = "a string or a list of input items")]
pub enum InputSpec {
    Text(String),
    Items(Vec<Json>),
}

/// `POST /v1/responses`. Sampling, `stream`, `program_id` and `extra_body`
/// come through [`CommonParams`] as on the chat route.
#[derive(Debug, Clone, Deserialize)]
pub struct ResponsesRequest {
    pub input: Option<InputSpec>,
    pub instructions: Option<String>,
    /// Responses-shaped function tools (`{"type": "function", "name", ...}`).
    pub tools: Option<Vec<Json>>,
    pub tool_choice: Option<Json>,
    pub max_output_tokens: Option<u64>,
    /// OpenAI's default is to store.
    pub store: Option<bool>,
    pub previous_response_id: Option<String>,
    /// Run detached; the result is fetched with `GET /v1/responses/{id}`.
    #[serde(default)]
    pub background: bool,
    pub parallel_tool_calls: Option<bool>,
    pub metadata: Option<Map<String, Json>>,
    pub text: Option<Json>,
    pub reasoning: Option<Json>,
    pub user: Option<String>,
    /// vLLM's extension, as on the chat route (`enable_thinking`, ...).
    pub chat_template_kwargs: Option<Map<String, Json>>,
    #[serde(flatten)]
    pub common: CommonParams,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct InputTokensDetails {
    pub cached_tokens: usize,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: usize,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ResponseUsage {
    pub input_tokens: usize,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: usize,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: usize,
}

impl From<crate::protocol::UsageInfo> for ResponseUsage {
    fn from(u: crate::protocol::UsageInfo) -> Self {
        ResponseUsage {
            input_tokens: u.prompt_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: u.prompt_tokens_details.cached_tokens,
            },
            output_tokens: u.completion_tokens,
            output_tokens_details: OutputTokensDetails::default(),
            total_tokens: u.total_tokens,
        }
    }
}

/// Lifecycle of a response (OpenAI's `status`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Queued,
    InProgress,
    Completed,
    Incomplete,
    Cancelled,
    Failed,
}

impl Status {
    pub fn is_final(self) -> bool {
        !matches!(self, Status::Queued | Status::InProgress)
    }
}

/// The response object (`"object": "response"`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ResponseObject {
    pub id: String,
    pub object: String,
    pub created_at: u64,
    pub status: Status,
    pub error: Option<Json>,
    pub incomplete_details: Option<Json>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u64>,
    pub model: String,
    pub output: Vec<Json>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub reasoning: Json,
    pub store: bool,
    pub background: bool,
    pub temperature: Option<f32>,
    pub text: Json,
    pub tool_choice: Json,
    pub tools: Vec<Json>,
    pub top_p: Option<f32>,
    pub truncation: String,
    pub usage: Option<ResponseUsage>,
    pub user: Option<String>,
    pub metadata: Map<String, Json>,
    /// agentd: the program (KV) this response's chain runs in.
    pub program_id: String,
}

impl ResponseObject {
    /// The object as it stands before generation: no output, no usage.
    pub fn started(id: String, model: String, req: &ResponsesRequest, program: String) -> Self {
        ResponseObject {
            id,
            object: "response".into(),
            created_at: crate::protocol::unix_now(),
            status: if req.background {
                Status::Queued
            } else {
                Status::InProgress
            },
            error: None,
            incomplete_details: None,
            instructions: req.instructions.clone(),
            max_output_tokens: req.max_output_tokens,
            model,
            output: Vec::new(),
            parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
            previous_response_id: req.previous_response_id.clone(),
            reasoning: req
                .reasoning
                .clone()
                .unwrap_or_else(|| serde_json::json!({"effort": null, "summary": null})),
            store: req.store.unwrap_or(true),
            background: req.background,
            temperature: req.common.temperature,
            text: req
                .text
                .clone()
                .unwrap_or_else(|| serde_json::json!({"format": {"type": "text"}})),
            tool_choice: req
                .tool_choice
                .clone()
                .unwrap_or_else(|| Json::String("auto".into())),
            tools: req.tools.clone().unwrap_or_default(),
            top_p: req.common.top_p,
            truncation: "disabled".into(),
            usage: None,
            user: req.user.clone(),
            metadata: req.metadata.clone().unwrap_or_default(),
            program_id: program,
        }
    }

    /// Sets the final status from the engine's finish reason.
    pub fn finish(&mut self, reason: &str, output: Vec<Json>, usage: ResponseUsage) {
        self.output = output;
        self.usage = Some(usage);
        self.status = match reason {
            "length" => {
                self.incomplete_details = Some(serde_json::json!({"reason": "max_output_tokens"}));
                Status::Incomplete
            }
            "abort" => Status::Cancelled,
            _ => Status::Completed,
        };
    }

    /// Marks the response failed with `error`'s OpenAI body.
    pub fn fail(&mut self, error: &crate::error::ApiError) {
        self.status = Status::Failed;
        self.error =
            Some(serde_json::json!({"code": "server_error", "message": error.to_string()}));
    }
}
