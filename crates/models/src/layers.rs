//! Dense building blocks of the decoder: a linear layer whose small-batch path
//! uses every core, and RMSNorm + RoPE applied per head on plain buffers.

use std::sync::OnceLock;

use candle_core::{DType, Storage, Tensor, WithDType};
use rayon::prelude::*;

use crate::error::{ModelError, Result};
use crate::loader::Weights;
use crate::matmul::{has_own_kernels, matmul_xwt, WeightElem};
use crate::simd;

// RoPE's tables are the runtime's (the CUDA backend builds its table from
// the same ones), at their old paths here.
pub use agentd_runtime::rope::{inv_freq, RopeBatch, RopeStyle};

/// Whether a product with `t` activation rows runs on [`matmul_xwt`] rather
/// than candle's gemm.
///
/// Why: candle's gemm runs AVX2 kernels only and does badly on few rows (the
/// 151,936-row output projection alone took 63 ms per token; ENVIRONMENT.md).
/// With AVX-512, `matmul_xwt` wins at every T: 1.7-1.8x gemm's GFLOP/s at
/// T = 256..1024 (prefill) and more below (`matmul_probe` example); the
/// AVX2 kernels are kept at every T too (batch invariance; see
/// crates/models/README.md for the figures). On the portable path its
/// row-by-row loop only wins for a few rows.
/// `AGENTD_GEMV_MAX_ROWS` overrides the cut-off (benchmarks).
fn use_own_matmul(t: usize) -> bool {
    static V: OnceLock<usize> = OnceLock::new();
    let max = *V.get_or_init(|| {
        let default = if has_own_kernels() { usize::MAX } else { 8 };
        std::env::var("AGENTD_GEMV_MAX_ROWS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    });
    t <= max
}

/// `y = x W^T (+ b)` with W `[out, in]` as stored by Hugging Face.
///
/// Activations are plain `[T, in]` f32 slices: the decoder keeps its hidden
/// state in `Vec<f32>` so that no candle elementwise op (each a round trip
/// through candle's spinning thread pool, which competes with the matmul
/// threads for the cores) sits in the per-token path.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Vec<f32>>,
    in_dim: usize,
    out_dim: usize,
}

impl Linear {
    /// `weight`: an `[out, in]` tensor, f32, bf16 or f16 (16-bit ones are
    /// kept as they are and widened by the kernels); other dtypes are
    /// converted to f32.
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Result<Self> {
        let (out_dim, in_dim) = weight.dims2()?;
        let weight = match weight.dtype() {
            DType::F32 | DType::BF16 | DType::F16 => weight,
            _ => weight.to_dtype(DType::F32)?,
        };
        let bias = match bias {
            Some(b) => Some(b.flatten_all()?.to_vec1::<f32>()?),
            None => None,
        };
        Ok(Linear {
            weight: weight.contiguous()?,
            bias,
            in_dim,
            out_dim,
        })
    }

    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    /// `x`: `[T, in]` → `[T, out]`.
    pub fn forward(&self, x: &[f32]) -> Result<Vec<f32>> {
        let k = self.in_dim;
        if !x.len().is_multiple_of(k) {
            return Err(ModelError::Batch(format!(
                "linear layer expects rows of {k} inputs, got {} values",
                x.len()
            )));
        }
        let t = x.len() / k;
        let mut y = if self.weight.dtype() == DType::BF16 {
            // 16-bit weights always take the own kernels: candle's gemm
            // would want f32 weights.
            let mut out = vec![0f32; t * self.out_dim];
            with_slice::<half::bf16, _>(&self.weight, |w| {
                matmul_xwt(x, t, w, self.out_dim, k, &mut out)
            })?;
            out
        } else if self.weight.dtype() == DType::F16 {
            let mut out = vec![0f32; t * self.out_dim];
            with_slice::<half::f16, _>(&self.weight, |w| {
                matmul_xwt(x, t, w, self.out_dim, k, &mut out)
            })?;
            out
        } else if use_own_matmul(t) {
            let mut out = vec![0f32; t * self.out_dim];
            with_f32(&self.weight, |w| {
                matmul_xwt(x, t, w, self.out_dim, k, &mut out)
            })?;
            out
        } else {
            let xt = Tensor::from_slice(x, (t, k), self.weight.device())?;
            xt.matmul(&self.weight.t()?)?.flatten_all()?.to_vec1()?
        };
        if let Some(b) = &self.bias {
            for row in y.chunks_mut(self.out_dim) {
                row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
            }
        }
        Ok(y)
    }
}

/// Runs `f` on the f32 contents of a contiguous CPU tensor, without copying.
pub fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    with_slice(t, f)
}

/// Runs `f` on the contents of a contiguous CPU tensor of element type `T`
/// (f32, bf16, f16, ...), without copying.
pub fn with_slice<T: WithDType, R>(t: &Tensor, f: impl FnOnce(&[T]) -> R) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    let Some((start, end)) = layout.contiguous_offsets() else {
        return Err(ModelError::Batch("expected a contiguous tensor".into()));
    };
    match &*storage {
        Storage::Cpu(cpu) => Ok(f(&cpu.as_slice::<T>()?[start..end])),
        _ => Err(ModelError::Batch("expected a CPU tensor".into())),
    }
}

/// Appends rows `ids` of the `[rows, width]` matrix `table` (f32, bf16 or
/// f16; 16-bit rows widened exactly) to a new f32 buffer: the embedding
/// lookup.
pub fn gather_rows(table: &Tensor, ids: &[u32], width: usize) -> Result<Vec<f32>> {
    fn gather<W: WeightElem>(e: &[W], ids: &[u32], width: usize, x: &mut Vec<f32>) {
        for &id in ids {
            let row = &e[id as usize * width..(id as usize + 1) * width];
            x.extend(row.iter().map(|v| v.to_f32()));
        }
    }
    let mut x = Vec::with_capacity(ids.len() * width);
    match table.dtype() {
        DType::BF16 => with_slice::<half::bf16, _>(table, |e| gather(e, ids, width, &mut x))?,
        DType::F16 => with_slice::<half::f16, _>(table, |e| gather(e, ids, width, &mut x))?,
        _ => with_f32(table, |e| gather(e, ids, width, &mut x))?,
    }
    Ok(x)
}

/// RMSNorm of each `weight.len()`-wide row of `x` (as transformers: f32,
/// `x * rsqrt(mean(x²) + eps) * weight`).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let d = weight.len();
    let mut out = vec![0f32; x.len()];
    out.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .with_min_len(8)
        .for_each(|(o, xr)| {
            let inv = 1.0 / (simd::dot(xr, xr) / d as f32 + eps).sqrt();
            for ((o, v), w) in o.iter_mut().zip(xr).zip(weight) {
                *o = v * inv * w;
            }
        });
    out
}

/// `x += y`.
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    simd::axpy(x, 1.0, y);
}

/// `gate = silu(gate) * up` (SwiGLU).
pub fn silu_mul_in_place(gate: &mut [f32], up: &[f32]) {
    gate.par_chunks_mut(4096)
        .zip(up.par_chunks(4096))
        .for_each(|(g, u)| {
            for (g, u) in g.iter_mut().zip(u) {
                *g = *g / (1.0 + (-*g).exp()) * u;
            }
        });
}

/// Applies, to each head of each token of `buf` (`[T, heads, head_dim]`),
/// RMSNorm with `norm` when given (Qwen3's q_norm / k_norm) then RoPE on the
/// head's first `2 * inv_freq.len()` dims (the rest pass through: GLM's
/// partial rotary), pairing dims as `style` says.
pub fn head_norm_rope(
    buf: &mut [f32],
    heads: usize,
    head_dim: usize,
    norm: Option<&[f32]>,
    eps: f32,
    rope: &RopeBatch,
    style: RopeStyle,
) {
    let half = rope.half();
    buf.par_chunks_mut(heads * head_dim)
        .enumerate()
        .for_each(|(t, tok)| {
            let cos = &rope.cos()[t * half..(t + 1) * half];
            let sin = &rope.sin()[t * half..(t + 1) * half];
            for x in tok.chunks_mut(head_dim) {
                if let Some(weight) = norm {
                    let ms = simd::dot(x, x) / head_dim as f32;
                    let inv = 1.0 / (ms + eps).sqrt();
                    for (v, w) in x.iter_mut().zip(weight) {
                        *v = *v * inv * w;
                    }
                }
                rotate(&mut x[..2 * half], cos, sin, style);
            }
        });
}

/// Rotates the pairs of one head's rotated part `x` (`2 * cos.len()` dims).
fn rotate(x: &mut [f32], cos: &[f32], sin: &[f32], style: RopeStyle) {
    let half = cos.len();
    match style {
        RopeStyle::Neox => {
            let (a, b) = x.split_at_mut(half);
            for i in 0..half {
                let (x1, x2) = (a[i], b[i]);
                a[i] = x1 * cos[i] - x2 * sin[i];
                b[i] = x2 * cos[i] + x1 * sin[i];
            }
        }
        RopeStyle::Interleaved => {
            for (i, p) in x.chunks_exact_mut(2).enumerate() {
                let (x1, x2) = (p[0], p[1]);
                p[0] = x1 * cos[i] - x2 * sin[i];
                p[1] = x2 * cos[i] + x1 * sin[i];
            }
        }
    }
}

/// The f32 contents of a (small) tensor.
pub fn to_f32_vec(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_vec1()?)
}

/// Loads `{name}.weight` `[out, inp]` (and `{name}.bias` `[out]` when `bias`).
pub fn linear(w: &Weights, name: &str, out: usize, inp: usize, bias: bool) -> Result<Linear> {
    let weight = w.get_matrix(&format!("{name}.weight"), &[out, inp])?;
    let bias = if bias {
        Some(w.get(&format!("{name}.bias"), &[out])?)
    } else {
        None
    };
    Linear::new(weight, bias)
}

/// Loads a norm weight `[dim]` as plain f32.
pub fn norm_weight(w: &Weights, name: &str, dim: usize) -> Result<Vec<f32>> {
    w.get_f32(name, &[dim])
}
