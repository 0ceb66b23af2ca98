//! `POST /v1/chat/completions`: messages → chat template → engine → text →
//! `reasoning_content` / `content` / `tool_calls`, whole or streamed.

use agentd_chat::{parse_output, ChatDelta, OutputOptions, StreamParser, ToolCallIds};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, StreamExt};

use crate::app::{parse_json, SharedState};
use crate::chat_prompt::{self, ChatInput};
use crate::choices::{self, Choice, ChoiceStep, ResponseMeta};
use crate::error::ApiError;
use crate::fields::{self, Endpoint};
use crate::generation::{Generation, Step};
use crate::program_id::ProgramRef;
use crate::protocol::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
    ChatCompletionResponse, ChatLogprobs, ChunkDelta, TokenLogprob, UsageInfo,
};
use crate::sampling::Sampling;
use crate::{controls, program_id, prompt_logprobs, sampling, sse, structured};

pub async fn handle(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req: ChatCompletionRequest = parse_json(&body)?;
    fields::check(&req.common.extra, Endpoint::Chat)?;
    state.check_model(req.common.model.as_deref())?;
    let program = program_id::resolve(&req.common, &headers)?;
    let p = prepare(&state, &program, req).await?;
    let logprobs = p.top.is_some();
    let submit = vec![(p.prompt, p.sampling)];
    let meta = ResponseMeta::new(&state, "chatcmpl");
    let choices = choices::submit_offloaded(
        &state,
        std::slice::from_ref(&meta.id),
        &program,
        submit,
        p.n,
        logprobs,
    )
    .await?;
    let shape = Shape {
        output: p.output,
        meta,
        logprobs,
        one_tool_call: p.req.parallel_tool_calls == Some(false),
        tool_note: choices::ToolNote::new(&state, &program),
    };
    if p.req.common.stream {
        let include_usage = p
            .req
            .common
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage);
        return Ok(stream_response(choices, shape, include_usage));
    }
    whole(&state, choices, shape, p.n).await
}

/// A chat request rendered and checked: what to submit.
struct Prepared {
    req: ChatCompletionRequest,
    prompt: Vec<u32>,
    output: OutputOptions,
    sampling: Sampling,
    /// `top_logprobs` when `logprobs` is on.
    top: Option<u32>,
    n: usize,
}

/// Renders the messages with the chat template (off the runtime: CPU work
/// on a long conversation), then builds and checks the sampling.
async fn prepare(
    state: &SharedState,
    program: &ProgramRef,
    req: ChatCompletionRequest,
) -> Result<Prepared, ApiError> {
    let (req, prompt, constraint) = {
        let state = state.clone();
        crate::offload::run(move || {
            let mut kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
            let constraint = structured::constraint(
                &state,
                structured::chat_format(req.response_format.as_ref())?,
                req.tools.as_deref().unwrap_or_default(),
                req.tool_choice.as_ref(),
                &mut kwargs,
            )?;
            let prompt = chat_prompt::render(
                &state,
                &ChatInput {
                    messages: &req.messages,
                    tools: req.tools.as_deref(),
                    tool_choice: req.tool_choice.as_ref(),
                    chat_template_kwargs: kwargs,
                    add_generation_prompt: req.add_generation_prompt,
                    continue_final_message: req.continue_final_message.unwrap_or(false),
                    add_special_tokens: req.add_special_tokens.unwrap_or(false),
                },
            )?;
            Ok((req, prompt, constraint))
        })
        .await?
    };
    let (mut prompt, output) = (prompt.tokens, prompt.output);
    controls::truncate(&mut prompt, &req.common, state.max_model_len)?;
    let top = match (req.logprobs, req.top_logprobs) {
        (Some(true), k) => Some(k.unwrap_or(0)),
        (_, Some(_)) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs needs logprobs: true",
            ))
        }
        _ => None,
    };
    let ask = sampling::Ask {
        defaults: &state.sampling_defaults,
        logprobs: top.map(|k| (k, "top_logprobs")),
        prompt_len: prompt.len(),
    };
    let mut sampling = sampling::for_request(state, &req.common, ask)?;
    sampling.params.constraint = constraint;
    let n = choices::count(req.common.n, 1)?;
    tracing::info!(
        program = ?program.program,
        prompt_tokens = prompt.len(),
        max_tokens = sampling.params.max_tokens,
        n,
        stream = req.common.stream,
        tools = output.tool_calls,
        "chat completion"
    );
    Ok(Prepared {
        req,
        prompt,
        output,
        sampling,
        top,
        n,
    })
}

/// How the generated text becomes the answer, whole or streamed.
struct Shape {
    output: OutputOptions,
    meta: ResponseMeta,
    logprobs: bool,
    /// `parallel_tool_calls: false`: only the first tool call goes out.
    one_tool_call: bool,
    /// The program's turn (choice 0): its first tool call, for the engine.
    tool_note: Option<choices::ToolNote>,
}

/// The non-streamed response: every choice generated, then parsed.
async fn whole(
    state: &SharedState,
    choices: Vec<Choice>,
    shape: Shape,
    n: usize,
) -> Result<Response, ApiError> {
    let mut done = choices::collect_all(choices).await?;
    let prompt_logprobs = prompt_logprobs::per_prompt(state, &mut done, n)
        .await?
        .pop()
        .flatten();
    let mut usages = Vec::with_capacity(done.len());
    let mut out = Vec::with_capacity(done.len());
    for (index, first, d) in done {
        let mut parsed = parse_output(&d.text, &shape.output, &mut ToolCallIds::Random);
        if shape.one_tool_call {
            parsed.tool_calls.truncate(1);
        }
        let reason = finish_reason(d.reason, !parsed.tool_calls.is_empty());
        if let (0, Some(note), Some(call)) = (index, &shape.tool_note, parsed.tool_calls.first()) {
            note.note(&call.function.name);
        }
        usages.push((first, d.usage));
        out.push(ChatChoice {
            index,
            message: AssistantMessage {
                role: "assistant",
                content: parsed.content,
                reasoning_content: parsed.reasoning_content,
                tool_calls: parsed.tool_calls,
            },
            logprobs: shape.logprobs.then_some(ChatLogprobs {
                content: d.logprobs,
            }),
            finish_reason: reason,
        });
    }
    let response = ChatCompletionResponse {
        id: shape.meta.id,
        object: "chat.completion",
        created: shape.meta.created,
        model: shape.meta.model,
        choices: out,
        usage: choices::merge_usage(&usages),
        prompt_logprobs,
    };
    Ok(Json(response).into_response())
}

/// OpenAI reports `tool_calls` when the model stopped after calling tools.
fn finish_reason(reason: &'static str, called_tools: bool) -> &'static str {
    if called_tools && reason == "stop" {
        "tool_calls"
    } else {
        reason
    }
}

/// The last chunk of a stream that asked for usage.
fn usage_chunk(meta: &ResponseMeta, usage: UsageInfo) -> Bytes {
    sse::event(&ChatCompletionChunk {
        id: meta.id.clone(),
        object: "chat.completion.chunk",
        created: meta.created,
        model: meta.model.clone(),
        choices: Vec::new(),
        usage: Some(Some(usage)),
    })
}

/// One choice of a streamed chat completion.
struct ChatStream {
    gen: Generation,
    index: usize,
    first_of_prompt: bool,
    parser: StreamParser,
    meta: ResponseMeta,
    include_usage: bool,
    logprobs: bool,
    /// `parallel_tool_calls: false`: only the first tool call goes out.
    one_tool_call: bool,
    /// Logprobs of tokens whose text the parser still holds back.
    pending_logprobs: Vec<TokenLogprob>,
    called_tools: bool,
    /// The program's turn (choice 0): the first tool called, for the engine.
    tool_note: Option<choices::ToolNote>,
    first_tool: Option<String>,
    started: bool,
    done: bool,
}

impl ChatStream {
    fn chunk(
        &self,
        role: bool,
        delta: ChatDelta,
        logprobs: Option<Vec<TokenLogprob>>,
        finish: Option<&'static str>,
    ) -> Bytes {
        sse::event(&ChatCompletionChunk {
            id: self.meta.id.clone(),
            object: "chat.completion.chunk",
            created: self.meta.created,
            model: self.meta.model.clone(),
            choices: vec![ChatChunkChoice {
                index: self.index,
                delta: ChunkDelta {
                    role: role.then_some("assistant"),
                    delta,
                },
                logprobs: logprobs.map(|content| ChatLogprobs { content }),
                finish_reason: finish,
            }],
            usage: self.include_usage.then_some(None),
        })
    }

    /// Chunks for parser deltas; pending logprobs ride on the first one.
    fn deltas(&mut self, mut deltas: Vec<ChatDelta>, out: &mut Vec<Bytes>) {
        if self.one_tool_call {
            chat_prompt::first_tool_call_only(&mut deltas);
        }
        for d in deltas {
            self.called_tools |= !d.tool_calls.is_empty();
            if self.first_tool.is_none() && self.tool_note.is_some() {
                self.first_tool = d.tool_calls.iter().find_map(|c| c.function.name.clone());
            }
            let lp = self
                .logprobs
                .then(|| std::mem::take(&mut self.pending_logprobs));
            out.push(self.chunk(false, d, lp, None));
        }
    }

    /// The chunks of the next step; `None` when the choice is over.
    async fn step(&mut self) -> Option<ChoiceStep> {
        if self.done {
            return None;
        }
        if !self.started {
            self.started = true;
            let first = ChatDelta {
                content: Some(String::new()),
                ..ChatDelta::default()
            };
            return Some(ChoiceStep::Chunks(
                vec![self.chunk(true, first, None, None)],
            ));
        }
        let mut out = Vec::new();
        let step = match self.gen.next().await {
            Ok(Some(Step::Piece(p))) => {
                self.pending_logprobs.extend(p.logprobs);
                let d = self.parser.push(&p.text);
                self.deltas(d, &mut out);
                return Some(ChoiceStep::Chunks(out));
            }
            Ok(Some(Step::Finished {
                piece,
                reason,
                usage,
            })) => {
                self.pending_logprobs.extend(piece.logprobs);
                let mut d = self.parser.push(&piece.text);
                d.extend(self.parser.finish());
                self.deltas(d, &mut out);
                let reason = finish_reason(reason, self.called_tools);
                if let (Some(note), Some(tool)) = (&self.tool_note, &self.first_tool) {
                    note.note(tool);
                }
                let lp = self
                    .logprobs
                    .then(|| std::mem::take(&mut self.pending_logprobs))
                    .filter(|l| !l.is_empty());
                out.push(self.chunk(false, ChatDelta::default(), lp, Some(reason)));
                ChoiceStep::Finished {
                    chunks: out,
                    usage,
                    first_of_prompt: self.first_of_prompt,
                }
            }
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(error = %e, "chat stream failed");
                ChoiceStep::Failed(sse::event(&e.body()))
            }
        };
        self.done = true;
        Some(step)
    }
}

fn stream_response(choices: Vec<Choice>, shape: Shape, include_usage: bool) -> Response {
    let Shape {
        output,
        meta,
        logprobs,
        one_tool_call,
        tool_note,
    } = shape;
    let streams = choices
        .into_iter()
        .map(|c| {
            let state = ChatStream {
                gen: c.gen,
                index: c.index,
                first_of_prompt: c.first_of_prompt,
                parser: StreamParser::new(output.clone(), ToolCallIds::Random),
                meta: meta.clone(),
                include_usage,
                logprobs,
                one_tool_call,
                pending_logprobs: Vec::new(),
                called_tools: false,
                tool_note: if c.index == 0 {
                    tool_note.clone()
                } else {
                    None
                },
                first_tool: None,
                started: false,
                done: false,
            };
            stream::unfold(state, |mut s| async move {
                let step = s.step().await?;
                Some((step, s))
            })
            .boxed()
        })
        .collect();
    sse::response(choices::merge(
        streams,
        move |usage| usage_chunk(&meta, usage),
        include_usage,
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn tool_calls_finish_reason_only_on_a_clean_stop() {
        assert_eq!(super::finish_reason("stop", true), "tool_calls");
        assert_eq!(super::finish_reason("stop", false), "stop");
        assert_eq!(super::finish_reason("length", true), "length");
    }
}
