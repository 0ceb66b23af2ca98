//! The workload shape flags `agentd bench` and `agentd simulate` share, so
//! a simulated sweep can mirror a measured one flag for flag.

use agentd_bench::{BenchWorkload, CountArg, ToolTime};
use clap::Args;

/// Overrides of a workload preset's shape (unset: the preset's).
#[derive(Args, Debug, Clone, Default)]
pub struct WorkloadShapeArgs {
    /// Shared system prompt tokens (preset: swe 2048, toolorch 1536).
    #[arg(long)]
    pub system_tokens: Option<usize>,
    /// Task tokens of the first turn: N (scale the preset), =N or LO:HI.
    #[arg(long)]
    pub task_tokens: Option<CountArg>,
    /// Turns (model calls) per program: N (scale), =N or LO:HI.
    #[arg(long)]
    pub turns: Option<CountArg>,
    /// Tool-output tokens per turn: N (median of the preset's shape), =N or LO:HI.
    #[arg(long)]
    pub tool_tokens: Option<CountArg>,
    /// Output tokens per turn: N (scale), =N or LO:HI.
    #[arg(long)]
    pub output_tokens: Option<CountArg>,
    /// Tool time: fixed:S, exp:MEAN or lognormal:MEDIAN:SIGMA.
    #[arg(long)]
    pub tool_time: Option<ToolTime>,
    /// A program ends before a turn that would exceed this context.
    #[arg(long)]
    pub max_context: Option<usize>,
}

impl WorkloadShapeArgs {
    /// Whether any flag is set.
    pub fn any(&self) -> bool {
        self.system_tokens.is_some()
            || self.task_tokens.is_some()
            || self.turns.is_some()
            || self.tool_tokens.is_some()
            || self.output_tokens.is_some()
            || self.tool_time.is_some()
            || self.max_context.is_some()
    }

    /// `w` with the flags that are set applied.
    pub fn apply(&self, w: &mut BenchWorkload) {
        if let Some(n) = self.system_tokens {
            w.system_tokens = n;
        }
        if let Some(c) = self.task_tokens {
            w.task_tokens = c.apply(w.task_tokens);
        }
        if let Some(c) = self.turns {
            w.turns = c.apply(w.turns);
        }
        if let Some(c) = self.tool_tokens {
            w.tool_tokens = c.apply(w.tool_tokens);
        }
        if let Some(c) = self.output_tokens {
            w.output_tokens = c.apply(w.output_tokens);
        }
        if let Some(t) = self.tool_time {
            w.tool_time = t;
        }
        if let Some(m) = self.max_context {
            w.max_context = m;
        }
    }
}
