//! Tool-time distributions: `fixed:S`, `exp:MEAN`, `lognormal:MEDIAN:SIGMA`.

use std::fmt;
use std::str::FromStr;

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp, LogNormal};

/// Seconds a tool call takes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ToolTime {
    Fixed(f64),
    /// Exponential with this mean.
    Exp(f64),
    /// Log-normal with this median and sigma, clipped to [lo, hi].
    LogNormal {
        median: f64,
        sigma: f64,
        lo: f64,
        hi: f64,
    },
}

impl ToolTime {
    pub fn sample(&self, rng: &mut ChaCha8Rng) -> f64 {
        match *self {
            ToolTime::Fixed(s) => s,
            ToolTime::Exp(mean) => match Exp::new(1.0 / mean) {
                Ok(d) => d.sample(rng),
                Err(_) => mean,
            },
            ToolTime::LogNormal {
                median,
                sigma,
                lo,
                hi,
            } => match LogNormal::new(median.ln(), sigma) {
                Ok(d) => d.sample(rng).clamp(lo, hi),
                Err(_) => median,
            },
        }
    }

    /// The distribution's mean (before clipping, for log-normal).
    pub fn mean(&self) -> f64 {
        match *self {
            ToolTime::Fixed(s) | ToolTime::Exp(s) => s,
            ToolTime::LogNormal { median, sigma, .. } => median * (sigma * sigma / 2.0).exp(),
        }
    }
}

impl fmt::Display for ToolTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToolTime::Fixed(s) => write!(f, "fixed:{s}"),
            ToolTime::Exp(m) => write!(f, "exp:{m}"),
            ToolTime::LogNormal { median, sigma, .. } => write!(f, "lognormal:{median}:{sigma}"),
        }
    }
}

fn positive(what: &str, v: &str) -> Result<f64, String> {
    let x: f64 = v
        .parse()
        .map_err(|_| format!("{what} {v:?} is not a number"))?;
    if !x.is_finite() || x < 0.0 {
        return Err(format!("{what} must be finite and >= 0, got {v}"));
    }
    Ok(x)
}

impl FromStr for ToolTime {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        match parts.as_slice() {
            ["fixed", v] => Ok(ToolTime::Fixed(positive("fixed seconds", v)?)),
            ["exp", v] => {
                let m = positive("exp mean", v)?;
                if m == 0.0 {
                    return Err("exp mean must be > 0".into());
                }
                Ok(ToolTime::Exp(m))
            }
            ["lognormal", m, sg] => {
                let median = positive("lognormal median", m)?;
                let sigma = positive("lognormal sigma", sg)?;
                if median == 0.0 {
                    return Err("lognormal median must be > 0".into());
                }
                // A tail cap so one draw cannot outlast the whole run.
                Ok(ToolTime::LogNormal {
                    median,
                    sigma,
                    lo: 0.0,
                    hi: median * 100.0,
                })
            }
            _ => Err(format!(
                "tool time {s:?}: expected fixed:S, exp:MEAN or lognormal:MEDIAN:SIGMA"
            )),
        }
    }
}

/// A token count: fixed, uniform in [lo, hi], or log-normal clipped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Count {
    Fixed(usize),
    Uniform(usize, usize),
    LogNormal {
        median: f64,
        sigma: f64,
        lo: usize,
        hi: usize,
    },
}

impl Count {
    pub fn sample(&self, rng: &mut ChaCha8Rng) -> usize {
        match *self {
            Count::Fixed(n) => n,
            Count::Uniform(lo, hi) if hi <= lo => lo,
            Count::Uniform(lo, hi) => rng.gen_range(lo..=hi),
            Count::LogNormal {
                median,
                sigma,
                lo,
                hi,
            } => {
                let v = match LogNormal::new(median.ln(), sigma) {
                    Ok(d) => d.sample(rng),
                    Err(_) => median,
                };
                (v.round() as usize).clamp(lo, hi.max(lo))
            }
        }
    }

    /// The same shape with its median (or value) moved to `n`.
    pub fn scaled_to(&self, n: usize) -> Count {
        match *self {
            Count::Fixed(_) => Count::Fixed(n),
            Count::Uniform(lo, hi) => {
                let mid = (lo + hi) as f64 / 2.0;
                let k = if mid > 0.0 { n as f64 / mid } else { 1.0 };
                Count::Uniform(
                    (lo as f64 * k).round() as usize,
                    (hi as f64 * k).round() as usize,
                )
            }
            Count::LogNormal {
                median,
                sigma,
                lo,
                hi,
            } => {
                let k = n as f64 / median;
                Count::LogNormal {
                    median: n as f64,
                    sigma,
                    lo: (lo as f64 * k).round() as usize,
                    hi: (hi as f64 * k).round() as usize,
                }
            }
        }
    }

    pub fn max(&self) -> usize {
        match *self {
            Count::Fixed(n) => n,
            Count::Uniform(_, hi) => hi,
            Count::LogNormal { hi, .. } => hi,
        }
    }
}

impl fmt::Display for Count {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Count::Fixed(n) => write!(f, "{n}"),
            Count::Uniform(lo, hi) => write!(f, "{lo}:{hi}"),
            Count::LogNormal {
                median,
                sigma,
                lo,
                hi,
            } => write!(f, "lognormal({median},{sigma})[{lo},{hi}]"),
        }
    }
}

/// A command-line count: `N` (keep the preset's shape, move its median to
/// N), `=N` (exactly N) or `LO:HI` (uniform).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CountArg {
    Scale(usize),
    Exact(usize),
    Range(usize, usize),
}

impl CountArg {
    pub fn apply(&self, preset: Count) -> Count {
        match *self {
            CountArg::Scale(n) => preset.scaled_to(n),
            CountArg::Exact(n) => Count::Fixed(n),
            CountArg::Range(lo, hi) => Count::Uniform(lo, hi),
        }
    }
}

impl FromStr for CountArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let num = |v: &str| {
            v.trim()
                .parse::<usize>()
                .map_err(|_| format!("{v:?} is not a token count"))
        };
        if let Some(v) = s.strip_prefix('=') {
            return Ok(CountArg::Exact(num(v)?));
        }
        match s.split_once(':') {
            Some((lo, hi)) => {
                let (lo, hi) = (num(lo)?, num(hi)?);
                if hi < lo {
                    return Err(format!("range {s:?}: max below min"));
                }
                Ok(CountArg::Range(lo, hi))
            }
            None => Ok(CountArg::Scale(num(s)?)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn rng() -> ChaCha8Rng {
        ChaCha8Rng::seed_from_u64(7)
    }

    #[test]
    fn parses_the_three_shapes_and_rejects_junk() {
        assert_eq!("fixed:2".parse::<ToolTime>(), Ok(ToolTime::Fixed(2.0)));
        assert_eq!("exp:1.5".parse::<ToolTime>(), Ok(ToolTime::Exp(1.5)));
        assert!(matches!(
            "lognormal:3:1.4".parse::<ToolTime>(),
            Ok(ToolTime::LogNormal { median, sigma, .. }) if median == 3.0 && sigma == 1.4
        ));
        for bad in [
            "",
            "fixed",
            "fixed:x",
            "exp:0",
            "exp:-1",
            "lognormal:1",
            "gamma:1",
        ] {
            assert!(bad.parse::<ToolTime>().is_err(), "{bad}");
        }
        assert_eq!(ToolTime::Exp(1.5).to_string(), "exp:1.5");
    }

    #[test]
    fn sample_means_and_medians_match_the_parameters() {
        let n = 40_000;
        let mut r = rng();
        assert_eq!(ToolTime::Fixed(0.7).sample(&mut r), 0.7);
        let mean: f64 = (0..n)
            .map(|_| ToolTime::Exp(2.0).sample(&mut r))
            .sum::<f64>()
            / n as f64;
        assert!((mean - 2.0).abs() < 0.05, "exp mean {mean}");
        let ln: ToolTime = "lognormal:3:0.8".parse().unwrap();
        let mut v: Vec<f64> = (0..n).map(|_| ln.sample(&mut r)).collect();
        v.sort_by(f64::total_cmp);
        let median = v[n / 2];
        assert!((median - 3.0).abs() < 0.1, "lognormal median {median}");
        assert!(v.iter().all(|&x| (0.0..=300.0).contains(&x)));
        // Reproducible from the seed.
        let a: Vec<f64> = (0..5).map(|_| ln.sample(&mut rng())).collect();
        let b: Vec<f64> = (0..5).map(|_| ln.sample(&mut rng())).collect();
        assert_eq!(a, b);
    }

    #[test]
    fn counts_scale_and_stay_in_bounds() {
        let preset = Count::LogNormal {
            median: 500.0,
            sigma: 0.6,
            lo: 200,
            hi: 2000,
        };
        let c = CountArg::Scale(100).apply(preset);
        assert_eq!(
            c,
            Count::LogNormal {
                median: 100.0,
                sigma: 0.6,
                lo: 40,
                hi: 400
            }
        );
        let mut r = rng();
        assert!((0..1000)
            .map(|_| c.sample(&mut r))
            .all(|x| (40..=400).contains(&x)));
        assert_eq!(
            "=32".parse::<CountArg>().unwrap().apply(preset),
            Count::Fixed(32)
        );
        assert_eq!("8:16".parse::<CountArg>(), Ok(CountArg::Range(8, 16)));
        assert!("16:8".parse::<CountArg>().is_err());
        assert_eq!(
            CountArg::Scale(10).apply(Count::Uniform(30, 135)),
            Count::Uniform(4, 16)
        );
    }
}
