//! out = silu(gate) * up (canonical silu).

use super::{for_chunks, ELEM_CHUNK};
use crate::backend::cpu::canon;
use anyhow::{ensure, Result};

/// gate, up, out: (len,).
pub fn run(par: bool, gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<()> {
    ensure!(
        gate.len() == up.len() && up.len() == out.len(),
        "swiglu: gate {} / up {} / out {} elements differ",
        gate.len(),
        up.len(),
        out.len()
    );
    for_chunks(par, out, ELEM_CHUNK, |c, oc| {
        let base = c * ELEM_CHUNK;
        for (i, o) in oc.iter_mut().enumerate() {
            *o = canon::silu(gate[base + i]) * up[base + i];
        }
    });
    Ok(())
}
