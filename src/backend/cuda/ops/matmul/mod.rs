//! The matmul planner: one pure function, `plan`, chooses the kernel and
//! its geometry for every `MatMuls` op from the op's shapes, the mode, what
//! the device offers (`MmCaps`) and the tuning table; the launchers
//! (`launch.rs`: the entry and the matvec and tile launches; `exact.rs`,
//! `mma.rs`, `wgmma.rs`, `blas.rs`: the canonical, int8 tensor-core,
//! Hopper and cuBLAS forms; `glu_launch.rs`: gate/up with the SwiGlu;
//! `norm.rs`: a `MatMuls` carrying its input's norm) match on its
//! `MmPlan`; `jobs.rs` builds their job tables and `prepared.rs` says
//! which input layout an earlier op left in the arena. Nothing here touches a device, so `tests.rs` pins the choices
//! on the CPU, with the invariant that makes `deterministic` and `exact`
//! what they are: a row's reduction order (`MmPlan::k_order`) never
//! depends on the number of rows in the batch.
//!
//! The planner (this file, `glu.rs`, `mq.rs`, `wr.rs`) imports none of
//! the launchers; the job table's helpers (`jobs.rs`) sit below it.

mod blas;
mod exact;
pub(crate) mod glu;
mod glu_launch;
mod jobs;
mod launch;
mod mma;
pub(crate) mod mq;
mod norm;
pub(crate) mod norm_ahead;
pub(crate) mod prepared;
#[cfg(test)]
mod tests;
mod wgmma;
mod wr;

pub(crate) use glu::glu_form;
pub(crate) use jobs::MV_ROWS;
pub(crate) use jobs::{job_table, mm_dims, mv_grid, MmDims, MmJobs};
pub(crate) use mq::{
    mq_det_kernel, mq_det_splits, mq_fits, mq_kernel, mq_smem, mq_smem_max, mq_splits, mq_takes,
    MqKernel, MQ_ROWS,
};
pub(crate) use wr::{
    wg_default_takes, wg_smem, wg_type_index, wr_plan, wr_smem_of, wr_tail, wr_threads, WR_SHAPES,
};

use crate::backend::cuda::tuning::{MatmulTuning, Switch};
use crate::backend::Mode;
use crate::quant::GgmlType;

/// Up to this many rows `fast` mode keeps the warp-per-row kernels (one
/// group of MV_ROWS: weights streamed once) unless the tensor-core decode
/// kernels take them; beyond, the prefill GEMMs. Measured on an H100 (8B
/// Q4_0): the warp-per-row kernel over 4 and 8 groups gave only 835 and
/// 853 tokens/s at batch 32 and 64.
pub(crate) const MV_BATCH: usize = MV_ROWS;

/// Weight rows and activation rows of one mm_f16_tile CTA (TT_ROWS,
/// TT_TOK in matmul_f16_fast.cu), and its k chunk in 32-value units.
pub(crate) const TILE_ROWS: usize = 128;
pub(crate) const TILE_TOK: usize = 64;
const TILE_KU: usize = 2;
/// mm_f16_tile's dynamic shared memory (TT_SMEM): the f16 weight tile
/// (128 rows of 72 halves), then 3 pipeline stages of raw weights (128 rows
/// of 17 words) and activations (64 rows of 72 halves): 70.5 KiB.
pub(crate) const TILE_SMEM: usize = 128 * 72 * 2 + 3 * (128 * 17 * 4 + 64 * 72 * 2);

/// The warp-per-row kernel families (see `mv_name`).
pub(crate) const MV_FLOAT: [&str; 4] = [
    "mv_float",
    "mv_float_r1",
    "mv_float_r1_w2",
    "mv_float_r1_w4",
];
pub(crate) const MV_Q8: [&str; 4] = ["mv_q8", "mv_q8_r1", "mv_q8_r1_w2", "mv_q8_r1_w4"];
/// Norm-ahead's consumers (one row only: no grouped form).
pub(crate) const MV_Q8_NC: [&str; 4] = ["", "mv_q8_r1_nc", "mv_q8_r1_w2_nc", "mv_q8_r1_w4_nc"];

/// The short-row matvec's rows per warp (`mv_q8_r1_s4`).
pub(crate) const SHORT_ROWS: usize = 4;

/// What the device offers the matmul kernels, read once at load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MmCaps {
    /// Compute capability major (9: Hopper; thread-block clusters from 9).
    pub arch_major: u32,
    /// Streaming multiprocessors.
    pub sms: usize,
    /// cuBLAS loaded.
    pub cublas: bool,
    /// The sm_90a wgmma kernels loaded.
    pub wgmma: bool,
}

/// One `MatMuls` op's shapes: every job has `ty` weights with rows of `k`
/// values over the same `n` activation rows; job j has `rows[j]` weight
/// rows. The two alignment facts are the launcher's reading of the
/// buffers' addresses (the planner sees no device).
#[derive(Clone, Copy, Debug)]
pub(crate) struct MmShape<'a> {
    pub ty: GgmlType,
    pub k: usize,
    pub n: usize,
    pub rows: &'a [usize],
    /// The input and every job's weights start 16-byte aligned (the wgmma
    /// GEMM's bulk copies and 16-byte loads).
    pub aligned16: bool,
    /// Every job's n * m is a multiple of 4 and its output 16-byte aligned
    /// (split_sum_jobs adds four floats at a time).
    pub outs_vec4: bool,
}

impl MmShape<'_> {
    fn float_w(&self) -> bool {
        is_float(self.ty)
    }
    fn m_all(&self) -> usize {
        self.rows.iter().sum()
    }
}

/// Whether `ty` is a float weight type (no blocks).
pub(crate) fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// The canonical kernels' forms (`exact`, and any mode where k is not a
/// multiple of 32); all give the cpu's bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ExactForm {
    /// mm_float per job (float weights).
    Float,
    /// quant_actk + mm_qk per job (256-value K-quant blocks).
    KQuant,
    /// quant_act32 + one mv_exact32 (several rows) or mv_exact32_r1 (one)
    /// launch over every job: decode, at most MV_ROWS rows.
    Matvec,
    /// quant_act32 + mm_q32 per job.
    Q32,
    /// quant_act32 + one mm_exact_mma launch over every job: the same
    /// terms with each block's integer dot on the int8 tensor cores
    /// (Q4_0 / Q4_1 / Q8_0, k a multiple of 256, more rows than the
    /// table's `exact_mma_rows`); `form` indexes XM_FORMS.
    Mma { form: usize },
}

/// Weight rows and activation rows of one mm_exact_mma CTA (XM_MR, XM_NR
/// in matmul_exact_mma.cu).
pub(crate) const XM_ROWS: usize = 64;
pub(crate) const XM_TOK: usize = 32;

/// An entry of matmul_exact_mma.cu: `kg` k groups of 8 warps (each taking
/// 8 / kg of the canonical lanes), `stages` chunk buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct XmForm {
    pub name: &'static str,
    pub kg: usize,
    pub stages: usize,
}

impl XmForm {
    pub(crate) fn threads(&self) -> usize {
        256 * self.kg
    }
}

/// The entries (the kernel file's list): two k groups, one CTA per SM
/// (the default), and one k group, two CTAs per SM.
pub(crate) const XM_FORMS: [XmForm; 2] = [
    XmForm {
        name: "mm_exact_mma",
        kg: 2,
        stages: 4,
    },
    XmForm {
        name: "mm_exact_mma_k1",
        kg: 1,
        stages: 3,
    },
];

/// mm_exact_mma's dynamic shared memory for `ty` in `form`
/// (xm_stage_bytes times its stages), or None for a type it does not take.
pub(crate) fn xm_smem(ty: GgmlType, form: &XmForm) -> Option<usize> {
    let wld = mq::mq_wld(ty)?;
    Some(form.stages * (XM_ROWS * wld + XM_TOK * (8 * 32 + 16) * 2 + 2 * 8 * XM_TOK * 4))
}

/// The most a launch of entry `name` takes (Q8_0's), None for other names.
pub(crate) fn xm_smem_max(name: &str) -> Option<usize> {
    let form = XM_FORMS.iter().find(|f| f.name == name)?;
    [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0]
        .into_iter()
        .filter_map(|t| xm_smem(t, form))
        .max()
}

/// The entry for `n` rows: the table's `exact_mma_kg` where set, else two
/// k groups up to XM_KG2_ROWS rows and one beyond. H200, 8B Q4_0 exact, one
/// call: B=64 2,704 / 2,399 tok/s with two / one, pp512 3,025 / 3,238.
pub(crate) fn xm_form(n: usize, t: &MatmulTuning) -> usize {
    let kg = t
        .exact_mma_kg
        .unwrap_or(if n <= XM_KG2_ROWS { 2 } else { 1 });
    XM_FORMS.iter().position(|f| f.kg == kg).unwrap_or(0)
}

/// The most rows the two-k-group entry takes by default (batched decode).
pub(crate) const XM_KG2_ROWS: usize = 64;

/// Whether `exact` mode's tensor-core form takes `n` rows of these jobs:
/// its types, k in whole chunks of 8 blocks, 16-byte aligned weights (its
/// copies), the int8 MMA (sm_80+), and more rows than the table's
/// `exact_mma_rows`.
fn xm_takes(s: &MmShape<'_>, caps: &MmCaps, t: &MatmulTuning) -> bool {
    t.exact_mma
        && xm_smem(s.ty, &XM_FORMS[0]).is_some()
        && s.k.is_multiple_of(256)
        && s.aligned16
        && caps.arch_major >= 8
        && s.n > t.exact_mma_rows
}

/// A `MatMuls` op's kernel and launch geometry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum MmPlan {
    /// No rows or no jobs' rows: nothing runs.
    Empty,
    /// k = 0: out = 0, or out += 0.
    Zero,
    /// The canonical kernels.
    Exact(ExactForm),
    /// The warp-per-row matvec (`mv_float*` / `mv_q8*`, `mv_name`): `warps`
    /// per weight row (1; 2 or 4 only for one row in `fast`).
    Matvec { float: bool, warps: usize },
    /// `fast`, one row of short quantized rows: `mv_q8_r1_s4`.
    Short,
    /// `fast`: one mm_q8_mma-family launch over every job, k split in
    /// `splits` ranges of `per_split` blocks (partials added in split
    /// order; `vec4`: by one split_sum_jobs launch, else split_sum per
    /// job).
    Mq {
        kern: MqKernel,
        splits: usize,
        per_split: usize,
        vec4: bool,
    },
    /// `fast`: mm_f16_tile per job, job j's k split as `splits[j]` =
    /// (splits, 32-value units per split).
    Tile { splits: Vec<(usize, usize)> },
    /// `fast`, sm_90: the wgmma GEMM over every job in CTA shape
    /// `WR_SHAPES[shape]`, k in `splits` ranges, or unsplit with a wave
    /// `tail` (first CTA row, k ranges).
    Wgmma {
        shape: usize,
        splits: usize,
        tail: Option<(usize, usize)>,
    },
    /// `fast`: cuBLAS f16 GEMMs (weights dequantized per call).
    Blas,
}

/// The part of a plan that fixes a row's reduction order: what
/// `deterministic` and `exact` must keep independent of the batch (the
/// planner tests assert it).
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KOrder {
    /// Nothing is summed.
    None,
    /// The canonical order (docs/DETERMINISM.md): the cpu's bits.
    Canonical,
    /// The warp-per-row kernels' lane order, `warps` per weight row.
    WarpPerRow { warps: usize },
    /// The short-row matvec's eight lanes a row.
    ShortRow,
    /// A tensor-core tile kernel, k in `splits` ranges of `per_split`
    /// (blocks or units) each (the first job's, for the tile kernel),
    /// each range's blocks in `ks` k groups added in group order.
    SplitK {
        splits: usize,
        per_split: usize,
        ks: usize,
    },
    /// The wgmma GEMM's shape, k splits and wave tail.
    Wgmma {
        shape: usize,
        splits: usize,
        tail: bool,
    },
    /// cuBLAS's own (it may pick a split-K by shape).
    Library,
}

impl MmPlan {
    /// The reduction order this plan gives a row.
    #[cfg(test)]
    pub(crate) fn k_order(&self) -> KOrder {
        match self {
            MmPlan::Empty | MmPlan::Zero => KOrder::None,
            MmPlan::Exact(_) => KOrder::Canonical,
            MmPlan::Matvec { warps, .. } => KOrder::WarpPerRow { warps: *warps },
            MmPlan::Short => KOrder::ShortRow,
            MmPlan::Mq {
                kern,
                splits,
                per_split,
                ..
            } => KOrder::SplitK {
                splits: *splits,
                per_split: *per_split,
                ks: kern.ks,
            },
            MmPlan::Tile { splits } => {
                let (splits, per_split) = splits.first().copied().unwrap_or((1, 0));
                KOrder::SplitK {
                    splits,
                    per_split,
                    ks: 1,
                }
            }
            MmPlan::Wgmma {
                shape,
                splits,
                tail,
            } => KOrder::Wgmma {
                shape: *shape,
                splits: *splits,
                tail: tail.is_some(),
            },
            MmPlan::Blas => KOrder::Library,
        }
    }

    /// Whether the plan reads quant_q8's int8 activations (the warp-per-row
    /// and int8 tensor-core kernels).
    pub(crate) fn reads_q8(&self) -> bool {
        matches!(
            self,
            MmPlan::Matvec { float: false, .. } | MmPlan::Short | MmPlan::Mq { .. }
        )
    }
}

/// The plan of a `MatMuls` op (validated shapes).
///
/// `exact`, or k not a multiple of 32: the canonical kernels.
/// `deterministic`: for the types the int8 tensor-core kernels take, those
/// for every n in one k group with the weights' own split-K
/// (`mq_det_kernel`, `mq_det_splits`); for the others the warp-per-row
/// kernels for every n, in groups of MV_ROWS rows. Both batch-invariant. `fast`, by rows: mm_q8_mma past
/// `mq_min_rows` up to `mma_max_rows` for the types it takes; the f16 tile
/// kernel past `mma_min_rows` up to `mma_max_rows` for other quantized
/// types; past both, the wgmma GEMM (sm_90, where it takes the op) or
/// cuBLAS; else the warp-per-row kernels (split rows or the short-row form
/// for one row where the rules say).
pub(crate) fn plan(s: &MmShape<'_>, mode: Mode, caps: &MmCaps, t: &MatmulTuning) -> MmPlan {
    let (n, k, ty) = (s.n, s.k, s.ty);
    if n == 0 || s.rows.iter().all(|&r| r == 0) {
        return MmPlan::Empty;
    }
    if k == 0 {
        return MmPlan::Zero;
    }
    let float_w = s.float_w();
    if mode == Mode::Exact || !k.is_multiple_of(32) {
        return MmPlan::Exact(if float_w {
            ExactForm::Float
        } else if ty.block_size() == 256 {
            ExactForm::KQuant
        } else if xm_takes(s, caps, t) {
            ExactForm::Mma {
                form: xm_form(n, t),
            }
        } else if n <= MV_ROWS {
            ExactForm::Matvec
        } else {
            ExactForm::Q32
        });
    }
    if mode == Mode::Deterministic && mq_fits(ty, k) {
        // Int8 tensor cores for every row count, one k group and a
        // split-K of the weights' shape: a row's bits never depend on the
        // batch (mq.rs).
        let ctas: usize = s.rows.iter().map(|r| r.div_ceil(MQ_ROWS)).sum();
        let (splits, per_split) = mq_det_splits(ctas * MQ_ROWS, k / 32, caps.sms);
        return MmPlan::Mq {
            kern: mq_det_kernel(ty, n),
            splits,
            per_split,
            vec4: s.outs_vec4,
        };
    }
    let fast = mode == Mode::Fast;
    let (lo, hi) = (t.mma_min_rows, t.mma_max_rows);
    if fast && n > t.mq_min_rows.min(lo) && n <= hi && mq_takes(ty, k, t) {
        let kern = mq_kernel(ty, n, t);
        let ctas: usize = s.rows.iter().map(|r| r.div_ceil(MQ_ROWS)).sum();
        let (splits, per_split) = mq_splits(
            ctas * MQ_ROWS,
            n,
            kern.tok,
            k / 32,
            caps.sms,
            t.mq_ctas_per_sm,
        );
        return MmPlan::Mq {
            kern,
            splits,
            per_split,
            vec4: s.outs_vec4,
        };
    }
    if fast && !float_w && n > lo && n <= hi {
        let splits = s
            .rows
            .iter()
            .map(|&m| tile_splits(m, n, k / 32, t.tile_ctas_per_sm * caps.sms))
            .collect();
        return MmPlan::Tile { splits };
    }
    if fast && n > hi && n > MV_BATCH && wg_takes(s, caps, t) {
        let (shape, splits) = wr_plan(s.rows, n, k, caps.sms, s.outs_vec4, t);
        let tail = if splits == 1 {
            let mt = WR_SHAPES[shape].0;
            let ctas: usize = s.rows.iter().map(|r| r.div_ceil(128 * mt)).sum();
            wr_tail(ctas, n.div_ceil(WR_SHAPES[shape].1), k, shape, caps.sms, t)
        } else {
            None
        };
        return MmPlan::Wgmma {
            shape,
            splits,
            tail,
        };
    }
    if fast && n > MV_BATCH && caps.cublas {
        return MmPlan::Blas;
    }
    let long_rows = k >= 3 * s.m_all();
    let warps = mv_warps_of(t, mode, n, float_w, long_rows);
    if warps == 1 && !float_w && short_takes(mode, n, k / 32, s.m_all(), caps.sms, t) {
        return MmPlan::Short;
    }
    MmPlan::Matvec {
        float: float_w,
        warps,
    }
}

/// Whether the wgmma GEMM takes these jobs: its kernels are loaded
/// (sm_90, the table's `wgmma` not Off), the table's rule (`On`: any type
/// it decodes, any shape; `Auto`: `wg_default_takes`), k a multiple of 256
/// (the raw superchunks: eight blocks, a multiple of 16 bytes for every
/// such type) and the buffers 16-byte aligned.
fn wg_takes(s: &MmShape<'_>, caps: &MmCaps, t: &MatmulTuning) -> bool {
    let rule = match t.wgmma {
        Switch::Off => false,
        Switch::On => true,
        Switch::Auto => wg_default_takes(s.ty, s.k, s.rows, s.n, caps.sms, t),
    };
    caps.wgmma && rule && wg_type_index(s.ty).is_some() && s.k.is_multiple_of(256) && s.aligned16
}

/// Whether `fast` mode may run an `n`-row matmul of quantized weights
/// through cuBLAS (which a CUDA graph does not capture).
pub(crate) fn fast_uses_blas_with(n: usize, t: &MatmulTuning) -> bool {
    n > MV_BATCH && !(n > t.mma_min_rows && n <= t.mma_max_rows)
}

/// `fast_uses_blas_with` under the default table (callers that have no
/// backend at hand; the table's defaults do not depend on the arch).
pub(crate) fn fast_uses_blas(n: usize) -> bool {
    fast_uses_blas_with(n, &MatmulTuning::for_arch(0))
}

/// The warp-per-row kernel of a family (`[grouped, r1, r1_w2, r1_w4]`)
/// for `n` activation rows and `warps` per weight row: the grouped kernel
/// for several rows; for one row the `r1` variant, whose per-row
/// arithmetic is the grouped kernel's (batch invariance is kept), or with
/// `warps` 2 or 4 the split-row variants (`fast` mode only, `mv_warps_of`).
pub(crate) fn mv_name(n: usize, warps: usize, family: [&'static str; 4]) -> &'static str {
    match (n, warps) {
        (1, 2) => family[2],
        (1, 4) => family[3],
        (1, _) => family[1],
        _ => family[0],
    }
}

/// Warps per weight row of the one-row matvecs: `fast` mode only (the
/// split changes a row's arithmetic, which `deterministic` must keep
/// batch-invariant), from the table: `mv_warps_float` (float weights),
/// `mv_warps_long` (quantized, long rows: k at least 3 m, the FFN down
/// projection: few rows, too few warps in flight), `mv_warps`; a value
/// other than 1, 2 or 4 counts as 1.
pub(crate) fn mv_warps_of(
    t: &MatmulTuning,
    mode: Mode,
    n: usize,
    float_w: bool,
    long_rows: bool,
) -> usize {
    if mode != Mode::Fast || n != 1 {
        return 1;
    }
    match match (float_w, long_rows) {
        (true, _) => t.mv_warps_float,
        (false, true) => t.mv_warps_long,
        (false, false) => t.mv_warps,
    } {
        w @ (2 | 4) => w,
        _ => 1,
    }
}

/// `mv_warps_of` under the default table (norm-ahead's consumer).
pub(crate) fn mv_warps(mode: Mode, n: usize, float_w: bool, long_rows: bool) -> usize {
    mv_warps_of(&MatmulTuning::for_arch(0), mode, n, float_w, long_rows)
}

/// Whether one row of `units` 32-value units a weight row, `m` rows in
/// all, runs the short-row matvec (`mv_q8_r1_s4`; `fast`, quantized
/// weights, one warp a row otherwise): by the table's `mv_short`, whose
/// rule takes rows of at most 24 units (three loads per lane at most) in
/// matrices of at least 64 rows per SM, where mv_q8_r1 runs many waves of
/// warps with idle lanes (the output heads of models as narrow as
/// SmolLM2: 49,152 rows of 18 units; +0.5-2% on an H200; everywhere,
/// -17 to -20%).
pub(crate) fn short_takes(
    mode: Mode,
    n: usize,
    units: usize,
    m: usize,
    sms: usize,
    t: &MatmulTuning,
) -> bool {
    if mode != Mode::Fast || n != 1 || units == 0 {
        return false;
    }
    t.mv_short.or(units <= 24 && m >= 64 * sms)
}

/// Split-K of a tile kernel: (splits, k units per split) so that `tiles`
/// output tiles times the splits make about `target` CTAs (one wave; a
/// 4096-row matrix has only 32 row tiles), each split a whole number of
/// `chunk`-unit k chunks and none empty. Depends only on the shapes and
/// the device, never on the data.
pub(crate) fn split_k(tiles: usize, units: usize, chunk: usize, target: usize) -> (usize, usize) {
    let chunks = units.div_ceil(chunk);
    let want = (target / tiles.max(1)).clamp(1, chunks.max(1));
    let upc = chunks.div_ceil(want) * chunk;
    (units.div_ceil(upc).max(1), upc)
}

/// Split-K for mm_f16_tile (`split_k` over its 128 x 64 tiles and
/// TILE_KU-unit chunks), aiming at `target` CTAs.
pub(crate) fn tile_splits(m: usize, n: usize, units: usize, target: usize) -> (usize, usize) {
    let tiles = m.div_ceil(TILE_ROWS) * n.div_ceil(TILE_TOK);
    split_k(tiles, units, TILE_KU, target)
}
