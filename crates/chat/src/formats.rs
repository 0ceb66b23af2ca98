//! Which output format a model writes, by vLLM's parser names
//! (`--tool-call-parser`, `--reasoning-parser`), chosen from the model
//! family unless overridden.

use std::fmt;

/// Tool-call formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolParser {
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen3,
    /// Qwen2.5, Hermes): vLLM's `hermes`.
    #[default]
    Hermes,
    /// `<tool_call>NAME<arg_key>k</arg_key><arg_value>v</arg_value>...</tool_call>`
    /// (GLM-4.5/4.6/4.7): vLLM's `glm45` / `glm47`.
    Glm45,
}

/// Reasoning formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReasoningParser {
    /// Text before `</think>` is reasoning (vLLM's `qwen3`).
    #[default]
    Qwen3,
    /// GLM-4.5's `<think>`: reasoning until `</think>` or a tool call, may
    /// reopen, trailing whitespace dropped (vLLM's `glm45` / `glm47`).
    Glm45,
}

/// vLLM's names accepted by `--tool-call-parser`.
pub const TOOL_PARSER_NAMES: &[&str] = &["hermes", "glm45", "glm47"];
/// vLLM's names accepted by `--reasoning-parser`.
pub const REASONING_PARSER_NAMES: &[&str] = &["qwen3", "glm45", "glm47"];

/// A parser choice that cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnknownParser {
    /// The message lists the valid names.
    #[error("unknown {kind} '{name}'; valid: {}", valid.join(", "))]
    Name {
        kind: &'static str,
        name: String,
        valid: &'static [&'static str],
    },
    #[error("the glm45 tool-call parser and the glm45 reasoning parser only come as a pair (one state machine: a tool call ends reasoning); got tool-call parser {tool}, reasoning parser {reasoning}")]
    Mixed { tool: String, reasoning: String },
}

impl ToolParser {
    pub fn from_name(name: &str) -> Result<Self, UnknownParser> {
        match name {
            "hermes" => Ok(ToolParser::Hermes),
            "glm45" | "glm47" => Ok(ToolParser::Glm45),
            _ => Err(UnknownParser::Name {
                kind: "tool-call parser",
                name: name.to_string(),
                valid: TOOL_PARSER_NAMES,
            }),
        }
    }
}

impl ReasoningParser {
    pub fn from_name(name: &str) -> Result<Self, UnknownParser> {
        match name {
            "qwen3" => Ok(ReasoningParser::Qwen3),
            "glm45" | "glm47" => Ok(ReasoningParser::Glm45),
            _ => Err(UnknownParser::Name {
                kind: "reasoning parser",
                name: name.to_string(),
                valid: REASONING_PARSER_NAMES,
            }),
        }
    }
}

/// The pair of parsers a server applies to every generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutputFormat {
    pub tool: ToolParser,
    pub reasoning: ReasoningParser,
}

impl OutputFormat {
    /// The format of a model family (`config.json` `model_type`): GLM-4.5
    /// MoE (`glm4_moe`) writes GLM tool calls; everything else here writes
    /// Hermes/Qwen3 ones.
    pub fn for_model_type(model_type: &str) -> Self {
        match model_type {
            "glm4_moe" => OutputFormat {
                tool: ToolParser::Glm45,
                reasoning: ReasoningParser::Glm45,
            },
            _ => OutputFormat::default(),
        }
    }

    /// `for_model_type` overridden by the flags' names. The GLM tool format
    /// and reasoning are one state machine in vLLM (a tool call ends
    /// reasoning), so they only come as a pair.
    pub fn resolve(
        model_type: &str,
        tool: Option<&str>,
        reasoning: Option<&str>,
    ) -> Result<Self, UnknownParser> {
        let mut format = OutputFormat::for_model_type(model_type);
        if let Some(name) = tool {
            format.tool = ToolParser::from_name(name)?;
        }
        if let Some(name) = reasoning {
            format.reasoning = ReasoningParser::from_name(name)?;
        }
        if (format.tool == ToolParser::Glm45) != (format.reasoning == ReasoningParser::Glm45) {
            return Err(UnknownParser::Mixed {
                tool: tool.unwrap_or("(family default)").to_string(),
                reasoning: reasoning.unwrap_or("(family default)").to_string(),
            });
        }
        Ok(format)
    }

    /// Whether the GLM state machine parses this output.
    pub(crate) fn is_glm(&self) -> bool {
        self.tool == ToolParser::Glm45
    }
}

impl fmt::Display for OutputFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tool = match self.tool {
            ToolParser::Hermes => "hermes",
            ToolParser::Glm45 => "glm45",
        };
        let reasoning = match self.reasoning {
            ReasoningParser::Qwen3 => "qwen3",
            ReasoningParser::Glm45 => "glm45",
        };
        write!(f, "tool-call parser {tool}, reasoning parser {reasoning}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_family_defaults() {
        let glm = OutputFormat::resolve("glm4_moe", None, None).expect("valid");
        assert_eq!(glm.tool, ToolParser::Glm45);
        let qwen = OutputFormat::resolve("qwen3", Some("glm47"), Some("glm45")).expect("valid");
        assert!(qwen.is_glm());
        assert!(OutputFormat::resolve("qwen3", Some("glm45"), None).is_err());
        let err = OutputFormat::resolve("qwen3", Some("nope"), None).expect_err("unknown");
        assert_eq!(
            err.to_string(),
            "unknown tool-call parser 'nope'; valid: hermes, glm45, glm47"
        );
    }
}
