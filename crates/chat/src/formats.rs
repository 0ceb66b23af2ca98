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
    /// The format of a model family (`config.json` `model_type`), as the
    /// parsers one serves it with in vLLM (0.32 has no per-family default:
    /// `--tool-call-parser` is required with `--enable-auto-tool-choice`):
    ///
    /// - `glm4_moe` (GLM-4.5/4.6/4.7): `glm45` / `glm45` (vLLM's `glm45` and
    ///   `glm47` are one parser, `Glm47MoeModelToolParser`).
    /// - `qwen3`, `qwen3_moe` (Qwen3, Qwen3-30B-A3B): `hermes` / `qwen3`, the
    ///   `<tool_call>{json}</tool_call>` their chat templates ask for (vLLM's
    ///   `qwen3_json` is an alias of `hermes`). Qwen3-Coder, also
    ///   `qwen3_moe`, writes XML calls (vLLM's `qwen3_coder`, not here):
    ///   pass the flag.
    /// - `glm4` (GLM-4-0414): its template asks for the call as the function
    ///   name, a newline and the JSON arguments right after `<|assistant|>`,
    ///   a format no vLLM parser reads; `hermes` / `qwen3` parse a checkpoint
    ///   whose template asks for Hermes calls, and GLM-Z1-0414's `<think>`.
    pub fn for_model_type(model_type: &str) -> Self {
        match model_type {
            "glm4_moe" => OutputFormat {
                tool: ToolParser::Glm45,
                reasoning: ReasoningParser::Glm45,
            },
            "qwen3" | "qwen3_moe" | "glm4" => OutputFormat {
                tool: ToolParser::Hermes,
                reasoning: ReasoningParser::Qwen3,
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
        for family in ["qwen3", "qwen3_moe", "glm4"] {
            let f = OutputFormat::resolve(family, None, None).expect("valid");
            assert_eq!(
                (f.tool, f.reasoning),
                (ToolParser::Hermes, ReasoningParser::Qwen3),
                "{family}"
            );
        }
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
