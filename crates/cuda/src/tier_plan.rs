//! The GPU host tier's copy schedule (docs/design.md §4 on the GPU, issue 28
//! item 4): the allocator's [`BlockCopy`]s for a step turned into as few
//! `cuMemcpyAsync` runs as their order allows, and where each run's bytes
//! lie in the device cache and in the pinned host buffer. Pure and always
//! built, so CI tests it without a GPU; `tier.rs` (feature `cuda`) issues
//! the runs on a copy stream of their own.
//!
//! Layouts (elements of the cache dtype, 2 bytes):
//! - device, per layer, K and V each: `[num_blocks, block_elems]` (one
//!   block of one layer is contiguous: `kv_heads × block_size × head_dim`);
//! - host: `[layers, 2 (K, V), slots, block_elems]`, so a run of slots of
//!   one layer's K (or V) is contiguous too.
//!
//! Order is kept: runs are merged only from neighbouring copies in the
//! allocator's order (an offload of a block and a later onload into the
//! same block stay in that order, as on the CPU tier).

use agentd_runtime::BlockCopy;

use crate::error::{CudaError, Result};

/// Which way a run goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Device block(s) → host slot(s) (an eviction keeps its content).
    ToHost,
    /// Host slot(s) → device block(s) (a prefix match found them there).
    ToDevice,
}

/// `blocks` consecutive device blocks from `device` and host slots from
/// `host`, one way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub dir: Dir,
    pub device: usize,
    pub host: usize,
    pub blocks: usize,
}

/// The geometry the offsets need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierShape {
    pub layers: usize,
    pub device_blocks: usize,
    pub host_slots: usize,
    /// Elements of one block of one layer's K (or V).
    pub block_elems: usize,
}

impl TierShape {
    /// Elements of the pinned host buffer.
    pub fn host_elems(&self) -> Result<usize> {
        self.layers
            .checked_mul(2)
            .and_then(|n| n.checked_mul(self.host_slots))
            .and_then(|n| n.checked_mul(self.block_elems))
            .ok_or_else(|| CudaError::Unsupported("host tier size overflows".into()))
    }

    /// Element offset of `slot` of `layer`'s K (`kv` 0) or V (1) on the host.
    pub fn host_offset(&self, layer: usize, kv: usize, slot: usize) -> usize {
        ((layer * 2 + kv) * self.host_slots + slot) * self.block_elems
    }

    /// Element offset of `block` in one layer's K or V cache.
    pub fn device_offset(&self, block: usize) -> usize {
        block * self.block_elems
    }

    /// Bytes one run moves over all layers, K and V (2-byte elements).
    pub fn run_bytes(&self, run: &Run) -> u64 {
        (run.blocks * self.block_elems * 2 * self.layers * 2) as u64
    }
}

/// The copies as runs, checked against the pool and the tier before any
/// block moves.
pub fn plan_runs(copies: &[BlockCopy], shape: &TierShape) -> Result<Vec<Run>> {
    let mut runs: Vec<Run> = Vec::new();
    for c in copies {
        let (dir, device, host) = match *c {
            BlockCopy::Offload { device, host } => (Dir::ToHost, device, host),
            BlockCopy::Onload { host, device } => (Dir::ToDevice, device, host),
        };
        let (device, host) = (device.0 as usize, host as usize);
        if device >= shape.device_blocks || host >= shape.host_slots {
            return Err(CudaError::Unsupported(format!(
                "tier copy {c:?} outside the pool ({} blocks) or the tier ({} slots)",
                shape.device_blocks, shape.host_slots
            )));
        }
        match runs.last_mut() {
            Some(r)
                if r.dir == dir && r.device + r.blocks == device && r.host + r.blocks == host =>
            {
                r.blocks += 1
            }
            _ => runs.push(Run {
                dir,
                device,
                host,
                blocks: 1,
            }),
        }
    }
    Ok(runs)
}

/// Bytes the runs move to the host and to the device.
pub fn bytes_each_way(runs: &[Run], shape: &TierShape) -> (u64, u64) {
    runs.iter().fold((0, 0), |(out, back), r| match r.dir {
        Dir::ToHost => (out + shape.run_bytes(r), back),
        Dir::ToDevice => (out, back + shape.run_bytes(r)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentd_runtime::BlockId;

    const SHAPE: TierShape = TierShape {
        layers: 3,
        device_blocks: 16,
        host_slots: 8,
        block_elems: 1024,
    };

    fn off(device: u32, host: u32) -> BlockCopy {
        BlockCopy::Offload {
            device: BlockId(device),
            host,
        }
    }
    fn on(host: u32, device: u32) -> BlockCopy {
        BlockCopy::Onload {
            host,
            device: BlockId(device),
        }
    }

    #[test]
    fn neighbouring_copies_merge_into_runs_in_order() {
        let copies = [
            off(4, 0),
            off(5, 1),
            off(6, 2),
            off(9, 3), // not after block 6: a new run
            on(3, 4),  // another way: a new run, after the offload of 4
            on(4, 5),
            on(0, 6),
        ];
        let runs = plan_runs(&copies, &SHAPE).unwrap();
        let run = |dir, device, host, blocks| Run {
            dir,
            device,
            host,
            blocks,
        };
        assert_eq!(
            runs,
            [
                run(Dir::ToHost, 4, 0, 3),
                run(Dir::ToHost, 9, 3, 1),
                run(Dir::ToDevice, 4, 3, 2),
                run(Dir::ToDevice, 6, 0, 1),
            ]
        );
        let per_block = 1024 * 2 * 3 * 2;
        assert_eq!(
            bytes_each_way(&runs, &SHAPE),
            (4 * per_block, 3 * per_block)
        );
    }

    #[test]
    fn copies_outside_the_pool_or_the_tier_are_refused() {
        assert!(plan_runs(&[off(16, 0)], &SHAPE).is_err());
        assert!(plan_runs(&[on(8, 0)], &SHAPE).is_err());
        assert!(plan_runs(&[], &SHAPE).unwrap().is_empty());
    }

    #[test]
    fn offsets_follow_the_layouts() {
        assert_eq!(SHAPE.host_elems().unwrap(), 3 * 2 * 8 * 1024);
        assert_eq!(SHAPE.host_offset(0, 0, 0), 0);
        assert_eq!(SHAPE.host_offset(0, 1, 0), 8 * 1024);
        assert_eq!(SHAPE.host_offset(2, 1, 7), (5 * 8 + 7) * 1024);
        assert_eq!(SHAPE.device_offset(3), 3 * 1024);
        let huge = TierShape {
            host_slots: usize::MAX / 4,
            ..SHAPE
        };
        assert!(huge.host_elems().is_err());
    }
}
