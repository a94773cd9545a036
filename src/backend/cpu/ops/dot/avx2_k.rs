//! AVX2 kernels for Q4_K and Q6_K weights against Q8_K activations. The
//! integer superblock sums `A`, `B` are exact (any order); the float term
//! and the 8-lane accumulation are the portable scalar steps, so results
//! are bitwise equal to `portable::dot_qk`.
//!
//! Callers guarantee AVX2 + F16C and that `w` holds `a.d.len()` superblocks.

use super::ActKRow;
use crate::backend::cpu::canon::tree8;
use crate::backend::cpu::ops::dequant::{f16_at, k_scale_min};
use std::arch::x86_64::*;

#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// Canonical Q4_K dot (see `canon.rs`).
///
/// # Safety
/// AVX2 + F16C; `w.len() >= a.d.len() * 144`.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn dot_q4_k(w: &[u8], a: ActKRow<'_>) -> f32 {
    let nb = a.d.len();
    let m4 = _mm256_set1_epi8(0x0F);
    let mut lane = [0f32; 8];
    for b in 0..nb {
        let blk = &w[b * 144..(b + 1) * 144];
        let sc = &blk[4..16];
        let qs = blk.as_ptr().add(16);
        let qa = a.qs.as_ptr().add(256 * b);
        let bsum = &a.bsum[16 * b..16 * b + 16];
        let mut acc = _mm256_setzero_si256();
        let mut bm = 0i32;
        for c in 0..4 {
            let (s0, m0) = k_scale_min(2 * c, sc);
            let (s1, m1) = k_scale_min(2 * c + 1, sc);
            let raw = _mm256_loadu_si256(qs.add(32 * c) as *const __m256i);
            let lo = _mm256_and_si256(raw, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
            let a0 = _mm256_loadu_si256(qa.add(64 * c) as *const __m256i);
            let a1 = _mm256_loadu_si256(qa.add(64 * c + 32) as *const __m256i);
            let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a0), _mm256_set1_epi16(s0 as i16));
            let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, a1), _mm256_set1_epi16(s1 as i16));
            acc = _mm256_add_epi32(acc, _mm256_add_epi32(p0, p1));
            bm += m0 as i32 * (bsum[4 * c] + bsum[4 * c + 1]);
            bm += m1 as i32 * (bsum[4 * c + 2] + bsum[4 * c + 3]);
        }
        let am = hsum_i32(acc);
        let d = f16_at(blk, 0);
        let dmin = f16_at(blk, 2);
        let t = ((d * a.d[b]) * am as f32) - ((dmin * a.d[b]) * bm as f32);
        lane[b % 8] += t;
    }
    tree8(lane)
}

/// Canonical Q6_K dot (see `canon.rs`): `A = Σ_g sc_g Σ (q6 - 32) q`
/// computed as `Σ_g sc_g Σ q6 q - 32 Σ_g sc_g bsum_g` (exact).
///
/// # Safety
/// AVX2 + F16C; `w.len() >= a.d.len() * 210`.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn dot_q6_k(w: &[u8], a: ActKRow<'_>) -> f32 {
    let nb = a.d.len();
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(0x03);
    let mut lane = [0f32; 8];
    for b in 0..nb {
        let blk = &w[b * 210..(b + 1) * 210];
        let qa = a.qs.as_ptr().add(256 * b);
        let bsum = &a.bsum[16 * b..16 * b + 16];
        let scales = &blk[192..208];
        let mut acc = _mm256_setzero_si256();
        for h in 0..2 {
            let ql = blk.as_ptr().add(64 * h);
            let qh = _mm256_loadu_si256(blk.as_ptr().add(128 + 32 * h) as *const __m256i);
            let ql0 = _mm256_loadu_si256(ql as *const __m256i);
            let ql1 = _mm256_loadu_si256(ql.add(32) as *const __m256i);
            let hbits = |shift: i32| -> __m256i {
                let v = match shift {
                    0 => qh,
                    2 => _mm256_srli_epi16(qh, 2),
                    4 => _mm256_srli_epi16(qh, 4),
                    _ => _mm256_srli_epi16(qh, 6),
                };
                _mm256_slli_epi16(_mm256_and_si256(v, m2), 4)
            };
            let q = [
                _mm256_or_si256(_mm256_and_si256(ql0, m4), hbits(0)),
                _mm256_or_si256(_mm256_and_si256(ql1, m4), hbits(2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), hbits(4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), hbits(6)),
            ];
            for (i, qi) in q.iter().enumerate() {
                // Elements 128h + 32i .. +32: groups g0 = 8h + 2i and g0 + 1.
                let g0 = 8 * h + 2 * i;
                let av = _mm256_loadu_si256(qa.add(128 * h + 32 * i) as *const __m256i);
                let sv = _mm256_set_m128i(
                    _mm_set1_epi16(scales[g0 + 1] as i8 as i16),
                    _mm_set1_epi16(scales[g0] as i8 as i16),
                );
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(*qi, av), sv);
                acc = _mm256_add_epi32(acc, p);
            }
        }
        let mut corr = 0i32;
        for g in 0..16 {
            corr += (scales[g] as i8) as i32 * bsum[g];
        }
        let am = hsum_i32(acc) - 32 * corr;
        let t = (f16_at(blk, 208) * a.d[b]) * am as f32;
        lane[b % 8] += t;
    }
    tree8(lane)
}
