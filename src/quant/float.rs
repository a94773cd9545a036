//! Float element types: F32, F16 (IEEE half) and BF16, little-endian.
//!
//! Callers (`quant::dequantize` / `quant::quantize`) have checked that the
//! byte buffers hold exactly `4`, `2` or `2` bytes per element.

/// IEEE half bits to f32 (exact: every half is representable in f32).
#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// f32 to IEEE half bits, round to nearest even (as ggml and numpy).
#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// BF16 bits to f32 (exact: the high half of an f32).
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// f32 to BF16 bits exactly as ggml's `ggml_compute_fp32_to_bf16`: NaN is
/// forced quiet, everything else rounds to nearest even.
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    // In u64 the sum cannot overflow; it reaches 2^32 only for inputs in the
    // NaN range handled above, so the shifted value fits u16 (the largest
    // finite f32 rounds to inf, as in ggml).
    ((u as u64 + (0x7fff + ((u as u64 >> 16) & 1))) >> 16) as u16
}

// src: (n * 4) bytes; dst: (n,)
pub(super) fn dequant_f32(src: &[u8], dst: &mut [f32]) {
    for (d, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

// src: (n * 2) bytes; dst: (n,)
pub(super) fn dequant_f16(src: &[u8], dst: &mut [f32]) {
    for (d, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

// src: (n * 2) bytes; dst: (n,)
pub(super) fn dequant_bf16(src: &[u8], dst: &mut [f32]) {
    for (d, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

// src: (n,); out: (n * 4) bytes
pub(super) fn quant_f32(src: &[f32], out: &mut [u8]) {
    for (o, x) in out.chunks_exact_mut(4).zip(src) {
        o.copy_from_slice(&x.to_le_bytes());
    }
}

// src: (n,); out: (n * 2) bytes
pub(super) fn quant_f16(src: &[f32], out: &mut [u8]) {
    for (o, x) in out.chunks_exact_mut(2).zip(src) {
        o.copy_from_slice(&f32_to_f16(*x).to_le_bytes());
    }
}

// src: (n,); out: (n * 2) bytes
pub(super) fn quant_bf16(src: &[f32], out: &mut [u8]) {
    for (o, x) in out.chunks_exact_mut(2).zip(src) {
        o.copy_from_slice(&f32_to_bf16(*x).to_le_bytes());
    }
}
