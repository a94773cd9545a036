//! `fast` mode's prefill GEMM on Hopper (kernels/matmul_wgmma_fast.cu):
//! 32-value block weights decoded straight into the wgmma A fragments in
//! registers and multiplied with f16 activations and f32 accumulation, in
//! place of the cuBLAS path's dequantization of every whole matrix to
//! device memory per call. All jobs of a MatMuls op run in one launch; the
//! CTA shape, k splits and wave tail are the planner's (ops/matmul/wr.rs).

use super::jobs::job_maps;
use super::{wg_type_index, wr_smem_of, wr_threads, WR_SHAPES};
use crate::backend::cuda::device::launch::arena3;
use crate::backend::cuda::device::memory::Dev;
use crate::backend::cuda::ops::kernels::WG_KERNELS;
use crate::backend::cuda::{drv, grid_1d, i32_of, CudaBackend};
use crate::backend::MatJob;
use anyhow::{anyhow, Result};
use cudarc::driver::{CudaView, LaunchConfig, PushKernelArg};

impl CudaBackend {
    /// out_j (n, m_j) (=, or +=) x (n, k) · w_jᵀ for every job in one
    /// launch (validated arguments, planned `MmPlan::Wgmma`: k a multiple
    /// of 256, the buffers 16-byte aligned) of CTA shape `WR_SHAPES[v]`, k
    /// in `splits` ranges, or unsplit with the wave `tail`.
    pub(super) fn mm_wgmma(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        jobs: &mut [MatJob<'_, Dev>],
        (v, splits, tail): (usize, usize, Option<(usize, usize)>),
        pre: bool,
    ) -> Result<()> {
        let s = self.stream();
        let (ty, k) = (jobs[0].w.ty, jobs[0].w.cols);
        let t = wg_type_index(ty)
            .ok_or_else(|| anyhow!("mat_mul: the wgmma GEMM does not take {ty:?}"))?;
        let rows: Vec<usize> = jobs.iter().map(|j| j.w.rows).collect();
        let m_all: usize = rows.iter().sum();
        let (mt, bn) = WR_SHAPES[v];
        let name = WG_KERNELS[t][v];
        // The f16 activations in to_f16_wr's tiled layout (whole tiles of
        // 128 tokens up to a multiple of `bn`, zeros past n) at the start of
        // the arena, unless `pre` (the op before wrote them there): the
        // next MatMuls op of the same input, so annotated, converts
        // nothing.
        let padded = n.div_ceil(bn) * bn;
        let (table, ctas) = self.mm_job_table(jobs, 128 * mt)?;
        let maps = job_maps(&table, k, ty.type_size(), mt)?;
        let tiles_x = n.div_ceil(bn);
        // The tail's partial tiles: sp k ranges x its tiles x bn x 128 mt.
        let tail_len = tail.map_or(0, |(from, _)| {
            (ctas as usize - from) * tiles_x * bn * 128 * mt
        });
        let part_len = match tail {
            Some((_, sp)) => sp * tail_len,
            None if splits > 1 => splits * n * m_all,
            None => 0,
        };
        let (mut guard, cached) = self.arena_kept(&[padded * k * 2, part_len * 4, 0], pre)?;
        let (ni, ki) = (i32_of(n, "n")?, i32_of(k, "k")?);
        arena3::<u16, f32, u8, ()>(&mut guard, (padded * k, part_len, 0), |x16, part, _| {
            if crate::backend::cuda::device::launch::dev_ptr_mut(x16, s) % 16 != 0 {
                return Err(anyhow!(
                    "mat_mul: {name}: f16 activations not 16-byte aligned"
                ));
            }
            if !cached {
                // x 16-byte aligned and k a multiple of 256 (wg_takes).
                self.to_f16_wr(x, n, k, padded, x16)?;
            }
            // With a tail, grid rows from.. hold the tail's CTA rows once
            // per k range (wr_body).
            let (tail_from, tail_sp) = tail.unwrap_or((ctas as usize, 1));
            let grid_y = tail_from + tail_sp * (ctas as usize - tail_from);
            let tail_part = if tail.is_some() {
                crate::backend::cuda::device::launch::dev_ptr_mut(part, s)
            } else {
                0u64
            };
            let (tf, tsp) = (
                i32_of(tail_from, "tail rows")?,
                i32_of(tail_sp, "tail ranges")?,
            );
            let cfg = LaunchConfig {
                grid_dim: (
                    u32::try_from(tiles_x)?,
                    u32::try_from(grid_y)?,
                    u32::try_from(splits)?,
                ),
                block_dim: (wr_threads(mt), 1, 1),
                shared_mem_bytes: u32::try_from(wr_smem_of(ty.type_size(), v))?,
            };
            // Split: the kernel's table stores each job's partial sums
            // (no add) at its place in split 0's part of the buffer, job j
            // after the n * m of the jobs before it; split z at + z stride.
            let stride = if splits > 1 { (n * m_all) as i64 } else { 0 };
            let mut kt = table;
            if splits > 1 {
                let base = crate::backend::cuda::device::launch::dev_ptr_mut(part, s);
                let mut off = 0u64;
                for (j, r) in rows.iter().enumerate() {
                    kt.set_out(j, base + 4 * off);
                    off += (n * r) as u64;
                }
                kt.set_add(0);
            }
            let mut b = s.launch_builder(self.func(name)?);
            b.arg(&kt).arg(&mut *x16).arg(&ni).arg(&ki).arg(&stride);
            b.arg(&tf).arg(&tsp).arg(&tail_part).arg(&maps);
            // SAFETY: matches mm_wr_* (MmJobs by value, x16, n, k, pstride,
            // tail_from, tail_sp, tail_part, JobMaps by value; the maps
            // describe the table's weights as job_maps says): the table's weights hold m_j
            // rows of k / 32 blocks (validated), 16-byte aligned
            // (wg_takes), its outputs n * m_j floats, x16 `padded` / 128
            // (whole CTAs of `bn`) tiles of 128 tokens x k halves in
            // to_f16_wr's layout, 16-byte aligned (checked); with a tail,
            // part holds tail_sp * tail_len floats (the tail's tiles of bn
            // x 128 mt, once per k range) and tail_sp divides k / 256
            // (wr_tail); without, no CTA row reaches tail_from = ctas. The
            // kernel's dynamic shared memory limit was raised to wg_smem
            // at load.
            drv(unsafe { b.launch(cfg) }, &format!("mat_mul: {name}"))?;
            if let Some((from, sp)) = tail {
                // wr_tail_sum's 32-bit indices.
                i32_of(sp * tail_len, "tail partials")?;
                let len = i32_of(tail_len, "tail partials")?;
                let (spi, fi) = (i32_of(sp, "tail ranges")?, i32_of(from, "tail rows")?);
                let (txi, bni, rpc) = (
                    i32_of(tiles_x, "token tiles")?,
                    i32_of(bn, "bn")?,
                    i32_of(128 * mt, "rows per CTA")?,
                );
                let mut b = s.launch_builder(self.func("wr_tail_sum")?);
                let pv = part.slice(0..);
                b.arg(&pv).arg(&len).arg(&spi).arg(&fi).arg(&txi).arg(&bni);
                b.arg(&rpc).arg(&ni).arg(&table);
                // SAFETY: matches wr_tail_sum (part, len, sp, tail_from,
                // tiles_x, bn, rpc, n, MmJobs), one CTA row per tail tile:
                // part holds sp * len floats as the GEMM above wrote them
                // (16-byte aligned: the arena), the table's outputs n * m_j
                // floats (its CTA rows of rpc rows, as the GEMM's).
                let cfg = LaunchConfig {
                    grid_dim: (
                        u32::try_from((bn * 128 * mt / 4).div_ceil(256))?,
                        u32::try_from(tail_len / (bn * 128 * mt))?,
                        1,
                    ),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                drv(unsafe { b.launch(cfg) }, "mat_mul: wr_tail_sum")?;
            }
            if splits > 1 {
                let sp = i32_of(splits, "splits")?;
                let len = n * m_all;
                let mut b = s.launch_builder(self.func("split_sum_jobs")?);
                let pv = part.slice(0..);
                b.arg(&pv).arg(&sp).arg(&stride).arg(&ni).arg(&table);
                // SAFETY: matches split_sum_jobs; part holds splits * n *
                // m_all floats (split z at z * stride, jobs back to back as
                // the kernel's table put them), the table's outputs n * m_j
                // floats, 16-byte aligned with n * m_j multiples of 4
                // (vec4_ok), stride = n * m_all.
                drv(
                    unsafe { b.launch(grid_1d(len.div_ceil(4), 256)?) },
                    "mat_mul: split_sum_jobs (wgmma)",
                )?;
            }
            Ok(())
        })
    }
}
