//! RMS norm launches: the canonical kernel (rms_norm.cu, every mode's
//! reference) and the fast one (rms_norm_fast.cu: float4 rows, the
//! output optionally quantized for the next matmul in the same pass), and
//! the thread count that fixes a fast row's sum order.

use super::super::{drv, grid_1d, i32_of, CudaBackend};
use crate::backend::cuda::device::launch::{dev_ptr, dev_ptr_mut};
use crate::backend::cuda::fusion::ActRead;
use crate::backend::{validate, Mode};
use anyhow::Result;
use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

impl CudaBackend {
    /// `rms_norm_fast` over n rows of dim (`di`) values, the output also
    /// quantized into (xq, xds) where those are not null.
    ///
    /// # Safety
    /// x and out hold n * dim floats, w dim; with `vec4` every row is
    /// 16-byte aligned (x, w, out); xq / xds are null, or (vec4, dim a
    /// multiple of 32) device regions of n * dim bytes and n * dim / 32
    /// float2.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn rms_norm_fast(
        &self,
        x: &CudaView<'_, f32>,
        w: &CudaView<'_, f32>,
        n: usize,
        (di, eps): (i32, f32),
        vec4: bool,
        out: &mut CudaViewMut<'_, f32>,
        (xq, xds): (u64, u64),
    ) -> Result<()> {
        let cfg = LaunchConfig {
            grid_dim: (u32::try_from(n)?, 1, 1),
            block_dim: (rms_threads(di as usize, vec4), 1, 1),
            shared_mem_bytes: 0,
        };
        let v4 = i32::from(vec4);
        let mut b = self.stream().launch_builder(self.func("rms_norm_fast")?);
        b.arg(x)
            .arg(w)
            .arg(&di)
            .arg(&eps)
            .arg(&v4)
            .arg(&mut *out)
            .arg(&xq)
            .arg(&xds);
        // SAFETY: matches rms_norm_fast; the caller's contract covers the
        // buffers; a CTA per row.
        drv(unsafe { b.launch(cfg) }, "rms_norm: launch")?;
        Ok(())
    }

    /// An `RmsNorm` op: the matmul that reads its output is the next op's,
    /// as the fusion pass planned it where the op has an annotation (none
    /// written without one); written in that layout also where the fused
    /// kernel could not (`finish_out_for_next`).
    pub(crate) fn d_rms_norm(
        &self,
        x: &CudaView<'_, f32>,
        w: &CudaView<'_, f32>,
        dim: usize,
        eps: f32,
        out: &mut CudaViewMut<'_, f32>,
        mode: Mode,
    ) -> Result<()> {
        let reader = self.current_fusion().and_then(|f| f.out_for_next);
        self.d_rms_norm_for(x, w, dim, eps, out, mode, reader)?;
        let rows = out.len().checked_div(dim);
        self.finish_out_for_next(&out.as_view(), rows, mode)
    }

    /// rms_norm of x (n rows of dim) into `out`; outside `exact`, also
    /// written in the layout the matmul that reads `out` next takes
    /// (`reader`: Q8 or F16Wr; None: none) where the buffers allow (the
    /// same bits: fusion.rs). Returns whether it wrote that layout.
    #[allow(clippy::too_many_arguments)] // the op's fields
    pub(crate) fn d_rms_norm_for(
        &self,
        x: &CudaView<'_, f32>,
        w: &CudaView<'_, f32>,
        dim: usize,
        eps: f32,
        out: &mut CudaViewMut<'_, f32>,
        mode: Mode,
        reader: Option<ActRead>,
    ) -> Result<bool> {
        let n = validate::rms_norm(x.len(), w.len(), dim, out.len())?;
        if n == 0 {
            return Ok(false);
        }
        let (ni, di) = (i32_of(n, "rows")?, i32_of(dim, "dim")?);
        // 16-byte loads when every row starts 16-byte aligned.
        let st = self.stream();
        let vec4 = i32::from(
            dim.is_multiple_of(4)
                && dev_ptr(x, st).is_multiple_of(16)
                && dev_ptr(w, st).is_multiple_of(16)
                && dev_ptr_mut(out, st).is_multiple_of(16),
        );
        if mode != Mode::Exact {
            let pre = if vec4 == 1 {
                self.q8_out_for(out, reader, dim, mode)?
            } else {
                None
            };
            let (xq, xds) = pre.map_or((0u64, 0u64), |(_, q, d)| (q, d));
            // The wgmma GEMM's f16 tiles (prefill rows, mutually exclusive
            // with q8_out's decode rows); the grid then covers whole tiles.
            let f16 = if vec4 == 1 && pre.is_none() {
                self.f16wr_out_for(out, n, dim, mode, reader)?
            } else {
                None
            };
            if let Some((key, x16)) = f16 {
                let rows = n.div_ceil(256) * 256;
                let cfg = LaunchConfig {
                    grid_dim: (u32::try_from(rows)?, 1, 1),
                    block_dim: (rms_threads(dim, true), 1, 1),
                    shared_mem_bytes: 0,
                };
                let mut b = self
                    .stream()
                    .launch_builder(self.func("rms_norm_fast_f16wr")?);
                b.arg(x)
                    .arg(w)
                    .arg(&ni)
                    .arg(&di)
                    .arg(&eps)
                    .arg(&mut *out)
                    .arg(&x16);
                // SAFETY: matches rms_norm_fast_f16wr; n*dim inputs/outputs,
                // 16-byte aligned (vec4), dim weights; x16 an arena region
                // of `rows` x dim halves, dim a multiple of 256 (f16wr_out);
                // a grid of `rows` CTAs.
                drv(unsafe { b.launch(cfg) }, "rms_norm: launch")?;
                self.q8_done(key);
                return Ok(true);
            }
            // SAFETY: vec4 only with 16-byte aligned rows (above); xq /
            // xds null, or (vec4, dim a multiple of 32) arena regions of
            // n*dim bytes and n*dim/32 float2 (q8_out).
            unsafe { self.rms_norm_fast(x, w, n, (di, eps), vec4 == 1, out, (xq, xds)) }?;
            if let Some((key, _, _)) = pre {
                self.q8_done(key);
                return Ok(true);
            }
            return Ok(false);
        }
        // Rows that fit the default 48 KiB of shared memory take the
        // block-per-row kernel (same bits, far less latency-bound).
        if dim * 4 <= 48 * 1024 {
            let cfg = LaunchConfig {
                grid_dim: (u32::try_from(n)?, 1, 1),
                block_dim: (rms_threads(dim, vec4 == 1), 1, 1),
                shared_mem_bytes: (dim * 4) as u32,
            };
            let mut b = self.stream().launch_builder(self.func("rms_norm_block")?);
            b.arg(x).arg(w).arg(&di).arg(&eps).arg(&vec4).arg(out);
            // SAFETY: matches rms_norm_block; n*dim inputs/outputs, dim
            // weights, dim floats of dynamic shared memory; vec4 only with
            // 16-byte aligned rows.
            drv(unsafe { b.launch(cfg) }, "rms_norm: launch")?;
            return Ok(false);
        }
        let mut b = self.stream().launch_builder(self.func("rms_norm")?);
        b.arg(x).arg(w).arg(&ni).arg(&di).arg(&eps).arg(out);
        // SAFETY: matches rms_norm; n*dim inputs/outputs, dim weights.
        drv(
            unsafe { b.launch(grid_1d(n * 32, 256)?) },
            "rms_norm: launch",
        )?;
        Ok(false)
    }
}

/// Threads of an `rms_norm_fast` / `rms_norm_fast_f16wr` / `rms_norm_block`
/// CTA (one per row): with float4 rows, one float4 per thread up to 1,024
/// threads (a multiple of 32, at least one warp), else 256, so each
/// phase is one round of loads for rows up to 4,096 (256 threads took
/// four dependent rounds in the output loop: 6.1 us for a 4,096 row
/// under ncu on an H200). A function of `dim` alone, the same for the
/// two fast kernels, so a fast row's sum order, and with it its bits,
/// never depends on the batch or on which kernel ran it;
/// `rms_norm_block`'s canonical order does not depend on its thread
/// count at all.
fn rms_threads(dim: usize, vec4: bool) -> u32 {
    if !vec4 {
        return 256;
    }
    // dim / 4 float4s, rounded up to whole warps: at most 1,024.
    (dim / 4).next_multiple_of(32).clamp(32, 1024) as u32
}

#[cfg(test)]
mod tests {
    use super::rms_threads;

    #[test]
    fn one_float4_per_thread_up_to_1024() {
        // SmolLM2, the 1B, the 8B, a 14336-wide row, a tiny one.
        assert_eq!(rms_threads(576, true), 160);
        assert_eq!(rms_threads(2048, true), 512);
        assert_eq!(rms_threads(4096, true), 1024);
        assert_eq!(rms_threads(14336, true), 1024);
        assert_eq!(rms_threads(64, true), 32);
        assert_eq!(rms_threads(4096, false), 256);
    }
}
