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

/// A queue time as a totally ordered key (simulated and engine times are
/// finite and non-negative; anything else sorts as 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Since(u64);

impl Since {
    fn of(t: f64) -> Self {
        // Non-negative finite floats order as their bit patterns do.
        Self(if t.is_finite() && t > 0.0 {
            t.to_bits()
        } else {
            0
        })
    }
}

/// Programs waiting for admission, in restore order.
#[derive(Debug, Default)]
pub struct WaitingQueue {
    set: BTreeSet<Key>,
    keys: HashMap<ProgramId, Key>,
    /// The same programs oldest first (by the time they are queued since,
    /// then arrival order `seq`), for bounded waiting.
    fifo: BTreeSet<(Since, u64, ProgramId)>,
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

    /// Enqueues `p`, waiting since `since` (no-op if already queued): the
    /// time it joins the queue, or, for a program paused mid-request, when
    /// that request arrived, so a preempted request keeps its place (its
    /// age for aging, the waiting bound and the oldest-first order) as
    /// vLLM puts a preempted request back at the head of its queue.
    pub fn push(&mut self, p: ProgramId, class: QueueClass, context_tokens: usize, since: f64) {
        if self.keys.contains_key(&p) {
            return;
        }
        let score = (context_tokens as f64 + self.aging_tokens_per_s * since) * 1000.0;
        let key = Key {
            class,
            score: score as i64,
            seq: self.next_seq,
            id: p,
        };
        self.next_seq += 1;
        self.set.insert(key);
        self.keys.insert(p, key);
        self.fifo.insert((Since::of(since), key.seq, p));
        self.enqueued_at.insert(p, (since, self.admitted));
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
                if let Some((since, _)) = self.enqueued_at.remove(&p) {
                    self.fifo.remove(&(Since::of(since), k.seq, p));
                }
                self.set.remove(&k)
            }
            None => false,
        }
    }

    /// Every queued program, oldest first.
    pub fn by_arrival(&self) -> impl Iterator<Item = ProgramId> + '_ {
        self.fifo.iter().map(|&(_, _, p)| p)
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
    fn a_preempted_request_keeps_its_place() {
        let mut q = WaitingQueue::new(0.0);
        q.push(ProgramId(1), QueueClass::Restore, 10, 5.0);
        q.push(ProgramId(2), QueueClass::Restore, 10, 6.0);
        // Paused at 7 s mid-request, its request having arrived at 3 s.
        q.push(ProgramId(3), QueueClass::Restore, 10, 3.0);
        let oldest: Vec<u64> = q.by_arrival().map(|p| p.0).collect();
        assert_eq!(oldest, vec![3, 1, 2]);
        let overdue: Vec<u64> = q.overdue(4.0, u64::MAX).map(|p| p.0).collect();
        assert_eq!(overdue, vec![3]);
        assert_eq!(q.enqueued_at(ProgramId(3)), Some(3.0));
        assert!(q.remove(ProgramId(3)));
        assert_eq!(q.by_arrival().next(), Some(ProgramId(1)));
        assert_eq!(q.overdue(4.0, u64::MAX).count(), 0);
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
