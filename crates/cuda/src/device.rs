//! The GPU: one context and stream, the embedded kernels, cuBLAS, and device
//! buffers. Single-stream by design: every call is ordered on `stream`, so
//! cudarc's per-buffer event tracking is switched off (it would record an
//! event per pointer use).

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::cublas::{result as blas, sys as blas_sys, CudaBlas};
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
    PinnedHostSlice, PushKernelArg, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;

use crate::error::{CudaError, Result};
use crate::plan::{Dtype, MAX_SMEM_BYTES};

/// The fat binaries build.rs compiled from `kernels/`.
const MODULES: [(&str, &[u8]); 6] = [
    (
        "layers",
        include_bytes!(concat!(env!("OUT_DIR"), "/layers.fatbin")),
    ),
    (
        "cache",
        include_bytes!(concat!(env!("OUT_DIR"), "/cache.fatbin")),
    ),
    (
        "attention",
        include_bytes!(concat!(env!("OUT_DIR"), "/attention.fatbin")),
    ),
    (
        "decode_1p",
        include_bytes!(concat!(env!("OUT_DIR"), "/decode_1p.fatbin")),
    ),
    (
        "moe",
        include_bytes!(concat!(env!("OUT_DIR"), "/moe.fatbin")),
    ),
    (
        "sample",
        include_bytes!(concat!(env!("OUT_DIR"), "/sample.fatbin")),
    ),
];

/// Entry points per module (the `extern "C"` names in the .cu files).
fn entry_points(module: &str) -> Vec<String> {
    let typed = |names: &[&str]| -> Vec<String> {
        names
            .iter()
            .flat_map(|n| [format!("{n}_bf16"), format!("{n}_f16")])
            .collect()
    };
    match module {
        "layers" => typed(&[
            "embed",
            "add_rms_norm",
            "head_norm_rope",
            "silu_mul",
            "fill_uniform",
            "qkv_prologue",
            "add_bias",
            "rms_norm_rows",
            "head_rope_interleaved",
            "head_norm_rope_partial",
            "gather_rows",
            "scatter_add_rows",
            "cast_rows",
        ]),
        "cache" => {
            let mut v = typed(&["reshape_and_cache"]);
            v.push("copy_blocks".into());
            v
        }
        "sample" => vec!["sample_rows".into()],
        "moe" => {
            let mut v = typed(&["moe_gemm", "moe_combine"]);
            v.extend(["moe_route", "moe_align_count", "moe_align_scatter"].map(String::from));
            v
        }
        "decode_1p" => {
            let mut v = Vec::new();
            for t in ["bf16", "f16"] {
                for d in crate::plan::HEAD_DIMS {
                    for g in crate::plan::SINGLE_PASS_GROUPS {
                        v.push(format!("paged_decode_1p_{t}_d{d}_g{g}"));
                    }
                }
            }
            v
        }
        _ => {
            let mut v = typed(&["paged_decode_reduce"]);
            for t in ["bf16", "f16"] {
                for d in crate::plan::HEAD_DIMS {
                    v.push(format!("paged_decode_{t}_d{d}"));
                    v.push(format!("paged_prefill_{t}_d{d}"));
                }
            }
            v
        }
    }
}

/// A u64 attribute of a memory pool.
fn pool_attr(pool: sys::CUmemoryPool, attr: sys::CUmemPool_attribute) -> Result<u64> {
    let mut v: u64 = 0;
    // SAFETY: the USED_MEM attributes are cuuint64_t values.
    unsafe { sys::cuMemPoolGetAttribute(pool, attr, (&mut v as *mut u64).cast()) }
        .result()
        .map_err(driver_err("cuMemPoolGetAttribute"))?;
    Ok(v)
}

pub(crate) fn driver_err(op: &str) -> impl Fn(cudarc::driver::DriverError) -> CudaError + '_ {
    move |e| CudaError::Driver {
        op: op.to_string(),
        msg: format!("{e:?}"),
    }
}

fn blas_err(op: &str) -> impl Fn(cudarc::cublas::result::CublasError) -> CudaError + '_ {
    move |e| CudaError::Blas {
        op: op.to_string(),
        msg: format!("{e:?}"),
    }
}

/// A kernel argument: device pointers travel as raw addresses, so a kernel
/// can take a view into a buffer (the K part of the fused QKV rows) or null.
#[derive(Debug, Clone, Copy)]
pub enum Arg {
    Ptr(u64),
    I32(i32),
    I64(i64),
    U64(u64),
    F32(f32),
}

/// A device buffer of `T`.
pub type Buf<T> = CudaSlice<T>;

pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    funcs: HashMap<String, CudaFunction>,
    /// cuBLAS's fixed workspace when the stream is captured into graphs
    /// ([`Gpu::new_for_graphs`]).
    _blas_workspace: Option<Buf<u8>>,
}

/// cuBLAS's workspace for captured products (vLLM and PyTorch give it a few
/// MiB per stream; 32 MiB covers every product of the shapes served).
const GRAPH_BLAS_WORKSPACE: usize = 32 << 20;

impl Gpu {
    /// Whether a CUDA driver and at least one device are present.
    pub fn available() -> bool {
        // SAFETY: only probes whether the driver library can be loaded.
        let lib = unsafe { sys::is_culib_present() };
        lib && CudaContext::device_count().map(|n| n > 0).unwrap_or(false)
    }

    /// Opens device `ordinal` and loads every kernel; work runs on the
    /// context's default stream (the path validated on an H200).
    pub fn new(ordinal: usize) -> Result<Self> {
        Self::open(ordinal, false)
    }

    /// [`Gpu::new`] for CUDA graphs (`--cuda-graphs`): a stream of its own
    /// (the legacy default stream cannot be captured) and a fixed cuBLAS
    /// workspace (cuBLAS must not allocate during a capture).
    pub fn new_for_graphs(ordinal: usize) -> Result<Self> {
        Self::open(ordinal, true)
    }

    fn open(ordinal: usize, graphs: bool) -> Result<Self> {
        // SAFETY: as above.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::NoDevice(
                "the CUDA driver library (libcuda.so) is not loadable".into(),
            ));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver_err("cuCtxCreate"))?;
        // SAFETY: nothing has been allocated yet; one stream orders all work.
        unsafe { ctx.disable_event_tracking() };
        let stream = if graphs {
            ctx.new_stream().map_err(driver_err("new_stream"))?
        } else {
            ctx.default_stream()
        };
        let blas = CudaBlas::new(stream.clone()).map_err(blas_err("cublasCreate"))?;
        let blas_workspace = if graphs {
            let ws = stream
                .alloc_zeros::<u8>(GRAPH_BLAS_WORKSPACE)
                .map_err(driver_err("alloc"))?;
            let (p, guard) = ws.device_ptr(&stream);
            // SAFETY: `ws` lives as long as the handle (both in this Gpu)
            // and holds GRAPH_BLAS_WORKSPACE bytes on the handle's stream.
            unsafe {
                blas_sys::cublasSetWorkspace_v2(
                    *blas.handle(),
                    p as *mut std::ffi::c_void,
                    GRAPH_BLAS_WORKSPACE,
                )
            }
            .result()
            .map_err(blas_err("cublasSetWorkspace"))?;
            drop(guard);
            Some(ws)
        } else {
            None
        };
        let mut funcs = HashMap::new();
        for (name, image) in MODULES {
            let module = ctx
                .load_module(Ptx::from_binary(image.to_vec()))
                .map_err(driver_err(name))?;
            for f in entry_points(name) {
                let func = module.load_function(&f).map_err(driver_err(&f))?;
                // Opt in to more than 48 KiB of dynamic shared memory (the
                // attention kernels' tiles); harmless for the others.
                func.set_attribute(
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    MAX_SMEM_BYTES as i32,
                )
                .map_err(driver_err(&f))?;
                funcs.insert(f, func);
            }
        }
        tracing::info!(device = %Self::name_of(&ctx), kernels = funcs.len(), "CUDA device ready");
        Ok(Gpu {
            ctx,
            stream,
            blas,
            funcs,
            _blas_workspace: blas_workspace,
        })
    }

    fn name_of(ctx: &CudaContext) -> String {
        ctx.name().unwrap_or_else(|_| "unknown".into())
    }

    pub fn name(&self) -> String {
        Self::name_of(&self.ctx)
    }

    pub fn compute_capability(&self) -> Result<(i32, i32)> {
        self.ctx
            .compute_capability()
            .map_err(driver_err("compute_capability"))
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(driver_err("synchronize"))
    }

    /// Free and total memory of this device in bytes (`cuMemGetInfo`).
    pub fn memory(&self) -> Result<(u64, u64)> {
        self.ctx
            .bind_to_thread()
            .map_err(driver_err("cuCtxSetCurrent"))?;
        let (free, total) =
            cudarc::driver::result::mem_get_info().map_err(driver_err("cuMemGetInfo"))?;
        Ok((free as u64, total as u64))
    }

    /// Runs `f` (work on this device's stream) and returns the most memory
    /// it held at once beyond what was in use before: the rise of the
    /// stream-ordered pool's high watermark (cudarc allocates a step's
    /// buffers from it with `cuMemAllocAsync` and frees them back into it),
    /// or what `f` kept of the device's memory (allocations outside the
    /// pool), whichever is larger. `--gpu-memory-utilization` sizes the KV
    /// cache from it.
    pub fn peak_during(&self, f: impl FnOnce() -> Result<()>) -> Result<u64> {
        use sys::CUmemPool_attribute::{
            CU_MEMPOOL_ATTR_USED_MEM_CURRENT as CURRENT, CU_MEMPOOL_ATTR_USED_MEM_HIGH as HIGH,
        };
        self.synchronize()?;
        let pool = self.default_pool()?;
        let used_before = pool_attr(pool, CURRENT)?;
        // The high watermark can only be reset to zero; it restarts from
        // the memory in use now.
        let mut zero: u64 = 0;
        // SAFETY: `pool` is this device's default pool; the attribute takes
        // a cuuint64_t.
        unsafe { sys::cuMemPoolSetAttribute(pool, HIGH, (&mut zero as *mut u64).cast()) }
            .result()
            .map_err(driver_err("cuMemPoolSetAttribute"))?;
        let (free_before, _) = self.memory()?;
        f()?;
        self.synchronize()?;
        let high = pool_attr(pool, HIGH)?;
        let (free_after, _) = self.memory()?;
        Ok(high
            .saturating_sub(used_before)
            .max(free_before.saturating_sub(free_after)))
    }

    /// Returns the memory the stream-ordered pool keeps for reuse to the
    /// device (after a release: `cuMemPoolTrimTo(pool, 0)`), once the
    /// stream's work is done.
    pub fn trim_pool(&self) -> Result<()> {
        self.synchronize()?;
        let pool = self.default_pool()?;
        // SAFETY: `pool` is this device's default pool; trimming frees only
        // memory no allocation holds.
        unsafe { sys::cuMemPoolTrimTo(pool, 0) }
            .result()
            .map_err(driver_err("cuMemPoolTrimTo"))
    }

    /// The device's default memory pool (where `cuMemAllocAsync` takes from).
    fn default_pool(&self) -> Result<sys::CUmemoryPool> {
        let mut pool = std::ptr::null_mut();
        // SAFETY: writes one pool handle for this context's device.
        unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, self.ctx.cu_device()) }
            .result()
            .map_err(driver_err("cuDeviceGetDefaultMemPool"))?;
        Ok(pool)
    }

    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> Result<Buf<T>> {
        self.stream
            .alloc_zeros(n.max(1))
            .map_err(driver_err("alloc"))
    }

    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<Buf<T>> {
        if host.is_empty() {
            // SAFETY: a one-element buffer nothing reads (kernels get n = 0).
            return unsafe { self.stream.alloc(1) }.map_err(driver_err("alloc"));
        }
        self.stream.clone_htod(host).map_err(driver_err("upload"))
    }

    /// Copies `host` into the first `host.len()` elements of `dst` (an
    /// error, not cudarc's panic, when `dst` is shorter).
    pub fn upload_into<T: DeviceRepr>(&self, host: &[T], dst: &mut Buf<T>) -> Result<()> {
        if host.len() > dst.len() {
            return Err(CudaError::Unsupported(format!(
                "{} values into a buffer of {}",
                host.len(),
                dst.len()
            )));
        }
        self.stream
            .memcpy_htod(host, dst)
            .map_err(driver_err("upload"))
    }

    pub fn download<T: DeviceRepr + Clone + Default>(&self, buf: &Buf<T>) -> Result<Vec<T>> {
        self.stream.clone_dtoh(buf).map_err(driver_err("download"))
    }

    /// Copies `src` into `pinned` (page-locked host memory, grown as needed:
    /// a direct DMA at full PCIe speed, where a pageable copy is staged and
    /// several times slower) and hands the values to `f`.
    pub fn download_pinned<R>(
        &self,
        src: &Buf<f32>,
        pinned: &mut Option<PinnedHostSlice<f32>>,
        f: impl FnOnce(&[f32]) -> R,
    ) -> Result<R> {
        self.download_pinned_at(self.ptr(src, 0), src.len(), pinned, f)
    }

    /// [`Gpu::download_pinned`] of `n` f32 at device address `src` (a view
    /// into a larger buffer: a graph's logits).
    pub fn download_pinned_at<R>(
        &self,
        src: u64,
        n: usize,
        pinned: &mut Option<PinnedHostSlice<f32>>,
        f: impl FnOnce(&[f32]) -> R,
    ) -> Result<R> {
        if pinned.as_ref().is_none_or(|p| p.len() < n) {
            // SAFETY: the buffer is written by the copy below before it is read.
            let buf = unsafe { self.ctx.alloc_pinned::<f32>(n.next_power_of_two()) }
                .map_err(driver_err("alloc_pinned"))?;
            *pinned = Some(buf);
        }
        let Some(host) = pinned.as_mut() else {
            return Err(CudaError::Unsupported("pinned buffer missing".into()));
        };
        let dst = host.as_mut_slice().map_err(driver_err("download"))?;
        let dst = &mut dst[..n];
        // SAFETY: the caller's `src` holds `n` f32 on this stream's device
        // (a buffer it owns, or a view into one); `dst` is page-locked host
        // memory of at least `n` values, read only after the stream is
        // synchronised below.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }
            .map_err(driver_err("download"))?;
        self.synchronize()?;
        Ok(f(dst))
    }

    /// Device address of `buf` plus `offset` elements.
    pub fn ptr<T>(&self, buf: &Buf<T>, offset: usize) -> u64 {
        let (p, _guard) = buf.device_ptr(&self.stream);
        p + (offset * std::mem::size_of::<T>()) as u64
    }

    /// Launches `name` and checks the launch.
    pub fn launch(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        smem: usize,
        args: &[Arg],
    ) -> Result<()> {
        let func = self
            .funcs
            .get(name)
            .ok_or_else(|| CudaError::Unsupported(format!("no kernel named {name}")))?;
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        let mut b = self.stream.launch_builder(func);
        for a in args {
            match a {
                Arg::Ptr(p) | Arg::U64(p) => b.arg(p),
                Arg::I32(v) => b.arg(v),
                Arg::I64(v) => b.arg(v),
                Arg::F32(v) => b.arg(v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (block, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        // SAFETY: each wrapper in ops.rs passes the argument list its kernel
        // declares, with buffers sized for the launch.
        unsafe { b.launch(cfg) }.map_err(driver_err(name))?;
        Ok(())
    }

    /// Row-major `y[t, n] = x[t, k] · w[n, k]ᵀ` (weights as Hugging Face stores
    /// them), f32 accumulation; `y` is f32 when `y_f32`, else `dtype`.
    #[allow(clippy::too_many_arguments)]
    pub fn linear(
        &self,
        dtype: Dtype,
        x: u64,
        w: u64,
        y: u64,
        y_f32: bool,
        t: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        if t == 0 {
            return Ok(());
        }
        let ty = match dtype {
            Dtype::Bf16 => blas_sys::cudaDataType::CUDA_R_16BF,
            Dtype::F16 => blas_sys::cudaDataType::CUDA_R_16F,
        };
        let cty = if y_f32 {
            blas_sys::cudaDataType::CUDA_R_32F
        } else {
            ty
        };
        let (alpha, beta) = (1f32, 0f32);
        // Column-major view: yᵀ[n, t] = (wᵀ)ᵀ[n, k] · xᵀ[k, t].
        // SAFETY: the caller sized x, w and y for (t, n, k).
        unsafe {
            blas::gemm_ex(
                *self.blas.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                t as i32,
                k as i32,
                (&alpha) as *const f32 as *const _,
                w as *const _,
                ty,
                k as i32,
                x as *const _,
                ty,
                k as i32,
                (&beta) as *const f32 as *const _,
                y as *mut _,
                cty,
                n as i32,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(blas_err("gemm"))
    }

    /// Device-to-device copy of `n` elements (bandwidth measurement).
    pub fn copy<T: DeviceRepr>(&self, src: &Buf<T>, dst: &mut Buf<T>) -> Result<()> {
        self.stream
            .memcpy_dtod(src, dst)
            .map_err(driver_err("memcpy_dtod"))
    }

    /// Elapsed milliseconds of `f` on the stream, timed with CUDA events.
    pub fn time_ms(&self, f: impl FnOnce() -> Result<()>) -> Result<f32> {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.ctx.new_event(flags).map_err(driver_err("event"))?;
        let end = self.ctx.new_event(flags).map_err(driver_err("event"))?;
        start.record(&self.stream).map_err(driver_err("event"))?;
        f()?;
        end.record(&self.stream).map_err(driver_err("event"))?;
        end.synchronize().map_err(driver_err("event"))?;
        start.elapsed_ms(&end).map_err(driver_err("event"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every entry point `Gpu::open` loads is in its module's embedded
    /// fat binary (a name the .cu files do not define would fail the
    /// device's start, which only a GPU run would otherwise find).
    #[test]
    fn every_entry_point_is_in_its_fat_binary() {
        for (module, image) in MODULES {
            for name in entry_points(module) {
                let mut needle = name.clone().into_bytes();
                needle.push(0);
                assert!(
                    image.windows(needle.len()).any(|w| w == needle.as_slice()),
                    "{name} is not in {module}.fatbin"
                );
            }
        }
        // A control: an instance the .cu files do not build is absent.
        let (_, image) = MODULES.iter().find(|m| m.0 == "decode_1p").expect("module");
        let absent = b"paged_decode_1p_bf16_d128_g16\0";
        assert!(!image.windows(absent.len()).any(|w| w == absent));
    }
}
