//! The tensor-core row forms of the split-attention kernel
//! (attention_rmma_fast.cu, att_rmma_* and its cluster form att_rmma_c_*):
//! when a `fast` decode launch takes them, how many CTAs a cluster has,
//! and the warps, stages, threads and shared memory their entries are
//! launched with. Pure functions of the batch shape, the device's SMs
//! and the knobs, so tested here without a device; the other forms'
//! rules are in attention_forms.rs.

use super::attention_forms::{entry_shape, env_switch, env_usize};

/// (D32, GM) of tensor-core row-form entry `name` (att_rmma_d{D32}_g{GM}
/// or its cluster form att_rmma_c_d{D32}_g{GM}).
fn rmma_shape_of(name: &str) -> Option<(usize, usize)> {
    entry_shape(name, "att_rmma_d").or_else(|| entry_shape(name, "att_rmma_c_d"))
}

/// The most CTAs of a tensor-core row form's cluster (ATT_RMMA_CL_MAX in
/// the prelude: rank 0 holds that many slots per head).
pub(crate) const ATT_RMMA_CL_MAX: usize = 4;

/// K and V bytes of a unit whose longest row has `part_ctas` 128-key
/// chunks of head_dim `hd` (f16 K and V).
fn unit_kv(part_ctas: usize, hd: usize) -> usize {
    part_ctas * 128 * hd * 4
}

/// CTAs per cluster of the tensor-core row form for rows of `part_ctas`
/// 128-key chunks and head_dim `hd`: enough that each CTA folds at most
/// kv_bounds().cl of K and V, 2..=ATT_RMMA_CL_MAX
/// (QUIRE_ATT_RMMA_CL_CTAS overrides, clamped the same way).
pub(super) fn rmma_cluster_ctas(part_ctas: usize, hd: usize) -> usize {
    static V: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    V.get_or_init(|| env_usize("QUIRE_ATT_RMMA_CL_CTAS"))
        .unwrap_or_else(|| unit_kv(part_ctas, hd).div_ceil(kv_bounds().cl))
        .clamp(2, ATT_RMMA_CL_MAX)
}

/// The tensor-core forms' K and V bounds in bytes, read once from their
/// knobs (KiB; for sweeps).
struct KvBounds {
    /// Per CTA, what the cluster form aims at (QUIRE_ATT_RMMA_CL_KB,
    /// default 96 KiB, at least 16: six 16-key tiles per warp at head_dim
    /// 64 and 8 warps; chosen when the form ran 16 warps there, and
    /// measured faster at 8).
    cl: usize,
    /// Per CTA, the most the cluster form takes (QUIRE_ATT_RMMA_CL_MAX_KB,
    /// default 128 KiB, at least 16): rows past ATT_RMMA_CL_MAX times that
    /// keep the split forms.
    cl_max: usize,
    /// Per unit, the most the cluster form takes in one-row launches where
    /// the split forms would merge in a cluster of their own (no
    /// `combine`; QUIRE_ATT_RMMA_CL_NC_KB, default 256 KiB: a decode
    /// graph's bucket of 8 chunks at head_dim 64, 4 at 128).
    cl_nc_max: usize,
    /// Per unit, the most the one-CTA row form folds past one chunk
    /// (QUIRE_ATT_RMMA_KV_KB, default 192 KiB).
    row_max: usize,
    /// Per unit, the most the one-CTA row form folds in one-row launches
    /// without the `combine` (QUIRE_ATT_RMMA_NC_KB, default 64 KiB: two
    /// chunks at head_dim 64, one at 128).
    row_nc_max: usize,
}

fn kv_bounds() -> &'static KvBounds {
    static V: std::sync::OnceLock<KvBounds> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        let kib = |name: &str, default: usize, floor: usize| {
            env_usize(name).unwrap_or(default).max(floor) << 10
        };
        KvBounds {
            cl: kib("QUIRE_ATT_RMMA_CL_KB", 96, 16),
            cl_max: kib("QUIRE_ATT_RMMA_CL_MAX_KB", 128, 16),
            cl_nc_max: kib("QUIRE_ATT_RMMA_CL_NC_KB", 256, 0),
            row_max: kib("QUIRE_ATT_RMMA_KV_KB", 192, 0),
            row_nc_max: kib("QUIRE_ATT_RMMA_NC_KB", 64, 0),
        }
    })
}

/// A `fast` decode launch as the tensor-core forms' rules see it.
#[derive(Clone, Copy, Debug)]
pub(super) struct RmmaLaunch {
    /// (row, KV head) pairs.
    pub(super) units: usize,
    /// Query rows (one per sequence in a decode graph).
    pub(super) rows: usize,
    /// 128-key chunks of the longest row.
    pub(super) part_ctas: usize,
    /// The device's SMs.
    pub(super) sms: usize,
    /// head_dim (the forms' kernels take exactly 64 or 128).
    pub(super) hd: usize,
    /// Whether the split forms would merge by a second launch here (a
    /// decode graph with the L2 read-ahead branch, whose resident CTAs
    /// keep the cluster merge out).
    pub(super) combine: bool,
}

/// Whether launch `l`, where it does not take the one-CTA tensor-core row
/// form, takes its cluster form (att_rmma_c_*, rmma_cluster_ctas CTAs per
/// unit): rmma_cluster_rule (QUIRE_ATT_RMMA_CL=0: never; =1: every launch
/// whose head_dim fits).
pub(super) fn rmma_cluster_wanted(l: RmmaLaunch) -> bool {
    static V: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    rmma_form_wanted(&V, "QUIRE_ATT_RMMA_CL", l.hd, || {
        let c = rmma_cluster_ctas(l.part_ctas, l.hd);
        let b = kv_bounds();
        rmma_cluster_rule(l, c, b.cl_max, b.cl_nc_max)
    })
}

/// A tensor-core row form's choice: head_dim exactly 64 or 128 (its
/// kernels'), then the comparison switch `knob` (read once into `v`) or
/// else `rule`.
fn rmma_form_wanted(
    v: &std::sync::OnceLock<Option<bool>>,
    knob: &str,
    hd: usize,
    rule: impl FnOnce() -> bool,
) -> bool {
    (hd == 64 || hd == 128) && v.get_or_init(|| env_switch(knob)).unwrap_or_else(rule)
}

/// Rows of several chunks where the split forms would merge by the
/// combine launch (`combine`, a decode graph with the L2 read-ahead
/// branch), whose K and V `c` CTAs fold at most `cl_kv_max` bytes each,
/// at most one cluster's CTAs per two SMs. A decode graph's rows have a
/// power of two of chunks (its bucket), so after 512 tokens the 1B's are
/// 256 KiB (3 CTAs) and the 8B's 512 KiB (4). Measured on H200s
/// (2026-11-28 evening, decode tok/s, the split forms and the combine /
/// this form): the 1B Q4_0 after 512 / 768 / 1,024 / 1,536 tokens
/// 1,700-1,733 / 1,687-1,723 / 1,669-1,710 / 1,633-1,666 against
/// 1,778-1,813 / 1,771-1,798 / 1,794 / 1,756; the 8B Q4_0 after 512 / 768
/// 491-500 / 495 against 497-507 / 502, Q8_0 after 512 354 against
/// 357-361. Past 4 x 128 KiB (the 1B after 2,048 tokens, the 8B after
/// 1,024) clusters of 8 lost (1,549-1,565 against 1,605; 450 against
/// 490), and at 512 KiB 6 CTAs did no better than 4. Where the split
/// forms merge in a cluster of their own (no read-ahead: SmolLM2), one-row
/// launches up to `nc_kv_max`: at 16 warps this form lost there (SmolLM2
/// Q4_0 after 512 / 1,024 tokens 1,676-1,689 / 1,633-1,636 against
/// 1,690-1,698 / 1,645-1,654, 2026-11-28 night); at 8 warps (2026-11-28
/// night 3, two calls of three rounds, split forms / this form) after 256
/// tokens 1,708-1,744 / 1,734-1,771 (faster in six of six pairs), after
/// 512 1,701-1,715 / 1,697-1,723 (a tie), but after 1,024 (512 KiB)
/// 1,641-1,674 / 1,628-1,651.
fn rmma_cluster_rule(l: RmmaLaunch, c: usize, cl_kv_max: usize, nc_kv_max: usize) -> bool {
    (l.combine || (l.rows == 1 && unit_kv(l.part_ctas, l.hd) <= nc_kv_max))
        && l.part_ctas >= 2
        && unit_kv(l.part_ctas, l.hd) <= c * cl_kv_max
        && 2 * l.units * c <= l.sms
}

/// (warps, stages) of the tensor-core row forms for head_dim 32 * d32
/// (ATT_RMMA_WARPS / _STAGES and their _D4 in the prelude). Each warp's
/// stages hold 16-key K and V tiles (4 KiB a stage at head_dim 64, 8 at
/// 128), so warps x stages is bounded by the SM's 227 KiB:
/// QUIRE_ATT_RMMA_WARPS (4, 8 or 16) and QUIRE_ATT_RMMA_STAGES (1..=8)
/// override the defaults, 8 x 3 at head_dim 64 and at 128, clamped to
/// fit. At head_dim 64 the default was 16 x 3 (every tile of a 768-key
/// row requested at once; SmolLM2 with the form forced after 512 tokens:
/// 16 x 3 1,604, 8 x 4 1,550 tok/s) until the rows the form takes were
/// measured at 8 (H200, 2026-11-28 night, decode tok/s, 16 / 8 warps, two
/// or three calls): the 1B from an empty cache 1,912-1,941 / 1,942-1,974,
/// after 256 tokens 1,829-1,882 / 1,858-1,892, after 512 (the cluster
/// form, 3 CTAs) 1,776-1,837 / 1,832-1,862; SmolLM2 from an empty cache
/// 1,802-1,875 / 1,858-1,919, after 128 tokens 1,782-1,829 / 1,815-1,835.
/// Fewer warps merge fewer states, and a row of at most 8 tiles (every
/// row from an empty cache, here) leaves none idle; 8 x 4 lost on the 1B
/// (1,804-1,836 against 1,832-1,862 after 512 tokens).
pub(crate) fn att_rmma_shape(d32: usize) -> (usize, usize) {
    static V: std::sync::OnceLock<(Option<usize>, Option<usize>)> = std::sync::OnceLock::new();
    let (w, st) = *V.get_or_init(|| {
        (
            env_usize("QUIRE_ATT_RMMA_WARPS").filter(|w| [4, 8, 16].contains(w)),
            env_usize("QUIRE_ATT_RMMA_STAGES").map(|s| s.clamp(1, 8)),
        )
    });
    let (w, mut st) = (w.unwrap_or(8), st.unwrap_or(3));
    // Room for the cluster form's slots too (its largest group, 8).
    while st > 1
        && rmma_bytes(d32, w, st) + 8 * ATT_RMMA_CL_MAX * (2 + 32 * d32) * 4 > RMMA_SMEM_MAX
    {
        st -= 1;
    }
    (w, st)
}

/// The most dynamic shared memory a tensor-core row form takes (an sm_90
/// SM's 227 KiB opt-in).
const RMMA_SMEM_MAX: usize = 227 * 1024;

/// ATT_RMMA_BYTES (attention_rmma_fast.cu): warps x stages of a 16-key K
/// and V tile of 32 * d32 f16 dims.
fn rmma_bytes(d32: usize, w: usize, st: usize) -> usize {
    w * st * 2 * 16 * 32 * d32 * 2
}

/// Whether launch `l` takes the tensor-core row form (att_rmma_*: one CTA
/// per unit folds the whole row with m16n8k16 MMAs, merges its warps in
/// shared memory and writes the output): rmma_rule (QUIRE_ATT_RMMA=0:
/// never; =1: every launch whose head_dim fits, so the op parity harness
/// checks it).
pub(super) fn rmma_wanted(l: RmmaLaunch) -> bool {
    static V: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    rmma_form_wanted(&V, "QUIRE_ATT_RMMA", l.hd, || {
        let b = kv_bounds();
        rmma_rule(l, b.row_max, b.row_nc_max)
    })
}

/// At most one unit per two SMs (a CTA alone on its SM), and rows whose K
/// and V (chunks x 128 keys x head_dim x 4 bytes) fit `kv_max` where the
/// split forms would merge by a second launch (`combine`, one-row graphs
/// only), else rows of one chunk, and in one-row launches rows within
/// `nc_kv_max` (at head_dim 64 two chunks): one SM reads the whole row at
/// about its L2 port's rate. Batches of several rows past one chunk keep
/// the split forms: not measured with this form.
/// Measured on an H200 (2026-11-28, decode tok/s, split forms / this
/// form; docs/PERF.md has every run): one chunk (tg128) SmolLM2 Q4_0
/// 1,755-1,784 / 1,827-1,863, 1B Q4_0 1,826-1,886 / 1,892-1,940, 8B Q4_0
/// 518-524 / 522-536; with the combine, the 1B after 256 / 512 / 768
/// tokens 1,700-1,751 / 1,682-1,740 / 1,709-1,727 against 1,845-1,854 /
/// 1,713-1,789 / 1,721-1,723 (164 KiB at 640 keys wins, 224 at 896 ties),
/// the 8B after 128 / 256 / 512 tokens 501-502 / 499-501 / 497-499 against
/// 522-525 / 504-513 / 486-491 (192 KiB at 384 keys wins, 320 at 640
/// loses); instead of the cluster merge (SmolLM2, whose graph has no
/// read-ahead) after 256 / 512 tokens 1,698-1,712 / 1,653-1,689 against
/// 1,698-1,706 / 1,570-1,607: a tie, then a loss; after 128 tokens (two
/// chunks; 2026-11-28 night, three rounds in one call) 1,826.8-1,828.8
/// against 1,695.4-1,746.0 (+4.6-7.9%), so such graphs take rows of two
/// chunks at head_dim 64 (64 KiB), not four. A decode graph's rows have a
/// power of two of chunks (its bucket), so this rule takes the 1B up to 4
/// chunks (511 tokens) and the 8B up to 2 (255); after 512 tokens
/// the 1B's default was the split forms and the combine (1,700-1,733 tok/s
/// on 2026-11-28 evening), which rmma_cluster_rule now replaces.
fn rmma_rule(l: RmmaLaunch, kv_max: usize, nc_kv_max: usize) -> bool {
    let max = if l.combine { kv_max } else { nc_kv_max };
    2 * l.units <= l.sms && (l.part_ctas == 1 || (l.rows == 1 && unit_kv(l.part_ctas, l.hd) <= max))
}

/// Threads of tensor-core row-form entry `name` (32 per warp of
/// att_rmma_shape), None for other entries.
pub(super) fn rmma_threads(name: &str) -> Option<usize> {
    let (d32, _) = rmma_shape_of(name)?;
    Some(32 * att_rmma_shape(d32).0)
}

/// Dynamic shared memory of tensor-core row-form entry `name`, None for
/// other entries: its warps' K and V stages, and in the cluster form the
/// slots rank 0 merges in, (GM, ATT_RMMA_CL_MAX) states of 2 + head_dim
/// f32 (ATT_RMMA_CL_BYTES).
pub(super) fn rmma_smem(name: &str) -> Option<usize> {
    let (d32, gm) = rmma_shape_of(name)?;
    let (w, st) = att_rmma_shape(d32);
    let cl = if name.starts_with("att_rmma_c_") {
        gm * ATT_RMMA_CL_MAX * (2 + 32 * d32) * 4
    } else {
        0
    };
    Some(rmma_bytes(d32, w, st) + cl)
}

#[cfg(test)]
mod tests {
    use super::RmmaLaunch;

    /// A launch of `units` (row, KV head) pairs whose longest row has
    /// `part_ctas` chunks, on `sms` SMs, head_dim `hd`: one row (`units` KV
    /// heads).
    fn at(units: usize, part_ctas: usize, sms: usize, hd: usize, combine: bool) -> RmmaLaunch {
        RmmaLaunch {
            units,
            rows: 1,
            part_ctas,
            sms,
            hd,
            combine,
        }
    }

    #[test]
    fn rmma_form_for_one_chunk_or_a_row_that_one_sm_reads_in_time() {
        use super::super::attention_forms::{att_pipe_smem, att_threads};
        use super::{att_rmma_shape, rmma_rule};
        let (kv, nc) = (192 << 10, 64 << 10);
        // One chunk: every head shape, with or without the combine.
        assert!(rmma_rule(at(3, 1, 132, 64, false), kv, nc));
        assert!(rmma_rule(at(8, 1, 132, 128, false), kv, nc));
        assert!(rmma_rule(at(8, 1, 132, 128, true), kv, nc));
        // Without the combine (SmolLM2) up to 64 KiB: two chunks at
        // head_dim 64 (rows under 256 keys), not four; one at 128.
        assert!(rmma_rule(at(3, 2, 132, 64, false), kv, nc));
        assert!(!rmma_rule(at(3, 4, 132, 64, false), kv, nc));
        assert!(!rmma_rule(at(8, 2, 132, 128, false), kv, nc));
        // Several rows: one chunk only (8 rows of SmolLM2's 3 KV heads).
        let rows8 = |part_ctas| RmmaLaunch {
            rows: 8,
            ..at(24, part_ctas, 132, 64, false)
        };
        assert!(rmma_rule(rows8(1), kv, nc));
        assert!(!rmma_rule(rows8(2), kv, nc));
        // Instead of the combine launch, up to 192 KiB of K and V: 6
        // chunks at head_dim 64, 3 at 128.
        assert!(rmma_rule(at(8, 6, 132, 64, true), kv, nc));
        assert!(!rmma_rule(at(8, 7, 132, 64, true), kv, nc));
        assert!(rmma_rule(at(8, 3, 132, 128, true), kv, nc));
        assert!(!rmma_rule(at(8, 4, 132, 128, true), kv, nc));
        // Not past one unit per two SMs.
        assert!(!rmma_rule(at(67, 1, 132, 64, false), kv, nc));
        assert!(rmma_rule(at(66, 1, 132, 64, false), kv, nc));
        // The launch's threads and shared memory follow att_rmma_shape,
        // within the SM's opt-in 227 KiB.
        for d32 in [2, 4] {
            let (w, st) = att_rmma_shape(d32);
            let name = if d32 == 2 {
                "att_rmma_d2_g3"
            } else {
                "att_rmma_d4_g4"
            };
            assert_eq!(att_threads(name), 32 * w);
            let smem = att_pipe_smem(name).unwrap();
            assert_eq!(smem, w * st * 2 * 16 * 32 * d32 * 2);
            assert!(smem <= 227 * 1024);
        }
    }

    #[test]
    fn rmma_cluster_for_rows_that_four_ctas_fold_at_128_kib() {
        use super::{rmma_cluster_rule, unit_kv, ATT_RMMA_CL_MAX};
        let rule = |l, c| rmma_cluster_rule(l, c, 128 << 10, 256 << 10);
        let c4 = ATT_RMMA_CL_MAX;
        // The 1B's heads (8 units, head_dim 64): 8 chunks (a decode
        // graph's bucket after 512 tokens) are 256 KiB, 3 CTAs; 16 chunks
        // 512 KiB at 4; 32 chunks do not fit 4 x 128 KiB.
        assert_eq!(unit_kv(8, 64), 256 << 10);
        assert!(rule(at(8, 8, 132, 64, true), 3));
        assert!(rule(at(8, 16, 132, 64, true), c4));
        assert!(!rule(at(8, 32, 132, 64, true), c4));
        // Only past one chunk.
        assert!(!rule(at(8, 1, 132, 64, true), 2));
        // Without the combine (SmolLM2's 3 KV heads): one-row launches up
        // to 256 KiB (8 chunks at head_dim 64), not 16 chunks; not
        // batches of several rows.
        assert!(rule(at(3, 4, 132, 64, false), 2));
        assert!(rule(at(3, 8, 132, 64, false), 3));
        assert!(!rule(at(3, 16, 132, 64, false), 4));
        let rows2 = RmmaLaunch {
            rows: 2,
            ..at(6, 8, 132, 64, false)
        };
        assert!(!rule(rows2, 3));
        assert!(rule(
            RmmaLaunch {
                combine: true,
                ..rows2
            },
            3
        ));
        // The 8B's heads (head_dim 128): 8 chunks are 512 KiB, 4 CTAs.
        assert!(rule(at(8, 8, 132, 128, true), c4));
        assert!(!rule(at(8, 16, 132, 128, true), c4));
        // At most one cluster's CTAs per two SMs.
        assert!(rule(at(16, 8, 132, 64, true), 4));
        assert!(!rule(at(17, 8, 132, 64, true), 4));
    }
}
