//! Doubly linked free queue over block ids with O(1) push-back, pop-front and
//! removal from the middle (needed when a cached free block is hit).
//!
//! Invariant: a block id is in the queue at most once; `in_queue[id]` says
//! whether it is; `len` counts the members.

const NONE: u32 = u32::MAX;

#[derive(Debug, Clone)]
pub(crate) struct FreeQueue {
    prev: Vec<u32>,
    next: Vec<u32>,
    in_queue: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
}

impl FreeQueue {
    pub(crate) fn new(n: usize) -> Self {
        FreeQueue {
            prev: vec![NONE; n],
            next: vec![NONE; n],
            in_queue: vec![false; n],
            head: NONE,
            tail: NONE,
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn contains(&self, id: u32) -> bool {
        self.in_queue[id as usize]
    }

    pub(crate) fn push_back(&mut self, id: u32) {
        debug_assert!(!self.in_queue[id as usize]);
        let i = id as usize;
        self.prev[i] = self.tail;
        self.next[i] = NONE;
        if self.tail == NONE {
            self.head = id;
        } else {
            self.next[self.tail as usize] = id;
        }
        self.tail = id;
        self.in_queue[i] = true;
        self.len += 1;
    }

    pub(crate) fn pop_front(&mut self) -> Option<u32> {
        if self.head == NONE {
            return None;
        }
        let id = self.head;
        self.remove(id);
        Some(id)
    }

    pub(crate) fn remove(&mut self, id: u32) {
        let i = id as usize;
        if !self.in_queue[i] {
            return;
        }
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NONE {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NONE {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[i] = NONE;
        self.next[i] = NONE;
        self.in_queue[i] = false;
        self.len -= 1;
    }

    /// Members from front (next to be evicted) to back.
    pub(crate) fn ids(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.len);
        let mut cur = self.head;
        while cur != NONE {
            out.push(cur);
            cur = self.next[cur as usize];
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_pop_remove_order() {
        let mut q = FreeQueue::new(6);
        for id in 1..6 {
            q.push_back(id);
        }
        q.remove(3);
        q.remove(1);
        q.remove(5);
        assert_eq!(q.ids(), vec![2, 4]);
        q.push_back(3);
        assert_eq!(q.pop_front(), Some(2));
        assert_eq!(q.ids(), vec![4, 3]);
        assert_eq!(q.len(), 2);
        assert!(q.contains(3) && !q.contains(2));
        assert_eq!(q.pop_front(), Some(4));
        assert_eq!(q.pop_front(), Some(3));
        assert_eq!(q.pop_front(), None);
        assert_eq!(q.len(), 0);
    }
}
