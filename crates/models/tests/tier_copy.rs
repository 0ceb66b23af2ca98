//! The host tier's copies carried out beside the forward
//! (`StepRunner::step_after_copies` on the CPU runner: a copy thread hands
//! each layer back as the forward reaches it) give exactly what copying
//! first and then stepping gives, on every golden family; and a bad copy
//! or a bad batch leaves the cache whole.

mod common;

use std::sync::Arc;

use agentd_kv::{BlockCopy, BlockId};
use agentd_models::runner::{LoadedModel, StepRunner};
use agentd_models::{BatchBuilder, LogitsFor, Model};

const BS: usize = 4;
const BLOCKS: usize = 32;
const HOST: usize = 16;

fn runner(model: &Arc<Model>) -> Box<dyn StepRunner> {
    let mut r = model
        .clone()
        .runner("tier-copy", BLOCKS, BS, 2)
        .expect("runner");
    r.enable_host_tier(HOST).expect("host tier");
    r
}

fn batch(tokens: &[u32], cached: usize, table: &[u32]) -> agentd_models::BatchInput {
    let mut b = BatchBuilder::new(BS);
    b.push(tokens, cached, table, LogitsFor::Last);
    b.build()
}

fn off(device: u32, host: u32) -> BlockCopy {
    BlockCopy::Offload {
        device: BlockId(device),
        host,
    }
}

fn on(host: u32, device: u32) -> BlockCopy {
    BlockCopy::Onload {
        host,
        device: BlockId(device),
    }
}

/// A prompt of 11 tokens in blocks 5, 9, 2.
fn prefill(r: &mut dyn StepRunner, prompt: &[u32]) -> Vec<Vec<f32>> {
    let logits = r.step(&batch(prompt, 0, &[5, 9, 2])).expect("prefill");
    logits.to_rows().expect("rows")
}

#[test]
fn copies_beside_the_forward_equal_copies_before_it() {
    for name in common::MODELS {
        let model = Arc::new(common::load(name));
        let prompt: Vec<u32> = (0..11).map(|i| (7 + 13 * i) % 100).collect();
        let (mut beside, mut before) = (runner(&model), runner(&model));
        assert_eq!(
            prefill(beside.as_mut(), &prompt),
            prefill(before.as_mut(), &prompt)
        );
        // The program is paused: its blocks go to the host tier, and block
        // 9 is reused by someone else (restored into from slot 7, which a
        // copy earlier in the list wrote: order matters).
        let out = [off(5, 0), off(9, 1), off(2, 2), off(2, 7), on(7, 9)];
        // Restored into other blocks (20, 21, 22), with one decode token in
        // block 22: the forward reads every restored block.
        let back = [on(0, 20), on(1, 21), on(2, 22)];
        let next = batch(&[42], 11, &[20, 21, 22]);
        let mut copies = out.to_vec();
        copies.extend(back);
        let got = beside
            .step_after_copies(&copies, &next)
            .expect("beside")
            .to_rows()
            .unwrap();
        before.copy_blocks(&copies).expect("copies");
        let want = before.step(&next).expect("step").to_rows().unwrap();
        assert_eq!(got, want, "{name}");
        // And what a cache that never paused computes.
        let mut resident = runner(&model);
        prefill(resident.as_mut(), &prompt);
        let stay = resident
            .step(&batch(&[42], 11, &[5, 9, 2]))
            .expect("step")
            .to_rows()
            .unwrap();
        assert_eq!(got, stay, "{name}: the restored context is the same");
    }
}

#[test]
fn a_bad_copy_or_batch_leaves_the_cache_whole() {
    let model = Arc::new(common::load("gqa2-untied"));
    let prompt: Vec<u32> = (0..11).map(|i| (3 + 17 * i) % 100).collect();
    let (mut beside, mut before) = (runner(&model), runner(&model));
    prefill(beside.as_mut(), &prompt);
    prefill(before.as_mut(), &prompt);
    let next = batch(&[42], 11, &[5, 9, 2]);
    // A host slot past the tier: refused before anything is copied.
    let Err(err) = beside.step_after_copies(&[off(5, 0), off(9, HOST as u32)], &next) else {
        panic!("a host slot past the tier was accepted");
    };
    assert!(err.to_string().contains("block id"), "{err}");
    // A batch the model refuses (a token past the vocabulary): the copies
    // are done, as they would be before a failed step, and every layer is
    // back in the cache.
    let bad = batch(&[u32::MAX], 11, &[5, 9, 2]);
    assert!(beside.step_after_copies(&[off(5, 3)], &bad).is_err());
    before.copy_blocks(&[off(5, 3)]).unwrap();
    // Both then restore from slot 3 and step alike.
    let again = [on(3, 30)];
    let after = batch(&[42], 11, &[30, 9, 2]);
    let got = beside.step_after_copies(&again, &after).unwrap().to_rows();
    before.copy_blocks(&again).unwrap();
    let want = before.step(&after).unwrap().to_rows();
    assert_eq!(got.unwrap(), want.unwrap());
    // Without a tier, copies are refused and the runner still steps.
    let mut bare = model.clone().runner("bare", BLOCKS, BS, 2).unwrap();
    assert!(bare.step_after_copies(&[off(5, 0)], &next).is_err());
    prefill(bare.as_mut(), &prompt);
    assert!(bare.step_after_copies(&[], &next).is_ok());
}
