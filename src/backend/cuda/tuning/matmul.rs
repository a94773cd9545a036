//! The matmul family's part of the tuning table (see `tuning/mod.rs`):
//! the thresholds between the matmul kernel forms and their geometry
//! knobs, read by the planner (`ops/matmul/mod.rs`, `plan`).
//!
//! No field changes a bit of `exact` or `deterministic` output: those modes
//! plan the canonical kernels and the one-warp matvecs whatever the table
//! says (the planner tests assert it).

use super::Switch;
use serde::{Deserialize, Serialize};

/// The wgmma GEMM's CTA shape (`wr_plan`): chosen per op by waves, or one
/// shape forced (parity coverage of every shape).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WrShape {
    #[default]
    Auto,
    /// 128 weight rows x 128 tokens.
    M1,
    /// 256 weight rows x 128 tokens.
    M2,
    /// 128 weight rows x 256 tokens.
    N256,
}

/// The fused gate/up + SwiGlu matvec's entry (`glu_form`): the rule's, none
/// (the unfused pair), or one entry of `GLU_FORMS` forced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GluForm {
    #[default]
    Auto,
    Off,
    Glu8,
    Glu16,
    Glu32,
    Glu8c2,
    Glu8c4,
    Glu16c2,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatmulTuning {
    /// `fast`: more than this many activation rows (and at most
    /// `mma_max_rows`) run the tensor-core decode kernels (mm_q8_mma for
    /// the types it takes, else the f16 tile kernel); fewer, the
    /// warp-per-row matvec. H100, 8B Q4_0, B2/4/6/8: warp-per-row
    /// 356/557/670/743 tok/s, tile 220/430/630/821-908.
    pub mma_min_rows: usize,
    /// `fast`: past this many rows, the prefill GEMMs (wgmma or cuBLAS).
    pub mma_max_rows: usize,
    /// `fast`: more than this many rows (or `mma_min_rows` where lower)
    /// run mm_q8_mma for the types it takes (H100 8B Q4_0 B2/B4:
    /// warp-per-row 561/794, mm_q8_mma_t16_k2b 589/1,142 tok/s).
    pub mq_min_rows: usize,
    /// `fast`: the int8 tensor-core kernels on (off: the f16 tile kernel
    /// and cuBLAS take their shapes; parity coverage).
    pub mq: bool,
    /// `exact`: the int8 tensor-core form of the canonical kernel
    /// (mm_exact_mma) for more than MV_ROWS rows of Q4_0 / Q4_1 / Q8_0
    /// (off: mm_q32; the same bits either way).
    pub exact_mma: bool,
    /// `exact`: more than this many rows take mm_exact_mma (fewer, the
    /// decode matvec mv_exact32 up to MV_ROWS, then mm_q32).
    pub exact_mma_rows: usize,
    /// `exact`: mm_exact_mma's k groups: None, the rule (`xm_form`: 2 up
    /// to 64 rows, 1 beyond); 2 (two groups of 8 warps taking four
    /// canonical lanes each, one CTA per SM) or 1 (one group of 8 warps,
    /// two CTAs per SM) forced. The same bits either way.
    pub exact_mma_kg: Option<usize>,
    /// mm_q8_mma's warps along the activation rows: None, the rule (2 past
    /// 16 rows); 1 or 2 forced (H100 8B Q4_0 B8/16/32/64: WN 1 1,487 /
    /// 2,444 / 3,461 / 4,290, WN 2 1,217-1,310 / 2,131-2,262 / 3,715-4,105
    /// / 4,390-4,677 tok/s).
    pub mq_wn: Option<usize>,
    /// CTAs per SM mm_q8_mma's split-K aims for (two fit per SM).
    pub mq_ctas_per_sm: usize,
    /// CTAs per SM mm_f16_tile's split-K aims for (H100 8B Q4_0 B16/B64:
    /// 1: 1,343 / 3,275, 2: 1,936 / 3,991, 3: 1,709 / 3,369 tok/s).
    pub tile_ctas_per_sm: usize,
    /// Warps per weight row of `fast`'s one-row matvec on float weights
    /// (1 / 2 / 4; H100 1B F16 tg128: 673 / 722 / 696 tok/s).
    pub mv_warps_float: usize,
    /// The same on quantized weights (8B Q4_0: 346 / 336 / 304).
    pub mv_warps: usize,
    /// The same on quantized weights with long rows (k >= 3 m: the FFN
    /// down projection; 1B Q4_0 1,293 / 1,348 / 1,307).
    pub mv_warps_long: usize,
    /// `fast`'s short-row matvec (four rows a warp, `mv_q8_r1_s4`): the
    /// rule (rows of at most 24 blocks in matrices of at least 64 rows per
    /// SM: narrow output heads), on for every one-row quantized matvec of
    /// one warp a row, or off.
    pub mv_short: Switch,
    /// The one-row matvecs prefetch their weights before waiting for the
    /// kernel before them when the launch's quantized weights are at most
    /// this many MiB (H100 tg128, every matrix: SmolLM2 +5%, 8B -3.7%).
    pub mv_prefetch_mb: usize,
    /// The fused gate/up + SwiGlu matvec's form.
    pub mv_glu_form: GluForm,
    /// The wgmma prefill GEMM (sm_90): Auto, where it measured faster than
    /// cuBLAS (`wg_default_takes`); On, every type it decodes and every
    /// shape (parity coverage); Off, never (its kernels are not compiled).
    pub wgmma: Switch,
    /// `wg_default_takes`: the smallest k (the 1B's 2,048, the smallest
    /// measured).
    pub wg_min_k: usize,
    /// `wg_default_takes`: the least fill of a wave of 128-row CTAs, in
    /// percent.
    pub wg_min_fill: usize,
    /// The wgmma CTA shape.
    pub wr_shape: WrShape,
    /// The wgmma k splits: None, by the estimate (`wr_plan`); 1, 2 or 4
    /// forced where k allows them.
    pub wr_split: Option<usize>,
    /// The split reduction's estimated cost (tenths of a wave per wave of
    /// 128 x 128 output tiles at k = 4,096 and two splits; 15 also split
    /// the 1B's q/k/v, -3%).
    pub wr_split_pen: usize,
    /// A 128 x 256 CTA's cost in tenths of a 128 x 128 one's (12 and 15
    /// ran 8B Q4_0 pp512 8% faster than 18).
    pub wr_n256_cost: usize,
    /// The wgmma wave-tail split (`wr_tail`).
    pub wr_tail: bool,
    /// Plan the wave tail as if the GPU had this many SMs and take it
    /// wherever possible (parity coverage of small shapes).
    pub wr_tail_sms: Option<usize>,
}

impl MatmulTuning {
    /// Defaults for compute capability `major` (9 = Hopper). The matmul
    /// rules do not branch on the architecture: the Hopper-only kernels are
    /// gated by what the device loaded (`MmCaps`).
    pub fn for_arch(_major: u32) -> Self {
        MatmulTuning {
            mma_min_rows: 7,
            mma_max_rows: 64,
            mq_min_rows: 1,
            mq: true,
            exact_mma: true,
            exact_mma_rows: 8,
            exact_mma_kg: None,
            mq_wn: None,
            mq_ctas_per_sm: 2,
            tile_ctas_per_sm: 2,
            mv_warps_float: 2,
            mv_warps: 1,
            mv_warps_long: 2,
            mv_short: Switch::Auto,
            mv_prefetch_mb: 4,
            mv_glu_form: GluForm::Auto,
            wgmma: Switch::Auto,
            wg_min_k: 2048,
            wg_min_fill: 90,
            wr_shape: WrShape::Auto,
            wr_split: None,
            wr_split_pen: 25,
            wr_n256_cost: 14,
            wr_tail: true,
            wr_tail_sms: None,
        }
    }
}
