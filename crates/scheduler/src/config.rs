use std::fmt;
use std::str::FromStr;

/// Which policy the engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    /// Program-level scheduling (DESIGN §4).
    Program,
    /// Request-level baseline, like vLLM.
    Request,
}

impl FromStr for PolicyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "program" => Ok(Self::Program),
            "request" => Ok(Self::Request),
            other => Err(format!(
                "unknown policy '{other}' (expected program or request)"
            )),
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Program => "program",
            Self::Request => "request",
        })
    }
}

/// Every knob of the scheduler, with the defaults of DESIGN §4.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    pub policy: PolicyKind,
    /// Restore only while `D + need <= lambda_min * C`.
    pub lambda_min: f64,
    /// Pause while `D > lambda_max * C`.
    pub lambda_max: f64,
    /// Base `x` of the acting-memory decay `f(t) = x^(-t/unit)`; 1 disables decay.
    pub decay_base: f64,
    /// Time unit Δ of the decay, seconds.
    pub decay_unit_s: f64,
    /// Blocks reserved per running sequence for decode growth.
    pub decode_reserve_blocks: usize,
    /// Aging of the restore queue: each second of waiting counts as this many
    /// fewer context tokens, so large programs are not starved by small ones.
    pub aging_tokens_per_s: f64,
    /// Inactivity lease: a program with no request for this long is terminated.
    pub lease_s: f64,
    /// Most sequences running on one replica (vLLM's `max_num_seqs`).
    pub max_running: usize,
    /// How stale (seconds) another replica's cached demand may be when placing.
    pub demand_refresh_s: f64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            policy: PolicyKind::Program,
            lambda_min: 0.9,
            lambda_max: 1.0,
            decay_base: 2.0,
            decay_unit_s: 1.0,
            decode_reserve_blocks: 1,
            aging_tokens_per_s: 256.0,
            lease_s: 1800.0,
            max_running: 256,
            demand_refresh_s: 0.25,
        }
    }
}

impl SchedulerConfig {
    /// `f(t) = x^(-t/Δ)`: the weight of an acting program's exclusive memory
    /// `t` seconds into its tool call.
    pub fn decay(&self, t: f64) -> f64 {
        if self.decay_base <= 1.0 || self.decay_unit_s <= 0.0 {
            return 1.0;
        }
        self.decay_base.powf(-t.max(0.0) / self.decay_unit_s)
    }

    /// Checks the relations the policy relies on.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0 < self.lambda_min && self.lambda_min <= self.lambda_max && self.lambda_max <= 1.0)
        {
            return Err(format!(
                "need 0 < lambda_min <= lambda_max <= 1, got {} / {}",
                self.lambda_min, self.lambda_max
            ));
        }
        if self.decay_base < 1.0 || self.decay_unit_s <= 0.0 {
            return Err("decay base must be >= 1 and its unit > 0".into());
        }
        if self.max_running == 0 {
            return Err("max_running must be at least 1".into());
        }
        Ok(())
    }
}
