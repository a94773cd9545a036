//! Attention options read from a llama-family file's metadata and
//! tensors (sliding window, logit softcap, ALiBi, sinks): each changes
//! the logits, a window longer than the sequence changes nothing, and
//! with each the logits stay bitwise equal between one prefill, chunks
//! and token by token. Bad values are load errors naming the key.

mod common;

use common::bits;
use quire::gguf::{GgufFile, GgufValue};
use quire::kv::SeqId;
use quire::model::{synth, ModelConfig};
use quire::quant::GgmlType;
use quire::runner::{LogitsWanted, Runner, RunnerOptions, SeqWork};
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};

fn base(dir: &Path) -> PathBuf {
    let p = dir.join("base.gguf");
    if !p.exists() {
        let shape = synth::find_shape("tiny-llama").unwrap();
        synth::write_model(&p, shape, GgmlType::Q8_0, 17).unwrap();
    }
    p
}

/// The base model with metadata `kvs` added and, with `sinks`, an
/// `attn_sinks.weight` of random logits in every layer.
fn variant(dir: &Path, name: &str, kvs: &[(&str, GgufValue)], sinks: bool) -> PathBuf {
    let p = dir.join(format!("{name}.gguf"));
    common::gguf_variant(&base(dir), &p, kvs, sinks.then_some(5));
    p
}

/// Logits at every position of `toks`, fed in chunks of `chunk`.
fn logits(path: &Path, toks: &[u32], chunk: usize) -> Vec<f32> {
    let mut r = Runner::load(
        path,
        &RunnerOptions {
            threads: Some(2),
            ..Default::default()
        },
    )
    .unwrap();
    let mut out = Vec::new();
    let mut pos = 0;
    for c in toks.chunks(chunk) {
        let l = r
            .step(&[SeqWork {
                seq: SeqId(0),
                tokens: c,
                start_pos: pos,
                logits: LogitsWanted::All,
            }])
            .unwrap();
        out.extend_from_slice(&l[0]);
        pos += c.len();
    }
    out
}

#[test]
fn attention_options_from_the_file_take_effect_and_stay_invariant() {
    let dir = tempfile::tempdir().unwrap();
    let g = GgufFile::open(&base(dir.path())).unwrap();
    let vocab = ModelConfig::from_gguf(&g).unwrap().vocab_size as u32;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let toks: Vec<u32> = (0..70).map(|_| rng.random_range(0..vocab)).collect();
    let plain = logits(&base(dir.path()), &toks, 70);
    // A window past the sequence is no window.
    let wide = variant(
        dir.path(),
        "wide",
        &[("llama.attention.sliding_window", GgufValue::U32(1000))],
        false,
    );
    assert_eq!(bits(&logits(&wide, &toks, 70)), bits(&plain));
    let cases: Vec<(&str, PathBuf)> = vec![
        (
            "window",
            variant(
                dir.path(),
                "window",
                &[("llama.attention.sliding_window", GgufValue::U32(20))],
                false,
            ),
        ),
        (
            "softcap",
            variant(
                dir.path(),
                "softcap",
                &[("llama.attn_logit_softcapping", GgufValue::F32(1.5))],
                false,
            ),
        ),
        (
            "alibi",
            variant(
                dir.path(),
                "alibi",
                &[("llama.attention.max_alibi_bias", GgufValue::F32(8.0))],
                false,
            ),
        ),
        ("sinks", variant(dir.path(), "sinks", &[], true)),
    ];
    let vocab = vocab as usize;
    for (name, p) in cases {
        let once = logits(&p, &toks, 70);
        assert!(once.iter().all(|x| x.is_finite()), "{name}");
        // The window only shows past its length; the others from the start.
        let from = if name == "window" { 20 * vocab } else { vocab };
        assert_ne!(
            bits(&once[from..]),
            bits(&plain[from..]),
            "{name} changed nothing"
        );
        if name == "window" {
            assert_eq!(bits(&once[..20 * vocab]), bits(&plain[..20 * vocab]));
        }
        for chunk in [9, 1] {
            assert_eq!(
                bits(&logits(&p, &toks, chunk)),
                bits(&once),
                "{name}: chunks of {chunk} differ from one prefill"
            );
        }
    }
}

#[test]
fn bad_attention_options_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    for (key, v) in [
        ("llama.attn_logit_softcapping", f32::NAN),
        ("llama.attn_logit_softcapping", -1.0),
        ("llama.attention.max_alibi_bias", f32::INFINITY),
    ] {
        let p = variant(dir.path(), "bad", &[(key, GgufValue::F32(v))], false);
        let g = GgufFile::open(&p).unwrap();
        let e = format!("{:#}", ModelConfig::from_gguf(&g).unwrap_err());
        assert!(e.contains(key) && e.contains("expected"), "{e}");
    }
}
