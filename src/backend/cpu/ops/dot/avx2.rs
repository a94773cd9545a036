//! AVX2 (+F16C) kernels. No FMA: every product is `_mm256_mul_ps` followed
//! by `_mm256_add_ps`, lane-for-lane the portable sequence. Integer partial
//! sums are exact, so their order is free.
//!
//! Every function here is `unsafe`: callers guarantee AVX2 and F16C are
//! available (runtime detection) and that the slices/pointers cover the
//! lengths stated in each function's doc.

use super::Act32Row;
use crate::backend::cpu::canon::{tree32, tree8};
use std::arch::x86_64::*;

macro_rules! float_dot {
    ($name:ident, $bty:ty, $load:ident) => {
        /// 32-lane canonical dot; `a` and `b` cover k elements.
        #[target_feature(enable = "avx2,f16c")]
        pub unsafe fn $name(a: *const f32, b: *const $bty, k: usize) -> f32 {
            let mut acc = [_mm256_setzero_ps(); 4];
            let full = k / 32 * 32;
            let mut e = 0;
            while e < full {
                for (r, acc) in acc.iter_mut().enumerate() {
                    let va = _mm256_loadu_ps(a.add(e + 8 * r));
                    let vb = $load(b, e + 8 * r);
                    *acc = _mm256_add_ps(*acc, _mm256_mul_ps(va, vb));
                }
                e += 32;
            }
            let mut lane = [0f32; 32];
            for (r, acc) in acc.iter().enumerate() {
                _mm256_storeu_ps(lane.as_mut_ptr().add(8 * r), *acc);
            }
            if full < k {
                let mut ta = [0f32; 32];
                let mut tb = [0f32; 32];
                for l in 0..k - full {
                    ta[l] = *a.add(full + l);
                }
                // Convert the tail through the same vector loader on a padded copy.
                tail_load(b, full, k - full, &mut tb);
                for l in 0..k - full {
                    lane[l] += ta[l] * tb[l];
                }
            }
            tree32(lane)
        }
    };
}

#[inline(always)]
unsafe fn load_f32(b: *const f32, i: usize) -> __m256 {
    _mm256_loadu_ps(b.add(i))
}

#[inline(always)]
unsafe fn load_f16(b: *const u8, i: usize) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(b.add(2 * i) as *const __m128i))
}

#[inline(always)]
unsafe fn load_bf16(b: *const u8, i: usize) -> __m256 {
    let h = _mm_loadu_si128(b.add(2 * i) as *const __m128i);
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
}

trait TailLoad {
    unsafe fn tail(b: *const Self, from: usize, n: usize, out: &mut [f32; 32]);
}
impl TailLoad for f32 {
    #[inline(always)]
    unsafe fn tail(b: *const f32, from: usize, n: usize, out: &mut [f32; 32]) {
        for (l, o) in out.iter_mut().enumerate().take(n) {
            *o = std::ptr::read_unaligned(b.add(from + l));
        }
    }
}
impl TailLoad for u8 {
    // Only used by the f16 kernel: bf16 has its own tail below.
    #[inline(always)]
    unsafe fn tail(b: *const u8, from: usize, n: usize, out: &mut [f32; 32]) {
        for (l, o) in out.iter_mut().enumerate().take(n) {
            let p = b.add(2 * (from + l));
            *o = half::f16::from_bits(u16::from_le_bytes([*p, *p.add(1)])).to_f32();
        }
    }
}
#[inline(always)]
unsafe fn tail_load<T: TailLoad>(b: *const T, from: usize, n: usize, out: &mut [f32; 32]) {
    T::tail(b, from, n, out)
}

float_dot!(dot_f32, f32, load_f32);
float_dot!(dot_f16, u8, load_f16);

/// bf16 weights: as `dot_f32`, `b` covers 2k bytes.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn dot_bf16(a: *const f32, b: *const u8, k: usize) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let full = k / 32 * 32;
    let mut e = 0;
    while e < full {
        for (r, acc) in acc.iter_mut().enumerate() {
            let va = _mm256_loadu_ps(a.add(e + 8 * r));
            let vb = load_bf16(b, e + 8 * r);
            *acc = _mm256_add_ps(*acc, _mm256_mul_ps(va, vb));
        }
        e += 32;
    }
    let mut lane = [0f32; 32];
    for (r, acc) in acc.iter().enumerate() {
        _mm256_storeu_ps(lane.as_mut_ptr().add(8 * r), *acc);
    }
    for (l, lane) in lane.iter_mut().enumerate().take(k - full) {
        let p = b.add(2 * (full + l));
        let wb = half::bf16::from_bits(u16::from_le_bytes([*p, *p.add(1)])).to_f32();
        *lane += *a.add(full + l) * wb;
    }
    tree32(lane)
}

/// Horizontal sums of 8 vectors of 8 i32: lane i of the result = Σ v[i].
#[inline(always)]
unsafe fn hsum8x8(v: &[__m256i; 8]) -> __m256i {
    let s01 = _mm256_hadd_epi32(v[0], v[1]);
    let s23 = _mm256_hadd_epi32(v[2], v[3]);
    let s45 = _mm256_hadd_epi32(v[4], v[5]);
    let s67 = _mm256_hadd_epi32(v[6], v[7]);
    // [v0 lo, v1 lo, v2 lo, v3 lo | v0 hi, v1 hi, v2 hi, v3 hi] (4-sums)
    let s0123 = _mm256_hadd_epi32(s01, s23);
    let s4567 = _mm256_hadd_epi32(s45, s67);
    let lo = _mm256_permute2x128_si256(s0123, s4567, 0x20);
    let hi = _mm256_permute2x128_si256(s0123, s4567, 0x31);
    _mm256_add_epi32(lo, hi)
}

/// Horizontal sum of one vector of 8 i32.
#[inline(always)]
unsafe fn hsum1(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

#[inline(always)]
unsafe fn rd_u16(p: *const u8) -> u16 {
    u16::from_le_bytes([*p, *p.add(1)])
}

#[inline(always)]
unsafe fn f16_scalar(p: *const u8) -> f32 {
    half::f16::from_bits(rd_u16(p)).to_f32()
}

/// 32 nibbles of 16 bytes as 32 unsigned bytes: low nibbles then high.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> __m256i {
    let raw = _mm_loadu_si128(p as *const __m128i);
    let both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// Shared driver for the 32-block kernels: `isum(b)` gives the 8 i32 partial
/// sums of block b (exact, any order); `fin` turns a vector of 8 exact block
/// integers (lanes = blocks g*8..g*8+8) into the 8 float terms.
macro_rules! q32_kernel {
    ($name:ident, $ts:expr, $has_min:expr, |$w:ident, $a:ident, $b:ident| $isum:expr, |$iv:ident, $g:ident| $adj:expr) => {
        /// Canonical dot; `w` holds `a.d.len()` blocks.
        #[target_feature(enable = "avx2,f16c")]
        pub unsafe fn $name($w: &[u8], $a: Act32Row<'_>) -> f32 {
            let nb = $a.d.len();
            let groups = nb / 8;
            let mut acc = _mm256_setzero_ps();
            let mut dwb = [0u16; 8];
            let mut mwb = [0u16; 8];
            let mut v = [_mm256_setzero_si256(); 8];
            for $g in 0..groups {
                for i in 0..8 {
                    let $b = $g * 8 + i;
                    let p = $w.as_ptr().add($b * $ts);
                    dwb[i] = rd_u16(p);
                    if $has_min {
                        mwb[i] = rd_u16(p.add(2));
                    }
                    v[i] = $isum;
                }
                let $iv = hsum8x8(&v);
                let _ = $g;
                let iv = $adj;
                let isf = _mm256_cvtepi32_ps(iv);
                let dw = _mm256_cvtph_ps(_mm_loadu_si128(dwb.as_ptr() as *const __m128i));
                let da = _mm256_loadu_ps($a.d.as_ptr().add($g * 8));
                let mut t = _mm256_mul_ps(_mm256_mul_ps(dw, da), isf);
                if $has_min {
                    let mw = _mm256_cvtph_ps(_mm_loadu_si128(mwb.as_ptr() as *const __m128i));
                    let sa = _mm256_loadu_ps($a.s.as_ptr().add($g * 8));
                    t = _mm256_add_ps(t, _mm256_mul_ps(mw, sa));
                }
                acc = _mm256_add_ps(acc, t);
            }
            let mut lane = [0f32; 8];
            _mm256_storeu_ps(lane.as_mut_ptr(), acc);
            for $b in groups * 8..nb {
                let p = $w.as_ptr().add($b * $ts);
                let $g = $b / 8;
                let _ = $g;
                // Scalar tail: lane vector with only this block's integer.
                let $iv = _mm256_set1_epi32(hsum1($isum));
                let iv = $adj;
                let mut tmp = [0i32; 8];
                _mm256_storeu_si256(tmp.as_mut_ptr() as *mut __m256i, iv);
                let isum = tmp[$b % 8];
                let mut t = (f16_scalar(p) * $a.d[$b]) * isum as f32;
                if $has_min {
                    t += f16_scalar(p.add(2)) * $a.s[$b];
                }
                lane[$b % 8] += t;
            }
            tree8(lane)
        }
    };
}

// Q4_1: unsigned nibbles x signed activations, maddubs then madd.
q32_kernel!(
    dot_q4_1,
    20,
    true,
    |w, a, b| {
        let wq = nibbles(w.as_ptr().add(b * 20 + 4));
        let aq = _mm256_loadu_si256(a.qs.as_ptr().add(b * 32) as *const __m256i);
        _mm256_madd_epi16(_mm256_maddubs_epi16(wq, aq), _mm256_set1_epi16(1))
    },
    |iv, g| iv
);

// Q4_0: Σ (nib - 8) q = Σ nib q - 8 Σ q (exact).
q32_kernel!(
    dot_q4_0,
    18,
    false,
    |w, a, b| {
        let wq = nibbles(w.as_ptr().add(b * 18 + 2));
        let aq = _mm256_loadu_si256(a.qs.as_ptr().add(b * 32) as *const __m256i);
        _mm256_madd_epi16(_mm256_maddubs_epi16(wq, aq), _mm256_set1_epi16(1))
    },
    |iv, g| {
        let sums = if g * 8 + 8 <= a.sum.len() {
            _mm256_loadu_si256(a.sum.as_ptr().add(g * 8) as *const __m256i)
        } else {
            let mut t = [0i32; 8];
            for (l, t) in t.iter_mut().enumerate() {
                if let Some(&s) = a.sum.get(g * 8 + l) {
                    *t = s;
                }
            }
            _mm256_loadu_si256(t.as_ptr() as *const __m256i)
        };
        _mm256_sub_epi32(iv, _mm256_slli_epi32(sums, 3))
    }
);

// Q8_0: |w| (unsigned) x sign(q, w), maddubs then madd.
q32_kernel!(
    dot_q8_0,
    34,
    false,
    |w, a, b| {
        let wq = _mm256_loadu_si256(w.as_ptr().add(b * 34 + 2) as *const __m256i);
        let aq = _mm256_loadu_si256(a.qs.as_ptr().add(b * 32) as *const __m256i);
        let ax = _mm256_sign_epi8(wq, wq);
        let sy = _mm256_sign_epi8(aq, wq);
        _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1))
    },
    |iv, g| iv
);
