//! Residual add and bias add (elementwise; no reduction).

use super::ELEM_CHUNK;
use anyhow::{ensure, Result};
use rayon::prelude::*;

/// x += y. x, y: (len,).
pub fn add(x: &mut [f32], y: &[f32]) -> Result<()> {
    ensure!(
        x.len() == y.len(),
        "add: x has {} elements, y has {}",
        x.len(),
        y.len()
    );
    x.par_chunks_mut(ELEM_CHUNK)
        .zip(y.par_chunks(ELEM_CHUNK))
        .for_each(|(xc, yc)| {
            for (a, &b) in xc.iter_mut().zip(yc) {
                *a += b;
            }
        });
    Ok(())
}

/// x: (n, dim) += bias: (dim,) on every row.
pub fn add_bias(x: &mut [f32], bias: &[f32]) -> Result<()> {
    let dim = bias.len();
    ensure!(
        dim > 0 && x.len().is_multiple_of(dim),
        "add_bias: x has {} elements, not a whole number of rows of bias dim {}",
        x.len(),
        dim
    );
    let rows_per = (ELEM_CHUNK / dim).max(1);
    x.par_chunks_mut(rows_per * dim).for_each(|xc| {
        for row in xc.chunks_exact_mut(dim) {
            for (a, &b) in row.iter_mut().zip(bias) {
                *a += b;
            }
        }
    });
    Ok(())
}
