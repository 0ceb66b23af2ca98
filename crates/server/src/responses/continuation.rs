//! The next turn of a response chain as tokens that extend the program's
//! KV exactly.
//!
//! Re-tokenising the re-rendered conversation does not give back the tokens
//! the model saw and wrote: templates rewrite earlier turns (Qwen3 drops the
//! reasoning of turns before the last user message, re-serialises tool
//! calls) and text rarely re-tokenises the same. The engine keeps a
//! program's KV only up to the first differing block (16 tokens), so the
//! previous turn's prompt would partly miss the cache. A chain therefore
//! continues its program's exact tokens:
//!
//! `prev prompt + prev generated + end of turn + the new messages`
//!
//! The end of turn (`<|im_end|>\n`) and the new messages' text come from
//! rendering probes: the template's text after a marker assistant answer,
//! and the growth of a one-user-message conversation when the new messages
//! are appended. A template for which the probe is not prefix-stable falls
//! back to tokenising the whole re-rendered conversation.

use agentd_runtime::Tokenizer;

use crate::error::ApiError;

/// What a stored response keeps to continue its chain token-exactly.
#[derive(Debug, Clone, Default)]
pub struct Turn {
    /// The prompt tokens it ran with.
    pub prompt: Vec<u32>,
    /// The generated tokens, trailing special tokens (EOS) dropped: the end
    /// of turn is added from the template.
    pub generated: Vec<u32>,
}

impl Turn {
    pub fn new(
        tokenizer: &Tokenizer,
        prompt: Vec<u32>,
        generated: &[u32],
    ) -> Result<Self, ApiError> {
        let mut end = generated.len();
        while end > 0 && tokenizer.decode(&generated[end - 1..end], true)?.is_empty() {
            end -= 1;
        }
        Ok(Turn {
            prompt,
            generated: generated[..end].to_vec(),
        })
    }
}

/// Text a marker answer is rendered with, to find what follows an answer.
pub const MARKER: &str = "agentd-continuation-marker";

/// The template's renderings the splice is made of.
pub struct Probes {
    /// A conversation ending in a [`MARKER`] assistant answer (no
    /// generation prompt).
    pub answered: String,
    /// A one-user-message conversation (no generation prompt).
    pub base: String,
    /// `base` with the new messages and the generation prompt.
    pub grown: String,
}

/// The prompt of `prev`'s next turn; `None` when the probes are not
/// prefix-stable (the caller tokenises the whole conversation).
pub fn tokens(
    tokenizer: &Tokenizer,
    prev: &Turn,
    probes: &Probes,
) -> Result<Option<Vec<u32>>, ApiError> {
    let closing = probes
        .answered
        .rfind(MARKER)
        .map(|i| &probes.answered[i + MARKER.len()..]);
    let rest = probes.grown.strip_prefix(probes.base.as_str());
    let (Some(closing), Some(rest)) = (closing, rest) else {
        tracing::debug!("template not prefix-stable: the chain's prompt is re-tokenised");
        return Ok(None);
    };
    let mut out = Vec::with_capacity(prev.prompt.len() + prev.generated.len() + 64);
    out.extend_from_slice(&prev.prompt);
    out.extend_from_slice(&prev.generated);
    out.extend(tokenizer.encode(closing, false)?);
    out.extend(tokenizer.encode(rest, false)?);
    Ok(Some(out))
}
