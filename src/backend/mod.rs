//! The op layer: one `Op` enum describing every kernel the model graphs
//! need, and the `Backend` trait through which they run.
//!
//! Capability is asked, never assumed: `supports_op(op, mode)` is the only
//! source of truth, and dispatch never compares backend names.

pub mod cpu;
pub mod cuda;
mod host_logits;
pub use host_logits::HostLogits;
pub mod tp;
pub mod validate;

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

/// How the paged KV cache stores a head's row of `head_dim` values, in
/// 16-bit units (`--kv-type`). The block types are ggml's blocks of 32
/// values, byte for byte (little-endian units): Q8_0 an f16 scale then 32
/// i8 (17 units), Q4_0 an f16 scale then 16 bytes of nibbles, value i in
/// the low nibble of byte i and value i + 16 in its high nibble (9 units).
/// Written by ggml's reference quantizers; read as `scale * q` (exact in
/// f32), so every backend reads the same values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvType {
    #[default]
    F16,
    Q8_0,
    Q4_0,
}

impl KvType {
    /// The weight type whose blocks this type stores.
    pub fn ggml(self) -> GgmlType {
        match self {
            KvType::F16 => GgmlType::F16,
            KvType::Q8_0 => GgmlType::Q8_0,
            KvType::Q4_0 => GgmlType::Q4_0,
        }
    }

    /// 16-bit units of one head's row of `head_dim` values (the block types
    /// need a multiple of 32: [`KvType::check`]).
    pub fn row_units(self, head_dim: usize) -> usize {
        match self {
            KvType::F16 => head_dim,
            KvType::Q8_0 => head_dim / 32 * 17,
            KvType::Q4_0 => head_dim / 32 * 9,
        }
    }

    /// An error unless rows of `head_dim` values fit this type.
    pub fn check(self, head_dim: usize) -> anyhow::Result<()> {
        if self != KvType::F16 && !head_dim.is_multiple_of(32) {
            anyhow::bail!(
                "--kv-type {self}: head_dim {head_dim} is not a multiple of 32 (its block);                  use --kv-type f16"
            );
        }
        Ok(())
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        })
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f16" => Ok(KvType::F16),
            "q8_0" => Ok(KvType::Q8_0),
            "q4_0" => Ok(KvType::Q4_0),
            other => Err(format!(
                "unknown KV cache type '{other}' (expected f16, q8_0 or q4_0)"
            )),
        }
    }
}

/// One layer's paged K or V storage.
/// `k`, `v`: (n_blocks, block_size, n_kv_heads, ty.row_units(head_dim))
/// 16-bit units (f16 values, or `ty`'s blocks).
pub struct KvLayerMut<'a> {
    pub k: &'a mut [f16],
    pub v: &'a mut [f16],
    pub block_size: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ty: KvType,
}

/// Read-only view of one layer's paged K/V (layout of [`KvLayerMut`]).
#[derive(Clone, Copy)]
pub struct KvLayer<'a> {
    pub k: &'a [f16],
    pub v: &'a [f16],
    pub block_size: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ty: KvType,
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

/// What shapes a paged attention's scores beyond `q·k * scale` and the
/// causal mask, for a query row at position P and head h (the canonical
/// order is in `cpu::ops::attention`). `none()` is plain causal attention.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnOpts<P> {
    /// Sliding window: only keys j with `P - j < window` are visible (0:
    /// every key up to P). Blocks wholly before the window are never read,
    /// so their table entries may name any valid block.
    pub window: u32,
    /// Logit softcap: `s = softcap * tanh(s / softcap)` (0: off).
    pub softcap: f32,
    /// ALiBi slopes (n_heads,): `s += slope[h] * (j - P)` ([`alibi_slopes`]).
    pub alibi: Option<P>,
    /// Learned sink logits (n_heads,): one more term of the softmax's
    /// denominator, with no value (gpt-oss).
    pub sinks: Option<P>,
}

impl<P> AttnOpts<P> {
    /// Plain causal attention.
    pub const fn none() -> Self {
        AttnOpts {
            window: 0,
            softcap: 0.0,
            alibi: None,
            sinks: None,
        }
    }

    /// No window, softcap, ALiBi or sinks.
    pub fn is_plain(&self) -> bool {
        self.window == 0 && self.softcap == 0.0 && self.alibi.is_none() && self.sinks.is_none()
    }

    /// The same options over other parameter handles.
    pub fn map<Q>(self, mut f: impl FnMut(P) -> Q) -> AttnOpts<Q> {
        AttnOpts {
            window: self.window,
            softcap: self.softcap,
            alibi: self.alibi.map(&mut f),
            sinks: self.sinks.map(&mut f),
        }
    }
}

/// ALiBi slopes of `n_heads` heads for `max_bias` (as ggml and the ALiBi
/// paper define them): with `n = 2^floor(log2(n_heads))`, head h < n
/// gets `2^(-max_bias (h + 1) / n)`, head h >= n gets
/// `2^(-max_bias (2 (h - n) + 1) / (2 n))`. Computed in f64 and rounded
/// once, so every backend reads the same f32 slopes.
pub fn alibi_slopes(n_heads: usize, max_bias: f32) -> Vec<f32> {
    let n = if n_heads == 0 {
        1
    } else {
        1usize << (usize::BITS - 1 - n_heads.leading_zeros())
    };
    let b = max_bias as f64;
    (0..n_heads)
        .map(|h| {
            let e = if h < n {
                -b * (h + 1) as f64 / n as f64
            } else {
                -b * (2 * (h - n) + 1) as f64 / (2 * n) as f64
            };
            2f64.powf(e) as f32
        })
        .collect()
}

/// Where an op's tensors live. Each backend's ops are written over one
/// memory space: `Host` (plain slices; the `cpu` backend, the parity
/// harness) or a device space (`cuda::Dev`: device buffers, so a whole
/// step runs without a host round trip). One `OpT` enum serves all spaces,
/// so a new op must be answered by every backend in every space.
pub trait Mem: 'static {
    /// Read-only f32 activation.
    type In<'a>;
    /// Written f32 activation.
    type Out<'a>;
    /// u32 index vector (token ids, positions, slots, rows).
    type Idx<'a>;
    /// f32 parameter vector (norm weights, biases, RoPE frequencies).
    type Param<'a>;
    /// A weight matrix in its stored type.
    type W<'a>: WeightInfo;
    /// One layer of the paged KV cache, read-only / written.
    type Kv<'a>: KvInfo;
    type KvMut<'a>: KvInfo;
    /// The attention batch (block tables, row -> sequence, positions).
    type Batch<'a>;
}

/// Shape of a weight matrix, whatever memory holds it.
pub trait WeightInfo {
    fn ty(&self) -> GgmlType;
    fn rows(&self) -> usize;
    fn cols(&self) -> usize;
    /// Bytes of the stored matrix.
    fn data_len(&self) -> usize;
}

/// Geometry of one KV layer: (block_size, n_kv_heads, head_dim), and how
/// it stores a row.
pub trait KvInfo {
    fn geometry(&self) -> (usize, usize, usize);
    fn kv_type(&self) -> KvType;
}

/// Host memory: the types every op had before device spaces existed.
pub struct Host;

impl Mem for Host {
    type In<'a> = &'a [f32];
    type Out<'a> = &'a mut [f32];
    type Idx<'a> = &'a [u32];
    type Param<'a> = &'a [f32];
    type W<'a> = QMatrix<'a>;
    type Kv<'a> = KvLayer<'a>;
    type KvMut<'a> = KvLayerMut<'a>;
    type Batch<'a> = AttnBatch<'a>;
}

impl WeightInfo for QMatrix<'_> {
    fn ty(&self) -> GgmlType {
        self.ty
    }
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

impl KvInfo for KvLayer<'_> {
    fn geometry(&self) -> (usize, usize, usize) {
        (self.block_size, self.n_kv_heads, self.head_dim)
    }
    fn kv_type(&self) -> KvType {
        self.ty
    }
}

impl KvInfo for KvLayerMut<'_> {
    fn geometry(&self) -> (usize, usize, usize) {
        (self.block_size, self.n_kv_heads, self.head_dim)
    }
    fn kv_type(&self) -> KvType {
        self.ty
    }
}

/// Every op a model graph may issue, over memory space `M`. Matched
/// exhaustively by each backend (no `_ =>` arm), so a new op fails to
/// compile until every backend answers.
pub enum OpT<'a, M: Mem> {
    /// out = x · wᵀ. x: (n, w.cols), out: (n, w.rows).
    MatMul {
        w: M::W<'a>,
        x: M::In<'a>,
        n: usize,
        out: M::Out<'a>,
    },
    /// Several matmuls of one input x (n, k), as one op so that a backend
    /// may run them in one launch (q/k/v, gate/up) and fold a residual add
    /// into the output write. Job j: out_j (n, w_j.rows) = x · w_jᵀ, or with
    /// `add`, out_j += x · w_jᵀ (the finished product added once: the bits
    /// of MatMul then Add). Every job has the same weight type and k; at
    /// most [`MAX_MAT_JOBS`] jobs.
    ///
    /// `norm`: the products read rms_norm(x) (as `RmsNorm` with dim = k
    /// and the norm's weights and eps) instead of x, with the bits of
    /// `RmsNorm` then `MatMuls` in every mode (one exception in `fast`:
    /// `next_norm` below); the norm's `out` (n, k) is
    /// scratch for the normalized rows, its contents afterwards
    /// unspecified (a backend may fold the norm into the products and
    /// never write it).
    ///
    /// `next_norm` (weights (dim,), eps): a hint that the output of the
    /// op's one adding job (the residual stream, (n, dim)) is the input of
    /// the next op, a `MatMuls` whose `norm` has these weights and eps. It
    /// changes no result of this op. In `fast` mode a backend may use it
    /// to prepare that op's input as it stores this output (CUDA, one row,
    /// residual rows of at most 1,024 values or tuning `matvec.norm_ahead`: the
    /// int8 blocks of x * w and the row's sums of squares, the 1/rms scale
    /// then applied after the next op's products);
    /// the next op then does not give the bits of `RmsNorm` then `MatMuls`
    /// (docs/DETERMINISM.md). Ignored in `exact` and `deterministic`.
    ///
    /// `glu` (n, m): after the products, glu = silu(out_0) * out_1, the
    /// FFN's SwiGlu of jobs 0 (gate) and 1 (up), two jobs of one shape,
    /// neither adding; the bits of `MatMuls` then `SwiGlu` in every mode (a
    /// backend may compute it in the products' epilogue).
    MatMuls {
        x: M::In<'a>,
        n: usize,
        jobs: Vec<MatJob<'a, M>>,
        norm: Option<MatNorm<'a, M>>,
        next_norm: Option<(M::Param<'a>, f32)>,
        glu: Option<M::Out<'a>>,
    },
    /// Row-wise RMS norm. x, out: (n, dim); w: (dim,).
    RmsNorm {
        x: M::In<'a>,
        w: M::Param<'a>,
        dim: usize,
        eps: f32,
        out: M::Out<'a>,
    },
    /// Rotary embedding in place. x: (n, n_heads, head_dim); positions:
    /// (n,); inv_freq: (rope_dim / 2,). `neox` rotates pairs (i, i + d/2)
    /// instead of (2i, 2i + 1).
    Rope {
        x: M::Out<'a>,
        n_heads: usize,
        head_dim: usize,
        rope_dim: usize,
        positions: M::Idx<'a>,
        inv_freq: M::Param<'a>,
        neox: bool,
    },
    /// Rope on q and on k in place (each as `Rope`), then k and v stored
    /// into the cache cells `slots` (as `KvWrite`): one op so that a
    /// backend can do it in one pass. q: (n, n_heads, head_dim); k, v:
    /// (n, n_kv_heads, head_dim) with the cache's n_kv_heads and head_dim;
    /// positions, slots: (n,).
    RopeKvWrite {
        q: M::Out<'a>,
        k: M::Out<'a>,
        v: M::In<'a>,
        n_heads: usize,
        rope_dim: usize,
        positions: M::Idx<'a>,
        inv_freq: M::Param<'a>,
        neox: bool,
        slots: M::Idx<'a>,
        cache: M::KvMut<'a>,
    },
    /// out = silu(gate) * up, elementwise.
    SwiGlu {
        gate: M::In<'a>,
        up: M::In<'a>,
        out: M::Out<'a>,
    },
    /// Embedding lookup: out (ids.len(), table.cols) = dequantized rows.
    GetRows {
        table: M::W<'a>,
        ids: M::Idx<'a>,
        out: M::Out<'a>,
    },
    /// Row gather of an activation: out (rows.len(), dim) = x[rows[i]].
    /// Picks the rows that go through the output head.
    SelectRows {
        x: M::In<'a>,
        dim: usize,
        rows: M::Idx<'a>,
        out: M::Out<'a>,
    },
    /// x += y, elementwise (residual).
    Add { x: M::Out<'a>, y: M::In<'a> },
    /// x (n, dim) += bias (dim,) on every row.
    AddBias { x: M::Out<'a>, bias: M::Param<'a> },
    /// Store k, v (n, n_kv_heads, head_dim) into physical cells `slots`
    /// (n,), which must be distinct.
    KvWrite {
        k: M::In<'a>,
        v: M::In<'a>,
        slots: M::Idx<'a>,
        cache: M::KvMut<'a>,
    },
    /// Causal attention reading K/V through the block tables in place.
    /// q, out: (n_rows, n_heads, head_dim); GQA: head h reads kv head
    /// h / (n_heads / n_kv_heads); `opts` adds a sliding window, a softcap,
    /// ALiBi or sinks.
    PagedAttention {
        q: M::In<'a>,
        n_heads: usize,
        scale: f32,
        cache: M::Kv<'a>,
        batch: M::Batch<'a>,
        /// Window, softcap, ALiBi slopes and sinks (n_heads,).
        opts: AttnOpts<M::Param<'a>>,
        out: M::Out<'a>,
    },
    // Hybrid (Gated DeltaNet) layers. Recurrent state lives in per-layer
    // arrays of `n_slots` slots; `row_slots` (n,) names each row's slot.
    // Rows of one slot are consecutive and in position order, so a slot's
    // state advances row by row (a step may hold several slots).
    /// Depthwise causal conv over time then SiLU, per channel:
    /// out[t][c] = silu(sum_i w[c][i] * window_c[i]), the window being the
    /// slot's last K-1 raw inputs then x[t][c]; the raw input is shifted into
    /// the state. x, out: (n, channels); w: (channels * kernel,), row c
    /// holds the taps oldest first; state: (n_slots, (kernel - 1) * channels).
    Conv1dSilu {
        x: M::In<'a>,
        w: M::Param<'a>,
        channels: usize,
        kernel: usize,
        row_slots: M::Idx<'a>,
        state: M::Out<'a>,
        out: M::Out<'a>,
    },
    /// In place, the first `n_heads` heads of `head_dim` of every row of
    /// `row_len` values: v / max(||v||, eps) (ggml's L2 norm).
    L2NormHeads {
        x: M::Out<'a>,
        row_len: usize,
        n_heads: usize,
        head_dim: usize,
        eps: f32,
    },
    /// The gates of a Gated DeltaNet layer: g = softplus(a + dt_bias) *
    /// ssm_a, beta = sigmoid(b). a, b, g, beta: (n, h_v); dt_bias, ssm_a:
    /// (h_v,).
    GdnGates {
        a: M::In<'a>,
        b: M::In<'a>,
        dt_bias: M::Param<'a>,
        ssm_a: M::Param<'a>,
        g: M::Out<'a>,
        beta: M::Out<'a>,
    },
    /// The gated delta rule, recurrent form, row by row per slot. qkv: (n,
    /// 2 * h_k * d_k + h_v * d_v) = [q | k | v], q and k L2-normalized, q
    /// unscaled (the op scales by 1/sqrt(d_k)); value head h reads key head
    /// h % h_k; g, beta: (n, h_v); state: (n_slots, h_v * d_k * d_v);
    /// out: (n, h_v * d_v).
    DeltaRule {
        qkv: M::In<'a>,
        g: M::In<'a>,
        beta: M::In<'a>,
        h_k: usize,
        h_v: usize,
        d_k: usize,
        d_v: usize,
        row_slots: M::Idx<'a>,
        state: M::Out<'a>,
        out: M::Out<'a>,
    },
    /// Per head of `head_dim`: out = rms_norm(x) * w * silu(z). x, z, out:
    /// (n, heads * head_dim); w: (head_dim,).
    GatedRmsNorm {
        x: M::In<'a>,
        z: M::In<'a>,
        w: M::Param<'a>,
        head_dim: usize,
        eps: f32,
        out: M::Out<'a>,
    },
    /// Splits rows of heads holding two halves: x (n, heads, 2 * head_dim)
    /// -> a, b (n, heads, head_dim) (the first and second half of each head).
    SplitHeads {
        x: M::In<'a>,
        head_dim: usize,
        a: M::Out<'a>,
        b: M::Out<'a>,
    },
    /// x *= sigmoid(gate), elementwise (gated attention output).
    SigmoidMul { x: M::Out<'a>, gate: M::In<'a> },
    /// Tensor parallel (`backend::tp`): gathers every rank's x (n, w) along the last
    /// dimension, out (n, world * w) with rank r's part at columns
    /// `[r * w, (r + 1) * w)`; with `add`, added to out (one rounding per
    /// element, the bits of `Add`). Through the backend's communicator.
    AllGather {
        x: M::In<'a>,
        n: usize,
        out: M::Out<'a>,
        add: bool,
    },
    /// Tensor parallel (`backend::tp`): out += Σ_r x_r over every rank's partial x
    /// (out's shape), summed in `order`.
    AllReduce {
        x: M::In<'a>,
        out: M::Out<'a>,
        order: crate::backend::tp::ReduceOrder,
    },
}

/// Most jobs of one `MatMuls` op (the kernels' job table holds this many).
pub const MAX_MAT_JOBS: usize = 4;

/// One matmul of a [`OpT::MatMuls`]: weight, output, and whether the product
/// is added into `out` instead of replacing it.
pub struct MatJob<'a, M: Mem> {
    pub w: M::W<'a>,
    pub out: M::Out<'a>,
    pub add: bool,
}

/// The RMS norm a [`OpT::MatMuls`] applies to its input first: weights
/// (k,), eps, and scratch `out` (n, k) for the normalized rows.
pub struct MatNorm<'a, M: Mem> {
    pub w: M::Param<'a>,
    pub eps: f32,
    pub out: M::Out<'a>,
}

/// Host-memory ops (the `cpu` backend, the parity harness).
pub type Op<'a> = OpT<'a, Host>;

/// What capability depends on, whatever memory the op's tensors live in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpInfo {
    pub kind: &'static str,
    /// Weight type of mat_mul / get_rows.
    pub weight: Option<GgmlType>,
    /// head_dim of paged_attention.
    pub head_dim: Option<usize>,
    /// How the KV cache of kv_write, rope_kv_write and paged_attention
    /// stores its rows (None: not a KV op, or the model-level question).
    pub kv: Option<KvType>,
}

impl<M: Mem> OpT<'_, M> {
    pub fn kind(&self) -> &'static str {
        self.info().kind
    }

    pub fn info(&self) -> OpInfo {
        let (kind, weight, head_dim, kv) = match self {
            OpT::MatMul { w, .. } => ("mat_mul", Some(w.ty()), None, None),
            // Every job has the same type (validate::mat_muls).
            OpT::MatMuls { jobs, .. } => ("mat_muls", jobs.first().map(|j| j.w.ty()), None, None),
            OpT::RmsNorm { .. } => ("rms_norm", None, None, None),
            OpT::Rope { .. } => ("rope", None, None, None),
            OpT::RopeKvWrite { cache, .. } => ("rope_kv_write", None, None, Some(cache.kv_type())),
            OpT::SwiGlu { .. } => ("swiglu", None, None, None),
            OpT::GetRows { table, .. } => ("get_rows", Some(table.ty()), None, None),
            OpT::SelectRows { .. } => ("select_rows", None, None, None),
            OpT::Add { .. } => ("add", None, None, None),
            OpT::AddBias { .. } => ("add_bias", None, None, None),
            OpT::KvWrite { cache, .. } => ("kv_write", None, None, Some(cache.kv_type())),
            OpT::PagedAttention { cache, .. } => (
                "paged_attention",
                None,
                Some(cache.geometry().2),
                Some(cache.kv_type()),
            ),
            OpT::Conv1dSilu { .. } => ("conv1d_silu", None, None, None),
            OpT::L2NormHeads { .. } => ("l2_norm_heads", None, None, None),
            OpT::GdnGates { .. } => ("gdn_gates", None, None, None),
            OpT::DeltaRule { .. } => ("delta_rule", None, None, None),
            OpT::GatedRmsNorm { .. } => ("gated_rms_norm", None, None, None),
            OpT::SplitHeads { .. } => ("split_heads", None, None, None),
            OpT::SigmoidMul { .. } => ("sigmoid_mul", None, None, None),
            OpT::AllGather { .. } => ("all_gather", None, None, None),
            OpT::AllReduce { .. } => ("all_reduce", None, None, None),
        };
        OpInfo {
            kind,
            weight,
            head_dim,
            kv,
        }
    }
}

/// A compute backend over memory space `M` (host slices by default).
pub trait Backend<M: Mem = Host>: Send + Sync {
    fn name(&self) -> &'static str;
    /// Whether this backend can run `op` in `mode`. The only capability query.
    fn supports_op(&self, op: &OpT<'_, M>, mode: Mode) -> bool;
    /// Runs `op`. Errors name the op and the shapes involved.
    fn run(&self, op: OpT<'_, M>, mode: Mode) -> anyhow::Result<()>;
}
