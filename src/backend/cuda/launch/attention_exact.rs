//! The canonical (`exact`) paged attention launches (attention.cu): one
//! warp per (row, head) for short rows in launches of more pairs than
//! SMs, else `paged_attention_par`, whose (row, head) pairs may each take
//! a thread-block cluster of CTAs.

use super::RawArgs;
use crate::backend::cuda::mem::{DevAttnBatch, DevKv};
use crate::backend::cuda::CudaBackend;
use anyhow::Result;
use cudarc::driver::{CudaView, CudaViewMut, DevicePtr, LaunchConfig};

/// The largest cluster `paged_attention_par` is launched in (the portable
/// limit; a round has at most 32 chunks, so more CTAs would idle).
pub(crate) const ATT_EX_CLUSTER_MAX: usize = 8;

/// Threads of `paged_attention_par`: 32 x ATT_EX_W, its launch bound (8
/// warps, or the value a tuning run compiles in through
/// `QUIRE_CUDA_DEFINES=ATT_EX_W=N`).
pub(crate) fn att_ex_threads() -> u32 {
    static T: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *T.get_or_init(|| {
        std::env::var("QUIRE_CUDA_DEFINES")
            .ok()
            .and_then(|d| {
                d.split(',')
                    .find_map(|x| x.trim().strip_prefix("ATT_EX_W=")?.parse::<u32>().ok())
            })
            .filter(|w| (1..=32).contains(w))
            .map_or(256, |w| 32 * w)
    })
}

/// QUIRE_ATT_EX_CLUSTER=S: every `paged_attention_par` launch in clusters
/// of S CTAs (1..=ATT_EX_CLUSTER_MAX; for parity runs and sweeps: the
/// same bits for every S).
fn forced_cluster() -> Option<usize> {
    static V: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("QUIRE_ATT_EX_CLUSTER")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|s| (1..=ATT_EX_CLUSTER_MAX).contains(s))
    })
}

/// CTAs per (row, head) of `paged_attention_par`: enough that a CTA's
/// warps take about one chunk each of the longest row's first round
/// (`chunks` 32-key chunks, at most 32), while the launch still fits the
/// GPU's SMs at one CTA each (its registers hold it to one per SM).
pub(crate) fn exact_cluster_rule(pairs: usize, chunks: usize, warps: usize, sms: usize) -> usize {
    let want = chunks.min(32).div_ceil(warps.max(1));
    let fits = sms / pairs.max(1);
    want.min(fits).clamp(1, ATT_EX_CLUSTER_MAX)
}

/// QUIRE_ATT_EX_ONE_WARP=0: `paged_attention_par` for short rows in
/// large launches too (for A/B runs; the same bits).
fn one_warp_wanted() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var("QUIRE_ATT_EX_ONE_WARP").map_or(true, |v| v != "0"))
}

/// Whether a launch of `pairs` one-CTA (row, head) pairs takes
/// `paged_attention_par2` (two CTAs per SM): past one wave of
/// `paged_attention_par` (QUIRE_ATT_EX_PAR2=0 / 1: never / always, for
/// A/B runs; the same bits).
fn two_per_sm(pairs: usize, sms: usize) -> bool {
    static V: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let set = *V.get_or_init(|| std::env::var("QUIRE_ATT_EX_PAR2").ok().map(|v| v != "0"));
    set.unwrap_or(pairs > sms)
}

impl CudaBackend {
    /// Exact attention, arguments validated by `d_attention`. One warp per
    /// (row, head) while every row is before position 128 (part_ctas 1:
    /// at most four chunks) in a launch of more pairs than SMs, else
    /// `paged_attention_par`: ATT_EX_W (8) warps per CTA and S CTAs (a
    /// cluster, sm_90+) per (row, head). The
    /// same bits either way, for any S: a graph replayed past its bucket
    /// stays correct. Measured on an H100 (2026-11-26, bench-attn exact,
    /// B1, us, one warp / 8 warps): ctx 64 15.1 / 17.2, ctx 600 129.0 /
    /// 52.5, ctx 4,100 894.9 / 304.9. On an H200 (2026-11-26, B1, us, 8
    /// warps / V rows loaded 16 at a time / and clusters): ctx 600 52.5 /
    /// 25.7 / 15.1 (S = 3), ctx 2,048 142.6 / 72.0 / 47.9 (S = 3), ctx
    /// 4,100 295.5 / 150.9 / 104.5 (S = 3); S = 4 is slower on an H200
    /// (its 32 clusters of 4 do not fit at once) and at B8 clusters are
    /// slower (two waves at one CTA per SM).
    #[allow(clippy::too_many_arguments)] // the op's fields
    pub(super) fn attention_exact(
        &self,
        q: &CudaView<'_, f32>,
        (nri, nhi, nkvi, hdi, bsi): (i32, i32, i32, i32, i32),
        scale: f32,
        cache: &DevKv<'_>,
        batch: &DevAttnBatch,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let pairs = batch.n_rows * nhi as usize;
        // Short rows in a launch of more pairs than SMs: one warp each
        // (8-warp CTAs whose rows have one or two chunks leave most
        // warps idle and cost more there); else the 8-warp kernel, whose
        // chunks' loads and sums run in parallel (B1 ctx 64: 15.0 ->
        // 8.7 us). Measured on an H200 (2026-11-26, bench-attn exact, us,
        // one warp / 8 warps): B1 ctx 16 / 64 / 127: 6.3 / 7.0, 15.0 /
        // 8.7, 28.9 / 9.0; B8 (256 pairs): 6.5 / 10.3, 15.3 / 14.2, 29.4
        // / 15.4; 8B Q4_0 exact tg128 278.6 -> 290.3 tok/s.
        let one_warp = batch.part_ctas <= 1 && pairs > self.sm_count() && one_warp_wanted();
        let (kernel, threads) = if one_warp {
            ("paged_attention", 32)
        } else {
            ("paged_attention_par", att_ex_threads())
        };
        let csize = if one_warp {
            1
        } else if let Some(s) = forced_cluster() {
            if s > 1 && self.att_clusters(kernel, s) > 0 {
                s
            } else {
                1
            }
        } else {
            // part_ctas: the longest row's 128-key chunks.
            let want = exact_cluster_rule(
                pairs,
                4 * batch.part_ctas,
                threads as usize / 32,
                self.sm_count(),
            );
            // The largest size up to it whose clusters the GPU holds all
            // at once (a GPC holds whole clusters only: an H200 holds 32
            // clusters of 3 but fewer of 4 at one CTA per SM, and a
            // second wave of clusters costs more than the split saves).
            (2..=want)
                .rev()
                .find(|&s| pairs <= self.att_clusters(kernel, s))
                .unwrap_or(1)
        };
        // Past one wave at one CTA per SM (and not in clusters: those are
        // sized to one wave), the entry that fits two per SM.
        let kernel = if !one_warp && csize == 1 && two_per_sm(pairs, self.sm_count()) {
            "paged_attention_par2"
        } else {
            kernel
        };
        if csize > 1 {
            let cfg = LaunchConfig {
                grid_dim: (u32::try_from(pairs * csize)?, 1, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: 0,
            };
            let s = self.stream();
            let mut a = RawArgs::new()
                .ptr(q.device_ptr(s).0)
                .i32(nri)
                .att_shared((nhi, nkvi, hdi, bsi), scale, cache, batch, s)
                .ptr(out.device_ptr(s).0);
            // SAFETY: paged_attention_par's arguments in order and C
            // types, the same buffers and bounds as attention_rowhead's; the
            // cluster (csize, 1, 1) divides the grid (pairs * csize CTAs),
            // and the device holds such clusters (att_clusters > 0:
            // counted at load, on sm_90+ only).
            return unsafe {
                self.launch_clustered(kernel, cfg, (u32::try_from(csize)?, 1, 1), &mut a.params())
            };
        }
        // SAFETY: paged_attention takes 32 threads, paged_attention_par /
        // _par2 att_ex_threads (their launch bound); all three take the
        // op's arguments (ATT_ROWHEAD_PARAMS), validated by d_attention.
        unsafe {
            self.attention_rowhead(
                kernel,
                pairs,
                threads,
                q,
                (nri, nhi, nkvi, hdi, bsi),
                scale,
                cache,
                batch,
                out,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::exact_cluster_rule;

    #[test]
    fn cluster_spreads_batch_one_over_the_sms() {
        // 8B heads, batch 1, 20 chunks (~640 keys), 8 warps, 132 SMs.
        assert_eq!(exact_cluster_rule(32, 20, 8, 132), 3);
        // Long rows: capped by the SMs (4 CTAs per pair), then the limit.
        assert_eq!(exact_cluster_rule(32, 64, 8, 132), 4);
        assert_eq!(exact_cluster_rule(8, 64, 8, 132), 4);
        assert_eq!(exact_cluster_rule(2, 32, 4, 132), 8);
        // Enough pairs to fill the GPU: no cluster.
        assert_eq!(exact_cluster_rule(256, 20, 8, 132), 1);
        assert_eq!(exact_cluster_rule(64, 20, 8, 132), 2);
        // Few chunks: one CTA's warps suffice.
        assert_eq!(exact_cluster_rule(32, 5, 8, 132), 1);
    }
}
