//! out = silu(gate) * up (canonical silu: `x / (1 + exp(-x))`, then `* up`).

use super::{for_chunks, ELEM_CHUNK};
use crate::backend::cpu::{canon, Isa};
use anyhow::Result;

/// gate, up, out: (len,).
pub fn run(
    par: crate::backend::cpu::pool::Par<'_>,
    isa: Isa,
    gate: &[f32],
    up: &[f32],
    out: &mut [f32],
) -> Result<()> {
    crate::backend::validate::same_len("swiglu", &[gate.len(), up.len(), out.len()])?;
    for_chunks(par, out, ELEM_CHUNK, |c, oc| {
        let base = c * ELEM_CHUNK;
        let g = &gate[base..base + oc.len()];
        let u = &up[base..base + oc.len()];
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx2 {
            // SAFETY: AVX2 + F16C detected at runtime; g, u, oc have equal
            // lengths (sliced above).
            unsafe { swiglu_avx2(g, u, oc) };
            return;
        }
        let _ = isa;
        for ((o, &x), &y) in oc.iter_mut().zip(g).zip(u) {
            *o = canon::silu(x) * y;
        }
    });
    Ok(())
}

/// Same per-element operations as the portable loop (`exp8` is bitwise
/// `canon::exp`), 8 lanes at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn swiglu_avx2(g: &[f32], u: &[f32], o: &mut [f32]) {
    use super::attention_avx2::exp8;
    use std::arch::x86_64::*;
    let n = o.len().min(g.len()).min(u.len());
    let one = _mm256_set1_ps(1.0);
    let neg = _mm256_set1_ps(-0.0);
    let mut i = 0;
    while i + 8 <= n {
        let x = _mm256_loadu_ps(g.as_ptr().add(i));
        let e = exp8(_mm256_xor_ps(x, neg)); // exp(-x)
        let s = _mm256_div_ps(x, _mm256_add_ps(one, e));
        let y = _mm256_loadu_ps(u.as_ptr().add(i));
        _mm256_storeu_ps(o.as_mut_ptr().add(i), _mm256_mul_ps(s, y));
        i += 8;
    }
    while i < n {
        o[i] = canon::silu(g[i]) * u[i];
        i += 1;
    }
}
