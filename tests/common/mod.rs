//! Shared test helpers.
#![allow(dead_code)]

pub mod cuda;
pub mod tp;

use std::path::PathBuf;
use std::process::Command;

/// The interpreter for reference checks (`QUIRE_PYTHON`, default python3).
pub fn python() -> String {
    std::env::var("QUIRE_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// Whether `python()` can import every module in `mods`; prints SKIPPED
/// with the reason when not.
pub fn python_has(test: &str, mods: &[&str]) -> bool {
    let code = format!("import {}", mods.join(", "));
    match Command::new(python()).args(["-c", &code]).output() {
        Ok(o) if o.status.success() => true,
        Ok(o) => {
            eprintln!(
                "SKIPPED: {test}: `{}` cannot import {:?} ({}); run scripts/setup-test-env.sh and set QUIRE_PYTHON",
                python(),
                mods,
                String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("")
            );
            false
        }
        Err(e) => {
            eprintln!("SKIPPED: {test}: cannot run `{}`: {e}", python());
            false
        }
    }
}

pub fn repo_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Normalized mean squared error of `got` against `want`.
pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    num / den.max(1e-30)
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// tests/py/gguf_ref.py: reference checks with the `gguf` Python package.
pub fn gguf_ref_script() -> PathBuf {
    repo_path("tests/py/gguf_ref.py")
}

/// None when `python()` can run gguf_ref.py (gguf + numpy), else the reason
/// to skip.
pub fn gguf_python_unavailable() -> Option<String> {
    match Command::new(python())
        .arg(gguf_ref_script())
        .arg("check-imports")
        .output()
    {
        Err(e) => Some(format!("cannot run {}: {e}", python())),
        Ok(o) if !o.status.success() => Some(format!(
            "{} lacks gguf/numpy: {}",
            python(),
            String::from_utf8_lossy(&o.stdout).trim()
        )),
        Ok(_) => None,
    }
}

/// A copy of the GGUF `base` at `out` with metadata `kvs` added and, with
/// `sinks_seed`, an `attn_sinks.weight` of random logits in [-2, 2) in
/// every layer (`n_heads` each).
pub fn gguf_variant(
    base: &std::path::Path,
    out: &std::path::Path,
    kvs: &[(&str, quire::gguf::GgufValue)],
    sinks_seed: Option<u64>,
) {
    use rand::{Rng, SeedableRng};
    let g = quire::gguf::GgufFile::open(base).unwrap();
    let cfg = quire::model::ModelConfig::from_gguf(&g).unwrap();
    let mut w = quire::gguf::GgufWriter::new();
    for (k, v) in g.metadata() {
        w.add_kv(k.clone(), v.clone());
    }
    for (k, v) in kvs {
        w.add_kv(k.to_string(), v.clone());
    }
    for t in g.tensors() {
        w.add_tensor(t.name.clone(), &t.dims, t.ty, g.data_of(t).to_vec())
            .unwrap();
    }
    if let Some(seed) = sinks_seed {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        for l in 0..cfg.n_layers {
            let x: Vec<u8> = (0..cfg.n_heads)
                .flat_map(|_| rng.random_range(-2.0f32..2.0).to_le_bytes())
                .collect();
            w.add_tensor(
                format!("blk.{l}.attn_sinks.weight"),
                &[cfg.n_heads as u64],
                quire::quant::GgmlType::F32,
                x,
            )
            .unwrap();
        }
    }
    w.write_to(out).unwrap();
}
