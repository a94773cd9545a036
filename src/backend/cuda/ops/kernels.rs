//! The kernel table: which CUDA C files exist (one per op, like the CPU
//! ops), their sources and entry points, and the prelude of constants
//! they are compiled with (the canonical arithmetic's exact constants,
//! shared with the CPU, and the op families' geometry constants). Compiled
//! and loaded by `device/` (NVRTC, kernel cache), which takes the text.

use super::attention::{ATT_FAST_HEAD, ATT_PIPE, ATT_PIPE_PARTS, ATT_RMMA, ATT_RMMA_ENTRIES};
use anyhow::{anyhow, Result};

/// Activation integer range of quantized matmul: the CPU's own constant
/// (16-bit activations, 32767), so the two can never disagree.
pub const ACT_QMAX: f32 = crate::backend::cpu::canon::QA_MAX;

/// Shared device functions (canonical arithmetic).
pub const COMMON: &str = include_str!("../kernels/common.cuh");

/// Element dequantization shared by get_rows and the matmul kernels.
pub const DEQUANT: &str = include_str!("../kernels/dequant.cuh");

/// One part of attention_pipe_fast.cu (its head_dim class `D32` and group
/// class `GM` defined first; `di`, `gi`: their indices in ATT_PIPE_PARTS).
macro_rules! att_pipe_part {
    ($d:literal, $g:literal, $di:literal, $gi:literal) => {
        (
            concat!("attention_pipe_d", $d, "_g", $g, "_fast"),
            concat!(
                "#define ATT_PART_D32 ",
                $d,
                "\n#define ATT_PART_GM ",
                $g,
                "\n",
                include_str!("attention/kernels/attention_split.cuh"),
                include_str!("attention/kernels/attention_pipe_fast.cu")
            ),
            &ATT_PIPE_PARTS[$di][$gi],
        )
    };
}

/// (file stem, source, kernel entry points).
pub const KERNELS: &[(&str, &str, &[&str])] = &[
    (
        "matmul",
        include_str!("matmul/kernels/matmul.cu"),
        &[
            "quant_act32",
            "quant_actk",
            "mm_q32",
            "mm_qk",
            "mm_float",
            "mv_exact32",
            "mv_exact32_r1",
        ],
    ),
    (
        "matmul_fast",
        concat!(
            include_str!("matmul/kernels/mv_q8.cuh"),
            include_str!("matmul/kernels/matmul_fast.cu")
        ),
        &[
            "quant_q8",
            "mv_q8",
            "mv_q8_r1",
            "mv_q8_r1_w2",
            "mv_q8_r1_w4",
            "mv_q8_r1_nc",
            "mv_q8_r1_w2_nc",
            "mv_q8_r1_w4_nc",
            "mv_q8_r1_na",
            "mv_q8_r1_na_c4",
            "mv_q8_r1_na_w2c4",
            "mv_float",
            "mv_float_r1",
            "mv_float_r1_w2",
            "mv_float_r1_w4",
        ],
    ),
    (
        "matmul_f16_fast",
        include_str!("matmul/kernels/matmul_f16_fast.cu"),
        &[
            "mm_f16_tile",
            "split_sum",
            "split_sum_jobs",
            "dequant_f16",
            "to_f16",
        ],
    ),
    (
        "matmul_glu_fast",
        concat!(
            include_str!("matmul/kernels/mv_q8.cuh"),
            include_str!("matmul/kernels/matmul_glu_fast.cu")
        ),
        &[
            "mv_q8_r1_glu8",
            "mv_q8_r1_glu16",
            "mv_q8_r1_glu32",
            "mv_q8_r1_glu8c2",
            "mv_q8_r1_glu8c4",
            "mv_q8_r1_glu16c2",
            "mv_q8_r1_glu8_nc",
            "mv_q8_r1_glu16_nc",
            "mv_q8_r1_glu32_nc",
            "mv_q8_r1_glu8c2_nc",
            "mv_q8_r1_glu8c4_nc",
            "mv_q8_r1_glu16c2_nc",
        ],
    ),
    (
        "matmul_short_fast",
        concat!(
            include_str!("matmul/kernels/mv_q8.cuh"),
            include_str!("matmul/kernels/matmul_short_fast.cu")
        ),
        &["mv_q8_r1_s4"],
    ),
    (
        "matmul_mma_fast",
        include_str!("matmul/kernels/matmul_mma_fast.cu"),
        &[
            "mm_q8_mma",
            "mm_q8_mma_w2",
            "mm_q8_mma_t16_k2",
            "mm_q8_mma_t16_k2b",
            "mm_q8_mma_t8_k2b",
            "mm_q8_mma_t16",
            "mm_q8_mma_t8",
        ],
    ),
    (
        "matmul_exact_mma",
        include_str!("matmul/kernels/matmul_exact_mma.cu"),
        &["mm_exact_mma", "mm_exact_mma_k1"],
    ),
    (
        "rms_norm",
        include_str!("norm/kernels/rms_norm.cu"),
        &["rms_norm", "rms_norm_block"],
    ),
    (
        "rms_norm_fast",
        include_str!("norm/kernels/rms_norm_fast.cu"),
        &["rms_norm_fast", "rms_norm_fast_f16wr"],
    ),
    (
        "rope",
        include_str!("elementwise/kernels/rope.cu"),
        &["rope"],
    ),
    (
        "rope_kv_write",
        include_str!("attention/kernels/rope_kv_write.cu"),
        &["rope_kv_write"],
    ),
    (
        "swiglu",
        include_str!("elementwise/kernels/swiglu.cu"),
        &["swiglu", "swiglu_q8", "swiglu_f16wr"],
    ),
    (
        "get_rows",
        include_str!("elementwise/kernels/get_rows.cu"),
        &["get_rows"],
    ),
    (
        "sample",
        include_str!("sample/kernels/sample.cu"),
        &["sample_rows", "mask_rows"],
    ),
    (
        "select_rows",
        include_str!("elementwise/kernels/select_rows.cu"),
        &["select_rows"],
    ),
    (
        "add",
        include_str!("elementwise/kernels/add.cu"),
        &["add", "add_bias", "add_zero"],
    ),
    (
        "collective",
        include_str!("collective/kernels/collective.cu"),
        &["tp_interleave", "tp_sum_ranks"],
    ),
    (
        "kv_write",
        include_str!("attention/kernels/kv_write.cu"),
        &["kv_write"],
    ),
    (
        "attention",
        include_str!("attention/kernels/attention.cu"),
        &[
            "paged_attention",
            "paged_attention_par",
            "paged_attention_par2",
            "paged_attention_opts",
        ],
    ),
    (
        "attention_fast",
        concat!(
            include_str!("attention/kernels/attention_split.cuh"),
            include_str!("attention/kernels/attention_fast.cu")
        ),
        &ATT_FAST_HEAD,
    ),
    att_pipe_part!(2, 1, 0, 0),
    att_pipe_part!(2, 2, 0, 1),
    att_pipe_part!(2, 3, 0, 2),
    att_pipe_part!(2, 4, 0, 3),
    att_pipe_part!(2, 8, 0, 4),
    att_pipe_part!(4, 1, 1, 0),
    att_pipe_part!(4, 2, 1, 1),
    att_pipe_part!(4, 3, 1, 2),
    att_pipe_part!(4, 4, 1, 3),
    att_pipe_part!(4, 8, 1, 4),
    (
        "attention_rmma_fast",
        concat!(
            include_str!("attention/kernels/attention_split.cuh"),
            include_str!("attention/kernels/attention_rmma_fast.cu")
        ),
        &ATT_RMMA_ENTRIES,
    ),
    (
        "attention_prefill_fast",
        include_str!("attention/kernels/attention_prefill_fast.cu"),
        &["flash_attention_prefill", "flash_attention_prefill_g"],
    ),
    (
        "l2_ahead_fast",
        include_str!("l2_ahead/kernels/l2_ahead_fast.cu"),
        &["l2_ahead"],
    ),
    (
        "gdn",
        include_str!("gdn/kernels/gdn.cu"),
        &super::gdn::GDN_ENTRIES,
    ),
];

/// Kernel files that use Hopper-only instructions (wgmma): compiled for
/// `sm_90a`, only on devices of compute capability 9.0 (`sm_90a` code runs
/// nowhere else) unless the tuning table's `matmul.wgmma` is off (cuda/mod.rs; see
/// matmul_wgmma_fast.cu's status). A compile or load failure leaves them
/// out: the ops then take the portable kernels.
pub const KERNELS_SM90A: &[(&str, &str, &[&str])] = &[(
    "matmul_wgmma_fast",
    include_str!("matmul/kernels/matmul_wgmma_fast.cu"),
    &WG_ENTRIES,
)];

/// matmul_wgmma_fast.cu's GEMM entries, [type][CTA shape] for the 32-value
/// block types in type-code order (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0):
/// `mm_wr_<type>_m1` (128 weight rows x 128 tokens), `_m2` (256 x 128),
/// `_n256` (128 x 256); ops/matmul/wgmma.rs, WR_SHAPES.
pub const WG_KERNELS: [[&str; 3]; 5] = [
    ["mm_wr_q4_0_m1", "mm_wr_q4_0_m2", "mm_wr_q4_0_n256"],
    ["mm_wr_q4_1_m1", "mm_wr_q4_1_m2", "mm_wr_q4_1_n256"],
    ["mm_wr_q5_0_m1", "mm_wr_q5_0_m2", "mm_wr_q5_0_n256"],
    ["mm_wr_q5_1_m1", "mm_wr_q5_1_m2", "mm_wr_q5_1_n256"],
    ["mm_wr_q8_0_m1", "mm_wr_q8_0_m2", "mm_wr_q8_0_n256"],
];
/// Every entry of matmul_wgmma_fast.cu: the GEMMs, then to_f16_wr (their
/// activations in the tiled layout) and wr_tail_sum (the wave tail's k
/// ranges added).
const WG_ENTRIES: [&str; 3 * WG_KERNELS.len() + 2] = {
    let mut out = [""; 3 * WG_KERNELS.len() + 2];
    let mut i = 0;
    while i < 3 * WG_KERNELS.len() {
        out[i] = WG_KERNELS[i / 3][i % 3];
        i += 1;
    }
    out[i] = "to_f16_wr";
    out[i + 1] = "wr_tail_sum";
    out
};

/// `#define`s of every constant of the canonical arithmetic, as exact f32
/// bit patterns computed from the same Rust expressions `canon.rs` uses.
pub fn prelude() -> String {
    let consts: [(&str, f32); 15] = [
        ("QC_LOG2E", std::f32::consts::LOG2_E),
        ("QC_LN2_HI", f32::from_bits(0x3f31_7200)),
        ("QC_LN2_LO", 1.428_606_8e-6),
        ("QC_TWO_OVER_PI", std::f32::consts::FRAC_2_PI),
        ("QC_P1", f32::from_bits(0x3fc8_0000)),
        ("QC_P2", f32::from_bits(0x3c06_0000)),
        ("QC_P3", f32::from_bits(0x38f6_0000)),
        ("QC_P4", f32::from_bits(0x34a8_885a)),
        ("QC_INV_FACT3", 1.0 / 6.0),
        ("QC_INV_FACT4", 1.0 / 24.0),
        ("QC_INV_FACT5", 1.0 / 120.0),
        ("QC_INV_FACT6", 1.0 / 720.0),
        ("QC_INV_FACT7", 1.0 / 5040.0),
        ("QC_INV_FACT8", 1.0 / 40320.0),
        ("QC_INV_FACT9", 1.0 / 362_880.0),
    ];
    let mut s = String::from("// generated by quire (src/backend/cuda/ops/kernels.rs)\n");
    for (name, v) in consts {
        s.push_str(&format!("#define {name} 0x{:08x}u\n", v.to_bits()));
    }
    s.push_str(&format!(
        "#define QC_INV_FACT10 0x{:08x}u\n",
        (1.0f32 / 3_628_800.0).to_bits()
    ));
    // gdn.rs's ln_ge1 (softplus): its threshold between mantissa halves
    // and its series' coefficients, the same Rust expressions.
    let gdn_consts: [(&str, f32); 6] = [
        ("QC_SQRT_2", std::f32::consts::SQRT_2),
        ("QC_INV_3", 1.0 / 3.0),
        ("QC_INV_5", 1.0 / 5.0),
        ("QC_INV_7", 1.0 / 7.0),
        ("QC_INV_9", 1.0 / 9.0),
        ("QC_INV_11", 1.0 / 11.0),
    ];
    let tanh_consts: [(&str, f32); 3] = [
        ("QC_TANH_C3", crate::backend::cpu::canon::TANH_C3),
        ("QC_TANH_C5", crate::backend::cpu::canon::TANH_C5),
        ("QC_TANH_C7", crate::backend::cpu::canon::TANH_C7),
    ];
    for (name, v) in gdn_consts.into_iter().chain(tanh_consts) {
        s.push_str(&format!("#define {name} 0x{:08x}u\n", v.to_bits()));
    }
    s.push_str(&format!(
        "#define ACT_QMAX __int_as_float((int)0x{:08x}u)\n",
        ACT_QMAX.to_bits()
    ));
    s.push_str(&format!("#define MV_EXACT_WR {MV_EXACT_WR}\n"));
    s.push_str(&format!(
        "#define ATT_STAGES {}\n#define ATT_W_STAGES {}\n#define ATT_M3_STAGES {}\n#define ATT_SPLIT_THREADS {}\n#define ATT_PIPE8_WARPS {}\n",
        crate::backend::cuda::ops::attention::ATT_STAGES,
        crate::backend::cuda::ops::attention::ATT_W_STAGES,
        crate::backend::cuda::ops::attention::ATT_M3_STAGES,
        crate::backend::cuda::ops::attention::ATT_SPLIT_THREADS,
        crate::backend::cuda::ops::attention::ATT_PIPE8_WARPS
    ));
    s.push_str(&format!(
        "#define ATT_ROW_STAGES {}\n#define ATT_ROW_STAGES_D4 {}\n#define ATT_ROW_WARPS {}\n#define ATT_ROW_WARPS_D4 {}\n#define ATT_CLUSTER_MAX {}\n",
        crate::backend::cuda::ops::attention::att_row_stages(2),
        crate::backend::cuda::ops::attention::att_row_stages(4),
        crate::backend::cuda::ops::attention::att_row_warps(2),
        crate::backend::cuda::ops::attention::att_row_warps(4),
        crate::backend::cuda::ops::attention::ATT_CLUSTER_MAX
    ));
    let ((rw, rs), (rw4, rs4)) = (
        crate::backend::cuda::ops::attention::att_rmma_shape(2),
        crate::backend::cuda::ops::attention::att_rmma_shape(4),
    );
    s.push_str(&format!(
        "#define ATT_RMMA_WARPS {rw}\n#define ATT_RMMA_STAGES {rs}\n#define ATT_RMMA_WARPS_D4 {rw4}\n#define ATT_RMMA_STAGES_D4 {rs4}\n#define ATT_RMMA_CL_MAX {}\n",
        crate::backend::cuda::ops::attention::ATT_RMMA_CL_MAX
    ));
    // The dynamic shared memory the host launches each split-attention
    // entry with: attention_pipe_fast.cu's ATT_PIPE_GQA asserts its layout matches.
    for name in ATT_PIPE
        .iter()
        .flatten()
        .flatten()
        .chain(ATT_RMMA.iter().flatten().flatten())
    {
        if let Some(bytes) = crate::backend::cuda::ops::attention::att_pipe_smem(name) {
            s.push_str(&format!("#define ATT_SMEM_{name} {bytes}\n"));
        }
    }
    // The dynamic shared memory the host launches each wgmma entry with:
    // matmul_wgmma_fast.cu's WG_ENTRY asserts its own layout matches.
    for name in WG_KERNELS.iter().flatten() {
        if let Some(bytes) = crate::backend::cuda::ops::wg_smem(name) {
            s.push_str(&format!("#define WG_SMEM_{name} {bytes}\n"));
        }
    }
    s
}

/// Weight rows per warp of the exact decode matvec (`mv_exact32`): the
/// kernel's register arrays and the host's grid both follow this. Measured
/// on an H100, 8B tg128 exact Q4_0 / Q8_0: 1 row 172 / 156 tok/s, 2 rows
/// 198 / 174, 3 rows 168 / 155, 4 rows 160 / 149 (registers).
pub const MV_EXACT_WR: usize = 2;

/// The full translation unit of one kernel file.
pub fn full_source(stem: &str) -> Result<String> {
    let (_, src, _) = KERNELS
        .iter()
        .chain(KERNELS_SM90A)
        .find(|(n, _, _)| *n == stem)
        .ok_or_else(|| anyhow!("no CUDA kernel file named {stem}"))?;
    Ok(format!("{}\n{}\n{}\n{}", prelude(), COMMON, DEQUANT, src))
}
