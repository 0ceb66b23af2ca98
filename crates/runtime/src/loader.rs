//! Finds and memory-maps a checkpoint's safetensors (a single `model.safetensors`
//! or the shards listed by `model.safetensors.index.json`) and hands out tensors
//! by name, checked against the shape the model expects: weight matrices in the
//! dtype [`LoadDtype`] asks for (by default as stored: f32, bf16 or f16), small
//! tensors (norms, biases) in f32.
//!
//! The shape and dtype checks happen on the safetensors header before any data
//! is read, so a wrong checkpoint fails fast with the file and tensor named.
//! Each tensor is copied out of the mapping once, in its stored dtype (cast
//! after that only when asked), and its mapped pages are then dropped from the
//! resident set, so loading peaks near the checkpoint's size, not twice it.
//!
//! Backend-neutral: the CPU backend takes its tensors ([`Weights::get`],
//! [`Weights::get_matrix`]), the CUDA backend uploads the mapped bytes
//! ([`Weights::with_raw`]) and its norms ([`Weights::get_f32`]). Built with
//! the feature `candle` (the mapping and the tensors are candle's).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use candle_core::safetensors::{Load, MmapedSafetensors};
use candle_core::{DType, Device, Tensor};

use crate::config::WeightDtype;
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

/// The dtype weight matrices take in memory (`--dtype`). Norm weights,
/// biases and router correction biases are f32 whatever it says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoadDtype {
    /// As stored: f32, bf16 or f16 (vLLM's `auto`). 16-bit matrices stay
    /// 16-bit; the CPU kernels widen them exactly inside the products.
    #[default]
    Auto,
    /// Every matrix cast to this dtype at load: widened exactly to f32, or
    /// rounded to nearest-even to bf16/f16 (f16 overflows to ±inf past
    /// 65504, as torch's cast does).
    Cast(WeightDtype),
}

impl LoadDtype {
    /// vLLM's `--dtype` names: `auto`, `float32`/`float`, `bfloat16`,
    /// `float16`/`half` (and `f32`, `bf16`, `f16`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "auto" => Some(LoadDtype::Auto),
            other => WeightDtype::parse(other).map(LoadDtype::Cast),
        }
    }

    /// Every name [`LoadDtype::parse`] accepts.
    pub const NAMES: &'static [&'static str] = &[
        "auto", "float32", "float", "f32", "bfloat16", "bf16", "float16", "half", "f16",
    ];

    /// The dtype a matrix stored as `stored` gets.
    pub fn resolve(self, stored: WeightDtype) -> WeightDtype {
        match self {
            LoadDtype::Auto => stored,
            LoadDtype::Cast(d) => d,
        }
    }
}

impl std::fmt::Display for LoadDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadDtype::Auto => f.write_str("auto"),
            LoadDtype::Cast(d) => f.write_str(d.as_hf_str()),
        }
    }
}

/// Told the stored bytes of each tensor as it is copied out of the mapping
/// (`agentd serve` draws the loading progress bar with it).
pub type LoadProgress = Arc<dyn Fn(u64) + Send + Sync>;

/// The weights of one checkpoint, memory-mapped.
pub struct Weights {
    mmaped: MmapedSafetensors,
    /// Tensor name -> the file it lives in (for error messages).
    file_of: HashMap<String, PathBuf>,
    files: Vec<PathBuf>,
    device: Device,
    /// The dtype of the matrices [`Weights::get_matrix`] hands out.
    matrix_dtype: LoadDtype,
    /// What was handed out so far: bytes (in memory, after any cast) and
    /// tensor names.
    loaded: Mutex<Loaded>,
    progress: Option<LoadProgress>,
}

#[derive(Default)]
struct Loaded {
    bytes: usize,
    names: HashSet<String>,
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
            matrix_dtype: LoadDtype::Auto,
            loaded: Mutex::default(),
            progress: None,
        })
    }

    /// The dtype of the matrices [`Weights::get_matrix`] hands out (default
    /// [`LoadDtype::Auto`]: as stored, so no f32 copy of a 16-bit model).
    pub fn with_dtype(mut self, dtype: LoadDtype) -> Self {
        self.matrix_dtype = dtype;
        self
    }

    /// The dtype of the matrices [`Weights::get_matrix`] hands out.
    pub fn matrix_dtype(&self) -> LoadDtype {
        self.matrix_dtype
    }

    /// Reports each tensor's stored bytes to `progress` as it is loaded.
    pub fn with_progress(mut self, progress: Option<LoadProgress>) -> Self {
        self.progress = progress;
        self
    }

    /// Bytes of the checkpoint's files (what a progress bar counts to).
    pub fn file_bytes(&self) -> u64 {
        self.files
            .iter()
            .filter_map(|f| f.metadata().ok())
            .map(|m| m.len())
            .sum()
    }

    /// Loads the weight matrix `name` in the dtype of [`Weights::with_dtype`].
    pub fn get_matrix(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.load(name, shape, self.matrix_dtype)
    }

    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    pub fn contains(&self, name: &str) -> bool {
        self.file_of.contains_key(name)
    }

    /// Bytes of the tensors handed out so far, in their in-memory dtype.
    pub fn loaded_bytes(&self) -> usize {
        self.loaded.lock().map_or(0, |l| l.bytes)
    }

    /// The checkpoint's tensors never handed out (sorted): e.g. GLM-4.5's
    /// multi-token-prediction layers, which the model does not run.
    pub fn unused(&self) -> Vec<String> {
        let Ok(l) = self.loaded.lock() else {
            return Vec::new();
        };
        let mut v: Vec<String> = self
            .file_of
            .keys()
            .filter(|n| !l.names.contains(*n))
            .cloned()
            .collect();
        v.sort();
        v
    }

    /// Loads `name`, checking its shape, as a contiguous f32 tensor.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.load(name, shape, LoadDtype::Cast(WeightDtype::F32))
    }

    /// Loads `name`, checking its shape, as a plain f32 vector (norm
    /// weights, biases: small tensors a backend keeps on the host or
    /// uploads as f32).
    pub fn get_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        Ok(self.get(name, shape)?.flatten_all()?.to_vec1()?)
    }

    /// Lends `name`'s bytes as stored in the mapped file (little-endian
    /// elements of the returned dtype), after the same checks as
    /// [`Weights::get`]: what a device backend uploads without an f32 stage.
    /// The pages are dropped from the resident set once `f` returns.
    pub fn with_raw<R>(
        &self,
        name: &str,
        shape: &[usize],
        f: impl FnOnce(WeightDtype, &[u8]) -> R,
    ) -> Result<R> {
        let (view, stored, _) = self.view(name, shape)?;
        let out = f(stored, view.data());
        release_pages(view.data());
        self.note_loaded(name, view.data().len(), view.data().len());
        Ok(out)
    }

    /// The mapped tensor `name`, checked to exist with `shape` in a dtype
    /// the runtime reads; its stored dtype and file.
    fn view(
        &self,
        name: &str,
        shape: &[usize],
    ) -> Result<(safetensors::tensor::TensorView<'_>, WeightDtype, &PathBuf)> {
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
        let stored = match view.dtype() {
            D::F32 => WeightDtype::F32,
            D::BF16 => WeightDtype::Bf16,
            D::F16 => WeightDtype::F16,
            other => {
                return Err(ModelError::UnsupportedDtype {
                    file: file.clone(),
                    tensor: name.to_owned(),
                    found: format!("{other:?}"),
                })
            }
        };
        Ok((view, stored, file))
    }

    fn note_loaded(&self, name: &str, bytes: usize, stored: usize) {
        if let Some(p) = &self.progress {
            p(stored as u64);
        }
        if let Ok(mut l) = self.loaded.lock() {
            l.bytes += bytes;
            l.names.insert(name.to_owned());
        }
    }

    fn load(&self, name: &str, shape: &[usize], dtype: LoadDtype) -> Result<Tensor> {
        let (view, stored, file) = self.view(name, shape)?;
        let t = view.load(&self.device).map_err(|e| ModelError::Weights {
            path: file.clone(),
            reason: format!("tensor `{name}`: {e}"),
        })?;
        release_pages(view.data());
        let stored_len = view.data().len();
        let want: DType = dtype.resolve(stored).to_candle();
        let t = if t.dtype() == want {
            t
        } else {
            t.to_dtype(want)?
        };
        self.note_loaded(name, t.elem_count() * want.size_in_bytes(), stored_len);
        Ok(t.contiguous()?)
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
