//! Per-op backend choice. Asks each backend, in priority order, whether it
//! supports the op in the current mode; never compares backend names.
//! Records which backend ran each op kind, for `--show-backends`.
//!
//! Also the runner's view of a device: a model loaded into a device's
//! memory ([`DeviceModel`], behind a box: the runner never names the
//! backend), and the model's step graph as an executor runs it ([`Graph`],
//! which the model implements, so dispatch never names a model).

pub mod cuda;
mod input;
pub mod weights;

pub use crate::backend::HostLogits;
pub use input::StepInput;

/// Host-side phases of decode steps (`QUIRE_STEP_TIMES=1`), marked by the
/// runner around the executor's own marks.
pub use crate::backend::cuda::device::step_times;
/// The tuning overrides a device is opened with (`--tuning FILE`,
/// `--tune KEY=VALUE`).
pub use crate::backend::cuda::TuningOverrides;

use crate::backend::{
    AttnBatch, Backend, GpuMode, Host, KvLayer, KvLayerMut, Mem, Mode, Op, OpInfo, OpT, QMatrix,
};
use crate::gguf::GgufFile;
use crate::kv::KvStorage;
use crate::sampler::DrawParams;
use anyhow::{anyhow, Context, Result};
use std::collections::BTreeMap;
use std::sync::Mutex;
use weights::{HostStore, Store, WeightRef};

pub struct Dispatcher {
    backends: Vec<Box<dyn Backend>>,
    mode: Mode,
    /// (op kind, backend name) -> count.
    counts: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
}

impl Dispatcher {
    /// `backends` in priority order; the last should support everything
    /// (the CPU reference).
    pub fn new(backends: Vec<Box<dyn Backend>>, mode: Mode) -> Self {
        Dispatcher {
            backends,
            mode,
            counts: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn run(&self, op: Op<'_>) -> Result<()> {
        let kind = op.kind();
        let b = self
            .backends
            .iter()
            .find(|b| b.supports_op(&op, self.mode))
            .ok_or_else(|| anyhow!("no backend supports op {kind} in mode {:?}", self.mode))?;
        let name = b.name();
        b.run(op, self.mode)
            .with_context(|| format!("op {kind} on backend {name}"))?;
        if let Ok(mut c) = self.counts.lock() {
            *c.entry((kind, name)).or_insert(0) += 1;
        }
        Ok(())
    }

    /// Which backend ran each op kind, and how often.
    pub fn report(&self) -> Vec<(String, String, u64)> {
        self.counts
            .lock()
            .map(|c| {
                c.iter()
                    .map(|((k, b), n)| (k.to_string(), b.to_string(), *n))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A device's steps by how they ran (`/metrics`, `quire bench`).
/// Counters since load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepPaths {
    /// Decode steps that replayed a captured CUDA graph.
    pub graph: u64,
    /// Decode steps of a new graph key, run op by op before its capture.
    pub warmup: u64,
    /// Decode steps run op by op for good: graphs off or not taking the
    /// batch size, or its capture failed.
    pub eager: u64,
    /// Steps with prompt rows (op by op by design).
    pub prefill: u64,
    /// Decode graphs captured.
    pub captures: u64,
    /// Captures that failed (that graph key then runs op by op).
    pub capture_failures: u64,
}

/// A step's index inputs in an executor's memory space.
pub struct StepBufs<I, B> {
    /// Rows of the step.
    pub n: usize,
    /// Rows that want logits (`rows` holds their indices).
    pub n_rows: usize,
    /// (n,) token ids, checked < vocab.
    pub tokens: I,
    /// (n,) absolute positions.
    pub positions: I,
    /// (n,) physical KV cells, checked distinct and in range.
    pub slots: I,
    /// (n,) recurrent state slots of a hybrid model's rows (empty
    /// otherwise), checked in range.
    pub state_slots: I,
    /// (n_rows,) rows that go through the output head, checked < n.
    pub rows: I,
    /// `rows` is 0..n (every row wants its logits, in order, as in every
    /// decode step): the output head reads the residual stream itself,
    /// with no row selection.
    pub rows_all: bool,
    /// The rows give their final hidden state (rms_norm with the output
    /// norm, (n_rows, dim)) instead of logits (`StepInput::hidden`).
    pub hidden: bool,
    /// The attention batch (validated at upload).
    pub batch: B,
}

/// Runs a model graph in one memory space: owns nothing but knows how to
/// allocate activations, view weights, upload a step's inputs, run ops and
/// bring logits back. The graph (`model/arch/*.rs`) is written once over
/// this trait; [`HostExec`] runs it on host slices through the
/// [`Dispatcher`], `cuda::CudaExec` wholly on the device.
pub trait Exec {
    /// The memory space of the ops.
    type M: Mem;
    /// Where the weights live.
    type S: Store;
    /// An owned f32 activation of a fixed length.
    type Buf;
    /// An owned (or borrowed, on the host) u32 vector.
    type IdxBuf<'i>;
    /// An owned (or borrowed) attention batch.
    type BatchBuf<'i>;
    /// The paged KV cache, all layers.
    type Kv;

    /// A zero-filled activation of `len` elements.
    fn zeros(&self, len: usize) -> Result<Self::Buf>;
    /// An activation of `len` elements that the next op writes whole
    /// before anything reads it: its contents until then are unspecified.
    /// The `cuda` executor hands back a pooled buffer without clearing it
    /// (a clearing memset was a full-dependency node in every decode
    /// graph, 14 per step: SmolLM2 and the 1B decode +4-6% on an H200,
    /// docs/PERF.md). Every op's parity case starts its output from a
    /// sentinel or random values the reference overwrites, so an op that
    /// left an element unwritten fails there.
    fn output(&self, len: usize) -> Result<Self::Buf> {
        self.zeros(len)
    }
    fn rd(b: &Self::Buf) -> <Self::M as Mem>::In<'_>;
    fn wr(b: &mut Self::Buf) -> <Self::M as Mem>::Out<'_>;
    fn mat<'a>(&'a self, m: &'a <Self::S as Store>::Mat) -> Result<<Self::M as Mem>::W<'a>>;
    fn param(v: &<Self::S as Store>::Vec) -> <Self::M as Mem>::Param<'_>;
    fn idx<'i>(&self, v: &'i [u32]) -> Result<Self::IdxBuf<'i>>;
    fn idx_view<'a>(b: &'a Self::IdxBuf<'_>) -> <Self::M as Mem>::Idx<'a>;
    /// Validates and uploads an attention batch for the cache `kv`.
    fn batch<'i>(&self, kv: &Self::Kv, b: AttnBatch<'i>) -> Result<Self::BatchBuf<'i>>;
    fn batch_view<'a>(b: &'a Self::BatchBuf<'_>) -> <Self::M as Mem>::Batch<'a>;
    /// Cells (block_size x blocks) of one layer of the cache.
    fn kv_cells(kv: &Self::Kv) -> usize;
    fn kv_layer(kv: &Self::Kv, li: usize) -> Result<<Self::M as Mem>::Kv<'_>>;
    fn kv_layer_mut(kv: &mut Self::Kv, li: usize) -> Result<<Self::M as Mem>::KvMut<'_>>;
    /// Recurrent layer `i`'s (conv, ssm) state arrays, every slot (hybrid
    /// models: the cache holds them beside the attention layers).
    #[allow(clippy::type_complexity)]
    fn state_layer_mut(
        kv: &mut Self::Kv,
        i: usize,
    ) -> Result<(<Self::M as Mem>::Out<'_>, <Self::M as Mem>::Out<'_>)>;
    /// Zeroes state `slots` in every recurrent layer (sequences that start
    /// at position 0), ordered before the next op.
    fn reset_states(&self, kv: &mut Self::Kv, slots: &[u32]) -> Result<()>;
    /// Runs one op (on whichever backend the executor picks).
    fn run(&self, op: OpT<'_, Self::M>) -> Result<()>;
    /// Moves an activation to the host (waits for every queued op).
    fn download(&self, b: Self::Buf) -> Result<HostLogits>;
}

/// A model's step graph, written once over [`Exec`] (`model/arch/*.rs`):
/// what a device loader needs to move its weights into a device's store
/// and to run a step there.
pub trait Graph: Send + 'static {
    /// The weights in store `S`.
    type Weights<S: Store>;

    /// The host weights moved into another store, matrix by matrix;
    /// `progress(done, total)` counts layers.
    fn map_weights<S: Store>(
        host: &Self::Weights<HostStore>,
        mat: &mut dyn FnMut(&WeightRef) -> Result<S::Mat>,
        vec: &mut dyn FnMut(&Vec<f32>) -> Result<S::Vec>,
        progress: &dyn Fn(usize, usize),
    ) -> Result<Self::Weights<S>>;

    /// Rows of logits a step returns are `vocab` wide.
    fn vocab(&self) -> usize;

    /// One step on `e`: K/V of every input row written into its slot,
    /// logits (input.logit_rows.len(), vocab) returned.
    fn forward<E: Exec>(
        &self,
        w: &Self::Weights<E::S>,
        e: &E,
        kv: &mut E::Kv,
        input: &StepInput<'_>,
    ) -> Result<HostLogits>;

    /// One step on inputs already in `e`'s memory (no host sync: a device
    /// executor captures it as a graph); the logits buffer, None when no
    /// row wants logits.
    fn forward_bufs<E: Exec>(
        &self,
        w: &Self::Weights<E::S>,
        e: &E,
        kv: &mut E::Kv,
        b: &StepBufs<E::IdxBuf<'_>, E::BatchBuf<'_>>,
    ) -> Result<Option<E::Buf>>;
}

/// A decode step in flight whose tokens the device chose
/// ([`DeviceModel::enqueue_chained`]); its tokens come back from
/// [`DeviceModel::chained_tokens`], tickets in the order issued.
pub use cuda::GreedyTicket as ChainTicket;

/// A model resident on a device: weights, KV cache and the executor that
/// runs its steps. The runner holds one behind a box and sees only this.
pub trait DeviceModel: Send {
    /// Where the model lives, for the user ("cuda device memory, ...").
    fn placement(&self) -> String;
    /// Which backend ran each op kind, and how often.
    fn report(&self) -> Vec<(String, String, u64)>;
    /// Per op kind (kind, count, seconds), when profiling ops.
    fn profile(&self) -> Option<Vec<(String, u64, f64)>>;
    /// Whether ops are being profiled (then host times are noted too).
    fn profiling(&self) -> bool;
    /// Adds host wall time under `kind` to the profile.
    fn note_host(&self, kind: &'static str, seconds: f64);
    /// Copies physical KV block `src` to `dst` in every layer.
    fn copy_block(&mut self, src: u32, dst: u32) -> Result<()>;
    /// Copies recurrent state slot `src` to `dst` in every recurrent layer
    /// (hybrid models: snapshots, forks).
    fn copy_state(&mut self, src: u32, dst: u32) -> Result<()>;
    /// Runs one step; `decode`: every sequence has one row and wants its
    /// logits (the device may replay a captured graph for it).
    fn step(&mut self, input: &StepInput<'_>, decode: bool) -> Result<HostLogits>;
    /// Whether a decode step of `rows` rows can choose its tokens on the
    /// device and feed them to the next step there.
    fn chains_tokens(&self, rows: usize) -> bool;
    /// Whether the device can draw with `p` over `vocab` logits, whatever
    /// the logits are.
    fn draws(&self, p: &DrawParams, vocab: usize) -> bool;
    /// Enqueues a decode step (one row per sequence) whose tokens the
    /// device chooses, without waiting for them. `chain`: the step's tokens
    /// are the previous such step's choices (`input.tokens` then only
    /// gives the row count). `draws`: per row, None (greedy) or its draw
    /// parameters (within [`DeviceModel::draws`]) and this step's uniform;
    /// empty: every row greedy.
    fn enqueue_chained(
        &mut self,
        input: &StepInput<'_>,
        chain: bool,
        draws: &[Option<(DrawParams, f64)>],
    ) -> Result<ChainTicket>;
    /// Whether a step of `rows` rows can draw on the device through grammar
    /// masks ([`DeviceModel::step_draw`]).
    fn masks_rows(&self, rows: usize) -> bool;
    /// Runs a decode step (one row per sequence, every row's logits) whose
    /// tokens the device draws (`draws` per row, None: greedy) through
    /// grammar masks: `fill` writes them into `masks` while the device
    /// runs the forward. Returns one token per row. Only where
    /// [`DeviceModel::masks_rows`] says so.
    fn step_draw(
        &mut self,
        input: &StepInput<'_>,
        draws: &[Option<(DrawParams, f64)>],
        masks: &mut crate::sampler::RowMasks,
        fill: &mut dyn FnMut(&mut crate::sampler::RowMasks),
    ) -> Result<Vec<u32>>;
    /// Waits for an enqueued step and returns its tokens, one per row.
    fn chained_tokens(&self, t: ChainTicket) -> Result<Vec<u32>>;
    /// The CUDA executor underneath, for the device checks that launch
    /// kernels directly (`quire check-greedy`, `check-sample`).
    fn cuda(&self) -> Option<&cuda::CudaExec>;
    /// The steps so far by how they ran.
    fn step_paths(&self) -> StepPaths;
    /// Physical KV blocks allocated (block 0 the null block).
    fn kv_blocks(&self) -> usize;
}

/// How [`load_device`] opens a device and lays out the KV cache.
pub struct DeviceOptions<'a> {
    pub gpu: GpuMode,
    pub mode: Mode,
    pub tuning: &'a TuningOverrides,
    /// KV cache geometry: physical blocks (block 0 the null block), tokens
    /// per block, and the model's KV heads, head_dim and layers.
    pub n_blocks: KvBlocks,
    /// The longest block table one sequence can have (its context length
    /// in blocks).
    pub max_seq_blocks: usize,
    pub block_size: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub n_layers: usize,
    /// Hybrid models: the recurrent state arrays to allocate beside the
    /// KV cache.
    pub states: Option<crate::kv::StateGeometry>,
}

/// How many KV blocks a device allocates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvBlocks {
    /// Exactly this many (block 0 the null block).
    Fixed(usize),
    /// What the device's free memory holds once the weights are up, past
    /// a reserve for activations, graphs and libraries (`auto_kv_blocks`);
    /// at most `max`.
    Auto { max: usize },
}

/// Device memory kept free of the KV cache under `KvBlocks::Auto`: the
/// activation pool, decode graphs, the scratch arena, cuBLAS and its
/// dequantized weights (the output head's f16 copy alone is about 1 GiB
/// at 128k vocabulary and 4,096 columns): 1/32 of the device, at least
/// 3 GiB.
pub fn kv_reserve_bytes(total: usize) -> usize {
    (total / 32).max(3 << 30)
}

/// Blocks of `per_block` bytes that `free` bytes hold past the reserve of
/// a device of `total` bytes, at most `max` and at least 2 (the null block
/// and one); an error naming the numbers when not even that fits.
pub fn auto_kv_blocks(free: usize, total: usize, per_block: usize, max: usize) -> Result<usize> {
    let room = free.saturating_sub(kv_reserve_bytes(total));
    let n = (room / per_block.max(1)).min(max.max(2));
    anyhow::ensure!(
        n >= 2,
        "not enough device memory for a KV cache: {} MiB free after the weights, {} MiB kept \
         for activations, {} KiB a block (give --kv-tokens to size it yourself)",
        free >> 20,
        kv_reserve_bytes(total) >> 20,
        per_block >> 10
    );
    Ok(n)
}

/// What [`load_device`] gives back: the model on the device, or (`--gpu auto`)
/// the backend with the reason it cannot run some op of this model, so the
/// caller can dispatch op by op with host memory instead.
pub enum DeviceLoad {
    Device(Box<dyn DeviceModel>),
    OpByOp(Box<dyn Backend>, String),
}

/// Loads a model onto the device (the cuda backend, tuned by
/// `opts.tuning`): checks that it can run every op in `ops` (the model's
/// [`OpInfo`]s) in `opts.mode`, uploads the weights `host` (progress on the
/// bar `upload_bar` makes once the check passed) and allocates the KV
/// cache. Under `--gpu required` an op the device cannot run is an error
/// naming it; under `auto`, [`DeviceLoad::OpByOp`].
pub fn load_device<G: Graph>(
    gguf: &GgufFile,
    graph: G,
    host: &G::Weights<HostStore>,
    ops: &[OpInfo],
    opts: &DeviceOptions<'_>,
    upload_bar: &dyn Fn() -> indicatif::ProgressBar,
) -> Result<DeviceLoad>
where
    G::Weights<cuda::DevStore>: Send,
{
    cuda::load(gguf, graph, host, ops, opts, upload_bar)
}

/// Host-memory execution: every op goes through the [`Dispatcher`], which
/// picks a backend per op.
pub struct HostExec<'g> {
    pub dx: &'g Dispatcher,
    pub gguf: &'g GgufFile,
}

impl Exec for HostExec<'_> {
    type M = Host;
    type S = HostStore;
    type Buf = Vec<f32>;
    type IdxBuf<'i> = &'i [u32];
    type BatchBuf<'i> = AttnBatch<'i>;
    type Kv = KvStorage;

    fn zeros(&self, len: usize) -> Result<Vec<f32>> {
        Ok(vec![0f32; len])
    }
    fn rd(b: &Vec<f32>) -> &[f32] {
        b
    }
    fn wr(b: &mut Vec<f32>) -> &mut [f32] {
        b
    }
    fn mat<'a>(&'a self, m: &'a WeightRef) -> Result<QMatrix<'a>> {
        m.matrix(self.gguf)
    }
    fn param(v: &Vec<f32>) -> &[f32] {
        v
    }
    fn idx<'i>(&self, v: &'i [u32]) -> Result<&'i [u32]> {
        Ok(v)
    }
    fn idx_view<'a>(b: &'a &[u32]) -> &'a [u32] {
        b
    }
    fn batch<'i>(&self, _kv: &KvStorage, b: AttnBatch<'i>) -> Result<AttnBatch<'i>> {
        // The cpu kernels validate the batch themselves.
        Ok(b)
    }
    fn batch_view<'a>(b: &'a AttnBatch<'_>) -> AttnBatch<'a> {
        *b
    }
    fn kv_cells(kv: &KvStorage) -> usize {
        kv.n_blocks() * kv.block_size()
    }
    fn kv_layer(kv: &KvStorage, li: usize) -> Result<KvLayer<'_>> {
        kv.layer(li)
    }
    fn kv_layer_mut(kv: &mut KvStorage, li: usize) -> Result<KvLayerMut<'_>> {
        kv.layer_mut(li)
    }
    fn state_layer_mut(kv: &mut KvStorage, i: usize) -> Result<(&mut [f32], &mut [f32])> {
        kv.states_mut()?.layer_mut(i)
    }
    fn reset_states(&self, kv: &mut KvStorage, slots: &[u32]) -> Result<()> {
        let st = kv.states_mut()?;
        for &s in slots {
            st.reset(s)?;
        }
        Ok(())
    }
    fn run(&self, op: Op<'_>) -> Result<()> {
        self.dx.run(op)
    }
    fn download(&self, b: Vec<f32>) -> Result<HostLogits> {
        Ok(HostLogits::Vec(b))
    }
}

#[cfg(test)]
mod tests {
    use super::{auto_kv_blocks, kv_reserve_bytes};

    #[test]
    fn auto_kv_fills_free_memory_past_the_reserve() {
        const G: usize = 1 << 30;
        // An H200: 140 GiB, 4.4 GiB kept.
        assert_eq!(kv_reserve_bytes(140 * G), 140 * G / 32);
        // A small device keeps 3 GiB.
        assert_eq!(kv_reserve_bytes(16 * G), 3 * G);
        // 8B Q4_0 on an H200: 2 MiB blocks in 130 GiB free.
        let per = 2 << 20;
        let n = auto_kv_blocks(130 * G, 140 * G, per, usize::MAX).unwrap();
        assert_eq!(n, (130 * G - 140 * G / 32) / per);
        // Capped by `max`.
        assert_eq!(auto_kv_blocks(130 * G, 140 * G, per, 1000).unwrap(), 1000);
        // Nothing past the reserve: an error naming the numbers.
        let e = auto_kv_blocks(3 * G, 16 * G, per, 1000).unwrap_err();
        assert!(format!("{e}").contains("--kv-tokens"), "{e}");
    }
}
