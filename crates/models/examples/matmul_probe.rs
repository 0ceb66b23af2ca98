//! GFLOP/s of the linear layers' products against candle's gemm on the
//! Qwen3-0.6B shapes, for a range of activation rows T (decode batch sizes and
//! prefill chunks), both timed in the same run.
//!
//! ```text
//! cargo run --release -p agentd-models --example matmul_probe [-- 1,8,32,256]
//! AGENTD_CPU_KERNELS=avx2 cargo run --release -p agentd-models --example matmul_probe
//! ```

use std::time::Instant;

use agentd_models::layers::Linear;
use candle_core::{Device, Tensor};

/// `[out, in]` of q|k|v, o, gate|up, down and the output projection.
const SHAPES: [(usize, usize); 5] = [
    (4096, 1024),
    (1024, 2048),
    (6144, 1024),
    (1024, 3072),
    (151936, 1024),
];

fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let s = Instant::now();
    for _ in 0..reps {
        f();
    }
    s.elapsed().as_secs_f64() / reps as f64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ts: Vec<usize> = match std::env::args().nth(1) {
        Some(list) => list
            .split(',')
            .map(|v| v.parse())
            .collect::<Result<_, _>>()?,
        None => vec![1, 4, 8, 16, 32, 64, 256],
    };
    let layers: Vec<(Tensor, Linear)> = SHAPES
        .iter()
        .map(|&(n, k)| {
            let w: Vec<f32> = (0..n * k)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.01)
                .collect();
            let w = Tensor::from_vec(w, (n, k), &Device::Cpu)?;
            Ok((w.clone(), Linear::new(w, None)?))
        })
        .collect::<Result<_, Box<dyn std::error::Error>>>()?;
    println!(
        "kernel path: {} (AGENTD_CPU_KERNELS)",
        agentd_models::cpu_kernels::selected()?
    );
    println!("    T | ours GFLOP/s | candle gemm GFLOP/s | ratio");
    for t in ts {
        let (mut ours, mut gemm, mut flop) = (0.0, 0.0, 0.0);
        for ((w, lin), &(n, k)) in layers.iter().zip(&SHAPES) {
            let x: Vec<f32> = (0..t * k)
                .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.1)
                .collect();
            let reps = (64 / t).clamp(1, 5);
            ours += time(reps, || {
                std::hint::black_box(lin.forward(&x).expect("forward"));
            });
            let xt = Tensor::from_slice(&x, (t, k), &Device::Cpu)?;
            let wt = w.t()?;
            gemm += time(reps, || {
                std::hint::black_box(xt.matmul(&wt).expect("matmul"));
            });
            flop += 2.0 * (t * n * k) as f64;
        }
        println!(
            "{t:>5} | {:>12.1} | {:>19.1} | {:.2}x",
            flop / ours / 1e9,
            flop / gemm / 1e9,
            gemm / ours
        );
    }
    Ok(())
}
