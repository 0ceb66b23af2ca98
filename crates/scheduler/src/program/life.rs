//! The part of a program's record its driver (the engine) keeps: who the
//! program is, its family of siblings, how it ends and since when it is
//! paused (docs/design.md §2). The policies decide nothing on it; it lives
//! in the record so that a program has one record, created once
//! ([`ProgramTable::open`]) and gone when the program terminates
//! ([`crate::ReplicaSet::terminate`] hands it back as [`Ended`]).

use super::{Program, ProgramTable};
use crate::{PauseCause, ProgramId};

/// Why a program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EndReason {
    /// A release call (`POST /programs/release`), or its parent's release
    /// (a sibling).
    Released,
    /// Its request marked `final` finished.
    Final,
    /// It had no request for longer than the inactivity lease.
    LeaseExpired,
}

impl EndReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::Final => "final",
            Self::LeaseExpired => "lease_expired",
        }
    }
}

/// What the engine keeps on a program's record.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Life {
    /// The name its requests give it; `None` for a one-off program.
    pub name: Option<String>,
    /// The program that spawned it, by name (`GenerateRequest::parent_program`).
    pub parent_program: Option<String>,
    /// Siblings: one-off programs running the requests that arrived while
    /// this program's request was busy (parallel tool calls, sub-agents
    /// sharing a session). They share its prefix through the prefix cache;
    /// its end cancels them.
    pub children: Vec<ProgramId>,
    /// For a sibling: the program it belongs to (its finished requests
    /// count as that program's steps too).
    pub parent: Option<ProgramId>,
    /// For a sibling whose request carried the final flag: its end releases
    /// the parent.
    pub release_parent: bool,
    /// Marked for release, and why: carried out once no batch holds it. A
    /// new request clears it (it revives the program).
    pub release: Option<EndReason>,
    /// Paused (why, since when: the core's `now`) and not started again:
    /// its next start is a restore, traced with how long it waited.
    pub paused: Option<(PauseCause, f64)>,
}

/// A program the core terminated: what its record said last.
#[derive(Debug, Clone, PartialEq)]
pub struct Ended {
    pub program: ProgramId,
    /// Requests completed (its siblings' included).
    pub steps: u64,
    pub life: Life,
}

impl ProgramTable {
    /// Mints a new program's id (from 1 up; the one place a program's name
    /// becomes an id) and makes its record at `now`, named `name` (`None`:
    /// a one-off program), before its first request reaches the policy:
    /// the engine does, so that a program's record exists from its first
    /// request to its end. A driver that numbers its programs itself (the
    /// simulator, the tests) never calls it; the policy makes the record
    /// of a program it sees first.
    pub fn open(&mut self, name: Option<String>, now: f64) -> ProgramId {
        self.last_id += 1;
        let p = ProgramId(self.last_id);
        if let Some(n) = &name {
            self.names.insert(n.clone(), p);
        }
        let life = Life {
            name,
            ..Life::default()
        };
        self.records
            .entry(p)
            .or_insert_with(|| Program::new(now, 0))
            .life = life;
        p
    }
    /// The id of the live program named `name`.
    pub fn id_of(&self, name: &str) -> Option<ProgramId> {
        self.names.get(name).copied()
    }
    pub fn life(&self, p: ProgramId) -> Option<&Life> {
        self.records.get(&p).map(|q| &q.life)
    }
    pub fn life_mut(&mut self, p: ProgramId) -> Option<&mut Life> {
        self.records.get_mut(&p).map(|q| &mut q.life)
    }
    /// Every program with what the engine keeps on it (in no particular order).
    pub fn lives(&self) -> impl Iterator<Item = (ProgramId, &Life)> {
        self.records.iter().map(|(&p, q)| (p, &q.life))
    }
    /// The programs marked for release.
    pub fn marked_for_release(&self) -> impl Iterator<Item = ProgramId> + '_ {
        self.records
            .iter()
            .filter(|(_, q)| q.life.release.is_some())
            .map(|(&p, _)| p)
    }
    /// `p`'s record's last word, taken as it terminates (the policy removes
    /// the record next).
    pub(crate) fn take_end(&mut self, p: ProgramId) -> Option<Ended> {
        let q = self.records.get_mut(&p)?;
        if let Some(n) = &q.life.name {
            self.names.remove(n);
        }
        Some(Ended {
            program: p,
            steps: q.steps,
            life: std::mem::take(&mut q.life),
        })
    }
    /// A request of `p` finished: when `p` is a sibling, it counts as a
    /// step of its parent too (the policy counted it as `p`'s).
    pub(crate) fn credit_parent(&mut self, p: ProgramId) {
        let parent = self.records.get(&p).and_then(|q| q.life.parent);
        if let Some(q) = parent.and_then(|parent| self.records.get_mut(&parent)) {
            q.steps += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_minted_once_and_goes_with_the_record() {
        let mut t = ProgramTable::default();
        let a = t.open(Some("a".into()), 0.0);
        let sib = t.open(None, 1.0);
        assert_ne!(a, sib, "each open mints a new id");
        assert_eq!(t.id_of("a"), Some(a));
        assert_eq!(t.life(a).and_then(|l| l.name.as_deref()), Some("a"));
        if let Some(l) = t.life_mut(sib) {
            l.parent = Some(a);
        }
        // The sibling's finished request is a step of its parent too.
        for p in [a, sib] {
            if let Some(q) = t.get_mut(&p) {
                q.steps += 1;
            }
            t.credit_parent(p);
        }
        assert_eq!(t.info(a).map(|i| i.steps), Some(2));
        assert_eq!(t.info(sib).map(|i| i.steps), Some(1));
        if let Some(l) = t.life_mut(a) {
            l.release = Some(EndReason::Final);
        }
        assert_eq!(t.marked_for_release().collect::<Vec<_>>(), vec![a]);
        let ended = t.take_end(a).expect("a has a record");
        assert_eq!((ended.program, ended.steps), (a, 2));
        assert_eq!(ended.life.release, Some(EndReason::Final));
        assert_eq!(t.id_of("a"), None, "the name goes with the program");
        let again = t.open(Some("a".into()), 2.0);
        assert_ne!(again, a, "a new program of the same name gets a new id");
    }
}
