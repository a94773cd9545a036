//! rms_norm, rope, swiglu, add, add_bias, get_rows, kv_write: f64
#![allow(clippy::needless_range_loop)] // index loops mirror the math
//! references, bitwise determinism, and errors for bad shapes.

mod cpu_ops_util;
use cpu_ops_util::*;

use half::f16;
use quire::backend::cpu::ops::dequant::dequantize_row;
use quire::backend::cpu::CpuBackend;
use quire::backend::{Backend, KvLayerMut, Mode, Op, QMatrix};
use quire::quant::GgmlType;

fn be() -> CpuBackend {
    CpuBackend::new(Some(2)).unwrap()
}

fn rms(be: &CpuBackend, x: &[f32], w: &[f32], dim: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    be.run(
        Op::RmsNorm {
            x,
            w,
            dim,
            eps: 1e-5,
            out: &mut out,
        },
        Mode::Exact,
    )
    .unwrap();
    out
}

#[test]
fn rms_norm_reference_and_bitwise() {
    let mut r = rng(10);
    for dim in [576usize, 100, 33] {
        let n = 7;
        let x = rand_vec(&mut r, n * dim, 3.0);
        let w = rand_vec(&mut r, dim, 1.0);
        let got = rms(&be(), &x, &w, dim);
        let mut want = vec![0f64; n * dim];
        for i in 0..n {
            let xr = &x[i * dim..(i + 1) * dim];
            let ms: f64 = xr.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / dim as f64;
            let s = 1.0 / (ms + 1e-5).sqrt();
            for d in 0..dim {
                want[i * dim + d] = xr[d] as f64 * s * w[d] as f64;
            }
        }
        let e = nmse(&got, &want);
        assert!(e < 1e-12, "rms_norm dim {dim}: nmse {e:.3e}");
        for (label, b) in backends() {
            assert_eq!(bits(&rms(&b, &x, &w, dim)), bits(&got), "rms_norm {label}");
            // Row alone equals row in batch.
            let alone = rms(&b, &x[3 * dim..4 * dim], &w, dim);
            assert_eq!(bits(&alone), bits(&got[3 * dim..4 * dim]), "{label}");
        }
    }
    let x = vec![1f32; 10];
    let mut out = vec![0f32; 10];
    assert!(be()
        .run(
            Op::RmsNorm {
                x: &x,
                w: &x[..4],
                dim: 4,
                eps: 1e-5,
                out: &mut out
            },
            Mode::Exact
        )
        .is_err());
}

fn rope_ref(x: &mut [f64], nh: usize, hd: usize, rd: usize, pos: &[u32], inv: &[f32], neox: bool) {
    for (i, &p) in pos.iter().enumerate() {
        for h in 0..nh {
            let base = (i * nh + h) * hd;
            for k in 0..rd / 2 {
                let ang = (p as f32 * inv[k]) as f64;
                let (a, b) = if neox {
                    (k, k + rd / 2)
                } else {
                    (2 * k, 2 * k + 1)
                };
                let (x0, x1) = (x[base + a], x[base + b]);
                x[base + a] = x0 * ang.cos() - x1 * ang.sin();
                x[base + b] = x0 * ang.sin() + x1 * ang.cos();
            }
        }
    }
}

#[test]
fn rope_reference_and_bitwise() {
    let mut r = rng(11);
    for (neox, hd, rd) in [
        (false, 64usize, 64usize),
        (true, 64, 64),
        (true, 80, 32),
        (false, 128, 96),
    ] {
        let (n, nh) = (6, 3);
        let pos: Vec<u32> = vec![0, 1, 17, 4095, 32768, 99_999];
        let inv: Vec<f32> = (0..rd / 2)
            .map(|i| 10000f32.powf(-2.0 * i as f32 / rd as f32))
            .collect();
        let x0 = rand_vec(&mut r, n * nh * hd, 1.0);
        let mut got = x0.clone();
        be().run(
            Op::Rope {
                x: &mut got,
                n_heads: nh,
                head_dim: hd,
                rope_dim: rd,
                positions: &pos,
                inv_freq: &inv,
                neox,
            },
            Mode::Exact,
        )
        .unwrap();
        let mut want: Vec<f64> = x0.iter().map(|&v| v as f64).collect();
        rope_ref(&mut want, nh, hd, rd, &pos, &inv, neox);
        let e = nmse(&got, &want);
        assert!(e < 1e-12, "rope neox {neox} hd {hd} rd {rd}: nmse {e:.3e}");
        for (label, b) in backends() {
            // Row 4 alone.
            let row = nh * hd;
            let mut alone = x0[4 * row..5 * row].to_vec();
            b.run(
                Op::Rope {
                    x: &mut alone,
                    n_heads: nh,
                    head_dim: hd,
                    rope_dim: rd,
                    positions: &pos[4..5],
                    inv_freq: &inv,
                    neox,
                },
                Mode::Exact,
            )
            .unwrap();
            assert_eq!(bits(&alone), bits(&got[4 * row..5 * row]), "rope {label}");
        }
    }
    let mut x = vec![0.5f32; 64];
    let inv = vec![1f32; 32];
    assert!(be()
        .run(
            Op::Rope {
                x: &mut x,
                n_heads: 1,
                head_dim: 64,
                rope_dim: 64,
                positions: &[1, 2],
                inv_freq: &inv,
                neox: false
            },
            Mode::Exact
        )
        .is_err());
    assert!(be()
        .run(
            Op::Rope {
                x: &mut x,
                n_heads: 1,
                head_dim: 64,
                rope_dim: 64,
                positions: &[1],
                inv_freq: &inv[..31],
                neox: false
            },
            Mode::Exact
        )
        .is_err());
}

#[test]
fn swiglu_add_add_bias() {
    let mut r = rng(12);
    let n = 40_000; // spans several parallel chunks
    let g = rand_vec(&mut r, n, 8.0);
    let u = rand_vec(&mut r, n, 2.0);
    let mut out = vec![0f32; n];
    be().run(
        Op::SwiGlu {
            gate: &g,
            up: &u,
            out: &mut out,
        },
        Mode::Exact,
    )
    .unwrap();
    let want: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(&a, &b)| a as f64 / (1.0 + (-(a as f64)).exp()) * b as f64)
        .collect();
    let e = nmse(&out, &want);
    assert!(e < 1e-12, "swiglu nmse {e:.3e}");
    // Bitwise across ISA / threads, with an odd length (SIMD tail).
    for (label, b) in backends() {
        let mut o2 = vec![0f32; n - 5];
        b.run(
            Op::SwiGlu {
                gate: &g[5..],
                up: &u[5..],
                out: &mut o2,
            },
            Mode::Exact,
        )
        .unwrap();
        assert_eq!(bits(&o2), bits(&out[5..]), "swiglu {label}");
    }
    assert!(be()
        .run(
            Op::SwiGlu {
                gate: &g,
                up: &u[1..],
                out: &mut out
            },
            Mode::Exact
        )
        .is_err());

    let mut x = g.clone();
    be().run(Op::Add { x: &mut x, y: &u }, Mode::Exact).unwrap();
    for i in 0..n {
        assert_eq!(x[i], g[i] + u[i]);
    }
    assert!(be()
        .run(
            Op::Add {
                x: &mut x,
                y: &u[1..]
            },
            Mode::Exact
        )
        .is_err());

    let dim = 576;
    let bias = rand_vec(&mut r, dim, 1.0);
    let mut x = g[..dim * 50].to_vec();
    be().run(
        Op::AddBias {
            x: &mut x,
            bias: &bias,
        },
        Mode::Exact,
    )
    .unwrap();
    for i in 0..dim * 50 {
        assert_eq!(x[i], g[i] + bias[i % dim]);
    }
    assert!(be()
        .run(
            Op::AddBias {
                x: &mut x[..dim + 1],
                bias: &bias
            },
            Mode::Exact
        )
        .is_err());
}

#[test]
fn get_rows_all_types() {
    for (ti, ty) in GgmlType::WEIGHT_TYPES.into_iter().enumerate() {
        let mut r = rng(300 + ti as u64);
        let cols = if ty.block_size() == 256 { 512 } else { 64 };
        let rows = 9;
        let data = rand_weights(&mut r, ty, rows, cols);
        let ids = [3u32, 0, 8, 3];
        let mut out = vec![0f32; ids.len() * cols];
        let t = QMatrix {
            ty,
            rows,
            cols,
            data: &data,
        };
        be().run(
            Op::GetRows {
                table: t,
                ids: &ids,
                out: &mut out,
            },
            Mode::Exact,
        )
        .unwrap();
        let rb = ty.row_bytes(cols).unwrap();
        for (i, &id) in ids.iter().enumerate() {
            let mut want = vec![0f32; cols];
            let id = id as usize;
            dequantize_row(ty, &data[id * rb..(id + 1) * rb], &mut want).unwrap();
            assert_eq!(bits(&out[i * cols..(i + 1) * cols]), bits(&want), "{ty:?}");
        }
        assert!(out.iter().all(|v| v.is_finite()) && out.iter().any(|&v| v != 0.0));
        let err = be()
            .run(
                Op::GetRows {
                    table: t,
                    ids: &[9],
                    out: &mut out[..cols],
                },
                Mode::Exact,
            )
            .unwrap_err();
        assert!(format!("{err:#}").contains("get_rows"));
    }
}

/// Independent decoding check: hand-built blocks with known values.
#[test]
fn dequant_known_blocks() {
    // Q4_0: d = 0.5, nibbles j -> element j = (j & 15) - 8 for the low half.
    let mut b = vec![0u8; 18];
    b[..2].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
    for j in 0..16 {
        b[2 + j] = (j as u8) | (((15 - j) as u8) << 4);
    }
    let mut y = vec![0f32; 32];
    dequantize_row(GgmlType::Q4_0, &b, &mut y).unwrap();
    for j in 0..16 {
        assert_eq!(y[j], (j as f32 - 8.0) * 0.5);
        assert_eq!(y[j + 16], ((15 - j) as f32 - 8.0) * 0.5);
    }
    // Q8_0: d = 0.25, q = j - 16.
    let mut b = vec![0u8; 34];
    b[..2].copy_from_slice(&f16::from_f32(0.25).to_bits().to_le_bytes());
    for j in 0..32 {
        b[2 + j] = (j as i8 - 16) as u8;
    }
    dequantize_row(GgmlType::Q8_0, &b, &mut y).unwrap();
    for j in 0..32 {
        assert_eq!(y[j], (j as f32 - 16.0) * 0.25);
    }
    // Q5_1: d = 1, m = -2, qh bit j set for odd j, nibble = j % 16.
    let mut b = vec![0u8; 24];
    b[..2].copy_from_slice(&f16::from_f32(1.0).to_bits().to_le_bytes());
    b[2..4].copy_from_slice(&f16::from_f32(-2.0).to_bits().to_le_bytes());
    let qh: u32 = 0xAAAA_AAAA;
    b[4..8].copy_from_slice(&qh.to_le_bytes());
    for j in 0..16 {
        b[8 + j] = (j as u8) | ((j as u8) << 4);
    }
    dequantize_row(GgmlType::Q5_1, &b, &mut y).unwrap();
    for e in 0..32 {
        let want = (e % 16) as f32 + if e % 2 == 1 { 16.0 } else { 0.0 } - 2.0;
        assert_eq!(y[e], want, "q5_1 element {e}");
    }
}

#[test]
fn kv_write_rounds_and_validates() {
    let mut r = rng(13);
    let (bs, nkv, hd, nblk) = (16usize, 3usize, 64usize, 4usize);
    let mut kc = vec![f16::ZERO; nblk * bs * nkv * hd];
    let mut vc = kc.clone();
    let slots = [5u32, 63, 17];
    let k = rand_vec(&mut r, 3 * nkv * hd, 4.0);
    let v = rand_vec(&mut r, 3 * nkv * hd, 4.0);
    be().run(
        Op::KvWrite {
            k: &k,
            v: &v,
            slots: &slots,
            cache: KvLayerMut {
                k: &mut kc,
                v: &mut vc,
                block_size: bs,
                n_kv_heads: nkv,
                head_dim: hd,
                ty: quire::backend::KvType::F16,
            },
        },
        Mode::Exact,
    )
    .unwrap();
    let row = nkv * hd;
    for (i, &s) in slots.iter().enumerate() {
        for e in 0..row {
            assert_eq!(kc[s as usize * row + e], f16::from_f32(k[i * row + e]));
            assert_eq!(vc[s as usize * row + e], f16::from_f32(v[i * row + e]));
        }
    }
    let written: usize = kc.iter().filter(|x| **x != f16::ZERO).count();
    assert!(written <= 3 * row && written > 3 * row - 10);
    let err = be()
        .run(
            Op::KvWrite {
                k: &k,
                v: &v,
                slots: &[1, 2, 64],
                cache: KvLayerMut {
                    k: &mut kc,
                    v: &mut vc,
                    block_size: bs,
                    n_kv_heads: nkv,
                    head_dim: hd,
                    ty: quire::backend::KvType::F16,
                },
            },
            Mode::Exact,
        )
        .unwrap_err();
    assert!(format!("{err:#}").contains("kv_write"));
    assert!(be()
        .run(
            Op::KvWrite {
                k: &k[1..],
                v: &v,
                slots: &slots,
                cache: KvLayerMut {
                    k: &mut kc,
                    v: &mut vc,
                    block_size: bs,
                    n_kv_heads: nkv,
                    head_dim: hd,
                    ty: quire::backend::KvType::F16,
                },
            },
            Mode::Exact,
        )
        .is_err());
}

/// The backend's block decoding (used by the dot kernels' reference and by
/// get_rows) equals `quire::quant::dequantize` (checked against gguf-py)
/// bit for bit, for every weight type.
#[test]
fn dequant_matches_quant_module() {
    for (ti, ty) in GgmlType::WEIGHT_TYPES.into_iter().enumerate() {
        let mut r = rng(600 + ti as u64);
        let cols = if ty.block_size() == 256 { 768 } else { 96 };
        let data = rand_weights(&mut r, ty, 1, cols);
        let mut ours = vec![0f32; cols];
        let mut theirs = vec![1f32; cols];
        dequantize_row(ty, &data, &mut ours).unwrap();
        quire::quant::dequantize(ty, &data, &mut theirs).unwrap();
        assert_eq!(bits(&ours), bits(&theirs), "{ty:?}");
    }
}

#[test]
fn select_rows_copies_rows_and_checks_indices() {
    let be = be();
    let (n, dim) = (5usize, 7usize);
    let x: Vec<f32> = (0..n * dim).map(|i| (i as f32) * 0.37 - 3.0).collect();
    let rows = [4u32, 0, 4, 2];
    let mut out = vec![0f32; rows.len() * dim];
    be.run(
        Op::SelectRows {
            x: &x,
            dim,
            rows: &rows,
            out: &mut out,
        },
        Mode::Exact,
    )
    .unwrap();
    for (i, &r) in rows.iter().enumerate() {
        let r = r as usize;
        assert_eq!(&out[i * dim..(i + 1) * dim], &x[r * dim..(r + 1) * dim]);
    }
    let e = be
        .run(
            Op::SelectRows {
                x: &x,
                dim,
                rows: &[5],
                out: &mut out[..dim],
            },
            Mode::Exact,
        )
        .unwrap_err();
    assert!(format!("{e:#}").contains("select_rows"), "{e:#}");
}

#[test]
fn kv_write_rejects_a_slot_written_twice() {
    let be = be();
    let (nkv, hd, bs, nblk) = (2usize, 8usize, 4usize, 3usize);
    let mut kc = vec![f16::from_f32(0.5); nblk * bs * nkv * hd];
    let mut vc = kc.clone();
    let k = vec![1.0f32; 2 * nkv * hd];
    let e = be
        .run(
            Op::KvWrite {
                k: &k,
                v: &k,
                slots: &[3, 3],
                cache: KvLayerMut {
                    k: &mut kc,
                    v: &mut vc,
                    block_size: bs,
                    n_kv_heads: nkv,
                    head_dim: hd,
                    ty: quire::backend::KvType::F16,
                },
            },
            Mode::Exact,
        )
        .unwrap_err();
    assert!(format!("{e:#}").contains("written by two rows"), "{e:#}");
    // Nothing was written.
    assert!(kc.iter().all(|&x| x == f16::from_f32(0.5)));
}
