//! Issue 59 F2: counts read from metadata are checked against what the file
//! holds before anything is sized by them. A `block_count` of 4294967295
//! used to abort on a multi-terabyte `Vec::with_capacity`.

use std::path::Path;

use quire::gguf::{GgufFile, GgufValue, GgufWriter};
use quire::model::{synth, LlamaModel, ModelConfig};

/// The tiny synthetic llama with one metadata value replaced.
fn with_kv(dir: &Path, key: &str, value: GgufValue) -> GgufFile {
    let base = dir.join("base.gguf");
    if !base.exists() {
        let shape = synth::find_shape("tiny-llama").unwrap();
        synth::write_model(&base, shape, quire::quant::GgmlType::F32, 7).unwrap();
    }
    let g = GgufFile::open(&base).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        if k == key {
            w.add_kv(k.clone(), value.clone());
        } else {
            w.add_kv(k.clone(), v.clone());
        }
    }
    for t in g.tensors() {
        w.add_tensor(t.name.clone(), &t.dims, t.ty, g.data_of(t).to_vec())
            .unwrap();
    }
    let p = dir.join("case.gguf");
    w.write_to(&p).unwrap();
    GgufFile::open(&p).unwrap()
}

/// Loads config and weights as the runner does.
fn load(g: &GgufFile) -> anyhow::Result<()> {
    let cfg = ModelConfig::from_gguf(g)?;
    LlamaModel::load(g, cfg, &|_, _| {})?;
    Ok(())
}

#[test]
fn absurd_block_counts_are_clean_errors() {
    let dir = tempfile::tempdir().unwrap();
    for n in [u32::MAX, i32::MAX as u32, 100_000_000, 0] {
        let g = with_kv(dir.path(), "llama.block_count", GgufValue::U32(n));
        let err = load(&g).unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.contains("llama.block_count") && msg.contains(&n.to_string()),
            "{n}: {msg}"
        );
    }
    // One layer more than the file holds.
    let g0 = with_kv(dir.path(), "general.name", GgufValue::String("x".into()));
    let real = ModelConfig::from_gguf(&g0).unwrap().n_layers as u32;
    let g = with_kv(dir.path(), "llama.block_count", GgufValue::U32(real + 1));
    let msg = format!("{:#}", load(&g).unwrap_err());
    assert!(
        msg.contains(&format!("blk.{real}.attn_norm.weight")),
        "{msg}"
    );
    // The untouched value still loads.
    load(&g0).unwrap();
}

#[test]
fn embedding_length_must_match_token_embd() {
    let dir = tempfile::tempdir().unwrap();
    let g = with_kv(
        dir.path(),
        "llama.embedding_length",
        GgufValue::U32(1 << 30),
    );
    let msg = format!("{:#}", load(&g).unwrap_err());
    assert!(msg.contains("llama.embedding_length"), "{msg}");
}
