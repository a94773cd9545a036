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

/// 16 bytes at `p`, or zeros when `p` is None.
#[inline(always)]
unsafe fn ld128(p: Option<*const u8>) -> __m128i {
    match p {
        Some(p) => _mm_loadu_si128(p as *const __m128i),
        None => _mm_setzero_si128(),
    }
}

/// `[16 bytes at a + off | 16 bytes at b + off (or zeros)]`.
#[inline(always)]
unsafe fn ld_pair(a: *const u8, b: Option<*const u8>, off: usize) -> __m256i {
    _mm256_set_m128i(
        ld128(b.map(|b| b.add(off))),
        _mm_loadu_si128(a.add(off) as *const __m128i),
    )
}

/// Weight integers of a block pair (A, B; B absent = zeros) as four i16
/// vectors in the activation pair layout (`actq::pair_pos`): chunk c holds
/// `[A 8c..8c+8 | B 8c..8c+8]`. Unsigned for Q4_*/Q5_* (offsets are
/// corrected through S), signed for Q8_0.
#[inline(always)]
unsafe fn decode_pair(kind: Kind, a: *const u8, b: Option<*const u8>) -> [__m256i; 4] {
    let m4 = _mm256_set1_epi16(0x0F);
    let z = _mm256_setzero_si256();
    let qo = match kind {
        Kind::Q4_0 | Kind::Q8_0 => 2,
        Kind::Q4_1 => 4,
        Kind::Q5_0 => 6,
        Kind::Q5_1 => 8,
    };
    match kind {
        Kind::Q8_0 => {
            // unpack(x, x) as i16 is 257 x; >> 8 (arithmetic) is x.
            let x = ld_pair(a, b, qo);
            let y = ld_pair(a, b, qo + 16);
            [
                _mm256_srai_epi16(_mm256_unpacklo_epi8(x, x), 8),
                _mm256_srai_epi16(_mm256_unpackhi_epi8(x, x), 8),
                _mm256_srai_epi16(_mm256_unpacklo_epi8(y, y), 8),
                _mm256_srai_epi16(_mm256_unpackhi_epi8(y, y), 8),
            ]
        }
        _ => {
            // Byte j: low nibble element j, high nibble element j + 16.
            let v = ld_pair(a, b, qo);
            let u0 = _mm256_unpacklo_epi8(v, z); // bytes 0..8 of A | of B
            let u1 = _mm256_unpackhi_epi8(v, z); // bytes 8..16
            let mut c = [
                _mm256_and_si256(u0, m4),
                _mm256_and_si256(u1, m4),
                _mm256_srli_epi16(u0, 4),
                _mm256_srli_epi16(u1, 4),
            ];
            if matches!(kind, Kind::Q5_0 | Kind::Q5_1) {
                let ho = if kind == Kind::Q5_1 { 4 } else { 2 };
                let ha = rd_u32(a.add(ho));
                let hb = match b {
                    Some(b) => rd_u32(b.add(ho)),
                    None => 0,
                };
                for (i, ci) in c.iter_mut().enumerate() {
                    // Bit e of qh is the fifth bit of element e.
                    let bits = ((ha >> (8 * i)) & 0xFF) | (((hb >> (8 * i)) & 0xFF) << 8);
                    *ci = _mm256_or_si256(*ci, high_bits(bits));
                }
            }
            c
        }
    }
}

/// 8 i32 partial sums of a block pair: lanes 0..4 of block A, 4..8 of B
/// (exact). `q` points at the pair's 64 activations.
#[inline(always)]
unsafe fn pair_dot(w: &[__m256i; 4], q: *const i16) -> __m256i {
    let l0 = _mm256_loadu_si256(q as *const __m256i);
    let l1 = _mm256_loadu_si256(q.add(16) as *const __m256i);
    let l2 = _mm256_loadu_si256(q.add(32) as *const __m256i);
    let l3 = _mm256_loadu_si256(q.add(48) as *const __m256i);
    let p0 = _mm256_add_epi32(_mm256_madd_epi16(w[0], l0), _mm256_madd_epi16(w[1], l1));
    let p1 = _mm256_add_epi32(_mm256_madd_epi16(w[2], l2), _mm256_madd_epi16(w[3], l3));
    _mm256_add_epi32(p0, p1)
}

/// One group of up to 8 blocks starting at block `g0` (`cnt` of them, g0
/// even) for R rows: returns per row the vector of 8 exact block integers
/// (zero in missing lanes). `FULL` = (cnt == 8), so the loop fully unrolls.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // k indexes pairs and z alike
unsafe fn group_ints<const R: usize, const FULL: bool>(
    kind: Kind,
    w: *const u8,
    a: &[Act32Row<'_>; R],
    g0: usize,
    cnt: usize,
) -> [__m256i; R] {
    let ts = kind.type_size();
    // Pair k of the group gives one vector (lanes 0..4 block 2k, 4..8 block
    // 2k + 1). Two merges by blends (any port) and one in-lane shuffle
    // each: pairs (0, 1) and (2, 3) fold to [b0 b2 b0 b2 | b1 b3 b1 b3] and
    // [b4 b6 .. | b5 b7 ..], then to [b0 b2 b4 b6 | b1 b3 b5 b7], permuted
    // to block order at the end. Integer adds, so exact in any order.
    let mut x = [[_mm256_setzero_si256(); 2]; R];
    for k in 0..4 {
        let (b0, b1) = (g0 + 2 * k, g0 + 2 * k + 1);
        let has0 = FULL || 2 * k < cnt;
        let has1 = FULL || 2 * k + 1 < cnt;
        let mut v = [_mm256_setzero_si256(); R];
        if has0 {
            let wv = decode_pair(
                kind,
                w.add(b0 * ts),
                if has1 { Some(w.add(b1 * ts)) } else { None },
            );
            for r in 0..R {
                // The pair's 64 activations exist even without a partner.
                v[r] = pair_dot(&wv, a[r].qs.as_ptr().add(32 * b0));
            }
        }
        for r in 0..R {
            if k % 2 == 0 {
                x[r][k / 2] = v[r];
            } else {
                let y = x[r][k / 2];
                // Lane 2i: y[2i] + y[2i+1]; lane 2i+1: v[2i] + v[2i+1].
                x[r][k / 2] = _mm256_add_epi32(
                    _mm256_blend_epi32(y, v[r], 0b1010_1010),
                    _mm256_shuffle_epi32(_mm256_blend_epi32(v[r], y, 0b1010_1010), 0b10_11_00_01),
                );
            }
        }
        if !FULL && 2 * k + 2 >= cnt && k % 2 == 1 {
            break;
        }
    }
    let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let mut out = [_mm256_setzero_si256(); R];
    for r in 0..R {
        let (u, v) = (x[r][0], x[r][1]);
        let m = _mm256_add_epi32(
            _mm256_blend_epi32(u, v, 0b1100_1100),
            _mm256_shuffle_epi32(_mm256_blend_epi32(v, u, 0b1100_1100), 0b01_00_11_10),
        );
        out[r] = _mm256_permutevar8x32_epi32(m, perm);
    }
    out
}

/// 8 i32 at `p` (full group) or the `mask`ed ones, zero elsewhere.
#[inline(always)]
unsafe fn ld_i(full: bool, mask: __m256i, p: *const i32) -> __m256i {
    if full {
        _mm256_loadu_si256(p as *const __m256i)
    } else {
        _mm256_maskload_epi32(p, mask)
    }
}

/// 8 f32 at `p` (full group) or the `mask`ed ones, zero elsewhere.
#[inline(always)]
unsafe fn ld_f(full: bool, mask: __m256i, p: *const f32) -> __m256 {
    if full {
        _mm256_loadu_ps(p)
    } else {
        _mm256_maskload_ps(p, mask)
    }
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
            // One gather of the first 4 bytes of each block: d in the low
            // 16 bits, m (Q4_1 / Q5_1) in the high 16 bits. Every block has
            // at least 18 bytes, so the reads stay inside `w`.
            let idx = _mm256_mullo_epi32(lane_idx, _mm256_set1_epi32(ts as i32));
            let v = _mm256_i32gather_epi32::<1>(wp.add(g0 * ts) as *const i32, idx);
            let lo = _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF));
            let hi = if kind.has_min() {
                _mm256_srli_epi32(v, 16)
            } else {
                _mm256_setzero_si256()
            };
            // [d0..d3, m0..m3 | d4..d7, m4..m7] -> [d0..d7 | m0..m7].
            let p = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0b11_01_10_00);
            (
                _mm256_cvtph_ps(_mm256_castsi256_si128(p)),
                _mm256_cvtph_ps(_mm256_extracti128_si256(p, 1)),
            )
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
        // Per-row block values: plain loads for a full group, masked
        // (zero-filled) loads for the tail.
        let full = cnt == 8;
        for r in 0..R {
            let mut iv = ints[r];
            if let Some(sh) = kind.offset_shift() {
                let sums = ld_i(full, mask, a[r].sum.as_ptr().add(g0));
                iv = _mm256_sub_epi32(iv, _mm256_sll_epi32(sums, _mm_cvtsi32_si128(sh)));
            }
            let isf = _mm256_cvtepi32_ps(iv);
            let da = ld_f(full, mask, a[r].d.as_ptr().add(g0));
            let mut t = _mm256_mul_ps(_mm256_mul_ps(dw, da), isf);
            if kind.has_min() {
                let sa = ld_f(full, mask, a[r].s.as_ptr().add(g0));
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
