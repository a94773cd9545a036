//! Dequantization of every weight type on random valid blocks, bitwise
//! against the `gguf` Python package (numpy port of ggml's
//! dequantize_row_*), and the reference quantizers of the float and 32-block
//! types bitwise against `gguf.quants.quantize`.
//!
//! Python: the interpreter in `QUIRE_PYTHON` (default `python3`); without
//! `gguf` and `numpy` the tests print SKIPPED and return.

use std::path::{Path, PathBuf};
use std::process::Command;

use quire::gguf::GgufWriter;
use quire::quant::{dequantize, quantize, GgmlType};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn python() -> String {
    std::env::var("QUIRE_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/gguf_ref.py")
}

/// None when Python with gguf+numpy is usable, else the reason to skip.
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

fn run_py(args: &[&str]) {
    let o = Command::new(python())
        .arg(script())
        .args(args)
        .output()
        .expect("spawn python (available a moment ago)");
    assert!(
        o.status.success(),
        "gguf_ref.py {args:?} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A random finite f16 (any sign, subnormals included).
fn finite_f16(rng: &mut ChaCha8Rng) -> u16 {
    loop {
        let b: u16 = rng.random();
        if (b >> 10) & 0x1f != 0x1f {
            return b;
        }
    }
}

/// Random but valid bytes for `n_blocks` blocks of `ty`: every byte random
/// except float fields, which are random finite values.
fn random_blocks(ty: GgmlType, n_blocks: usize, rng: &mut ChaCha8Rng) -> Vec<u8> {
    let mut b = vec![0u8; n_blocks * ty.type_size()];
    rng.fill_bytes(&mut b);
    let f16_fields: &[usize] = match ty {
        GgmlType::F32 => {
            for c in b.chunks_exact_mut(4) {
                // Force a finite exponent: clear one exponent bit if all set.
                if (c[3] & 0x7f) == 0x7f && (c[2] & 0x80) != 0 {
                    c[3] &= 0xbf;
                }
            }
            return b;
        }
        GgmlType::BF16 => {
            for c in b.chunks_exact_mut(2) {
                if (c[1] & 0x7f) == 0x7f && (c[0] & 0x80) != 0 {
                    c[1] &= 0xbf;
                }
            }
            return b;
        }
        GgmlType::F16 => &[0],
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        other => panic!("not a weight type: {other:?}"),
    };
    for blk in b.chunks_exact_mut(ty.type_size()) {
        for &o in f16_fields {
            blk[o..o + 2].copy_from_slice(&finite_f16(rng).to_le_bytes());
        }
    }
    b
}

fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn dequantize_matches_gguf_python_bitwise() {
    if let Some(why) = python_unavailable() {
        println!("SKIPPED: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blocks.gguf");
    let mut rng = ChaCha8Rng::seed_from_u64(2024);
    let mut w = GgufWriter::new();
    let mut expect = Vec::new();
    for ty in GgmlType::WEIGHT_TYPES {
        // 512-element rows x 5 rows: 2 K-quant super-blocks / 16 32-blocks
        // per row, 10 / 80 blocks per type.
        let (cols, rows) = (512usize, 5usize);
        let n_blocks = cols * rows / ty.block_size();
        let data = random_blocks(ty, n_blocks, &mut rng);
        let mut ours = vec![0f32; cols * rows];
        dequantize(ty, &data, &mut ours).unwrap();
        w.add_tensor(ty.name(), &[cols as u64, rows as u64], ty, data.clone())
            .unwrap();
        expect.push((ty, data, ours));
    }
    w.write_to(&path).unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    run_py(&["dump", path.to_str().unwrap(), out.to_str().unwrap()]);

    let mut checked = 0;
    for (i, (ty, data, ours)) in expect.iter().enumerate() {
        let raw = std::fs::read(out.join(format!("{i}.raw"))).unwrap();
        assert_eq!(&raw, data, "{ty:?}: GGUFReader sees other bytes");
        let reference = read_f32(&out.join(format!("{i}.f32")));
        assert_eq!(reference.len(), ours.len(), "{ty:?}: element count");
        for (j, (a, b)) in ours.iter().zip(&reference).enumerate() {
            assert!(
                a.to_bits() == b.to_bits(),
                "{ty:?} element {j} (block {}): ours {a:e} ({:#010x}) vs gguf {b:e} ({:#010x})",
                j / ty.block_size(),
                a.to_bits(),
                b.to_bits()
            );
        }
        checked += ours.len();
    }
    println!("checked {checked} values bitwise against gguf-py");
}

#[test]
fn reference_quantizers_match_gguf_python_bitwise() {
    if let Some(why) = python_unavailable() {
        println!("SKIPPED: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(99);
    let n = 32 * 200;
    let mut x: Vec<f32> = (0..n)
        .map(|i| {
            let scale = [1e-3f32, 0.05, 1.0, 30.0][(i / 32) % 4];
            rng.random_range(-1.0f32..1.0) * scale
        })
        .collect();
    // Degenerate blocks: constant, all zero, one nonzero.
    x[..32].fill(0.75);
    x[32..64].fill(0.0);
    x[64..96].fill(0.0);
    x[70] = -2.0;
    let src = dir.path().join("x.f32");
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(&src, bytes).unwrap();
    for ty in [
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
    ] {
        let dst = dir.path().join(format!("{}.bin", ty.name()));
        run_py(&[
            "quantize",
            ty.name(),
            src.to_str().unwrap(),
            dst.to_str().unwrap(),
        ]);
        let reference = std::fs::read(&dst).unwrap();
        let ours = quantize(ty, &x).unwrap();
        assert_eq!(ours.len(), reference.len(), "{ty:?}: encoded length");
        if let Some(k) = ours.iter().zip(&reference).position(|(a, b)| a != b) {
            let blk = k / ty.type_size();
            panic!(
                "{ty:?}: first differing byte {k} (block {blk}, byte {} of it): ours {:02x?} vs gguf {:02x?}",
                k % ty.type_size(),
                &ours[blk * ty.type_size()..(blk + 1) * ty.type_size()],
                &reference[blk * ty.type_size()..(blk + 1) * ty.type_size()]
            );
        }
    }
}
