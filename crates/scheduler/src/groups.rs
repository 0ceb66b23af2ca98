//! Program groups: an RL rollout group (GRPO's n samples of one prompt), or
//! the `n` choices of one request (docs/design.md §2,
//! §5 rule 13).
//!
//! A group's members share their prompt's blocks; they are first admitted
//! together, on one replica, and never half-admitted while the pool has
//! room for the whole group: a group is done only when its slowest member
//! is, so a member left waiting holds up the others' rewards (the reference
//! system's burst issue hurt GRPO groups most). Later turns are restored
//! member by member: restored as one unit, a group whose members queued at
//! once waited for room no single pause frees, and the slowest group took
//! 1.5x as long (`admit.rs`, `unit`).

use std::collections::{BTreeSet, HashMap};

use crate::ProgramId;

/// A group, by a stable hash of its name (scoped by the caller to a tenant).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupId(pub u64);

/// A program's membership as the core reports it when a request arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupJoin {
    pub group: GroupId,
    /// Members the group will have, when the client says (`n` choices,
    /// `group_size`): admission waits for them (at most
    /// `SchedulerConfig::group_gather_s`) so the first arrival is not
    /// admitted alone.
    pub size: Option<usize>,
    /// Leading tokens of this member's context equal to the group's first
    /// member's (the shared prompt): their blocks are counted once.
    pub shared_tokens: usize,
}

#[derive(Debug, Clone)]
pub(crate) struct Group {
    pub members: BTreeSet<ProgramId>,
    pub size: Option<usize>,
    /// When its first member arrived.
    pub since: f64,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct GroupTable {
    groups: HashMap<GroupId, Group>,
}

impl GroupTable {
    pub fn join(&mut self, p: ProgramId, join: &GroupJoin, now: f64) {
        let g = self.groups.entry(join.group).or_insert_with(|| Group {
            members: BTreeSet::new(),
            size: join.size,
            since: now,
        });
        if join.size.is_some() {
            g.size = join.size;
        }
        g.members.insert(p);
    }

    pub fn leave(&mut self, p: ProgramId, g: GroupId) {
        if let Some(group) = self.groups.get_mut(&g) {
            group.members.remove(&p);
            if group.members.is_empty() {
                self.groups.remove(&g);
            }
        }
    }

    pub fn get(&self, g: GroupId) -> Option<&Group> {
        self.groups.get(&g)
    }

    /// Whether admission should still wait for members announced but not
    /// arrived yet.
    pub fn gathering(&self, g: GroupId, now: f64, gather_s: f64) -> bool {
        self.groups.get(&g).is_some_and(|x| {
            x.size.is_some_and(|n| x.members.len() < n) && now - x.since < gather_s
        })
    }
}
