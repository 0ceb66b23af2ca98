//! Splitting Qwen3-style `<think>...</think>` reasoning from model output, as
//! vLLM's `qwen3` reasoning parser does.
//!
//! With thinking on, everything before `</think>` is reasoning: the model
//! usually opens with `<think>` itself (stripped here), but a template may
//! already have put `<think>` in the prompt, in which case the output starts
//! straight with the reasoning. Output that never closes the block was cut
//! short while thinking (length limit), so all of it is reasoning. With
//! thinking off (`enable_thinking: false`, whose prompt already contains an
//! empty think block) the output is plain content and tags are not
//! interpreted.

/// Opens a reasoning block.
pub const THINK_START: &str = "<think>";
/// Closes a reasoning block.
pub const THINK_END: &str = "</think>";

/// Whether the output is expected to start with reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReasoningMode {
    /// Text before `</think>` is reasoning (Qwen3's default).
    #[default]
    Enabled,
    /// No reasoning extraction; the whole output is content.
    Disabled,
}

impl ReasoningMode {
    /// The mode for a request's `chat_template_kwargs.enable_thinking`
    /// (absent means the template's default, which for Qwen3 is thinking).
    pub fn from_enable_thinking(enable_thinking: Option<bool>) -> Self {
        match enable_thinking {
            Some(false) => ReasoningMode::Disabled,
            _ => ReasoningMode::Enabled,
        }
    }
}

/// Splits whole `output` into `(reasoning, rest)`. `reasoning` is `None` when
/// empty; `rest` is the text after `</think>` (the content, before tool-call
/// extraction).
pub fn split_reasoning(output: &str, mode: ReasoningMode) -> (Option<String>, &str) {
    match mode {
        ReasoningMode::Disabled => (None, output),
        ReasoningMode::Enabled => {
            let body = output.strip_prefix(THINK_START).unwrap_or(output);
            let (reasoning, rest) = match body.find(THINK_END) {
                Some(i) => (&body[..i], &body[i + THINK_END.len()..]),
                None => (body, ""),
            };
            let reasoning = (!reasoning.is_empty()).then(|| reasoning.to_string());
            (reasoning, rest)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_like_vllm_qwen3() {
        let on = ReasoningMode::Enabled;
        assert_eq!(
            split_reasoning("<think>\nhmm\n</think>\n\nHi", on),
            (Some("\nhmm\n".to_string()), "\n\nHi")
        );
        // `<think>` was in the prompt.
        assert_eq!(
            split_reasoning("hmm</think>Hi", on),
            (Some("hmm".to_string()), "Hi")
        );
        // Cut off while thinking.
        assert_eq!(
            split_reasoning("<think>still", on),
            (Some("still".to_string()), "")
        );
        assert_eq!(split_reasoning("<think></think>x", on), (None, "x"));
        assert_eq!(
            split_reasoning("<think>a</think>b", ReasoningMode::Disabled),
            (None, "<think>a</think>b")
        );
    }
}
