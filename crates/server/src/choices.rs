//! Several choices in one response: OpenAI's `n`, and `/v1/completions` with
//! a list of prompts. Each choice is its own engine request. The first choice
//! is the program's turn (its KV continues the program); the others run as
//! one-off sequences that reuse the prompt's full blocks through the prefix
//! cache, as vLLM's parallel sampling does. Streams of the choices are merged
//! into one SSE response with one usage chunk and one `[DONE]`.

use std::sync::atomic::{AtomicU64, Ordering};

use agentd_engine::{GenerateRequest, GroupTag};
use bytes::Bytes;
use futures_util::future::try_join_all;
use futures_util::stream::{self, BoxStream, StreamExt};

use crate::app::SharedState;
use crate::error::ApiError;
use crate::generation::{collect, Collected, Generation};
use crate::program_id::ProgramRef;
use crate::protocol::{unix_now, UsageInfo};
use crate::sampling::Sampling;
use crate::sse;
use crate::tenant::{Caller, ProgramKey};

/// Most choices one request may ask for (prompts × n).
pub const MAX_CHOICES: usize = 64;

/// `n` from the request, checked against [`MAX_CHOICES`] for `prompts` prompts.
pub fn count(n: Option<u64>, prompts: usize) -> Result<usize, ApiError> {
    let n = n.unwrap_or(1);
    if n == 0 {
        return Err(ApiError::invalid("n", "n must be at least 1"));
    }
    let total = (n as usize).saturating_mul(prompts);
    if n > MAX_CHOICES as u64 || total > MAX_CHOICES {
        return Err(ApiError::invalid(
            "n",
            format!("{prompts} prompt(s) x n={n} choices is more than {MAX_CHOICES}"),
        ));
    }
    Ok(n as usize)
}

/// What every chunk and response of one request repeats: its id, creation
/// time and model name.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl ResponseMeta {
    /// A fresh id with `prefix` (`cmpl`, `chatcmpl`), stamped now.
    pub fn new(state: &SharedState, prefix: &str) -> Self {
        ResponseMeta {
            id: state.request_id(prefix),
            created: unix_now(),
            model: state.model_name.clone(),
        }
    }
}

/// One choice being generated.
pub struct Choice {
    /// `index` in the response: prompt * n + j.
    pub index: usize,
    /// Whether this is the first choice of its prompt (its prompt tokens and
    /// cache hits count once in the usage).
    pub first_of_prompt: bool,
    pub gen: Generation,
}

/// [`submit`] on the blocking pool, as the request's caller: submitting
/// builds each choice's sampler (penalty setup over the whole prompt, the
/// grammar's start) and copies the prompt per choice, O(prompt) work that
/// must not stall the runtime's sockets on a 100k-token prompt.
pub async fn submit_offloaded(
    state: &SharedState,
    request_ids: &[String],
    program: &ProgramRef,
    prompts: Vec<(Vec<u32>, Sampling)>,
    n: usize,
    logprobs: bool,
) -> Result<Vec<Choice>, ApiError> {
    let (state, program, caller) = (state.clone(), program.clone(), Caller::current());
    let ids = request_ids.to_vec();
    crate::offload::run(move || {
        caller.scope_sync(|| submit(&state, &ids, &program, prompts, n, logprobs))
    })
    .await
}

/// Submits `n` engine requests per prompt, each traced under a `request`
/// span (`agentd_engine::request_span`) with its prompt's request id:
/// `request_ids` holds one per prompt (SGLang's `rid`s) or one for them
/// all (the OpenAI response's id). A refusal of any of them (the queue is full, say) drops those
/// already submitted, cancelling them.
pub fn submit(
    state: &SharedState,
    request_ids: &[String],
    program: &ProgramRef,
    prompts: Vec<(Vec<u32>, Sampling)>,
    n: usize,
    logprobs: bool,
) -> Result<Vec<Choice>, ApiError> {
    // The engine and the tool side know the program under its tenant's key.
    let key = program
        .program
        .as_deref()
        .map(|id| Caller::current().program_key(id));
    let released = key.as_ref().is_some_and(|k| state.released.take(k));
    if released {
        tracing::info!(program = ?key, "released before its first request: this request is its last");
    }
    // Before the engine sees the request: a `final` request may end the
    // program (and so reclaim its resources) as soon as it is submitted.
    state.declare_tools(key.as_ref(), program)?;
    let cache_salt = Caller::current().prefix_salt(program.cache_salt.as_deref());
    let tenant = Caller::current().tenant_key();
    let mut out = Vec::with_capacity(prompts.len() * n);
    for (p, (prompt, sampling)) in prompts.into_iter().enumerate() {
        let group = group_of(program, n);
        let request_id = request_ids.get(p).or(request_ids.first());
        for j in 0..n {
            let first = p == 0 && j == 0;
            let mut params = sampling.params.clone();
            // Distinct but reproducible streams for the choices of a seeded request.
            params.seed = params.seed.map(|s| s.wrapping_add(j as u64));
            // The prompt's logprobs are the same for every choice of it:
            // the first computes them (without prefix-cache hits), the
            // others reuse its blocks.
            if j > 0 {
                params.prompt_logprobs = None;
            }
            let engine_program = key.as_ref().filter(|_| first).map(|k| k.to_string());
            let span = agentd_engine::request_span(
                request_id.map(String::as_str),
                engine_program.as_deref(),
                tenant.as_deref(),
                prompt.len(),
            );
            let req = GenerateRequest {
                program: engine_program,
                prompt: prompt.clone(),
                sampling: params,
                final_request: first && (program.final_request || released),
                parent_program: if first { program.parent.clone() } else { None },
                cache_salt,
                group: group.clone(),
                tool: if first {
                    program.tool_name.clone()
                } else {
                    None
                },
            };
            let stream = state.engine.submit_traced(req, span)?;
            out.push(Choice {
                index: p * n + j,
                first_of_prompt: j == 0,
                gen: Generation::new(
                    stream,
                    state.tokenizer.clone(),
                    &sampling,
                    logprobs,
                    prompt.len(),
                ),
            });
        }
    }
    Ok(out)
}

/// The group a prompt's choices join: the client's `group_id` (scoped to
/// its tenant like a program id), else, for `n > 1`, one of their own — the
/// `n` samples of one prompt are a rollout group.
fn group_of(program: &ProgramRef, n: usize) -> Option<GroupTag> {
    static IMPLICIT: AtomicU64 = AtomicU64::new(0);
    match &program.group {
        Some(g) => Some(GroupTag {
            name: Caller::current().group_key(g),
            size: program.group_size,
        }),
        None if n > 1 => Some(GroupTag {
            name: format!("n:{}", IMPLICIT.fetch_add(1, Ordering::Relaxed)),
            size: Some(n),
        }),
        None => None,
    }
}

/// Tells the engine which tool a named program runs after this turn, from
/// the tool calls the turn returned (the per-tool decay's input), unless the
/// request named it (`tool_name`, noted by the engine at the request's end).
#[derive(Clone)]
pub struct ToolNote {
    engine: agentd_engine::Engine,
    program: ProgramKey,
}

impl ToolNote {
    /// Built inside the handler (the caller's tenant scopes the program).
    pub fn new(state: &SharedState, program: &ProgramRef) -> Option<Self> {
        if program.tool_name.is_some() {
            return None;
        }
        let id = program.program.as_ref()?;
        Some(Self {
            engine: state.engine.clone(),
            program: Caller::current().program_key(id),
        })
    }

    /// The turn returned a call of `tool` (the first, when several). Call
    /// once the request finished: the program is acting from then on.
    pub fn note(&self, tool: &str) {
        if !self.engine.note_tool(self.program.as_str(), tool) {
            tracing::debug!(program = %self.program, tool, "tool of an ended program not noted");
        }
    }
}

/// Runs every choice to the end, concurrently. Each result carries its
/// `index` and whether it is the first choice of its prompt (for
/// [`merge_usage`]). The first error ends them all (the others are dropped,
/// which cancels them).
pub async fn collect_all(choices: Vec<Choice>) -> Result<Vec<(usize, bool, Collected)>, ApiError> {
    try_join_all(choices.into_iter().map(|c| async move {
        let first = c.first_of_prompt;
        collect(c.gen).await.map(|d| (c.index, first, d))
    }))
    .await
}

/// Usage of a multi-choice response: prompt tokens and cache hits once per
/// prompt, completion tokens of every choice.
pub fn merge_usage(parts: &[(bool, UsageInfo)]) -> UsageInfo {
    let (mut prompt, mut completion, mut cached) = (0, 0, 0);
    for (first, u) in parts {
        if *first {
            prompt += u.prompt_tokens;
            cached += u.prompt_tokens_details.cached_tokens;
        }
        completion += u.completion_tokens;
    }
    UsageInfo::new(prompt, completion, cached)
}

/// What one choice's stream produced at a step.
pub enum ChoiceStep {
    /// Chunks to send.
    Chunks(Vec<Bytes>),
    /// The last chunks of the choice, and its usage.
    Finished {
        chunks: Vec<Bytes>,
        usage: UsageInfo,
        first_of_prompt: bool,
    },
    /// An error event; the whole response ends after it.
    Failed(Bytes),
}

/// Interleaves the choices' chunks as they come; after the last choice
/// finishes, the merged usage chunk (when asked for) and `[DONE]`. An error
/// in any choice ends the response (dropping the others cancels them); so
/// does an engine that goes away, and `[DONE]` goes out exactly once.
pub fn merge(
    choices: Vec<BoxStream<'static, ChoiceStep>>,
    usage_chunk: impl Fn(UsageInfo) -> Bytes + Send + Sync + 'static,
    include_usage: bool,
) -> BoxStream<'static, Bytes> {
    let total = choices.len();
    let merged = stream::select_all(choices);
    let state = (
        merged,
        Vec::<(bool, UsageInfo)>::with_capacity(total),
        false,
    );
    let usage_chunk = std::sync::Arc::new(usage_chunk);
    stream::unfold(state, move |(mut merged, mut usages, done)| {
        let usage_chunk = usage_chunk.clone();
        async move {
            if done {
                return None;
            }
            let mut out = Vec::new();
            let ended = match merged.next().await {
                Some(ChoiceStep::Chunks(c)) => {
                    out.extend(c);
                    false
                }
                Some(ChoiceStep::Finished {
                    chunks,
                    usage,
                    first_of_prompt,
                }) => {
                    out.extend(chunks);
                    usages.push((first_of_prompt, usage));
                    if usages.len() == total && include_usage {
                        out.push(usage_chunk(merge_usage(&usages)));
                    }
                    usages.len() == total
                }
                Some(ChoiceStep::Failed(e)) => {
                    out.push(e);
                    true
                }
                None => true,
            };
            if ended {
                out.push(Bytes::from_static(sse::DONE));
            }
            Some((stream::iter(out), (merged, usages, ended)))
        }
    })
    .flatten()
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choice_counts_are_bounded() {
        assert_eq!(count(None, 1).ok(), Some(1));
        assert_eq!(count(Some(4), 2).ok(), Some(4));
        assert!(count(Some(0), 1).is_err());
        assert!(count(Some(65), 1).is_err());
        assert!(count(Some(40), 2).is_err());
        assert!(count(Some(u64::MAX), 1).is_err());
    }

    #[test]
    fn usage_counts_each_prompt_once() {
        let u = |p, c, k| UsageInfo::new(p, c, k);
        let m = merge_usage(&[
            (true, u(10, 5, 8)),
            (false, u(10, 7, 8)),
            (true, u(3, 2, 0)),
        ]);
        assert_eq!(m, u(13, 14, 8));
    }
}
