//! Fusion as a pass over a step's op list: which op writes its output also
//! in the layout the next matmul reads (prequant: norm -> quantize ->
//! matmul, gate/up -> SwiGLU -> quantize -> down, attention -> quantize ->
//! o), which matmul then finds its input already quantized, and which
//! residual matvec prepares the next op's normalized input (norm-ahead).
//!
//! The pass is pure: it sees the step's ops as [`StepOp`]s, whose buffers
//! are named by the graph ([`BufId`], [`ParamId`]), never by device
//! address, and answers one [`OpFusion`] per op. The device executor
//! records the ops by running the model's graph over a recording
//! executor (dispatch/cuda/step_ops.rs), plans once per step shape, and
//! hands each op its annotation (`CudaBackend::run_fused`): what an op
//! writes for the next op and whether it takes part in norm-ahead are
//! decided here, not from the ops that ran before it.
//!
//! `input_from` is the pass's model of the scratch arena, and the
//! launchers act on it alone (ops/matmul/prepared.rs): a reader so annotated
//! skips preparing its input, so an annotated producer always writes it
//! (where its fused kernel cannot, for a buffer it finds unaligned or a
//! kernel form without the epilogue, the standalone conversion runs
//! after it). Only what a producer can always write is annotated: q8
//! blocks for any rows, wgmma tiles only where the op knows its rows (not
//! a bare `SwiGlu` op).
//!
//! Every fusion here keeps the bits of the unfused sequence except
//! norm-ahead (`fast` only; docs/DETERMINISM.md), whose parity cases are
//! `quire ops --op norm_ahead` and `check-exact --mode fast-norm-ahead`;
//! the prequant forms are checked by `check-exact --mode fast` against
//! `matvec.prequant=false`.
//!
//! What a matmul reads ([`ActRead`]) is the matmul planner's answer for
//! the op (mode, rows, weight type, k); the pass takes it as given, so
//! this module decides fusions only, never a matmul's kernel.

use super::tuning::{MatvecTuning, Switch};
use crate::backend::Mode;
use crate::quant::GgmlType;

/// An activation buffer of the step, named by the graph.
pub type BufId = u32;
/// A parameter of the model (norm weights), named by the graph (its
/// identity while the step's op list is taken).
pub type ParamId = usize;

/// The activation layout a matmul reads its input in, which it writes
/// into the scratch arena itself unless an earlier op left it there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActRead {
    /// quant_q8's int8 blocks and float2 scales (the warp-per-row
    /// matvecs, mm_q8_mma: `deterministic`, and `fast` at decode rows).
    Q8,
    /// quant_act32's canonical rows (`exact`).
    Canon,
    /// f16 rows (the tile kernel, the cuBLAS path).
    F16,
    /// to_f16_wr's tiles (the wgmma prefill GEMM, sm_90).
    F16Wr,
    /// Float weights: nothing prepared.
    Raw,
}

/// One job of a [`MatOp`]: its rows, whether it adds into its output, and
/// the output buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobDesc {
    pub m: usize,
    pub add: bool,
    pub out: BufId,
}

/// An op's input norm (`OpT::MatMuls::norm`): weights, eps bits, scratch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NormDesc {
    pub w: ParamId,
    pub eps: u32,
    pub scratch: BufId,
}

/// A `MatMuls` op as the pass sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatOp {
    /// Input (n, k).
    pub x: BufId,
    pub n: usize,
    pub k: usize,
    pub ty: GgmlType,
    pub jobs: Vec<JobDesc>,
    pub norm: Option<NormDesc>,
    /// `OpT::MatMuls::next_norm`: (weights, eps bits).
    pub next_norm: Option<(ParamId, u32)>,
    /// The SwiGlu's output (n, m) where the op carries one.
    pub glu: Option<BufId>,
    /// What its products read (the matmul planner's answer).
    pub reads: ActRead,
}

/// One op of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepOp {
    MatMuls(MatOp),
    /// out (n, dim) = rms_norm(x).
    RmsNorm {
        out: BufId,
        n: usize,
        dim: usize,
    },
    /// out (len values) = silu(gate) * up.
    SwiGlu {
        out: BufId,
        len: usize,
    },
    /// out (n, width): the attention's output rows.
    PagedAttention {
        out: BufId,
        n: usize,
        width: usize,
    },
    /// Any other op (get_rows, select_rows, add_bias, rope_kv_write, ...).
    Other {
        kind: &'static str,
    },
}

/// How one op runs fused with its neighbours.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpFusion {
    /// A `MatMuls` with a norm: the norm writes the normalized rows also
    /// in this layout (Q8 or F16Wr), which the op's own products read.
    pub norm_for_self: Option<ActRead>,
    /// The op's output (a norm's, a SwiGlu's or a `MatMuls`' glu, the
    /// attention's) is written also in this layout (Q8 or F16Wr) for the
    /// matmul of the next op, which reads it.
    pub out_for_next: Option<ActRead>,
    /// A `MatMuls` whose products find their input already prepared in
    /// the arena, by this op (its own norm, or an earlier op).
    pub input_from: Option<usize>,
    /// Norm-ahead's producer: the op's one adding job also quantizes
    /// x * g and stores the blocks' sums of squares for the next op.
    pub ahead_producer: bool,
    /// Norm-ahead's consumer: the op's norm is skipped and its products
    /// read the previous op's blocks.
    pub ahead_consumer: bool,
}

/// The annotations of a step's ops, by op index.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepFusion {
    pub ops: Vec<OpFusion>,
}

/// The widest residual row (values) that norm-ahead takes by default.
/// Measured on an H200 after 512 tokens: SmolLM2 (576) +5-7%, the 1B
/// (2,048) -15%, the 8B (4,096) -11% (ops/matmul/norm_ahead.rs).
pub const NORM_AHEAD_MAX_DIM: usize = 1024;

/// Whether a producer of `dim` residual values runs norm-ahead: the
/// tuning switch, or rows of at most NORM_AHEAD_MAX_DIM.
pub fn norm_ahead_rule(switch: Switch, dim: usize) -> bool {
    switch.or(dim <= NORM_AHEAD_MAX_DIM)
}

/// Norm-ahead producer's entry for rows of `k` and a residual of `m`
/// (kernels/matmul_fast.cu): (name, threads per CTA, rows per CTA, CTAs
/// per cluster). With clusters (sm_90+, tuning `matvec.norm_ahead_clusters`)
/// 4 CTAs of 8 rows share a block, a warp per row or, for long rows
/// (k >= 3 m, the down projection: mv_warps' rule), two; else one CTA of
/// 1,024 threads owns the block's 32 rows.
pub fn producer_form(clusters: bool, k: usize, m: usize) -> (&'static str, u32, usize, u32) {
    match (clusters, k >= 3 * m) {
        (false, _) => ("mv_q8_r1_na", 1024, 32, 1),
        (true, false) => ("mv_q8_r1_na_c4", 256, 8, 4),
        (true, true) => ("mv_q8_r1_na_w2c4", 512, 8, 4),
    }
}

/// Whether a weight type runs through the int8 matvecs (not a float type).
fn q8_type(ty: GgmlType) -> bool {
    !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// Whether an elementwise producer of `len` values in rows of `k` may
/// write `read` for a matmul in `mode`: q8 blocks outside `exact` (whole
/// 32-value blocks of whole rows), wgmma tiles in `fast` (k a multiple of
/// 256). Alignment of the device buffers is the launcher's to handle (the
/// plain kernel then the standalone conversion, the same bits).
fn producible(read: ActRead, mode: Mode, len: usize, k: usize) -> bool {
    let rows_ok = len > 0 && k > 0 && len.is_multiple_of(k);
    match read {
        ActRead::Q8 => mode != Mode::Exact && rows_ok && k.is_multiple_of(32),
        ActRead::F16Wr => mode == Mode::Fast && rows_ok && k.is_multiple_of(256),
        ActRead::Canon | ActRead::F16 | ActRead::Raw => false,
    }
}

/// The layout the op right after `i` reads `buf` in (a `MatMuls` without a
/// norm on `buf`), with its k.
fn next_reader(ops: &[StepOp], i: usize, buf: BufId) -> Option<(ActRead, usize)> {
    match ops.get(i + 1)? {
        StepOp::MatMuls(m) if m.norm.is_none() && m.x == buf => Some((m.reads, m.k)),
        _ => None,
    }
}

/// Whether `op` (at i) is norm-ahead's producer for `next` (at i + 1).
fn ahead_pair(op: &MatOp, next: Option<&StepOp>, mode: Mode, t: &MatvecTuning) -> bool {
    let [job] = op.jobs.as_slice() else {
        return false;
    };
    let Some((g, eps)) = op.next_norm else {
        return false;
    };
    let producer = mode == Mode::Fast
        && op.norm.is_none()
        && op.n == 1
        && job.add
        && q8_type(op.ty)
        && op.k > 0
        && op.k.is_multiple_of(32)
        && job.m > 0
        && job.m.is_multiple_of(32)
        && norm_ahead_rule(t.norm_ahead, job.m);
    let consumer = match next {
        Some(StepOp::MatMuls(c)) => {
            c.x == job.out
                && c.n == 1
                && c.k == job.m
                && c.norm.is_some_and(|nd| nd.w == g && nd.eps == eps)
                && q8_type(c.ty)
        }
        _ => false,
    };
    producer && consumer
}

/// The pass: one annotation per op of `ops` in `mode` under `t`.
pub fn plan(ops: &[StepOp], mode: Mode, t: &MatvecTuning) -> StepFusion {
    let mut out = vec![OpFusion::default(); ops.len()];
    // What the arena holds prepared: (buffer, layout, the op that wrote
    // it). Only this pass's model of it: the launchers act on the
    // annotations.
    let mut arena: Option<(BufId, ActRead, usize)> = None;
    for (i, op) in ops.iter().enumerate() {
        let consumer = i > 0 && out[i - 1].ahead_producer;
        let f = &mut out[i];
        match op {
            StepOp::MatMuls(m) => {
                if consumer {
                    // Norm-ahead's consumer: no norm, no arena write (a
                    // SwiGlu rewrites it below).
                    f.ahead_consumer = true;
                } else {
                    let input = match m.norm {
                        Some(nd) => {
                            // The norm rewrites its scratch and the arena.
                            arena = None;
                            if t.prequant && producible(m.reads, mode, m.n * m.k, m.k) {
                                f.norm_for_self = Some(m.reads);
                                arena = Some((nd.scratch, m.reads, i));
                            }
                            nd.scratch
                        }
                        None => m.x,
                    };
                    if let Some((b, l, from)) = arena {
                        if b == input && l == m.reads {
                            f.input_from = Some(from);
                        }
                    }
                    // After the products the arena holds their input's
                    // layout, unless an output overwrote the input or the
                    // weights are float (nothing prepared).
                    let clobbered = m.jobs.iter().any(|j| j.out == input);
                    arena = match m.reads {
                        ActRead::Raw => None,
                        _ if clobbered => None,
                        r => Some((input, r, f.input_from.unwrap_or(i))),
                    };
                }
                f.ahead_producer = ahead_pair(m, ops.get(i + 1), mode, t);
                if let Some(g) = m.glu {
                    // The SwiGlu after the products rewrites the arena.
                    arena = None;
                    let len = m.n * m.jobs.first().map_or(0, |j| j.m);
                    elementwise(ops, i, (g, len, true), f, &mut arena, mode, t);
                }
            }
            StepOp::RmsNorm { out: b, n, dim } => {
                arena = None;
                elementwise(ops, i, (*b, n * dim, true), f, &mut arena, mode, t);
            }
            StepOp::SwiGlu { out: b, len } => {
                arena = None;
                // No rows: q8 blocks only (the tiles need the rows).
                elementwise(ops, i, (*b, *len, false), f, &mut arena, mode, t);
            }
            StepOp::PagedAttention { out: b, n, width } => {
                arena = None;
                elementwise(ops, i, (*b, n * width, true), f, &mut arena, mode, t);
            }
            StepOp::Other { .. } => arena = None,
        }
    }
    StepFusion { ops: out }
}

/// An elementwise op writing `len` values of `buf` (`rows`: whether the
/// op knows its rows): prequant for the next op's matmul where it reads
/// `buf` in a layout this op can write.
fn elementwise(
    ops: &[StepOp],
    i: usize,
    (buf, len, rows): (BufId, usize, bool),
    f: &mut OpFusion,
    arena: &mut Option<(BufId, ActRead, usize)>,
    mode: Mode,
    t: &MatvecTuning,
) {
    if let Some((read, k)) = next_reader(ops, i, buf) {
        let tiles_ok = rows || read != ActRead::F16Wr;
        if t.prequant && tiles_ok && producible(read, mode, len, k) {
            f.out_for_next = Some(read);
            *arena = Some((buf, read, i));
        }
    }
}

#[cfg(test)]
#[path = "fusion_tests.rs"]
pub(crate) mod tests;
