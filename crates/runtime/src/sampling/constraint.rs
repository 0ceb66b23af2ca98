//! Grammar-constrained decoding with llguidance: a request's grammar (a JSON
//! schema, or a Lark grammar embedding schemas) is compiled once when the
//! request arrives; its matcher travels with the request's sampler, masks the
//! logits row before each draw (disallowed tokens → -inf) and advances with
//! the chosen token. Both run in the sampler, so in the engine's parallel
//! sample phase, outside the engine lock, on host logits of any backend.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value as Json;
use toktrie::TokEnv;

use crate::error::{ModelError, Result};
use crate::tokenizer::Tokenizer;

/// What a request constrains its output to.
#[derive(Debug, Clone)]
pub enum Grammar {
    /// A JSON Schema (`{"type": "object"}` for OpenAI's `json_object`).
    JsonSchema(Json),
    /// llguidance's Lark dialect; `%json {...}` embeds a schema.
    Lark(String),
}

/// Compact JSON layout for a schema: `", "` and `": "` separators (Python's
/// `json.dumps`, what the tool-call parser re-serialises to) and no free
/// whitespace, so a weak model cannot spend its whole budget on blanks.
/// A schema's own `x-guidance` options win.
pub fn compact_layout(schema: &mut Json) {
    if let Json::Object(o) = schema {
        o.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            })
        });
    }
}

/// Compiles grammars against one model's vocabulary. Built once per model
/// at startup and shared (the token trie is the costly part).
pub struct GrammarCompiler {
    factory: ParserFactory,
}

impl GrammarCompiler {
    /// `vocab_size` is the width of the model's logits rows; `eos` the
    /// tokens that end generation (allowed once the grammar is complete).
    pub fn new(tokenizer: &Tokenizer, vocab_size: usize, eos: &[u32]) -> Result<Self> {
        let env: TokEnv = super::token_env::token_env(tokenizer, vocab_size, eos)?;
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| ModelError::Tokenizer(format!("grammar engine: {e}")))?;
        factory.quiet();
        Ok(GrammarCompiler { factory })
    }

    /// Compiles `grammar`; the error is the grammar engine's reason (an
    /// unsupported or invalid schema), for the client.
    pub fn compile(&self, grammar: Grammar) -> std::result::Result<Constraint, String> {
        let top = match grammar {
            Grammar::JsonSchema(schema) => TopLevelGrammar::from_json_schema(schema),
            Grammar::Lark(lark) => TopLevelGrammar::from_lark(lark),
        };
        let parser = self.factory.create_parser(top).map_err(|e| e.to_string())?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        Ok(Constraint {
            start: Arc::new(matcher),
        })
    }
}

/// A compiled grammar in its start state: cheap to clone, each sequence
/// starts its own matcher from it.
#[derive(Clone)]
pub struct Constraint {
    start: Arc<Matcher>,
}

impl Constraint {
    pub(crate) fn start(&self) -> ConstraintState {
        ConstraintState {
            matcher: self.start.deep_clone(),
        }
    }
}

impl PartialEq for Constraint {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.start, &other.start)
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Constraint")
    }
}

/// One sequence's position in its grammar.
#[derive(Clone)]
pub(crate) struct ConstraintState {
    matcher: Matcher,
}

impl std::fmt::Debug for ConstraintState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintState")
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

impl ConstraintState {
    /// The grammar's allowed next tokens as `vocab.div_ceil(32)` bitmask
    /// words (bit `t % 32` of word `t / 32`; ids past the grammar's mask
    /// are never allowed).
    pub(crate) fn mask_words(&mut self, vocab: usize) -> Result<Vec<u32>> {
        let allowed = self.matcher.compute_mask().map_err(grammar_error)?;
        let words = allowed.as_slice();
        Ok((0..vocab.div_ceil(32))
            .map(|i| words.get(i).copied().unwrap_or(0))
            .collect())
    }

    /// Moves past the sampled `token`.
    pub(crate) fn advance(&mut self, token: u32) -> Result<()> {
        self.matcher.consume_token(token).map_err(grammar_error)
    }

    /// The grammar is complete and allows nothing more (EOS was consumed, or
    /// the grammar ends on its own).
    pub(crate) fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}

fn grammar_error(e: impl std::fmt::Display) -> ModelError {
    ModelError::Sampling(format!("grammar: {e}"))
}
