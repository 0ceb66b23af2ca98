//! The engine: one batching loop per replica, with the program scheduler inside.
//!
//! Every step of replica *r*: ask the policy for this step's pauses and
//! admissions (on exact block counts), plan a mixed batch — decode tokens
//! first, then prefill chunks — under the token budget, allocate its slots
//! (pausing by the policy's order when blocks run out), run the model, sample,
//! stream tokens back and finish requests on their stop conditions.
//!
//! Block bookkeeping (all replicas' [`agentd_kv::KvCache`]s, the policy, the
//! program table) sits behind one mutex held for microseconds per step; the
//! model forward and sampling run outside it on the replica's own tensor
//! cache and threads. Callers never take it to submit (an inbox the workers
//! drain) or to read (a snapshot, [`Snapshot`]). Pausing a program drops its
//! block references at once; restoring re-matches its prefix and prefills
//! only what was lost.
//!
//! Each request is traced under a `request` span (its queueing, admission,
//! pauses with their cause, restores and end as events) and each step
//! under a `step` span that follows from the requests in its batch
//! (`trace.rs`; target [`TRACE_TARGET`]).

mod api;
mod board;
mod config;
mod control;
mod core;
mod engine;
mod inbox;
mod kv_events;
mod lifecycle;
mod memory;
mod metrics;
mod outbox;
mod prompt_lp;
mod sample;
mod step;
mod trace;
mod worker;

pub use agentd_runtime::MemoryTags;
pub use api::{
    EndReason, EngineError, Event, FinishReason, GenerateRequest, GroupTag, KvWhereabouts,
    ProgramEnded, ProgramStatus, TokenEvent, Usage,
};
pub use board::{Snapshot, MIN_REBUILD, READ_WAIT};
pub use config::EngineConfig;
pub use control::{ControlError, PauseMode, SwapReport};
pub use engine::{AbortHandle, Engine, RequestStream, StartError};
pub use kv_events::KvEventSink;
pub use metrics::{Counters, Histogram, MetricsSnapshot};
pub use trace::{request_span, TARGET as TRACE_TARGET};
