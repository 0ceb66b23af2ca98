use std::fmt;

use crate::{BlockHash, BlockId};

/// Identifier of a program (one agent workflow). Opaque to this crate, but it must
/// be unique per program: the pool uses it to track which program solely owns a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProgramId(pub u64);

impl fmt::Display for ProgramId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{}", self.0)
    }
}

/// The KV state of one program on one replica, kept between its requests.
#[derive(Debug, Default)]
pub(crate) struct ProgramKv {
    /// Block table covering `num_slots` tokens; empty while the program is paused.
    pub blocks: Vec<BlockId>,
    /// Chained hashes of the program's full computed blocks. Kept across a pause so
    /// the scheduler can probe what survives in the cache before restoring.
    pub hashes: Vec<BlockHash>,
    /// Tokens of the trailing partial block that are computed (`< block_size`).
    pub tail: Vec<u32>,
    /// Tokens whose K/V are written in the blocks.
    pub num_computed: usize,
    /// Tokens for which slots are allocated (`>= num_computed`).
    pub num_slots: usize,
    /// Blocks of `blocks` that no other program references.
    pub exclusive: usize,
    /// The salt of its chain's first block (the cache's salt mixed with the
    /// current request's); a turn with another salt matches none of its blocks.
    pub salt: u64,
}

impl ProgramKv {
    pub fn is_resident(&self) -> bool {
        !self.blocks.is_empty()
    }
}
