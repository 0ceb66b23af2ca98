//! CUDA graphs for decode (issue 28 item 2, `--cuda-graphs`): a decode
//! step padded to a capture size replays one captured graph instead of
//! launching ~14 kernels per layer. Which steps, their buckets and padded
//! metadata: [`crate::graph_plan`] (tested without a GPU). Here: the fixed
//! buffers every graph reads and writes, captured lazily per key on first
//! use, and the replay.
//!
//! Every graph shares one pool of buffers (metadata, split-K scratch,
//! activations, logits), sized for the largest key captured so far: the
//! graphs replay one at a time on the one stream. A key that needs a larger
//! pool reallocates it and drops the graphs captured over the old one
//! (recaptured on their next use); sizes only grow, so this happens a few
//! times at most.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use agentd_runtime::BatchInput;
use cudarc::driver::{sys, CudaGraph};

use crate::attn_ops::DecodeScratch;
use crate::device::{driver_err, Buf, Gpu};
use crate::error::{CudaError, Result};
use crate::forward::{MetaPtrs, StepPtrs, Workspace};
use crate::graph_plan::{capture_sizes, key_for, pad_decode, GraphKey, PoolNeed};
use crate::model::{GpuKvCache, GpuModel};
use crate::plan::{DecodeKernel, Kernels};

struct Pool {
    need: PoolNeed,
    meta: Buf<i32>,
    slots: Buf<i64>,
    tmp: Buf<f32>,
    ws: Workspace,
    last: Buf<u16>,
    logits: Buf<f32>,
}

/// A captured graph that may move to another thread.
struct Graph(CudaGraph);

// SAFETY: CUDA graph objects are not internally synchronised and must not
// be used from two threads at once (cudarc leaves `CudaGraph` !Send for
// that reason). A `Graph` lives in one replica's `DecodeGraphs`, reached
// only through `&mut` (the runner's step methods), so it is used by one
// thread at a time; moving it to the worker thread that owns the runner is
// what `Send` allows, and nothing here is shared.
unsafe impl Send for Graph {}

/// One replica's decode graphs.
pub struct DecodeGraphs {
    sizes: Vec<usize>,
    max_model_len: usize,
    pool: Option<Pool>,
    graphs: HashMap<GraphKey, Graph>,
}

/// A replayed step's logits: `rows` rows at `ptr` in the pool, valid until
/// the next replay.
pub struct GraphLogits {
    pub ptr: u64,
    pub rows: usize,
}

impl DecodeGraphs {
    /// Graphs for batches up to `max_batch` sequences (vLLM's capture
    /// sizes) and contexts up to `max_model_len`.
    pub fn new(max_batch: usize, max_model_len: usize) -> Self {
        DecodeGraphs {
            sizes: capture_sizes(max_batch),
            max_model_len,
            pool: None,
            graphs: HashMap::new(),
        }
    }

    /// Graphs captured so far.
    pub fn captured(&self) -> usize {
        self.graphs.len()
    }

    /// Drops every graph and the pool (new weights: the graphs hold the old
    /// ones' addresses); the next steps capture again.
    pub fn clear(&mut self) {
        self.graphs.clear();
        self.pool = None;
    }
}

impl GpuModel {
    /// Runs `batch` by replaying its decode graph (captured first if this
    /// is its key's first step); `None` when the step is not one a graph
    /// covers (the caller runs it eagerly). The host tier's copies must be
    /// waited for before (a capture cannot wait on another stream's event).
    pub fn forward_graph(
        &self,
        batch: &BatchInput,
        cache: &mut GpuKvCache,
        graphs: &mut DecodeGraphs,
        kernels: Kernels,
    ) -> Result<Option<GraphLogits>> {
        // Never captured: a sparse layer downloads its routing mid-step
        // (host-routed path) or allocates and uploads per step
        // (`--device-moe`: its buffers and the shared expert's row list).
        if self.cfg.moe.is_some() {
            return Ok(None);
        }
        let Some(key) = key_for(batch, &graphs.sizes, graphs.max_model_len) else {
            return Ok(None);
        };
        self.check_batch(batch, cache)?;
        let block_size = cache.cfg.block_size;
        let padded = pad_decode(batch, key, block_size)?;
        let shape = self.attn_shape(block_size);
        let (_, rows) = Gpu::decode_scratch_len(&shape, key.batch, key.ctx_cap);
        let need = PoolNeed {
            meta: padded.meta.len(),
            batch: key.batch,
            scratch_rows: rows,
        };
        self.ensure_pool(graphs, need)?;
        let Some(pool) = graphs.pool.as_mut() else {
            return Err(CudaError::Unsupported("graph pool missing".into()));
        };
        let gpu = &*self.gpu;
        // The metadata goes into the same buffers at the same offsets every
        // step of this key, ordered on the stream before the launch.
        gpu.upload_into(&padded.meta, &mut pool.meta)?;
        gpu.upload_into(&padded.slots, &mut pool.slots)?;
        let graph = match graphs.graphs.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let mut meta = MetaPtrs::at(gpu, &pool.meta, &padded.offsets, &pool.slots);
                meta.max_blocks = padded.max_blocks;
                let step = StepPtrs {
                    shape,
                    kernels: self.kernels_for(kernels),
                    decode_kernel: DecodeKernel::choose(kernels.single_pass_decode, &shape),
                    t: key.batch,
                    s: key.batch,
                    decode: true,
                    max_ctx: key.ctx_cap,
                    meta,
                    scratch: DecodeScratch::within(gpu, &pool.tmp, rows, shape.head_dim),
                    ws: pool.ws.ptrs(gpu),
                };
                let (last, logits) = (gpu.ptr(&pool.last, 0), gpu.ptr(&pool.logits, 0));
                let graph = self.capture(&step, cache, key.batch, last, logits)?;
                tracing::info!(
                    batch = key.batch,
                    ctx_cap = key.ctx_cap,
                    "captured a decode graph"
                );
                e.insert(Graph(graph))
            }
        };
        graph.0.launch().map_err(driver_err("cuGraphLaunch"))?;
        Ok(Some(GraphLogits {
            ptr: gpu.ptr(&pool.logits, 0),
            rows: padded.real,
        }))
    }

    /// A replayed step's logits downloaded (through the pinned buffer).
    pub fn graph_logits(&self, out: &GraphLogits) -> Result<Vec<f32>> {
        self.download_logits(out.ptr, out.rows)
    }

    /// The step's launches recorded into a graph (nothing runs).
    fn capture(
        &self,
        step: &StepPtrs,
        cache: &GpuKvCache,
        n: usize,
        last: u64,
        logits: u64,
    ) -> Result<CudaGraph> {
        let stream = self.gpu.stream();
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        stream
            .begin_capture(mode)
            .map_err(driver_err("cuStreamBeginCapture"))?;
        let recorded = self
            .run_layers(step, cache, None)
            .and_then(|()| self.head_into(step, n, last, logits));
        // The capture ends whatever happened, so the stream is usable again.
        let graph = stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(driver_err("cuStreamEndCapture"));
        recorded?;
        graph?.ok_or_else(|| CudaError::Unsupported("the capture recorded no graph".into()))
    }

    /// A pool covering `need` (and what the current one covers), dropping
    /// the graphs over a pool that is replaced.
    fn ensure_pool(&self, graphs: &mut DecodeGraphs, need: PoolNeed) -> Result<()> {
        if graphs.pool.as_ref().is_some_and(|p| p.need.covers(&need)) {
            return Ok(());
        }
        let need = graphs.pool.as_ref().map_or(need, |p| p.need.max(&need));
        graphs.graphs.clear();
        graphs.pool = None;
        self.gpu.synchronize()?;
        let gpu = &*self.gpu;
        let (hid, vocab, d) = (self.cfg.hidden_size, self.cfg.vocab_size, self.cfg.head_dim);
        graphs.pool = Some(Pool {
            need,
            meta: gpu.zeros(need.meta)?,
            slots: gpu.zeros(need.batch)?,
            tmp: gpu.zeros(need.scratch_rows * (d + 2))?,
            ws: Workspace::new(gpu, self, need.batch)?,
            last: gpu.zeros(need.batch * hid)?,
            logits: gpu.zeros(need.batch * vocab)?,
        });
        tracing::info!(?need, "decode graph pool (re)allocated");
        Ok(())
    }
}
