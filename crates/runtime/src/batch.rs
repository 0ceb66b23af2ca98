//! The flattened batch one model step runs on (docs/design.md §8).
//!
//! All new tokens of all sequences are concatenated into one list; per-sequence
//! metadata says where each sequence's tokens start (`cu_seqlens`), how long its
//! context is once these tokens are added (`context_lens`), where its KV lives
//! (`block_tables`) and where each new token's K/V is written (`slot_mapping`).
//! A sequence may bring one decode token or a whole prefill chunk; the model
//! does not care which.

use crate::error::{ModelError, Result};

/// One step's input. Build it with [`BatchBuilder`] or fill it by hand and let
/// the model [`validate`](BatchInput::validate) it.
#[derive(Debug, Clone, Default)]
pub struct BatchInput {
    /// New token ids of all sequences, concatenated. Length T.
    pub token_ids: Vec<u32>,
    /// Absolute position of each new token (drives RoPE). Length T.
    pub positions: Vec<u32>,
    /// Offsets of each sequence's new tokens in `token_ids`; length S+1,
    /// `cu_seqlens[0] == 0`, `cu_seqlens[S] == T`.
    pub cu_seqlens: Vec<usize>,
    /// Tokens each sequence attends over after this step: cached prefix + new
    /// tokens. The new tokens are the last `q_len` of the context.
    pub context_lens: Vec<usize>,
    /// Block ids holding each sequence's context, in order. Must cover
    /// `context_lens[s]` tokens.
    pub block_tables: Vec<Vec<u32>>,
    /// Cache slot of each new token: `block_id * block_size + offset`. Length T.
    pub slot_mapping: Vec<usize>,
    /// Indices into the flattened tokens whose logits are wanted, in output order.
    pub logits_indices: Vec<usize>,
}

/// Which logits a sequence wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsFor {
    /// Only the last new token (the next-token distribution).
    Last,
    /// Every new token (tests, prompt logprobs).
    All,
    /// None (a prefill chunk that is not the last).
    None,
}

impl BatchInput {
    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    pub fn num_seqs(&self) -> usize {
        self.context_lens.len()
    }

    /// New-token count of sequence `s`.
    pub fn query_len(&self, s: usize) -> usize {
        self.cu_seqlens[s + 1] - self.cu_seqlens[s]
    }

    /// Checks every invariant the model and the attention kernel rely on, so a
    /// malformed batch is an error rather than an out-of-bounds panic.
    pub fn validate(
        &self,
        block_size: usize,
        num_blocks: usize,
        max_positions: usize,
        vocab_size: usize,
    ) -> Result<()> {
        self.check_shape(vocab_size)?;
        for seq in 0..self.context_lens.len() {
            self.check_seq(seq, block_size, num_blocks, max_positions)?;
        }
        let t = self.token_ids.len();
        if let Some(&i) = self.logits_indices.iter().find(|&&i| i >= t) {
            return Err(ModelError::Batch(format!(
                "logits index {i} >= token count {t}"
            )));
        }
        Ok(())
    }

    /// The lengths agree (tokens, positions, slots; sequences, cu_seqlens,
    /// block tables), `cu_seqlens` spans the tokens, every id is in the
    /// vocabulary.
    fn check_shape(&self, vocab_size: usize) -> Result<()> {
        let bad = |m: String| Err(ModelError::Batch(m));
        let t = self.token_ids.len();
        let s = self.context_lens.len();
        if t == 0 {
            return bad("no tokens".into());
        }
        if self.positions.len() != t || self.slot_mapping.len() != t {
            return bad(format!(
                "token_ids ({t}), positions ({}) and slot_mapping ({}) differ in length",
                self.positions.len(),
                self.slot_mapping.len()
            ));
        }
        if self.cu_seqlens.len() != s + 1 || self.block_tables.len() != s {
            return bad(format!(
                "{s} context_lens need {} cu_seqlens (got {}) and {s} block tables (got {})",
                s + 1,
                self.cu_seqlens.len(),
                self.block_tables.len()
            ));
        }
        if self.cu_seqlens[0] != 0 || self.cu_seqlens[s] != t {
            return bad("cu_seqlens must start at 0 and end at the token count".into());
        }
        if let Some(&id) = self.token_ids.iter().find(|&&id| id as usize >= vocab_size) {
            return bad(format!("token id {id} >= vocab_size {vocab_size}"));
        }
        Ok(())
    }

    /// Sequence `seq` (after [`Self::check_shape`]): its new tokens fit its
    /// context and the model's positions, its block table holds the
    /// context in the cache, and each new token's slot is where the
    /// attention kernel will look for it.
    fn check_seq(
        &self,
        seq: usize,
        block_size: usize,
        num_blocks: usize,
        max_positions: usize,
    ) -> Result<()> {
        let bad = |m: String| Err(ModelError::Batch(m));
        let (lo, hi) = (self.cu_seqlens[seq], self.cu_seqlens[seq + 1]);
        if hi < lo {
            return bad(format!("cu_seqlens decreases at sequence {seq}"));
        }
        let q = hi - lo;
        let ctx = self.context_lens[seq];
        if q == 0 || q > ctx {
            return bad(format!(
                "sequence {seq}: {q} new tokens but context length {ctx}"
            ));
        }
        let too_long = |position: usize| ModelError::ContextTooLong {
            seq,
            position,
            max: max_positions,
        };
        if ctx > max_positions {
            return Err(too_long(ctx - 1));
        }
        let table = &self.block_tables[seq];
        if table.len() * block_size < ctx {
            return bad(format!(
                "sequence {seq}: block table of {} blocks cannot hold {ctx} tokens",
                table.len()
            ));
        }
        if let Some(&b) = table.iter().find(|&&b| b as usize >= num_blocks) {
            return bad(format!(
                "sequence {seq}: block id {b} >= cache size {num_blocks}"
            ));
        }
        for (i, tok) in (lo..hi).enumerate() {
            let pos = self.positions[tok] as usize;
            if pos >= max_positions {
                return Err(too_long(pos));
            }
            // The new token's slot must be where the attention kernel will
            // look for context index ctx - q + i.
            let idx = ctx - q + i;
            let want = table[idx / block_size] as usize * block_size + idx % block_size;
            let slot = self.slot_mapping[tok];
            if slot != want || slot >= num_blocks * block_size {
                return bad(format!(
                    "sequence {seq}: token {i} has slot {slot}, its block table puts context index {idx} at slot {want}"
                ));
            }
        }
        Ok(())
    }
}

/// Builds a [`BatchInput`] one sequence at a time.
#[derive(Debug, Clone)]
pub struct BatchBuilder {
    block_size: usize,
    batch: BatchInput,
}

impl BatchBuilder {
    pub fn new(block_size: usize) -> Self {
        BatchBuilder {
            block_size,
            batch: BatchInput {
                cu_seqlens: vec![0],
                ..BatchInput::default()
            },
        }
    }

    /// Adds a sequence whose first `num_cached` context tokens are already in
    /// the cache, bringing `new_tokens`. `block_table` must cover the whole
    /// context (checked by [`BatchInput::validate`]); positions continue from
    /// `num_cached`.
    pub fn push(
        &mut self,
        new_tokens: &[u32],
        num_cached: usize,
        block_table: &[u32],
        logits: LogitsFor,
    ) -> &mut Self {
        let b = &mut self.batch;
        let start = b.token_ids.len();
        let bs = self.block_size.max(1);
        for (i, &tok) in new_tokens.iter().enumerate() {
            let idx = num_cached + i;
            b.token_ids.push(tok);
            b.positions.push(u32::try_from(idx).unwrap_or(u32::MAX));
            // A table too short yields an out-of-range slot that validate reports.
            let slot = match block_table.get(idx / bs) {
                Some(&blk) => blk as usize * bs + idx % bs,
                None => usize::MAX,
            };
            b.slot_mapping.push(slot);
        }
        b.cu_seqlens.push(b.token_ids.len());
        b.context_lens.push(num_cached + new_tokens.len());
        b.block_tables.push(block_table.to_vec());
        match logits {
            LogitsFor::Last if !new_tokens.is_empty() => {
                b.logits_indices.push(b.token_ids.len() - 1)
            }
            LogitsFor::All => b.logits_indices.extend(start..b.token_ids.len()),
            _ => {}
        }
        self
    }

    pub fn build(self) -> BatchInput {
        self.batch
    }
}
