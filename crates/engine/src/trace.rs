//! Tracing: a span per request and one per engine step, linked, so a
//! request's queue time, admission, pauses, restores and steps read as one
//! trace (in the log with `RUST_LOG=agentd::trace=info`, or exported with
//! `agentd serve --otlp-traces-endpoint`).
//!
//! - `request` spans are made at the server's edge ([`request_span`], passed
//!   in with [`crate::Engine::submit_traced`]; [`crate::Engine::submit`]
//!   makes one itself) and carried with the submission; the engine records
//!   on them, as events: `queued` (the policy queued it), `admitted` (its
//!   first start, with the cached prefix and its queue time), `paused`
//!   (with the cause), `restored` (its program started again after a pause,
//!   with that pause's cause and length) and `finished` (reason, token
//!   counts, also recorded as span fields).
//! - `step` spans are made by each replica's worker around a step (the
//!   forward, sampling and commit) and follow from the request spans of the
//!   sequences in its batch (`follows_from`: a step serves many requests,
//!   a request spans many steps).
//!
//! No tracing work happens under the engine lock beyond cloning a span
//! handle: the lock's sections queue [`Mark`]s in the outbox, which emits
//! them once the lock is free ([`crate::outbox`]), and the step span is
//! made and linked by the worker outside it. With no subscriber interested
//! in [`TARGET`] every span is disabled and nothing is queued at all.

use tracing::field::Empty;
use tracing::Span;

use crate::{FinishReason, Usage};

/// The target of every span and event here: `RUST_LOG=agentd::trace=info`
/// prints them; the OTLP exporter takes them.
pub const TARGET: &str = "agentd::trace";

/// The span of one request. `request_id` is the server's response id,
/// `program` the program key (tenant-scoped), `tenant` the caller's
/// tenant when there are several; the token counts, cached prefix and
/// finish reason are recorded when the request finishes.
pub fn request_span(
    request_id: Option<&str>,
    program: Option<&str>,
    tenant: Option<&str>,
    prompt_tokens: usize,
) -> Span {
    tracing::info_span!(
        target: TARGET,
        "request",
        request_id,
        program,
        tenant,
        prompt_tokens,
        completion_tokens = Empty,
        cached_tokens = Empty,
        finish_reason = Empty,
    )
}

/// The span of one engine step of `replica`: its batch, and the prefill
/// and decode tokens it computes.
pub(crate) fn step_span(replica: usize, seqs: usize, prefill: usize, decode: usize) -> Span {
    tracing::info_span!(
        target: TARGET,
        "step",
        replica,
        batch = seqs,
        prefill_tokens = prefill,
        decode_tokens = decode,
    )
}

/// Why a program was paused (the `cause` of `paused` and `restored`): the
/// scheduler's one definition, which its counts use too.
pub(crate) type Cause = agentd_scheduler::PauseCause;

/// Something that happened to a request under the engine lock, emitted as
/// an event of its span once the lock is free.
#[derive(Debug)]
pub(crate) enum Mark {
    /// The policy queued it (its program is not active on a replica).
    Queued {
        waiting: usize,
    },
    /// Its first start on a replica.
    Admitted {
        replica: usize,
        cached_tokens: usize,
        queue_s: f64,
    },
    /// Its program's KV was released mid-request.
    Paused {
        cause: Cause,
    },
    /// Its program started again after a pause (of this request, or while
    /// the program acted between requests).
    Restored {
        replica: usize,
        cached_tokens: usize,
        cause: Cause,
        paused_s: f64,
    },
    Finished {
        reason: FinishReason,
        usage: Usage,
    },
}

impl Mark {
    /// Emits the event on `span` (outside the engine lock).
    pub fn emit(self, span: &Span) {
        match self {
            Mark::Queued { waiting } => {
                tracing::info!(target: TARGET, parent: span, waiting, "queued")
            }
            Mark::Admitted {
                replica,
                cached_tokens,
                queue_s,
            } => tracing::info!(
                target: TARGET,
                parent: span,
                replica,
                cached_tokens,
                queue_s,
                "admitted"
            ),
            Mark::Paused { cause } => {
                tracing::info!(target: TARGET, parent: span, cause = cause.as_str(), "paused")
            }
            Mark::Restored {
                replica,
                cached_tokens,
                cause,
                paused_s,
            } => tracing::info!(
                target: TARGET,
                parent: span,
                replica,
                cached_tokens,
                cause = cause.as_str(),
                paused_s,
                "restored"
            ),
            Mark::Finished { reason, usage } => {
                let reason = reason.as_openai();
                span.record("completion_tokens", usage.completion_tokens);
                span.record("cached_tokens", usage.cached_tokens);
                span.record("finish_reason", reason);
                tracing::info!(
                    target: TARGET,
                    parent: span,
                    finish_reason = reason,
                    completion_tokens = usage.completion_tokens,
                    "finished"
                )
            }
        }
    }
}
