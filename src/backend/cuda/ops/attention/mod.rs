//! Paged attention: the planner and its rules (`planner.rs`, over
//! `forms.rs`, `rmma.rs` and `geometry.rs`, pure and tested on the CPU),
//! the launchers (`launch.rs`: every mode's entry and the split-KV and
//! tensor-core prefill launches; `exact.rs`: the canonical kernels'; and
//! `maps.rs`: the K/V cache's tensor maps for the bulk copies), what the
//! device offers them, counted at load (`caps.rs`), their entry points
//! (`entries.rs`, which the kernel table loads), and the
//! kernels (`kernels/`: attention.cu canonical, the `_fast` forms, the
//! KV writes).
//!
//! Imports go one way: launch.rs / exact.rs -> planner.rs -> forms.rs,
//! rmma.rs -> geometry.rs.

mod caps;
mod entries;
mod exact;
mod forms;
mod geometry;
mod kv_write;
mod launch;
mod maps;
mod planner;
mod rmma;

pub(crate) use caps::count_at_load;
pub(crate) use entries::{ATT_FAST_HEAD, ATT_PIPE, ATT_PIPE_PARTS, ATT_RMMA, ATT_RMMA_ENTRIES};
pub(crate) use exact::att_ex_threads;
pub(crate) use geometry::{
    att_pipe_smem, att_rmma_shape, att_row_stages, att_row_warps, ATT_CLUSTER_MAX, ATT_M3_STAGES,
    ATT_PIPE8_WARPS, ATT_RMMA_CL_MAX, ATT_SPLIT_THREADS, ATT_STAGES, ATT_W_STAGES,
};
pub(crate) use planner::head_dim_supported;
