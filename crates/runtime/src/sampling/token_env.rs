//! The tokenizer as the grammar engine (llguidance's `toktrie`) sees it: the
//! byte string of every token id, built once per model at startup (~150k
//! tokens for Qwen3: a trie build of ~0.1 s, too costly per request) and
//! shared by every request's constraint.
//!
//! Byte-level BPE vocabularies (Qwen3, GLM-4) spell bytes as printable
//! characters (GPT-2's map: `Ġ` is a space); byte-fallback vocabularies
//! (Llama, Mistral) spell raw bytes `<0xNN>` and spaces `▁`. Special added
//! tokens (`<|im_end|>`) get toktrie's special marker so grammars never
//! produce them as text; non-special added tokens (`<tool_call>`) are their
//! text, so the grammar literal `<tool_call>` matches the single token too.

use std::collections::HashMap;
use std::sync::Arc;

use tokenizers::DecoderWrapper;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::error::{ModelError, Result};
use crate::tokenizer::Tokenizer;

/// How a vocabulary spells bytes.
#[derive(Clone, Copy, PartialEq)]
enum Spelling {
    ByteLevel,
    ByteFallback,
}

/// A [`TokenizerEnv`] over a Hugging Face tokenizer.
struct HfTokenEnv {
    trie: TokTrie,
    hf: tokenizers::Tokenizer,
}

impl TokenizerEnv for HfTokenEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |s| {
            // An encoding error leaves the greedy trie tokenization (the
            // trait has no error path); it only affects forced-token hints.
            self.hf
                .encode(s, false)
                .map(|e| e.get_ids().to_vec())
                .unwrap_or_else(|_| self.trie.greedy_tokenize(s.as_bytes()))
        })
    }
}

/// Builds the token environment of `tokenizer` for a model whose logits rows
/// are `vocab_size` wide (padding ids past the tokenizer's vocabulary are
/// never allowed) and whose generation ends on `eos` tokens.
pub fn token_env(tokenizer: &Tokenizer, vocab_size: usize, eos: &[u32]) -> Result<TokEnv> {
    let hf = tokenizer.hf();
    let spelling = spelling(hf.get_decoder()).ok_or_else(|| {
        ModelError::Tokenizer(
            "structured outputs need a byte-level or byte-fallback tokenizer".into(),
        )
    })?;
    let n = vocab_size.max(hf.get_vocab_size(true));
    let mut words: Vec<Vec<u8>> = (0..n).map(|i| special_word(&format!("<[{i}]>"))).collect();
    let added = hf.get_added_tokens_decoder();
    let chars = byte_level_chars();
    for (id, word) in words.iter_mut().enumerate() {
        let Ok(id32) = u32::try_from(id) else { break };
        if let Some(a) = added.get(&id32) {
            *word = if a.special {
                special_word(&a.content)
            } else {
                a.content.as_bytes().to_vec()
            };
        } else if let Some(name) = hf.id_to_token(id32) {
            if let Some(bytes) = token_bytes(&name, spelling, &chars) {
                *word = bytes;
            }
        }
    }
    let first_eos = *eos
        .first()
        .ok_or_else(|| ModelError::Tokenizer("the model declares no EOS token".into()))?;
    let n32 = u32::try_from(n).map_err(|_| ModelError::Tokenizer("vocabulary too large".into()))?;
    if eos.iter().any(|&e| e >= n32) {
        return Err(ModelError::Tokenizer(
            "an EOS id is past the vocabulary".into(),
        ));
    }
    let trie = TokTrie::from(&TokRxInfo::new(n32, first_eos), &words).with_eos_tokens(eos);
    Ok(Arc::new(HfTokenEnv {
        trie,
        hf: hf.clone(),
    }))
}

fn special_word(name: &str) -> Vec<u8> {
    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
    w.extend_from_slice(name.as_bytes());
    w
}

fn spelling(d: Option<&DecoderWrapper>) -> Option<Spelling> {
    match d? {
        DecoderWrapper::ByteLevel(_) => Some(Spelling::ByteLevel),
        DecoderWrapper::ByteFallback(_) => Some(Spelling::ByteFallback),
        DecoderWrapper::Sequence(seq) => seq.get_decoders().iter().find_map(|d| spelling(Some(d))),
        _ => None,
    }
}

/// The bytes a vocabulary entry stands for; `None` for an entry that is not
/// a spelling of bytes (left as an unreachable special word).
fn token_bytes(name: &str, spelling: Spelling, chars: &HashMap<char, u8>) -> Option<Vec<u8>> {
    match spelling {
        Spelling::ByteLevel => name.chars().map(|c| chars.get(&c).copied()).collect(),
        Spelling::ByteFallback => {
            let hex = name.strip_prefix("<0x").and_then(|h| h.strip_suffix('>'));
            match hex {
                Some(h) if h.len() == 2 => u8::from_str_radix(h, 16).ok().map(|b| vec![b]),
                _ => Some(name.replace('▁', " ").into_bytes()),
            }
        }
    }
}

/// GPT-2's byte ↔ printable character map: printable Latin-1 bytes stand for
/// themselves, the other 68 bytes for U+0100 onwards, in byte order.
fn byte_level_chars() -> HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100u32;
    let mut map = HashMap::with_capacity(256);
    for b in 0..=255u8 {
        let c = if printable(b) {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or(char::REPLACEMENT_CHARACTER);
            next += 1;
            c
        };
        map.insert(c, b);
    }
    map
}
