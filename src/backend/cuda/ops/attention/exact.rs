//! The canonical (`exact`) paged attention launches (attention.cu):
//! `paged_attention_par` / `_par2`, whose (row, head) pairs may each take
//! a thread-block cluster of CTAs. The planner (planner.rs,
//! exact_plan) picks the entry and the cluster; every form gives the same
//! bits.

use crate::backend::cuda::device::launch::RawArgs;
use crate::backend::cuda::device::memory::{DevAttnBatch, DevKv};
use crate::backend::cuda::CudaBackend;
use anyhow::Result;
use cudarc::driver::{CudaView, CudaViewMut, DevicePtr, LaunchConfig};

/// Threads of `paged_attention_par`: 32 x ATT_EX_W, its launch bound (8
/// warps, or the value a tuning run compiles in through
/// `QUIRE_CUDA_DEFINES=ATT_EX_W=N`, which device/compile.rs passes to NVRTC).
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

impl CudaBackend {
    /// Exact attention by `kernel` (paged_attention_par or _par2) of
    /// `threads` per CTA, `cluster` CTAs per (row, head) (1: no cluster),
    /// arguments validated by `d_attention`.
    #[allow(clippy::too_many_arguments)] // the op's fields and the plan
    pub(super) fn attention_exact(
        &self,
        q: &CudaView<'_, f32>,
        (nri, nhi, nkvi, hdi, bsi): (i32, i32, i32, i32, i32),
        scale: f32,
        cache: &DevKv<'_>,
        batch: &DevAttnBatch,
        out: &mut CudaViewMut<'_, f32>,
        (kernel, threads, cluster): (&'static str, u32, usize),
    ) -> Result<()> {
        let pairs = batch.n_rows * nhi as usize;
        if cluster > 1 {
            let cfg = LaunchConfig {
                grid_dim: (u32::try_from(pairs * cluster)?, 1, 1),
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
            // cluster (cluster, 1, 1) divides the grid (pairs * cluster
            // CTAs), and the device holds such clusters (the plan takes a
            // size only where att_clusters > 0: counted at load, on sm_90+
            // only).
            return unsafe {
                self.launch_clustered(
                    kernel,
                    cfg,
                    (u32::try_from(cluster)?, 1, 1),
                    &mut a.params(),
                )
            };
        }
        // SAFETY: paged_attention_par / _par2 take att_ex_threads (their
        // launch bound) and the op's arguments (ATT_ROWHEAD_PARAMS),
        // validated by d_attention.
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
                None,
            )
        }
    }
}
