//! AVX2 kernels for Q4_K, Q5_K and Q6_K weights against 16-bit activations.
//! The integer superblock sums `A`, `B` are exact (any order); the float
//! term and the 8-lane accumulation are the portable scalar steps, so
//! results are bitwise equal to `portable::dot_qk`.
//!
//! `A = Σ_j sc_j * I_j` is formed by scaling the i16 weights first
//! (`sc * w` fits i16: at most 63 * 31 = 1953 for Q4_K/Q5_K, 128 * 32 = 4096
//! for Q6_K) and `madd_epi16` against the activations. Each i32 lane then
//! sums 2 products per madd; bounds (|q| <= 32767):
//! - Q4_K: 32 products per lane per superblock, |.| <= 32 * 945 * 32767 < 2^31;
//! - Q5_K: 32 products, <= 32 * 1953 * 32767 = 2_047_934_112 < 2^31;
//! - Q6_K: accumulated per 128-element half, 16 products per lane,
//!   <= 16 * 4096 * 32767 = 2_147_418_112 < 2^31.
//!
//! The lanes are widened to i64 before the horizontal sum.
//!
//! Callers guarantee AVX2 + F16C and that `w` holds `a.d.len()` superblocks.

use super::ActKRow;
use crate::backend::cpu::canon::tree8;
use crate::backend::cpu::ops::dequant::{f16_at, k_scale_min};
use std::arch::x86_64::*;

/// Exact i64 sum of 8 i32 lanes.
#[inline(always)]
unsafe fn hsum_i64(v: __m256i) -> i64 {
    let w = _mm256_add_epi64(
        _mm256_cvtepi32_epi64(_mm256_castsi256_si128(v)),
        _mm256_cvtepi32_epi64(_mm256_extracti128_si256(v, 1)),
    );
    let s = _mm_add_epi64(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    _mm_cvtsi128_si64(s) + _mm_extract_epi64(s, 1)
}

#[inline(always)]
unsafe fn ld16(p: *const i16) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline(always)]
unsafe fn ldu8(p: *const u8) -> __m256i {
    _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const __m128i))
}

/// B = Σ_j m_j (bsum[2j] + bsum[2j+1]) (exact i64) and the 8 scales.
#[inline(always)]
fn mins_and_scales(sc: &[u8], bsum: &[i32]) -> (i64, [i16; 8]) {
    let mut bm = 0i64;
    let mut s = [0i16; 8];
    for j in 0..8 {
        let (sj, mj) = k_scale_min(j, sc);
        s[j] = sj as i16;
        bm += mj as i64 * (bsum[2 * j] as i64 + bsum[2 * j + 1] as i64);
    }
    (bm, s)
}

/// Canonical Q4_K dot (see `canon.rs`).
///
/// # Safety
/// AVX2 + F16C; `w.len() >= a.d.len() * 144`.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn dot_q4_k(w: &[u8], a: ActKRow<'_>) -> f32 {
    let nb = a.d.len();
    let m4 = _mm256_set1_epi16(0x0F);
    let mut lane = [0f32; 8];
    for b in 0..nb {
        let blk = &w[b * 144..(b + 1) * 144];
        let (bm, s) = mins_and_scales(&blk[4..16], &a.bsum[16 * b..16 * b + 16]);
        let qs = blk.as_ptr().add(16);
        let qa = a.qs.as_ptr().add(256 * b);
        let mut acc = _mm256_setzero_si256();
        for c in 0..4 {
            // Bytes qs[32c..32c+32]: low nibbles are sub-block 2c, high 2c+1.
            let s0 = _mm256_set1_epi16(s[2 * c]);
            let s1 = _mm256_set1_epi16(s[2 * c + 1]);
            let v0 = ldu8(qs.add(32 * c));
            let v1 = ldu8(qs.add(32 * c + 16));
            let e = qa.add(64 * c);
            let p0 = _mm256_madd_epi16(_mm256_mullo_epi16(_mm256_and_si256(v0, m4), s0), ld16(e));
            let p1 = _mm256_madd_epi16(
                _mm256_mullo_epi16(_mm256_and_si256(v1, m4), s0),
                ld16(e.add(16)),
            );
            let p2 = _mm256_madd_epi16(
                _mm256_mullo_epi16(_mm256_srli_epi16(v0, 4), s1),
                ld16(e.add(32)),
            );
            let p3 = _mm256_madd_epi16(
                _mm256_mullo_epi16(_mm256_srli_epi16(v1, 4), s1),
                ld16(e.add(48)),
            );
            acc = _mm256_add_epi32(
                acc,
                _mm256_add_epi32(_mm256_add_epi32(p0, p1), _mm256_add_epi32(p2, p3)),
            );
        }
        let am = hsum_i64(acc);
        let d = f16_at(blk, 0);
        let dmin = f16_at(blk, 2);
        let t = ((d * a.d[b]) * am as f32) - ((dmin * a.d[b]) * bm as f32);
        lane[b % 8] += t;
    }
    tree8(lane)
}

/// Canonical Q5_K dot (see `canon.rs`).
///
/// # Safety
/// AVX2 + F16C; `w.len() >= a.d.len() * 176`.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn dot_q5_k(w: &[u8], a: ActKRow<'_>) -> f32 {
    let nb = a.d.len();
    let m4 = _mm256_set1_epi16(0x0F);
    let b5 = _mm256_set1_epi16(0x10);
    let mut lane = [0f32; 8];
    for b in 0..nb {
        let blk = &w[b * 176..(b + 1) * 176];
        let (bm, s) = mins_and_scales(&blk[4..16], &a.bsum[16 * b..16 * b + 16]);
        // qh bit j of byte l is the fifth bit of element 32j + l; pre-shift
        // by 4 so that bit j lands on 0x10 after a right shift by j.
        let h0 = _mm256_slli_epi16(ldu8(blk.as_ptr().add(16)), 4);
        let h1 = _mm256_slli_epi16(ldu8(blk.as_ptr().add(32)), 4);
        let qs = blk.as_ptr().add(48);
        let qa = a.qs.as_ptr().add(256 * b);
        let mut acc = _mm256_setzero_si256();
        for c in 0..4 {
            let (j0, j1) = (2 * c, 2 * c + 1);
            let s0 = _mm256_set1_epi16(s[j0]);
            let s1 = _mm256_set1_epi16(s[j1]);
            let c0 = _mm_cvtsi32_si128(j0 as i32);
            let c1 = _mm_cvtsi32_si128(j1 as i32);
            let hb = |h: __m256i, cnt: __m128i| _mm256_and_si256(_mm256_srl_epi16(h, cnt), b5);
            let v0 = ldu8(qs.add(32 * c));
            let v1 = ldu8(qs.add(32 * c + 16));
            let w0 = _mm256_or_si256(_mm256_and_si256(v0, m4), hb(h0, c0));
            let w1 = _mm256_or_si256(_mm256_and_si256(v1, m4), hb(h1, c0));
            let w2 = _mm256_or_si256(_mm256_srli_epi16(v0, 4), hb(h0, c1));
            let w3 = _mm256_or_si256(_mm256_srli_epi16(v1, 4), hb(h1, c1));
            let e = qa.add(64 * c);
            let p0 = _mm256_madd_epi16(_mm256_mullo_epi16(w0, s0), ld16(e));
            let p1 = _mm256_madd_epi16(_mm256_mullo_epi16(w1, s0), ld16(e.add(16)));
            let p2 = _mm256_madd_epi16(_mm256_mullo_epi16(w2, s1), ld16(e.add(32)));
            let p3 = _mm256_madd_epi16(_mm256_mullo_epi16(w3, s1), ld16(e.add(48)));
            acc = _mm256_add_epi32(
                acc,
                _mm256_add_epi32(_mm256_add_epi32(p0, p1), _mm256_add_epi32(p2, p3)),
            );
        }
        let am = hsum_i64(acc);
        let d = f16_at(blk, 0);
        let dmin = f16_at(blk, 2);
        let t = ((d * a.d[b]) * am as f32) - ((dmin * a.d[b]) * bm as f32);
        lane[b % 8] += t;
    }
    tree8(lane)
}

/// Canonical Q6_K dot (see `canon.rs`): `A = Σ_g sc_g Σ (q6 - 32) q`.
///
/// # Safety
/// AVX2 + F16C; `w.len() >= a.d.len() * 210`.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn dot_q6_k(w: &[u8], a: ActKRow<'_>) -> f32 {
    let nb = a.d.len();
    let m4 = _mm256_set1_epi16(0x0F);
    let m30 = _mm256_set1_epi16(0x30);
    let k32 = _mm256_set1_epi16(32);
    let mut lane = [0f32; 8];
    for b in 0..nb {
        let blk = &w[b * 210..(b + 1) * 210];
        let qa = a.qs.as_ptr().add(256 * b);
        let scales = &blk[192..208];
        let mut am = 0i64;
        for h in 0..2 {
            let ql = blk.as_ptr().add(64 * h);
            let qh = blk.as_ptr().add(128 + 32 * h);
            let mut acc = _mm256_setzero_si256();
            for half in 0..2 {
                // l in [16 half, 16 half + 16): elements 128h + 32i + l,
                // i = 0..4, each a whole group g = 8h + 2i + half.
                let l0 = 16 * half;
                let la = ldu8(ql.add(l0));
                let lb = ldu8(ql.add(32 + l0));
                let hv = ldu8(qh.add(l0));
                let q = [
                    _mm256_or_si256(
                        _mm256_and_si256(la, m4),
                        _mm256_and_si256(_mm256_slli_epi16(hv, 4), m30),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(lb, m4),
                        _mm256_and_si256(_mm256_slli_epi16(hv, 2), m30),
                    ),
                    _mm256_or_si256(_mm256_srli_epi16(la, 4), _mm256_and_si256(hv, m30)),
                    _mm256_or_si256(
                        _mm256_srli_epi16(lb, 4),
                        _mm256_and_si256(_mm256_srli_epi16(hv, 2), m30),
                    ),
                ];
                for (i, qi) in q.iter().enumerate() {
                    let g = 8 * h + 2 * i + half;
                    let sv = _mm256_set1_epi16(scales[g] as i8 as i16);
                    let wv = _mm256_mullo_epi16(_mm256_sub_epi16(*qi, k32), sv);
                    let av = ld16(qa.add(128 * h + 32 * i + l0));
                    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(wv, av));
                }
            }
            am += hsum_i64(acc);
        }
        let t = (f16_at(blk, 208) * a.d[b]) * am as f32;
        lane[b % 8] += t;
    }
    tree8(lane)
}
