//! The physical block pool: reference counts, the LRU free queue and the
//! prefix-cache map from block hash to block id.
//!
//! Invariants:
//! - block 0 (the null block) has no ref count, is never in the free queue and
//!   never cached;
//! - every other block is either referenced (`ref_cnt > 0`, not in the queue)
//!   or free (`ref_cnt == 0`, in the queue); a free block may still be cached
//!   and can be revived by a hit until it reaches the queue front and is
//!   evicted for a fresh allocation;
//! - `cached[h] == id` iff `meta[id].cached` is `Some` with hash `h`.

use std::collections::HashMap;

use super::free_queue::FreeQueue;
use super::{KvError, NULL_BLOCK};

/// What the cache remembers about a full block, to verify hits exactly.
#[derive(Debug, Clone)]
struct CachedBlock {
    hash: u64,
    parent: u64,
    tokens: Vec<u32>,
}

#[derive(Debug, Clone, Default)]
struct BlockMeta {
    ref_cnt: u32,
    cached: Option<CachedBlock>,
}

/// Pool of physical KV blocks.
#[derive(Debug, Clone)]
pub struct BlockPool {
    meta: Vec<BlockMeta>,
    free: FreeQueue,
    cached: HashMap<u64, u32>,
}

impl BlockPool {
    /// A pool of `n_blocks` blocks including the null block (so at least 2).
    /// Initially the free queue holds blocks 1..n in id order.
    pub fn new(n_blocks: usize) -> Result<Self, KvError> {
        if n_blocks < 2 || n_blocks > u32::MAX as usize {
            return Err(KvError::InvalidConfig(format!(
                "n_blocks must be in 2..=u32::MAX (block 0 is the null block), got {n_blocks}"
            )));
        }
        let mut free = FreeQueue::new(n_blocks);
        for id in 1..n_blocks as u32 {
            free.push_back(id);
        }
        Ok(BlockPool {
            meta: vec![BlockMeta::default(); n_blocks],
            free,
            cached: HashMap::new(),
        })
    }

    /// Total blocks, the null block included.
    pub fn num_blocks(&self) -> usize {
        self.meta.len()
    }

    /// Blocks on the free queue (cached-but-unreferenced ones included:
    /// they are evictable).
    pub fn num_free_blocks(&self) -> usize {
        self.free.len()
    }

    /// Blocks currently referenced by at least one sequence.
    pub fn num_used_blocks(&self) -> usize {
        self.meta.len() - 1 - self.free.len()
    }

    /// Blocks registered in the prefix cache (referenced or not).
    pub fn num_cached_blocks(&self) -> usize {
        self.cached.len()
    }

    /// Reference count of a block (0 for the null block or a bad id).
    pub fn ref_cnt(&self, id: u32) -> u32 {
        self.meta.get(id as usize).map_or(0, |m| m.ref_cnt)
    }

    /// Prefix-cache hash of a block, if it is registered.
    pub fn block_hash(&self, id: u32) -> Option<u64> {
        self.meta
            .get(id as usize)
            .and_then(|m| m.cached.as_ref().map(|c| c.hash))
    }

    /// Free queue from front (evicted first) to back.
    pub fn free_block_ids(&self) -> Vec<u32> {
        self.free.ids()
    }

    /// Pops the LRU free block, drops its cache entry (eviction) and returns
    /// it with ref count 1. `None` when nothing is free.
    pub(crate) fn get_new_block(&mut self) -> Option<u32> {
        let id = self.free.pop_front()?;
        let m = &mut self.meta[id as usize];
        if let Some(c) = m.cached.take() {
            self.cached.remove(&c.hash);
        }
        debug_assert_eq!(m.ref_cnt, 0);
        m.ref_cnt = 1;
        Some(id)
    }

    /// Adds a reference to a block; revives it from the free queue if it was
    /// unreferenced (a prefix-cache hit on a free block).
    pub(crate) fn touch(&mut self, id: u32) {
        debug_assert_ne!(id, NULL_BLOCK);
        let m = &mut self.meta[id as usize];
        if m.ref_cnt == 0 {
            self.free.remove(id);
        }
        m.ref_cnt += 1;
    }

    /// Drops one reference; an unreferenced block goes to the back of the free
    /// queue (most recently used), keeping its cache entry.
    pub(crate) fn release(&mut self, id: u32) {
        debug_assert_ne!(id, NULL_BLOCK);
        let m = &mut self.meta[id as usize];
        debug_assert!(m.ref_cnt > 0);
        m.ref_cnt -= 1;
        if m.ref_cnt == 0 {
            self.free.push_back(id);
        }
    }

    /// The cached block holding exactly (parent, tokens) under `hash`, if any.
    /// Compares the stored parent hash and tokens so a hash collision cannot
    /// alias two different contents.
    pub(crate) fn lookup(&self, hash: u64, parent: u64, tokens: &[u32]) -> Option<u32> {
        let id = *self.cached.get(&hash)?;
        let c = self.meta[id as usize].cached.as_ref()?;
        (c.parent == parent && c.tokens == tokens).then_some(id)
    }

    /// Registers a full, referenced block under `hash`. Returns false (and
    /// changes nothing) if the block is already registered or the hash is
    /// taken (an identical block computed concurrently, or a collision): the
    /// first registration wins and this block stays uncached.
    pub(crate) fn cache_block(&mut self, id: u32, hash: u64, parent: u64, tokens: &[u32]) -> bool {
        let m = &mut self.meta[id as usize];
        if id == NULL_BLOCK || m.cached.is_some() || self.cached.contains_key(&hash) {
            return false;
        }
        m.cached = Some(CachedBlock {
            hash,
            parent,
            tokens: tokens.to_vec(),
        });
        self.cached.insert(hash, id);
        true
    }

    /// Whether a block is on the free queue.
    pub(crate) fn is_free(&self, id: u32) -> bool {
        self.free.contains(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_collision_does_not_alias() {
        let mut p = BlockPool::new(4).unwrap();
        let id = p.get_new_block().unwrap();
        assert!(p.cache_block(id, 42, 7, &[1, 2]));
        assert_eq!(p.lookup(42, 7, &[1, 2]), Some(id));
        // Same hash, different tokens or parent: a collision, not a hit.
        assert_eq!(p.lookup(42, 7, &[1, 3]), None);
        assert_eq!(p.lookup(42, 8, &[1, 2]), None);
        // The hash is taken: a second block cannot register under it.
        let id2 = p.get_new_block().unwrap();
        assert!(!p.cache_block(id2, 42, 9, &[5, 5]));
        assert_eq!(p.block_hash(id2), None);
        assert_eq!(p.num_cached_blocks(), 1);
    }

    #[test]
    fn eviction_drops_hash() {
        let mut p = BlockPool::new(2).unwrap();
        let id = p.get_new_block().unwrap();
        p.cache_block(id, 1, 0, &[3]);
        p.release(id);
        assert_eq!(p.lookup(1, 0, &[3]), Some(id));
        assert_eq!(p.get_new_block(), Some(id));
        assert_eq!(p.lookup(1, 0, &[3]), None);
        assert_eq!(p.num_cached_blocks(), 0);
        assert_eq!(p.get_new_block(), None);
    }
}
