//! Helpers shared by the integration tests: golden fixtures and a tiny
//! "engine" that allocates block ids and drives sequences step by step.
#![allow(dead_code)]

use std::path::PathBuf;

use agentd_models::{BatchBuilder, LogitsFor, Model, PagedKvCache};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::Value;

/// Every golden fixture: Qwen3 (the first three), GLM-4-0414, Qwen3-MoE and
/// GLM-4.5 MoE (scripts/make_golden.py says what each covers).
pub const MODELS: [&str; 9] = [
    "gqa4-tied",
    "gqa2-untied",
    "gqa1-untied",
    "glm4-gqa2",
    "glm4-gqa1-tied",
    "qwen3moe-gqa2",
    "qwen3moe-gqa1-tied",
    "glm4moe-gqa2",
    "glm4moe-gqa1-tied",
];

pub fn fixture_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/golden")
        .join(name)
}

pub struct Step {
    pub token: u32,
    pub logprob: f32,
    pub logits: Vec<f32>,
}

pub struct Case {
    pub input_ids: Vec<u32>,
    pub all_positions: bool,
    pub prefill_logits: Vec<Vec<f32>>,
    pub greedy: Vec<Step>,
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

pub fn golden(name: &str) -> Vec<Case> {
    let path = fixture_dir(name).join("golden.json");
    let text = std::fs::read_to_string(&path).expect("golden.json");
    let v: Value = serde_json::from_str(&text).expect("json");
    v["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| Case {
            input_ids: c["input_ids"]
                .as_array()
                .expect("ids")
                .iter()
                .map(|x| x.as_u64().expect("id") as u32)
                .collect(),
            all_positions: c["prefill_logits_all_positions"].as_bool().expect("bool"),
            prefill_logits: c["prefill_logits"]
                .as_array()
                .expect("rows")
                .iter()
                .map(floats)
                .collect(),
            greedy: c["greedy"]
                .as_array()
                .expect("greedy")
                .iter()
                .map(|s| Step {
                    token: s["token"].as_u64().expect("token") as u32,
                    logprob: s["logprob"].as_f64().expect("logprob") as f32,
                    logits: floats(&s["logits"]),
                })
                .collect(),
        })
        .collect()
}

pub fn load(name: &str) -> Model {
    Model::load(&fixture_dir(name)).expect("load fixture")
}

/// max |a - b| / max |b|.
pub fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let num = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let den = b.iter().map(|y| y.abs()).fold(0f32, f32::max);
    num / den.max(1e-12)
}

pub fn rows(t: &candle_core::Tensor) -> Vec<Vec<f32>> {
    t.to_vec2::<f32>().expect("logits")
}

/// Hands out block ids from a shuffled pool, so block tables are never
/// contiguous or ordered.
pub struct BlockPool {
    free: Vec<u32>,
}

impl BlockPool {
    pub fn new(num_blocks: usize, seed: u64) -> Self {
        let mut free: Vec<u32> = (0..num_blocks as u32).collect();
        free.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(seed));
        BlockPool { free }
    }

    pub fn alloc(&mut self) -> u32 {
        self.free.pop().expect("out of blocks")
    }
}

/// One sequence being driven through the model.
pub struct Seq {
    pub tokens: Vec<u32>,
    pub num_cached: usize,
    pub table: Vec<u32>,
}

impl Seq {
    pub fn new(prompt: &[u32]) -> Self {
        Seq {
            tokens: prompt.to_vec(),
            num_cached: 0,
            table: Vec::new(),
        }
    }

    /// Grows the block table to hold `len` tokens.
    pub fn reserve(&mut self, len: usize, block_size: usize, pool: &mut BlockPool) {
        while self.table.len() * block_size < len {
            self.table.push(pool.alloc());
        }
    }
}

/// Runs one step over `(seq, chunk_len, logits)` entries; returns the logits rows.
pub fn step(
    model: &Model,
    cache: &mut PagedKvCache,
    pool: &mut BlockPool,
    seqs: &mut [&mut Seq],
    chunks: &[(usize, LogitsFor)],
) -> Vec<Vec<f32>> {
    let bs = cache.block_size();
    let mut b = BatchBuilder::new(bs);
    for (s, &(n, lf)) in seqs.iter_mut().zip(chunks) {
        let end = s.num_cached + n;
        s.reserve(end, bs, pool);
        b.push(&s.tokens[s.num_cached..end], s.num_cached, &s.table, lf);
    }
    let logits = model.forward(&b.build(), cache).expect("forward");
    for (s, &(n, _)) in seqs.iter_mut().zip(chunks) {
        s.num_cached += n;
    }
    rows(&logits)
}

pub fn argmax(v: &[f32]) -> u32 {
    agentd_models::sampling::argmax(v) as u32
}

/// Runs this test binary again (every test but `this_test`) under each
/// other CPU kernel path the CPU supports, forced by `AGENTD_CPU_KERNELS`,
/// and fails if any run fails; paths the CPU lacks are skipped with a
/// message. A no-op inside such a run (the variable is set).
pub fn rerun_under_other_kernel_paths(this_test: &str) {
    use agentd_models::cpu_kernels::{KernelPath, ENV};
    if std::env::var_os(ENV).is_some() {
        return;
    }
    let exe = std::env::current_exe().expect("test binary path");
    for path in KernelPath::ALL {
        if !path.supported() {
            eprintln!("SKIPPED {path}: this CPU lacks {}", path.needs());
            continue;
        }
        if path == KernelPath::best() {
            continue; // this process runs the tests on it
        }
        let out = std::process::Command::new(&exe)
            .env(ENV, path.name())
            .args(["--skip", this_test, "--test-threads", "1"])
            .output()
            .expect("run the test binary again");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "tests under {ENV}={path} failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Guard against a run that filtered everything out.
        let passed = stdout
            .lines()
            .find_map(|l| l.strip_prefix("test result: ok. "))
            .and_then(|r| r.split(' ').next()?.parse::<usize>().ok())
            .unwrap_or(0);
        assert!(passed > 0, "no test ran under {path}:\n{stdout}");
        eprintln!("{ENV}={path}: {passed} tests passed");
    }
}

/// Whether the process's kernel path has the vectorised matmul and
/// attention kernels (every row batch-invariant, 16-bit weights widened in
/// the same FMA chains). The portable path hands products of more than 8
/// rows to candle's gemm, which sums in another order.
pub fn vectorised_kernels() -> bool {
    use agentd_models::cpu_kernels::{path, KernelPath};
    matches!(path(), KernelPath::Avx2 | KernelPath::Avx512)
}
