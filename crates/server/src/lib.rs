//! agentd's OpenAI-compatible HTTP server (docs/design.md §9), on axum; a
//! request's walk through it to the engine and back is docs/design.md §7.
//!
//! - [`app`]: shared state, router (API key on all but `/health`), serving;
//!   [`listener`]: the accept loop's timeouts and connection cap.
//! - [`routes`]: `/v1/chat/completions`, `/v1/completions`, `/v1/models`,
//!   `/health`, `/metrics`, `/programs`, `/programs/release`, and the tool
//!   side of a program: `/programs/{id}`, `/programs/{id}/resources`,
//!   `/programs/{id}/environment` (docs/design.md §10, in `agentd-tools`).
//! - [`responses`]: `/v1/responses` (a response chain is a program), its
//!   store and its output items; [`chat_prompt`]: the chat-template path
//!   it shares with `/v1/chat/completions`.
//! - [`protocol`]: OpenAI wire types; [`sampling`]: request fields → engine
//!   sampling parameters; [`program_id`]: which program a request belongs to.
//! - [`structured`]: `response_format` and forced tool calls → the grammar
//!   the sampler enforces (tool calls as grammars in the model's own format
//!   are `agentd_runtime::sampling::tool_grammar`).
//! - [`choices`]: `n` and prompt lists as engine requests (the first choice
//!   is the program's turn), their streams merged; [`offload`]: template
//!   rendering, tokenization and submission on the blocking pool.
//! - [`generation`]: engine token events → text pieces (detokenisation, stop
//!   strings, logprobs); [`stop`]: the stop-string matcher; [`sse`]: framing.
//! - [`tenant`]: API keys as tenants, each with its own program ids;
//!   [`tombstone`]: releases that arrive before their program.
//! - [`metrics`]: Prometheus text under vLLM's names; [`error`]: OpenAI-shaped
//!   errors with their HTTP status; [`fallback`]: the same shape for what
//!   the stack refuses before a handler runs.

pub mod app;
pub mod chat_prompt;
pub mod choices;
pub mod controls;
pub mod error;
pub mod fallback;
pub mod fields;
pub mod generation;
pub mod listener;
pub mod metrics;
pub mod offload;
pub mod program_id;
pub mod prompt_logprobs;
pub mod protocol;
pub mod responses;
pub mod rl;
pub mod routes;
pub mod sampling;
pub mod sse;
pub mod stop;
pub mod structured;
pub mod tenant;
pub mod tombstone;

pub use app::{router, serve, AppState, SetupError, SharedState};
pub use error::ApiError;
pub use listener::ConnectionLimits;
pub use tenant::ApiKeys;
