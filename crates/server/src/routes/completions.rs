//! `POST /v1/completions`: a text or token-id prompt, raw text out.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, BoxStream, StreamExt};

use crate::app::{parse_json, SharedState};
use crate::choices::{self, Choice, ChoiceStep, ResponseMeta};
use crate::error::ApiError;
use crate::fields::{self, Endpoint};
use crate::generation::{Generation, Piece, Step};
use crate::program_id::ProgramRef;
use crate::protocol::{
    CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse, PromptSpec,
    UsageInfo,
};
use crate::sampling::Sampling;
use crate::{controls, program_id, prompt_logprobs, sampling, sse};

/// The prompts' token ids and texts: one prompt, or OpenAI's batch form (a
/// list of strings or of token-id lists), each prompt giving `n` choices.
fn prompt_list(
    state: &SharedState,
    prompt: PromptSpec,
    add_special_tokens: bool,
) -> Result<Vec<(Vec<u32>, String)>, ApiError> {
    let text = |t: String| -> Result<(Vec<u32>, String), ApiError> {
        Ok((state.tokenizer.encode(&t, add_special_tokens)?, t))
    };
    let list = match prompt {
        PromptSpec::Text(t) => vec![text(t)?],
        PromptSpec::Texts(v) => v.into_iter().map(text).collect::<Result<_, _>>()?,
        PromptSpec::Tokens(ids) => vec![tokens_prompt(state, ids)?],
        PromptSpec::TokenLists(v) => v
            .into_iter()
            .map(|ids| tokens_prompt(state, ids))
            .collect::<Result<_, _>>()?,
    };
    if list.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt list is empty"));
    }
    if list.len() > choices::MAX_CHOICES {
        return Err(ApiError::invalid(
            "prompt",
            format!("at most {} prompts per request", choices::MAX_CHOICES),
        ));
    }
    Ok(list)
}

fn tokens_prompt(state: &SharedState, ids: Vec<u32>) -> Result<(Vec<u32>, String), ApiError> {
    let vocab = state.engine.model_config().vocab_size;
    if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid(
            "prompt",
            format!("token id {bad} is outside the vocabulary (size {vocab})"),
        ));
    }
    // Only needed for `echo`; decoding cannot fail for in-vocabulary ids.
    let text = state.tokenizer.decode(&ids, false).unwrap_or_default();
    Ok((ids, text))
}

pub async fn handle(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse_json(&body)?;
    fields::check(&req.common.extra, Endpoint::Completions)?;
    state.check_model(req.common.model.as_deref())?;
    let program = program_id::resolve(&req.common, &headers)?;
    let (req, prompts) = prepare(&state, &program, req).await?;
    let logprobs = req.logprobs.is_some();
    let meta = ResponseMeta::new(&state, "cmpl");
    let (submit, n) = (prompts.submit, prompts.n);
    let choices = choices::submit_offloaded(
        &state,
        std::slice::from_ref(&meta.id),
        &program,
        submit,
        n,
        logprobs,
    )
    .await?;
    let shape = Shape {
        meta,
        n: prompts.n,
        logprobs,
        echo: req.echo.then_some(prompts.texts),
        return_token_ids: req.return_token_ids,
        prompt_ids: prompts.ids,
    };
    if req.common.stream {
        let include_usage = req
            .common
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage);
        return Ok(stream_response(choices, shape, include_usage));
    }
    whole(&state, choices, shape).await
}

/// The request's prompts, checked, with their sampling.
struct Prompts {
    submit: Vec<(Vec<u32>, Sampling)>,
    /// Each prompt's text (for `echo`).
    texts: Vec<String>,
    /// Each prompt's ids, with `return_token_ids`.
    ids: Vec<Vec<u32>>,
    /// Choices per prompt.
    n: usize,
}

/// Tokenizes the prompts (or detokenizes token prompts for `echo`: CPU
/// work, off the runtime), then builds and checks each one's sampling.
async fn prepare(
    state: &SharedState,
    program: &ProgramRef,
    req: CompletionRequest,
) -> Result<(CompletionRequest, Prompts), ApiError> {
    let (req, prompts) = {
        let state = state.clone();
        crate::offload::run(move || {
            let mut req = req;
            let prompt = std::mem::replace(&mut req.prompt, PromptSpec::Tokens(Vec::new()));
            let prompts = prompt_list(&state, prompt, req.add_special_tokens.unwrap_or(false))?;
            Ok((req, prompts))
        })
        .await?
    };
    let n = choices::count(req.common.n, prompts.len())?;
    let mut out = Prompts {
        submit: Vec::with_capacity(prompts.len()),
        texts: Vec::with_capacity(prompts.len()),
        ids: Vec::new(),
        n,
    };
    for (mut ids, text) in prompts {
        controls::truncate(&mut ids, &req.common, state.max_model_len)?;
        let ask = sampling::Ask {
            defaults: &state.sampling_defaults,
            logprobs: req.logprobs.map(|k| (k, "logprobs")),
            prompt_len: ids.len(),
        };
        let sampling = sampling::for_request(state, &req.common, ask)?;
        tracing::info!(
            program = ?program.program,
            prompt_tokens = ids.len(),
            max_tokens = sampling.params.max_tokens,
            n,
            stream = req.common.stream,
            "completion"
        );
        out.texts.push(text);
        if req.return_token_ids {
            out.ids.push(ids.clone());
        }
        out.submit.push((ids, sampling));
    }
    Ok((req, out))
}

/// How the choices' text becomes the answer, whole or streamed.
struct Shape {
    meta: ResponseMeta,
    n: usize,
    logprobs: bool,
    /// With `echo`: each prompt's text, put before its choices' text.
    echo: Option<Vec<String>>,
    return_token_ids: bool,
    /// With `return_token_ids`: each prompt's ids.
    prompt_ids: Vec<Vec<u32>>,
}

impl Shape {
    fn echo(&self, index: usize) -> Option<String> {
        self.echo.as_ref()?.get(index / self.n).cloned()
    }

    /// vLLM's `return_token_ids`: each choice carries its prompt's ids (on
    /// its first chunk when streaming) and the ids it generated.
    fn ids_of(&self, index: usize) -> Option<Vec<u32>> {
        self.prompt_ids.get(index / self.n).cloned()
    }
}

fn stream_response(choices: Vec<Choice>, shape: Shape, include_usage: bool) -> Response {
    let streams = choices
        .into_iter()
        .map(|c| {
            CompletionStream {
                echo: shape.echo(c.index),
                prompt_token_ids: shape.ids_of(c.index),
                gen: c.gen,
                index: c.index,
                first_of_prompt: c.first_of_prompt,
                meta: shape.meta.clone(),
                logprobs: shape.logprobs,
                include_usage,
                offset: 0,
                done: false,
                return_token_ids: shape.return_token_ids,
            }
            .into_stream()
        })
        .collect();
    let meta = shape.meta;
    sse::response(choices::merge(
        streams,
        move |usage| usage_chunk(&meta, usage),
        include_usage,
    ))
}

/// The non-streamed response: every choice generated.
async fn whole(
    state: &SharedState,
    choices: Vec<Choice>,
    shape: Shape,
) -> Result<Response, ApiError> {
    let mut done = choices::collect_all(choices).await?;
    let prompt_logprobs = prompt_logprobs::per_prompt(state, &mut done, shape.n).await?;
    let mut usages = Vec::with_capacity(done.len());
    let mut out = Vec::with_capacity(done.len());
    for (index, first, d) in done {
        let mut text = shape.echo(index).unwrap_or_default();
        let lp = shape.logprobs.then(|| {
            let mut lp = CompletionLogprobs::default();
            lp.extend(&d.logprobs, text.len());
            lp
        });
        text.push_str(&d.text);
        usages.push((first, d.usage));
        out.push(CompletionChoice {
            index,
            text,
            logprobs: lp,
            finish_reason: Some(d.reason),
            prompt_token_ids: shape.ids_of(index),
            token_ids: shape.return_token_ids.then_some(d.token_ids),
            prompt_logprobs: prompt_logprobs.get(index / shape.n).cloned().flatten(),
        });
    }
    Ok(Json(CompletionResponse {
        id: shape.meta.id,
        object: "text_completion",
        created: shape.meta.created,
        model: shape.meta.model,
        choices: out,
        usage: Some(Some(choices::merge_usage(&usages))),
    })
    .into_response())
}

/// The last chunk of a stream that asked for usage.
fn usage_chunk(meta: &ResponseMeta, usage: UsageInfo) -> Bytes {
    sse::event(&CompletionResponse {
        id: meta.id.clone(),
        object: "text_completion",
        created: meta.created,
        model: meta.model.clone(),
        choices: Vec::new(),
        usage: Some(Some(usage)),
    })
}

/// One choice of a streamed completion.
struct CompletionStream {
    gen: Generation,
    index: usize,
    first_of_prompt: bool,
    meta: ResponseMeta,
    logprobs: bool,
    include_usage: bool,
    /// The echoed prompt, sent as the choice's first chunk.
    echo: Option<String>,
    /// Bytes of text sent so far (`text_offset` of the next token).
    offset: usize,
    done: bool,
    return_token_ids: bool,
    /// Sent on the choice's first chunk, then `None`.
    prompt_token_ids: Option<Vec<u32>>,
}

impl CompletionStream {
    fn chunk(&mut self, piece: Piece, finish: Option<&'static str>) -> Bytes {
        let lp = self.logprobs.then(|| {
            let mut lp = CompletionLogprobs::default();
            lp.extend(&piece.logprobs, self.offset);
            lp
        });
        self.offset += piece.text.len();
        let (prompt_token_ids, token_ids) = if self.return_token_ids {
            (self.prompt_token_ids.take(), Some(piece.token_ids))
        } else {
            (None, None)
        };
        sse::event(&CompletionResponse {
            id: self.meta.id.clone(),
            object: "text_completion",
            created: self.meta.created,
            model: self.meta.model.clone(),
            choices: vec![CompletionChoice {
                index: self.index,
                text: piece.text,
                logprobs: lp,
                finish_reason: finish,
                prompt_token_ids,
                token_ids,
                prompt_logprobs: None,
            }],
            usage: self.include_usage.then_some(None),
        })
    }

    async fn step(&mut self) -> Option<ChoiceStep> {
        if self.done {
            return None;
        }
        if let Some(text) = self.echo.take() {
            let piece = Piece {
                text,
                logprobs: Vec::new(),
                token_ids: Vec::new(),
            };
            return Some(ChoiceStep::Chunks(vec![self.chunk(piece, None)]));
        }
        let step = match self.gen.next().await {
            Ok(Some(Step::Piece(p))) => return Some(ChoiceStep::Chunks(vec![self.chunk(p, None)])),
            Ok(Some(Step::Finished {
                piece,
                reason,
                usage,
            })) => ChoiceStep::Finished {
                chunks: vec![self.chunk(piece, Some(reason))],
                usage,
                first_of_prompt: self.first_of_prompt,
            },
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(error = %e, "completion stream failed");
                ChoiceStep::Failed(sse::event(&e.body()))
            }
        };
        self.done = true;
        Some(step)
    }

    fn into_stream(self) -> BoxStream<'static, ChoiceStep> {
        stream::unfold(self, |mut s| async move {
            let step = s.step().await?;
            Some((step, s))
        })
        .boxed()
    }
}
