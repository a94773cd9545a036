//! Scheduler tests with exact schedules, budgets, preemption order and block ids.

use quire::kv::{KvManager, SeqId};
use quire::scheduler::{PrefillBudget, PrefillCap, Scheduler, SchedulerConfig, StepPlan};

const A: SeqId = SeqId(1);
const B: SeqId = SeqId(2);
const C: SeqId = SeqId(3);

fn sched(cfg: SchedulerConfig, n_blocks: usize, block: usize) -> Scheduler {
    Scheduler::new(cfg, KvManager::new(n_blocks, block).unwrap()).unwrap()
}

/// (seq, start, n, sample) per planned request.
fn shape(plan: &StepPlan) -> Vec<(u64, usize, usize, bool)> {
    plan.seqs
        .iter()
        .map(|s| (s.seq.0, s.start, s.len(), s.sample))
        .collect()
}

/// Runs one step, sampling token `1000 * seq + position` where due.
fn step(s: &mut Scheduler) -> StepPlan {
    let plan = s.schedule().unwrap();
    let sampled: Vec<(SeqId, u32)> = plan
        .seqs
        .iter()
        .filter(|e| e.sample)
        .map(|e| (e.seq, (1000 * e.seq.0 + e.positions().end as u64) as u32))
        .collect();
    s.on_step_done(&sampled).unwrap();
    plan
}

fn table(s: &Scheduler, seq: SeqId) -> Vec<u32> {
    s.kv().block_table(seq).unwrap().to_vec()
}

#[test]
fn chunked_prefill_then_decode_first() {
    let mut s = sched(SchedulerConfig::new(8, 2, 64), 32, 4);
    s.add_request(A, (0..10).collect()).unwrap();
    let p = step(&mut s);
    assert_eq!(shape(&p), vec![(1, 0, 8, false)]);
    assert_eq!((p.n_decodes, p.n_prefill_tokens), (0, 8));
    assert_eq!(p.seqs[0].tokens, (0..8).collect::<Vec<u32>>());
    assert_eq!(table(&s, A), vec![1, 2]);
    let p = step(&mut s);
    assert_eq!(shape(&p), vec![(1, 8, 2, true)]);
    assert_eq!(table(&s, A), vec![1, 2, 3]);
    assert_eq!(s.tokens(A).unwrap()[10], 1010);
    s.add_request(B, (20..30).collect()).unwrap();
    // One decode, so the prefill budget is max(2, 8 - 1) = 7.
    let p = step(&mut s);
    assert_eq!(shape(&p), vec![(1, 10, 1, true), (2, 0, 7, false)]);
    assert_eq!(p.seqs[0].tokens, vec![1010]);
    assert_eq!((p.n_decodes, p.n_prefill_tokens), (1, 7));
    assert_eq!(table(&s, B), vec![4, 5]);
    let p = step(&mut s);
    assert_eq!(shape(&p), vec![(1, 11, 1, true), (2, 7, 3, true)]);
    assert_eq!(table(&s, B), vec![4, 5, 6]);
    let p = step(&mut s);
    assert_eq!(shape(&p), vec![(1, 12, 1, true), (2, 10, 1, true)]);
    assert_eq!(table(&s, A), vec![1, 2, 3, 7]);
    assert_eq!(s.num_computed(A), Some(13));
    assert_eq!(s.kv().slot_mapping(A, 12, 1).unwrap(), vec![7 * 4]);
}

/// Six one-token prompts become six decodes.
fn six_decodes(cfg: SchedulerConfig) -> Scheduler {
    let mut s = sched(cfg, 64, 4);
    for i in 10..16 {
        s.add_request(SeqId(i), vec![i as u32]).unwrap();
    }
    let p = step(&mut s);
    assert_eq!(p.seqs.len(), 6);
    assert!(p.seqs.iter().all(|e| e.sample && e.len() == 1));
    s.add_request(C, (0..10).collect()).unwrap();
    s
}

#[test]
fn dynamic_budget_never_drops_below_a_ubatch() {
    let mut s = six_decodes(SchedulerConfig::new(8, 4, 64));
    // D = 6: max(4, 8 - 6) = 4 prefill tokens, 10 in the batch.
    let p = step(&mut s);
    assert_eq!((p.n_decodes, p.n_prefill_tokens, p.n_tokens()), (6, 4, 10));
    let ids: Vec<u64> = p.seqs.iter().map(|e| e.seq.0).collect();
    assert_eq!(ids, vec![10, 11, 12, 13, 14, 15, 3]);
    assert_eq!(shape(&p)[6], (3, 0, 4, false));
    let p = step(&mut s);
    assert_eq!(shape(&p)[6], (3, 4, 4, false));
    let p = step(&mut s);
    assert_eq!(shape(&p)[6], (3, 8, 2, true));
}

#[test]
fn dynamic_budget_is_t_minus_d_when_that_is_larger() {
    let mut s = six_decodes(SchedulerConfig::new(16, 4, 64));
    let p = step(&mut s);
    // 16 - 6 = 10 > 4: exactly plain chunked prefill with a 16-token batch.
    assert_eq!((p.n_decodes, p.n_prefill_tokens, p.n_tokens()), (6, 10, 16));
    assert_eq!(shape(&p)[6], (3, 0, 10, true));
}

#[test]
fn static_budget_ignores_decodes() {
    let cfg = SchedulerConfig {
        budget: PrefillBudget::Static(3),
        ..SchedulerConfig::new(8, 4, 64)
    };
    assert_eq!((cfg.prefill_budget(0), cfg.prefill_budget(7)), (3, 3));
    let mut s = six_decodes(SchedulerConfig {
        budget: PrefillBudget::Static(6),
        ..cfg
    });
    let p = step(&mut s);
    assert_eq!((p.n_decodes, p.n_prefill_tokens), (6, 6));
    assert_eq!(shape(&p)[6], (3, 0, 6, false));
}

#[test]
fn per_request_prefill_cap() {
    let auto = |t, ub, ctx| SchedulerConfig {
        cap: PrefillCap::Auto,
        ..SchedulerConfig::new(t, ub, ctx)
    };
    // ceil(0.04 * n_ctx), at most T, at least n_ubatch.
    assert_eq!(auto(128, 32, 4096).prefill_cap(), 128);
    assert_eq!(auto(512, 64, 1000).prefill_cap(), 64);
    assert_eq!(auto(512, 16, 1000).prefill_cap(), 40);
    assert_eq!(auto(512, 16, 1001).prefill_cap(), 41);
    assert_eq!(SchedulerConfig::new(8, 2, 64).prefill_cap(), usize::MAX);
    let mut s = sched(auto(16, 2, 100), 32, 4);
    s.add_request(A, (0..10).collect()).unwrap();
    s.add_request(B, (20..30).collect()).unwrap();
    assert_eq!(
        shape(&step(&mut s)),
        vec![(1, 0, 4, false), (2, 0, 4, false)]
    );
    assert_eq!(
        shape(&step(&mut s)),
        vec![(1, 4, 4, false), (2, 4, 4, false)]
    );
    assert_eq!(shape(&step(&mut s)), vec![(1, 8, 2, true), (2, 8, 2, true)]);
    assert_eq!(
        shape(&step(&mut s)),
        vec![(1, 10, 1, true), (2, 10, 1, true)]
    );
}

#[test]
fn prefix_cache_hit_skips_cached_prompt_tokens() {
    let mut s = sched(SchedulerConfig::new(32, 4, 64), 16, 4);
    s.add_request(A, (0..10).collect()).unwrap();
    assert_eq!(shape(&step(&mut s)), vec![(1, 0, 10, true)]);
    assert_eq!(table(&s, A), vec![1, 2, 3]);
    s.finish(A).unwrap();
    let mut prompt: Vec<u32> = (0..8).collect();
    prompt.extend([50, 51, 52]);
    s.add_request(B, prompt).unwrap();
    let p = step(&mut s);
    assert_eq!(shape(&p), vec![(2, 8, 3, true)]);
    assert_eq!(p.seqs[0].tokens, vec![50, 51, 52]);
    // Blocks 1 and 2 are revived from the cache; 4 is the LRU fresh block.
    assert_eq!(table(&s, B), vec![1, 2, 4]);
    let m = s.kv().metrics();
    assert_eq!((m.prefix_query_tokens, m.prefix_hit_tokens), (21, 8));
}

#[test]
fn without_prefix_caching_a_repeated_prefix_is_prefilled_again() {
    let mut cfg = SchedulerConfig::new(32, 4, 64);
    cfg.prefix_caching = false;
    let mut s = sched(cfg, 16, 4);
    s.add_request(A, (0..10).collect()).unwrap();
    assert_eq!(shape(&step(&mut s)), vec![(1, 0, 10, true)]);
    assert_eq!(table(&s, A), vec![1, 2, 3]);
    s.finish(A).unwrap();
    let mut prompt: Vec<u32> = (0..8).collect();
    prompt.extend([50, 51, 52]);
    s.add_request(B, prompt).unwrap();
    // The whole prompt is computed; fresh blocks come off the free list in
    // LRU order (A's blocks were freed tail first).
    assert_eq!(shape(&step(&mut s)), vec![(2, 0, 11, true)]);
    assert_eq!(table(&s, B), vec![4, 5, 6]);
    assert_eq!(s.kv().metrics().prefix_hit_tokens, 0);
}

#[test]
fn decode_preempts_the_newest_and_it_recomputes_later() {
    // 4 usable blocks of 4 tokens.
    let mut s = sched(SchedulerConfig::new(16, 4, 64), 5, 4);
    s.add_request(A, (0..7).collect()).unwrap();
    s.add_request(B, (10..17).collect()).unwrap();
    assert_eq!(shape(&step(&mut s)), vec![(1, 0, 7, true), (2, 0, 7, true)]);
    assert_eq!((table(&s, A), table(&s, B)), (vec![1, 2], vec![3, 4]));
    assert_eq!(shape(&step(&mut s)), vec![(1, 7, 1, true), (2, 7, 1, true)]);
    // A's decode at position 8 needs a block: B (newest) is preempted, its
    // blocks freed tail first ([4, 3]) and A takes 4. Nobody is admitted.
    let p = step(&mut s);
    assert_eq!(p.preempted, vec![B]);
    assert_eq!(shape(&p), vec![(1, 8, 1, true)]);
    assert_eq!(table(&s, A), vec![1, 2, 4]);
    assert_eq!(s.waiting_ids(), vec![B]);
    assert_eq!(s.num_computed(B), Some(0));
    assert_eq!(s.tokens(B).unwrap().len(), 9);
    // B's first block (3) is still cached, but it needs 3 blocks and only
    // block 3 is free: it keeps waiting.
    let p = step(&mut s);
    assert_eq!(shape(&p), vec![(1, 9, 1, true)]);
    assert!(p.preempted.is_empty());
    s.finish(A).unwrap();
    assert_eq!(s.kv().pool().free_block_ids(), vec![3, 4, 2, 1]);
    // B recomputes from its cached first block.
    let p = step(&mut s);
    assert_eq!(shape(&p), vec![(2, 4, 5, true)]);
    assert_eq!(
        p.seqs[0].tokens,
        vec![14, 15, 16, 2007, 2008],
        "prompt tail and the two tokens sampled before preemption"
    );
    assert_eq!(table(&s, B), vec![3, 4, 2]);
    assert_eq!(s.num_preemptions_of(B), Some(1));
    assert_eq!(s.num_preemptions(), 1);
}

#[test]
fn running_prefill_shrinks_to_fit_then_is_preempted_by_a_decode() {
    let cfg = SchedulerConfig {
        budget: PrefillBudget::Static(3),
        ..SchedulerConfig::new(16, 4, 64)
    };
    let mut s = sched(cfg, 5, 4); // 4 usable blocks of 4 tokens
    s.add_request(A, (0..5).collect()).unwrap();
    s.add_request(B, (10..20).collect()).unwrap();
    assert_eq!(shape(&step(&mut s)), vec![(1, 0, 3, false)]);
    assert_eq!(table(&s, A), vec![1]);
    // A's last two prompt tokens, then B gets what is left of the budget.
    assert_eq!(
        shape(&step(&mut s)),
        vec![(1, 3, 2, true), (2, 0, 1, false)]
    );
    assert_eq!((table(&s, A), table(&s, B)), (vec![1, 2], vec![3]));
    assert_eq!(
        shape(&step(&mut s)),
        vec![(1, 5, 1, true), (2, 1, 3, false)]
    );
    assert_eq!(
        shape(&step(&mut s)),
        vec![(1, 6, 1, true), (2, 4, 3, false)]
    );
    assert_eq!(table(&s, B), vec![3, 4]);
    // B wants 3 more tokens (a third block) but no block is free and no
    // newer request exists: its chunk shrinks to the 1 cell left in block 4.
    let p = step(&mut s);
    assert_eq!(shape(&p), vec![(1, 7, 1, true), (2, 7, 1, false)]);
    assert!(p.preempted.is_empty());
    assert_eq!(table(&s, B), vec![3, 4]);
    // A's decode at position 8 needs a block: B (newest) is preempted.
    let p = step(&mut s);
    assert_eq!(p.preempted, vec![B]);
    assert_eq!(shape(&p), vec![(1, 8, 1, true)]);
    assert_eq!(table(&s, A), vec![1, 2, 4]);
    assert_eq!(s.running_ids(), vec![A]);
    assert_eq!(s.waiting_ids(), vec![B]);
}

#[test]
fn context_limit_reports_must_finish() {
    let mut s = sched(SchedulerConfig::new(8, 2, 4), 16, 4);
    s.add_request(A, vec![1, 2, 3]).unwrap();
    assert_eq!(shape(&step(&mut s)), vec![(1, 0, 3, true)]);
    assert_eq!(shape(&step(&mut s)), vec![(1, 3, 1, true)]);
    // 5 tokens: position 4 would be outside n_ctx = 4.
    let p = step(&mut s);
    assert!(p.is_empty());
    assert_eq!(p.must_finish, vec![A]);
    s.finish(A).unwrap();
    assert!(!s.has_unfinished());
    assert_eq!(s.kv().num_used_blocks(), 0);
}

#[test]
fn bad_requests_and_misuse_are_errors() {
    let mut s = sched(SchedulerConfig::new(8, 2, 16), 3, 4); // 8-token pool
    assert!(s.add_request(A, vec![]).is_err());
    assert!(s.add_request(A, vec![0; 17]).is_err(), "exceeds n_ctx");
    assert!(s.add_request(A, vec![0; 9]).is_err(), "exceeds the pool");
    s.add_request(A, vec![1, 2]).unwrap();
    assert!(s.add_request(A, vec![1]).is_err(), "duplicate");
    s.add_request(B, vec![3]).unwrap();
    assert!(s.on_step_done(&[(A, 5)]).is_err(), "nothing in flight");
    let p = s.schedule().unwrap();
    assert_eq!(shape(&p), vec![(1, 0, 2, true), (2, 0, 1, true)]);
    assert!(s.schedule().is_err(), "previous step in flight");
    assert!(s.on_step_done(&[(A, 5)]).is_err(), "B's token missing");
    assert!(s.on_step_done(&[(A, 5), (A, 6), (B, 7)]).is_err());
    assert!(s.on_step_done(&[(A, 5), (B, 7), (C, 1)]).is_err());
    assert_eq!(s.num_computed(A), Some(0), "failed calls change nothing");
    // A finished mid-step (e.g. client gone): its entry is skipped.
    s.finish(A).unwrap();
    s.on_step_done(&[(B, 7)]).unwrap();
    assert_eq!(s.tokens(B).unwrap(), &[3, 7]);
    assert!(s.finish(A).is_err());
    assert!(Scheduler::new(SchedulerConfig::new(0, 1, 1), KvManager::new(4, 4).unwrap()).is_err());
}

#[test]
fn older_prefill_preempts_a_newer_planned_decode() {
    let cfg = SchedulerConfig {
        cap: PrefillCap::Tokens(4),
        ..SchedulerConfig::new(16, 4, 64)
    };
    let mut s = sched(cfg, 5, 4); // 4 usable blocks of 4 tokens
    s.add_request(A, (0..12).collect()).unwrap();
    s.add_request(B, vec![50, 51, 52]).unwrap();
    assert_eq!(
        shape(&step(&mut s)),
        vec![(1, 0, 4, false), (2, 0, 3, true)]
    );
    assert_eq!((table(&s, A), table(&s, B)), (vec![1], vec![2]));
    assert_eq!(
        shape(&step(&mut s)),
        vec![(2, 3, 1, true), (1, 4, 4, false)]
    );
    assert_eq!(table(&s, A), vec![1, 3]);
    // B's decode takes the last block (4), then A's chunk needs a third
    // block: B, newer than A, is preempted and its planned decode withdrawn.
    let p = step(&mut s);
    assert_eq!(p.preempted, vec![B]);
    assert_eq!(shape(&p), vec![(1, 8, 4, true)]);
    assert_eq!((p.n_decodes, p.n_prefill_tokens), (0, 4));
    assert_eq!(table(&s, A), vec![1, 3, 4]);
    assert_eq!(s.waiting_ids(), vec![B]);
    assert_eq!(s.tokens(B).unwrap(), &[50, 51, 52, 2003, 2004]);
    assert_eq!(s.kv().pool().free_block_ids(), vec![2]);
}

#[test]
fn a_sliding_window_returns_blocks_as_the_sequence_moves_on() {
    let mut cfg = SchedulerConfig::new(8, 2, 64);
    cfg.sliding_window = Some(6);
    // 6 blocks of 4 (5 usable): without the window, 10 prompt tokens and
    // 10 more decoded would need 5 blocks for A alone.
    let mut s = sched(cfg, 6, 4);
    s.add_request(A, (0..10).collect()).unwrap();
    step(&mut s); // prefill 0..8: the next query at 8 needs keys 3..
    assert_eq!(table(&s, A), vec![1, 2]);
    step(&mut s); // 8..10, sampled 10: the next query at 10 needs 5..
    assert_eq!(table(&s, A), vec![0, 2, 3]);
    assert_eq!(s.kv().pool().free_block_ids(), vec![4, 5, 1]);
    for _ in 0..3 {
        step(&mut s); // decode 10, 11, 12: the next query at 13 needs 8..
    }
    assert_eq!(table(&s, A), vec![0, 0, 3, 4]);
    // A second request fits in the blocks A released.
    s.add_request(B, (20..28).collect()).unwrap();
    let p = step(&mut s);
    assert_eq!(shape(&p), vec![(1, 13, 1, true), (2, 0, 7, false)]);
    assert_eq!(table(&s, B), vec![5, 1]);
    s.kv().check_invariants().unwrap();
}
