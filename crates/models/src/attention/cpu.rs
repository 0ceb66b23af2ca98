//! CPU paged attention for a mixed batch (prefill chunks and decode tokens).
//!
//! Each new token of sequence `s` sits at context index `ctx - q_len + i` and
//! attends causally over context indices `0..=that`, whose K/V are read through
//! the sequence's block table. The work is split into independent tasks of
//! (sequence, KV head, chunk of query tokens) run on rayon: a task loads each
//! key/value block of its KV head once and uses it for every query head of the
//! GQA group and every query token of the chunk, keeping a running (online)
//! softmax per query row so no score buffer grows with the context. Inner loops
//! are dot products and axpys over `head_dim` contiguous f32s (see `simd`).
//! Scratch is allocated once per task, never per token.

use rayon::prelude::*;

use super::cache::LayerKv;
use crate::batch::BatchInput;
use crate::cpu_kernels::{self, KernelPath};
use crate::simd;

/// Query tokens per task: long prefills split into many tasks (parallelism),
/// while each task still reuses every key block for up to this many queries.
const QUERY_CHUNK: usize = 16;

/// Head geometry of one attention layer and the cache block size.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
}

/// The output rows of different tasks are disjoint `(token, head)` pairs, but
/// they interleave in memory, so tasks write through a shared raw pointer.
#[derive(Clone, Copy)]
pub(super) struct OutPtr(pub(super) *mut f32);
// SAFETY: each task writes only the rows of its own (token, head) pairs; no two
// tasks share a pair (see `paged_attention`), and the buffer outlives the scope.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// What every task of one call reads.
pub(super) struct Job<'a> {
    pub q: &'a [f32],
    pub kv: &'a LayerKv,
    pub batch: &'a BatchInput,
    pub shape: AttentionShape,
    pub scale: f32,
    /// The kernel path (the portable kernel's vector helpers follow it).
    pub path: KernelPath,
}

/// One task: query tokens `lo..hi` of sequence `seq`, for the query heads
/// of KV head `kv_head`.
#[derive(Clone, Copy)]
pub(super) struct Task {
    pub seq: usize,
    pub kv_head: usize,
    pub lo: usize,
    pub hi: usize,
}

/// A task kernel: the portable [`attend_chunk`] or a vectorised one.
pub(super) type ChunkFn = fn(&Job<'_>, Task, OutPtr);

/// The kernel of `path` for head dim `d` (the portable one where the path
/// has no vectorised form for `d`).
fn kernel(path: KernelPath, d: usize) -> ChunkFn {
    let f = match cpu_kernels::check(path) {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512 => super::avx512::select(d),
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2 => super::avx2::select(d),
        #[cfg(target_arch = "aarch64")]
        KernelPath::Neon => super::neon::select(d),
        _ => None,
    };
    let _ = d;
    f.unwrap_or(attend_chunk)
}

/// Computes attention for every new token of `batch`.
///
/// `q` is `[T, num_heads, head_dim]` (already normed and rotated), `kv` holds
/// the layer's cache *including* the new tokens' K/V (written beforehand), and
/// `out` receives `[T, num_heads, head_dim]`. The batch must have been
/// validated against the cache (slots and block tables in range).
pub fn paged_attention(
    q: &[f32],
    kv: &LayerKv,
    batch: &BatchInput,
    shape: AttentionShape,
    scale: f32,
    out: &mut [f32],
) {
    paged_attention_on(cpu_kernels::path(), q, kv, batch, shape, scale, out)
}

/// [`paged_attention`] on the given kernel path (panics if the CPU lacks it).
pub fn paged_attention_on(
    path: KernelPath,
    q: &[f32],
    kv: &LayerKv,
    batch: &BatchInput,
    shape: AttentionShape,
    scale: f32,
    out: &mut [f32],
) {
    let job = Job {
        q,
        kv,
        batch,
        shape,
        scale,
        path,
    };
    run(kernel(path, shape.head_dim), &job, out);
}

/// Splits `job` into tasks and runs `chunk` on each, in parallel.
fn run(chunk: ChunkFn, job: &Job<'_>, out: &mut [f32]) {
    let Job {
        q, batch, shape, ..
    } = *job;
    let t = batch.num_tokens();
    let (h, d) = (shape.num_heads, shape.head_dim);
    assert_eq!(q.len(), t * h * d, "q has the wrong size");
    assert_eq!(out.len(), t * h * d, "out has the wrong size");

    let mut tasks = Vec::new();
    for seq in 0..batch.num_seqs() {
        let q_len = batch.query_len(seq);
        for kv_head in 0..shape.num_kv_heads {
            let mut lo = 0;
            while lo < q_len {
                let hi = (lo + QUERY_CHUNK).min(q_len);
                tasks.push(Task {
                    seq,
                    kv_head,
                    lo,
                    hi,
                });
                lo = hi;
            }
        }
    }
    let out_ptr = OutPtr(out.as_mut_ptr());
    tasks.par_iter().for_each(|&task| chunk(job, task, out_ptr));
}

/// Blocks ahead of the one a task is reading whose K and V it prefetches.
/// A decode step streams each sequence's blocks once from memory, and the
/// allocator scatters them, so the hardware prefetchers, which follow runs
/// within a page, restart at every block (4-16 KiB per KV head). Two blocks
/// ahead is a few hundred ns of compute, past DRAM latency.
/// `cargo bench -p agentd-models --bench attention_decode` (AMD EPYC, 32
/// sequences of 4,096 / 8,192 tokens over shuffled blocks, against the same
/// build without it): GQA 1 x 64 1.06-1.18x on avx512, 0.98-1.15x on avx2;
/// GQA 4 x 128 1.05-1.16x (`benches/results/attention-decode-AMD-EPYC`).
/// x86_64 only: the NEON kernel does not prefetch (no aarch64 machine has
/// measured it, and `core::arch::aarch64::_prefetch` is unstable).
#[cfg(target_arch = "x86_64")]
const PF_BLOCKS: usize = 2;

/// Tasks of at most this many query tokens prefetch (decode, and the few
/// tokens of a speculative step). A prefill chunk's task (16 queries)
/// computes 16 rows for each key it loads and its keys were just read by
/// the chunk before it, so there a prefetch would only add instructions.
#[cfg(target_arch = "x86_64")]
pub(super) const PF_MAX_QUERIES: usize = 2;

/// Prefetches, for the task on KV head `kv_head` now entering block index
/// `blk` of `table`, the K and V of block `blk + PF_BLOCKS` if the task
/// reads it (`end`: the keys it reads). One prefetch per cache line: a
/// block's K (and V) of one head is `block_size * head_dim` contiguous
/// floats in either layout (`cache.rs`).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(super) fn prefetch_ahead(job: &Job<'_>, table: &[u32], blk: usize, end: usize, kv_head: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let sh = job.shape;
    let ahead = blk + PF_BLOCKS;
    if ahead * sh.block_size >= end {
        return;
    }
    let Some(&block) = table.get(ahead) else {
        return;
    };
    let len = sh.block_size * sh.head_dim;
    let base = (block as usize * sh.num_kv_heads + kv_head) * len;
    let (Some(k), Some(v)) = (
        job.kv.k.get(base..base + len),
        job.kv.v.get(base..base + len),
    ) else {
        return;
    };
    for i in (0..len).step_by(16) {
        // SAFETY: a prefetch is a hint that never faults, and both
        // pointers are in bounds (`get` above); SSE is baseline on
        // x86_64.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(k.as_ptr().add(i) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(v.as_ptr().add(i) as *const i8);
        }
    }
}

/// The portable task kernel: one dot product, `exp` and axpy per (row, key).
fn attend_chunk(job: &Job<'_>, task: Task, out: OutPtr) {
    let Job {
        q,
        kv,
        batch,
        shape,
        scale,
        path,
    } = *job;
    let Task {
        seq: s,
        kv_head: kvh,
        lo,
        hi,
    } = task;
    let AttentionShape {
        num_heads,
        num_kv_heads,
        head_dim: d,
        block_size: bs,
    } = shape;
    let group = num_heads / num_kv_heads;
    let tok0 = batch.cu_seqlens[s];
    let ctx = batch.context_lens[s];
    let first = ctx - batch.query_len(s); // context index of query 0
    let table = &batch.block_tables[s];
    let rows = (hi - lo) * group;

    // Running softmax state per (query, head-in-group) row.
    let mut m = vec![f32::NEG_INFINITY; rows];
    let mut l = vec![0f32; rows];
    let mut acc = vec![0f32; rows * d];
    let mut scores = vec![0f32; bs];

    let last_key = first + hi - 1; // the chunk's last query sees keys 0..=last_key
    for (bi, &block) in table.iter().enumerate().take(last_key / bs + 1) {
        let j0 = bi * bs;
        let base = (block as usize * num_kv_heads + kvh) * bs * d;
        let kblk = &kv.k[base..base + bs * d];
        let vblk = &kv.v[base..base + bs * d];
        for qi in lo..hi {
            let qidx = first + qi;
            if j0 > qidx {
                continue; // the whole block is in this query's future
            }
            let n = (qidx + 1 - j0).min(bs);
            for g in 0..group {
                let head = kvh * group + g;
                let qoff = ((tok0 + qi) * num_heads + head) * d;
                let qv = &q[qoff..qoff + d];
                let r = (qi - lo) * group + g;
                // K is `[head_dim, block_size]` in a block: scores for all
                // keys at once, one axpy per head-dim component.
                let sc = &mut scores[..n];
                sc.fill(0.0);
                for (x, krow) in qv.iter().zip(kblk.chunks_exact(bs)) {
                    simd::axpy_on(path, sc, *x, &krow[..n]);
                }
                let mut bmax = f32::NEG_INFINITY;
                for s in sc.iter_mut() {
                    *s *= scale;
                    bmax = bmax.max(*s);
                }
                let new_m = m[r].max(bmax);
                let arow = &mut acc[r * d..(r + 1) * d];
                if m[r] != f32::NEG_INFINITY && m[r] != new_m {
                    let corr = (m[r] - new_m).exp();
                    l[r] *= corr;
                    arow.iter_mut().for_each(|a| *a *= corr);
                }
                for (j, &sc) in scores[..n].iter().enumerate() {
                    let p = (sc - new_m).exp();
                    l[r] += p;
                    simd::axpy_on(path, arow, p, &vblk[j * d..(j + 1) * d]);
                }
                m[r] = new_m;
            }
        }
    }

    for qi in lo..hi {
        for g in 0..group {
            let head = kvh * group + g;
            let r = (qi - lo) * group + g;
            let inv = if l[r] > 0.0 { 1.0 / l[r] } else { 0.0 };
            let off = ((tok0 + qi) * num_heads + head) * d;
            // SAFETY: (tok0 + qi, head) belongs to this task alone: tasks differ
            // in sequence (disjoint token ranges), KV head (disjoint head
            // groups) or query chunk (disjoint tokens); `off + d <= out.len()`
            // because the batch was validated.
            let dst = unsafe { std::slice::from_raw_parts_mut(out.0.add(off), d) };
            for (o, a) in dst.iter_mut().zip(&acc[r * d..(r + 1) * d]) {
                *o = a * inv;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::cache::{KvCacheConfig, PagedKvCache};
    use crate::batch::{BatchBuilder, LogitsFor};
    use crate::cpu_kernels::KernelPath;

    /// Dense reference: softmax(q k^T * scale) v over contiguous K/V.
    fn reference(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        ctx: usize,
        qlen: usize,
        sh: AttentionShape,
        scale: f32,
    ) -> Vec<f32> {
        let (h, kvh, d) = (sh.num_heads, sh.num_kv_heads, sh.head_dim);
        let g = h / kvh;
        let mut out = vec![0f32; qlen * h * d];
        for i in 0..qlen {
            let qidx = ctx - qlen + i;
            for head in 0..h {
                let kh = head / g;
                let qv = &q[(i * h + head) * d..][..d];
                let sc: Vec<f32> = (0..=qidx)
                    .map(|j| {
                        qv.iter()
                            .zip(&k[(j * kvh + kh) * d..][..d])
                            .map(|(a, b)| a * b)
                            .sum::<f32>()
                            * scale
                    })
                    .collect();
                let mx = sc.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = sc.iter().map(|s| (s - mx).exp()).collect();
                let z: f32 = e.iter().sum();
                for (j, p) in e.iter().enumerate() {
                    for x in 0..d {
                        out[(i * h + head) * d + x] += p / z * v[(j * kvh + kh) * d + x];
                    }
                }
            }
        }
        out
    }

    /// A cache holding `ctx` tokens of K/V over shuffled blocks of `bs`, and
    /// queries for the last `qlen` of them.
    struct Case {
        cache: PagedKvCache,
        batch: BatchInput,
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        sh: AttentionShape,
    }

    fn case(bs: usize, ctx: usize, qlen: usize, h: usize, kvh: usize, d: usize) -> Case {
        let sh = AttentionShape {
            num_heads: h,
            num_kv_heads: kvh,
            head_dim: d,
            block_size: bs,
        };
        let nblk = ctx.div_ceil(bs);
        let cfg = KvCacheConfig {
            num_layers: 1,
            num_blocks: nblk * 3 + 1,
            block_size: bs,
            num_kv_heads: kvh,
            head_dim: d,
        };
        let mut cache = PagedKvCache::new(cfg).unwrap();
        // Non-contiguous, descending block ids.
        let table: Vec<u32> = (0..nblk).map(|i| (nblk * 3 - i * 3) as u32).collect();
        let f = |i: usize, s: f32| (i as f32 * s).sin();
        let k: Vec<f32> = (0..ctx * kvh * d).map(|i| f(i, 0.37)).collect();
        let v: Vec<f32> = (0..ctx * kvh * d).map(|i| f(i, 0.91)).collect();
        // The queries of the whole context; the case asks for the last qlen.
        let q_all: Vec<f32> = (0..ctx * h * d).map(|i| f(i, 0.13)).collect();
        let q = q_all[(ctx - qlen) * h * d..].to_vec();
        let tokens = vec![0u32; ctx];
        // Write the whole context (cached prefix + new) through slots.
        let mut all = BatchBuilder::new(bs);
        all.push(&tokens, 0, &table, LogitsFor::Last);
        cache.write(0, &all.build().slot_mapping, &k, &v);
        let mut b = BatchBuilder::new(bs);
        b.push(&tokens[..qlen], ctx - qlen, &table, LogitsFor::Last);
        let batch = b.build();
        batch.validate(bs, cfg.num_blocks, 1 << 20, 1).unwrap();
        Case {
            cache,
            batch,
            q,
            k,
            v,
            sh,
        }
    }

    fn attend(c: &Case, path: KernelPath) -> Vec<f32> {
        let mut out = vec![f32::NAN; c.q.len()];
        paged_attention_on(path, &c.q, c.cache.layer(0), &c.batch, c.sh, 0.3, &mut out);
        out
    }

    /// Every path's kernel (vectorised where the path has a form for the
    /// head dim, else the portable one on the path's vector helpers) against
    /// the dense reference: prefill chunks (≥ 8 rows per task), decode (1
    /// query, GQA groups of 1..4), keys in chunks that straddle blocks of
    /// 3..48 tokens.
    #[test]
    fn matches_dense_attention_over_shuffled_blocks_on_every_path() {
        for (bs, ctx, qlen, h, kvh, d) in [
            (4usize, 9usize, 9usize, 4usize, 2usize, 8usize),
            (16, 37, 5, 4, 1, 8),
            (3, 20, 1, 2, 2, 8),
            (16, 16, 16, 8, 2, 8),
            (4, 9, 9, 4, 2, 16),
            (16, 37, 5, 4, 1, 32),
            (3, 20, 1, 2, 2, 64),
            (16, 70, 40, 8, 2, 64),
            (32, 100, 1, 8, 2, 64),
            (48, 130, 33, 4, 1, 128),
            (5, 41, 1, 4, 4, 128),
            (16, 33, 17, 2, 2, 48),
            (8, 29, 3, 2, 1, 80),
            (16, 40, 2, 2, 2, 96),
            (16, 24, 24, 2, 1, 256),
        ] {
            let c = case(bs, ctx, qlen, h, kvh, d);
            let want = reference(&c.q, &c.k, &c.v, ctx, qlen, c.sh, 0.3);
            for path in KernelPath::supported_paths() {
                let out = attend(&c, path);
                for (a, b) in out.iter().zip(&want) {
                    assert!(
                        (a - b).abs() < 1e-5,
                        "{path} bs={bs} ctx={ctx} qlen={qlen} d={d}: {a} vs {b}"
                    );
                }
            }
        }
    }

    /// On every path a token's attention is the same to the bit whether it
    /// is decoded alone or is the last row of a whole prefill (each row's
    /// sums run in one order whatever rows share its task).
    #[test]
    fn decode_equals_the_prefill_row_on_every_path() {
        for (bs, ctx, h, kvh, d) in [
            (16usize, 70usize, 8usize, 2usize, 64usize),
            (5, 41, 4, 4, 128),
            (16, 33, 2, 2, 48),
            (4, 19, 4, 2, 8),
        ] {
            let whole = case(bs, ctx, ctx, h, kvh, d);
            let last = case(bs, ctx, 1, h, kvh, d);
            for path in KernelPath::supported_paths() {
                let all = attend(&whole, path);
                let one = attend(&last, path);
                assert!(
                    one == all[(ctx - 1) * h * d..],
                    "{path} bs={bs} ctx={ctx} d={d}: decode != last prefill row"
                );
            }
        }
    }
}
