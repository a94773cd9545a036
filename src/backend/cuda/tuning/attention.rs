//! The attention family's part of the tuning table (see `tuning/mod.rs`).
//! The planner (ops/attention/planner.rs) reads it; every field picks
//! between forms of the same partition or sizes a threshold of a `fast`
//! rule, so none changes a bit of `deterministic` or `exact` output
//! (the planner's tests assert it).

use super::Switch;
use serde::{Deserialize, Serialize};

/// A family of attention kernels (the `family` knob; llama.cpp's
/// GGML_CUDA_FORCE_VEC / FORCE_TILE / ALLOW_MMA switches pick among its
/// own families the same way). docs/BACKENDS.md lists each family's kernels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttnFamily {
    /// The mode's rules.
    #[default]
    Auto,
    /// The canonical kernels (paged_attention, paged_attention_par):
    /// 32-key chunks in order, one warp or a CTA cluster per (row, head).
    Canonical,
    /// Split-KV on the CUDA cores (att_pipe*, att_row*,
    /// paged_attention_split / _fast).
    Split,
    /// Tensor cores (flash_attention_prefill*, att_rmma*).
    Mma,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionTuning {
    /// `fast` only: the kernel family every launch takes where that
    /// family has a kernel for it (else the rule's, with one INFO line
    /// naming what ran). `deterministic` and `exact` fix their family
    /// (split, canonical) and say so once when another is asked for;
    /// launches with a window, softcap, ALiBi or sinks take the canonical
    /// kernel in every mode.
    pub family: AttnFamily,
    /// `fast` decode: the tensor-core row form (att_rmma_*, one CTA per
    /// (row, KV head) over the whole row). Auto: rmma_rule; on: every
    /// launch whose head_dim is 64 or 128 (gpu-check's parity steps).
    pub rmma: Switch,
    /// `fast` decode: its cluster form (att_rmma_c_*). Auto:
    /// rmma_cluster_rule; on: every launch whose head_dim is 64 or 128
    /// and whose clusters the device holds.
    pub rmma_cluster: Switch,
    /// CTAs per cluster of att_rmma_c_* (2..=4); null: enough that each
    /// folds at most `rmma_cl_kib` of K and V.
    pub rmma_cluster_ctas: Option<usize>,
    /// KiB of K and V the cluster form aims at per CTA (at least 16).
    pub rmma_cl_kib: usize,
    /// KiB of K and V the cluster form takes at most per CTA (at least
    /// 16): longer rows keep the split forms.
    pub rmma_cl_max_kib: usize,
    /// KiB of K and V per unit the cluster form takes at most in one-row
    /// launches without the read-ahead's combine (a decode graph's bucket
    /// of 8 chunks at head_dim 64, 4 at 128).
    pub rmma_cl_nc_kib: usize,
    /// KiB of K and V per unit the one-CTA tensor-core form folds past one
    /// chunk where the split forms would merge by the combine launch.
    pub rmma_kv_kib: usize,
    /// KiB of K and V per unit the one-CTA tensor-core form folds in
    /// one-row launches without the combine (two chunks at head_dim 64).
    pub rmma_nc_kib: usize,
    /// `fast` decode: the row form (att_row_*). Auto: row_rule; on: every
    /// launch that has the kernel.
    pub row: Switch,
    /// The most 128-key chunks of a row the row form takes under auto.
    pub row_chunks_max: usize,
    /// `fast` decode: the 8-key-tile split form (att_pipe_w_*). Auto:
    /// wide_rule; on: every launch of several CTAs per unit.
    pub wide: Switch,
    /// `fast` decode: the deep merging form (att_pipe_m3_*). Auto:
    /// deep_rule; on: every launch whose rows have 2 to 16 chunks.
    pub deep: Switch,
    /// `fast` decode: the eight-warp forms (att_pipe8_*). Auto:
    /// eight_rule; on: every partials, merging or cluster launch.
    pub eight: Switch,
    /// The split forms' K/V by bulk tensor copies where they fit (sm_90+).
    /// Auto: tma_rule; off: every lane's cp.async (the same bits).
    pub tma: Switch,
    /// Units of 2..=16 CTAs merge in a thread-block cluster (att_pipe_c_*)
    /// where the device holds them; off: attention_combine merges (the
    /// same bits).
    pub cluster: bool,
    /// The most CTAs in all (units x CTAs per unit) a cluster-merging
    /// launch takes: past it placing the clusters costs more than the
    /// combine launch saves (H100, bench-attn: faster at 8 x 9 and 24 x 5,
    /// slower at 8 x 13 and 32 x 5).
    pub cluster_ctas_max: usize,
    /// `exact`: every paged_attention_par launch in clusters of this many
    /// CTAs (1..=8, where the device holds them); null: the rule's. The
    /// same bits for every size.
    pub exact_cluster: Option<usize>,
}

impl AttentionTuning {
    /// Defaults for compute capability `major` (9 = Hopper); the
    /// architecture enters the plan through the device's capabilities
    /// (clusters, bulk copies, occupancy), not through these numbers.
    pub fn for_arch(_major: u32) -> Self {
        AttentionTuning {
            family: AttnFamily::Auto,
            rmma: Switch::Auto,
            rmma_cluster: Switch::Auto,
            rmma_cluster_ctas: None,
            rmma_cl_kib: 96,
            rmma_cl_max_kib: 128,
            rmma_cl_nc_kib: 256,
            rmma_kv_kib: 192,
            rmma_nc_kib: 64,
            row: Switch::Auto,
            row_chunks_max: 1,
            wide: Switch::Auto,
            deep: Switch::Auto,
            eight: Switch::Auto,
            tma: Switch::Auto,
            cluster: true,
            cluster_ctas_max: 80,
            exact_cluster: None,
        }
    }
}
