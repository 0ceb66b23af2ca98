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
    /// The agent stops when its next prompt would exceed this context (as
    /// SWE-agent's `exit_context` does at the model's window).
    pub max_context: usize,
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
        }
    }
}

impl FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "swe" => Ok(Self::swe()),
            "toolorch" => Ok(Self::toolorch()),
            other => Err(format!(
                "unknown workload '{other}' (expected swe or toolorch)"
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
