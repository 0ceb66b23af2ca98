//! One forward step of [`GpuQwen3`]: the batch metadata goes up in two
//! copies, every layer runs as cuBLAS products and the kernels of `kernels/`
//! on the one stream, and the logits of the rows that asked for them stay on
//! the device until the caller downloads them.

use agentd_models::KvCacheConfig;
use agentd_runtime::{BatchInput, ModelError};

use crate::device::{Buf, Gpu};
use crate::error::{CudaError, Result};
use crate::model::{GpuKvCache, GpuQwen3};
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
        let (gpu, dt) = (&*self.gpu, self.dtype);
        let (h, kv, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let (hid, inter, vocab) = (c.hidden_size, c.intermediate_size, c.vocab_size);
        let shape = AttnShape {
            num_heads: h,
            num_kv_heads: kv,
            head_dim: d,
            block_size: cache.cfg.block_size,
        };
        let (t, s) = (batch.num_tokens(), batch.num_seqs());
        let qkv_dim = (h + 2 * kv) * d;
        let eps = c.rms_norm_eps as f32;
        let scale = 1.0 / (d as f32).sqrt();
        let decode = (0..s).all(|i| batch.query_len(i) == 1);
        let max_ctx = batch.context_lens.iter().copied().max().unwrap_or(0);
        let n = batch.logits_indices.len();

        // All i32 metadata in one upload: ids, positions, cu_seqlens,
        // context lengths, block tables, logits rows, prefill tiles.
        let (tables, max_blocks) = block_table_matrix(&batch.block_tables);
        let tiles = if decode {
            Vec::new()
        } else {
            prefill_tiles(&batch.cu_seqlens, shape.group())
        };
        let mut meta: Vec<i32> =
            Vec::with_capacity(3 * t + 2 * s + tables.len() + n + tiles.len() + 1);
        let mut offsets = [0usize; 7];
        let parts: [Vec<i32>; 7] = [
            batch.token_ids.iter().map(|&x| x as i32).collect(),
            batch.positions.iter().map(|&x| x as i32).collect(),
            batch.cu_seqlens.iter().map(|&x| x as i32).collect(),
            batch.context_lens.iter().map(|&x| x as i32).collect(),
            tables,
            batch.logits_indices.iter().map(|&x| x as i32).collect(),
            tiles,
        ];
        for (o, p) in offsets.iter_mut().zip(&parts) {
            *o = meta.len();
            meta.extend_from_slice(p);
        }
        let num_tiles = parts[6].len() / 2;
        let meta = gpu.upload(&meta)?;
        let slots = gpu.upload(
            &batch
                .slot_mapping
                .iter()
                .map(|&x| x as i64)
                .collect::<Vec<_>>(),
        )?;
        let at = |i: usize| gpu.ptr(&meta, offsets[i]);
        let (ids, pos, cu, ctx, tp, rows, tl) = (at(0), at(1), at(2), at(3), at(4), at(5), at(6));

        let (_, srows) = Gpu::decode_scratch_len(&shape, s, max_ctx);
        let scratch_len = if decode { srows } else { 0 };
        let tmp = gpu.zeros::<f32>(scratch_len * (d + 2))?;
        let scratch = DecodeScratch {
            out: gpu.ptr(&tmp, 0),
            max: gpu.ptr(&tmp, scratch_len * d),
            sum: gpu.ptr(&tmp, scratch_len * (d + 1)),
        };

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
        let (res, xp, qkvp, attn) = (gpu.ptr(&ws.residual, 0), p(&ws.x), p(&ws.qkv), p(&ws.attn));
        let (o, gu, act, down) = (p(&ws.o), p(&ws.gu), p(&ws.act), p(&ws.down));
        let csp = gpu.ptr(&self.cos_sin, 0);

        gpu.embed(dt, res, p(&self.embed), ids, t, hid)?;
        for (l, layer) in self.layers.iter().enumerate() {
            let delta = (l > 0).then_some(down);
            gpu.add_rms_norm(
                dt,
                res,
                delta,
                None,
                gpu.ptr(&layer.input_norm, 0),
                xp,
                t,
                hid,
                eps,
            )?;
            gpu.linear(dt, xp, p(&layer.qkv), qkvp, false, t, qkv_dim, hid)?;
            gpu.head_norm_rope(
                dt,
                qkvp,
                Some(gpu.ptr(&layer.q_norm, 0)),
                pos,
                csp,
                t,
                h,
                0,
                qkv_dim,
                d,
                eps,
            )?;
            gpu.head_norm_rope(
                dt,
                qkvp,
                Some(gpu.ptr(&layer.k_norm, 0)),
                pos,
                csp,
                t,
                kv,
                h * d,
                qkv_dim,
                d,
                eps,
            )?;
            let (kc, vc) = (p(&cache.k[l]), p(&cache.v[l]));
            gpu.reshape_and_cache(
                dt,
                qkvp,
                h * d,
                (h + kv) * d,
                qkv_dim,
                kc,
                vc,
                gpu.ptr(&slots, 0),
                t,
                &shape,
            )?;
            if decode {
                gpu.paged_decode(
                    dt, &shape, attn, qkvp, qkv_dim, kc, vc, tp, max_blocks, ctx, s, max_ctx,
                    scale, &scratch,
                )?;
            } else {
                gpu.paged_prefill(
                    dt, &shape, attn, qkvp, qkv_dim, kc, vc, tp, max_blocks, cu, ctx, tl,
                    num_tiles, scale,
                )?;
            }
            gpu.linear(dt, attn, p(&layer.o), o, false, t, hid, h * d)?;
            gpu.add_rms_norm(
                dt,
                res,
                Some(o),
                None,
                gpu.ptr(&layer.post_norm, 0),
                xp,
                t,
                hid,
                eps,
            )?;
            gpu.linear(dt, xp, p(&layer.gate_up), gu, false, t, 2 * inter, hid)?;
            gpu.silu_mul(dt, act, gu, t, inter)?;
            gpu.linear(dt, act, p(&layer.down), down, false, t, hid, inter)?;
        }
        if n == 0 {
            return Ok(None);
        }
        // The final norm reads the selected rows only (and the last layer's
        // MLP output as the pending residual add).
        let last = gpu.zeros::<u16>(n * hid)?;
        let delta = (!self.layers.is_empty()).then_some(down);
        gpu.add_rms_norm(
            dt,
            res,
            delta,
            Some(rows),
            gpu.ptr(&self.norm, 0),
            p(&last),
            n,
            hid,
            eps,
        )?;
        let logits = gpu.zeros::<f32>(n * vocab)?;
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        gpu.linear(
            dt,
            p(&last),
            p(head),
            gpu.ptr(&logits, 0),
            true,
            n,
            vocab,
            hid,
        )?;
        Ok(Some(DeviceLogits { logits, rows: n }))
    }
}
