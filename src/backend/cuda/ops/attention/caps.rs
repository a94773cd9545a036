//! The device's attention capabilities, counted once when the kernels
//! load: the resident CTAs per SM of the split kernels whose occupancy
//! the planner weighs, and the clusters the device holds at once of each
//! clustered kernel (sm_90+). The planner reads them through `AttnCaps`.

use super::geometry::{att_pipe_smem, att_threads, ATT_CLUSTER_MAX};
use super::planner::ATT_EX_CLUSTER_MAX;
use crate::backend::cuda::device::launch::max_active_clusters;
use crate::backend::cuda::drv;
use anyhow::Result;
use cudarc::driver::{CudaFunction, CudaStream};
use std::collections::HashMap;
use std::sync::Arc;

/// Counts what kernel `e` (just loaded as `f`) offers the planner into
/// `per_sm` and `cluster_counts`; `clusters`: the device has thread-block
/// clusters (sm_90+). Kernels the planner does not weigh are left out.
pub(crate) fn count_at_load(
    e: &'static str,
    f: &CudaFunction,
    stream: &Arc<CudaStream>,
    clusters: bool,
    per_sm: &mut HashMap<&'static str, usize>,
    cluster_counts: &mut HashMap<(&'static str, usize), usize>,
) -> Result<()> {
    // The partials-only kernels (16- and 8-key tiles): parts_for_slots
    // sizes the partition by them (their att_pipe_m_ forms run the same
    // partition); the deep merging form, whose occupancy deep_rule
    // weighs; the eight-warp partials kernels, whose one wave eight_rule
    // keeps to.
    if e.starts_with("att_pipe_d")
        || e.starts_with("att_pipe8_d")
        || e.starts_with("att_pipe_w_d")
        || e.starts_with("att_pipe_m3_d")
        || e == "paged_attention_split"
    {
        let smem = att_pipe_smem(e).unwrap_or(0);
        let n = drv(
            f.occupancy_max_active_blocks_per_multiprocessor(
                u32::try_from(att_threads(e))?,
                smem,
                None,
            ),
            &format!("{e}: occupancy"),
        )?;
        per_sm.insert(e, n.max(1) as usize);
    }
    if clusters
        && (e.starts_with("att_pipe_c_")
            || e.starts_with("att_pipe8_c_")
            || e.starts_with("att_rmma_c_"))
    {
        let smem = att_pipe_smem(e).unwrap_or(0);
        // Clusters past the portable 8 CTAs are opt-in.
        if let Err(why) = f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
            1,
        ) {
            tracing::warn!("{e}: no clusters past 8 CTAs ({why:?})");
        }
        for c in 2..=ATT_CLUSTER_MAX {
            match max_active_clusters(f, stream, smem, c, att_threads(e)) {
                Ok(n) => {
                    cluster_counts.insert((e, c), n);
                }
                // No count: the combine merges (same bits).
                Err(why) => tracing::warn!("{e}, clusters of {c}: {why:#}"),
            }
        }
    }
    // The exact kernel's clusters (planner.rs, exact_plan): static shared
    // memory only.
    if clusters && e == "paged_attention_par" {
        let threads = super::att_ex_threads() as usize;
        for c in 2..=ATT_EX_CLUSTER_MAX {
            match max_active_clusters(f, stream, 0, c, threads) {
                Ok(n) => {
                    cluster_counts.insert((e, c), n);
                }
                // No count: one CTA per (row, head) (same bits).
                Err(why) => tracing::warn!("{e}, clusters of {c}: {why:#}"),
            }
        }
    }
    Ok(())
}
