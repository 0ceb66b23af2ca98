//! Finds and memory-maps a checkpoint's safetensors (a single `model.safetensors`
//! or the shards listed by `model.safetensors.index.json`) and hands out tensors
//! by name, checked against the shape the model expects and converted to f32.
//!
//! The shape check happens on the safetensors header before any data is read, so
//! a wrong checkpoint fails fast with the file and tensor named.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use candle_core::safetensors::{Load, MmapedSafetensors};
use candle_core::{DType, Device, Tensor};

use crate::error::{ModelError, Result};

const SINGLE: &str = "model.safetensors";
const INDEX: &str = "model.safetensors.index.json";

/// Drops the mapped pages of a tensor already copied out of the mapping from
/// this process's resident set (they stay in the page cache). Without it a
/// load peaks at the mapped pages plus their copies: 5.16 GB for a 2.64 GB
/// bf16 checkpoint kept in bf16 (1.96x).
fn release_pages(data: &[u8]) {
    #[cfg(unix)]
    {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let start = data.as_ptr() as usize;
        let begin = start.div_ceil(page) * page;
        let end = (start + data.len()) / page * page;
        if end > begin {
            // SAFETY: [begin, end) is whole pages inside the read-only file
            // mapping; MADV_DONTNEED on a file mapping only unmaps pages from
            // this process, and a later read faults the same bytes back in
            // from the file, so every borrow of the mapping stays valid.
            unsafe {
                libc::madvise(begin as *mut libc::c_void, end - begin, libc::MADV_DONTNEED);
            }
        }
    }
    #[cfg(not(unix))]
    let _ = data;
}

/// The weights of one checkpoint, memory-mapped.
pub struct Weights {
    mmaped: MmapedSafetensors,
    /// Tensor name -> the file it lives in (for error messages).
    file_of: HashMap<String, PathBuf>,
    files: Vec<PathBuf>,
    device: Device,
    /// Matrices stored in bf16 stay bf16 ([`Weights::get_matrix`]).
    keep_bf16: bool,
}

impl Weights {
    /// Opens the safetensors of the Hugging Face directory `dir`.
    pub fn from_dir(dir: &Path, device: &Device) -> Result<Self> {
        let files = checkpoint_files(dir)?;
        for f in &files {
            if !f.is_file() {
                return Err(ModelError::MissingFile {
                    path: f.clone(),
                    what: "safetensors shard listed by the index",
                });
            }
        }
        // SAFETY: the files are mapped read-only; like every mmap-based loader we
        // rely on nobody truncating the checkpoint while the model is loaded.
        let mmaped =
            unsafe { MmapedSafetensors::multi(&files) }.map_err(|e| ModelError::Weights {
                path: dir.to_path_buf(),
                reason: format!("cannot read safetensors: {e}"),
            })?;
        let mut file_of = HashMap::new();
        for (name, _) in mmaped.tensors() {
            file_of.insert(name, PathBuf::new());
        }
        // Map names to files by opening each header on its own: the combined
        // mapping does not say which file a tensor came from.
        if files.len() == 1 {
            for v in file_of.values_mut() {
                v.clone_from(&files[0]);
            }
        } else {
            for f in &files {
                // SAFETY: as above.
                let one =
                    unsafe { MmapedSafetensors::new(f) }.map_err(|e| ModelError::Weights {
                        path: f.clone(),
                        reason: format!("cannot read safetensors: {e}"),
                    })?;
                for (name, _) in one.tensors() {
                    file_of.insert(name, f.clone());
                }
            }
        }
        Ok(Weights {
            mmaped,
            file_of,
            files,
            device: device.clone(),
            keep_bf16: false,
        })
    }

    /// Keeps bf16 matrices in bf16 (the CPU kernels widen them on the fly):
    /// half the memory of an f32 copy, and no f32 copy of the model at load.
    pub fn keep_bf16(mut self, on: bool) -> Self {
        self.keep_bf16 = on;
        self
    }

    /// Loads the weight matrix `name`: bf16 as stored when
    /// [`Weights::keep_bf16`] is on, else (and for f16/f32) f32.
    pub fn get_matrix(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.load(name, shape, self.keep_bf16)
    }

    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    pub fn contains(&self, name: &str) -> bool {
        self.file_of.contains_key(name)
    }

    /// Loads `name`, checking its shape, as a contiguous f32 tensor.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.load(name, shape, false)
    }

    fn load(&self, name: &str, shape: &[usize], keep_bf16: bool) -> Result<Tensor> {
        let file = self
            .file_of
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                tensor: name.to_owned(),
                files: self
                    .files
                    .iter()
                    .map(|f| f.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let view = self.mmaped.get(name).map_err(|e| ModelError::Weights {
            path: file.clone(),
            reason: format!("tensor `{name}`: {e}"),
        })?;
        if view.shape() != shape {
            return Err(ModelError::ShapeMismatch {
                file: file.clone(),
                tensor: name.to_owned(),
                expected: shape.to_vec(),
                found: view.shape().to_vec(),
            });
        }
        use safetensors::Dtype as D;
        match view.dtype() {
            D::F32 | D::BF16 | D::F16 => {}
            other => {
                return Err(ModelError::UnsupportedDtype {
                    file: file.clone(),
                    tensor: name.to_owned(),
                    found: format!("{other:?}"),
                })
            }
        }
        let t = view.load(&self.device).map_err(|e| ModelError::Weights {
            path: file.clone(),
            reason: format!("tensor `{name}`: {e}"),
        })?;
        release_pages(view.data());
        if keep_bf16 && t.dtype() == DType::BF16 {
            return Ok(t.contiguous()?);
        }
        Ok(t.to_dtype(DType::F32)?.contiguous()?)
    }
}

/// The safetensors files of `dir`: the single file, or the shards of the index.
pub fn checkpoint_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join(SINGLE);
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join(INDEX);
    if !index.is_file() {
        return Err(ModelError::MissingFile {
            path: single,
            what: "no weights: expected model.safetensors or model.safetensors.index.json",
        });
    }
    let text = std::fs::read_to_string(&index).map_err(|e| ModelError::io(&index, e))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|source| ModelError::Json {
            path: index.clone(),
            source,
        })?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| ModelError::Config {
            path: index.clone(),
            field: "weight_map",
            reason: "missing or not an object".into(),
        })?;
    let mut shards = BTreeSet::new();
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| ModelError::Config {
            path: index.clone(),
            field: "weight_map",
            reason: format!("entry for `{tensor}` is not a file name"),
        })?;
        // Shard names are plain file names inside the directory; refuse paths
        // that would escape it.
        if file.contains('/') || file.contains('\\') || file == ".." {
            return Err(ModelError::Config {
                path: index.clone(),
                field: "weight_map",
                reason: format!("shard name {file:?} is not a plain file name"),
            });
        }
        shards.insert(file.to_owned());
    }
    if shards.is_empty() {
        return Err(ModelError::Config {
            path: index,
            field: "weight_map",
            reason: "lists no shards".into(),
        });
    }
    Ok(shards.into_iter().map(|s| dir.join(s)).collect())
}
