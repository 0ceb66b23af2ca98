//! Eight f32 lanes as a pair of NEON `float32x4_t`, so the aarch64 kernels
//! can follow the AVX2 kernels' 8-lane structure (chunks of 8 keys in the
//! attention, two 8-lane accumulators in `simd::dot`) and reduce in their
//! order: [`F8::hsum`] adds lanes as `hsum` in `simd.rs`/`attention/avx2.rs`
//! do ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
//!
//! NEON is part of the aarch64 baseline, so these need no `#[target_feature]`;
//! only the loads and stores (raw pointers) are unsafe. `vfmaq_f32(a, b, c)`
//! is fused (`a + b·c`, one rounding) like `_mm256_fmadd_ps(b, c, a)`.

use std::arch::aarch64::*;

#[derive(Clone, Copy)]
pub(crate) struct F8(pub float32x4_t, pub float32x4_t);

impl F8 {
    #[inline(always)]
    pub fn zero() -> F8 {
        F8::splat(0.0)
    }

    #[inline(always)]
    pub fn splat(v: f32) -> F8 {
        // SAFETY: NEON is baseline on aarch64.
        unsafe { F8(vdupq_n_f32(v), vdupq_n_f32(v)) }
    }

    /// # Safety
    /// `p..p + 8` must be readable.
    #[inline(always)]
    pub unsafe fn load(p: *const f32) -> F8 {
        F8(vld1q_f32(p), vld1q_f32(p.add(4)))
    }

    /// # Safety
    /// `p..p + 8` must be writable.
    #[inline(always)]
    pub unsafe fn store(self, p: *mut f32) {
        vst1q_f32(p, self.0);
        vst1q_f32(p.add(4), self.1);
    }

    /// `self + b·c`, fused.
    #[inline(always)]
    pub fn fma(self, b: F8, c: F8) -> F8 {
        // SAFETY: NEON is baseline on aarch64.
        unsafe { F8(vfmaq_f32(self.0, b.0, c.0), vfmaq_f32(self.1, b.1, c.1)) }
    }

    /// `self - b·c`, fused (`_mm256_fnmadd_ps(b, c, self)`).
    #[inline(always)]
    pub fn fms(self, b: F8, c: F8) -> F8 {
        // SAFETY: NEON is baseline on aarch64.
        unsafe { F8(vfmsq_f32(self.0, b.0, c.0), vfmsq_f32(self.1, b.1, c.1)) }
    }

    #[inline(always)]
    pub fn add(self, b: F8) -> F8 {
        // SAFETY: NEON is baseline on aarch64.
        unsafe { F8(vaddq_f32(self.0, b.0), vaddq_f32(self.1, b.1)) }
    }

    #[inline(always)]
    pub fn sub(self, b: F8) -> F8 {
        // SAFETY: NEON is baseline on aarch64.
        unsafe { F8(vsubq_f32(self.0, b.0), vsubq_f32(self.1, b.1)) }
    }

    #[inline(always)]
    pub fn mul(self, b: F8) -> F8 {
        // SAFETY: NEON is baseline on aarch64.
        unsafe { F8(vmulq_f32(self.0, b.0), vmulq_f32(self.1, b.1)) }
    }

    #[inline(always)]
    pub fn max(self, b: F8) -> F8 {
        // SAFETY: NEON is baseline on aarch64.
        unsafe { F8(vmaxq_f32(self.0, b.0), vmaxq_f32(self.1, b.1)) }
    }

    /// Lanes `i < n` kept, the rest `other`'s.
    #[inline(always)]
    pub fn first_or(self, n: usize, other: F8) -> F8 {
        let n = n.min(8) as u32;
        // SAFETY: NEON is baseline on aarch64; IOTA holds 8 u32.
        unsafe {
            let lim = vdupq_n_u32(n);
            let m0 = vcgtq_u32(lim, vld1q_u32(IOTA.as_ptr()));
            let m1 = vcgtq_u32(lim, vld1q_u32(IOTA.as_ptr().add(4)));
            F8(
                vbslq_f32(m0, self.0, other.0),
                vbslq_f32(m1, self.1, other.1),
            )
        }
    }

    /// The sum of the lanes in the AVX2 `hsum` order.
    #[inline(always)]
    pub fn hsum(self) -> f32 {
        // SAFETY: NEON is baseline on aarch64.
        unsafe {
            let s = vaddq_f32(self.0, self.1); // lo + hi
            let s2 = vadd_f32(vget_low_f32(s), vget_high_f32(s)); // s + movehl(s)
            vget_lane_f32::<0>(s2) + vget_lane_f32::<1>(s2)
        }
    }

    /// The largest lane (max is exact, so the order does not matter).
    #[inline(always)]
    pub fn hmax(self) -> f32 {
        // SAFETY: NEON is baseline on aarch64.
        unsafe { vmaxvq_f32(vmaxq_f32(self.0, self.1)) }
    }

    /// `e^x` lane-wise for x ≤ 0, the AVX2 attention's `exp` step for step
    /// (clamp at -87, round to nearest even, Cody-Waite, degree-6 Taylor by
    /// fused Horner, 2^n in the exponent bits): the same value per lane.
    #[inline(always)]
    pub fn exp(self) -> F8 {
        let x = self.max(F8::splat(-87.0));
        // SAFETY: NEON is baseline on aarch64.
        let n = unsafe {
            let t = x.mul(F8::splat(std::f32::consts::LOG2_E));
            F8(vrndnq_f32(t.0), vrndnq_f32(t.1))
        };
        let r = x.fms(n, F8::splat(0.693_145_75));
        let r = r.fms(n, F8::splat(1.428_606_8e-6));
        let mut y = F8::splat(1.0 / 720.0);
        for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
            y = F8::splat(c).fma(y, r);
        }
        // SAFETY: NEON is baseline on aarch64.
        let scale = unsafe {
            let bias = vdupq_n_s32(127);
            let b =
                |v| vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(vcvtnq_s32_f32(v), bias)));
            F8(b(n.0), b(n.1))
        };
        y.mul(scale)
    }
}

const IOTA: [u32; 8] = [0, 1, 2, 3, 4, 5, 6, 7];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_exp_matches_libm() {
        let xs: Vec<f32> = (0..4000).map(|i| -(i as f32) * 0.025).collect();
        for c in xs.chunks(8) {
            let mut lanes = [0f32; 8];
            lanes[..c.len()].copy_from_slice(c);
            let mut got = [0f32; 8];
            // SAFETY: both arrays hold 8 floats.
            unsafe { F8::load(lanes.as_ptr()).exp().store(got.as_mut_ptr()) };
            for (x, g) in lanes.iter().zip(got) {
                let want = x.exp();
                // Below -87 the clamp returns e^-87 (≤ 2e-38).
                assert!(
                    (g - want).abs() <= 4e-7 * want + 2e-38,
                    "exp({x}) = {g}, libm {want}"
                );
            }
        }
    }

    #[test]
    fn lane_sum_and_mask_follow_the_avx2_order() {
        // Values whose sum depends on the order: ((l0+l4)+(l2+l6)) +
        // ((l1+l5)+(l3+l7)).
        let v = [1e8f32, 1.0, -1e8, 1.0, 3.0, 0.5, 2.0, 0.25];
        // SAFETY: v holds 8 floats.
        let f = unsafe { F8::load(v.as_ptr()) };
        let want = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
        assert_eq!(f.hsum().to_bits(), want.to_bits());
        assert_eq!(f.hmax(), 1e8);
        let mut out = [0f32; 8];
        // SAFETY: out holds 8 floats.
        unsafe { f.first_or(3, F8::splat(-1.0)).store(out.as_mut_ptr()) };
        assert_eq!(out, [1e8, 1.0, -1e8, -1.0, -1.0, -1.0, -1.0, -1.0]);
    }
}
