//! Device-resident execution on the `cuda` backend: weights uploaded once
//! at load, the paged KV cache allocated on the device for the whole run,
//! and every op of a step launched on device buffers. A step uploads its
//! inputs (token ids, positions, slots, block tables: a few KB) and
//! downloads only the logits of the rows that asked for them.

mod greedy;
pub use greedy::GreedyTicket;

use super::{Exec, StepBufs};
use crate::backend::cuda::mem::{zeros, Dev, DevAttnBatch, DevKv, DevKvMut, DevMatrix};
use crate::backend::cuda::{drv, CudaBackend, PdlExec};
use crate::backend::{AttnBatch, Backend, Mode, OpT};
use crate::model::weights::{Store, WeightRef};
use crate::quant::GgmlType;
use anyhow::{anyhow, bail, ensure, Context, Result};
use cudarc::driver::{CudaEvent, CudaGraph, CudaSlice, CudaView, CudaViewMut, PinnedHostSlice};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A weight matrix uploaded to the device in its stored type.
pub struct DevWeight {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    data: CudaSlice<u8>,
    len: usize,
}

/// An f32 vector on the device (exact length; allocations are >= 1).
pub struct DevVec {
    data: CudaSlice<f32>,
    len: usize,
}

/// Weights on the device. Matrices are shared (`Arc`) so a tied output
/// head reuses the embedding upload.
pub struct DevStore;

impl Store for DevStore {
    type Mat = Arc<DevWeight>;
    type Vec = DevVec;
}

/// The device KV cache. Per layer k, v: (n_blocks, block_size, n_kv_heads,
/// head_dim) f16 bits, initialized to NaN like the host cache (a read of a
/// never-written cell shows up as NaN).
pub struct DevKvCache {
    k: Vec<CudaSlice<u16>>,
    v: Vec<CudaSlice<u16>>,
    n_blocks: usize,
    block_size: usize,
    n_kv_heads: usize,
    head_dim: usize,
}

impl DevKvCache {
    pub fn new(
        be: &CudaBackend,
        n_layers: usize,
        n_blocks: usize,
        block_size: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Result<Self> {
        let per_layer = n_blocks
            .checked_mul(block_size)
            .and_then(|c| c.checked_mul(n_kv_heads * head_dim))
            .ok_or_else(|| anyhow!("KV cache of {n_blocks} blocks overflows"))?;
        // f16 quiet NaN, the host cache's fill.
        let fill = vec![half::f16::NAN.to_bits(); per_layer];
        let mut k = Vec::with_capacity(n_layers);
        let mut v = Vec::with_capacity(n_layers);
        for li in 0..n_layers {
            let what = format!(
                "allocating KV layer {li} ({} MiB for K and V)",
                (2 * per_layer * 2) >> 20
            );
            k.push(be.up(&fill, &what)?);
            v.push(be.up(&fill, &what)?);
        }
        be.sync("KV cache allocation")?;
        Ok(DevKvCache {
            k,
            v,
            n_blocks,
            block_size,
            n_kv_heads,
            head_dim,
        })
    }

    fn layer_len(&self) -> usize {
        self.n_blocks * self.block_size * self.n_kv_heads * self.head_dim
    }

    /// Copies physical block `src` to `dst` in every layer (copy-on-write),
    /// on the device.
    pub fn copy_block(&mut self, be: &CudaBackend, src: u32, dst: u32) -> Result<()> {
        let (s, d) = (src as usize, dst as usize);
        if s >= self.n_blocks || d >= self.n_blocks {
            bail!(
                "copy_block {src} -> {dst}: out of range ({} blocks)",
                self.n_blocks
            );
        }
        if s == d {
            return Ok(());
        }
        let n = self.block_size * self.n_kv_heads * self.head_dim;
        be.bind()?;
        for buf in self.k.iter_mut().chain(self.v.iter_mut()) {
            // Two views of one buffer cannot be borrowed at once: copy the
            // source block out to a scratch buffer first (device to device).
            let tmp = drv(
                be.stream().clone_dtod(&buf.slice(s * n..(s + 1) * n)),
                "copy_block",
            )?;
            drv(
                be.stream()
                    .memcpy_dtod(&tmp, &mut buf.slice_mut(d * n..(d + 1) * n)),
                "copy_block",
            )?;
        }
        Ok(())
    }
}

/// Device buffers of finished steps, by length, for the next step to
/// reuse (a step allocates the same shapes as the one before it). Buffers
/// a captured graph uses are `pinned` (by device address): the graph holds
/// their addresses, so they are never freed; others are freed past a cap.
#[derive(Default)]
struct PoolInner {
    bufs: Mutex<HashMap<usize, Vec<CudaSlice<f32>>>>,
    pinned: Mutex<HashSet<u64>>,
}

fn dev_addr(s: &CudaSlice<f32>) -> u64 {
    use cudarc::driver::DevicePtr;
    let (p, _sync) = s.device_ptr(s.stream());
    p
}

type BufPool = Arc<PoolInner>;

/// Most bytes the pool keeps.
const POOL_CAP_BYTES: usize = 512 << 20;

/// Owned activation on the device; returns its memory to the pool on drop.
pub struct DevBuf {
    data: Option<CudaSlice<f32>>,
    len: usize,
    pool: BufPool,
}

impl DevBuf {
    fn slice(&self) -> &CudaSlice<f32> {
        // Only `drop` takes the slice out.
        self.data.as_ref().expect("DevBuf used after drop")
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if let (Some(d), Ok(mut p)) = (self.data.take(), self.pool.bufs.lock()) {
            // Bounded: steps of ever new shapes (serving) must not hoard
            // memory; past the cap a buffer is simply freed (unless pinned).
            let held: usize = p.iter().map(|(len, v)| len * v.len()).sum();
            let pinned = self
                .pool
                .pinned
                .lock()
                .map(|g| g.contains(&dev_addr(&d)))
                .unwrap_or(true);
            if pinned || (held + self.len) * 4 <= POOL_CAP_BYTES {
                // Stream-ordered: a later user's kernels queue after this
                // buffer's last kernels.
                p.entry(self.len).or_default().push(d);
            }
        }
    }
}

/// Runs every op of a step on the cuda backend's device space.
pub struct CudaExec {
    be: Arc<CudaBackend>,
    mode: Mode,
    /// op kind -> (count, seconds), for `--show-backends`. Seconds are
    /// measured only with QUIRE_PROFILE_OPS=1 (which synchronizes after
    /// every op, so it slows the run down).
    counts: Mutex<BTreeMap<&'static str, (u64, f64)>>,
    profile: bool,
    pool: BufPool,
    /// Decode graphs by [`GraphKey`].
    graphs: Mutex<HashMap<GraphKey, DecodeGraph>>,
    /// Page-locked staging of a decode step's inputs, shared by every
    /// graph (taken under the `graphs` lock: one step at a time).
    stage: Mutex<Staging>,
    /// Set while a graph is being captured: no allocation may happen then.
    capturing: AtomicBool,
    /// CUDA graphs for decode steps (QUIRE_NO_GRAPHS=1 turns them off).
    use_graphs: bool,
    /// Greedy steps in flight (greedy.rs).
    greedy: Mutex<greedy::Greedy>,
    /// The ring every greedy graph of up to SHARED_RING_ROWS rows writes
    /// (greedy.rs), made by the first.
    shared_ring: Mutex<Option<Arc<crate::backend::cuda::GreedyRing>>>,
}

/// A decode graph's key: (batch size, split-KV CTAs per row and head,
/// greedy: its last node chooses the next tokens instead of copying the
/// logits out).
type GraphKey = (usize, usize, bool);

/// Where a greedy graph's sample_rows reads its draw records and writes
/// (decode_finish).
struct GreedyOut<'g> {
    b: usize,
    vocab: usize,
    /// Device address of the graph's draw records (b, DRAW_WORDS).
    draws: u64,
    /// Device address of the graph's tokens: (b tokens, b statuses).
    tokens: u64,
    ring: &'g Arc<crate::backend::cuda::GreedyRing>,
    positions: CudaView<'g, u32>,
}

/// Which graph a decode step replays, and where its tokens come from.
#[derive(Clone, Copy)]
struct GraphSel<'d> {
    /// `graph_key` of the step (`.2`: a greedy graph, greedy.rs).
    key: GraphKey,
    /// A greedy step's previous greedy step's graph, whose tokens are this
    /// step's (None: uploaded from `input.tokens`).
    chain: Option<GraphKey>,
    /// A greedy graph's draw records (b, DRAW_WORDS), uploaded where they
    /// differ from the graph's last ones; empty: every row greedy.
    draws: &'d [u32],
}

/// A decode step's ops on fixed buffers (`forward_bufs`): its logits.
pub type DecodeFn<'f> = dyn FnMut(&CudaExec, &mut DevKvCache, &StepBufs<DevIdx<'_>, DevBatch<'_>>) -> Result<Option<DevBuf>>
    + 'f;

/// A captured, instantiated graph, and on sm_90+ the same graph
/// instantiated with programmatic kernel-to-kernel edges, which is the one
/// launched (`backend::cuda::pdl`).
struct SendGraph(CudaGraph, Option<PdlExec>);

// SAFETY: CUDA graph handles are not tied to a thread; every use (launch,
// destroy) binds the context first and is serialized by `CudaExec::graphs`.
unsafe impl Send for SendGraph {}

/// Page-locked staging of decode inputs: tokens, slots, then the block
/// tables and positions (DevAttnBatch::refill), (B * (stride + 3),) for a
/// step of B rows. One async copy each (from pageable memory each upload
/// cost the host a staging copy of its own: about 14 of a SmolLM2 step's
/// 700 us on an H100). Invariant: the host writes the buffer only after
/// `done`, recorded behind the last copies that read it, has completed.
#[derive(Default)]
struct Staging {
    buf: Option<PinnedHostSlice<u32>>,
    done: Option<CudaEvent>,
}

impl Staging {
    /// The first `len` values of the buffer (grown when too small), once
    /// the copies of its last use have run (long done when that step
    /// synchronized on its logits; not if it failed half way).
    fn take(&mut self, be: &CudaBackend, len: usize) -> Result<&mut [u32]> {
        if let Some(e) = &self.done {
            drv(e.synchronize(), "decode inputs")?;
        }
        let buf = match self.buf.take() {
            Some(b) if b.len() >= len => b,
            // Sized for the next batch sizes too (steps grow one sequence
            // at a time while a server fills up).
            _ => be.pinned_u32(len.next_power_of_two())?,
        };
        let buf = self.buf.insert(buf);
        Ok(&mut drv(buf.as_mut_slice(), "decode inputs")?[..len])
    }

    /// Records, on `st`, that the copies just issued from the buffer are
    /// the last to read it.
    fn mark(&mut self, st: &Arc<cudarc::driver::CudaStream>) -> Result<()> {
        match &self.done {
            Some(e) => drv(e.record(st), "decode inputs"),
            None => {
                self.done = Some(drv(st.record_event(None), "decode inputs")?);
                Ok(())
            }
        }
    }
}

/// Fixed inputs, fixed logits buffer and the captured graph of the decode
/// steps of one batch size (one row per sequence, every row's logits).
struct DecodeGraph {
    tokens: CudaSlice<u32>,
    slots: CudaSlice<u32>,
    rows: CudaSlice<u32>,
    batch: DevAttnBatch,
    /// (B, vocab) logits, written by the graph's last node (greedy graphs:
    /// unused).
    out: CudaSlice<f32>,
    /// Greedy graphs: the page-locked ring their sample_rows writes.
    ring: Option<Arc<crate::backend::cuda::GreedyRing>>,
    /// Greedy graphs: the draw records sample_rows reads (b, DRAW_WORDS),
    /// and the host's copy of what they hold (zeros: every row greedy).
    draws: Option<(CudaSlice<u32>, Vec<u32>)>,
    graph: Option<SendGraph>,
    /// One uncaptured step ran with these inputs (it filled the buffer
    /// pool, so the capture allocates nothing).
    warm: bool,
    /// A capture of this size failed: run its steps op by op.
    capture_failed: bool,
    /// Scratch arena size at capture: a larger arena is a new allocation,
    /// and the graph must be captured again.
    arena_len: usize,
}

impl CudaExec {
    pub fn new(be: Arc<CudaBackend>, mode: Mode) -> Self {
        CudaExec {
            be,
            mode,
            counts: Mutex::new(BTreeMap::new()),
            profile: std::env::var("QUIRE_PROFILE_OPS").is_ok_and(|v| v == "1"),
            pool: Arc::new(PoolInner::default()),
            graphs: Mutex::new(HashMap::new()),
            stage: Mutex::new(Staging::default()),
            capturing: AtomicBool::new(false),
            use_graphs: !std::env::var("QUIRE_NO_GRAPHS").is_ok_and(|v| v == "1"),
            greedy: Mutex::new(greedy::Greedy::default()),
            shared_ring: Mutex::new(None),
        }
    }

    pub fn backend(&self) -> &CudaBackend {
        &self.be
    }

    /// Uploads a model's weights (matrices keep their stored type). Tied
    /// matrices (same tensor name) are uploaded once.
    pub fn upload_weights<W>(
        &self,
        map: impl FnOnce(
            &mut dyn FnMut(&WeightRef) -> Result<Arc<DevWeight>>,
            &mut dyn FnMut(&Vec<f32>) -> Result<DevVec>,
        ) -> Result<W>,
        gguf: &crate::gguf::GgufFile,
    ) -> Result<W> {
        self.be.bind()?;
        let be = &self.be;
        let mut done: HashMap<String, Arc<DevWeight>> = HashMap::new();
        let mut mat = |w: &WeightRef| -> Result<Arc<DevWeight>> {
            if let Some(d) = done.get(&w.name) {
                return Ok(d.clone());
            }
            let bytes = gguf.tensor_data(&w.name)?;
            let d = Arc::new(DevWeight {
                ty: w.ty,
                rows: w.rows,
                cols: w.cols,
                data: be
                    .up_weight(bytes, &format!("uploading {}", w.name))
                    .with_context(|| format!("{} ({} MiB)", w.name, bytes.len() >> 20))?,
                len: bytes.len(),
            });
            done.insert(w.name.clone(), d.clone());
            Ok(d)
        };
        let mut vec = |v: &Vec<f32>| -> Result<DevVec> {
            Ok(DevVec {
                data: be.up(v, "uploading a weight vector")?,
                len: v.len(),
            })
        };
        let w = map(&mut mat, &mut vec)?;
        be.sync("weight upload")?;
        Ok(w)
    }

    /// Which backend ran each op kind, and how often.
    pub fn report(&self) -> Vec<(String, String, u64)> {
        self.counts
            .lock()
            .map(|c| {
                c.iter()
                    .map(|(k, (n, _))| (k.to_string(), "cuda".to_string(), *n))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether a decode step of `b` rows can run as a CUDA graph in `mode`
    /// (fast mode's cuBLAS GEMMs, for batches past the int8 kernels, are not
    /// captured).
    pub fn graphable(&self, b: usize) -> bool {
        self.use_graphs
            && !self.profile
            && b > 0
            && (self.mode != Mode::Fast || !crate::backend::cuda::fast_uses_blas(b))
    }

    /// Runs a decode step (one row per sequence, every row's logits) with
    /// fixed input buffers, as a CUDA graph captured on the second step of
    /// a batch size and replayed after. `step` runs the model's ops on the
    /// given inputs and returns its logits buffer (forward_bufs).
    #[allow(clippy::type_complexity)]
    pub fn decode_step(
        &self,
        vocab: usize,
        input: &crate::model::StepInput<'_>,
        kv: &mut DevKvCache,
        step: &mut DecodeFn<'_>,
    ) -> Result<super::HostLogits> {
        let b = input.tokens.len();
        let sel = GraphSel {
            key: Self::graph_key(input, false),
            chain: None,
            draws: &[],
        };
        self.decode_run(vocab, input, kv, step, sel, |be, g| {
            be.down_logits(&g.out, b * vocab, "decode step logits")
        })
    }

    /// The graph key of a step: (rows, split-KV CTAs per row and head,
    /// greedy).
    fn graph_key(input: &crate::model::StepInput<'_>, greedy: bool) -> GraphKey {
        // Split-KV CTAs are baked into a graph: one graph per power-of-two
        // bucket of the longest row's partial count.
        let max_pos = input.positions.iter().copied().max().unwrap_or(0) as usize;
        let ctas = crate::backend::cuda::mem::att_parts(max_pos).next_power_of_two();
        (input.tokens.len(), ctas, greedy)
    }

    /// The body of [`CudaExec::decode_step`]: stages the inputs, captures
    /// or replays graph `key` (`graph_key`), then runs `after` on the graph
    /// under the graphs lock. Without `greedy` the graph's last node copies
    /// the logits into `out`. With it (greedy.rs), its last node is
    /// sample_rows writing each row's next token into `tokens` (the next
    /// replay's input), its status after them, and both into the graph's
    /// host `ring`; with `sel.chain` the step's tokens
    /// are not uploaded (`input.tokens` only gives their count): they are
    /// the previous greedy step's, already in place or copied from that
    /// step's graph.
    fn decode_run<R>(
        &self,
        vocab: usize,
        input: &crate::model::StepInput<'_>,
        kv: &mut DevKvCache,
        step: &mut DecodeFn<'_>,
        sel: GraphSel<'_>,
        after: impl FnOnce(&CudaBackend, &DecodeGraph) -> Result<R>,
    ) -> Result<R> {
        let b = input.tokens.len();
        input.validate(vocab)?;
        crate::backend::validate::kv_slots(input.slots, Self::kv_cells(kv))?;
        anyhow::ensure!(
            input.logit_rows.len() == b
                && input.logit_rows.iter().enumerate().all(|(i, &r)| r == i),
            "decode graph: every row must want its logits, in order"
        );
        self.be.bind()?;
        let mut graphs = self
            .graphs
            .lock()
            .map_err(|_| anyhow!("cuda: graph lock poisoned"))?;
        let (key, greedy) = (sel.key, sel.key.2);
        let ctas = key.1;
        if let std::collections::hash_map::Entry::Vacant(slot) = graphs.entry(key) {
            let rows: Vec<u32> = (0..b as u32).collect();
            // Greedy graphs: tokens (b), then sample_rows' status (b); no
            // logits copy.
            let (nt, nl) = if greedy { (2 * b, 1) } else { (b, b * vocab) };
            slot.insert(DecodeGraph {
                tokens: zeros::<u32>(&self.be, nt, "decode tokens")?,
                slots: zeros::<u32>(&self.be, b, "decode slots")?,
                rows: self.be.up(&rows, "decode rows")?,
                batch: DevAttnBatch::fixed(
                    &self.be,
                    b,
                    kv.n_blocks,
                    kv.block_size,
                    kv.n_blocks,
                    ctas,
                )?,
                out: zeros::<f32>(&self.be, nl, "decode logits")?,
                ring: if greedy {
                    Some(self.greedy_ring(b)?)
                } else {
                    None
                },
                draws: if greedy {
                    let n = b * crate::backend::cuda::DRAW_WORDS;
                    Some((zeros::<u32>(&self.be, n, "decode draws")?, vec![0; n]))
                } else {
                    None
                },
                graph: None,
                warm: false,
                capture_failed: false,
                arena_len: 0,
            });
        }
        let st = self.be.stream();
        // A chained step whose previous greedy step replayed another graph
        // (its split bucket changed): that graph's tokens are this one's.
        if let Some(pk) = sel.chain {
            if pk != key {
                let [p, c] = graphs.get_disjoint_mut([&pk, &key]);
                let (p, c) = p
                    .zip(c)
                    .ok_or_else(|| anyhow!("greedy decode: the previous step's graph is gone"))?;
                drv(
                    st.memcpy_dtod(&p.tokens.slice(0..b), &mut c.tokens.slice_mut(0..b)),
                    "greedy decode: tokens from the previous graph",
                )?;
            }
        }
        let g = graphs
            .get_mut(&key)
            .ok_or_else(|| anyhow!("cuda: decode graph missing"))?;
        let mut staging = self
            .stage
            .lock()
            .map_err(|_| anyhow!("cuda: staging lock poisoned"))?;
        let nd = b * crate::backend::cuda::DRAW_WORDS;
        let stage = staging.take(&self.be, b * (kv.n_blocks + 3) + nd)?;
        let (stage, draw_stage) = stage.split_at_mut(b * (kv.n_blocks + 3));
        let (tok_slot, rest) = stage.split_at_mut(2 * b);
        let (tok, slot) = tok_slot.split_at_mut(b);
        tok.copy_from_slice(input.tokens);
        slot.copy_from_slice(input.slots);
        if sel.chain.is_none() {
            drv(
                st.memcpy_htod(&*tok, &mut g.tokens.slice_mut(0..b)),
                "decode tokens",
            )?;
        }
        drv(st.memcpy_htod(&*slot, &mut g.slots), "decode slots")?;
        if let Some((d, held)) = g.draws.as_mut() {
            // Only what changed goes up: a greedy chain's records stay zero.
            if sel.draws.is_empty() {
                draw_stage.fill(0);
            } else {
                ensure!(
                    sel.draws.len() == nd,
                    "decode step: {} draw words for {b} rows",
                    sel.draws.len()
                );
                draw_stage.copy_from_slice(sel.draws);
            }
            if *draw_stage != *held {
                drv(st.memcpy_htod(&*draw_stage, d), "decode draws")?;
                held.copy_from_slice(draw_stage);
            }
        }
        g.batch.refill(
            &self.be,
            &AttnBatch {
                block_tables: input.block_tables,
                row_seq: input.row_seq,
                positions: input.positions,
            },
            kv.n_blocks,
            rest,
        )?;
        staging.mark(st)?;
        drop(staging);
        if g.graph.is_some() && g.arena_len != self.be.arena_len() {
            g.graph = None;
        }
        if g.graph.is_none() {
            // Greedy graphs end with sample_rows into their own token input.
            let fin = match (greedy, &g.ring, &g.draws) {
                (true, Some(ring), Some((d, _))) => Some(GreedyOut {
                    b,
                    vocab,
                    draws: {
                        use cudarc::driver::DevicePtr;
                        d.device_ptr(st).0
                    },
                    tokens: {
                        use cudarc::driver::DevicePtr;
                        g.tokens.device_ptr(st).0
                    },
                    ring,
                    positions: g.batch.positions(),
                }),
                (true, _, _) => bail!("greedy decode graph without its ring or draws"),
                (false, _, _) => None,
            };
            let bufs = StepBufs {
                n: b,
                n_rows: b,
                tokens: DevIdx::View(g.tokens.slice(0..b)),
                // The attention batch's positions serve rope and the KV
                // write too: one upload.
                positions: DevIdx::View(g.batch.positions()),
                slots: DevIdx::View(g.slots.slice(0..b)),
                rows: DevIdx::View(g.rows.slice(0..b)),
                batch: DevBatch::Fixed(&g.batch),
            };
            if !g.warm || g.capture_failed {
                let logits = step(self, kv, &bufs)?
                    .ok_or_else(|| anyhow!("decode step returned no logits"))?;
                self.decode_finish(&logits, &mut g.out, fin.as_ref())?;
                g.warm = true;
            } else {
                drv(
                    st.begin_capture(
                        cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                    ),
                    "beginning graph capture",
                )?;
                self.capturing.store(true, Ordering::Relaxed);
                let r = step(self, kv, &bufs).and_then(|l| {
                    let l = l.ok_or_else(|| anyhow!("decode step returned no logits"))?;
                    self.decode_finish(&l, &mut g.out, fin.as_ref())
                });
                self.capturing.store(false, Ordering::Relaxed);
                let graph = drv(
                    st.end_capture(
                        cudarc::driver::sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
                    ),
                    "ending graph capture",
                );
                let captured = r.and_then(|()| {
                    graph?.ok_or_else(|| anyhow!("graph capture produced no graph"))
                });
                let captured = captured.and_then(|graph| {
                    if !self.be.pdl_enabled() {
                        return Ok(SendGraph(graph, None));
                    }
                    let (exec, edges) = self.be.instantiate_pdl(graph.cu_graph())?;
                    tracing::debug!("decode graph for batch {b}: {edges} programmatic edges");
                    Ok(SendGraph(graph, Some(exec)))
                });
                match captured {
                    Ok(graph) => {
                        g.arena_len = self.be.arena_len();
                        g.graph = Some(graph);
                    }
                    Err(e) => {
                        // Nothing ran during the failed capture: run this
                        // step (and later ones of this size) op by op.
                        tracing::warn!(
                            "cuda graph capture for batch {b} failed ({e:#}); running op by op"
                        );
                        g.capture_failed = true;
                        let logits = step(self, kv, &bufs)?
                            .ok_or_else(|| anyhow!("decode step returned no logits"))?;
                        self.decode_finish(&logits, &mut g.out, fin.as_ref())?;
                    }
                }
            }
        }
        if let Some(SendGraph(graph, pdl)) = &g.graph {
            match pdl {
                Some(exec) => self.be.launch_pdl(exec)?,
                None => drv(graph.launch(), "launching a decode graph")?,
            }
            if let Ok(mut c) = self.counts.lock() {
                c.entry("decode_graph").or_insert((0, 0.0)).0 += 1;
            }
        }
        after(&self.be, g)
    }

    /// A decode step's last node: its logits copied into the graph's
    /// `out`, or (`greedy`) sample_rows into the graph's tokens and ring.
    fn decode_finish(
        &self,
        logits: &DevBuf,
        out: &mut CudaSlice<f32>,
        greedy: Option<&GreedyOut<'_>>,
    ) -> Result<()> {
        let l = Self::rd(logits);
        match greedy {
            // SAFETY: the graph's tokens buffer holds (b tokens, b
            // statuses); the step read its tokens first (stream order);
            // its draws buffer holds b records, written only by uploads
            // ordered before the graph on this stream.
            Some(f) => unsafe {
                self.be.d_sample_rows_at(
                    &l,
                    f.b,
                    f.vocab,
                    f.draws,
                    f.tokens,
                    f.tokens + 4 * f.b as u64,
                    Some((f.ring, &f.positions)),
                )
            },
            None => drv(self.be.stream().memcpy_dtod(&l, out), "decode logits"),
        }
    }

    /// Whether QUIRE_PROFILE_OPS=1 (per-op device time, no graphs).
    pub fn profiling(&self) -> bool {
        self.profile
    }

    /// Adds host wall time under `kind` to the profile (QUIRE_PROFILE_OPS=1):
    /// whole steps and their host-side parts, beside the per-op times.
    pub fn note_host(&self, kind: &'static str, seconds: f64) {
        if let Ok(mut c) = self.counts.lock() {
            let e = c.entry(kind).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += seconds;
        }
    }

    /// Per op kind: (kind, count, seconds), when QUIRE_PROFILE_OPS=1.
    pub fn profile(&self) -> Option<Vec<(String, u64, f64)>> {
        if !self.profile {
            return None;
        }
        self.counts
            .lock()
            .map(|c| {
                c.iter()
                    .map(|(k, (n, t))| (k.to_string(), *n, *t))
                    .collect()
            })
            .ok()
    }
}

/// A step's index vector on the device: uploaded for this step, or a view
/// of a fixed buffer that a captured graph reads.
pub enum DevIdx<'i> {
    Owned(CudaSlice<u32>, usize),
    View(CudaView<'i, u32>),
}

/// A step's attention batch: uploaded for this step, or a fixed one.
pub enum DevBatch<'i> {
    Owned(Box<DevAttnBatch>),
    Fixed(&'i DevAttnBatch),
}

impl Exec for CudaExec {
    type M = Dev;
    type S = DevStore;
    type Buf = DevBuf;
    type IdxBuf<'i> = DevIdx<'i>;
    type BatchBuf<'i> = DevBatch<'i>;
    type Kv = DevKvCache;

    fn zeros(&self, len: usize) -> Result<DevBuf> {
        // A reused buffer may be the input the arena holds quantized.
        self.be.forget_activations();
        let reused = self
            .pool
            .bufs
            .lock()
            .map_err(|_| anyhow!("cuda: buffer pool lock poisoned"))?
            .get_mut(&len)
            .and_then(|v| v.pop());
        let data = match reused {
            Some(mut d) => {
                if self.capturing.load(Ordering::Relaxed) {
                    self.pool
                        .pinned
                        .lock()
                        .map_err(|_| anyhow!("cuda: buffer pool lock poisoned"))?
                        .insert(dev_addr(&d));
                }
                drv(
                    self.be.stream().memset_zeros(&mut d),
                    "zeroing an activation",
                )?;
                d
            }
            None if self.capturing.load(Ordering::Relaxed) => {
                bail!("cuda graph capture: no pooled buffer of {len} elements (would allocate)")
            }
            None => zeros::<f32>(&self.be, len, "allocating an activation")?,
        };
        Ok(DevBuf {
            data: Some(data),
            len,
            pool: self.pool.clone(),
        })
    }
    fn rd(b: &DevBuf) -> CudaView<'_, f32> {
        b.slice().slice(0..b.len)
    }
    fn wr(b: &mut DevBuf) -> CudaViewMut<'_, f32> {
        let len = b.len;
        // Only `drop` takes the slice out.
        b.data
            .as_mut()
            .expect("DevBuf used after drop")
            .slice_mut(0..len)
    }
    fn mat<'a>(&'a self, m: &'a Arc<DevWeight>) -> Result<DevMatrix<'a>> {
        Ok(DevMatrix {
            ty: m.ty,
            rows: m.rows,
            cols: m.cols,
            data: m.data.slice(0..m.len),
        })
    }
    fn param(v: &DevVec) -> CudaView<'_, f32> {
        v.data.slice(0..v.len)
    }
    fn idx<'i>(&self, v: &'i [u32]) -> Result<DevIdx<'i>> {
        Ok(DevIdx::Owned(
            self.be.up(v, "uploading step indices")?,
            v.len(),
        ))
    }
    fn idx_view<'a>(b: &'a DevIdx<'_>) -> CudaView<'a, u32> {
        match b {
            DevIdx::Owned(s, n) => s.slice(0..*n),
            DevIdx::View(v) => v.slice(0..v.len()),
        }
    }
    fn batch<'i>(&self, kv: &DevKvCache, b: AttnBatch<'i>) -> Result<DevBatch<'i>> {
        Ok(DevBatch::Owned(Box::new(DevAttnBatch::upload(
            &self.be,
            &b,
            kv.block_size,
            kv.n_blocks,
        )?)))
    }
    fn batch_view<'a>(b: &'a DevBatch<'_>) -> &'a DevAttnBatch {
        match b {
            DevBatch::Owned(o) => o,
            DevBatch::Fixed(f) => f,
        }
    }
    fn kv_cells(kv: &DevKvCache) -> usize {
        kv.n_blocks * kv.block_size
    }
    fn kv_layer(kv: &DevKvCache, li: usize) -> Result<DevKv<'_>> {
        let len = kv.layer_len();
        match (kv.k.get(li), kv.v.get(li)) {
            (Some(k), Some(v)) => Ok(DevKv {
                k: k.slice(0..len),
                v: v.slice(0..len),
                block_size: kv.block_size,
                n_kv_heads: kv.n_kv_heads,
                head_dim: kv.head_dim,
            }),
            _ => bail!("KV layer {li} out of range ({} layers)", kv.k.len()),
        }
    }
    fn kv_layer_mut(kv: &mut DevKvCache, li: usize) -> Result<DevKvMut<'_>> {
        let len = kv.layer_len();
        let n = kv.k.len();
        match (kv.k.get_mut(li), kv.v.get_mut(li)) {
            (Some(k), Some(v)) => Ok(DevKvMut {
                k: k.slice_mut(0..len),
                v: v.slice_mut(0..len),
                block_size: kv.block_size,
                n_kv_heads: kv.n_kv_heads,
                head_dim: kv.head_dim,
            }),
            _ => bail!("KV layer {li} out of range ({n} layers)"),
        }
    }
    fn run(&self, op: OpT<'_, Dev>) -> Result<()> {
        // Backend<Dev>::run checks capability and names the op and reason.
        let kind = match (&op, self.profile) {
            // The profile splits matmuls by batch shape (decode vs prefill).
            (OpT::MatMul { n, .. } | OpT::MatMuls { n, .. }, true) => match n {
                1 => "mat_mul n=1",
                2..=8 => "mat_mul n=2..8",
                9..=64 => "mat_mul n=9..64",
                _ => "mat_mul n>64",
            },
            _ => op.kind(),
        };
        let t0 = if self.profile {
            self.be.sync("profiling")?;
            Some(std::time::Instant::now())
        } else {
            None
        };
        Backend::<Dev>::run(self.be.as_ref(), op, self.mode)?;
        let dt = match t0 {
            Some(t) => {
                self.be.sync("profiling")?;
                t.elapsed().as_secs_f64()
            }
            None => 0.0,
        };
        if let Ok(mut c) = self.counts.lock() {
            let e = c.entry(kind).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += dt;
        }
        Ok(())
    }
    fn download(&self, b: DevBuf) -> Result<super::HostLogits> {
        let t0 = std::time::Instant::now();
        let h = self
            .be
            .down_logits(b.slice(), b.len, "downloading logits")?;
        if self.profile {
            self.note_host("host: logits download", t0.elapsed().as_secs_f64());
        }
        Ok(h)
    }
}
