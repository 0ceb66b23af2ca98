//! One forward step of [`GpuModel`]: the batch metadata goes up in two
//! copies, every layer runs as cuBLAS products and the kernels of `kernels/`
//! on the one stream, and the logits of the rows that asked for them stay on
//! the device until the caller downloads them.

use agentd_runtime::{BatchInput, KvCacheConfig, ModelError};

use crate::attn_ops::{AttnIo, DecodeScratch};
use crate::device::{Buf, Gpu};
use crate::error::{CudaError, Result};
use crate::model::{Ffn, GpuKvCache, GpuModel, Layer};
use crate::plan::{block_table_matrix, prefill_tiles, AttnShape, DecodeKernel, Kernels};
use crate::tier::GpuHostTier;

/// Activations of one step, sized for `cap` tokens and reused while a step
/// fits (allocation and zeroing per step cost more than a small decode).
pub(crate) struct Workspace {
    pub(crate) cap: usize,
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
    /// The activations' device addresses.
    pub(crate) fn ptrs(&self, gpu: &Gpu) -> WsPtrs {
        let p = |b: &Buf<u16>| gpu.ptr(b, 0);
        WsPtrs {
            res: gpu.ptr(&self.residual, 0),
            x: p(&self.x),
            qkv: p(&self.qkv),
            attn: p(&self.attn),
            o: p(&self.o),
            gu: p(&self.gu),
            act: p(&self.act),
            down: p(&self.down),
        }
    }

    pub(crate) fn new(gpu: &Gpu, m: &GpuModel, cap: usize) -> Result<Self> {
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

/// Logits left on the device by [`GpuModel::forward_device`].
pub struct DeviceLogits {
    pub logits: Buf<f32>,
    pub rows: usize,
}

/// How a step runs beyond its batch.
#[derive(Clone, Copy, Default)]
pub struct StepOpts<'a> {
    /// The host tier whose queued copies each layer waits for.
    pub tier: Option<&'a GpuHostTier>,
    /// The kernels beyond the validated path (`--fused-prologue`,
    /// `--single-pass-decode`, `--device-moe`).
    pub kernels: Kernels,
}

impl DeviceLogits {
    /// The device address of the first row.
    pub fn logits_ptr(&self, gpu: &Gpu) -> u64 {
        gpu.ptr(&self.logits, 0)
    }
}

impl GpuModel {
    /// One step: writes the new tokens' K/V through the slot mapping and
    /// returns f32 logits `[batch.logits_indices.len() * vocab]`, row-major.
    /// The logits come back through a pinned buffer, copied once into the
    /// returned vector (what the engine's sampler reads in place).
    pub fn forward(&self, batch: &BatchInput, cache: &mut GpuKvCache) -> Result<Vec<f32>> {
        self.forward_after(batch, cache, StepOpts::default())
    }

    /// [`Self::forward`] with `opts`: after the host tier's queued copies
    /// (layer `l` waits for its own: [`GpuHostTier::wait_layer`]), with the
    /// fused prologue.
    pub fn forward_after(
        &self,
        batch: &BatchInput,
        cache: &mut GpuKvCache,
        opts: StepOpts<'_>,
    ) -> Result<Vec<f32>> {
        let Some(l) = self.forward_device_after(batch, cache, opts)? else {
            self.gpu.synchronize()?;
            return Ok(Vec::new());
        };
        self.download_logits(l.logits_ptr(&self.gpu), l.rows)
    }

    /// `rows` rows of f32 logits at device address `logits`, copied to the
    /// host through the model's pinned buffer.
    pub(crate) fn download_logits(&self, logits: u64, rows: usize) -> Result<Vec<f32>> {
        let mut pinned = self
            .pinned
            .lock()
            .map_err(|_| CudaError::Unsupported("pinned buffer lock poisoned".into()))?;
        let n = rows * self.cfg.vocab_size;
        self.gpu
            .download_pinned_at(logits, n, &mut pinned, <[f32]>::to_vec)
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
        self.forward_device_after(batch, cache, StepOpts::default())
    }

    /// [`Self::forward_device`] with `opts`.
    pub fn forward_device_after(
        &self,
        batch: &BatchInput,
        cache: &mut GpuKvCache,
        opts: StepOpts<'_>,
    ) -> Result<Option<DeviceLogits>> {
        self.check_batch(batch, cache)?;
        let gpu = &*self.gpu;
        let shape = self.attn_shape(cache.cfg.block_size);
        let decode = (0..batch.num_seqs()).all(|i| batch.query_len(i) == 1);
        let meta = StepMeta::upload(gpu, batch, &shape, decode)?;
        let t = batch.num_tokens();
        let max_ctx = batch.context_lens.iter().copied().max().unwrap_or(0);
        let (_, srows) = Gpu::decode_scratch_len(&shape, batch.num_seqs(), max_ctx);
        let scratch_len = if decode { srows } else { 0 };
        let tmp = gpu.zeros::<f32>(scratch_len * (shape.head_dim + 2))?;
        let mut guard = self.workspace.lock().map_err(|_| {
            CudaError::Unsupported("workspace lock poisoned by a failed step".into())
        })?;
        if guard.as_ref().is_none_or(|w| w.cap < t) {
            *guard = Some(Workspace::new(gpu, self, t.next_power_of_two())?);
        }
        let Some(ws) = guard.as_ref() else {
            return Err(CudaError::Unsupported("workspace missing".into()));
        };
        let step = StepPtrs {
            shape,
            kernels: self.kernels_for(opts.kernels),
            decode_kernel: DecodeKernel::choose(opts.kernels.single_pass_decode, &shape),
            t,
            s: batch.num_seqs(),
            decode,
            max_ctx,
            meta: meta.ptrs(gpu),
            scratch: DecodeScratch::within(gpu, &tmp, scratch_len, shape.head_dim),
            ws: ws.ptrs(gpu),
        };
        self.run_layers(&step, cache, opts.tier)?;
        self.head(&step, batch.logits_indices.len())
    }

    /// The attention geometry of this model over blocks of `block_size`.
    pub fn attn_shape(&self, block_size: usize) -> AttnShape {
        AttnShape {
            num_heads: self.cfg.num_attention_heads,
            num_kv_heads: self.cfg.num_key_value_heads,
            head_dim: self.cfg.head_dim,
            block_size,
        }
    }

    /// The embedding and every layer of `step` (each layer after its tier
    /// copies), queued on the stream; the last layer's MLP output is left
    /// pending for the head.
    pub(crate) fn run_layers(
        &self,
        step: &StepPtrs,
        cache: &GpuKvCache,
        tier: Option<&GpuHostTier>,
    ) -> Result<()> {
        let gpu = &*self.gpu;
        let embed = gpu.ptr(&self.embed, 0);
        let hidden = self.cfg.hidden_size;
        gpu.embed(
            self.dtype,
            step.ws.res,
            embed,
            step.meta.ids,
            step.t,
            hidden,
        )?;
        for (l, layer) in self.layers.iter().enumerate() {
            if let Some(t) = tier {
                t.wait_layer(gpu, l)?;
            }
            self.layer_forward(step, l, layer, cache)?;
        }
        Ok(())
    }

    /// Refuses a cache of another geometry and a batch that does not fit
    /// it or the model (`BatchInput::validate`).
    pub(crate) fn check_batch(&self, batch: &BatchInput, cache: &GpuKvCache) -> Result<()> {
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
    /// their residual adds pending in `step.ws.res`.
    fn layer_forward(
        &self,
        step: &StepPtrs,
        l: usize,
        layer: &Layer,
        cache: &GpuKvCache,
    ) -> Result<()> {
        self.qkv_rope(step, l, layer, cache)?;
        self.attend(step, l, cache)?;
        self.mlp(step, layer)
    }

    /// The pending residual add (the previous layer's MLP output) and the
    /// input norm, the QKV projection, then Q and K normed per head and
    /// rotated.
    fn qkv_rope(&self, step: &StepPtrs, l: usize, layer: &Layer, cache: &GpuKvCache) -> Result<()> {
        let (gpu, dt, c, t) = (&*self.gpu, self.dtype, &self.cfg, step.t);
        let (h, kv, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let (qkv_dim, hid) = ((h + 2 * kv) * d, c.hidden_size);
        let eps = c.rms_norm_eps as f32;
        let csp = gpu.ptr(&self.cos_sin, 0);
        let (xp, qkvp, pos) = (step.ws.x, step.ws.qkv, step.meta.pos);
        let delta = (l > 0).then_some(step.ws.down);
        let norm = gpu.ptr(&layer.input_norm, 0);
        gpu.add_rms_norm(dt, step.ws.res, delta, None, norm, xp, t, hid, eps)?;
        let w = gpu.ptr(&layer.qkv, 0);
        gpu.linear(dt, xp, w, qkvp, false, t, qkv_dim, hid)?;
        if let Some(b) = &layer.qkv_bias {
            gpu.add_bias(dt, qkvp, gpu.ptr(b, 0), t, qkv_dim)?;
        }
        if c.family == agentd_runtime::Family::Glm4Moe {
            let (qn, kn) = (layer.q_norm.as_ref(), layer.k_norm.as_ref());
            let (qn, kn) = (qn.map(|b| gpu.ptr(b, 0)), kn.map(|b| gpu.ptr(b, 0)));
            let rot = c.rotary_dim;
            gpu.head_norm_rope_partial(dt, qkvp, qn, pos, csp, t, h, 0, qkv_dim, d, rot, eps)?;
            let k_at = h * d;
            return gpu
                .head_norm_rope_partial(dt, qkvp, kn, pos, csp, t, kv, k_at, qkv_dim, d, rot, eps);
        }
        if c.family == agentd_runtime::Family::Glm4 {
            let rot = c.rotary_dim;
            gpu.head_rope_interleaved(dt, qkvp, pos, csp, t, h, 0, qkv_dim, d, rot)?;
            return gpu.head_rope_interleaved(dt, qkvp, pos, csp, t, kv, h * d, qkv_dim, d, rot);
        }
        let q_norm = layer.q_norm.as_ref().map(|b| gpu.ptr(b, 0));
        let k_norm = layer.k_norm.as_ref().map(|b| gpu.ptr(b, 0));
        if step.kernels.fused_prologue {
            let kvc = (gpu.ptr(&cache.k[l], 0), gpu.ptr(&cache.v[l], 0));
            let (sh, slots) = (&step.shape, step.meta.slots);
            return gpu.qkv_prologue(
                dt,
                qkvp,
                (q_norm, k_norm),
                pos,
                csp,
                kvc,
                slots,
                t,
                h,
                sh,
                eps,
            );
        }
        gpu.head_norm_rope(dt, qkvp, q_norm, pos, csp, t, h, 0, qkv_dim, d, eps)?;
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
        let (shape, qkvp, attn) = (&step.shape, step.ws.qkv, step.ws.attn);
        let (kc, vc) = (gpu.ptr(&cache.k[l], 0), gpu.ptr(&cache.v[l], 0));
        let (k_at, v_at) = (h * d, (h + kv) * d);
        if !step.kernels.fused_prologue {
            gpu.reshape_and_cache(
                dt,
                qkvp,
                k_at,
                v_at,
                qkv_dim,
                kc,
                vc,
                step.meta.slots,
                step.t,
                shape,
            )?;
        }
        let io = AttnIo {
            dt,
            shape: *shape,
            out: attn,
            q: qkvp,
            q_stride: qkv_dim,
            k_cache: kc,
            v_cache: vc,
            block_tables: step.meta.tables,
            max_blocks: step.meta.max_blocks,
            context_lens: step.meta.ctx,
            scale,
        };
        if step.decode {
            let (s, max_ctx) = (step.s, step.max_ctx);
            gpu.paged_decode(&io, step.decode_kernel, s, max_ctx, &step.scratch)
        } else {
            let (cu, tiles, n) = (step.meta.cu, step.meta.tiles, step.meta.num_tiles);
            gpu.paged_prefill(&io, cu, tiles, n)
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
        let (xp, o, gu, act, down) = (step.ws.x, step.ws.o, step.ws.gu, step.ws.act, step.ws.down);
        let w = |b: &Buf<u16>| gpu.ptr(b, 0);
        gpu.linear(dt, step.ws.attn, w(&layer.o), o, false, t, hid, hd)?;
        if let Some(n) = &layer.attn_out_norm {
            gpu.rms_norm_rows(dt, o, gpu.ptr(n, 0), t, hid, eps)?;
        }
        let norm = gpu.ptr(&layer.post_norm, 0);
        gpu.add_rms_norm(dt, step.ws.res, Some(o), None, norm, xp, t, hid, eps)?;
        match &layer.ffn {
            Ffn::Dense { gate_up, down: wd } => {
                gpu.linear(dt, xp, w(gate_up), gu, false, t, 2 * inter, hid)?;
                gpu.silu_mul(dt, act, gu, t, inter)?;
                gpu.linear(dt, act, w(wd), down, false, t, hid, inter)?;
            }
            Ffn::Sparse(moe) if step.kernels.device_moe => self.moe_forward_device(step, moe)?,
            Ffn::Sparse(moe) => self.moe_forward(step, moe)?,
        }
        match &layer.mlp_out_norm {
            Some(n) => gpu.rms_norm_rows(dt, down, gpu.ptr(n, 0), t, hid, eps),
            None => Ok(()),
        }
    }

    /// The final norm and the LM head over the `n` rows that asked for
    /// logits (none: nothing to compute). The norm reads the selected rows
    /// only, with the last layer's MLP output as the pending residual add.
    fn head(&self, step: &StepPtrs, n: usize) -> Result<Option<DeviceLogits>> {
        if n == 0 {
            return Ok(None);
        }
        let gpu = &*self.gpu;
        let last = gpu.zeros::<u16>(n * self.cfg.hidden_size)?;
        let logits = gpu.zeros::<f32>(n * self.cfg.vocab_size)?;
        self.head_into(step, n, gpu.ptr(&last, 0), gpu.ptr(&logits, 0))?;
        Ok(Some(DeviceLogits { logits, rows: n }))
    }

    /// [`Self::head`] into given buffers: `last` holds `n × hidden` of the
    /// dtype, `logits` `n × vocab` f32 (a graph's fixed buffers).
    pub(crate) fn head_into(
        &self,
        step: &StepPtrs,
        n: usize,
        last: u64,
        logits: u64,
    ) -> Result<()> {
        let (gpu, dt, c) = (&*self.gpu, self.dtype, &self.cfg);
        let (hid, vocab) = (c.hidden_size, c.vocab_size);
        let delta = (!self.layers.is_empty()).then_some(step.ws.down);
        let norm = gpu.ptr(&self.norm, 0);
        let eps = c.rms_norm_eps as f32;
        let rows = Some(step.meta.rows);
        gpu.add_rms_norm(dt, step.ws.res, delta, rows, norm, last, n, hid, eps)?;
        let head = gpu.ptr(self.lm_head.as_ref().unwrap_or(&self.embed), 0);
        gpu.linear(dt, last, head, logits, true, n, vocab, hid)
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

    /// Every part's device address.
    fn ptrs(&self, gpu: &Gpu) -> MetaPtrs {
        MetaPtrs {
            num_tiles: self.num_tiles,
            max_blocks: self.max_blocks,
            ..MetaPtrs::at(gpu, &self.meta, &self.offsets, &self.slots)
        }
    }
}

/// What one step's layers read and write, as device addresses: the batch
/// metadata ([`StepMeta`]) and the workspace's activations. The buffers
/// behind them outlive the step's kernels (the caller holds the metadata,
/// the scratch and the workspace lock until every launch is queued, and
/// the stream orders the launches before any later free).
pub(crate) struct StepPtrs {
    pub shape: AttnShape,
    /// The kernels this step uses; with the prologue fused
    /// (`qkv_prologue`) the cache is written there.
    pub kernels: Kernels,
    /// The decode attention kernel (a decode step).
    pub decode_kernel: DecodeKernel,
    pub t: usize,
    pub s: usize,
    pub decode: bool,
    pub max_ctx: usize,
    pub meta: MetaPtrs,
    pub scratch: DecodeScratch,
    pub ws: WsPtrs,
}

/// The batch metadata's device addresses ([`StepMeta`]'s parts, or a
/// graph's fixed copy of them).
#[derive(Clone, Copy)]
pub(crate) struct MetaPtrs {
    pub ids: u64,
    pub pos: u64,
    pub cu: u64,
    pub ctx: u64,
    pub tables: u64,
    pub rows: u64,
    pub tiles: u64,
    pub slots: u64,
    pub num_tiles: usize,
    pub max_blocks: usize,
}

impl MetaPtrs {
    /// The parts of a metadata buffer at `base` laid out by `offsets`
    /// (i32 elements, [`StepMeta::upload`]'s order).
    pub fn at(gpu: &Gpu, meta: &Buf<i32>, offsets: &[usize; 7], slots: &Buf<i64>) -> Self {
        let at = |i: usize| gpu.ptr(meta, offsets[i]);
        MetaPtrs {
            ids: at(0),
            pos: at(1),
            cu: at(2),
            ctx: at(3),
            tables: at(4),
            rows: at(5),
            tiles: at(6),
            slots: gpu.ptr(slots, 0),
            num_tiles: 0,
            max_blocks: 0,
        }
    }
}

/// The workspace's activation buffers as device addresses.
#[derive(Clone, Copy)]
pub(crate) struct WsPtrs {
    pub res: u64,
    pub x: u64,
    pub qkv: u64,
    pub attn: u64,
    pub o: u64,
    pub gu: u64,
    pub act: u64,
    pub down: u64,
}
