//! The paged-attention planner: which kernel a launch takes and its
//! geometry, as a pure function of the launch's shape, the mode, the
//! device's capabilities and the tuning table. The launchers
//! (launch.rs, exact.rs) match on the plan; the backend's
//! capability for attention is "a plan exists". Below it in the family's
//! imports: the forms' rules (forms.rs, rmma.rs) and the entries'
//! geometry (geometry.rs).
//!
//! What makes `deterministic` and `exact` what they are lives here: in
//! those modes a row's reduction order (its keys cut into ATT_PARTS
//! partials of 128-key chunks aligned to absolute position 0, folded in
//! 16-key tiles by four warps, combined in partial order; or the
//! canonical kernel's fixed order) depends on the head shape only, never
//! on the batch's rows, its longest row, prefill or decode, or the
//! device (tests below).

use super::forms::{
    cluster_rule, deep_rule, eight_rule, parts_for_slots, row_rule, tma_rule, wide_rule,
};
use super::geometry::{att_pipe_smem, att_threads, att_tma_fits, gqa_split_kernel, SplitForm};
use super::rmma::{rmma_cluster_ctas, rmma_cluster_wanted, rmma_wanted, RmmaLaunch};
use crate::backend::cuda::device::memory::ATT_PARTS;
use crate::backend::cuda::tuning::{AttentionTuning, AttnFamily, Switch};
use crate::backend::Mode;
use anyhow::{anyhow, bail, Result};
use std::collections::HashMap;

/// One paged-attention launch as the planner sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AttnShape {
    /// Query rows of the batch (at least 1).
    pub rows: usize,
    /// Query heads; a multiple of `kv_heads`.
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Cells per KV page.
    pub block_size: usize,
    /// Cells of the layer's KV cache (pages x block_size).
    pub kv_cells: usize,
    /// 128-key chunks of the batch's longest row (1..=ATT_PARTS; a decode
    /// graph's bucket fixes it). Parallelism only: no row's reduction
    /// order follows it in `deterministic` or `exact`.
    pub part_ctas: usize,
    /// The batch carries prefill tiles (runs of at most 16 rows of one
    /// sequence, for the tensor-core prefill kernel).
    pub prefill_tiles: bool,
    /// Every row is its sequence's only row (a decode batch): the split
    /// kernels may read K/V before their programmatic wait.
    pub one_row_per_seq: bool,
    /// The launch carries a sliding window, a softcap, ALiBi slopes or
    /// sinks (`AttnOpts`): only the canonical warp kernel has them.
    pub scored: bool,
    /// The device fusions are on (the backend's `prequant`): the merging
    /// forms write the output and its int8 copy themselves. Off in
    /// check-exact's unfused reference (the same bits).
    pub fusions: bool,
    /// A decode graph with the L2 read-ahead branch is being captured: its
    /// resident CTAs keep thread-block clusters from being placed.
    pub read_ahead: bool,
}

/// What the device offers the attention kernels, read once at load.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnCaps<'a> {
    /// Compute capability major (9: Hopper; clusters and bulk copies).
    pub arch_major: u32,
    pub sms: usize,
    /// Resident CTAs per SM of each occupancy-counted split kernel.
    pub per_sm: &'a HashMap<&'static str, usize>,
    /// Clusters resident at once per (kernel, cluster size); absent: none.
    pub clusters: &'a HashMap<(&'static str, usize), usize>,
    /// Threads of paged_attention_par (its compiled launch bound).
    pub exact_threads: u32,
}

impl AttnCaps<'_> {
    fn per_sm(&self, name: &str) -> Result<usize> {
        self.per_sm
            .get(name)
            .copied()
            .ok_or_else(|| anyhow!("cuda backend: no occupancy for kernel {name}"))
    }

    fn clusters(&self, name: &'static str, size: usize) -> usize {
        self.clusters.get(&(name, size)).copied().unwrap_or(0)
    }
}

/// A paged-attention launch: the kernel form and its geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AttnPlan {
    /// `fast` prefill on tensor cores (attention_prefill_fast.cu): one CTA
    /// per (tile, grid_y) of `threads`.
    Prefill {
        kernel: &'static str,
        grid_y: usize,
        threads: usize,
    },
    /// `exact`: one warp per (row, head) (paged_attention).
    ExactWarp,
    /// Every mode, with a window, softcap, ALiBi or sinks: the canonical
    /// arithmetic with them, one warp per (row, head)
    /// (paged_attention_opts): batch- and KV-cache invariant and bitwise
    /// the cpu, so `fast` pays the canonical kernel's speed for them.
    Scored,
    /// `exact`: `kernel` (paged_attention_par, or _par2 at two CTAs per
    /// SM) of `threads` per (row, head), in clusters of `cluster` CTAs
    /// (1: none).
    ExactPar {
        kernel: &'static str,
        threads: u32,
        cluster: usize,
    },
    /// `fast` / `deterministic`, head_dim not a multiple of 8: eight warps
    /// per (row, head) splitting the keys (paged_attention_fast).
    RowHead,
    /// `fast` / `deterministic`: split-KV partials and their merge.
    Split(SplitPlan),
}

/// A split-KV launch (attention_fast.cu, attention_pipe_fast.cu,
/// attention_rmma_fast.cu).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SplitPlan {
    /// The grouped kernel's form; None: the per-head kernel
    /// (paged_attention_split: more than 8 heads per KV head, or head_dim
    /// past 128).
    pub form: Option<SplitForm>,
    pub kernel: &'static str,
    /// Partials a row's chunks are dealt to.
    pub parts: usize,
    /// CTAs per unit (grid y; the cluster's extent in the clustered forms).
    pub ctas_y: usize,
    /// CTAs per partial: (row, KV head) pairs for the grouped kernels,
    /// (row, head) for the per-head one (grid x).
    pub ctas_x: usize,
    pub threads: usize,
    /// Dynamic shared memory (the attribute set at load).
    pub smem: usize,
    /// K and V by bulk tensor copies (else every lane's cp.async).
    pub tma: bool,
    /// Keys per tile of the bulk copies' box.
    pub tile_keys: usize,
    /// The first K/V tiles are copied before the programmatic wait.
    pub early: bool,
}

impl SplitPlan {
    /// Whether the kernel writes the output itself (else the combine).
    pub(crate) fn merges(&self) -> bool {
        self.form.is_some_and(SplitForm::merges)
    }

    /// Whether the kernel launches in thread-block clusters (1, ctas_y, 1).
    pub(crate) fn clustered(&self) -> bool {
        self.form.is_some_and(SplitForm::clustered)
    }

    /// The kernel that merges the partials when this one does not: the
    /// form with twice the partials in flight up to head_dim 128.
    pub(crate) fn combine_kernel(head_dim: usize) -> &'static str {
        if head_dim <= 128 {
            "attention_combine_d128"
        } else {
            "attention_combine"
        }
    }
}

/// The largest head_dim the kernels take (8 values per thread).
pub(crate) const ATT_MAX_HEAD_DIM: usize = 256;

/// Whether attention with `head_dim` can run (capability: a plan exists
/// for every batch of such heads in every mode).
pub(crate) fn head_dim_supported(head_dim: usize) -> std::result::Result<(), String> {
    if head_dim > ATT_MAX_HEAD_DIM {
        return Err(format!(
            "head_dim {head_dim} > {ATT_MAX_HEAD_DIM} (the attention kernel keeps 8 values per thread)"
        ));
    }
    Ok(())
}

/// The plan of launch `s` in `mode`.
pub(crate) fn plan(
    s: &AttnShape,
    mode: Mode,
    caps: &AttnCaps<'_>,
    t: &AttentionTuning,
) -> Result<AttnPlan> {
    head_dim_supported(s.head_dim).map_err(|e| anyhow!("paged_attention: {e}"))?;
    if s.kv_heads == 0 || !s.heads.is_multiple_of(s.kv_heads) {
        bail!(
            "paged_attention: {} heads over {} KV heads",
            s.heads,
            s.kv_heads
        );
    }
    let hd = s.head_dim;
    if s.scored {
        return Ok(AttnPlan::Scored);
    }
    if mode == Mode::Fast && t.family != AttnFamily::Auto {
        return fast_family_plan(s, caps, t);
    }
    if mode == Mode::Fast && s.prefill_tiles && hd.is_multiple_of(16) && hd <= 128 {
        let (kernel, grid_y, threads) = prefill_kernel(s.heads, s.kv_heads);
        return Ok(AttnPlan::Prefill {
            kernel,
            grid_y,
            threads,
        });
    }
    match mode {
        Mode::Exact => Ok(exact_plan(s, caps, t)),
        Mode::Fast | Mode::Deterministic if hd.is_multiple_of(8) => {
            split_plan(s, mode, caps, t).map(AttnPlan::Split)
        }
        Mode::Fast | Mode::Deterministic => Ok(AttnPlan::RowHead),
    }
}

/// `fast` with `attention.family` set: that family's kernel where it has
/// one for the launch, else the rule's plan (`family_note` says so).
fn fast_family_plan(s: &AttnShape, caps: &AttnCaps<'_>, t: &AttentionTuning) -> Result<AttnPlan> {
    let hd = s.head_dim;
    let auto = AttentionTuning {
        family: AttnFamily::Auto,
        ..t.clone()
    };
    match t.family {
        AttnFamily::Auto => plan(s, Mode::Fast, caps, t),
        AttnFamily::Canonical => Ok(exact_plan(s, caps, t)),
        AttnFamily::Split if hd.is_multiple_of(8) => {
            let split = AttentionTuning {
                rmma: Switch::Off,
                rmma_cluster: Switch::Off,
                ..auto
            };
            split_plan(s, Mode::Fast, caps, &split).map(AttnPlan::Split)
        }
        AttnFamily::Split => Ok(AttnPlan::RowHead),
        AttnFamily::Mma if s.prefill_tiles && hd.is_multiple_of(16) && hd <= 128 => {
            let (kernel, grid_y, threads) = prefill_kernel(s.heads, s.kv_heads);
            Ok(AttnPlan::Prefill {
                kernel,
                grid_y,
                threads,
            })
        }
        AttnFamily::Mma => {
            let mma = AttentionTuning {
                rmma: Switch::On,
                ..auto
            };
            let p = plan(s, Mode::Fast, caps, &mma)?;
            if p.family() == AttnFamily::Mma {
                Ok(p)
            } else {
                plan(s, Mode::Fast, caps, &auto)
            }
        }
    }
}

/// The INFO line for a launch whose plan is not of the family the tuning
/// table asks for (None: it is, or none is asked for).
pub(crate) fn family_note(
    s: &AttnShape,
    mode: Mode,
    t: &AttentionTuning,
    p: &AttnPlan,
) -> Option<String> {
    let want = t.family;
    if want == AttnFamily::Auto || p.family() == want {
        return None;
    }
    let why = if s.scored {
        "launches with a window, softcap, ALiBi or sinks take the canonical kernel".to_string()
    } else if mode != Mode::Fast {
        format!("{mode:?} fixes its family")
    } else {
        format!(
            "no {want:?} kernel for head_dim {} ({})",
            s.head_dim,
            if s.prefill_tiles { "prefill" } else { "decode" }
        )
    };
    Some(format!(
        "attention.family={want:?} asked for, {:?} ran instead: {why}",
        p.family()
    ))
}

/// The tensor-core prefill kernel for `n_heads` query heads over
/// `n_kv_heads` (a divisor): its name, the grid's y extent and the threads
/// per CTA. Up to 8 heads per KV head share a CTA (one warp each, K/V
/// copied once for them, pipelined: flash_attention_prefill_g, grid y =
/// KV heads); past 8, one warp per head (flash_attention_prefill). The
/// same bits either way.
fn prefill_kernel(n_heads: usize, n_kv_heads: usize) -> (&'static str, usize, usize) {
    let group = n_heads / n_kv_heads.max(1);
    if (1..=8).contains(&group) {
        ("flash_attention_prefill_g", n_kv_heads, 32 * group)
    } else {
        ("flash_attention_prefill", n_heads, 32)
    }
}

/// The largest cluster `paged_attention_par` is launched in (the portable
/// limit; a round has at most 32 chunks, so more CTAs would idle).
pub(crate) const ATT_EX_CLUSTER_MAX: usize = 8;

/// CTAs per (row, head) of `paged_attention_par`: enough that a CTA's
/// warps take about one chunk each of the longest row's first round
/// (`chunks` 32-key chunks, at most 32), while the launch still fits the
/// GPU's SMs at one CTA each (its registers hold it to one per SM).
fn exact_cluster_rule(pairs: usize, chunks: usize, warps: usize, sms: usize) -> usize {
    let want = chunks.min(32).div_ceil(warps.max(1));
    let fits = sms / pairs.max(1);
    want.min(fits).clamp(1, ATT_EX_CLUSTER_MAX)
}

/// The canonical kernels (attention.cu), the same bits in every form: one
/// warp per (row, head) while every row is before position 128
/// (part_ctas 1) in a launch of more pairs than SMs (8-warp CTAs whose
/// rows have one or two chunks leave most warps idle there; H200,
/// bench-attn exact, us, one warp / 8 warps: B1 ctx 16 / 64 / 127: 6.3 /
/// 7.0, 15.0 / 8.7, 28.9 / 9.0; B8 (256 pairs): 6.5 / 10.3, 15.3 / 14.2,
/// 29.4 / 15.4); else `paged_attention_par`, 8 warps per CTA, in
/// clusters of S CTAs per (row, head) (sm_90+) sized by
/// exact_cluster_rule to the largest the device holds all at once (a GPC
/// holds whole clusters: an H200 holds 32 of 3 but fewer of 4 at one CTA
/// per SM, and a second wave costs more than the split saves; H200, B1,
/// us, 8 warps / clusters: ctx 600 25.7 / 15.1 (S = 3), ctx 4,100 150.9
/// / 104.5). Past one wave at one CTA per SM, outside clusters, the
/// entry that fits two per SM (paged_attention_par2).
fn exact_plan(s: &AttnShape, caps: &AttnCaps<'_>, t: &AttentionTuning) -> AttnPlan {
    let pairs = s.rows * s.heads;
    if s.part_ctas <= 1 && pairs > caps.sms {
        return AttnPlan::ExactWarp;
    }
    let kernel = "paged_attention_par";
    let threads = caps.exact_threads;
    let forced = t
        .exact_cluster
        .filter(|c| (1..=ATT_EX_CLUSTER_MAX).contains(c));
    let cluster = match forced {
        Some(c) if c > 1 && caps.clusters(kernel, c) > 0 => c,
        Some(_) => 1,
        None => {
            // part_ctas: the longest row's 128-key chunks.
            let want = exact_cluster_rule(pairs, 4 * s.part_ctas, threads as usize / 32, caps.sms);
            (2..=want)
                .rev()
                .find(|&c| pairs <= caps.clusters(kernel, c))
                .unwrap_or(1)
        }
    };
    let kernel = if cluster == 1 && pairs > caps.sms {
        "paged_attention_par2"
    } else {
        kernel
    };
    AttnPlan::ExactPar {
        kernel,
        threads,
        cluster,
    }
}

/// Split-KV attention (head_dim a multiple of 8). Partials per row:
/// `deterministic` ATT_PARTS always, in the four-warp 16-key forms
/// (partials, merging or cluster: who merges changes nothing); `fast`
/// the forms' rules over the batch shape and the device's occupancy.
fn split_plan(
    s: &AttnShape,
    mode: Mode,
    caps: &AttnCaps<'_>,
    t: &AttentionTuning,
) -> Result<SplitPlan> {
    use SplitForm::*;
    let (hd, sms) = (s.head_dim, caps.sms);
    let fast = mode == Mode::Fast;
    // GQA-grouped: one CTA per (row, KV head); else per (row, head).
    let group = s.heads / s.kv_heads;
    let kernel_of = |f: SplitForm| gqa_split_kernel(group, hd, f);
    let gqa = kernel_of(Partials).is_some();
    let base = kernel_of(Partials).unwrap_or("paged_attention_split");
    let units = s.rows * s.kv_heads;
    let slots = caps.per_sm(base)? * sms;
    let mut parts = if fast {
        parts_for_slots(units, slots)
    } else {
        ATT_PARTS
    };
    // `fast`, few units: one CTA per unit folds its whole row and writes
    // the output, on tensor cores (head_dim 64 or 128) in one CTA or in a
    // cluster of CTAs per unit where the device holds every unit's
    // cluster at once, else on the row form.
    let rl = RmmaLaunch {
        units,
        rows: s.rows,
        part_ctas: s.part_ctas,
        sms,
        hd,
        combine: s.read_ahead,
    };
    let rmma = fast && kernel_of(RowMma).is_some() && rmma_wanted(rl, t);
    let rmma_cl_ctas = rmma_cluster_ctas(s.part_ctas, hd, t);
    let rmma_cl = !rmma
        && fast
        && rmma_cluster_wanted(rl, t)
        && kernel_of(RowMmaCluster).is_some_and(|c| units <= caps.clusters(c, rmma_cl_ctas));
    let row = rmma
        || rmma_cl
        || (fast && kernel_of(Row).is_some() && row_rule(units, s.part_ctas, sms, t));
    // `fast`, rows of 2 to 16 chunks and units enough to fill the GPU at
    // the deep merging kernel's occupancy: one partial per row.
    let deep = match (fast, kernel_of(Deep)) {
        (true, Some(dn)) if !row => deep_rule(units, s.part_ctas, caps.per_sm(dn)? * sms, t),
        _ => false,
    };
    if deep {
        parts = 1;
    }
    // `fast`, more than one wave: the 8-key-tile form, its partition
    // sized by its own resident CTAs (a function of the batch shape only).
    let wide = fast && gqa && !deep && !row && wide_rule(units, parts, slots, s.part_ctas, t);
    if wide {
        let wname = kernel_of(Wide).unwrap_or(base);
        parts = parts_for_slots(units, caps.per_sm(wname)? * sms);
    }
    // No more CTAs per row than partials.
    let ctas_y = if rmma_cl {
        rmma_cl_ctas
    } else if row {
        1
    } else {
        s.part_ctas.min(parts)
    };
    // One CTA per unit: the merging form merges its own partials (not
    // without the device fusions, whose int8 copy it writes). The
    // partition does not depend on it.
    let fused = !wide && gqa && s.fusions;
    let merge = (fused && ctas_y == 1) || row;
    // `fast`, few CTAs in all: the partials, merging or cluster kernel at
    // eight warps per CTA (the same partition, other bits).
    let eight = if fast && gqa && !wide && !deep && !row {
        let per_sm = match kernel_of(Partials8) {
            Some(n) => caps.per_sm(n)?,
            None => 0,
        };
        eight_rule(units * ctas_y, sms, per_sm, t)
    } else {
        false
    };
    let kernel_form = |f: SplitForm| if eight { f.eight() } else { f };
    // Two to 16 CTAs per unit and few CTAs in all: a thread-block cluster
    // merges after its barrier, so no combine launches. Only while every
    // unit's cluster is resident at once (a GPC holds whole clusters, a
    // launch of more waits for a second wave: H100, B=8 ctx 1,024, 64
    // clusters of 6: 31.1 us against 18.5 us with the combine), and not
    // beside the read-ahead branch, whose resident CTAs keep the clusters
    // from being placed (H100, tg128@d512 with the read-ahead, clusters /
    // the combine: 8B Q8_0 275.6 / 283.0 tok/s, 1B Q4_0 1,528 / 1,538).
    let cluster = fused
        && !row
        && cluster_rule(ctas_y, t)
        && !s.read_ahead
        && units * ctas_y <= t.cluster_ctas_max
        && kernel_of(kernel_form(Cluster)).is_some_and(|c| units <= caps.clusters(c, ctas_y));
    let form = if rmma {
        RowMma
    } else if rmma_cl {
        RowMmaCluster
    } else if row {
        Row
    } else if wide {
        Wide
    } else if merge && deep {
        Deep
    } else if merge {
        Merge
    } else if cluster {
        Cluster
    } else {
        Partials
    };
    let kernel = kernel_of(kernel_form(form)).unwrap_or(base);
    // K and V by bulk tensor copies where a tile is one page's cells (the
    // tensor-core forms copy by cp.async only).
    let tile_keys = form.tile_keys();
    let fits = att_tma_fits(caps.arch_major, hd, s.block_size, tile_keys, s.kv_cells);
    let tma = gqa
        && !rmma
        && !rmma_cl
        && tma_rule(
            form,
            (units * ctas_y, slots, sms),
            (s.part_ctas, parts),
            fits,
            t,
        );
    Ok(SplitPlan {
        form: gqa.then(|| kernel_form(form)),
        kernel,
        parts,
        ctas_y,
        ctas_x: if gqa { units } else { s.rows * s.heads },
        threads: att_threads(kernel),
        smem: att_pipe_smem(kernel).unwrap_or(0),
        tma,
        tile_keys,
        early: s.one_row_per_seq,
    })
}

/// A row's reduction order under a plan: what its bits depend on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReductionOrder {
    /// The canonical kernels' order (attention.cu): the same in every
    /// exact form and cluster size.
    Canonical,
    /// Eight warps per (row, head) splitting the keys (attention_fast.cu).
    RowHead,
    /// Split KV: `parts` partials of 128-key chunks aligned to position 0,
    /// each folded in `tile_keys`-key tiles by `warps` warps, combined in
    /// partial order; `kernel_family` the entry's layout class.
    Split {
        parts: usize,
        tile_keys: usize,
        warps: usize,
        kernel_family: &'static str,
    },
    /// Tensor-core prefill (`fast` only).
    Prefill,
}

impl AttnPlan {
    /// The kernel family of this plan (the `attention.family` knob's terms).
    pub(crate) fn family(&self) -> AttnFamily {
        match self {
            AttnPlan::ExactWarp | AttnPlan::ExactPar { .. } | AttnPlan::Scored => {
                AttnFamily::Canonical
            }
            AttnPlan::RowHead => AttnFamily::Split,
            AttnPlan::Prefill { .. } => AttnFamily::Mma,
            AttnPlan::Split(p) => match p.form {
                Some(SplitForm::RowMma | SplitForm::RowMmaCluster) => AttnFamily::Mma,
                _ => AttnFamily::Split,
            },
        }
    }

    /// The order in which this plan reduces a row's keys.
    pub(crate) fn reduction_order(&self) -> ReductionOrder {
        match self {
            AttnPlan::ExactWarp | AttnPlan::ExactPar { .. } | AttnPlan::Scored => {
                ReductionOrder::Canonical
            }
            AttnPlan::RowHead => ReductionOrder::RowHead,
            AttnPlan::Prefill { .. } => ReductionOrder::Prefill,
            AttnPlan::Split(p) => {
                use SplitForm::*;
                let family = match p.form {
                    None => "paged_attention_split",
                    Some(Partials | Merge | Cluster) => "att_pipe",
                    Some(Partials8 | Merge8 | Cluster8) => "att_pipe8",
                    Some(Wide) => "att_pipe_w",
                    Some(Deep) => "att_pipe_m3",
                    Some(Row) => "att_row",
                    Some(RowMma | RowMmaCluster) => "att_rmma",
                };
                ReductionOrder::Split {
                    parts: p.parts,
                    tile_keys: p.tile_keys,
                    warps: p.threads / 32,
                    kernel_family: family,
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "planner_tests.rs"]
mod tests;
