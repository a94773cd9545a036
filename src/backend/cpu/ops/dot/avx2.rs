//! AVX2 (+F16C) kernels. No FMA: every product is `_mm256_mul_ps` followed
//! by `_mm256_add_ps`, lane-for-lane the portable sequence. Integer partial
//! sums are exact, so their order is free.
//!
//! Every function here is `unsafe`: callers guarantee AVX2 and F16C are
//! available (runtime detection) and that the slices/pointers cover the
//! lengths stated in each function's doc.

use crate::backend::cpu::canon::{self, tree32};
use std::arch::x86_64::*;

macro_rules! float_dot {
    ($name:ident, $bty:ty, $load:ident) => {
        /// 32-lane canonical dot; `a` and `b` cover k elements.
        #[inline]
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
            if full == k {
                return tree32_regs(acc);
            }
            let mut lane = [0f32; 32];
            for (r, acc) in acc.iter().enumerate() {
                _mm256_storeu_ps(lane.as_mut_ptr().add(8 * r), *acc);
            }
            {
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

/// The canonical 32-lane tree on lanes held as 4 x 8 (lane 8r + i in
/// register r, element i): s = 16 and 8 are whole-register adds, s = 4, 2, 1
/// are in-register; each step is exactly `lane[i] = lane[i] + lane[i + s]`.
#[inline(always)]
pub(crate) unsafe fn tree32_regs(acc: [__m256; 4]) -> f32 {
    let a = _mm256_add_ps(acc[0], acc[2]); // s = 16 (lanes 0..8)
    let b = _mm256_add_ps(acc[1], acc[3]); // s = 16 (lanes 8..16)
    tree8_reg(_mm256_add_ps(a, b)) // s = 8, then 4, 2, 1
}

/// The canonical 8-lane tree (s = 4, 2, 1) on one register.
#[inline(always)]
pub(crate) unsafe fn tree8_reg(v: __m256) -> f32 {
    let s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 0b01));
    _mm_cvtss_f32(s1)
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
    if full == k {
        return tree32_regs(acc);
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

/// Canonical 16-bit activation quantization of one block of `n` elements
/// (bitwise `canon::quantize_block` + the exact sum): returns (d, Σq).
/// NaN elements are ignored by the max and quantize to 0, as in the
/// portable version.
///
/// # Safety
/// AVX2 available; `x` and `q` hold `n` elements, `n` a multiple of 16.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn quantize_block16(x: *const f32, q: *mut i16, n: usize) -> (f32, i32) {
    let absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    // amax: max is exact and order-free; NaN lanes are zeroed first (the
    // portable f32::max ignores NaN operands).
    let mut m = _mm256_setzero_ps();
    let mut e = 0;
    while e < n {
        let v = _mm256_loadu_ps(x.add(e));
        let a = _mm256_and_ps(v, absmask);
        let a = _mm256_and_ps(a, _mm256_cmp_ps(a, a, _CMP_ORD_Q));
        m = _mm256_max_ps(m, a);
        e += 8;
    }
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let m1 = _mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 0b01));
    let amax = _mm_cvtss_f32(m1);
    let d = amax / canon::QA_MAX;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    let idv = _mm256_set1_ps(id);
    let half = _mm256_set1_ps(0.5);
    let mhalf = _mm256_set1_ps(-0.5);
    let one = _mm256_set1_ps(1.0);
    let lo = _mm256_set1_ps(-canon::QA_MAX);
    let hi = _mm256_set1_ps(canon::QA_MAX);
    let mut sum = _mm256_setzero_si256();
    let quant8 = |p: *const f32| -> __m256i {
        let y = _mm256_mul_ps(_mm256_loadu_ps(p), idv);
        // NaN -> 0 (portable: NaN as i16 == 0).
        let y = _mm256_and_ps(y, _mm256_cmp_ps(y, y, _CMP_ORD_Q));
        // round half away from zero, as canon::round_away. |y| can exceed
        // 2^23 only if inf (id = 0 then, so y is 0 or NaN): the clamp
        // below handles +-inf either way.
        let t = _mm256_round_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        let f = _mm256_sub_ps(y, t);
        let up = _mm256_and_ps(_mm256_cmp_ps(f, half, _CMP_GE_OQ), one);
        let dn = _mm256_and_ps(_mm256_cmp_ps(f, mhalf, _CMP_LE_OQ), one);
        let r = _mm256_sub_ps(_mm256_add_ps(t, up), dn);
        let r = _mm256_min_ps(_mm256_max_ps(r, lo), hi);
        _mm256_cvttps_epi32(r)
    };
    let mut e = 0;
    while e < n {
        let a = quant8(x.add(e));
        let b = quant8(x.add(e + 8));
        sum = _mm256_add_epi32(sum, _mm256_add_epi32(a, b));
        // packs interleaves 128-bit lanes: qwords come out as [0, 2, 1, 3].
        let p = _mm256_packs_epi32(a, b);
        let p = _mm256_permute4x64_epi64(p, 0b11_01_10_00);
        _mm256_storeu_si256(q.add(e) as *mut __m256i, p);
        e += 16;
    }
    let s = _mm_add_epi32(
        _mm256_castsi256_si128(sum),
        _mm256_extracti128_si256(sum, 1),
    );
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    (d, _mm_cvtsi128_si32(s))
}
