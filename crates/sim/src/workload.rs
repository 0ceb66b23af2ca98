//! Agentic workloads: programs made of turns, each turn a tool output appended
//! to the context, a generation, then a tool call of some duration.
//!
//! Token ids are synthetic but content-faithful: the system prompt is the same
//! sequence for every program (so the prefix cache can share it), everything
//! else is unique to its program, and all of it is reproducible from the seed.

use std::str::FromStr;

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, LogNormal};

/// A named workload shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub name: String,
    /// Tokens of the system prompt shared by every program.
    pub system_tokens: usize,
    /// Tokens of the first user message (the task), unique per program.
    pub task_tokens: (usize, usize),
    /// Turns planned per program, uniform in [min, max].
    pub steps: (usize, usize),
    /// Tool output appended per turn: log-normal (median, sigma) clipped to [min, max].
    pub tool_tokens: LogNormalClip,
    /// Tokens generated per turn, uniform in [min, max].
    pub gen_tokens: (usize, usize),
    /// Tool time per turn in seconds: log-normal (median, sigma) clipped.
    pub tool_time_s: LogNormalClip,
    /// Named tools, each with its probability and time distribution; when
    /// non-empty a turn's tool is drawn from these (and named to the
    /// scheduler) instead of `tool_time_s`.
    pub tools: Vec<NamedTool>,
    /// The agent stops when its next prompt would exceed this context (as
    /// SWE-agent's `exit_context` does at the model's window).
    pub max_context: usize,
    /// Programs per rollout group (GRPO's n samples of one task): members
    /// share the task prompt and are announced to the scheduler as a group;
    /// a group is replaced when its last member ends. 1: no groups.
    pub group_size: usize,
}

/// A tool of a mixed workload.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedTool {
    pub name: &'static str,
    /// Probability weight (normalised over the workload's tools).
    pub weight: f64,
    pub time_s: LogNormalClip,
}

/// A log-normal distribution given by its median and sigma, clipped to [lo, hi].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogNormalClip {
    pub median: f64,
    pub sigma: f64,
    pub lo: f64,
    pub hi: f64,
}

impl LogNormalClip {
    pub fn sample(&self, rng: &mut ChaCha8Rng) -> f64 {
        let v = match LogNormal::new(self.median.ln(), self.sigma) {
            Ok(d) => d.sample(rng),
            Err(_) => self.median,
        };
        v.clamp(self.lo, self.hi)
    }
}

impl Workload {
    /// SWE-agent-like: a ~2k shared system prompt, 30–135 steps of 200–2,000
    /// tool tokens and 100–500 generated tokens, predictable ~2 s tools.
    pub fn swe() -> Self {
        Self {
            name: "swe".into(),
            system_tokens: 2048,
            task_tokens: (300, 800),
            steps: (30, 135),
            tool_tokens: LogNormalClip {
                median: 500.0,
                sigma: 0.6,
                lo: 200.0,
                hi: 2000.0,
            },
            gen_tokens: (100, 500),
            tool_time_s: LogNormalClip {
                median: 2.0,
                sigma: 0.5,
                lo: 0.2,
                hi: 30.0,
            },
            max_context: 32_768,
            group_size: 1,
            tools: Vec::new(),
        }
    }

    /// The swe shape with a bimodal tool mix, as a coding agent's: 70% quick
    /// file reads and edits (median 0.3 s) and 30% test runs (median 20 s) —
    /// two tools whose times differ by ~70×, for the per-tool decay.
    pub fn bimodal() -> Self {
        let mut w = Self::swe();
        w.name = "bimodal".into();
        w.tools = vec![
            NamedTool {
                name: "read",
                weight: 0.7,
                time_s: LogNormalClip {
                    median: 0.3,
                    sigma: 0.4,
                    lo: 0.05,
                    hi: 3.0,
                },
            },
            NamedTool {
                name: "test",
                weight: 0.3,
                time_s: LogNormalClip {
                    median: 20.0,
                    sigma: 0.5,
                    lo: 5.0,
                    hi: 120.0,
                },
            },
        ];
        w
    }

    /// Whether a program whose context is `context` tokens ends instead of
    /// taking `tool` more tokens of tool output: its next prompt and the
    /// longest answer would pass `max_context`.
    pub fn ends_before(&self, context: usize, tool: usize) -> bool {
        context + tool + self.gen_tokens.1 > self.max_context
    }

    /// A turn's tool: its index in `tools` (None for the unnamed one) and
    /// its time.
    pub fn sample_tool(&self, rng: &mut ChaCha8Rng) -> (Option<usize>, f64) {
        let total: f64 = self.tools.iter().map(|t| t.weight).sum();
        if self.tools.is_empty() || total <= 0.0 {
            return (None, self.tool_time_s.sample(rng));
        }
        let mut u = rng.gen_range(0.0..total);
        for (i, t) in self.tools.iter().enumerate() {
            if u < t.weight || i + 1 == self.tools.len() {
                return (Some(i), t.time_s.sample(rng));
            }
            u -= t.weight;
        }
        (None, self.tool_time_s.sample(rng))
    }

    /// Long contexts on a slow engine (issue 32's held-out regime): programs
    /// join mid-history (a 1–2k-token history after a 512-token system
    /// prompt), then 14 turns of 200–600 tool tokens and exactly 32
    /// generated ones, tools about exponential with a 2 s mean (log-normal,
    /// median 1.4 s = 2 s·ln 2, σ 1). Contexts grow from ~2k to ~7k tokens
    /// (~4k on average), so a CPU engine spends most of its time in prefill:
    /// the regime where admitting work the engine cannot compute soon
    /// makes every decode wait behind other programs' prefill chunks.
    pub fn long() -> Self {
        Self {
            name: "long".into(),
            system_tokens: 512,
            task_tokens: (1000, 2000),
            steps: (14, 14),
            tool_tokens: LogNormalClip {
                median: 350.0,
                sigma: 0.35,
                lo: 200.0,
                hi: 600.0,
            },
            gen_tokens: (32, 32),
            tool_time_s: LogNormalClip {
                median: 1.4,
                sigma: 1.0,
                lo: 0.05,
                hi: 30.0,
            },
            max_context: 16_384,
            group_size: 1,
            tools: Vec::new(),
        }
    }

    /// Tool orchestration: fewer, longer steps and heavy-tailed tool time
    /// (median 3 s, p99 ≈ 3·e^(2.33·1.4) ≈ 78 s).
    pub fn toolorch() -> Self {
        Self {
            name: "toolorch".into(),
            system_tokens: 1536,
            task_tokens: (200, 600),
            steps: (8, 30),
            tool_tokens: LogNormalClip {
                median: 1200.0,
                sigma: 0.7,
                lo: 300.0,
                hi: 4000.0,
            },
            gen_tokens: (200, 1000),
            tool_time_s: LogNormalClip {
                median: 3.0,
                sigma: 1.4,
                lo: 0.2,
                hi: 600.0,
            },
            max_context: 32_768,
            group_size: 1,
            tools: Vec::new(),
        }
    }
}

impl FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "swe" => Ok(Self::swe()),
            "toolorch" => Ok(Self::toolorch()),
            "bimodal" => Ok(Self::bimodal()),
            "long" => Ok(Self::long()),
            other => Err(format!(
                "unknown workload '{other}' (expected swe, toolorch, bimodal or long)"
            )),
        }
    }
}

/// Token ids for the synthetic text: the shared system prompt, then ids drawn
/// from a program-specific stream. Ids stay below a Qwen-sized vocabulary.
pub fn system_prompt(tokens: usize) -> Vec<u32> {
    (0..tokens as u64).map(|i| token_at(0, i)).collect()
}

/// A deterministic token for (stream, index).
pub fn token_at(stream: u64, i: u64) -> u32 {
    let h = xxhash_rust::xxh3::xxh3_64(&[stream.to_le_bytes(), i.to_le_bytes()].concat());
    (h % 150_000) as u32
}

/// Uniform integer in [lo, hi].
pub fn uniform(rng: &mut ChaCha8Rng, (lo, hi): (usize, usize)) -> usize {
    if hi <= lo {
        lo
    } else {
        rng.gen_range(lo..=hi)
    }
}
