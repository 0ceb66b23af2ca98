//! Streaming output parser: fed decoded text deltas, emits OpenAI-style
//! deltas (`reasoning_content`, `content`, `tool_calls`).
//!
//! It applies exactly the rules of the whole-text parser
//! ([`crate::parse_output`]), so concatenating its deltas for any chunking of
//! an output gives the same message (the tests check this on random
//! chunkings). To get there it holds back only what is still undecided:
//! - a chunk ending in a prefix of a tag (`<thi`, `</thin`, `<tool_`) keeps
//!   that suffix until the next chunk settles it, so no partial tag leaks;
//! - a tool-call block is buffered until `</tool_call>` (or the end) and then
//!   emitted as a call (id, type and name first, then the arguments) or, if
//!   malformed, as content — a call is never announced and then retracted;
//! - whitespace after a tool call waits to see whether more text (kept) or
//!   another call / the end (dropped) follows.

use crate::glm45::Glm45Stream;
use crate::output::{OutputOptions, ParsedOutput};
use crate::reasoning::{ReasoningMode, THINK_END, THINK_START};
use crate::tool_calls::{
    make_call, parse_call_body, FunctionCall, ToolCall, ToolCallIds, TOOL_CALL_END, TOOL_CALL_START,
};
use serde::{Deserialize, Serialize};

/// One delta of a streamed assistant message (the `delta` of an OpenAI
/// `chat.completion.chunk` choice).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub tool_calls: Vec<ToolCallDelta>,
}

/// A piece of a tool call; pieces with the same `index` belong together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none", default)]
    pub kind: Option<String>,
    pub function: FunctionDelta,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub arguments: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting to see whether the output opens with `<think>`.
    ThinkStart,
    Reasoning,
    Content,
    /// Inside a `<tool_call>` block; `buf` holds its body so far.
    ToolCall,
}

/// Incremental parser for one generation.
#[derive(Debug)]
pub struct StreamParser {
    opts: OutputOptions,
    ids: ToolCallIds,
    phase: Phase,
    /// Text received but not yet emitted.
    buf: String,
    /// Whitespace seen after a tool call, not yet known to be content.
    pending_ws: String,
    after_call: bool,
    calls: usize,
    /// In a tool-call block: bytes of `buf` already known not to start
    /// `</tool_call>`.
    scanned: usize,
    /// GLM-4.5 output has its own machine (`crate::glm45`).
    glm: Option<Glm45Stream>,
}

impl StreamParser {
    pub fn new(opts: OutputOptions, ids: ToolCallIds) -> Self {
        let phase = match opts.reasoning {
            ReasoningMode::Enabled => Phase::ThinkStart,
            ReasoningMode::Disabled => Phase::Content,
        };
        let glm = opts
            .format
            .is_glm()
            .then(|| Glm45Stream::new(opts.clone(), ids.clone()));
        StreamParser {
            opts,
            ids,
            phase,
            buf: String::new(),
            pending_ws: String::new(),
            after_call: false,
            calls: 0,
            scanned: 0,
            glm,
        }
    }

    /// Feeds the next decoded text; returns the deltas it settles.
    pub fn push(&mut self, text: &str) -> Vec<ChatDelta> {
        if let Some(glm) = &mut self.glm {
            return glm.push(text);
        }
        self.buf.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out, false) {}
        out
    }

    /// Ends the generation: flushes everything held back.
    pub fn finish(&mut self) -> Vec<ChatDelta> {
        if let Some(glm) = &mut self.glm {
            return glm.finish();
        }
        let mut out = Vec::new();
        // Each `true` either consumes input or moves to a later phase, so
        // this terminates.
        while self.step(&mut out, true) {}
        out
    }

    /// Advances one state transition; returns true when it changed phase and
    /// the buffer should be looked at again.
    fn step(&mut self, out: &mut Vec<ChatDelta>, at_end: bool) -> bool {
        match self.phase {
            Phase::ThinkStart => {
                if self.buf.starts_with(THINK_START) {
                    self.buf.drain(..THINK_START.len());
                    self.phase = Phase::Reasoning;
                    true
                } else if THINK_START.starts_with(self.buf.as_str()) && !at_end {
                    false
                } else {
                    self.phase = Phase::Reasoning;
                    true
                }
            }
            Phase::Reasoning => {
                if let Some(i) = self.buf.find(THINK_END) {
                    let reasoning: String = self.buf.drain(..i).collect();
                    self.buf.drain(..THINK_END.len());
                    emit_reasoning(out, reasoning);
                    self.phase = Phase::Content;
                    return true;
                }
                let keep = if at_end {
                    0
                } else {
                    partial_tag_len(&self.buf, THINK_END)
                };
                let ready: String = self.buf.drain(..self.buf.len() - keep).collect();
                emit_reasoning(out, ready);
                false
            }
            Phase::Content if !self.opts.tool_calls => {
                let text = std::mem::take(&mut self.buf);
                emit_content(out, text);
                false
            }
            Phase::Content => {
                if let Some(i) = self.buf.find(TOOL_CALL_START) {
                    let seg: String = self.buf.drain(..i).collect();
                    self.buf.drain(..TOOL_CALL_START.len());
                    self.text_segment(out, seg, true);
                    self.phase = Phase::ToolCall;
                    return true;
                }
                let keep = if at_end {
                    0
                } else {
                    partial_tag_len(&self.buf, TOOL_CALL_START)
                };
                let seg: String = self.buf.drain(..self.buf.len() - keep).collect();
                self.text_segment(out, seg, at_end);
                false
            }
            Phase::ToolCall => {
                // Resume the search where the last one stopped (minus a
                // partial tag): a call that writes a large file arrives in
                // thousands of small deltas and must not be rescanned each time.
                let from = floor_char_boundary(&self.buf, self.scanned);
                let found = self.buf[from..].find(TOOL_CALL_END).map(|i| from + i);
                let (body, closed) = match found {
                    Some(i) => {
                        let body: String = self.buf.drain(..i).collect();
                        self.buf.drain(..TOOL_CALL_END.len());
                        (body, true)
                    }
                    None if at_end => (std::mem::take(&mut self.buf), false),
                    None => {
                        self.scanned = self.buf.len().saturating_sub(TOOL_CALL_END.len() - 1);
                        return false;
                    }
                };
                self.scanned = 0;
                self.finish_block(out, &body, closed);
                self.phase = Phase::Content;
                true
            }
        }
    }

    /// Text outside tool-call blocks. `ends_segment`: a tool call or the end
    /// of output follows, so whitespace after a previous call is decided.
    fn text_segment(&mut self, out: &mut Vec<ChatDelta>, seg: String, ends_segment: bool) {
        if !self.after_call {
            emit_content(out, seg);
            return;
        }
        self.pending_ws.push_str(&seg);
        if !self.pending_ws.trim().is_empty() {
            // Not a blank separator after all: everything since the call is
            // ordinary content.
            let text = std::mem::take(&mut self.pending_ws);
            emit_content(out, text);
            self.after_call = false;
        } else if ends_segment {
            self.pending_ws.clear();
        }
    }

    fn finish_block(&mut self, out: &mut Vec<ChatDelta>, body: &str, closed: bool) {
        match parse_call_body(body) {
            Some((name, arguments)) => {
                let call = make_call(&mut self.ids, name, arguments);
                out.extend(call_deltas(self.calls, call));
                self.calls += 1;
                self.after_call = true;
            }
            None => {
                let mut raw = String::with_capacity(body.len() + 24);
                raw.push_str(TOOL_CALL_START);
                raw.push_str(body);
                if closed {
                    raw.push_str(TOOL_CALL_END);
                }
                emit_content(out, raw);
                self.after_call = false;
            }
        }
        self.pending_ws.clear();
    }
}

/// A finished call as two deltas: id, type and name (with empty arguments)
/// first, then the arguments, as vLLM streams them.
pub(crate) fn call_deltas(index: usize, call: ToolCall) -> [ChatDelta; 2] {
    let ToolCall {
        id,
        kind,
        function: FunctionCall { name, arguments },
    } = call;
    let piece = |id, kind, name, arguments| ChatDelta {
        tool_calls: vec![ToolCallDelta {
            index,
            id,
            kind,
            function: FunctionDelta {
                name,
                arguments: Some(arguments),
            },
        }],
        ..ChatDelta::default()
    };
    [
        piece(Some(id), Some(kind), Some(name), String::new()),
        piece(None, None, None, arguments),
    ]
}

/// Length of the longest suffix of `buf` that is a proper prefix of `tag`
/// (a tag that may be completed by the next chunk). Tags are ASCII, so the
/// cut is always on a character boundary.
fn partial_tag_len(buf: &str, tag: &str) -> usize {
    let max = buf.len().min(tag.len() - 1);
    (1..=max)
        .rev()
        .find(|&n| buf.is_char_boundary(buf.len() - n) && tag.starts_with(&buf[buf.len() - n..]))
        .unwrap_or(0)
}

/// The largest char boundary of `s` at or below `i`.
fn floor_char_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

pub(crate) fn emit_reasoning(out: &mut Vec<ChatDelta>, text: String) {
    if text.is_empty() {
        return;
    }
    match out.last_mut() {
        Some(ChatDelta {
            reasoning_content: Some(prev),
            content: None,
            tool_calls,
        }) if tool_calls.is_empty() => prev.push_str(&text),
        _ => out.push(ChatDelta {
            reasoning_content: Some(text),
            ..ChatDelta::default()
        }),
    }
}

pub(crate) fn emit_content(out: &mut Vec<ChatDelta>, text: String) {
    if text.is_empty() {
        return;
    }
    match out.last_mut() {
        Some(ChatDelta {
            reasoning_content: None,
            content: Some(prev),
            tool_calls,
        }) if tool_calls.is_empty() => prev.push_str(&text),
        _ => out.push(ChatDelta {
            content: Some(text),
            ..ChatDelta::default()
        }),
    }
}

/// Reassembles streamed deltas into a message, as an OpenAI client does
/// (text fields concatenated, tool-call pieces merged by `index`).
#[derive(Debug, Default)]
pub struct DeltaAccumulator {
    reasoning: String,
    content: String,
    calls: Vec<ToolCall>,
}

impl DeltaAccumulator {
    pub fn add(&mut self, delta: &ChatDelta) {
        if let Some(r) = &delta.reasoning_content {
            self.reasoning.push_str(r);
        }
        if let Some(c) = &delta.content {
            self.content.push_str(c);
        }
        for piece in &delta.tool_calls {
            while self.calls.len() <= piece.index {
                self.calls.push(ToolCall {
                    id: String::new(),
                    kind: String::new(),
                    function: FunctionCall {
                        name: String::new(),
                        arguments: String::new(),
                    },
                });
            }
            let call = &mut self.calls[piece.index];
            if let Some(id) = &piece.id {
                call.id.push_str(id);
            }
            if let Some(kind) = &piece.kind {
                call.kind.push_str(kind);
            }
            if let Some(name) = &piece.function.name {
                call.function.name.push_str(name);
            }
            if let Some(args) = &piece.function.arguments {
                call.function.arguments.push_str(args);
            }
        }
    }

    pub fn finish(self) -> ParsedOutput {
        ParsedOutput {
            reasoning_content: (!self.reasoning.is_empty()).then_some(self.reasoning),
            content: (!self.content.is_empty()).then_some(self.content),
            tool_calls: self.calls,
        }
    }
}
