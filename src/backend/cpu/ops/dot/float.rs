//! Canonical 32-lane float dot products (f32 activations with f32, f16 or
//! bf16 weights). The AVX2 versions keep lanes 0..32 in four 8-lane
//! registers and do exactly the portable sequence of mul-then-add.

use crate::backend::cpu::canon::dot32_by;
use crate::backend::cpu::Isa;
use half::{bf16, f16};

/// dot32(a, b); a.len() == b.len() (caller's invariant; extra ignored).
#[inline]
pub fn dot_f32(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    let k = a.len().min(b.len());
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        // SAFETY: AVX2 detected at runtime; both slices hold >= k elements.
        return unsafe { super::avx2::dot_f32(a.as_ptr(), b.as_ptr(), k) };
    }
    let _ = isa;
    dot32_by(k, |i| a[i] * b[i])
}

/// dot32 of f32 `a` (k,) with little-endian f16 bytes `w` (2k,).
#[inline]
pub fn dot_f16_bytes(isa: Isa, a: &[f32], w: &[u8]) -> f32 {
    let k = a.len().min(w.len() / 2);
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        // SAFETY: AVX2+F16C detected at runtime; a has k elements and w 2k bytes.
        return unsafe { super::avx2::dot_f16(a.as_ptr(), w.as_ptr(), k) };
    }
    let _ = isa;
    dot32_by(k, |i| {
        a[i] * f16::from_bits(u16::from_le_bytes([w[2 * i], w[2 * i + 1]])).to_f32()
    })
}

/// dot32 of f32 `a` (k,) with little-endian bf16 bytes `w` (2k,).
#[inline]
pub fn dot_bf16_bytes(isa: Isa, a: &[f32], w: &[u8]) -> f32 {
    let k = a.len().min(w.len() / 2);
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        // SAFETY: AVX2 detected at runtime; a has k elements and w 2k bytes.
        return unsafe { super::avx2::dot_bf16(a.as_ptr(), w.as_ptr(), k) };
    }
    let _ = isa;
    dot32_by(k, |i| {
        a[i] * bf16::from_bits(u16::from_le_bytes([w[2 * i], w[2 * i + 1]])).to_f32()
    })
}

/// dot32 of f32 `a` (k,) with little-endian f32 bytes `w` (4k,).
#[inline]
pub fn dot_f32_bytes(isa: Isa, a: &[f32], w: &[u8]) -> f32 {
    let k = a.len().min(w.len() / 4);
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        // SAFETY: AVX2 detected at runtime; unaligned loads are used, and w
        // holds 4k bytes.
        return unsafe { super::avx2::dot_f32(a.as_ptr(), w.as_ptr() as *const f32, k) };
    }
    let _ = isa;
    dot32_by(k, |i| {
        a[i] * f32::from_le_bytes([w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]])
    })
}

/// dot32 of f32 `a` with f16 `b` (KV cache).
#[inline]
pub fn dot_f16(isa: Isa, a: &[f32], b: &[f16]) -> f32 {
    let k = a.len().min(b.len());
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        // SAFETY: AVX2+F16C detected; f16 is a transparent u16, 2k bytes.
        return unsafe { super::avx2::dot_f16(a.as_ptr(), b.as_ptr() as *const u8, k) };
    }
    let _ = isa;
    dot32_by(k, |i| a[i] * b[i].to_f32())
}
