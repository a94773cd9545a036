//! One room per op family: its planner (a pure function from the op's
//! shape, the mode, the device's capabilities and the tuning table to the
//! kernel and its geometry), its launchers and its kernel sources
//! (`<family>/kernels/`); and the kernel table of every family
//! (`kernels.rs`), which `device/` compiles and loads. Kernel headers
//! every family includes are in `backend/cuda/kernels/`.
//!
//! Imports go one way: families -> `device/` (launch plumbing, memory);
//! `matmul` is the family others read (its planner says what layout a
//! matmul reads its input in).

pub(crate) mod attention;
pub mod collective;
pub(crate) mod elementwise;
pub(crate) mod gdn;
pub mod kernels;
pub(crate) mod l2_ahead;
pub(crate) mod matmul;
pub(crate) mod norm;
pub(crate) mod sample;

pub(crate) use l2_ahead::{L2Bufs, L2Log};
pub(crate) use matmul::norm_ahead::NormAhead;
pub(crate) use matmul::{fast_uses_blas, mq_smem_max, wg_smem, xm_smem_max, TILE_SMEM};
pub(crate) use sample::{device_draws, draw_record, GreedyRing, DRAW_WORDS, GREEDY_SLOTS};
