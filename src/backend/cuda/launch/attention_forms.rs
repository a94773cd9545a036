//! The split-attention kernels' forms and partition (attention_pipe_fast.cu,
//! att_pipe_*): which entry a decode launch takes, how many partials a
//! row's keys are cut into, and the shared memory each entry is launched
//! with. Pure functions of the batch shape and the device's occupancy, so
//! tested here without a device.

use super::attention_rmma::{rmma_smem, rmma_threads};
use crate::backend::cuda::mem::ATT_PARTS;

/// Whether a unit's `ctas` CTAs take the cluster-merging form: 2 to
/// ATT_CLUSTER_MAX of them (one takes att_pipe_m_, more than a cluster
/// holds take attention_combine). QUIRE_ATT_CLUSTER=0 turns it
/// off (attention_combine merges, for comparisons: the same bits).
pub(super) fn cluster_wanted(ctas: usize) -> bool {
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
pub(super) fn cluster_ctas() -> usize {
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
pub(super) fn fast_parts(units: usize, slots: usize) -> usize {
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

/// Whether a one-CTA-per-unit launch of the pipelined kernels merges
/// its own partials (QUIRE_ATT_FUSE=0: attention_combine does, for
/// comparisons; the same arithmetic and order either way).
pub(super) fn fuse_merge() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var("QUIRE_ATT_FUSE").map_or(true, |v| v != "0"))
}

/// Whether decode batches' split attention copies its first K/V tiles
/// before its programmatic wait (QUIRE_ATT_EARLY=0: after it, for
/// comparisons; the start-up loads of positions and block tables go
/// before it either way; the same bits).
pub(super) fn early_kv() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var("QUIRE_ATT_EARLY").map_or(true, |v| v != "0"))
}

/// Whether a launch of `ctas` CTAs of form `form` takes the bulk tensor
/// copies, `fits` saying it can (att_maps.rs, att_tma_fits_cache):
/// QUIRE_ATT_TMA=0 never (every lane's cp.async, for comparisons; the
/// same bits either way), =1 wherever it fits, else where tma_rule says.
/// `chunks`: the longest row's chunks (part_ctas, at most ATT_PARTS),
/// `parts` the partials they are dealt to.
pub(super) fn tma_wanted(
    form: Pipe,
    (ctas, slots, sms): (usize, usize, usize),
    chunks: usize,
    parts: usize,
    fits: bool,
) -> bool {
    static V: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    fits && V
        .get_or_init(|| env_switch("QUIRE_ATT_TMA"))
        .unwrap_or_else(|| tma_rule(form, (ctas, slots, sms), chunks, parts))
}

/// Every launch but one kind: the partials kernel as a single wave of
/// more than two CTAs per SM (of its `slots` resident) whose CTAs fold
/// more than two chunks each, where each lane's cp.async measured faster.
/// H100, bench-attn, 8B heads, 16-token pages, us per call with PDL, bulk
/// copies / cp.async, two rounds (2026-11-26): B=8 (384 CTAs of 396
/// slots, 6 partials) ctx 2,048 (3 chunks a CTA) 33.4 / 32.3, ctx 4,096
/// 57.0 / 56.9, ctx 8,192 100.9 / 98.4; but ctx 1,024 (2 chunks) 16.5 /
/// 19.0, B=1 (256 CTAs) ctx 8,192 17.5 / 19.6 and ctx 2,048 9.0 / 9.9,
/// B=64 ctx 8,192 (1,536 CTAs) 736 / 760-800, B=32 ctx 8,192 (768) 377 /
/// 377.
fn tma_rule(
    form: Pipe,
    (ctas, slots, sms): (usize, usize, usize),
    chunks: usize,
    parts: usize,
) -> bool {
    form != Pipe::Partials || ctas > slots || ctas <= 2 * sms || chunks.div_ceil(parts.max(1)) <= 2
}

/// Whether a `fast` launch of `units` (row, KV head) pairs whose longest
/// row has `part_ctas` chunks (at most ATT_PARTS) folds each row in one
/// CTA at ATT_M3_STAGES stages: deep_rule (QUIRE_ATT_DEEP=0: never;
/// =1: for every row count, so the op parity harness, whose batches are
/// small, checks it; the partition changes, so the bits do).
pub(super) fn deep_wanted(units: usize, part_ctas: usize, deep_slots: usize) -> bool {
    static V: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    match *V.get_or_init(|| env_switch("QUIRE_ATT_DEEP")) {
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
pub(super) fn att_trace(line: &str) {
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

pub(super) fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// A form's comparison switch: `0` never, `1` wherever it can run, else
/// (unset or anything else) None: the form's rule decides.
pub(super) fn env_switch(name: &str) -> Option<bool> {
    match std::env::var(name).as_deref() {
        Ok("0") => Some(false),
        Ok("1") => Some(true),
        _ => None,
    }
}

/// Pipeline depth of the att_pipe kernels (ATT_STAGES in the prelude):
/// QUIRE_ATT_STAGES, 2..=4, default 2.
pub(crate) fn att_stages() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| env_usize("QUIRE_ATT_STAGES").unwrap_or(2).clamp(2, 4))
}

/// The forms of the pipelined split kernel (attention_pipe_fast.cu): partials
/// only (16-key tiles), partials merged by the CTA itself (att_pipe_m_*,
/// one CTA per (row, KV head)), partials with 8-key tiles at
/// ATT_W_STAGES stages (att_pipe_w_*: `fast` mode, multi-wave launches),
/// partials merged by the unit's thread-block cluster of
/// 2..=ATT_CLUSTER_MAX CTAs (att_pipe_c_*, sm_90+), the merging form
/// at ATT_M3_STAGES stages (att_pipe_m3_*, deep_rule), and the partials,
/// merging and cluster forms at eight warps per CTA (att_pipe8_*,
/// eight_rule), one CTA per (row, KV head) folding the whole row
/// without partials (att_row_*, row_rule), and the same on tensor cores
/// (att_rmma_*, attention_rmma_fast.cu, rmma_rule).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pipe {
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

impl Pipe {
    /// The eight-warp form of a partials, merging or cluster form; the
    /// others are their own (they serve launches of many CTAs).
    pub(crate) fn eight(self) -> Pipe {
        match self {
            Pipe::Partials | Pipe::Partials8 => Pipe::Partials8,
            Pipe::Merge | Pipe::Merge8 => Pipe::Merge8,
            Pipe::Cluster | Pipe::Cluster8 => Pipe::Cluster8,
            Pipe::Wide | Pipe::Deep | Pipe::Row | Pipe::RowMma | Pipe::RowMmaCluster => self,
        }
    }
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
/// att_pipe_*: 32 * ATT_SPLIT_WARPS, which attention_split.cuh checks against
/// the prelude's ATT_SPLIT_THREADS): their launches and the occupancy
/// counts taken at load.
pub(crate) const ATT_SPLIT_THREADS: usize = 128;

/// Warps per CTA of the eight-warp forms (att_pipe8_*: ATT_PIPE8_WARPS in
/// the prelude, which their launch bounds and layout take).
pub(crate) const ATT_PIPE8_WARPS: usize = 8;

/// Threads per CTA of split-attention entry `name`: 32 * ATT_PIPE8_WARPS
/// for the eight-warp forms, 32 * att_row_warps for the row forms, the
/// tensor-core row forms' (attention_rmma.rs), else ATT_SPLIT_THREADS.
pub(crate) fn att_threads(name: &str) -> usize {
    if name.starts_with("att_pipe8_") {
        32 * ATT_PIPE8_WARPS
    } else if let Some((d32, _)) = row_shape(name) {
        32 * att_row_warps(d32)
    } else if let Some(t) = rmma_threads(name) {
        t
    } else {
        ATT_SPLIT_THREADS
    }
}

/// (D32, GM) of an entry named `{prefix}{D32}_g{GM}`.
pub(super) fn entry_shape(name: &str, prefix: &str) -> Option<(usize, usize)> {
    let (d32, gm) = name.strip_prefix(prefix)?.split_once("_g")?;
    Some((d32.parse().ok()?, gm.parse().ok()?))
}

/// (D32, GM) of row-form entry `name` (att_row_d{D32}_g{GM}).
fn row_shape(name: &str) -> Option<(usize, usize)> {
    entry_shape(name, "att_row_d")
}

/// Warps per CTA of the row forms (att_row_d{D32}_*: ATT_ROW_WARPS and
/// ATT_ROW_WARPS_D4 in the prelude): QUIRE_ATT_ROW_WARPS (16 or 32;
/// default 16) for head_dim <= 64, at most 16 for head_dim <= 128, where
/// 32 warps' stages of 8 keys would not fit in shared memory.
pub(crate) fn att_row_warps(d32: usize) -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let w = *V.get_or_init(|| {
        env_usize("QUIRE_ATT_ROW_WARPS")
            .filter(|w| [16, 32].contains(w))
            .unwrap_or(16)
    });
    if d32 > 2 {
        w.min(16)
    } else {
        w
    }
}

/// Pipeline depth of the row forms for head_dim <= 32 * d32
/// (ATT_ROW_STAGES and ATT_ROW_STAGES_D4 in the prelude):
/// QUIRE_ATT_ROW_STAGES, 2..=4, default 2; at most 3 for head_dim <= 128,
/// where 16 warps' four stages would not fit in shared memory.
pub(crate) fn att_row_stages(d32: usize) -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let st = *V.get_or_init(|| env_usize("QUIRE_ATT_ROW_STAGES").unwrap_or(2).clamp(2, 4));
    if d32 > 2 {
        st.min(3)
    } else {
        st
    }
}

/// Whether a `fast` launch of `units` (row, KV head) pairs whose longest
/// row has `part_ctas` 128-key chunks takes the row form (att_row_*: one
/// CTA per unit folds the whole row, merges its warps in shared memory
/// and writes the output; no partials, combine or cluster), `sms` the
/// device's SMs: row_rule (QUIRE_ATT_ROW=0: never; =1: every launch that
/// has the kernel, so the op parity harness checks it). Not in
/// `deterministic` mode (its partition is fixed by ATT_PARTS).
pub(super) fn row_wanted(units: usize, part_ctas: usize, sms: usize) -> bool {
    static V: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    V.get_or_init(|| env_switch("QUIRE_ATT_ROW"))
        .unwrap_or_else(|| row_rule(units, part_ctas, sms))
}

/// The most 128-key chunks of a row the row form takes by default
/// (QUIRE_ATT_ROW_CHUNKS overrides, for sweeps).
fn row_chunks_max() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| env_usize("QUIRE_ATT_ROW_CHUNKS").unwrap_or(1))
}

/// At most one unit per two SMs and rows of at most row_chunks_max()
/// chunks. Measured on an H200 (2026-11-28, bench-attn, us per call with
/// PDL at 64 / 128 keys, split forms / row form): B=1-8 faster on every
/// head shape (1B heads B=8 3.76 / 2.84, 4.09 / 3.61; 8B heads 4.69 /
/// 3.40, 5.06 / 4.48); at B=16 the 1B's 128 units (of 132 SMs) slower
/// (3.93 / 4.03, 4.30 / 4.93); past one chunk slower everywhere (one SM
/// folds about 128 keys per 1.5 us).
fn row_rule(units: usize, part_ctas: usize, sms: usize) -> bool {
    2 * units <= sms && part_ctas <= row_chunks_max()
}

/// Whether a `fast` launch of `ctas` CTAs in all takes the eight-warp form
/// of its partials, merging or cluster kernel (att_pipe8_*: each warp one
/// 16-key tile of a chunk instead of two), `sms` the device's SMs,
/// `per_sm` the eight-warp partials kernel's resident CTAs per SM:
/// eight_rule (QUIRE_ATT_EIGHT=0: never, for comparisons and
/// gpu-check's parity step; =1: every such launch, whatever its size).
/// Not in `deterministic` mode, whose bits must not depend on the batch.
pub(super) fn eight_wanted(ctas: usize, sms: usize, per_sm: usize) -> bool {
    static V: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    V.get_or_init(|| env_switch("QUIRE_ATT_EIGHT"))
        .unwrap_or_else(|| eight_rule(ctas, sms, per_sm))
}

/// Launches of at most two CTAs per SM, where a CTA's warps are (nearly)
/// alone on their schedulers and the tile loop is latency-bound. Measured
/// on an H200 (2026-11-28, every launch in one form or the other): decode
/// tg128@d512 SmolLM2 Q4_0 1,585-1,597 -> 1,616-1,624 tok/s, Llama-3.2-1B
/// 1,616-1,635 -> 1,661-1,674, 8B Q4_0 487-490 -> 493-495; bench-attn 8B
/// heads B=1 ctx 512 / 2,048 / 8,192 7.43 / 8.41 / 16.37 -> 6.33 / 7.51 /
/// 15.67 us; but fuller launches lose (B=8 ctx 512 9.13 -> 9.85, B=32 ctx
/// 2,048 78.1 -> 89.9; batched decode B=32 / 64 6,589 / 8,247 -> 6,366 /
/// 7,851 tok/s): with more CTAs per SM the schedulers have other warps
/// already, and twice the shared memory per CTA halves the resident CTAs.
/// And only while the launch is one wave of the eight-warp kernel itself:
/// at head_dim 128 its stages (128 KiB) leave one CTA per SM, so B=1 at
/// 8,192 keys (8 x 32 CTAs) ran in two waves (H200, 2026-11-28 night 3,
/// bench-attn 8B heads, us per call with PDL: 19.45-19.51 against 15.42
/// in the four-warp form, two per SM).
fn eight_rule(ctas: usize, sms: usize, per_sm: usize) -> bool {
    ctas <= per_sm.min(2) * sms
}

/// Dynamic shared memory of the pipelined kernel `name`
/// (att_pipe{,8}_{,m_,c_,w_,m3_}d{D32}_g{GM}; the layout of att_pipe_gqa):
/// K and V stages (per warp, 4 or ATT_PIPE8_WARPS of them, stages of KT
/// rows of 32*D32 f16 each: 16 rows at ATT_STAGES stages, or for
/// att_pipe_w_* 8 rows at att_w_stages()), the queries (GM x 32*D32 f32),
/// the tile weights (warps x GM x KT), the warps' (m, l) and the stages'
/// mbarriers (warps x stages u64, the bulk tensor copies'). None for any
/// other kernel.
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
        (r, 8, att_w_stages())
    } else if let Some(r) = form.strip_prefix("m3_d") {
        (r, 16, ATT_M3_STAGES)
    } else {
        let r = ["d", "m_d", "c_d"]
            .iter()
            .find_map(|p| form.strip_prefix(p))?;
        (r, 16, att_stages())
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
/// its `_m_` / `_w_` form) with head_dim <= 32 * D32 and group <= GM, the
/// smallest instantiated (attention_pipe_fast.cu); None past 8 heads per group
/// or head_dim 128 (the per-head kernel).
pub(super) fn gqa_split_kernel(group: usize, head_dim: usize, form: Pipe) -> Option<&'static str> {
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
    if form == Pipe::RowMma {
        return Some(crate::backend::cuda::source::ATT_RMMA[0][d][g]);
    }
    if form == Pipe::RowMmaCluster {
        return Some(crate::backend::cuda::source::ATT_RMMA[1][d][g]);
    }
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
pub(super) fn wide_wanted(units: usize, parts: usize, slots: usize, part_ctas: usize) -> bool {
    static V: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    match *V.get_or_init(|| env_switch("QUIRE_ATT_WIDE")) {
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
        att_pipe_smem, att_threads, cluster_rule, deep_rule, eight_rule, gqa_split_kernel,
        parts_for_slots, tma_rule, wide_rule, Pipe, ATT_SPLIT_THREADS,
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
    fn bulk_copies_except_one_full_wave_of_long_partials() {
        let (slots, sms) = (396, 132);
        // B=8: 384 CTAs in one wave of 396 slots, 6 partials of rows of
        // 16 and 32 chunks (2,048 and 8,192 keys).
        assert!(!tma_rule(Pipe::Partials, (384, slots, sms), 16, 6));
        assert!(!tma_rule(Pipe::Partials, (384, slots, sms), 32, 6));
        // The same launch over 8 chunks (1,024 keys): two a CTA.
        assert!(tma_rule(Pipe::Partials, (384, slots, sms), 8, 6));
        // B=1 (256 CTAs) and multi-wave launches.
        assert!(tma_rule(Pipe::Partials, (256, slots, sms), 32, 32));
        assert!(tma_rule(Pipe::Partials, (768, slots, sms), 32, 3));
        // Every other form.
        for f in [Pipe::Merge, Pipe::Wide, Pipe::Cluster, Pipe::Deep] {
            assert!(tma_rule(f, (384, slots, sms), 16, 6));
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
        use Pipe::{Cluster, Cluster8, Deep, Merge, Merge8, Partials, Partials8, Row, Wide};
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
        assert_eq!(gqa_split_kernel(9, 128, Partials), None);
        assert_eq!(gqa_split_kernel(4, 256, Merge), None);
        // Every pipelined kernel's shared memory fits an H100's 227 KiB
        // per CTA (the names come from source::ATT_PIPE, which KERNELS
        // loads).
        for g in 1..=8 {
            for hd in (8..=128).step_by(8) {
                for form in [
                    Partials, Merge, Wide, Cluster, Deep, Partials8, Merge8, Cluster8, Row,
                ] {
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
        if super::att_w_stages() == 3 {
            assert_eq!(
                att_pipe_smem("att_pipe_w_d4_g4"),
                Some(49_152 + 2_048 + 512 + 128 + 96)
            );
        }
        // d4_g8 at 2 stages: 64 KiB of K/V stages + 4 KiB of queries +
        // 2 KiB of weights + 256 bytes of (m, l) + 8 mbarriers; the
        // eight-warp form twice the per-warp parts (the queries once).
        if super::att_stages() == 2 {
            assert_eq!(
                att_pipe_smem("att_pipe_d4_g8"),
                Some(65_536 + 4_096 + 2_048 + 256 + 64)
            );
            assert_eq!(
                att_pipe_smem("att_pipe8_c_d4_g8"),
                Some(131_072 + 4_096 + 4_096 + 512 + 128 + 66_560)
            );
        }
    }

    #[test]
    fn eight_warp_forms_for_launches_of_few_ctas() {
        use Pipe::{Cluster, Cluster8, Deep, Merge, Merge8, Partials, Partials8, Wide};
        // Batch 1 on 132 SMs: SmolLM2 (3 KV heads, head_dim 64: three
        // eight-warp CTAs per SM) at up to 2,048 keys (16 chunks) and the
        // 8B (8, head_dim 128: one per SM) at up to 2,048; not the 8B at
        // 8,192 (32 partials: two waves of the eight-warp form), which
        // head_dim 64's two per SM would take.
        assert!(eight_rule(3 * 16, 132, 3));
        assert!(eight_rule(8 * 16, 132, 1));
        assert!(!eight_rule(8 * 32, 132, 1));
        assert!(eight_rule(8 * 32, 132, 3));
        // Batch 8 of the 8B at 512 keys (6 partials: 384 CTAs) and more.
        assert!(!eight_rule(64 * 6, 132, 2));
        assert!(!eight_rule(256 * 3, 132, 2));
        assert_eq!(Partials.eight(), Partials8);
        assert_eq!(Merge.eight(), Merge8);
        assert_eq!(Cluster.eight(), Cluster8);
        assert_eq!(Cluster8.eight(), Cluster8);
        assert_eq!(Wide.eight(), Wide);
        assert_eq!(Deep.eight(), Deep);
        assert_eq!(att_threads("att_pipe8_m_d2_g3"), 256);
        assert_eq!(att_threads("att_pipe_m_d2_g3"), ATT_SPLIT_THREADS);
        assert_eq!(att_threads("paged_attention_split"), ATT_SPLIT_THREADS);
    }

    #[test]
    fn row_form_for_few_units_of_one_chunk() {
        use super::{att_row_stages, att_row_warps, row_rule, Pipe};
        // Batch 1 on 132 SMs: SmolLM2 (3 KV heads), the 1B and 8B (8)
        // while a row has at most 128 keys (one chunk, the default
        // QUIRE_ATT_ROW_CHUNKS); not at 512 keys (5 chunks), where one
        // SM's copies and arithmetic for the whole row lose to the split
        // forms by 20-25% of a decode step.
        if super::row_chunks_max() == 1 {
            assert!(row_rule(3, 1, 132));
            assert!(row_rule(8, 1, 132));
            assert!(!row_rule(8, 5, 132));
            assert!(!row_rule(3, 2, 132));
            // B=8 of 8 KV heads (64 units) still; B=16 (128 units) not.
            assert!(row_rule(64, 1, 132));
        }
        // Past one unit per two SMs: never (B=16 of 8 KV heads).
        assert!(!row_rule(128, 1, 132));
        assert!(!row_rule(133, 1, 132));
        assert_eq!(Pipe::Row.eight(), Pipe::Row);
        // 16 warps by default; at most 16 for head_dim 128.
        assert!(att_row_warps(4) <= 16);
        if att_row_warps(2) == 16 && att_row_stages(2) == 2 {
            assert_eq!(att_threads("att_row_d2_g3"), 512);
            // d2_g4: 16 warps x 2 stages x (K, V) x 8 keys x 64 f16 (64
            // KiB) + 1 KiB of queries + 2 KiB of weights + 512 bytes of
            // (m, l) + 32 mbarriers.
            assert_eq!(
                att_pipe_smem("att_row_d2_g4"),
                Some(65_536 + 1_024 + 2_048 + 512 + 256)
            );
        }
        assert_eq!(att_threads("att_row_d4_g4"), 32 * att_row_warps(4));
    }
}
