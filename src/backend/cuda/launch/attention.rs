//! Paged attention launches: the canonical kernel (`exact`), split-KV
//! (`deterministic`, `fast` decode) and tensor-core prefill (`fast`).

use super::att_maps::{att_maps, att_tma_fits_cache, AttMaps};
use super::attention_forms::{
    att_pipe_smem, att_threads, att_trace, cluster_ctas, cluster_wanted, deep_wanted, early_kv,
    eight_wanted, fast_parts, fuse_merge, gqa_split_kernel, row_wanted, tma_wanted, wide_wanted,
    Pipe,
};
use super::attention_rmma::{rmma_cluster_ctas, rmma_cluster_wanted, rmma_wanted, RmmaLaunch};
use super::{arena3, RawArgs};
use crate::backend::cuda::mem::{DevAttnBatch, DevKv, ATT_PARTS};
use crate::backend::cuda::{drv, grid_1d, i32_of, CudaBackend};
use crate::backend::{validate, KvInfo, Mode};
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
        out: &mut CudaViewMut<'_, f32>,
        mode: Mode,
    ) -> Result<()> {
        let (bs, nkv, hd) = cache.geometry();
        let n_blocks = validate::attention(
            (bs, nkv, hd),
            n_heads,
            cache.k.len(),
            cache.v.len(),
            batch.n_rows,
            q.len(),
            out.len(),
        )?;
        ensure!(
            hd <= 256,
            "paged_attention: head_dim {hd} > 256 is not supported by the CUDA kernel"
        );
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
        if let (Mode::Fast, Some((tiles, n_tiles))) = (mode, &batch.tiles) {
            if hd.is_multiple_of(16) && hd <= 128 {
                // The heads of a KV head in one CTA (K/V copied once for
                // them, pipelined) up to 8 of them; the same bits either way.
                let (name, grid_y, threads) = fa_kernel(n_heads, nkv, fa_grouped());
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
                let mut b = self.stream().launch_builder(self.func(name)?);
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
                return Ok(());
            }
        }
        if mode != Mode::Exact && hd.is_multiple_of(8) {
            return self.attention_split(
                q,
                (nri, nhi, nkvi, hdi, bsi),
                scale,
                cache,
                batch,
                out,
                mode,
            );
        }
        if mode == Mode::Exact {
            return self.attention_exact(q, (nri, nhi, nkvi, hdi, bsi), scale, cache, batch, out);
        }
        // Heads not a multiple of 8: ATT_WARPS (8) warps per (row, head)
        // splitting the keys (attention_fast.cu).
        // SAFETY: paged_attention_fast takes the op's arguments and 256
        // threads.
        unsafe {
            self.attention_rowhead(
                "paged_attention_fast",
                batch.n_rows * n_heads,
                256,
                q,
                (nri, nhi, nkvi, hdi, bsi),
                scale,
                cache,
                batch,
                out,
            )
        }
    }

    /// Launches `kernel`, whose parameters are ATT_ROWHEAD_PARAMS
    /// (common.cuh: q, n_rows, n_heads, n_kv_heads, head_dim, block_size,
    /// scale, k, v, tables, table_off, row_seq, positions, out), on `ctas`
    /// CTAs of `threads`, without clusters.
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
        // SAFETY: the caller's contract (above).
        drv(
            unsafe { b.launch(cfg) },
            &format!("paged_attention: launching {kernel}"),
        )?;
        Ok(())
    }

    /// Split-KV attention (fast and deterministic modes, head_dim a
    /// multiple of 8): partials into the scratch arena, then the ordered
    /// combine. Arguments validated by `d_attention`. Partials per row:
    /// `deterministic` ATT_PARTS always, `fast` fast_parts for the batch
    /// shape and the kernel's resident CTAs.
    #[allow(clippy::too_many_arguments)] // the op's fields and the mode
    fn attention_split(
        &self,
        q: &CudaView<'_, f32>,
        (nri, nhi, nkvi, hdi, bsi): (i32, i32, i32, i32, i32),
        scale: f32,
        cache: &DevKv<'_>,
        batch: &DevAttnBatch,
        out: &mut CudaViewMut<'_, f32>,
        mode: Mode,
    ) -> Result<()> {
        let (_, _, hd) = cache.geometry();
        // GQA-grouped: one CTA per (row, KV head); else per (row, head).
        let group = nhi as usize / nkvi as usize;
        let gqa = gqa_split_kernel(group, hd, Pipe::Partials);
        let name = gqa.unwrap_or("paged_attention_split");
        let units = batch.n_rows * nkvi as usize;
        let slots = self.att_per_sm(name)? * self.sm_count();
        let mut parts = match mode {
            Mode::Fast => fast_parts(units, slots),
            _ => ATT_PARTS,
        };
        // `fast`, few units: one CTA per unit folds its whole row and
        // writes the output (att_row_*, row_wanted): no partials, combine
        // or cluster barrier. With or without the device fusions (its
        // int8 copy is q8_block's, so check-exact's unfused reference
        // takes it too and checks that copy bitwise).
        // `fast`, few units, head_dim 64 or 128: the same on tensor cores
        // (att_rmma_*, rmma_wanted), for rows of one chunk (two at
        // head_dim 64), and of a few more where the split forms' merge
        // would be the combine launch (a
        // capture with the L2 read-ahead branch, a function of the model:
        // check-exact's unfused reference captures the same branch).
        // The launch as the tensor-core rules see it; `combine`: a capture
        // with the read-ahead branch (asked once: the cluster rules below
        // read it too).
        let rl = RmmaLaunch {
            units,
            rows: batch.n_rows,
            part_ctas: batch.part_ctas,
            sms: self.sm_count(),
            hd,
            combine: self.l2_branch_live()?,
        };
        let rmma = mode == Mode::Fast
            && gqa_split_kernel(group, hd, Pipe::RowMma).is_some()
            && rmma_wanted(rl);
        // Else, rows of several chunks where the split forms would merge
        // by the combine launch: the tensor-core form in a thread-block
        // cluster of CTAs per unit (att_rmma_c_*, rmma_cluster_wanted),
        // where the device holds every unit's cluster at once (a device
        // property: check-exact's reference takes the same form).
        let rmma_cl_ctas = rmma_cluster_ctas(batch.part_ctas, hd);
        let rmma_cl = !rmma
            && mode == Mode::Fast
            && rmma_cluster_wanted(rl)
            && gqa_split_kernel(group, hd, Pipe::RowMmaCluster)
                .is_some_and(|c| units <= self.att_clusters(c, rmma_cl_ctas));
        let row = rmma
            || rmma_cl
            || (mode == Mode::Fast
                && gqa_split_kernel(group, hd, Pipe::Row).is_some()
                && row_wanted(units, batch.part_ctas, self.sm_count()));
        // `fast`, rows of 2 to 16 chunks and units enough to fill the GPU
        // at the deep merging kernel's occupancy: one partial per row,
        // folded by one CTA per unit (att_pipe_m3_* when the merge is
        // fused; else the partials kernel and the combine, the same bits).
        let deep_name = gqa_split_kernel(group, hd, Pipe::Deep);
        let deep = match (mode, deep_name) {
            (Mode::Fast, Some(dn)) if !row => deep_wanted(
                units,
                batch.part_ctas,
                self.att_per_sm(dn)? * self.sm_count(),
            ),
            _ => false,
        };
        if deep {
            parts = 1;
        }
        // `fast`, more than one wave: the 8-key-tile form, its partition
        // sized by its own resident CTAs (a function of the batch shape
        // only, like fast_parts).
        let wide = mode == Mode::Fast
            && gqa.is_some()
            && !deep
            && !row
            && wide_wanted(units, parts, slots, batch.part_ctas);
        if wide {
            let wname = gqa_split_kernel(group, hd, Pipe::Wide).unwrap_or(name);
            parts = fast_parts(units, self.att_per_sm(wname)? * self.sm_count());
        }
        // No more CTAs per row than partials.
        let pi = i32_of(parts, "partials")?;
        let ctas_y = if rmma_cl {
            rmma_cl_ctas
        } else if row {
            1
        } else {
            batch.part_ctas.min(parts)
        };
        // One CTA per (row, KV head) (short contexts: a decode graph's
        // part_ctas follows the longest row): the pipelined kernel's
        // att_pipe_m_ form merges its own partials, so no
        // attention_combine runs. Not without the device fusions
        // (`prequant` off: check-exact's unfused reference, which so checks
        // this merge bitwise). The partition (parts) does not depend on it.
        let fused = !wide && gqa.is_some() && self.prequant && fuse_merge();
        let merge = (fused && ctas_y == 1) || row;
        // Two to 16 CTAs per unit (a decode graph's bucket fixes the
        // count) and few CTAs in all (cluster_ctas): they form a
        // thread-block cluster that merges after its barrier
        // (att_pipe_c_*), so no combine launches either. Only while every
        // unit's cluster is resident at once: a GPC holds whole clusters,
        // so a launch of more waits for a second wave (H100, B=8 ctx
        // 1,024, 8B heads, 64 clusters of 6: 31.1 us against 18.5 us with
        // the combine). The same bits as the combine. Not in a decode
        // graph with the L2 read-ahead branch (launch/l2_ahead.rs): its
        // CTAs, resident for the whole step, keep the clusters from being
        // placed (a carveout of 100% for the read-ahead kernel removed
        // that, 31% and 44% did not; l2_ahead_fast.cu) and the clusters
        // wait (H100, 2026-11-27, tg128@d512 with the
        // read-ahead, clusters / the combine: 8B Q8_0 275.6 / 283.0 tok/s,
        // 8B Q4_0 402.7 / 424.6, 1B Q4_0 1,528 / 1,538; with 64
        // read-ahead CTAs no cluster was placed until they gave up).
        // `fast`, few CTAs in all: the partials, merging or cluster kernel
        // at eight warps per CTA, each warp one 16-key tile of a chunk
        // (att_pipe8_*, eight_wanted; the same partition, other bits),
        // within one wave of it.
        let eight = if mode == Mode::Fast && gqa.is_some() && !wide && !deep && !row {
            let per_sm = match gqa_split_kernel(group, hd, Pipe::Partials8) {
                Some(n) => self.att_per_sm(n)?,
                None => 0,
            };
            eight_wanted(units * ctas_y, self.sm_count(), per_sm)
        } else {
            false
        };
        let kernel_form = |f: Pipe| if eight { f.eight() } else { f };
        let cluster = fused
            && !row
            && cluster_wanted(ctas_y)
            && !rl.combine
            && units * ctas_y <= cluster_ctas()
            && gqa_split_kernel(group, hd, kernel_form(Pipe::Cluster))
                .is_some_and(|c| units <= self.att_clusters(c, ctas_y));
        let form = match (wide, merge, cluster) {
            _ if rmma => Pipe::RowMma,
            _ if rmma_cl => Pipe::RowMmaCluster,
            _ if row => Pipe::Row,
            (true, _, _) => Pipe::Wide,
            (false, true, _) if deep => Pipe::Deep,
            (false, true, _) => Pipe::Merge,
            (false, false, true) => Pipe::Cluster,
            (false, false, false) => Pipe::Partials,
        };
        let name = gqa_split_kernel(group, hd, kernel_form(form)).unwrap_or(name);
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
        let smem = att_pipe_smem(name).unwrap_or(0);
        let early = i32::from(batch.one_row_per_seq && early_kv());
        // K and V by bulk tensor copies where a tile is one page's cells
        // (att_maps.rs): 8-key tiles in the wide and row forms, else 16.
        let kt = if wide || row { 8 } else { 16 };
        let arch_major = crate::backend::cuda::pdl::arch_major(&self.arch);
        // (The tensor-core row form copies by cp.async only.)
        let tma = gqa.is_some()
            && !rmma
            && !rmma_cl
            && tma_wanted(
                form,
                (units * ctas_y, slots, self.sm_count()),
                batch.part_ctas,
                parts,
                att_tma_fits_cache(arch_major, cache, kt),
            );
        let maps = if tma {
            att_maps(cache, s, kt)?
        } else {
            AttMaps::none()
        };
        let tmai = i32::from(tma);
        att_trace(&format!(
            "{name}: {} rows x {nkvi} kv heads, {ctas_y} CTAs per unit, {parts} partials, \
             {slots} slots of the partials kernel, tma {tma}",
            batch.n_rows
        ));
        let regions = (qlen, qlen / 32 * 8, plen);
        let res = arena3::<u8, u8, f32, ()>(&mut guard, regions, |_, _, part| {
            let ctas_x = if gqa.is_some() {
                batch.n_rows * nkvi as usize
            } else {
                rh
            };
            let cfg = LaunchConfig {
                grid_dim: (u32::try_from(ctas_x)?, u32::try_from(ctas_y)?, 1),
                block_dim: (u32::try_from(att_threads(name))?, 1, 1),
                shared_mem_bytes: u32::try_from(smem)?,
            };
            if cluster || rmma_cl {
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
            if gqa.is_none() {
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
            if gqa.is_some() {
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
            // the form's tile when `tma` is 1 (att_tma_fits_cache: sm_90+,
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
            let combine = if hd <= 128 {
                "attention_combine_d128"
            } else {
                "attention_combine"
            };
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

/// The tensor-core prefill kernel for `n_heads` query heads over
/// `n_kv_heads` (a divisor): its name, the grid's y extent and the threads
/// per CTA. With `grouped`, up to 8 heads per KV head share a CTA (one warp
/// each: flash_attention_prefill_g, grid y = KV heads); else, or past 8,
/// one warp per head (flash_attention_prefill).
fn fa_kernel(n_heads: usize, n_kv_heads: usize, grouped: bool) -> (&'static str, usize, usize) {
    let group = n_heads / n_kv_heads.max(1);
    if grouped && (1..=8).contains(&group) {
        ("flash_attention_prefill_g", n_kv_heads, 32 * group)
    } else {
        ("flash_attention_prefill", n_heads, 32)
    }
}

/// Whether prefill attention takes the grouped, pipelined kernel
/// (QUIRE_FA_GROUPED=0: the warp-per-head one, for comparisons; the same
/// bits either way).
fn fa_grouped() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var("QUIRE_FA_GROUPED").map_or(true, |v| v != "0"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn prefill_kernel_groups_up_to_8_heads() {
        use super::fa_kernel;
        // Llama-3.1-8B: 4 heads per KV head, one CTA of 4 warps per KV head.
        assert_eq!(
            fa_kernel(32, 8, true),
            ("flash_attention_prefill_g", 8, 128)
        );
        // SmolLM2: 3 per KV head; no GQA: one warp per CTA, still grouped.
        assert_eq!(fa_kernel(9, 3, true), ("flash_attention_prefill_g", 3, 96));
        assert_eq!(
            fa_kernel(16, 16, true),
            ("flash_attention_prefill_g", 16, 32)
        );
        // Past 8 heads per KV head (the launch bound), or switched off.
        assert_eq!(fa_kernel(12, 1, true), ("flash_attention_prefill", 12, 32));
        assert_eq!(fa_kernel(32, 8, false), ("flash_attention_prefill", 32, 32));
    }
}
