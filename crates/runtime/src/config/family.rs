//! The model families this crate runs, named as `config.json` names them.

/// A decoder family: which layer structure and weight names a checkpoint has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// Qwen3 dense (`Qwen3ForCausalLM`).
    Qwen3,
    /// GLM-4-0414 dense (`Glm4ForCausalLM`).
    Glm4,
    /// Qwen3 MoE, e.g. Qwen3-30B-A3B (`Qwen3MoeForCausalLM`).
    Qwen3Moe,
    /// GLM-4.5 / 4.6 / 4.5-Air MoE (`Glm4MoeForCausalLM`).
    Glm4Moe,
}

const ALL: [Family; 4] = [
    Family::Qwen3,
    Family::Glm4,
    Family::Qwen3Moe,
    Family::Glm4Moe,
];

impl Family {
    /// `config.json`'s `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Qwen3 => "qwen3",
            Family::Glm4 => "glm4",
            Family::Qwen3Moe => "qwen3_moe",
            Family::Glm4Moe => "glm4_moe",
        }
    }

    /// `config.json`'s `architectures[0]`.
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Qwen3 => "Qwen3ForCausalLM",
            Family::Glm4 => "Glm4ForCausalLM",
            Family::Qwen3Moe => "Qwen3MoeForCausalLM",
            Family::Glm4Moe => "Glm4MoeForCausalLM",
        }
    }

    pub fn from_model_type(s: &str) -> Option<Self> {
        ALL.into_iter().find(|f| f.model_type() == s)
    }

    pub fn from_architecture(s: &str) -> Option<Self> {
        ALL.into_iter().find(|f| f.architecture() == s)
    }

    /// "qwen3, glm4, qwen3_moe, glm4_moe", for error messages.
    pub fn supported() -> String {
        ALL.map(Family::model_type).join(", ")
    }

    /// Whether the family has mixture-of-experts layers.
    pub fn is_moe(self) -> bool {
        matches!(self, Family::Qwen3Moe | Family::Glm4Moe)
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.model_type())
    }
}
