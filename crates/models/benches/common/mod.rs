//! What the model benches share.

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
