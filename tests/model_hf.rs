//! Tiny random-weight Llama, Qwen2 and Qwen3 models written to GGUF give
//! the logits of Hugging Face transformers (torch, CPU) on the same
//! (dequantized) weights, for prefill and for decode steps.
//!
//! Tolerance: NMSE per position over the vocabulary below 1e-6 for every
//! weight type (measured 2e-8 to 5e-8 on 2026-11-22). HF computes in f32 on
//! the dequantized weights; Quire's differences are the f16 KV cache and,
//! for quantized weights, the 16-bit activation quantization.

mod common;

use common::{nmse, python, python_has, repo_path};
use quire::kv::SeqId;
use quire::model::synth::{find_shape, write_model};
use quire::quant::GgmlType;
use quire::runner::{LogitsWanted, Runner, RunnerOptions, SeqWork};
use rand::{Rng, SeedableRng};
use std::process::Command;

fn hf_logits(model: &std::path::Path, tokens: &[u32], vocab: usize) -> Vec<f32> {
    let out = model.with_extension("ref.f32");
    let status = Command::new(python())
        .arg(repo_path("tests/py/hf_reference.py"))
        .arg(model)
        .arg(serde_json::to_string(tokens).unwrap())
        .arg(&out)
        .status()
        .expect("running hf_reference.py");
    assert!(status.success(), "hf_reference.py failed");
    let bytes = std::fs::read(&out).unwrap();
    let v: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(v.len(), tokens.len() * vocab);
    v
}

fn check(shape: &str, ty: GgmlType, bound: f64) {
    let test = format!("model_hf {shape} {}", ty.name());
    if !python_has(&test, &["torch", "transformers", "gguf", "numpy"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{shape}-{}.gguf", ty.name()));
    let s = find_shape(shape).unwrap();
    write_model(&path, s, ty, 7).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let n = 37;
    let tokens: Vec<u32> = (0..n)
        .map(|_| rng.random_range(0..s.vocab as u32))
        .collect();
    let want = hf_logits(&path, &tokens, s.vocab);
    let v = s.vocab;
    let mut r = Runner::load(&path, &RunnerOptions::default()).unwrap();

    // Prefill all at once, logits at every position.
    let got = r
        .step(&[SeqWork {
            seq: SeqId(1),
            tokens: &tokens,
            start_pos: 0,
            logits: LogitsWanted::All,
        }])
        .unwrap()
        .pop()
        .unwrap();
    for p in 0..n {
        let e = nmse(&got[p * v..(p + 1) * v], &want[p * v..(p + 1) * v]);
        assert!(
            e < bound,
            "{test}: prefill position {p}: NMSE {e:.3e} >= {bound:.0e}"
        );
    }
    r.free(SeqId(1));

    // Prefill 20, then decode token by token.
    let split = 20;
    r.step(&[SeqWork {
        seq: SeqId(2),
        tokens: &tokens[..split],
        start_pos: 0,
        logits: LogitsWanted::None,
    }])
    .unwrap();
    let mut worst = 0f64;
    for p in split..n {
        let l = r
            .step(&[SeqWork {
                seq: SeqId(2),
                tokens: &tokens[p..p + 1],
                start_pos: p,
                logits: LogitsWanted::Last,
            }])
            .unwrap()
            .pop()
            .unwrap();
        let e = nmse(&l, &want[p * v..(p + 1) * v]);
        worst = worst.max(e);
        assert!(
            e < bound,
            "{test}: decode position {p}: NMSE {e:.3e} >= {bound:.0e}"
        );
    }
    eprintln!("{test}: worst decode NMSE {worst:.3e} (bound {bound:.0e})");
}

#[test]
fn llama_f32_matches_hf() {
    check("tiny-llama", GgmlType::F32, 1e-6);
}

#[test]
fn llama_tied_q8_0_matches_hf() {
    check("tiny-llama-tied", GgmlType::Q8_0, 1e-6);
}

#[test]
fn llama_q4_k_matches_hf() {
    check("tiny-llama", GgmlType::Q4_K, 1e-6);
}

#[test]
fn qwen2_f32_matches_hf() {
    check("tiny-qwen2", GgmlType::F32, 1e-6);
}

#[test]
fn qwen2_q4_1_matches_hf() {
    check("tiny-qwen2", GgmlType::Q4_1, 1e-6);
}

#[test]
fn qwen3_f32_matches_hf() {
    check("tiny-qwen3", GgmlType::F32, 1e-6);
}

#[test]
fn qwen3_q6_k_matches_hf() {
    check("tiny-qwen3", GgmlType::Q6_K, 1e-6);
}
