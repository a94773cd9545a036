//! GGML block decoding (weights -> integers + scales, and -> f32).
//! Shared by get_rows, the portable dot kernels and the tests.

use crate::quant::GgmlType;
use anyhow::{bail, ensure, Result};
use half::{bf16, f16};

/// f16 at byte offset `off` (little endian), converted exactly to f32.
#[inline]
pub fn f16_at(b: &[u8], off: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

/// Signed weight integers of a Q4_0 block (nib - 8). blk: 18 bytes.
#[inline]
pub fn q4_0_ints(blk: &[u8], w: &mut [i8; 32]) {
    for j in 0..16 {
        w[j] = (blk[2 + j] & 0xF) as i8 - 8;
        w[j + 16] = (blk[2 + j] >> 4) as i8 - 8;
    }
}

/// Unsigned weight integers of a Q4_1 block. blk: 20 bytes.
#[inline]
pub fn q4_1_ints(blk: &[u8], w: &mut [i8; 32]) {
    for j in 0..16 {
        w[j] = (blk[4 + j] & 0xF) as i8;
        w[j + 16] = (blk[4 + j] >> 4) as i8;
    }
}

/// 5-bit weight integers (unsigned, 0..31) given qh (u32) and 16 qs bytes.
#[inline]
fn q5_ints(qh: u32, qs: &[u8], w: &mut [i8; 32]) {
    for j in 0..16 {
        let h0 = (((qh >> j) << 4) & 0x10) as u8;
        let h1 = ((qh >> (j + 12)) & 0x10) as u8;
        w[j] = ((qs[j] & 0xF) | h0) as i8;
        w[j + 16] = ((qs[j] >> 4) | h1) as i8;
    }
}

/// Signed Q5_0 integers (q5 - 16). blk: 22 bytes.
#[inline]
pub fn q5_0_ints(blk: &[u8], w: &mut [i8; 32]) {
    let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
    q5_ints(qh, &blk[6..22], w);
    for v in w.iter_mut() {
        *v -= 16;
    }
}

/// Unsigned Q5_1 integers. blk: 24 bytes.
#[inline]
pub fn q5_1_ints(blk: &[u8], w: &mut [i8; 32]) {
    let qh = u32::from_le_bytes([blk[4], blk[5], blk[6], blk[7]]);
    q5_ints(qh, &blk[8..24], w);
}

/// Q8_0 integers. blk: 34 bytes.
#[inline]
pub fn q8_0_ints(blk: &[u8], w: &mut [i8; 32]) {
    for j in 0..32 {
        w[j] = blk[2 + j] as i8;
    }
}

/// 6-bit (scale, min) of sub-block j (0..8) from the 12 K-quant scale bytes.
#[inline]
pub fn k_scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Q4_K superblock (144 bytes) -> 256 unsigned ints in element order.
#[inline]
pub fn q4_k_ints(blk: &[u8], w: &mut [u8; 256]) {
    let qs = &blk[16..144];
    for j in 0..4 {
        for l in 0..32 {
            w[64 * j + l] = qs[32 * j + l] & 0xF;
            w[64 * j + 32 + l] = qs[32 * j + l] >> 4;
        }
    }
}

/// Q5_K superblock (176 bytes) -> 256 unsigned ints (0..31).
#[inline]
pub fn q5_k_ints(blk: &[u8], w: &mut [u8; 256]) {
    let qh = &blk[16..48];
    let qs = &blk[48..176];
    for j in 0..4 {
        for l in 0..32 {
            let lo = qs[32 * j + l] & 0xF;
            let hi = qs[32 * j + l] >> 4;
            w[64 * j + l] = lo | (((qh[l] >> (2 * j)) & 1) << 4);
            w[64 * j + 32 + l] = hi | (((qh[l] >> (2 * j + 1)) & 1) << 4);
        }
    }
}

/// Q6_K superblock (210 bytes) -> 256 signed ints (q6 - 32).
#[inline]
pub fn q6_k_ints(blk: &[u8], w: &mut [i8; 256]) {
    let ql = &blk[0..128];
    let qh = &blk[128..192];
    for h in 0..2 {
        let (ql, qh) = (&ql[64 * h..], &qh[32 * h..]);
        let y = &mut w[128 * h..];
        for l in 0..32 {
            y[l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
            y[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            y[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            y[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
}

/// Dequantizes one row. src: `ty.row_bytes(dst.len())` bytes; dst: (cols,).
/// Canonical: legacy `y = d * w` or `y = (d * w) + m`; K-quants
/// `y = (d * sc) * w - (dmin * m)`; Q6_K `y = (d * sc) * w`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    let want = ty
        .row_bytes(dst.len())
        .map_err(|e| anyhow::anyhow!("dequantize_row: {e}"))?;
    ensure!(
        src.len() == want,
        "dequantize_row: {:?} row of {} elements needs {} bytes, got {}",
        ty,
        dst.len(),
        want,
        src.len()
    );
    let bs = ty.block_size();
    let ts = ty.type_size();
    let mut w = [0i8; 32];
    match ty {
        GgmlType::F32 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (o, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => {
            for (blk, y) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(bs)) {
                match ty {
                    GgmlType::Q4_0 => q4_0_ints(blk, &mut w),
                    GgmlType::Q5_0 => q5_0_ints(blk, &mut w),
                    _ => q8_0_ints(blk, &mut w),
                }
                let d = f16_at(blk, 0);
                for (o, &q) in y.iter_mut().zip(&w) {
                    *o = d * q as f32;
                }
            }
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 => {
            for (blk, y) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(bs)) {
                if ty == GgmlType::Q4_1 {
                    q4_1_ints(blk, &mut w)
                } else {
                    q5_1_ints(blk, &mut w)
                }
                let d = f16_at(blk, 0);
                let m = f16_at(blk, 2);
                for (o, &q) in y.iter_mut().zip(&w) {
                    *o = (d * q as f32) + m;
                }
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let mut u = [0u8; 256];
            for (blk, y) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(bs)) {
                if ty == GgmlType::Q4_K {
                    q4_k_ints(blk, &mut u)
                } else {
                    q5_k_ints(blk, &mut u)
                }
                let d = f16_at(blk, 0);
                let dmin = f16_at(blk, 2);
                for j in 0..8 {
                    let (sc, m) = k_scale_min(j, &blk[4..16]);
                    let d1 = d * sc as f32;
                    let m1 = dmin * m as f32;
                    for l in 0..32 {
                        y[32 * j + l] = d1 * u[32 * j + l] as f32 - m1;
                    }
                }
            }
        }
        GgmlType::Q6_K => {
            let mut s = [0i8; 256];
            for (blk, y) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(bs)) {
                q6_k_ints(blk, &mut s);
                let d = f16_at(blk, 208);
                for g in 0..16 {
                    let d1 = d * (blk[192 + g] as i8) as f32;
                    for l in 0..16 {
                        y[16 * g + l] = d1 * s[16 * g + l] as f32;
                    }
                }
            }
        }
        GgmlType::Q8_1 | GgmlType::Q8_K => {
            bail!("dequantize_row: {ty:?} is an activation type, not a weight type")
        }
    }
    Ok(())
}
