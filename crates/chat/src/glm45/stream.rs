//! The GLM-4.5 parser fed text deltas: the machine's events become chat
//! deltas as soon as they are decided, with the whole-text rules of
//! [`super::parse`]:
//! - reasoning's trailing whitespace waits for more reasoning (else it is
//!   dropped);
//! - content's trailing whitespace waits: a call drops it, more text sends it;
//! - a call is buffered to `</tool_call>` (or the end) and then sent whole
//!   or, if vLLM would reject it, dropped; text after a rejected call waits
//!   until a kept call (dropped) or the end (sent);
//! - after a kept call, content is dropped.

use super::lexer::{Event, Lexer};
use super::{lexer_for, Slot};
use crate::output::OutputOptions;
use crate::stream::{call_deltas, emit_content, emit_reasoning, ChatDelta};
use crate::tool_calls::ToolCallIds;

#[derive(Debug)]
pub(crate) struct Glm45Stream {
    opts: OutputOptions,
    ids: ToolCallIds,
    lexer: Lexer,
    /// Reasoning whitespace not yet known to be followed by more reasoning.
    held_reasoning: String,
    /// Content not yet sent (trailing whitespace, or text after a call).
    held: String,
    sent_content: bool,
    slot: Option<Slot>,
    seen_call: bool,
    kept_calls: usize,
}

impl Glm45Stream {
    pub(crate) fn new(opts: OutputOptions, ids: ToolCallIds) -> Self {
        Glm45Stream {
            lexer: lexer_for(&opts),
            opts,
            ids,
            held_reasoning: String::new(),
            held: String::new(),
            sent_content: false,
            slot: None,
            seen_call: false,
            kept_calls: 0,
        }
    }

    pub(crate) fn push(&mut self, text: &str) -> Vec<ChatDelta> {
        let mut events = Vec::new();
        self.lexer.push(text, &mut events);
        self.apply(events)
    }

    pub(crate) fn finish(&mut self) -> Vec<ChatDelta> {
        let mut events = Vec::new();
        self.lexer.finish(&mut events);
        let mut out = self.apply(events);
        if self.kept_calls == 0 {
            let blank = !self.sent_content && self.held.trim().is_empty();
            if !(blank && self.seen_call) {
                emit_content(&mut out, std::mem::take(&mut self.held));
            }
        }
        self.held.clear();
        self.held_reasoning.clear();
        out
    }

    fn apply(&mut self, events: Vec<Event>) -> Vec<ChatDelta> {
        let mut out = Vec::new();
        for event in events {
            match event {
                Event::Reasoning(t) => {
                    self.held_reasoning.push_str(&t);
                    let keep = trailing_ws(&self.held_reasoning);
                    let ready: String = self.held_reasoning.drain(..keep).collect();
                    emit_reasoning(&mut out, ready);
                }
                Event::Content(t) => self.content(&mut out, &t),
                Event::CallStart => {
                    self.seen_call = true;
                    self.slot = Some(Slot::default());
                }
                Event::Name(t) => self.slot.iter_mut().for_each(|s| s.name.push_str(&t)),
                Event::Args(t) => self.slot.iter_mut().for_each(|s| s.args.push_str(&t)),
                Event::CallEnd => {
                    let slot = self.slot.take().unwrap_or_default();
                    if let Some(call) = slot.into_call(&self.opts, &mut self.ids) {
                        out.extend(call_deltas(self.kept_calls, call));
                        self.kept_calls += 1;
                        self.held.clear();
                    }
                }
            }
        }
        out
    }

    fn content(&mut self, out: &mut Vec<ChatDelta>, text: &str) {
        if self.kept_calls > 0 {
            return;
        }
        self.held.push_str(text);
        if self.seen_call {
            return;
        }
        let keep = trailing_ws(&self.held);
        if keep > 0 {
            let ready: String = self.held.drain(..keep).collect();
            self.sent_content = true;
            emit_content(out, ready);
        }
    }
}

/// Byte length of `s` without its trailing whitespace.
fn trailing_ws(s: &str) -> usize {
    s.trim_end().len()
}
