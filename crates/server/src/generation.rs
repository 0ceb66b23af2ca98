//! One request's output as text: engine token events → detokenised pieces,
//! stop strings applied, logprobs attached, usage at the end. Shared by the
//! chat and text-completion routes, streaming or not.

use std::collections::VecDeque;
use std::sync::Arc;

use agentd_engine::{Event, FinishReason, RequestStream, TokenEvent};
use agentd_runtime::{IncrementalDecoder, PromptLogprob, Tokenizer};

use crate::error::ApiError;
use crate::protocol::{TokenLogprob, TopLogprob, UsageInfo};
use crate::sampling::Sampling;
use crate::stop::{StopMatcher, StopOutcome};

/// Text settled by one or more tokens, with the logprobs of the tokens whose
/// text starts in it.
#[derive(Debug, Default, Clone)]
pub struct Piece {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    /// Ids of the tokens generated since the previous piece (vLLM's
    /// `return_token_ids`): every generated token lands in exactly one piece.
    pub token_ids: Vec<u32>,
}

/// What [`Generation::next`] yields.
#[derive(Debug)]
pub enum Step {
    Piece(Piece),
    /// The last step: remaining text, the OpenAI finish reason and usage.
    Finished {
        piece: Piece,
        reason: &'static str,
        usage: UsageInfo,
    },
}

pub struct Generation {
    /// `None` once finished; dropping it cancels the engine request.
    stream: Option<RequestStream>,
    tokenizer: Arc<Tokenizer>,
    decoder: IncrementalDecoder,
    stop: StopMatcher,
    /// Stop strings are looked for only past this many tokens (vLLM's
    /// `min_tokens`; the engine holds back stop ids and EOS itself).
    min_tokens: usize,
    /// vLLM's `include_stop_str_in_output`: also the text of a stop token.
    include_stop: bool,
    logprobs: bool,
    prompt_tokens: usize,
    completion_tokens: usize,
    /// Bytes of text decoded so far (before any stop-string cut).
    decoded: usize,
    /// Bytes of text handed out.
    emitted: usize,
    /// Logprobs not yet handed out, with the byte offset where each token's
    /// text starts.
    pending: VecDeque<(usize, TokenLogprob)>,
    /// Generated token ids not yet handed out.
    pending_ids: Vec<u32>,
    /// The prompt's logprobs (they come with the first token).
    prompt_logprobs: Option<Vec<PromptLogprob>>,
}

impl Generation {
    pub fn new(
        stream: RequestStream,
        tokenizer: Arc<Tokenizer>,
        sampling: &Sampling,
        logprobs: bool,
        prompt_tokens: usize,
    ) -> Self {
        Generation {
            stream: Some(stream),
            tokenizer,
            // vLLM's default `skip_special_tokens=True`: `<|im_end|>` and
            // friends never show in the text; Qwen3's `<think>` and
            // `<tool_call>` are not special, so the chat parser still sees them.
            decoder: IncrementalDecoder::new(true),
            stop: StopMatcher::new(sampling.stop.clone(), sampling.include_stop_str_in_output),
            min_tokens: sampling.params.controls.min_tokens,
            include_stop: sampling.include_stop_str_in_output,
            logprobs,
            prompt_tokens,
            completion_tokens: 0,
            decoded: 0,
            emitted: 0,
            pending: VecDeque::new(),
            pending_ids: Vec::new(),
            prompt_logprobs: None,
        }
    }

    /// The prompt's logprobs, once the first token brought them.
    pub fn take_prompt_logprobs(&mut self) -> Option<Vec<PromptLogprob>> {
        self.prompt_logprobs.take()
    }

    /// A handle that cancels this request from elsewhere (SGLang's
    /// `/abort_request`): it then finishes with `abort`. `None` once done.
    pub fn abort_handle(&self) -> Option<agentd_engine::AbortHandle> {
        self.stream.as_ref().map(RequestStream::abort_handle)
    }

    /// Keeps special tokens' text in the output (SGLang's
    /// `skip_special_tokens: false`); call before the first token.
    pub fn keep_special_tokens(&mut self) {
        self.decoder = IncrementalDecoder::new(false);
    }

    /// Prompt tokens reused from the cache (0 until the request started).
    pub fn cached_tokens(&self) -> usize {
        self.stream.as_ref().map_or(0, RequestStream::cached_tokens)
    }

    /// The next settled piece; `None` after [`Step::Finished`].
    pub async fn next(&mut self) -> Result<Option<Step>, ApiError> {
        loop {
            let Some(stream) = self.stream.as_mut() else {
                return Ok(None);
            };
            let event = stream.next().await;
            match event {
                Some(Event::Token(t)) => {
                    if let Some(step) = self.on_token(t)? {
                        return Ok(Some(step));
                    }
                }
                Some(Event::Finished {
                    reason: FinishReason::Error,
                    ..
                }) => {
                    self.stream = None;
                    return Err(ApiError::Internal(
                        "the engine could not complete this request (a model or sampling \
                         failure; the server log has the cause)"
                            .into(),
                    ));
                }
                Some(Event::Finished { reason, usage }) => {
                    let tail = self.decoder.flush(&self.tokenizer)?.unwrap_or_default();
                    self.decoded += tail.len();
                    let usage = UsageInfo::new(
                        usage.prompt_tokens,
                        usage.completion_tokens,
                        usage.cached_tokens,
                    );
                    tracing::debug!(reason = reason.as_openai(), ?usage, "request finished");
                    let check = self.completion_tokens > self.min_tokens;
                    return Ok(Some(match self.stop.push(&tail, check) {
                        StopOutcome::Stopped(text) => self.finish_stopped(text),
                        StopOutcome::Ready(mut text) => {
                            text.push_str(&self.stop.finish());
                            self.stream = None;
                            let piece = self.piece(text, true);
                            Step::Finished {
                                piece,
                                reason: reason.as_openai(),
                                usage,
                            }
                        }
                    }));
                }
                None => {
                    // The engine dropped the request without finishing it
                    // (shutdown): report what was generated as aborted.
                    tracing::warn!("engine stream closed without a finish event");
                    let cached = self.stream.take().map_or(0, |s| s.cached_tokens());
                    let text = self.stop.finish();
                    return Ok(Some(Step::Finished {
                        piece: self.piece(text, true),
                        reason: "abort",
                        usage: self.usage_so_far(cached),
                    }));
                }
            }
        }
    }

    fn on_token(&mut self, mut t: TokenEvent) -> Result<Option<Step>, ApiError> {
        self.completion_tokens += 1;
        if let Some(p) = t.prompt_logprobs.take() {
            self.prompt_logprobs = Some(p);
        }
        self.pending_ids.push(t.token_id);
        if self.logprobs {
            let lp = self.token_logprob(&t)?;
            self.pending.push_back((self.decoded, lp));
        }
        // vLLM's detokenizer leaves a stop token's text out (the stream
        // ends with it) unless stop strings are included.
        if t.stop_token && !self.include_stop {
            return Ok(None);
        }
        let Some(delta) = self.decoder.push(&self.tokenizer, t.token_id)? else {
            return Ok(None);
        };
        self.decoded += delta.len();
        let check = self.completion_tokens > self.min_tokens;
        Ok(match self.stop.push(&delta, check) {
            StopOutcome::Stopped(text) => Some(self.finish_stopped(text)),
            StopOutcome::Ready(text) if text.is_empty() => None,
            StopOutcome::Ready(text) => Some(Step::Piece(self.piece(text, false))),
        })
    }

    /// A stop string matched: cancel the engine request by dropping its
    /// stream and finish with the text before the stop string.
    fn finish_stopped(&mut self, text: String) -> Step {
        tracing::debug!(
            completion_tokens = self.completion_tokens,
            "stop string matched; cancelling"
        );
        let cached = self.stream.take().map_or(0, |s| s.cached_tokens());
        let piece = self.piece(text, false);
        // Tokens past the stop string are not part of the answer.
        self.pending.clear();
        Step::Finished {
            piece,
            reason: "stop",
            // The engine's final usage went with the dropped stream; the
            // counts here are exact and the cached count was read before.
            usage: self.usage_so_far(cached),
        }
    }

    fn usage_so_far(&self, cached_tokens: usize) -> UsageInfo {
        UsageInfo::new(self.prompt_tokens, self.completion_tokens, cached_tokens)
    }

    /// Wraps `text` with the logprobs of the tokens that start inside it
    /// (all pending ones when `all`).
    fn piece(&mut self, text: String, all: bool) -> Piece {
        self.emitted += text.len();
        let mut logprobs = Vec::new();
        while let Some((start, _)) = self.pending.front() {
            if !all && *start >= self.emitted {
                break;
            }
            if let Some((_, lp)) = self.pending.pop_front() {
                logprobs.push(lp);
            }
        }
        Piece {
            text,
            logprobs,
            token_ids: std::mem::take(&mut self.pending_ids),
        }
    }

    fn token_logprob(&self, t: &TokenEvent) -> Result<TokenLogprob, ApiError> {
        let token = self.tokenizer.decode(&[t.token_id], false)?;
        let top = t
            .top
            .iter()
            .map(|&(id, logprob)| {
                let token = self.tokenizer.decode(&[id], false)?;
                Ok(TopLogprob {
                    bytes: token.as_bytes().to_vec(),
                    token,
                    logprob,
                    id,
                })
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        Ok(TokenLogprob {
            bytes: token.as_bytes().to_vec(),
            token,
            logprob: t.logprob.unwrap_or(f32::NAN),
            top_logprobs: top,
            id: t.token_id,
        })
    }
}

/// A whole generation, for non-streamed responses.
#[derive(Debug)]
pub struct Collected {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    pub token_ids: Vec<u32>,
    pub reason: &'static str,
    pub usage: UsageInfo,
    /// The prompt's logprobs, when the request asked for them.
    pub prompt_logprobs: Option<Vec<PromptLogprob>>,
}

/// Runs `gen` to the end. If the client disconnects meanwhile, axum drops
/// this future and the engine request with it.
pub async fn collect(mut gen: Generation) -> Result<Collected, ApiError> {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    let mut token_ids = Vec::new();
    loop {
        match gen.next().await? {
            Some(Step::Piece(p)) => {
                text.push_str(&p.text);
                logprobs.extend(p.logprobs);
                token_ids.extend(p.token_ids);
            }
            Some(Step::Finished {
                piece,
                reason,
                usage,
            }) => {
                text.push_str(&piece.text);
                logprobs.extend(piece.logprobs);
                token_ids.extend(piece.token_ids);
                return Ok(Collected {
                    text,
                    logprobs,
                    token_ids,
                    reason,
                    usage,
                    prompt_logprobs: gen.take_prompt_logprobs(),
                });
            }
            None => {
                return Err(ApiError::Internal(
                    "generation ended without a finish event".into(),
                ))
            }
        }
    }
}
