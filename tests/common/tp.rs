//! The tensor-parallel tests' models and scenario (tests/tp.rs on the
//! cpu's ranks, tests/cuda_tp.rs on the device's).

use quire::kv::SeqId;
use quire::model::synth;
use quire::quant::GgmlType;
use quire::runner::{LogitsWanted, Runner, RunnerOptions, SeqWork};
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};

pub fn synth_model(dir: &Path, shape: &str, ty: GgmlType) -> PathBuf {
    let p = dir.join(format!("{shape}-{ty:?}.gguf"));
    if !p.exists() {
        synth::write_model(&p, synth::find_shape(shape).unwrap(), ty, 29).unwrap();
    }
    p
}

/// `tp`: None, the model whole; Some(n), n ranks.
pub fn load(path: &Path, mode: &str, tp: Option<usize>) -> Runner {
    load_on(path, mode, tp, "off")
}

/// [`load`] with `--gpu gpu`.
pub fn load_on(path: &Path, mode: &str, tp: Option<usize>, gpu: &str) -> Runner {
    Runner::load(
        path,
        &RunnerOptions {
            threads: Some(2),
            mode: mode.parse().unwrap(),
            tensor_parallel: tp,
            gpu: gpu.parse().unwrap(),
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| {
        panic!(
            "loading {} ({mode}, {tp:?} ranks, gpu {gpu}): {e:#}",
            path.display()
        )
    })
}

pub fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(0..vocab as u32)).collect()
}

/// Every logit of a serving-like run: sequence A's prompt in two chunks
/// (the second beside B's whole prompt), then `decode` steps of both
/// together (or A alone when `with_b` is false), feeding back tokens taken
/// from a fixed stream (not the argmax, so the run never depends on ties).
/// The decode steps want the last logits only: on a device they are
/// decode steps (CUDA graphs). Returns (A's logits, B's logits).
pub fn run(r: &mut Runner, with_b: bool, decode: usize) -> (Vec<f32>, Vec<f32>) {
    let vocab = r.config().vocab_size;
    let a = tokens(37, vocab, 1);
    let b = tokens(23, vocab, 2);
    let next = tokens(2 * decode, vocab, 3);
    let (mut la, mut lb) = (Vec::new(), Vec::new());
    fn w(seq: u64, tokens: &[u32], start_pos: usize) -> SeqWork<'_> {
        SeqWork {
            seq: SeqId(seq),
            tokens,
            start_pos,
            logits: match tokens.len() {
                1 => LogitsWanted::Last,
                _ => LogitsWanted::All,
            },
        }
    }
    la.extend(r.step(&[w(0, &a[..17], 0)]).unwrap().remove(0));
    let mut work = vec![w(0, &a[17..], 17)];
    if with_b {
        work.push(w(1, &b[..], 0));
    }
    let out = r.step(&work).unwrap();
    la.extend(&out[0]);
    if with_b {
        lb.extend(&out[1]);
    }
    for i in 0..decode {
        let mut work = vec![w(0, &next[2 * i..2 * i + 1], 37 + i)];
        if with_b {
            work.push(w(1, &next[2 * i + 1..2 * i + 2], 23 + i));
        }
        let out = r.step(&work).unwrap();
        la.extend(&out[0]);
        if with_b {
            lb.extend(&out[1]);
        }
    }
    (la, lb)
}

pub fn all(r: &mut Runner) -> Vec<f32> {
    let (a, b) = run(r, true, 6);
    [a, b].concat()
}
