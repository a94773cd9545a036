//! `MatMuls` with the FFN's SwiGlu (`OpT::MatMuls::glu`): the gate/up
//! products, then glu = silu(gate) * up.
//!
//! One decode row (`deterministic` and `fast`, the gate/up op carrying its
//! RMS norm, as the model graphs build it): `rms_norm_fast` quantizes the
//! normalized input into the arena past the SwiGlu's blocks, then one
//! `mv_q8_r1_glu*` launch (kernels/matmul_glu_fast.cu) computes gate and up
//! with mv_q8_r1's bits, the SwiGlu with swiglu_q8's, and quantizes its
//! output for the down projection at the arena's start, where that matvec
//! looks for it (prepared.rs). So the `swiglu_q8` launch, one dependent
//! kernel boundary per layer, goes away and no result changes.
//! Everywhere else: the op's matmuls, then `d_swiglu`.
//!
//! Weights of the 32-value block types only (Q4_0, Q4_1, Q5_0, Q5_1,
//! Q8_0): the K-quants' paired-row loops spill at the kernel's 40
//! registers.
//!
//! The tuning table's `matmul.mv_glu_form` turns the fused launch off or
//! fixes its entry (`glu_form`, `GLU_FORMS`, ops/matmul/glu.rs).

use super::{glu_form, mm_dims};
use crate::backend::cuda::device::launch::{arena3, dev_ptr, dev_ptr_mut, RawArgs};
use crate::backend::cuda::device::memory::Dev;
use crate::backend::cuda::i32_of;
use crate::backend::cuda::{drv, CudaBackend};
use crate::backend::{validate, MatJob, Mode, WeightInfo};
use crate::quant::GgmlType;
use anyhow::{anyhow, Context, Result};
use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

/// The `_nc` entry (norm-ahead's consumer) of the form `name`, as the
/// kernel table lists it: a `&'static str`, so no name is built per launch.
fn glu_nc(name: &str) -> Result<&'static str> {
    crate::backend::cuda::ops::kernels::KERNELS
        .iter()
        .flat_map(|(_, _, entries)| entries.iter().copied())
        .find(|e| e.strip_suffix("_nc") == Some(name))
        .ok_or_else(|| anyhow!("mat_muls glu: no norm-ahead entry for {name}"))
}

impl CudaBackend {
    /// Whether a one-row gate/up op of `blocks` blocks of 32 indices (32-value
    /// block weights, the norm on the op) takes the fused launch here.
    ///
    /// The same conditions as the launch (`mat_muls_glu_fused`): a 32-value
    /// block type `ty` of `k` columns whose one-row products the planner
    /// gives the one-row q8 matvec (under tuning overrides that send one
    /// row elsewhere, the fused launch does not run either), and a form.
    pub(crate) fn glu_takes(&self, ty: GgmlType, k: usize, blocks: usize) -> bool {
        let block32 = matches!(
            ty,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0
        );
        let m = blocks * 32;
        block32
            && self.one_row_q8(ty, k, &[m, m], Mode::Fast)
            && self.tuning.matvec.prequant
            && glu_form(blocks, false, &self.mm_caps(), &self.tuning.matmul).is_some()
    }

    /// A `MatMuls`'s SwiGlu shapes (`validate::mat_muls_glu`), checked
    /// before any of its kernels runs.
    pub(crate) fn check_glu(jobs: &[MatJob<'_, Dev>], glu_len: Option<usize>) -> Result<()> {
        let Some(len) = glu_len else {
            return Ok(());
        };
        let lens: Vec<(usize, bool)> = jobs.iter().map(|j| (j.out.len(), j.add)).collect();
        validate::mat_muls_glu(&lens, len)
    }

    /// The SwiGlu after an op's products where it has one (`glu`, its
    /// shapes checked by `check_glu`; the unfused path): `d_swiglu` of
    /// jobs 0 and 1.
    pub(crate) fn glu_after(
        &self,
        jobs: &mut [MatJob<'_, Dev>],
        glu: Option<CudaViewMut<'_, f32>>,
        n: usize,
        mode: Mode,
    ) -> Result<()> {
        let Some(mut glu) = glu else {
            return Ok(());
        };
        let (g, rest) = jobs.split_at_mut(1);
        self.d_swiglu(
            &g[0].out.as_view(),
            &rest[0].out.as_view(),
            &mut glu,
            Some(n),
            mode,
        )
    }

    /// The fused launch where it applies (module doc; the SwiGlu's shapes
    /// checked by `check_glu`): rms_norm(x) with
    /// weights `w` and `eps` quantized, then `mv_q8_r1_glu*`; false (nothing
    /// launched) elsewhere. `scratch` is the norm's f32 scratch (n, k),
    /// which this path leaves unwritten (the op allows it).
    #[allow(clippy::too_many_arguments)] // the op's fields
    pub(crate) fn mat_muls_glu_fused(
        &self,
        x: &CudaView<'_, f32>,
        w: &CudaView<'_, f32>,
        eps: f32,
        scratch: &mut CudaViewMut<'_, f32>,
        n: usize,
        jobs: &mut [MatJob<'_, Dev>],
        glu: &mut CudaViewMut<'_, f32>,
        mode: Mode,
        ahead: Option<(crate::backend::cuda::ops::matmul::norm_ahead::AheadKey, u64)>,
    ) -> Result<bool> {
        let off = self.tuning.matmul.mv_glu_form == crate::backend::cuda::tuning::GluForm::Off;
        if off || mode == Mode::Exact || n != 1 || !self.tuning.matvec.prequant || jobs.len() != 2 {
            return Ok(false);
        }
        // Bad shapes get the unfused path's errors first.
        let shapes: Vec<(&dyn WeightInfo, usize)> = jobs
            .iter()
            .map(|j| (&j.w as &dyn WeightInfo, j.out.len()))
            .collect();
        validate::mat_muls(x.len(), n, &shapes)?;
        let (ty, k, m) = (jobs[0].w.ty, jobs[0].w.cols, jobs[0].w.rows);
        validate::mat_muls_norm(x.len(), k, w.len(), scratch.len())?;
        let s = self.stream();
        // The 32-value block types: their paired-row loops hold in the
        // kernel's 40 registers (sm_90 SASS); the K-quants' spill there.
        let block32 = matches!(
            ty,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0
        );
        let fits = block32
            // The unfused products' kernel, whose bits these are.
            && self.takes_mv_q8_r1(mode, n, jobs)
            && m.is_multiple_of(32)
            // rms_norm_fast's float4 form (its bits: the unfused norm's).
            && dev_ptr(x, s).is_multiple_of(16)
            && dev_ptr(w, s).is_multiple_of(16)
            && dev_ptr_mut(scratch, s).is_multiple_of(16);
        if !fits {
            return Ok(false);
        }
        let blocks = m / 32;
        // Norm-ahead's blocks where the residual's producer left them for
        // this norm (ops/matmul/norm_ahead.rs; `fast` only): the `_nc` entry
        // reads them and scales gate and up by the norm's 1/rms.
        let nc = match mode {
            Mode::Fast => self.ahead_for(k, ahead),
            _ => None,
        };
        let Some((name, warps, csize)) =
            glu_form(blocks, nc.is_some(), &self.mm_caps(), &self.tuning.matmul)
        else {
            return Ok(false);
        };
        let d = mm_dims(&jobs[0].w, 1)?;
        // The arena: the SwiGlu's blocks first (m int8, m / 32 float2:
        // where q8_out puts them and the down projection reads them), then
        // the normalized input's (k int8, k / 32 float2), which the CTAs
        // read while others store their output blocks. Sized before
        // q8_out, so that it cannot grow under q8_out's addresses.
        let in_bytes = k + k / 32 * 8;
        let (xq, xds) = {
            let mut guard = self.arena(&[m, m / 32 * 8, in_bytes])?;
            arena3::<i8, f32, u8, _>(&mut guard, (m, m / 32 * 2, in_bytes), |_, _, r| {
                let p = dev_ptr_mut(r, s);
                Ok((p, p + k as u64))
            })?
        };
        // The kernel writes its output's blocks: for the down projection
        // where the op's annotation says it reads them; without an
        // annotation (an op outside a planned step) too, so that the op
        // runs the same kernel, though no op reads them then.
        let reader = match self.current_fusion() {
            Some(f) => f.out_for_next,
            None => Some(crate::backend::cuda::fusion::ActRead::Q8),
        };
        let Some((key, hq, hds)) = self.q8_out_for(glu, reader, m, mode)? else {
            return Ok(false);
        };
        let (mut table, _) = self.mm_job_table(jobs, 32)?;
        self.l2_record(jobs, &mut table)?;

        let (xq, xds, name) = match nc {
            Some(a) => (a.nq, a.nds, glu_nc(name)?),
            None => {
                // rms_norm_fast of the one row, its blocks into (xq, xds).
                // SAFETY: one row of k inputs, weights and scratch outputs,
                // 16-byte aligned (checked); xq / xds an arena region of k
                // bytes then k / 32 float2 (8-byte aligned: k is a
                // multiple of 32).
                unsafe {
                    self.rms_norm_fast(x, w, 1, (i32_of(k, "dim")?, eps), true, scratch, (xq, xds))
                }
                .context("mat_muls glu: the norm")?;
                (xq, xds, name)
            }
        };
        let (parts, nblocks) = nc.map_or((0u64, 0i32), |a| (a.parts, a.blocks));

        let ctas = blocks * csize;
        let grid_y = u32::try_from(ctas).map_err(|_| anyhow!("mat_muls glu: {ctas} CTAs"))?;
        let cfg = LaunchConfig {
            grid_dim: (1, grid_y, 1),
            block_dim: (32 * warps as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        if csize > 1 {
            let mut a = RawArgs::new()
                .bytes(&table.param_bytes())
                .i32(d.ki)
                .i64(d.rb)
                .i32(d.tc)
                .ptr(xq)
                .ptr(xds)
                .ptr(dev_ptr_mut(glu, s))
                .ptr(hq)
                .ptr(hds);
            if nc.is_some() {
                a = a.ptr(parts).i32(nblocks).f32(eps);
            }
            let c = u32::try_from(csize)?;
            // SAFETY: as the launch below, in clusters of (1, csize, 1)
            // CTAs, which divide the grid (blocks * csize along y); the
            // device has clusters (sm_90+) and a cluster of at most 4 CTAs
            // of at most 512 threads and no dynamic shared memory fits.
            unsafe { self.launch_clustered(name, cfg, (1, c, 1), &mut a.params()) }
                .context("mat_muls glu: launch")?;
        } else {
            let mut b = s.launch_builder(self.func(name)?);
            b.arg(&table)
                .arg(&d.ki)
                .arg(&d.rb)
                .arg(&d.tc)
                .arg(&xq)
                .arg(&xds)
                .arg(&mut *glu)
                .arg(&hq)
                .arg(&hds);
            if nc.is_some() {
                b.arg(&parts).arg(&nblocks).arg(&eps);
            }
            // SAFETY: matches mv_q8_r1_glu* (the `_nc` entries: then the
            // producer's k / 32 sums of squares at `parts`, their count
            // and eps, and xq / xds its blocks of this x, `ahead_for`):
            // the table's jobs 0 and 1 hold m rows of rb bytes and
            // outputs of m floats (checked above);
            // xq / xds the normalized row's blocks (k bytes, k / 32
            // float2); glu m floats; hq / hds q8_out's arena region of m
            // bytes and m / 32 float2, disjoint from xq / xds (the arena's
            // third region); a grid of csize * m / 32 CTAs of 32 * warps
            // threads.
            drv(unsafe { b.launch(cfg) }, "mat_muls glu: launch")?;
        }
        self.q8_done(key);
        if nc.is_some() {
            self.norm_ahead_runs
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.glu_runs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::super::glu::GLU_FORMS;
    use super::glu_nc;

    #[test]
    fn every_glu_form_has_its_norm_ahead_entry() {
        for (name, _, _) in GLU_FORMS {
            assert_eq!(glu_nc(name).unwrap(), format!("{name}_nc"));
        }
        assert!(glu_nc("mv_q8_r1_glu64").is_err());
    }
}
