//! The decode-sized products (T = 1..8 activation rows) timed in isolation on
//! every kernel path the CPU has, f32 and bf16 weights (issue 27: at batch 1
//! the portable path decoded faster than the SIMD ones).
//!
//! ```text
//! cargo bench -p agentd-models --bench matmul_decode
//! MATMUL_TS=1,4 MATMUL_PATHS=avx512,portable cargo bench -p agentd-models --bench matmul_decode
//! ```
//!
//! The parent process re-runs itself per path with `AGENTD_CPU_KERNELS` set
//! (the path is chosen once per process), `MATMUL_ROUNDS` times (default 3)
//! with the paths interleaved, so a load that comes and goes on a shared
//! machine hits every path alike, and prints one markdown table: the median
//! over rounds of each round's median µs per product, and the weight bytes
//! streamed per second. Each
//! product is `Linear::forward`, what the decoder calls. The 151,936-row
//! output projections (155 MB f32 at k = 256, 622 MB at k = 1024) stream from
//! memory on every call; the small matrices stay in the caches between calls,
//! as a decode step's layer weights do not, so read those as the kernel's
//! compute rate.

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use agentd_models::cpu_kernels::{self, KernelPath};
use agentd_models::layers::Linear;
use candle_core::{DType, Device, Tensor};

use common::{list, median_secs};

/// At least this long of calls per product (and at most `MAX_CALLS`).
const MIN_TIME: Duration = Duration::from_millis(300);
const MAX_CALLS: usize = 200;

/// `[n, k]` weight shapes: the output projections at hidden 256 and 1024,
/// and layer matrices of both widths.
const SHAPES: [(usize, usize); 6] = [
    (151936, 256),
    (1024, 256),
    (256, 1024),
    (4096, 1024),
    (151936, 1024),
    (3072, 1024),
];
const CHILD: &str = "AGENTD_MATMUL_BENCH_CHILD";

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// One path (this process's): lines `n k dtype T seconds`.
fn child(ts: &[usize]) -> Result<()> {
    for &(n, k) in &SHAPES {
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.01)
            .collect();
        let w = Tensor::from_vec(w, (n, k), &Device::Cpu)?;
        for dtype in [DType::F32, DType::BF16] {
            let lin = Linear::new(w.to_dtype(dtype)?, None)?;
            for &t in ts {
                let x: Vec<f32> = (0..t * k)
                    .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.1)
                    .collect();
                let secs = median_secs(
                    || {
                        std::hint::black_box(lin.forward(&x).expect("forward"));
                    },
                    MIN_TIME,
                    MAX_CALLS,
                );
                println!("{n} {k} {dtype:?} {t} {secs:e}");
            }
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let ts: Vec<usize> = list("MATMUL_TS", "1,2,4,8")
        .iter()
        .map(|s| s.parse())
        .collect::<std::result::Result<_, _>>()?;
    if std::env::var_os(CHILD).is_some() {
        return child(&ts);
    }
    let supported = KernelPath::supported_paths();
    let paths: Vec<KernelPath> = match std::env::var("MATMUL_PATHS") {
        Ok(v) => v
            .split(',')
            .map(|p| KernelPath::from_setting(Some(p)))
            .collect::<std::result::Result<_, _>>()?,
        Err(_) => supported,
    };
    let rounds: usize = std::env::var("MATMUL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    // (n, k, dtype, T, path index) -> seconds, one per round.
    let mut cells: BTreeMap<(usize, usize, String, usize, usize), Vec<f64>> = BTreeMap::new();
    for (round, (pi, p)) in (0..rounds).flat_map(|r| paths.iter().enumerate().map(move |p| (r, p)))
    {
        eprintln!("-- round {round}: {p}");
        let out = Command::new(std::env::current_exe()?)
            .env(CHILD, "1")
            .env(cpu_kernels::ENV, p.name())
            .output()?;
        if !out.status.success() {
            return Err(format!("{p}: {}", String::from_utf8_lossy(&out.stderr)).into());
        }
        for line in String::from_utf8(out.stdout)?.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [n, k, dtype, t, secs] = f[..] else {
                continue;
            };
            let key = (n.parse()?, k.parse()?, dtype.to_string(), t.parse()?, pi);
            cells.entry(key).or_default().push(secs.parse()?);
        }
    }
    println!(
        "CPU: {}; threads: {}",
        cpu_kernels::cpu_model_name(),
        rayon::current_num_threads()
    );
    print!("| n × k | weights | T |");
    for p in &paths {
        print!(" {p} µs | {p} GB/s |");
    }
    println!();
    println!("|---|---|---:|{}", "---:|---:|".repeat(paths.len()));
    for &(n, k) in &SHAPES {
        for dtype in ["F32", "BF16"] {
            for &t in &ts {
                let bytes = (n * k * if dtype == "F32" { 4 } else { 2 }) as f64;
                print!("| {n} × {k} | {} | {t} |", dtype.to_lowercase());
                for pi in 0..paths.len() {
                    let Some(secs) = cells.get_mut(&(n, k, dtype.to_string(), t, pi)) else {
                        print!(" - | - |");
                        continue;
                    };
                    secs.sort_by(f64::total_cmp);
                    let s = secs[secs.len() / 2];
                    print!(" {:.0} | {:.1} |", s * 1e6, bytes / s / 1e9);
                }
                println!();
            }
        }
    }
    Ok(())
}
