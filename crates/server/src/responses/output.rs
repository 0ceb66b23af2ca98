//! The chat parser's deltas → Responses output items, with the stream
//! events that build them (`response.output_item.added`,
//! `response.output_text.delta`, `response.function_call_arguments.delta`,
//! ..., `response.output_item.done`).
//!
//! Streamed and whole responses both go through [`OutputBuilder`] (a whole
//! response just drops the events), so their items are the same by
//! construction. Items open in the order the model writes them: reasoning,
//! text, then one item per tool call; a change of kind closes the open item.

use agentd_chat::{ChatDelta, ChatMessage, FunctionCall, ParsedOutput, ToolCall};
use serde_json::{json, Value as Json};

enum Open {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        args: String,
    },
}

/// Output items of one response being generated.
pub struct OutputBuilder {
    /// Stem of the item ids (`msg_{stem}_{n}`, `fc_...`, `rs_...`).
    stem: String,
    items: Vec<Json>,
    open: Option<Open>,
    /// The same output as a chat message, for the conversation history.
    parsed: ParsedOutput,
}

impl OutputBuilder {
    pub fn new(response_id: &str) -> Self {
        let stem = response_id
            .split_once(['_', '-'])
            .map_or(response_id, |(_, s)| s);
        OutputBuilder {
            stem: stem.to_string(),
            items: Vec::new(),
            open: None,
            parsed: ParsedOutput::default(),
        }
    }

    fn item_id(&self, kind: &str) -> String {
        format!("{kind}_{}_{}", self.stem, self.items.len())
    }

    /// Feeds parser deltas; appends the stream events they make to `ev`.
    pub fn push(&mut self, deltas: Vec<ChatDelta>, ev: &mut Vec<Json>) {
        for d in deltas {
            if let Some(text) = d.reasoning_content.filter(|t| !t.is_empty()) {
                if !matches!(self.open, Some(Open::Reasoning { .. })) {
                    self.close(ev);
                    let id = self.item_id("rs");
                    ev.push(
                        self.added(json!({"type": "reasoning", "id": id, "summary": [],
                        "content": [], "status": "in_progress"})),
                    );
                    self.open = Some(Open::Reasoning {
                        id,
                        text: String::new(),
                    });
                }
                self.parsed
                    .reasoning_content
                    .get_or_insert_with(String::new)
                    .push_str(&text);
                if let Some(Open::Reasoning { id, text: all }) = &mut self.open {
                    all.push_str(&text);
                    ev.push(
                        json!({"type": "response.reasoning_text.delta", "item_id": id,
                        "output_index": self.items.len(), "content_index": 0, "delta": text}),
                    );
                }
            }
            if let Some(text) = d.content.filter(|t| !t.is_empty()) {
                if !matches!(self.open, Some(Open::Message { .. })) {
                    self.close(ev);
                    let id = self.item_id("msg");
                    ev.push(
                        self.added(json!({"type": "message", "id": id, "status": "in_progress",
                        "role": "assistant", "content": []})),
                    );
                    ev.push(json!({"type": "response.content_part.added", "item_id": id,
                        "output_index": self.items.len(), "content_index": 0,
                        "part": text_part("")}));
                    self.open = Some(Open::Message {
                        id,
                        text: String::new(),
                    });
                }
                self.parsed
                    .content
                    .get_or_insert_with(String::new)
                    .push_str(&text);
                if let Some(Open::Message { id, text: all }) = &mut self.open {
                    all.push_str(&text);
                    ev.push(json!({"type": "response.output_text.delta", "item_id": id,
                        "output_index": self.items.len(), "content_index": 0, "delta": text,
                        "logprobs": []}));
                }
            }
            for call in d.tool_calls {
                if let Some(call_id) = call.id {
                    self.close(ev);
                    let id = self.item_id("fc");
                    let name = call.function.name.clone().unwrap_or_default();
                    ev.push(self.added(json!({"type": "function_call", "id": id,
                        "call_id": call_id, "name": name, "arguments": "",
                        "status": "in_progress"})));
                    self.open = Some(Open::Call {
                        id,
                        call_id,
                        name,
                        args: String::new(),
                    });
                }
                let Some(delta) = call.function.arguments.filter(|a| !a.is_empty()) else {
                    continue;
                };
                if let Some(Open::Call { id, args, .. }) = &mut self.open {
                    args.push_str(&delta);
                    ev.push(json!({"type": "response.function_call_arguments.delta",
                        "item_id": id, "output_index": self.items.len(), "delta": delta}));
                }
            }
        }
    }

    fn added(&self, item: Json) -> Json {
        json!({"type": "response.output_item.added", "output_index": self.items.len(),
            "item": item})
    }

    /// Closes the open item: its `done` events, and it joins the items.
    fn close(&mut self, ev: &mut Vec<Json>) {
        let index = self.items.len();
        let item = match self.open.take() {
            None => return,
            Some(Open::Reasoning { id, text }) => {
                ev.push(
                    json!({"type": "response.reasoning_text.done", "item_id": id,
                    "output_index": index, "content_index": 0, "text": text}),
                );
                json!({"type": "reasoning", "id": id, "summary": [], "status": "completed",
                    "content": [{"type": "reasoning_text", "text": text}]})
            }
            Some(Open::Message { id, text }) => {
                ev.push(json!({"type": "response.output_text.done", "item_id": id,
                    "output_index": index, "content_index": 0, "text": text, "logprobs": []}));
                ev.push(json!({"type": "response.content_part.done", "item_id": id,
                    "output_index": index, "content_index": 0, "part": text_part(&text)}));
                json!({"type": "message", "id": id, "status": "completed", "role": "assistant",
                    "content": [text_part(&text)]})
            }
            Some(Open::Call {
                id,
                call_id,
                name,
                args,
            }) => {
                ev.push(
                    json!({"type": "response.function_call_arguments.done", "item_id": id,
                    "output_index": index, "name": name, "arguments": args}),
                );
                self.parsed.tool_calls.push(ToolCall {
                    id: call_id.clone(),
                    kind: "function".into(),
                    function: FunctionCall {
                        name: name.clone(),
                        arguments: args.clone(),
                    },
                });
                json!({"type": "function_call", "id": id, "call_id": call_id, "name": name,
                    "arguments": args, "status": "completed"})
            }
        };
        ev.push(
            json!({"type": "response.output_item.done", "output_index": index,
            "item": item}),
        );
        self.items.push(item);
    }

    /// Closes the last item; the output items and the assistant message for
    /// the conversation history.
    pub fn finish(mut self, ev: &mut Vec<Json>) -> (Vec<Json>, ChatMessage) {
        self.close(ev);
        (self.items, self.parsed.to_message())
    }
}

fn text_part(text: &str) -> Json {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentd_chat::{FunctionDelta, ToolCallDelta};

    fn text(t: &str) -> ChatDelta {
        ChatDelta {
            content: Some(t.into()),
            ..ChatDelta::default()
        }
    }

    #[test]
    fn kinds_open_and_close_items_in_order() {
        let mut b = OutputBuilder::new("resp_abc");
        let mut ev = Vec::new();
        let call = ChatDelta {
            tool_calls: vec![ToolCallDelta {
                index: 0,
                id: Some("call_1".into()),
                kind: Some("function".into()),
                function: FunctionDelta {
                    name: Some("f".into()),
                    arguments: Some("{\"a\": 1}".into()),
                },
            }],
            ..ChatDelta::default()
        };
        b.push(vec![text("Hel"), text("lo"), call], &mut ev);
        let (items, msg) = b.finish(&mut ev);
        assert_eq!(items.len(), 2);
        assert_eq!(items[0]["content"][0]["text"], "Hello");
        assert_eq!(items[1]["arguments"], "{\"a\": 1}");
        assert_eq!(items[1]["call_id"], "call_1");
        assert_eq!(msg.tool_calls.unwrap()[0].function.name, "f");
        let kinds: Vec<_> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
            ]
        );
    }
}
