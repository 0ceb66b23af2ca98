//! What CPU this is, for logs and benchmark reports (every figure names its
//! CPU). Here, below both backends and the sampler, so each reads the one
//! definition; `agentd_models::cpu_kernels` re-exports it beside the kernel
//! path it selects.

/// The CPU's model name (`/proc/cpuinfo`'s "model name", or the aarch64
/// implementer/part line), for logs and benchmark reports; "unknown" where
/// there is none.
pub fn cpu_model_name() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| matches!(k.trim(), "model name" | "Model" | "CPU part"))
        .map(|(_, v)| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "unknown".to_string())
}
