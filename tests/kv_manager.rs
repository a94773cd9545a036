//! KV manager tests with exact block ids (block size 4 for compact cases).

use quire::kv::{BlockCopy, KvError, KvManager, SeqId};

const S1: SeqId = SeqId(1);
const S2: SeqId = SeqId(2);
const S3: SeqId = SeqId(3);
const S4: SeqId = SeqId(4);

fn toks(range: std::ops::Range<u32>) -> Vec<u32> {
    range.collect()
}

#[test]
fn config_errors() {
    assert!(matches!(
        KvManager::new(1, 16),
        Err(KvError::InvalidConfig(_))
    ));
    assert!(matches!(
        KvManager::new(8, 0),
        Err(KvError::InvalidConfig(_))
    ));
    assert!(matches!(
        KvManager::new(1 << 29, 16),
        Err(KvError::InvalidConfig(_))
    ));
    let kv = KvManager::new(8, 16).unwrap();
    assert_eq!(
        (kv.num_blocks(), kv.num_free_blocks(), kv.num_used_blocks()),
        (8, 7, 0)
    );
    assert_eq!(kv.block_size(), 16);
}

#[test]
fn allocation_order_and_slot_mapping() {
    let mut kv = KvManager::new(10, 4).unwrap();
    assert_eq!(kv.allocate(S1, 10).unwrap(), vec![]);
    assert_eq!(kv.block_table(S1).unwrap(), &[1, 2, 3]);
    assert_eq!(kv.allocate(S2, 5).unwrap(), vec![]);
    assert_eq!(kv.block_table(S2).unwrap(), &[4, 5]);
    assert_eq!((kv.num_free_blocks(), kv.num_used_blocks()), (4, 5));
    // Growing within the last block takes nothing; crossing takes the next id.
    kv.allocate(S1, 12).unwrap();
    assert_eq!(kv.block_table(S1).unwrap(), &[1, 2, 3]);
    kv.allocate(S1, 13).unwrap();
    assert_eq!(kv.block_table(S1).unwrap(), &[1, 2, 3, 6]);
    // Shrinking is a no-op.
    kv.allocate(S1, 3).unwrap();
    assert_eq!(kv.seq_len(S1), Some(13));
    // table[p / 4] * 4 + p % 4
    assert_eq!(kv.slot_mapping(S1, 2, 5).unwrap(), vec![6, 7, 8, 9, 10]);
    assert_eq!(kv.slot_mapping(S1, 12, 1).unwrap(), vec![24]);
    assert_eq!(kv.slot_mapping(S2, 0, 5).unwrap(), vec![16, 17, 18, 19, 20]);
    assert!(matches!(
        kv.slot_mapping(S2, 3, 3),
        Err(KvError::OutOfRange { end: 6, len: 5, .. })
    ));
    assert!(matches!(
        kv.slot_mapping(S3, 0, 1),
        Err(KvError::UnknownSeq(S3))
    ));
    kv.check_invariants().unwrap();
}

#[test]
fn free_order_tail_first_then_reuse() {
    let mut kv = KvManager::new(10, 4).unwrap();
    kv.allocate(S1, 12).unwrap(); // [1, 2, 3]
    kv.allocate(S2, 4).unwrap(); // [4]
    kv.free(S1).unwrap();
    // Remaining initial blocks first, then S1's blocks tail first.
    assert_eq!(kv.pool().free_block_ids(), vec![5, 6, 7, 8, 9, 3, 2, 1]);
    kv.allocate(S3, 24).unwrap();
    assert_eq!(kv.block_table(S3).unwrap(), &[5, 6, 7, 8, 9, 3]);
    kv.free(S2).unwrap();
    assert_eq!(kv.pool().free_block_ids(), vec![2, 1, 4]);
    assert!(matches!(kv.free(S2), Err(KvError::UnknownSeq(S2))));
    kv.check_invariants().unwrap();
}

#[test]
fn out_of_blocks_leaves_state_unchanged() {
    let mut kv = KvManager::new(5, 4).unwrap(); // 4 usable
    kv.allocate(S1, 6).unwrap(); // [1, 2]
    let before = (kv.pool().free_block_ids(), kv.metrics());
    assert_eq!(
        kv.allocate(S2, 9),
        Err(KvError::OutOfBlocks { needed: 3, free: 2 })
    );
    assert!(!kv.contains(S2));
    assert_eq!(
        kv.allocate(S1, 17),
        Err(KvError::OutOfBlocks { needed: 3, free: 2 })
    );
    assert_eq!(kv.block_table(S1).unwrap(), &[1, 2]);
    assert_eq!(kv.seq_len(S1), Some(6));
    assert_eq!((kv.pool().free_block_ids(), kv.metrics()), before);
    // Exactly enough succeeds.
    kv.allocate(S1, 16).unwrap();
    assert_eq!(kv.block_table(S1).unwrap(), &[1, 2, 3, 4]);
    assert_eq!(kv.num_free_blocks(), 0);
    kv.check_invariants().unwrap();
}

#[test]
fn prefix_hit_reuses_blocks_and_counts_tokens() {
    let mut kv = KvManager::new(16, 4).unwrap();
    let a = toks(0..10); // blocks: [0..4] [4..8] [8..10]
    assert_eq!(kv.allocate_with_prefix(S1, &a).unwrap(), 0);
    assert_eq!(kv.block_table(S1).unwrap(), &[1, 2, 3]);
    kv.commit_full_blocks(S1, &a, 10).unwrap();
    assert_eq!(kv.metrics().cached_blocks, 2);
    // Same prefix, different tail: hits the two full blocks while S1 lives.
    let mut b = toks(0..8);
    b.extend([50, 51, 52]);
    assert_eq!(kv.get_computed_blocks(&b), (vec![1, 2], 8));
    assert_eq!(kv.allocate_with_prefix(S2, &b).unwrap(), 8);
    assert_eq!(kv.block_table(S2).unwrap(), &[1, 2, 4]);
    assert_eq!(
        (
            kv.pool().ref_cnt(1),
            kv.pool().ref_cnt(2),
            kv.pool().ref_cnt(3)
        ),
        (2, 2, 1)
    );
    // Diverging in the second block: only the first block hits.
    let mut c = toks(0..5);
    c.extend([9, 9, 9, 9, 9]);
    assert_eq!(kv.allocate_with_prefix(S3, &c).unwrap(), 4);
    assert_eq!(kv.block_table(S3).unwrap(), &[1, 5, 6]);
    let m = kv.metrics();
    assert_eq!(
        (m.prefix_query_tokens, m.prefix_hit_tokens),
        (10 + 11 + 10, 12)
    );
    assert!((m.prefix_hit_rate() - 12.0 / 31.0).abs() < 1e-12);
    assert!(matches!(
        kv.allocate_with_prefix(S3, &c),
        Err(KvError::SeqExists(S3))
    ));
    kv.check_invariants().unwrap();
}

#[test]
fn never_hits_the_whole_prompt() {
    let mut kv = KvManager::new(8, 4).unwrap();
    let a = toks(0..8);
    kv.allocate_with_prefix(S1, &a).unwrap();
    kv.commit_full_blocks(S1, &a, 8).unwrap();
    kv.free(S1).unwrap();
    // Both blocks are cached but the last token must be recomputed.
    assert_eq!(kv.get_computed_blocks(&a), (vec![1], 4));
    assert_eq!(kv.get_computed_blocks(&toks(0..9)), (vec![1, 2], 8));
    assert_eq!(kv.get_computed_blocks(&[]), (vec![], 0));
    assert_eq!(kv.get_computed_blocks(&[0, 1, 2]), (vec![], 0));
}

#[test]
fn lru_eviction_order_and_revival() {
    let mut kv = KvManager::new(6, 4).unwrap(); // blocks 1..=5
    let a = toks(0..9);
    kv.allocate_with_prefix(S1, &a).unwrap(); // [1, 2, 3]
    kv.commit_full_blocks(S1, &a, 9).unwrap(); // caches 1, 2
    kv.free(S1).unwrap();
    assert_eq!(kv.pool().free_block_ids(), vec![4, 5, 3, 2, 1]);
    assert_eq!(kv.num_free_blocks(), 5);
    // Unrelated prompt takes 4, 5, 3 (3 is uncached).
    let b = toks(100..109);
    assert_eq!(kv.allocate_with_prefix(S2, &b).unwrap(), 0);
    assert_eq!(kv.block_table(S2).unwrap(), &[4, 5, 3]);
    assert_eq!(kv.metrics().cached_blocks, 2);
    // The next fresh block evicts the LRU cached block: 2 (tail of A).
    kv.allocate(S3, 4).unwrap();
    assert_eq!(kv.block_table(S3).unwrap(), &[2]);
    assert_eq!(kv.pool().block_hash(2), None);
    assert_eq!(kv.metrics().cached_blocks, 1);
    assert_eq!(kv.get_computed_blocks(&a), (vec![1], 4));
    // A needs block 1 revived + 2 fresh, only 1 free: refused, unchanged.
    let before = (kv.pool().free_block_ids(), kv.metrics());
    assert_eq!(
        kv.allocate_with_prefix(S4, &a),
        Err(KvError::OutOfBlocks { needed: 3, free: 1 })
    );
    assert_eq!((kv.pool().free_block_ids(), kv.metrics()), before);
    // After S2 frees, the hit revives block 1 out of the middle of the queue.
    kv.free(S2).unwrap();
    assert_eq!(kv.pool().free_block_ids(), vec![1, 3, 5, 4]);
    assert_eq!(kv.allocate_with_prefix(S4, &a).unwrap(), 4);
    assert_eq!(kv.block_table(S4).unwrap(), &[1, 3, 5]);
    assert_eq!(kv.pool().free_block_ids(), vec![4]);
    kv.check_invariants().unwrap();
}

#[test]
fn concurrent_identical_blocks_first_registration_wins() {
    let mut kv = KvManager::new(10, 4).unwrap();
    let a = toks(0..6);
    kv.allocate_with_prefix(S1, &a).unwrap(); // [1, 2]
    kv.allocate_with_prefix(S2, &a).unwrap(); // [3, 4]: nothing committed yet
    kv.commit_full_blocks(S1, &a, 6).unwrap();
    kv.commit_full_blocks(S2, &a, 6).unwrap();
    assert_eq!(kv.pool().block_hash(3), None);
    assert_eq!(kv.metrics().cached_blocks, 1);
    kv.free(S1).unwrap();
    kv.free(S2).unwrap();
    assert_eq!(kv.get_computed_blocks(&a), (vec![1], 4));
    // Commit argument checks.
    kv.allocate(S3, 4).unwrap();
    assert!(matches!(
        kv.commit_full_blocks(S3, &a, 7),
        Err(KvError::InvalidArgument(_))
    ));
    assert!(matches!(
        kv.commit_full_blocks(S3, &a, 6),
        Err(KvError::OutOfRange { .. })
    ));
    assert!(matches!(
        kv.commit_full_blocks(S4, &a, 1),
        Err(KvError::UnknownSeq(S4))
    ));
}

#[test]
fn fork_ref_counts_and_copy_on_write() {
    let mut kv = KvManager::new(10, 4).unwrap();
    kv.allocate(S1, 6).unwrap(); // [1, 2], block 2 half full
    kv.fork(S1, S2).unwrap();
    assert_eq!(kv.block_table(S2).unwrap(), &[1, 2]);
    assert_eq!((kv.pool().ref_cnt(1), kv.pool().ref_cnt(2)), (2, 2));
    assert_eq!(kv.num_used_blocks(), 2);
    // The child appends into the shared partial block: copy on write.
    assert_eq!(
        kv.allocate(S2, 7).unwrap(),
        vec![BlockCopy { src: 2, dst: 3 }]
    );
    assert_eq!(kv.block_table(S2).unwrap(), &[1, 3]);
    assert_eq!((kv.pool().ref_cnt(2), kv.pool().ref_cnt(3)), (1, 1));
    // The parent now owns block 2 alone: writes in place.
    assert_eq!(kv.allocate(S1, 7).unwrap(), vec![]);
    assert_eq!(kv.block_table(S1).unwrap(), &[1, 2]);
    // Copy on write plus growth in one call.
    kv.fork(S1, S3).unwrap();
    assert_eq!(
        kv.allocate(S3, 10).unwrap(),
        vec![BlockCopy { src: 2, dst: 4 }]
    );
    assert_eq!(kv.block_table(S3).unwrap(), &[1, 4, 5]);
    assert_eq!(kv.pool().ref_cnt(1), 3);
    assert!(matches!(kv.fork(S1, S3), Err(KvError::SeqExists(S3))));
    assert!(matches!(
        kv.fork(S4, SeqId(9)),
        Err(KvError::UnknownSeq(S4))
    ));
    kv.check_invariants().unwrap();
    kv.free(S1).unwrap();
    assert_eq!(kv.pool().ref_cnt(1), 2);
    assert_eq!(kv.pool().free_block_ids(), vec![6, 7, 8, 9, 2]);
    kv.free(S3).unwrap();
    kv.free(S2).unwrap();
    assert_eq!(kv.pool().free_block_ids(), vec![6, 7, 8, 9, 2, 5, 4, 3, 1]);
    assert_eq!(kv.num_used_blocks(), 0);
}

#[test]
fn fork_full_last_block_needs_no_copy_and_cow_counts_toward_capacity() {
    let mut kv = KvManager::new(4, 4).unwrap(); // blocks 1..=3
    kv.allocate(S1, 8).unwrap(); // [1, 2] full
    kv.fork(S1, S2).unwrap();
    assert_eq!(kv.allocate(S2, 9).unwrap(), vec![]);
    assert_eq!(kv.block_table(S2).unwrap(), &[1, 2, 3]);
    kv.free(S2).unwrap();
    kv.allocate(S1, 6).unwrap(); // no-op: already 8 reserved
    kv.free(S1).unwrap();
    kv.allocate(S1, 5).unwrap(); // [3, 2]
    kv.fork(S1, S2).unwrap();
    // Growth by one block + copy on write = 2 blocks, 1 free.
    assert_eq!(kv.blocks_needed(S2, 9), 2);
    assert_eq!(
        kv.allocate(S2, 9),
        Err(KvError::OutOfBlocks { needed: 2, free: 1 })
    );
    assert_eq!(kv.block_table(S2).unwrap(), &[3, 2]);
    assert_eq!(
        kv.allocate(S2, 8).unwrap(),
        vec![BlockCopy { src: 2, dst: 1 }]
    );
    kv.check_invariants().unwrap();
}

#[test]
fn sliding_window_releases_the_blocks_it_left() {
    let mut kv = KvManager::new(10, 4).unwrap();
    kv.allocate(S1, 14).unwrap(); // [1, 2, 3, 4]
    kv.allocate(S2, 4).unwrap(); // [5]
                                 // The next query is at 14 with a window of 5: keys 10.. are needed,
                                 // so blocks 0 and 1 (positions 0..8) go; block 2 (8..12) stays.
    assert_eq!(kv.release_before(S1, 14 + 1 - 5).unwrap(), 2);
    assert_eq!(kv.block_table(S1).unwrap(), &[0, 0, 3, 4]);
    assert_eq!(kv.pool().free_block_ids(), vec![6, 7, 8, 9, 1, 2]);
    assert_eq!((kv.num_free_blocks(), kv.num_used_blocks()), (6, 3));
    kv.check_invariants().unwrap();
    // Again: nothing new to release.
    assert_eq!(kv.release_before(S1, 10).unwrap(), 0);
    // Positions past the reservation are not released (14 tokens: blocks
    // 0..3 at most).
    assert_eq!(kv.release_before(S1, 100).unwrap(), 1);
    assert_eq!(kv.block_table(S1).unwrap(), &[0, 0, 0, 4]);
    // The table keeps its length; growing appends after the last block.
    kv.allocate(S1, 17).unwrap();
    assert_eq!(kv.block_table(S1).unwrap(), &[0, 0, 0, 4, 6]);
    assert_eq!(kv.slot_mapping(S1, 15, 2).unwrap(), vec![19, 24]);
    kv.check_invariants().unwrap();
    // A fork shares only the live blocks; freeing skips the null entries.
    kv.fork(S1, S3).unwrap();
    assert_eq!(kv.pool().ref_cnt(4), 2);
    assert_eq!(kv.pool().ref_cnt(0), 0);
    kv.check_invariants().unwrap();
    kv.free(S1).unwrap();
    kv.free(S3).unwrap();
    kv.free(S2).unwrap();
    assert_eq!(kv.num_used_blocks(), 0);
    kv.check_invariants().unwrap();
    assert!(matches!(
        kv.release_before(S4, 3),
        Err(KvError::UnknownSeq(S4))
    ));
}

#[test]
fn released_window_blocks_stay_in_the_prefix_cache() {
    let mut kv = KvManager::new(10, 4).unwrap();
    let t = toks(0..13);
    assert_eq!(kv.allocate_with_prefix(S1, &t).unwrap(), 0); // [1, 2, 3, 4]
    kv.commit_full_blocks(S1, &t, 12).unwrap();
    assert_eq!(kv.release_before(S1, 9).unwrap(), 2);
    // A new prompt with the same 12 first tokens revives them by hash.
    let mut u = toks(0..12);
    u.push(99);
    assert_eq!(kv.allocate_with_prefix(S2, &u).unwrap(), 12);
    assert_eq!(&kv.block_table(S2).unwrap()[..3], &[1, 2, 3]);
    kv.check_invariants().unwrap();
}
