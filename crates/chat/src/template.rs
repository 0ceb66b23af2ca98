//! A model's chat template, loaded from its Hugging Face `tokenizer_config.json`
//! and rendered the way `tokenizer.apply_chat_template(..., tokenize=False)`
//! renders it.

use crate::content_format::{detect_content_format, ContentFormat};
use crate::environment::{chat_environment, rewrite_generation_tags, RaisedException};
use crate::error::ChatError;
use crate::messages::{normalize_messages, template_tools, ChatMessage};
use minijinja::value::Serde;
use minijinja::{Environment, Value};
use serde_json::{Map, Value as Json};
use std::path::Path;

/// The Qwen3 `tokenizer_config.json` embedded as the default model's.
pub const QWEN3_TOKENIZER_CONFIG: &str =
    include_str!("../../../models/qwen3/tokenizer_config.json");

/// Options of one render, mirroring the request fields vLLM forwards.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RenderOptions {
    /// Append the assistant header so the model starts a new turn.
    pub add_generation_prompt: bool,
    /// Leave the final (assistant) message open so the model continues it.
    pub continue_final_message: bool,
    /// Extra template variables (`chat_template_kwargs`), e.g.
    /// `{"enable_thinking": false}` for Qwen3.
    pub chat_template_kwargs: Map<String, Json>,
}

impl RenderOptions {
    /// `chat_template_kwargs.enable_thinking` when it is a boolean.
    pub fn enable_thinking(&self) -> Option<bool> {
        self.chat_template_kwargs
            .get("enable_thinking")
            .and_then(Json::as_bool)
    }
}

/// Variables a template sees that `chat_template_kwargs` may not replace
/// (transformers would fail with "got multiple values for keyword argument").
const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// transformers' marker for `continue_final_message`: appended to the final
/// message, found again in the output, and everything from it on is cut.
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

const DEFAULT_NAME: &str = "default";
const TOOL_USE_NAME: &str = "tool_use";

/// One named template.
struct Entry {
    name: String,
    /// Kept for `continue_final_message`, which checks that the template
    /// reads `content`.
    source: String,
    content_format: ContentFormat,
}

/// A compiled chat template (or the named set some models ship) plus the
/// special tokens transformers passes to it (`bos_token`, `eos_token`, ...).
pub struct ChatTemplate {
    env: Environment<'static>,
    templates: Vec<Entry>,
    special_tokens: Vec<(String, String)>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("templates", &self.names())
            .field("special_tokens", &self.special_tokens)
            .finish()
    }
}

impl ChatTemplate {
    /// One template, with the special tokens given as `(name, token)` pairs
    /// such as `("eos_token", "<|im_end|>")`.
    pub fn new(source: &str, special_tokens: Vec<(String, String)>) -> Result<Self, ChatError> {
        Self::named(
            vec![(DEFAULT_NAME.to_string(), source.to_string())],
            special_tokens,
        )
    }

    /// Several named templates (the `[{"name": ..., "template": ...}]` form).
    /// `default` is used unless tools are given and `tool_use` exists.
    pub fn named(
        templates: Vec<(String, String)>,
        special_tokens: Vec<(String, String)>,
    ) -> Result<Self, ChatError> {
        let mut env = chat_environment().map_err(|e| ChatError::TemplateLoad(e.to_string()))?;
        for (name, source) in &templates {
            env.add_template_owned(name.clone(), rewrite_generation_tags(source))
                .map_err(|e| {
                    ChatError::TemplateLoad(format!("template '{name}' does not compile: {e}"))
                })?;
        }
        let templates = templates
            .into_iter()
            .map(|(name, source)| Entry {
                content_format: detect_content_format(&source),
                name,
                source,
            })
            .collect();
        Ok(ChatTemplate {
            env,
            templates,
            special_tokens,
        })
    }

    /// Parses a `tokenizer_config.json` document.
    pub fn from_tokenizer_config(json: &str) -> Result<Self, ChatError> {
        let config: Json = serde_json::from_str(json)
            .map_err(|e| ChatError::TemplateLoad(format!("tokenizer_config.json: {e}")))?;
        let templates = match config.get("chat_template") {
            Some(Json::String(source)) => vec![(DEFAULT_NAME.to_string(), source.clone())],
            Some(Json::Array(items)) => items
                .iter()
                .map(|item| {
                    let name = item.get("name").and_then(Json::as_str);
                    let source = item.get("template").and_then(Json::as_str);
                    match (name, source) {
                        (Some(n), Some(s)) => Ok((n.to_string(), s.to_string())),
                        _ => Err(ChatError::TemplateLoad(
                            "chat_template list entries need 'name' and 'template' strings"
                                .to_string(),
                        )),
                    }
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => {
                return Err(ChatError::TemplateLoad(
                    "tokenizer_config.json has no chat_template".to_string(),
                ))
            }
        };
        let special_tokens = ["bos_token", "eos_token", "unk_token", "pad_token"]
            .iter()
            .filter_map(|key| special_token(&config, key).map(|tok| (key.to_string(), tok)))
            .collect();
        Self::named(templates, special_tokens)
    }

    /// Reads and parses a `tokenizer_config.json` file.
    pub fn from_tokenizer_config_file(path: impl AsRef<Path>) -> Result<Self, ChatError> {
        let path = path.as_ref();
        let json = std::fs::read_to_string(path)
            .map_err(|e| ChatError::TemplateLoad(format!("{}: {e}", path.display())))?;
        Self::from_tokenizer_config(&json)
    }

    /// The embedded Qwen3 template.
    pub fn qwen3() -> Result<Self, ChatError> {
        Self::from_tokenizer_config(QWEN3_TOKENIZER_CONFIG)
    }

    /// Names of the available templates.
    pub fn names(&self) -> Vec<&str> {
        self.templates.iter().map(|t| t.name.as_str()).collect()
    }

    /// The content shape the template used for these `tools` expects.
    pub fn content_format(&self, has_tools: bool) -> Result<ContentFormat, ChatError> {
        self.select(has_tools).map(|t| t.content_format)
    }

    /// The special token `name` (`"eos_token"`, ...), if the config set it.
    pub fn special_token(&self, name: &str) -> Option<&str> {
        self.special_tokens
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.as_str())
    }

    /// transformers' `get_chat_template`: with several named templates, use
    /// `tool_use` when tools are given and it exists, else `default`.
    fn select(&self, has_tools: bool) -> Result<&Entry, ChatError> {
        let find = |name: &str| self.templates.iter().find(|t| t.name == name);
        let chosen = if has_tools { find(TOOL_USE_NAME) } else { None };
        chosen.or_else(|| find(DEFAULT_NAME)).ok_or_else(|| {
            ChatError::TemplateLoad(format!(
                "this model has multiple chat templates with no default; available: {:?}",
                self.names()
            ))
        })
    }

    /// Renders the prompt text for `messages` (and `tools`, the request's
    /// function definitions, as sent).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[Json]>,
        opts: &RenderOptions,
    ) -> Result<String, ChatError> {
        if opts.continue_final_message && opts.add_generation_prompt {
            return Err(ChatError::invalid(
                "continue_final_message",
                "continue_final_message and add_generation_prompt are not compatible: use \
                 continue_final_message to let the model continue the final message, and \
                 add_generation_prompt to start a new assistant message",
            ));
        }
        for key in opts.chat_template_kwargs.keys() {
            if RESERVED.contains(&key.as_str()) {
                return Err(ChatError::invalid(
                    format!("chat_template_kwargs.{key}"),
                    "is set by the server and cannot be overridden",
                ));
            }
        }
        let tools = tools.map(template_tools).transpose()?;
        let entry = self.select(tools.is_some())?;
        let mut msgs = normalize_messages(messages, entry.content_format)?;

        let final_content = if opts.continue_final_message {
            Some(tag_final_message(&mut msgs, &entry.source)?)
        } else {
            None
        };
        let msgs: Vec<Value> = msgs.iter().map(|m| Value::from(Serde(m))).collect();

        let mut ctx: Vec<(String, Value)> = self
            .special_tokens
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        for (k, v) in &opts.chat_template_kwargs {
            ctx.retain(|(name, _)| name != k);
            ctx.push((k.clone(), Value::from(Serde(v))));
        }
        ctx.push(("messages".into(), Value::from(msgs)));
        ctx.push((
            "tools".into(),
            tools.map(Value::from).unwrap_or(Value::from(())),
        ));
        ctx.push(("documents".into(), Value::from(())));
        ctx.push((
            "add_generation_prompt".into(),
            Value::from(opts.add_generation_prompt),
        ));

        let template = self
            .env
            .get_template(&entry.name)
            .map_err(|e| ChatError::TemplateLoad(e.to_string()))?;
        let rendered = template
            .render(Value::from_pairs(ctx))
            .map_err(template_error)?;
        match final_content {
            Some(final_content) => cut_at_continue_tag(rendered, &final_content),
            None => Ok(rendered),
        }
    }
}

/// transformers' `continue_final_message`: append the tag to the final
/// message's content and return the original content.
fn tag_final_message(msgs: &mut [Json], source: &str) -> Result<String, ChatError> {
    // transformers refuses templates that never read the field it continues.
    if !source.contains("content") {
        return Err(ChatError::invalid(
            "continue_final_message",
            "this model's chat template does not render message content",
        ));
    }
    let Some(Json::Object(last)) = msgs.last_mut() else {
        return Err(ChatError::invalid(
            "messages",
            "must contain at least one message",
        ));
    };
    // With list-shaped content transformers continues the last text part.
    let text = match last.get_mut("content") {
        Some(Json::Array(parts)) => parts.iter_mut().rev().find_map(|part| part.get_mut("text")),
        Some(content) => Some(content),
        None => None,
    };
    match text {
        Some(Json::String(text)) => {
            let original = text.clone();
            text.push_str(CONTINUE_TAG);
            Ok(original)
        }
        _ => Err(ChatError::invalid(
            "continue_final_message",
            "the final message has no text to continue",
        )),
    }
}

fn cut_at_continue_tag(rendered: String, final_content: &str) -> Result<String, ChatError> {
    let tag = CONTINUE_TAG.trim();
    if !rendered.contains(final_content.trim()) || !rendered.contains(tag) {
        return Err(ChatError::invalid(
            "continue_final_message",
            "the final message does not appear in the prompt after applying the chat template \
             (the template drops or rewrites part of it), so it cannot be continued",
        ));
    }
    let loc = rendered.rfind(tag).unwrap_or(rendered.len());
    if rendered[loc..].starts_with(CONTINUE_TAG) {
        Ok(rendered[..loc].to_string())
    } else {
        // The template trimmed whitespace after the tag, so trailing
        // whitespace of the message is not reliable either.
        Ok(rendered[..loc].trim_end().to_string())
    }
}

/// A special token from the config: a plain string, or an `AddedToken`
/// object whose text is under `content`.
fn special_token(config: &Json, key: &str) -> Option<String> {
    match config.get(key)? {
        Json::String(s) => Some(s.clone()),
        Json::Object(obj) => obj
            .get("content")
            .and_then(Json::as_str)
            .map(str::to_string),
        _ => None,
    }
}

fn template_error(err: minijinja::Error) -> ChatError {
    let raised = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<RaisedException>())
        .map(|e| e.0.clone());
    match raised {
        Some(message) => ChatError::Template(message),
        None => {
            tracing::debug!(error = %err, "chat template failed to render");
            ChatError::Template(err.to_string())
        }
    }
}
