//! The agentic workload: programs of turns, each turn a block of new tokens
//! appended to the context (the task, then tool outputs), a generation of an
//! exact number of tokens, then a tool call of some duration.
//!
//! Presets mirror the simulator's (`agentd_sim::Workload::swe()` /
//! `toolorch()`), and flags scale them to the machine. Everything a program
//! sends is a pure function of (seed, program stream): the shared system
//! prompt is identical across programs (the prefix cache may share it) and
//! the rest is unique to its program.

use std::str::FromStr;

use agentd_sim::workload::{token_at, LogNormalClip};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::dist::{Count, ToolTime};

/// The shape of a program.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchWorkload {
    pub name: String,
    /// Tokens of the system prompt shared by every program.
    pub system_tokens: usize,
    /// Tokens of the task (first user message), unique per program.
    pub task_tokens: Count,
    /// Model calls per program.
    pub turns: Count,
    /// Tool output appended before every turn but the first.
    pub tool_tokens: Count,
    /// Tokens generated per turn (sent as `max_tokens` with `ignore_eos`).
    pub output_tokens: Count,
    /// Seconds between a generation and the next turn.
    pub tool_time: ToolTime,
    /// A program ends early when its next turn would not fit this context.
    pub max_context: usize,
    /// Token ids are drawn below this (inside any Qwen-sized vocabulary,
    /// below the special tokens).
    pub vocab: u32,
}

fn lognormal_count(c: &LogNormalClip) -> Count {
    Count::LogNormal {
        median: c.median,
        sigma: c.sigma,
        lo: c.lo as usize,
        hi: c.hi as usize,
    }
}

impl From<agentd_sim::Workload> for BenchWorkload {
    fn from(w: agentd_sim::Workload) -> Self {
        BenchWorkload {
            name: w.name,
            system_tokens: w.system_tokens,
            task_tokens: Count::Uniform(w.task_tokens.0, w.task_tokens.1),
            turns: Count::Uniform(w.steps.0, w.steps.1),
            tool_tokens: lognormal_count(&w.tool_tokens),
            output_tokens: Count::Uniform(w.gen_tokens.0, w.gen_tokens.1),
            tool_time: ToolTime::LogNormal {
                median: w.tool_time_s.median,
                sigma: w.tool_time_s.sigma,
                lo: w.tool_time_s.lo,
                hi: w.tool_time_s.hi,
            },
            max_context: w.max_context,
            vocab: 150_000,
        }
    }
}

impl BenchWorkload {
    /// This workload in the simulator's form, over `base` (its named tools
    /// and group size kept), so `agentd simulate` can run the shape a bench
    /// measured. The simulator draws task, turn and output counts uniformly
    /// and tool tokens and tool times log-normally: a shape it cannot draw
    /// is an error naming the field, not an approximation.
    pub fn to_sim(&self, mut base: agentd_sim::Workload) -> Result<agentd_sim::Workload, String> {
        let uniform = |c: Count, what: &str| match c {
            Count::Fixed(n) => Ok((n, n)),
            Count::Uniform(lo, hi) => Ok((lo, hi)),
            Count::LogNormal { .. } => Err(format!(
                "the simulator draws {what} uniformly: give =N or LO:HI"
            )),
        };
        let fixed = |x: f64| LogNormalClip {
            median: x,
            sigma: 0.0,
            lo: x,
            hi: x,
        };
        base.system_tokens = self.system_tokens;
        base.task_tokens = uniform(self.task_tokens, "task tokens")?;
        base.steps = uniform(self.turns, "turns")?;
        base.gen_tokens = uniform(self.output_tokens, "output tokens")?;
        base.tool_tokens = match self.tool_tokens {
            Count::Fixed(n) => fixed(n as f64),
            Count::LogNormal {
                median,
                sigma,
                lo,
                hi,
            } => LogNormalClip {
                median,
                sigma,
                lo: lo as f64,
                hi: hi as f64,
            },
            Count::Uniform(..) => {
                return Err("the simulator draws tool tokens log-normally: give =N or N".into())
            }
        };
        base.tool_time_s = match self.tool_time {
            ToolTime::Fixed(s) => fixed(s),
            ToolTime::LogNormal { median, sigma, lo, hi } => LogNormalClip { median, sigma, lo, hi },
            ToolTime::Exp(_) => {
                return Err("the simulator draws tool times log-normally: give fixed:S or lognormal:MEDIAN:SIGMA".into())
            }
        };
        base.max_context = self.max_context;
        base.name = self.name.clone();
        Ok(base)
    }
}

impl FromStr for BenchWorkload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        s.parse::<agentd_sim::Workload>().map(Into::into)
    }
}

/// One turn of a planned program.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnPlan {
    /// Tokens appended to the context before this turn's model call: the
    /// task on the first turn, a tool output after that.
    pub appended: Vec<u32>,
    /// Exact tokens to generate.
    pub output_tokens: usize,
    /// Tool time after this turn's generation (0 after the last turn).
    pub tool_time_s: f64,
}

/// A whole program, reproducible from its stream id.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgramPlan {
    pub stream: u64,
    pub turns: Vec<TurnPlan>,
}

/// The stream id of program `index` of a run: distinct per (seed, level),
/// so levels run on one server do not hit each other's cached contexts.
pub fn program_stream(seed: u64, level: u64, index: u64) -> u64 {
    let bytes = [seed.to_le_bytes(), level.to_le_bytes(), index.to_le_bytes()].concat();
    // Stream 0 is the shared system prompt.
    xxhash_rust::xxh3::xxh3_64(&bytes).max(1)
}

impl BenchWorkload {
    /// The shared system prompt.
    pub fn system_prompt(&self) -> Vec<u32> {
        (0..self.system_tokens as u64)
            .map(|i| token_at(0, i) % self.vocab)
            .collect()
    }

    /// Plans the program of `stream`.
    pub fn plan(&self, stream: u64) -> ProgramPlan {
        self.plan_with_task(stream, None)
    }

    /// Plans the program of `stream` whose first turn appends `task`
    /// instead of its own (a rollout group's members share the task); its
    /// turn count, tool outputs, output lengths and tool times stay its own.
    pub fn plan_with_task(&self, stream: u64, task: Option<&[u32]>) -> ProgramPlan {
        let mut rng = ChaCha8Rng::seed_from_u64(stream);
        let turns = self.turns.sample(&mut rng).max(1);
        let mut next_token = 0u64;
        let mut tokens = |n: usize| -> Vec<u32> {
            let v = (next_token..next_token + n as u64)
                .map(|i| token_at(stream, i) % self.vocab)
                .collect();
            next_token += n as u64;
            v
        };
        let mut context = self.system_tokens;
        let mut out = Vec::with_capacity(turns);
        for t in 0..turns {
            let mut n = if t == 0 {
                self.task_tokens.sample(&mut rng)
            } else {
                self.tool_tokens.sample(&mut rng)
            };
            let shared = task.filter(|_| t == 0);
            if let Some(task) = shared {
                n = task.len();
            }
            let output_tokens = self.output_tokens.sample(&mut rng).max(1);
            let tool_time_s = self.tool_time.sample(&mut rng);
            if t > 0 && context + n + output_tokens > self.max_context {
                break;
            }
            context += n + output_tokens;
            out.push(TurnPlan {
                appended: shared.map_or_else(|| tokens(n), <[u32]>::to_vec),
                output_tokens,
                tool_time_s,
            });
        }
        if let Some(last) = out.last_mut() {
            last.tool_time_s = 0.0;
        }
        ProgramPlan { stream, turns: out }
    }
}

/// Offset of the stand-in outputs in a program's token stream: far past
/// any appended token, so history never repeats the program's own input.
const STAND_IN_OFFSET: u64 = 1 << 40;

impl ProgramPlan {
    /// The turn this program joins at under a stationary start: uniform
    /// over its turns, from its own stream (reproducible per program).
    ///
    /// All N programs of a closed loop starting at turn 0 move as one
    /// cohort: their contexts grow together for a whole lifetime, so a
    /// window shortly after the start sees short contexts at high
    /// concurrency (the CPU swe cell at 96 programs ran 445 steps/min with
    /// a 20 s warm-up and 311 with 150 s, ideal hit 0.867 against 0.908).
    /// Starting each of the first N programs at a uniform turn, with its
    /// earlier turns as history, puts the population at steady-state ages
    /// from the first request. (Uniform over the turns of a normally drawn
    /// program; a renewal process would also favour longer programs.)
    pub fn join_turn(&self) -> usize {
        let mut rng = ChaCha8Rng::seed_from_u64(self.stream ^ 0x9e37_79b9_7f4a_7c15);
        rand::Rng::gen_range(&mut rng, 0..self.turns.len().max(1))
    }

    /// Stand-ins for what the model generated in the turns before `turn`,
    /// one vector of exactly `output_tokens` ids per turn.
    pub fn stand_in_outputs(&self, turn: usize, vocab: u32) -> Vec<Vec<u32>> {
        let mut next = STAND_IN_OFFSET;
        self.turns[..turn.min(self.turns.len())]
            .iter()
            .map(|t| {
                let ids = (next..next + t.output_tokens as u64)
                    .map(|i| token_at(self.stream, i) % vocab)
                    .collect();
                next += t.output_tokens as u64;
                ids
            })
            .collect()
    }
}

/// Prompt tokens an unlimited prefix cache would hit, at `block` granularity
/// (vLLM and agentd hash full blocks): the longest prefix of the prompt that
/// an earlier request computed, never the prompt's last token (which is
/// always recomputed to produce logits).
///
/// - `shared`: tokens of the shared system prompt at the head of the prompt,
///   if an earlier request already carried it (0 otherwise).
/// - `own`: tokens of the program's previous context (previous prompt plus
///   the previous generation less its last token, whose KV was never
///   computed) at the head of the prompt; 0 on a program's first turn.
pub fn ideal_hit_tokens(prompt_len: usize, shared: usize, own: usize, block: usize) -> usize {
    let block = block.max(1);
    let best = shared.max(own).min(prompt_len.saturating_sub(1));
    best / block * block
}

/// Words that are one token each in common BPE vocabularies (Qwen, Llama,
/// GPT): chat mode writes token `i` as `WORDS[i % len]`, so a block of n ids
/// becomes about n tokens of text.
const WORDS: [&str; 32] = [
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "as", "with", "by", "at", "from",
    "that", "this", "it", "be", "are", "or", "an", "which", "not", "but", "have", "had", "has",
    "were", "one", "two", "all", "can",
];

/// Chat-mode text standing for `ids`.
pub fn text_for(ids: &[u32]) -> String {
    let mut s = String::with_capacity(ids.len() * 4);
    for (i, &id) in ids.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(WORDS[id as usize % WORDS.len()]);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> BenchWorkload {
        let mut w: BenchWorkload = "swe".parse().unwrap();
        w.system_tokens = 64;
        w.turns = Count::Uniform(3, 6);
        w.task_tokens = Count::Fixed(20);
        w.tool_tokens = w.tool_tokens.scaled_to(40);
        w.output_tokens = Count::Fixed(8);
        w
    }

    #[test]
    fn presets_mirror_the_simulator() {
        let w: BenchWorkload = "swe".parse().unwrap();
        let s = agentd_sim::Workload::swe();
        assert_eq!(w.system_tokens, s.system_tokens);
        assert_eq!(w.turns, Count::Uniform(s.steps.0, s.steps.1));
        assert_eq!(
            w.output_tokens,
            Count::Uniform(s.gen_tokens.0, s.gen_tokens.1)
        );
        assert!(matches!(w.tool_time, ToolTime::LogNormal { median, .. } if median == 2.0));
        let t: BenchWorkload = "toolorch".parse().unwrap();
        assert_eq!(
            t.system_tokens,
            agentd_sim::Workload::toolorch().system_tokens
        );
        assert!("nope".parse::<BenchWorkload>().is_err());
    }

    #[test]
    fn plans_are_reproducible_and_distinct() {
        let w = small();
        let a = w.plan(program_stream(1, 4, 0));
        assert_eq!(a, w.plan(program_stream(1, 4, 0)));
        let b = w.plan(program_stream(1, 4, 1));
        assert_ne!(a.turns[0].appended, b.turns[0].appended);
        // Another level or seed: other content.
        assert_ne!(program_stream(1, 4, 0), program_stream(1, 8, 0));
        assert_ne!(program_stream(1, 4, 0), program_stream(2, 4, 0));
        // The system prompt is the same for everyone.
        assert_eq!(w.system_prompt(), small().system_prompt());
        assert_eq!(w.system_prompt().len(), 64);
    }

    #[test]
    fn a_stationary_start_spreads_programs_over_their_turns() {
        let w = small();
        let plans: Vec<ProgramPlan> = (0..400).map(|i| w.plan(program_stream(1, 48, i))).collect();
        let joins: Vec<usize> = plans.iter().map(|p| p.join_turn()).collect();
        for (p, &j) in plans.iter().zip(&joins) {
            assert!(j < p.turns.len());
            assert_eq!(j, p.join_turn(), "reproducible");
            let outs = p.stand_in_outputs(j, w.vocab);
            assert_eq!(outs.len(), j);
            for (o, t) in outs.iter().zip(&p.turns) {
                assert_eq!(o.len(), t.output_tokens);
                assert!(o.iter().all(|&id| id < w.vocab));
            }
        }
        // Turns 3..6: every turn index is a join turn for some programs,
        // and about half the programs join past turn 0..2.
        for k in 0..3 {
            assert!(joins.contains(&k), "join turn {k} never drawn");
        }
        let late = joins.iter().filter(|&&j| j >= 2).count();
        assert!(
            (120..=320).contains(&late),
            "{late} of 400 join at turn 2 or later"
        );
        // Stand-ins come from their own part of the stream, not the inputs'.
        let p = &plans[0];
        let outs = p.stand_in_outputs(p.turns.len(), w.vocab);
        assert_ne!(outs[0][..], p.turns[0].appended[..outs[0].len()]);
    }

    #[test]
    fn token_counts_are_exact() {
        let w = small();
        for i in 0..50 {
            let p = w.plan(program_stream(9, 2, i));
            assert!((3..=6).contains(&p.turns.len()));
            assert_eq!(p.turns[0].appended.len(), 20);
            for t in &p.turns[1..] {
                assert!(
                    (16..=160).contains(&t.appended.len()),
                    "{}",
                    t.appended.len()
                );
            }
            assert!(p.turns.iter().all(|t| t.output_tokens == 8));
            assert_eq!(p.turns.last().unwrap().tool_time_s, 0.0);
            assert!(p
                .turns
                .iter()
                .flat_map(|t| &t.appended)
                .all(|&id| id < w.vocab));
        }
    }

    #[test]
    fn max_context_cuts_programs() {
        let mut w = small();
        w.turns = Count::Fixed(100);
        w.tool_tokens = Count::Fixed(50);
        w.max_context = 64 + 28 + 2 * 58;
        let p = w.plan(3);
        assert_eq!(p.turns.len(), 3);
    }

    #[test]
    fn ideal_hits() {
        // First program's first turn: nothing computed before.
        assert_eq!(ideal_hit_tokens(100, 0, 0, 1), 0);
        // A later program's first turn: the shared system prompt.
        assert_eq!(ideal_hit_tokens(100, 64, 0, 16), 64);
        // A later turn: the previous context, floored to blocks.
        assert_eq!(ideal_hit_tokens(300, 64, 250, 16), 240);
        assert_eq!(ideal_hit_tokens(300, 64, 250, 1), 250);
        // Never the whole prompt: its last token is always computed.
        assert_eq!(ideal_hit_tokens(64, 64, 0, 1), 63);
        assert_eq!(ideal_hit_tokens(64, 64, 0, 16), 48);
    }

    #[test]
    fn chat_text_has_one_word_per_token() {
        let t = text_for(&[0, 1, 33]);
        assert_eq!(t, "the of of");
        assert_eq!(text_for(&[]), "");
    }
}
