//! `MatMuls` with its input's RMS norm (`OpT::MatMuls::norm`):
//! `rms_norm_fast` (or the canonical norm in `exact`) into the op's
//! scratch, then the matmuls, exactly as an `RmsNorm` op then a `MatMuls`
//! op.
//!
//! A fold of the norm into the one-row matvecs (every CTA normalizing and
//! quantizing the row itself in shared memory, commit 6387180) was measured on an H100 on 2026-11-26 and removed: the
//! 1B Q4_0 decode ran 14% slower (1,448 -> 1,246 tok/s; every CTA of every
//! wave repeats the row's L2 read and block reduction before its first
//! weight load), SmolLM2 +0.4% (docs/PERF.md).

use super::prepared::act_read;
use crate::backend::cuda::device::memory::Dev;
use crate::backend::cuda::CudaBackend;
use crate::backend::{validate, MatJob, Mode};
use anyhow::Result;
use cudarc::driver::{CudaView, CudaViewMut};

impl CudaBackend {
    /// jobs' products of rms_norm(x) (the norm's weights `w` (k,), `eps`,
    /// scratch `out` (n, k)): validated, then `d_rms_norm` into `out` and
    /// `d_mat_muls` of `out`, the bits of an `RmsNorm` op then a `MatMuls`
    /// op.
    #[allow(clippy::too_many_arguments)] // the op's fields
    pub(crate) fn d_mat_muls_norm(
        &self,
        x: &CudaView<'_, f32>,
        w: &CudaView<'_, f32>,
        eps: f32,
        out: &mut CudaViewMut<'_, f32>,
        n: usize,
        jobs: &mut [MatJob<'_, Dev>],
        mode: Mode,
    ) -> Result<()> {
        let k = jobs
            .first()
            .map(|j| j.w.cols)
            .ok_or_else(|| anyhow::anyhow!("mat_muls: no jobs"))?;
        validate::mat_muls_norm(x.len(), k, w.len(), out.len())?;
        // The products' plan is this op's: the norm writes the layout they
        // read (norm -> quantize -> matmul, fusion.rs), with or without an
        // annotation; where it could not, they prepare their own.
        let read = act_read(&self.mm_plan(&out.as_view(), n, jobs, mode));
        let wrote = self.d_rms_norm_for(x, w, k, eps, out, mode, read)?;
        // Those blocks are the op's input, not the output it writes for
        // the next op (its SwiGlu's: `finish_out_for_next`).
        self.forget_op_wrote();
        self.mat_muls_in(&out.as_view(), n, jobs, mode, Some(wrote))
    }
}
