//! vLLM's `prompt_logprobs` in the engine: what a request accumulates while
//! its prefill computes them, and what one planned chunk scores.

use agentd_runtime::PromptLogprob;

/// A request's prompt logprobs as its prefill computes them.
pub(crate) struct PromptLp {
    /// Alternatives per position.
    pub k: usize,
    /// Entry `j` is prompt token `j + 1`'s (the first token has none).
    pub entries: Vec<PromptLogprob>,
    /// The whole prompt is computed: the entries go out with the first
    /// token, and a later restore may match the prefix as usual.
    pub done: bool,
}

/// The prompt logprobs one planned chunk yields (filled by the worker
/// outside the lock): row `i` of the chunk scores `targets[i]`, the prompt
/// token after the chunk's `i`-th; a chunk that ends the prompt has one
/// target fewer than rows (its last row samples).
pub(crate) struct PromptRows {
    pub k: usize,
    pub targets: Vec<u32>,
    pub out: Vec<PromptLogprob>,
}

impl PromptLp {
    pub fn new(k: usize) -> Self {
        PromptLp {
            k,
            entries: Vec::new(),
            done: false,
        }
    }

    /// What the chunk `from..to` of `tokens` (a context whose first
    /// `prompt_len` tokens are the prompt) scores: `None` once the prompt
    /// is done or past it.
    pub fn rows(
        &self,
        tokens: &[u32],
        prompt_len: usize,
        from: usize,
        to: usize,
    ) -> Option<PromptRows> {
        if self.done || from >= prompt_len {
            return None;
        }
        let end = (to + 1).min(prompt_len);
        Some(PromptRows {
            k: self.k,
            targets: tokens.get(from + 1..end)?.to_vec(),
            out: Vec::new(),
        })
    }

    /// Takes in a chunk computed from `from` of a prompt of `prompt_len`
    /// tokens, `n` tokens long. A restarted prefill (from the first token
    /// again) replaces what an interrupted one scored.
    pub fn absorb(&mut self, rows: PromptRows, from: usize, n: usize, prompt_len: usize) {
        self.entries.truncate(from);
        self.entries.extend(rows.out);
        self.done = from + n >= prompt_len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scored(rows: &mut PromptRows) {
        rows.out = rows
            .targets
            .iter()
            .map(|&t| PromptLogprob {
                token_id: t,
                logprob: -1.0,
                rank: 1,
                top: Vec::new(),
            })
            .collect();
    }

    #[test]
    fn chunks_score_the_next_prompt_token_and_a_restart_replaces_them() {
        let tokens: Vec<u32> = (10..20).collect();
        let mut lp = PromptLp::new(2);
        // Chunk 0..4 scores tokens 1..=4; the last chunk 4..10 scores 5..=9
        // with one row fewer (its last row samples).
        let mut a = lp.rows(&tokens, 10, 0, 4).unwrap();
        assert_eq!(a.targets, [11, 12, 13, 14]);
        scored(&mut a);
        lp.absorb(a, 0, 4, 10);
        assert!(!lp.done);
        // Paused and restarted from the first token: entries replaced.
        let mut again = lp.rows(&tokens, 10, 0, 6).unwrap();
        scored(&mut again);
        lp.absorb(again, 0, 6, 10);
        assert_eq!(lp.entries.len(), 6);
        let mut last = lp.rows(&tokens, 10, 6, 10).unwrap();
        assert_eq!(last.targets, [17, 18, 19]);
        scored(&mut last);
        lp.absorb(last, 6, 4, 10);
        assert!(lp.done);
        let ids: Vec<u32> = lp.entries.iter().map(|e| e.token_id).collect();
        assert_eq!(ids, (11..20).collect::<Vec<_>>());
        // Done: nothing more to score.
        assert!(lp.rows(&tokens, 10, 0, 10).is_none());
    }
}
