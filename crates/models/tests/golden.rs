//! The runtime against Hugging Face transformers on the same random weights
//! (fixtures from scripts/make_golden.py), for every family (Qwen3,
//! GLM-4-0414, Qwen3-MoE, GLM-4.5 MoE): prefill logits, incremental decode
//! across block boundaries, chunked prefill, mixed batches; GQA ratios 4, 2,
//! 1; tied and untied output heads.

mod common;

use agentd_models::sampling::log_softmax;
use agentd_models::{LogitsFor, Model};
use common::*;

const TOL: f32 = 1e-4;

/// Every golden test again under each other kernel path the CPU supports
/// (`AGENTD_CPU_KERNELS=avx2` and `portable` on an AVX-512 machine).
#[test]
fn golden_under_every_kernel_path() {
    rerun_under_other_kernel_paths("golden_under_every_kernel_path");
}

#[test]
fn prefill_logits_match_transformers() {
    for name in MODELS {
        let model = load(name);
        for (ci, case) in golden(name).iter().enumerate() {
            let mut cache = model.new_cache(64, 16).unwrap();
            let mut pool = BlockPool::new(64, ci as u64);
            let mut seq = Seq::new(&case.input_ids);
            let lf = if case.all_positions {
                LogitsFor::All
            } else {
                LogitsFor::Last
            };
            let got = step(
                &model,
                &mut cache,
                &mut pool,
                &mut [&mut seq],
                &[(case.input_ids.len(), lf)],
            );
            assert_eq!(got.len(), case.prefill_logits.len());
            for (pos, (g, w)) in got.iter().zip(&case.prefill_logits).enumerate() {
                let e = rel_err(g, w);
                assert!(
                    e < TOL,
                    "{name} prompt {} pos {pos}: rel err {e}",
                    case.input_ids.len()
                );
            }
        }
    }
}

/// Prefill then decode one token at a time (block size 16: prompts 1, 15, 16,
/// 17, 100 put the decode steps on both sides of block boundaries).
#[test]
fn greedy_decode_matches_transformers() {
    for name in MODELS {
        let model = load(name);
        for (ci, case) in golden(name).iter().enumerate() {
            let mut cache = model.new_cache(64, 16).unwrap();
            let mut pool = BlockPool::new(64, 10 + ci as u64);
            let mut seq = Seq::new(&case.input_ids);
            let mut n = case.input_ids.len();
            for (si, want) in case.greedy.iter().enumerate() {
                let got = step(
                    &model,
                    &mut cache,
                    &mut pool,
                    &mut [&mut seq],
                    &[(n, LogitsFor::Last)],
                );
                let row = &got[0];
                let tok = argmax(row);
                let ctx = format!("{name} prompt {} step {si}", case.input_ids.len());
                assert_eq!(tok, want.token, "{ctx}: greedy token");
                let e = rel_err(row, &want.logits);
                assert!(e < TOL, "{ctx}: logits rel err {e}");
                let lp = log_softmax(row)[tok as usize];
                assert!(
                    (lp - want.logprob).abs() < 1e-4,
                    "{ctx}: logprob {lp} vs {}",
                    want.logprob
                );
                seq.tokens.push(tok);
                n = 1;
            }
        }
    }
}

/// Prefill in chunks (of several sizes, including ones that straddle blocks)
/// gives the same logits as transformers' whole-prompt prefill.
#[test]
fn chunked_prefill_equals_whole_prefill() {
    for name in MODELS {
        let model = load(name);
        let cases = golden(name);
        let case = cases.iter().find(|c| c.input_ids.len() == 100).unwrap();
        for (chunk, bs) in [(7usize, 16usize), (16, 16), (33, 16), (10, 4), (99, 1)] {
            let blocks = 200 / bs + 8;
            let mut cache = model.new_cache(blocks, bs).unwrap();
            let mut pool = BlockPool::new(blocks, chunk as u64);
            let mut seq = Seq::new(&case.input_ids);
            let mut last = Vec::new();
            while seq.num_cached < 100 {
                let n = chunk.min(100 - seq.num_cached);
                let lf = if seq.num_cached + n == 100 {
                    LogitsFor::Last
                } else {
                    LogitsFor::None
                };
                last = step(&model, &mut cache, &mut pool, &mut [&mut seq], &[(n, lf)]);
            }
            let e = rel_err(&last[0], &case.prefill_logits[0]);
            assert!(e < TOL, "{name} chunk {chunk} block {bs}: rel err {e}");
            // And the next decode step still matches transformers.
            seq.tokens.push(case.greedy[0].token);
            let got = step(
                &model,
                &mut cache,
                &mut pool,
                &mut [&mut seq],
                &[(1, LogitsFor::Last)],
            );
            assert_eq!(argmax(&got[0]), case.greedy[1].token);
            assert!(rel_err(&got[0], &case.greedy[1].logits) < TOL);
        }
    }
}

/// All five prompts of a model run together in one cache: prefill chunks and
/// decode tokens of different sequences share steps. Each sequence must follow
/// transformers' greedy path exactly as when run alone.
#[test]
fn mixed_batch_equals_each_sequence_alone() {
    for name in MODELS {
        let model = load(name);
        let cases = golden(name);
        let mut cache = model.new_cache(128, 16).unwrap();
        let mut pool = BlockPool::new(128, 99);
        let mut seqs: Vec<Seq> = cases.iter().map(|c| Seq::new(&c.input_ids)).collect();
        // Prefill chunk size per sequence: staggered so that some decode
        // while others are still prefilling.
        let chunk = [1usize, 6, 16, 5, 24];
        let mut next_step = vec![0usize; seqs.len()];
        let mut alone_done = vec![false; seqs.len()];
        loop {
            let mut active = Vec::new();
            let mut chunks = Vec::new();
            for (i, s) in seqs.iter().enumerate() {
                if next_step[i] >= cases[i].greedy.len() {
                    continue;
                }
                let pending = s.tokens.len() - s.num_cached;
                let n = pending.min(chunk[i]);
                let lf = if n == pending {
                    LogitsFor::Last
                } else {
                    LogitsFor::None
                };
                active.push(i);
                chunks.push((n, lf));
            }
            if active.is_empty() {
                break;
            }
            let mut refs: Vec<&mut Seq> = seqs
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| active.contains(i))
                .map(|(_, s)| s)
                .collect();
            let rows = step(&model, &mut cache, &mut pool, &mut refs, &chunks);
            let mut r = rows.into_iter();
            for (&i, &(_, lf)) in active.iter().zip(&chunks) {
                if lf != LogitsFor::Last {
                    continue;
                }
                let row = r.next().unwrap();
                let want = &cases[i].greedy[next_step[i]];
                let tok = argmax(&row);
                assert_eq!(tok, want.token, "{name} seq {i} step {}", next_step[i]);
                let e = rel_err(&row, &want.logits);
                assert!(e < TOL, "{name} seq {i} step {}: rel err {e}", next_step[i]);
                seqs[i].tokens.push(tok);
                next_step[i] += 1;
                alone_done[i] = true;
            }
        }
        assert!(alone_done.iter().all(|d| *d));
    }
}

/// Batched and solo runs of the same sequences agree to float rounding
/// (for the MoE models: experts see different token groups batched and solo).
#[test]
fn batch_rows_equal_solo_rows() {
    for name in ["gqa2-untied", "qwen3moe-gqa2", "glm4moe-gqa2"] {
        let model = load(name);
        let cases = golden(name);
        let batched = batched_prefill_logits(&model, &cases);
        for (i, c) in cases.iter().enumerate() {
            let solo = chunked_prefill_logits(&model, &c.input_ids, usize::MAX);
            assert!(rel_err(&batched[i], &solo) < 1e-5, "{name} seq {i}");
        }
    }
}

/// Prefills every case's prompt in one step; the last position's logits of
/// each.
fn batched_prefill_logits(model: &Model, cases: &[Case]) -> Vec<Vec<f32>> {
    let mut cache = model.new_cache(128, 16).unwrap();
    let mut pool = BlockPool::new(128, 5);
    let mut seqs: Vec<Seq> = cases.iter().map(|c| Seq::new(&c.input_ids)).collect();
    let chunks: Vec<_> = seqs
        .iter()
        .map(|s| (s.tokens.len(), LogitsFor::Last))
        .collect();
    let mut refs: Vec<&mut Seq> = seqs.iter_mut().collect();
    step(model, &mut cache, &mut pool, &mut refs, &chunks)
}

/// Runs prompt `ids` in chunks of `chunk` tokens and returns the last
/// position's logits.
fn chunked_prefill_logits(model: &Model, ids: &[u32], chunk: usize) -> Vec<f32> {
    let mut cache = model.new_cache(32, 16).unwrap();
    let mut pool = BlockPool::new(32, chunk as u64);
    let mut seq = Seq::new(ids);
    let mut last = Vec::new();
    while seq.num_cached < ids.len() {
        let n = chunk.min(ids.len() - seq.num_cached);
        let lf = if seq.num_cached + n == ids.len() {
            LogitsFor::Last
        } else {
            LogitsFor::None
        };
        last = step(model, &mut cache, &mut pool, &mut [&mut seq], &[(n, lf)]);
    }
    last.remove(0)
}

/// With the vectorised kernels (AVX-512, AVX2) a sequence's logits are
/// bit-identical whether it runs alone or batched with others, and whether
/// its prefix was computed in the same step or came from the cache: every
/// sum has one order. Seeded sampling (`n` choices, repeats of a seeded
/// request) relies on it.
#[test]
fn logits_are_batch_invariant_with_vectorised_kernels() {
    if !vectorised_kernels() {
        eprintln!(
            "SKIPPED: the {} path hands prefill products to candle's gemm (not batch-invariant)",
            agentd_models::cpu_kernels::path()
        );
        return;
    }
    for name in MODELS {
        let model = load(name);
        let cases = golden(name);
        let batched = batched_prefill_logits(&model, &cases);
        for (i, c) in cases.iter().enumerate() {
            let whole = chunked_prefill_logits(&model, &c.input_ids, usize::MAX);
            assert!(batched[i] == whole, "{name} seq {i}: batched != alone");
            for chunk in [1, 5, 16, 17] {
                let chunked = chunked_prefill_logits(&model, &c.input_ids, chunk);
                assert!(
                    chunked == whole,
                    "{name} seq {i}: chunks of {chunk} != whole"
                );
            }
        }
    }
}
