//! AVX2 kernels for the 32-block legacy types (Q4_0, Q4_1, Q5_0, Q5_1,
//! Q8_0) dotting one weight row against R activation rows at once: each
//! weight block is decoded once (to 2 x 16 i16) and reused for all R rows
//! (prefill tiling); R = 1 is decode.
//!
//! Canonical per row (see `canon.rs`): blocks g*8..g*8+8 form one vector
//! step. Exact block integers come from `madd_epi16` (i16 weights x i16
//! activations, pairwise i32 sums) reduced by a hadd tree (integer,
//! order-free); then, lane-wise with lane = b % 8, `t = (dw * da) * I`
//! (+ `mw * sa` for Q4_1 / Q5_1) and `acc = acc + t`. A last partial group
//! uses zero scales in its missing lanes, so those lanes add `+0.0`, which
//! leaves every lane unchanged (lanes start at +0.0 and, in
//! round-to-nearest, a sum is never -0.0 unless both addends are).
//!
//! Integer bounds: |w| <= 128 and |q| <= 32767, so every partial sum of a
//! block's 32 products is below 32 * 128 * 32767 < 2^31 (exact in i32).
//! Q4_0 / Q5_0 use the unsigned integers and subtract `8 S` / `16 S`
//! (`S` = Σ q, |S| <= 32 * 32767), also exact.
//!
//! Callers guarantee AVX2 + F16C and that `w` holds `a[r].d.len()` blocks
//! for every row r (all rows have the same block count).

use super::avx2::tree8_reg;
use super::Act32Row;
use std::arch::x86_64::*;

/// Which legacy block layout a kernel reads.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
}

impl Kind {
    /// Const-generic tag (so each kernel is compiled per kind, branch-free).
    pub const fn tag(self) -> u8 {
        match self {
            Kind::Q4_0 => 0,
            Kind::Q4_1 => 1,
            Kind::Q5_0 => 2,
            Kind::Q5_1 => 3,
            Kind::Q8_0 => 4,
        }
    }
    #[inline(always)]
    const fn from_tag(t: u8) -> Kind {
        match t {
            0 => Kind::Q4_0,
            1 => Kind::Q4_1,
            2 => Kind::Q5_0,
            3 => Kind::Q5_1,
            _ => Kind::Q8_0,
        }
    }
    #[inline(always)]
    fn type_size(self) -> usize {
        match self {
            Kind::Q4_0 => 18,
            Kind::Q4_1 => 20,
            Kind::Q5_0 => 22,
            Kind::Q5_1 => 24,
            Kind::Q8_0 => 34,
        }
    }
    #[inline(always)]
    fn has_min(self) -> bool {
        matches!(self, Kind::Q4_1 | Kind::Q5_1)
    }
    /// Offset subtracted from the unsigned integers (applied as `off * S`).
    #[inline(always)]
    fn offset_shift(self) -> Option<i32> {
        match self {
            Kind::Q4_0 => Some(3),
            Kind::Q5_0 => Some(4),
            _ => None,
        }
    }
}

#[inline(always)]
unsafe fn rd_u16(p: *const u8) -> u16 {
    u16::from_le_bytes([*p, *p.add(1)])
}

#[inline(always)]
unsafe fn rd_u32(p: *const u8) -> u32 {
    u32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)])
}

/// 16 i16 lanes: 0x10 where bit i of `bits` is set (lane i), else 0.
#[inline(always)]
unsafe fn high_bits(bits: u32) -> __m256i {
    let sel = _mm256_setr_epi16(
        1,
        2,
        4,
        8,
        16,
        32,
        64,
        128,
        256,
        512,
        1024,
        2048,
        4096,
        8192,
        16384,
        i16::MIN,
    );
    let b = _mm256_and_si256(_mm256_set1_epi16(bits as u16 as i16), sel);
    _mm256_and_si256(_mm256_cmpeq_epi16(b, sel), _mm256_set1_epi16(0x10))
}

/// Weight integers of one block as i16: (elements 0..16, elements 16..32).
/// Unsigned for Q4_*/Q5_* (offsets are corrected through S), signed Q8_0.
#[inline(always)]
unsafe fn decode(kind: Kind, blk: *const u8) -> (__m256i, __m256i) {
    let m4 = _mm256_set1_epi16(0x0F);
    match kind {
        Kind::Q8_0 => (
            _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(2) as *const __m128i)),
            _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(18) as *const __m128i)),
        ),
        Kind::Q4_0 | Kind::Q4_1 => {
            let qo = if kind == Kind::Q4_1 { 4 } else { 2 };
            // Byte j -> i16 lane j: low nibble is element j, high j + 16.
            let v = _mm256_cvtepu8_epi16(_mm_loadu_si128(blk.add(qo) as *const __m128i));
            (_mm256_and_si256(v, m4), _mm256_srli_epi16(v, 4))
        }
        Kind::Q5_0 | Kind::Q5_1 => {
            let (ho, qo) = if kind == Kind::Q5_1 { (4, 8) } else { (2, 6) };
            let qh = rd_u32(blk.add(ho));
            let v = _mm256_cvtepu8_epi16(_mm_loadu_si128(blk.add(qo) as *const __m128i));
            (
                _mm256_or_si256(_mm256_and_si256(v, m4), high_bits(qh)),
                _mm256_or_si256(_mm256_srli_epi16(v, 4), high_bits(qh >> 16)),
            )
        }
    }
}

/// 8 i32 partial sums of Σ w_i * q_i for one block (exact).
#[inline(always)]
unsafe fn block_dot(w: (__m256i, __m256i), q: *const i16) -> __m256i {
    let a0 = _mm256_loadu_si256(q as *const __m256i);
    let a1 = _mm256_loadu_si256(q.add(16) as *const __m256i);
    _mm256_add_epi32(_mm256_madd_epi16(w.0, a0), _mm256_madd_epi16(w.1, a1))
}

/// One group of up to 8 blocks starting at block `g0` (`cnt` of them) for
/// R rows: returns per row the vector of 8 exact block integers (zero in
/// missing lanes). `FULL` = (cnt == 8), so the loop fully unrolls.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // k indexes blocks and h alike
unsafe fn group_ints<const R: usize, const FULL: bool>(
    kind: Kind,
    w: *const u8,
    a: &[Act32Row<'_>; R],
    g0: usize,
    cnt: usize,
) -> [__m256i; R] {
    let ts = kind.type_size();
    let mut h = [[_mm256_setzero_si256(); 4]; R];
    for k in 0..4 {
        let (b0, b1) = (g0 + 2 * k, g0 + 2 * k + 1);
        let has0 = FULL || 2 * k < cnt;
        let has1 = FULL || 2 * k + 1 < cnt;
        if !has0 {
            break;
        }
        let w0 = decode(kind, w.add(b0 * ts));
        let w1 = if has1 {
            decode(kind, w.add(b1 * ts))
        } else {
            (_mm256_setzero_si256(), _mm256_setzero_si256())
        };
        for r in 0..R {
            let q = a[r].qs.as_ptr();
            let p0 = block_dot(w0, q.add(b0 * 32));
            let p1 = if has1 {
                block_dot(w1, q.add(b1 * 32))
            } else {
                _mm256_setzero_si256()
            };
            h[r][k] = _mm256_hadd_epi32(p0, p1);
        }
    }
    let mut out = [_mm256_setzero_si256(); R];
    for r in 0..R {
        // [b0 lo, b1 lo, b2 lo, b3 lo | b0 hi, b1 hi, b2 hi, b3 hi] (4-sums)
        let s0123 = _mm256_hadd_epi32(h[r][0], h[r][1]);
        let s4567 = _mm256_hadd_epi32(h[r][2], h[r][3]);
        let lo = _mm256_permute2x128_si256(s0123, s4567, 0x20);
        let hi = _mm256_permute2x128_si256(s0123, s4567, 0x31);
        out[r] = _mm256_add_epi32(lo, hi);
    }
    out
}

/// out[r] = canonical dot of weight row `w` with activation row `a[r]`.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn dot_rows<const KIND: u8, const R: usize>(
    w: &[u8],
    a: &[Act32Row<'_>; R],
    out: &mut [f32; R],
) {
    let kind = Kind::from_tag(KIND);
    let nb = a[0].d.len();
    let ts = kind.type_size();
    let wp = w.as_ptr();
    let mut acc = [_mm256_setzero_ps(); R];
    let lane_idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let mut g0 = 0;
    while g0 < nb {
        let cnt = (nb - g0).min(8);
        let ints = if cnt == 8 {
            group_ints::<R, true>(kind, wp, a, g0, 8)
        } else {
            group_ints::<R, false>(kind, wp, a, g0, cnt)
        };
        // Block scales (f16) of this group; zero in missing lanes.
        let (dw, mw) = if cnt == 8 {
            let h = |i: usize, o: usize| rd_u16(wp.add((g0 + i) * ts + o)) as i16;
            let d = _mm_setr_epi16(
                h(0, 0),
                h(1, 0),
                h(2, 0),
                h(3, 0),
                h(4, 0),
                h(5, 0),
                h(6, 0),
                h(7, 0),
            );
            let m = if kind.has_min() {
                _mm_setr_epi16(
                    h(0, 2),
                    h(1, 2),
                    h(2, 2),
                    h(3, 2),
                    h(4, 2),
                    h(5, 2),
                    h(6, 2),
                    h(7, 2),
                )
            } else {
                _mm_setzero_si128()
            };
            (_mm256_cvtph_ps(d), _mm256_cvtph_ps(m))
        } else {
            let mut dh = [0u16; 8];
            let mut mh = [0u16; 8];
            for i in 0..cnt {
                let blk = wp.add((g0 + i) * ts);
                dh[i] = rd_u16(blk);
                if kind.has_min() {
                    mh[i] = rd_u16(blk.add(2));
                }
            }
            (
                _mm256_cvtph_ps(_mm_loadu_si128(dh.as_ptr() as *const __m128i)),
                _mm256_cvtph_ps(_mm_loadu_si128(mh.as_ptr() as *const __m128i)),
            )
        };
        let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt as i32), lane_idx);
        for r in 0..R {
            let mut iv = ints[r];
            if let Some(sh) = kind.offset_shift() {
                let sums = _mm256_maskload_epi32(a[r].sum.as_ptr().add(g0), mask);
                iv = _mm256_sub_epi32(iv, _mm256_sll_epi32(sums, _mm_cvtsi32_si128(sh)));
            }
            let isf = _mm256_cvtepi32_ps(iv);
            let da = _mm256_maskload_ps(a[r].d.as_ptr().add(g0), mask);
            let mut t = _mm256_mul_ps(_mm256_mul_ps(dw, da), isf);
            if kind.has_min() {
                let sa = _mm256_maskload_ps(a[r].s.as_ptr().add(g0), mask);
                t = _mm256_add_ps(t, _mm256_mul_ps(mw, sa));
            }
            acc[r] = _mm256_add_ps(acc[r], t);
        }
        g0 += 8;
    }
    for r in 0..R {
        out[r] = tree8_reg(acc[r]);
    }
}
