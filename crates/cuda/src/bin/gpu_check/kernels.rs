//! Each kernel against its CPU reference: the CPU runtime's own functions
//! (agentd-models, themselves checked against transformers), on fresh random
//! inputs rounded to the GPU dtype, with outputs poisoned (NaN) beforehand.

use agentd_cuda::plan::{block_table_matrix, prefill_tiles, rope_table, AttnShape};
use agentd_cuda::{AttnIo, DecodeKernel, Dtype, Gpu, Result};
use agentd_models::attention::{paged_attention, AttentionShape};
use agentd_models::layers::{head_norm_rope, rms_norm, silu_mul_in_place, RopeBatch, RopeStyle};
use agentd_models::{KvCacheConfig, PagedKvCache};
use agentd_runtime::BatchInput;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::{rel_l2, Report};

/// A NaN in both bf16 and f16.
const POISON: u16 = 0xFFFF;

fn tol(dt: Dtype) -> f64 {
    match dt {
        Dtype::Bf16 => 1e-2,
        Dtype::F16 => 3e-3,
    }
}

fn randv(rng: &mut StdRng, n: usize, a: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-a..a)).collect()
}

/// Values exactly representable in `dt`.
fn rounded(dt: Dtype, v: Vec<f32>) -> Vec<f32> {
    dt.decode_all(&dt.encode_all(&v))
}

pub fn run(gpu: &Gpu, report: &mut Report) -> Result<()> {
    let seed: u64 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    println!("kernel checks, input seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    for dt in [Dtype::Bf16, Dtype::F16] {
        let tag = dt.suffix();
        embed(gpu, dt, &mut rng, report, tag)?;
        add_rms_norm(gpu, dt, &mut rng, report, tag)?;
        for d in [64, 128] {
            norm_rope(gpu, dt, &mut rng, report, tag, d)?;
        }
        silu_mul(gpu, dt, &mut rng, report, tag)?;
        cache_write_and_copy(gpu, dt, &mut rng, report, tag)?;
        for (h, kv, d, bs) in [
            (16, 8, 128, 16),
            (32, 8, 128, 16),
            (8, 8, 64, 32),
            (64, 4, 128, 16),
            (28, 4, 64, 16),
            (4, 1, 16, 16),
            (4, 2, 32, 8),
        ] {
            let shape = AttnShape {
                num_heads: h,
                num_kv_heads: kv,
                head_dim: d,
                block_size: bs,
            };
            attention(gpu, dt, &mut rng, report, tag, shape, false)?;
            attention(gpu, dt, &mut rng, report, tag, shape, true)?;
        }
    }
    Ok(())
}

fn embed(gpu: &Gpu, dt: Dtype, rng: &mut StdRng, report: &mut Report, tag: &str) -> Result<()> {
    let (vocab, hid, t) = (1000, 200, 37);
    let table = rounded(dt, randv(rng, vocab * hid, 1.0));
    let ids: Vec<i32> = (0..t).map(|_| rng.gen_range(0..vocab as i32)).collect();
    let emb = gpu.upload(&dt.encode_all(&table))?;
    let idsb = gpu.upload(&ids)?;
    let res = gpu.upload(&vec![f32::NAN; t * hid])?;
    gpu.embed(
        dt,
        gpu.ptr(&res, 0),
        gpu.ptr(&emb, 0),
        gpu.ptr(&idsb, 0),
        t,
        hid,
    )?;
    let got = gpu.download(&res)?;
    let want: Vec<f32> = ids
        .iter()
        .flat_map(|&i| table[i as usize * hid..(i as usize + 1) * hid].to_vec())
        .collect();
    report.check(&format!("embed {tag}"), rel_l2(&got, &want), 0.0);
    Ok(())
}

fn add_rms_norm(
    gpu: &Gpu,
    dt: Dtype,
    rng: &mut StdRng,
    report: &mut Report,
    tag: &str,
) -> Result<()> {
    let (t, hid, eps) = (37, 1000, 1e-6f32);
    let residual = randv(rng, t * hid, 2.0);
    let delta = rounded(dt, randv(rng, t * hid, 1.0));
    let w = randv(rng, hid, 1.5);
    let x: Vec<f32> = residual.iter().zip(&delta).map(|(a, b)| a + b).collect();
    let want = rms_norm(&x, &w, eps);
    // Fused add + norm over all rows: residual updated, output normed.
    let res = gpu.upload(&residual)?;
    let dl = gpu.upload(&dt.encode_all(&delta))?;
    let wb = gpu.upload(&w)?;
    let out = gpu.upload(&vec![POISON; t * hid])?;
    gpu.add_rms_norm(
        dt,
        gpu.ptr(&res, 0),
        Some(gpu.ptr(&dl, 0)),
        None,
        gpu.ptr(&wb, 0),
        gpu.ptr(&out, 0),
        t,
        hid,
        eps,
    )?;
    report.check(
        &format!("add_rms_norm {tag}: output"),
        rel_l2(&dt.decode_all(&gpu.download(&out)?), &want),
        tol(dt),
    );
    report.check(
        &format!("add_rms_norm {tag}: residual"),
        rel_l2(&gpu.download(&res)?, &x),
        1e-6,
    );
    // Row-gathered form (the final norm): residual untouched.
    let rows = [5i32, 0, 36, 5];
    let res = gpu.upload(&residual)?;
    let rb = gpu.upload(&rows)?;
    let out = gpu.upload(&vec![POISON; rows.len() * hid])?;
    gpu.add_rms_norm(
        dt,
        gpu.ptr(&res, 0),
        Some(gpu.ptr(&dl, 0)),
        Some(gpu.ptr(&rb, 0)),
        gpu.ptr(&wb, 0),
        gpu.ptr(&out, 0),
        rows.len(),
        hid,
        eps,
    )?;
    let want_rows: Vec<f32> = rows
        .iter()
        .flat_map(|&r| want[r as usize * hid..(r as usize + 1) * hid].to_vec())
        .collect();
    report.check(
        &format!("add_rms_norm {tag}: gathered rows"),
        rel_l2(&dt.decode_all(&gpu.download(&out)?), &want_rows),
        tol(dt),
    );
    report.check(
        &format!("add_rms_norm {tag}: residual kept"),
        rel_l2(&gpu.download(&res)?, &residual),
        0.0,
    );
    Ok(())
}

fn norm_rope(
    gpu: &Gpu,
    dt: Dtype,
    rng: &mut StdRng,
    report: &mut Report,
    tag: &str,
    d: usize,
) -> Result<()> {
    let (t, h, kv, eps, max_pos) = (19, 16, 8, 1e-6f32, 4096);
    let stride = (h + 2 * kv) * d;
    let rows = rounded(dt, randv(rng, t * stride, 3.0));
    let (qw, kw) = (randv(rng, d, 1.5), randv(rng, d, 1.5));
    let positions: Vec<u32> = (0..t).map(|_| rng.gen_range(0..max_pos as u32)).collect();
    let inv: Vec<f32> = (0..d / 2)
        .map(|i| 1.0 / 1e6f32.powf(2.0 * i as f32 / d as f32))
        .collect();
    let rope = RopeBatch::new(&inv, &positions);
    let part = |off: usize, heads: usize| -> Vec<f32> {
        (0..t)
            .flat_map(|i| rows[i * stride + off..i * stride + off + heads * d].to_vec())
            .collect()
    };
    let (mut q, mut k, v) = (part(0, h), part(h * d, kv), part((h + kv) * d, kv));
    head_norm_rope(&mut q, h, d, Some(&qw), eps, &rope, RopeStyle::Neox);
    head_norm_rope(&mut k, kv, d, Some(&kw), eps, &rope, RopeStyle::Neox);

    let buf = gpu.upload(&dt.encode_all(&rows))?;
    let pos = gpu.upload(&positions.iter().map(|&p| p as i32).collect::<Vec<_>>())?;
    let cs = gpu.upload(&rope_table(&inv, max_pos))?;
    let (qwb, kwb) = (gpu.upload(&qw)?, gpu.upload(&kw)?);
    let (bp, pp, cp) = (gpu.ptr(&buf, 0), gpu.ptr(&pos, 0), gpu.ptr(&cs, 0));
    gpu.head_norm_rope(
        dt,
        bp,
        Some(gpu.ptr(&qwb, 0)),
        pp,
        cp,
        t,
        h,
        0,
        stride,
        d,
        eps,
    )?;
    gpu.head_norm_rope(
        dt,
        bp,
        Some(gpu.ptr(&kwb, 0)),
        pp,
        cp,
        t,
        kv,
        h * d,
        stride,
        d,
        eps,
    )?;
    let got = dt.decode_all(&gpu.download(&buf)?);
    let gpart = |off: usize, heads: usize| -> Vec<f32> {
        (0..t)
            .flat_map(|i| got[i * stride + off..i * stride + off + heads * d].to_vec())
            .collect()
    };
    report.check(
        &format!("head_norm_rope {tag} d{d}: q"),
        rel_l2(&gpart(0, h), &q),
        tol(dt),
    );
    report.check(
        &format!("head_norm_rope {tag} d{d}: k"),
        rel_l2(&gpart(h * d, kv), &k),
        tol(dt),
    );
    report.check(
        &format!("head_norm_rope {tag} d{d}: v untouched"),
        rel_l2(&gpart((h + kv) * d, kv), &v),
        0.0,
    );
    Ok(())
}

fn silu_mul(gpu: &Gpu, dt: Dtype, rng: &mut StdRng, report: &mut Report, tag: &str) -> Result<()> {
    let (t, inter) = (13, 777);
    let gu = rounded(dt, randv(rng, t * 2 * inter, 4.0));
    let mut gate: Vec<f32> = (0..t)
        .flat_map(|i| gu[i * 2 * inter..i * 2 * inter + inter].to_vec())
        .collect();
    let up: Vec<f32> = (0..t)
        .flat_map(|i| gu[i * 2 * inter + inter..(i + 1) * 2 * inter].to_vec())
        .collect();
    silu_mul_in_place(&mut gate, &up);
    let gb = gpu.upload(&dt.encode_all(&gu))?;
    let out = gpu.upload(&vec![POISON; t * inter])?;
    gpu.silu_mul(dt, gpu.ptr(&out, 0), gpu.ptr(&gb, 0), t, inter)?;
    report.check(
        &format!("silu_mul {tag}"),
        rel_l2(&dt.decode_all(&gpu.download(&out)?), &gate),
        tol(dt),
    );
    Ok(())
}

fn cache_write_and_copy(
    gpu: &Gpu,
    dt: Dtype,
    rng: &mut StdRng,
    report: &mut Report,
    tag: &str,
) -> Result<()> {
    let shape = AttnShape {
        num_heads: 16,
        num_kv_heads: 8,
        head_dim: 128,
        block_size: 16,
    };
    let (nb, bs, kv, d, h) = (40, 16, 8, 128, 16);
    let t = 50;
    let stride = (h + 2 * kv) * d;
    let rows = dt.encode_all(&randv(rng, t * stride, 1.0));
    let mut all: Vec<i64> = (0..(nb * bs) as i64).collect();
    all.shuffle(rng);
    let mut slots: Vec<i64> = all[..t].to_vec();
    slots[7] = -1; // padding: written nowhere
    let n = nb * kv * bs * d;
    let (kc, vc) = (gpu.upload(&vec![POISON; n])?, gpu.upload(&vec![POISON; n])?);
    let (src, sl) = (gpu.upload(&rows)?, gpu.upload(&slots)?);
    gpu.reshape_and_cache(
        dt,
        gpu.ptr(&src, 0),
        h * d,
        (h + kv) * d,
        stride,
        gpu.ptr(&kc, 0),
        gpu.ptr(&vc, 0),
        gpu.ptr(&sl, 0),
        t,
        &shape,
    )?;
    let (kg, vg) = (gpu.download(&kc)?, gpu.download(&vc)?);
    let mut want_k = vec![POISON; n];
    let mut want_v = vec![POISON; n];
    for (i, &slot) in slots.iter().enumerate() {
        if slot < 0 {
            continue;
        }
        let (blk, off) = (slot as usize / bs, slot as usize % bs);
        for hh in 0..kv {
            for dd in 0..d {
                let at = ((blk * kv + hh) * bs + off) * d + dd;
                want_k[at] = rows[i * stride + h * d + hh * d + dd];
                want_v[at] = rows[i * stride + (h + kv) * d + hh * d + dd];
            }
        }
    }
    let bad = kg
        .iter()
        .zip(&want_k)
        .chain(vg.iter().zip(&want_v))
        .filter(|(a, b)| a != b)
        .count();
    report.check(
        &format!("reshape_and_cache {tag}: {bad} wrong elements"),
        bad as f64,
        0.0,
    );

    // copy_blocks on random content: destinations equal sources, rest intact.
    let content = dt.encode_all(&randv(rng, n, 1.0));
    let (kc, vc) = (gpu.upload(&content)?, gpu.upload(&content)?);
    let pairs: Vec<i64> = vec![3, 7, 10, 2, 39, 0];
    let pb = gpu.upload(&pairs)?;
    gpu.copy_blocks(gpu.ptr(&kc, 0), gpu.ptr(&vc, 0), gpu.ptr(&pb, 0), 3, &shape)?;
    let mut want = content.clone();
    let be = kv * bs * d;
    for p in pairs.chunks(2) {
        let (s, dst) = (p[0] as usize, p[1] as usize);
        want.copy_within(s * be..(s + 1) * be, dst * be);
    }
    let got_k = gpu.download(&kc)?;
    let got_v = gpu.download(&vc)?;
    let bad = got_k
        .iter()
        .chain(&got_v)
        .zip(want.iter().chain(&want))
        .filter(|(a, b)| a != b)
        .count();
    report.check(
        &format!("copy_blocks {tag}: {bad} wrong elements"),
        bad as f64,
        0.0,
    );
    Ok(())
}

/// Decode (one token per sequence, several split-K partitions) or a mixed
/// prefill batch (chunks over cached prefixes, and single tokens), against
/// the CPU paged attention on the same rounded cache.
fn attention(
    gpu: &Gpu,
    dt: Dtype,
    rng: &mut StdRng,
    report: &mut Report,
    tag: &str,
    shape: AttnShape,
    prefill: bool,
) -> Result<()> {
    let (h, kv, d, bs) = (
        shape.num_heads,
        shape.num_kv_heads,
        shape.head_dim,
        shape.block_size,
    );
    // (context length, new tokens)
    let seqs: Vec<(usize, usize)> = if prefill {
        vec![(1, 1), (40, 40), (100, 37), (700, 64), (33, 1), (2000, 5)]
    } else {
        vec![(1, 1), (17, 1), (513, 1), (1500, 1), (3000, 1), (64, 1)]
    };
    let need: usize = seqs.iter().map(|(c, _)| c.div_ceil(bs)).sum();
    let nb = need + 7;
    let mut free: Vec<u32> = (0..nb as u32).collect();
    free.shuffle(rng);
    let mut batch = BatchInput {
        cu_seqlens: vec![0],
        ..Default::default()
    };
    for &(ctx, q) in &seqs {
        let table: Vec<u32> = (0..ctx.div_ceil(bs))
            .map(|_| free.pop().unwrap_or(0))
            .collect();
        for i in ctx - q..ctx {
            batch.token_ids.push(0);
            batch.positions.push(i as u32);
            batch
                .slot_mapping
                .push(table[i / bs] as usize * bs + i % bs);
        }
        batch.cu_seqlens.push(batch.token_ids.len());
        batch.context_lens.push(ctx);
        batch.block_tables.push(table);
    }
    let t = batch.num_tokens();
    // Cache content for every slot, rounded to dt; the CPU cache gets it
    // through its own slot-mapped write.
    let slots = nb * bs;
    let krows = rounded(dt, randv(rng, slots * kv * d, 1.0));
    let vrows = rounded(dt, randv(rng, slots * kv * d, 1.0));
    let mut cpu = PagedKvCache::new(KvCacheConfig {
        num_layers: 1,
        num_blocks: nb,
        block_size: bs,
        num_kv_heads: kv,
        head_dim: d,
    })?;
    cpu.write(0, &(0..slots).collect::<Vec<_>>(), &krows, &vrows);
    let to_gpu_layout = |rows: &[f32]| -> Vec<u16> {
        let mut out = vec![0u16; rows.len()];
        for slot in 0..slots {
            let (blk, off) = (slot / bs, slot % bs);
            for hh in 0..kv {
                for dd in 0..d {
                    out[((blk * kv + hh) * bs + off) * d + dd] =
                        dt.encode(rows[slot * kv * d + hh * d + dd]);
                }
            }
        }
        out
    };
    let (kc, vc) = (
        gpu.upload(&to_gpu_layout(&krows))?,
        gpu.upload(&to_gpu_layout(&vrows))?,
    );
    let q = rounded(dt, randv(rng, t * h * d, 2.0));
    let scale = 1.0 / (d as f32).sqrt();
    let mut want = vec![0f32; t * h * d];
    let cpu_shape = AttentionShape {
        num_heads: h,
        num_kv_heads: kv,
        head_dim: d,
        block_size: bs,
    };
    paged_attention(&q, cpu.layer(0), &batch, cpu_shape, scale, &mut want);

    let qb = gpu.upload(&dt.encode_all(&q))?;
    let (tables, max_blocks) = block_table_matrix(&batch.block_tables);
    let tb = gpu.upload(&tables)?;
    let ctx = gpu.upload(
        &batch
            .context_lens
            .iter()
            .map(|&c| c as i32)
            .collect::<Vec<_>>(),
    )?;
    let cu = gpu.upload(
        &batch
            .cu_seqlens
            .iter()
            .map(|&c| c as i32)
            .collect::<Vec<_>>(),
    )?;
    let max_ctx = seqs.iter().map(|s| s.0).max().unwrap_or(1);
    let (kp, vp, qp) = (gpu.ptr(&kc, 0), gpu.ptr(&vc, 0), gpu.ptr(&qb, 0));
    // Decode: the validated kernel and the single-pass one (where built
    // for the group), each into freshly poisoned output.
    let kernels: Vec<Option<DecodeKernel>> = if prefill {
        vec![None]
    } else {
        let one = DecodeKernel::choose(true, &shape);
        let mut v = vec![Some(DecodeKernel::TwoPass)];
        if one != DecodeKernel::TwoPass {
            v.push(Some(one));
        }
        v
    };
    for kernel in kernels {
        let out = gpu.upload(&vec![POISON; t * h * d])?;
        let io = AttnIo {
            dt,
            shape,
            out: gpu.ptr(&out, 0),
            q: qp,
            q_stride: h * d,
            k_cache: kp,
            v_cache: vp,
            block_tables: gpu.ptr(&tb, 0),
            max_blocks,
            context_lens: gpu.ptr(&ctx, 0),
            scale,
        };
        let what = match kernel {
            None => {
                let tiles = prefill_tiles(&batch.cu_seqlens, shape.group());
                let tl = gpu.upload(&tiles)?;
                let (cu, tl) = (gpu.ptr(&cu, 0), gpu.ptr(&tl, 0));
                gpu.paged_prefill(&io, cu, tl, tiles.len() / 2)?;
                "paged_prefill"
            }
            Some(kernel) => {
                let (_, rows) = Gpu::decode_scratch_len(&shape, seqs.len(), max_ctx);
                let (so, sm, ss) = (
                    gpu.zeros::<f32>(rows * d)?,
                    gpu.zeros::<f32>(rows)?,
                    gpu.zeros::<f32>(rows)?,
                );
                let scratch = agentd_cuda::DecodeScratch {
                    out: gpu.ptr(&so, 0),
                    max: gpu.ptr(&sm, 0),
                    sum: gpu.ptr(&ss, 0),
                };
                gpu.paged_decode(&io, kernel, seqs.len(), max_ctx, &scratch)?;
                match kernel {
                    DecodeKernel::TwoPass => "paged_decode",
                    DecodeKernel::SinglePass { .. } => "paged_decode_1p",
                }
            }
        };
        let got = dt.decode_all(&gpu.download(&out)?);
        report.check(
            &format!("{what} {tag} h{h} kv{kv} d{d} bs{bs}"),
            rel_l2(&got, &want),
            tol(dt),
        );
    }
    Ok(())
}
