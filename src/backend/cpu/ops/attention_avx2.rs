//! AVX2 fast path of paged attention for head_dim % 8 == 0 (<= 256):
//! scores of 8 positions at once and a vectorized canonical exp, bitwise
//! equal to the portable path in `attention.rs`.
//!
//! Each position's 32-lane dot runs exactly as `canon::dot32` (4 registers
//! of 8 lanes, separate mul and add; the tail of head_dim % 32 elements goes
//! into the first registers, i.e. lanes 0..tail, as the lane rule says), then
//! the tree steps s = 16 and 8 are register adds and s = 4, 2, 1 run for 8
//! positions together through permutes (each lane pairing exactly as in
//! `canon::tree32`; f32 addition is commutative, so operand order is free).
//!
//! All functions require AVX2 + F16C (callers check `Isa::Avx2`).

use crate::backend::cpu::canon;
use half::f16;
use std::arch::x86_64::*;

/// Canonical exp of 8 lanes, bitwise equal to `canon::exp` per lane.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn exp8(x: __m256) -> __m256 {
    let log2e = _mm256_set1_ps(std::f32::consts::LOG2_E);
    // Clamp so the arithmetic below stays finite; out-of-range lanes are
    // replaced at the end exactly as canon::exp's early returns.
    let xc = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-104.0)),
        _mm256_set1_ps(88.8),
    );
    let y = _mm256_mul_ps(xc, log2e);
    // round half away from zero (|y| < 2^23): trunc, then fix by the exact fraction.
    let t = _mm256_round_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    let f = _mm256_sub_ps(y, t);
    let one = _mm256_set1_ps(1.0);
    let up = _mm256_and_ps(_mm256_cmp_ps(f, _mm256_set1_ps(0.5), _CMP_GE_OQ), one);
    let dn = _mm256_and_ps(_mm256_cmp_ps(f, _mm256_set1_ps(-0.5), _CMP_LE_OQ), one);
    // t + 1 or t - 1 or t (exactly one of up/dn is nonzero at most; adding
    // or subtracting +0.0 leaves t unchanged except -0.0 -> +0.0, matching
    // the scalar path's +0.0 for zero).
    let n = _mm256_sub_ps(_mm256_add_ps(t, up), dn);
    let r = _mm256_sub_ps(
        _mm256_sub_ps(
            xc,
            _mm256_mul_ps(n, _mm256_set1_ps(f32::from_bits(0x3f31_7200))),
        ),
        _mm256_mul_ps(n, _mm256_set1_ps(1.428_606_8e-6)),
    );
    let c = |v: f32| _mm256_set1_ps(v);
    let mut p = c(1.0 / 5040.0);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), c(1.0 / 720.0));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), c(1.0 / 120.0));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), c(1.0 / 24.0));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), c(1.0 / 6.0));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), c(0.5));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), one);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), one);
    // scale by 2^n in the same steps as canon::scale_pow2.
    let ni = _mm256_cvtps_epi32(n); // exact: n is an integer
    let hi = _mm256_cmpgt_epi32(ni, _mm256_set1_epi32(127));
    let lo = _mm256_cmpgt_epi32(_mm256_set1_epi32(-126), ni);
    let pre = _mm256_or_si256(
        _mm256_and_si256(hi, _mm256_set1_epi32(127)),
        _mm256_and_si256(lo, _mm256_set1_epi32(-100)),
    );
    let f1 = _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_add_epi32(pre, _mm256_set1_epi32(127)),
        23,
    ));
    let n2 = _mm256_sub_epi32(ni, pre);
    let f2 = _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_add_epi32(n2, _mm256_set1_epi32(127)),
        23,
    ));
    let res = _mm256_mul_ps(_mm256_mul_ps(p, f1), f2);
    // Early-return lanes: x > 88.8 -> inf, x < -104 -> 0, NaN -> x.
    let res = _mm256_blendv_ps(
        res,
        _mm256_set1_ps(f32::INFINITY),
        _mm256_cmp_ps(x, c(88.8), _CMP_GT_OQ),
    );
    let res = _mm256_blendv_ps(
        res,
        _mm256_setzero_ps(),
        _mm256_cmp_ps(x, c(-104.0), _CMP_LT_OQ),
    );
    _mm256_blendv_ps(res, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q))
}

/// Post-s=8 register (lanes 0..8) of one position's canonical dot of q with
/// the f16 row at `k`; hd % 8 == 0.
#[inline(always)]
unsafe fn dot_partial(q: *const f32, k: *const f16, hd: usize) -> __m256 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let full = hd / 32 * 32;
    let mut e = 0;
    while e < full {
        for (r, a) in acc.iter_mut().enumerate() {
            let kv = _mm256_cvtph_ps(_mm_loadu_si128(k.add(e + 8 * r) as *const __m128i));
            *a = _mm256_add_ps(*a, _mm256_mul_ps(_mm256_loadu_ps(q.add(e + 8 * r)), kv));
        }
        e += 32;
    }
    // Tail (hd % 32 = 8, 16 or 24 elements) feeds lanes 0..tail.
    let mut r = 0;
    while e < hd {
        let kv = _mm256_cvtph_ps(_mm_loadu_si128(k.add(e) as *const __m128i));
        acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(_mm256_loadu_ps(q.add(e)), kv));
        e += 8;
        r += 1;
    }
    let a = _mm256_add_ps(acc[0], acc[2]);
    let b = _mm256_add_ps(acc[1], acc[3]);
    _mm256_add_ps(a, b)
}

/// Tree steps s = 4, 2, 1 for 8 positions; returns [dot_0 .. dot_7].
#[inline(always)]
unsafe fn tree_s4_8pos(v: &[__m256; 8]) -> __m256 {
    let pair = |a: __m256, b: __m256| {
        _mm256_add_ps(
            _mm256_permute2f128_ps(a, b, 0x20),
            _mm256_permute2f128_ps(a, b, 0x31),
        )
    };
    let p01 = pair(v[0], v[1]); // [A y0..3 | B y0..3]
    let p23 = pair(v[2], v[3]);
    let p45 = pair(v[4], v[5]);
    let p67 = pair(v[6], v[7]);
    // s = 2: [A z0, C z0, A z1, C z1 | B z0, D z0, B z1, D z1]
    let t0 = _mm256_add_ps(_mm256_unpacklo_ps(p01, p23), _mm256_unpackhi_ps(p01, p23));
    let t1 = _mm256_add_ps(_mm256_unpacklo_ps(p45, p67), _mm256_unpackhi_ps(p45, p67));
    // s = 1: [A, C, E, G | B, D, F, H]
    let s = _mm256_add_ps(
        _mm256_shuffle_ps(t0, t1, 0x44),
        _mm256_shuffle_ps(t0, t1, 0xEE),
    );
    _mm256_permutevar8x32_ps(s, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// One (row, head) of canonical paged attention; see `attention.rs` for
/// the definition. `offs` gives, per absolute position, nothing: cells are
/// resolved from `table` here.
///
/// # Safety
/// AVX2 + F16C available; `hd = qv.len() = o.len()`, hd % 8 == 0, hd <= 256;
/// `table` covers positions 0..=pos with block ids whose cells (`bs` per
/// block, `nkv * hd` f16 each) lie inside `k` and `v`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn head(
    qv: &[f32],
    scale: f32,
    k: &[f16],
    v: &[f16],
    table: &[u32],
    bs: usize,
    nkv: usize,
    kvh: usize,
    pos: usize,
    o: &mut [f32],
) {
    // Common head sizes get fully unrolled inner loops (same arithmetic).
    match qv.len() {
        64 => head_n::<64>(qv, scale, k, v, table, bs, nkv, kvh, pos, o),
        128 => head_n::<128>(qv, scale, k, v, table, bs, nkv, kvh, pos, o),
        _ => head_n::<0>(qv, scale, k, v, table, bs, nkv, kvh, pos, o),
    }
}

/// `head` with head_dim fixed at compile time (`HD > 0`) or read from
/// `qv.len()` (`HD == 0`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn head_n<const HD: usize>(
    qv: &[f32],
    scale: f32,
    k: &[f16],
    v: &[f16],
    table: &[u32],
    bs: usize,
    nkv: usize,
    kvh: usize,
    pos: usize,
    o: &mut [f32],
) {
    let hd = if HD > 0 { HD } else { qv.len() };
    let mut vs = [0f32; 256];
    let vs = &mut vs[..hd];
    o.fill(0.0);
    let mut m = f32::NEG_INFINITY;
    let mut l = 0f32;
    let mut offs = [0usize; 32];
    let mut s = [0f32; 32];
    let scale_v = _mm256_set1_ps(scale);
    let mut j0 = 0;
    while j0 <= pos {
        let j1 = (j0 + 32).min(pos + 1);
        let cnt = j1 - j0;
        let (mut blk, mut within) = (j0 / bs, j0 % bs);
        for off in offs.iter_mut().take(cnt) {
            *off = ((table[blk] as usize * bs + within) * nkv + kvh) * hd;
            within += 1;
            if within == bs {
                within = 0;
                blk += 1;
            }
        }
        // Scores, 8 positions at a time (missing positions: zero vectors).
        let mut g = 0;
        while g < cnt {
            let mut parts = [_mm256_setzero_ps(); 8];
            for (t, p) in parts.iter_mut().enumerate() {
                if g + t < cnt {
                    *p = dot_partial(qv.as_ptr(), k.as_ptr().add(offs[g + t]), hd);
                }
            }
            let d = _mm256_mul_ps(tree_s4_8pos(&parts), scale_v);
            _mm256_storeu_ps(s.as_mut_ptr().add(g), d);
            g += 8;
        }
        let mut cmax = f32::NEG_INFINITY;
        for &sj in s.iter().take(cnt) {
            cmax = cmax.max(sj);
        }
        let m_new = m.max(cmax);
        let alpha = canon::exp(m - m_new);
        let mn = _mm256_set1_ps(m_new);
        let mut g = 0;
        while g < cnt {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s.as_ptr().add(g)), mn));
            _mm256_storeu_ps(s.as_mut_ptr().add(g), e);
            g += 8;
        }
        let mut ls = 0f32;
        for &p in s.iter().take(cnt) {
            ls += p;
        }
        l = (l * alpha) + ls;
        vs.fill(0.0);
        for (&p, &off) in s.iter().zip(offs.iter()).take(cnt) {
            let pv = _mm256_set1_ps(p);
            let vr = v.as_ptr().add(off);
            let mut d = 0;
            while d < hd {
                let x = _mm256_cvtph_ps(_mm_loadu_si128(vr.add(d) as *const __m128i));
                let a = _mm256_loadu_ps(vs.as_ptr().add(d));
                _mm256_storeu_ps(
                    vs.as_mut_ptr().add(d),
                    _mm256_add_ps(a, _mm256_mul_ps(pv, x)),
                );
                d += 8;
            }
        }
        let av = _mm256_set1_ps(alpha);
        let mut d = 0;
        while d < hd {
            let a = _mm256_loadu_ps(o.as_ptr().add(d));
            let x = _mm256_loadu_ps(vs.as_ptr().add(d));
            _mm256_storeu_ps(
                o.as_mut_ptr().add(d),
                _mm256_add_ps(_mm256_mul_ps(a, av), x),
            );
            d += 8;
        }
        m = m_new;
        j0 = j1;
    }
    let lv = _mm256_set1_ps(l);
    let mut d = 0;
    while d < hd {
        let a = _mm256_loadu_ps(o.as_ptr().add(d));
        _mm256_storeu_ps(o.as_mut_ptr().add(d), _mm256_div_ps(a, lv));
        d += 8;
    }
}
