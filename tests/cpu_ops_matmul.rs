//! MatMul for every weight type: accuracy vs an f64 reference over the
//! dequantized weights, and bitwise determinism across thread counts,
//! instruction sets and batch composition.

mod cpu_ops_util;
use cpu_ops_util::*;

use quire::backend::cpu::ops::dequant::dequantize_row;
use quire::backend::cpu::{CpuBackend, Isa};
use quire::backend::{Backend, Mode, Op, QMatrix};
use quire::quant::GgmlType;
use rand::Rng;

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
        // Float weights: only f32 rounding. Quantized: 16-bit activation
        // quantization (relative step 1/65534 of the block max) dominates;
        // measured ~2e-10 for every type (8-bit activations gave ~1e-5).
        let bound = if ty.block_size() == 1 { 1e-10 } else { 1e-9 };
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

/// Every tail length of the 8-block AVX2 groups (1..=17 blocks), all
/// legacy types, tiles of 1..=9 rows: bitwise equal across backends.
#[test]
fn matmul_q32_group_tails_bitwise() {
    let bes = backends();
    for (ti, ty) in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
    ]
    .into_iter()
    .enumerate()
    {
        for nb in 1..=17 {
            let mut r = rng(300 + 32 * ti as u64 + nb as u64);
            let (m, k) = (5, 32 * nb);
            let data = rand_weights(&mut r, ty, m, k);
            let w = QMatrix {
                ty,
                rows: m,
                cols: k,
                data: &data,
            };
            let n = 1 + nb % 9;
            let x = rand_vec(&mut r, n * k, 1.5);
            let reference = matmul(&bes[0].1, w, &x, n);
            for (label, be) in &bes {
                assert_eq!(
                    bits(&matmul(be, w, &x, n)),
                    bits(&reference),
                    "{ty:?} nb {nb} {label}"
                );
            }
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
    // Ties: amax 32767 -> d = 1, so x*id = x exactly; k + 0.5 must round away.
    for (i, v) in x[..32].iter_mut().enumerate() {
        *v = if i == 0 {
            32767.0
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
    use quire::backend::cpu::ops::dot::actq::pair_pos;
    assert_eq!(a.qs[pair_pos(0, 1)], -15); // i = 1: -14.5 -> -15
    assert_eq!(a.qs[pair_pos(0, 31)], 16); // 15.5 -> 16
    assert_eq!(a.d[1], 0.0);
    assert_eq!(a.qs[pair_pos(0, 0)], 32767);
    // Odd block count: the last pair's missing partner is zero.
    let a = Act32::quantize(false, simd, &x[..3 * 32], 1, 96);
    assert_eq!(a.qs.len(), 128);
    assert!((0..32).all(|i| a.qs[pair_pos(3, i)] == 0));
}

/// Same for the 256-element (K-quant) activation blocks, with NaN/inf
/// elements (NaN is ignored by the max and quantizes to 0).
#[test]
fn activation_quantization_k_isa_bitwise() {
    use quire::backend::cpu::ops::dot::actq::ActK;
    let simd = CpuBackend::new(Some(1)).unwrap().isa();
    if simd == Isa::Portable {
        println!("SKIPPED: no AVX2 on this machine");
        return;
    }
    let mut r = rng(78);
    let (n, k) = (4, 768);
    let mut x = rand_vec(&mut r, n * k, 5.0);
    x[256..512].fill(0.0);
    x[3] = f32::NAN;
    x[k + 7] = f32::INFINITY;
    x[2 * k + 300] = 1e-42; // subnormal block max
    x[2 * k + 256..2 * k + 300].fill(0.0);
    x[2 * k + 301..2 * k + 512].fill(0.0);
    let a = ActK::quantize(false, simd, &x, n, k);
    let b = ActK::quantize(false, Isa::Portable, &x, n, k);
    assert_eq!(a.qs, b.qs);
    assert_eq!(a.bsum, b.bsum);
    assert_eq!(bits(&a.d), bits(&b.d));
    assert_eq!(a.qs[3], 0);
    assert!(a.qs.iter().any(|&q| q.abs() == 32767));
}

/// Sign and extreme-magnitude inputs: activations all ±1.0 (so q = ±32767,
/// the largest activation integer), weights at the extremes of each type's
/// integer range with maximal sub-block scales. Checked bitwise against the
/// canonical definition computed here with i64 integer sums, and against
/// an f64 evaluation (which would expose any i32 wrap-around).
#[test]
fn matmul_overflow_edges_exact() {
    use quire::backend::cpu::canon::tree8;
    use quire::backend::cpu::ops::dequant::{
        k_scale_min, q4_0_ints, q4_1_ints, q4_k_ints, q5_0_ints, q5_1_ints, q5_k_ints, q6_k_ints,
        q8_0_ints,
    };
    let f16b = |v: f32| half::f16::from_f32(v).to_le_bytes();
    let types = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];
    for (ti, ty) in types.into_iter().enumerate() {
        let mut r = rng(900 + ti as u64);
        let k = if ty.block_size() == 32 {
            32 * 11
        } else {
            256 * 9
        };
        let ts = ty.type_size();
        let nb = k / ty.block_size();
        // Row 0: every weight integer at its most negative (or largest
        // unsigned) value; row 1: random extremes; row 2: random bytes.
        let m = 3;
        let mut data = vec![0u8; m * nb * ts];
        for j in 0..m {
            for b in 0..nb {
                let blk = &mut data[(j * nb + b) * ts..(j * nb + b + 1) * ts];
                match j {
                    0 => match ty {
                        // Q4_0/Q5_0: nibble 0 -> -8 / -16; Q4_1/Q5_1: 15 / 31.
                        GgmlType::Q4_0 | GgmlType::Q5_0 => blk.fill(0),
                        GgmlType::Q8_0 => blk.fill(0x80), // -128
                        GgmlType::Q6_K => {
                            // q6 = 0 -> -32 everywhere; scales -128.
                            blk.fill(0);
                            blk[192..208].fill(0x80);
                        }
                        _ => blk.fill(0xFF), // all 15/31, scales/mins 63
                    },
                    1 => {
                        for v in blk.iter_mut() {
                            *v = if r.random_range(0..2) == 0 {
                                0x00
                            } else {
                                0xFF
                            };
                        }
                        if ty == GgmlType::Q8_0 {
                            for v in blk[2..].iter_mut() {
                                *v = if *v == 0 { 0x80 } else { 0x7F };
                            }
                        }
                        if ty == GgmlType::Q6_K {
                            for v in blk[192..208].iter_mut() {
                                *v = if r.random_range(0..2) == 0 {
                                    0x80
                                } else {
                                    0x7F
                                };
                            }
                        }
                        if matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K) {
                            blk[4..16].fill(0xFF);
                        }
                    }
                    _ => r.fill(&mut blk[..]),
                }
                // Finite, moderate scales (f16 at offset 0, 2; Q6_K at 208).
                let (d0, d1) = (r.random_range(0.5f32..2.0), r.random_range(0.5f32..2.0));
                if ty == GgmlType::Q6_K {
                    blk[208..210].copy_from_slice(&f16b(d0));
                } else {
                    blk[0..2].copy_from_slice(&f16b(d0));
                    if matches!(
                        ty,
                        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K
                    ) {
                        blk[2..4].copy_from_slice(&f16b(d1));
                    }
                }
            }
        }
        // Activations: all +1, all -1, random signs.
        let n = 3;
        let mut x = vec![1f32; n * k];
        x[k..2 * k].fill(-1.0);
        for v in x[2 * k..].iter_mut() {
            *v = if r.random_range(0..2) == 0 { -1.0 } else { 1.0 };
        }
        let qa: Vec<i64> = x
            .iter()
            .map(|&v| if v > 0.0 { 32767 } else { -32767 })
            .collect();
        let da = 1.0f32 / 32767.0;
        let w = QMatrix {
            ty,
            rows: m,
            cols: k,
            data: &data,
        };
        let mut max_abs_int = 0i64;
        let mut want = vec![0f32; n * m];
        let mut want64 = vec![0f64; n * m];
        for i in 0..n {
            let q = &qa[i * k..(i + 1) * k];
            for j in 0..m {
                let mut lane = [0f32; 8];
                let mut acc64 = 0f64;
                for b in 0..nb {
                    let blk = &data[(j * nb + b) * ts..(j * nb + b + 1) * ts];
                    let h = |o: usize| half::f16::from_le_bytes([blk[o], blk[o + 1]]).to_f32();
                    let (t, t64) = if ty.block_size() == 32 {
                        let mut wi = [0i8; 32];
                        match ty {
                            GgmlType::Q4_0 => q4_0_ints(blk, &mut wi),
                            GgmlType::Q4_1 => q4_1_ints(blk, &mut wi),
                            GgmlType::Q5_0 => q5_0_ints(blk, &mut wi),
                            GgmlType::Q5_1 => q5_1_ints(blk, &mut wi),
                            _ => q8_0_ints(blk, &mut wi),
                        }
                        let qb = &q[32 * b..32 * b + 32];
                        let ii: i64 = (0..32).map(|e| wi[e] as i64 * qb[e]).sum();
                        let s: i64 = qb.iter().sum();
                        max_abs_int = max_abs_int.max(ii.abs());
                        let mut t = (h(0) * da) * ii as f32;
                        let mut t64 = h(0) as f64 * da as f64 * ii as f64;
                        if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                            t += h(2) * (da * s as f32);
                            t64 += h(2) as f64 * da as f64 * s as f64;
                        }
                        (t, t64)
                    } else {
                        let qb = &q[256 * b..256 * b + 256];
                        if ty == GgmlType::Q6_K {
                            let mut wi = [0i8; 256];
                            q6_k_ints(blk, &mut wi);
                            let a: i64 = (0..16)
                                .map(|g| {
                                    let ig: i64 =
                                        (16 * g..16 * g + 16).map(|e| wi[e] as i64 * qb[e]).sum();
                                    (blk[192 + g] as i8) as i64 * ig
                                })
                                .sum();
                            max_abs_int = max_abs_int.max(a.abs());
                            let dd = h(208);
                            ((dd * da) * a as f32, dd as f64 * da as f64 * a as f64)
                        } else {
                            let mut wu = [0u8; 256];
                            if ty == GgmlType::Q4_K {
                                q4_k_ints(blk, &mut wu);
                            } else {
                                q5_k_ints(blk, &mut wu);
                            }
                            let (mut a, mut bb) = (0i64, 0i64);
                            for sj in 0..8 {
                                let (sc, mn) = k_scale_min(sj, &blk[4..16]);
                                let ij: i64 =
                                    (32 * sj..32 * sj + 32).map(|e| wu[e] as i64 * qb[e]).sum();
                                let s: i64 = qb[32 * sj..32 * sj + 32].iter().sum();
                                a += sc as i64 * ij;
                                bb += mn as i64 * s;
                            }
                            max_abs_int = max_abs_int.max(a.abs());
                            let (dd, dm) = (h(0), h(2));
                            (
                                ((dd * da) * a as f32) - ((dm * da) * bb as f32),
                                dd as f64 * da as f64 * a as f64
                                    - dm as f64 * da as f64 * bb as f64,
                            )
                        }
                    };
                    lane[b % 8] += t;
                    acc64 += t64;
                }
                want[i * m + j] = tree8(lane);
                want64[i * m + j] = acc64;
            }
        }
        if ty.block_size() == 256 {
            // The extreme rows really exceed the i32 range.
            assert!(max_abs_int > i32::MAX as i64, "{ty:?}: {max_abs_int}");
        } else {
            // Row 0 reaches the largest block sum: 32 * max|w| * 32767.
            let wmax = match ty {
                GgmlType::Q4_0 => 8,
                GgmlType::Q4_1 => 15,
                GgmlType::Q5_0 => 16,
                GgmlType::Q5_1 => 31,
                _ => 128,
            };
            assert_eq!(max_abs_int, 32 * wmax * 32767, "{ty:?}");
        }
        for (label, be) in &backends() {
            let got = matmul(be, w, &x, n);
            assert_eq!(bits(&got), bits(&want), "{ty:?} {label}: not canonical");
        }
        let got = matmul(&backends()[0].1, w, &x, n);
        for (g, w64) in got.iter().zip(&want64) {
            let rel = (*g as f64 - w64).abs() / w64.abs().max(1e-3);
            assert!(rel < 1e-5, "{ty:?}: got {g}, f64 {w64} (rel {rel:.2e})");
        }
        println!("{ty:?}: max |integer sum| {max_abs_int}");
    }
}

/// `MatMuls` with `glu`: the bits of `MatMuls` then `SwiGlu`; a SwiGlu of
/// the wrong shape, or on an adding job, is an error naming it.
#[test]
fn mat_muls_glu_is_mat_muls_then_swiglu() {
    use quire::backend::MatJob;
    let be = CpuBackend::new(Some(1)).unwrap();
    let mut r = rng(11);
    let (m, k) = (48, 64);
    let wg = rand_weights(&mut r, GgmlType::Q4_0, m, k);
    let wu = rand_weights(&mut r, GgmlType::Q4_0, m, k);
    let q = |data| QMatrix {
        ty: GgmlType::Q4_0,
        rows: m,
        cols: k,
        data,
    };
    let x = rand_vec(&mut r, k, 2.0);
    let run = |h: &mut [f32], add: bool| -> anyhow::Result<(Vec<f32>, Vec<f32>)> {
        let (mut g, mut u) = (vec![0.5f32; m], vec![0.25f32; m]);
        be.run(
            Op::MatMuls {
                x: &x,
                n: 1,
                jobs: vec![
                    MatJob {
                        w: q(&wg),
                        out: &mut g,
                        add: false,
                    },
                    MatJob {
                        w: q(&wu),
                        out: &mut u,
                        add,
                    },
                ],
                norm: None,
                next_norm: None,
                glu: Some(h),
            },
            Mode::Exact,
        )?;
        Ok((g, u))
    };
    let mut h = vec![0f32; m];
    let (g, u) = run(&mut h, false).unwrap();
    let mut want = vec![0f32; m];
    be.run(
        Op::SwiGlu {
            gate: &g,
            up: &u,
            out: &mut want,
        },
        Mode::Exact,
    )
    .unwrap();
    assert_eq!(bits(&h), bits(&want));
    assert!(h.iter().any(|v| *v != 0.0));
    let e = run(&mut vec![0f32; m - 1], false).unwrap_err();
    assert!(format!("{e:#}").contains("glu"), "{e:#}");
    let e = run(&mut vec![0f32; m], true).unwrap_err();
    assert!(format!("{e:#}").contains("glu"), "{e:#}");
}
