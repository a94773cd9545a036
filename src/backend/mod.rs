//! The op layer: one `Op` enum describing every kernel the model graphs
//! need, and the `Backend` trait through which they run.
//!
//! Capability is asked, never assumed: `supports_op(op, mode)` is the only
//! source of truth, and dispatch never compares backend names.

pub mod cpu;
pub mod validate;
// --- CUDA backend (h-cuda) ---
pub mod cuda;

use crate::quant::GgmlType;
use half::f16;

/// Execution mode (see docs/DETERMINISM.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Fastest kernels; run-to-run deterministic for the same batch.
    Fast,
    /// Also batch-invariant and KV-cache invariant.
    Deterministic,
    /// Also bitwise equal to the `cpu` backend.
    #[default]
    Exact,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fast" => Ok(Mode::Fast),
            "deterministic" => Ok(Mode::Deterministic),
            "exact" => Ok(Mode::Exact),
            other => Err(format!(
                "unknown mode '{other}' (expected fast, deterministic or exact)"
            )),
        }
    }
}

// --- CUDA backend (h-cuda): the GPU-use contract ---
/// Whether and how a GPU backend is used (`--gpu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum GpuMode {
    /// Never touch a device.
    #[default]
    Off,
    /// Use the GPU where it can run an op; fall back to the CPU otherwise
    /// (no device, compile failure, unsupported op, device error) and say so.
    Auto,
    /// Every op on the GPU; any fallback is an error naming the op and why.
    Required,
}

impl std::str::FromStr for GpuMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(GpuMode::Off),
            "auto" => Ok(GpuMode::Auto),
            "required" => Ok(GpuMode::Required),
            other => Err(format!(
                "unknown gpu mode '{other}' (expected off, auto or required)"
            )),
        }
    }
}
// --- end CUDA backend additions ---

/// A weight matrix in its stored (possibly quantized) form.
/// `data`: (rows, cols) row-major, each row `ty.row_bytes(cols)` bytes.
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    pub ty: GgmlType,
    /// Output features (m).
    pub rows: usize,
    /// Input features (k); a multiple of `ty.block_size()`.
    pub cols: usize,
    pub data: &'a [u8],
}

/// One layer's paged K or V storage.
/// `k`, `v`: (n_blocks, block_size, n_kv_heads, head_dim), f16.
pub struct KvLayerMut<'a> {
    pub k: &'a mut [f16],
    pub v: &'a mut [f16],
    pub block_size: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// Read-only view of one layer's paged K/V.
#[derive(Clone, Copy)]
pub struct KvLayer<'a> {
    pub k: &'a [f16],
    pub v: &'a [f16],
    pub block_size: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// The attention batch: which sequence each query row belongs to, its
/// absolute position, and every sequence's block table. Query row `i`
/// attends to keys at positions `0..=positions[i]` of sequence
/// `row_seq[i]`, reading physical cell `table[j / B] * B + j % B`.
#[derive(Clone, Copy)]
pub struct AttnBatch<'a> {
    /// One block table per sequence in the step (physical block ids).
    pub block_tables: &'a [&'a [u32]],
    /// (n_rows,) index into `block_tables`.
    pub row_seq: &'a [u32],
    /// (n_rows,) absolute position of each query row.
    pub positions: &'a [u32],
}

/// Every op a model graph may issue. Matched exhaustively by each backend
/// (no `_ =>` arm), so a new op fails to compile until every backend answers.
pub enum Op<'a> {
    /// out = x · wᵀ. x: (n, w.cols), out: (n, w.rows).
    MatMul {
        w: QMatrix<'a>,
        x: &'a [f32],
        n: usize,
        out: &'a mut [f32],
    },
    /// Row-wise RMS norm. x, out: (n, dim); w: (dim,).
    RmsNorm {
        x: &'a [f32],
        w: &'a [f32],
        dim: usize,
        eps: f32,
        out: &'a mut [f32],
    },
    /// Rotary embedding in place. x: (n, n_heads, head_dim); positions:
    /// (n,); inv_freq: (rope_dim / 2,). `neox` rotates pairs (i, i + d/2)
    /// instead of (2i, 2i + 1).
    Rope {
        x: &'a mut [f32],
        n_heads: usize,
        head_dim: usize,
        rope_dim: usize,
        positions: &'a [u32],
        inv_freq: &'a [f32],
        neox: bool,
    },
    /// out = silu(gate) * up, elementwise.
    SwiGlu {
        gate: &'a [f32],
        up: &'a [f32],
        out: &'a mut [f32],
    },
    /// Embedding lookup: out (ids.len(), table.cols) = dequantized rows.
    GetRows {
        table: QMatrix<'a>,
        ids: &'a [u32],
        out: &'a mut [f32],
    },
    /// x += y, elementwise (residual).
    Add { x: &'a mut [f32], y: &'a [f32] },
    /// x (n, dim) += bias (dim,) on every row.
    AddBias { x: &'a mut [f32], bias: &'a [f32] },
    /// Store k, v (n, n_kv_heads, head_dim) into physical cells `slots` (n,).
    KvWrite {
        k: &'a [f32],
        v: &'a [f32],
        slots: &'a [u32],
        cache: KvLayerMut<'a>,
    },
    /// Causal attention reading K/V through the block tables in place.
    /// q, out: (n_rows, n_heads, head_dim); GQA: head h reads kv head
    /// h / (n_heads / n_kv_heads).
    PagedAttention {
        q: &'a [f32],
        n_heads: usize,
        scale: f32,
        cache: KvLayer<'a>,
        batch: AttnBatch<'a>,
        out: &'a mut [f32],
    },
}

impl Op<'_> {
    pub fn kind(&self) -> &'static str {
        match self {
            Op::MatMul { .. } => "mat_mul",
            Op::RmsNorm { .. } => "rms_norm",
            Op::Rope { .. } => "rope",
            Op::SwiGlu { .. } => "swiglu",
            Op::GetRows { .. } => "get_rows",
            Op::Add { .. } => "add",
            Op::AddBias { .. } => "add_bias",
            Op::KvWrite { .. } => "kv_write",
            Op::PagedAttention { .. } => "paged_attention",
        }
    }
}

/// A compute backend.
pub trait Backend: Send + Sync {
    fn name(&self) -> &'static str;
    /// Whether this backend can run `op` in `mode`. The only capability query.
    fn supports_op(&self, op: &Op<'_>, mode: Mode) -> bool;
    /// Runs `op`. Errors name the op and the shapes involved.
    fn run(&self, op: Op<'_>, mode: Mode) -> anyhow::Result<()>;
}
