//! Whole-text parsing of a finished generation into an OpenAI assistant
//! message: reasoning first (tool calls inside reasoning are not calls),
//! then tool calls from the rest.

use crate::formats::OutputFormat;
use crate::glm45::ToolSchemas;
use crate::messages::{ChatMessage, FunctionCallParam, MessageContent, ToolCallParam};
use crate::reasoning::{split_reasoning, ReasoningMode};
use crate::tool_calls::{extract_tool_calls, ToolCall, ToolCallIds};
use serde::{Deserialize, Serialize};

/// How to interpret model output.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OutputOptions {
    pub reasoning: ReasoningMode,
    /// Extract `<tool_call>` blocks (the request has tools and
    /// `tool_choice` is not `none`).
    pub tool_calls: bool,
    /// The model's tool-call and reasoning formats.
    pub format: OutputFormat,
    /// The request's tools (GLM-4.5 calls are checked against their names
    /// and their arguments typed by their schemas).
    pub tools: ToolSchemas,
}

/// The parsed assistant message. Empty strings are `None`, as vLLM reports
/// them (`"content": null` next to tool calls).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ParsedOutput {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub tool_calls: Vec<ToolCall>,
}

/// Parses a complete generation.
pub fn parse_output(text: &str, opts: &OutputOptions, ids: &mut ToolCallIds) -> ParsedOutput {
    if opts.format.is_glm() {
        return crate::glm45::parse(text, opts, ids);
    }
    let (reasoning_content, rest) = split_reasoning(text, opts.reasoning);
    let (content, tool_calls) = if opts.tool_calls {
        extract_tool_calls(rest, ids)
    } else {
        (rest.to_string(), Vec::new())
    };
    ParsedOutput {
        reasoning_content,
        content: (!content.is_empty()).then_some(content),
        tool_calls,
    }
}

impl ParsedOutput {
    /// The assistant message a client sends back in the next request's
    /// history (content, tool calls with string arguments, reasoning).
    pub fn to_message(&self) -> ChatMessage {
        let tool_calls = (!self.tool_calls.is_empty()).then(|| {
            self.tool_calls
                .iter()
                .map(|call| ToolCallParam {
                    id: Some(call.id.clone()),
                    kind: Some(call.kind.clone()),
                    function: FunctionCallParam {
                        name: call.function.name.clone(),
                        arguments: Some(serde_json::Value::String(call.function.arguments.clone())),
                    },
                })
                .collect()
        });
        ChatMessage {
            role: "assistant".to_string(),
            content: self.content.clone().map(MessageContent::Text),
            name: None,
            tool_calls,
            tool_call_id: None,
            reasoning_content: self.reasoning_content.clone(),
            reasoning: None,
        }
    }
}
