//! Dot-product kernels of weight rows with activation rows, and the
//! quantized activation formats they consume. Every kernel follows the
//! canonical arithmetic of `canon.rs`; the AVX2 and portable versions of a
//! kernel are bitwise equal (integer partial sums are exact, float steps are
//! the same separately rounded operations in the same lanes).

pub mod actq;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_k;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_q32;
pub mod float;
pub mod portable;

use crate::backend::cpu::Isa;
use crate::quant::GgmlType;

/// One activation row quantized in 32-element blocks (for Q4_0, Q4_1, Q5_0,
/// Q5_1, Q8_0 weights). Per block b: elements at `qs[actq::pair_pos(b, i)]`
/// (`qs` holds the block count rounded up to a pair), scale `d[b]`,
/// exact sum `sum[b] = Σ q`, and `s[b] = d[b] * (sum[b] as f32)`.
#[derive(Clone, Copy)]
pub struct Act32Row<'a> {
    pub qs: &'a [i16],
    pub d: &'a [f32],
    pub s: &'a [f32],
    pub sum: &'a [i32],
}

/// One activation row quantized in 256-element superblocks (K-quants).
/// Per superblock b: `qs[256b..]`, `d[b]`, `bsum[16b..16b+16]` (exact sums
/// of 16-element groups).
#[derive(Clone, Copy)]
pub struct ActKRow<'a> {
    pub qs: &'a [i16],
    pub d: &'a [f32],
    pub bsum: &'a [i32],
}

/// Canonical dots of one 32-block-quantized weight row (`nb` blocks of
/// `ty`) with several activation rows: `out[r] = dot(w, a[r])`. `w` holds
/// exactly `nb * ty.type_size()` bytes and every `a[r]` exactly `nb` blocks
/// (the caller validated both); `out.len() == a.len()`.
#[inline]
pub fn dot_q32_rows(isa: Isa, ty: GgmlType, w: &[u8], a: &[Act32Row<'_>], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        use avx2_q32::Kind;
        let kind = match ty {
            GgmlType::Q4_0 => Some(Kind::Q4_0),
            GgmlType::Q4_1 => Some(Kind::Q4_1),
            GgmlType::Q5_0 => Some(Kind::Q5_0),
            GgmlType::Q5_1 => Some(Kind::Q5_1),
            GgmlType::Q8_0 => Some(Kind::Q8_0),
            _ => None,
        };
        if let Some(kind) = kind {
            // SAFETY: Isa::Avx2 is only chosen after runtime detection of
            // AVX2 and F16C; lengths are validated by the caller.
            unsafe {
                match kind {
                    Kind::Q4_0 => rows_avx2::<{ Kind::Q4_0.tag() }>(w, a, out),
                    Kind::Q4_1 => rows_avx2::<{ Kind::Q4_1.tag() }>(w, a, out),
                    Kind::Q5_0 => rows_avx2::<{ Kind::Q5_0.tag() }>(w, a, out),
                    Kind::Q5_1 => rows_avx2::<{ Kind::Q5_1.tag() }>(w, a, out),
                    Kind::Q8_0 => rows_avx2::<{ Kind::Q8_0.tag() }>(w, a, out),
                }
            }
            return;
        }
    }
    let _ = isa;
    for (ar, o) in a.iter().zip(out.iter_mut()) {
        *o = portable::dot_q32(ty, w, *ar);
    }
}

/// Tiles of 4 activation rows, then single rows.
///
/// # Safety
/// AVX2 + F16C available; `w` and every row of `a` hold the same block count.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn rows_avx2<const KIND: u8>(w: &[u8], a: &[Act32Row<'_>], out: &mut [f32]) {
    use avx2_q32::dot_rows;
    let mut ac = a.chunks_exact(4);
    let mut oc = out.chunks_exact_mut(4);
    for (a4, o4) in (&mut ac).zip(&mut oc) {
        if let (Ok(a4), Ok(o4)) = (
            <&[Act32Row<'_>; 4]>::try_from(a4),
            <&mut [f32; 4]>::try_from(o4),
        ) {
            dot_rows::<KIND, 4>(w, a4, o4);
        }
    }
    for (a1, o1) in ac.remainder().iter().zip(oc.into_remainder()) {
        let mut o = [0f32; 1];
        dot_rows::<KIND, 1>(w, &[*a1], &mut o);
        *o1 = o[0];
    }
}

/// Canonical dot of one K-quant weight row with one Q8_K activation row.
#[inline]
pub fn dot_qk(isa: Isa, ty: GgmlType, w: &[u8], a: ActKRow<'_>) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        // SAFETY: Isa::Avx2 only after runtime AVX2 + F16C detection; the
        // caller validated that w holds a.d.len() superblocks of ty.
        unsafe {
            match ty {
                GgmlType::Q4_K => return avx2_k::dot_q4_k(w, a),
                GgmlType::Q5_K => return avx2_k::dot_q5_k(w, a),
                GgmlType::Q6_K => return avx2_k::dot_q6_k(w, a),
                _ => {}
            }
        }
    }
    let _ = isa;
    portable::dot_qk(ty, w, a)
}
