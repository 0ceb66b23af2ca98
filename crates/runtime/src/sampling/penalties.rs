//! Repetition, presence and frequency penalties, applied only to the tokens
//! seen: the sequence keeps one count per distinct token, updated by one
//! binary-searched insert per sampled token, so a step costs a copy of the
//! row plus O(distinct tokens), never a rescan of the history.

use super::device::Edit;
use super::SamplingParams;

#[derive(Debug, Clone, Copy)]
struct Seen {
    token: u32,
    /// Occurrences in the output (0 for a prompt token not generated yet).
    count: u32,
}

/// Penalty state of one sequence; exists only when some penalty is set
/// (the penalties themselves are the request's: `SamplingParams`).
#[derive(Debug, Clone)]
pub(super) struct Penalties {
    /// Distinct tokens seen, sorted by id.
    seen: Vec<Seen>,
}

impl Penalties {
    /// `None` when every penalty is neutral (the default).
    pub fn new(p: &SamplingParams, prompt: &[u32]) -> Option<Self> {
        if p.repetition_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0 {
            return None;
        }
        // Only the repetition penalty looks at the prompt.
        let mut seen: Vec<Seen> = if p.repetition_penalty != 1.0 {
            prompt
                .iter()
                .map(|&token| Seen { token, count: 0 })
                .collect()
        } else {
            Vec::new()
        };
        seen.sort_unstable_by_key(|s| s.token);
        seen.dedup_by_key(|s| s.token);
        Some(Penalties { seen })
    }

    /// Counts one generated token.
    pub fn record(&mut self, token: u32) {
        match self.seen.binary_search_by_key(&token, |s| s.token) {
            Ok(i) => self.seen[i].count = self.seen[i].count.saturating_add(1),
            Err(i) => self.seen.insert(i, Seen { token, count: 1 }),
        }
    }

    /// The seen tokens as a device plan's edits (the plan carries the
    /// three penalties).
    pub fn plan(&self, edits: &mut Vec<Edit>) {
        edits.extend(self.seen.iter().map(|s| Edit {
            seen: true,
            count: s.count,
            ..Edit::new(s.token)
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::device::{merge_edits, RowPlan};

    /// `row` as the penalties edit it (through the row plan, the one
    /// definition of the edits).
    fn apply(p: &SamplingParams, pen: &Penalties, row: &mut [f32]) {
        let mut edits = Vec::new();
        pen.plan(&mut edits);
        let plan = RowPlan {
            repetition: p.repetition_penalty,
            presence: p.presence_penalty,
            frequency: p.frequency_penalty,
            edits: merge_edits(edits, row.len()),
            ..RowPlan::greedy()
        };
        plan.edit(row);
    }

    #[test]
    fn counts_are_kept_incrementally_and_applied_to_seen_tokens_only() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..SamplingParams::default()
        };
        let mut pen = Penalties::new(&p, &[3, 1, 3, 99]).unwrap();
        for t in [2, 3, 2, 2] {
            pen.record(t);
        }
        let mut row = vec![1.0, 1.0, 1.0, -1.0, 1.0];
        apply(&p, &pen, &mut row);
        // 0, 4 unseen; 1 prompt only; 2 output ×3; 3 prompt + output ×1; 99 out of range.
        assert_eq!(
            row,
            vec![1.0, 0.5, 0.5 - 0.75 - 0.5, -2.0 - 0.25 - 0.5, 1.0]
        );
        assert!(Penalties::new(&SamplingParams::default(), &[1]).is_none());
        // Without a repetition penalty the prompt is not tracked.
        let p = SamplingParams {
            presence_penalty: 1.0,
            ..SamplingParams::default()
        };
        let pen = Penalties::new(&p, &[0]).unwrap();
        let mut row = vec![1.0, 2.0];
        apply(&p, &pen, &mut row);
        assert_eq!(row, vec![1.0, 2.0]);
    }
}
