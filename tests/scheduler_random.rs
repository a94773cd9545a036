//! Seeded random workloads through the scheduler against a simulated KV
//! memory. Checks per step: decodes first, each request at most once, chunks
//! start at the computed counter, budget respected, KV cells read back the
//! request's tokens (prefix hits, copy-on-write and recompute are correct),
//! ref counts consistent. At the end: every request produced exactly the
//! tokens a scheduling-independent sampler dictates, no block leaked, and the
//! same seed gives the same plans.

use std::collections::{BTreeMap, HashSet};

use quire::kv::{KvManager, SeqId};
use quire::scheduler::{PrefillBudget, PrefillCap, Scheduler, SchedulerConfig, StepPlan};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The "model": the next token depends only on (request, position).
fn next_token(seq: SeqId, pos: usize) -> u32 {
    ((seq.0 as u32).wrapping_mul(7919) ^ (pos as u32).wrapping_mul(104_729)) % 50_000
}

struct Req {
    seq: SeqId,
    arrival: usize,
    prompt: Vec<u32>,
    n_gen: usize,
}

fn workload(rng: &mut ChaCha8Rng) -> (SchedulerConfig, usize, usize, Vec<Req>) {
    let block = [1, 2, 4][rng.random_range(0..3)];
    let n_blocks = rng.random_range(3..40);
    let mut cfg = SchedulerConfig::new(rng.random_range(1..33), rng.random_range(1..9), 64);
    cfg.max_running = rng.random_range(1..10);
    cfg.budget = match rng.random_range(0..2) {
        0 => PrefillBudget::Dynamic,
        _ => PrefillBudget::Static(rng.random_range(1..17)),
    };
    cfg.cap = match rng.random_range(0..3) {
        0 => PrefillCap::Off,
        1 => PrefillCap::Auto,
        _ => PrefillCap::Tokens(rng.random_range(1..9)),
    };
    // Shared prefixes so the prefix cache gets hits.
    let bases: Vec<Vec<u32>> = (0..3)
        .map(|_| {
            (0..rng.random_range(0..20))
                .map(|_| rng.random_range(0..5))
                .collect()
        })
        .collect();
    let reqs = (0..rng.random_range(1..12))
        .map(|i| {
            let mut prompt = bases[rng.random_range(0..3)].clone();
            prompt.extend((0..rng.random_range(1..12)).map(|_| rng.random_range(0..5)));
            Req {
                seq: SeqId(i),
                arrival: rng.random_range(0..10),
                prompt,
                n_gen: rng.random_range(1..10),
            }
        })
        .collect();
    (cfg, n_blocks, block, reqs)
}

/// Runs one seeded workload; returns the plans.
fn run(seed: u64) -> Vec<StepPlan> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (cfg, n_blocks, block, reqs) = workload(&mut rng);
    let kv = KvManager::new(n_blocks, block).unwrap();
    let pool_tokens = (n_blocks - 1) * block;
    let mut s = Scheduler::new(cfg, kv).unwrap();
    let mut cells: Vec<Option<u32>> = vec![None; n_blocks * block];
    let mut live: BTreeMap<SeqId, usize> = BTreeMap::new(); // seq -> n_gen target
    let mut done: BTreeMap<SeqId, Vec<u32>> = BTreeMap::new();
    let mut plans = Vec::new();
    let mut accepted = 0;
    for step in 0..5000 {
        for r in reqs.iter().filter(|r| r.arrival == step) {
            let ok = s.add_request(r.seq, r.prompt.clone()).is_ok();
            assert_eq!(ok, r.prompt.len() <= pool_tokens, "seed {seed}");
            if ok {
                live.insert(r.seq, r.n_gen);
                accepted += 1;
            }
        }
        let before: BTreeMap<SeqId, usize> = live
            .keys()
            .map(|&q| (q, s.num_computed(q).unwrap()))
            .collect();
        let running_before = s.running_ids();
        let plan = s.schedule().unwrap();
        let mut seen = HashSet::new();
        for (i, e) in plan.seqs.iter().enumerate() {
            assert!(seen.insert(e.seq), "seed {seed}: {} twice", e.seq);
            assert!(!e.is_empty());
            if i < plan.n_decodes {
                assert_eq!(e.len(), 1, "seed {seed}: decodes come first");
            }
            let toks = s.tokens(e.seq).unwrap();
            // Running requests continue where they were; admitted ones
            // start at their prefix-cache hit.
            if running_before.contains(&e.seq) {
                assert_eq!(e.start, before[&e.seq], "seed {seed}");
            }
            assert_eq!(e.tokens, toks[e.positions()]);
            assert_eq!(e.sample, e.positions().end == toks.len());
            for c in &e.copies {
                for k in 0..block {
                    cells[c.dst as usize * block + k] = cells[c.src as usize * block + k];
                }
            }
            let slots = s.kv().slot_mapping(e.seq, e.start, e.len()).unwrap();
            for (&sl, &t) in slots.iter().zip(&e.tokens) {
                cells[sl as usize] = Some(t);
            }
            let all = s.kv().slot_mapping(e.seq, 0, e.positions().end).unwrap();
            let got: Vec<Option<u32>> = all.iter().map(|&sl| cells[sl as usize]).collect();
            let want: Vec<Option<u32>> =
                toks[..e.positions().end].iter().map(|&t| Some(t)).collect();
            assert_eq!(got, want, "seed {seed} step {step}: KV of {}", e.seq);
        }
        let prefill: usize = plan.seqs[plan.n_decodes..].iter().map(|e| e.len()).sum();
        assert_eq!(prefill, plan.n_prefill_tokens);
        assert!(prefill <= cfg.prefill_budget(plan.n_decodes), "seed {seed}");
        assert!(plan.seqs[plan.n_decodes..]
            .iter()
            .all(|e| e.len() <= cfg.prefill_cap()));
        assert!(s.num_running() <= cfg.max_running);
        s.kv().check_invariants().unwrap();
        for q in s.waiting_ids() {
            assert!(!s.kv().contains(q), "seed {seed}: waiting {q} holds blocks");
        }
        let sampled: Vec<(SeqId, u32)> = plan
            .seqs
            .iter()
            .filter(|e| e.sample)
            .map(|e| (e.seq, next_token(e.seq, e.positions().end)))
            .collect();
        s.on_step_done(&sampled).unwrap();
        let mut to_finish: Vec<SeqId> = plan.must_finish.clone();
        for (&q, &n_gen) in &live {
            let r = reqs.iter().find(|r| r.seq == q).unwrap();
            if s.tokens(q).unwrap().len() >= r.prompt.len() + n_gen {
                to_finish.push(q);
            }
        }
        for q in to_finish {
            done.insert(q, s.tokens(q).unwrap().to_vec());
            s.finish(q).unwrap();
            live.remove(&q);
        }
        plans.push(plan);
        if done.len() == accepted && step >= 10 {
            break;
        }
    }
    assert_eq!(done.len(), accepted, "seed {seed}: stalled");
    assert_eq!(s.kv().num_used_blocks(), 0, "seed {seed}: leaked blocks");
    assert!(!s.has_unfinished());
    for (q, toks) in done {
        let r = reqs.iter().find(|r| r.seq == q).unwrap();
        let mut want = r.prompt.clone();
        while want.len() < toks.len() {
            want.push(next_token(q, want.len()));
        }
        assert_eq!(toks, want, "seed {seed}: tokens of {q}");
        // Only a request that outgrew the pool may stop short.
        if toks.len() < r.prompt.len() + r.n_gen {
            assert!(toks.len() >= pool_tokens, "seed {seed}: {q} cut short");
        }
    }
    plans
}

#[test]
fn random_workloads_are_correct_and_deterministic() {
    let mut preempting = 0;
    for seed in 0..300 {
        let plans = run(seed);
        if plans.iter().any(|p| !p.preempted.is_empty()) {
            preempting += 1;
        }
        if seed % 10 == 0 {
            assert_eq!(plans, run(seed), "seed {seed}: plans differ run to run");
        }
    }
    // The workloads must exercise preemption, or the test proves little.
    assert!(preempting > 10, "only {preempting} workloads preempted");
}
