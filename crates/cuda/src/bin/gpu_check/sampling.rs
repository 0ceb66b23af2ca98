//! The device sampler (`kernels/sample.cu`) against its reference
//! (`agentd_runtime::sampling::device::draw_planned`, itself tested against
//! the host sampler) on the same random logits: greedy rows exactly, drawn
//! rows by the share that agree (the same Philox noise; only float rounding
//! at a filter's edge may differ), the frequencies of many draws against the
//! softmax, and the time of sampling a step on the device against
//! downloading its logits for the host sampler.

use agentd_cuda::{Gpu, Result};
use agentd_runtime::sampling::device::{
    draw_planned, merge_edits, words_allowing, Drawn, Edit, RowPlan,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::Report;

/// Qwen3's vocabulary.
const VOCAB: usize = 151_936;

fn plans(rows: usize, rng: &mut StdRng) -> Vec<RowPlan> {
    (0..rows)
        .map(|i| {
            let mut p = RowPlan {
                seed: rng.gen(),
                draw: i as u64,
                ..RowPlan::greedy()
            };
            match i % 7 {
                0 => p.logprobs = Some(5),
                1 => {
                    p.repetition = 1.3;
                    p.presence = 0.5;
                    p.frequency = 0.2;
                    p.edits = merge_edits(
                        (0..200)
                            .map(|_| Edit {
                                seen: true,
                                count: rng.gen_range(0..3),
                                banned: rng.gen_bool(0.05),
                                bias: rng.gen_bool(0.1).then(|| rng.gen_range(-5.0..5.0)),
                                ..Edit::new(rng.gen_range(0..VOCAB as u32))
                            })
                            .collect(),
                        VOCAB,
                    );
                    p.allowed = Some(words_allowing(
                        &(0..VOCAB as u32).filter(|t| t % 3 != 0).collect::<Vec<_>>(),
                        VOCAB,
                    ));
                    p.logprobs = Some(2);
                }
                2 => p.temperature = 1.0,
                3 => (p.temperature, p.top_k) = (0.8, 50),
                4 => (p.temperature, p.top_p) = (0.7, 0.9),
                5 => (p.temperature, p.min_p) = (1.0, 0.1),
                _ => (p.temperature, p.top_k, p.top_p, p.min_p) = (0.6, 200, 0.95, 0.02),
            }
            p
        })
        .collect()
}

fn device_draw(gpu: &Gpu, logits: &[f32], vocab: usize, plans: &[RowPlan]) -> Result<Vec<Drawn>> {
    let buf = gpu.upload(logits)?;
    gpu.sample_rows(gpu.ptr(&buf, 0), vocab, plans)
}

pub fn run(gpu: &Gpu, report: &mut Report) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(28);
    let rows = 70;
    let logits: Vec<f32> = (0..rows * VOCAB)
        .map(|_| rng.gen_range(-12.0f32..12.0))
        .collect();
    let plans = plans(rows, &mut rng);
    let got = device_draw(gpu, &logits, VOCAB, &plans)?;
    let (mut greedy_bad, mut greedy, mut agree, mut drawn, mut lp_err) = (0, 0, 0, 0, 0f64);
    for (i, (plan, g)) in plans.iter().zip(&got).enumerate() {
        let want = draw_planned(&logits[i * VOCAB..(i + 1) * VOCAB], plan)
            .map_err(agentd_cuda::CudaError::Model)?;
        if plan.temperature < 1e-5 {
            greedy += 1;
            let tops = |d: &Drawn| d.top.iter().map(|t| t.0).collect::<Vec<_>>();
            if g.token != want.token || tops(g) != tops(&want) {
                greedy_bad += 1;
            }
        } else {
            drawn += 1;
            agree += usize::from(g.token == want.token);
        }
        if let (Some(a), Some(b)) = (g.logprob, want.logprob) {
            lp_err = lp_err.max((a - b).abs() as f64);
        }
        for (a, b) in g.top.iter().zip(&want.top) {
            lp_err = lp_err.max((a.1 - b.1).abs() as f64);
        }
    }
    report.check(
        &format!("sample: greedy rows differing ({greedy})"),
        greedy_bad as f64,
        0.0,
    );
    report.check(
        &format!("sample: drawn rows disagreeing ({drawn})"),
        1.0 - agree as f64 / drawn.max(1) as f64,
        0.05,
    );
    report.check("sample: logprobs abs err", lp_err, 1e-3);
    frequencies(gpu, report)?;
    timing(gpu, &mut rng)
}

/// 20,000 draws of one 8-token row at temperature 0.7, each its own draw
/// index: every frequency within 4.5 standard deviations of the softmax.
fn frequencies(gpu: &Gpu, report: &mut Report) -> Result<()> {
    let row = [1.0f32, 0.5, 0.0, -0.5, -1.0, -2.0, f32::NEG_INFINITY, 0.25];
    let n = 20_000;
    let logits: Vec<f32> = (0..n).flat_map(|_| row).collect();
    let plans: Vec<RowPlan> = (0..n as u64)
        .map(|d| RowPlan {
            temperature: 0.7,
            seed: 5,
            draw: d,
            ..RowPlan::greedy()
        })
        .collect();
    let got = device_draw(gpu, &logits, 8, &plans)?;
    let mut counts = [0f64; 8];
    for d in &got {
        counts[d.token as usize % 8] += 1.0;
    }
    let w: Vec<f64> = row
        .iter()
        .map(|&x| ((x - 1.0) as f64 / 0.7).exp())
        .collect();
    let z: f64 = w.iter().sum();
    let worst = (0..8)
        .map(|i| {
            let p = w[i] / z;
            let sd = (n as f64 * p * (1.0 - p)).sqrt().max(1.0);
            (counts[i] - n as f64 * p).abs() / sd
        })
        .fold(0.0, f64::max);
    report.check("sample: draw frequencies (worst z)", worst, 4.5);
    Ok(())
}

/// Device sampling of a step against downloading its logits.
fn timing(gpu: &Gpu, rng: &mut StdRng) -> Result<()> {
    println!("\n| batch | sample on device ms | download logits ms |\n|---|---|---|");
    for batch in [1usize, 32, 128] {
        let logits: Vec<f32> = (0..batch * VOCAB)
            .map(|_| rng.gen_range(-12.0f32..12.0))
            .collect();
        let plans = plans(batch, rng);
        let buf = gpu.upload(&logits)?;
        let mut pinned = None;
        // Warm both paths once.
        gpu.download_pinned(&buf, &mut pinned, |_| ())?;
        gpu.sample_rows(gpu.ptr(&buf, 0), VOCAB, &plans)?;
        let buf = gpu.upload(&logits)?;
        let sample = gpu.time_ms(|| gpu.sample_rows(gpu.ptr(&buf, 0), VOCAB, &plans).map(drop))?;
        let down = gpu.time_ms(|| gpu.download_pinned(&buf, &mut pinned, |_| ()))?;
        println!("| {batch} | {sample:.3} | {down:.3} |");
    }
    Ok(())
}
