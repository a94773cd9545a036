//! Device-resident execution on the `cuda` backend: weights uploaded once
//! at load, the paged KV cache allocated on the device for the whole run,
//! and every op of a step launched on device buffers. A step uploads its
//! inputs (token ids, positions, slots, block tables: a few KB) and
//! downloads only the logits of the rows that asked for them.

use super::Exec;
use crate::backend::cuda::mem::{zeros, Dev, DevAttnBatch, DevKv, DevKvMut, DevMatrix};
use crate::backend::cuda::{drv, CudaBackend};
use crate::backend::{AttnBatch, Backend, Mode, OpT};
use crate::model::weights::{Store, WeightRef};
use crate::quant::GgmlType;
use anyhow::{anyhow, bail, Context, Result};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};
use std::collections::{BTreeMap, HashMap};
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

    pub fn bytes(&self) -> usize {
        2 * self.k.len() * self.n_blocks * self.block_size * self.n_kv_heads * self.head_dim * 2
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
/// reuse (a step allocates the same shapes as the one before it).
type BufPool = Arc<Mutex<HashMap<usize, Vec<CudaSlice<f32>>>>>;

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
        if let (Some(d), Ok(mut p)) = (self.data.take(), self.pool.lock()) {
            // Bounded: steps of ever new shapes (serving) must not hoard
            // memory; past the cap a buffer is simply freed.
            let held: usize = p.iter().map(|(len, v)| len * v.len()).sum();
            if (held + self.len) * 4 <= POOL_CAP_BYTES {
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
}

impl CudaExec {
    pub fn new(be: Arc<CudaBackend>, mode: Mode) -> Self {
        CudaExec {
            be,
            mode,
            counts: Mutex::new(BTreeMap::new()),
            profile: std::env::var("QUIRE_PROFILE_OPS").is_ok_and(|v| v == "1"),
            pool: Arc::new(Mutex::new(HashMap::new())),
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
                    .up(bytes, &format!("uploading {}", w.name))
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

impl Exec for CudaExec {
    type M = Dev;
    type S = DevStore;
    type Buf = DevBuf;
    type IdxBuf<'i> = (CudaSlice<u32>, usize);
    type BatchBuf<'i> = DevAttnBatch;
    type Kv = DevKvCache;

    fn zeros(&self, len: usize) -> Result<DevBuf> {
        let reused = self
            .pool
            .lock()
            .map_err(|_| anyhow!("cuda: buffer pool lock poisoned"))?
            .get_mut(&len)
            .and_then(|v| v.pop());
        let data = match reused {
            Some(mut d) => {
                drv(
                    self.be.stream().memset_zeros(&mut d),
                    "zeroing an activation",
                )?;
                d
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
    fn idx(&self, v: &[u32]) -> Result<(CudaSlice<u32>, usize)> {
        Ok((self.be.up(v, "uploading step indices")?, v.len()))
    }
    fn idx_view<'a>(b: &'a (CudaSlice<u32>, usize)) -> CudaView<'a, u32> {
        b.0.slice(0..b.1)
    }
    fn batch<'i>(&self, kv: &DevKvCache, b: AttnBatch<'i>) -> Result<DevAttnBatch> {
        DevAttnBatch::upload(&self.be, &b, kv.block_size, kv.n_blocks)
    }
    fn batch_view(b: &DevAttnBatch) -> &DevAttnBatch {
        b
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
        let kind = op.kind();
        if !Backend::<Dev>::supports_op(self.be.as_ref(), &op, self.mode) {
            let why = self
                .be
                .capability(&op.info(), self.mode)
                .err()
                .unwrap_or_else(|| "the backend is disabled".into());
            bail!("op {kind} cannot run on the cuda device path: {why}");
        }
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
    fn download(&self, b: DevBuf) -> Result<Vec<f32>> {
        let mut h = vec![0f32; b.len];
        self.be.down(b.slice(), &mut h, "downloading logits")?;
        self.be.sync("step")?;
        Ok(h)
    }
}
