//! The matmul launches' entry (`d_mat_muls`: plan, then `match` on the
//! plan) and the launchers of the warp-per-row matvecs, the short-row
//! matvec and the f16 tile kernel; the other forms have their own files
//! (exact.rs, mma.rs, wgmma.rs, blas.rs).

use super::jobs::{job_table_mb, mm_dims, vec4_ok, MmDims, MmJobs};
use super::prepared::{act_read, outs_overlap};
use super::{
    is_float, mv_grid, mv_name, plan, MmCaps, MmPlan, MmShape, MV_FLOAT, MV_Q8, SHORT_ROWS,
    TILE_ROWS, TILE_SMEM, TILE_TOK,
};
use crate::backend::cuda::device::launch::{arena3, dev_ptr, dev_ptr_mut, RawArgs};
use crate::backend::cuda::device::memory::{Dev, DevMatrix};
use crate::backend::cuda::ops::kernels::WG_KERNELS;
use crate::backend::cuda::{drv, grid_1d, i32_of, CudaBackend};
use crate::backend::{validate, MatJob, Mode, WeightInfo};
use crate::quant::GgmlType;
use anyhow::Result;
use cudarc::driver::{CudaStream, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

impl CudaBackend {
    /// out (n, m) = x (n, k) · wᵀ: a MatMuls of one job.
    pub(crate) fn d_mat_mul(
        &self,
        w: &DevMatrix<'_>,
        x: &CudaView<'_, f32>,
        n: usize,
        out: &mut CudaViewMut<'_, f32>,
        mode: Mode,
    ) -> Result<()> {
        validate::mat_mul(w, w.data.len(), x.len(), n, out.len())?;
        if n == 0 || w.rows == 0 {
            return Ok(());
        }
        if w.cols == 0 {
            drv(self.stream().memset_zeros(out), "mat_mul: zero out")?;
            return Ok(());
        }
        let len = out.len();
        let mut jobs = [MatJob {
            w: DevMatrix {
                ty: w.ty,
                rows: w.rows,
                cols: w.cols,
                data: w.data.slice(0..w.data.len()),
            },
            out: out.slice_mut(0..len),
            add: false,
        }];
        self.d_mat_muls(x, n, &mut jobs, mode)
    }

    /// What this device offers the matmul planner.
    pub(super) fn mm_caps(&self) -> MmCaps {
        let arch_major = crate::backend::cuda::device::pdl::arch_major(&self.arch);
        MmCaps {
            arch_major,
            sms: self.sm_count(),
            cublas: self.blas.is_some(),
            wgmma: arch_major >= 9 && self.func(WG_KERNELS[0][0]).is_ok(),
        }
    }

    /// The plan of validated jobs over `x` (n rows): `plan` with the
    /// buffers' alignment read here.
    pub(super) fn mm_plan(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        jobs: &[MatJob<'_, Dev>],
        mode: Mode,
    ) -> MmPlan {
        let Some(j0) = jobs.first() else {
            return MmPlan::Empty;
        };
        let s = self.stream();
        let rows: Vec<usize> = jobs.iter().map(|j| j.w.rows).collect();
        let shape = MmShape {
            ty: j0.w.ty,
            k: j0.w.cols,
            n,
            rows: &rows,
            aligned16: dev_ptr(x, s).is_multiple_of(16)
                && jobs
                    .iter()
                    .all(|j| dev_ptr(&j.w.data, s).is_multiple_of(16)),
            outs_vec4: outs_vec4(jobs, n, s),
        };
        plan(&shape, mode, &self.mm_caps(), &self.tuning.matmul)
    }

    /// Each job: out (n, m) = x (n, k) · wᵀ, or += with `add`, by the
    /// planner's choice (`matmul::plan`). The warp-per-row kernels (every
    /// mode) run all jobs in one launch, with the add folded into the
    /// store. The input is prepared in the arena where the op's fusion
    /// annotation says so (`annotated_input`).
    pub(crate) fn d_mat_muls(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        jobs: &mut [MatJob<'_, Dev>],
        mode: Mode,
    ) -> Result<()> {
        self.mat_muls_in(x, n, jobs, mode, None)
    }

    /// `d_mat_muls`, the input prepared as `own` says where given (the
    /// op's own norm wrote its layout: norm.rs), else as the op's
    /// annotation says.
    pub(super) fn mat_muls_in(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        jobs: &mut [MatJob<'_, Dev>],
        mode: Mode,
        own: Option<bool>,
    ) -> Result<()> {
        let shapes: Vec<(&dyn WeightInfo, usize)> = jobs
            .iter()
            .map(|j| (&j.w as &dyn WeightInfo, j.out.len()))
            .collect();
        validate::mat_muls(x.len(), n, &shapes)?;
        let plan = self.mm_plan(x, n, jobs, mode);
        let actual = act_read(&plan);
        let pre = match own {
            Some(wrote) => wrote,
            None => self.annotated_input(n, jobs, mode, actual),
        };
        match plan {
            MmPlan::Empty => Ok(()),
            MmPlan::Zero => self.mat_muls_zero(jobs),
            MmPlan::Exact(form) => self.mat_muls_exact(x, n, jobs, form, pre),
            MmPlan::Mq {
                kern,
                splits,
                per_split,
                vec4,
            } => self.mm_q8_mma(x, n, jobs, kern, (splits, per_split), vec4, pre),
            MmPlan::Tile { splits } => {
                // Each job after the first finds the f16 rows the one
                // before wrote (unless that job wrote over its input).
                let s = self.stream();
                let mut pre = pre;
                for (j, sp) in splits.into_iter().enumerate() {
                    let job = &mut jobs[j];
                    self.mm_tile(&job.w, x, n, &mut job.out, job.add, sp, pre)?;
                    pre = !outs_overlap(x, &jobs[j..=j], s);
                }
                Ok(())
            }
            MmPlan::Wgmma {
                shape,
                splits,
                tail,
            } => self.mm_wgmma(x, n, jobs, (shape, splits, tail), pre),
            MmPlan::Blas => self.gemm_f16_jobs(x, n, jobs, pre),
            MmPlan::Short => self.mat_vec_short(x, jobs, pre),
            MmPlan::Matvec { warps, .. } => self.mat_vec(x, n, jobs, warps, pre),
        }?;
        self.keep_planned_input(x, n, jobs, mode, actual)
    }

    /// k = 0: the product is zero: out = 0, or out += 0 (as MatMul then Add).
    fn mat_muls_zero(&self, jobs: &mut [MatJob<'_, Dev>]) -> Result<()> {
        for j in jobs.iter_mut() {
            if j.add {
                let mut b = self.stream().launch_builder(self.func("add_zero")?);
                let n_out = j.out.len();
                let len = n_out as i64;
                b.arg(&mut j.out).arg(&len);
                // SAFETY: matches add_zero; out holds len floats.
                drv(
                    unsafe { b.launch(grid_1d(n_out, 256)?) },
                    "mat_mul: add_zero",
                )?;
            } else {
                drv(self.stream().memset_zeros(&mut j.out), "mat_mul: zero out")?;
            }
        }
        Ok(())
    }

    /// Whether `d_mat_muls` runs these jobs with `mv_q8_r1` (one row, one
    /// warp a weight row), the kernel whose per-row bits the fused
    /// launches (glu_launch.rs) reproduce: the planner's answer, so the
    /// two never disagree.
    pub(super) fn takes_mv_q8_r1(&self, mode: Mode, n: usize, jobs: &[MatJob<'_, Dev>]) -> bool {
        let Some(j0) = jobs.first() else {
            return false;
        };
        let rows: Vec<usize> = jobs.iter().map(|j| j.w.rows).collect();
        n == 1 && self.one_row_q8(j0.w.ty, j0.w.cols, &rows, mode)
    }

    /// Whether the planner gives one row of products of `ty` weights (k
    /// columns, jobs of `rows` output rows) the one-row q8 matvec
    /// (`mv_q8_r1`, one warp a row). One row: no form that reads the
    /// alignment facts can be planned, so they are left false.
    pub(crate) fn one_row_q8(&self, ty: GgmlType, k: usize, rows: &[usize], mode: Mode) -> bool {
        let shape = MmShape {
            ty,
            k,
            n: 1,
            rows,
            aligned16: false,
            outs_vec4: false,
        };
        plan(&shape, mode, &self.mm_caps(), &self.tuning.matmul)
            == MmPlan::Matvec {
                float: false,
                warps: 1,
            }
    }

    /// One row of short rows (`short_takes`): `mv_q8_r1_s4`, SHORT_ROWS
    /// rows per warp.
    fn mat_vec_short(
        &self,
        x: &CudaView<'_, f32>,
        jobs: &mut [MatJob<'_, Dev>],
        pre: bool,
    ) -> Result<()> {
        let d = mm_dims(&jobs[0].w, 1)?;
        let (mut table, ctas) = self.mm_job_table(jobs, 8 * SHORT_ROWS)?;
        self.l2_record(jobs, &mut table)?;
        let cfg = mv_grid(1, ctas)?;
        self.mat_vec_q8(x, 1, jobs, (&d, &table, cfg, "mv_q8_r1_s4"), &[], 1, pre)
    }

    /// `job_table` with the table's weight prefetch bound.
    pub(super) fn mm_job_table(
        &self,
        jobs: &mut [MatJob<'_, Dev>],
        rows_per_cta: usize,
    ) -> Result<(MmJobs, u32)> {
        let mb = self.tuning.matmul.mv_prefetch_mb;
        job_table_mb(jobs, rows_per_cta, self.stream(), mb)
    }

    /// The warp-per-row kernels over every job in one launch (validated
    /// arguments, k a multiple of 32). The grid's x dimension walks
    /// activation-row groups fastest, so the groups that read one tile of
    /// weight rows run together and all but the first find it in L2.
    /// `warps` (1, 2 or 4) per weight row: more than 1 only for one row in
    /// `fast` mode (`mv_warps_of`).
    fn mat_vec(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        jobs: &mut [MatJob<'_, Dev>],
        warps: usize,
        pre: bool,
    ) -> Result<()> {
        let w0 = &jobs[0].w;
        let d = mm_dims(w0, n)?;
        let float_w = is_float(w0.ty);
        let s = self.stream();
        let (mut table, ctas) = self.mm_job_table(jobs, 8 / warps)?;
        self.l2_record(jobs, &mut table)?;
        let cfg = mv_grid(n, ctas)?;
        if float_w {
            let name = mv_name(n, warps, MV_FLOAT);
            let mut b = s.launch_builder(self.func(name)?);
            b.arg(&table).arg(&d.ki).arg(&d.tc).arg(x).arg(&d.ni);
            // SAFETY: matches mv_float and its one-row variants (8 /
            // warps rows per CTA, as the job table); each job's weights
            // hold m rows of k values and its output n*m (validated), x
            // n*k; k is a multiple of 32.
            drv(unsafe { b.launch(cfg) }, "mat_mul: launching mv_float")?;
            return Ok(());
        }
        let name = mv_name(n, warps, MV_Q8);
        self.mat_vec_q8(x, n, jobs, (&d, &table, cfg, name), &[], 1, pre)
    }

    /// Quantized weights: activations to int8 (quant_q8, unless `pre`: the
    /// arena holds them), then the warp-per-row dp4a kernel `name` over every
    /// job, with `mat_vec`'s dimensions, job table and grid. `extra`: the
    /// kernel's parameters after the common ones (device addresses; only
    /// norm-ahead's producer `mv_q8_r1_na` has any).
    #[allow(clippy::too_many_arguments)] // the launch's parts
    pub(crate) fn mat_vec_q8(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        jobs: &[MatJob<'_, Dev>],
        (d, table, cfg, name): (&MmDims, &MmJobs, LaunchConfig, &str),
        extra: &[u64],
        cluster: u32,
        pre: bool,
    ) -> Result<()> {
        let k = jobs[0].w.cols;
        let s = self.stream();
        let nblk = n * k / 32;
        let (mut guard, cached) = self.arena_kept(&[n * k, nblk * 8, 0], pre)?;
        arena3::<i8, f32, u8, ()>(&mut guard, (n * k, nblk * 2, 0), |xq, xds, _| {
            if !cached {
                self.quant_q8(x, nblk, xq, xds)?;
            }
            if cluster > 1 {
                let mut a = RawArgs::new()
                    .bytes(&table.param_bytes())
                    .i32(d.ki)
                    .i64(d.rb)
                    .i32(d.tc)
                    .ptr(dev_ptr_mut(xq, s))
                    .ptr(dev_ptr_mut(xds, s))
                    .i32(d.ni);
                for &e in extra {
                    a = a.ptr(e);
                }
                // SAFETY: as the launch below (norm-ahead's cluster
                // producers, whose caller's SAFETY note covers `extra`), in
                // clusters of (1, cluster, 1) CTAs that divide the grid; the
                // caller launches clusters only on sm_90+.
                return unsafe {
                    self.launch_clustered(name, cfg, (1, cluster, 1), &mut a.params())
                };
            }
            let mut b = s.launch_builder(self.func(name)?);
            b.arg(table)
                .arg(&d.ki)
                .arg(&d.rb)
                .arg(&d.tc)
                .arg(&mut *xq)
                .arg(&mut *xds)
                .arg(&d.ni);
            for e in extra {
                b.arg(e);
            }
            // SAFETY: matches mv_q8 and its one-row variants (8 / warps
            // rows per CTA, as the job table), or with `extra` mv_q8_r1_na
            // (32 rows per CTA; its caller's SAFETY note covers `extra`);
            // each job's weights hold m rows of rb bytes (256-byte aligned
            // allocation) and its output n*m; xq/xds as above.
            drv(unsafe { b.launch(cfg) }, "mat_mul: launching mv_q8")?;
            Ok(())
        })
    }

    /// Batched decode on quantized weights: activations to f16, then
    /// mm_f16_tile (weight tiles dequantized to f16 in shared memory,
    /// tensor-core MMA), split over k as planned (`tile_splits`: splits,
    /// units per split), and the splits' partial sums added in order
    /// (split_sum), which (or the one split's store) adds into `out` for
    /// `add`.
    #[allow(clippy::too_many_arguments)] // a job's fields and its plan
    fn mm_tile(
        &self,
        w: &DevMatrix<'_>,
        x: &CudaView<'_, f32>,
        n: usize,
        out: &mut CudaViewMut<'_, f32>,
        add: bool,
        (splits, upc): (usize, usize),
        pre: bool,
    ) -> Result<()> {
        let d = mm_dims(w, n)?;
        let (m, k) = (w.rows, w.cols);
        let part_len = if splits > 1 { splits * n * m } else { 0 };
        let s = self.stream();
        // The f16 activations at the start of the arena serve every matmul
        // of the same input (q/k/v, gate/up), like quant_q8's (`pre`).
        let (mut guard, cached) = self.arena_kept(&[n * k * 2, part_len * 4, 0], pre)?;
        let add = add as i32;
        arena3::<u16, f32, u8, ()>(&mut guard, (n * k, part_len, 0), |x16, part, _| {
            if !cached {
                self.to_f16_into(x, x16, n * k)?;
            }
            let cfg = LaunchConfig {
                grid_dim: (
                    u32::try_from(n.div_ceil(TILE_TOK))?,
                    u32::try_from(m.div_ceil(TILE_ROWS))?,
                    u32::try_from(splits)?,
                ),
                block_dim: (256, 1, 1),
                shared_mem_bytes: TILE_SMEM as u32,
            };
            let upci = i32_of(upc, "units per split")?;
            let stride = (n * m) as i64;
            let mut b = s.launch_builder(self.func("mm_f16_tile")?);
            b.arg(&w.data)
                .arg(&d.mi)
                .arg(&d.ki)
                .arg(&d.rb)
                .arg(&d.tc)
                .arg(&mut *x16)
                .arg(&d.ni)
                .arg(&upci);
            if splits > 1 {
                b.arg(&stride).arg(&add).arg(&mut *part);
                // SAFETY: matches mm_f16_tile; w holds m rows of rb bytes,
                // x16 n*k halves (arena: 256-byte aligned, rows of k halves
                // 64-byte multiples, for the 16-byte loads), part
                // splits*n*m floats (split z writes its n*m at z*stride).
                drv(unsafe { b.launch(cfg) }, "mat_mul: mm_f16_tile")?;
                let sp = i32_of(splits, "splits")?;
                let mut b = s.launch_builder(self.func("split_sum")?);
                b.arg(&mut *part)
                    .arg(&sp)
                    .arg(&stride)
                    .arg(&stride)
                    .arg(&add)
                    .arg(&mut *out);
                // SAFETY: matches split_sum; part holds splits*n*m floats,
                // out n*m.
                drv(
                    unsafe { b.launch(grid_1d(n * m, 256)?) },
                    "mat_mul: split_sum",
                )?;
            } else {
                let zero = 0i64;
                b.arg(&zero).arg(&add).arg(&mut *out);
                // SAFETY: as above, one split writing out (n*m floats).
                drv(unsafe { b.launch(cfg) }, "mat_mul: mm_f16_tile")?;
            }
            Ok(())
        })
    }
}

/// Whether every job's n * m is a multiple of 4 and its output 16-byte
/// aligned (split_sum_jobs adds four floats at a time).
fn outs_vec4(jobs: &[MatJob<'_, Dev>], n: usize, s: &std::sync::Arc<CudaStream>) -> bool {
    vec4_ok(n, jobs.iter().map(|j| (j.w.rows, dev_ptr_mut(&j.out, s))))
}
