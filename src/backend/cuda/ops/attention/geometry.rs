//! The split-attention kernels' geometry (attention_pipe_fast.cu,
//! att_pipe_*, att_row_*; attention_rmma_fast.cu, att_rmma_*): the entry
//! of each form for a head shape, and the threads, pipeline stages and
//! shared memory each entry is compiled and launched with. Compile-time
//! numbers (ops/kernels.rs writes them into the prelude, the host launches by
//! them), so constants: the bottom of the attention family's imports.

/// The forms of the pipelined split kernel (attention_pipe_fast.cu):
/// partials only (16-key tiles), partials merged by the CTA itself
/// (att_pipe_m_*, one CTA per (row, KV head)), partials with 8-key tiles
/// at ATT_W_STAGES stages (att_pipe_w_*: `fast` mode, multi-wave
/// launches), partials merged by the unit's thread-block cluster of
/// 2..=ATT_CLUSTER_MAX CTAs (att_pipe_c_*, sm_90+), the merging form at
/// ATT_M3_STAGES stages (att_pipe_m3_*, deep_rule), the partials, merging
/// and cluster forms at eight warps per CTA (att_pipe8_*, eight_rule),
/// one CTA per (row, KV head) folding the whole row without partials
/// (att_row_*, row_rule), and the same on tensor cores in one CTA
/// (att_rmma_*, rmma_rule) or a cluster (att_rmma_c_*,
/// rmma_cluster_rule). The discriminant of the first nine indexes
/// entries.rs, ATT_PIPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum SplitForm {
    Partials = 0,
    Merge = 1,
    Wide = 2,
    Cluster = 3,
    Deep = 4,
    Partials8 = 5,
    Merge8 = 6,
    Cluster8 = 7,
    Row = 8,
    RowMma = 9,
    RowMmaCluster = 10,
}

impl SplitForm {
    /// The eight-warp form of a partials, merging or cluster form; the
    /// others are their own (they serve launches of many CTAs).
    pub(crate) fn eight(self) -> SplitForm {
        use SplitForm::*;
        match self {
            Partials | Partials8 => Partials8,
            Merge | Merge8 => Merge8,
            Cluster | Cluster8 => Cluster8,
            Wide | Deep | Row | RowMma | RowMmaCluster => self,
        }
    }

    /// Keys per tile of the form's K/V stages (the bulk copies' box).
    pub(crate) fn tile_keys(self) -> usize {
        use SplitForm::*;
        match self {
            Wide | Row => 8,
            Partials | Merge | Cluster | Deep | Partials8 | Merge8 | Cluster8 | RowMma
            | RowMmaCluster => 16,
        }
    }

    /// Whether the form writes the output itself (no combine launch).
    pub(crate) fn merges(self) -> bool {
        use SplitForm::*;
        match self {
            Merge | Cluster | Deep | Merge8 | Cluster8 | Row | RowMma | RowMmaCluster => true,
            Partials | Wide | Partials8 => false,
        }
    }

    /// Whether the form launches in thread-block clusters.
    pub(crate) fn clustered(self) -> bool {
        use SplitForm::*;
        match self {
            Cluster | Cluster8 | RowMmaCluster => true,
            Partials | Merge | Wide | Deep | Partials8 | Merge8 | Row | RowMma => false,
        }
    }
}

/// The most CTAs of one cluster-merging unit: an H100's largest cluster
/// (past the portable 8, the kernels opt in at load; where the device
/// refuses, its count of resident clusters is 0 and the combine merges).
pub(crate) const ATT_CLUSTER_MAX: usize = 16;

/// The most CTAs of a tensor-core row form's cluster (ATT_RMMA_CL_MAX in
/// the prelude: rank 0 holds that many slots per head).
pub(crate) const ATT_RMMA_CL_MAX: usize = 4;

/// Threads per CTA of the split-attention kernels (paged_attention_split,
/// att_pipe_*: 32 * ATT_SPLIT_WARPS, which attention_split.cuh checks
/// against the prelude's ATT_SPLIT_THREADS): their launches and the
/// occupancy counts taken at load.
pub(crate) const ATT_SPLIT_THREADS: usize = 128;

/// Warps per CTA of the eight-warp forms (att_pipe8_*: ATT_PIPE8_WARPS in
/// the prelude, which their launch bounds and layout take).
pub(crate) const ATT_PIPE8_WARPS: usize = 8;

/// Pipeline depth of the 16-key att_pipe kernels (ATT_STAGES in the
/// prelude).
pub(crate) const ATT_STAGES: usize = 2;

/// Stages of the att_pipe_w_* kernels (ATT_W_STAGES in the prelude).
pub(crate) const ATT_W_STAGES: usize = 3;

/// Stages of the att_pipe_m3_* kernels (ATT_M3_STAGES in the prelude): the
/// merging form for rows of several chunks folded by one CTA (deep_rule),
/// where a tile's copies have a tile's compute less to hide behind than
/// in the split forms.
pub(crate) const ATT_M3_STAGES: usize = 3;

/// Warps per CTA of the row forms for head_dim <= 32 * d32 (att_row_d*:
/// ATT_ROW_WARPS and ATT_ROW_WARPS_D4 in the prelude): 16 (at head_dim
/// 128 no more fit: 32 warps' stages of 8 keys would not fit in shared
/// memory).
pub(crate) const fn att_row_warps(_d32: usize) -> usize {
    16
}

/// Pipeline depth of the row forms for head_dim <= 32 * d32
/// (ATT_ROW_STAGES and ATT_ROW_STAGES_D4 in the prelude).
pub(crate) const fn att_row_stages(_d32: usize) -> usize {
    2
}

/// The most dynamic shared memory a tensor-core row form takes (an sm_90
/// SM's 227 KiB opt-in).
const RMMA_SMEM_MAX: usize = 227 * 1024;

/// ATT_RMMA_BYTES (attention_rmma_fast.cu): warps x stages of a 16-key K
/// and V tile of 32 * d32 f16 dims.
const fn rmma_bytes(d32: usize, w: usize, st: usize) -> usize {
    w * st * 2 * 16 * 32 * d32 * 2
}

/// (warps, stages) of the tensor-core row forms for head_dim 32 * d32
/// (ATT_RMMA_WARPS / _STAGES and their _D4 in the prelude): 8 x 3 (4 or
/// 8 KiB of K and V per warp and stage), fewer stages where they and the
/// cluster form's slots would pass the SM's 227 KiB. At head_dim 64 the
/// default was 16 x 3 (every tile of a 768-key row requested at once)
/// until the rows the form takes were measured at 8 (H200, decode tok/s,
/// 16 / 8 warps): the 1B from an empty cache 1,912-1,941 / 1,942-1,974,
/// after 512 tokens (the cluster form, 3 CTAs) 1,776-1,837 / 1,832-1,862;
/// SmolLM2 from an empty cache 1,802-1,875 / 1,858-1,919. Fewer warps
/// merge fewer states, and a row of at most 8 tiles leaves none idle;
/// 8 x 4 lost on the 1B (1,804-1,836 against 1,832-1,862 after 512
/// tokens).
pub(crate) const fn att_rmma_shape(d32: usize) -> (usize, usize) {
    let (w, mut st) = (8, 3);
    // Room for the cluster form's slots too (its largest group, 8).
    while st > 1
        && rmma_bytes(d32, w, st) + 8 * ATT_RMMA_CL_MAX * (2 + 32 * d32) * 4 > RMMA_SMEM_MAX
    {
        st -= 1;
    }
    (w, st)
}

/// (D32, GM) of an entry named `{prefix}{D32}_g{GM}`.
fn entry_shape(name: &str, prefix: &str) -> Option<(usize, usize)> {
    let (d32, gm) = name.strip_prefix(prefix)?.split_once("_g")?;
    Some((d32.parse().ok()?, gm.parse().ok()?))
}

/// (D32, GM) of row-form entry `name` (att_row_d{D32}_g{GM}).
fn row_shape(name: &str) -> Option<(usize, usize)> {
    entry_shape(name, "att_row_d")
}

/// (D32, GM) of tensor-core row-form entry `name` (att_rmma_d{D32}_g{GM}
/// or its cluster form att_rmma_c_d{D32}_g{GM}).
fn rmma_shape_of(name: &str) -> Option<(usize, usize)> {
    entry_shape(name, "att_rmma_d").or_else(|| entry_shape(name, "att_rmma_c_d"))
}

/// Threads per CTA of split-attention entry `name`: 32 * ATT_PIPE8_WARPS
/// for the eight-warp forms, 32 * att_row_warps for the row forms, 32 per
/// warp of att_rmma_shape for the tensor-core row forms, else
/// ATT_SPLIT_THREADS.
pub(crate) fn att_threads(name: &str) -> usize {
    if name.starts_with("att_pipe8_") {
        32 * ATT_PIPE8_WARPS
    } else if let Some((d32, _)) = row_shape(name) {
        32 * att_row_warps(d32)
    } else if let Some((d32, _)) = rmma_shape_of(name) {
        32 * att_rmma_shape(d32).0
    } else {
        ATT_SPLIT_THREADS
    }
}

/// Dynamic shared memory of tensor-core row-form entry `name`, None for
/// other entries: its warps' K and V stages, and in the cluster form the
/// slots rank 0 merges in, (GM, ATT_RMMA_CL_MAX) states of 2 + head_dim
/// f32 (ATT_RMMA_CL_BYTES).
fn rmma_smem(name: &str) -> Option<usize> {
    let (d32, gm) = rmma_shape_of(name)?;
    let (w, st) = att_rmma_shape(d32);
    let cl = if name.starts_with("att_rmma_c_") {
        gm * ATT_RMMA_CL_MAX * (2 + 32 * d32) * 4
    } else {
        0
    };
    Some(rmma_bytes(d32, w, st) + cl)
}

/// Dynamic shared memory of the pipelined kernel `name`
/// (att_pipe{,8}_{,m_,c_,w_,m3_}d{D32}_g{GM}; the layout of att_pipe_gqa):
/// K and V stages (per warp, 4 or ATT_PIPE8_WARPS of them, stages of KT
/// rows of 32*D32 f16 each: 16 rows at ATT_STAGES stages, or for
/// att_pipe_w_* 8 rows at ATT_W_STAGES), the queries (GM x 32*D32 f32),
/// the tile weights (warps x GM x KT), the warps' (m, l) and the stages'
/// mbarriers (warps x stages u64, the bulk tensor copies'); the row and
/// tensor-core row forms' likewise. None for any other kernel.
pub(crate) fn att_pipe_smem(name: &str) -> Option<usize> {
    if let Some(b) = rmma_smem(name) {
        return Some(b);
    }
    if let Some((d32, gm)) = row_shape(name) {
        return Some(pipe_bytes(
            d32,
            gm,
            8,
            att_row_stages(d32),
            att_row_warps(d32),
        ));
    }
    let (w, form) = match name.strip_prefix("att_pipe8_") {
        Some(f) => (ATT_PIPE8_WARPS, f),
        None => (4, name.strip_prefix("att_pipe_")?),
    };
    let (rest, kt, st) = if let Some(r) = form.strip_prefix("w_d") {
        (r, 8, ATT_W_STAGES)
    } else if let Some(r) = form.strip_prefix("m3_d") {
        (r, 16, ATT_M3_STAGES)
    } else {
        let r = ["d", "m_d", "c_d"]
            .iter()
            .find_map(|p| form.strip_prefix(p))?;
        (r, 16, ATT_STAGES)
    };
    let (d32, gm) = entry_shape(rest, "")?;
    // The cluster forms also hold the unit's partials (att_pipe_cl_bytes).
    let cl = if form.starts_with("c_d") {
        ATT_CLUSTER_MAX * gm * (2 + 32 * d32) * 4
    } else {
        0
    };
    Some(pipe_bytes(d32, gm, kt, st, w) + cl)
}

/// att_pipe_bytes (attention_pipe_fast.cu): the layout's bytes.
fn pipe_bytes(d32: usize, gm: usize, kt: usize, st: usize, w: usize) -> usize {
    let hd = 32 * d32;
    2 * w * st * kt * hd * 2 + gm * hd * 4 + w * gm * kt * 4 + 2 * w * gm * 4 + 8 * w * st
}

/// The GQA-grouped split kernel of form `form` for `group` query heads per
/// KV head and `head_dim` (a multiple of 8): `att_pipe_d{D32}_g{GM}` (or
/// its other forms') with head_dim <= 32 * D32 and group <= GM, the
/// smallest instantiated (attention_pipe_fast.cu, attention_rmma_fast.cu);
/// None past 8 heads per group or head_dim 128 (the per-head kernel).
pub(crate) fn gqa_split_kernel(
    group: usize,
    head_dim: usize,
    form: SplitForm,
) -> Option<&'static str> {
    use super::entries::{ATT_PIPE, ATT_RMMA};
    let d = match head_dim {
        1..=64 => 0,
        65..=128 => 1,
        _ => return None,
    };
    let g = match group {
        1 => 0,
        2 => 1,
        3 => 2,
        4 => 3,
        5..=8 => 4,
        _ => return None,
    };
    Some(match form {
        SplitForm::RowMma => ATT_RMMA[0][d][g],
        SplitForm::RowMmaCluster => ATT_RMMA[1][d][g],
        _ => ATT_PIPE[form as usize][d][g],
    })
}

/// Whether a launch of the pipelined split kernel with tiles of `kt` keys
/// can take the bulk tensor copies (which launches do: tma_rule): sm_90+,
/// head_dim 64 or 128 (the kernel's row width exactly, so a box lands as
/// its stage's rows), pages of `bs` cells a multiple of the tile (a tile
/// is `kt` consecutive cells of one page) and the cache's `cells`
/// addressable by the kernel's 32-bit coordinate.
pub(crate) fn att_tma_fits(arch_major: u32, hd: usize, bs: usize, kt: usize, cells: usize) -> bool {
    arch_major >= 9
        && (hd == 64 || hd == 128)
        && kt > 0
        && bs.is_multiple_of(kt)
        && i32::try_from(cells).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gqa_kernel_is_the_smallest_that_fits() {
        use SplitForm::*;
        assert_eq!(gqa_split_kernel(4, 128, Partials), Some("att_pipe_d4_g4"));
        assert_eq!(gqa_split_kernel(3, 64, Partials), Some("att_pipe_d2_g3"));
        assert_eq!(gqa_split_kernel(8, 80, Partials), Some("att_pipe_d4_g8"));
        assert_eq!(gqa_split_kernel(1, 8, Partials), Some("att_pipe_d2_g1"));
        assert_eq!(gqa_split_kernel(3, 64, Merge), Some("att_pipe_m_d2_g3"));
        assert_eq!(gqa_split_kernel(4, 128, Wide), Some("att_pipe_w_d4_g4"));
        assert_eq!(gqa_split_kernel(3, 64, Cluster), Some("att_pipe_c_d2_g3"));
        assert_eq!(gqa_split_kernel(4, 128, Deep), Some("att_pipe_m3_d4_g4"));
        assert_eq!(gqa_split_kernel(3, 64, Partials8), Some("att_pipe8_d2_g3"));
        assert_eq!(gqa_split_kernel(4, 128, Merge8), Some("att_pipe8_m_d4_g4"));
        assert_eq!(gqa_split_kernel(4, 64, Cluster8), Some("att_pipe8_c_d2_g4"));
        assert_eq!(gqa_split_kernel(3, 64, Row), Some("att_row_d2_g3"));
        assert_eq!(gqa_split_kernel(4, 128, Row), Some("att_row_d4_g4"));
        assert_eq!(gqa_split_kernel(3, 64, RowMma), Some("att_rmma_d2_g3"));
        assert_eq!(
            gqa_split_kernel(4, 128, RowMmaCluster),
            Some("att_rmma_c_d4_g4")
        );
        assert_eq!(gqa_split_kernel(9, 128, Partials), None);
        assert_eq!(gqa_split_kernel(4, 256, Merge), None);
        // Every pipelined kernel's shared memory fits an H100's 227 KiB
        // per CTA (the names come from entries::ATT_PIPE, which KERNELS
        // loads).
        for g in 1..=8 {
            for hd in (8..=128).step_by(8) {
                for form in [
                    Partials,
                    Merge,
                    Wide,
                    Cluster,
                    Deep,
                    Partials8,
                    Merge8,
                    Cluster8,
                    Row,
                    RowMma,
                    RowMmaCluster,
                ] {
                    let n = gqa_split_kernel(g, hd, form).unwrap();
                    let smem = att_pipe_smem(n).expect("a pipelined kernel");
                    assert!(smem <= 227 * 1024, "{n}");
                }
            }
        }
        assert_eq!(att_pipe_smem("paged_attention_split"), None);
    }

    #[test]
    fn shared_memory_of_each_layout() {
        // The deep merging form: 3 stages of 16 keys (96 KiB of K/V) + 2
        // KiB of queries + 1 KiB of weights + 128 bytes of (m, l) + 12
        // mbarriers: two CTAs per SM of an H100.
        assert_eq!(
            att_pipe_smem("att_pipe_m3_d4_g4"),
            Some(98_304 + 2_048 + 1_024 + 128 + 96)
        );
        // The merging forms share the partials kernel's layout; the
        // cluster forms add (16, 4) slots of the unit's partials (2 + 128
        // floats each).
        assert_eq!(
            att_pipe_smem("att_pipe_m_d4_g4"),
            att_pipe_smem("att_pipe_d4_g4")
        );
        assert_eq!(
            att_pipe_smem("att_pipe_c_d4_g4"),
            att_pipe_smem("att_pipe_d4_g4").map(|b| b + 16 * 4 * 130 * 4)
        );
        // The 8-key form at 3 stages: 48 KiB of K/V stages + 2 KiB of
        // queries + 512 bytes of weights + 128 bytes of (m, l) + 12
        // mbarriers.
        assert_eq!(
            att_pipe_smem("att_pipe_w_d4_g4"),
            Some(49_152 + 2_048 + 512 + 128 + 96)
        );
        // d4_g8 at 2 stages: 64 KiB of K/V stages + 4 KiB of queries +
        // 2 KiB of weights + 256 bytes of (m, l) + 8 mbarriers; the
        // eight-warp form twice the per-warp parts (the queries once).
        assert_eq!(
            att_pipe_smem("att_pipe_d4_g8"),
            Some(65_536 + 4_096 + 2_048 + 256 + 64)
        );
        assert_eq!(
            att_pipe_smem("att_pipe8_c_d4_g8"),
            Some(131_072 + 4_096 + 4_096 + 512 + 128 + 66_560)
        );
        // The row form, 16 warps of 2 stages: d2_g4: 16 x 2 x (K, V) x 8
        // keys x 64 f16 (64 KiB) + 1 KiB of queries + 2 KiB of weights +
        // 512 bytes of (m, l) + 32 mbarriers.
        assert_eq!(att_threads("att_row_d2_g3"), 512);
        assert_eq!(att_threads("att_row_d4_g4"), 512);
        assert_eq!(
            att_pipe_smem("att_row_d2_g4"),
            Some(65_536 + 1_024 + 2_048 + 512 + 256)
        );
        assert_eq!(att_threads("att_pipe8_m_d2_g3"), 256);
        assert_eq!(att_threads("att_pipe_m_d2_g3"), ATT_SPLIT_THREADS);
        assert_eq!(att_threads("paged_attention_split"), ATT_SPLIT_THREADS);
    }

    #[test]
    fn tensor_core_row_forms_at_eight_warps_of_three_stages() {
        for (d32, name) in [(2, "att_rmma_d2_g3"), (4, "att_rmma_d4_g4")] {
            assert_eq!(att_rmma_shape(d32), (8, 3));
            assert_eq!(att_threads(name), 256);
            let smem = att_pipe_smem(name).unwrap();
            assert_eq!(smem, 8 * 3 * 2 * 16 * 32 * d32 * 2);
            assert!(smem <= 227 * 1024);
        }
        // The cluster form adds rank 0's slots: (GM 4, 4 CTAs) states of
        // 2 + 128 floats.
        assert_eq!(
            att_pipe_smem("att_rmma_c_d4_g4"),
            att_pipe_smem("att_rmma_d4_g4").map(|b| b + 4 * 4 * 130 * 4)
        );
    }

    #[test]
    fn form_properties() {
        use SplitForm::*;
        assert_eq!(Partials.eight(), Partials8);
        assert_eq!(Merge.eight(), Merge8);
        assert_eq!(Cluster.eight(), Cluster8);
        assert_eq!(Cluster8.eight(), Cluster8);
        for f in [Wide, Deep, Row, RowMma, RowMmaCluster] {
            assert_eq!(f.eight(), f);
        }
        assert_eq!(Wide.tile_keys(), 8);
        assert_eq!(Row.tile_keys(), 8);
        assert_eq!(Partials.tile_keys(), 16);
        assert!(!Partials.merges() && !Wide.merges() && !Partials8.merges());
        assert!(Merge.merges() && Cluster8.merges() && RowMmaCluster.merges());
    }

    #[test]
    fn bulk_copies_only_where_a_tile_is_one_page_of_whole_rows() {
        assert!(att_tma_fits(9, 128, 16, 16, 1 << 20));
        assert!(att_tma_fits(9, 64, 32, 16, 1 << 20));
        assert!(att_tma_fits(10, 128, 8, 8, 1 << 20));
        // Before sm_90, other head sizes, pages that split a tile, and
        // cells past the kernel's 32-bit coordinate take cp.async.
        assert!(!att_tma_fits(8, 128, 16, 16, 1 << 20));
        assert!(!att_tma_fits(9, 96, 16, 16, 1 << 20));
        assert!(!att_tma_fits(9, 80, 16, 16, 1 << 20));
        assert!(!att_tma_fits(9, 128, 8, 16, 1 << 20));
        assert!(!att_tma_fits(9, 128, 24, 16, 1 << 20));
        assert!(!att_tma_fits(9, 128, 16, 16, 1 << 31));
    }
}
