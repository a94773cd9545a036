//! `fast` mode's prefill GEMM on Hopper (kernels/matmul_wgmma_fast.cu):
//! 32-value block weights decoded straight into the wgmma A fragments in
//! registers and multiplied with f16 activations and f32 accumulation, in
//! place of the cuBLAS path's dequantization of every whole matrix to
//! device memory per call. All jobs of a MatMuls op run in one launch.

use super::act_cache::{ActKey, ACT_F16_WR};
use super::arena3;
use super::matmul::{job_table, MmJobs};
use crate::backend::cuda::mem::Dev;
use crate::backend::cuda::source::WG_KERNELS;
use crate::backend::cuda::{drv, grid_1d, i32_of, ty_code, wgmma_use, CudaBackend, WgmmaUse};
use crate::backend::{MatJob, MAX_MAT_JOBS};
use crate::quant::GgmlType;
use anyhow::{anyhow, Result};
use cudarc::driver::{CudaView, LaunchConfig, PushKernelArg};

/// Tokens per tile of to_f16_wr's layout (WR_BN); a CTA takes one or two.
const WR_BN: usize = 128;

/// The weight type of each WG_KERNELS row (its kernel type code is the row
/// index: `wg_type_index`), for the shared memory of an entry by name.
const WG_TYPES: [GgmlType; 5] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
];

/// The opt-in shared memory limit of an sm_90 CTA (WG_SMEM_MAX).
const WG_SMEM_MAX: usize = 232_448;

/// Threads per CTA (WR_THREADS) with 128 `mt` weight rows: one producer and
/// 2 `mt` consumer warpgroups.
const fn wr_threads(mt: usize) -> u32 {
    128 + 256 * mt as u32
}

/// Dynamic shared memory of a CTA (wr_smem_bytes): 1,024 bytes of
/// alignment slack, `sx` activation chunks of `bn` tokens x 128 bytes, `sr`
/// raw superchunks of 128 `mt` rows x 8 blocks of `bs` bytes, mbarriers.
const fn wr_smem_bytes(bs: usize, mt: usize, sr: usize, sx: usize, bn: usize) -> usize {
    1024 + sx * bn * 128 + sr * 128 * mt * 8 * bs + 256
}

/// Stage counts (raw superchunks, activation chunks), as wr_stages: the
/// first of (3, 6), (3, 5), (2, 6), (2, 5), (2, 4) that fits.
const fn wr_stages(bs: usize, mt: usize, bn: usize) -> (usize, usize) {
    const C: [(usize, usize); 5] = [(3, 6), (3, 5), (2, 6), (2, 5), (2, 4)];
    let mut i = 0;
    while i < C.len() {
        if wr_smem_bytes(bs, mt, C[i].0, C[i].1, bn) <= WG_SMEM_MAX {
            return C[i];
        }
        i += 1;
    }
    (2, 4)
}

/// QUIRE_WR_STAGES=sr,sx (a tuning knob; no result changes): those stage
/// counts for every CTA shape and type where they fit (sr >= 2 raw
/// superchunks and sx >= 3 activation chunks keep the pipeline live:
/// wr_body's loop). `nvrtc_options` passes the same pair to the kernel as
/// WR_STAGES_FORCE = 8 sr + sx.
pub(crate) fn wr_stages_knob() -> Option<(usize, usize)> {
    static K: std::sync::OnceLock<Option<(usize, usize)>> = std::sync::OnceLock::new();
    *K.get_or_init(|| {
        let v = std::env::var("QUIRE_WR_STAGES").ok()?;
        let (a, b) = v.split_once(',')?;
        let st = (a.trim().parse().ok()?, b.trim().parse().ok()?);
        if (2..8).contains(&st.0) && (3..8).contains(&st.1) {
            Some(st)
        } else {
            eprintln!("QUIRE_WR_STAGES={v} ignored: sr must be 2..7 and sx 3..7");
            None
        }
    })
}

/// wr_smem_of with the stage knob applied where its pair fits.
fn wr_smem_rt(bs: usize, v: usize) -> usize {
    let (mt, bn) = WR_SHAPES[v];
    wr_stages_knob()
        .map(|(sr, sx)| wr_smem_bytes(bs, mt, sr, sx, bn))
        .filter(|&b| b <= WG_SMEM_MAX)
        .unwrap_or_else(|| wr_smem_of(bs, v))
}

/// The kernels' JobMaps (common.cuh): one tensor map per job, by which the
/// copy engine moves a raw superchunk (a CTA's rows x 8 blocks) in one bulk
/// tensor copy (the wgmma GEMM, the batched-decode mq kernels).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct JobMaps([cudarc::driver::sys::CUtensorMap; MAX_MAT_JOBS]);
// SAFETY: plain data (opaque 64-byte-aligned tensor maps that hold device
// addresses, none into host memory), laid out as the kernels' struct
// JobMaps (MM_JOBS = MAX_MAT_JOBS maps of 128 bytes).
unsafe impl cudarc::driver::DeviceRepr for JobMaps {}

impl JobMaps {
    /// All zeros: for launches whose kernels copy no weights by tensor
    /// map (devices before sm_90).
    pub(super) fn none() -> Self {
        JobMaps([cudarc::driver::sys::CUtensorMap { opaque: [0; 16] }; MAX_MAT_JOBS])
    }
}

/// The geometry of one job's tensor map (`m` rows of k / 32 blocks of `bs`
/// bytes, k a multiple of 256): dims (u64 per row, rows), the row stride in
/// bytes, the box (u64, rows) = one raw superchunk of the CTA's 128 `mt`
/// rows (8 blocks: `bs` u64). The driver's limits: the stride and the box's
/// row bytes multiples of 16, box sides at most 256.
fn wr_map_geometry(m: usize, k: usize, bs: usize, mt: usize) -> ([u64; 2], u64, [u32; 2]) {
    let row_bytes = (k / 32 * bs) as u64;
    (
        [row_bytes / 8, m as u64],
        row_bytes,
        [bs as u32, (128 * mt) as u32],
    )
}

/// Tensor maps of a job table's weights (16-byte aligned, rows of k / 32
/// blocks of `bs` bytes, k a multiple of 256), for CTAs of 128 `mt` rows:
/// 2-D u64 elements as wr_map_geometry says, no swizzle (a box lands as
/// the raw stage's rows of 8 `bs` bytes), zeros past the last row.
pub(super) fn job_maps(table: &MmJobs, k: usize, bs: usize, mt: usize) -> Result<JobMaps> {
    use cudarc::driver::sys;
    let mut maps = JobMaps::none();
    for (j, (addr, m)) in table.weights().enumerate() {
        let (dims, stride, boxd) = wr_map_geometry(m, k, bs, mt);
        super::encode_tiled_map(
            &mut maps.0[j],
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT64,
            addr,
            (&dims, &[stride], &boxd),
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            &|| format!("mat_mul: job {j}'s weights ({m} rows, k {k}, {bs}-byte blocks)"),
        )?;
    }
    Ok(maps)
}

/// The CTA shapes of a WG_KERNELS row, in its order: (MT, tokens), 128 MT
/// weight rows (2 MT consumer warpgroups) by that many tokens.
const WR_SHAPES: [(usize, usize); 3] = [(1, 128), (2, 128), (1, 256)];

/// Dynamic shared memory of the entry for block size `bs` and CTA shape
/// `WR_SHAPES[v]`.
pub(super) const fn wr_smem_of(bs: usize, v: usize) -> usize {
    let (mt, bn) = WR_SHAPES[v];
    let (sr, sx) = wr_stages(bs, mt, bn);
    wr_smem_bytes(bs, mt, sr, sx, bn)
}

/// The dynamic shared memory of a `mm_wr_*` entry, None for other names.
pub(crate) fn wg_smem(name: &str) -> Option<usize> {
    WG_KERNELS.iter().enumerate().find_map(|(t, row)| {
        row.iter()
            .position(|n| *n == name)
            .map(|v| wr_smem_rt(WG_TYPES[t].type_size(), v))
    })
}

/// The row of WG_KERNELS for a weight type: its kernel type code (TY_Q4_0
/// .. TY_Q8_0 are 0..4, the rows' order), None for types the kernel does
/// not decode (K-quants, float types).
fn wg_type_index(ty: GgmlType) -> Option<usize> {
    ty_code(ty)
        .and_then(|c| usize::try_from(c).ok())
        .filter(|&c| c < WG_KERNELS.len())
}

/// The comparison knobs of the shape choice and the default rule, read once
/// (they are consulted on every prefill matmul).
struct WrKnobs {
    /// QUIRE_WR_MT=1|2 or QUIRE_WR_BN=256: the WR_SHAPES index to force.
    force: Option<usize>,
    n256_cost: usize,
    /// QUIRE_WR_SPLIT=1|2|4: the k splits to force where k allows them.
    split: Option<usize>,
    /// QUIRE_WR_SPLIT_PEN: the reduction's estimated cost (wr_plan).
    split_pen: usize,
    min_k: usize,
    min_fill: usize,
    /// QUIRE_WR_TAIL=0: no wave-tail split (wr_tail).
    tail: bool,
    /// QUIRE_WR_TAIL_SMS=N: plan the wave tail as if the GPU had N SMs and
    /// take it wherever it is possible (the parity runs' small shapes).
    tail_sms: Option<usize>,
}

fn knobs() -> &'static WrKnobs {
    static K: std::sync::OnceLock<WrKnobs> = std::sync::OnceLock::new();
    K.get_or_init(|| {
        let env = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
        };
        WrKnobs {
            force: match (env("QUIRE_WR_MT"), env("QUIRE_WR_BN")) {
                (_, Some(256)) => Some(2),
                (Some(1), _) => Some(0),
                (Some(2), _) => Some(1),
                _ => None,
            },
            n256_cost: env("QUIRE_WR_N256_COST").unwrap_or(14),
            split: env("QUIRE_WR_SPLIT").filter(|v| matches!(v, 1 | 2 | 4)),
            split_pen: env("QUIRE_WR_SPLIT_PEN").unwrap_or(25),
            min_k: env("QUIRE_WG_MIN_K").unwrap_or(2048),
            min_fill: env("QUIRE_WG_MIN_FILL").unwrap_or(90),
            tail: env("QUIRE_WR_TAIL") != Some(0),
            tail_sms: env("QUIRE_WR_TAIL_SMS").filter(|&v| v > 0),
        }
    })
}

/// The CTA shape (index into WR_SHAPES) and the k splits of one launch,
/// the pair with the shorter estimate (ties take the later).
///
/// Shapes: CTA-waves times a wave's time relative to (1, 128), in tenths:
/// 15 for MT = 2 (measured 1.49-1.58x on an H100: twice the work with four
/// consumers, 8B Q4_0 pp512 under ncu) and `QUIRE_WR_N256_COST` for 256
/// tokens (default 14: twice the work, but each weight block decoded and
/// copied once for 256 tokens; on an H100, 2026-11-25, costs 12 and 15
/// both took it for q/k/v and gate/up and ran 8B Q4_0 pp512 8% faster than
/// 18, which never took it). `QUIRE_WR_MT=1|2` forces (MT, 128),
/// `QUIRE_WR_BN=256` (1, 256) (comparisons).
///
/// Splits: with `split_ok` (the partials' reduction possible) also 2 or 4
/// where they divide k / 256, each CTA over k / splits, the partial sums
/// added in split order by split_sum_jobs. A split divides a wave's time
/// by the splits and multiplies the CTAs; its reduction costs
/// QUIRE_WR_SPLIT_PEN (default 25) tenths per wave of 128 x 128 output
/// tiles at k = 4,096 and 2 splits, scaled by splits / 2 and 4,096 / k
/// (the reduction's bytes per output do not grow with k, the GEMM's time
/// does). Why: the 8B's o and down at 512 tokens fill one wave only with
/// 128 x 128 CTAs, the least efficient shape (ncu, H100, 2026-11-25: 63
/// and 152 us against cuBLAS's 29 and 85 on f16 weights), while two k
/// halves of 64 CTAs of 128 x 256 fill the same wave: 32 + 12 and 95 + 12
/// us with split_sum_jobs, and 8B Q4_0 pp512 27.0k tokens/s against 24.1k
/// unsplit. Penalties 15 and 30 ran the 8B alike; 15 also split the 1B's
/// q/k/v (-3%), which 25 does not. QUIRE_WR_SPLIT forces a count.
pub(super) fn wr_plan(
    rows: &[usize],
    n: usize,
    k: usize,
    sms: usize,
    split_ok: bool,
) -> (usize, usize) {
    let kn = knobs();
    let cost = [10, 15, kn.n256_cost];
    let sms = sms.max(1);
    let out_tiles: usize = rows.iter().map(|r| r.div_ceil(128)).sum::<usize>() * n.div_ceil(128);
    let splits: &[usize] = match (split_ok, kn.split) {
        (false, _) => &[1],
        (true, Some(1)) => &[1],
        (true, Some(2)) => &[2],
        (true, Some(_)) => &[4],
        (true, None) => &[1, 2, 4],
    };
    let splits: Vec<usize> = splits
        .iter()
        .copied()
        .filter(|&sp| sp == 1 || (k / 256).is_multiple_of(sp) && k >= 256 * sp)
        .collect();
    let splits = if splits.is_empty() { vec![1] } else { splits };
    // Times 1,000 / splits: integers, ties decided as before.
    let time = |v: usize, sp: usize| -> usize {
        let (mt, bn) = WR_SHAPES[v];
        let tiles: usize = rows.iter().map(|r| r.div_ceil(128 * mt)).sum();
        let gemm = (tiles * n.div_ceil(bn) * sp).div_ceil(sms) * cost[v] * 1000 / sp;
        // The reduction reads sp partials: calibrated at 2.
        let reduce = if sp > 1 {
            kn.split_pen * 50 * sp * out_tiles * 4096 / (sms * k.max(1))
        } else {
            0
        };
        gemm + reduce
    };
    let shapes: Vec<usize> = match kn.force {
        Some(v) => vec![v],
        None => (0..WR_SHAPES.len()).collect(),
    };
    let mut best = (shapes[0], splits[0]);
    for &sp in &splits {
        for &v in &shapes {
            if time(v, sp) <= time(best.0, best.1) {
                best = (v, sp);
            }
        }
    }
    best
}

/// The wave tail of an unsplit launch of `ctas_y` CTA rows by `tiles_x`
/// token tiles of shape `WR_SHAPES[v]`: Some((from, sp)) to run CTA rows
/// `from..` (the tiles past the last whole wave, in whole CTA rows) in
/// `sp` k ranges each, their partials added by wr_tail_sum, where that
/// estimate is shorter than the whole launch's waves.
///
/// Why: the 8B's gate/up at 512 tokens is 448 CTAs of 128 x 256 on an
/// H100's 132 SMs, 3.4 waves, the last 40% full (ncu, 2026-11-25: 217.5
/// us against cuBLAS's 168 on f16 weights). Split in two k halves, the
/// last 52 tiles become 104 CTAs of half the time: 3.5 wave times plus
/// their reduction instead of 4. Estimate, in wr_plan's units: whole
/// waves times the shape's cost, plus the cost divided by sp, plus the
/// reduction as wr_plan counts it for the tail's output tiles; the tail's
/// sp x tiles must fit one wave. `QUIRE_WR_TAIL=0` turns it off;
/// `QUIRE_WR_TAIL_SMS=N` plans for N SMs and takes any possible tail (the
/// parity runs, whose shapes fill no wave of a real GPU).
pub(super) fn wr_tail(
    ctas_y: usize,
    tiles_x: usize,
    k: usize,
    v: usize,
    sms: usize,
) -> Option<(usize, usize)> {
    let kn = knobs();
    if !kn.tail {
        return None;
    }
    let sms = kn.tail_sms.unwrap_or(sms).max(1);
    let tiles = ctas_y * tiles_x;
    let full = tiles / sms;
    if full == 0 || tiles.is_multiple_of(sms) || tiles_x == 0 {
        return None;
    }
    let from = full * sms / tiles_x;
    let tail_tiles = (ctas_y - from) * tiles_x;
    let (mt, bn) = WR_SHAPES[v];
    let cost = [10, 15, kn.n256_cost][v];
    let out_tiles = tail_tiles * mt * bn.div_ceil(128);
    let whole = tiles.div_ceil(sms) * cost * 1000;
    let mut best: Option<(usize, usize)> = None;
    for sp in [2usize, 4] {
        if !(k / 256).is_multiple_of(sp) || k < 256 * sp || tail_tiles * sp > sms {
            continue;
        }
        let reduce = kn.split_pen * 50 * sp * out_tiles * 4096 / (sms * k.max(1));
        let t = full * cost * 1000 + cost * 1000 / sp + reduce;
        if (kn.tail_sms.is_some() || t < whole) && best.is_none_or(|(_, bt)| t < bt) {
            best = Some((sp, t));
        }
    }
    best.map(|(sp, _)| (from, sp))
}

/// Whether the wgmma GEMM takes an op by default (without QUIRE_WGMMA=1):
/// where it measured faster than the cuBLAS path on an H100 (2026-11-25):
/// every type it decodes (Q5_0 and Q5_1 since 2026-11-26: 8B pp512 27.9k
/// and 24.9k against the cuBLAS path's 20.8k and 20.7k, pp2048 24.6k and
/// 22.4k against 18.9k and 18.8k; they had stayed out at the 0.93x of the
/// first pipelined form), k of at least 2,048 (the smallest measured: the
/// 1B) and at least 0.9 of a wave of 128-row CTAs (taking also the 1B's o
/// and down at 512 tokens, 64 CTAs on 132 SMs, ran its Q4_0 prefill at
/// 0.97x the cuBLAS path; leaving them out, 1.06x). Q8_0 joined in the
/// evening: 8B pp512 22.0k against the cuBLAS path's 20.1k (pp2048 19.8k
/// against 18.4k), 1B with every GEMM taken 105.9k against 91.2k.
/// QUIRE_WG_MIN_K and QUIRE_WG_MIN_FILL (percent of a wave) override the
/// two bounds (comparisons).
pub(super) fn wg_default_takes(
    ty: GgmlType,
    k: usize,
    rows: &[usize],
    n: usize,
    sms: usize,
) -> bool {
    let ctas: usize = rows.iter().map(|r| r.div_ceil(128)).sum::<usize>() * n.div_ceil(WR_BN);
    wg_type_index(ty).is_some() && k >= knobs().min_k && 100 * ctas >= knobs().min_fill * sms.max(1)
}

impl CudaBackend {
    /// Whether the wgmma GEMM takes these jobs: its kernels are loaded
    /// (sm_90), `wg_default_takes` (skipped with QUIRE_WGMMA=1: any 32-value
    /// block type, any shape; see `wgmma_use`), k is a multiple of 256
    /// (the raw superchunks: eight blocks, a multiple of 16 bytes for every
    /// such type), every weight and the input start 16-byte aligned (bulk
    /// copies, to_f16_wr's 16-byte loads).
    pub(super) fn wg_takes(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        jobs: &[MatJob<'_, Dev>],
    ) -> bool {
        let Some(j0) = jobs.first() else {
            return false;
        };
        let Some(t) = wg_type_index(j0.w.ty) else {
            return false;
        };
        if wgmma_use() != WgmmaUse::AllTypes {
            let rows: Vec<usize> = jobs.iter().map(|j| j.w.rows).collect();
            if !wg_default_takes(j0.w.ty, j0.w.cols, &rows, n, self.sm_count()) {
                return false;
            }
        }
        let s = self.stream();
        j0.w.cols.is_multiple_of(256)
            && super::dev_ptr(x, s).is_multiple_of(16)
            && jobs
                .iter()
                .all(|j| super::dev_ptr(&j.w.data, s).is_multiple_of(16))
            && self.func(WG_KERNELS[t][0]).is_ok()
    }

    /// out_j (n, m_j) (=, or +=) x (n, k) · w_jᵀ for every job in one
    /// launch (validated arguments, `wg_takes`: k a multiple of 256).
    pub(super) fn mm_wgmma(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        jobs: &mut [MatJob<'_, Dev>],
    ) -> Result<()> {
        let s = self.stream();
        let (ty, k) = (jobs[0].w.ty, jobs[0].w.cols);
        let t = wg_type_index(ty).expect("wg_takes checked the type");
        let rows: Vec<usize> = jobs.iter().map(|j| j.w.rows).collect();
        let m_all: usize = rows.iter().sum();
        // Splits need split_sum_jobs's float4 sums: every n * m_j a
        // multiple of 4, every output 16-byte aligned.
        let split_ok = jobs.iter().all(|j| {
            (n * j.w.rows).is_multiple_of(4) && super::dev_ptr_mut(&j.out, s).is_multiple_of(16)
        });
        let (v, splits) = wr_plan(&rows, n, k, self.sm_count(), split_ok);
        let (mt, bn) = WR_SHAPES[v];
        let name = WG_KERNELS[t][v];
        // The f16 activations in to_f16_wr's tiled layout (whole tiles of
        // 128 tokens up to a multiple of `bn`, zeros past n) at the start of
        // the arena, under their own cache key: the next MatMuls op of the
        // same input converts nothing.
        let padded = n.div_ceil(bn) * bn;
        let (table, ctas) = job_table(jobs, 128 * mt, s)?;
        let maps = job_maps(&table, k, ty.type_size(), mt)?;
        let tiles_x = n.div_ceil(bn);
        let tail = if splits == 1 {
            wr_tail(ctas as usize, tiles_x, k, v, self.sm_count())
        } else {
            None
        };
        // The tail's partial tiles: sp k ranges x its tiles x bn x 128 mt.
        let tail_len = tail.map_or(0, |(from, _)| {
            (ctas as usize - from) * tiles_x * bn * 128 * mt
        });
        let part_len = match tail {
            Some((_, sp)) => sp * tail_len,
            None if splits > 1 => splits * n * m_all,
            None => 0,
        };
        let mut guard = self.arena(&[padded * k * 2, part_len * 4, 0])?;
        let key = ActKey::new(x, k, ACT_F16_WR, s);
        let cached = self.act_cached(key);
        let out_ranges: Vec<(u64, usize)> = jobs
            .iter()
            .map(|j| (super::dev_ptr_mut(&j.out, s), j.out.len()))
            .collect();
        let (ni, ki) = (i32_of(n, "n")?, i32_of(k, "k")?);
        arena3::<u16, f32, u8, ()>(&mut guard, (padded * k, part_len, 0), |x16, part, _| {
            if super::dev_ptr_mut(x16, s) % 16 != 0 {
                return Err(anyhow!(
                    "mat_mul: {name}: f16 activations not 16-byte aligned"
                ));
            }
            if !cached {
                let pieces = padded * k / 8;
                let p64 = i64::try_from(pieces)?;
                let mut b = s.launch_builder(self.func("to_f16_wr")?);
                b.arg(x).arg(&ni).arg(&ki).arg(&p64).arg(&mut *x16);
                // SAFETY: matches to_f16_wr (x, n, k, pieces, out): x holds
                // n * k floats, 16-byte aligned (wg_takes), out padded * k
                // halves; k is a multiple of 256 (wg_takes).
                drv(
                    unsafe { b.launch(grid_1d(pieces, 256)?) },
                    "mat_mul: to_f16_wr",
                )?;
            }
            // With a tail, grid rows from.. hold the tail's CTA rows once
            // per k range (wr_body).
            let (tail_from, tail_sp) = tail.unwrap_or((ctas as usize, 1));
            let grid_y = tail_from + tail_sp * (ctas as usize - tail_from);
            let tail_part = if tail.is_some() {
                super::dev_ptr_mut(part, s)
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
                shared_mem_bytes: u32::try_from(wr_smem_rt(ty.type_size(), v))?,
            };
            // Split: the kernel's table stores each job's partial sums
            // (no add) at its place in split 0's part of the buffer, job j
            // after the n * m of the jobs before it; split z at + z stride.
            let stride = if splits > 1 { (n * m_all) as i64 } else { 0 };
            let mut kt = table;
            if splits > 1 {
                let base = super::dev_ptr_mut(part, s);
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
        })?;
        self.act_remember(key, &out_ranges);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{
        wg_default_takes, wg_smem, wg_type_index, wr_map_geometry, wr_plan, wr_smem_of, wr_stages,
        wr_tail, WG_SMEM_MAX, WG_TYPES, WR_SHAPES,
    };
    use crate::quant::GgmlType;

    /// Whether one of these knobs is set (it changes the plans under
    /// test): prints SKIPPED and which.
    fn skipped_by(knobs: &[&str]) -> bool {
        match knobs.iter().find(|v| std::env::var(v).is_ok()) {
            Some(k) => {
                eprintln!("SKIPPED: {k} is set");
                true
            }
            None => false,
        }
    }

    #[test]
    fn kernel_rows_follow_the_type_codes() {
        assert_eq!(wg_type_index(GgmlType::Q4_0), Some(0));
        assert_eq!(wg_type_index(GgmlType::Q5_1), Some(3));
        assert_eq!(wg_type_index(GgmlType::Q8_0), Some(4));
        assert_eq!(wg_type_index(GgmlType::Q4_K), None);
        assert_eq!(wg_type_index(GgmlType::F16), None);
    }

    #[test]
    fn weight_tensor_maps_fit_the_drivers_limits() {
        // Every type and CTA shape at the 8B's and 1B's k: the box is one
        // raw superchunk row (8 blocks) of 16-byte multiples, its sides at
        // most 256, the row stride a 16-byte multiple, and the box bytes
        // those of the kernel's raw stage (the mbarrier's expected bytes).
        for ty in WG_TYPES {
            let bs = ty.type_size();
            for (v, &(mt, _)) in WR_SHAPES.iter().enumerate() {
                for k in [2048, 4096, 14336] {
                    let (dims, stride, boxd) = wr_map_geometry(1000, k, bs, mt);
                    assert_eq!(stride, (k / 32 * bs) as u64, "{ty:?} k {k}");
                    assert_eq!(stride % 16, 0, "{ty:?} k {k}");
                    assert_eq!(dims, [stride / 8, 1000]);
                    assert_eq!(boxd[0] as usize * 8, 8 * bs, "{ty:?}");
                    assert_eq!((boxd[0] * 8) % 16, 0, "{ty:?}");
                    assert!(boxd[0] <= 256 && boxd[1] <= 256, "{ty:?} shape {v}");
                    assert_eq!(boxd[1] as usize, 128 * mt);
                    // k / 256 superchunks of boxd[0] u64 per row.
                    assert_eq!(dims[0], (k / 256) as u64 * boxd[0] as u64);
                }
            }
        }
    }

    #[test]
    fn shared_memory_fits_an_h100_cta() {
        // 227 KiB is the opt-in limit per CTA on sm_90.
        for (t, ty) in WG_TYPES.iter().enumerate() {
            assert_eq!(wg_type_index(*ty), Some(t));
            for v in 0..3 {
                let bytes = wr_smem_of(ty.type_size(), v);
                assert!(bytes <= WG_SMEM_MAX && WG_SMEM_MAX <= 227 * 1024);
            }
        }
        // 128 rows x 128 tokens: three raw superchunks and six activation
        // chunks for every type; 256 rows: the same for Q4_0 (3 x 36 KiB),
        // two raw stages and five chunks for Q8_0 (2 x 68 KiB); 256 tokens
        // (32 KiB chunks): (3, 5) for Q4_0, (2, 5) for Q5_0, (2, 4) for Q8_0.
        assert_eq!(wr_stages(18, 1, 128), (3, 6));
        assert_eq!(wr_stages(34, 1, 128), (3, 6));
        assert_eq!(wr_stages(18, 2, 128), (3, 6));
        assert_eq!(wr_stages(20, 2, 128), (3, 6));
        assert_eq!(wr_stages(34, 2, 128), (2, 5));
        assert_eq!(wr_stages(18, 1, 256), (3, 5));
        assert_eq!(wr_stages(22, 1, 256), (2, 5));
        assert_eq!(wr_stages(34, 1, 256), (2, 4));
        assert_eq!(wg_smem("mm_wr_q8_0_m2"), Some(wr_smem_of(34, 1)));
        assert_eq!(wg_smem("mm_wr_q4_0_m1"), Some(wr_smem_of(18, 0)));
        assert_eq!(wg_smem("mm_wr_q4_1_n256"), Some(wr_smem_of(20, 2)));
        assert_eq!(wg_smem("mm_q8_mma"), None);
    }

    #[test]
    fn cta_shape_and_splits_by_waves() {
        if skipped_by(&[
            "QUIRE_WR_MT",
            "QUIRE_WR_BN",
            "QUIRE_WR_N256_COST",
            "QUIRE_WR_SPLIT",
            "QUIRE_WR_SPLIT_PEN",
        ]) {
            return;
        }
        // 8B gate and up at 512 tokens: 224 x 4 = 896 CTAs of 128 x 128 (7
        // waves on 132 SMs: 70) vs 112 x 4 = 448 of 256 rows (4 waves: 60)
        // vs 224 x 2 = 448 of 256 tokens (4 waves: 56); two splits: 49 plus
        // the reduction of 896 output tiles (17).
        assert_eq!(wr_plan(&[14336, 14336], 512, 4096, 132, true), (2, 1));
        // 8B down at 512 tokens: 32 x 4 = 128 CTAs of 128 x 128 fit one
        // wave (10); two k halves of 64 CTAs of 128 x 256 too (7 + 0.7).
        assert_eq!(wr_plan(&[4096], 512, 14336, 132, true), (2, 2));
        assert_eq!(wr_plan(&[4096], 512, 14336, 132, false), (0, 1));
        // 8B o: the same at k = 4,096 (7 + 2.4).
        assert_eq!(wr_plan(&[4096], 512, 4096, 132, true), (2, 2));
        // 8B q/k/v: 48 x 4 = 192 CTAs (2 waves: 20) vs 96 (1 wave: 15 or
        // 14); two splits: 2 waves of 7 plus 3.6.
        assert_eq!(wr_plan(&[4096, 1024, 1024], 512, 4096, 132, true), (2, 1));
        // 1B gate and up at 512 tokens: 512 CTAs (4 waves: 40) vs 256 (2
        // waves: 30 or 28).
        assert_eq!(wr_plan(&[8192, 8192], 512, 2048, 132, true), (2, 1));
        // 1B q/k/v: 96 CTAs of 128 x 128 (10) vs two k halves of 48 x 2 of
        // 128 x 256 (7 + 3.6).
        assert_eq!(wr_plan(&[2048, 512, 512], 512, 2048, 132, true), (0, 1));
        // Splits must divide k / 256: k = 768 takes none.
        assert_eq!(wr_plan(&[4096], 512, 768, 132, true).1, 1);
    }

    #[test]
    fn wave_tail_split_where_the_last_wave_is_thin() {
        if skipped_by(&[
            "QUIRE_WR_TAIL",
            "QUIRE_WR_TAIL_SMS",
            "QUIRE_WR_N256_COST",
            "QUIRE_WR_SPLIT_PEN",
        ]) {
            return;
        }
        // 8B gate/up at 512 tokens, 128 x 256 CTAs (shape 2): 224 CTA rows x
        // 2 token tiles = 448 on 132 SMs: 3 waves (198 rows), the last 26
        // rows (52 tiles) in two k halves: 104 CTAs. 3 x 14 + 7 + 2.0
        // against 4 x 14; four ranges would be 208 CTAs, past one wave.
        assert_eq!(wr_tail(224, 2, 4096, 2, 132), Some((198, 2)));
        // Less than a wave, or whole waves: no tail.
        assert_eq!(wr_tail(48, 2, 4096, 2, 132), None);
        assert_eq!(wr_tail(66, 2, 4096, 2, 132), None);
        // 1B gate/up at 512 tokens: 128 rows x 2 = 256 CTAs, a tail of 124
        // tiles: two ranges would be 248 CTAs.
        assert_eq!(wr_tail(128, 2, 2048, 2, 132), None);
        // A thin tail at k = 4,096 in four ranges: 140 tiles of 128 x 128
        // on 132 SMs leave 8 (rows 132..), 32 CTAs of a quarter's time.
        assert_eq!(wr_tail(140, 1, 4096, 0, 132), Some((132, 4)));
        // k / 256 must divide: k = 768 (three superchunks) takes none.
        assert_eq!(wr_tail(140, 1, 768, 0, 132), None);
    }

    #[test]
    fn parity_shapes_plan_their_jobs_alike_together_and_alone() {
        if skipped_by(&["QUIRE_WR_SPLIT", "QUIRE_WR_SPLIT_PEN", "QUIRE_WR_TAIL_SMS"]) {
            return;
        }
        // The opcheck's fused-vs-unfused bit check of MatMuls relies on it
        // (docs/DETERMINISM.md); 114 / 132 / 144 SMs: an H100 PCIe, SXM
        // and a larger part.
        for &(ms, k, n, _) in crate::opcheck::mat_muls::WIDE_SHAPES {
            if k % 256 != 0 {
                continue;
            }
            for sms in [114, 132, 144] {
                let joint = wr_plan(ms, n, k, sms, true).1;
                for &m in ms {
                    assert_eq!(
                        wr_plan(&[m], n, k, sms, true).1,
                        joint,
                        "rows {ms:?} k {k} n {n} on {sms} SMs: job {m} alone"
                    );
                }
                // No wave tail either (it depends on the launch's CTAs).
                for v in 0..3 {
                    let (mt, bn) = super::WR_SHAPES[v];
                    let rows = |ms: &[usize]| ms.iter().map(|m| m.div_ceil(128 * mt)).sum();
                    assert_eq!(wr_tail(rows(ms), n.div_ceil(bn), k, v, sms), None);
                    for &m in ms {
                        assert_eq!(wr_tail(rows(&[m]), n.div_ceil(bn), k, v, sms), None);
                    }
                }
            }
        }
        // Where they do not (why the doc names the exception): the 8B's
        // q/k/v at 512 tokens run unsplit together, q alone in two splits.
        assert_eq!(wr_plan(&[4096, 1024, 1024], 512, 4096, 132, true).1, 1);
        assert_eq!(wr_plan(&[4096], 512, 4096, 132, true).1, 2);
    }

    #[test]
    fn default_takes_the_measured_winners() {
        if skipped_by(&["QUIRE_WG_MIN_K", "QUIRE_WG_MIN_FILL"]) {
            return;
        }
        let q4 = GgmlType::Q4_0;
        // 8B at 512 tokens: q/k/v 48 x 4 CTAs, o and down 32 x 4 = 128
        // (0.97 of 132 SMs).
        assert!(wg_default_takes(q4, 4096, &[4096, 1024, 1024], 512, 132));
        assert!(wg_default_takes(q4, 4096, &[4096], 512, 132));
        assert!(wg_default_takes(GgmlType::Q4_1, 14336, &[4096], 512, 132));
        // Q8_0 too (8B gate/up), and Q5_0 / Q5_1 since 2026-11-26.
        assert!(wg_default_takes(
            GgmlType::Q8_0,
            4096,
            &[14336, 14336],
            512,
            132
        ));
        assert!(!wg_default_takes(GgmlType::Q8_0, 2048, &[2048], 512, 132));
        assert!(wg_default_takes(GgmlType::Q5_0, 4096, &[4096], 512, 132));
        assert!(wg_default_takes(GgmlType::Q5_1, 4096, &[4096], 512, 132));
        assert!(!wg_default_takes(GgmlType::Q5_1, 2048, &[2048], 512, 132));
        // Types the kernel does not decode: never.
        assert!(!wg_default_takes(GgmlType::Q4_K, 4096, &[4096], 512, 132));
        assert!(!wg_default_takes(GgmlType::F16, 4096, &[4096], 512, 132));
        // 1B at 512 tokens: gate/up (128 x 4 CTAs) yes, o and down (16 x
        // 4 = 64) no; at 2,048 tokens down too (256).
        assert!(wg_default_takes(q4, 2048, &[8192, 8192], 512, 132));
        assert!(!wg_default_takes(q4, 2048, &[2048], 512, 132));
        assert!(!wg_default_takes(q4, 8192, &[2048], 512, 132));
        assert!(wg_default_takes(q4, 8192, &[2048], 2048, 132));
        // Shorter rows than any measured: the cuBLAS path.
        assert!(!wg_default_takes(q4, 1024, &[8192], 2048, 132));
    }
}
