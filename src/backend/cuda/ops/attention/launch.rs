//! Paged attention launches: the canonical kernel (`exact`), split-KV
//! (`deterministic`, `fast` decode) and tensor-core prefill (`fast`).

use super::maps::{att_maps, kv_cells, AttMaps};
use super::planner::{family_note, plan, AttnCaps, AttnPlan, AttnShape, SplitPlan};
use crate::backend::cuda::device::launch::{arena3, RawArgs};
use crate::backend::cuda::device::memory::{DevAttnBatch, DevKv};
use crate::backend::cuda::{drv, grid_1d, i32_of, CudaBackend};
use crate::backend::{validate, AttnOpts, KvInfo, Mode};
use anyhow::{ensure, Result};
use cudarc::driver::{CudaView, CudaViewMut, DevicePtr, LaunchConfig, PushKernelArg};

impl RawArgs {
    /// The run of arguments the attention kernels share (after q, and
    /// for the canonical ones n_rows): n_heads, n_kv_heads, head_dim,
    /// block_size, scale, the cache's K and V, the batch's tables, table
    /// offsets, row sequences and positions (ATT_ROWHEAD_PARAMS,
    /// common.cuh; att_pipe_*'s parameters).
    pub(super) fn att_shared(
        self,
        (nhi, nkvi, hdi, bsi): (i32, i32, i32, i32),
        scale: f32,
        cache: &DevKv<'_>,
        batch: &DevAttnBatch,
        s: &std::sync::Arc<cudarc::driver::CudaStream>,
    ) -> Self {
        self.i32(nhi)
            .i32(nkvi)
            .i32(hdi)
            .i32(bsi)
            .f32(scale)
            .ptr(cache.k.device_ptr(s).0)
            .ptr(cache.v.device_ptr(s).0)
            .ptr(batch.tables.device_ptr(s).0)
            .ptr(batch.table_off.device_ptr(s).0)
            .ptr(batch.row_seq.device_ptr(s).0)
            .ptr(batch.positions.device_ptr(s).0)
    }
}

impl CudaBackend {
    #[allow(clippy::too_many_arguments)] // the op's fields and the mode
    pub(crate) fn d_attention(
        &self,
        q: &CudaView<'_, f32>,
        n_heads: usize,
        scale: f32,
        cache: &DevKv<'_>,
        batch: &DevAttnBatch,
        opts: &AttnOpts<CudaView<'_, f32>>,
        out: &mut CudaViewMut<'_, f32>,
        mode: Mode,
    ) -> Result<()> {
        let (bs, nkv, hd) = cache.geometry();
        validate::attention_opts(opts, n_heads)?;
        let n_blocks = validate::attention(
            (bs, nkv, hd),
            cache.kv_type(),
            n_heads,
            cache.k.len(),
            cache.v.len(),
            batch.n_rows,
            q.len(),
            out.len(),
        )?;
        // The batch's tables were validated against a cache of this shape.
        ensure!(
            batch.block_size == bs && batch.n_blocks == n_blocks,
            "paged_attention: the batch was validated for {} blocks of {}, the cache has {n_blocks} of {bs}",
            batch.n_blocks,
            batch.block_size
        );
        if batch.n_rows == 0 {
            return Ok(());
        }
        let (nri, nhi, nkvi, hdi, bsi) = (
            i32_of(batch.n_rows, "n_rows")?,
            i32_of(n_heads, "n_heads")?,
            i32_of(nkv, "n_kv_heads")?,
            i32_of(hd, "head_dim")?,
            i32_of(bs, "block_size")?,
        );
        let shape = AttnShape {
            rows: batch.n_rows,
            heads: n_heads,
            kv_heads: nkv,
            head_dim: hd,
            block_size: bs,
            kv_cells: kv_cells(cache),
            part_ctas: batch.part_ctas,
            prefill_tiles: batch.tiles.is_some(),
            one_row_per_seq: batch.one_row_per_seq,
            fusions: self.tuning.matvec.prequant,
            // A capture with the read-ahead branch: the tensor-core and
            // cluster rules read it (the canonical kernels never do).
            read_ahead: mode != Mode::Exact && self.l2_branch_live()?,
            scored: !opts.is_plain(),
        };
        let caps = AttnCaps {
            arch_major: crate::backend::cuda::device::pdl::arch_major(&self.arch),
            sms: self.sm_count(),
            per_sm: &self.dev.att_per_sm,
            clusters: &self.dev.att_clusters,
            exact_threads: super::exact::att_ex_threads(),
        };
        let args = (nri, nhi, nkvi, hdi, bsi);
        let plan = plan(&shape, mode, &caps, &self.tuning.attention)?;
        if let Some(line) = family_note(&shape, mode, &self.tuning.attention, &plan) {
            self.info_once(line);
        }
        tracing::trace!(
            "paged_attention {mode:?}: {shape:?} -> {plan:?} (order {:?})",
            plan.reduction_order()
        );
        match plan {
            AttnPlan::Prefill {
                kernel,
                grid_y,
                threads,
            } => {
                let Some((tiles, n_tiles)) = &batch.tiles else {
                    anyhow::bail!("paged_attention: a prefill plan without prefill tiles");
                };
                // The o projection's f16 tiles (f16wr_out): rows past
                // n_rows of the last whole tiles zeroed first, the kernel
                // writes the rest.
                let f16 = self.f16wr_out(out, batch.n_rows, n_heads * hd, mode)?;
                let x16 = f16.map_or(0u64, |(_, p)| p);
                if f16.is_some() && !batch.n_rows.is_multiple_of(256) {
                    let tile = 128 * n_heads * hd * 2;
                    let (from, to) = (batch.n_rows / 128, batch.n_rows.div_ceil(256) * 2);
                    // SAFETY: x16 is an arena region of n_rows.div_ceil(256)
                    // * 256 rows of n_heads * hd halves (f16wr_out): tiles
                    // `from..to` of 128 rows lie inside it; the memset is
                    // queued on the backend's stream before the kernel.
                    drv(
                        unsafe {
                            cudarc::driver::sys::cuMemsetD32Async(
                                x16 + (from * tile) as u64,
                                0,
                                (to - from) * tile / 4,
                                self.stream().cu_stream(),
                            )
                        }
                        .result(),
                        "paged_attention: zeroing the f16 tiles' padding",
                    )?;
                }
                let cfg = LaunchConfig {
                    grid_dim: (u32::try_from(*n_tiles)?, u32::try_from(grid_y)?, 1),
                    block_dim: (u32::try_from(threads)?, 1, 1),
                    shared_mem_bytes: 0,
                };
                let mut b = self.stream().launch_builder(self.func(kernel)?);
                b.arg(q)
                    .arg(&nhi)
                    .arg(&nkvi)
                    .arg(&hdi)
                    .arg(&bsi)
                    .arg(&scale)
                    .arg(&cache.k)
                    .arg(&cache.v)
                    .arg(&batch.tables)
                    .arg(&batch.table_off)
                    .arg(&batch.row_seq)
                    .arg(&batch.positions)
                    .arg(tiles)
                    .arg(&mut *out)
                    .arg(&x16);
                // SAFETY: matches flash_attention_prefill{,_g}; x16 null or
                // the o projection's f16 tiles of n_rows rows of n_heads *
                // head_dim (a multiple of 256: f16wr_out); tables
                // validated at upload for this cache; tiles cover rows <
                // n_rows, each of one sequence; q/out hold
                // n_rows*n_heads*head_dim floats; head_dim a multiple of 16,
                // at most 128 (shared tiles); _g: n_kv_heads CTAs of 32 *
                // group <= 256 threads (its launch bounds).
                drv(
                    unsafe { b.launch(cfg) },
                    "paged_attention: launching the tensor-core prefill kernel",
                )?;
                if let Some((key, _)) = f16 {
                    self.q8_done(key);
                }
                Ok(())
            }
            AttnPlan::Split(p) => self.attention_split(q, args, scale, cache, batch, out, mode, &p),
            AttnPlan::ExactWarp => {
                // SAFETY: paged_attention takes the op's arguments
                // (ATT_ROWHEAD_PARAMS), validated above, and 32 threads.
                unsafe {
                    self.attention_rowhead(
                        "paged_attention",
                        batch.n_rows * n_heads,
                        32,
                        q,
                        args,
                        scale,
                        cache,
                        batch,
                        out,
                        None,
                    )
                }
            }
            AttnPlan::ExactPar {
                kernel,
                threads,
                cluster,
            } => self.attention_exact(
                q,
                args,
                scale,
                cache,
                batch,
                out,
                (kernel, threads, cluster),
            ),
            AttnPlan::Scored => self.attention_scored(q, args, scale, cache, batch, opts, out),
            AttnPlan::RowHead => {
                // Heads not a multiple of 8: ATT_WARPS (8) warps per (row,
                // head) splitting the keys (attention_fast.cu).
                // SAFETY: paged_attention_fast takes the op's arguments and
                // 256 threads.
                unsafe {
                    self.attention_rowhead(
                        "paged_attention_fast",
                        batch.n_rows * n_heads,
                        256,
                        q,
                        args,
                        scale,
                        cache,
                        batch,
                        out,
                        None,
                    )
                }
            }
        }
    }

    /// Launches `kernel`, whose parameters are ATT_ROWHEAD_PARAMS
    /// (common.cuh: q, n_rows, n_heads, n_kv_heads, head_dim, block_size,
    /// scale, k, v, tables, table_off, row_seq, positions, out), then with
    /// `tail` paged_attention_opts' (window, softcap, alibi, sinks), on
    /// `ctas` CTAs of `threads`, without clusters.
    ///
    /// # Safety
    /// `kernel` takes these parameters and `threads` threads (within its
    /// launch bound) and reads no more of the batch than `d_attention`
    /// validated: table entries below n_blocks (checked at upload for this
    /// cache geometry), q/out of n_rows*n_heads*head_dim, head_dim <= 256.
    #[allow(clippy::too_many_arguments)] // the op's fields
    pub(super) unsafe fn attention_rowhead(
        &self,
        kernel: &str,
        ctas: usize,
        threads: u32,
        q: &CudaView<'_, f32>,
        (nri, nhi, nkvi, hdi, bsi): (i32, i32, i32, i32, i32),
        scale: f32,
        cache: &DevKv<'_>,
        batch: &DevAttnBatch,
        out: &mut CudaViewMut<'_, f32>,
        tail: Option<(i32, f32, u64, u64)>,
    ) -> Result<()> {
        let cfg = LaunchConfig {
            grid_dim: (u32::try_from(ctas)?, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(self.func(kernel)?);
        b.arg(q)
            .arg(&nri)
            .arg(&nhi)
            .arg(&nkvi)
            .arg(&hdi)
            .arg(&bsi)
            .arg(&scale)
            .arg(&cache.k)
            .arg(&cache.v)
            .arg(&batch.tables)
            .arg(&batch.table_off)
            .arg(&batch.row_seq)
            .arg(&batch.positions)
            .arg(out);
        if let Some((window, softcap, alibi, sinks)) = &tail {
            b.arg(window).arg(softcap).arg(alibi).arg(sinks);
        }
        // SAFETY: the caller's contract (above).
        drv(
            unsafe { b.launch(cfg) },
            &format!("paged_attention: launching {kernel}"),
        )?;
        Ok(())
    }

    /// The canonical warp-per-(row, head) kernel with a window, softcap,
    /// ALiBi slopes or sinks (`paged_attention_opts`), arguments validated
    /// by `d_attention`.
    #[allow(clippy::too_many_arguments)] // the op's fields
    fn attention_scored(
        &self,
        q: &CudaView<'_, f32>,
        (nri, nhi, nkvi, hdi, bsi): (i32, i32, i32, i32, i32),
        scale: f32,
        cache: &DevKv<'_>,
        batch: &DevAttnBatch,
        opts: &AttnOpts<CudaView<'_, f32>>,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let s = self.stream();
        let window = i32::try_from(opts.window)
            .map_err(|_| anyhow::anyhow!("paged_attention: window {} too large", opts.window))?;
        // Null pointers select no ALiBi / no sinks (the kernel tests them).
        let alibi = opts.alibi.as_ref().map_or(0u64, |a| a.device_ptr(s).0);
        let sinks = opts.sinks.as_ref().map_or(0u64, |a| a.device_ptr(s).0);
        // SAFETY: paged_attention_opts takes ATT_ROWHEAD_PARAMS then
        // (int window, float softcap, const float* alibi, const float*
        // sinks), one warp per (row, head); the batch and cache were
        // validated by d_attention, alibi / sinks are null or hold n_heads
        // floats (validate::attention_opts), and the kernel reads no
        // table entry of a block wholly before a row's window.
        unsafe {
            self.attention_rowhead(
                "paged_attention_opts",
                batch.n_rows * nhi as usize,
                32,
                q,
                (nri, nhi, nkvi, hdi, bsi),
                scale,
                cache,
                batch,
                out,
                Some((window, opts.softcap, alibi, sinks)),
            )
        }
    }

    /// Split-KV attention (fast and deterministic modes, head_dim a
    /// multiple of 8) by plan `p` (planner.rs, split_plan):
    /// partials into the scratch arena, then the merge (the kernel's own,
    /// its cluster's, or the ordered combine). Arguments validated by
    /// `d_attention`.
    #[allow(clippy::too_many_arguments)] // the op's fields, the mode, the plan
    fn attention_split(
        &self,
        q: &CudaView<'_, f32>,
        (nri, nhi, nkvi, hdi, bsi): (i32, i32, i32, i32, i32),
        scale: f32,
        cache: &DevKv<'_>,
        batch: &DevAttnBatch,
        out: &mut CudaViewMut<'_, f32>,
        mode: Mode,
        p: &SplitPlan,
    ) -> Result<()> {
        let (_, _, hd) = cache.geometry();
        let name = p.kernel;
        let gqa = p.form.is_some();
        let (merge, clustered) = (p.merges(), p.clustered());
        let pi = i32_of(p.parts, "partials")?;
        let ctas_y = p.ctas_y;
        let rh = batch.n_rows * nhi as usize;
        let stride = batch.part_stride;
        let plen = rh * stride * (2 + hd);
        let si = i32_of(stride, "partial stride")?;
        let s = self.stream();
        // The arena: the quantized copy of the output for the next matmul
        // (regions a, b, where the matmul looks: q8_out), then the partials.
        let k_att = nhi as usize * hd;
        let qlen = batch.n_rows * k_att;
        let sizes = [qlen, qlen / 32 * 8, plen * 4];
        drop(self.arena(&sizes)?);
        let pre = if hd.is_multiple_of(32) {
            self.q8_out(out, Some(batch.n_rows), k_att, mode)?
        } else {
            None
        };
        let (xq, xds) = pre.map_or((0u64, 0u64), |(_, q, d)| (q, d));
        let mut guard = self.arena(&sizes)?;
        let early = i32::from(p.early);
        // K and V by bulk tensor copies (maps.rs) where the plan says.
        let maps = if p.tma {
            att_maps(cache, s, p.tile_keys)?
        } else {
            AttMaps::none()
        };
        let tmai = i32::from(p.tma);
        tracing::debug!(
            "paged_attention: {name}: {} rows x {nkvi} kv heads, {ctas_y} CTAs per unit, \
             {} partials, tma {}",
            batch.n_rows,
            p.parts,
            p.tma
        );
        let regions = (qlen, qlen / 32 * 8, plen);
        let res = arena3::<u8, u8, f32, ()>(&mut guard, regions, |_, _, part| {
            let cfg = LaunchConfig {
                grid_dim: (u32::try_from(p.ctas_x)?, u32::try_from(ctas_y)?, 1),
                block_dim: (u32::try_from(p.threads)?, 1, 1),
                shared_mem_bytes: u32::try_from(p.smem)?,
            };
            if clustered {
                let mut a = RawArgs::new()
                    .ptr(q.device_ptr(s).0)
                    .att_shared((nhi, nkvi, hdi, bsi), scale, cache, batch, s)
                    .i32(si)
                    .i32(pi)
                    .ptr(part.device_ptr(s).0)
                    .i32(early)
                    .bytes(&maps.to_bytes())
                    .i32(tmai)
                    .ptr(out.device_ptr(s).0)
                    .ptr(xq)
                    .ptr(xds);
                // SAFETY: att_pipe_c_d*_g* and att_rmma_c_d*_g* take
                // att_pipe_m_'s arguments (the same buffers and bounds as
                // the launch below documents; att_rmma_c_ reads neither
                // the partials nor the maps, its ctas_y is
                // 2..=ATT_RMMA_CL_MAX, its slots in rank 0), in this order
                // and these C types; the
                // cluster (1, ctas_y, 1) divides the grid (its y extent
                // is ctas_y, 2..=ATT_CLUSTER_MAX, at least every row's
                // chunks (part_ctas), so each CTA's one partial has its
                // slot in rank 0's shared memory); the device holds such
                // clusters (att_clusters > 0: counted only on sm_90+, and
                // past 8 CTAs only once the kernel opted in at load).
                return unsafe {
                    self.launch_clustered(
                        name,
                        cfg,
                        (1, u32::try_from(ctas_y)?, 1),
                        &mut a.params(),
                    )
                };
            }
            let mut b = s.launch_builder(self.func(name)?);
            b.arg(q);
            if !gqa {
                b.arg(&nri);
            }
            b.arg(&nhi)
                .arg(&nkvi)
                .arg(&hdi)
                .arg(&bsi)
                .arg(&scale)
                .arg(&cache.k)
                .arg(&cache.v)
                .arg(&batch.tables)
                .arg(&batch.table_off)
                .arg(&batch.row_seq)
                .arg(&batch.positions)
                .arg(&si)
                .arg(&pi)
                .arg(&mut *part);
            if gqa {
                b.arg(&early).arg(&maps).arg(&tmai);
            }
            if merge {
                b.arg(&mut *out).arg(&xq).arg(&xds);
            }
            // SAFETY: matches paged_attention_split and att_pipe_d*_g*
            // (the same arguments without n_rows, which the grid carries;
            // att_pipe's dynamic shared memory is att_pipe_smem's size, the
            // attribute set at load);
            // tables validated at upload for this cache; part holds
            // rows*heads*stride*(2+hd) floats and stride covers every row's
            // partials (att_parts of the largest position, or ATT_PARTS);
            // head_dim <= 256 and a multiple of 8 (16-byte K/V loads), and
            // for the grouped kernels at most 32*D32 with at most GM query
            // heads per KV head (gqa_split_kernel), whose `early` is set
            // only when every row is its sequence's only row (what their
            // reads before the programmatic wait rely on), and whose
            // AttMaps (by value) describe this layer's K and V with boxes of
            // the form's tile when `tma` is 1 (att_tma_fits: sm_90+,
            // head_dim 32*D32, pages a multiple of the tile), else are
            // never read; att_pipe_m_* and att_row_* (merge: gridDim.y ==
            // 1) also take out and xq / xds as the combine below does.
            drv(
                unsafe { b.launch(cfg) },
                "paged_attention: launching the split kernel",
            )?;
            if merge {
                return Ok(());
            }
            // The combine merges (a launch: under PDL it is resident before
            // the partials end). Merging in the unit's last CTA instead (a
            // fence and a ticket per unit) measured 2-4% slower on the 1B
            // and 8B decode (H200, 2026-11-28, docs/PERF.md).
            // head_dim <= 128: the form with twice the partials in flight.
            let combine = SplitPlan::combine_kernel(hd);
            let mut b = s.launch_builder(self.func(combine)?);
            b.arg(&mut *part)
                .arg(&nri)
                .arg(&nhi)
                .arg(&hdi)
                .arg(&batch.positions)
                .arg(&si)
                .arg(&pi)
                .arg(&mut *out)
                .arg(&xq)
                .arg(&xds);
            // SAFETY: matches attention_combine and attention_combine_d128
            // (head_dim <= 128); part as above (every (row, head) has stride
            // slots, all of which the kernel may read), out holds
            // rows*heads*head_dim floats; xq / xds null, or (head_dim a
            // multiple of 32) arena regions of rows*heads*head_dim bytes and
            // as many / 32 float2 (q8_out), disjoint from part.
            drv(
                unsafe { b.launch(grid_1d(rh * 32, 256)?) },
                "paged_attention: launching the combine",
            )?;
            Ok(())
        });
        res?;
        if let Some((key, _, _)) = pre {
            self.q8_done(key);
        }
        Ok(())
    }
}
