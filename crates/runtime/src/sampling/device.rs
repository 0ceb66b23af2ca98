//! Sampling where the logits are (docs/design.md §8, issue 28 item 1): one
//! row's sampling as plain data, [`RowPlan`], that a backend's kernel takes
//! with the logits still on its device, and [`draw_planned`], the reference
//! of the algorithm that kernel runs (`kernels/sample.cu`). Only the drawn
//! token, its raw logprob and the requested alternatives come back
//! ([`Drawn`]): at batch 128 and Qwen's 151,936-token vocabulary the f32
//! logits the host sampler reads are 78 MB, whose download cost 42-65 ms on
//! an H200 against a 23 ms step (kernels/NOTES.md).
//!
//! The plan holds everything the host sampler applies to a row, in the host
//! sampler's order, so the edited row is the same to the bit
//! ([`RowPlan::edit`], tested against [`super::SequenceSampler`]):
//! 1. the allowed set (`allowed_token_ids` and the grammar's bitmask, one
//!    bitmask): tokens outside it are -inf;
//! 2. sparse [`Edit`]s, sorted by token: banned (bad words, stop ids held
//!    back by `min_tokens`) → -inf; else `+ bias`, then the repetition
//!    penalty on seen tokens, then `frequency·count + presence`.
//!
//! The candidate set is the host sampler's (top-k, then top-p on it, then
//! min-p: `select::kept`); the draw differs. The host walks the inverse CDF
//! with one ChaCha8 uniform; a GPU wants no scan, so a planned draw is a
//! Gumbel-max: the kept token maximising `(x - max)/T + g`, with
//! `g = -ln(-ln u)` and `u` from Philox4x32-10 keyed by the request's seed
//! and counted by (token, draw index). That samples the same distribution
//! (a test checks the frequencies), reproducibly per seed, but not the host
//! sampler's sequence for the same seed. Greedy rows are an argmax either
//! way, so greedy output does not depend on where it is sampled.

use super::kernels::{argmax, max};
use super::{raw_logprobs, select, SamplingParams};
use crate::error::{ModelError, Result};
use crate::logits::Logits;

/// Below this temperature a row is greedy (the host sampler's threshold).
pub const GREEDY_BELOW: f32 = 1e-5;

/// One logits row's sampling, as a kernel takes it.
#[derive(Debug, Clone, PartialEq)]
pub struct RowPlan {
    /// < [`GREEDY_BELOW`]: greedy.
    pub temperature: f32,
    /// 0: off (also when ≥ the vocabulary).
    pub top_k: u32,
    /// 1: off.
    pub top_p: f32,
    /// 0: off.
    pub min_p: f32,
    /// Keys the Philox stream: the request's seed (or the one drawn for it).
    pub seed: u64,
    /// Which draw of the sequence this is (tokens generated before it):
    /// the Philox counter's high words, so no two draws share noise.
    pub draw: u64,
    /// Report the chosen token's raw logprob and this many alternatives.
    pub logprobs: Option<u32>,
    /// 1: off.
    pub repetition: f32,
    pub presence: f32,
    pub frequency: f32,
    /// Sorted by token, one per token, every token < the vocabulary.
    pub edits: Vec<Edit>,
    /// Bit `t % 32` of word `t / 32` allows token `t`; tokens past the
    /// words are not allowed. `None`: every token.
    pub allowed: Option<Vec<u32>>,
}

impl RowPlan {
    /// A greedy row with nothing else asked (a row whose result is unused).
    pub fn greedy() -> Self {
        RowPlan {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
            draw: 0,
            logprobs: None,
            repetition: 1.0,
            presence: 0.0,
            frequency: 0.0,
            edits: Vec::new(),
            allowed: None,
        }
    }

    /// Whether the row needs a copy before it is read: some edit or mask.
    pub fn edits_row(&self) -> bool {
        !self.edits.is_empty() || self.allowed.is_some()
    }

    /// `row` as the host sampler would see it after its controls,
    /// penalties and grammar (module docs, steps 1 and 2), in place.
    pub fn edit(&self, row: &mut [f32]) {
        if let Some(words) = &self.allowed {
            mask_row(row, words);
        }
        self.apply_edits(row);
    }

    /// [`Self::edit`] on a copy of `row`, masked as it is copied (one pass
    /// over the row, not two: the host sampler's path).
    pub fn edited_copy(&self, row: &[f32]) -> Vec<f32> {
        let mut out = match &self.allowed {
            Some(words) => masked_copy(row, words),
            None => row.to_vec(),
        };
        self.apply_edits(&mut out);
        out
    }

    fn apply_edits(&self, row: &mut [f32]) {
        for e in &self.edits {
            if let Some(x) = row.get_mut(e.token as usize) {
                *x = self.edited(*x, e);
            }
        }
    }

    /// One edited logit (the kernel's `edited`).
    fn edited(&self, x: f32, e: &Edit) -> f32 {
        if e.banned || x == f32::NEG_INFINITY {
            return f32::NEG_INFINITY;
        }
        let mut y = x;
        if let Some(b) = e.bias {
            y += b;
        }
        if e.seen && self.repetition != 1.0 {
            y = if y > 0.0 {
                y / self.repetition
            } else {
                y * self.repetition
            };
        }
        if e.count > 0 {
            y -= self.frequency * e.count as f32 + self.presence;
        }
        y
    }

    /// The filters as [`select::kept`] takes them.
    fn filters(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: i64::from(self.top_k),
            top_p: self.top_p,
            min_p: self.min_p,
            ..SamplingParams::default()
        }
    }
}

/// What happens to one token of a row (module docs, step 2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Edit {
    pub token: u32,
    /// -inf whatever else applies.
    pub banned: bool,
    /// `logit_bias`, added first.
    pub bias: Option<f32>,
    /// In the prompt or the output: the repetition penalty applies.
    pub seen: bool,
    /// Occurrences in the output: frequency and presence apply when > 0.
    pub count: u32,
}

impl Edit {
    pub fn new(token: u32) -> Self {
        Edit {
            token,
            banned: false,
            bias: None,
            seen: false,
            count: 0,
        }
    }
}

/// `edits` sorted by token, one per token (a token named twice has its
/// flags joined and its biases summed), tokens past `vocab` dropped (the
/// host sampler ignores them too).
pub fn merge_edits(mut edits: Vec<Edit>, vocab: usize) -> Vec<Edit> {
    edits.retain(|e| (e.token as usize) < vocab);
    // One source alone (the penalties' seen tokens, kept sorted and
    // distinct) needs no merge: thousands of prompt tokens, every step.
    if edits.windows(2).all(|w| w[0].token < w[1].token) {
        return edits;
    }
    edits.sort_by_key(|e| e.token);
    let mut out: Vec<Edit> = Vec::with_capacity(edits.len());
    for e in edits {
        match out.last_mut() {
            Some(last) if last.token == e.token => {
                last.banned |= e.banned;
                last.seen |= e.seen;
                last.count = last.count.max(e.count);
                last.bias = match (last.bias, e.bias) {
                    (Some(a), Some(b)) => Some(a + b),
                    (a, b) => a.or(b),
                };
            }
            _ => out.push(e),
        }
    }
    out
}

/// The bitmask of `vocab` tokens allowing exactly `tokens` (those below
/// `vocab`).
pub fn words_allowing(tokens: &[u32], vocab: usize) -> Vec<u32> {
    let mut words = vec![0u32; vocab.div_ceil(32)];
    for &t in tokens {
        if (t as usize) < vocab {
            words[t as usize / 32] |= 1 << (t % 32);
        }
    }
    words
}

/// Both masks' allowed tokens (a word missing from either allows nothing).
pub fn and_words(a: &[u32], b: &[u32]) -> Vec<u32> {
    a.iter().zip(b).map(|(x, y)| x & y).collect()
}

/// Whether `words` (`None`: everything) allows `token`.
pub fn allows(words: Option<&[u32]>, token: u32) -> bool {
    words.is_none_or(|w| {
        w.get(token as usize / 32)
            .is_some_and(|x| x & (1 << (token % 32)) != 0)
    })
}

/// Sets every token `words` does not allow to -inf in `row` (bit `t % 32`
/// of word `t / 32` allows token `t`; tokens past the words are not
/// allowed): the allowed set of a plan and the grammar's mask.
pub fn mask_row(row: &mut [f32], words: &[u32]) {
    for (i, chunk) in row.chunks_mut(32).enumerate() {
        mask_word(chunk, words.get(i).copied().unwrap_or(0));
    }
}

/// `row` with the tokens `words` does not allow at -inf: [`mask_row`] on
/// a copy, each 32-token chunk masked as soon as it is copied (while it is
/// in L1), so the row is read once.
fn masked_copy(row: &[f32], words: &[u32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(row.len());
    for (i, chunk) in row.chunks(32).enumerate() {
        let at = out.len();
        out.extend_from_slice(chunk);
        mask_word(&mut out[at..], words.get(i).copied().unwrap_or(0));
    }
    out
}

/// The one rule of a mask word over its (up to) 32 tokens: bit `b` allows
/// token `b`.
#[inline(always)]
fn mask_word(chunk: &mut [f32], w: u32) {
    match w {
        u32::MAX => {}
        // Most words of a small allowed set (a grammar state, a list of
        // ids) allow nothing: one fill, not 32 bit tests.
        0 => chunk.fill(f32::NEG_INFINITY),
        w => {
            for (b, x) in chunk.iter_mut().enumerate() {
                if w & (1 << b) == 0 {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
    }
}

/// One row's draw: the token, its raw logprob and the best alternatives
/// (raw logprobs, best first) when the plan asked for them.
#[derive(Debug, Clone, PartialEq)]
pub struct Drawn {
    pub token: u32,
    pub logprob: Option<f32>,
    pub top: Vec<(u32, f32)>,
}

impl Drawn {
    /// `token` of the raw `row` with its logprob and the alternatives, when
    /// `raw` (the row's log-sum-exp and best logprobs) was computed.
    pub(super) fn of(row: &[f32], token: usize, raw: Option<(f64, Vec<(u32, f32)>)>) -> Self {
        let (logprob, top) = match raw {
            Some((lse, top)) => (Some((row[token] as f64 - lse) as f32), top),
            None => (None, Vec::new()),
        };
        Drawn {
            token: token as u32,
            logprob,
            top,
        }
    }
}

/// Draws every row of `logits` by its plan, on the host: what a runner
/// without a device sampler does ([`crate::StepRunner::step_and_draw`]).
pub fn draw_rows(logits: &Logits, plans: &[RowPlan]) -> Result<Vec<Drawn>> {
    if logits.rows() != plans.len() {
        return Err(ModelError::Batch(format!(
            "{} logits rows for {} sampling plans",
            logits.rows(),
            plans.len()
        )));
    }
    let vocab = logits.vocab().max(1);
    logits.with_flat(|flat| {
        flat.chunks_exact(vocab)
            .zip(plans)
            .map(|(row, plan)| draw_planned(row, plan))
            .collect()
    })?
}

/// The reference of the device kernel: one row drawn by its plan.
pub fn draw_planned(row: &[f32], plan: &RowPlan) -> Result<Drawn> {
    if row.is_empty() {
        return Err(ModelError::Sampling("empty logits".into()));
    }
    let raw = plan.logprobs.map(|n| raw_logprobs(row, n as usize));
    let mut owned = plan.edits_row().then(|| row.to_vec());
    if let Some(r) = owned.as_mut() {
        plan.edit(r);
    }
    let edited = owned.as_deref().unwrap_or(row);
    Ok(Drawn::of(row, choose(edited, plan), raw))
}

/// Greedy, or the Gumbel-max over the host sampler's candidate set.
fn choose(row: &[f32], plan: &RowPlan) -> usize {
    if plan.temperature < GREEDY_BELOW {
        return argmax(row);
    }
    let m = max(row);
    if !m.is_finite() {
        return argmax(row);
    }
    let inv_t = 1.0 / plan.temperature;
    let filtered = (plan.top_k > 0 && (plan.top_k as usize) < row.len())
        || plan.top_p < 1.0
        || plan.min_p > 0.0;
    let score = |i: usize, x: f32| (x - m) * inv_t + gumbel(plan.seed, plan.draw, i as u32);
    let mut best: Option<(usize, f32)> = None;
    let mut consider = |i: usize, x: f32| {
        if x == f32::NEG_INFINITY || x.is_nan() {
            return;
        }
        let s = score(i, x);
        // Ties go to the lower index (candidates are visited in any order).
        if best.is_none_or(|(j, b)| s > b || (s == b && i < j)) {
            best = Some((i, s));
        }
    };
    if filtered {
        for c in select::kept(row, m, inv_t, &plan.filters()) {
            consider(c.idx as usize, c.logit);
        }
    } else {
        for (i, &x) in row.iter().enumerate() {
            consider(i, x);
        }
    }
    best.map_or_else(|| argmax(row), |(i, _)| i)
}

/// The Gumbel noise of token `i` in draw `draw` of the stream `seed`:
/// `-ln(-ln u)` with `u` ∈ (0, 1) from the top 24 bits of Philox's first
/// word (exact in f32, never 0 or 1).
pub fn gumbel(seed: u64, draw: u64, i: u32) -> f32 {
    let x = philox4x32_10([i, draw as u32, (draw >> 32) as u32, 0], seed)[0];
    let u = ((x >> 8) as f32 + 0.5) * (1.0 / 16_777_216.0);
    -(-u.ln()).ln()
}

/// Philox4x32 with 10 rounds (Salmon et al., SC'11; Random123's
/// `philox4x32_R(10, ..)`): counter-based, so a GPU thread computes token
/// `i`'s noise without any state. The kernel has the same integer code.
pub fn philox4x32_10(mut ctr: [u32; 4], seed: u64) -> [u32; 4] {
    const M0: u64 = 0xD251_1F53;
    const M1: u64 = 0xCD9E_8D57;
    const W0: u32 = 0x9E37_79B9;
    const W1: u32 = 0xBB67_AE85;
    let mut key = [seed as u32, (seed >> 32) as u32];
    for round in 0..10 {
        if round > 0 {
            key = [key[0].wrapping_add(W0), key[1].wrapping_add(W1)];
        }
        let p0 = M0 * u64::from(ctr[0]);
        let p1 = M1 * u64::from(ctr[2]);
        ctr = [
            (p1 >> 32) as u32 ^ ctr[1] ^ key[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ ctr[3] ^ key[1],
            p0 as u32,
        ];
    }
    ctr
}

#[cfg(test)]
#[path = "device_tests.rs"]
mod tests;
