//! Device-resident execution on the `cuda` backend: weights uploaded once
//! at load, the paged KV cache allocated on the device for the whole run,
//! and every op of a step launched on device buffers. A step uploads its
//! inputs (token ids, positions, slots, block tables: a few KB) and
//! downloads only the logits of the rows that asked for them.

mod capture;
mod draw;
mod graph;
mod greedy;
mod model;
mod pool;
mod ranks;
pub use model::load_on;
pub use ranks::{device_ranks, open_ranks};
pub mod step_ops;
pub use graph::DecodeFn;
use graph::{DecodeGraph, GraphKey, Staging};
pub use greedy::GreedyTicket;
pub(super) use model::load;

use super::{Exec, Graph, StepBufs};
use crate::backend::cuda::device::memory::{zeros, Dev, DevAttnBatch, DevKv, DevKvMut, DevMatrix};
use crate::backend::cuda::{drv, CudaBackend};
use crate::backend::{AttnBatch, Mode, OpT};
use crate::dispatch::weights::{Store, WeightRef};
use crate::kv::{KvGeometry, StateGeometry};
use crate::quant::GgmlType;
use anyhow::{anyhow, bail, Context, Result};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
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

/// The device KV cache: `kv::KvGeometry`'s layout (per layer k, v:
/// (n_blocks, block_size, n_kv_heads, head_dim) f16 bits, NaN until
/// written, like the host cache) in device memory.
pub struct DevKvCache {
    k: Vec<CudaSlice<u16>>,
    v: Vec<CudaSlice<u16>>,
    geo: KvGeometry,
    /// `table_stride()`.
    table_stride: usize,
    /// Hybrid models: per recurrent layer, the conv (n_slots, conv_len)
    /// and SSM (n_slots, ssm_len) states of every slot, zeroed at start.
    states: Option<DevStates>,
}

/// The recurrent state arrays of a hybrid model on the device.
pub struct DevStates {
    conv: Vec<CudaSlice<f32>>,
    ssm: Vec<CudaSlice<f32>>,
    geo: StateGeometry,
}

impl DevStates {
    pub fn new(be: &CudaBackend, geo: StateGeometry) -> Result<Self> {
        geo.bytes()?;
        let (mut conv, mut ssm) = (Vec::new(), Vec::new());
        for li in 0..geo.n_layers {
            let what = format!(
                "allocating the recurrent state of layer {li} ({} MiB for {} slots)",
                ((geo.conv_len + geo.ssm_len) * geo.n_slots * 4) >> 20,
                geo.n_slots
            );
            conv.push(zeros::<f32>(be, geo.conv_len * geo.n_slots, &what)?);
            ssm.push(zeros::<f32>(be, geo.ssm_len * geo.n_slots, &what)?);
        }
        Ok(DevStates { conv, ssm, geo })
    }
}

impl DevKvCache {
    /// The cache with recurrent states (hybrid models).
    pub fn with_states(mut self, states: DevStates) -> Self {
        self.states = Some(states);
        self
    }

    /// Copies recurrent state slot `src` to `dst` in every layer, on the
    /// device (stream-ordered with the steps).
    pub fn copy_state(&mut self, be: &CudaBackend, src: u32, dst: u32) -> Result<()> {
        let st = self
            .states
            .as_mut()
            .context("this KV cache holds no recurrent state")?;
        let g = st.geo;
        g.check_slots(&[src, dst])?;
        if src == dst {
            return Ok(());
        }
        be.bind()?;
        let s = be.stream();
        for (arr, len) in [(&mut st.conv, g.conv_len), (&mut st.ssm, g.ssm_len)] {
            if len == 0 {
                continue;
            }
            for buf in arr.iter_mut() {
                let base = dev_addr(buf);
                let (from, to) = (
                    base + (src as usize * len * 4) as u64,
                    base + (dst as usize * len * 4) as u64,
                );
                // SAFETY: both ranges are whole slots inside `buf` (slots
                // checked < n_slots, the buffer holds n_slots * len f32),
                // distinct slots do not overlap, and the copy is ordered on
                // the backend's stream after every kernel that wrote `buf`.
                drv(
                    unsafe {
                        cudarc::driver::result::memcpy_dtod_async(to, from, len * 4, s.cu_stream())
                    },
                    "copying a recurrent state slot",
                )?;
            }
        }
        Ok(())
    }

    /// The recurrent states' shape, for a hybrid model's cache.
    pub fn state_geometry(&self) -> Option<StateGeometry> {
        self.states.as_ref().map(|s| s.geo)
    }

    /// Allocates the cache, every cell NaN (a device-side fill: a large
    /// cache takes no host memory and no upload). `max_seq_blocks`: the
    /// longest block table a sequence can have (its context length in
    /// blocks), which sizes the decode graphs' table buffers.
    pub fn new(be: &CudaBackend, geo: KvGeometry, max_seq_blocks: usize) -> Result<Self> {
        let per_layer = geo.layer_elems();
        let fill = KvGeometry::FILL.to_bits();
        let mut k = Vec::with_capacity(geo.n_layers);
        let mut v = Vec::with_capacity(geo.n_layers);
        be.bind()?;
        let st = be.stream();
        for li in 0..geo.n_layers {
            let what = format!(
                "allocating KV layer {li} ({} MiB for K and V)",
                (2 * per_layer * 2) >> 20
            );
            for dst in [&mut k, &mut v] {
                // SAFETY: the allocation is filled whole by the memset
                // below, ordered before any other use on this stream.
                let buf = drv(unsafe { st.alloc::<u16>(per_layer.max(1)) }, &what)?;
                // SAFETY: `buf` holds per_layer.max(1) u16 values from its
                // device address; the fill is queued on the backend's stream.
                drv(
                    unsafe {
                        cudarc::driver::sys::cuMemsetD16Async(
                            dev_addr(&buf),
                            fill,
                            per_layer.max(1),
                            st.cu_stream(),
                        )
                        .result()
                    },
                    &what,
                )?;
                dst.push(buf);
            }
        }
        be.sync("KV cache allocation")?;
        Ok(DevKvCache {
            k,
            v,
            table_stride: max_seq_blocks.clamp(1, geo.n_blocks.max(1)),
            geo,
            states: None,
        })
    }

    /// Room for one sequence's block table in a decode graph's tables: the
    /// longest table a sequence can have (at most every block).
    pub fn table_stride(&self) -> usize {
        self.table_stride
    }

    fn layer_len(&self) -> usize {
        self.geo.layer_elems()
    }

    /// Copies physical block `src` to `dst` in every layer (copy-on-write),
    /// on the device.
    pub fn copy_block(&mut self, be: &CudaBackend, src: u32, dst: u32) -> Result<()> {
        let (s, d) = self.geo.copy_ranges(src, dst)?;
        if s == d {
            return Ok(());
        }
        be.bind()?;
        for buf in self.k.iter_mut().chain(self.v.iter_mut()) {
            // Two views of one buffer cannot be borrowed at once: copy the
            // source block out to a scratch buffer first (device to device).
            let tmp = drv(be.stream().clone_dtod(&buf.slice(s.clone())), "copy_block")?;
            drv(
                be.stream().memcpy_dtod(&tmp, &mut buf.slice_mut(d.clone())),
                "copy_block",
            )?;
        }
        Ok(())
    }
}

/// The activation pool (`pool.rs`) and the addresses of the buffers a
/// captured graph uses (`pinned`: the graph holds their addresses, so they
/// are never freed).
#[derive(Default)]
struct PoolInner {
    bufs: Mutex<pool::ClassPool<CudaSlice<f32>>>,
    pinned: Mutex<HashSet<u64>>,
}

fn dev_addr<T>(s: &CudaSlice<T>) -> u64 {
    use cudarc::driver::DevicePtr;
    let (p, _sync) = s.device_ptr(s.stream());
    p
}

impl PoolInner {
    fn is_pinned(&self, d: &CudaSlice<f32>) -> bool {
        // A poisoned lock: keep the buffer (never free what a graph holds).
        self.pinned
            .lock()
            .map(|g| g.contains(&dev_addr(d)))
            .unwrap_or(true)
    }
}

type BufPool = Arc<PoolInner>;

/// Owned activation on the device: `len` elements of a pooled buffer of at
/// least that capacity; returns the buffer to the pool on drop.
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
        let Some(d) = self.data.take() else { return };
        let pinned = self.pool.is_pinned(&d);
        if let Ok(mut p) = self.pool.bufs.lock() {
            let cap = d.len();
            // Stream-ordered: a later user's kernels queue after this
            // buffer's last kernels. Past the cap the oldest unpinned
            // buffers are freed (steps of ever new shapes must not hoard
            // memory), outside the lock.
            let evicted = p.give(d, cap, pinned, pool::POOL_CAP_BYTES);
            drop(p);
            drop(evicted);
        }
    }
}

/// A step's shape as its fusion plan depends on it: (rows, rows through
/// the head, every row in order, hidden states instead of logits).
type StepShape = (usize, usize, bool, bool);

/// Step shapes whose fusion plans `CudaExec` keeps at once.
const MAX_PLANS: usize = 64;

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
    /// CUDA graphs for decode steps (tuning `runtime.graphs`).
    use_graphs: bool,
    /// Greedy steps in flight (greedy.rs).
    greedy: Mutex<greedy::Greedy>,
    /// The ring every greedy graph of up to SHARED_RING_ROWS rows writes
    /// (greedy.rs), made by the first.
    shared_ring: Mutex<Option<Arc<crate::backend::cuda::GreedyRing>>>,
    /// Draw records, masks, tokens and statuses of steps drawn outside a
    /// graph (draw.rs), grown as needed.
    draw_bufs: Mutex<Option<cudarc::driver::CudaSlice<u32>>>,
    /// The fusion pass's plans of steps by (rows, logit rows, every row
    /// in order), recorded once each (step_ops.rs).
    plans: Mutex<HashMap<StepShape, Arc<step_ops::Planned>>>,
    /// The step being issued: each op's annotation in turn.
    cursor: Mutex<step_ops::Cursor>,
    /// Steps by how they ran.
    paths: Mutex<super::StepPaths>,
    /// Why the last failed graph capture failed.
    capture_error: Mutex<Option<String>>,
}

impl CudaExec {
    pub fn new(be: Arc<CudaBackend>, mode: Mode) -> Self {
        let use_graphs = be.tuning.runtime.graphs;
        CudaExec {
            be,
            mode,
            counts: Mutex::new(BTreeMap::new()),
            profile: std::env::var("QUIRE_PROFILE_OPS").is_ok_and(|v| v == "1"),
            pool: Arc::new(PoolInner::default()),
            graphs: Mutex::new(HashMap::new()),
            stage: Mutex::new(Staging::default()),
            capturing: AtomicBool::new(false),
            use_graphs,
            greedy: Mutex::new(greedy::Greedy::default()),
            shared_ring: Mutex::new(None),
            draw_bufs: Mutex::new(None),
            plans: Mutex::new(HashMap::new()),
            cursor: Mutex::new(step_ops::Cursor::default()),
            paths: Mutex::new(super::StepPaths::default()),
            capture_error: Mutex::new(None),
        }
    }

    /// The steps so far by how they ran.
    pub fn step_paths(&self) -> super::StepPaths {
        self.paths.lock().map(|p| *p).unwrap_or_default()
    }

    /// Why the last failed graph capture failed (None: none failed).
    pub fn last_capture_error(&self) -> Option<String> {
        self.capture_error.lock().ok().and_then(|e| e.clone())
    }

    /// Counts a step's path.
    pub(crate) fn count_path(&self, f: impl FnOnce(&mut super::StepPaths)) {
        if let Ok(mut p) = self.paths.lock() {
            f(&mut p);
        }
    }

    pub fn backend(&self) -> &CudaBackend {
        &self.be
    }

    /// The fusion pass's plan of a step of `n` rows, `n_rows` of them
    /// wanting logits (`rows_all`: every row, in order), over the ops
    /// `graph` issues for it (recorded once per shape, step_ops.rs); None
    /// where the recording fails (the step then runs unannotated).
    pub fn plan_step<G: Graph>(
        &self,
        graph: &G,
        weights: &G::Weights<DevStore>,
        kv: &DevKvCache,
        (n, n_rows, rows_all, hidden): StepShape,
    ) -> Option<Arc<step_ops::Planned>> {
        let key = (n, n_rows, rows_all, hidden);
        if let Some(p) = self.plans.lock().ok()?.get(&key) {
            return Some(p.clone());
        }
        let (be, mode) = (&self.be, self.mode);
        let reads = |n: usize, ty: GgmlType, k: usize, rows: &[usize]| {
            be.planned_read(mode, n, ty, k, rows)
        };
        let e = step_ops::ShapeExec::<DevStore>::new(
            |m: &Arc<DevWeight>| step_ops::MatShape {
                ty: m.ty,
                rows: m.rows,
                cols: m.cols,
            },
            &reads,
        );
        let mut shape = step_ops::KvShape {
            geometry: (kv.geo.block_size, kv.geo.n_kv_heads, kv.geo.head_dim),
            cells: kv.geo.n_blocks * kv.geo.block_size,
            layers: kv.k.len(),
            states: kv.state_geometry(),
        };
        let bufs = step_ops::ShapeExec::<DevStore>::step_bufs(n, n_rows, rows_all, hidden);
        if let Err(err) = graph.forward_bufs(weights, &e, &mut shape, &bufs) {
            tracing::debug!("fusion: recording a step of {n} rows failed: {err:#}");
            return None;
        }
        let (ops, keys) = e.into_parts();
        let p = Arc::new(step_ops::Planned::new(
            ops,
            keys,
            mode,
            &self.be.tuning.matvec,
        ));
        if let Ok(mut plans) = self.plans.lock() {
            // Prefill chunks come in many sizes: a bounded cache (a plan
            // is recorded again in well under a step's time).
            if plans.len() >= MAX_PLANS {
                plans.clear();
            }
            plans.insert(key, p.clone());
        }
        Some(p)
    }

    /// The ops issued from now on get `planned`'s annotations in order
    /// (None: none, as outside a step).
    pub fn begin_step(&self, planned: Option<Arc<step_ops::Planned>>) {
        if let Ok(mut c) = self.cursor.lock() {
            c.start(planned);
        }
    }

    /// One step of `graph` on inputs already on the device
    /// (`forward_bufs`), its ops annotated by the fusion pass.
    pub fn forward_fused<G: Graph>(
        &self,
        graph: &G,
        weights: &G::Weights<DevStore>,
        kv: &mut DevKvCache,
        bufs: &StepBufs<DevIdx<'_>, DevBatch<'_>>,
    ) -> Result<Option<DevBuf>> {
        let planned = self.plan_step(
            graph,
            weights,
            kv,
            (bufs.n, bufs.n_rows, bufs.rows_all, bufs.hidden),
        );
        self.begin_step(planned);
        let r = graph.forward_bufs(weights, self, kv, bufs);
        self.begin_step(None);
        r
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
            let bytes = w.matrix(gguf)?.data;
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
        let mut r: Vec<(String, String, u64)> = self
            .counts
            .lock()
            .map(|c| {
                c.iter()
                    .map(|(k, (n, _))| (k.to_string(), "cuda".to_string(), *n))
                    .collect()
            })
            .unwrap_or_default();
        // Matmuls that read norm-ahead's blocks (launched or captured).
        let na = self
            .be
            .norm_ahead_runs
            .load(std::sync::atomic::Ordering::Relaxed);
        if na > 0 {
            r.push(("norm_ahead".into(), "cuda".into(), na));
        }
        // gate/up matvecs that computed the SwiGlu too.
        let glu = self.be.glu_runs.load(std::sync::atomic::Ordering::Relaxed);
        if glu > 0 {
            r.push(("mat_muls_glu".into(), "cuda".into(), glu));
        }
        r
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

    /// An activation of `len` elements from the pool (allocated, in its
    /// size class, only outside a graph capture), cleared with a memset
    /// when `clear` (the `zeros` contract; `output`'s buffers are written
    /// whole by their op).
    fn pooled(&self, len: usize, clear: bool) -> Result<DevBuf> {
        let reused = self
            .pool
            .bufs
            .lock()
            .map_err(|_| anyhow!("cuda: buffer pool lock poisoned"))?
            .take(len);
        let data = match reused {
            Some(mut d) => {
                if self.capturing.load(Ordering::Relaxed) {
                    self.pool
                        .pinned
                        .lock()
                        .map_err(|_| anyhow!("cuda: buffer pool lock poisoned"))?
                        .insert(dev_addr(&d));
                }
                if clear {
                    drv(
                        self.be.stream().memset_zeros(&mut d),
                        "zeroing an activation",
                    )?;
                }
                d
            }
            None if self.capturing.load(Ordering::Relaxed) => {
                return Err(anyhow::Error::new(pool::NoPooledBuffer(len)))
            }
            // Fresh allocations are zeroed either way (mem::zeros).
            None => zeros::<f32>(&self.be, pool::size_class(len), "allocating an activation")?,
        };
        Ok(DevBuf {
            data: Some(data),
            len,
            pool: self.pool.clone(),
        })
    }

    /// Adds a free buffer for `len` elements to the pool (outside a
    /// capture: a capture that found none is tried again with it).
    fn pool_add(&self, len: usize) -> Result<()> {
        let d = zeros::<f32>(&self.be, pool::size_class(len), "allocating an activation")?;
        let cap = d.len();
        let evicted = self
            .pool
            .bufs
            .lock()
            .map_err(|_| anyhow!("cuda: buffer pool lock poisoned"))?
            .give(d, cap, false, pool::POOL_CAP_BYTES);
        drop(evicted);
        Ok(())
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
        self.pooled(len, true)
    }
    fn output(&self, len: usize) -> Result<DevBuf> {
        self.pooled(len, false)
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
            kv.geo.block_size,
            kv.geo.n_blocks,
        )?)))
    }
    fn batch_view<'a>(b: &'a DevBatch<'_>) -> &'a DevAttnBatch {
        match b {
            DevBatch::Owned(o) => o,
            DevBatch::Fixed(f) => f,
        }
    }
    fn kv_cells(kv: &DevKvCache) -> usize {
        kv.geo.n_blocks * kv.geo.block_size
    }
    fn kv_layer(kv: &DevKvCache, li: usize) -> Result<DevKv<'_>> {
        let len = kv.layer_len();
        match (kv.k.get(li), kv.v.get(li)) {
            (Some(k), Some(v)) => Ok(DevKv {
                k: k.slice(0..len),
                v: v.slice(0..len),
                block_size: kv.geo.block_size,
                n_kv_heads: kv.geo.n_kv_heads,
                head_dim: kv.geo.head_dim,
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
                block_size: kv.geo.block_size,
                n_kv_heads: kv.geo.n_kv_heads,
                head_dim: kv.geo.head_dim,
            }),
            _ => bail!("KV layer {li} out of range ({n} layers)"),
        }
    }
    fn state_layer_mut(
        kv: &mut DevKvCache,
        i: usize,
    ) -> Result<(CudaViewMut<'_, f32>, CudaViewMut<'_, f32>)> {
        let st = kv
            .states
            .as_mut()
            .context("this KV cache holds no recurrent state")?;
        let (n, g) = (st.conv.len(), st.geo);
        match (st.conv.get_mut(i), st.ssm.get_mut(i)) {
            (Some(c), Some(s)) => Ok((
                c.slice_mut(0..g.conv_len * g.n_slots),
                s.slice_mut(0..g.ssm_len * g.n_slots),
            )),
            _ => bail!("recurrent layer {i} out of range ({n} layers)"),
        }
    }
    fn reset_states(&self, kv: &mut DevKvCache, slots: &[u32]) -> Result<()> {
        if slots.is_empty() {
            return Ok(());
        }
        let st = kv
            .states
            .as_mut()
            .context("this KV cache holds no recurrent state")?;
        let g = st.geo;
        g.check_slots(slots)?;
        self.be.bind()?;
        let s = self.be.stream();
        for &slot in slots {
            let slot = slot as usize;
            for (arr, len) in [(&mut st.conv, g.conv_len), (&mut st.ssm, g.ssm_len)] {
                for l in arr.iter_mut() {
                    let mut v = l.slice_mut(slot * len..(slot + 1) * len);
                    drv(s.memset_zeros(&mut v), "zeroing a recurrent state slot")?;
                }
            }
        }
        Ok(())
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
        // The op's annotation from the step's fusion pass, if the step
        // was planned (`forward_fused`, `begin_step`).
        let fusion = self.cursor.lock().ok().and_then(|mut c| c.take(&op));
        self.be.run_fused(op, self.mode, fusion)?;
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
