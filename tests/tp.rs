//! Tensor parallelism on the cpu backend's simulated ranks (`backend::tp`): in
//! `exact` the logits of 2 and 4 ranks are bitwise those of one, over
//! prefill chunks and batched decode, for every llama-family variant
//! (biases, q/k norms, GQA, attention sinks and ALiBi cut per head);
//! `deterministic` is run-to-run and batch-invariant and close to one
//! rank; `fast` is close. Shapes that do not split, hybrids and the cuda
//! backend are clear errors.

mod common;
mod server_util;

use common::tp::{all, load, run, synth_model};
use common::{bits, nmse};
use quire::gguf::{GgufFile, GgufValue};
use quire::model::shard::{cut, Cut};
use quire::quant::GgmlType;
use quire::runner::{Runner, RunnerOptions};
use std::path::{Path, PathBuf};

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
        ("llama Q4_0, 4 KV heads".into(), kv4.clone(), &[1, 2, 4]),
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
        let one = all(&mut load(&path, "exact", None));
        assert!(one.iter().all(|x| x.is_finite()), "{name}");
        for &n in worlds {
            let got = all(&mut load(&path, "exact", Some(n)));
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
    let one = all(&mut load(&path, "exact", None));
    for n in [2, 4] {
        let mut r = load(&path, "deterministic", Some(n));
        let first = all(&mut r);
        // Run to run, in a fresh runner and in the same one (its KV blocks
        // now reused).
        assert_eq!(
            bits(&all(&mut load(&path, "deterministic", Some(n)))),
            bits(&first)
        );
        assert_eq!(bits(&all(&mut r)), bits(&first));
        // A's logits alone equal A's logits beside B.
        let (alone, _) = run(&mut load(&path, "deterministic", Some(n)), false, 6);
        let (beside, _) = run(&mut load(&path, "deterministic", Some(n)), true, 6);
        assert_eq!(bits(&alone), bits(&beside), "{n} ranks");
        // The partial sums change the rounding, not the model (a wrong
        // cut is an nmse near 1).
        let e = nmse(&first, &one);
        assert!(e < 1e-6, "{n} ranks: nmse {e:e} against one rank");
        let fast = all(&mut load(&path, "fast", Some(n)));
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
        tensor_parallel: Some(n),
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
    // Ranks on GPUs need the devices (and NCCL); hybrids do not split.
    let e = err(
        &llama,
        RunnerOptions {
            gpu: "required".parse().unwrap(),
            ..tp(64)
        },
    );
    assert!(e.contains("--gpu required --tensor-parallel 64"), "{e}");
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

/// `quire serve --tensor-parallel 2` answers concurrent greedy requests
/// with the text and logprobs of one rank, bit for bit (exact mode).
#[test]
fn serving_on_two_ranks_answers_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = synth_model(dir.path(), "tiny-llama-kv4", GgmlType::Q8_0);
    let prompts = ["the cat sat", "on a mat by the door", "1 2 3 4", "zebra"];
    let answers = |args: &[&str]| -> Vec<serde_json::Value> {
        let srv = server_util::Server::start_model(&path, None, args);
        let srv = &srv;
        std::thread::scope(|s| {
            let hs: Vec<_> = prompts
                .iter()
                .map(|p| {
                    s.spawn(move || {
                        let body = serde_json::json!({
                            "model": srv.model_id, "prompt": p, "max_tokens": 16,
                            "temperature": 0, "logprobs": 3,
                        });
                        let r = srv.request("POST", "/v1/completions", Some(&body.to_string()));
                        assert_eq!(r.status, 200, "{}", r.body);
                        r.json()["choices"][0].clone()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    let one = answers(&[]);
    assert!(one[0]["logprobs"]["token_logprobs"]
        .as_array()
        .is_some_and(|a| a.len() == 16));
    assert_eq!(answers(&["--tensor-parallel", "2"]), one);
}

fn dequant(m: &quire::backend::QMatrix<'_>) -> Vec<f32> {
    let mut out = vec![0f32; m.rows * m.cols];
    quire::quant::dequantize(m.ty, m.data, &mut out).unwrap();
    out
}
