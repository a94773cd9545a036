//! A file written by GgufWriter, read by the `gguf` Python package's
//! GGUFReader: same version, metadata, tensor names, shapes, types, offsets
//! and bytes. Skipped (SKIPPED printed) when `QUIRE_PYTHON` (default
//! `python3`) lacks `gguf` or `numpy`.

use std::path::{Path, PathBuf};
use std::process::Command;

use quire::gguf::{GgufFile, GgufValue, GgufWriter};
use quire::quant::{quantize, GgmlType};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

fn python() -> String {
    std::env::var("QUIRE_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/gguf_ref.py")
}

fn python_unavailable() -> Option<String> {
    match Command::new(python())
        .arg(script())
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

/// gguf-py's GGUFValueType name for a scalar value.
fn py_type(v: &GgufValue) -> &'static str {
    match v {
        GgufValue::U8(_) => "UINT8",
        GgufValue::I8(_) => "INT8",
        GgufValue::U16(_) => "UINT16",
        GgufValue::I16(_) => "INT16",
        GgufValue::U32(_) => "UINT32",
        GgufValue::I32(_) => "INT32",
        GgufValue::U64(_) => "UINT64",
        GgufValue::I64(_) => "INT64",
        GgufValue::F32(_) => "FLOAT32",
        GgufValue::F64(_) => "FLOAT64",
        GgufValue::Bool(_) => "BOOL",
        GgufValue::String(_) => "STRING",
        GgufValue::Array(_) => "ARRAY",
    }
}

fn same_scalar(ours: &GgufValue, py: &Value) -> bool {
    if let Some(i) = ours.as_int() {
        return py.as_i64().map(|p| p as i128 == i).unwrap_or(false)
            || py.as_u64().map(|p| p as i128 == i).unwrap_or(false);
    }
    match ours {
        GgufValue::F32(x) => py.as_f64() == Some(*x as f64),
        GgufValue::F64(x) => py.as_f64() == Some(*x),
        GgufValue::Bool(b) => py.as_bool() == Some(*b),
        GgufValue::String(s) => py.as_str() == Some(s.as_str()),
        _ => false,
    }
}

#[test]
fn gguf_python_reads_our_files() {
    if let Some(why) = python_unavailable() {
        println!("SKIPPED: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ours.gguf");
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let s = |x: &str| GgufValue::String(x.to_string());
    let kvs: Vec<(&str, GgufValue)> = vec![
        ("general.architecture", s("llama")),
        ("general.alignment", GgufValue::U32(64)),
        ("u8", GgufValue::U8(rng.random())),
        ("i8", GgufValue::I8(rng.random())),
        ("u16", GgufValue::U16(rng.random())),
        ("i16", GgufValue::I16(rng.random())),
        ("u32", GgufValue::U32(rng.random())),
        ("i32", GgufValue::I32(rng.random())),
        ("u64", GgufValue::U64(rng.random())),
        ("i64", GgufValue::I64(rng.random())),
        ("f32", GgufValue::F32(rng.random_range(-10.0f32..10.0))),
        ("f64", GgufValue::F64(rng.random_range(-10.0f64..10.0))),
        ("bool", GgufValue::Bool(true)),
        ("str", s("Ġtoken ✓")),
        (
            "tokens",
            GgufValue::Array(vec![s("<s>"), s("a"), s("ĠHello")]),
        ),
        (
            "scores",
            GgufValue::Array((0..6).map(|_| GgufValue::F32(rng.random())).collect()),
        ),
        (
            "types",
            GgufValue::Array(
                (0..6)
                    .map(|_| GgufValue::I32(rng.random_range(1..7)))
                    .collect(),
            ),
        ),
    ];
    let mut w = GgufWriter::new();
    for (k, v) in &kvs {
        w.add_kv(*k, v.clone());
    }
    for (i, ty) in GgmlType::WEIGHT_TYPES.into_iter().enumerate() {
        let dims: Vec<u64> = match i % 3 {
            0 => vec![256, 3],
            1 => vec![512, 2, 2],
            _ => vec![256],
        };
        let n = dims.iter().product::<u64>() as usize;
        let x: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        w.add_tensor(
            format!("t{i}.{}", ty.name()),
            &dims,
            ty,
            quantize(ty, &x).unwrap(),
        )
        .unwrap();
    }
    w.write_to(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();

    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let o = Command::new(python())
        .arg(script())
        .args(["dump", path.to_str().unwrap(), out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "GGUFReader failed on our file: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["version"], 3);

    let md = m["metadata"].as_object().unwrap();
    assert_eq!(md.len(), kvs.len(), "metadata count");
    for (k, v) in &kvs {
        let p = &md[*k];
        let types: Vec<&str> = p["types"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        match v {
            GgufValue::Array(items) => {
                assert_eq!(types, vec!["ARRAY", py_type(&items[0])], "{k}");
                let pv = p["value"].as_array().unwrap();
                assert_eq!(pv.len(), items.len(), "{k}");
                for (a, b) in items.iter().zip(pv) {
                    assert!(same_scalar(a, b), "{k}: ours {a:?} vs python {b}");
                }
            }
            _ => {
                assert_eq!(types, vec![py_type(v)], "{k}");
                assert!(
                    same_scalar(v, &p["value"]),
                    "{k}: ours {v:?} vs python {}",
                    p["value"]
                );
            }
        }
    }

    let pts = m["tensors"].as_array().unwrap();
    assert_eq!(pts.len(), f.tensors().len());
    for (i, (t, p)) in f.tensors().iter().zip(pts).enumerate() {
        assert_eq!(p["name"], t.name.as_str());
        let shape: Vec<u64> = p["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(shape, t.dims, "{}: GGML-order shape", t.name);
        assert_eq!(p["type"], t.ty.name(), "{}", t.name);
        assert_eq!(
            p["n_bytes"].as_u64().unwrap(),
            t.n_bytes as u64,
            "{}",
            t.name
        );
        assert_eq!(
            p["data_offset"].as_u64().unwrap(),
            f.data_offset() + t.offset,
            "{}: absolute data offset",
            t.name
        );
        let raw = std::fs::read(out.join(format!("{i}.raw"))).unwrap();
        assert_eq!(raw, f.data_of(t), "{}: bytes", t.name);
    }
}
