//! Messages + tools → prompt tokens and how to read the output: the one
//! chat-template path shared by `/v1/chat/completions` and `/v1/responses`.

use agentd_chat::{
    ChatDelta, ChatMessage, OutputOptions, ReasoningMode, RenderOptions, ToolSchemas,
};
use serde_json::{Map, Value as Json};

use crate::app::AppState;
use crate::error::ApiError;

/// What a chat-shaped request renders from.
pub struct ChatInput<'a> {
    pub messages: &'a [ChatMessage],
    /// OpenAI chat-completions tool definitions (`{"type": "function",
    /// "function": {...}}`); empty or `None` means no tools.
    pub tools: Option<&'a [Json]>,
    /// `tool_choice` as sent (`"none"`, `"auto"`, `"required"` or a named
    /// function).
    pub tool_choice: Option<&'a Json>,
    pub chat_template_kwargs: Map<String, Json>,
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: bool,
    /// Tokenize with the tokenizer's special tokens (vLLM's
    /// `add_special_tokens`; the template usually writes them itself).
    pub add_special_tokens: bool,
}

/// The rendered prompt and the parsing rules of its output.
pub struct ChatPrompt {
    /// The template's output, before tokenisation.
    pub text: String,
    pub tokens: Vec<u32>,
    pub output: OutputOptions,
}

/// OpenAI's `parallel_tool_calls: false` on parsed stream deltas: only the
/// model's first tool call (index 0) is returned; the pieces of later ones
/// are dropped, and deltas left with nothing in them too.
pub fn first_tool_call_only(deltas: &mut Vec<ChatDelta>) {
    for d in deltas.iter_mut() {
        d.tool_calls.retain(|c| c.index == 0);
    }
    deltas.retain(|d| {
        !d.tool_calls.is_empty() || d.content.is_some() || d.reasoning_content.is_some()
    });
}

/// Renders `input` with the model's chat template and tokenises it.
pub fn render(state: &AppState, input: &ChatInput<'_>) -> Result<ChatPrompt, ApiError> {
    let (text, output) = render_text(state, input)?;
    let tokens = state.tokenizer.encode(&text, input.add_special_tokens)?;
    Ok(ChatPrompt {
        text,
        tokens,
        output,
    })
}

/// Renders `input` with the model's chat template, without tokenising.
pub fn render_text(
    state: &AppState,
    input: &ChatInput<'_>,
) -> Result<(String, OutputOptions), ApiError> {
    let template = state.template.as_ref().ok_or_else(|| {
        ApiError::invalid(
            "messages",
            "this model has no chat template (no tokenizer_config.json); use /v1/completions",
        )
    })?;
    if input.messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    let opts = RenderOptions {
        add_generation_prompt: input
            .add_generation_prompt
            .unwrap_or(!input.continue_final_message),
        continue_final_message: input.continue_final_message,
        chat_template_kwargs: input.chat_template_kwargs.clone(),
    };
    let tools = input.tools.filter(|t| !t.is_empty());
    let text = template.render(input.messages, tools, &opts)?;
    check_tool_choice(input.tool_choice, tools.unwrap_or_default())?;
    // `tool_choice: "none"` keeps the tools in the prompt (as vLLM) but the
    // output is not parsed for calls.
    let parse_tools =
        tools.is_some() && !matches!(input.tool_choice, Some(Json::String(s)) if s == "none");
    let output = OutputOptions {
        reasoning: ReasoningMode::from_enable_thinking(opts.enable_thinking()),
        tool_calls: parse_tools,
        format: state.output_format,
        tools: ToolSchemas::from_tools(tools.unwrap_or_default()),
    };
    Ok((text, output))
}

/// `tool_choice` must be `none`, `auto`, `required` or a named function of
/// `tools`; `required` and a named function need tools (and are enforced
/// on the output by [`crate::structured`]).
fn check_tool_choice(choice: Option<&Json>, tools: &[Json]) -> Result<(), ApiError> {
    let named = match choice {
        None => return Ok(()),
        Some(Json::String(s)) if s == "none" || s == "auto" => return Ok(()),
        Some(Json::String(s)) if s == "required" => None,
        Some(v) => match v.pointer("/function/name").and_then(Json::as_str) {
            Some(name) if v.get("type").and_then(Json::as_str) == Some("function") => Some(name),
            _ => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("tool_choice must be none, auto, required or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {v}"),
                ))
            }
        },
    };
    if tools.is_empty() {
        return Err(ApiError::invalid(
            "tool_choice",
            "tool_choice 'required' or a named function needs tools",
        ));
    }
    if let Some(name) = named {
        let known = tools
            .iter()
            .any(|t| t.pointer("/function/name").and_then(Json::as_str) == Some(name));
        if !known {
            return Err(ApiError::invalid(
                "tool_choice",
                format!("tool_choice names function '{name}', which is not in tools"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use agentd_chat::{parse_output, StreamParser, ToolCallIds};

    use super::*;

    /// Two Hermes calls, streamed in small pieces through the real parser:
    /// with the filter only the first call's pieces are left.
    #[test]
    fn one_tool_call_keeps_the_first_call_of_a_stream() {
        let opts = OutputOptions {
            reasoning: ReasoningMode::Disabled,
            tool_calls: true,
            ..OutputOptions::default()
        };
        let text = "Sure.<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n\
                    <tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>";
        assert_eq!(
            parse_output(text, &opts, &mut ToolCallIds::Random)
                .tool_calls
                .len(),
            2
        );
        let run = |filter: bool| {
            let mut p = StreamParser::new(opts.clone(), ToolCallIds::Random);
            let mut out = Vec::new();
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(5) {
                let mut d = p.push(&piece.iter().collect::<String>());
                if filter {
                    first_tool_call_only(&mut d);
                }
                out.extend(d);
            }
            let mut d = p.finish();
            if filter {
                first_tool_call_only(&mut d);
            }
            out.extend(d);
            out
        };
        let names = |deltas: &[ChatDelta]| -> Vec<String> {
            deltas
                .iter()
                .flat_map(|d| &d.tool_calls)
                .filter_map(|c| c.function.name.clone())
                .collect()
        };
        assert_eq!(names(&run(false)), ["a", "b"]);
        let one = run(true);
        assert_eq!(names(&one), ["a"]);
        assert!(one
            .iter()
            .all(|d| d.tool_calls.iter().all(|c| c.index == 0)));
        assert!(one
            .iter()
            .all(|d| !d.tool_calls.is_empty() || d.content.is_some()));
    }
}
