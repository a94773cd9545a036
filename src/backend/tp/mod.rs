//! Tensor parallelism: one model split across ranks, Megatron style.
//!
//! Attention heads and FFN columns are split across ranks; the paged KV
//! cache of each rank holds its own KV heads (same block ids on every rank,
//! so one `KvManager` and one scheduler plan every step). Every rank runs the
//! same step graph over its shard; the ranks meet in two collectives per
//! layer, which are ops of the graph ([`crate::backend::OpT::AllGather`],
//! [`crate::backend::OpT::AllReduce`]) run by the rank's backend through its
//! [`Communicator`].
//!
//! This module is the part the backends need (the trait, the in-process
//! group, the layouts and shapes); the cut of a model is
//! `model/arch/llama_tp.rs`, the ranks themselves `runner/host_ranks.rs`
//! and `dispatch/cuda/ranks.rs`.
//!
//! # The layout follows the mode
//!
//! * `exact` ([`Layout::Gather`]): bitwise equal to one rank and to the cpu.
//!   A row-parallel product (the attention output and FFN down projections)
//!   would split the reduction over k across ranks, and the canonical dot
//!   product (`backend/cpu/canon.rs`: block terms into 8 lanes by block
//!   index, then a tree) cannot be rebuilt from per-rank partial sums. So in
//!   `exact` every product keeps its whole k: the ranks all-gather the
//!   attention output (heads in rank order: the full row) and the SwiGLU
//!   activations, each rank computes its slice of the *output* features of
//!   the projection, and an all-gather adds the slices into the residual
//!   stream. Per layer that is four all-gathers instead of two all-reduces
//!   (about the same bytes as two ring all-reduces; twice the latency).
//! * `deterministic` ([`Layout::Reduce`] with [`ReduceOrder::Fixed`]):
//!   Megatron's row-parallel projections; the partial sums are gathered and
//!   added in rank order, `out + (((p0 + p1) + p2) + ...)`, the same for
//!   every batch and every run.
//! * `fast` ([`Layout::Reduce`] with [`ReduceOrder::Any`]): the
//!   communicator's own all-reduce (NCCL's ring or tree), order unspecified.
//!
//! The in-process communicator ([`local::LocalGroup`]) runs the whole path
//! on the cpu backend with simulated ranks (threads), so CI proves the
//! `exact` claim; its sum is in rank order.

pub mod local;

use crate::backend::{Host, Mem, Mode};
use anyhow::Result;

/// How a rank's collectives reach the other ranks: NCCL's two primitives
/// over a memory space `M`, pure data movement and a sum. The arithmetic
/// around them (the gathered rows interleaved or added, partial sums added
/// in rank order) is the backend's, the same on every backend
/// (`backend/cpu/ops/collective.rs`, `backend/cuda/ops/collective`).
/// Implementations: the in-process [`local::LocalComm`] (host slices,
/// simulated ranks) and the cuda backend's `NcclComm` (device buffers).
///
/// Every rank calls the same collectives in the same order with the same
/// lengths (the step graph is the same on every rank).
pub trait Communicator<M: Mem = Host>: Send + Sync {
    fn rank(&self) -> usize;
    fn world(&self) -> usize;
    /// `parts` (world, x.len()) rank-major: every rank's `x`.
    fn all_gather(&self, x: M::In<'_>, parts: M::Out<'_>) -> Result<()>;
    /// `sum` = Σ_r x_r elementwise, in the communicator's own order.
    fn all_reduce_sum(&self, x: M::In<'_>, sum: M::Out<'_>) -> Result<()>;
}

/// The summation order of an all-reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOrder {
    /// Rank order, the same for every batch and run (`deterministic`).
    Fixed,
    /// Whatever the communicator's all-reduce does (`fast`).
    Any,
}

/// How the row-parallel projections (attention output, FFN down) are split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// By output features, inputs all-gathered: every product keeps its
    /// whole k (`exact`).
    Gather,
    /// By input features (Megatron), partial sums all-reduced.
    Reduce(ReduceOrder),
}

impl Layout {
    pub fn for_mode(mode: Mode) -> Layout {
        match mode {
            Mode::Exact => Layout::Gather,
            Mode::Deterministic => Layout::Reduce(ReduceOrder::Fixed),
            Mode::Fast => Layout::Reduce(ReduceOrder::Any),
        }
    }
}

/// One rank's place in a tensor-parallel group, as its weights record it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TpRank {
    pub rank: usize,
    pub world: usize,
    pub layout: Layout,
    /// Whether this rank computes the output head (every rank holds the
    /// same residual stream). The host ranks: rank 0 alone. The device
    /// ranks: every rank (a decode graph ends in its logits).
    pub head: bool,
}

/// The per-rank shapes of a llama-family model split `world` ways, or an
/// error naming the dimension that does not divide. Pure: tested in tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TpShapes {
    /// Query heads per rank.
    pub n_heads: usize,
    /// KV heads per rank (the KV cache shard).
    pub n_kv_heads: usize,
    /// FFN columns per rank.
    pub ffn_dim: usize,
    /// Output features per rank of the attention-output and down
    /// projections ([`Layout::Gather`]); `dim` otherwise.
    pub out_dim: usize,
}

/// Splits (n_heads, n_kv_heads, head_dim, ffn_dim, dim) `world` ways for
/// `layout`. `block`: the largest block size (in elements) among the
/// weights whose k is split ([`Layout::Reduce`]: attention output and FFN
/// down); a split k must be a whole number of blocks.
pub fn shapes(
    (n_heads, n_kv_heads, head_dim, ffn_dim, dim): (usize, usize, usize, usize, usize),
    world: usize,
    layout: Layout,
    block: usize,
) -> Result<TpShapes> {
    use anyhow::ensure;
    ensure!(
        (1..=64).contains(&world),
        "--tensor-parallel {world}: between 1 and 64 ranks"
    );
    ensure!(
        n_kv_heads % world == 0,
        "--tensor-parallel {world}: the model's {n_kv_heads} KV heads do not split into {world} equal parts (the KV cache is sharded by KV head)"
    );
    ensure!(
        n_heads % world == 0,
        "--tensor-parallel {world}: the model's {n_heads} attention heads do not split into {world} equal parts"
    );
    ensure!(
        ffn_dim % world == 0,
        "--tensor-parallel {world}: the FFN width {ffn_dim} does not split into {world} equal parts"
    );
    let (q_r, f_r) = (n_heads / world * head_dim, ffn_dim / world);
    let out_dim = match layout {
        Layout::Gather => {
            ensure!(
                dim % world == 0,
                "--tensor-parallel {world}: the model width {dim} does not split into {world} equal parts"
            );
            dim / world
        }
        Layout::Reduce(_) => {
            ensure!(
                world == 1 || (q_r % block == 0 && f_r % block == 0),
                "--tensor-parallel {world}: each rank's share of the attention output ({q_r}) and of the FFN ({f_r}) must be a whole number of the weights' {block}-element blocks"
            );
            dim
        }
    };
    Ok(TpShapes {
        n_heads: n_heads / world,
        n_kv_heads: n_kv_heads / world,
        ffn_dim: f_r,
        out_dim,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA8B: (usize, usize, usize, usize, usize) = (32, 8, 128, 14336, 4096);

    #[test]
    fn shapes_split_heads_ffn_and_the_gathered_outputs() {
        let cases = [
            (1, Layout::Gather, (32, 8, 14336, 4096)),
            (2, Layout::Gather, (16, 4, 7168, 2048)),
            (4, Layout::Gather, (8, 2, 3584, 1024)),
            (8, Layout::Gather, (4, 1, 1792, 512)),
            (2, Layout::Reduce(ReduceOrder::Fixed), (16, 4, 7168, 4096)),
            (8, Layout::Reduce(ReduceOrder::Any), (4, 1, 1792, 4096)),
        ];
        for (world, layout, (h, kv, f, o)) in cases {
            let s = shapes(LLAMA8B, world, layout, 256).unwrap();
            assert_eq!(
                s,
                TpShapes {
                    n_heads: h,
                    n_kv_heads: kv,
                    ffn_dim: f,
                    out_dim: o
                },
                "world {world} {layout:?}"
            );
        }
    }

    #[test]
    fn shapes_name_what_does_not_divide() {
        let smollm = (9, 3, 64, 1536, 576);
        let e = shapes(smollm, 2, Layout::Gather, 32).unwrap_err();
        assert!(format!("{e}").contains("3 KV heads"), "{e}");
        let e = shapes(LLAMA8B, 16, Layout::Gather, 32).unwrap_err();
        assert!(format!("{e}").contains("8 KV heads"), "{e}");
        let e = shapes(
            (4, 4, 32, 96, 128),
            4,
            Layout::Reduce(ReduceOrder::Fixed),
            256,
        )
        .unwrap_err();
        assert!(format!("{e}").contains("256-element blocks"), "{e}");
        let e = shapes((4, 2, 32, 96, 129), 2, Layout::Gather, 32).unwrap_err();
        assert!(format!("{e}").contains("width 129"), "{e}");
        assert!(shapes(LLAMA8B, 0, Layout::Gather, 32).is_err());
        // One rank: nothing to split, whatever the blocks.
        assert!(shapes(
            (9, 3, 64, 1536, 576),
            1,
            Layout::Reduce(ReduceOrder::Any),
            256
        )
        .is_ok());
    }

    #[test]
    fn each_mode_has_its_layout() {
        assert_eq!(Layout::for_mode(Mode::Exact), Layout::Gather);
        assert_eq!(
            Layout::for_mode(Mode::Deterministic),
            Layout::Reduce(ReduceOrder::Fixed)
        );
        assert_eq!(
            Layout::for_mode(Mode::Fast),
            Layout::Reduce(ReduceOrder::Any)
        );
    }
}
