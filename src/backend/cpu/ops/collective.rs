//! Tensor-parallel collectives (`backend::tp`) on the cpu backend: the rank's
//! communicator moves the data (NCCL's all-gather and all-reduce), these
//! functions do the arithmetic around it, the same steps as the cuda
//! backend's `tp_interleave` and `tp_sum_ranks` kernels.

use crate::backend::tp::{Communicator, ReduceOrder};
use crate::backend::validate;
use anyhow::Result;

/// `AllGather`: every rank's x (n, w) into out (n, world * w), rank r's
/// part at columns `[r * w, (r + 1) * w)`; with `add`, added to out.
pub fn all_gather(
    comm: &dyn Communicator,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    add: bool,
) -> Result<()> {
    let world = comm.world();
    validate::all_gather(x.len(), n, out.len(), world)?;
    let mut parts = vec![0f32; out.len()]; // (world, n, w)
    comm.all_gather(x, &mut parts)?;
    interleave(&parts, n, world, out, add);
    Ok(())
}

/// parts (world, n, w) rank-major into out (n, world * w); with `add`,
/// `out + part` (one rounding).
pub fn interleave(parts: &[f32], n: usize, world: usize, out: &mut [f32], add: bool) {
    let w = parts.len() / (world * n).max(1);
    for (r, part) in parts.chunks_exact(n * w).enumerate() {
        for (i, src) in part.chunks_exact(w).enumerate() {
            let dst = &mut out[i * world * w + r * w..][..w];
            if add {
                dst.iter_mut().zip(src).for_each(|(o, s)| *o += s);
            } else {
                dst.copy_from_slice(src);
            }
        }
    }
}

/// `AllReduce`: out += Σ_r x_r. `Fixed`: every rank's x gathered and
/// summed here in rank order; `Any`: the communicator's sum.
pub fn all_reduce(
    comm: &dyn Communicator,
    x: &[f32],
    out: &mut [f32],
    order: ReduceOrder,
) -> Result<()> {
    validate::same_len("all_reduce", &[x.len(), out.len()])?;
    match order {
        ReduceOrder::Fixed => {
            let mut parts = vec![0f32; x.len() * comm.world()];
            comm.all_gather(x, &mut parts)?;
            sum_ranks(&parts, comm.world(), out);
        }
        ReduceOrder::Any => {
            let mut sum = vec![0f32; x.len()];
            comm.all_reduce_sum(x, &mut sum)?;
            sum_ranks(&sum, 1, out);
        }
    }
    Ok(())
}

/// parts (world, len): `out[e] = out[e] + (((p0 + p1) + p2) + ...)`.
pub fn sum_ranks(parts: &[f32], world: usize, out: &mut [f32]) {
    let len = out.len();
    for (e, o) in out.iter_mut().enumerate() {
        let mut s = parts[e];
        for r in 1..world {
            s += parts[r * len + e];
        }
        *o += s;
    }
}
