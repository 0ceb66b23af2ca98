//! Unit tests of the engine core's step bookkeeping.

use std::sync::Arc;
use std::time::Instant;

use agentd_runtime::{SamplingParams, SequenceSampler};
use tokio::sync::mpsc;

use super::*;

fn submitted(prompt: Vec<u32>) -> (Submitted, mpsc::UnboundedReceiver<Event>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let params = SamplingParams {
        max_tokens: 4,
        ..SamplingParams::greedy()
    };
    let sub = Submitted {
        program: None,
        sampler: SequenceSampler::new(params, &prompt).expect("valid"),
        prompt,
        final_request: false,
        parent_program: None,
        cache_salt: 0,
        group: None,
        tool: None,
        tx,
        signals: Arc::new(Signals::default()),
        arrived: Instant::now(),
        released: Released::No,
        span: Span::none(),
    };
    (sub, rx)
}

/// A planned sequence whose slots vanish before its commit (nothing in
/// the engine does that today; the path must not hang the request): it
/// ends with an error instead of waiting for a sampler that never comes
/// back.
#[test]
fn a_failed_commit_ends_the_request_with_an_error() {
    let mut core = Core::new(EngineConfig {
        num_blocks: 16,
        ..EngineConfig::default()
    });
    let (sub, mut rx) = submitted((1..40).collect());
    core.accept(vec![sub]);
    let step = core.plan(0);
    assert_eq!(step.seqs.len(), 1, "the prompt is planned");
    assert!(step.seqs[0].wants_logits(), "its sampler is lent");
    let p = step.seqs[0].program;
    // The fault: the sequence loses its KV between plan and commit.
    core.replicas.pause_on(p, 0);
    core.commit(0, step.seqs, vec![None]);
    core.outbox.take().deliver();
    match rx.try_recv() {
        Ok(Event::Finished { reason, usage }) => {
            assert_eq!(reason, FinishReason::Error);
            assert_eq!(usage.prompt_tokens, 39);
        }
        other => panic!("expected the request to end, got {other:?}"),
    }
    assert_eq!(core.num_running(), 0);
    assert!(core.requests.is_empty(), "its request is gone");
    assert!(
        core.replicas.programs().is_empty(),
        "the one-off program is released"
    );
}
