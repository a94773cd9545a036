//! MatMul for every weight type: accuracy vs an f64 reference over the
//! dequantized weights, and bitwise determinism across thread counts,
//! instruction sets and batch composition.

mod cpu_ops_util;
use cpu_ops_util::*;

use quire::backend::cpu::ops::dequant::dequantize_row;
use quire::backend::cpu::{CpuBackend, Isa};
use quire::backend::{Backend, Mode, Op, QMatrix};
use quire::quant::GgmlType;

fn cols_for(ty: GgmlType) -> usize {
    match ty.block_size() {
        1 => 333,  // odd: exercises the 32-lane tail
        32 => 352, // 11 blocks: one AVX2 group of 8 plus a 3-block tail
        _ => 768,  // 3 superblocks
    }
}

fn matmul(be: &CpuBackend, w: QMatrix<'_>, x: &[f32], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * w.rows];
    be.run(
        Op::MatMul {
            w,
            x,
            n,
            out: &mut out,
        },
        Mode::Exact,
    )
    .unwrap();
    out
}

#[test]
fn matmul_accuracy_all_types() {
    let be = CpuBackend::new(Some(2)).unwrap();
    for (ti, ty) in GgmlType::WEIGHT_TYPES.into_iter().enumerate() {
        let mut r = rng(100 + ti as u64);
        let (m, k, n) = (37, cols_for(ty), 5);
        let data = rand_weights(&mut r, ty, m, k);
        let x = rand_vec(&mut r, n * k, 1.0);
        let w = QMatrix {
            ty,
            rows: m,
            cols: k,
            data: &data,
        };
        let got = matmul(&be, w, &x, n);
        let rb = ty.row_bytes(k).unwrap();
        let mut deq = vec![0f32; m * k];
        for j in 0..m {
            dequantize_row(
                ty,
                &data[j * rb..(j + 1) * rb],
                &mut deq[j * k..(j + 1) * k],
            )
            .unwrap();
        }
        let mut want = vec![0f64; n * m];
        for i in 0..n {
            for j in 0..m {
                want[i * m + j] = (0..k)
                    .map(|e| x[i * k + e] as f64 * deq[j * k + e] as f64)
                    .sum();
            }
        }
        let e = nmse(&got, &want);
        // Float weights: only f32 rounding. Quantized: 8-bit activation
        // quantization (relative step 1/254 per element) dominates.
        let bound = if ty.block_size() == 1 { 1e-10 } else { 2e-4 };
        println!("{ty:?}: nmse {e:.3e} (bound {bound:.0e})");
        assert!(e < bound, "{ty:?}: nmse {e:.3e} >= {bound:.0e}");
    }
}

#[test]
fn matmul_bitwise_threads_isa_batch() {
    let bes = backends();
    if CpuBackend::new(Some(1)).unwrap().isa() == Isa::Portable {
        println!("NOTE: no AVX2 on this machine; simd rows run the portable path");
    }
    for (ti, ty) in GgmlType::WEIGHT_TYPES.into_iter().enumerate() {
        let mut r = rng(200 + ti as u64);
        let (m, k) = (67, cols_for(ty));
        let data = rand_weights(&mut r, ty, m, k);
        let w = QMatrix {
            ty,
            rows: m,
            cols: k,
            data: &data,
        };
        // Batch of 7 random rows with the probe row at index 3.
        let batch = rand_vec(&mut r, 7 * k, 2.0);
        let probe = batch[3 * k..4 * k].to_vec();
        let reference = matmul(&bes[0].1, w, &batch, 7);
        for (label, be) in &bes {
            let full = matmul(be, w, &batch, 7);
            assert_eq!(
                bits(&full),
                bits(&reference),
                "{ty:?} {label}: batch differs"
            );
            let alone = matmul(be, w, &probe, 1);
            assert_eq!(
                bits(&alone),
                bits(&reference[3 * m..4 * m]),
                "{ty:?} {label}: row alone differs from row in batch"
            );
        }
    }
}

#[test]
fn matmul_errors_not_panics() {
    let be = CpuBackend::new(Some(1)).unwrap();
    let mut r = rng(7);
    let data = rand_weights(&mut r, GgmlType::Q4_1, 4, 64);
    let x = rand_vec(&mut r, 64, 1.0);
    let mut out = vec![0f32; 4];
    let w = QMatrix {
        ty: GgmlType::Q4_1,
        rows: 4,
        cols: 64,
        data: &data,
    };
    // x too short
    let e = be
        .run(
            Op::MatMul {
                w,
                x: &x[..63],
                n: 1,
                out: &mut out,
            },
            Mode::Exact,
        )
        .unwrap_err();
    assert!(format!("{e:#}").contains("mat_mul"), "{e:#}");
    // out wrong
    assert!(be
        .run(
            Op::MatMul {
                w,
                x: &x,
                n: 1,
                out: &mut out[..3]
            },
            Mode::Exact
        )
        .is_err());
    // weight bytes wrong
    let bad = QMatrix {
        data: &data[..data.len() - 1],
        ..w
    };
    assert!(be
        .run(
            Op::MatMul {
                w: bad,
                x: &x,
                n: 1,
                out: &mut out
            },
            Mode::Exact
        )
        .is_err());
    // cols not a block multiple
    let bad = QMatrix { cols: 48, ..w };
    assert!(be
        .run(
            Op::MatMul {
                w: bad,
                x: &x[..48],
                n: 1,
                out: &mut out
            },
            Mode::Exact
        )
        .is_err());
    // activation type as weight
    let bad = QMatrix {
        ty: GgmlType::Q8_K,
        rows: 1,
        cols: 256,
        data: &[0u8; 292],
    };
    let x2 = vec![0.5f32; 256];
    assert!(be
        .run(
            Op::MatMul {
                w: bad,
                x: &x2,
                n: 1,
                out: &mut out[..1]
            },
            Mode::Exact
        )
        .is_err());
}

/// Float weights with K a multiple of 32 take the in-register tree path;
/// it must equal the portable lane-by-lane tree.
#[test]
fn matmul_float_no_tail_bitwise() {
    let bes = backends();
    for (ti, ty) in [GgmlType::F32, GgmlType::F16, GgmlType::BF16]
        .into_iter()
        .enumerate()
    {
        let mut r = rng(400 + ti as u64);
        let (m, k) = (19, 320);
        let data = rand_weights(&mut r, ty, m, k);
        let w = QMatrix {
            ty,
            rows: m,
            cols: k,
            data: &data,
        };
        let x = rand_vec(&mut r, 3 * k, 1.0);
        let reference = matmul(&bes[0].1, w, &x, 3);
        for (label, be) in &bes {
            assert_eq!(
                bits(&matmul(be, w, &x, 3)),
                bits(&reference),
                "{ty:?} {label}"
            );
        }
        // And equals the canonical definition computed directly.
        let row0: Vec<f32> = (0..k)
            .map(|e| match ty {
                GgmlType::F32 => f32::from_le_bytes(data[4 * e..4 * e + 4].try_into().unwrap()),
                GgmlType::F16 => half::f16::from_le_bytes([data[2 * e], data[2 * e + 1]]).to_f32(),
                _ => half::bf16::from_le_bytes([data[2 * e], data[2 * e + 1]]).to_f32(),
            })
            .collect();
        let want = quire::backend::cpu::canon::dot32(&x[..k], &row0);
        assert_eq!(reference[0].to_bits(), want.to_bits(), "{ty:?} canonical");
    }
}

/// AVX2 activation quantization is bitwise the portable (canonical) one,
/// including exact .5 ties (rounded away from zero).
#[test]
fn activation_quantization_isa_bitwise() {
    use quire::backend::cpu::ops::dot::actq::Act32;
    let simd = CpuBackend::new(Some(1)).unwrap().isa();
    if simd == Isa::Portable {
        println!("SKIPPED: no AVX2 on this machine");
        return;
    }
    let mut r = rng(77);
    let k = 32 * 9;
    let n = 5;
    let mut x = rand_vec(&mut r, n * k, 3.0);
    // Ties: amax 127 -> d = 1, so x*id = x exactly; k + 0.5 must round away.
    for (i, v) in x[..32].iter_mut().enumerate() {
        *v = if i == 0 {
            127.0
        } else {
            (i as f32 - 16.0) + 0.5
        };
    }
    x[32..64].fill(0.0); // all-zero block: d = 0
    let a = Act32::quantize(false, simd, &x, n, k);
    let b = Act32::quantize(false, Isa::Portable, &x, n, k);
    assert_eq!(a.qs, b.qs);
    assert_eq!(a.sum, b.sum);
    assert_eq!(bits(&a.d), bits(&b.d));
    assert_eq!(bits(&a.s), bits(&b.s));
    assert_eq!(a.qs[1], -15); // i = 1: -14.5 -> -15
    assert_eq!(a.qs[31], 16); // 15.5 -> 16
    assert_eq!(a.d[1], 0.0);
}
