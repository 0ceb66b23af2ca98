//! The engine announces each named program's end with its reason (release
//! call, `final` request, inactivity lease), once, so that callers can
//! reclaim what they tied to it; one-off programs are not announced.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentd_engine::{EndReason, Engine, EngineConfig, Event, GenerateRequest, ProgramEnded};
use agentd_models::Model;
use agentd_runtime::SamplingParams;
use agentd_scheduler::SchedulerConfig;
use tokio::sync::mpsc::UnboundedReceiver;

fn engine(lease_s: f64) -> Engine {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/golden/gqa2-untied");
    let cfg = EngineConfig {
        num_blocks: 128,
        block_size: 16,
        max_num_batched_tokens: 64,
        scheduler: SchedulerConfig {
            lease_s,
            ..SchedulerConfig::default()
        },
        ..EngineConfig::default()
    };
    Engine::with_model(Arc::new(Model::load(&dir).expect("model")), cfg).expect("engine starts")
}

/// Runs one request to its end.
fn run(e: &Engine, program: Option<&str>, final_request: bool) {
    let mut s = e
        .submit(GenerateRequest {
            program: program.map(str::to_string),
            prompt: (1..20).collect(),
            sampling: SamplingParams {
                max_tokens: 2,
                ignore_eos: true,
                ..SamplingParams::greedy()
            },
            final_request,
            parent_program: None,
            cache_salt: 0,
            group: None,
            tool: None,
        })
        .expect("submitted");
    while let Some(ev) = s.blocking_next() {
        if matches!(ev, Event::Finished { .. }) {
            return;
        }
    }
    panic!("stream ended without Finished");
}

/// The next end announced within `within`, as (id, reason); checks its
/// timestamp is not in the future.
fn next_end(rx: &mut UnboundedReceiver<ProgramEnded>, within: Duration) -> Option<Ended> {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Ok(ev) = rx.try_recv() {
            assert!(ev.at <= std::time::Instant::now());
            return Some(Ended {
                id: ev.id,
                reason: ev.reason,
            });
        }
        if std::time::Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Ended {
    id: String,
    reason: EndReason,
}

#[test]
fn release_and_final_are_announced_once_with_their_reason() {
    let e = engine(1800.0);
    let mut rx = e.subscribe_ended();
    let mut rx2 = e.subscribe_ended();
    run(&e, Some("a"), false);
    assert_eq!(
        next_end(&mut rx, Duration::from_millis(200)),
        None,
        "a is still alive"
    );
    assert!(e.release("a"));
    let end = Ended {
        id: "a".into(),
        reason: EndReason::Released,
    };
    assert_eq!(next_end(&mut rx, Duration::from_secs(5)), Some(end.clone()));
    assert_eq!(
        next_end(&mut rx2, Duration::from_secs(5)),
        Some(end),
        "every subscriber hears it"
    );
    assert!(!e.release("a"));

    run(&e, Some("b"), true);
    assert_eq!(
        next_end(&mut rx, Duration::from_secs(5)),
        Some(Ended {
            id: "b".into(),
            reason: EndReason::Final
        })
    );
    // A one-off program has no name to announce.
    run(&e, None, false);
    drop(rx2);
    run(&e, Some("c"), true);
    assert_eq!(
        next_end(&mut rx, Duration::from_secs(5)).map(|x| x.id),
        Some("c".into())
    );
    assert_eq!(
        next_end(&mut rx, Duration::from_millis(200)),
        None,
        "nothing else ended"
    );
}

#[test]
fn lease_expiry_is_announced() {
    let e = engine(0.3);
    let mut rx = e.subscribe_ended();
    run(&e, Some("idle"), false);
    assert_eq!(
        next_end(&mut rx, Duration::from_secs(10)),
        Some(Ended {
            id: "idle".into(),
            reason: EndReason::LeaseExpired
        })
    );
    assert!(e.snapshot_blocking().programs.is_empty());
}

#[test]
fn a_final_parallel_request_ends_its_program_as_final_once() {
    let e = engine(1800.0);
    let mut rx = e.subscribe_ended();
    let submit = |max_tokens: usize, final_request: bool| {
        e.submit(GenerateRequest {
            program: Some("par".into()),
            prompt: (1..30).collect(),
            sampling: SamplingParams {
                max_tokens,
                ignore_eos: true,
                ..SamplingParams::greedy()
            },
            final_request,
            parent_program: None,
            cache_salt: 0,
            group: None,
            tool: None,
        })
        .expect("submitted")
    };
    let mut main = submit(40, false);
    // Runs beside the busy main request, as a sibling; when it ends the
    // program ends with it.
    let mut last = submit(2, true);
    for s in [&mut last, &mut main] {
        while let Some(ev) = s.blocking_next() {
            if matches!(ev, Event::Finished { .. }) {
                break;
            }
        }
    }
    assert_eq!(
        next_end(&mut rx, Duration::from_secs(5)),
        Some(Ended {
            id: "par".into(),
            reason: EndReason::Final
        })
    );
    assert_eq!(
        next_end(&mut rx, Duration::from_millis(200)),
        None,
        "announced once"
    );
}
