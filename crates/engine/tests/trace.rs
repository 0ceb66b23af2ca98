//! The trace of multi-turn programs through the real engine (the tiny
//! random-weight Qwen3 fixture, real workers, real KV pool): printed by
//! the fmt subscriber (`cargo test -p agentd-engine --test trace --
//! --nocapture` shows it) and captured by a layer that keeps every span,
//! event and `follows_from` link, so the test can check that each request
//! span carries its queueing, admission, pause, restore and end, and that
//! the step spans follow from the requests they ran.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use agentd_engine::{Engine, EngineConfig, Event, GenerateRequest, PauseMode, TRACE_TARGET};
use agentd_models::Model;
use agentd_runtime::SamplingParams;
use agentd_scheduler::{PolicyKind, SchedulerConfig};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Level, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// A span as created, with its fields as recorded since.
#[derive(Debug)]
struct SpanRec {
    name: &'static str,
    fields: HashMap<String, String>,
}

#[derive(Debug)]
struct EventRec {
    /// The serial number of its span.
    span: Option<usize>,
    message: String,
    fields: HashMap<String, String>,
}

#[derive(Debug, Default)]
struct Captured {
    spans: Vec<SpanRec>,
    /// `(span, followed)` by serial number.
    links: Vec<(usize, usize)>,
    events: Vec<EventRec>,
}

/// Span ids are reused once a span closes; each span gets a serial number
/// of its own in its extensions.
struct Serial(usize);

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Captured>>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
}

impl Capture {
    fn lock(&self) -> std::sync::MutexGuard<'_, Captured> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn serial<S: Subscriber + for<'a> LookupSpan<'a>>(ctx: &Context<'_, S>, id: &Id) -> Option<usize> {
    ctx.span(id)?.extensions().get::<Serial>().map(|s| s.0)
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        let mut c = self.lock();
        let n = c.spans.len();
        c.spans.push(SpanRec {
            name: attrs.metadata().name(),
            fields,
        });
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Serial(n));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(n) = serial(&ctx, id) {
            values.record(&mut Fields(&mut self.lock().spans[n].fields));
        }
    }

    fn on_follows_from(&self, id: &Id, follows: &Id, ctx: Context<'_, S>) {
        if let (Some(a), Some(b)) = (serial(&ctx, id), serial(&ctx, follows)) {
            self.lock().links.push((a, b));
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let mut fields = HashMap::new();
        event.record(&mut Fields(&mut fields));
        let message = fields.remove("message").unwrap_or_default();
        let span = ctx
            .event_span(event)
            .and_then(|s| s.extensions().get::<Serial>().map(|s| s.0));
        self.lock().events.push(EventRec {
            span,
            message,
            fields,
        });
    }
}

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/golden/gqa2-untied")
}

fn request(program: &str, prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        program: Some(program.to_string()),
        prompt,
        sampling: SamplingParams {
            max_tokens,
            ignore_eos: true,
            ..SamplingParams::greedy()
        },
        ..GenerateRequest::default()
    }
}

fn tokens(mut s: agentd_engine::RequestStream) -> Vec<u32> {
    let mut out = Vec::new();
    while let Some(e) = s.blocking_next() {
        match e {
            Event::Token(t) => out.push(t.token_id),
            Event::Finished { .. } => return out,
        }
    }
    panic!("stream ended without Finished");
}

/// Four programs of two turns each; in the first, they outgrow a pool of
/// 14 blocks (224 tokens; each needs 7 for 20 + 90 tokens), so some are
/// paused mid-request and restored; the second turns reuse their KV.
fn run_programs(e: &Engine) {
    let prompts: Vec<Vec<u32>> = (0..4u32)
        .map(|k| (0..20).map(|i| (i * 13 + k * 101) % 500).collect())
        .collect();
    let turn = |prompts: &[Vec<u32>], max_tokens| -> Vec<Vec<u32>> {
        let streams: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(k, p)| e.submit(request(&format!("t{k}"), p.clone(), max_tokens)))
            .collect();
        streams
            .into_iter()
            .map(|s| tokens(s.expect("accepted")))
            .collect()
    };
    let first = turn(&prompts, 90);
    let next: Vec<Vec<u32>> = prompts
        .iter()
        .zip(&first)
        .map(|(p, g)| [p.as_slice(), g.as_slice(), &[7, 8, 9][..]].concat())
        .collect();
    turn(&next, 4);
}

/// A trainer's `pause_generation` in `retract` mode while a request runs
/// (program `rl`), then resume. The request must be running when the pause
/// lands (a step of the fixture takes well under a millisecond), so it is
/// tried until the pause finds it held.
fn retract_one(e: &Engine) {
    for attempt in 0..20 {
        let prompt: Vec<u32> = (0..20).map(|i| (i * 7 + attempt) % 500).collect();
        let mut s = e.submit(request("rl", prompt, 100)).expect("accepted");
        assert!(matches!(s.blocking_next(), Some(Event::Token(_))));
        let held = e.pause(PauseMode::Retract);
        e.resume();
        let rest = tokens(s);
        if held > 0 {
            assert!(!rest.is_empty(), "the retracted request goes on");
            return;
        }
    }
    panic!("no pause found the request running");
}

#[test]
fn a_multi_turn_programs_trace_shows_queue_admission_pauses_and_steps() {
    let capture = Capture::default();
    let only_trace = || Targets::new().with_target(TRACE_TARGET, Level::INFO);
    let subscriber = tracing_subscriber::registry()
        .with(capture.clone().with_filter(only_trace()))
        .with(
            tracing_subscriber::fmt::layer()
                .with_test_writer()
                .with_ansi(false)
                .with_span_events(FmtSpan::CLOSE)
                .with_filter(only_trace()),
        );
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");

    let cfg = EngineConfig {
        num_blocks: 14,
        block_size: 16,
        max_num_batched_tokens: 64,
        scheduler: SchedulerConfig {
            policy: PolicyKind::Program,
            ..SchedulerConfig::default()
        },
        ..EngineConfig::default()
    };
    let e = Engine::with_model(Arc::new(Model::load(&fixture()).expect("model")), cfg)
        .expect("engine starts");
    run_programs(&e);
    let m = e.snapshot_blocking().metrics.clone();
    retract_one(&e);
    drop(e); // the workers stop: every span is closed, every mark emitted

    let c = capture.lock();
    let requests: Vec<usize> = (0..c.spans.len())
        .filter(|&i| c.spans[i].name == "request")
        .collect();
    assert!(requests.len() >= 9, "one span per request");
    let events_of = |span: usize| -> Vec<&EventRec> {
        c.events.iter().filter(|e| e.span == Some(span)).collect()
    };
    let names =
        |span: usize| -> Vec<&str> { events_of(span).iter().map(|e| e.message.as_str()).collect() };
    for &r in &requests {
        let f = &c.spans[r].fields;
        let ev = names(r);
        assert!(f.contains_key("prompt_tokens"), "{f:?}");
        assert_eq!(
            f.get("finish_reason").map(String::as_str),
            Some("length"),
            "{f:?}"
        );
        assert_eq!(ev.iter().filter(|n| **n == "admitted").count(), 1, "{ev:?}");
        assert_eq!(ev.last(), Some(&"finished"), "{ev:?}");
        // Every request ran in steps that follow from it.
        let steps = c.links.iter().filter(|(_, to)| *to == r).count();
        assert!(steps > 0, "request {f:?} linked from no step");
    }
    // Each program's trace: two requests, the first queued (a new program
    // waits for the policy's admission), the second admitted with what of
    // its first turn's KV survived the others (all of it for some).
    let mut reused = Vec::new();
    for k in 0..4 {
        let program = format!("t{k}");
        let mine: Vec<usize> = requests
            .iter()
            .copied()
            .filter(|&r| c.spans[r].fields.get("program") == Some(&program))
            .collect();
        assert_eq!(mine.len(), 2, "{program}: two turns");
        assert_eq!(names(mine[0]).first(), Some(&"queued"), "{program}");
        let admitted = |r: usize| -> usize {
            events_of(r)
                .iter()
                .find(|e| e.message == "admitted")
                .and_then(|e| e.fields.get("cached_tokens")?.parse().ok())
                .expect("admitted with cached_tokens")
        };
        reused.push(admitted(mine[1]));
        assert_eq!(
            c.spans[mine[1]]
                .fields
                .get("completion_tokens")
                .map(String::as_str),
            Some("4")
        );
    }
    assert!(
        reused.iter().any(|&n| n >= 96),
        "cached at turn 2: {reused:?}"
    );
    // Pressure paused someone mid-request; that request shows the pause
    // with its cause, then the restore, then more steps, then its end.
    assert!(m.pauses() > 0 && m.restores > 0, "{m:?}");
    let paused: Vec<usize> = requests
        .iter()
        .copied()
        .filter(|&r| names(r).contains(&"paused"))
        .collect();
    assert!(!paused.is_empty(), "a request shows its pause");
    for &r in &paused {
        let ev = events_of(r);
        let at = |name: &str| ev.iter().position(|e| e.message == name).expect(name);
        assert!(at("admitted") < at("paused") && at("paused") < at("restored"));
        let cause = ev[at("paused")].fields.get("cause").expect("a cause");
        assert_eq!(ev[at("restored")].fields.get("cause"), Some(cause));
        assert!([
            "kv_exhausted",
            "thrashing",
            "work_conserving",
            "overdue",
            "policy",
            "retracted"
        ]
        .contains(&cause.as_str()));
    }
    // The trainer's retract: the request it found running shows the pause
    // with cause `retracted` and its restore after the resume.
    let rl = requests
        .iter()
        .copied()
        .rfind(|&r| c.spans[r].fields.get("program").map(String::as_str) == Some("rl"))
        .expect("the retracted request's span");
    let ev = events_of(rl);
    let at = |name: &str| ev.iter().position(|e| e.message == name).expect(name);
    assert!(at("admitted") < at("paused") && at("paused") < at("restored"));
    for name in ["paused", "restored"] {
        let cause = ev[at(name)].fields.get("cause").map(String::as_str);
        assert_eq!(cause, Some("retracted"), "{name}: {ev:?}");
    }
    // Step spans: one per step, each following from the requests of its batch.
    let steps: Vec<usize> = (0..c.spans.len())
        .filter(|&i| c.spans[i].name == "step")
        .collect();
    assert!(steps.len() > 90, "{} steps", steps.len());
    for &s in &steps {
        let batch: usize = c.spans[s].fields["batch"].parse().expect("batch");
        let linked = c.links.iter().filter(|(from, _)| *from == s).count();
        assert_eq!(linked, batch, "a link per sequence of the batch");
        assert!(c.spans[s].fields.contains_key("prefill_tokens"));
        assert!(c.spans[s].fields.contains_key("decode_tokens"));
    }
}
