//! Random alloc / append / fork / free sequences against a simulated device
//! memory: every live sequence must read back its own tokens through its
//! block table (so prefix hits and copy on write are correct), ref counts must
//! match the tables, failed allocations must change nothing, a sliding
//! window's released blocks must leave the rest readable, and freeing
//! everything must return every block.

use std::collections::BTreeMap;

use proptest::prelude::*;
use quire::kv::{KvError, KvManager, SeqId};

#[derive(Debug, Clone)]
enum Op {
    /// Start sequence `seq` with a prompt over a tiny alphabet (so prefixes
    /// repeat and hit the cache).
    Start(u64, Vec<u32>),
    Append(u64, u32),
    Fork(u64, u64),
    Free(u64),
    /// Release the blocks before a window of this many positions.
    Window(u64, usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..6u64, prop::collection::vec(0..2u32, 1..20)).prop_map(|(s, p)| Op::Start(s, p)),
        (0..6u64, 0..3u32).prop_map(|(s, t)| Op::Append(s, t)),
        (0..6u64, 0..6u64).prop_map(|(a, b)| Op::Fork(a, b)),
        (0..6u64).prop_map(Op::Free),
        (0..6u64, 1..10usize).prop_map(|(s, w)| Op::Window(s, w)),
    ]
}

/// Simulated KV memory: the token whose K/V a cell holds.
struct Device {
    cells: Vec<Option<u32>>,
}

impl Device {
    fn write(&mut self, kv: &KvManager, seq: SeqId, start: usize, toks: &[u32]) {
        let slots = kv.slot_mapping(seq, start, toks.len()).unwrap();
        for (s, &t) in slots.iter().zip(toks) {
            self.cells[*s as usize] = Some(t);
        }
    }
    fn copy_block(&mut self, src: u32, dst: u32, b: usize) {
        for i in 0..b {
            self.cells[dst as usize * b + i] = self.cells[src as usize * b + i];
        }
    }
    fn read(&self, kv: &KvManager, seq: SeqId, n: usize) -> Vec<Option<u32>> {
        kv.slot_mapping(seq, 0, n)
            .unwrap()
            .iter()
            .map(|&s| self.cells[s as usize])
            .collect()
    }
}

type Snapshot = (Vec<u32>, quire::kv::KvMetrics, Vec<Option<Vec<u32>>>);

fn snapshot(kv: &KvManager) -> Snapshot {
    let tables = (0..6).map(|s| kv.block_table(SeqId(s)).map(|t| t.to_vec()));
    (kv.pool().free_block_ids(), kv.metrics(), tables.collect())
}

fn run(ops: Vec<Op>, n_blocks: usize, b: usize) -> Result<(), TestCaseError> {
    let mut kv = KvManager::new(n_blocks, b).unwrap();
    let mut dev = Device {
        cells: vec![None; n_blocks * b],
    };
    // Model: tokens per live sequence; all of them are computed.
    let mut seqs: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    // Per sequence: positions before this were released by a window.
    let mut gone: BTreeMap<u64, usize> = BTreeMap::new();
    for op in ops {
        let before = snapshot(&kv);
        match op {
            Op::Start(s, prompt) if !seqs.contains_key(&s) => {
                match kv.allocate_with_prefix(SeqId(s), &prompt) {
                    Ok(n_cached) => {
                        prop_assert!(n_cached < prompt.len() && n_cached % b == 0);
                        // Cached cells already hold exactly this prefix.
                        let got = dev.read(&kv, SeqId(s), n_cached);
                        let want: Vec<_> = prompt[..n_cached].iter().map(|&t| Some(t)).collect();
                        prop_assert_eq!(got, want);
                        dev.write(&kv, SeqId(s), n_cached, &prompt[n_cached..]);
                        kv.commit_full_blocks(SeqId(s), &prompt, prompt.len())
                            .unwrap();
                        seqs.insert(s, prompt);
                    }
                    Err(KvError::OutOfBlocks { .. }) => prop_assert_eq!(snapshot(&kv), before),
                    Err(e) => return Err(TestCaseError::fail(e.to_string())),
                }
            }
            Op::Append(s, t) if seqs.contains_key(&s) => {
                let toks = seqs.get_mut(&s).unwrap();
                match kv.allocate(SeqId(s), toks.len() + 1) {
                    Ok(copies) => {
                        for c in copies {
                            dev.copy_block(c.src, c.dst, b);
                        }
                        dev.write(&kv, SeqId(s), toks.len(), &[t]);
                        toks.push(t);
                        kv.commit_full_blocks(SeqId(s), toks, toks.len()).unwrap();
                    }
                    Err(KvError::OutOfBlocks { .. }) => prop_assert_eq!(snapshot(&kv), before),
                    Err(e) => return Err(TestCaseError::fail(e.to_string())),
                }
            }
            Op::Fork(a, c) if seqs.contains_key(&a) && !seqs.contains_key(&c) => {
                kv.fork(SeqId(a), SeqId(c)).unwrap();
                let toks = seqs[&a].clone();
                seqs.insert(c, toks);
                let g = gone.get(&a).copied().unwrap_or(0);
                gone.insert(c, g);
            }
            Op::Free(s) if seqs.contains_key(&s) => {
                kv.free(SeqId(s)).unwrap();
                seqs.remove(&s);
                gone.remove(&s);
            }
            Op::Window(s, w) if seqs.contains_key(&s) => {
                let len = seqs[&s].len();
                let first = (len + 1).saturating_sub(w);
                kv.release_before(SeqId(s), first).unwrap();
                let g = gone.entry(s).or_insert(0);
                *g = (*g).max(first.min(len) / b * b);
                // Those entries are the null block now.
                let t = kv.block_table(SeqId(s)).unwrap();
                prop_assert!(t[..*g / b].iter().all(|&x| x == 0));
            }
            _ => {}
        }
        kv.check_invariants().map_err(TestCaseError::fail)?;
        for (&s, toks) in &seqs {
            let g = gone.get(&s).copied().unwrap_or(0);
            let want: Vec<_> = toks[g..].iter().map(|&t| Some(t)).collect();
            prop_assert_eq!(
                dev.read(&kv, SeqId(s), toks.len())[g..].to_vec(),
                want,
                "seq {}",
                s
            );
        }
    }
    for &s in seqs.keys() {
        kv.free(SeqId(s)).unwrap();
    }
    prop_assert_eq!(kv.num_used_blocks(), 0);
    prop_assert_eq!(kv.num_free_blocks(), n_blocks - 1);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_ops_keep_contents_and_leak_nothing(
        ops in prop::collection::vec(op(), 1..80),
        n_blocks in 2usize..24,
        b in 1usize..5,
    ) {
        run(ops, n_blocks, b)?;
    }
}
