//! `NormMatMuls`: RmsNorm, then the matmuls of its output. At decode (one
//! activation row, `fast` / `deterministic`, quantized weights of a small
//! matrix) one launch of `mv_q8_norm_r1*` does both: every CTA normalizes
//! the row itself with rms_norm_fast's code and reads its int8 copy from
//! shared memory, so the norm's launch leaves the step's critical path.
//! Elsewhere the two ops run as they would apart. The bits are the same
//! either way (the same q8_block arithmetic on the same normalized values).

use super::matmul::{job_table, mm_dims, mv_grid, mv_name, mv_warps};
use super::{dev_ptr, dev_ptr_mut};
use crate::backend::cuda::mem::Dev;
use crate::backend::cuda::{drv, CudaBackend};
use crate::backend::{validate, MatJob, Mode, WeightInfo};
use crate::quant::GgmlType;
use anyhow::Result;
use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

/// The fused kernels, as `mv_name` indexes a family (the grouped slot is
/// never used: the fused form takes one activation row).
const MV_Q8_NORM: [&str; 4] = [
    "mv_q8_norm_r1",
    "mv_q8_norm_r1",
    "mv_q8_norm_r1_w2",
    "mv_q8_norm_r1_w4",
];

/// Largest weight bytes of one NormMatMuls that take the fused kernel
/// (`QUIRE_NORM_FUSE_MB`, default 8; 0 turns the fusion off). Every CTA of
/// the fused launch reads the activation row and the norm weights (8 bytes
/// per column, from L2) besides its 8 weight rows, about 1.8x the weight
/// bytes for Q4_0: free while a matvec is latency-bound (small matrices),
/// a cost once it streams at full bandwidth.
fn norm_fuse_limit() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("QUIRE_NORM_FUSE_MB")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(8)
            << 20
    })
}

/// Whether a NormMatMuls of `weight_bytes` over rows of `dim` takes the
/// fused kernel: one activation row, quantized weights (the dp4a kernels),
/// dim a multiple of 32 (the int8 blocks) that fits the default 48 KiB of
/// shared memory (dim int8 + dim / 32 float2), 16-byte aligned rows (the
/// norm's float4 form), and at most `limit` weight bytes.
pub(super) fn norm_fused(
    n: usize,
    dim: usize,
    float_w: bool,
    aligned: bool,
    weight_bytes: usize,
    limit: usize,
) -> bool {
    n == 1
        && !float_w
        && dim > 0
        && dim.is_multiple_of(32)
        && dim + dim / 4 <= 48 * 1024
        && aligned
        && weight_bytes <= limit
}

impl CudaBackend {
    /// NormMatMuls on device buffers: x, out (n, dim); w (dim,); the jobs
    /// as MatMuls of out (validated here).
    #[allow(clippy::too_many_arguments)] // the op's fields
    pub(crate) fn d_norm_mat_muls(
        &self,
        x: &CudaView<'_, f32>,
        w: &CudaView<'_, f32>,
        dim: usize,
        eps: f32,
        out: &mut CudaViewMut<'_, f32>,
        n: usize,
        jobs: &mut [MatJob<'_, Dev>],
        mode: Mode,
    ) -> Result<()> {
        validate::rms_norm(x.len(), w.len(), dim, out.len())?;
        let shapes: Vec<(&dyn WeightInfo, usize)> = jobs
            .iter()
            .map(|j| (&j.w as &dyn WeightInfo, j.out.len()))
            .collect();
        validate::mat_muls(out.len(), n, &shapes)?;
        let s = self.stream();
        let ty = jobs[0].w.ty;
        let float_w = matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
        let aligned = [dev_ptr(x, s), dev_ptr(w, s), dev_ptr_mut(out, s)]
            .iter()
            .all(|p| p.is_multiple_of(16));
        let bytes: usize = jobs.iter().map(|j| j.w.data.len()).sum();
        let fused = mode != Mode::Exact
            && self.prequant
            && jobs.iter().all(|j| j.w.rows > 0)
            && norm_fused(n, dim, float_w, aligned, bytes, norm_fuse_limit());
        if !fused {
            self.d_rms_norm(x, w, dim, eps, out, mode)?;
            let h = out.slice(0..out.len());
            return self.d_mat_muls(&h, n, jobs, mode);
        }
        // The arena's int8 copy of the normalized row, written by CTA 0
        // for a later matmul of `out` (q8_out: the key mat_vec_q8 looks
        // up); every launch condition above makes q8_out answer Some.
        let Some((key, xq, xds)) = self.q8_out(out, Some(n), dim, mode)? else {
            self.d_rms_norm(x, w, dim, eps, out, mode)?;
            let h = out.slice(0..out.len());
            return self.d_mat_muls(&h, n, jobs, mode);
        };
        let m: usize = jobs.iter().map(|j| j.w.rows).sum();
        let long_rows = dim >= 3 * m;
        let warps = mv_warps(mode, n, false, long_rows);
        let d = mm_dims(&jobs[0].w, n)?;
        let outs = Self::out_ranges(jobs, s);
        let (table, ctas) = job_table(jobs, 8 / warps, s)?;
        let mut cfg = mv_grid(n, ctas)?;
        cfg.shared_mem_bytes = u32::try_from(dim + dim / 4)?;
        let mut b = s.launch_builder(self.func(mv_name(n, warps, MV_Q8_NORM))?);
        b.arg(&table)
            .arg(&d.ki)
            .arg(&d.rb)
            .arg(&d.tc)
            .arg(x)
            .arg(w)
            .arg(&eps)
            .arg(&mut *out)
            .arg(&xq)
            .arg(&xds);
        // SAFETY: matches mv_q8_norm_r1*: the job table as mat_vec's (8 /
        // warps rows per CTA; each job's weights m rows of rb bytes, its
        // output m floats, n = 1); x, w, out dim floats, 16-byte aligned,
        // dim a multiple of 32 (`norm_fused`); dim + dim / 4 bytes of
        // dynamic shared memory; xq / xds arena regions of dim bytes and
        // dim / 32 float2 (q8_out).
        drv(unsafe { b.launch(cfg) }, "norm_mat_muls: launching mv_q8_norm")?;
        self.act_remember(key, &outs);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::norm_fused;

    #[test]
    fn fused_form_only_where_its_kernel_applies() {
        let mb = 8 << 20;
        // SmolLM2 / 1B / 8B decode shapes of small matrices.
        assert!(norm_fused(1, 576, false, true, 1 << 20, mb));
        assert!(norm_fused(1, 4096, false, true, mb, mb));
        // Batches, float weights, odd or huge rows, misaligned buffers and
        // large matrices keep the two launches.
        assert!(!norm_fused(2, 576, false, true, 1 << 20, mb));
        assert!(!norm_fused(1, 576, true, true, 1 << 20, mb));
        assert!(!norm_fused(1, 100, false, true, 1 << 20, mb));
        assert!(!norm_fused(1, 65536, false, true, 1 << 20, mb));
        assert!(!norm_fused(1, 576, false, false, 1 << 20, mb));
        assert!(!norm_fused(1, 4096, false, true, mb + 1, mb));
        assert!(!norm_fused(1, 4096, false, true, 1, 0));
    }
}
