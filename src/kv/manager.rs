//! Per-sequence block tables on top of the [`BlockPool`], with prefix caching
//! and copy on write.
//!
//! Invariants (checked by the tests' leak audit):
//! - for every sequence, `blocks.len() == ceil(n_tokens / B)`;
//! - a block's ref count equals the number of block-table entries naming it;
//! - the null block appears only in a prefix of a table: the blocks a
//!   sliding window left ([`KvManager::release_before`]);
//! - `hashes[i]` is the chained hash of logical block `i` for the committed
//!   full blocks `0..hashes.len()`;
//! - every method either succeeds or returns an error leaving all state
//!   (tables, ref counts, free queue, cache, metrics) unchanged.

use std::collections::BTreeMap;

use super::hash::{hash_block, ROOT_HASH};
use super::pool::BlockPool;
use super::{BlockCopy, KvError, SeqId, NULL_BLOCK};

/// Default tokens per block.
pub const DEFAULT_BLOCK_SIZE: usize = 16;

#[derive(Debug, Clone, Default)]
struct SeqState {
    /// Block table: logical block -> physical block.
    blocks: Vec<u32>,
    /// Tokens whose cells are reserved (written or about to be).
    n_tokens: usize,
    /// Chained hashes of the committed full blocks, in order.
    hashes: Vec<u64>,
}

/// Counters for the prefix cache and the pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvMetrics {
    /// Prompt tokens looked up in the prefix cache (successful allocations).
    pub prefix_query_tokens: u64,
    /// Of those, tokens served from the cache.
    pub prefix_hit_tokens: u64,
    pub used_blocks: usize,
    pub free_blocks: usize,
    pub cached_blocks: usize,
}

impl KvMetrics {
    /// Hit rate in tokens, 0 when nothing was queried.
    pub fn prefix_hit_rate(&self) -> f64 {
        if self.prefix_query_tokens == 0 {
            0.0
        } else {
            self.prefix_hit_tokens as f64 / self.prefix_query_tokens as f64
        }
    }
}

/// Paged KV cache manager: block tables, prefix cache, copy on write.
#[derive(Debug, Clone)]
pub struct KvManager {
    pool: BlockPool,
    block_size: usize,
    seqs: BTreeMap<SeqId, SeqState>,
    prefix_query_tokens: u64,
    prefix_hit_tokens: u64,
}

impl KvManager {
    /// `n_blocks` physical blocks (block 0 is the null block) of `block_size`
    /// cells each. Cell ids must fit in `u32`.
    pub fn new(n_blocks: usize, block_size: usize) -> Result<Self, KvError> {
        if block_size == 0 {
            return Err(KvError::InvalidConfig("block_size must be >= 1".into()));
        }
        if (n_blocks as u128) * (block_size as u128) > (1u128 << 32) {
            return Err(KvError::InvalidConfig(format!(
                "{n_blocks} blocks x {block_size} cells do not fit u32 cell ids"
            )));
        }
        Ok(KvManager {
            pool: BlockPool::new(n_blocks)?,
            block_size,
            seqs: BTreeMap::new(),
            prefix_query_tokens: 0,
            prefix_hit_tokens: 0,
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }
    /// Total physical blocks, the null block included.
    pub fn num_blocks(&self) -> usize {
        self.pool.num_blocks()
    }
    /// Blocks that a fresh allocation may take (evictable cached ones included).
    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free_blocks()
    }
    /// Blocks referenced by at least one sequence.
    pub fn num_used_blocks(&self) -> usize {
        self.pool.num_used_blocks()
    }
    /// Read access to the pool (ref counts, free queue order, cache state).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }
    /// Whether `seq` holds a block table.
    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }
    /// Live sequences.
    pub fn num_seqs(&self) -> usize {
        self.seqs.len()
    }
    /// Tokens reserved for `seq`.
    pub fn seq_len(&self, seq: SeqId) -> Option<usize> {
        self.seqs.get(&seq).map(|s| s.n_tokens)
    }
    /// The block table of `seq`.
    pub fn block_table(&self, seq: SeqId) -> Option<&[u32]> {
        self.seqs.get(&seq).map(|s| s.blocks.as_slice())
    }

    pub fn metrics(&self) -> KvMetrics {
        KvMetrics {
            prefix_query_tokens: self.prefix_query_tokens,
            prefix_hit_tokens: self.prefix_hit_tokens,
            used_blocks: self.num_used_blocks(),
            free_blocks: self.num_free_blocks(),
            cached_blocks: self.pool.num_cached_blocks(),
        }
    }

    fn blocks_for(&self, n_tokens: usize) -> usize {
        n_tokens.div_ceil(self.block_size)
    }

    /// Fresh blocks `allocate(seq, n_total)` would take (copy on write
    /// included); 0 if nothing grows. An unknown seq counts as empty.
    pub fn blocks_needed(&self, seq: SeqId, n_total: usize) -> usize {
        let Some(s) = self.seqs.get(&seq) else {
            return self.blocks_for(n_total);
        };
        if n_total <= s.n_tokens {
            return 0;
        }
        let grow = self.blocks_for(n_total) - s.blocks.len();
        grow + usize::from(self.needs_cow(s))
    }

    /// The last block is partially filled and shared: the next append must
    /// copy it first.
    fn needs_cow(&self, s: &SeqState) -> bool {
        !s.n_tokens.is_multiple_of(self.block_size)
            && s.blocks.last().is_some_and(|&b| self.pool.ref_cnt(b) > 1)
    }

    /// Grows `seq`'s reservation to `n_total` tokens (creating the sequence
    /// if unknown). Returns the block copies the runner must execute first.
    /// A smaller `n_total` than reserved changes nothing.
    pub fn allocate(&mut self, seq: SeqId, n_total: usize) -> Result<Vec<BlockCopy>, KvError> {
        let needed = self.blocks_needed(seq, n_total);
        let free = self.pool.num_free_blocks();
        if needed > free {
            return Err(KvError::OutOfBlocks { needed, free });
        }
        let cow = self
            .seqs
            .get(&seq)
            .is_some_and(|s| n_total > s.n_tokens && self.needs_cow(s));
        let target_blocks = self.blocks_for(n_total);
        let mut state = self.seqs.remove(&seq).unwrap_or_default();
        if n_total <= state.n_tokens {
            self.seqs.insert(seq, state);
            return Ok(Vec::new());
        }
        let mut copies = Vec::new();
        // Capacity was checked above, so the pool cannot run dry below.
        if cow {
            let src = *state.blocks.last().expect("cow implies a last block");
            let dst = self.take_fresh()?;
            self.pool.release(src);
            *state.blocks.last_mut().expect("checked") = dst;
            copies.push(BlockCopy { src, dst });
        }
        while state.blocks.len() < target_blocks {
            let b = self.take_fresh()?;
            state.blocks.push(b);
        }
        state.n_tokens = n_total;
        self.seqs.insert(seq, state);
        Ok(copies)
    }

    fn take_fresh(&mut self) -> Result<u32, KvError> {
        self.pool
            .get_new_block()
            .ok_or(KvError::OutOfBlocks { needed: 1, free: 0 })
    }

    /// Longest cached full-block prefix of `tokens`: its blocks, the number of
    /// tokens they cover, and their chained hashes. At most `(len - 1) / B`
    /// blocks, so the last prompt token is always computed (its logits are
    /// needed).
    fn lookup_prefix(&self, tokens: &[u32]) -> (Vec<u32>, Vec<u64>) {
        self.lookup_prefix_upto(tokens, usize::MAX)
    }

    /// [`Self::lookup_prefix`] of at most `max_tokens` tokens.
    fn lookup_prefix_upto(&self, tokens: &[u32], max_tokens: usize) -> (Vec<u32>, Vec<u64>) {
        let b = self.block_size;
        let max_blocks = (tokens.len().saturating_sub(1) / b).min(max_tokens / b);
        let mut blocks = Vec::new();
        let mut hashes = Vec::new();
        let mut parent = ROOT_HASH;
        for chunk in tokens.chunks_exact(b).take(max_blocks) {
            let h = hash_block(parent, chunk);
            match self.pool.lookup(h, parent, chunk) {
                Some(id) => {
                    blocks.push(id);
                    hashes.push(h);
                    parent = h;
                }
                None => break,
            }
        }
        (blocks, hashes)
    }

    /// Longest cached full-block prefix of `tokens` (never the whole prompt):
    /// `(blocks, n_cached_tokens)`. Pure: takes no references.
    pub fn get_computed_blocks(&self, tokens: &[u32]) -> (Vec<u32>, usize) {
        let (blocks, _) = self.lookup_prefix(tokens);
        let n = blocks.len() * self.block_size;
        (blocks, n)
    }

    /// New sequence for prompt `tokens`: takes the cached prefix blocks and
    /// allocates the rest of the prompt. Returns the number of cached tokens.
    pub fn allocate_with_prefix(&mut self, seq: SeqId, tokens: &[u32]) -> Result<usize, KvError> {
        self.allocate_with_prefix_reserve(seq, tokens, tokens.len())
    }

    /// Like [`Self::allocate_with_prefix`] but reserves only `n_reserve`
    /// tokens (at least the cached ones), for chunked prefill that grows the
    /// table step by step with [`Self::allocate`].
    pub fn allocate_with_prefix_reserve(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        n_reserve: usize,
    ) -> Result<usize, KvError> {
        self.allocate_with_prefix_upto(seq, tokens, usize::MAX, n_reserve)
    }

    /// [`Self::allocate_with_prefix_reserve`] taking at most `max_cached`
    /// tokens from the prefix cache (a hybrid model resumes only where a
    /// state snapshot exists).
    pub fn allocate_with_prefix_upto(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        max_cached: usize,
        n_reserve: usize,
    ) -> Result<usize, KvError> {
        if self.seqs.contains_key(&seq) {
            return Err(KvError::SeqExists(seq));
        }
        let (hits, hashes) = self.lookup_prefix_upto(tokens, max_cached);
        let n_cached = hits.len() * self.block_size;
        let n_reserve = n_reserve.max(n_cached);
        let fresh = self.blocks_for(n_reserve) - hits.len();
        // Reviving an unreferenced cached block takes it off the free queue.
        let revived = hits.iter().filter(|&&b| self.pool.is_free(b)).count();
        let free = self.pool.num_free_blocks();
        if fresh + revived > free {
            return Err(KvError::OutOfBlocks {
                needed: fresh + revived,
                free,
            });
        }
        for &b in &hits {
            self.pool.touch(b);
        }
        let mut blocks = hits;
        for _ in 0..fresh {
            blocks.push(self.take_fresh()?);
        }
        self.prefix_query_tokens += tokens.len() as u64;
        self.prefix_hit_tokens += n_cached as u64;
        self.seqs.insert(
            seq,
            SeqState {
                blocks,
                n_tokens: n_reserve,
                hashes,
            },
        );
        Ok(n_cached)
    }

    /// Registers the full blocks among the first `n_computed` tokens of
    /// `tokens` (the sequence's tokens so far) in the prefix cache. Blocks
    /// committed before are skipped; the caller must pass the same tokens.
    pub fn commit_full_blocks(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        n_computed: usize,
    ) -> Result<(), KvError> {
        let b = self.block_size;
        let s = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?;
        if n_computed > tokens.len() {
            return Err(KvError::InvalidArgument(format!(
                "n_computed {n_computed} > {} tokens given",
                tokens.len()
            )));
        }
        if n_computed > s.n_tokens {
            return Err(KvError::OutOfRange {
                seq,
                start: 0,
                end: n_computed,
                len: s.n_tokens,
            });
        }
        let full = n_computed / b;
        for i in s.hashes.len()..full {
            let parent = s.hashes.last().copied().unwrap_or(ROOT_HASH);
            let chunk = &tokens[i * b..(i + 1) * b];
            let h = hash_block(parent, chunk);
            self.pool.cache_block(s.blocks[i], h, parent, chunk);
            s.hashes.push(h);
        }
        Ok(())
    }

    /// `child` shares all of `parent`'s blocks (ref counts up). Assumes the
    /// parent's reserved cells are written; the first append of either side
    /// into a shared partial last block triggers copy on write.
    pub fn fork(&mut self, parent: SeqId, child: SeqId) -> Result<(), KvError> {
        if self.seqs.contains_key(&child) {
            return Err(KvError::SeqExists(child));
        }
        let state = self
            .seqs
            .get(&parent)
            .ok_or(KvError::UnknownSeq(parent))?
            .clone();
        for &b in state.blocks.iter().filter(|&&b| b != NULL_BLOCK) {
            self.pool.touch(b);
        }
        self.seqs.insert(child, state);
        Ok(())
    }

    /// Releases `seq`'s blocks. Tail blocks are released first so that they
    /// are evicted before the (more shareable) prefix blocks, as in vLLM.
    pub fn free(&mut self, seq: SeqId) -> Result<(), KvError> {
        let s = self.seqs.remove(&seq).ok_or(KvError::UnknownSeq(seq))?;
        for &b in s.blocks.iter().rev().filter(|&&b| b != NULL_BLOCK) {
            self.pool.release(b);
        }
        Ok(())
    }

    /// Sliding-window attention: releases `seq`'s blocks that hold only
    /// positions before `first_needed` (no later query reads them) and
    /// puts the null block in their table entries, which the attention
    /// never reads. Oldest first, so they are evicted first. Returns how
    /// many blocks were released. Positions at or past the reserved
    /// tokens stay.
    pub fn release_before(&mut self, seq: SeqId, first_needed: usize) -> Result<usize, KvError> {
        let b = self.block_size;
        let s = self.seqs.get_mut(&seq).ok_or(KvError::UnknownSeq(seq))?;
        let whole = first_needed.min(s.n_tokens) / b;
        let mut n = 0;
        for e in s.blocks.iter_mut().take(whole) {
            if *e != NULL_BLOCK {
                self.pool.release(*e);
                *e = NULL_BLOCK;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Physical cell ids of positions `start_pos..start_pos + n` of `seq`.
    pub fn slot_mapping(
        &self,
        seq: SeqId,
        start_pos: usize,
        n: usize,
    ) -> Result<Vec<u32>, KvError> {
        let s = self.seqs.get(&seq).ok_or(KvError::UnknownSeq(seq))?;
        let end = start_pos.saturating_add(n);
        if end > s.n_tokens {
            return Err(KvError::OutOfRange {
                seq,
                start: start_pos,
                end,
                len: s.n_tokens,
            });
        }
        let b = self.block_size;
        // new() guarantees n_blocks * B <= 2^32, so cell ids fit in u32.
        Ok((start_pos..end)
            .map(|p| s.blocks[p / b] * b as u32 + (p % b) as u32)
            .collect())
    }

    /// Checks the ref-count invariant against all block tables (test and
    /// debug aid): every block's ref count equals its number of table
    /// entries, and used + free + null == total.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut refs = vec![0u32; self.pool.num_blocks()];
        for (id, s) in &self.seqs {
            if s.blocks.len() != self.blocks_for(s.n_tokens) {
                return Err(format!(
                    "{id}: {} blocks for {} tokens",
                    s.blocks.len(),
                    s.n_tokens
                ));
            }
            // Released window blocks: a prefix of null entries.
            let released = s.blocks.iter().take_while(|&&b| b == NULL_BLOCK).count();
            for &b in &s.blocks[released..] {
                if b == NULL_BLOCK {
                    return Err(format!(
                        "{id} holds the null block past its released prefix"
                    ));
                }
                refs[b as usize] += 1;
            }
        }
        for (b, &r) in refs.iter().enumerate().skip(1) {
            let b = b as u32;
            if self.pool.ref_cnt(b) != r {
                return Err(format!(
                    "block {b}: ref_cnt {} but {r} table entries",
                    self.pool.ref_cnt(b)
                ));
            }
            if (r == 0) != self.pool.is_free(b) {
                return Err(format!(
                    "block {b}: ref {r} but free-queue membership disagrees"
                ));
            }
        }
        if self.num_used_blocks() + self.num_free_blocks() + 1 != self.num_blocks() {
            return Err("used + free + null != total".into());
        }
        Ok(())
    }
}
