//! The `fast` rules of the tensor-core row forms of the split-attention
//! kernel (attention_rmma_fast.cu, att_rmma_* and its cluster form
//! att_rmma_c_*): when a decode launch takes them and how many CTAs a
//! cluster has. Pure functions of the batch shape, the device's SMs and
//! the tuning table, gathered by the planner (planner.rs); the other
//! forms' rules are in forms.rs, the entries' geometry in geometry.rs.

use super::geometry::ATT_RMMA_CL_MAX;
use crate::backend::cuda::tuning::AttentionTuning;

/// K and V bytes of a unit whose longest row has `part_ctas` 128-key
/// chunks of head_dim `hd` (f16 K and V).
fn unit_kv(part_ctas: usize, hd: usize) -> usize {
    part_ctas * 128 * hd * 4
}

/// CTAs per cluster of the tensor-core row form for rows of `part_ctas`
/// 128-key chunks and head_dim `hd`: `t.rmma_cluster_ctas`, or enough
/// that each CTA folds at most `t.rmma_cl_kib` (at least 16 KiB: six
/// 16-key tiles per warp at head_dim 64 and 8 warps) of K and V;
/// 2..=ATT_RMMA_CL_MAX either way.
pub(super) fn rmma_cluster_ctas(part_ctas: usize, hd: usize, t: &AttentionTuning) -> usize {
    t.rmma_cluster_ctas
        .unwrap_or_else(|| unit_kv(part_ctas, hd).div_ceil(kib(t.rmma_cl_kib, 16)))
        .clamp(2, ATT_RMMA_CL_MAX)
}

/// `n` KiB in bytes, at least `floor` KiB.
fn kib(n: usize, floor: usize) -> usize {
    n.max(floor) << 10
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
/// unit): head_dim exactly 64 or 128 (its kernels'), then `t.rmma_cluster`
/// (auto: rmma_cluster_rule).
pub(super) fn rmma_cluster_wanted(l: RmmaLaunch, t: &AttentionTuning) -> bool {
    (l.hd == 64 || l.hd == 128)
        && t.rmma_cluster.or({
            let c = rmma_cluster_ctas(l.part_ctas, l.hd, t);
            rmma_cluster_rule(l, c, kib(t.rmma_cl_max_kib, 16), kib(t.rmma_cl_nc_kib, 0))
        })
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

/// Whether launch `l` takes the tensor-core row form (att_rmma_*: one CTA
/// per unit folds the whole row with m16n8k16 MMAs, merges its warps in
/// shared memory and writes the output): head_dim exactly 64 or 128,
/// then `t.rmma` (auto: rmma_rule).
pub(super) fn rmma_wanted(l: RmmaLaunch, t: &AttentionTuning) -> bool {
    (l.hd == 64 || l.hd == 128)
        && t.rmma
            .or(rmma_rule(l, kib(t.rmma_kv_kib, 0), kib(t.rmma_nc_kib, 0)))
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
        use super::rmma_rule;
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
