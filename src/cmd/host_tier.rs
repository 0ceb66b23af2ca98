//! The host KV tier behind each replica's pool: how many blocks it gets.
//!
//! `--num-host-kv-blocks N` or `--kv-offloading-size GiB` (vLLM's flag;
//! `0` turns the tier off) set it. Unset, the CPU engine gets a tier sized
//! from the machine:
//!
//! * **a quarter of `MemAvailable`** at start (the pool, the weights and
//!   the OS keep the rest), **capped at 8× the pool**: the CPU bench with a
//!   tier of 8× its pool and the measured rotation ran 650 steps/min
//!   against 525 without (1.24×), p99/p50 1.6 against 34.8
//!   (`benches/results/host-tier.md`). With this default (8 pools at the
//!   cap) against `--kv-offloading-size 0` on one AMD EPYC (avx512 path),
//!   the long workload ran 1.16× / 1.39× the steps/min at 16 / 48
//!   programs, p99 12.2 vs 37.4 s and 19.1 vs 68.9 s
//!   (`benches/results/host-tier-default.md`);
//! * any size helps, more helps more: `agentd simulate` (swe, H100 cost,
//!   192 programs, tier in pools: 0 / 0.5 / 1 / 2 / 4) ran 297.4 / 298.6 /
//!   306.8 / 316.6 / 322.8 steps/min (`benches/results/sim-host-tier.md`); the CPU long workload (`--workload
//!   long --cost cpu-avx2`, a 32,768-token pool, 16 programs) 77.5 without
//!   a tier and 118–120 with 2–8 pools.
//!
//! On the CPU the pool and the tier share RAM, and a larger pool alone does
//! better than a pool plus a tier of the same total (the long workload at
//! 16 programs: 129.6 steps/min with a 294,912-token pool, 114.4 with
//! 32,768 + a 262,144-token tier): the tier is the memory a machine has
//! *beyond* the pool it was given (`VLLM_CPU_KVCACHE_SPACE`, 4 GiB by
//! default, as vLLM), not a split of it.
//!
//! The CUDA engine's tier (pinned host memory, copies on their own stream:
//! `crates/cuda/src/tier.rs`) is off by default until an H200 run has
//! checked it (issue 28); `--kv-offloading-size` / `--num-host-kv-blocks`
//! turn it on.
//! Both buffers are allocated zeroed (`calloc`): a tier costs resident
//! memory only as evicted blocks fill it.

use anyhow::Result;

use super::kv_size::KvPlan;

/// The share of available memory a default tier may take.
const MEM_FRACTION: f64 = 0.25;
/// The largest default tier, in pools.
const MAX_POOLS: f64 = 8.0;

/// What the sizing reads from the command line and the machine.
pub struct TierArgs {
    pub kv_offloading_size: Option<f64>,
    pub num_host_kv_blocks: Option<usize>,
    pub cuda: bool,
    /// `MemAvailable` in bytes (None: unknown, no default tier).
    pub mem_available: Option<u64>,
}

/// Host-tier blocks per replica and the reason, for the start log.
pub fn plan(a: &TierArgs, kv: &KvPlan) -> Result<(usize, String)> {
    let per_block = kv.bytes_per_block.max(1) as f64;
    if let Some(n) = a.num_host_kv_blocks {
        return Ok((n, "--num-host-kv-blocks".into()));
    }
    if let Some(gib) = a.kv_offloading_size {
        anyhow::ensure!(
            gib.is_finite() && gib >= 0.0,
            "--kv-offloading-size must be a size in GiB, got {gib}"
        );
        let blocks = (gib * GIB / per_block) as usize;
        return Ok((blocks, format!("--kv-offloading-size {gib}")));
    }
    if a.cuda {
        return Ok((
            0,
            "off on CUDA until validated on a GPU; --kv-offloading-size GiB turns it on".into(),
        ));
    }
    let Some(avail) = a.mem_available else {
        return Ok((0, "MemAvailable unknown".into()));
    };
    let pool = kv.num_blocks as f64 * per_block;
    let bytes = (avail as f64 * MEM_FRACTION).min(MAX_POOLS * pool);
    let blocks = (bytes / per_block) as usize;
    Ok((
        blocks,
        format!(
            "{:.1} GiB: a quarter of available memory, at most 8x the pool; \
             --kv-offloading-size 0 turns it off",
            blocks as f64 * per_block / GIB
        ),
    ))
}

const GIB: f64 = (1u64 << 30) as f64;

/// `MemAvailable` from `/proc/meminfo`, in bytes.
pub fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&text)
}

fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(blocks: usize) -> KvPlan {
        KvPlan {
            num_blocks: blocks,
            block_size: 16,
            bytes_per_block: 1 << 20,
            source: String::new(),
            gpu_utilization: None,
        }
    }

    fn args(avail_gib: u64) -> TierArgs {
        TierArgs {
            kv_offloading_size: None,
            num_host_kv_blocks: None,
            cuda: false,
            mem_available: Some(avail_gib << 30),
        }
    }

    #[test]
    fn a_quarter_of_available_memory_capped_at_eight_pools() {
        // 256 MiB pool, 64 GiB available: 16 GiB > 8 pools -> 2 GiB.
        assert_eq!(plan(&args(64), &pool(256)).unwrap().0, 8 * 256);
        // 4 GiB pool, 64 GiB available: 16 GiB = 4 pools.
        assert_eq!(plan(&args(64), &pool(4096)).unwrap().0, 16 * 1024);
    }

    #[test]
    fn off_on_cuda_and_when_memory_is_unknown() {
        // 4 GiB pool, 20 GiB available (this dev machine): 5 GiB.
        let (n, why) = plan(&args(20), &pool(4096)).unwrap();
        assert_eq!(n, 5 * 1024);
        assert!(why.contains("--kv-offloading-size 0"), "{why}");
        let mut cuda = args(64);
        cuda.cuda = true;
        assert_eq!(plan(&cuda, &pool(256)).unwrap().0, 0);
        let mut unknown = args(64);
        unknown.mem_available = None;
        assert_eq!(plan(&unknown, &pool(256)).unwrap().0, 0);
    }

    #[test]
    fn flags_win_and_zero_turns_it_off() {
        let mut a = args(64);
        a.kv_offloading_size = Some(0.0);
        assert_eq!(plan(&a, &pool(256)).unwrap().0, 0);
        a.kv_offloading_size = Some(1.5);
        assert_eq!(plan(&a, &pool(256)).unwrap().0, 1536);
        a.kv_offloading_size = Some(f64::NAN);
        assert!(plan(&a, &pool(256)).is_err());
        a.kv_offloading_size = None;
        a.num_host_kv_blocks = Some(7);
        assert_eq!(plan(&a, &pool(256)).unwrap().0, 7);
    }

    #[test]
    fn mem_available_is_read_in_kib() {
        let m = "MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(parse_mem_available(m), Some(20_000_000 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 1 kB\n"), None);
    }
}
