//! What the model benches share. Each bench compiles this module on its
//! own and uses only some of it.
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// The comma-separated values of environment variable `var`, or of
/// `default` when it is unset.
pub fn list(var: &str, default: &str) -> Vec<String> {
    std::env::var(var)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The median of `v` (the upper one of an even count); `v` must not be
/// empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median seconds per call of `f`: one warm-up call, then at least 5 calls
/// and `min` of time, at most `max_calls`.
pub fn median_secs(mut f: impl FnMut(), min: Duration, max_calls: usize) -> f64 {
    f();
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 5 || start.elapsed() < min {
        let s = Instant::now();
        f();
        times.push(s.elapsed().as_secs_f64());
        if times.len() >= max_calls {
            break;
        }
    }
    median(times)
}
