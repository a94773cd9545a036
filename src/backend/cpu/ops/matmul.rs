//! out = x · wᵀ for every weight type. Activations are quantized once per
//! call (canonically); threads split output columns (weight rows) in fixed
//! chunks; each output element is one canonical dot, so the result is
//! independent of thread count and batch composition.

use super::dot::actq::{Act32, ActK};
use super::dot::{dot_q32_rows, dot_qk, float, Act32Row};
use crate::backend::cpu::{Isa, SendPtr};
use crate::backend::QMatrix;
use crate::quant::GgmlType;
use anyhow::{ensure, Result};

/// Activation rows per tile: a weight row is loaded once (into L1) and
/// dotted against this many activation rows.
const ROW_TILE: usize = 8;

/// w: (m, k); x: (n, k); out: (n, m).
pub fn run(
    par: crate::backend::cpu::pool::Par<'_>,
    isa: Isa,
    n_threads: usize,
    w: QMatrix<'_>,
    x: &[f32],
    n: usize,
    out: &mut [f32],
) -> Result<()> {
    let (m, k) = (w.rows, w.cols);
    ensure!(
        !matches!(w.ty, GgmlType::Q8_1 | GgmlType::Q8_K),
        "mat_mul: {:?} is an activation type, not a weight type",
        w.ty
    );
    let rb = crate::backend::validate::mat_mul(&w, w.data.len(), x.len(), n, out.len())?;
    if n == 0 || m == 0 {
        return Ok(());
    }
    if k == 0 {
        out.fill(0.0);
        return Ok(());
    }
    enum Acts {
        F(),
        Q(Act32),
        K(ActK),
    }
    let acts = match w.ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => Acts::F(),
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
            Acts::K(ActK::quantize(par, isa, x, n, k))
        }
        _ => Acts::Q(Act32::quantize(par, isa, x, n, k)),
    };
    let _ = n_threads;
    let outp = SendPtr(out.as_mut_ptr());
    let ty = w.ty;
    // Output columns (weight rows) [j0, j1) for all n activation rows.
    let task = |j0: usize, j1: usize| {
        let mut tile_out = [0f32; ROW_TILE];
        for i0 in (0..n).step_by(ROW_TILE) {
            let i1 = (i0 + ROW_TILE).min(n);
            let nr = i1 - i0;
            // Quantized activation rows of this tile (built once per tile).
            let rows: Option<[Act32Row<'_>; ROW_TILE]> = match &acts {
                Acts::Q(a) => Some(std::array::from_fn(|t| a.row((i0 + t).min(i1 - 1)))),
                _ => None,
            };
            for j in j0..j1 {
                let wr = &w.data[j * rb..(j + 1) * rb];
                match &acts {
                    Acts::F() => {
                        for (t, i) in (i0..i1).enumerate() {
                            let xr = &x[i * k..(i + 1) * k];
                            tile_out[t] = match ty {
                                GgmlType::F16 => float::dot_f16_bytes(isa, xr, wr),
                                GgmlType::BF16 => float::dot_bf16_bytes(isa, xr, wr),
                                _ => float::dot_f32_bytes(isa, xr, wr),
                            };
                        }
                    }
                    Acts::Q(_) => {
                        if let Some(rows) = &rows {
                            dot_q32_rows(isa, ty, wr, &rows[..nr], &mut tile_out[..nr]);
                        }
                    }
                    Acts::K(a) => {
                        for (t, i) in (i0..i1).enumerate() {
                            tile_out[t] = dot_qk(isa, ty, wr, a.row(i));
                        }
                    }
                }
                for (t, &v) in tile_out[..nr].iter().enumerate() {
                    // SAFETY: element (i0 + t, j) is written by exactly one
                    // task (the one owning column chunk [j0, j1)); i < n and
                    // j < m so the index is < out.len(); `out` outlives this
                    // parallel loop.
                    unsafe { *outp.get().add((i0 + t) * m + j) = v };
                }
            }
        }
    };
    // The split of weight rows among threads never changes any element's
    // arithmetic. Few activation rows (decode): one contiguous range per
    // thread (a multiple of 8 rows), no hand-offs. Many (prefill): chunks
    // claimed dynamically, for balance.
    let nt = par.n_threads();
    if n <= SMALL_N {
        let per = m.div_ceil(nt).next_multiple_of(8);
        par.for_threads(|t, _| {
            let j0 = (t * per).min(m);
            let j1 = (j0 + per).min(m);
            if j0 < j1 {
                task(j0, j1);
            }
        });
    } else {
        let chunk = m.div_ceil(nt * 4).clamp(1, 256);
        par.for_tasks(m.div_ceil(chunk), |c| {
            let j0 = c * chunk;
            task(j0, (j0 + chunk).min(m));
        });
    }
    Ok(())
}

/// Activation rows up to which threads split the weight rows statically.
const SMALL_N: usize = 4;

/// `MatMuls`: each job's product in turn, as the composition MatMul then
/// Add (the product lands in a temporary and is added once, in order).
pub fn run_jobs(
    par: crate::backend::cpu::pool::Par<'_>,
    isa: Isa,
    n_threads: usize,
    x: &[f32],
    n: usize,
    jobs: &mut [crate::backend::MatJob<'_, crate::backend::Host>],
) -> Result<()> {
    let shapes: Vec<(&dyn crate::backend::WeightInfo, usize)> = jobs
        .iter()
        .map(|j| (&j.w as &dyn crate::backend::WeightInfo, j.out.len()))
        .collect();
    crate::backend::validate::mat_muls(x.len(), n, &shapes)?;
    for j in jobs.iter_mut() {
        if j.add {
            let mut tmp = vec![0f32; j.out.len()];
            run(par, isa, n_threads, j.w, x, n, &mut tmp)?;
            super::add::add(par, j.out, &tmp)?;
        } else {
            run(par, isa, n_threads, j.w, x, n, j.out)?;
        }
    }
    Ok(())
}
