//! The matmul on every kernel path the CPU supports, against a naive
//! product, against each other (AVX2 = AVX-512 bit for bit; every vector
//! path = the scalar FMA chain, NEON included) and for batch invariance.

use super::*;

fn paths() -> Vec<KernelPath> {
    KernelPath::supported_paths()
}

fn run<W: WeightElem>(p: KernelPath, x: &[f32], t: usize, w: &[W], n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; t * n];
    matmul_xwt_on(p, &x[..t * k], t, w, n, k, &mut out);
    out
}

/// Each output row is bit-identical whatever other rows share the call, on
/// every path: alone (the small-T kernels), with three others (small-T),
/// with six others (small-T), with eight or 29 others (the broadcast
/// kernels, one and several vector groups).
#[test]
fn rows_are_batch_invariant_on_every_path() {
    let (n, k) = (70, 45);
    let x: Vec<f32> = (0..30 * k).map(|i| (i as f32 * 0.37).sin()).collect();
    let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
    for p in paths() {
        for t in [4, 7, 9, 30] {
            let all = run(p, &x, t, &w, n, k);
            for row in 0..t {
                let alone = run(p, &x[row * k..], 1, &w, n, k);
                assert!(
                    alone == all[row * n..(row + 1) * n],
                    "{p} row {row}: alone vs {t}"
                );
            }
        }
    }
}

/// The AVX2 kernels sum in the AVX-512 kernels' order: equal bit for bit,
/// for f32, bf16 and f16 weights, small and broadcast T, ragged k and n.
#[test]
fn avx2_equals_avx512_bit_for_bit() {
    if !KernelPath::Avx512.supported() {
        eprintln!("SKIPPED: no AVX-512 on this CPU to compare with");
        return;
    }
    for (n, k) in [(70, 45), (33, 128), (97, 31), (16, 8)] {
        let x: Vec<f32> = (0..130 * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let wb: Vec<half::bf16> = w.iter().map(|v| half::bf16::from_f32(*v)).collect();
        let wh: Vec<half::f16> = w.iter().map(|v| half::f16::from_f32(*v)).collect();
        for t in [1, 2, 3, 4, 5, 8, 9, 17, 24, 25, 64, 130] {
            let same = |a: Vec<f32>, b: Vec<f32>, what: &str| {
                assert!(a == b, "{what} n={n} k={k} t={t}: avx2 != avx512");
            };
            same(
                run(KernelPath::Avx2, &x, t, &w, n, k),
                run(KernelPath::Avx512, &x, t, &w, n, k),
                "f32",
            );
            same(
                run(KernelPath::Avx2, &x, t, &wb, n, k),
                run(KernelPath::Avx512, &x, t, &wb, n, k),
                "bf16",
            );
            same(
                run(KernelPath::Avx2, &x, t, &wh, n, k),
                run(KernelPath::Avx512, &x, t, &wh, n, k),
                "f16",
            );
        }
    }
}

/// Every vectorised path (AVX-512, AVX2, NEON) computes each output as the
/// one FMA chain `acc = fma(w[i], x[i], acc)` over k in order from zero:
/// equal bit for bit to that chain written with `f32::mul_add`, so the
/// paths equal each other across machines (NEON is checked under qemu on
/// x86 CI against this, not against x86 outputs).
#[test]
fn vector_paths_equal_the_scalar_fma_chain() {
    for p in [KernelPath::Avx512, KernelPath::Avx2, KernelPath::Neon] {
        if !p.supported() {
            eprintln!("SKIPPED: {p}: not on this CPU");
            continue;
        }
        for (n, k) in [(70, 45), (33, 128), (16, 8)] {
            let x: Vec<f32> = (0..70 * k).map(|i| (i as f32 * 0.37).sin()).collect();
            let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
            for t in [1, 3, 4, 5, 17, 70] {
                let out = run(p, &x, t, &w, n, k);
                for a in 0..t {
                    for b in 0..n {
                        let want =
                            (0..k).fold(0f32, |acc, i| w[b * k + i].mul_add(x[a * k + i], acc));
                        let got = out[a * n + b];
                        assert!(
                            got.to_bits() == want.to_bits(),
                            "{p} n={n} k={k} t={t} ({a},{b}): {got} vs chain {want}"
                        );
                    }
                }
            }
        }
    }
}

/// The small-T kernels run the columns before the weights' first aligned
/// tile separately: every offset of the weights in memory (so every length
/// of that lead, 16-bit weights included) gives the same chain.
#[test]
fn every_weight_alignment_gives_the_fma_chain() {
    let (n, k) = (19, 64);
    let x: Vec<f32> = (0..8 * k).map(|i| (i as f32 * 0.37).sin()).collect();
    let w: Vec<f32> = (0..n * k + 16).map(|i| (i as f32 * 0.11).cos()).collect();
    let wb: Vec<half::bf16> = w.iter().map(|v| half::bf16::from_f32(*v)).collect();
    for p in [KernelPath::Avx512, KernelPath::Avx2, KernelPath::Neon] {
        if !p.supported() {
            continue;
        }
        for off in 0..16 {
            let wo = &w[off..off + n * k];
            let wf: Vec<f32> = wb[off..off + n * k].iter().map(|v| v.to_f32()).collect();
            for t in [1, 8] {
                let got = run(p, &x, t, wo, n, k);
                for a in 0..t {
                    for b in 0..n {
                        let chain =
                            (0..k).fold(0f32, |acc, i| wo[b * k + i].mul_add(x[a * k + i], acc));
                        assert!(
                            got[a * n + b].to_bits() == chain.to_bits(),
                            "{p} off={off} t={t}"
                        );
                    }
                }
                let narrow = run(p, &x, t, &wb[off..off + n * k], n, k);
                assert!(
                    narrow == run(p, &x, t, &wf, n, k),
                    "{p} bf16 off={off} t={t}"
                );
            }
        }
    }
}

/// `v` rounded to a 16-bit type, and those rounded values back in f32.
fn rounded<W: WeightElem>(v: &[f32], round: impl Fn(f32) -> W) -> (Vec<W>, Vec<f32>) {
    let narrow: Vec<W> = v.iter().map(|x| round(*x)).collect();
    let wide = narrow.iter().map(|x| x.to_f32()).collect();
    (narrow, wide)
}

/// 16-bit weights give bit for bit the f32 product of the same rounded
/// weights, on every path and kernel (T = 1..4 small, 5+ broadcast; k = 45
/// has a ragged tail), and their rows are batch-invariant.
fn narrow_weights_equal_f32_of_rounded<W: WeightElem>(round: impl Fn(f32) -> W) {
    let (n, k) = (70, 45);
    let x: Vec<f32> = (0..9 * k).map(|i| (i as f32 * 0.37).sin()).collect();
    // Values spanning f16's subnormals (2^-24..2^-14) up to ~8.
    let w: Vec<f32> = (0..n * k)
        .map(|i| (i as f32 * 0.11).cos() * 2f32.powi((i % 28) as i32 - 25))
        .collect();
    let (wn, wf) = rounded(&w, round);
    let name = format!("{:?}", W::KIND);
    for p in paths() {
        for t in [1, 2, 4, 5, 9] {
            let a = run(p, &x, t, &wn, n, k);
            let b = run(p, &x, t, &wf, n, k);
            assert!(a == b, "{p} {name} t={t}: narrow vs f32 of rounded weights");
        }
        let all = run(p, &x, 9, &wn, n, k);
        for row in 0..9 {
            let alone = run(p, &x[row * k..], 1, &wn, n, k);
            assert!(alone == all[row * n..(row + 1) * n], "{p} {name} row {row}");
        }
    }
}

#[test]
fn bf16_weights_equal_f32_of_rounded_weights() {
    narrow_weights_equal_f32_of_rounded(half::bf16::from_f32);
}

#[test]
fn f16_weights_equal_f32_of_rounded_weights() {
    narrow_weights_equal_f32_of_rounded(half::f16::from_f32);
}

/// Every path's f16 widening (vcvtph2ps on the x86 paths) equals `half`'s
/// on every f16 value but NaNs: products with unit activations return each
/// weight as the kernel widened it (1 and 5 rows: small kernel, 9:
/// broadcast).
/// Compared as floats: `fma(-0, 1, +0)` is +0.
#[test]
fn f16_widening_is_exact_for_every_value() {
    let w: Vec<half::f16> = (0..=u16::MAX)
        .map(half::f16::from_bits)
        .filter(|v| !v.is_nan())
        .collect();
    let n = w.len();
    for p in paths() {
        for t in [1, 5, 9] {
            let out = run(p, &vec![1.0; t], t, &w, n, 1);
            for row in out.chunks(n) {
                for (v, o) in w.iter().zip(row) {
                    assert!(*o == v.to_f32(), "{p} t={t} f16 {:#06x}: {o}", v.to_bits());
                }
            }
        }
    }
}

#[test]
fn matches_naive_for_ragged_shapes_on_every_path() {
    for p in paths() {
        for (t, n, k) in [
            (1, 1, 1),
            (1, 70, 33),
            (3, 5, 16),
            (5, 37, 100),
            (70, 9, 17),
            (4, 4, 1024),
            (5, 13, 40),
            (16, 49, 64),
            (33, 50, 100),
            (64, 97, 31),
            (130, 61, 48),
        ] {
            let x: Vec<f32> = (0..t * k)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1)
                .collect();
            let w: Vec<f32> = (0..n * k)
                .map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.1)
                .collect();
            let out = run(p, &x, t, &w, n, k);
            for a in 0..t {
                for b in 0..n {
                    let want: f32 = (0..k).map(|i| x[a * k + i] * w[b * k + i]).sum();
                    let got = out[a * n + b];
                    assert!(
                        (got - want).abs() < 1e-3,
                        "{p} t={t} n={n} k={k} ({a},{b}): {got} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn transposed_blocks_hold_each_row_in_its_lane() {
    let (t, k) = (70, 3);
    let x: Vec<f32> = (0..t * k).map(|i| i as f32).collect();
    let xt = transpose_blocks(&x, t, k, 16);
    // Block 0: 64 rows, tp 64. Block 1: 6 rows, tp 16.
    assert_eq!(xt[2 * 64 + 5], x[5 * k + 2]);
    let b1 = &xt[64 * k..];
    assert_eq!(b1[16 + 3], x[(64 + 3) * k + 1]);
    assert_eq!(b1[16 + 6], 0.0, "padding lanes are zero");
    // 8 lanes: block 1's 6 rows pad to 8.
    let xt = transpose_blocks(&x, t, k, 8);
    assert_eq!(xt[64 * k + 8 + 3], x[(64 + 3) * k + 1]);
    assert_eq!(xt.len(), 72 * k);
}
