//! `POST /v1/completions`: a text or token-id prompt, raw text out.

use agentd_engine::GenerateRequest;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, StreamExt};

use crate::app::{parse_json, SharedState};
use crate::error::ApiError;
use crate::generation::{collect, Generation, Piece, Step};
use crate::protocol::{
    unix_now, CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse,
    PromptSpec, UsageInfo,
};
use crate::{program_id, sampling, sse};

/// The prompt's token ids. Several prompts in one request (OpenAI's batch
/// form) are refused: one request is one turn of one program here.
fn prompt_tokens(state: &SharedState, prompt: PromptSpec) -> Result<(Vec<u32>, String), ApiError> {
    let many = || {
        ApiError::invalid(
            "prompt",
            "only one prompt per request is supported; send one request per prompt",
        )
    };
    match prompt {
        PromptSpec::Text(t) => Ok((state.tokenizer.encode(&t, false)?, t)),
        PromptSpec::Texts(mut v) if v.len() == 1 => {
            let t = v.pop().unwrap_or_default();
            Ok((state.tokenizer.encode(&t, false)?, t))
        }
        PromptSpec::Texts(_) => Err(many()),
        PromptSpec::Tokens(ids) => tokens_prompt(state, ids),
        PromptSpec::TokenLists(mut v) if v.len() == 1 => {
            tokens_prompt(state, v.pop().unwrap_or_default())
        }
        PromptSpec::TokenLists(_) => Err(many()),
    }
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
    state.check_model(req.common.model.as_deref())?;
    let program = program_id::resolve(&req.common, &headers)?;
    let (prompt, prompt_text) = prompt_tokens(&state, req.prompt)?;
    let sampling = sampling::build(&req.common, req.logprobs, prompt.len(), state.max_model_len)?;
    let prompt_len = prompt.len();
    let prompt_ids = req.return_token_ids.then(|| prompt.clone());
    tracing::info!(
        program = ?program.program,
        prompt_tokens = prompt_len,
        max_tokens = sampling.params.max_tokens,
        stream = req.common.stream,
        "completion"
    );
    let engine_stream = state.engine.submit(GenerateRequest {
        program: program.program,
        prompt,
        sampling: sampling.params,
        final_request: program.final_request,
    })?;
    let logprobs = req.logprobs.is_some();
    let gen = Generation::new(
        engine_stream,
        state.tokenizer.clone(),
        sampling.stop,
        logprobs,
        prompt_len,
    );
    let echo = req.echo.then_some(prompt_text);
    let mut s = CompletionStream {
        gen,
        id: state.request_id("cmpl"),
        created: unix_now(),
        model: state.model_name.clone(),
        logprobs,
        include_usage: req
            .common
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage),
        offset: 0,
        done: false,
        return_token_ids: req.return_token_ids,
        prompt_token_ids: prompt_ids.clone(),
    };
    if req.common.stream {
        if let Some(text) = echo {
            // The echoed prompt goes first, as its own chunk.
            s.offset = text.len();
            let first = s.chunk(
                Piece {
                    text,
                    logprobs: Vec::new(),
                    token_ids: Vec::new(),
                },
                None,
            );
            let head = stream::iter(vec![first]);
            return Ok(sse::response(head.chain(s.into_stream())));
        }
        return Ok(sse::response(s.into_stream()));
    }
    let done = collect(s.gen).await?;
    let mut text = echo.unwrap_or_default();
    let lp = logprobs.then(|| {
        let mut lp = CompletionLogprobs::default();
        lp.extend(&done.logprobs, text.len());
        lp
    });
    text.push_str(&done.text);
    Ok(Json(CompletionResponse {
        id: s.id,
        object: "text_completion",
        created: s.created,
        model: s.model,
        choices: vec![CompletionChoice {
            index: 0,
            text,
            logprobs: lp,
            finish_reason: Some(done.reason),
            prompt_token_ids: prompt_ids,
            token_ids: req.return_token_ids.then_some(done.token_ids),
        }],
        usage: Some(Some(done.usage)),
    })
    .into_response())
}

struct CompletionStream {
    gen: Generation,
    id: String,
    created: u64,
    model: String,
    logprobs: bool,
    include_usage: bool,
    /// Bytes of text sent so far (`text_offset` of the next token).
    offset: usize,
    done: bool,
    return_token_ids: bool,
    /// Sent on the first chunk, then `None`.
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
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices: vec![CompletionChoice {
                index: 0,
                text: piece.text,
                logprobs: lp,
                finish_reason: finish,
                prompt_token_ids,
                token_ids,
            }],
            usage: self.include_usage.then_some(None),
        })
    }

    fn usage_chunk(&self, usage: UsageInfo) -> Bytes {
        sse::event(&CompletionResponse {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices: Vec::new(),
            usage: Some(Some(usage)),
        })
    }

    async fn step(&mut self) -> Option<Vec<Bytes>> {
        if self.done {
            return None;
        }
        let mut out = Vec::new();
        let ended = match self.gen.next().await {
            Ok(Some(Step::Piece(p))) => {
                out.push(self.chunk(p, None));
                false
            }
            Ok(Some(Step::Finished {
                piece,
                reason,
                usage,
            })) => {
                out.push(self.chunk(piece, Some(reason)));
                if self.include_usage {
                    out.push(self.usage_chunk(usage));
                }
                true
            }
            Ok(None) => true,
            Err(e) => {
                tracing::warn!(error = %e, "completion stream failed");
                out.push(sse::event(&e.body()));
                true
            }
        };
        // However the stream ends (finished, engine gone, error), the
        // terminator goes out once.
        if ended {
            out.push(Bytes::from_static(sse::DONE));
            self.done = true;
        }
        Some(out)
    }

    fn into_stream(self) -> impl futures_util::Stream<Item = Bytes> + Send + 'static {
        stream::unfold(self, |mut s| async move {
            let out = s.step().await?;
            Some((stream::iter(out), s))
        })
        .flatten()
    }
}
