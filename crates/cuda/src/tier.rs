//! The host KV tier on the GPU (docs/design.md §4, issue 28 item 4): evicted
//! blocks kept in page-locked host memory and copied back when a prefix
//! match finds them, as the CPU tier does (`crates/kv/src/host.rs` decides
//! which; this moves the bytes). Copies run on a stream of their own, layer
//! by layer, each layer's copies closed by an event: a step's layer `l`
//! waits for that layer's copies only ([`GpuHostTier::wait_layer`]), so
//! the copies of later layers overlap the forward of earlier ones. The
//! schedule (runs, offsets, bytes) is [`crate::tier_plan`], tested without
//! a GPU.

use std::ffi::c_void;
use std::sync::Arc;

use agentd_runtime::BlockCopy;
use cudarc::driver::{sys, CudaEvent, CudaStream, PinnedHostSlice};

use crate::device::{driver_err, Gpu};
use crate::error::Result;
use crate::model::GpuKvCache;
use crate::tier_plan::{bytes_each_way, plan_runs, Dir, TierShape};

pub struct GpuHostTier {
    /// `[layers, 2, slots, block_elems]` (tier_plan's host layout). Its
    /// contents are only ever written and read by the copies below, never
    /// through a Rust reference.
    host: PinnedHostSlice<u16>,
    shape: TierShape,
    copy: Arc<CudaStream>,
    /// Per layer: recorded on the copy stream after that layer's copies.
    done: Vec<CudaEvent>,
    /// Bytes moved to the host and back since start.
    moved: (u64, u64),
}

impl GpuHostTier {
    /// A tier of `slots` blocks behind `cache` (pinned host memory, not
    /// zeroed: a slot is read only after an offload wrote it, which the
    /// allocator guarantees).
    pub fn new(gpu: &Gpu, cache: &GpuKvCache, slots: usize) -> Result<Self> {
        let c = cache.config();
        let shape = TierShape {
            layers: c.num_layers,
            device_blocks: c.num_blocks,
            host_slots: slots,
            block_elems: c.num_kv_heads * c.block_size * c.head_dim,
        };
        let ctx = gpu.context();
        // SAFETY: the buffer is only a DMA source after being a DMA
        // destination (module docs); no Rust reference reads it.
        let host = unsafe { ctx.alloc_pinned::<u16>(shape.host_elems()?.max(1)) }
            .map_err(driver_err("alloc_pinned (host KV tier)"))?;
        let copy = ctx.new_stream().map_err(driver_err("new_stream"))?;
        let flags = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let done = (0..shape.layers)
            .map(|_| ctx.new_event(flags).map_err(driver_err("new_event")))
            .collect::<Result<_>>()?;
        tracing::info!(
            slots,
            bytes = shape.host_elems()? * 2,
            "GPU host KV tier in pinned memory"
        );
        Ok(GpuHostTier {
            host,
            shape,
            copy,
            done,
            moved: (0, 0),
        })
    }

    /// Queues `copies` on the copy stream after everything queued so far on
    /// the main stream (an offload reads what earlier steps wrote), layer by
    /// layer. Returns at once; the main stream waits with
    /// [`Self::wait_layer`] or [`Self::wait_all`]. The copies are checked
    /// whole before any is queued.
    pub fn enqueue(&mut self, gpu: &Gpu, cache: &GpuKvCache, copies: &[BlockCopy]) -> Result<()> {
        let runs = plan_runs(copies, &self.shape)?;
        if runs.is_empty() {
            return Ok(());
        }
        self.copy
            .join(gpu.stream())
            .map_err(driver_err("stream join"))?;
        let base = self
            .host
            .as_mut_ptr()
            .map_err(driver_err("pinned host tier"))?;
        let s = self.shape;
        let stream = self.copy.cu_stream();
        for l in 0..s.layers {
            for (kv, buf) in [(0, &cache.k[l]), (1, &cache.v[l])] {
                let dev = gpu.ptr(buf, 0);
                for r in &runs {
                    let bytes = r.blocks * s.block_elems * 2;
                    let d = dev + (s.device_offset(r.device) * 2) as u64;
                    // SAFETY: plan_runs checked the run against the pool
                    // and the tier, so [d, d + bytes) lies in this layer's
                    // cache buffer and [h, h + bytes) in the pinned buffer
                    // (tier_plan's layouts, tested); both outlive the copy
                    // (the cache and the tier live in the runner, which
                    // synchronises before dropping either).
                    unsafe {
                        let h = base.add(s.host_offset(l, kv, r.host));
                        match r.dir {
                            Dir::ToHost => {
                                sys::cuMemcpyDtoHAsync_v2(h as *mut c_void, d, bytes, stream)
                            }
                            Dir::ToDevice => {
                                sys::cuMemcpyHtoDAsync_v2(d, h as *const c_void, bytes, stream)
                            }
                        }
                    }
                    .result()
                    .map_err(driver_err("tier copy"))?;
                }
            }
            self.done[l]
                .record(&self.copy)
                .map_err(driver_err("event record"))?;
        }
        let (out, back) = bytes_each_way(&runs, &s);
        self.moved = (self.moved.0 + out, self.moved.1 + back);
        Ok(())
    }

    /// The main stream waits for layer `l`'s copies of the last
    /// [`Self::enqueue`] (no wait if none was queued since).
    pub fn wait_layer(&self, gpu: &Gpu, l: usize) -> Result<()> {
        match self.done.get(l) {
            Some(e) => gpu.stream().wait(e).map_err(driver_err("stream wait")),
            None => Ok(()),
        }
    }

    /// The main stream waits for every layer's copies.
    pub fn wait_all(&self, gpu: &Gpu) -> Result<()> {
        (0..self.done.len()).try_for_each(|l| self.wait_layer(gpu, l))
    }

    /// Bytes moved to the host and back since start.
    pub fn moved(&self) -> (u64, u64) {
        self.moved
    }
}

impl Drop for GpuHostTier {
    /// No copy may still read or write the pinned buffer once it is freed.
    fn drop(&mut self) {
        if let Err(e) = self.copy.synchronize() {
            tracing::warn!(error = ?e, "host KV tier: copies not drained before freeing");
        }
    }
}
