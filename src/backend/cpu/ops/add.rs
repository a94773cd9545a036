//! Residual add and bias add (elementwise; no reduction).

use super::{for_chunks, ELEM_CHUNK};
use anyhow::Result;

/// x += y. x, y: (len,).
pub fn add(par: crate::backend::cpu::pool::Par<'_>, x: &mut [f32], y: &[f32]) -> Result<()> {
    crate::backend::validate::same_len("add", &[x.len(), y.len()])?;
    for_chunks(par, x, ELEM_CHUNK, |c, xc| {
        for (a, &b) in xc.iter_mut().zip(&y[c * ELEM_CHUNK..]) {
            *a += b;
        }
    });
    Ok(())
}

/// x: (n, dim) += bias: (dim,) on every row.
pub fn add_bias(
    par: crate::backend::cpu::pool::Par<'_>,
    x: &mut [f32],
    bias: &[f32],
) -> Result<()> {
    let dim = bias.len();
    crate::backend::validate::add_bias(x.len(), dim)?;
    let rows_per = (ELEM_CHUNK / dim).max(1);
    for_chunks(par, x, rows_per * dim, |_, xc| {
        for row in xc.chunks_exact_mut(dim) {
            for (a, &b) in row.iter_mut().zip(bias) {
                *a += b;
            }
        }
    });
    Ok(())
}
