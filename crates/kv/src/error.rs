use crate::ProgramId;

/// Errors of the KV allocator. None of them leave the pool in an inconsistent state:
/// an allocation that cannot be satisfied in full takes nothing.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KvError {
    /// Not enough free or evictable blocks for the requested slots.
    #[error("out of KV blocks: need {needed}, {available} free or evictable")]
    OutOfBlocks { needed: usize, available: usize },
    /// The program has no block table on this replica.
    #[error("program {0} has no KV state on this replica")]
    UnknownProgram(ProgramId),
    /// Tokens were committed beyond the allocated slots (a caller bug).
    #[error("program {program}: committing {committing} tokens but only {allocated} slots are allocated past the computed prefix")]
    CommitBeyondSlots {
        program: ProgramId,
        committing: usize,
        allocated: usize,
    },
}
