//! The 32-element block types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (GGML layouts).
//!
//! Block layouts (little-endian, packed):
//! - Q4_0 (18 B): d: f16, qs: [u8; 16]; x = (q - 8) * d
//! - Q4_1 (20 B): d: f16, m: f16, qs: [u8; 16]; x = q * d + m
//! - Q5_0 (22 B): d: f16, qh: u32, qs: [u8; 16]; x = (q - 16) * d
//! - Q5_1 (24 B): d: f16, m: f16, qh: u32, qs: [u8; 16]; x = q * d + m
//! - Q8_0 (34 B): d: f16, qs: [i8; 32]; x = q * d
//!
//! Nibble order: element j (j < 16) is the low nibble of qs[j], element
//! j + 16 the high nibble. For the 5-bit types bit j of qh is bit 4 of
//! element j. Callers have checked the buffer lengths against the block
//! counts, so `chunks_exact` covers every element.

use super::float::{f16_to_f32, f32_to_f16};

const QK: usize = 32;

#[inline]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

// src: (nb * 18) bytes; dst: (nb * 32,)
pub(super) fn dequant_q4_0(src: &[u8], dst: &mut [f32]) {
    for (blk, y) in src.chunks_exact(18).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(blk, 0);
        let qs = &blk[2..18];
        for j in 0..QK / 2 {
            let x0 = (qs[j] & 0x0f) as i32 - 8;
            let x1 = (qs[j] >> 4) as i32 - 8;
            y[j] = x0 as f32 * d;
            y[j + QK / 2] = x1 as f32 * d;
        }
    }
}

// src: (nb * 20) bytes; dst: (nb * 32,)
pub(super) fn dequant_q4_1(src: &[u8], dst: &mut [f32]) {
    for (blk, y) in src.chunks_exact(20).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(blk, 0);
        let m = f16_at(blk, 2);
        let qs = &blk[4..20];
        for j in 0..QK / 2 {
            y[j] = (qs[j] & 0x0f) as f32 * d + m;
            y[j + QK / 2] = (qs[j] >> 4) as f32 * d + m;
        }
    }
}

// src: (nb * 22) bytes; dst: (nb * 32,)
pub(super) fn dequant_q5_0(src: &[u8], dst: &mut [f32]) {
    for (blk, y) in src.chunks_exact(22).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(blk, 0);
        let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
        let qs = &blk[6..22];
        for j in 0..QK / 2 {
            let h0 = ((qh >> j) & 1) as u8;
            let h1 = ((qh >> (j + 16)) & 1) as u8;
            let x0 = ((qs[j] & 0x0f) | (h0 << 4)) as i32 - 16;
            let x1 = ((qs[j] >> 4) | (h1 << 4)) as i32 - 16;
            y[j] = x0 as f32 * d;
            y[j + QK / 2] = x1 as f32 * d;
        }
    }
}

// src: (nb * 24) bytes; dst: (nb * 32,)
pub(super) fn dequant_q5_1(src: &[u8], dst: &mut [f32]) {
    for (blk, y) in src.chunks_exact(24).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(blk, 0);
        let m = f16_at(blk, 2);
        let qh = u32::from_le_bytes([blk[4], blk[5], blk[6], blk[7]]);
        let qs = &blk[8..24];
        for j in 0..QK / 2 {
            let h0 = ((qh >> j) & 1) as u8;
            let h1 = ((qh >> (j + 16)) & 1) as u8;
            let x0 = (qs[j] & 0x0f) | (h0 << 4);
            let x1 = (qs[j] >> 4) | (h1 << 4);
            y[j] = x0 as f32 * d + m;
            y[j + QK / 2] = x1 as f32 * d + m;
        }
    }
}

// src: (nb * 34) bytes; dst: (nb * 32,)
pub(super) fn dequant_q8_0(src: &[u8], dst: &mut [f32]) {
    for (blk, y) in src.chunks_exact(34).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(blk, 0);
        for (yj, &q) in y.iter_mut().zip(&blk[2..34]) {
            *yj = q as i8 as f32 * d;
        }
    }
}

/// The element of largest magnitude (first one on ties), as ggml's
/// `quantize_row_q4_0_ref` / `q5_0` find it: (amax, signed max).
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

#[inline]
fn inv(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

// src: (nb * 32,); out: (nb * 18) bytes
pub(super) fn quant_q4_0(src: &[f32], out: &mut [u8]) {
    for (x, blk) in src.chunks_exact(QK).zip(out.chunks_exact_mut(18)) {
        let (_, max) = signed_absmax(x);
        let d = max / -8.0;
        let id = inv(d);
        blk[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        for j in 0..QK / 2 {
            // `as i8` truncates toward zero like C's (int8_t) cast (and
            // saturates where C would be undefined).
            let xi0 = ((x[j] * id + 8.5) as i8 as u8).min(15);
            let xi1 = ((x[j + QK / 2] * id + 8.5) as i8 as u8).min(15);
            blk[2 + j] = xi0 | (xi1 << 4);
        }
    }
}

// src: (nb * 32,); out: (nb * 20) bytes
pub(super) fn quant_q4_1(src: &[f32], out: &mut [u8]) {
    for (x, blk) in src.chunks_exact(QK).zip(out.chunks_exact_mut(20)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = inv(d);
        blk[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        blk[2..4].copy_from_slice(&f32_to_f16(min).to_le_bytes());
        for j in 0..QK / 2 {
            let xi0 = (((x[j] - min) * id + 0.5) as i8 as u8).min(15);
            let xi1 = (((x[j + QK / 2] - min) * id + 0.5) as i8 as u8).min(15);
            blk[4 + j] = xi0 | (xi1 << 4);
        }
    }
}

// src: (nb * 32,); out: (nb * 22) bytes
pub(super) fn quant_q5_0(src: &[f32], out: &mut [u8]) {
    for (x, blk) in src.chunks_exact(QK).zip(out.chunks_exact_mut(22)) {
        let (_, max) = signed_absmax(x);
        let d = max / -16.0;
        let id = inv(d);
        blk[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        let mut qh = 0u32;
        for j in 0..QK / 2 {
            let xi0 = ((x[j] * id + 16.5) as i8 as u8).min(31);
            let xi1 = ((x[j + QK / 2] * id + 16.5) as i8 as u8).min(31);
            blk[6 + j] = (xi0 & 0x0f) | ((xi1 & 0x0f) << 4);
            qh |= (((xi0 & 0x10) >> 4) as u32) << j;
            qh |= (((xi1 & 0x10) >> 4) as u32) << (j + QK / 2);
        }
        blk[2..6].copy_from_slice(&qh.to_le_bytes());
    }
}

// src: (nb * 32,); out: (nb * 24) bytes
pub(super) fn quant_q5_1(src: &[f32], out: &mut [u8]) {
    for (x, blk) in src.chunks_exact(QK).zip(out.chunks_exact_mut(24)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = inv(d);
        blk[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        blk[2..4].copy_from_slice(&f32_to_f16(min).to_le_bytes());
        let mut qh = 0u32;
        for j in 0..QK / 2 {
            // ggml casts to uint8_t without a clamp; (max - min) * id can
            // round to just above 31, which truncation brings back to 31.
            // The clamp only matters for non-finite input.
            let xi0 = (((x[j] - min) * id + 0.5) as u8).min(31);
            let xi1 = (((x[j + QK / 2] - min) * id + 0.5) as u8).min(31);
            blk[8 + j] = (xi0 & 0x0f) | ((xi1 & 0x0f) << 4);
            qh |= (((xi0 & 0x10) >> 4) as u32) << j;
            qh |= (((xi1 & 0x10) >> 4) as u32) << (j + QK / 2);
        }
        blk[4..8].copy_from_slice(&qh.to_le_bytes());
    }
}

// src: (nb * 32,); out: (nb * 34) bytes
pub(super) fn quant_q8_0(src: &[f32], out: &mut [u8]) {
    for (x, blk) in src.chunks_exact(QK).zip(out.chunks_exact_mut(34)) {
        let (amax, _) = signed_absmax(x);
        let d = amax / 127.0;
        let id = inv(d);
        blk[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        for j in 0..QK {
            // f32::round rounds half away from zero, like C's roundf.
            blk[2 + j] = (x[j] * id).round() as i8 as u8;
        }
    }
}
