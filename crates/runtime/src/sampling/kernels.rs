//! Vector passes over one row of logits (151,936 wide on Qwen3): max, argmax,
//! the softmax normaliser and the inverse-CDF walk. Each is one streaming pass
//! that LLVM vectorises; the two full-row passes of the sampling fast path
//! (max, normaliser) also get an AVX2+FMA build selected at run time, since
//! Rust targets baseline x86-64 (4-wide SSE2). On aarch64 NEON is baseline,
//! so the portable loops are the NEON form (4-wide `fcmgt`/`bit` for the
//! max, `fmul`/`fadd` on `v.4s` for the exp polynomial, in the emitted
//! assembly); no run-time choice is needed there.

/// The environment variable that forces the CPU kernel path
/// (`agentd_models::cpu_kernels` reads the same name): `portable` keeps the
/// sampler on its plain loops too, so a portable run is portable throughout.
pub const CPU_KERNELS_ENV: &str = "AGENTD_CPU_KERNELS";

/// Whether the AVX2+FMA forms run: the CPU has AVX2 and FMA and the process
/// is not forced onto the portable path. Decided once.
#[cfg(target_arch = "x86_64")]
#[inline]
fn has_avx2_fma() -> bool {
    static WIDE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WIDE.get_or_init(|| {
        std::env::var(CPU_KERNELS_ENV).ok().as_deref() != Some("portable")
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
    })
}

/// The build of the passes below this process runs: `avx2+fma` or
/// `portable` (named in bench reports). An AVX-512 build of the same code
/// was measured slower on an AVX-512 Xeon (greedy 17.5-21.6 against
/// 9.9-13.1 µs a token, p50; `benches/results/sampler-argmax/`), so AVX-512
/// machines run the AVX2+FMA build.
pub fn pass_name() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        return "avx2+fma";
    }
    "portable"
}

/// Elements per block of the normaliser pass: its per-block sums let the draw
/// recompute the weights of one block (256 exps) instead of the row (~150k).
pub(super) const BLOCK: usize = 256;

/// `e^x` for `x ≤ 0`, branch-free so loops over it vectorise: x = n·ln2 + r
/// with |r| ≤ ln2/2, e^r by a degree-6 Taylor polynomial (relative error
/// ~1.2e-7), scaled by 2^n through the exponent bits. Below -87 (where 2^n
/// would leave the normal range) and for NaN it returns exactly 0, so masked
/// (-inf) tokens get no weight.
#[inline(always)]
pub(super) fn exp_neg(x: f32) -> f32 {
    // 1.5·2^23: adding it rounds to an integer held in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    let xc = if x > -87.0 { x } else { -87.0 };
    let t = xc * std::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    let k = t.to_bits().wrapping_sub(MAGIC.to_bits()) as i32;
    // Cody-Waite: ln2 split so n·LN2_HI is exact.
    let r = xc - n * 0.693_145_75 - n * 1.428_606_8e-6;
    let mut y = 1.0 / 720.0;
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        y = y * r + c;
    }
    // Wrapping ops: an overflow check here would stop the loop vectorising in
    // debug builds (8x slower); k ∈ [-126, 0] never overflows.
    let scale = f32::from_bits((k.wrapping_add(127) as u32) << 23);
    if x >= -87.0 {
        y * scale
    } else {
        0.0
    }
}

/// Largest value, ignoring NaN; -inf for an empty or all-NaN slice.
#[inline(always)]
pub(super) fn max_portable(v: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = v.chunks_exact(16);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l = if x > *l { x } else { *l };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &x in lanes.iter().chain(chunks.remainder()) {
        m = if x > m { x } else { m };
    }
    m
}

/// `Σ e^((x - m)·inv_t)` over a slice of at most one block, in 8 lanes.
#[inline(always)]
fn sum_exp_portable(v: &[f32], m: f32, inv_t: f32) -> f32 {
    let mut acc = [0f32; 8];
    let mut chunks = v.chunks_exact(8);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += exp_neg((x - m) * inv_t);
        }
    }
    let tail: f32 = chunks
        .remainder()
        .iter()
        .map(|&x| exp_neg((x - m) * inv_t))
        .sum();
    acc.iter().sum::<f32>() + tail
}

/// Per-block sums into `blocks` (cleared first); returns their f64 total.
#[inline(always)]
fn block_sums_portable(row: &[f32], m: f32, inv_t: f32, blocks: &mut Vec<f32>) -> f64 {
    blocks.clear();
    let mut z = 0f64;
    for b in row.chunks(BLOCK) {
        let s = sum_exp_portable(b, m, inv_t);
        blocks.push(s);
        z += s as f64;
    }
    z
}

#[cfg(target_arch = "x86_64")]
mod wide {
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn max(v: &[f32]) -> f32 {
        super::max_portable(v)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn argmax(v: &[f32]) -> usize {
        super::argmax_portable(v)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn block_sums(row: &[f32], m: f32, inv_t: f32, blocks: &mut Vec<f32>) -> f64 {
        super::block_sums_portable(row, m, inv_t, blocks)
    }
}

/// Largest value of a row, ignoring NaN (-inf when there is none).
pub(super) fn max(v: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        return unsafe { wide::max(v) };
    }
    max_portable(v)
}

/// The softmax normaliser `Σ e^((x - m)·inv_t)` of a row, with its per-block
/// partial sums in `blocks` for [`draw`]. `m` must be the row's max.
pub(super) fn block_sums(row: &[f32], m: f32, inv_t: f32, blocks: &mut Vec<f32>) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        return unsafe { wide::block_sums(row, m, inv_t, blocks) };
    }
    block_sums_portable(row, m, inv_t, blocks)
}

/// Index of the largest value, the lowest index among ties; NaN never wins
/// (the first -inf when nothing is larger, 0 when every value is NaN).
/// One pass: greedy decoding reads each row once, where the max-then-search
/// form it replaces read it one and a half times on average.
pub fn argmax(v: &[f32]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        return unsafe { wide::argmax(v) };
    }
    argmax_portable(v)
}

/// Elements per block of [`argmax`]: the vectorised max runs over each
/// block, and only the winning block is searched for its position.
const ARGMAX_BLOCK: usize = 512;

/// [`argmax`]: each block's max by the vectorised pass, the first block
/// with the largest (a strict `>`, so ties keep the earliest and NaN never
/// wins), then the first position of that value in it.
#[inline(always)]
fn argmax_portable(v: &[f32]) -> usize {
    let mut best = (f32::NEG_INFINITY, None);
    for (b, block) in v.chunks(ARGMAX_BLOCK).enumerate() {
        let m = max_portable(block);
        if m > best.0 {
            best = (m, Some(b));
        }
    }
    match best {
        (m, Some(b)) => {
            let start = b * ARGMAX_BLOCK;
            let block = &v[start..(start + ARGMAX_BLOCK).min(v.len())];
            start + block.iter().position(|&x| x == m).unwrap_or(0)
        }
        (_, None) => v.iter().position(|&x| x == f32::NEG_INFINITY).unwrap_or(0),
    }
}

/// Inverse-CDF draw over the whole row: the token where the running sum of
/// `e^((x - m)·inv_t)` (index order) first exceeds `target` ∈ [0, z). The
/// block is found from the normaliser's own block sums, so only its 256
/// weights are recomputed. Rounding that leaves the target unreached picks
/// the last token with weight (a bias of order 1e-7).
pub(super) fn draw(row: &[f32], m: f32, inv_t: f32, blocks: &[f32], target: f64) -> usize {
    let mut acc = 0f64;
    let mut last = None;
    for (b, &s) in blocks.iter().enumerate() {
        if s > 0.0 {
            last = Some(b);
        }
        if acc + s as f64 > target {
            return draw_in_block(row, b, m, inv_t, target - acc);
        }
        acc += s as f64;
    }
    match last {
        Some(b) => draw_in_block(row, b, m, inv_t, f64::INFINITY),
        None => argmax(row),
    }
}

fn draw_in_block(row: &[f32], b: usize, m: f32, inv_t: f32, mut target: f64) -> usize {
    let start = b * BLOCK;
    let block = &row[start..(start + BLOCK).min(row.len())];
    let mut last = 0;
    for (i, &x) in block.iter().enumerate() {
        let w = exp_neg((x - m) * inv_t) as f64;
        if w > 0.0 {
            last = i;
            if target < w {
                return start + i;
            }
            target -= w;
        }
    }
    start + last
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_neg_matches_libm_and_zeroes_the_far_tail() {
        for i in 0..40_000 {
            let x = -(i as f32) * 0.002_2;
            let (got, want) = (exp_neg(x), x.exp());
            assert!(
                (got - want).abs() <= 3e-7 * want + 1e-37,
                "exp({x}) = {got}, libm {want}"
            );
        }
        assert_eq!(exp_neg(0.0), 1.0);
        assert_eq!(exp_neg(-100.0), 0.0);
        assert_eq!(exp_neg(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_neg(f32::NAN), 0.0);
    }

    #[test]
    fn max_and_argmax_skip_nan_and_take_the_first_tie() {
        let mut v: Vec<f32> = (0..1000).map(|i| ((i * 7919) % 1000) as f32).collect();
        v[17] = f32::NAN;
        v[900] = 5000.0;
        v[950] = 5000.0;
        assert_eq!(max(&v), 5000.0);
        assert_eq!(max_portable(&v), 5000.0);
        assert_eq!(argmax(&v), 900);
        assert_eq!(argmax(&[f32::NAN, 1.0, 3.0, 3.0]), 2);
        assert_eq!(argmax(&[f32::NAN]), 0);
    }

    /// The one-pass argmax against the rule written plainly (the first
    /// index of the largest non-NaN value; the first -inf, else 0, when
    /// nothing is larger), on both builds, over rows with ties, NaN and -inf
    /// in every lane position and every tail length.
    #[test]
    fn one_pass_argmax_is_the_first_largest() {
        fn rule(v: &[f32]) -> usize {
            let m = v
                .iter()
                .copied()
                .filter(|x| !x.is_nan())
                .fold(f32::NEG_INFINITY, f32::max);
            v.iter().position(|&x| x == m).unwrap_or(0)
        }
        let mut state = 12345u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        for len in (0..70).chain([1000, 4096, 151_936]) {
            for trial in 0..20 {
                let v: Vec<f32> = (0..len)
                    .map(|_| match next() % 16 {
                        0 => f32::NAN,
                        1 => f32::NEG_INFINITY,
                        2 if trial % 5 == 0 => f32::INFINITY,
                        // Few distinct values: ties everywhere.
                        k => ((next() % 8) as f32) - (k % 3) as f32,
                    })
                    .collect();
                let want = rule(&v);
                assert_eq!(argmax(&v), want, "len {len} trial {trial}");
                assert_eq!(argmax_portable(&v), want, "len {len} trial {trial}");
                let all_low: Vec<f32> = v
                    .iter()
                    .map(|&x| if x.is_nan() { x } else { f32::NEG_INFINITY })
                    .collect();
                assert_eq!(
                    argmax(&all_low),
                    rule(&all_low),
                    "len {len}: nothing above -inf"
                );
            }
        }
        assert_eq!(argmax(&[]), 0);
    }

    /// The AVX2+FMA builds are the portable code compiled for wider
    /// vectors (no reassociation), so both give the same bits.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn wide_and_portable_passes_agree_bit_for_bit() {
        if !has_avx2_fma() {
            return;
        }
        let row: Vec<f32> = (0..7_001)
            .map(|i| ((i as f32) * 0.61).cos() * 6.0)
            .collect();
        let m = max_portable(&row);
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        assert_eq!(unsafe { wide::max(&row) }.to_bits(), m.to_bits());
        // SAFETY: as above.
        assert_eq!(unsafe { wide::argmax(&row) }, argmax_portable(&row));
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let za = block_sums_portable(&row, m, 0.8, &mut a);
        // SAFETY: as above.
        let zb = unsafe { wide::block_sums(&row, m, 0.8, &mut b) };
        assert_eq!(za.to_bits(), zb.to_bits());
        assert_eq!(
            a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn block_sums_add_up_to_the_f64_normaliser() {
        let row: Vec<f32> = (0..5_000)
            .map(|i| ((i as f32) * 0.37).sin() * 4.0)
            .collect();
        let m = max(&row);
        let mut blocks = Vec::new();
        let z = block_sums(&row, m, 0.7, &mut blocks);
        let want: f64 = row.iter().map(|&x| ((x - m) as f64 * 0.7).exp()).sum();
        assert_eq!(blocks.len(), 5_000usize.div_ceil(BLOCK));
        assert!((z - want).abs() < 1e-5 * want, "{z} vs {want}");
        // The walk lands where the exact cumulative sum crosses the target.
        for q in [0.0, 0.1, 0.5, 0.9, 0.999_999] {
            let t = draw(&row, m, 0.7, &blocks, q * z);
            let mut cum = 0f64;
            let want = row
                .iter()
                .position(|&x| {
                    cum += ((x - m) as f64 * 0.7).exp();
                    cum > q * z
                })
                .unwrap_or(row.len() - 1);
            assert!(t.abs_diff(want) <= 1, "q {q}: {t} vs {want}");
        }
    }
}
