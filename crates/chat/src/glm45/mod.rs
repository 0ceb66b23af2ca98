//! GLM-4.5/4.6/4.7 output: `<think>` reasoning and
//! `<tool_call>NAME<arg_key>k</arg_key><arg_value>v</arg_value>...</tool_call>`
//! calls, parsed as vLLM's `glm45` parsers (`vllm/parser/glm47_moe.py`)
//! return them; `tests/fixtures/chat/glm45_output_golden.json` holds vLLM's
//! own results (`scripts/glm45_output_golden.py`).
//!
//! Whole-text rules (from vLLM's `ParserEngine.parse`):
//! - reasoning is all reasoning text (it may reopen with `<think>`), trailing
//!   whitespace dropped;
//! - a call is kept when its trimmed name is one of the request's tools;
//!   its arguments are the key/value pairs as a JSON object, values coerced
//!   to their schema types ([`args`]);
//! - with a kept call, content is the text before the first `<tool_call>`,
//!   trimmed (text after it is dropped, as vLLM does); without one, all text,
//!   except that only whitespace around rejected calls is no content.
//!
//! The stream ([`Glm45Stream`]) gives the same message for any chunking,
//! with one difference that vLLM's streaming shares: content's leading
//! whitespace is sent as it comes, so it is not trimmed when a call follows.

mod args;
mod lexer;
mod stream;

pub use args::{value_types, ToolSchemas, KEY_END, KEY_START, VALUE_END, VALUE_START};
pub(crate) use stream::Glm45Stream;

use crate::output::{OutputOptions, ParsedOutput};
use crate::reasoning::ReasoningMode;
use crate::tool_calls::{make_call, ToolCall, ToolCallIds};
use lexer::{Event, Lexer};

fn lexer_for(opts: &OutputOptions) -> Lexer {
    Lexer::new(opts.reasoning == ReasoningMode::Enabled, opts.tool_calls)
}

/// A call body gathered from the machine's events.
#[derive(Debug, Default)]
struct Slot {
    name: String,
    args: String,
}

impl Slot {
    /// The call, if vLLM keeps it.
    fn into_call(self, opts: &OutputOptions, ids: &mut ToolCallIds) -> Option<ToolCall> {
        let name = self.name.trim();
        if name.is_empty() || !opts.tools.accepts(name) {
            return None;
        }
        let arguments = args::arguments_json(name, &self.args, &opts.tools);
        Some(make_call(ids, name.to_string(), arguments))
    }
}

/// Parses a complete generation.
pub(crate) fn parse(text: &str, opts: &OutputOptions, ids: &mut ToolCallIds) -> ParsedOutput {
    let mut lexer = lexer_for(opts);
    let mut events = Vec::new();
    lexer.push(text, &mut events);
    lexer.finish(&mut events);

    let (mut reasoning, mut before, mut all) = (String::new(), String::new(), String::new());
    let mut slots: Vec<Slot> = Vec::new();
    for event in events {
        match event {
            Event::Reasoning(t) => reasoning.push_str(&t),
            Event::Content(t) => {
                if slots.is_empty() {
                    before.push_str(&t);
                }
                all.push_str(&t);
            }
            Event::CallStart => slots.push(Slot::default()),
            Event::Name(t) => slots
                .last_mut()
                .into_iter()
                .for_each(|s| s.name.push_str(&t)),
            Event::Args(t) => slots
                .last_mut()
                .into_iter()
                .for_each(|s| s.args.push_str(&t)),
            Event::CallEnd => {}
        }
    }
    let had_slots = !slots.is_empty();
    let tool_calls: Vec<ToolCall> = slots
        .into_iter()
        .filter_map(|s| s.into_call(opts, ids))
        .collect();
    let content = if !tool_calls.is_empty() {
        before.trim().to_string()
    } else if had_slots && all.trim().is_empty() {
        String::new()
    } else {
        all
    };
    let reasoning = reasoning.trim_end();
    ParsedOutput {
        reasoning_content: (!reasoning.is_empty()).then(|| reasoning.to_string()),
        content: (!content.is_empty()).then_some(content),
        tool_calls,
    }
}
