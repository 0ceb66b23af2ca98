//! SGLang's `POST /generate` on the engine path the OpenAI routes use
//! (`choices::submit`: program, group of the `n` samples, cache salt):
//! `text` or `input_ids`, one prompt or a batch; the response is SGLang's
//! `{text, output_ids, meta_info}` (a list for a batch or `n > 1`), and a
//! stream is SGLang's default (non-incremental) SSE: every event carries
//! the text and ids so far, then `data: [DONE]`.

use std::sync::Arc;
use std::time::Instant;

use agentd_runtime::PromptLogprob;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, BoxStream, StreamExt};
use serde_json::{json, Value};

use super::logprobs;
use super::request::{sglang_names, GenerateBody, IdsSpec, OneOrMany};
use crate::app::{parse_json, SharedState};
use crate::choices::{self, Choice};
use crate::error::ApiError;
use crate::generation::{Generation, Step};
use crate::protocol::{CommonParams, TokenLogprob, UsageInfo};
use crate::rl::RidGuard;
use crate::sampling::Sampling;
use crate::stop::Matched;
use crate::{program_id, sampling, sse};

/// One prompt of the request, ready to submit.
struct Item {
    ids: Vec<u32>,
    sampling: Sampling,
    /// `Some(k)` when `return_logprob` (k = `top_logprobs_num`).
    top: Option<u32>,
    /// The first prompt position whose logprob is reported
    /// ([`logprobs::start`]).
    start: usize,
    skip_special: bool,
    rid: String,
    /// The sampling dict's `n` (every prompt of a batch must agree).
    n: u64,
}

/// What every output of the request shares.
struct Shape {
    items: Vec<Item>,
    n: usize,
    /// A batch (a list of prompts) or `n > 1`: the response is a list and
    /// stream events carry `index`.
    listed: bool,
    text_in_logprobs: bool,
    started: Instant,
    state: SharedState,
}

pub async fn generate(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let req: GenerateBody = parse_json(&body)?;
    req.check_unsupported()?;
    let common = CommonParams {
        program_id: req.program_id.clone().or(req.session_id.clone()),
        cache_salt: req.extra_key.clone(),
        ..CommonParams::default()
    };
    let program = program_id::resolve(&common, &headers)?;
    // Tokenizing text prompts is CPU work: off the runtime.
    let (req, items, batch) = {
        let state = state.clone();
        crate::offload::run(move || {
            let (prompts, batch) = prompts(&state, &req)?;
            let items = items(&state, &req, prompts)?;
            Ok((req, items, batch))
        })
        .await?
    };
    let n = same_n(&items)?;
    let n = choices::count(Some(n), items.len())?;
    let submit = items
        .iter()
        .map(|i| (i.ids.clone(), i.sampling.clone()))
        .collect();
    let logprobs = items.iter().any(|i| i.top.is_some());
    tracing::info!(program = ?program.program, prompts = items.len(), n, stream = req.stream, "generate");
    let rids: Vec<String> = items.iter().map(|i| i.rid.clone()).collect();
    let mut choices =
        choices::submit_offloaded(&state, &rids, &program, submit, n, logprobs).await?;
    for c in &mut choices {
        if items.get(c.index / n).is_some_and(|i| !i.skip_special) {
            c.gen.keep_special_tokens();
        }
    }
    let guards = register(&state, &items, &choices, n)?;
    let shape = Arc::new(Shape {
        listed: batch || n > 1,
        items,
        n,
        text_in_logprobs: req.return_text_in_logprobs,
        started,
        state,
    });
    if req.stream {
        return Ok(stream_response(shape, choices, guards));
    }
    let mut done = choices::collect_all(choices).await?;
    drop(guards);
    let mut inputs: Vec<Option<logprobs::Input>> = vec![None; shape.items.len()];
    for (index, _, d) in done.iter_mut() {
        if let Some(entries) = d.prompt_logprobs.take() {
            let p = *index / shape.n;
            inputs[p] = Some(input_of(&shape, p, entries).await?);
        }
    }
    let mut outs: Vec<Value> = done
        .into_iter()
        .map(|(index, _, d)| {
            let mut out = Output::new(&shape, index);
            out.text = d.text;
            out.ids = d.token_ids;
            out.logprobs = d.logprobs;
            out.input = inputs[index / shape.n].clone();
            out.json(&shape, Some((d.reason, d.usage)), 0)
        })
        .collect();
    if shape.listed {
        return Ok(Json(Value::Array(outs)).into_response());
    }
    Ok(Json(outs.pop().unwrap_or(Value::Null)).into_response())
}

/// The prompts' token ids, and whether the request is a batch.
fn prompts(state: &SharedState, req: &GenerateBody) -> Result<(Vec<Vec<u32>>, bool), ApiError> {
    let encode = |t: &String| -> Result<Vec<u32>, ApiError> {
        // SGLang's tokenizer manager encodes with the tokenizer's defaults
        // (special tokens added, as a BOS model needs).
        Ok(state.tokenizer.encode(t, true)?)
    };
    let vocab = state.engine.model_config().vocab_size;
    let check = |ids: &Vec<u32>| match ids.iter().find(|&&t| t as usize >= vocab) {
        Some(bad) => Err(ApiError::invalid(
            "input_ids",
            format!("token id {bad} is outside the vocabulary (size {vocab})"),
        )),
        None => Ok(()),
    };
    let (list, batch) = match (&req.text, &req.input_ids) {
        (Some(_), Some(_)) | (None, None) => {
            return Err(ApiError::invalid(
                "text",
                "Either text or input_ids should be provided (not both).",
            ))
        }
        (Some(OneOrMany::One(t)), None) => (vec![encode(t)?], false),
        (Some(OneOrMany::Many(ts)), None) => {
            (ts.iter().map(encode).collect::<Result<_, _>>()?, true)
        }
        (None, Some(IdsSpec::One(ids))) => {
            check(ids)?;
            (vec![ids.clone()], false)
        }
        (None, Some(IdsSpec::Many(lists))) => {
            lists.iter().try_for_each(check)?;
            (lists.clone(), true)
        }
    };
    if list.is_empty() {
        return Err(ApiError::invalid("text", "the batch is empty"));
    }
    if list.len() > choices::MAX_CHOICES {
        return Err(ApiError::invalid(
            "text",
            format!("at most {} prompts per request", choices::MAX_CHOICES),
        ));
    }
    Ok((list, batch))
}

/// Each prompt's sampling, logprob request and `rid`.
fn items(
    state: &SharedState,
    req: &GenerateBody,
    prompts: Vec<Vec<u32>>,
) -> Result<Vec<Item>, ApiError> {
    let count = prompts.len();
    let all = req.sampling()?;
    let mut out = Vec::with_capacity(count);
    for (i, ids) in prompts.into_iter().enumerate() {
        let sp = all.get(i, count, "sampling_params")?;
        let mut c = sp.to_common(ids.len(), state.max_model_len)?;
        let wants = match &req.return_logprob {
            Some(v) => v.get(i, count, "return_logprob")?,
            None => false,
        };
        let k = match &req.top_logprobs_num {
            Some(v) => v.get(i, count, "top_logprobs_num")?,
            None => 0,
        };
        let top = wants.then_some(k);
        let start = match &req.logprob_start_len {
            Some(v) => logprobs::start(v.get(i, count, "logprob_start_len")?, ids.len())?,
            None => ids.len().saturating_sub(1),
        };
        if top.is_some() && start + 1 < ids.len() {
            input_logprobs_allowed(req.stream, c.n.unwrap_or(1))?;
            c.prompt_logprobs = Some(i64::from(k));
        }
        let ask = sampling::Ask {
            defaults: &state.sampling_defaults,
            logprobs: top.map(|k| (k, "top_logprobs_num")),
            prompt_len: ids.len(),
        };
        let s = sampling::for_request(state, &c, ask).map_err(sglang_names)?;
        let rid = match &req.rid {
            None => state.request_id("sgl"),
            Some(OneOrMany::One(r)) if count == 1 => r.clone(),
            Some(OneOrMany::One(r)) => format!("{r}_{i}"),
            Some(many) => many.get(i, count, "rid")?,
        };
        if rid.is_empty() {
            return Err(ApiError::invalid("rid", "rid must not be empty"));
        }
        out.push(Item {
            skip_special: sp.skip_special_tokens.unwrap_or(true),
            n: c.n.unwrap_or(1),
            ids,
            sampling: s,
            top,
            start,
            rid,
        });
    }
    Ok(out)
}

/// The `n` every prompt asks for (SGLang's parallel sampling).
fn same_n(items: &[Item]) -> Result<u64, ApiError> {
    let n = items.first().map_or(1, |i| i.n);
    if items.iter().any(|i| i.n != n) {
        return Err(ApiError::invalid(
            "n",
            "every prompt of a batch must ask for the same n",
        ));
    }
    Ok(n)
}

/// Registers each prompt's engine requests under its `rid`, for
/// `/abort_request`; the guards unregister them.
fn register(
    state: &SharedState,
    items: &[Item],
    choices: &[Choice],
    n: usize,
) -> Result<Vec<RidGuard>, ApiError> {
    items
        .iter()
        .enumerate()
        .map(|(p, item)| {
            let handles = choices
                .iter()
                .filter(|c| c.index / n == p)
                .filter_map(|c| c.gen.abort_handle())
                .collect();
            state.rl.register(&item.rid, handles)
        })
        .collect()
}

/// The engine computes a prompt's logprobs on its first choice only
/// (`choices::submit`); the others of a non-streamed response share them,
/// separate streams cannot.
fn input_logprobs_allowed(stream: bool, n: u64) -> Result<(), ApiError> {
    if stream && n > 1 {
        return Err(ApiError::invalid(
            "logprob_start_len",
            "input token logprobs with stream and n > 1 are not supported: stream n = 1 requests, \
             or ask without stream",
        ));
    }
    Ok(())
}

/// Renders a prompt's input logprobs off the runtime (a position each, with
/// its k alternatives and their text).
async fn input_of(
    shape: &Shape,
    item_index: usize,
    entries: Vec<PromptLogprob>,
) -> Result<logprobs::Input, ApiError> {
    let item = &shape.items[item_index];
    let (ids, start, k) = (item.ids.clone(), item.start, item.top.unwrap_or(0));
    let tokenizer = shape
        .text_in_logprobs
        .then(|| shape.state.tokenizer.clone());
    crate::offload::run(move || {
        logprobs::render(&ids, start, Some(&entries), k, tokenizer.as_deref())
    })
    .await
}

/// One output (choice) as far as it got.
struct Output {
    index: usize,
    text: String,
    ids: Vec<u32>,
    logprobs: Vec<TokenLogprob>,
    /// Its prompt's input logprobs, once the engine computed them.
    input: Option<logprobs::Input>,
}

impl Output {
    fn new(_shape: &Shape, index: usize) -> Self {
        Output {
            index,
            text: String::new(),
            ids: Vec::new(),
            logprobs: Vec::new(),
            input: None,
        }
    }

    /// SGLang's output dict; `finished` carries the OpenAI finish reason
    /// and the usage, `cached` the cache hits known before that.
    fn json(&self, shape: &Shape, finished: Option<(&str, UsageInfo)>, cached: usize) -> Value {
        let (n, item) = (shape.n, &shape.items[self.index / shape.n]);
        let id = match n {
            1 => item.rid.clone(),
            _ => format!("{}_{}", item.rid, self.index % n),
        };
        let (prompt_tokens, cached) = match &finished {
            Some((_, u)) => (u.prompt_tokens, u.prompt_tokens_details.cached_tokens),
            None => (item.ids.len(), cached),
        };
        let mut meta = json!({
            "id": id,
            "finish_reason": finished.as_ref().map(|(r, _)| self.finish_reason(shape, item, r)),
            "prompt_tokens": prompt_tokens,
            "weight_version": shape.state.rl.weight_version(),
            "completion_tokens": self.ids.len(),
            "cached_tokens": cached,
        });
        if let Some(k) = item.top {
            self.add_logprobs(&mut meta, shape, item, k);
        }
        if finished.is_some() {
            meta["e2e_latency"] = json!(shape.started.elapsed().as_secs_f64());
        }
        let mut out = json!({"text": self.text, "output_ids": self.ids, "meta_info": meta});
        if shape.listed {
            out["index"] = json!(self.index);
        }
        out
    }

    /// `[logprob, token_id, text]` triples (text `null` unless
    /// `return_text_in_logprobs`). Input logprobs from `logprob_start_len`
    /// ([`logprobs`]); by default only the prompt's last token, `null`.
    fn add_logprobs(&self, meta: &mut Value, shape: &Shape, item: &Item, k: u32) {
        let text = |t: &str| shape.text_in_logprobs.then(|| t.to_string());
        let input = self.input.clone().or_else(|| {
            let tokenizer = shape.text_in_logprobs.then_some(&*shape.state.tokenizer);
            let last = item.ids.len().saturating_sub(1);
            logprobs::render(&item.ids, last, None, k, tokenizer).ok()
        });
        if let Some(input) = input {
            meta["input_token_logprobs"] = input.tokens;
            if let Some(top) = input.top {
                meta["input_top_logprobs"] = top;
            }
        }
        meta["output_token_logprobs"] = self
            .logprobs
            .iter()
            .map(|l| json!([l.logprob, l.id, text(&l.token)]))
            .collect();
        if k > 0 {
            meta["output_top_logprobs"] = self
                .logprobs
                .iter()
                .map(|l| {
                    l.top_logprobs
                        .iter()
                        .map(|t| json!([t.logprob, t.id, text(&t.token)]))
                        .collect::<Value>()
                })
                .collect();
        }
    }

    /// SGLang's `finish_reason` object.
    fn finish_reason(&self, shape: &Shape, item: &Item, reason: &str) -> Value {
        match reason {
            "length" => json!({"type": "length", "length": self.ids.len()}),
            "abort" => json!({
                "type": "abort",
                "message": "the request was aborted (abort_request, pause_generation, or its program released)",
            }),
            "stop" => json!({"type": "stop", "matched": self.matched(shape, item)}),
            other => json!({"type": other}),
        }
    }

    /// What stopped the output: the stop token (EOS or a `stop_token_ids`
    /// id) it ended with, else the stop string found where the text ends.
    fn matched(&self, shape: &Shape, item: &Item) -> Value {
        let eos = &shape.state.engine.model_config().eos_token_ids;
        let full = || {
            shape
                .state
                .tokenizer
                .decode(&self.ids, item.skip_special)
                .unwrap_or_default()
        };
        match crate::stop::matched(&self.ids, &self.text, &item.sampling, eos, full) {
            Matched::Eos(t) | Matched::Token(t) => json!(t),
            Matched::Text(s) => json!(s),
            Matched::Nothing => Value::Null,
        }
    }
}

/// SGLang's stream: each event the output so far, `[DONE]` at the end.
fn stream_response(shape: Arc<Shape>, choices: Vec<Choice>, guards: Vec<RidGuard>) -> Response {
    let streams: Vec<BoxStream<'static, Bytes>> = choices
        .into_iter()
        .map(|c| {
            let out = Output::new(&shape, c.index);
            choice_stream(shape.clone(), c.gen, out)
        })
        .collect();
    let events = stream::select_all(streams)
        .chain(stream::once(async { Bytes::from_static(sse::DONE) }))
        .map(move |b| {
            // The rids stay registered until the stream ends.
            let _ = &guards;
            b
        });
    sse::response(events)
}

/// One choice's events.
fn choice_stream(shape: Arc<Shape>, gen: Generation, out: Output) -> BoxStream<'static, Bytes> {
    stream::unfold(Some((gen, out)), move |st| {
        let shape = shape.clone();
        async move {
            let (mut gen, mut out) = st?;
            let step = gen.next().await;
            if let Some(entries) = gen.take_prompt_logprobs() {
                match input_of(&shape, out.index / shape.n, entries).await {
                    Ok(input) => out.input = Some(input),
                    Err(e) => tracing::warn!(error = %e, "input logprobs not rendered"),
                }
            }
            match step {
                Ok(Some(Step::Piece(p))) => {
                    out.text.push_str(&p.text);
                    out.ids.extend(p.token_ids);
                    out.logprobs.extend(p.logprobs);
                    let ev = sse::event(&out.json(&shape, None, gen.cached_tokens()));
                    Some((ev, Some((gen, out))))
                }
                Ok(Some(Step::Finished {
                    piece,
                    reason,
                    usage,
                })) => {
                    out.text.push_str(&piece.text);
                    out.ids.extend(piece.token_ids);
                    out.logprobs.extend(piece.logprobs);
                    Some((
                        sse::event(&out.json(&shape, Some((reason, usage)), 0)),
                        None,
                    ))
                }
                Ok(None) => None,
                Err(e) => {
                    tracing::warn!(error = %e, "generate stream failed");
                    let ev = sse::event(&json!({"error": {"message": e.to_string()}}));
                    Some((ev, None))
                }
            }
        }
    })
    .boxed()
}
