//! The CPU kernel path of this process (`AGENTD_CPU_KERNELS`), checked and
//! logged once at start by the commands that run the model on the CPU.

use agentd_models::cpu_kernels::{self, KernelPath};
use anyhow::Result;

/// The path the kernels will run on; an `AGENTD_CPU_KERNELS` the CPU lacks
/// (or that names no path) is an error here, before any model is loaded.
pub fn kernel_path() -> Result<KernelPath> {
    let path = cpu_kernels::selected()?;
    let supported: Vec<&str> = KernelPath::supported_paths()
        .iter()
        .map(|p| p.name())
        .collect();
    tracing::info!(
        path = path.name(),
        forced = std::env::var_os(cpu_kernels::ENV).is_some(),
        supported = supported.join(","),
        cpu = cpu_kernels::cpu_model_name(),
        "CPU kernels"
    );
    Ok(path)
}
