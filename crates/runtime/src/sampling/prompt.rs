//! vLLM's `prompt_logprobs`: for each prompt token after the first, its raw
//! log-probability under the model given the tokens before it, its rank
//! in the vocabulary, and the `k` most likely tokens at that position.

use super::raw_logprobs;

/// One prompt position's entry (vLLM's `dict[token_id, Logprob]` for that
/// position, before detokenization).
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLogprob {
    /// The prompt's token at this position.
    pub token_id: u32,
    /// Its raw log-probability (log-softmax of the logits of the position
    /// before, no penalties or temperature).
    pub logprob: f32,
    /// 1-based rank as vLLM counts it: tokens whose logit is at least this
    /// token's (itself included), so ties rank pessimistically.
    pub rank: usize,
    /// The `k` most likely `(token, raw logprob)` at this position, best first.
    pub top: Vec<(u32, f32)>,
}

/// The entry for `token` from the logits `row` of the position before it,
/// with the `k` best alternatives. A token outside the row (the engine
/// checks prompts against the vocabulary, so never in practice) gets
/// `-inf` and the last rank rather than a panic.
pub fn prompt_logprob(row: &[f32], token: u32, k: usize) -> PromptLogprob {
    let (lse, top) = raw_logprobs(row, k);
    let Some(&x) = row.get(token as usize) else {
        return PromptLogprob {
            token_id: token,
            logprob: f32::NEG_INFINITY,
            rank: row.len() + 1,
            top,
        };
    };
    PromptLogprob {
        token_id: token,
        logprob: (x as f64 - lse) as f32,
        rank: row.iter().filter(|&&y| y >= x).count().max(1),
        top,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::log_softmax;

    #[test]
    fn entry_is_the_log_softmax_with_rank_and_top() {
        let row = [1.0f32, 3.0, 2.0, 3.0, -1.0];
        let want = log_softmax(&row);
        let e = prompt_logprob(&row, 2, 2);
        assert!((e.logprob - want[2]).abs() < 1e-6);
        // Two tokens (1 and 3) beat it: rank 3.
        assert_eq!(e.rank, 3);
        assert_eq!(e.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 3]);
        assert!((e.top[0].1 - want[1]).abs() < 1e-6);
        // A tie ranks pessimistically (vLLM counts `>=`).
        assert_eq!(prompt_logprob(&row, 1, 0).rank, 2);
        assert!(prompt_logprob(&row, 1, 0).top.is_empty());
        assert_eq!(prompt_logprob(&row, 0, 0).rank, 4);
        let out = prompt_logprob(&row, 9, 1);
        assert_eq!(out.logprob, f32::NEG_INFINITY);
        assert_eq!(out.rank, 6);
    }
}
