//! The checkpoint's `tokenizer.json` and a streaming detokenizer.
//!
//! Byte-level BPE tokens can end in the middle of a UTF-8 character, so text
//! cannot be produced token by token. [`IncrementalDecoder`] re-decodes a short
//! window of recent tokens and emits only the new suffix, holding it back while
//! it ends in an incomplete character (U+FFFD), as vLLM and TGI do.

use std::path::Path;

use crate::error::{ModelError, Result};

/// A Hugging Face tokenizer.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(ModelError::MissingFile {
                path,
                what: "tokenizer.json (needed for text prompts and output text)",
            });
        }
        Self::from_file(&path)
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))?;
        Ok(Tokenizer { inner })
    }

    /// Token ids of `text`. Chat prompts already carry their special tokens,
    /// so callers usually pass `add_special_tokens = false`.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The vocabulary's spelling of token `id` (byte-level BPE's `Ġhello`,
    /// transformers' `convert_ids_to_tokens`); `None` outside the vocabulary.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The Hugging Face tokenizer itself (the grammar engine reads its vocabulary).
    pub(crate) fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// Turns a stream of token ids into a stream of complete UTF-8 text pieces.
#[derive(Debug, Clone, Default)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    /// Start of the window re-decoded for context (keeps merges such as a
    /// leading space right).
    prefix_offset: usize,
    /// End of the text already emitted.
    read_offset: usize,
    skip_special_tokens: bool,
}

impl IncrementalDecoder {
    pub fn new(skip_special_tokens: bool) -> Self {
        IncrementalDecoder {
            skip_special_tokens,
            ..Default::default()
        }
    }

    /// Adds one token; returns the text it completes, if any.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let skip = self.skip_special_tokens;
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset], skip)?;
        let full = tok.decode(&self.ids[self.prefix_offset..], skip)?;
        if full.len() <= prefix.len() || full.ends_with('\u{FFFD}') {
            return Ok(None);
        }
        match full.get(prefix.len()..) {
            Some(delta) if full.starts_with(&prefix) => {
                let delta = delta.to_owned();
                self.prefix_offset = self.read_offset;
                self.read_offset = self.ids.len();
                Ok(Some(delta))
            }
            _ => Ok(None),
        }
    }

    /// Emits whatever is held back at the end of generation (an incomplete
    /// character then shows as U+FFFD, as the full decode would).
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<Option<String>> {
        if self.read_offset >= self.ids.len() {
            return Ok(None);
        }
        let skip = self.skip_special_tokens;
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset], skip)?;
        let full = tok.decode(&self.ids[self.prefix_offset..], skip)?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        let delta = full.get(prefix.len()..).unwrap_or(&full).to_owned();
        Ok((!delta.is_empty()).then_some(delta))
    }
}
