//! CUDA graphs for decode (issue 28 item 2), the host half: which steps
//! replay a captured graph, the bucket a step pads to, and the padded
//! metadata uploaded into the graph's fixed buffers before a replay. Pure
//! and always built (tested in CI); `graph.rs` (feature `cuda`) captures
//! and replays.
//!
//! A decode step of batch 1 on the 0.6B shape launches ~400 kernels at a
//! few µs each, 7.5× the HBM floor (kernels/NOTES.md); one graph launch
//! replaces them. A graph fixes every pointer and grid: the batch is padded
//! to a capture size (vLLM's list), and the longest context to a power of
//! two (the split-K decode's grid follows it; shorter sequences leave their
//! extra partitions empty, as in any mixed batch). Padding sequences write
//! nowhere (slot -1, which the cache write skips), attend over one token of
//! block 0 and their logits rows are dropped.

use agentd_runtime::BatchInput;

use crate::error::{CudaError, Result};

/// The smallest context bucket: below it one graph covers every context.
pub const CTX_CAP_MIN: usize = 1024;

/// vLLM's default capture sizes (`cudagraph_capture_sizes`: 1, 2, 4, every
/// 8 to 256, then every 16), up to `max` (vLLM's
/// `max_cudagraph_capture_size`, at most 512).
pub fn capture_sizes(max: usize) -> Vec<usize> {
    let max = max.clamp(1, 512);
    [1, 2, 4]
        .into_iter()
        .chain((8..=256).step_by(8))
        .chain((272..=512).step_by(16))
        .filter(|&s| s <= max)
        .collect()
}

/// A captured graph's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphKey {
    /// Sequences, padded.
    pub batch: usize,
    /// The longest context a graph's decode grid covers.
    pub ctx_cap: usize,
}

impl GraphKey {
    /// Block-table columns of the padded metadata.
    pub fn max_blocks(&self, block_size: usize) -> usize {
        self.ctx_cap.div_ceil(block_size.max(1))
    }
}

/// The graph `batch` replays, or `None` when it runs eagerly: a step with a
/// prefill chunk, a sequence without logits, more sequences than the
/// largest capture size, or a context past `max_model_len`'s bucket.
pub fn key_for(batch: &BatchInput, sizes: &[usize], max_model_len: usize) -> Option<GraphKey> {
    let s = batch.num_seqs();
    let decode = s > 0 && batch.num_tokens() == s && batch.cu_seqlens.len() == s + 1;
    let every_row = batch.logits_indices.iter().copied().eq(0..s);
    if !decode || !every_row {
        return None;
    }
    let padded = sizes.iter().copied().find(|&b| b >= s)?;
    let max_ctx = batch.context_lens.iter().copied().max()?;
    let ctx_cap = max_ctx.next_power_of_two().max(CTX_CAP_MIN);
    let limit = max_model_len.next_power_of_two().max(CTX_CAP_MIN);
    (ctx_cap <= limit).then_some(GraphKey {
        batch: padded,
        ctx_cap,
    })
}

/// The step's metadata padded to its graph: the i32 parts in the eager
/// path's order (token ids, positions, cu_seqlens, context lengths, block
/// tables, logits rows, prefill tiles: none) and the slot mapping.
#[derive(Debug, Clone, PartialEq)]
pub struct PaddedDecode {
    pub meta: Vec<i32>,
    pub offsets: [usize; 7],
    pub slots: Vec<i64>,
    pub max_blocks: usize,
    /// Real sequences (the first rows of the logits).
    pub real: usize,
}

/// `batch` padded to `key` (module docs). Refuses a batch the key does not
/// fit.
pub fn pad_decode(batch: &BatchInput, key: GraphKey, block_size: usize) -> Result<PaddedDecode> {
    let (s, b) = (batch.num_seqs(), key.batch);
    let max_blocks = key.max_blocks(block_size);
    let misfit = s > b
        || batch.num_tokens() != s
        || batch.context_lens.iter().any(|&c| c > key.ctx_cap)
        || batch.block_tables.iter().any(|t| t.len() > max_blocks);
    if misfit {
        return Err(CudaError::Unsupported(format!(
            "a decode of {s} sequences does not fit graph {key:?}"
        )));
    }
    let i32_of =
        |v: usize| i32::try_from(v).map_err(|_| CudaError::Unsupported(format!("{v} exceeds i32")));
    let pad = b - s;
    let mut parts: [Vec<i32>; 7] = Default::default();
    for &t in &batch.token_ids {
        parts[0].push(i32_of(t as usize)?);
    }
    parts[0].extend(std::iter::repeat_n(0, pad));
    for &p in &batch.positions {
        parts[1].push(i32_of(p as usize)?);
    }
    parts[1].extend(std::iter::repeat_n(0, pad));
    parts[2] = (0..=b).map(i32_of).collect::<Result<_>>()?;
    for &c in &batch.context_lens {
        parts[3].push(i32_of(c)?);
    }
    parts[3].extend(std::iter::repeat_n(1, pad));
    parts[4] = vec![0; b * max_blocks];
    for (row, table) in parts[4]
        .chunks_exact_mut(max_blocks)
        .zip(&batch.block_tables)
    {
        for (dst, &blk) in row.iter_mut().zip(table) {
            *dst = i32_of(blk as usize)?;
        }
    }
    parts[5] = (0..b).map(i32_of).collect::<Result<_>>()?;
    let mut meta = Vec::with_capacity(parts.iter().map(Vec::len).sum());
    let mut offsets = [0usize; 7];
    for (o, p) in offsets.iter_mut().zip(&parts) {
        *o = meta.len();
        meta.extend_from_slice(p);
    }
    let mut slots = Vec::with_capacity(b);
    for &sl in &batch.slot_mapping {
        slots.push(i64::try_from(sl).map_err(|_| CudaError::Unsupported("slot".into()))?);
    }
    slots.extend(std::iter::repeat_n(-1, pad));
    Ok(PaddedDecode {
        meta,
        offsets,
        slots,
        max_blocks,
        real: s,
    })
}

/// What the graphs' shared pool must hold for one key (`graph.rs`): a
/// key whose need the pool does not cover reallocates it, to the
/// element-wise max of both, and drops the graphs captured over it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolNeed {
    /// i32 metadata words ([`PaddedDecode::meta`]).
    pub meta: usize,
    /// Padded sequences (rows of activations and logits).
    pub batch: usize,
    /// Split-K scratch rows of the decode.
    pub scratch_rows: usize,
}

impl PoolNeed {
    pub fn covers(&self, other: &PoolNeed) -> bool {
        self.meta >= other.meta
            && self.batch >= other.batch
            && self.scratch_rows >= other.scratch_rows
    }

    pub fn max(&self, other: &PoolNeed) -> PoolNeed {
        PoolNeed {
            meta: self.meta.max(other.meta),
            batch: self.batch.max(other.batch),
            scratch_rows: self.scratch_rows.max(other.scratch_rows),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentd_runtime::{BatchBuilder, LogitsFor};

    fn decode(contexts: &[usize], block_size: usize) -> BatchInput {
        let mut b = BatchBuilder::new(block_size);
        let mut next = 0u32;
        for (i, &c) in contexts.iter().enumerate() {
            let blocks = c.div_ceil(block_size) as u32;
            let table: Vec<u32> = (next..next + blocks).collect();
            next += blocks;
            b.push(&[10 + i as u32], c - 1, &table, LogitsFor::Last);
        }
        b.build()
    }

    #[test]
    fn a_pool_grows_to_cover_every_key_it_met() {
        let need = |meta, batch, scratch_rows| PoolNeed {
            meta,
            batch,
            scratch_rows,
        };
        let (a, b) = (need(100, 8, 50), need(80, 16, 10));
        assert!(!a.covers(&b) && !b.covers(&a));
        let both = a.max(&b);
        assert_eq!(both, need(100, 16, 50));
        assert!(both.covers(&a) && both.covers(&b) && both.covers(&both));
    }

    #[test]
    fn capture_sizes_are_vllms() {
        let s = capture_sizes(512);
        assert_eq!(&s[..5], &[1, 2, 4, 8, 16]);
        assert!(s.contains(&256) && s.contains(&272) && !s.contains(&264));
        assert_eq!((s.len(), s.last()), (3 + 32 + 16, Some(&512)));
        assert_eq!(capture_sizes(20), [1, 2, 4, 8, 16]);
        assert_eq!(capture_sizes(0), [1]);
    }

    #[test]
    fn decode_steps_pick_their_bucket_others_run_eagerly() {
        let sizes = capture_sizes(512);
        let key = key_for(&decode(&[5, 300, 2000], 16), &sizes, 8192).unwrap();
        assert_eq!(
            key,
            GraphKey {
                batch: 4,
                ctx_cap: 2048
            }
        );
        let short = key_for(&decode(&[3], 16), &sizes, 8192).unwrap();
        assert_eq!((short.batch, short.ctx_cap), (1, CTX_CAP_MIN));
        // Past the model's window bucket, or more sequences than any size.
        assert!(key_for(&decode(&[9000], 16), &sizes, 8192).is_none());
        assert!(key_for(&decode(&vec![4; 30], 16), &capture_sizes(16), 8192).is_none());
        // A prefill chunk, or a sequence without logits: eager.
        let mut b = BatchBuilder::new(16);
        b.push(&[1, 2, 3], 0, &[0], LogitsFor::Last);
        assert!(key_for(&b.build(), &sizes, 8192).is_none());
        let mut b = BatchBuilder::new(16);
        b.push(&[1], 4, &[0], LogitsFor::None);
        assert!(key_for(&b.build(), &sizes, 8192).is_none());
        assert!(key_for(&BatchBuilder::new(16).build(), &sizes, 8192).is_none());
    }

    #[test]
    fn padding_writes_nowhere_and_keeps_the_real_rows_first() {
        let batch = decode(&[5, 40], 16);
        let key = GraphKey {
            batch: 4,
            ctx_cap: 1024,
        };
        let p = pad_decode(&batch, key, 16).unwrap();
        assert_eq!((p.real, p.max_blocks), (2, 64));
        let part = |i: usize| {
            let end = p.offsets.get(i + 1).copied().unwrap_or(p.meta.len());
            &p.meta[p.offsets[i]..end]
        };
        assert_eq!(part(0), [10, 11, 0, 0]);
        assert_eq!(part(1), [4, 39, 0, 0]);
        assert_eq!(part(2), [0, 1, 2, 3, 4]);
        assert_eq!(part(3), [5, 40, 1, 1]);
        assert_eq!(part(4).len(), 4 * 64);
        assert_eq!(&part(4)[..3], [0, 0, 0]);
        assert_eq!(&part(4)[64..67], [1, 2, 3]);
        assert!(part(4)[128..].iter().all(|&x| x == 0));
        assert_eq!(part(5), [0, 1, 2, 3]);
        assert!(part(6).is_empty());
        assert_eq!(p.slots, [4, 3 * 16 + 7, -1, -1]);
        // A batch larger than the key, or a context past it, is refused.
        let small = GraphKey {
            batch: 1,
            ctx_cap: 1024,
        };
        assert!(pad_decode(&batch, small, 16).is_err());
        let long = decode(&[2000], 16);
        assert!(pad_decode(&long, small, 16).is_err());
    }
}
