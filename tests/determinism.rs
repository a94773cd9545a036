//! Determinism of the CPU backend on the default model: logits bitwise
//! equal across thread counts, alone vs in a batch, and for prefill at
//! once vs chunked vs token by token (KV-cache invariance).

mod common;

use common::bits;
use quire::kv::SeqId;
use quire::runner::{LogitsWanted, Runner, RunnerOptions, SeqWork};
use rand::{Rng, SeedableRng};

fn runner(threads: usize) -> Runner {
    let path = quire::fetch::default_model_path().expect("default model");
    Runner::load(
        &path,
        &RunnerOptions {
            threads: Some(threads),
            ..Default::default()
        },
    )
    .expect("loading the default model")
}

fn prompt(n: usize, seed: u64) -> Vec<u32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(0..49152u32)).collect()
}

/// Logits at every position, computing the prompt in chunks of `chunk`.
fn chunked(r: &mut Runner, seq: SeqId, toks: &[u32], chunk: usize) -> Vec<f32> {
    let mut out = Vec::new();
    let mut pos = 0;
    for c in toks.chunks(chunk) {
        let l = r
            .step(&[SeqWork {
                seq,
                tokens: c,
                start_pos: pos,
                logits: LogitsWanted::All,
            }])
            .unwrap();
        out.extend_from_slice(&l[0]);
        pos += c.len();
    }
    r.free(seq);
    out
}

#[test]
fn bitwise_equal_across_thread_counts() {
    let toks = prompt(45, 11);
    let reference = chunked(&mut runner(1), SeqId(0), &toks, 64);
    assert!(reference.iter().all(|x| x.is_finite()));
    for t in [2, 4] {
        let got = chunked(&mut runner(t), SeqId(0), &toks, 64);
        assert!(
            bits(&got) == bits(&reference),
            "{t} threads differ from 1 thread"
        );
    }
}

#[test]
fn bitwise_equal_prefill_chunked_and_token_by_token() {
    let mut r = runner(2);
    let toks = prompt(70, 12);
    let once = chunked(&mut r, SeqId(1), &toks, 70);
    for chunk in [7, 16, 1] {
        let got = chunked(&mut r, SeqId(2), &toks, chunk);
        assert!(
            bits(&got) == bits(&once),
            "chunks of {chunk} differ from one prefill"
        );
    }
}

#[test]
fn bitwise_equal_alone_and_in_a_batch() {
    let mut r = runner(2);
    let target = prompt(30, 13);
    // Alone: prefill 24 tokens, then 6 decode steps.
    let mut alone = Vec::new();
    alone.extend(
        r.step(&[SeqWork {
            seq: SeqId(10),
            tokens: &target[..24],
            start_pos: 0,
            logits: LogitsWanted::All,
        }])
        .unwrap()
        .remove(0),
    );
    for p in 24..30 {
        alone.extend(
            r.step(&[SeqWork {
                seq: SeqId(10),
                tokens: &target[p..p + 1],
                start_pos: p,
                logits: LogitsWanted::All,
            }])
            .unwrap()
            .remove(0),
        );
    }
    r.free(SeqId(10));

    // In a batch with 3 other sequences of other lengths, mixing their
    // prefill chunks and decode rows with the target's rows.
    let others: Vec<Vec<u32>> = (0..3).map(|i| prompt(19 + 9 * i, 100 + i as u64)).collect();
    let mut other_pos = [0usize; 3];
    let mut batched = Vec::new();
    let mut step_rows = vec![(0usize, 24usize)];
    step_rows.extend((24..30).map(|p| (p, p + 1)));
    for (si, (a, b)) in step_rows.into_iter().enumerate() {
        let mut work = vec![];
        // Others go first in the batch so the target's rows are not row 0.
        for (i, o) in others.iter().enumerate() {
            let take = if si == 0 { 5 + i } else { 1 };
            let start = other_pos[i];
            let end = (start + take).min(o.len());
            if start < end {
                work.push(SeqWork {
                    seq: SeqId(20 + i as u64),
                    tokens: &o[start..end],
                    start_pos: start,
                    logits: LogitsWanted::Last,
                });
                other_pos[i] = end;
            }
        }
        work.push(SeqWork {
            seq: SeqId(10),
            tokens: &target[a..b],
            start_pos: a,
            logits: LogitsWanted::All,
        });
        let mut out = r.step(&work).unwrap();
        batched.extend(out.pop().unwrap());
    }
    assert_eq!(batched.len(), alone.len());
    assert!(
        bits(&batched) == bits(&alone),
        "batched logits differ from alone"
    );
}

/// The output head reads the residual stream directly when every row
/// wants logits (`StepBufs::rows_all`) and selected rows otherwise: the
/// last row's logits are the same bits either way.
#[test]
fn bitwise_equal_last_row_selected_or_all_rows() {
    let mut r = runner(2);
    let toks = prompt(21, 14);
    let step = |r: &mut Runner, seq: SeqId, logits: LogitsWanted| {
        let l = r
            .step(&[SeqWork {
                seq,
                tokens: &toks,
                start_pos: 0,
                logits,
            }])
            .unwrap()
            .remove(0);
        r.free(seq);
        l
    };
    let all = step(&mut r, SeqId(20), LogitsWanted::All);
    let last = step(&mut r, SeqId(21), LogitsWanted::Last);
    assert_eq!(all.len(), toks.len() * last.len());
    assert!(last.iter().all(|x| x.is_finite()));
    assert!(
        bits(&all[all.len() - last.len()..]) == bits(&last),
        "the last row's logits differ between a selected row and all rows"
    );
}
