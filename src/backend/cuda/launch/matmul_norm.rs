//! `MatMuls` with its input's RMS norm (`OpT::MatMuls::norm`): by default
//! `rms_norm_fast` (or the canonical norm in `exact`) into the op's scratch,
//! then the matmuls, exactly as an `RmsNorm` op then a `MatMuls` op; with
//! `QUIRE_NORM_FOLD=1`, one-row decode in `fast` / `deterministic` folds
//! the norm into the warp-per-row matvec (`mv_q8_r1_n*`: every CTA
//! normalizes and quantizes the row itself, in shared memory, with
//! rms_norm_fast's arithmetic), so the norm's own launch and its global
//! round trip leave the decode step.
//!
//! Why opt-in: written on 2026-11-25 without device time left to run it,
//! so neither its parity nor its speed has been seen on a GPU. Counted
//! first: skipping `rms_norm_fast` outright (timing only, 2026-11-23) ran
//! SmolLM2 decode 8% and the 1B's 17% faster; the fold keeps an L2 read
//! of the row and a block reduction in each CTA. `scripts/gpu-check.sh`
//! runs the parity cases with the fold on (`ops --op mat_muls_norm`: each
//! case also bitwise against the backend's own `RmsNorm` then `MatMuls`),
//! and `check-exact --mode fast|deterministic` compares a folded run
//! against the unfused reference (`prequant` off, which never folds)
//! bitwise at every step.

use super::matmul::{job_table, mm_dims, mma_rows, mq_min_rows, mv_grid, mv_name, mv_warps};
use super::matmul_mma::mq_takes;
use super::{dev_ptr, dev_ptr_mut};
use crate::backend::cuda::mem::Dev;
use crate::backend::cuda::{drv, i32_of, CudaBackend};
use crate::backend::{validate, MatJob, Mode};
use crate::quant::GgmlType;
use anyhow::Result;
use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

/// The folded kernels, indexed like `mv_name`'s families.
const MV_Q8_NORM: [&str; 4] = ["", "mv_q8_r1_n", "mv_q8_r1_w2_n", "mv_q8_r1_w4_n"];

/// Largest k the fold takes: its shared memory holds the row's int8 values
/// and block scales (1.25 k bytes) within the default 48 KiB.
const FOLD_MAX_K: usize = 32 * 1024;

/// QUIRE_NORM_FOLD=1 turns the fold on (see the module doc).
pub(crate) fn norm_fold_wanted() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var("QUIRE_NORM_FOLD").as_deref() == Ok("1"))
}

/// Whether `d_mat_muls` would run these `n` rows of `ty` weights through
/// the int8 warp-per-row kernels (`mat_vec_q8`), whose one-row form the
/// fold replaces, and the fold's own limits hold: one row, not `exact`,
/// a quantized type, k a multiple of 32 (whole quant_q8 blocks, float4
/// loads) up to FOLD_MAX_K, not the tensor-core kernels some row-count
/// knobs send a single row to.
pub(super) fn fold_shape_ok(mode: Mode, n: usize, ty: GgmlType, k: usize) -> bool {
    let float_w = matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
    let (lo, hi) = mma_rows();
    let mma = mode == Mode::Fast && n > mq_min_rows() && n <= hi && mq_takes(ty, k);
    let tile = mode == Mode::Fast && n > lo && n <= hi;
    mode != Mode::Exact
        && n == 1
        && !float_w
        && k > 0
        && k.is_multiple_of(32)
        && k <= FOLD_MAX_K
        && !mma
        && !tile
}

impl CudaBackend {
    /// jobs' products of rms_norm(x) (the norm's weights `w` (k,), `eps`,
    /// scratch `out` (n, k)): validated, then folded (see the module doc)
    /// or `d_rms_norm` into `out` and `d_mat_muls` of `out`, the bits of
    /// an `RmsNorm` op then a `MatMuls` op either way.
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
        let (ty, k) = jobs
            .first()
            .map(|j| (j.w.ty, j.w.cols))
            .ok_or_else(|| anyhow::anyhow!("mat_muls: no jobs"))?;
        validate::mat_muls_norm(x.len(), k, w.len(), out.len())?;
        // The scratch is about to be rewritten (or, folded, left stale):
        // no cached activation may claim it.
        self.forget_activations();
        let s = self.stream();
        // Not in check-exact's unfused reference (`prequant` off), which so
        // checks the fold bitwise. Only where the unfused norm would take
        // rms_norm_fast's float4 path (x, w and out 16-byte aligned): the
        // scalar path sums in another order.
        let fold = self.prequant
            && norm_fold_wanted()
            && fold_shape_ok(mode, n, ty, k)
            && dev_ptr(x, s).is_multiple_of(16)
            && dev_ptr(w, s).is_multiple_of(16)
            && dev_ptr_mut(out, s).is_multiple_of(16);
        if !fold {
            self.d_rms_norm(x, w, k, eps, out, mode)?;
            return self.d_mat_muls(&out.as_view(), n, jobs, mode);
        }
        let shapes: Vec<(&dyn crate::backend::WeightInfo, usize)> = jobs
            .iter()
            .map(|j| (&j.w as &dyn crate::backend::WeightInfo, j.out.len()))
            .collect();
        validate::mat_muls(x.len(), n, &shapes)?;
        self.last_mv_q8
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let m: usize = jobs.iter().map(|j| j.w.rows).sum();
        let warps = mv_warps(mode, n, false, k >= 3 * m);
        let d = mm_dims(&jobs[0].w, n)?;
        let (table, ctas) = job_table(jobs, 8 / warps, s)?;
        let mut cfg = mv_grid(n, ctas)?;
        // xq (k int8) then xds (k / 32 float2, 8-byte aligned: k is a
        // multiple of 32).
        cfg.shared_mem_bytes = u32::try_from(k + 8 * (k / 32))?;
        let name = mv_name(n, warps, MV_Q8_NORM);
        let ki = i32_of(k, "k")?;
        let mut b = s.launch_builder(self.func(name)?);
        b.arg(&table)
            .arg(&ki)
            .arg(&d.rb)
            .arg(&d.tc)
            .arg(x)
            .arg(w)
            .arg(&eps);
        // SAFETY: matches mv_q8_r1_n and its split-row variants (8 / warps
        // rows per CTA, as the job table); each job's weights hold m rows
        // of rb bytes and its output m floats (validated, n = 1); x and w
        // hold k floats, 16-byte aligned, k a multiple of 32; the dynamic
        // shared memory holds k int8 and k / 32 float2.
        drv(unsafe { b.launch(cfg) }, "mat_muls: launching mv_q8_r1_n")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_takes_one_quantized_row_outside_exact() {
        if [
            "QUIRE_MMA_MIN_ROWS",
            "QUIRE_MMA_MAX_ROWS",
            "QUIRE_MQ_MIN_ROWS",
        ]
        .iter()
        .any(|v| std::env::var(v).is_ok())
        {
            eprintln!("SKIPPED: a row-count knob is set");
            return;
        }
        let q4 = GgmlType::Q4_0;
        assert!(fold_shape_ok(Mode::Fast, 1, q4, 2048));
        assert!(fold_shape_ok(Mode::Deterministic, 1, GgmlType::Q6_K, 4096));
        assert!(!fold_shape_ok(Mode::Exact, 1, q4, 2048));
        assert!(!fold_shape_ok(Mode::Fast, 2, q4, 2048));
        assert!(!fold_shape_ok(Mode::Fast, 1, GgmlType::F16, 2048));
        assert!(!fold_shape_ok(Mode::Fast, 1, q4, 2048 + 16));
        assert!(!fold_shape_ok(Mode::Fast, 1, q4, FOLD_MAX_K + 32));
        assert!(!fold_shape_ok(Mode::Fast, 1, q4, 0));
    }

    #[test]
    fn folded_kernel_names_follow_the_families() {
        assert_eq!(mv_name(1, 1, MV_Q8_NORM), "mv_q8_r1_n");
        assert_eq!(mv_name(1, 2, MV_Q8_NORM), "mv_q8_r1_w2_n");
        assert_eq!(mv_name(1, 4, MV_Q8_NORM), "mv_q8_r1_w4_n");
    }
}
