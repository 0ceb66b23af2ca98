//! One response from request to stored result: the chain's history and
//! program, the chat-template prompt, the engine request, and the loop that
//! turns its text into output items (and stream events).
//!
//! A chain of responses is one program (docs/design.md §2): the first response names
//! it (its own id, unless the request gives a `program_id`), each
//! `previous_response_id` submits the whole conversation again under that
//! program, and the engine reuses the KV it kept. `store: false` marks the
//! request `final`, so the program ends with it.

use std::sync::Arc;

use agentd_chat::{ChatMessage, OutputOptions, StreamParser, ToolCallIds};
use axum::http::HeaderMap;
use serde_json::{json, Value as Json};
use tokio::sync::Notify;

use super::continuation::{self, Turn};
use super::input::{append_input, chat_tool_choice, chat_tools};
use super::output::OutputBuilder;
use super::protocol::{ResponseObject, ResponsesRequest, Status};
use super::store::Stored;
use crate::app::SharedState;
use crate::chat_prompt::{self, ChatInput, ChatPrompt};
use crate::choices::{self, Choice};
use crate::error::ApiError;
use crate::generation::{Generation, Step};
use crate::program_id::{self, ProgramRef};
use crate::protocol::UsageInfo;
use crate::sampling;
use crate::structured;
use crate::tenant::{Caller, ProgramKey};
use agentd_runtime::sampling::Constraint;

/// A response submitted to the engine, not yet generated.
pub struct Prepared {
    pub object: ResponseObject,
    /// The conversation so far (without instructions), this input included.
    history: Vec<ChatMessage>,
    output: OutputOptions,
    choice: Choice,
    prompt: Vec<u32>,
    /// The tenant that created it ([`drive`] may run on a task of its own,
    /// outside the request's caller scope).
    owner: Caller,
    /// Fires on cancel. Registered before the create call returns, so a
    /// cancel that arrives before a background response's task first runs
    /// is not lost.
    cancel: Arc<Notify>,
    /// Feeds the turn's first tool call to the per-tool statistics.
    tool_note: Option<choices::ToolNote>,
    /// `parallel_tool_calls: false`: only the first tool call is output.
    one_tool_call: bool,
}

/// Builds the prompt of `req` and submits it.
pub fn prepare(
    state: &SharedState,
    headers: &HeaderMap,
    mut req: ResponsesRequest,
) -> Result<Prepared, ApiError> {
    state.check_model(req.common.model.as_deref())?;
    let store = req.store.unwrap_or(true);
    if req.background && !store {
        return Err(ApiError::invalid(
            "background",
            "background responses must be stored (store: true)",
        ));
    }
    let resolved = program_id::resolve(&req.common, headers)?;
    let id = state.request_id("resp");
    let (prev, program, history) = conversation(state, &req, &resolved, &id)?;
    if req.common.prompt_logprobs.take().is_some() {
        // vLLM's ResponsesRequest does not define it: ignored, as there.
        tracing::info!(
            field = "prompt_logprobs",
            "request field ignored: no API defines it here"
        );
    }
    let (prompt, tokens, constraint) = render(state, &req, &history, prev.as_ref())?;
    let sampling = response_sampling(state, &mut req, tokens.len(), constraint)?;
    let program_ref = ProgramRef {
        program: Some(program.clone()),
        final_request: !store || resolved.final_request,
        ..resolved
    };
    tracing::info!(response = %id, program = %program, prompt_tokens = tokens.len(),
        previous = ?req.previous_response_id, store, stream = req.common.stream, "response");
    let choice = choices::submit(
        state,
        std::slice::from_ref(&id),
        &program_ref,
        vec![(tokens.clone(), sampling)],
        1,
        false,
    )?
    .pop()
    .ok_or_else(|| ApiError::Internal("no choice submitted".into()))?;
    let object = ResponseObject::started(id, state.model_name.clone(), &req, program);
    // Visible to GET and cancel from now on (a background request returns
    // before its task first runs).
    let owner = Caller::current();
    keep(
        state,
        owner,
        &object,
        Arc::new(history.clone()),
        Arc::default(),
    );
    let cancel = state.responses.start(&object.id, owner);
    let tool_note = choices::ToolNote::new(state, &program_ref);
    Ok(Prepared {
        object,
        history,
        output: prompt.output,
        choice,
        prompt: tokens,
        owner,
        cancel,
        tool_note,
        one_tool_call: req.parallel_tool_calls == Some(false),
    })
}

/// The stored response `req` continues (if any), the program it runs in
/// (the previous response's, else the request's, else a one-off named by
/// `id`) and the conversation with its new input appended.
fn conversation(
    state: &SharedState,
    req: &ResponsesRequest,
    resolved: &ProgramRef,
    id: &str,
) -> Result<(Option<Stored>, String, Vec<ChatMessage>), ApiError> {
    let prev = match &req.previous_response_id {
        Some(prev) => Some(previous(state, prev)?),
        None => None,
    };
    let program = match &prev {
        Some(p) => p.object.program_id.clone(),
        None => resolved.program.clone().unwrap_or_else(|| id.to_owned()),
    };
    let mut history = prev
        .as_ref()
        .map(|p| (*p.history).clone())
        .unwrap_or_default();
    match &req.input {
        Some(input) => append_input(&mut history, input)?,
        None if prev.is_none() => return Err(ApiError::invalid("input", "input is required")),
        None => {}
    }
    Ok((prev, program, history))
}

/// The sampling of a response of `prompt_len` tokens: the common fields
/// (`max_output_tokens` standing for `max_tokens`), the server's defaults,
/// the logit controls and the structured-output `constraint`.
fn response_sampling(
    state: &SharedState,
    req: &mut ResponsesRequest,
    prompt_len: usize,
    constraint: Option<agentd_runtime::sampling::Constraint>,
) -> Result<sampling::Sampling, ApiError> {
    if let Some(m) = req.max_output_tokens {
        req.common.max_tokens = Some(m);
        req.common.max_completion_tokens = None;
    }
    let ask = sampling::Ask {
        defaults: &state.sampling_defaults,
        logprobs: None,
        prompt_len,
    };
    let mut sampling = sampling::for_request(state, &req.common, ask)?;
    sampling.params.constraint = constraint;
    Ok(sampling)
}

/// The stored response a request continues; it must have finished.
fn previous(state: &SharedState, id: &str) -> Result<Stored, ApiError> {
    let (found, ended) = state.responses.get(id, Caller::current());
    release_all(state, ended);
    let prev = found.ok_or_else(|| ApiError::ResponseNotFound(id.to_string()))?;
    if !prev.object.status.is_final() {
        return Err(ApiError::invalid(
            "previous_response_id",
            format!("response '{id}' is still in progress"),
        ));
    }
    Ok(prev)
}

/// Renders `history` (after `instructions`, with the request's tools) and
/// tokenises it, continuing `prev`'s exact tokens when it can
/// ([`continuation`]); with the request's output constraint.
fn render(
    state: &SharedState,
    req: &ResponsesRequest,
    history: &[ChatMessage],
    prev: Option<&Stored>,
) -> Result<(ChatPrompt, Vec<u32>, Option<Constraint>), ApiError> {
    let tools = req.tools.as_deref().map(chat_tools).transpose()?;
    let tool_choice = chat_tool_choice(req.tool_choice.as_ref())?;
    let mut kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
    let constraint = structured::constraint(
        state,
        structured::responses_format(req.text.as_ref())?,
        tools.as_deref().unwrap_or_default(),
        tool_choice.as_ref(),
        &mut kwargs,
    )?;
    let with_instructions = |h: &[ChatMessage]| {
        let mut m = Vec::with_capacity(h.len() + 1);
        if let Some(instructions) = &req.instructions {
            m.push(ChatMessage::text("system", instructions.as_str()));
        }
        m.extend(h.iter().cloned());
        m
    };
    let input = |messages: &[ChatMessage], add_generation_prompt| {
        let input = ChatInput {
            messages,
            tools: tools.as_deref(),
            tool_choice: tool_choice.as_ref(),
            chat_template_kwargs: kwargs.clone(),
            add_generation_prompt,
            continue_final_message: false,
            add_special_tokens: false,
        };
        chat_prompt::render_text(state, &input)
    };
    let messages = with_instructions(history);
    let (text, output) = input(&messages, None)?;
    let prompt = ChatPrompt {
        tokens: state.tokenizer.encode(&text, false)?,
        text,
        output,
    };
    let Some(prev) = prev.filter(|p| !p.turn.prompt.is_empty()) else {
        let tokens = prompt.tokens.clone();
        return Ok((prompt, tokens, constraint));
    };
    let probe = |extra: &[ChatMessage], generation: bool| {
        input(&with_instructions(extra), Some(generation)).map(|(text, _)| text)
    };
    let user = ChatMessage::text("user", continuation::MARKER);
    let new = history.get(prev.history.len()..).unwrap_or_default();
    let grown: Vec<ChatMessage> = std::iter::once(user.clone())
        .chain(new.iter().cloned())
        .collect();
    let probes = continuation::Probes {
        answered: probe(
            &[
                user.clone(),
                ChatMessage::text("assistant", continuation::MARKER),
            ],
            false,
        )?,
        base: probe(std::slice::from_ref(&user), false)?,
        grown: probe(&grown, true)?,
    };
    let tokens = continuation::tokens(&state.tokenizer, &prev.turn, &probes)?
        .unwrap_or_else(|| prompt.tokens.clone());
    Ok((prompt, tokens, constraint))
}

/// Releases the programs (engine keys) of chains that left the store.
pub fn release_all(state: &SharedState, programs: Vec<ProgramKey>) {
    for p in programs {
        if state.engine.release(p.as_str()) {
            tracing::info!(program = %p, "response chain ended: program released");
        }
    }
}

fn keep(
    state: &SharedState,
    owner: Caller,
    object: &ResponseObject,
    history: Arc<Vec<ChatMessage>>,
    turn: Arc<Turn>,
) {
    if object.store {
        let ended = state.responses.put(Stored {
            object: object.clone(),
            history,
            turn,
            owner,
        });
        release_all(state, ended);
    }
}

/// Generates `p` to the end (or until cancelled through the store),
/// handing each batch of stream events to `sink`; a `false` from `sink`
/// (the client went away) cancels. Returns the final response object,
/// stored when the request asked for it.
pub async fn drive(
    state: SharedState,
    p: Prepared,
    mut sink: impl FnMut(Vec<Json>) -> bool,
) -> ResponseObject {
    let Prepared {
        mut object,
        history,
        output,
        choice,
        prompt,
        owner,
        cancel,
        tool_note,
        one_tool_call,
    } = p;
    let history = Arc::new(history);
    object.status = Status::InProgress;
    keep(&state, owner, &object, history.clone(), Arc::default());
    let created = json!({"type": "response.created", "response": &object});
    let in_progress = json!({"type": "response.in_progress", "response": &object});
    let alive = sink(vec![created, in_progress]);
    let reader = Reader {
        parser: StreamParser::new(output, ToolCallIds::Random),
        builder: OutputBuilder::new(&object.id),
        one_tool_call,
    };
    // Dropped at its end: the engine request is cancelled if still running.
    let mut g = generate(choice.gen, reader, &cancel, alive, &mut sink).await;
    state.responses.stop(&object.id);
    let (items, message) = g.builder.finish(&mut g.ev);
    let terminal = settle(&mut object, g.finished, items);
    if matches!(object.status, Status::Completed | Status::Incomplete) {
        let first = message.tool_calls.as_ref().and_then(|c| c.first());
        if let (Some(note), Some(call)) = (&tool_note, first) {
            note.note(&call.function.name);
        }
    }
    let mut full = (*history).clone();
    full.push(message);
    // Only a clean finish leaves the program's KV holding exactly these
    // tokens.
    let turn = match object.status {
        Status::Completed | Status::Incomplete => {
            Turn::new(&state.tokenizer, prompt, &g.ids).unwrap_or_default()
        }
        _ => Turn::default(),
    };
    keep(&state, owner, &object, Arc::new(full), Arc::new(turn));
    g.ev.push(json!({"type": terminal, "response": &object}));
    sink(g.ev);
    object
}

/// Turns the generated text into output items (and their events).
struct Reader {
    parser: StreamParser,
    builder: OutputBuilder,
    /// `parallel_tool_calls: false`: only the first tool call is output.
    one_tool_call: bool,
}

impl Reader {
    fn push(&mut self, text: &str, end: bool, ev: &mut Vec<Json>) {
        let mut d = self.parser.push(text);
        if end {
            d.extend(self.parser.finish());
        }
        if self.one_tool_call {
            chat_prompt::first_tool_call_only(&mut d);
        }
        self.builder.push(d, ev);
    }
}

/// What [`generate`] leaves: how it ended (`None`: cancelled, or the
/// client went away), the generated ids, the output so far and the events
/// not yet handed out.
struct Generated {
    finished: Option<Result<(&'static str, UsageInfo), ApiError>>,
    ids: Vec<u32>,
    builder: OutputBuilder,
    ev: Vec<Json>,
}

/// Reads `gen` to its end, handing each step's events to `sink`, until a
/// cancel or a `false` from `sink`.
async fn generate(
    mut gen: Generation,
    mut reader: Reader,
    cancel: &Notify,
    mut alive: bool,
    sink: &mut impl FnMut(Vec<Json>) -> bool,
) -> Generated {
    let mut ev = Vec::new();
    let mut ids = Vec::new();
    let finished = loop {
        if !alive {
            break None;
        }
        let step = tokio::select! {
            step = gen.next() => step,
            () = cancelled(cancel) => break None,
        };
        match step {
            Ok(Some(Step::Piece(piece))) => {
                reader.push(&piece.text, false, &mut ev);
                ids.extend(piece.token_ids);
            }
            Ok(Some(Step::Finished {
                piece,
                reason,
                usage,
            })) => {
                ids.extend(piece.token_ids);
                reader.push(&piece.text, true, &mut ev);
                break Some(Ok((reason, usage)));
            }
            Ok(None) => break Some(Err(ApiError::Internal("generation ended early".into()))),
            Err(e) => break Some(Err(e)),
        }
        if !ev.is_empty() {
            alive = sink(std::mem::take(&mut ev));
        }
    };
    Generated {
        finished,
        ids,
        builder: reader.builder,
        ev,
    }
}

/// Sets the object's final status and output; the terminal event's name.
fn settle(
    object: &mut ResponseObject,
    finished: Option<Result<(&'static str, UsageInfo), ApiError>>,
    items: Vec<Json>,
) -> &'static str {
    match finished {
        Some(Ok((reason, usage))) => {
            object.finish(reason, items, usage.into());
            match object.status {
                Status::Incomplete => "response.incomplete",
                _ => "response.completed",
            }
        }
        Some(Err(e)) => {
            tracing::warn!(response = %object.id, error = %e, "response failed");
            object.output = items;
            object.fail(&e);
            "response.failed"
        }
        None => {
            tracing::info!(response = %object.id, "response cancelled");
            object.output = items;
            object.status = Status::Cancelled;
            "response.cancelled"
        }
    }
}

async fn cancelled(n: &Notify) {
    n.notified().await
}
