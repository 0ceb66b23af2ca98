//! Host side of the device sampler (`kernels/sample.cu`): a step's
//! [`RowPlan`]s packed into the three word arrays the kernel reads, and its
//! output words read back into [`Drawn`]s. Pure and always built, so the
//! layout is tested in CI without a GPU: [`unpack_plans`] reads the packed
//! words back the way the kernel does, and the tests check it gives every
//! plan back.
//!
//! Layouts (the kernel's `P_*` offsets and `EDIT_WORDS`):
//! - params: [`ROW_WORDS`] words a row: temperature, top_p, min_p,
//!   repetition, presence, frequency (f32 bits), top_k, logprobs (`n`, or
//!   [`NO_LOGPROBS`]), seed lo/hi, draw lo/hi, first edit, edit count, mask
//!   start (or [`NO_MASK`]), reserved;
//! - edits: [`EDIT_WORDS`] words an edit: token, flags (1 banned, 2 seen,
//!   4 bias), bias bits, count;
//! - masks: `vocab.div_ceil(32)` words per masked row;
//! - out: [`Packed::out_stride`] words a row: token, logprob bits, then `n`
//!   (token, logprob bits) pairs.

use agentd_runtime::sampling::device::{Drawn, Edit, RowPlan};
use agentd_runtime::sampling::MAX_LOGPROBS;

use crate::error::{CudaError, Result};

pub const ROW_WORDS: usize = 16;
pub const EDIT_WORDS: usize = 4;
pub const NO_LOGPROBS: u32 = 0x8000_0000;
pub const NO_MASK: u32 = u32::MAX;
/// The kernel's `MAX_TOP`: alternatives a row can report (the server's
/// limit, vLLM's 20).
pub const MAX_TOP: usize = 20;
/// Threads of one row's CTA (the kernel's `SAMPLE_THREADS`).
pub const SAMPLE_THREADS: u32 = 1024;

const _: () = assert!(MAX_LOGPROBS <= MAX_TOP);

const FLAG_BANNED: u32 = 1;
const FLAG_SEEN: u32 = 2;
const FLAG_BIAS: u32 = 4;

/// One step's plans as the kernel reads them.
#[derive(Debug, Clone, PartialEq)]
pub struct Packed {
    pub rows: usize,
    pub params: Vec<u32>,
    pub edits: Vec<u32>,
    pub masks: Vec<u32>,
    /// Words of one row's output.
    pub out_stride: usize,
}

impl Packed {
    pub fn num_edits(&self) -> usize {
        self.edits.len() / EDIT_WORDS
    }
}

fn too_big(what: &str, v: usize) -> CudaError {
    CudaError::Unsupported(format!("device sampling: {what} = {v} exceeds u32"))
}

fn u32_of(what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| too_big(what, v))
}

/// Packs `plans` (one per logits row) for rows of `vocab` logits. Refuses
/// what the kernel could not read safely: an edit past the vocabulary or
/// out of order, more alternatives than [`MAX_TOP`].
pub fn pack(plans: &[RowPlan], vocab: usize) -> Result<Packed> {
    let words = vocab.div_ceil(32);
    let mut p = Packed {
        rows: plans.len(),
        params: Vec::with_capacity(plans.len() * ROW_WORDS),
        edits: Vec::new(),
        masks: Vec::new(),
        out_stride: 2,
    };
    for plan in plans {
        check_edits(&plan.edits, vocab)?;
        let logprobs = match plan.logprobs {
            Some(n) if n as usize > MAX_TOP => {
                return Err(CudaError::Unsupported(format!(
                    "device sampling: {n} alternatives asked, at most {MAX_TOP}"
                )))
            }
            Some(n) => {
                p.out_stride = p.out_stride.max(2 + 2 * n as usize);
                n
            }
            None => NO_LOGPROBS,
        };
        let mask_start = match &plan.allowed {
            Some(m) => {
                let start = u32_of("mask words", p.masks.len())?;
                p.masks
                    .extend((0..words).map(|i| m.get(i).copied().unwrap_or(0)));
                start
            }
            None => NO_MASK,
        };
        let edit_start = u32_of("edits", p.num_edits())?;
        for e in &plan.edits {
            p.edits.extend(edit_words(e));
        }
        p.params.extend([
            plan.temperature.to_bits(),
            plan.top_p.to_bits(),
            plan.min_p.to_bits(),
            plan.repetition.to_bits(),
            plan.presence.to_bits(),
            plan.frequency.to_bits(),
            plan.top_k,
            logprobs,
            plan.seed as u32,
            (plan.seed >> 32) as u32,
            plan.draw as u32,
            (plan.draw >> 32) as u32,
            edit_start,
            u32_of("edits of a row", plan.edits.len())?,
            mask_start,
            0,
        ]);
    }
    u32_of("edits", p.num_edits())?;
    Ok(p)
}

fn check_edits(edits: &[Edit], vocab: usize) -> Result<()> {
    let sorted = edits.windows(2).all(|w| w[0].token < w[1].token);
    match edits.last() {
        Some(e) if e.token as usize >= vocab || !sorted => Err(CudaError::Unsupported(format!(
            "device sampling: edits must be sorted, unique and below the vocabulary ({vocab})"
        ))),
        _ => Ok(()),
    }
}

fn edit_words(e: &Edit) -> [u32; EDIT_WORDS] {
    let flags = if e.banned { FLAG_BANNED } else { 0 }
        | if e.seen { FLAG_SEEN } else { 0 }
        | if e.bias.is_some() { FLAG_BIAS } else { 0 };
    [e.token, flags, e.bias.unwrap_or(0.0).to_bits(), e.count]
}

/// The kernel's output words back as draws, one per plan.
pub fn unpack(out: &[u32], plans: &[RowPlan], out_stride: usize) -> Result<Vec<Drawn>> {
    if out.len() < plans.len() * out_stride || out_stride < 2 {
        return Err(CudaError::Unsupported(format!(
            "device sampling: {} output words for {} rows of {out_stride}",
            out.len(),
            plans.len()
        )));
    }
    Ok(plans
        .iter()
        .zip(out.chunks_exact(out_stride))
        .map(|(plan, o)| {
            let n = plan.logprobs.map_or(0, |n| n as usize);
            Drawn {
                token: o[0],
                logprob: plan.logprobs.map(|_| f32::from_bits(o[1])),
                top: (0..n)
                    .map(|j| (o[2 + 2 * j], f32::from_bits(o[3 + 2 * j])))
                    .collect(),
            }
        })
        .collect())
}

/// The plans read back from packed words as the kernel reads them (the
/// layout's test; a mask comes back as its `vocab.div_ceil(32)` words).
pub fn unpack_plans(p: &Packed, vocab: usize) -> Vec<RowPlan> {
    let words = vocab.div_ceil(32);
    let f = f32::from_bits;
    p.params
        .chunks_exact(ROW_WORDS)
        .map(|w| {
            let (start, count) = (w[12] as usize, w[13] as usize);
            let edits = p.edits[start * EDIT_WORDS..(start + count) * EDIT_WORDS]
                .chunks_exact(EDIT_WORDS)
                .map(|e| Edit {
                    token: e[0],
                    banned: e[1] & FLAG_BANNED != 0,
                    seen: e[1] & FLAG_SEEN != 0,
                    bias: (e[1] & FLAG_BIAS != 0).then(|| f(e[2])),
                    count: e[3],
                })
                .collect();
            RowPlan {
                temperature: f(w[0]),
                top_p: f(w[1]),
                min_p: f(w[2]),
                repetition: f(w[3]),
                presence: f(w[4]),
                frequency: f(w[5]),
                top_k: w[6],
                logprobs: (w[7] & NO_LOGPROBS == 0).then_some(w[7]),
                seed: u64::from(w[8]) | (u64::from(w[9]) << 32),
                draw: u64::from(w[10]) | (u64::from(w[11]) << 32),
                edits,
                allowed: (w[14] != NO_MASK)
                    .then(|| p.masks[w[14] as usize..w[14] as usize + words].to_vec()),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentd_runtime::sampling::device::{draw_planned, merge_edits, words_allowing};

    fn plans(vocab: usize) -> Vec<RowPlan> {
        let edit = |token, banned, bias, seen, count| Edit {
            token,
            banned,
            bias,
            seen,
            count,
        };
        vec![
            RowPlan::greedy(),
            RowPlan {
                temperature: 0.7,
                top_k: 40,
                top_p: 0.9,
                min_p: 0.05,
                seed: 0x0123_4567_89ab_cdef,
                draw: (7u64 << 32) | 3,
                logprobs: Some(5),
                repetition: 1.2,
                presence: 0.5,
                frequency: 0.25,
                edits: merge_edits(
                    vec![
                        edit(3, false, Some(-1.5), true, 2),
                        edit(0, true, None, false, 0),
                        edit(99, false, None, true, 0),
                    ],
                    vocab,
                ),
                allowed: Some(words_allowing(&[0, 3, 5, 31, 32, 99], vocab)),
            },
            RowPlan {
                logprobs: Some(0),
                allowed: Some(vec![u32::MAX]),
                ..RowPlan::greedy()
            },
        ]
    }

    #[test]
    fn packed_plans_read_back_as_the_kernel_reads_them() {
        let vocab = 100;
        let plans = plans(vocab);
        let p = pack(&plans, vocab).unwrap();
        assert_eq!(p.params.len(), 3 * ROW_WORDS);
        assert_eq!(p.num_edits(), 3);
        assert_eq!(p.out_stride, 2 + 2 * 5);
        let back = unpack_plans(&p, vocab);
        assert_eq!(back[..2], plans[..2]);
        // A short mask is padded with zero words (nothing allowed past it).
        assert_eq!(back[2].allowed, Some(vec![u32::MAX, 0, 0, 0]));
        // The kernel's reads draw what the reference draws from the plan.
        let row: Vec<f32> = (0..vocab).map(|i| ((i * 37 % 23) as f32) * 0.3).collect();
        for (a, b) in plans.iter().zip(&back) {
            assert_eq!(
                draw_planned(&row, a).unwrap(),
                draw_planned(&row, b).unwrap()
            );
        }
    }

    #[test]
    fn output_words_become_draws() {
        let plans = plans(100);
        let stride = 12;
        let mut out = vec![0u32; 3 * stride];
        out[0] = 7;
        out[stride] = 9;
        out[stride + 1] = (-0.5f32).to_bits();
        for j in 0..5 {
            out[stride + 2 + 2 * j] = j as u32;
            out[stride + 3 + 2 * j] = (-(j as f32)).to_bits();
        }
        out[2 * stride + 1] = (-2.0f32).to_bits();
        let d = unpack(&out, &plans, stride).unwrap();
        assert_eq!((d[0].token, d[0].logprob, d[0].top.len()), (7, None, 0));
        assert_eq!((d[1].token, d[1].logprob), (9, Some(-0.5)));
        assert_eq!(d[1].top[4], (4, -4.0));
        assert_eq!((d[2].logprob, d[2].top.len()), (Some(-2.0), 0));
        assert!(unpack(&out[..20], &plans, stride).is_err());
    }

    #[test]
    fn plans_the_kernel_cannot_read_are_refused() {
        let unsorted = RowPlan {
            edits: vec![Edit::new(5), Edit::new(2)],
            ..RowPlan::greedy()
        };
        assert!(pack(&[unsorted], 10).is_err());
        let past = RowPlan {
            edits: vec![Edit::new(10)],
            ..RowPlan::greedy()
        };
        assert!(pack(&[past], 10).is_err());
        let many = RowPlan {
            logprobs: Some(21),
            ..RowPlan::greedy()
        };
        assert!(pack(&[many], 10).is_err());
        assert!(pack(&[], 10).unwrap().params.is_empty());
    }
}
