//! The fused attention prologue (`qkv_prologue`, `--fused-prologue`)
//! against the three launches it replaces (`head_norm_rope` for Q and K,
//! `reshape_and_cache`) on the same random rows: the rotated Q and K and
//! both caches must be the same bits, padding slots (-1) untouched.

use agentd_cuda::plan::{rope_table, AttnShape};
use agentd_cuda::{Dtype, Gpu, Result};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::Report;

/// A NaN in both bf16 and f16.
const POISON: u16 = 0xFFFF;

pub fn run(gpu: &Gpu, report: &mut Report) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(3);
    for dt in [Dtype::Bf16, Dtype::F16] {
        for (h, kv, d) in [(16, 8, 128), (8, 8, 64), (32, 4, 128)] {
            check(gpu, dt, &mut rng, report, h, kv, d)?;
        }
    }
    Ok(())
}

fn check(
    gpu: &Gpu,
    dt: Dtype,
    rng: &mut StdRng,
    report: &mut Report,
    h: usize,
    kv: usize,
    d: usize,
) -> Result<()> {
    let shape = AttnShape {
        num_heads: h,
        num_kv_heads: kv,
        head_dim: d,
        block_size: 16,
    };
    let (t, nb, eps, max_pos) = (37, 12, 1e-6f32, 4096);
    let stride = (h + 2 * kv) * d;
    let rows: Vec<f32> = (0..t * stride).map(|_| rng.gen_range(-3.0..3.0)).collect();
    let rows = dt.encode_all(&rows);
    let (qw, kw): (Vec<f32>, Vec<f32>) = (
        (0..d).map(|_| rng.gen_range(-1.5..1.5)).collect(),
        (0..d).map(|_| rng.gen_range(-1.5..1.5)).collect(),
    );
    let positions: Vec<i32> = (0..t).map(|_| rng.gen_range(0..max_pos as i32)).collect();
    let inv: Vec<f32> = (0..d / 2)
        .map(|i| 1.0 / 1e6f32.powf(2.0 * i as f32 / d as f32))
        .collect();
    let mut all: Vec<i64> = (0..(nb * 16) as i64).collect();
    all.shuffle(rng);
    let mut slots = all[..t].to_vec();
    slots[5] = -1;
    let n = nb * kv * 16 * d;
    let pos = gpu.upload(&positions)?;
    let cs = gpu.upload(&rope_table(&inv, max_pos))?;
    let (qwb, kwb) = (gpu.upload(&qw)?, gpu.upload(&kw)?);
    let sl = gpu.upload(&slots)?;
    let (pp, cp, sp) = (gpu.ptr(&pos, 0), gpu.ptr(&cs, 0), gpu.ptr(&sl, 0));
    let (qn, kn) = (Some(gpu.ptr(&qwb, 0)), Some(gpu.ptr(&kwb, 0)));
    // The three launches.
    let a = gpu.upload(&rows)?;
    let (ka, va) = (gpu.upload(&vec![POISON; n])?, gpu.upload(&vec![POISON; n])?);
    let ap = gpu.ptr(&a, 0);
    gpu.head_norm_rope(dt, ap, qn, pp, cp, t, h, 0, stride, d, eps)?;
    gpu.head_norm_rope(dt, ap, kn, pp, cp, t, kv, h * d, stride, d, eps)?;
    let (kap, vap) = (gpu.ptr(&ka, 0), gpu.ptr(&va, 0));
    gpu.reshape_and_cache(dt, ap, h * d, (h + kv) * d, stride, kap, vap, sp, t, &shape)?;
    // The fused one.
    let b = gpu.upload(&rows)?;
    let (kb, vb) = (gpu.upload(&vec![POISON; n])?, gpu.upload(&vec![POISON; n])?);
    let caches = (gpu.ptr(&kb, 0), gpu.ptr(&vb, 0));
    gpu.qkv_prologue(
        dt,
        gpu.ptr(&b, 0),
        (qn, kn),
        pp,
        cp,
        caches,
        sp,
        t,
        h,
        &shape,
        eps,
    )?;
    let differ = |x: Vec<u16>, y: Vec<u16>| x.iter().zip(&y).filter(|(p, q)| p != q).count();
    let wrong = differ(gpu.download(&a)?, gpu.download(&b)?)
        + differ(gpu.download(&ka)?, gpu.download(&kb)?)
        + differ(gpu.download(&va)?, gpu.download(&vb)?);
    report.check(
        &format!(
            "qkv_prologue {} h{h} kv{kv} d{d}: values differing",
            dt.suffix()
        ),
        wrong as f64,
        0.0,
    );
    Ok(())
}
