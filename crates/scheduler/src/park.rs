//! Keep, swap or recompute: what the program policy does with a program's
//! KV when memory is wanted (docs/design.md §4; issue 32 item 3).
//!
//! A program the policy might pause has three fates, priced from what the
//! replica measured of its own steps (`rates.rs`: prefill seconds at that
//! context, copy seconds per token) and, for an acting program in a named
//! tool, the tool's expected remaining time (`tools.rs`):
//!
//! * **keep** — it stays resident. Chosen for an acting program whose tool
//!   is expected back (`R`) before its KV could be brought back
//!   (`restore_s`: the copies back from the tier, or the prefill of its
//!   context when it would be recomputed): pausing would free its blocks for
//!   less time than restoring them costs (InferCept's waste, memory ×
//!   time, with both sides over the same memory). Without a named tool with
//!   enough history, or before the replica measured its rates, nothing is
//!   kept this way and the pause order alone decides (`program_policy.rs`).
//! * **swap** — it is paused and its blocks, evicted from the device, are
//!   copied to the host tier and back on restore. Chosen whenever the
//!   replica has a tier and the copies cost less than the prefill; the
//!   tier's LRU decides what it drops when full.
//! * **recompute** — it is paused and its blocks are dropped when evicted
//!   (`KvCache::pause_for_recompute`): no tier, or a prefill priced at
//!   under a quarter of the copies out and back ([`RECOMPUTE_MARGIN`]).
//!
//! Tried and rejected: once the contexts parked on a replica filled the
//! tier, recomputing a program whose context was cheaper per block to
//! recompute than those parked (to keep the tier for dearer ones).
//! `agentd simulate` swe at 192 programs with a 3.46M-token tier: 135 such
//! choices, 311.7 steps/min and 2.2M tokens recomputed against 322.8 and
//! 85k with every pause swapped. Short contexts are restored first (the
//! queue's shortest-first order), so they are the ones the tier serves
//! best; the LRU keeps them.
//!
//! Each choice is counted ([`ParkCounts`], `agentd:park_decisions_total`)
//! and recorded on the program's record (`GET /programs` shows it).
//!
//! On the CPU both tiers are host memory and a copy runs at memory
//! bandwidth against a prefill at the model's prefill rate, so with a tier
//! every pause swaps and keep is chosen only for tools expected back
//! sooner than the copies; without one, for tools back sooner than the
//! prefill of the program's context.

use crate::program::Program;
use crate::{Memory, Phase, ProgramId, ProgramScheduler};

/// How much cheaper than the copies out and back a prefill must be priced
/// before a pause recomputes instead of swapping. The prices are the
/// step-time fit's (`rates.rs`), and its prefill term swings between steps:
/// in `agentd simulate` swe at 96 programs (H100 costs, copies beside the
/// forward, 3.46M-token tier, a 3,600 s window after 3,600 s) it priced
/// 21k-token contexts at 0.18-0.97 s against copies of 0.09-0.15 s. With
/// no margin it chose recompute 375 times and recomputed 2.39M tokens:
/// 262.4 steps/min against the request policy's 267.6. Margin 2: 263.0
/// (1.90M); 4: 264.8 (0.82M); always swapping: 266.2 (0.12M). At 192
/// programs, margin 4 against none: swe 258.1 against 250.3, bimodal 264.8
/// against 259.8. A copy over PCIe or memory costs a tenth of a prefill or
/// less on every device measured, so the margin only keeps recompute for a
/// link clearly slower than the prefill, not for the fit's noise.
///
/// Most of that noise was the fit's: where the copies run beside the
/// forward, steps that restored a long context took about as long as their
/// copies and the fit explained them by the copies alone, pricing a
/// 2,048-token prefill at 0.2-2 ms against 51 ms. Since the fit leaves
/// such steps out (`rates.rs`, `COPY_HEAVY`) that cell chooses no
/// recompute by price: 266.2 steps/min, 0.12M tokens recomputed (192
/// programs: 261.6 against 258.1).
const RECOMPUTE_MARGIN: f64 = 4.0;

/// The fate of a program's KV when memory is wanted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Park {
    /// Resident: not paused, though memory was wanted.
    Keep,
    /// Paused; its blocks go to the host tier when evicted.
    Swap,
    /// Paused; its blocks are dropped when evicted.
    Recompute,
}

impl Park {
    pub const ALL: [Park; 3] = [Park::Keep, Park::Swap, Park::Recompute];

    pub fn as_str(self) -> &'static str {
        match self {
            Park::Keep => "keep",
            Park::Swap => "swap",
            Park::Recompute => "recompute",
        }
    }
}

/// Park decisions counted by choice (a program kept is counted once per
/// acting period, however many decisions kept it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParkCounts([u64; 3]);

impl ParkCounts {
    pub fn of(&self, park: Park) -> u64 {
        self.0[park as usize]
    }
    pub(crate) fn add(&mut self, park: Park) {
        self.0[park as usize] += 1;
    }
}

impl ProgramScheduler {
    /// Whether the acting program `p` on `l` is kept rather than paused:
    /// its tool is expected back before its KV could be restored.
    pub(crate) fn keeps(&self, l: usize, p: ProgramId, now: f64, mem: &dyn Memory) -> bool {
        let Some(prog) = self.programs.get(&p) else {
            return false;
        };
        if prog.phase != Phase::Acting {
            return false;
        }
        let Some(remaining) = self.expected_remaining(prog, now) else {
            return false;
        };
        let (_, restore) = self.price(l, prog, mem.blocks_held(l, p), mem);
        restore.is_some_and(|s| remaining < s)
    }

    /// Records that `kept` were kept (once per acting period each).
    pub(crate) fn note_kept(&mut self, kept: &[ProgramId]) {
        for p in kept {
            if let Some(prog) = self.programs.get_mut(p) {
                if prog.park != Some(Park::Keep) {
                    prog.park = Some(Park::Keep);
                    self.stats.parks.add(Park::Keep);
                }
            }
        }
    }

    /// Swap or recompute for `p`, about to be paused on `l` (`forced`, when
    /// the caller decided: rotation past the tier), counted and recorded
    /// on its record (the core reads it when it drops the program's
    /// references).
    pub(crate) fn choose_park(
        &mut self,
        l: usize,
        p: ProgramId,
        mem: &dyn Memory,
        forced: Option<Park>,
    ) {
        let Some(prog) = self.programs.get(&p) else {
            return;
        };
        let park = forced.unwrap_or_else(|| self.price(l, prog, mem.blocks_held(l, p), mem).0);
        self.stats.parks.add(park);
        if let Some(prog) = self.programs.get_mut(&p) {
            prog.park = Some(park);
        }
    }

    /// Seconds `l` takes to recompute `prog`'s context (or the `held`
    /// blocks it holds, when decoding grew it past its last request) at
    /// the replica's measured prefill rate; `None` before it measured one.
    pub(crate) fn recompute_s(
        l: usize,
        prog: &Program,
        held: usize,
        mem: &dyn Memory,
    ) -> Option<f64> {
        mem.prefill_s(l, 0, prog.context_tokens.max(held * mem.block_size()))
    }

    /// The module's rule for a program holding `held` blocks on `l`: swap
    /// or recompute, and the seconds that brings its KV back on restore
    /// (the copies back, or the prefill of its context; `None` before the
    /// replica measured them). Keep and the pause's choice read the same
    /// price.
    fn price(
        &self,
        l: usize,
        prog: &Program,
        held: usize,
        mem: &dyn Memory,
    ) -> (Park, Option<f64>) {
        let held_tokens = held * mem.block_size();
        let prefill = Self::recompute_s(l, prog, held, mem);
        if mem.host_capacity(l) == 0 {
            return (Park::Recompute, prefill);
        }
        // Out when evicted and back on restore; unknown copies (no step
        // copied enough yet) mean swap: a copy runs at memory bandwidth.
        match (prefill, mem.copy_s(l, 2 * held_tokens)) {
            (Some(r), Some(c)) if r * RECOMPUTE_MARGIN <= c => (Park::Recompute, prefill),
            _ => (Park::Swap, mem.copy_s(l, held_tokens)),
        }
    }
}
