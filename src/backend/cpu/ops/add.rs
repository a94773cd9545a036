//! Residual add and bias add (elementwise; no reduction).

use super::{for_chunks, ELEM_CHUNK};
use anyhow::{ensure, Result};

/// x += y. x, y: (len,).
pub fn add(par: crate::backend::cpu::pool::Par<'_>, x: &mut [f32], y: &[f32]) -> Result<()> {
    ensure!(
        x.len() == y.len(),
        "add: x has {} elements, y has {}",
        x.len(),
        y.len()
    );
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
    ensure!(
        dim > 0 && x.len().is_multiple_of(dim),
        "add_bias: x has {} elements, not a whole number of rows of bias dim {}",
        x.len(),
        dim
    );
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
