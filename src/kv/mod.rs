//! Paged KV cache bookkeeping: block pool and per-sequence block tables (pure, no device).
//!
//! Shape follows vLLM v1's `KVCacheManager` / `BlockPool`:
//! - the cache is `n_blocks` physical blocks of `block_size` token cells;
//!   physical block 0 is the *null block* and is never handed out (padding
//!   entries of block tables may point at it safely);
//! - each sequence owns a block table (logical block -> physical block);
//!   cell of logical position `p` is `table[p / B] * B + p % B`;
//! - full blocks are registered in a prefix cache under a chained hash of
//!   (parent block hash, the block's token ids); blocks are reference counted
//!   and an unreferenced block sits on an LRU free queue, where a cached one
//!   can still be hit until it is evicted for a fresh allocation;
//! - `fork` shares blocks; appending into a shared, partially filled last
//!   block triggers copy on write, reported as a [`BlockCopy`] for the runner.

mod free_queue;
mod hash;
mod manager;
mod pool;
pub mod recurrent;
pub mod snapshots;
pub mod storage;

pub use hash::{hash_block, prefix_hash, ROOT_HASH};
pub use manager::{KvManager, KvMetrics, DEFAULT_BLOCK_SIZE};
pub use pool::BlockPool;
pub use recurrent::{RecurrentStates, StateGeometry, StateSlots};
pub use snapshots::SnapshotIndex;
pub use storage::{KvGeometry, KvStorage};

/// Identifier of one sequence (one request, or one fork of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

impl std::fmt::Display for SeqId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "seq{}", self.0)
    }
}

/// Device-side instruction: copy all cells of physical block `src` into `dst`
/// before the step runs (copy on write of a shared partial block).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockCopy {
    pub src: u32,
    pub dst: u32,
}

/// The physical id of the null block, never allocated to a sequence.
pub const NULL_BLOCK: u32 = 0;

/// Errors of the KV manager. Every error leaves the manager unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    #[error("out of KV blocks: needed {needed}, free {free}")]
    OutOfBlocks { needed: usize, free: usize },
    #[error("unknown sequence {0}")]
    UnknownSeq(SeqId),
    #[error("sequence {0} already exists")]
    SeqExists(SeqId),
    #[error("positions {start}..{end} of {seq} outside its {len} reserved tokens")]
    OutOfRange {
        seq: SeqId,
        start: usize,
        end: usize,
        len: usize,
    },
    #[error("invalid KV configuration: {0}")]
    InvalidConfig(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}
