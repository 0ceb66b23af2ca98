//! One program's conversation as the bench sends it: the token context
//! (token mode) or the chat messages (chat mode), grown turn by turn, and the
//! check that a reply counted exactly what was asked.

use serde_json::{json, Value};

use crate::client::{Mode, Prompt, StepReply};
use crate::workload::text_for;

/// The context of one program in the form its mode sends.
pub(crate) struct Conversation {
    mode: Mode,
    context: Vec<u32>,
    messages: Vec<Value>,
}

impl Conversation {
    /// A conversation holding only the shared system prompt.
    pub(crate) fn new(mode: Mode, system: &[u32]) -> Self {
        let mut c = Conversation {
            mode,
            context: Vec::new(),
            messages: Vec::new(),
        };
        match mode {
            Mode::Tokens => c.context.extend_from_slice(system),
            Mode::Chat => c
                .messages
                .push(json!({"role": "system", "content": text_for(system)})),
        }
        c
    }

    /// A turn taken before the program joined: its input and a stand-in
    /// output, as history.
    pub(crate) fn history(&mut self, appended: &[u32], output: &[u32]) {
        self.user(appended);
        match self.mode {
            Mode::Tokens => self.context.extend_from_slice(output),
            Mode::Chat => self
                .messages
                .push(json!({"role": "assistant", "content": text_for(output)})),
        }
    }

    /// The next turn's input (the tool output or task text).
    pub(crate) fn user(&mut self, appended: &[u32]) {
        match self.mode {
            Mode::Tokens => self.context.extend_from_slice(appended),
            Mode::Chat => self
                .messages
                .push(json!({"role": "user", "content": text_for(appended)})),
        }
    }

    /// What the next step sends.
    pub(crate) fn prompt(&self) -> Prompt<'_> {
        match self.mode {
            Mode::Tokens => Prompt::Tokens(&self.context),
            Mode::Chat => Prompt::Chat(&self.messages),
        }
    }

    /// The prompt's length in tokens: known here in token mode, the
    /// server's count in chat mode (its template decides).
    pub(crate) fn prompt_tokens(&self, reply: &StepReply) -> usize {
        match self.mode {
            Mode::Tokens => self.context.len(),
            Mode::Chat => reply.prompt_tokens,
        }
    }

    /// The reply, appended for the next turn.
    pub(crate) fn assistant(&mut self, reply: &StepReply) {
        match self.mode {
            Mode::Tokens => self.context.extend_from_slice(&reply.token_ids),
            Mode::Chat => self
                .messages
                .push(json!({"role": "assistant", "content": reply.text})),
        }
    }

    /// Why `reply` does not count what was asked (`asked` tokens for a
    /// `prompt_tokens`-token prompt), if it does not: a bench that cannot
    /// trust the counts measures nothing.
    pub(crate) fn inexact(
        &self,
        asked: usize,
        prompt_tokens: usize,
        reply: &StepReply,
    ) -> Option<String> {
        let tokens = self.mode == Mode::Tokens;
        let exact = reply.completion_tokens == asked
            && (!tokens
                || (reply.token_ids.len() == asked
                    && (reply.prompt_tokens == 0 || reply.prompt_tokens == prompt_tokens)));
        (!exact).then(|| {
            format!(
                "inexact counts: asked {asked} tokens for a {prompt_tokens}-token prompt, got {} ids, usage {}+{}",
                reply.token_ids.len(),
                reply.prompt_tokens,
                reply.completion_tokens
            )
        })
    }
}
