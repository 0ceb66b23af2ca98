//! The one global waiting queue (over all replicas) of programs with a request
//! to run.
//!
//! Order (DESIGN §4, restore score `1/c + 1[Reasoning]`): programs that were
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
    }

    pub fn remove(&mut self, p: ProgramId) -> bool {
        match self.keys.remove(&p) {
            Some(k) => self.set.remove(&k),
            None => false,
        }
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
    fn aging_lets_an_old_large_program_overtake() {
        let mut q = WaitingQueue::new(100.0);
        q.push(ProgramId(1), QueueClass::New, 10_000, 0.0);
        // 200 s later, a 100-token program arrives: 100 + 100·200 > 10 000.
        q.push(ProgramId(2), QueueClass::New, 100, 200.0);
        assert_eq!(q.iter().next(), Some(ProgramId(1)));
    }
}
