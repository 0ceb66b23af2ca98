//! The one global waiting queue (over all replicas) of programs with a request
//! to run.
//!
//! Order (docs/design.md §5 rule 6, restore score `1/c + 1[Reasoning]`): programs that were
//! already admitted once and have a pending request come first, then new
//! programs; within a class the shortest context first, with aging.
//!
//! Aging subtracts `aging · (now − enqueued_at)` tokens from a program's context
//! for ordering. Since `now` is common to every entry, the order by
//! `c − a·(now − t)` equals the order by `c + a·t`, a key fixed at enqueue time:
//! the queue is a plain ordered set, O(log n) per operation, never re-sorted.

use std::collections::{BTreeSet, HashMap};

use crate::ProgramId;

/// Admission classes, highest priority first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QueueClass {
    /// A program admitted before (paused, or preempted mid-request).
    Restore = 0,
    /// A program never admitted yet.
    New = 1,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    class: QueueClass,
    /// `(c + aging · enqueued_at)` in thousandths of a token.
    score: i64,
    /// Arrival order breaks ties (FIFO among equals).
    seq: u64,
    id: ProgramId,
}

/// Programs waiting for admission, in restore order.
#[derive(Debug, Default)]
pub struct WaitingQueue {
    set: BTreeSet<Key>,
    keys: HashMap<ProgramId, Key>,
    /// The same programs in arrival order (`seq`), with their enqueue time:
    /// the oldest first, for bounded waiting.
    fifo: BTreeSet<(u64, ProgramId)>,
    enqueued_at: HashMap<ProgramId, (f64, u64)>,
    /// Admissions so far: an entry queued when this was `a` has been
    /// overtaken `admitted − a` times (minus its own group's).
    admitted: u64,
    aging_tokens_per_s: f64,
    next_seq: u64,
}

impl WaitingQueue {
    pub fn new(aging_tokens_per_s: f64) -> Self {
        Self {
            aging_tokens_per_s,
            ..Self::default()
        }
    }

    pub fn len(&self) -> usize {
        self.set.len()
    }
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
    pub fn contains(&self, p: ProgramId) -> bool {
        self.keys.contains_key(&p)
    }

    /// Enqueues `p` (no-op if already queued).
    pub fn push(&mut self, p: ProgramId, class: QueueClass, context_tokens: usize, now: f64) {
        if self.keys.contains_key(&p) {
            return;
        }
        let score = (context_tokens as f64 + self.aging_tokens_per_s * now) * 1000.0;
        let key = Key {
            class,
            score: score as i64,
            seq: self.next_seq,
            id: p,
        };
        self.next_seq += 1;
        self.set.insert(key);
        self.keys.insert(p, key);
        self.fifo.insert((key.seq, p));
        self.enqueued_at.insert(p, (now, self.admitted));
    }

    /// Removes `p` because it was admitted: every entry still queued was
    /// passed over once more.
    pub fn admit(&mut self, p: ProgramId) -> bool {
        let removed = self.remove(p);
        if removed {
            self.admitted += 1;
        }
        removed
    }

    pub fn remove(&mut self, p: ProgramId) -> bool {
        match self.keys.remove(&p) {
            Some(k) => {
                self.fifo.remove(&(k.seq, p));
                self.enqueued_at.remove(&p);
                self.set.remove(&k)
            }
            None => false,
        }
    }

    /// Every queued program, oldest first.
    pub fn by_arrival(&self) -> impl Iterator<Item = ProgramId> + '_ {
        self.fifo.iter().map(|&(_, p)| p)
    }

    /// Programs queued at or before `t`, or passed over by at least
    /// `bypass` admissions, oldest first (both are prefixes of the arrival
    /// order).
    pub fn overdue(&self, t: f64, bypass: u64) -> impl Iterator<Item = ProgramId> + '_ {
        self.by_arrival().take_while(move |p| {
            self.enqueued_at
                .get(p)
                .is_some_and(|&(at, adm)| at <= t || self.admitted.saturating_sub(adm) >= bypass)
        })
    }

    /// When `p` was queued.
    pub fn enqueued_at(&self, p: ProgramId) -> Option<f64> {
        self.enqueued_at.get(&p).map(|e| e.0)
    }

    /// Admissions of other programs since `p` was queued.
    pub fn bypassed(&self, p: ProgramId) -> Option<u64> {
        let (_, at) = self.enqueued_at.get(&p)?;
        Some(self.admitted.saturating_sub(*at))
    }

    /// Programs in admission order.
    pub fn iter(&self) -> impl Iterator<Item = ProgramId> + '_ {
        self.set.iter().map(|k| k.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restore_class_first_then_shortest() {
        let mut q = WaitingQueue::new(0.0);
        q.push(ProgramId(1), QueueClass::New, 100, 0.0);
        q.push(ProgramId(2), QueueClass::Restore, 5000, 0.0);
        q.push(ProgramId(3), QueueClass::Restore, 300, 0.0);
        q.push(ProgramId(4), QueueClass::New, 50, 0.0);
        let order: Vec<u64> = q.iter().map(|p| p.0).collect();
        assert_eq!(order, vec![3, 2, 4, 1]);
    }

    #[test]
    fn overdue_view_is_oldest_first_by_time_or_bypass() {
        let mut q = WaitingQueue::new(0.0);
        q.push(ProgramId(1), QueueClass::New, 10, 1.0);
        q.push(ProgramId(2), QueueClass::Restore, 99, 2.0);
        q.push(ProgramId(3), QueueClass::New, 5, 3.0);
        let old: Vec<u64> = q.overdue(2.5, u64::MAX).map(|p| p.0).collect();
        assert_eq!(old, vec![1, 2]);
        q.admit(ProgramId(3));
        q.push(ProgramId(4), QueueClass::New, 1, 4.0);
        q.admit(ProgramId(4));
        // 1 and 2 were passed over twice.
        assert_eq!(q.bypassed(ProgramId(2)), Some(2));
        let old: Vec<u64> = q.overdue(0.0, 2).map(|p| p.0).collect();
        assert_eq!(old, vec![1, 2]);
        assert_eq!(q.overdue(0.0, 3).count(), 0);
        q.remove(ProgramId(1));
        assert_eq!(q.enqueued_at(ProgramId(2)), Some(2.0));
        assert_eq!(q.enqueued_at(ProgramId(1)), None);
    }

    #[test]
    fn aging_lets_an_old_large_program_overtake() {
        let mut q = WaitingQueue::new(100.0);
        q.push(ProgramId(1), QueueClass::New, 10_000, 0.0);
        // 200 s later, a 100-token program arrives: 100 + 100·200 > 10 000.
        q.push(ProgramId(2), QueueClass::New, 100, 200.0);
        assert_eq!(q.iter().next(), Some(ProgramId(1)));
    }
}
