//! K-quants with 256-element super-blocks: Q4_K, Q5_K, Q6_K (GGML layouts).
//!
//! Block layouts (little-endian, packed):
//! - Q4_K (144 B): d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]
//! - Q5_K (176 B): d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]
//! - Q6_K (210 B): ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16
//!
//! Q4_K/Q5_K: 8 sub-blocks of 32 with 6-bit scale `sc` and 6-bit min `m`
//! packed in `scales` (see `scale_min`); x = (d * sc) * q - (dmin * m).
//! Q6_K: 16 sub-blocks of 16 with int8 scales; x = (d * sc) * (q - 32).
//! Callers have checked buffer lengths, so `chunks_exact` covers everything.

use super::float::{f16_to_f32, f32_to_f16};

const QK_K: usize = 256;

#[inline]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

/// ggml's `get_scale_min_k4`: 6-bit scale and min of sub-block `j` (0..8).
#[inline]
fn scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Inverse of `scale_min` for all 8 sub-blocks; `ls`, `lm` are < 64.
fn pack_scale_min(ls: &[u8; 8], lm: &[u8; 8], out: &mut [u8]) {
    out[..12].fill(0);
    for j in 0..8 {
        if j < 4 {
            out[j] = ls[j];
            out[j + 4] = lm[j];
        } else {
            out[j + 4] = (ls[j] & 0x0f) | ((lm[j] & 0x0f) << 4);
            out[j - 4] |= (ls[j] >> 4) << 6;
            out[j] |= (lm[j] >> 4) << 6;
        }
    }
}

// src: (nb * 144) bytes; dst: (nb * 256,)
pub(super) fn dequant_q4_k(src: &[u8], dst: &mut [f32]) {
    for (blk, y) in src.chunks_exact(144).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(blk, 0);
        let dmin = f16_at(blk, 2);
        let scales = &blk[4..16];
        let qs = &blk[16..144];
        for c in 0..4 {
            let (sc1, m1) = scale_min(2 * c, scales);
            let (sc2, m2) = scale_min(2 * c + 1, scales);
            let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
            let q = &qs[32 * c..32 * c + 32];
            let y = &mut y[64 * c..64 * c + 64];
            for l in 0..32 {
                y[l] = d1 * (q[l] & 0x0f) as f32 - m1;
                y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

// src: (nb * 176) bytes; dst: (nb * 256,)
pub(super) fn dequant_q5_k(src: &[u8], dst: &mut [f32]) {
    for (blk, y) in src.chunks_exact(176).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(blk, 0);
        let dmin = f16_at(blk, 2);
        let scales = &blk[4..16];
        let qh = &blk[16..48];
        let qs = &blk[48..176];
        for c in 0..4 {
            let (sc1, m1) = scale_min(2 * c, scales);
            let (sc2, m2) = scale_min(2 * c + 1, scales);
            let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
            let q = &qs[32 * c..32 * c + 32];
            let y = &mut y[64 * c..64 * c + 64];
            for l in 0..32 {
                let h1 = ((qh[l] >> (2 * c)) & 1) << 4;
                let h2 = ((qh[l] >> (2 * c + 1)) & 1) << 4;
                y[l] = d1 * ((q[l] & 0x0f) | h1) as f32 - m1;
                y[l + 32] = d2 * ((q[l] >> 4) | h2) as f32 - m2;
            }
        }
    }
}

// src: (nb * 210) bytes; dst: (nb * 256,)
pub(super) fn dequant_q6_k(src: &[u8], dst: &mut [f32]) {
    for (blk, y) in src.chunks_exact(210).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(blk, 208);
        for half in 0..2 {
            let ql = &blk[64 * half..64 * half + 64];
            let qh = &blk[128 + 32 * half..128 + 32 * half + 32];
            let sc = &blk[192 + 8 * half..192 + 8 * half + 8];
            let y = &mut y[128 * half..128 * half + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                y[l] = d * sc[is] as i8 as f32 * q1 as f32;
                y[l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
                y[l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
                y[l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
            }
        }
    }
}

/// Rounds `v` to the nearest integer and clamps it to `lo..=hi` (NaN -> lo).
#[inline]
fn round_clamp(v: f32, lo: i32, hi: i32) -> i32 {
    (v.round() as i32).clamp(lo, hi)
}

/// The f16-rounded value of `x` and its bits: the encoder must reason with
/// the scale the decoder will see.
#[inline]
fn f16_round(x: f32) -> (f32, u16) {
    let b = f32_to_f16(x);
    (f16_to_f32(b), b)
}

/// Shared Q4_K/Q5_K encoder for one super-block: asymmetric sub-block
/// quantization to `0..=nmax` with 6-bit scales and mins. Writes d, dmin and
/// the packed scales into `head` (16 bytes) and returns the levels `l`.
///
/// Simplified ggml scheme (no iterative search): per sub-block
/// scale = (max - min') / nmax with min' = min(min, 0), then the scales and
/// mins are quantized against the super-block maxima.
fn encode_kq(x: &[f32], nmax: i32, head: &mut [u8], l: &mut [u8; QK_K]) {
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    for (s, xs) in x.chunks_exact(32).enumerate() {
        let mn = xs.iter().fold(0f32, |a, &v| a.min(v));
        let mx = xs.iter().fold(f32::MIN, |a, &v| a.max(v));
        scales[s] = ((mx - mn) / nmax as f32).max(0.0);
        mins[s] = -mn;
    }
    let max_scale = scales.iter().fold(0f32, |a, &v| a.max(v));
    let max_min = mins.iter().fold(0f32, |a, &v| a.max(v));
    let (d, d_bits) = f16_round(max_scale / 63.0);
    let (dmin, dmin_bits) = f16_round(max_min / 63.0);
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for s in 0..8 {
        if d > 0.0 {
            // Round the scale up so that the sub-block maximum stays
            // representable after the 6-bit scale quantization.
            ls[s] = ((scales[s] / d).ceil() as i32).clamp(0, 63) as u8;
        }
        if dmin > 0.0 {
            lm[s] = round_clamp(mins[s] / dmin, 0, 63) as u8;
        }
    }
    head[0..2].copy_from_slice(&d_bits.to_le_bytes());
    head[2..4].copy_from_slice(&dmin_bits.to_le_bytes());
    pack_scale_min(&ls, &lm, &mut head[4..16]);
    for (s, xs) in x.chunks_exact(32).enumerate() {
        // Same products the decoder forms.
        let de = d * ls[s] as f32;
        let me = dmin * lm[s] as f32;
        for (j, &v) in xs.iter().enumerate() {
            l[32 * s + j] = if de > 0.0 {
                round_clamp((v + me) / de, 0, nmax) as u8
            } else {
                0
            };
        }
    }
}

// src: (nb * 256,); out: (nb * 144) bytes
pub(super) fn quant_q4_k(src: &[f32], out: &mut [u8]) {
    let mut l = [0u8; QK_K];
    for (x, blk) in src.chunks_exact(QK_K).zip(out.chunks_exact_mut(144)) {
        encode_kq(x, 15, &mut blk[0..16], &mut l);
        let qs = &mut blk[16..144];
        for c in 0..4 {
            for j in 0..32 {
                qs[32 * c + j] = l[64 * c + j] | (l[64 * c + j + 32] << 4);
            }
        }
    }
}

// src: (nb * 256,); out: (nb * 176) bytes
pub(super) fn quant_q5_k(src: &[f32], out: &mut [u8]) {
    let mut l = [0u8; QK_K];
    for (x, blk) in src.chunks_exact(QK_K).zip(out.chunks_exact_mut(176)) {
        encode_kq(x, 31, &mut blk[0..16], &mut l);
        let (qh, qs) = blk[16..176].split_at_mut(32);
        qh.fill(0);
        for c in 0..4 {
            for j in 0..32 {
                let l1 = l[64 * c + j];
                let l2 = l[64 * c + j + 32];
                qh[j] |= ((l1 >> 4) << (2 * c)) | ((l2 >> 4) << (2 * c + 1));
                qs[32 * c + j] = (l1 & 0x0f) | ((l2 & 0x0f) << 4);
            }
        }
    }
}

// src: (nb * 256,); out: (nb * 210) bytes
pub(super) fn quant_q6_k(src: &[f32], out: &mut [u8]) {
    for (x, blk) in src.chunks_exact(QK_K).zip(out.chunks_exact_mut(210)) {
        // Per 16-element sub-block: symmetric scale mapping the element of
        // largest magnitude to -32 (as ggml's make_qx_quants starting point).
        let mut scales = [0f32; 16];
        for (s, xs) in x.chunks_exact(16).enumerate() {
            let mut amax = 0f32;
            let mut max = 0f32;
            for &v in xs {
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
            scales[s] = max / -32.0;
        }
        let mut amax = 0f32;
        let mut max_scale = 0f32;
        for &s in &scales {
            if s.abs() > amax {
                amax = s.abs();
                max_scale = s;
            }
        }
        let mut l = [32u8; QK_K];
        let mut isc = [0i8; 16];
        let d_bits;
        if amax == 0.0 {
            d_bits = 0u16;
        } else {
            let iscale = -128.0 / max_scale;
            let (d, bits) = f16_round(1.0 / iscale);
            d_bits = bits;
            for s in 0..16 {
                isc[s] = round_clamp(iscale * scales[s], -128, 127) as i8;
                let de = d * isc[s] as f32;
                if de == 0.0 {
                    continue;
                }
                for j in 0..16 {
                    let q = round_clamp(x[16 * s + j] / de, -32, 31);
                    l[16 * s + j] = (q + 32) as u8;
                }
            }
        }
        let (ql, rest) = blk.split_at_mut(128);
        let (qh, rest) = rest.split_at_mut(64);
        let (sc, dd) = rest.split_at_mut(16);
        for half in 0..2 {
            let lh = &l[128 * half..128 * half + 128];
            for j in 0..32 {
                ql[64 * half + j] = (lh[j] & 0x0f) | ((lh[j + 64] & 0x0f) << 4);
                ql[64 * half + j + 32] = (lh[j + 32] & 0x0f) | ((lh[j + 96] & 0x0f) << 4);
                qh[32 * half + j] = (lh[j] >> 4)
                    | ((lh[j + 32] >> 4) << 2)
                    | ((lh[j + 64] >> 4) << 4)
                    | ((lh[j + 96] >> 4) << 6);
            }
        }
        for s in 0..16 {
            sc[s] = isc[s] as u8;
        }
        dd.copy_from_slice(&d_bits.to_le_bytes());
    }
}
