//! Which shape of `message.content` a chat template expects.
//!
//! Text-only templates (Qwen3, GLM-4, Llama 3) concatenate `message.content`
//! as a string; multimodal-style templates (Qwen2-VL, Llama 4, Gemma 3) loop
//! over `message['content']` as a list of `{"type": ..., "text": ...}` parts.
//! vLLM detects this from the template's Jinja AST — a `for` loop over the
//! `content` of a message variable means the list ("openai") form — and
//! shapes every message's content accordingly. We apply the same rule on the
//! template's block tags.

/// The content shape given to the template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentFormat {
    /// `content` is a string; text parts are joined with `"\n"`.
    String,
    /// `content` is a list of `{"type": "text", "text": ...}` parts; plain
    /// strings are wrapped into one part.
    OpenAi,
}

/// Detects the format of `source` (see the module docs).
pub fn detect_content_format(source: &str) -> ContentFormat {
    let tags = block_tags(source);
    // Names bound to messages: `for message in messages...` and
    // `set message = messages[...]`.
    let mut message_vars: Vec<&str> = Vec::new();
    for tag in &tags {
        match tag.as_slice() {
            ["for", target, "in", iter, ..] if iter.starts_with("messages") => {
                message_vars.push(target)
            }
            ["set", target, "=", value, ..] if value.starts_with("messages[") => {
                message_vars.push(target)
            }
            _ => {}
        }
    }
    let loops_over_content = tags.iter().any(|tag| match tag.as_slice() {
        ["for", _, "in", iter, ..] => message_vars.iter().any(|var| {
            let Some(rest) = iter.strip_prefix(var) else {
                return false;
            };
            let rest = rest.split('|').next().unwrap_or(rest);
            matches!(rest, ".content" | "['content']" | "[\"content\"]")
        }),
        _ => false,
    });
    if loops_over_content {
        ContentFormat::OpenAi
    } else {
        ContentFormat::String
    }
}

/// The words of every `{% ... %}` tag, whitespace-control markers removed.
fn block_tags(source: &str) -> Vec<Vec<&str>> {
    let mut tags = Vec::new();
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("%}") else { break };
        let inner = after[..end].trim_start_matches(['-', '+']);
        let inner = inner.trim_end_matches(['-', '+']);
        tags.push(inner.split_whitespace().collect());
        rest = &after[end + 2..];
    }
    tags
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen3_is_string() {
        let config: serde_json::Value =
            serde_json::from_str(crate::QWEN3_TOKENIZER_CONFIG).expect("valid json");
        let source = config["chat_template"].as_str().expect("template string");
        assert_eq!(detect_content_format(source), ContentFormat::String);
    }

    #[test]
    fn loops_over_parts_are_openai() {
        for src in [
            "{% for message in messages %}{% for c in message['content'] %}{% endfor %}{% endfor %}",
            "{%- for m in messages -%}{%- for c in m.content | selectattr('type') -%}{%- endfor -%}{%- endfor -%}",
            "{% set last = messages[-1] %}{% for part in last[\"content\"] %}{% endfor %}",
        ] {
            assert_eq!(detect_content_format(src), ContentFormat::OpenAi, "{src}");
        }
        let src = "{% for m in messages %}{% for x in other.content %}{% endfor %}{% endfor %}";
        assert_eq!(detect_content_format(src), ContentFormat::String);
    }
}
