//! Weight matrices staged for upload in the device dtype, straight from the
//! mapped checkpoint: a bf16 (f16) tensor going to a bf16 (f16) device is
//! copied bit for bit, with no f32 copy of it on the host; any other pair is
//! converted element by element (widened exactly, rounded to nearest even)
//! without a full-tensor f32 buffer. Host-side only, so it is built and
//! tested without a GPU.

use agentd_runtime::loader::Weights;
use agentd_runtime::WeightDtype;

use crate::error::Result;
use crate::plan::Dtype;

/// Appends the bits of matrix `name` (`shape`, as stored) in `dtype` to
/// `out` (fused matrices — QKV, gate·up — are several appends).
pub fn append_matrix(
    w: &Weights,
    name: &str,
    shape: &[usize],
    dtype: Dtype,
    out: &mut Vec<u16>,
) -> Result<()> {
    w.with_raw(name, shape, |stored, bytes| {
        out.reserve(bytes.len() / stored.size());
        let half = |b: &[u8]| u16::from_le_bytes([b[0], b[1]]);
        match (stored, dtype) {
            (WeightDtype::Bf16, Dtype::Bf16) | (WeightDtype::F16, Dtype::F16) => {
                out.extend(bytes.chunks_exact(2).map(half));
            }
            (WeightDtype::Bf16, Dtype::F16) => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| dtype.encode(half::bf16::from_bits(half(b)).to_f32())),
            ),
            (WeightDtype::F16, Dtype::Bf16) => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| dtype.encode(half::f16::from_bits(half(b)).to_f32())),
            ),
            (WeightDtype::F32, _) => out.extend(
                bytes
                    .chunks_exact(4)
                    .map(|b| dtype.encode(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
            ),
        }
    })?;
    Ok(())
}

/// One matrix in `dtype` (see [`append_matrix`]).
pub fn matrix(w: &Weights, name: &str, shape: &[usize], dtype: Dtype) -> Result<Vec<u16>> {
    let mut out = Vec::new();
    append_matrix(w, name, shape, dtype, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use candle_core::{DType, Device, Tensor};

    use super::*;

    /// A checkpoint of one 3×4 matrix `w` stored in `dtype`, and the f32
    /// values it holds exactly.
    fn checkpoint(dtype: DType) -> (tempfile::TempDir, Weights, Vec<f32>) {
        let dir = tempfile::tempdir().expect("temp dir");
        let values: Vec<f32> = (0..12).map(|i| (i as f32 - 5.5) * 0.3711).collect();
        let t = Tensor::from_vec(values, (3, 4), &Device::Cpu)
            .and_then(|t| t.to_dtype(dtype))
            .expect("tensor");
        let exact = t
            .to_dtype(DType::F32)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .expect("values");
        let tensors = HashMap::from([("w".to_string(), t)]);
        candle_core::safetensors::save(&tensors, dir.path().join("model.safetensors"))
            .expect("save");
        let w = Weights::from_dir(dir.path(), &Device::Cpu).expect("weights");
        (dir, w, exact)
    }

    #[test]
    fn a_bf16_checkpoint_reaches_a_bf16_device_bit_for_bit() {
        let (_dir, w, exact) = checkpoint(DType::BF16);
        let bits = matrix(&w, "w", &[3, 4], Dtype::Bf16).expect("staged");
        let want: Vec<u16> = exact
            .iter()
            .map(|&x| half::bf16::from_f32(x).to_bits())
            .collect();
        assert_eq!(bits, want);
        assert_eq!(w.loaded_bytes(), 12 * 2, "the stored bytes, no f32 copy");
    }

    #[test]
    fn other_dtypes_are_converted_element_by_element() {
        for (stored, device) in [
            (DType::F32, Dtype::Bf16),
            (DType::F32, Dtype::F16),
            (DType::BF16, Dtype::F16),
            (DType::F16, Dtype::Bf16),
            (DType::F16, Dtype::F16),
        ] {
            let (_dir, w, exact) = checkpoint(stored);
            let bits = matrix(&w, "w", &[3, 4], device).expect("staged");
            assert_eq!(bits, device.encode_all(&exact), "{stored:?} -> {device:?}");
        }
    }

    #[test]
    fn fused_matrices_are_appended_in_order_and_shapes_are_checked() {
        let (_dir, w, _) = checkpoint(DType::BF16);
        let one = matrix(&w, "w", &[3, 4], Dtype::Bf16).expect("staged");
        let mut two = Vec::new();
        append_matrix(&w, "w", &[3, 4], Dtype::Bf16, &mut two).expect("first");
        append_matrix(&w, "w", &[3, 4], Dtype::Bf16, &mut two).expect("second");
        assert_eq!(two, [one.clone(), one].concat());
        let err = matrix(&w, "w", &[4, 3], Dtype::Bf16).expect_err("wrong shape");
        assert!(err.to_string().contains('w'), "{err}");
        assert!(matrix(&w, "missing", &[3, 4], Dtype::Bf16).is_err());
    }
}
