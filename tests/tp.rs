//! Tensor parallelism on the cpu backend's simulated ranks (`tp`): in
//! `exact` the logits of 2 and 4 ranks are bitwise those of one, over
//! prefill chunks and batched decode, for every llama-family variant
//! (biases, q/k norms, GQA, attention sinks and ALiBi cut per head);
//! `deterministic` is run-to-run and batch-invariant and close to one
//! rank; `fast` is close. Shapes that do not split, hybrids and the cuda
//! backend are clear errors.

mod common;

use common::{bits, nmse};
use quire::gguf::{GgufFile, GgufValue};
use quire::kv::SeqId;
use quire::model::synth;
use quire::quant::GgmlType;
use quire::runner::{LogitsWanted, Runner, RunnerOptions, SeqWork};
use quire::tp::shard::{cut, Cut};
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};

fn synth_model(dir: &Path, shape: &str, ty: GgmlType) -> PathBuf {
    let p = dir.join(format!("{shape}-{ty:?}.gguf"));
    if !p.exists() {
        synth::write_model(&p, synth::find_shape(shape).unwrap(), ty, 29).unwrap();
    }
    p
}

fn load(path: &Path, mode: &str, tp: usize) -> Runner {
    Runner::load(
        path,
        &RunnerOptions {
            threads: Some(2),
            mode: mode.parse().unwrap(),
            tensor_parallel: tp,
            ..Default::default()
        },
    )
    .unwrap()
}

fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(0..vocab as u32)).collect()
}

/// Every logit of a serving-like run: sequence A's prompt in two chunks
/// (the second beside B's whole prompt), then `decode` steps of both
/// together (or A alone when `with_b` is false), feeding back tokens taken
/// from a fixed stream (not the argmax, so the run never depends on ties).
/// Returns (A's logits, B's logits).
fn run(r: &mut Runner, with_b: bool, decode: usize) -> (Vec<f32>, Vec<f32>) {
    let vocab = r.config().vocab_size;
    let a = tokens(37, vocab, 1);
    let b = tokens(23, vocab, 2);
    let next = tokens(2 * decode, vocab, 3);
    let (mut la, mut lb) = (Vec::new(), Vec::new());
    let w = |seq, tokens, start_pos| SeqWork {
        seq: SeqId(seq),
        tokens,
        start_pos,
        logits: LogitsWanted::All,
    };
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

fn all(r: &mut Runner) -> Vec<f32> {
    let (a, b) = run(r, true, 6);
    [a, b].concat()
}

#[test]
fn exact_ranks_are_bitwise_one_rank() {
    let dir = tempfile::tempdir().unwrap();
    let kv4 = synth_model(dir.path(), "tiny-llama-kv4", GgmlType::Q4_0);
    let sinks = dir.path().join("sinks-alibi.gguf");
    common::gguf_variant(
        &kv4,
        &sinks,
        &[
            ("llama.attention.max_alibi_bias", GgufValue::F32(8.0)),
            ("llama.attention.sliding_window", GgufValue::U32(24)),
        ],
        Some(7),
    );
    let cases: Vec<(String, PathBuf, &[usize])> = vec![
        ("llama Q4_0, 4 KV heads".into(), kv4.clone(), &[2, 4]),
        (
            "llama Q4_K".into(),
            synth_model(dir.path(), "tiny-llama-kv4", GgmlType::Q4_K),
            &[2, 4],
        ),
        (
            "llama F16".into(),
            synth_model(dir.path(), "tiny-llama-kv4", GgmlType::F16),
            &[4],
        ),
        (
            "qwen2 (q/k/v biases) Q8_0".into(),
            synth_model(dir.path(), "tiny-qwen2", GgmlType::Q8_0),
            &[2],
        ),
        (
            "qwen3 (q/k norms) Q8_0".into(),
            synth_model(dir.path(), "tiny-qwen3", GgmlType::Q8_0),
            &[2],
        ),
        ("sinks, ALiBi, window".into(), sinks, &[2, 4]),
    ];
    for (name, path, worlds) in cases {
        let one = all(&mut load(&path, "exact", 1));
        assert!(one.iter().all(|x| x.is_finite()), "{name}");
        for &n in worlds {
            let got = all(&mut load(&path, "exact", n));
            assert_eq!(got.len(), one.len(), "{name}: {n} ranks");
            assert!(
                bits(&got) == bits(&one),
                "{name}: {n} ranks differ from one (nmse {:e})",
                nmse(&got, &one)
            );
        }
    }
}

#[test]
fn deterministic_ranks_repeat_and_are_batch_invariant() {
    let dir = tempfile::tempdir().unwrap();
    let path = synth_model(dir.path(), "tiny-llama-kv4", GgmlType::Q8_0);
    let one = all(&mut load(&path, "exact", 1));
    for n in [2, 4] {
        let mut r = load(&path, "deterministic", n);
        let first = all(&mut r);
        // Run to run, in a fresh runner and in the same one (its KV blocks
        // now reused).
        assert_eq!(
            bits(&all(&mut load(&path, "deterministic", n))),
            bits(&first)
        );
        assert_eq!(bits(&all(&mut r)), bits(&first));
        // A's logits alone equal A's logits beside B.
        let (alone, _) = run(&mut load(&path, "deterministic", n), false, 6);
        let (beside, _) = run(&mut load(&path, "deterministic", n), true, 6);
        assert_eq!(bits(&alone), bits(&beside), "{n} ranks");
        // The partial sums change the rounding, not the model (a wrong
        // cut is an nmse near 1).
        let e = nmse(&first, &one);
        assert!(e < 1e-6, "{n} ranks: nmse {e:e} against one rank");
        let fast = all(&mut load(&path, "fast", n));
        let e = nmse(&fast, &one);
        assert!(e < 1e-6, "fast, {n} ranks: nmse {e:e} against one rank");
    }
}

#[test]
fn shapes_that_do_not_split_and_unsupported_setups_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let err = |path: &Path, opts: RunnerOptions| match Runner::load(path, &opts) {
        Ok(_) => panic!("{} loaded with {opts:?}", path.display()),
        Err(e) => format!("{e:#}"),
    };
    let tp = |n| RunnerOptions {
        threads: Some(2),
        tensor_parallel: n,
        ..Default::default()
    };
    // 2 KV heads do not split 4 ways.
    let llama = synth_model(dir.path(), "tiny-llama", GgmlType::Q8_0);
    let e = err(&llama, tp(4));
    assert!(e.contains("2 KV heads do not split into 4"), "{e}");
    assert!(err(&llama, tp(0)).contains("at least one rank"));
    // Q4_K blocks of 256: a deterministic split of the FFN's 768 columns 4
    // ways (192 each) cuts blocks; exact keeps every k whole.
    let q4k = synth_model(dir.path(), "tiny-llama-kv4", GgmlType::Q4_K);
    let e = err(
        &q4k,
        RunnerOptions {
            mode: "deterministic".parse().unwrap(),
            ..tp(4)
        },
    );
    assert!(e.contains("256-element blocks"), "{e}");
    // The cuda backend has no ranks yet; hybrids do not split.
    let e = err(
        &llama,
        RunnerOptions {
            gpu: "required".parse().unwrap(),
            ..tp(2)
        },
    );
    assert!(e.contains("--gpu off"), "{e}");
    let hybrid = synth_model(dir.path(), "qwen35-tiny", GgmlType::Q8_0);
    let e = err(&hybrid, tp(2));
    assert!(e.contains("do not split yet"), "{e}");
}

#[test]
fn cut_matrices_hold_the_rows_and_columns_they_name() {
    let dir = tempfile::tempdir().unwrap();
    for ty in [GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::F16] {
        let path = synth_model(dir.path(), "tiny-llama-kv4", ty);
        let g = GgufFile::open(&path).unwrap();
        let w =
            quire::model::weights::WeightRef::load(&g, "blk.0.ffn_down.weight", 256, 768).unwrap();
        let full = dequant(&w.matrix(&g).unwrap());
        let rows = cut(&g, &w, &Cut::Rows(64..128)).unwrap();
        assert_eq!((rows.rows, rows.cols), (64, 768));
        assert_eq!(
            dequant(&rows.matrix(&g).unwrap()),
            full[64 * 768..128 * 768]
        );
        let cols = cut(&g, &w, &Cut::Cols(256..512)).unwrap();
        assert_eq!((cols.rows, cols.cols), (256, 256));
        let want: Vec<f32> = (0..256)
            .flat_map(|r| full[r * 768 + 256..r * 768 + 512].to_vec())
            .collect();
        assert_eq!(dequant(&cols.matrix(&g).unwrap()), want);
        assert!(cols.name.contains("cols 256..512"), "{}", cols.name);
        // Not on a block boundary (Q4_0: 32, Q4_K: 256).
        if ty != GgmlType::F16 {
            let e = cut(&g, &w, &Cut::Cols(16..272)).unwrap_err();
            assert!(format!("{e}").contains("whole"), "{e}");
        }
        assert!(cut(&g, &w, &Cut::Rows(0..257)).is_err());
    }
}

fn dequant(m: &quire::backend::QMatrix<'_>) -> Vec<f32> {
    let mut out = vec![0f32; m.rows * m.cols];
    quire::quant::dequantize(m.ty, m.data, &mut out).unwrap();
    out
}
