//! vLLM's token-in, token-out route, `POST /inference/v1/generate`
//! (`vllm/entrypoints/scale_out/token_in_token_out/`: the data plane SkyRL's
//! `RemoteInferenceClient` generates through), and `POST
//! /finish_session?session_id=` (vllm-router's session release, which
//! SkyRL calls when a trajectory ends). The program is named by the
//! `X-Session-ID` header (or the other session headers
//! [`program_id::resolve`] reads); `finish_session` ends it.
//!
//! The request is vLLM's `GenerateRequest` ([`request`]); the response is
//! its `GenerateResponse`: `{request_id: "generate-tokens-...", model,
//! created, choices: [{index, logprobs, finish_reason, stop_reason,
//! token_ids, routed_experts}], usage, prompt_logprobs,
//! kv_transfer_params, ec_transfer_params}`, with logprobs as vLLM's
//! `_create_tokens_logprobs` writes them (tokens named `token_id:N`, the
//! sampled token first among `top_logprobs`). A stream is vLLM's: one
//! event per step with the new ids, a usage event with
//! `stream_options.include_usage`, then `data: [DONE]`. One difference:
//! the engine's finish comes after the last token's event, so the finish
//! reason usually rides on a last event of its own with no ids (vLLM puts
//! it on the event of the last ids); holding every event back one step to
//! merge them would delay each token by a decode step.

pub mod request;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, BoxStream, StreamExt};
use serde_json::{json, Value};

use self::request::TokensRequest;
use crate::app::{parse_json, SharedState};
use crate::choices::{self, Choice, ChoiceStep};
use crate::error::ApiError;
use crate::generation::{Generation, Step};
use crate::protocol::{unix_now, TokenLogprob, UsageInfo};
use crate::rl::RidGuard;
use crate::sampling::Sampling;
use crate::stop::Matched;
use crate::tenant::Caller;
use crate::{controls, program_id, prompt_logprobs, sampling, sse};

/// vLLM's clamp of `-inf` logprobs for JSON.
const MIN_LOGPROB: f32 = -9999.0;

/// What every choice of one request shares.
struct Shape {
    state: SharedState,
    request_id: String,
    created: u64,
    sampling: Sampling,
    /// `Some(k)` when the request asked for logprobs.
    logprobs: Option<u32>,
}

pub async fn generate(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: TokensRequest = parse_json(&body)?;
    state.check_model(req.model.as_deref())?;
    let mut ids = req.check(state.engine.model_config().vocab_size)?;
    let stream = req.stream.unwrap_or(false);
    let (mut common, logprobs) = req.sampling_params.to_common(stream)?;
    common.cache_salt = req.cache_salt.clone();
    let program = program_id::resolve(&common, &headers)?;
    controls::truncate(&mut ids, &common, state.max_model_len)?;
    // vLLM's `SamplingParams` defaults, not the model's generation config:
    // vLLM applies only the config's max_tokens on this route.
    let ask = sampling::Ask {
        defaults: &agentd_runtime::SamplingParams::default(),
        logprobs: logprobs.map(|k| (k, "logprobs")),
        prompt_len: ids.len(),
    };
    let sampling = sampling::for_request(&state, &common, ask)?;
    let n = choices::count(common.n, 1)?;
    // vLLM: `generate-tokens-{X-Request-Id header, else the body's, else a uuid}`.
    let base = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or(req.request_id.clone())
        .unwrap_or_else(|| state.request_id("gen"));
    let request_id = format!("generate-tokens-{base}");
    tracing::info!(program = ?program.program, prompt_tokens = ids.len(), max_tokens = sampling.params.max_tokens, n, stream, "token-in generate");
    let shape = Arc::new(Shape {
        state: state.clone(),
        request_id: request_id.clone(),
        created: unix_now(),
        sampling: sampling.clone(),
        logprobs,
    });
    let submit = vec![(ids, sampling)];
    let rid = std::slice::from_ref(&request_id);
    let choices =
        choices::submit_offloaded(&state, rid, &program, submit, n, logprobs.is_some()).await?;
    let guard = register(&state, &base, &choices);
    if stream {
        let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
        return Ok(stream_response(shape, choices, include_usage, guard));
    }
    let out = whole(&shape, choices, n).await;
    drop(guard);
    out
}

/// Registers the request's engine requests under the id the client knows
/// (the body's `request_id` or `X-Request-Id`), so that dev mode's
/// `/abort_requests {request_ids}` reaches them as it reaches vLLM's. An
/// id already in flight stays with its first request: vLLM does not refuse
/// a reused id, so neither does this route (that request is then only
/// aborted with everything else).
fn register(state: &SharedState, id: &str, choices: &[Choice]) -> Option<RidGuard> {
    let handles = choices
        .iter()
        .filter_map(|c| c.gen.abort_handle())
        .collect();
    match state.rl.register(id, handles) {
        Ok(g) => Some(g),
        Err(_) => {
            tracing::debug!(
                request_id = id,
                "request id already in flight: not registered for abort"
            );
            None
        }
    }
}

/// The whole response once every choice finished.
async fn whole(shape: &Shape, choices: Vec<Choice>, n: usize) -> Result<Response, ApiError> {
    let mut done = choices::collect_all(choices).await?;
    let prompt_logprobs = prompt_logprobs::per_prompt(&shape.state, &mut done, n).await?;
    let usage = choices::merge_usage(
        &done
            .iter()
            .map(|(_, first, d)| (*first, d.usage))
            .collect::<Vec<_>>(),
    );
    done.sort_by_key(|(index, _, _)| *index);
    let choices: Vec<Value> = done
        .iter()
        .map(|(index, _, d)| {
            let stop = stop_reason(shape, &d.token_ids, &d.text, d.reason);
            choice_json(
                shape,
                *index,
                &d.token_ids,
                &d.logprobs,
                Some(d.reason),
                stop,
            )
        })
        .collect();
    Ok(Json(json!({
        "request_id": shape.request_id,
        "model": shape.state.model_name,
        "created": shape.created,
        "choices": choices,
        "usage": usage,
        "prompt_logprobs": prompt_logprobs.into_iter().next().flatten(),
        "kv_transfer_params": Value::Null,
        "ec_transfer_params": Value::Null,
    }))
    .into_response())
}

/// One `GenerateResponseChoice` (or a stream chunk's choice: the same
/// fields, `finish_reason` null until the last).
fn choice_json(
    shape: &Shape,
    index: usize,
    ids: &[u32],
    logprobs: &[TokenLogprob],
    finish_reason: Option<&str>,
    stop_reason: Value,
) -> Value {
    json!({
        "index": index,
        "logprobs": shape.logprobs.map(|k| logprobs_json(logprobs, k)),
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "token_ids": ids,
        "routed_experts": Value::Null,
    })
}

/// vLLM's `_create_tokens_logprobs`: each token as `token_id:N`; its
/// `top_logprobs` are the first `max(k, 1)` entries of vLLM's per-step dict,
/// which holds the sampled token first, then the k best (a token already
/// in it is not repeated).
fn logprobs_json(logprobs: &[TokenLogprob], k: u32) -> Value {
    let entry = |id: u32, lp: f32| json!({"token": format!("token_id:{id}"), "logprob": lp.max(MIN_LOGPROB), "bytes": Value::Null});
    let content: Vec<Value> = logprobs
        .iter()
        .map(|l| {
            let mut top = vec![entry(l.id, l.logprob)];
            let rest = l.top_logprobs.iter().filter(|t| t.id != l.id);
            top.extend(rest.map(|t| entry(t.id, t.logprob)));
            top.truncate(k.max(1) as usize);
            json!({
                "token": format!("token_id:{}", l.id),
                "logprob": l.logprob.max(MIN_LOGPROB),
                "bytes": Value::Null,
                "top_logprobs": top,
            })
        })
        .collect();
    json!({ "content": content })
}

/// vLLM's `stop_reason`: the stop token id or stop string that ended the
/// output, `null` for EOS, a length limit or an abort.
fn stop_reason(shape: &Shape, ids: &[u32], text: &str, reason: &str) -> Value {
    if reason != "stop" {
        return Value::Null;
    }
    let eos = &shape.state.engine.model_config().eos_token_ids;
    let full = || shape.state.tokenizer.decode(ids, true).unwrap_or_default();
    match crate::stop::matched(ids, text, &shape.sampling, eos, full) {
        Matched::Token(t) => json!(t),
        Matched::Text(s) => json!(s),
        Matched::Eos(_) | Matched::Nothing => Value::Null,
    }
}

/// vLLM's stream: an event per step that produced ids (`usage` null), the
/// finish reason on the last, then the usage event when asked for, then
/// `[DONE]`.
fn stream_response(
    shape: Arc<Shape>,
    choices: Vec<Choice>,
    include_usage: bool,
    guard: Option<RidGuard>,
) -> Response {
    let streams = choices
        .into_iter()
        .map(|c| choice_stream(shape.clone(), c))
        .collect();
    let usage_shape = shape.clone();
    let usage_chunk = move |usage: UsageInfo| {
        sse::event(&json!({"request_id": usage_shape.request_id, "choices": [], "usage": usage}))
    };
    let events = choices::merge(streams, usage_chunk, include_usage).map(move |b| {
        // The id stays registered until the stream ends.
        let _ = &guard;
        b
    });
    sse::response(events)
}

/// One choice's stream state: the ids and text so far (for the stop
/// reason at the end).
struct Sofar {
    gen: Generation,
    ids: Vec<u32>,
    text: String,
}

fn choice_stream(shape: Arc<Shape>, c: Choice) -> BoxStream<'static, ChoiceStep> {
    let (index, first) = (c.index, c.first_of_prompt);
    let start = Sofar {
        gen: c.gen,
        ids: Vec::new(),
        text: String::new(),
    };
    stream::unfold(Some(start), move |st| {
        let shape = shape.clone();
        async move {
            let mut s = st?;
            let chunk = |ids: &[u32], lp: &[TokenLogprob], fin: Option<&str>, stop: Value| {
                let choice = choice_json(&shape, index, ids, lp, fin, stop);
                sse::event(&json!({"request_id": shape.request_id, "choices": [choice], "usage": Value::Null}))
            };
            match s.gen.next().await {
                Ok(Some(Step::Piece(p))) => {
                    s.text.push_str(&p.text);
                    s.ids.extend_from_slice(&p.token_ids);
                    // vLLM skips steps that brought no new ids.
                    let out = match p.token_ids.is_empty() {
                        true => Vec::new(),
                        false => vec![chunk(&p.token_ids, &p.logprobs, None, Value::Null)],
                    };
                    Some((ChoiceStep::Chunks(out), Some(s)))
                }
                Ok(Some(Step::Finished {
                    piece,
                    reason,
                    usage,
                })) => {
                    s.text.push_str(&piece.text);
                    s.ids.extend_from_slice(&piece.token_ids);
                    let stop = stop_reason(&shape, &s.ids, &s.text, reason);
                    let last = chunk(&piece.token_ids, &piece.logprobs, Some(reason), stop);
                    let step = ChoiceStep::Finished {
                        chunks: vec![last],
                        usage,
                        first_of_prompt: first,
                    };
                    Some((step, None))
                }
                Ok(None) => None,
                Err(e) => {
                    tracing::warn!(error = %e, "token-in generate stream failed");
                    Some((ChoiceStep::Failed(sse::event(&e.body())), None))
                }
            }
        }
    })
    .boxed()
}

/// `POST /finish_session?session_id=ID`: ends the program `ID` (its
/// requests cancelled, its KV freed, its tool resources reclaimed) as
/// `/programs/release` does. An unknown or already finished session is not
/// an error (the release is idempotent, as vllm-router's is: SkyRL calls it
/// from every trajectory's cleanup): 200 with `released: false`.
pub async fn finish_session(
    State(state): State<SharedState>,
    RawQuery(q): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let pairs = super::vllm_dev::query_pairs(q.as_deref())?;
    let id = super::vllm_dev::param(&pairs, "session_id")
        .ok_or_else(|| {
            ApiError::invalid("session_id", "the session_id query parameter is required")
        })?
        .to_string();
    program_id::check(&id)
        .map_err(|_| ApiError::invalid("session_id", "session_id must be 1 to 256 bytes long"))?;
    let key = Caller::current().program_key(&id);
    let released = super::programs::end(&state, &key);
    tracing::info!(session = %id, released, "finish_session");
    Ok(Json(
        json!({"status": "ok", "session_id": id, "released": released}),
    ))
}
