//! What the engine offers its callers (the HTTP server, tests, benchmarks):
//! requests in, token events out. Nothing here knows about HTTP or blocks.

use agentd_runtime::{InvalidSampling, SamplingParams};

/// One generation request of a program. The default is an empty one-off
/// request with default sampling: no program, group, tool, salt or parent.
#[derive(Debug, Clone, Default)]
pub struct GenerateRequest {
    /// The client's program id (body `program_id`, `extra_body.program_id` or
    /// the `X-Session-ID` header). `None` makes the request a one-off program
    /// of its own, released when it finishes.
    pub program: Option<String>,
    /// The full prompt: for a program's next turn, its whole conversation so
    /// far (as OpenAI clients resend it); the engine reuses whatever KV of it
    /// survives.
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    /// Release the program once this request finishes (the `final` flag).
    pub final_request: bool,
    /// The program that spawned this one (a subagent's caller; Dynamo's
    /// `x-dynamo-parent-session-id`). Recorded on the program, shown on `/programs`.
    pub parent_program: Option<String>,
    /// Prefix-cache salt: the request shares KV blocks only with requests of
    /// the same salt (the server derives it from the tenant and the body's
    /// `cache_salt`; 0 shares with every unsalted request).
    pub cache_salt: u64,
    /// The rollout group the program belongs to (`group_id`; the `n`
    /// choices of one request form one implicitly): the scheduler admits
    /// and restores its members together.
    pub group: Option<GroupTag>,
    /// The tool the program runs once this request finishes
    /// (`extra_body.tool_name`): its observed durations set the program's
    /// decay while it acts (see `agentd_scheduler`'s `tools`).
    pub tool: Option<String>,
}

/// A program's rollout group, by name (scoped to the tenant by the caller),
/// and how many members it will have when the client says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupTag {
    pub name: String,
    pub size: Option<usize>,
}

/// A stable 64-bit hash of a name (xxh3, the project's string hash, as for
/// block contents and cache salts): group and tool names become the
/// scheduler's ids without the scheduler ever seeing strings.
pub(crate) fn name_hash(s: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(s.as_bytes())
}

/// Why a request stopped: the sampler's own enum (one finish reason from
/// the sampler to the HTTP response), re-exported here.
pub use agentd_runtime::FinishReason;

/// Token counts of one finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV was reused when the request first started.
    pub cached_tokens: usize,
}

/// One generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    pub token_id: u32,
    /// Raw log-probability (when the request asked for logprobs).
    pub logprob: Option<f32>,
    /// Top alternatives `(token, logprob)`, best first.
    pub top: Vec<(u32, f32)>,
    /// The token ended the request as a stop token id or EOS (see
    /// [`agentd_runtime::SampleOutput::stop_token`]).
    pub stop_token: bool,
    /// On the request's first token, when it asked for them: the prompt's
    /// logprobs, entry `j` for prompt token `j + 1` (vLLM sends them with
    /// the first output too).
    pub prompt_logprobs: Option<Vec<agentd_runtime::PromptLogprob>>,
}

/// What a request's stream carries.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Token(TokenEvent),
    /// The last event of every request.
    Finished {
        reason: FinishReason,
        usage: Usage,
    },
}

/// Why a request was refused at submission.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    #[error("the engine is overloaded: {waiting} requests waiting (limit {limit}); retry later")]
    Overloaded { waiting: usize, limit: usize },
    #[error("this model's maximum context length is {max} tokens; the request has {prompt} prompt tokens and asks for {max_tokens} more")]
    ContextTooLong {
        prompt: usize,
        max_tokens: usize,
        max: usize,
    },
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A sampling parameter out of range ([`SamplingParams::validate`]).
    #[error("invalid request: {0}")]
    InvalidSampling(#[from] InvalidSampling),
    #[error("the engine is shutting down")]
    ShuttingDown,
}

/// A program as `GET /programs` shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ProgramStatus {
    pub id: String,
    /// "reasoning" or "acting".
    pub phase: &'static str,
    /// "active", "paused" or "terminated".
    pub state: &'static str,
    /// Where it is in its life, from the scheduler's program record
    /// (`agentd_scheduler::Lifecycle`): "idle", "queued", "running",
    /// "acting", "paused" or "released".
    pub lifecycle: &'static str,
    pub replica: Option<usize>,
    pub context_tokens: usize,
    pub blocks_held: usize,
    /// Where its KV is (`agentd_kv::Whereabouts`): what a restore costs.
    pub kv: KvWhereabouts,
    /// Requests completed.
    pub steps: u64,
    /// 1 while its request waits for the program's restore.
    pub waiting_requests: usize,
    /// Requests of the program running beside its main one (siblings).
    pub parallel_requests: usize,
    /// The program that spawned it, when a request said so.
    pub parent_program: Option<String>,
    /// The scheduler's last keep / swap / recompute choice for its KV
    /// (`agentd_scheduler::Park`): "keep" while kept resident though memory
    /// was wanted, "swap" or "recompute" while paused; none once admitted
    /// again.
    pub park: Option<&'static str>,
}

/// Where a program's full KV blocks are, in blocks: in the device pool
/// (kept: a restore costs nothing), in the host tier (swapped: a restore
/// copies them back) or lost (a restore recomputes them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct KvWhereabouts {
    pub device: usize,
    pub host: usize,
    pub lost: usize,
}

/// Why a program ended (the program table's, `agentd_scheduler`).
pub use agentd_scheduler::EndReason;

/// A named program has terminated in the engine: its KV is released and
/// whatever the outside world tied to it (tool resources) can be reclaimed.
/// One-off programs (no id) are not announced: nothing outside can name them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramEnded {
    pub id: String,
    pub reason: EndReason,
    /// When the engine ended it: a subscriber that sees the event late can
    /// tell it apart from a new program reusing the id since.
    pub at: std::time::Instant,
}
