//! AVX2 (+F16C) kernels. No FMA: every product is `_mm256_mul_ps` followed
//! by `_mm256_add_ps`, lane-for-lane the portable sequence. Integer partial
//! sums are exact, so their order is free.
//!
//! Every function here is `unsafe`: callers guarantee AVX2 and F16C are
//! available (runtime detection) and that the slices/pointers cover the
//! lengths stated in each function's doc.

use crate::backend::cpu::canon::tree32;
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
