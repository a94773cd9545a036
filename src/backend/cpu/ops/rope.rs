//! Rotary embedding in place with canonical sin/cos.

use super::for_chunks;
use crate::backend::cpu::canon;
use anyhow::Result;

/// x: (n, n_heads, head_dim) rotated in place; positions: (n,);
/// inv_freq: (rope_dim / 2,). Angle_i = (pos as f32) * inv_freq[i];
/// pair i is (2i, 2i+1), or (i, i + rope_dim/2) when `neox`.
#[allow(clippy::too_many_arguments)] // the op's fields, passed through
pub fn run(
    par: crate::backend::cpu::pool::Par<'_>,
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    rope_dim: usize,
    positions: &[u32],
    inv_freq: &[f32],
    neox: bool,
) -> Result<()> {
    let n = positions.len();
    crate::backend::validate::rope(x.len(), n_heads, head_dim, rope_dim, n, inv_freq.len())?;
    let half = rope_dim / 2;
    for_chunks(par, x, n_heads * head_dim, |r, row| {
        let pos = positions[r];
        // (cos, sin) per pair; computed once per row, shared by heads.
        let mut cs = [(0f32, 0f32); 512];
        let mut heap;
        let cs: &mut [(f32, f32)] = if half <= cs.len() {
            &mut cs[..half]
        } else {
            heap = vec![(0f32, 0f32); half];
            &mut heap[..]
        };
        for (i, c) in cs.iter_mut().enumerate() {
            let (s, co) = canon::sin_cos(pos as f32 * inv_freq[i]);
            *c = (co, s);
        }
        for head in row.chunks_exact_mut(head_dim) {
            for (i, &(c, s)) in cs.iter().enumerate() {
                let (a, b) = if neox {
                    (i, i + half)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let x0 = head[a];
                let x1 = head[b];
                head[a] = (x0 * c) - (x1 * s);
                head[b] = (x0 * s) + (x1 * c);
            }
        }
    });
    Ok(())
}
