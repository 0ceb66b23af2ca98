//! The row plan against the rules and the host sampler: the edited row to
//! the bit by a plain statement of the rules, the same greedy tokens and
//! logprobs, draws inside the host's candidate set and with the softmax's
//! frequencies.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::sampling::{SequenceSampler, TokenControls};

/// Random logits with ties and a spread like a model's.
fn row(rng: &mut ChaCha8Rng, vocab: usize) -> Vec<f32> {
    (0..vocab)
        .map(|_| (rng.gen_range(-40..40) as f32) * 0.25)
        .collect()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
}

fn params_with_everything(temperature: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        seed: Some(5),
        repetition_penalty: 1.3,
        presence_penalty: 0.4,
        frequency_penalty: 0.2,
        stop_token_ids: vec![3],
        logprobs: Some(4),
        max_tokens: 64,
        controls: TokenControls {
            logit_bias: vec![(7, 2.5), (11, -1.0), (500, 3.0)],
            bad_words: vec![vec![5, 6], vec![9]],
            min_tokens: 4,
            allowed_token_ids: Some((0..48).filter(|t| t % 5 != 2).collect()),
        },
        ..SamplingParams::default()
    }
}

#[test]
fn philox_matches_random123_known_answers() {
    assert_eq!(
        philox4x32_10([0; 4], 0),
        [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
    );
    assert_eq!(
        philox4x32_10(
            [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
            0x299f_31d0_a409_3822
        ),
        [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
    );
}

/// The edited row by the rules as vLLM states them, written out plainly:
/// the oracle for the one implementation ([`RowPlan::edit`], which the
/// host sampler and the device kernel both follow). `out`: tokens
/// generated so far.
fn by_the_rules(
    p: &SamplingParams,
    prompt: &[u32],
    out: &[u32],
    logits: &[f32],
    eos: &[u32],
) -> Vec<f32> {
    let c = &p.controls;
    let mut r = logits.to_vec();
    let ban = |r: &mut Vec<f32>, t: u32| {
        if let Some(x) = r.get_mut(t as usize) {
            *x = f32::NEG_INFINITY;
        }
    };
    if let Some(allowed) = &c.allowed_token_ids {
        for t in 0..r.len() as u32 {
            if !allowed.contains(&t) {
                ban(&mut r, t);
            }
        }
    }
    for word in &c.bad_words {
        if let Some((&last, prefix)) = word.split_last() {
            if out.ends_with(prefix) {
                ban(&mut r, last);
            }
        }
    }
    for &(t, b) in &c.logit_bias {
        if let Some(x) = r.get_mut(t as usize) {
            *x += b;
        }
    }
    if out.len() < c.min_tokens {
        for &t in p.stop_token_ids.iter().chain(eos) {
            ban(&mut r, t);
        }
    }
    for (t, x) in r.iter_mut().enumerate() {
        let t = t as u32;
        let count = out.iter().filter(|&&o| o == t).count();
        if (prompt.contains(&t) || count > 0) && p.repetition_penalty != 1.0 {
            *x = if *x > 0.0 {
                *x / p.repetition_penalty
            } else {
                *x * p.repetition_penalty
            };
        }
        if count > 0 {
            *x -= p.frequency_penalty * count as f32 + p.presence_penalty;
        }
    }
    r
}

#[test]
fn the_edited_row_follows_the_rules_on_host_and_plan() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let vocab = 64;
    let prompt = [1, 2, 5, 7, 7, 40];
    let eos = [4];
    let p = params_with_everything(0.0);
    let mut host = SequenceSampler::new(p.clone(), &prompt).unwrap();
    let mut dev = host.clone();
    let mut out = Vec::new();
    for step in 0..24 {
        let logits = row(&mut rng, vocab);
        let want = by_the_rules(&p, &prompt, &out, &logits, &eos);
        let got_host = host.edited(&logits, &eos).unwrap().unwrap();
        assert!(
            same_bits(&got_host, &want),
            "step {step}: {got_host:?} vs {want:?}"
        );
        let plan = dev.plan_row(vocab, &eos).unwrap();
        assert_eq!(plan.draw, step);
        let mut got = logits.clone();
        plan.edit(&mut got);
        assert!(same_bits(&got, &want), "step {step}: {got:?} vs {want:?}");
        let a = host.sample(&logits, &eos).unwrap();
        let b = dev
            .accept(draw_planned(&logits, &plan).unwrap(), &eos)
            .unwrap();
        assert_eq!(a, b, "step {step}");
        out.push(a.token_id);
    }
}

#[test]
fn greedy_rows_agree_with_the_host_sampler_for_every_control() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let cases = [
        SamplingParams::greedy(),
        SamplingParams {
            repetition_penalty: 1.8,
            ..SamplingParams::greedy()
        },
        SamplingParams {
            frequency_penalty: 1.5,
            presence_penalty: 0.5,
            logprobs: Some(3),
            ..SamplingParams::greedy()
        },
        params_with_everything(0.0),
    ];
    for (n, p) in cases.into_iter().enumerate() {
        let mut host = SequenceSampler::new(p, &[0, 9, 12]).unwrap();
        let mut dev = host.clone();
        for _ in 0..40 {
            let logits = row(&mut rng, 50);
            let a = host.sample(&logits, &[4]).unwrap();
            let plan = dev.plan_row(50, &[4]).unwrap();
            let b = dev.accept(draw_planned(&logits, &plan).unwrap(), &[4]);
            assert_eq!(a, b.unwrap(), "case {n}");
        }
    }
}

#[test]
fn draws_stay_in_the_host_candidate_set() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for (top_k, top_p, min_p) in [(3, 1.0, 0.0), (0, 0.6, 0.0), (0, 1.0, 0.3), (10, 0.9, 0.05)] {
        let p = SamplingParams {
            temperature: 0.8,
            top_k,
            top_p,
            min_p,
            seed: Some(9),
            ..SamplingParams::default()
        };
        let mut s = SequenceSampler::new(p.clone(), &[]).unwrap();
        for _ in 0..200 {
            let logits = row(&mut rng, 80);
            let m = max(&logits);
            let kept: Vec<u32> = select::kept(&logits, m, 1.0 / 0.8, &p)
                .iter()
                .map(|c| c.idx)
                .collect();
            let plan = s.plan_row(80, &[]).unwrap();
            let d = draw_planned(&logits, &plan).unwrap();
            assert!(kept.contains(&d.token), "{} not in {kept:?}", d.token);
            s.accept(d, &[]).unwrap();
        }
    }
}

/// Frequencies over 40,000 draws within 4.5 standard deviations of the
/// (filtered, renormalised) softmax at temperature 0.7.
#[test]
fn gumbel_draws_follow_the_softmax() {
    let logits = [1.0f32, 0.5, 0.0, -0.5, -1.0, -2.0, f32::NEG_INFINITY, 0.25];
    for top_k in [0u32, 3] {
        let mut plan = RowPlan {
            temperature: 0.7,
            top_k,
            seed: 77,
            ..RowPlan::greedy()
        };
        let n = 40_000u64;
        let mut counts = [0u64; 8];
        for d in 0..n {
            plan.draw = d;
            counts[draw_planned(&logits, &plan).unwrap().token as usize] += 1;
        }
        let mut order: Vec<usize> = (0..8).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let keep = if top_k == 0 { 8 } else { top_k as usize };
        let w: Vec<f64> = (0..8)
            .map(|i| {
                if order[..keep].contains(&i) {
                    ((logits[i] - 1.0) as f64 / 0.7).exp()
                } else {
                    0.0
                }
            })
            .collect();
        let z: f64 = w.iter().sum();
        for i in 0..8 {
            let p = w[i] / z;
            let sd = (n as f64 * p * (1.0 - p)).sqrt().max(1.0);
            let dev = (counts[i] as f64 - n as f64 * p).abs();
            assert!(
                dev <= 4.5 * sd,
                "top_k {top_k}: token {i} drawn {} times, expected {:.0}",
                counts[i],
                n as f64 * p
            );
        }
    }
}

#[test]
fn a_seed_and_draw_index_fix_the_draw() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let logits = row(&mut rng, 200);
    let plan = |seed, draw| RowPlan {
        temperature: 1.0,
        seed,
        draw,
        ..RowPlan::greedy()
    };
    let tok = |p: &RowPlan| draw_planned(&logits, p).unwrap().token;
    assert_eq!(tok(&plan(1, 0)), tok(&plan(1, 0)));
    let by_draw: std::collections::HashSet<u32> = (0..50).map(|d| tok(&plan(1, d))).collect();
    assert!(by_draw.len() > 5, "{by_draw:?}");
}

#[test]
fn edits_merge_per_token_and_masks_combine() {
    let e = |t, bias: Option<f32>, banned| Edit {
        bias,
        banned,
        ..Edit::new(t)
    };
    let merged = merge_edits(
        vec![
            e(9, Some(1.0), false),
            e(2, None, true),
            e(9, Some(0.5), false),
            e(70, Some(1.0), false),
            Edit {
                seen: true,
                count: 2,
                ..Edit::new(9)
            },
        ],
        64,
    );
    assert_eq!(merged.len(), 2);
    assert_eq!(merged[0], e(2, None, true));
    assert_eq!(
        merged[1],
        Edit {
            bias: Some(1.5),
            seen: true,
            count: 2,
            ..Edit::new(9)
        }
    );
    let a = words_allowing(&[0, 33, 63, 64], 64);
    assert_eq!(a, [1, 0x8000_0002]);
    let b = words_allowing(&[33, 40], 64);
    let both = and_words(&a, &b);
    assert!(allows(Some(&both), 33) && !allows(Some(&both), 40) && !allows(Some(&both), 0));
    assert!(!allows(Some(&both), 64) && allows(None, 1_000_000));
}

#[test]
fn rows_and_plans_must_pair() {
    let logits = Logits::from_flat(vec![0.0, 1.0, 2.0, 0.5, 0.4, 0.3], 3).unwrap();
    let drawn = draw_rows(&logits, &[RowPlan::greedy(), RowPlan::greedy()]).unwrap();
    assert_eq!(drawn.iter().map(|d| d.token).collect::<Vec<_>>(), [2, 0]);
    assert!(draw_rows(&logits, &[RowPlan::greedy()]).is_err());
    assert!(draw_planned(&[], &RowPlan::greedy()).is_err());
}
