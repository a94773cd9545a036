//! Recurrent-state snapshots for prefix caching of hybrid models.
//!
//! A hybrid model's sequence cannot resume from cached KV blocks alone: its
//! recurrent state at the resume position must come too. When a step of a
//! sequence ends exactly on a snapshot boundary (a multiple of the stride,
//! itself a multiple of the block size), the engine copies the sequence's
//! state slot into a snapshot slot, keyed by the chain hash of the block
//! that ends there (the prefix cache's own key for that prefix). A later
//! sequence whose prompt hits those cached blocks restores the state from
//! the snapshot and computes from the boundary on.
//!
//! [`SnapshotIndex`] is the bookkeeping only (pure, tested with exact ids):
//! which snapshot slot holds which prefix, least recently used first out.
//! The numbers live in the executor's state arrays, in slots after the
//! sequences' own.

use std::collections::{BTreeMap, HashMap};

/// Snapshot slots by prefix: at most `capacity`, the least recently used
/// one reused first.
#[derive(Clone, Debug)]
pub struct SnapshotIndex {
    capacity: usize,
    stride: usize,
    /// (prefix chain hash, prefix tokens) -> (slot, last use).
    by_key: HashMap<(u64, usize), (u32, u64)>,
    /// last use -> key, for the eviction order.
    lru: BTreeMap<u64, (u64, usize)>,
    /// Slots never used yet, lowest first.
    free: Vec<u32>,
    clock: u64,
}

impl SnapshotIndex {
    /// `capacity` snapshot slots (0: snapshots off) at every `stride`
    /// tokens (> 0).
    pub fn new(capacity: usize, stride: usize) -> anyhow::Result<Self> {
        anyhow::ensure!(stride > 0, "state snapshot stride 0");
        anyhow::ensure!(
            u32::try_from(capacity).is_ok(),
            "{capacity} state snapshots (at most u32::MAX)"
        );
        Ok(SnapshotIndex {
            capacity,
            stride,
            by_key: HashMap::new(),
            lru: BTreeMap::new(),
            free: (0..capacity as u32).rev().collect(),
            clock: 0,
        })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn stride(&self) -> usize {
        self.stride
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Whether position `pos` (a prefix of `pos` tokens) is a boundary.
    pub fn is_boundary(&self, pos: usize) -> bool {
        pos > 0 && pos.is_multiple_of(self.stride)
    }

    /// The first boundary after `pos`.
    pub fn next_boundary(&self, pos: usize) -> usize {
        (pos / self.stride + 1) * self.stride
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The snapshot of the prefix of `n_tokens` tokens whose last block
    /// has chain hash `hash`, marked used.
    pub fn lookup(&mut self, hash: u64, n_tokens: usize) -> Option<u32> {
        let key = (hash, n_tokens);
        let now = self.tick();
        let (slot, used) = self.by_key.get_mut(&key)?;
        self.lru.remove(used);
        *used = now;
        self.lru.insert(now, key);
        Some(*slot)
    }

    /// Whether the prefix has a snapshot (no use recorded).
    pub fn contains(&self, hash: u64, n_tokens: usize) -> bool {
        self.by_key.contains_key(&(hash, n_tokens))
    }

    /// Forgets whichever prefix slot `slot` holds (a snapshot that was
    /// never filled); the slot is free again.
    pub fn forget_slot(&mut self, slot: u32) {
        let Some((&key, &(_, used))) = self.by_key.iter().find(|(_, v)| v.0 == slot) else {
            return;
        };
        self.by_key.remove(&key);
        self.lru.remove(&used);
        self.free.push(slot);
    }

    /// A slot for a new snapshot of the prefix (`hash`, `n_tokens`): an
    /// unused slot, else the least recently used one (its prefix is
    /// forgotten). None when the prefix has one already or capacity is 0.
    /// The caller fills the slot before the next lookup.
    pub fn insert(&mut self, hash: u64, n_tokens: usize) -> Option<u32> {
        let key = (hash, n_tokens);
        if self.capacity == 0 || self.by_key.contains_key(&key) {
            return None;
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                let (&t, &old) = self.lru.iter().next()?;
                self.lru.remove(&t);
                self.by_key.remove(&old)?.0
            }
        };
        let now = self.tick();
        self.by_key.insert(key, (slot, now));
        self.lru.insert(now, key);
        Some(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_reuse_with_exact_ids() {
        let mut s = SnapshotIndex::new(2, 32).unwrap();
        assert_eq!(s.insert(10, 32), Some(0));
        assert_eq!(s.insert(11, 64), Some(1));
        assert_eq!(s.insert(10, 32), None, "already held");
        // 10 used last: 11 goes first.
        assert_eq!(s.lookup(10, 32), Some(0));
        assert_eq!(s.insert(12, 96), Some(1));
        assert_eq!(s.lookup(11, 64), None);
        assert_eq!(s.lookup(12, 96), Some(1));
        assert_eq!(s.insert(13, 32), Some(0));
        assert!(!s.contains(10, 32));
        assert!(s.contains(12, 96) && s.contains(13, 32));
        assert_eq!(s.len(), 2);
        // The key includes the length.
        assert_eq!(s.lookup(13, 64), None);
        // A forgotten slot is free again, its prefix gone.
        s.forget_slot(0);
        assert!(!s.contains(13, 32));
        assert_eq!(s.len(), 1);
        assert_eq!(s.insert(14, 64), Some(0));
        s.forget_slot(7);
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn boundaries_and_zero_capacity() {
        let s = SnapshotIndex::new(0, 48).unwrap();
        assert!(!s.is_boundary(0) && s.is_boundary(48) && !s.is_boundary(50));
        assert_eq!(s.next_boundary(0), 48);
        assert_eq!(s.next_boundary(48), 96);
        assert_eq!(s.next_boundary(95), 96);
        let mut s = s;
        assert_eq!(s.insert(1, 48), None);
        assert!(SnapshotIndex::new(4, 0).is_err());
    }
}
