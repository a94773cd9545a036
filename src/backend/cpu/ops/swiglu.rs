//! out = silu(gate) * up (canonical silu).

use super::ELEM_CHUNK;
use crate::backend::cpu::canon;
use anyhow::{ensure, Result};
use rayon::prelude::*;

/// gate, up, out: (len,).
pub fn run(gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<()> {
    ensure!(
        gate.len() == up.len() && up.len() == out.len(),
        "swiglu: gate {} / up {} / out {} elements differ",
        gate.len(),
        up.len(),
        out.len()
    );
    out.par_chunks_mut(ELEM_CHUNK)
        .enumerate()
        .for_each(|(c, oc)| {
            let base = c * ELEM_CHUNK;
            for (i, o) in oc.iter_mut().enumerate() {
                *o = canon::silu(gate[base + i]) * up[base + i];
            }
        });
    Ok(())
}
