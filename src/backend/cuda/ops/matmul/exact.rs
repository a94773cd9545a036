//! Matmul launches of `exact` mode: the canonical kernels (bitwise equal to
//! the cpu), for every job of a `MatMuls` op.

use super::{job_table, mm_dims, ExactForm, MmDims};
use crate::backend::cuda::device::launch::arena3;
use crate::backend::cuda::device::memory::{Dev, DevMatrix};
use crate::backend::cuda::{drv, grid_1d, CudaBackend};
use crate::backend::MatJob;
use crate::quant::GgmlType;
use anyhow::Result;
use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

/// The exact decode matvecs: several rows, one row.
pub(super) const MV_EXACT: [&str; 2] = ["mv_exact32", "mv_exact32_r1"];

/// The exact decode matvec for `n` activation rows: `_r1` for one row.
fn mv_exact_name(n: usize) -> &'static str {
    MV_EXACT[(n == 1) as usize]
}

impl CudaBackend {
    /// The canonical kernels for validated jobs (n, m, k > 0) in the
    /// planned form: 32-block weights quantize the activations once
    /// (prepared by the op before where `pre`) and run every job in one
    /// mv_exact32 launch for decode (`ExactForm::Matvec`), in one
    /// mm_exact_mma launch (`ExactForm::Mma`) or mm_q32 per job; float
    /// and K-quant weights run job by job.
    pub(super) fn mat_muls_exact(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        jobs: &mut [MatJob<'_, Dev>],
        form: ExactForm,
        pre: bool,
    ) -> Result<()> {
        let ty = jobs[0].w.ty;
        if matches!(form, ExactForm::Float | ExactForm::KQuant) {
            for j in jobs.iter_mut() {
                self.mat_mul_exact_one(&j.w, x, n, &mut j.out, j.add)?;
            }
            return Ok(());
        }
        let k = jobs[0].w.cols;
        let s = self.stream();
        let nb = k / 32;
        // qs: (n, k) i16; ad: (n, nb); asum: (2, n, nb), the float sums
        // then the integer ones (quant_act32).
        let (mut guard, cached) = self.arena_kept(&[n * k * 2, n * nb * 4, 2 * n * nb * 4], pre)?;
        let ni = crate::backend::cuda::i32_of(n, "n")?;
        let ki = crate::backend::cuda::i32_of(k, "k")?;
        arena3::<i16, f32, f32, ()>(&mut guard, (n * k, n * nb, 2 * n * nb), |qs, ad, asum| {
            // (The norm, swiglu and attention writing these activations
            // themselves, so that no quant_act32 runs, was measured on an
            // H200 on 2026-11-27 (commit 8de7f66) and removed: exact
            // tg128 / tg128@d512 without / with it, 8B Q4_0 329.8 / 314.7
            // -> 328.1 / 308.1 tok/s, 8B Q8_0 268.8 / 258.7 -> 268.0 /
            // 254.9, 1B Q4_0 1,142 / 1,063 -> 1,133 / 1,044, SmolLM2
            // 1,070 / 944 -> 1,095 / 958: the quantization moved onto the
            // latency-bound producers' critical path costs about what its
            // launch did under PDL.)
            if !cached {
                let mut b = s.launch_builder(self.func("quant_act32")?);
                b.arg(x)
                    .arg(&ni)
                    .arg(&ki)
                    .arg(&mut *qs)
                    .arg(&mut *ad)
                    .arg(&mut *asum);
                // SAFETY: matches quant_act32 (one warp per block); n*k
                // inputs, n*k q, n*nb d and 2*n*nb s.
                drv(
                    unsafe { b.launch(grid_1d(n * nb * 32, 256)?) },
                    "mat_mul: launching quant_act32",
                )?;
            }
            if form == ExactForm::Matvec {
                // Decode: the warp-per-row kernel (same bits), all jobs,
                // 8 warps of MV_EXACT_WR weight rows a CTA.
                let wr = crate::backend::cuda::ops::kernels::MV_EXACT_WR;
                let (table, ctas) = job_table(jobs, 8 * wr, s)?;
                let tc = crate::backend::cuda::ty_code(ty)
                    .ok_or_else(|| anyhow::anyhow!("mat_mul: {ty:?} is not a weight type"))?;
                let cfg = LaunchConfig {
                    grid_dim: (1, ctas, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                let name = mv_exact_name(n);
                let mut b = s.launch_builder(self.func(name)?);
                b.arg(&table)
                    .arg(&ki)
                    .arg(&tc)
                    .arg(&mut *qs)
                    .arg(&mut *ad)
                    .arg(&mut *asum)
                    .arg(&ni);
                // SAFETY: matches mv_exact32 and mv_exact32_r1 (the same
                // parameters); the job table holds each job's weights (m
                // rows) and output (n*m, validated) and its CTA ranges of 8
                // warps of MV_EXACT_WR rows; n <= MV_EXACT_ROWS (the plan:
                // at most MV_ROWS); static shared memory only.
                drv(unsafe { b.launch(cfg) }, "mat_mul: launching mv_exact32")?;
                return Ok(());
            }
            if let ExactForm::Mma { form } = form {
                return self.mm_exact_mma(jobs, n, &super::XM_FORMS[form], qs, ad, asum);
            }
            for j in jobs.iter_mut() {
                let MmDims { tc, mi, .. } = mm_dims(&j.w, n)?;
                let add = j.add as i32;
                let (ra, cfg) = q_grid(j.w.rows, n)?;
                let mut b = s.launch_builder(self.func("mm_q32")?);
                b.arg(&j.w.data)
                    .arg(&mi)
                    .arg(&ki)
                    .arg(&tc)
                    .arg(&mut *qs)
                    .arg(&mut *ad)
                    .arg(&mut *asum)
                    .arg(&ni)
                    .arg(&ra)
                    .arg(&add)
                    .arg(&mut j.out);
                // SAFETY: matches mm_q32; buffers sized as above, out n*m.
                drv(unsafe { b.launch(cfg) }, "mat_mul: launching mm_q32")?;
            }
            Ok(())
        })
    }

    /// Every job in one mm_exact_mma launch (`ExactForm::Mma`: Q4_0 / Q4_1
    /// / Q8_0, k a multiple of 256, weights 16-byte aligned) over
    /// quant_act32's outputs qs (n, k), ad (n, k / 32) and asum (2, n, k /
    /// 32; the kernel reads the first plane, the float sums).
    fn mm_exact_mma(
        &self,
        jobs: &mut [MatJob<'_, Dev>],
        n: usize,
        form: &super::XmForm,
        qs: &mut CudaViewMut<'_, i16>,
        ad: &mut CudaViewMut<'_, f32>,
        asum: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let ty = jobs[0].w.ty;
        let smem = super::xm_smem(ty, form)
            .ok_or_else(|| anyhow::anyhow!("mat_mul: {} does not take {ty:?}", form.name))?;
        let d = mm_dims(&jobs[0].w, n)?;
        let s = self.stream();
        let (table, ctas) = job_table(jobs, super::XM_ROWS, s)?;
        let cfg = LaunchConfig {
            grid_dim: (u32::try_from(n.div_ceil(super::XM_TOK))?, ctas, 1),
            block_dim: (u32::try_from(form.threads())?, 1, 1),
            shared_mem_bytes: u32::try_from(smem)?,
        };
        let mut b = s.launch_builder(self.func(form.name)?);
        b.arg(&table)
            .arg(&d.ki)
            .arg(&d.rb)
            .arg(&d.tc)
            .arg(&mut *qs)
            .arg(&mut *ad)
            .arg(&mut *asum)
            .arg(&d.ni);
        // SAFETY: matches the parameters of every mm_exact_mma entry (form
        // gives its block size and shared memory); the job table holds
        // each job's weights (m rows of rb bytes, rb a multiple of 16 as k
        // is of 256, 16-byte aligned: the plan) and output (n*m floats,
        // validated) and its CTA ranges of XM_ROWS rows; qs holds n*k
        // values, ad and the first plane of asum n*k/32 floats each
        // (quant_act32); the shared memory is xm_smem(ty, form), which the
        // kernel's stages take (opted in at load).
        drv(unsafe { b.launch(cfg) }, form.name)?;
        Ok(())
    }

    /// One job of float or K-quant weights.
    fn mat_mul_exact_one(
        &self,
        w: &DevMatrix<'_>,
        x: &CudaView<'_, f32>,
        n: usize,
        out: &mut CudaViewMut<'_, f32>,
        add: bool,
    ) -> Result<()> {
        let k = w.cols;
        let MmDims { tc, mi, ki, ni, .. } = mm_dims(w, n)?;
        let add = add as i32;
        let s = self.stream();
        if matches!(w.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            let mut b = s.launch_builder(self.func("mm_float")?);
            b.arg(&w.data)
                .arg(&mi)
                .arg(&ki)
                .arg(&tc)
                .arg(x)
                .arg(&ni)
                .arg(&add)
                .arg(out);
            // SAFETY: argument types match mm_float's signature; buffers
            // hold m*k weights, n*k inputs and n*m outputs (validated).
            drv(
                unsafe { b.launch(grid_1d(n * w.rows * 32, 256)?) },
                "mat_mul: launching mm_float",
            )?;
            return Ok(());
        }
        let nb = k / 256;
        let (ra, qcfg) = q_grid(w.rows, n)?;
        let mut guard = self.arena(&[n * k * 2, n * nb * 4, n * nb * 16 * 4])?;
        arena3::<i16, f32, i32, ()>(&mut guard, (n * k, n * nb, n * nb * 16), |qs, ad, bs| {
            let mut b = s.launch_builder(self.func("quant_actk")?);
            b.arg(x)
                .arg(&ni)
                .arg(&ki)
                .arg(&mut *qs)
                .arg(&mut *ad)
                .arg(&mut *bs);
            // SAFETY: matches quant_actk; n*k inputs, n*k q, n*nb d, n*nb*16 sums.
            drv(
                unsafe { b.launch(grid_1d(n * nb, 128)?) },
                "mat_mul: launching quant_actk",
            )?;
            let mut b = s.launch_builder(self.func("mm_qk")?);
            b.arg(&w.data)
                .arg(&mi)
                .arg(&ki)
                .arg(&tc)
                .arg(&mut *qs)
                .arg(&mut *ad)
                .arg(&mut *bs)
                .arg(&ni)
                .arg(&ra)
                .arg(&add)
                .arg(out);
            // SAFETY: matches mm_qk; buffers sized as above, out n*m.
            drv(unsafe { b.launch(qcfg) }, "mat_mul: launching mm_qk")?;
            Ok(())
        })
    }
}

/// Grid of mm_q32 / mm_qk: `ra` activation rows per thread group (outputs
/// share weight loads), 32 / ra weight rows per CTA.
fn q_grid(m: usize, n: usize) -> Result<(i32, LaunchConfig)> {
    let ra: i32 = match n {
        1 => 1,
        2..=4 => 4,
        5..=8 => 8,
        _ => 32,
    };
    let rw = 32 / ra as u64;
    Ok((
        ra,
        LaunchConfig {
            grid_dim: (
                u32::try_from((m as u64).div_ceil(rw))?,
                u32::try_from((n as u64).div_ceil(ra as u64))?,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        },
    ))
}
