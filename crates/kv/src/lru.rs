//! An intrusive doubly-linked list over block indices: O(1) push to the tail,
//! pop from the head and removal from the middle (a cache hit on an evictable
//! block takes it out of the LRU wherever it is). Same idea as vLLM's
//! `FreeKVCacheBlockQueue`, without per-node allocations.

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Links {
    prev: u32,
    next: u32,
    linked: bool,
}

#[derive(Debug)]
pub(crate) struct Lru {
    links: Vec<Links>,
    head: u32,
    tail: u32,
    len: usize,
}

impl Lru {
    pub fn new(capacity: usize) -> Self {
        Self {
            links: vec![
                Links {
                    prev: NIL,
                    next: NIL,
                    linked: false
                };
                capacity
            ],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn contains(&self, i: u32) -> bool {
        self.links[i as usize].linked
    }

    /// Most recently released goes to the tail; eviction takes from the head.
    pub fn push_back(&mut self, i: u32) {
        self.link(i, self.tail, NIL);
    }

    /// First to be evicted: the head.
    pub fn push_front(&mut self, i: u32) {
        self.link(i, NIL, self.head);
    }

    /// Links the unlinked `i` between the adjacent `prev` and `next` (NIL:
    /// the list's end on that side).
    fn link(&mut self, i: u32, prev: u32, next: u32) {
        debug_assert!(!self.contains(i));
        self.links[i as usize] = Links {
            prev,
            next,
            linked: true,
        };
        if prev == NIL {
            self.head = i;
        } else {
            self.links[prev as usize].next = i;
        }
        if next == NIL {
            self.tail = i;
        } else {
            self.links[next as usize].prev = i;
        }
        self.len += 1;
    }

    pub fn pop_front(&mut self) -> Option<u32> {
        if self.head == NIL {
            return None;
        }
        let i = self.head;
        self.remove(i);
        Some(i)
    }

    pub fn remove(&mut self, i: u32) {
        let Links { prev, next, linked } = self.links[i as usize];
        debug_assert!(linked);
        if !linked {
            return;
        }
        if prev == NIL {
            self.head = next;
        } else {
            self.links[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.links[next as usize].prev = prev;
        }
        self.links[i as usize] = Links {
            prev: NIL,
            next: NIL,
            linked: false,
        };
        self.len -= 1;
    }

    /// Walks head → tail (least to most recently used). For invariant checks.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let mut cur = self.head;
        std::iter::from_fn(move || {
            if cur == NIL {
                return None;
            }
            let i = cur;
            cur = self.links[i as usize].next;
            Some(i)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_and_middle_removal() {
        let mut l = Lru::new(5);
        for i in [3, 1, 4, 0] {
            l.push_back(i);
        }
        l.remove(1);
        assert_eq!(l.iter().collect::<Vec<_>>(), vec![3, 4, 0]);
        assert_eq!(l.pop_front(), Some(3));
        l.push_back(1);
        assert_eq!(l.iter().collect::<Vec<_>>(), vec![4, 0, 1]);
        assert_eq!(l.len(), 3);
        l.remove(1);
        l.remove(4);
        l.remove(0);
        assert_eq!(l.pop_front(), None);
        assert_eq!(l.len(), 0);
    }

    #[test]
    fn push_front_is_evicted_first() {
        let mut l = Lru::new(4);
        l.push_front(2);
        l.push_back(0);
        l.push_front(3);
        assert_eq!(l.iter().collect::<Vec<_>>(), vec![3, 2, 0]);
        l.remove(3);
        assert_eq!(l.pop_front(), Some(2));
        assert_eq!(l.pop_front(), Some(0));
        assert_eq!(l.pop_front(), None);
        l.push_front(1);
        assert_eq!(l.iter().collect::<Vec<_>>(), vec![1]);
    }
}
