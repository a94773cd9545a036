//! Dot-product kernels of weight rows with activation rows, and the
//! quantized activation formats they consume. Every kernel follows the
//! canonical arithmetic of `canon.rs`; the AVX2 and portable versions of a
//! kernel are bitwise equal (integer partial sums are exact, float steps are
//! the same separately rounded operations in the same lanes).

pub mod actq;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
pub mod float;
pub mod portable;

use crate::backend::cpu::Isa;
use crate::quant::GgmlType;

/// One activation row quantized in 32-element blocks (for Q4_0, Q4_1, Q5_0,
/// Q5_1, Q8_0 weights). Per block b: `qs[32b..32b+32]`, scale `d[b]`,
/// exact sum `sum[b] = Σ q`, and `s[b] = d[b] * (sum[b] as f32)`.
#[derive(Clone, Copy)]
pub struct Act32Row<'a> {
    pub qs: &'a [i8],
    pub d: &'a [f32],
    pub s: &'a [f32],
    pub sum: &'a [i32],
}

/// One activation row quantized in 256-element superblocks (K-quants).
/// Per superblock b: `qs[256b..]`, `d[b]`, `bsum[16b..16b+16]` (exact sums
/// of 16-element groups).
#[derive(Clone, Copy)]
pub struct ActKRow<'a> {
    pub qs: &'a [i8],
    pub d: &'a [f32],
    pub bsum: &'a [i32],
}

/// Canonical dot of one 32-block-quantized weight row (`nb` blocks of `ty`)
/// with one activation row. `w` holds exactly `nb * ty.type_size()` bytes
/// and `a` exactly `nb` blocks (the caller validated both).
#[inline]
pub fn dot_q32(isa: Isa, ty: GgmlType, w: &[u8], a: Act32Row<'_>) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        // SAFETY: Isa::Avx2 is only chosen after runtime detection of AVX2
        // and F16C; lengths are validated by the caller (see above).
        unsafe {
            match ty {
                GgmlType::Q4_1 => return avx2::dot_q4_1(w, a),
                GgmlType::Q4_0 => return avx2::dot_q4_0(w, a),
                GgmlType::Q8_0 => return avx2::dot_q8_0(w, a),
                _ => {}
            }
        }
    }
    let _ = isa;
    portable::dot_q32(ty, w, a)
}

/// Canonical dot of one K-quant weight row with one Q8_K activation row.
#[inline]
pub fn dot_qk(isa: Isa, ty: GgmlType, w: &[u8], a: ActKRow<'_>) -> f32 {
    let _ = isa;
    portable::dot_qk(ty, w, a)
}
