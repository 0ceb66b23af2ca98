//! One forward step of [`GpuQwen3`]: the batch metadata goes up in two
//! copies, every layer runs as cuBLAS products and the kernels of `kernels/`
//! on the one stream, and the logits of the rows that asked for them stay on
//! the device until the caller downloads them.

use agentd_runtime::{BatchInput, KvCacheConfig, ModelError};

use crate::device::{Buf, Gpu};
use crate::error::{CudaError, Result};
use crate::model::{GpuKvCache, GpuQwen3, Layer};
use crate::ops::DecodeScratch;
use crate::plan::{block_table_matrix, prefill_tiles, AttnShape};

/// Activations of one step, sized for `cap` tokens and reused while a step
/// fits (allocation and zeroing per step cost more than a small decode).
pub(crate) struct Workspace {
    cap: usize,
    residual: Buf<f32>,
    x: Buf<u16>,
    qkv: Buf<u16>,
    attn: Buf<u16>,
    o: Buf<u16>,
    gu: Buf<u16>,
    act: Buf<u16>,
    down: Buf<u16>,
}

impl Workspace {
    fn new(gpu: &Gpu, m: &GpuQwen3, cap: usize) -> Result<Self> {
        let c = &m.cfg;
        let (h, kv, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let (hid, inter) = (c.hidden_size, c.intermediate_size);
        Ok(Workspace {
            cap,
            residual: gpu.zeros(cap * hid)?,
            x: gpu.zeros(cap * hid)?,
            qkv: gpu.zeros(cap * (h + 2 * kv) * d)?,
            attn: gpu.zeros(cap * h * d)?,
            o: gpu.zeros(cap * hid)?,
            gu: gpu.zeros(cap * 2 * inter)?,
            act: gpu.zeros(cap * inter)?,
            down: gpu.zeros(cap * hid)?,
        })
    }
}

/// Logits left on the device by [`GpuQwen3::forward_device`].
pub struct DeviceLogits {
    pub logits: Buf<f32>,
    pub rows: usize,
}

impl DeviceLogits {
    /// The device address of the first row.
    pub fn logits_ptr(&self, gpu: &Gpu) -> u64 {
        gpu.ptr(&self.logits, 0)
    }
}

impl GpuQwen3 {
    /// One step: writes the new tokens' K/V through the slot mapping and
    /// returns f32 logits `[batch.logits_indices.len() * vocab]`, row-major.
    /// The logits come back through a pinned buffer, copied once into the
    /// returned vector (what the engine's sampler reads in place).
    pub fn forward(&self, batch: &BatchInput, cache: &mut GpuKvCache) -> Result<Vec<f32>> {
        let Some(l) = self.forward_device(batch, cache)? else {
            self.gpu.synchronize()?;
            return Ok(Vec::new());
        };
        let mut pinned = self
            .pinned
            .lock()
            .map_err(|_| CudaError::Unsupported("pinned buffer lock poisoned".into()))?;
        self.gpu
            .download_pinned(&l.logits, &mut pinned, <[f32]>::to_vec)
    }

    /// [`Self::forward`] as one row of `vocab` logits per logits index.
    pub fn forward_rows(
        &self,
        batch: &BatchInput,
        cache: &mut GpuKvCache,
    ) -> Result<Vec<Vec<f32>>> {
        let vocab = self.cfg.vocab_size.max(1);
        Ok(self
            .forward(batch, cache)?
            .chunks(vocab)
            .map(<[f32]>::to_vec)
            .collect())
    }

    /// [`Self::forward`] without the download: the work is queued on the
    /// stream and the logits (if any row asked for them) stay on the device.
    pub fn forward_device(
        &self,
        batch: &BatchInput,
        cache: &mut GpuKvCache,
    ) -> Result<Option<DeviceLogits>> {
        self.check_batch(batch, cache)?;
        let gpu = &*self.gpu;
        let shape = AttnShape {
            num_heads: self.cfg.num_attention_heads,
            num_kv_heads: self.cfg.num_key_value_heads,
            head_dim: self.cfg.head_dim,
            block_size: cache.cfg.block_size,
        };
        let decode = (0..batch.num_seqs()).all(|i| batch.query_len(i) == 1);
        let meta = StepMeta::upload(gpu, batch, &shape, decode)?;
        let t = batch.num_tokens();
        let max_ctx = batch.context_lens.iter().copied().max().unwrap_or(0);
        let (_, srows) = Gpu::decode_scratch_len(&shape, batch.num_seqs(), max_ctx);
        let scratch_len = if decode { srows } else { 0 };
        let d = shape.head_dim;
        let tmp = gpu.zeros::<f32>(scratch_len * (d + 2))?;
        let mut guard = self.workspace.lock().map_err(|_| {
            CudaError::Unsupported("workspace lock poisoned by a failed step".into())
        })?;
        if guard.as_ref().is_none_or(|w| w.cap < t) {
            *guard = Some(Workspace::new(gpu, self, t.next_power_of_two())?);
        }
        let Some(ws) = guard.as_ref() else {
            return Err(CudaError::Unsupported("workspace missing".into()));
        };
        let p = |b: &Buf<u16>| gpu.ptr(b, 0);
        let step = StepPtrs {
            shape,
            t,
            s: batch.num_seqs(),
            decode,
            max_ctx,
            num_tiles: meta.num_tiles,
            max_blocks: meta.max_blocks,
            ids: meta.at(gpu, 0),
            pos: meta.at(gpu, 1),
            cu: meta.at(gpu, 2),
            ctx: meta.at(gpu, 3),
            tables: meta.at(gpu, 4),
            rows: meta.at(gpu, 5),
            tiles: meta.at(gpu, 6),
            slots: gpu.ptr(&meta.slots, 0),
            scratch: DecodeScratch {
                out: gpu.ptr(&tmp, 0),
                max: gpu.ptr(&tmp, scratch_len * d),
                sum: gpu.ptr(&tmp, scratch_len * (d + 1)),
            },
            res: gpu.ptr(&ws.residual, 0),
            x: p(&ws.x),
            qkv: p(&ws.qkv),
            attn: p(&ws.attn),
            o: p(&ws.o),
            gu: p(&ws.gu),
            act: p(&ws.act),
            down: p(&ws.down),
        };
        gpu.embed(
            self.dtype,
            step.res,
            p(&self.embed),
            step.ids,
            t,
            self.cfg.hidden_size,
        )?;
        for (l, layer) in self.layers.iter().enumerate() {
            self.layer_forward(&step, l, layer, cache)?;
        }
        self.head(&step, batch.logits_indices.len())
    }

    /// Refuses a cache of another geometry and a batch that does not fit
    /// it or the model (`BatchInput::validate`).
    fn check_batch(&self, batch: &BatchInput, cache: &GpuKvCache) -> Result<()> {
        let c = &self.cfg;
        let want = KvCacheConfig::for_model(c, cache.cfg.num_blocks, cache.cfg.block_size);
        if want != cache.cfg {
            return Err(ModelError::Batch(format!(
                "cache geometry {:?} does not fit the model ({want:?})",
                cache.cfg
            ))
            .into());
        }
        batch.validate(
            cache.cfg.block_size,
            cache.cfg.num_blocks,
            c.max_position_embeddings,
            c.vocab_size,
        )?;
        Ok(())
    }

    /// Layer `l`: attention (its K/V written through the slot mapping into
    /// the cache, then paged decode or prefill) and the MLP, both with
    /// their residual adds pending in `step.res`.
    fn layer_forward(
        &self,
        step: &StepPtrs,
        l: usize,
        layer: &Layer,
        cache: &GpuKvCache,
    ) -> Result<()> {
        self.qkv_rope(step, l, layer)?;
        self.attend(step, l, cache)?;
        self.mlp(step, layer)
    }

    /// The pending residual add (the previous layer's MLP output) and the
    /// input norm, the QKV projection, then Q and K normed per head and
    /// rotated.
    fn qkv_rope(&self, step: &StepPtrs, l: usize, layer: &Layer) -> Result<()> {
        let (gpu, dt, c, t) = (&*self.gpu, self.dtype, &self.cfg, step.t);
        let (h, kv, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let (qkv_dim, hid) = ((h + 2 * kv) * d, c.hidden_size);
        let eps = c.rms_norm_eps as f32;
        let csp = gpu.ptr(&self.cos_sin, 0);
        let (xp, qkvp, pos) = (step.x, step.qkv, step.pos);
        let delta = (l > 0).then_some(step.down);
        let norm = gpu.ptr(&layer.input_norm, 0);
        gpu.add_rms_norm(dt, step.res, delta, None, norm, xp, t, hid, eps)?;
        let w = gpu.ptr(&layer.qkv, 0);
        gpu.linear(dt, xp, w, qkvp, false, t, qkv_dim, hid)?;
        let q_norm = Some(gpu.ptr(&layer.q_norm, 0));
        gpu.head_norm_rope(dt, qkvp, q_norm, pos, csp, t, h, 0, qkv_dim, d, eps)?;
        let k_norm = Some(gpu.ptr(&layer.k_norm, 0));
        let k_at = h * d;
        gpu.head_norm_rope(dt, qkvp, k_norm, pos, csp, t, kv, k_at, qkv_dim, d, eps)
    }

    /// The new tokens' K/V written into layer `l`'s cache through the slot
    /// mapping, then paged attention over the cache: decode (one query a
    /// sequence) or prefill tiles.
    fn attend(&self, step: &StepPtrs, l: usize, cache: &GpuKvCache) -> Result<()> {
        let (gpu, dt, c) = (&*self.gpu, self.dtype, &self.cfg);
        let (h, kv, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let qkv_dim = (h + 2 * kv) * d;
        let scale = 1.0 / (d as f32).sqrt();
        let (shape, qkvp, attn) = (&step.shape, step.qkv, step.attn);
        let (kc, vc) = (gpu.ptr(&cache.k[l], 0), gpu.ptr(&cache.v[l], 0));
        let (k_at, v_at) = (h * d, (h + kv) * d);
        gpu.reshape_and_cache(
            dt, qkvp, k_at, v_at, qkv_dim, kc, vc, step.slots, step.t, shape,
        )?;
        let (tp, mb, ctx) = (step.tables, step.max_blocks, step.ctx);
        if step.decode {
            let (s, max_ctx, scratch) = (step.s, step.max_ctx, &step.scratch);
            gpu.paged_decode(
                dt, shape, attn, qkvp, qkv_dim, kc, vc, tp, mb, ctx, s, max_ctx, scale, scratch,
            )
        } else {
            let (cu, tiles, n) = (step.cu, step.tiles, step.num_tiles);
            gpu.paged_prefill(
                dt, shape, attn, qkvp, qkv_dim, kc, vc, tp, mb, cu, ctx, tiles, n, scale,
            )
        }
    }

    /// The output projection with its residual add and the post-attention
    /// norm, then the gated MLP; its output stays pending for the next
    /// layer's (or the final) norm.
    fn mlp(&self, step: &StepPtrs, layer: &Layer) -> Result<()> {
        let (gpu, dt, c, t) = (&*self.gpu, self.dtype, &self.cfg, step.t);
        let (hid, inter) = (c.hidden_size, c.intermediate_size);
        let hd = c.num_attention_heads * c.head_dim;
        let eps = c.rms_norm_eps as f32;
        let (xp, o, gu, act, down) = (step.x, step.o, step.gu, step.act, step.down);
        let w = |b: &Buf<u16>| gpu.ptr(b, 0);
        gpu.linear(dt, step.attn, w(&layer.o), o, false, t, hid, hd)?;
        let norm = gpu.ptr(&layer.post_norm, 0);
        gpu.add_rms_norm(dt, step.res, Some(o), None, norm, xp, t, hid, eps)?;
        gpu.linear(dt, xp, w(&layer.gate_up), gu, false, t, 2 * inter, hid)?;
        gpu.silu_mul(dt, act, gu, t, inter)?;
        gpu.linear(dt, act, w(&layer.down), down, false, t, hid, inter)
    }

    /// The final norm and the LM head over the `n` rows that asked for
    /// logits (none: nothing to compute). The norm reads the selected rows
    /// only, with the last layer's MLP output as the pending residual add.
    fn head(&self, step: &StepPtrs, n: usize) -> Result<Option<DeviceLogits>> {
        if n == 0 {
            return Ok(None);
        }
        let (gpu, dt, c) = (&*self.gpu, self.dtype, &self.cfg);
        let (hid, vocab) = (c.hidden_size, c.vocab_size);
        let p = |b: &Buf<u16>| gpu.ptr(b, 0);
        let last = gpu.zeros::<u16>(n * hid)?;
        let delta = (!self.layers.is_empty()).then_some(step.down);
        let norm = gpu.ptr(&self.norm, 0);
        let eps = c.rms_norm_eps as f32;
        gpu.add_rms_norm(
            dt,
            step.res,
            delta,
            Some(step.rows),
            norm,
            p(&last),
            n,
            hid,
            eps,
        )?;
        let logits = gpu.zeros::<f32>(n * vocab)?;
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        let out = gpu.ptr(&logits, 0);
        gpu.linear(dt, p(&last), p(head), out, true, n, vocab, hid)?;
        Ok(Some(DeviceLogits { logits, rows: n }))
    }
}

/// The step's batch metadata on the device: every i32 array in one upload
/// (token ids, positions, cu_seqlens, context lengths, block tables,
/// logits rows, prefill tiles, in that order) and the slot mapping.
struct StepMeta {
    meta: Buf<i32>,
    slots: Buf<i64>,
    offsets: [usize; 7],
    num_tiles: usize,
    max_blocks: usize,
}

impl StepMeta {
    fn upload(gpu: &Gpu, batch: &BatchInput, shape: &AttnShape, decode: bool) -> Result<Self> {
        let (tables, max_blocks) = block_table_matrix(&batch.block_tables);
        let tiles = if decode {
            Vec::new()
        } else {
            prefill_tiles(&batch.cu_seqlens, shape.group())
        };
        let num_tiles = tiles.len() / 2;
        let as_i32 = |v: &[usize]| v.iter().map(|&x| x as i32).collect::<Vec<i32>>();
        let parts: [Vec<i32>; 7] = [
            batch.token_ids.iter().map(|&x| x as i32).collect(),
            batch.positions.iter().map(|&x| x as i32).collect(),
            as_i32(&batch.cu_seqlens),
            as_i32(&batch.context_lens),
            tables,
            as_i32(&batch.logits_indices),
            tiles,
        ];
        let mut meta: Vec<i32> = Vec::with_capacity(parts.iter().map(Vec::len).sum());
        let mut offsets = [0usize; 7];
        for (o, p) in offsets.iter_mut().zip(&parts) {
            *o = meta.len();
            meta.extend_from_slice(p);
        }
        let slots: Vec<i64> = batch.slot_mapping.iter().map(|&x| x as i64).collect();
        Ok(StepMeta {
            meta: gpu.upload(&meta)?,
            slots: gpu.upload(&slots)?,
            offsets,
            num_tiles,
            max_blocks,
        })
    }

    /// The device address of part `i` (the order of [`StepMeta::upload`]).
    fn at(&self, gpu: &Gpu, i: usize) -> u64 {
        gpu.ptr(&self.meta, self.offsets[i])
    }
}

/// What one step's layers read and write, as device addresses: the batch
/// metadata ([`StepMeta`]) and the workspace's activations. The buffers
/// behind them outlive the step's kernels (the caller holds the metadata,
/// the scratch and the workspace lock until every launch is queued, and
/// the stream orders the launches before any later free).
struct StepPtrs {
    shape: AttnShape,
    t: usize,
    s: usize,
    decode: bool,
    max_ctx: usize,
    num_tiles: usize,
    max_blocks: usize,
    ids: u64,
    pos: u64,
    cu: u64,
    ctx: u64,
    tables: u64,
    rows: u64,
    tiles: u64,
    slots: u64,
    scratch: DecodeScratch,
    res: u64,
    x: u64,
    qkv: u64,
    attn: u64,
    o: u64,
    gu: u64,
    act: u64,
    down: u64,
}
