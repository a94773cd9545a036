//! Per-op backend choice. Asks each backend, in priority order, whether it
//! supports the op in the current mode; never compares backend names.
//! Records which backend ran each op kind, for `--show-backends`.

pub mod cuda;

use crate::backend::{AttnBatch, Backend, Host, KvLayer, KvLayerMut, Mem, Mode, Op, OpT, QMatrix};
use crate::gguf::GgufFile;
use crate::model::arch::llama::LlamaWeights;
use crate::model::config::ModelConfig;
use crate::model::weights::{HostStore, Store, WeightRef};
use crate::model::KvStorage;
use anyhow::{anyhow, Context, Result};
use std::collections::BTreeMap;
use std::sync::Mutex;

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
    /// (n_rows,) rows that go through the output head, checked < n.
    pub rows: I,
    /// `rows` is 0..n (every row wants its logits, in order, as in every
    /// decode step): the output head reads the residual stream itself,
    /// with no row selection.
    pub rows_all: bool,
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
    /// Runs one op (on whichever backend the executor picks).
    fn run(&self, op: OpT<'_, Self::M>) -> Result<()>;
    /// Moves an activation to the host (waits for every queued op).
    fn download(&self, b: Self::Buf) -> Result<HostLogits>;
    /// Runs every layer of a llama-family step on the residual stream `x`
    /// (n, dim) in one fused launch where the executor has one for this
    /// model and step (the `cuda` executor: `fast` mode, one row;
    /// launch/decode_layers.rs), writing each layer's K/V as the op-by-op
    /// graph would. Ok(false): not taken, nothing was run, and the graph
    /// runs the layers op by op.
    fn fused_layers(
        &self,
        _c: &ModelConfig,
        _w: &LlamaWeights<Self::S>,
        _kv: &mut Self::Kv,
        _b: &StepBufs<Self::IdxBuf<'_>, Self::BatchBuf<'_>>,
        _x: &mut Self::Buf,
    ) -> Result<bool> {
        Ok(false)
    }
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
    fn run(&self, op: Op<'_>) -> Result<()> {
        self.dx.run(op)
    }
    fn download(&self, b: Vec<f32>) -> Result<HostLogits> {
        Ok(HostLogits::Vec(b))
    }
}

/// A step's logits on the host: a vector (host execution) or the
/// page-locked memory a device copied them into (read in place, no second
/// copy; it returns to the backend's pool when dropped).
#[derive(Debug)]
pub enum HostLogits {
    Vec(Vec<f32>),
    Pinned(crate::backend::cuda::PinnedLogits),
}

impl Default for HostLogits {
    fn default() -> Self {
        HostLogits::Vec(Vec::new())
    }
}

impl HostLogits {
    pub fn as_slice(&self) -> &[f32] {
        match self {
            HostLogits::Vec(v) => v,
            HostLogits::Pinned(p) => p.as_slice(),
        }
    }
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The values as a vector (a copy for pinned memory).
    pub fn into_vec(self) -> Vec<f32> {
        match self {
            HostLogits::Vec(v) => v,
            HostLogits::Pinned(p) => p.as_slice().to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HostLogits;

    #[test]
    fn host_logits_vec_reads_in_place() {
        let v = vec![0.5f32, -1.25, 3.0];
        let ptr = v.as_ptr();
        let l = HostLogits::Vec(v);
        assert_eq!(l.len(), 3);
        assert!(!l.is_empty());
        assert_eq!(l.as_slice(), &[0.5, -1.25, 3.0]);
        // The host vector moves out without a copy.
        let back = l.into_vec();
        assert_eq!(back.as_ptr(), ptr);
        assert!(HostLogits::default().is_empty());
    }
}
