//! Portable quantized dot kernels: the readable statement of the canonical
//! block arithmetic (see `canon.rs`).

use super::actq::pair_pos;
use super::{Act32Row, ActKRow};
use crate::backend::cpu::canon::tree8;
use crate::backend::cpu::ops::dequant::{
    f16_at, k_scale_min, q4_0_ints, q4_1_ints, q4_k_ints, q5_0_ints, q5_1_ints, q5_k_ints,
    q6_k_ints, q8_0_ints,
};
use crate::quant::GgmlType;

/// 32-block legacy types. w: nb blocks of `ty`; a: nb activation blocks.
pub fn dot_q32(ty: GgmlType, w: &[u8], a: Act32Row<'_>) -> f32 {
    let ts = ty.type_size();
    let nb = a.d.len();
    let mut lane = [0f32; 8];
    let mut wi = [0i8; 32];
    let has_min = matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1);
    for b in 0..nb {
        let blk = &w[b * ts..(b + 1) * ts];
        match ty {
            GgmlType::Q4_0 => q4_0_ints(blk, &mut wi),
            GgmlType::Q4_1 => q4_1_ints(blk, &mut wi),
            GgmlType::Q5_0 => q5_0_ints(blk, &mut wi),
            GgmlType::Q5_1 => q5_1_ints(blk, &mut wi),
            _ => q8_0_ints(blk, &mut wi),
        }
        let qa: [i16; 32] = std::array::from_fn(|i| a.qs[pair_pos(b, i)]);
        // Exact: |w| <= 128, |q| <= 32767, so |isum| <= 32 * 128 * 32767 < 2^31.
        let mut isum = 0i32;
        for i in 0..32 {
            isum += wi[i] as i32 * qa[i] as i32;
        }
        let dw = f16_at(blk, 0);
        let mut t = (dw * a.d[b]) * isum as f32;
        if has_min {
            t += f16_at(blk, 2) * a.s[b];
        }
        lane[b % 8] += t;
    }
    tree8(lane)
}

/// K-quant types (Q4_K, Q5_K, Q6_K). w: nb superblocks; a: nb Q8_K blocks.
pub fn dot_qk(ty: GgmlType, w: &[u8], a: ActKRow<'_>) -> f32 {
    let ts = ty.type_size();
    let nb = a.d.len();
    let mut lane = [0f32; 8];
    let mut u = [0u8; 256];
    let mut s = [0i8; 256];
    for b in 0..nb {
        let blk = &w[b * ts..(b + 1) * ts];
        let qa = &a.qs[256 * b..256 * b + 256];
        let bsum = &a.bsum[16 * b..16 * b + 16];
        let t = if ty == GgmlType::Q6_K {
            q6_k_ints(blk, &mut s);
            // I_g exact in i32 (|I_g| <= 16 * 32 * 32767); A in i64.
            let mut acc = 0i64;
            for g in 0..16 {
                let mut ig = 0i32;
                for i in 16 * g..16 * g + 16 {
                    ig += s[i] as i32 * qa[i] as i32;
                }
                acc += (blk[192 + g] as i8) as i64 * ig as i64;
            }
            (f16_at(blk, 208) * a.d[b]) * acc as f32
        } else {
            if ty == GgmlType::Q4_K {
                q4_k_ints(blk, &mut u)
            } else {
                q5_k_ints(blk, &mut u)
            }
            // I_j exact in i32 (|I_j| <= 32 * 31 * 32767); A, B in i64.
            let (mut am, mut bm) = (0i64, 0i64);
            for j in 0..8 {
                let (sc, m) = k_scale_min(j, &blk[4..16]);
                let mut ij = 0i32;
                for i in 32 * j..32 * j + 32 {
                    ij += u[i] as i32 * qa[i] as i32;
                }
                am += sc as i64 * ij as i64;
                bm += m as i64 * (bsum[2 * j] as i64 + bsum[2 * j + 1] as i64);
            }
            let d = f16_at(blk, 0);
            let dmin = f16_at(blk, 2);
            ((d * a.d[b]) * am as f32) - ((dmin * a.d[b]) * bm as f32)
        };
        lane[b % 8] += t;
    }
    tree8(lane)
}
