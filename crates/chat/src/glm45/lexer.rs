//! The GLM-4.5 output state machine (vLLM's `glm47_moe_config`): tags move
//! between reasoning, content, a call's name and a call's arguments; a tag
//! with no transition in the current state is ordinary text of that state.
//!
//! | state | tag | → |
//! | --- | --- | --- |
//! | reasoning | `<think>` | reasoning (tag dropped) |
//! | reasoning | `</think>` | content |
//! | reasoning / content | `<tool_call>` | name (ends reasoning, starts a call) |
//! | content | `<think>` | reasoning (reasoning may reopen) |
//! | content | `</think>` | content (dropped) |
//! | name | `<arg_key>` | arguments (the tag is part of the arguments) |
//! | name / arguments | `</tool_call>` | content (ends the call) |
//! | arguments | `<arg_key>` ... `</arg_value>` | arguments (raw) |
//!
//! Without thinking the `<think>` tags are text and output starts in content;
//! without tool parsing the tool tags are text, except that `<tool_call>`
//! still ends reasoning (and is then content), as vLLM's reasoning adapter.

const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";
const TOOL_START: &str = "<tool_call>";
const TOOL_END: &str = "</tool_call>";
const ARG_TAGS: [&str; 4] = ["<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Reasoning,
    Content,
    Name,
    Args,
}

/// What the machine reports, in output order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    Reasoning(String),
    Content(String),
    CallStart,
    Name(String),
    Args(String),
    CallEnd,
}

/// The incremental machine: fed text pieces, it holds back only a suffix
/// that may still become a tag.
#[derive(Debug)]
pub(crate) struct Lexer {
    state: State,
    thinking: bool,
    tools: bool,
    buf: String,
}

impl Lexer {
    pub(crate) fn new(thinking: bool, tools: bool) -> Self {
        Lexer {
            state: if thinking {
                State::Reasoning
            } else {
                State::Content
            },
            thinking,
            tools,
            buf: String::new(),
        }
    }

    pub(crate) fn push(&mut self, text: &str, out: &mut Vec<Event>) {
        self.buf.push_str(text);
        self.drain(out, false);
    }

    /// Flushes held text; an open call ends, an open reasoning block ends.
    pub(crate) fn finish(&mut self, out: &mut Vec<Event>) {
        self.drain(out, true);
        if matches!(self.state, State::Name | State::Args) {
            out.push(Event::CallEnd);
        }
        self.state = State::Content;
    }

    fn tags(&self) -> impl Iterator<Item = &'static str> + '_ {
        let think = [THINK_START, THINK_END]
            .into_iter()
            .filter(|_| self.thinking);
        think.chain([TOOL_START, TOOL_END]).chain(ARG_TAGS)
    }

    fn drain(&mut self, out: &mut Vec<Event>, at_end: bool) {
        let buf = std::mem::take(&mut self.buf);
        let mut rest = buf.as_str();
        loop {
            // The earliest tag; tags never overlap at one position except as
            // prefixes of nothing else, so the first found is the one.
            let next = self
                .tags()
                .filter_map(|t| rest.find(t).map(|i| (i, t)))
                .min_by_key(|&(i, _)| i);
            match next {
                Some((i, tag)) => {
                    self.text(&rest[..i], out);
                    self.tag(tag, out);
                    rest = &rest[i + tag.len()..];
                }
                None => {
                    let keep = if at_end { 0 } else { self.partial_len(rest) };
                    self.text(&rest[..rest.len() - keep], out);
                    self.buf = rest[rest.len() - keep..].to_string();
                    return;
                }
            }
        }
    }

    /// Longest suffix of `s` that is a proper prefix of some tag (all tags
    /// are ASCII, so the cut is a char boundary when the suffix matches).
    fn partial_len(&self, s: &str) -> usize {
        self.tags()
            .map(|tag| {
                (1..tag.len().min(s.len() + 1))
                    .rev()
                    .find(|&n| {
                        s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..])
                    })
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0)
    }

    fn text(&self, text: &str, out: &mut Vec<Event>) {
        if text.is_empty() {
            return;
        }
        let text = text.to_string();
        out.push(match self.state {
            State::Reasoning => Event::Reasoning(text),
            State::Content => Event::Content(text),
            State::Name => Event::Name(text),
            State::Args => Event::Args(text),
        });
    }

    fn tag(&mut self, tag: &'static str, out: &mut Vec<Event>) {
        use State::*;
        match (self.state, tag) {
            (Reasoning, THINK_START) | (Content, THINK_END) => {}
            (Reasoning, THINK_END) => self.state = Content,
            (Content, THINK_START) => self.state = Reasoning,
            (Reasoning, TOOL_START) if !self.tools => {
                self.state = Content;
                self.text(tag, out);
            }
            (Reasoning | Content, TOOL_START) if self.tools => {
                self.state = Name;
                out.push(Event::CallStart);
            }
            (Name, "<arg_key>") if self.tools => {
                self.state = Args;
                self.text(tag, out);
            }
            (Name | Args, TOOL_END) if self.tools => {
                self.state = Content;
                out.push(Event::CallEnd);
            }
            _ => self.text(tag, out),
        }
    }
}
