//! Row-wise RMS norm: ss = dot32(x, x); scale = rsqrt(ss / dim + eps);
//! out = (x * scale) * w.

use super::dot::float::dot_f32;
use super::for_chunks;
use crate::backend::cpu::{canon, Isa};
use anyhow::Result;

/// x, out: (n, dim); w: (dim,).
pub fn run(
    par: crate::backend::cpu::pool::Par<'_>,
    isa: Isa,
    x: &[f32],
    w: &[f32],
    dim: usize,
    eps: f32,
    out: &mut [f32],
) -> Result<()> {
    crate::backend::validate::rms_norm(x.len(), w.len(), dim, out.len())?;
    for_chunks(par, out, dim, |r, o| {
        let xr = &x[r * dim..(r + 1) * dim];
        let ss = dot_f32(isa, xr, xr);
        let mean = ss / dim as f32;
        let scale = canon::rsqrt(mean + eps);
        for ((o, &v), &g) in o.iter_mut().zip(xr).zip(w) {
            *o = (v * scale) * g;
        }
    });
    Ok(())
}
