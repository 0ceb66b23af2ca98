//! Which family of CPU kernels runs: chosen once per process, by run-time
//! detection or by `AGENTD_CPU_KERNELS`.
//!
//! Rust builds for baseline x86-64 (SSE2) or aarch64, so every vectorised
//! kernel is compiled with `#[target_feature]` and reached only through a
//! [`KernelPath`] the CPU supports. The matmul, the attention and the vector
//! helpers all dispatch on [`path`]; tests call a path explicitly.
//!
//! - `avx512`: AVX-512F (with AVX2, FMA and F16C, which every AVX-512 CPU has).
//! - `avx2`: AVX2 + FMA + F16C (Haswell / Zen 1 on), 8-lane forms of the
//!   AVX-512 kernels summing in the same order, so equal to them bit for bit.
//! - `neon`: aarch64 Advanced SIMD (baseline on aarch64): 4-lane forms of the
//!   matmul kernels with the same FMA chains (equal to the x86 ones bit for
//!   bit), the AVX2 attention and `simd` kernels on pairs of 4-lane vectors;
//!   the sampler's loops, RoPE and SiLU stay portable.
//! - `portable`: plain Rust, on every CPU.
//!
//! `AGENTD_CPU_KERNELS=portable|avx2|avx512|neon` forces one (benchmarks and
//! tests compare paths on one machine); a path the CPU lacks is refused by
//! [`selected`], which model loading calls, so the error comes at start.

use std::fmt;
use std::sync::OnceLock;

/// The environment variable that forces a path.
pub const ENV: &str = agentd_runtime::sampling::CPU_KERNELS_ENV;

/// A family of CPU kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelPath {
    Portable,
    Avx2,
    Avx512,
    Neon,
}

/// Why `AGENTD_CPU_KERNELS` cannot be honoured.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum CpuKernelsError {
    #[error("{ENV}={0:?} is not a kernel path (expected portable, avx2, avx512 or neon)")]
    Unknown(String),
    #[error("{ENV}={path}: this CPU lacks {needs} (it supports: {supported})")]
    Unsupported {
        path: KernelPath,
        needs: &'static str,
        supported: String,
    },
}

impl From<CpuKernelsError> for agentd_runtime::ModelError {
    fn from(e: CpuKernelsError) -> Self {
        agentd_runtime::ModelError::CpuKernels(e.to_string())
    }
}

impl KernelPath {
    pub const ALL: [KernelPath; 4] = [
        KernelPath::Avx512,
        KernelPath::Avx2,
        KernelPath::Neon,
        KernelPath::Portable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            KernelPath::Portable => "portable",
            KernelPath::Avx2 => "avx2",
            KernelPath::Avx512 => "avx512",
            KernelPath::Neon => "neon",
        }
    }

    /// What the CPU must have for this path.
    pub fn needs(self) -> &'static str {
        match self {
            KernelPath::Portable => "nothing",
            KernelPath::Avx2 => "AVX2, FMA and F16C (x86-64)",
            KernelPath::Avx512 => "AVX-512F, AVX2, FMA and F16C (x86-64)",
            KernelPath::Neon => "NEON (aarch64)",
        }
    }

    /// Whether this CPU can run the path (CPUID read once, then cached).
    pub fn supported(self) -> bool {
        static S: OnceLock<[bool; 4]> = OnceLock::new();
        let s = S.get_or_init(|| KernelPath::ALL.map(detect));
        let i = KernelPath::ALL.iter().position(|p| *p == self).unwrap_or(0);
        s[i]
    }

    /// Every path this CPU supports, fastest first.
    pub fn supported_paths() -> Vec<KernelPath> {
        KernelPath::ALL
            .into_iter()
            .filter(|p| p.supported())
            .collect()
    }

    /// The fastest path this CPU supports.
    pub fn best() -> KernelPath {
        KernelPath::ALL
            .into_iter()
            .find(|p| p.supported())
            .unwrap_or(KernelPath::Portable)
    }

    /// `AGENTD_CPU_KERNELS`'s value, unset or empty meaning [`Self::best`];
    /// refused if the CPU lacks it.
    pub fn from_setting(value: Option<&str>) -> Result<KernelPath, CpuKernelsError> {
        let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
            return Ok(KernelPath::best());
        };
        let path = KernelPath::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(v))
            .ok_or_else(|| CpuKernelsError::Unknown(v.to_string()))?;
        if !path.supported() {
            let supported: Vec<_> = KernelPath::supported_paths()
                .iter()
                .map(|p| p.name())
                .collect();
            return Err(CpuKernelsError::Unsupported {
                path,
                needs: path.needs(),
                supported: supported.join(", "),
            });
        }
        Ok(path)
    }

    /// Whether AVX2 + FMA code may run on this path (the AVX-512 path uses
    /// the AVX2 helpers where it has no wider form).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn x86_avx2(self) -> bool {
        matches!(self, KernelPath::Avx2 | KernelPath::Avx512)
    }
}

impl fmt::Display for KernelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn detect(p: KernelPath) -> bool {
    match p {
        KernelPath::Portable => true,
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2 => {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
        }
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512 => {
            detect(KernelPath::Avx2) && std::arch::is_x86_feature_detected!("avx512f")
        }
        #[cfg(target_arch = "aarch64")]
        KernelPath::Neon => std::arch::is_aarch64_feature_detected!("neon"),
        #[allow(unreachable_patterns)]
        _ => false,
    }
}

/// The process's path: `AGENTD_CPU_KERNELS` if set (and supported), else the
/// fastest the CPU has. Read once; model loading calls this so a bad setting
/// fails at start with this error.
pub fn selected() -> Result<KernelPath, CpuKernelsError> {
    static SEL: OnceLock<Result<KernelPath, CpuKernelsError>> = OnceLock::new();
    SEL.get_or_init(|| KernelPath::from_setting(std::env::var(ENV).ok().as_deref()))
        .clone()
}

/// The path the kernels run on. An unusable setting (refused by
/// [`selected`] at model load) falls back to the fastest supported path
/// here rather than panic inside a kernel.
#[inline]
pub fn path() -> KernelPath {
    static P: OnceLock<KernelPath> = OnceLock::new();
    *P.get_or_init(|| selected().unwrap_or_else(|_| KernelPath::best()))
}

/// The CPU's model name, for logs and reports (defined in the runtime crate,
/// which the sampler's bench reads too).
pub use agentd_runtime::cpu::cpu_model_name;

/// Panics unless the CPU supports `p`: the check every kernel entry point
/// that takes an explicit path makes before running `#[target_feature]`
/// code (paths from [`path`] always pass).
#[inline]
pub(crate) fn check(p: KernelPath) -> KernelPath {
    assert!(p.supported(), "CPU kernel path {p} is not supported here");
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setting_parses_and_refuses_what_the_cpu_lacks() {
        assert_eq!(KernelPath::from_setting(None), Ok(KernelPath::best()));
        assert_eq!(KernelPath::from_setting(Some(" ")), Ok(KernelPath::best()));
        assert_eq!(
            KernelPath::from_setting(Some("Portable")),
            Ok(KernelPath::Portable)
        );
        let e = KernelPath::from_setting(Some("sse9")).unwrap_err();
        assert!(
            e.to_string().contains("\"sse9\" is not a kernel path"),
            "{e}"
        );
        for p in KernelPath::ALL {
            match KernelPath::from_setting(Some(p.name())) {
                Ok(got) => assert!(got == p && p.supported()),
                Err(e) => {
                    assert!(!p.supported());
                    let msg = e.to_string();
                    assert!(
                        msg.contains("this CPU lacks") && msg.contains("portable"),
                        "{msg}"
                    );
                }
            }
        }
        // Neon and the x86 paths never coexist.
        assert!(!(KernelPath::Neon.supported() && KernelPath::Avx2.supported()));
        assert!(KernelPath::supported_paths().contains(&KernelPath::Portable));
    }
}
