//! Prefix caching of hybrid models through recurrent-state snapshots, with
//! exact ids: chunks end on snapshot boundaries, a boundary's state is kept
//! once its blocks are committed, a later prompt with the same prefix
//! resumes from the longest boundary that has a snapshot (not from every
//! cached block), the least recently used snapshot is reused first, and a
//! hybrid without snapshots never resumes from cached blocks.

use quire::kv::{KvManager, SeqId};
use quire::scheduler::{Scheduler, SchedulerConfig, StateSave, StateSnapshots};

fn sched(capacity: usize) -> Scheduler {
    let mut cfg = SchedulerConfig::new(256, 32, 4096);
    cfg.state_snapshots = Some(StateSnapshots {
        capacity,
        stride: 32,
    });
    Scheduler::new(cfg, KvManager::new(64, 16).unwrap()).unwrap()
}

fn prompt(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (seed * 1000 + i) % 500).collect()
}

/// One step of a sequence: (start, len, snapshot restored).
type Chunk = (usize, usize, Option<u32>);

/// Runs steps until `seq` has sampled one token; returns every step's
/// chunk of `seq` and the saves registered.
fn run_prompt(s: &mut Scheduler, seq: SeqId) -> (Vec<Chunk>, Vec<StateSave>) {
    let (mut steps, mut saves) = (Vec::new(), Vec::new());
    loop {
        let plan = s.schedule().unwrap();
        let mine = plan.seqs.iter().find(|x| x.seq == seq).cloned();
        let sampled: Vec<(SeqId, u32)> = plan
            .seqs
            .iter()
            .filter(|x| x.sample)
            .map(|x| (x.seq, 7))
            .collect();
        s.on_step_done(&sampled).unwrap();
        saves.extend(s.take_saves());
        if let Some(m) = mine {
            steps.push((m.start, m.len(), m.restore));
            if m.sample {
                return (steps, saves);
            }
        }
    }
}

#[test]
fn chunks_end_on_boundaries_and_boundaries_are_saved() {
    let mut s = sched(4);
    let (a, b) = (SeqId(1), SeqId(2));
    s.add_request(a, prompt(1, 70)).unwrap();
    let (steps, saves) = run_prompt(&mut s, a);
    assert_eq!(steps, vec![(0, 32, None), (32, 32, None), (64, 6, None)]);
    assert_eq!(
        saves,
        vec![StateSave { seq: a, slot: 0 }, StateSave { seq: a, slot: 1 }]
    );
    // Same 64-token prefix, another tail: resumes at 64 from snapshot 1
    // (the blocks up to 64 are cached; 64 is the longest boundary).
    let mut p = prompt(1, 64);
    p.extend(prompt(9, 20));
    s.add_request(b, p).unwrap();
    let (steps, saves) = run_prompt(&mut s, b);
    assert_eq!(steps, vec![(64, 20, Some(1))]);
    assert_eq!(saves, vec![]);
}

#[test]
fn resume_point_is_the_longest_boundary_with_a_snapshot() {
    // Capacity 1: the second boundary's snapshot evicts the first's.
    let mut s = sched(1);
    s.add_request(SeqId(1), prompt(1, 70)).unwrap();
    let (_, saves) = run_prompt(&mut s, SeqId(1));
    assert_eq!(
        saves,
        vec![
            StateSave {
                seq: SeqId(1),
                slot: 0
            },
            StateSave {
                seq: SeqId(1),
                slot: 0
            }
        ]
    );
    // A prompt sharing only the first 40 tokens: its blocks up to 32 are
    // cached but the snapshot at 32 is gone, so it computes from 0 (and
    // takes the 32-token snapshot again, evicting the 64-token one).
    let mut p = prompt(1, 40);
    p.extend(prompt(5, 10));
    s.add_request(SeqId(2), p).unwrap();
    let (steps, saves) = run_prompt(&mut s, SeqId(2));
    assert_eq!(steps, vec![(0, 32, None), (32, 18, None)]);
    assert_eq!(
        saves,
        vec![StateSave {
            seq: SeqId(2),
            slot: 0
        }]
    );
    // Now the 32-token prefix resumes; the 64-token one does not.
    let mut p = prompt(1, 64);
    p.extend(prompt(6, 3));
    s.add_request(SeqId(3), p).unwrap();
    let (steps, _) = run_prompt(&mut s, SeqId(3));
    assert_eq!(steps, vec![(32, 32, Some(0)), (64, 3, None)]);
}

#[test]
fn a_hybrid_without_snapshots_never_resumes_from_blocks() {
    let mut s = sched(0);
    s.add_request(SeqId(1), prompt(1, 70)).unwrap();
    let (steps, saves) = run_prompt(&mut s, SeqId(1));
    // No snapshots: chunks are not cut at boundaries either.
    assert_eq!(steps, vec![(0, 70, None)]);
    assert!(saves.is_empty());
    s.add_request(SeqId(2), prompt(1, 70)).unwrap();
    let (steps, _) = run_prompt(&mut s, SeqId(2));
    assert_eq!(steps, vec![(0, 70, None)]);
}

#[test]
fn stride_must_be_a_multiple_of_the_block_size() {
    let mut cfg = SchedulerConfig::new(256, 32, 4096);
    cfg.state_snapshots = Some(StateSnapshots {
        capacity: 2,
        stride: 24,
    });
    let err = Scheduler::new(cfg, KvManager::new(64, 16).unwrap()).unwrap_err();
    assert!(
        format!("{err:#}").contains("multiple of the KV block size"),
        "{err:#}"
    );
}

#[test]
fn untaken_saves_are_forgotten() {
    let mut s = sched(4);
    s.add_request(SeqId(1), prompt(1, 70)).unwrap();
    // The first step ends on the boundary at 32; its save is not taken.
    let plan = s.schedule().unwrap();
    assert_eq!(plan.seqs[0].len(), 32);
    s.on_step_done(&[]).unwrap();
    // The next step's completion forgets it (and registers 64's).
    s.schedule().unwrap();
    s.on_step_done(&[]).unwrap();
    assert_eq!(
        s.take_saves(),
        vec![StateSave {
            seq: SeqId(1),
            slot: 0
        }],
        "slot 0 was freed and reused for the boundary at 64"
    );
    let plan = s.schedule().unwrap();
    s.on_step_done(&[(SeqId(1), 7)]).unwrap();
    assert!(plan.seqs[0].sample);
    // A prompt sharing only the first 40 tokens finds no snapshot at 32.
    let mut p = prompt(1, 40);
    p.extend(prompt(5, 10));
    s.add_request(SeqId(2), p).unwrap();
    let plan = s.schedule().unwrap();
    let b = plan.seqs.iter().find(|x| x.seq == SeqId(2)).unwrap();
    assert_eq!((b.start, b.restore), (0, None));
}
