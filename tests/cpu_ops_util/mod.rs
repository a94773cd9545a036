//! Shared helpers for the cpu op tests: seeded random data, weight
//! generation for every GGML type, NMSE.
#![allow(dead_code)]

use half::{bf16, f16};
use quire::backend::cpu::CpuBackend;
use quire::quant::GgmlType;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// n values uniform in [-scale, scale].
pub fn rand_vec(r: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| r.random_range(-scale..scale)).collect()
}

fn put_f16(b: &mut [u8], off: usize, v: f32) {
    b[off..off + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
}

/// Random weight matrix (rows, cols) of type `ty` with sane block scales.
pub fn rand_weights(r: &mut ChaCha8Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let n = rows * cols;
    match ty {
        GgmlType::F32 => rand_vec(r, n, 1.0)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        GgmlType::F16 => rand_vec(r, n, 1.0)
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
        GgmlType::BF16 => rand_vec(r, n, 1.0)
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
        _ => {
            let ts = ty.type_size();
            let nb = n / ty.block_size();
            let mut b: Vec<u8> = (0..nb * ts).map(|_| r.random::<u8>()).collect();
            for blk in b.chunks_exact_mut(ts) {
                let d = r.random_range(0.001f32..0.05);
                let m = r.random_range(-0.2f32..0.0);
                match ty {
                    GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => put_f16(blk, 0, d),
                    GgmlType::Q4_1 | GgmlType::Q5_1 => {
                        put_f16(blk, 0, d);
                        put_f16(blk, 2, m);
                    }
                    GgmlType::Q4_K | GgmlType::Q5_K => {
                        put_f16(blk, 0, d / 16.0);
                        put_f16(blk, 2, -m / 16.0);
                    }
                    GgmlType::Q6_K => put_f16(blk, 208, d / 16.0),
                    _ => panic!("not a weight type: {ty:?}"),
                }
            }
            b
        }
    }
}

/// Normalized mean squared error of `got` against `want`.
pub fn nmse(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let mut num = 0.0;
    let mut den = 0.0;
    for (&g, &w) in got.iter().zip(want) {
        num += (g as f64 - w) * (g as f64 - w);
        den += w * w;
    }
    num / den.max(1e-300)
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Backends to compare: (label, backend) for threads 1/2/4 and portable.
pub fn backends() -> Vec<(String, CpuBackend)> {
    let mut v = Vec::new();
    for t in [1, 2, 4] {
        v.push((format!("simd t{t}"), CpuBackend::new(Some(t)).unwrap()));
    }
    // Every op through the pool, however small.
    v.push((
        "simd t3 all-parallel".to_string(),
        CpuBackend::new(Some(3)).unwrap().with_par_min_work(0),
    ));
    for t in [1, 3] {
        v.push((
            format!("portable t{t}"),
            CpuBackend::with_options(Some(t), true)
                .unwrap()
                .with_par_min_work(0),
        ));
    }
    v
}
