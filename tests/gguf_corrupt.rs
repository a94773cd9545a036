//! Malformed GGUF input gives errors naming the file, never a panic or a
//! huge allocation: truncation at sampled offsets, header byte flips, absurd
//! counts and lengths, bad tensor entries, overlaps, duplicates.

use std::path::Path;

use quire::gguf::{GgufError, GgufFile, GgufValue, GgufWriter};
use quire::quant::{quantize, GgmlType};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A valid file with every value kind and several tensor types.
fn valid_file(dir: &Path) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", "llama");
    w.add_kv("a.u32", 7u32);
    w.add_kv("a.f32", 0.5f32);
    w.add_kv("a.bool", true);
    w.add_kv("a.i64", -3i64);
    w.add_kv("a.toks", vec!["x", "yy", "zzz"]);
    w.add_kv("a.scores", vec![1.0f32, 2.0, 3.0]);
    w.add_kv(
        "a.nested",
        GgufValue::Array(vec![GgufValue::Array(vec![GgufValue::U16(1)])]),
    );
    for (i, ty) in [
        GgmlType::F32,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q6_K,
    ]
    .into_iter()
    .enumerate()
    {
        let x: Vec<f32> = (0..512).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        w.add_tensor(format!("t{i}"), &[256, 2], ty, quantize(ty, &x).unwrap())
            .unwrap();
    }
    let p = dir.join("valid.gguf");
    w.write_to(&p).unwrap();
    std::fs::read(&p).unwrap()
}

fn open_bytes(dir: &Path, bytes: &[u8]) -> Result<GgufFile, GgufError> {
    let p = dir.join("case.gguf");
    std::fs::write(&p, bytes).unwrap();
    GgufFile::open(&p)
}

/// Touches everything an accepted file exposes (must not panic).
fn exercise(f: &GgufFile) {
    for t in f.tensors() {
        let d = f.data_of(t);
        assert_eq!(d.len(), t.n_bytes);
        let _ = f.tensor_f32(&t.name);
    }
    for (k, _) in f.metadata() {
        let _ = f.get_u32(k);
        let _ = f.get_str_array(k);
    }
}

fn expect_err(dir: &Path, bytes: &[u8], needle: &str) -> GgufError {
    match open_bytes(dir, bytes) {
        Ok(_) => panic!("accepted malformed file (expected error with '{needle}')"),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains("case.gguf"),
                "error does not name the file: {msg}"
            );
            assert!(msg.contains(needle), "error '{msg}' lacks '{needle}'");
            e
        }
    }
}

#[test]
fn truncation_anywhere_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = valid_file(dir.path());
    let f = open_bytes(dir.path(), &bytes).unwrap();
    let last_end = f
        .tensors()
        .iter()
        .map(|t| f.data_offset() + t.offset + t.n_bytes as u64)
        .max()
        .unwrap() as usize;
    let header_end = f.data_offset() as usize;
    drop(f);
    // Every cut in the header, a sample of cuts in the data.
    let mut cuts: Vec<usize> = (0..=header_end).collect();
    cuts.extend((header_end..last_end).step_by(37));
    cuts.push(last_end - 1);
    for cut in cuts {
        match open_bytes(dir.path(), &bytes[..cut]) {
            Ok(_) => panic!(
                "file truncated to {cut} of {} bytes was accepted",
                bytes.len()
            ),
            Err(e) => assert!(e.to_string().contains("case.gguf"), "{e}"),
        }
    }
    // Cutting only trailing padding after the last tensor leaves a valid file.
    if last_end < bytes.len() {
        open_bytes(dir.path(), &bytes[..last_end]).unwrap();
    }
}

#[test]
fn header_byte_flips_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = valid_file(dir.path());
    let header_end = open_bytes(dir.path(), &bytes).unwrap().data_offset() as usize;
    let (mut ok, mut err) = (0, 0);
    for pos in 0..header_end {
        for mask in [0x01u8, 0x80, 0xff] {
            let mut b = bytes.clone();
            b[pos] ^= mask;
            match open_bytes(dir.path(), &b) {
                Ok(f) => {
                    exercise(&f);
                    ok += 1;
                }
                Err(e) => {
                    assert!(e.to_string().contains("case.gguf"), "{e}");
                    err += 1;
                }
            }
        }
    }
    // Most flips hit lengths, counts, types or dims and must be rejected.
    assert!(err > ok, "only {err} of {} flips rejected", ok + err);
    // Random multi-byte corruption too.
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for _ in 0..500 {
        let mut b = bytes.clone();
        for _ in 0..rng.random_range(1..6) {
            let p = rng.random_range(0..header_end);
            b[p] = rng.random();
        }
        if let Ok(f) = open_bytes(dir.path(), &b) {
            exercise(&f);
        }
    }
}

/// Minimal raw GGUF builder for hand-made malformed files.
struct Raw(Vec<u8>);

impl Raw {
    fn new(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw(b"GGUF".to_vec());
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    fn kv_u32(&mut self, k: &str, v: u32) -> &mut Self {
        self.str(k).u32(4).u32(v)
    }
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Pads to 32 and appends `n` data bytes.
    fn data(&mut self, n: usize) -> Vec<u8> {
        let mut b = self.0.clone();
        b.resize(b.len().div_ceil(32) * 32, 0);
        b.extend((0..n).map(|i| (i * 7 % 251) as u8));
        b
    }
}

#[test]
fn hand_made_valid_file_opens() {
    // Guards the builder: the malformed cases below differ from this in one
    // field only.
    let dir = tempfile::tempdir().unwrap();
    let mut r = Raw::new(3, 2, 1);
    r.kv_u32("k", 5)
        .tensor("a", &[8], 0, 0)
        .tensor("b", &[32, 1], 8, 32);
    let f = open_bytes(dir.path(), &r.data(32 + 34)).unwrap();
    assert_eq!(f.get_u32("k").unwrap(), 5);
    assert_eq!(f.tensor("b").unwrap().ty, GgmlType::Q8_0);
    // Version 2 has the same layout.
    let mut r = Raw::new(2, 1, 0);
    r.tensor("a", &[8], 0, 0);
    assert_eq!(open_bytes(dir.path(), &r.data(32)).unwrap().version(), 2);
}

#[test]
fn malformed_headers_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();

    expect_err(d, b"", "shorter");
    expect_err(d, b"GGUF\x03\x00\x00\x00", "shorter");
    let mut r = Raw::new(3, 0, 0);
    r.0[0] = b'X';
    expect_err(d, &r.data(0), "magic");
    let e = expect_err(d, &Raw::new(1, 0, 0).data(0), "version 1");
    assert!(matches!(e, GgufError::UnsupportedVersion { .. }));
    expect_err(d, &Raw::new(3u32.swap_bytes(), 0, 0).data(0), "big-endian");
    expect_err(d, &Raw::new(4, 0, 0).data(0), "version 4");

    // Absurd counts are rejected before allocating.
    expect_err(d, &Raw::new(3, 0, u64::MAX).data(0), "cannot fit");
    expect_err(d, &Raw::new(3, u64::MAX, 0).data(0), "cannot fit");
    expect_err(d, &Raw::new(3, 1 << 40, 1 << 40).data(0), "cannot fit");

    // Key string length past the end.
    let mut r = Raw::new(3, 0, 1);
    r.u64(u64::MAX).u32(4).u32(0);
    expect_err(d, &r.data(0), "past the end");
    // Value string length past the end.
    let mut r = Raw::new(3, 0, 1);
    r.str("k").u32(8).u64(1 << 50);
    expect_err(d, &r.data(0), "past the end");
    // Array count past the end.
    let mut r = Raw::new(3, 0, 1);
    r.str("k").u32(9).u32(6).u64(u64::MAX / 2);
    expect_err(d, &r.data(0), "cannot fit");
    // Array of strings whose count fits but whose strings do not.
    let mut r = Raw::new(3, 0, 1);
    r.str("k").u32(9).u32(8).u64(3).str("a").u64(1 << 40);
    expect_err(d, &r.data(0), "past the end");
    // Unknown value type, unknown array element type.
    let mut r = Raw::new(3, 0, 1);
    r.str("k").u32(13).u32(0);
    expect_err(d, &r.data(0), "unknown value type 13");
    let mut r = Raw::new(3, 0, 1);
    r.str("k").u32(9).u32(77).u64(1);
    expect_err(d, &r.data(0), "unknown array element type 77");
    // Deeply nested arrays.
    let mut r = Raw::new(3, 0, 1);
    r.str("k").u32(9);
    for _ in 0..40 {
        r.u32(9).u64(1);
    }
    r.u32(0).u64(0);
    expect_err(d, &r.data(64), "nested");
    // Bool byte other than 0/1.
    let mut r = Raw::new(3, 0, 1);
    r.str("k").u32(7);
    r.0.push(2);
    expect_err(d, &r.data(0), "bool");
    // Key not UTF-8.
    let mut r = Raw::new(3, 0, 1);
    r.u64(2);
    r.0.extend_from_slice(&[0xff, 0xfe]);
    r.u32(4).u32(1);
    expect_err(d, &r.data(0), "UTF-8");
    // Duplicate keys.
    let mut r = Raw::new(3, 0, 2);
    r.kv_u32("k", 1).kv_u32("k", 2);
    expect_err(d, &r.data(0), "duplicate metadata key 'k'");
    // Bad alignment values.
    for a in [0u32, 48, 3] {
        let mut r = Raw::new(3, 0, 1);
        r.kv_u32("general.alignment", a);
        expect_err(d, &r.data(0), "general.alignment");
    }
    let mut r = Raw::new(3, 0, 1);
    r.str("general.alignment").u32(8).str("32");
    expect_err(d, &r.data(0), "general.alignment");
    // Missing file.
    let e = GgufFile::open(&d.join("missing.gguf")).unwrap_err();
    assert!(matches!(e, GgufError::Io { .. }) && e.to_string().contains("missing.gguf"));
}

#[test]
fn malformed_tensors_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let one = |name: &str, dims: &[u64], ty: u32, offset: u64, n: usize| {
        let mut r = Raw::new(3, 1, 0);
        r.tensor(name, dims, ty, offset);
        r.data(n)
    };
    let e = expect_err(d, &one("w", &[1, 1, 1, 1, 1], 0, 0, 32), "'w'");
    assert!(e.to_string().contains("5 dimensions"), "{e}");
    expect_err(d, &one("w", &[], 0, 0, 32), "0 dimensions");
    expect_err(
        d,
        &one("w", &[1 << 32, 1 << 32, 1 << 32], 0, 0, 32),
        "overflow",
    );
    expect_err(d, &one("w", &[1 << 62, 4], 0, 0, 32), "overflow");
    expect_err(
        d,
        &one("w", &[33], 2, 0, 64),
        "multiple of the Q4_0 block size 32",
    );
    // Unsupported / unknown tensor types name the tensor and the type.
    let e = expect_err(d, &one("blk.0.w", &[256], 10, 0, 256), "'blk.0.w'");
    assert!(e.to_string().contains("Q2_K"), "{e}");
    assert!(matches!(e, GgufError::UnsupportedTensorType { id: 10, .. }));
    let e = expect_err(d, &one("x", &[256], 99, 0, 256), "'x'");
    assert!(
        e.to_string().contains("unknown") && e.to_string().contains("99"),
        "{e}"
    );
    expect_err(d, &one("x", &[256], 15, 0, 292), "Q8_K");
    // Placement: unaligned, past the end, offset overflow.
    expect_err(d, &one("w", &[8], 0, 4, 64), "alignment");
    expect_err(d, &one("w", &[8], 0, 0, 31), "past the end");
    expect_err(d, &one("w", &[8], 0, 64, 64), "past the end");
    expect_err(d, &one("w", &[8], 0, u64::MAX - 31, 64), "past the end");
    expect_err(d, &one("w", &[u64::MAX / 4], 0, 0, 64), "");
    // Overlapping tensors name both.
    let mut r = Raw::new(3, 2, 0);
    r.tensor("a", &[16], 0, 0).tensor("b", &[8], 0, 32);
    let e = expect_err(d, &r.data(64), "overlaps");
    assert!(
        e.to_string().contains("'a'") && e.to_string().contains("'b'"),
        "{e}"
    );
    let mut r = Raw::new(3, 2, 0);
    r.tensor("a", &[8], 0, 0).tensor("b", &[8], 0, 0);
    expect_err(d, &r.data(64), "overlaps");
    // Duplicate tensor names.
    let mut r = Raw::new(3, 2, 0);
    r.tensor("a", &[8], 0, 0).tensor("a", &[8], 0, 32);
    expect_err(d, &r.data(64), "duplicate tensor name 'a'");
    // Tensor name not UTF-8.
    let mut r = Raw::new(3, 1, 0);
    r.u64(1);
    r.0.push(0xc3);
    r.u32(1).u64(8).u32(0).u64(0);
    expect_err(d, &r.data(32), "UTF-8");
}
