//! `fast` mode's int8 tensor-core matmul for batched decode and prefill on
//! 32-block weights (mm_q8_mma in kernels/matmul_mma_fast.cu): quant_q8's int8
//! activations (quantized once per input, or already written by the
//! elementwise kernel before: `q8_out`) times the weights' own integers,
//! both block scales applied per 32-block in f32. The kernel, its split-K
//! and the sum's form are the planner's (`MmPlan::Mq`, ops/matmul/mq.rs).

use super::jobs::{job_maps, JobMaps};
use super::{mm_dims, mq_smem, MqKernel, MQ_ROWS};
use crate::backend::cuda::device::launch::arena3;
use crate::backend::cuda::device::memory::Dev;
use crate::backend::cuda::{drv, grid_1d, i32_of, CudaBackend};
use crate::backend::MatJob;
use anyhow::Result;
use cudarc::driver::{CudaView, LaunchConfig, PushKernelArg};

impl CudaBackend {
    /// Every job in one launch of `kern` (validated jobs of one type and
    /// k, which `mq_takes`; the job table's CTA rows cover each job's row
    /// tiles): activations to int8 (quant_q8, unless the arena holds them),
    /// then the kernel, k in `splits` ranges of `bpc` blocks (`mq_splits`),
    /// and the splits' partial sums added in split order, which adds into
    /// the output for `add`: by one split_sum_jobs launch for every job
    /// (`vec4`: every n * m a multiple of 4, every output 16-byte
    /// aligned), else split_sum per job.
    #[allow(clippy::too_many_arguments)] // the plan's fields
    pub(super) fn mm_q8_mma(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        jobs: &mut [MatJob<'_, Dev>],
        kern: MqKernel,
        (splits, bpc): (usize, usize),
        vec4: bool,
        pre: bool,
    ) -> Result<()> {
        let (ty, k) = (jobs[0].w.ty, jobs[0].w.cols);
        let smem = mq_smem(ty, kern).ok_or_else(|| {
            anyhow::anyhow!("mat_mul: {} does not take {ty:?} weights", kern.name)
        })?;
        let s = self.stream();
        let nblk = n * k / 32;
        let d = mm_dims(&jobs[0].w, n)?;
        let rows: Vec<usize> = jobs.iter().map(|j| j.w.rows).collect();
        let m_all: usize = rows.iter().sum();
        let (table, ctas) = self.mm_job_table(jobs, MQ_ROWS)?;
        // The weights' tensor maps (sm_90+: the bulk tensor copies of the
        // Q4_0 / Q8_0 chunks, boxes of MQ_ROWS = 128 rows x 8 blocks).
        let maps = if crate::backend::cuda::device::pdl::arch_major(&self.arch) >= 9 {
            job_maps(&table, k, ty.type_size(), 1)?
        } else {
            JobMaps::none()
        };
        let part_len = if splits > 1 { splits * n * m_all } else { 0 };
        let (mut guard, cached) = self.arena_kept(&[n * k, nblk * 8, part_len * 4], pre)?;
        arena3::<i8, f32, f32, ()>(&mut guard, (n * k, nblk * 2, part_len), |xq, xds, part| {
            if !cached {
                self.quant_q8(x, nblk, xq, xds)?;
            }
            let cfg = LaunchConfig {
                grid_dim: (
                    u32::try_from(n.div_ceil(kern.tok))?,
                    ctas,
                    u32::try_from(splits)?,
                ),
                block_dim: (128 * (kern.wn * kern.ks) as u32, 1, 1),
                shared_mem_bytes: u32::try_from(smem)?,
            };
            let bpci = i32_of(bpc, "blocks per split")?;
            let stride = if splits > 1 { (n * m_all) as i64 } else { 0 };
            let mut b = s.launch_builder(self.func(kern.name)?);
            b.arg(&table)
                .arg(&d.ki)
                .arg(&d.rb)
                .arg(&d.tc)
                .arg(&mut *xq)
                .arg(&mut *xds)
                .arg(&d.ni)
                .arg(&bpci)
                .arg(&stride)
                .arg(&mut *part)
                .arg(&maps);
            // SAFETY: matches every mq_kernel instantiation (MQ_KERNELS;
            // kern's block size and shared memory; MQ_ROWS weight rows per
            // CTA row, as the job table); each job's weights hold m rows
            // of rb bytes (rb a multiple of 16: k % 256 == 0, mq_takes; the
            // allocation 256-byte aligned) and its output n*m floats; xq
            // n*k bytes and xds n*k/32 float2 (arena, 256-byte aligned);
            // part splits*n*m_all floats when split (split z writes at
            // z*stride), unused otherwise; maps by value: job_maps's
            // description of the jobs' weights (or zeros before sm_90,
            // where the kernel copies by cp.async).
            drv(unsafe { b.launch(cfg) }, "mat_mul: mm_q8_mma")?;
            if splits > 1 && vec4 {
                // One launch for every job, four floats per thread (the
                // partials of all jobs lie back to back; part is 256-byte
                // aligned and stride a multiple of 4: every n * m is).
                let sp = i32_of(splits, "splits")?;
                let mut b = s.launch_builder(self.func("split_sum_jobs")?);
                let pv = part.slice(0..);
                b.arg(&pv).arg(&sp).arg(&stride).arg(&d.ni).arg(&table);
                // SAFETY: matches split_sum_jobs; part holds splits*n*m_all
                // floats (split s at s*stride, stride = n*m_all), the table's
                // outputs n*m_j floats each, 16-byte aligned (vec4_ok).
                drv(
                    unsafe { b.launch(grid_1d(n * m_all / 4, 256)?) },
                    "mat_mul: split_sum_jobs",
                )?;
            } else if splits > 1 {
                let sp = i32_of(splits, "splits")?;
                let mut off = 0;
                for (j, &m) in jobs.iter_mut().zip(&rows) {
                    let len = (n * m) as i64;
                    let add = j.add as i32;
                    let pj = part.slice(n * off..);
                    let mut b = s.launch_builder(self.func("split_sum")?);
                    b.arg(&pj)
                        .arg(&sp)
                        .arg(&len)
                        .arg(&stride)
                        .arg(&add)
                        .arg(&mut j.out);
                    // SAFETY: matches split_sum; pj starts at this job's
                    // n*m partials of split 0, split s at s*stride (within
                    // part's splits*n*m_all floats); out n*m floats.
                    drv(
                        unsafe { b.launch(grid_1d(n * m, 256)?) },
                        "mat_mul: split_sum",
                    )?;
                    off += m;
                }
            }
            Ok(())
        })
    }
}
