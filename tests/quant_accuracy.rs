//! Quantize -> dequantize accuracy per type on seeded random data, exactness
//! of the float types, and argument checking.

use quire::quant::{dequantize, quantize, GgmlType, QuantError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Roughly Gaussian values with per-row scale variation and a few outliers,
/// like real weights.
fn weights(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let g: f32 = (0..4).map(|_| rng.random_range(-1.0f32..1.0)).sum::<f32>() * 0.5;
        let scale = 0.02 * (1.0 + (i / 256) as f32 * 0.3);
        let outlier = if rng.random_range(0..100) == 0 {
            4.0
        } else {
            1.0
        };
        v.push(g * scale * outlier);
    }
    v
}

fn rel_rms(x: &[f32], y: &[f32]) -> f64 {
    let num: f64 = x.iter().zip(y).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
    let den: f64 = x.iter().map(|a| (*a as f64).powi(2)).sum();
    (num / den).sqrt()
}

/// Relative RMS error bound per type: about 1.4x the measured error of these
/// quantizers on this data (F16 2.0e-4, BF16 1.6e-3, Q8_0 6.6e-3, Q6_K
/// 2.2e-2, Q5_* 4.2e-2..5.4e-2, Q4_* 8.6e-2..1.1e-1); a rounding or layout
/// bug exceeds them by far.
fn bound(ty: GgmlType) -> f64 {
    match ty {
        GgmlType::F32 => 0.0,
        GgmlType::F16 => 3e-4,
        GgmlType::BF16 => 2.5e-3,
        GgmlType::Q8_0 => 9e-3,
        GgmlType::Q6_K => 3e-2,
        GgmlType::Q5_1 | GgmlType::Q5_K => 6e-2,
        GgmlType::Q5_0 => 7.5e-2,
        GgmlType::Q4_1 | GgmlType::Q4_K => 1.2e-1,
        GgmlType::Q4_0 => 1.5e-1,
        _ => 0.0,
    }
}

#[test]
fn quantize_dequantize_error_is_small() {
    let n = 256 * 16;
    let x = weights(n, 7);
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for ty in GgmlType::WEIGHT_TYPES {
        let q = quantize(ty, &x).unwrap();
        assert_eq!(q.len(), ty.row_bytes(n).unwrap(), "{ty:?} encoded size");
        let mut y = vec![f32::NAN; n];
        dequantize(ty, &q, &mut y).unwrap();
        assert!(y.iter().all(|v| v.is_finite()), "{ty:?}: non-finite output");
        let e = rel_rms(&x, &y);
        report.push(format!("{ty:?}: {e:.2e} (bound {:.1e})", bound(ty)));
        if e > bound(ty) {
            failures.push(format!(
                "{ty:?}: relative RMS error {e:.3e} > {:.1e}",
                bound(ty)
            ));
        }
    }
    println!("{}", report.join(", "));
    assert!(failures.is_empty(), "{failures:?}");
}

/// Data that a type represents exactly survives a round trip bit for bit.
#[test]
fn float_types_round_trip_exactly() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let x: Vec<f32> = (0..1000).map(|_| rng.random_range(-3.0f32..3.0)).collect();
    let q = quantize(GgmlType::F32, &x).unwrap();
    let mut y = vec![0f32; x.len()];
    dequantize(GgmlType::F32, &q, &mut y).unwrap();
    assert_eq!(x, y);
    for ty in [GgmlType::F16, GgmlType::BF16] {
        let q = quantize(ty, &x).unwrap();
        dequantize(ty, &q, &mut y).unwrap();
        // y is exactly representable, so quantizing it again is lossless.
        let q2 = quantize(ty, &y).unwrap();
        assert_eq!(q, q2, "{ty:?}");
        let mut z = vec![0f32; x.len()];
        dequantize(ty, &q2, &mut z).unwrap();
        assert_eq!(y, z, "{ty:?}");
    }
}

/// Re-encoding the dequantized values of the 32-blocks reproduces them: the
/// grid points of a block quantize onto themselves.
#[test]
fn block32_requantization_is_stable() {
    let x = weights(32 * 64, 3);
    for ty in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0] {
        let q = quantize(ty, &x).unwrap();
        let mut y = vec![0f32; x.len()];
        dequantize(ty, &q, &mut y).unwrap();
        let q2 = quantize(ty, &y).unwrap();
        let mut z = vec![0f32; x.len()];
        dequantize(ty, &q2, &mut z).unwrap();
        let e = rel_rms(&y, &z);
        assert!(e < 2e-3, "{ty:?}: requantization drift {e:.3e}");
    }
}

#[test]
fn zero_and_constant_blocks_are_finite() {
    for ty in GgmlType::WEIGHT_TYPES {
        for c in [0.0f32, 0.5, -1.25] {
            let x = vec![c; 256];
            let q = quantize(ty, &x).unwrap();
            let mut y = vec![f32::NAN; 256];
            dequantize(ty, &q, &mut y).unwrap();
            for v in &y {
                assert!(v.is_finite(), "{ty:?} const {c}: {v}");
                assert!(
                    (v - c).abs() <= 0.02 * c.abs() + 1e-6,
                    "{ty:?} const {c}: got {v}"
                );
            }
        }
    }
}

#[test]
fn bad_lengths_are_errors() {
    for ty in GgmlType::WEIGHT_TYPES {
        let b = ty.block_size();
        let good = vec![0u8; ty.type_size() * 2];
        let mut dst = vec![0f32; 2 * b];
        dequantize(ty, &good, &mut dst).unwrap();
        let r = dequantize(ty, &good[..good.len() - 1], &mut dst);
        assert!(
            matches!(r, Err(QuantError::BadLength { .. })),
            "{ty:?}: {r:?}"
        );
        let mut long = good.clone();
        long.push(0);
        let r = dequantize(ty, &long, &mut dst);
        assert!(
            matches!(r, Err(QuantError::BadLength { .. })),
            "{ty:?}: {r:?}"
        );
        if b > 1 {
            let mut odd = vec![0f32; b + 1];
            let r = dequantize(ty, &good, &mut odd);
            assert!(
                matches!(r, Err(QuantError::NotBlockMultiple { .. })),
                "{ty:?}: {r:?}"
            );
            let r = quantize(ty, &odd);
            assert!(
                matches!(r, Err(QuantError::NotBlockMultiple { .. })),
                "{ty:?}: {r:?}"
            );
            assert!(r.unwrap_err().to_string().contains("quantize"));
        }
    }
    for ty in [GgmlType::Q8_1, GgmlType::Q8_K] {
        let r = quantize(ty, &vec![1.0; 256]);
        assert!(
            matches!(r, Err(QuantError::Unsupported { .. })),
            "{ty:?}: {r:?}"
        );
    }
}
