//! Paged attention launches: the canonical kernel (`exact`), split-KV
//! (`deterministic`, `fast` decode) and tensor-core prefill (`fast`).

use super::att_maps::{att_maps, att_tma_wanted, AttMaps};
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
        // `fast`, rows of 2 to 16 chunks and units enough to fill the GPU
        // at the deep merging kernel's occupancy: one partial per row,
        // folded by one CTA per unit (att_pipe_m3_* when the merge is
        // fused; else the partials kernel and the combine, the same bits).
        let deep_name = gqa_split_kernel(group, hd, Pipe::Deep);
        let deep = match (mode, deep_name) {
            (Mode::Fast, Some(dn)) => deep_wanted(
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
            && wide_wanted(units, parts, slots, batch.part_ctas);
        if wide {
            let wname = gqa_split_kernel(group, hd, Pipe::Wide).unwrap_or(name);
            parts = fast_parts(units, self.att_per_sm(wname)? * self.sm_count());
        }
        // No more CTAs per row than partials.
        let pi = i32_of(parts, "partials")?;
        let ctas_y = batch.part_ctas.min(parts);
        // One CTA per (row, KV head) (short contexts: a decode graph's
        // part_ctas follows the longest row): the pipelined kernel's
        // att_pipe_m_ form merges its own partials, so no
        // attention_combine runs. Not without the device fusions
        // (`prequant` off: check-exact's unfused reference, which so checks
        // this merge bitwise). The partition (parts) does not depend on it.
        let fused = !wide && gqa.is_some() && self.prequant && fuse_merge();
        let merge = fused && ctas_y == 1;
        // Two to 16 CTAs per unit (a decode graph's bucket fixes the
        // count) and few CTAs in all (cluster_ctas): they form a
        // thread-block cluster that merges after its barrier
        // (att_pipe_c_*), so no combine launches either. Only while every
        // unit's cluster is resident at once: a GPC holds whole clusters,
        // so a launch of more waits for a second wave (H100, B=8 ctx
        // 1,024, 8B heads, 64 clusters of 6: 31.1 us against 18.5 us with
        // the combine). The same bits as the combine.
        let cluster = fused
            && cluster_wanted(ctas_y)
            && units * ctas_y <= cluster_ctas()
            && gqa_split_kernel(group, hd, Pipe::Cluster)
                .is_some_and(|c| units <= self.att_clusters(c, ctas_y));
        let form = match (wide, merge, cluster) {
            (true, _, _) => Pipe::Wide,
            (false, true, _) if deep => Pipe::Deep,
            (false, true, _) => Pipe::Merge,
            (false, false, true) => Pipe::Cluster,
            (false, false, false) => Pipe::Partials,
        };
        let name = gqa_split_kernel(group, hd, form).unwrap_or(name);
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
        // (att_maps.rs): 8-key tiles in the wide form, else 16.
        let kt = if wide { 8 } else { 16 };
        let cells = cache.k.len() / (nkvi as usize * hd).max(1);
        let arch_major = crate::backend::cuda::pdl::arch_major(&self.arch);
        let ctas = units * ctas_y;
        let tma = gqa.is_some()
            && tma_form_wanted(form, ctas, slots, self.sm_count())
            && att_tma_wanted(arch_major, hd, bsi as usize, kt, cells);
        let maps = if tma {
            att_maps(cache, cache.k.device_ptr(s).0, cache.v.device_ptr(s).0, kt)?
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
                block_dim: (ATT_SPLIT_THREADS as u32, 1, 1),
                shared_mem_bytes: u32::try_from(smem)?,
            };
            if cluster {
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
                // SAFETY: att_pipe_c_d*_g* take att_pipe_m_'s arguments
                // (the same buffers and bounds as the launch below
                // documents), in this order and these C types; the
                // cluster (1, ctas_y, 1) divides the grid (its y extent
                // is ctas_y, 2..=ATT_CLUSTER_MAX); the device holds such
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
            // the form's tile when `tma` is 1 (att_tma_wanted: sm_90+,
            // head_dim 32*D32, pages a multiple of the tile), else are
            // never read; att_pipe_m_* (merge: gridDim.y == 1) also take
            // out and xq / xds as the combine below does.
            drv(
                unsafe { b.launch(cfg) },
                "paged_attention: launching the split kernel",
            )?;
            if merge {
                return Ok(());
            }
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

/// Whether a unit's `ctas` CTAs take the cluster-merging form: 2 to
/// ATT_CLUSTER_MAX of them (one takes att_pipe_m_, more than a cluster
/// holds take attention_combine). QUIRE_ATT_CLUSTER=0 turns it
/// off (attention_combine merges, for comparisons: the same bits).
fn cluster_wanted(ctas: usize) -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let on = *V.get_or_init(|| std::env::var("QUIRE_ATT_CLUSTER").map_or(true, |v| v != "0"));
    on && cluster_rule(ctas)
}

fn cluster_rule(ctas: usize) -> bool {
    (2..=ATT_CLUSTER_MAX).contains(&ctas)
}

/// The most CTAs of one cluster-merging unit: an H100's largest cluster
/// (past the portable 8, the kernels opt in at load; where the device
/// refuses, its count of resident clusters is 0 and the combine merges).
pub(crate) const ATT_CLUSTER_MAX: usize = 16;

/// The most CTAs (units x CTAs per unit) a cluster-merging launch takes
/// (QUIRE_ATT_CLUSTER_CTAS overrides, for sweeps): past it placing the
/// clusters costs more than the combine launch saves. Measured on an H100
/// (2026-11-24, bench-attn fast, 8B heads, us per call with PDL, combine /
/// cluster, units x CTAs): faster at 8 x 5 (8.97 / 8.63), 8 x 9 (9.14 /
/// 8.73), 16 x 5 (9.05 / 8.63), 24 x 5 (9.15 / 8.77); slower at 8 x 13
/// (9.39 / 10.89), 16 x 9 (9.28 / 10.21), 32 x 5 (9.11 / 9.82); in the
/// decode graphs faster at 3 x 16 (SmolLM2 ctx 1,024) and 8 x 8 (1B ctx
/// 512), slower at 8 x 16 (1B ctx 1,024).
fn cluster_ctas() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| env_usize("QUIRE_ATT_CLUSTER_CTAS").unwrap_or(80))
}

/// Partials per row in `fast` mode, from `units` (rows x KV heads: the
/// split kernel's CTAs per partial) and `slots` (its CTAs resident on the
/// whole GPU at once, from the occupancy): all ATT_PARTS while they fit in
/// one wave; else the fewest partials whose CTAs fill their last wave to
/// at least 95% (or make 8 waves), so no wave runs mostly empty and each
/// CTA walks as many tiles as the GPU allows. QUIRE_ATT_PARTS fixes the
/// count (for sweeps). A function of the batch shape only, so a captured
/// graph keeps its value. Measured on an H100 (2026-11-23, bench-attn
/// fast, 8B heads, att_pipe_d4_g4 at 3 CTAs per SM: 396 slots), us per
/// call at ctx 512 / 2048 / 8192 for the partials this picks vs the
/// former rule (about 8 CTAs per SM): B=8 (6 vs 17 partials) 12.3 / 34.6
/// / 101.9 vs 12.3 / 42.9 / 116.9; B=32 (3 vs 5) 37.1 / 105.7 / 377.8 vs
/// 41.5 / 116.5 / 403.2; B=64 (3, the same); B=1: 32.
fn fast_parts(units: usize, slots: usize) -> usize {
    static V: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    match *V.get_or_init(|| env_usize("QUIRE_ATT_PARTS")) {
        Some(p) => p.clamp(1, ATT_PARTS),
        None => parts_for_slots(units, slots),
    }
}

fn parts_for_slots(units: usize, slots: usize) -> usize {
    let (units, slots) = (units.max(1), slots.max(1));
    if units * ATT_PARTS <= slots {
        return ATT_PARTS;
    }
    // Share of the last wave's slots in use (1.0: whole waves).
    let fill = |p: usize| {
        let ctas = units * p;
        ctas as f64 / (ctas.div_ceil(slots) * slots) as f64
    };
    (1..=ATT_PARTS)
        .find(|&p| fill(p) >= 0.95 || units * p >= 8 * slots)
        .unwrap_or_else(|| {
            // No count fills its waves: the best fill (the fewest on a tie).
            (1..=ATT_PARTS).fold(1, |b, p| if fill(p) > fill(b) { p } else { b })
        })
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

/// Whether a one-CTA-per-unit launch of the pipelined kernels merges
/// its own partials (QUIRE_ATT_FUSE=0: attention_combine does, for
/// comparisons; the same arithmetic and order either way).
fn fuse_merge() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var("QUIRE_ATT_FUSE").map_or(true, |v| v != "0"))
}

/// Whether decode batches' split attention copies its first K/V tiles
/// before its programmatic wait (QUIRE_ATT_EARLY=0: after it, for
/// comparisons; the start-up loads of positions and block tables go
/// before it either way; the same bits).
fn early_kv() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var("QUIRE_ATT_EARLY").map_or(true, |v| v != "0"))
}

/// Whether a launch of `ctas` CTAs of form `form` takes the bulk tensor
/// copies (where att_tma_wanted allows them): QUIRE_ATT_TMA=1 every
/// launch, else tma_rule.
fn tma_form_wanted(form: Pipe, ctas: usize, slots: usize, sms: usize) -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var("QUIRE_ATT_TMA").is_ok_and(|v| v == "1"))
        || tma_rule(form, ctas, slots, sms)
}

/// Every form but one: the partials kernel launched as a single wave of
/// more than two CTAs per SM (of its `slots` resident), where each lane's
/// cp.async measured faster. H100, bench-attn, 8B heads, 16-token pages,
/// us per call with PDL, bulk copies / cp.async, two rounds
/// (2026-11-26): B=8 (384 CTAs, 396 slots) ctx 2,048 32.9 / 32.4, ctx
/// 8,192 102.5 / 99.3; but B=1 (256 CTAs) ctx 8,192 17.5 / 19.6 and ctx
/// 2,048 9.0 / 9.9, B=64 ctx 8,192 (1,536 CTAs) 736 / 760-800, B=32 ctx
/// 8,192 (768) 377 / 377.
fn tma_rule(form: Pipe, ctas: usize, slots: usize, sms: usize) -> bool {
    form != Pipe::Partials || ctas > slots || ctas <= 2 * sms
}

/// Whether a `fast` launch of `units` (row, KV head) pairs whose longest
/// row has `part_ctas` chunks (at most ATT_PARTS) folds each row in one
/// CTA at ATT_M3_STAGES stages: deep_rule (QUIRE_ATT_DEEP=0: never;
/// =1: for every row count, so the op parity harness, whose batches are
/// small, checks it; the partition changes, so the bits do).
fn deep_wanted(units: usize, part_ctas: usize, deep_slots: usize) -> bool {
    static V: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    match *V.get_or_init(|| match std::env::var("QUIRE_ATT_DEEP").as_deref() {
        Ok("0") => Some(false),
        Ok("1") => Some(true),
        _ => None,
    }) {
        Some(false) => false,
        Some(true) => (2..=ATT_PARTS / 2).contains(&part_ctas),
        None => deep_rule(units, part_ctas, deep_slots),
    }
}

/// Rows of 2 to 16 chunks (a decode graph's bucket fixes the count: up to
/// 2,048 keys) and units that fill the deep kernel's `deep_slots` resident
/// CTAs by themselves (one partial is what fast_parts would pick there).
/// Measured on an H100 (2026-11-26, bench-attn, 8B heads, us per call
/// with PDL; this form / the 8-key split and its combine): B=32 ctx 512
/// 29.8 / 33.3, ctx 2,048 98.9 / 104.4; B=64 58.1 / 58.7, 197.3 / 203.3;
/// but at ctx 8,192 385.4 / 378.6 and 741.5 / 734.6 (the split form
/// stays there).
fn deep_rule(units: usize, part_ctas: usize, deep_slots: usize) -> bool {
    (2..=ATT_PARTS / 2).contains(&part_ctas) && parts_for_slots(units, deep_slots) == 1
}

/// QUIRE_ATT_TRACE=1: each distinct split-attention launch shape (the
/// kernel, its grid and partition), once, on stderr: which form a
/// benchmark's shapes take.
fn att_trace(line: &str) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    if !*ON.get_or_init(|| std::env::var("QUIRE_ATT_TRACE").is_ok_and(|v| v == "1")) {
        return;
    }
    if let Ok(mut seen) = SEEN.lock() {
        if !seen.iter().any(|l| l == line) {
            eprintln!("attention: {line}");
            seen.push(line.to_string());
        }
    }
}

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Pipeline depth of the att_pipe kernels (ATT_STAGES in the prelude):
/// QUIRE_ATT_STAGES, 2..=4, default 2.
pub(crate) fn att_stages() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| env_usize("QUIRE_ATT_STAGES").unwrap_or(2).clamp(2, 4))
}

/// The forms of the pipelined split kernel (attention_fast.cu): partials
/// only (16-key tiles), partials merged by the CTA itself (att_pipe_m_*,
/// one CTA per (row, KV head)), partials with 8-key tiles at
/// ATT_W_STAGES stages (att_pipe_w_*: `fast` mode, multi-wave launches),
/// partials merged by the unit's thread-block cluster of
/// 2..=ATT_CLUSTER_MAX CTAs (att_pipe_c_*, sm_90+), and the merging form
/// at ATT_M3_STAGES stages (att_pipe_m3_*, deep_rule).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pipe {
    Partials = 0,
    Merge = 1,
    Wide = 2,
    Cluster = 3,
    Deep = 4,
}

/// Stages of the att_pipe_m3_* kernels (ATT_M3_STAGES in the prelude): the
/// merging form for rows of several chunks folded by one CTA (deep_rule),
/// where a tile's copies have a tile's compute less to hide behind than
/// in the split forms.
pub(crate) const ATT_M3_STAGES: usize = 3;

/// Stages of the att_pipe_w_* kernels (ATT_W_STAGES in the prelude):
/// QUIRE_ATT_W_STAGES, 2..=4, default 3.
pub(crate) fn att_w_stages() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| env_usize("QUIRE_ATT_W_STAGES").unwrap_or(3).clamp(2, 4))
}

/// Threads per CTA of the split-attention kernels (paged_attention_split,
/// att_pipe_*: 32 * ATT_SPLIT_WARPS, which attention_fast.cu checks against
/// the prelude's ATT_SPLIT_THREADS): their launches and the occupancy
/// counts taken at load.
pub(crate) const ATT_SPLIT_THREADS: usize = 128;

/// Dynamic shared memory of the pipelined kernel `name`
/// (att_pipe_{,m_,w_}d{D32}_g{GM}; the layout of att_pipe_gqa): K and V
/// stages (4 warps, stages of KT rows of 32*D32 f16 each: 16 rows at
/// ATT_STAGES stages, or for att_pipe_w_* 8 rows at att_w_stages()), the
/// queries (GM x 32*D32 f32), the tile weights (4 x GM x KT), the
/// warps' (m, l) and the stages' mbarriers (4 x stages u64, the bulk
/// tensor copies'). None for any other kernel.
pub(crate) fn att_pipe_smem(name: &str) -> Option<usize> {
    let (rest, kt, st) = if let Some(r) = name.strip_prefix("att_pipe_w_d") {
        (r, 8, att_w_stages())
    } else if let Some(r) = name.strip_prefix("att_pipe_m3_d") {
        (r, 16, ATT_M3_STAGES)
    } else {
        let r = name
            .strip_prefix("att_pipe_d")
            .or_else(|| name.strip_prefix("att_pipe_m_d"))
            .or_else(|| name.strip_prefix("att_pipe_c_d"))?;
        (r, 16, att_stages())
    };
    let (d32, gm) = rest.split_once("_g")?;
    let (d32, gm): (usize, usize) = (d32.parse().ok()?, gm.parse().ok()?);
    let (w, hd) = (4, 32 * d32);
    Some(2 * w * st * kt * hd * 2 + gm * hd * 4 + w * gm * kt * 4 + 2 * w * gm * 4 + 8 * w * st)
}

/// The GQA-grouped split kernel of form `form` for `group` query heads per
/// KV head and `head_dim` (a multiple of 8): `att_pipe_d{D32}_g{GM}` (or
/// its `_m_` / `_w_` form) with head_dim <= 32 * D32 and group <= GM, the
/// smallest instantiated (attention_fast.cu); None past 8 heads per group
/// or head_dim 128 (the per-head kernel).
fn gqa_split_kernel(group: usize, head_dim: usize, form: Pipe) -> Option<&'static str> {
    let d = match head_dim {
        1..=64 => 0,
        65..=128 => 1,
        _ => return None,
    };
    let g = match group {
        1 => 0,
        2 => 1,
        3..=4 => 2,
        5..=8 => 3,
        _ => return None,
    };
    Some(crate::backend::cuda::source::ATT_PIPE[form as usize][d][g])
}

/// Whether a `fast` launch of `units` (row, KV head) pairs with `parts`
/// partials each takes the 8-key-tile kernel: when the 16-key kernel's
/// grid would run in more than one wave of its `slots` resident CTAs,
/// each unit has more than one CTA (the merging form stays for one), and
/// rows reach at most 16 chunks (`part_ctas`, the longest row's, which a
/// decode graph's bucket fixes: 2,048 keys). There the smaller stages let
/// more CTAs share an SM, which short CTAs need. Measured on an H100
/// (2026-11-24, bench-attn, 8B heads, us per call with PDL, 16-key / 8-key
/// at 3 stages): B=64 ctx 512 66.8 / 52.6, ctx 2,048 207.4 / 194.1; B=32
/// 35.1 / 32.6, 108.1 / 103.9; but at ctx 8,192 (32 chunks) 741.8 / 764.8
/// and 381.4 / 383.2, and one-wave launches lose (B=1 ctx 512 8.9 / 10.0,
/// B=8 10.1 / 11.6). QUIRE_ATT_WIDE=0 turns it off; =1 takes it for every launch
/// with more than one CTA per unit (so the op parity harness, whose
/// batches are small, checks it).
fn wide_wanted(units: usize, parts: usize, slots: usize, part_ctas: usize) -> bool {
    static V: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    match *V.get_or_init(|| match std::env::var("QUIRE_ATT_WIDE").as_deref() {
        Ok("0") => Some(false),
        Ok("1") => Some(true),
        _ => None,
    }) {
        Some(false) => false,
        Some(true) => several_ctas(parts, part_ctas),
        None => wide_rule(units, parts, slots, part_ctas),
    }
}

/// More than one CTA per (row, KV head): else the merging form runs.
fn several_ctas(parts: usize, part_ctas: usize) -> bool {
    part_ctas.min(parts) > 1
}

fn wide_rule(units: usize, parts: usize, slots: usize, part_ctas: usize) -> bool {
    units * parts > slots && several_ctas(parts, part_ctas) && part_ctas <= ATT_PARTS / 2
}

#[cfg(test)]
mod tests {
    use super::{
        att_pipe_smem, cluster_rule, deep_rule, gqa_split_kernel, parts_for_slots, tma_rule,
        wide_rule, Pipe,
    };

    #[test]
    fn cluster_form_for_two_to_sixteen_ctas_per_unit() {
        // One CTA merges its own partials (att_pipe_m_); past an H100's
        // largest cluster attention_combine merges.
        assert!(!cluster_rule(0));
        assert!(!cluster_rule(1));
        assert!(cluster_rule(2));
        assert!(cluster_rule(5));
        assert!(cluster_rule(8));
        assert!(cluster_rule(16));
        assert!(!cluster_rule(17));
        assert!(!cluster_rule(32));
    }

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

    #[test]
    fn deep_form_for_rows_of_two_to_sixteen_chunks_that_fill_the_gpu() {
        // An H100's 132 SMs at 2 deep CTAs per SM: 264 slots.
        let slots = 264;
        // B=32 and B=64 of 8 KV heads at 512 and 2,048 keys.
        for units in [256, 512] {
            for chunks in [4, 16] {
                assert!(deep_rule(units, chunks, slots), "{units} {chunks}");
            }
            // One chunk (the plain merging form) and past 16 chunks (the
            // split form) stay.
            assert!(!deep_rule(units, 1, slots));
            assert!(!deep_rule(units, 17, slots));
            assert!(!deep_rule(units, 32, slots));
        }
        // Too few units to fill a wave: B=8 and B=16.
        assert!(!deep_rule(64, 16, slots));
        assert!(!deep_rule(128, 16, slots));
    }

    #[test]
    fn bulk_copies_except_one_full_wave_of_the_partials_kernel() {
        let (slots, sms) = (396, 132);
        // B=8: 384 CTAs in one wave of 396 slots.
        assert!(!tma_rule(Pipe::Partials, 384, slots, sms));
        // B=1 (256 CTAs) and multi-wave launches.
        assert!(tma_rule(Pipe::Partials, 256, slots, sms));
        assert!(tma_rule(Pipe::Partials, 768, slots, sms));
        // Every other form.
        for f in [Pipe::Merge, Pipe::Wide, Pipe::Cluster, Pipe::Deep] {
            assert!(tma_rule(f, 384, slots, sms));
        }
    }

    #[test]
    fn fast_parts_fill_the_last_wave() {
        // Llama-3.1-8B (8 KV heads) on 132 SMs at 3 CTAs per SM.
        let parts = |units| parts_for_slots(units, 396);
        // B=1: 8 x 32 CTAs fit in one wave.
        assert_eq!(parts(8), 32);
        // B=8: 6 x 64 = 384 of 396 slots; 1..5 leave the wave emptier.
        assert_eq!(parts(8 * 8), 6);
        // B=32: 3 x 256 = 768 of 792 (two waves); 1 and 2 fill 65%.
        assert_eq!(parts(32 * 8), 3);
        // B=64: 1 fills 65% of 2 waves, 2 86% of 3, 3 97% of 4.
        assert_eq!(parts(64 * 8), 3);
        // 8 waves or more with one partial.
        assert_eq!(parts(10_000), 1);
        assert_eq!(parts(0), 32);
        // One slot: any count fills it.
        assert_eq!(parts_for_slots(5, 1), 1);
    }

    #[test]
    fn wide_form_only_past_one_wave_with_several_ctas_per_unit() {
        // Llama-3.1-8B on 132 SMs at 3 CTAs per SM (396 slots), the
        // partials parts_for_slots picks.
        let wide = |b: usize, part_ctas| {
            let units = 8 * b;
            wide_rule(units, parts_for_slots(units, 396), 396, part_ctas)
        };
        // B=1 (8 x 32 = 256 CTAs) and B=8 (64 x 6 = 384): one wave.
        assert!(!wide(1, 64));
        assert!(!wide(8, 64));
        // B=32 (256 x 3 = 768) and B=64 (512 x 3): more than one.
        assert!(wide(32, 4));
        assert!(wide(64, 8));
        // Contexts of at most 128 keys: one CTA per unit (the merging form).
        assert!(!wide(64, 1));
        // Past 16 chunks (2,048 keys) per row: the 16-key form.
        assert!(wide(64, 16));
        assert!(!wide(64, 17));
        assert!(!wide(32, 32));
        // Many units with one partial each but more than one wave.
        assert!(wide_rule(1000, 2, 396, 2));
        assert!(!wide_rule(1000, 1, 396, 4));
    }

    #[test]
    fn gqa_kernel_is_the_smallest_that_fits() {
        use Pipe::{Cluster, Deep, Merge, Partials, Wide};
        assert_eq!(gqa_split_kernel(4, 128, Partials), Some("att_pipe_d4_g4"));
        assert_eq!(gqa_split_kernel(3, 64, Partials), Some("att_pipe_d2_g4"));
        assert_eq!(gqa_split_kernel(8, 80, Partials), Some("att_pipe_d4_g8"));
        assert_eq!(gqa_split_kernel(1, 8, Partials), Some("att_pipe_d2_g1"));
        assert_eq!(gqa_split_kernel(3, 64, Merge), Some("att_pipe_m_d2_g4"));
        assert_eq!(gqa_split_kernel(4, 128, Wide), Some("att_pipe_w_d4_g4"));
        assert_eq!(gqa_split_kernel(3, 64, Cluster), Some("att_pipe_c_d2_g4"));
        assert_eq!(gqa_split_kernel(4, 128, Deep), Some("att_pipe_m3_d4_g4"));
        assert_eq!(gqa_split_kernel(9, 128, Partials), None);
        assert_eq!(gqa_split_kernel(4, 256, Merge), None);
        // Every pipelined kernel's shared memory fits an H100's 227 KiB
        // per CTA (the names come from source::ATT_PIPE, which KERNELS
        // loads).
        for g in 1..=8 {
            for hd in (8..=128).step_by(8) {
                for form in [Partials, Merge, Wide, Cluster, Deep] {
                    let n = gqa_split_kernel(g, hd, form).unwrap();
                    let smem = att_pipe_smem(n).expect("a pipelined kernel");
                    assert!(smem <= 227 * 1024, "{n}");
                }
            }
        }
        assert_eq!(att_pipe_smem("paged_attention_split"), None);
        // The deep merging form: 3 stages of 16 keys (96 KiB of K/V) + 2
        // KiB of queries + 1 KiB of weights + 128 bytes of (m, l) + 12
        // mbarriers: two CTAs per SM of an H100.
        assert_eq!(
            att_pipe_smem("att_pipe_m3_d4_g4"),
            Some(98_304 + 2_048 + 1_024 + 128 + 96)
        );
        // The merging forms share the partials kernel's layout.
        assert_eq!(
            att_pipe_smem("att_pipe_c_d4_g4"),
            att_pipe_smem("att_pipe_d4_g4")
        );
        // The 8-key form at 3 stages: 48 KiB of K/V stages + 2 KiB of
        // queries + 512 bytes of weights + 128 bytes of (m, l) + 12
        // mbarriers.
        if super::att_w_stages() == 3 {
            assert_eq!(
                att_pipe_smem("att_pipe_w_d4_g4"),
                Some(49_152 + 2_048 + 512 + 128 + 96)
            );
        }
        // d4_g8 at 2 stages: 64 KiB of K/V stages + 4 KiB of queries +
        // 2 KiB of weights + 256 bytes of (m, l) + 8 mbarriers.
        if super::att_stages() == 2 {
            assert_eq!(
                att_pipe_smem("att_pipe_d4_g8"),
                Some(65_536 + 4_096 + 2_048 + 256 + 64)
            );
        }
    }
}
