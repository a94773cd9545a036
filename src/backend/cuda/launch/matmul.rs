//! Matmul launches: canonical kernels (`exact`), the int8 warp-per-row
//! and tensor-core kernels (`deterministic`, `fast`) and cuBLAS (`fast`,
//! many rows), plus the cache of quantized activations in the arena.

use super::act_cache::{ActKey, ACT_F16, ACT_Q8};
pub(super) use super::mm_jobs::{job_table, MmJobs};
use super::{arena3, dev_ptr_mut, RawArgs};
use crate::backend::cuda::mem::{Dev, DevMatrix};
use crate::backend::cuda::{drv, grid_1d, i32_of, ty_code, CudaBackend};
use crate::backend::{validate, MatJob, Mode, WeightInfo};
use crate::quant::GgmlType;
use anyhow::{anyhow, Result};
use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

/// Activation rows per group of the warp-per-row matmul (MV_ROWS in
/// matmul_fast.cu).
pub(super) const MV_ROWS: usize = 8;

/// Up to this many rows `fast` mode keeps the warp-per-row kernels (one
/// group of MV_ROWS: weights streamed once); beyond, one cuBLAS GEMM, which
/// pays a dequantization of the whole matrix per call but runs on tensor
/// cores. Measured on an H100 (8B Q4_0, 2026-11-22): the warp-per-row
/// kernel over 4 and 8 groups (weights re-read from L2) gave only 835 and
/// 853 tokens/s at batch 32 and 64.
pub(crate) const MV_BATCH: usize = MV_ROWS;

/// The activation rows for which `fast` mode uses the tensor-core kernels
/// on quantized weights (mm_q8_mma for the types it takes, else the f16
/// tile kernel mm_f16_tile): more than `lo`, at most `hi`
/// (QUIRE_MMA_MIN_ROWS, default 7; QUIRE_MMA_MAX_ROWS, default 64). Below,
/// the warp-per-row kernel; above, cuBLAS (prefill: the f16 dequantization
/// per call is paid back by the GEMM's tensor-core rate). Measured on an
/// H100, 8B Q4_0 (2026-11-22), batches of 2/4/6/8 decode rows: warp-per-row
/// 356/557/670/743 tokens/s, tile kernel 220/430/630/821-908; pp512
/// (2026-11-23): mm_q8_mma 11,482, dequantization + cuBLAS 17,333.
pub(super) fn mma_rows() -> (usize, usize) {
    static V: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        let var = |name: &str, default: usize| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        (var("QUIRE_MMA_MIN_ROWS", 7), var("QUIRE_MMA_MAX_ROWS", 64))
    })
}

/// Above how many activation rows `fast` mode runs the weight types that
/// mm_q8_mma takes through it (at most `hi` of mma_rows): QUIRE_MQ_MIN_ROWS,
/// by default 1 (or QUIRE_MMA_MIN_ROWS where that is lower), so only a
/// single row keeps the warp-per-row kernel. The f16 tile kernel keeps
/// mma_rows' `lo` (it loses to warp-per-row below 8 rows). Measured on an
/// H100 (8B Q4_0, 2026-11-23, tokens/s at B2 / B4): warp-per-row 561 / 794,
/// mm_q8_mma_t16 570 / 1,114 (llama-batched-bench: 558 / 909; t16_k2b,
/// which replaced t16, 589 / 1,142).
pub(super) fn mq_min_rows() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("QUIRE_MQ_MIN_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1.min(mma_rows().0))
    })
}

/// Whether `fast` mode runs an `n`-row matmul of quantized weights through
/// cuBLAS (which a CUDA graph does not capture).
pub(crate) fn fast_uses_blas(n: usize) -> bool {
    let (lo, hi) = mma_rows();
    n > MV_BATCH && !(n > lo && n <= hi)
}

/// Weight rows and activation rows of one mm_f16_tile CTA (TT_ROWS,
/// TT_TOK in matmul_fast.cu), and its k chunk in 32-value units.
const TILE_ROWS: usize = 128;
const TILE_TOK: usize = 64;
const TILE_KU: usize = 2;
/// mm_f16_tile's dynamic shared memory (TT_SMEM): the f16 weight tile
/// (128 rows of 72 halves), then 3 pipeline stages of raw weights (128 rows
/// of 17 words) and activations (64 rows of 72 halves): 70.5 KiB.
pub(crate) const TILE_SMEM: usize = 128 * 72 * 2 + 3 * (128 * 17 * 4 + 64 * 72 * 2);

/// A split-K target read once from the environment: `var` parsed as a
/// positive count of CTAs per SM, else 2 (the tile kernels fit two per SM).
pub(super) fn ctas_per_sm_knob(var: &str) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&v| v > 0)
        .unwrap_or(2)
}

/// CTAs per SM that tile_splits aims for: QUIRE_TILE_CTAS_PER_SM (tuning
/// knob), default 2. Measured on an H100 (2026-11-22, 8B Q4_0, batched
/// decode B16 / B64): 1: 1,343 / 3,275, 2: 1,936 / 3,991, 3: 1,709 /
/// 3,369, 4: 1,786 / 3,720 tokens/s.
fn tile_ctas_per_sm() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| ctas_per_sm_knob("QUIRE_TILE_CTAS_PER_SM"))
}

/// Split-K of a tile kernel: (splits, k units per split) so that `tiles`
/// output tiles times the splits make about `target` CTAs (one wave; a
/// 4096-row matrix has only 32 row tiles), each split a whole number of
/// `chunk`-unit k chunks and none empty. Depends only on the shapes and
/// the device, never on the data.
pub(super) fn split_k(tiles: usize, units: usize, chunk: usize, target: usize) -> (usize, usize) {
    let chunks = units.div_ceil(chunk);
    let want = (target / tiles.max(1)).clamp(1, chunks.max(1));
    let upc = chunks.div_ceil(want) * chunk;
    (units.div_ceil(upc).max(1), upc)
}

/// Split-K for mm_f16_tile (`split_k` over its 128 x 64 tiles and
/// TILE_KU-unit chunks).
fn tile_splits(m: usize, n: usize, units: usize, sms: usize) -> (usize, usize) {
    let tiles = m.div_ceil(TILE_ROWS) * n.div_ceil(TILE_TOK);
    split_k(tiles, units, TILE_KU, tile_ctas_per_sm() * sms)
}

/// A matmul's kernel arguments: the weight type code, bytes per weight
/// row, and m, k, n as the kernels' ints (n * k checked to fit too).
pub(super) struct MmDims {
    pub tc: i32,
    pub rb: i64,
    pub mi: i32,
    pub ki: i32,
    pub ni: i32,
}

pub(super) fn mm_dims(w: &DevMatrix<'_>, n: usize) -> Result<MmDims> {
    let (m, k) = (w.rows, w.cols);
    let tc = ty_code(w.ty).ok_or_else(|| anyhow!("mat_mul: {:?} is not a weight type", w.ty))?;
    let rb = w.ty.row_bytes(k).map_err(|e| anyhow!("mat_mul: {e}"))? as i64;
    i32_of(n * k, "n * k")?;
    Ok(MmDims {
        tc,
        rb,
        mi: i32_of(m, "m")?,
        ki: i32_of(k, "k")?,
        ni: i32_of(n, "n")?,
    })
}

/// The warp-per-row kernel families (see `mv_name`).
const MV_FLOAT: [&str; 4] = [
    "mv_float",
    "mv_float_r1",
    "mv_float_r1_w2",
    "mv_float_r1_w4",
];
pub(super) const MV_Q8: [&str; 4] = ["mv_q8", "mv_q8_r1", "mv_q8_r1_w2", "mv_q8_r1_w4"];
/// Norm-ahead's consumers (one row only: no grouped form).
pub(super) const MV_Q8_NC: [&str; 4] = ["", "mv_q8_r1_nc", "mv_q8_r1_w2_nc", "mv_q8_r1_w4_nc"];

/// The warp-per-row kernel of a family (`[grouped, r1, r1_w2, r1_w4]`)
/// for `n` activation rows and `warps` per weight row: the grouped kernel
/// for several rows; for one row the `r1` variant, whose per-row
/// arithmetic is the grouped kernel's (batch invariance is kept), or with
/// `warps` 2 or 4 the split-row variants (`fast` mode only, `mv_warps`).
pub(super) fn mv_name(n: usize, warps: usize, family: [&'static str; 4]) -> &'static str {
    match (n, warps) {
        (1, 2) => family[2],
        (1, 4) => family[3],
        (1, _) => family[1],
        _ => family[0],
    }
}

/// Warps per weight row of the one-row matvecs: `fast` mode only (the
/// split changes a row's arithmetic, which `deterministic` must keep
/// batch-invariant). `QUIRE_MV_WARPS=1|2|4` overrides the default, which
/// is the measured best on an H100 (tg128, warps 1 / 2 / 4): float
/// weights 2 (1B F16: 673 / 722 / 696 tok/s; 8B F16 with the
/// type-specialized kernel, 2026-11-23: 2 / 4: 166.7 / 165.7), quantized
/// 1 (8B Q4_0: 346 / 336 / 304). Quantized matrices with long rows (`long_rows`: k at least
/// 3 m, the FFN down projection: few rows, too few warps in flight) take
/// QUIRE_MV_WARPS_LONG (default 2; measured 1 / 2 / 4, 2026-11-22: 1B Q4_0
/// 1,293 / 1,348 / 1,307, 8B Q8_0 254.0 / 259.4 / 255.5, 8B Q4_0 371.0 /
/// 369.6 / 356.1, SmolLM2 1,361 / 1,389 / 1,370).
pub(super) fn mv_warps(mode: Mode, n: usize, float_w: bool, long_rows: bool) -> usize {
    static V: std::sync::OnceLock<(Option<usize>, usize)> = std::sync::OnceLock::new();
    if mode != Mode::Fast || n != 1 {
        return 1;
    }
    let parse = |name: &str| match std::env::var(name).as_deref() {
        Ok("1") => Some(1),
        Ok("2") => Some(2),
        Ok("4") => Some(4),
        _ => None,
    };
    let (set, long) = *V.get_or_init(|| {
        (
            parse("QUIRE_MV_WARPS"),
            parse("QUIRE_MV_WARPS_LONG").unwrap_or(2),
        )
    });
    set.unwrap_or(match (float_w, long_rows) {
        (true, _) => 2,
        (false, true) => long,
        (false, false) => 1,
    })
}

/// Rows per warp of the one-row short-row matvec (`mv_q8_r1_s{2,4}`,
/// kernels/matmul_short_fast.cu; `fast` mode, quantized weights, one warp
/// per row otherwise), or None for mv_q8_r1: 4 for rows of at most 24
/// units (three loads per lane at most) in matrices of at least 64 rows
/// per SM, where mv_q8_r1 runs many waves of warps with idle lanes (the
/// output heads of models as narrow as SmolLM2: 49,152 rows of 18
/// units). `QUIRE_MV_SHORT=0|2|4` overrides it for every such one-row
/// matvec (0: never).
pub(super) fn mv_short_rows(
    mode: Mode,
    n: usize,
    units: usize,
    m: usize,
    sms: usize,
) -> Option<usize> {
    short_rule(mode, n, units, m, sms, short_knob())
}

/// QUIRE_MV_SHORT (0, 2 or 4), if set.
fn short_knob() -> Option<usize> {
    static V: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("QUIRE_MV_SHORT")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|r| matches!(r, 0 | 2 | 4))
    })
}

/// Whether QUIRE_MV_SHORT forces the short-row matvec on every one-row
/// `fast` matvec (then no other one-row kernel gives those bits).
pub(super) fn short_forced() -> bool {
    matches!(short_knob(), Some(2 | 4))
}

fn short_rule(
    mode: Mode,
    n: usize,
    units: usize,
    m: usize,
    sms: usize,
    fixed: Option<usize>,
) -> Option<usize> {
    if mode != Mode::Fast || n != 1 || units == 0 {
        return None;
    }
    match fixed {
        Some(0) => None,
        Some(r) => Some(r),
        None => (units <= 24 && m >= 64 * sms).then_some(4),
    }
}

/// Grid of the warp-per-row kernels: activation-row groups fastest, then
/// the job table's `ctas` CTAs of 8 weight rows (warps, 256 threads).
pub(super) fn mv_grid(n: usize, ctas: u32) -> Result<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (u32::try_from(n.div_ceil(MV_ROWS))?, ctas, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    })
}

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

    /// Each job: out (n, m) = x (n, k) · wᵀ, or += with `add`. `exact`: the
    /// canonical kernels; `deterministic`: the warp-per-row kernels (int8
    /// activations and dp4a for quantized weights) for every n, in groups of
    /// MV_ROWS rows (batch-invariant); `fast`: those up to MV_BATCH rows,
    /// the tensor-core tile kernel for batched decode (see mma_rows), and
    /// cuBLAS f16 tensor-core GEMM with f32 accumulation beyond (weights
    /// dequantized to f16 per call). The warp-per-row kernels (every mode)
    /// run all jobs in one launch, with the add folded into the store.
    pub(crate) fn d_mat_muls(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        jobs: &mut [MatJob<'_, Dev>],
        mode: Mode,
    ) -> Result<()> {
        let shapes: Vec<(&dyn WeightInfo, usize)> = jobs
            .iter()
            .map(|j| (&j.w as &dyn WeightInfo, j.out.len()))
            .collect();
        validate::mat_muls(x.len(), n, &shapes)?;
        let (ty, k) = (jobs[0].w.ty, jobs[0].w.cols);
        let float_w = matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
        let blas = mode == Mode::Fast && n > MV_BATCH && self.blas.is_some();
        if float_w && !(blas && k.is_multiple_of(32)) {
            // Float kernels quantize nothing but may overwrite a cached
            // input (the cuBLAS path keeps the cache itself: gemm_f16).
            self.forget_activations();
        }
        if n == 0 || jobs.iter().all(|j| j.w.rows == 0) {
            return Ok(());
        }
        if k == 0 {
            // The product is zero: out = 0, or out += 0 (as MatMul then Add).
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
            return Ok(());
        }
        self.last_wgmma_rows
            .store(0, std::sync::atomic::Ordering::Relaxed);
        if mode == Mode::Exact || !k.is_multiple_of(32) {
            self.last_mv_q8
                .store(false, std::sync::atomic::Ordering::Relaxed);
            return self.mat_muls_exact(x, n, jobs);
        }
        let (lo, hi) = mma_rows();
        if mode == Mode::Fast && n > mq_min_rows() && n <= hi && super::matmul_mma::mq_takes(ty, k)
        {
            self.last_mv_q8
                .store(true, std::sync::atomic::Ordering::Relaxed);
            return self.mm_q8_mma(x, n, jobs);
        }
        let tile = mode == Mode::Fast && !float_w && n > lo && n <= hi;
        let wgmma =
            mode == Mode::Fast && !tile && n > hi && n > MV_BATCH && self.wg_takes(x, n, jobs);
        self.last_mv_q8.store(
            !tile && !wgmma && !blas && !float_w,
            std::sync::atomic::Ordering::Relaxed,
        );
        if tile {
            for j in jobs.iter_mut() {
                self.mm_tile(&j.w, x, n, &mut j.out, j.add)?;
            }
            return Ok(());
        }
        if wgmma {
            self.last_wgmma_rows
                .store(n, std::sync::atomic::Ordering::Relaxed);
            return self.mm_wgmma(x, n, jobs);
        }
        if blas {
            return self.gemm_f16_jobs(x, n, jobs);
        }
        let m: usize = jobs.iter().map(|j| j.w.rows).sum();
        let long_rows = jobs.first().is_some_and(|j| j.w.cols >= 3 * m);
        let warps = mv_warps(mode, n, float_w, long_rows);
        if warps == 1 && !float_w {
            if let Some(r) = mv_short_rows(mode, n, k / 32, m, self.sm_count()) {
                return self.mat_vec_short(x, jobs, r);
            }
        }
        self.mat_vec(x, n, jobs, warps)
    }

    /// Whether `d_mat_muls` runs these one-row jobs (validated: one type
    /// and k) with `mv_q8_r1`, the kernel whose per-row bits the fused
    /// launches (matmul_glu.rs) reproduce: quantized weights, k a
    /// multiple of 32, not the int8 tensor-core or tile kernels, one warp
    /// per row and not the short-row form.
    pub(super) fn takes_mv_q8_r1(&self, mode: Mode, n: usize, jobs: &[MatJob<'_, Dev>]) -> bool {
        let Some(j0) = jobs.first() else {
            return false;
        };
        let (ty, k) = (j0.w.ty, j0.w.cols);
        let m: usize = jobs.iter().map(|j| j.w.rows).sum();
        let float_w = matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
        mode != Mode::Exact
            && n == 1
            && !float_w
            && k > 0
            && k.is_multiple_of(32)
            && n <= mq_min_rows()
            && n <= mma_rows().0
            && mv_warps(mode, n, false, k >= 3 * m) == 1
            && mv_short_rows(mode, n, k / 32, m, self.sm_count()).is_none()
    }

    /// One row of short rows (`mv_short_rows`): `mv_q8_r1_s{r}`, r rows
    /// per warp.
    fn mat_vec_short(
        &self,
        x: &CudaView<'_, f32>,
        jobs: &mut [MatJob<'_, Dev>],
        r: usize,
    ) -> Result<()> {
        let d = mm_dims(&jobs[0].w, 1)?;
        let s = self.stream();
        let (mut table, ctas) = job_table(jobs, 8 * r, s)?;
        self.l2_record(jobs, &mut table)?;
        let cfg = mv_grid(1, ctas)?;
        let name = if r == 2 { "mv_q8_r1_s2" } else { "mv_q8_r1_s4" };
        self.mat_vec_q8(x, 1, jobs, (&d, &table, cfg, name), &[], 1)
    }

    /// The warp-per-row kernels over every job in one launch (validated
    /// arguments, k a multiple of 32). The grid's x dimension walks
    /// activation-row groups fastest, so the groups that read one tile of
    /// weight rows run together and all but the first find it in L2.
    /// `warps` (1, 2 or 4) per weight row: more than 1 only for one row in
    /// `fast` mode (`mv_warps`).
    fn mat_vec(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        jobs: &mut [MatJob<'_, Dev>],
        warps: usize,
    ) -> Result<()> {
        let w0 = &jobs[0].w;
        let d = mm_dims(w0, n)?;
        let float_w = matches!(w0.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
        let s = self.stream();
        let (mut table, ctas) = job_table(jobs, 8 / warps, s)?;
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
        self.mat_vec_q8(x, n, jobs, (&d, &table, cfg, name), &[], 1)
    }

    /// Quantized weights: activations to int8 (quant_q8, unless the arena
    /// holds them), then the warp-per-row dp4a kernel `name` over every
    /// job, with `mat_vec`'s dimensions, job table and grid. `extra`: the
    /// kernel's parameters after the common ones (device addresses; only
    /// norm-ahead's producer `mv_q8_r1_na` has any).
    pub(super) fn mat_vec_q8(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        jobs: &[MatJob<'_, Dev>],
        (d, table, cfg, name): (&MmDims, &MmJobs, LaunchConfig, &str),
        extra: &[u64],
        cluster: u32,
    ) -> Result<()> {
        let k = jobs[0].w.cols;
        let s = self.stream();
        let nblk = n * k / 32;
        let mut guard = self.arena(&[n * k, nblk * 8, 0])?;
        let key = ActKey::new(x, k, ACT_Q8, s);
        let cached = self.act_cached(key);
        let outs = Self::out_ranges(jobs, s);
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
        })?;
        self.act_remember(key, &outs);
        Ok(())
    }

    /// Batched decode on quantized weights: activations to f16, then
    /// mm_f16_tile (weight tiles dequantized to f16 in shared memory,
    /// tensor-core MMA), split over k so that the grid has about two CTAs
    /// per SM, and the splits' partial sums added in order (split_sum),
    /// which (or the one split's store) adds into `out` for `add`.
    fn mm_tile(
        &self,
        w: &DevMatrix<'_>,
        x: &CudaView<'_, f32>,
        n: usize,
        out: &mut CudaViewMut<'_, f32>,
        add: bool,
    ) -> Result<()> {
        let d = mm_dims(w, n)?;
        let (m, k) = (w.rows, w.cols);
        let (splits, upc) = tile_splits(m, n, k / 32, self.sm_count());
        let part_len = if splits > 1 { splits * n * m } else { 0 };
        let s = self.stream();
        let mut guard = self.arena(&[n * k * 2, part_len * 4, 0])?;
        // The f16 activations at the start of the arena serve every matmul
        // of the same input (q/k/v, gate/up), like quant_q8's.
        let key = ActKey::new(x, k, ACT_F16, s);
        let cached = self.act_cached(key);
        let outs = [(dev_ptr_mut(out, s), out.len())];
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
        })?;
        self.act_remember(key, &outs);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{mv_name, mv_warps, tile_splits, MV_FLOAT, MV_Q8};
    use crate::backend::Mode;

    #[test]
    fn split_k_grids() {
        // 8B shapes on a 132-SM H100: (splits, units per split).
        assert_eq!(tile_splits(4096, 64, 128, 132), (8, 16));
        assert_eq!(tile_splits(1024, 64, 128, 132), (32, 4));
        assert_eq!(tile_splits(14336, 64, 128, 132), (2, 64));
        assert_eq!(tile_splits(4096, 64, 448, 132), (8, 56));
        assert_eq!(tile_splits(128256, 64, 128, 132), (1, 128));
        // Every split is non-empty and they cover the units exactly.
        for units in [1, 2, 3, 17, 18, 128, 449] {
            for m in [1, 97, 4096] {
                let (s, upc) = tile_splits(m, 17, units, 132);
                assert!(upc % 2 == 0 && s >= 1);
                assert!((s - 1) * upc < units && s * upc >= units, "{m} {units}");
            }
        }
    }

    #[test]
    fn short_row_rule() {
        use super::short_rule;
        // SmolLM2's output head (49,152 rows of 18 units) on 132 SMs; not
        // its q/k/v (960 rows), not the 1B's head (64 units), not in
        // deterministic mode or for several rows; the knob forces or
        // forbids it.
        assert_eq!(short_rule(Mode::Fast, 1, 18, 49152, 132, None), Some(4));
        assert_eq!(short_rule(Mode::Fast, 1, 18, 960, 132, None), None);
        assert_eq!(short_rule(Mode::Fast, 1, 64, 128256, 132, None), None);
        assert_eq!(
            short_rule(Mode::Deterministic, 1, 18, 49152, 132, None),
            None
        );
        assert_eq!(short_rule(Mode::Fast, 2, 18, 49152, 132, None), None);
        assert_eq!(short_rule(Mode::Fast, 1, 64, 960, 132, Some(2)), Some(2));
        assert_eq!(short_rule(Mode::Fast, 1, 18, 49152, 132, Some(0)), None);
    }

    #[test]
    fn matvec_kernel_choice() {
        // One row: the r1 variant, or the split-row ones; more rows: grouped.
        assert_eq!(mv_name(1, 1, MV_Q8), "mv_q8_r1");
        assert_eq!(mv_name(1, 2, MV_FLOAT), "mv_float_r1_w2");
        assert_eq!(mv_name(1, 4, MV_Q8), "mv_q8_r1_w4");
        assert_eq!(mv_name(2, 1, MV_Q8), "mv_q8");
        assert_eq!(mv_name(7, 2, MV_FLOAT), "mv_float");
        // Splitting a row changes its arithmetic: never outside `fast`, and
        // never for several rows (whatever QUIRE_MV_WARPS says).
        for float_w in [false, true] {
            for long in [false, true] {
                assert_eq!(mv_warps(Mode::Deterministic, 1, float_w, long), 1);
                assert_eq!(mv_warps(Mode::Exact, 1, float_w, long), 1);
                assert_eq!(mv_warps(Mode::Fast, 3, float_w, long), 1);
                assert!([1, 2, 4].contains(&mv_warps(Mode::Fast, 1, float_w, long)));
            }
        }
        // Every name the launches use is a kernel the backend loads.
        let loaded: Vec<&str> = crate::backend::cuda::source::KERNELS
            .iter()
            .flat_map(|(_, _, e)| e.iter().copied())
            .collect();
        for name in MV_Q8.iter().chain(MV_FLOAT.iter()) {
            assert!(loaded.contains(name), "{name} is not in KERNELS");
        }
        for (n, split) in [(1, false), (1, true), (3, false), (8, true)] {
            let name = &super::super::matmul_exact::mv_exact_name(n, split);
            assert!(loaded.contains(name), "{name} is not in KERNELS");
        }
    }
}
