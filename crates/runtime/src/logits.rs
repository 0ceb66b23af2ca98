//! [`Logits`]: one step's logits rows as the runner left them, lent to the
//! sampler without a copy.
//!
//! A step's logits are `rows × vocab` f32: at batch 96 and Qwen's 151,936
//! tokens, 58 MB. Copying them into one `Vec` per row (what the runner did
//! before) took 61% of the engine worker's CPU time at 96 programs on the
//! CPU sweep, single-threaded, between the forward and sampling. The CPU
//! runner now hands over the forward's output tensor itself and the sampler
//! reads its rows in place.

#[cfg(feature = "candle")]
use candle_core::{DType, Storage, Tensor};

use crate::error::{ModelError, Result};

/// `rows` rows of `vocab` f32 logits, row-major, in batch order (one per
/// `BatchInput::logits_indices` entry).
pub struct Logits {
    rows: usize,
    vocab: usize,
    store: Store,
}

enum Store {
    Host(Vec<f32>),
    /// A contiguous CPU f32 tensor `[rows, vocab]`.
    #[cfg(feature = "candle")]
    Tensor(Tensor),
}

impl Logits {
    /// No rows (a step that asked for no logits).
    pub fn empty() -> Self {
        Logits {
            rows: 0,
            vocab: 0,
            store: Store::Host(Vec::new()),
        }
    }

    /// Rows of `vocab` logits laid end to end in `data`.
    pub fn from_flat(data: Vec<f32>, vocab: usize) -> Result<Self> {
        if vocab == 0 || !data.len().is_multiple_of(vocab) {
            return Err(ModelError::Batch(format!(
                "{} logits are not whole rows of {vocab}",
                data.len()
            )));
        }
        Ok(Logits {
            rows: data.len() / vocab,
            vocab,
            store: Store::Host(data),
        })
    }

    /// The CPU forward's `[rows, vocab]` output, kept as it is when it is a
    /// contiguous f32 tensor in host memory (converted once otherwise).
    #[cfg(feature = "candle")]
    pub fn from_tensor(t: Tensor) -> Result<Self> {
        let (rows, vocab) = t.dims2()?;
        let t = t.to_dtype(DType::F32)?.contiguous()?;
        if !t.device().is_cpu() {
            let data = t.flatten_all()?.to_vec1::<f32>()?;
            return Self::from_flat(data, vocab);
        }
        Ok(Logits {
            rows,
            vocab,
            store: Store::Tensor(t),
        })
    }

    /// Rows held.
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Logits per row.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Runs `f` on every row at once, borrowed in place: `rows × vocab`
    /// floats, row `i` at `i * vocab`.
    pub fn with_flat<R>(&self, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
        let n = self.rows * self.vocab;
        match &self.store {
            Store::Host(v) => Ok(f(&v[..n])),
            #[cfg(feature = "candle")]
            Store::Tensor(t) => {
                let (storage, layout) = t.storage_and_layout();
                let Storage::Cpu(cpu) = &*storage else {
                    return Err(ModelError::Batch("logits left the host".into()));
                };
                let all = cpu.as_slice::<f32>()?;
                let start = layout.start_offset();
                let rows = all.get(start..start + n).ok_or_else(|| {
                    ModelError::Batch(format!(
                        "logits storage holds {} floats, {n} expected from {start}",
                        all.len()
                    ))
                })?;
                Ok(f(rows))
            }
        }
    }

    /// Copies of the rows (tests, tools; the engine borrows them).
    pub fn to_rows(&self) -> Result<Vec<Vec<f32>>> {
        let vocab = self.vocab.max(1);
        self.with_flat(|flat| flat.chunks(vocab).map(<[f32]>::to_vec).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "candle")]
    use candle_core::{Device, Tensor};

    #[cfg(feature = "candle")]
    #[test]
    fn a_tensor_and_its_copy_lend_the_same_rows() {
        let data: Vec<f32> = (0..12).map(|i| i as f32 * 0.5).collect();
        let t = Tensor::from_vec(data.clone(), (3, 4), &Device::Cpu).expect("tensor");
        let from_t = Logits::from_tensor(t).expect("cpu f32");
        let from_v = Logits::from_flat(data.clone(), 4).expect("whole rows");
        assert_eq!((from_t.rows(), from_t.vocab()), (3, 4));
        assert_eq!(
            from_t.to_rows().expect("rows"),
            from_v.to_rows().expect("rows")
        );
        assert_eq!(from_t.with_flat(<[f32]>::to_vec).expect("flat"), data);
    }

    #[cfg(feature = "candle")]
    #[test]
    fn a_narrowed_tensor_lends_only_its_own_rows() {
        let data: Vec<f32> = (0..20).map(|i| i as f32).collect();
        let t = Tensor::from_vec(data, (5, 4), &Device::Cpu).expect("tensor");
        let rows = Logits::from_tensor(t.narrow(0, 2, 2).expect("narrow")).expect("logits");
        assert_eq!(
            rows.to_rows().expect("rows"),
            vec![vec![8.0, 9.0, 10.0, 11.0], vec![12.0, 13.0, 14.0, 15.0]]
        );
    }

    #[test]
    fn a_ragged_buffer_is_refused() {
        assert!(Logits::from_flat(vec![0.0; 7], 4).is_err());
        assert!(Logits::from_flat(vec![0.0; 4], 0).is_err());
        assert!(Logits::empty().is_empty());
    }
}
