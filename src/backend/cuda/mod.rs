//! The `cuda` backend: CUDA C kernels (`kernels/<op>.cu`) compiled at run
//! time by NVRTC for the device's architecture, driven through `cudarc`
//! with dynamic loading (the binary builds and starts without CUDA).
//!
//! Every kernel follows the canonical arithmetic of
//! `src/backend/cpu/canon.rs` (explicitly rounded intrinsics, no FMA
//! contraction, the project's own exp/sin/cos, the same lanes and trees), so
//! in `exact` mode its results are bitwise equal to the `cpu` backend's.
//! `fast` and `deterministic` currently run the same kernels.
//!
//! Op interface: ops carry host slices. Each run uploads the inputs, runs
//! the kernels and downloads the outputs. Weights (`QMatrix.data`, which
//! lives in the model's mmap for the whole run) are uploaded once and cached
//! on the device, keyed by (address, length, content fingerprint).
//! Attention uploads only the KV blocks its block tables reference (the
//! kernel reads them through a remapped block table); a device-resident KV
//! cache is the next step.

pub mod source;

use crate::backend::cpu::CpuBackend;
use crate::backend::{AttnBatch, Backend, GpuMode, KvLayer, KvLayerMut, Mode, Op, QMatrix};
use crate::quant::GgmlType;
use anyhow::{anyhow, bail, ensure, Context, Result};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Compiled kernels and the device they run on.
struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    funcs: HashMap<&'static str, CudaFunction>,
}

/// Weight cache key: (address, length, fingerprint of the first and last
/// bytes) — the address alone could be reused by a later allocation.
type WeightKey = (usize, usize, u64);

/// The `cuda` backend. See the module doc.
pub struct CudaBackend {
    gpu_mode: GpuMode,
    dev: Device,
    name: String,
    arch: String,
    weights: Mutex<HashMap<WeightKey, Arc<CudaSlice<u8>>>>,
    /// Serializes runs (one stream, one set of scratch buffers).
    lock: Mutex<()>,
    /// `auto` only: set after a launch/transfer error; the failing op then
    /// runs on `fallback` and every later op is declined (dispatch falls
    /// back to its cpu backend).
    disabled: Mutex<Option<String>>,
    fallback: Option<CpuBackend>,
}

fn drv<T>(r: std::result::Result<T, cudarc::driver::DriverError>, what: &str) -> Result<T> {
    r.map_err(|e| anyhow!("CUDA driver error in {what}: {e:?}"))
}

fn ty_code(ty: GgmlType) -> Option<i32> {
    Some(match ty {
        GgmlType::Q4_0 => 0,
        GgmlType::Q4_1 => 1,
        GgmlType::Q5_0 => 2,
        GgmlType::Q5_1 => 3,
        GgmlType::Q8_0 => 4,
        GgmlType::Q4_K => 10,
        GgmlType::Q5_K => 11,
        GgmlType::Q6_K => 12,
        GgmlType::F32 => 20,
        GgmlType::F16 => 21,
        GgmlType::BF16 => 22,
        GgmlType::Q8_1 | GgmlType::Q8_K => return None,
    })
}

fn i32_of(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| anyhow!("{what} = {v} exceeds the CUDA kernels' i32 range"))
}

fn grid_1d(len: usize, threads: u32) -> Result<LaunchConfig> {
    let blocks = len.div_ceil(threads as usize);
    let blocks = u32::try_from(blocks).map_err(|_| anyhow!("{len} elements: grid too large"))?;
    Ok(LaunchConfig {
        grid_dim: (blocks.max(1), 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    })
}

fn fingerprint(d: &[u8]) -> u64 {
    // FNV-1a over the first and last 64 bytes.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let n = d.len();
    for &b in d[..n.min(64)].iter().chain(&d[n.saturating_sub(64)..]) {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

impl CudaBackend {
    /// Opens device 0 and compiles every kernel for its architecture.
    /// `gpu_mode` decides what an op the backend cannot run does: `required`
    /// makes it an error; `auto` lets dispatch fall back. `GpuMode::Off` is
    /// refused (the caller must not build a CUDA backend then).
    pub fn new(gpu_mode: GpuMode) -> Result<Self> {
        if gpu_mode == GpuMode::Off {
            bail!("cuda backend: --gpu off never opens a device");
        }
        if !source::driver_present() {
            bail!("cuda backend: the CUDA driver library (libcuda) was not found");
        }
        if !source::nvrtc_present() {
            bail!(
                "cuda backend: NVRTC (libnvrtc) was not found; it compiles the kernels at run time"
            );
        }
        let n = drv(CudaContext::device_count(), "cuDeviceGetCount")?;
        if n < 1 {
            bail!("cuda backend: no CUDA device");
        }
        let ctx = drv(CudaContext::new(0), "opening device 0")?;
        let (maj, min) = drv(ctx.compute_capability(), "compute capability")?;
        let arch = format!("sm_{maj}{min}");
        let name = drv(ctx.name(), "device name")?;
        let stream = ctx.default_stream();
        let mut funcs = HashMap::new();
        for (stem, _, entries) in source::KERNELS {
            let ptx = source::compile(stem, &arch)?;
            let module = drv(ctx.load_module(ptx), &format!("loading module {stem}"))?;
            for &e in entries.iter() {
                let f = drv(module.load_function(e), &format!("kernel {e} of {stem}.cu"))?;
                funcs.insert(e, f);
            }
        }
        // Runs only the one op that hit a device error (later ops are
        // declined and go to the dispatcher's own cpu backend): one thread.
        let fallback = if gpu_mode == GpuMode::Auto {
            Some(CpuBackend::new(Some(1))?)
        } else {
            None
        };
        Ok(CudaBackend {
            gpu_mode,
            dev: Device { ctx, stream, funcs },
            name,
            arch,
            weights: Mutex::new(HashMap::new()),
            lock: Mutex::new(()),
            disabled: Mutex::new(None),
            fallback,
        })
    }

    /// Device name and architecture, e.g. "NVIDIA H100 80GB HBM3 (sm_90)".
    pub fn device_description(&self) -> String {
        format!("{} ({})", self.name, self.arch)
    }

    /// Drops every cached weight upload (the parity harness calls this
    /// between cases, whose host buffers are freed and reused).
    pub fn clear_weight_cache(&self) {
        if let Ok(mut w) = self.weights.lock() {
            w.clear();
        }
    }

    /// Why this backend cannot run `op` in `mode`, or Ok. Exhaustive over
    /// `Op`: the single source of capability.
    pub fn capability(&self, op: &Op<'_>, mode: Mode) -> std::result::Result<(), String> {
        // Every mode runs the exact kernels (fast = deterministic = exact).
        let _ = mode;
        match op {
            Op::MatMul { w, .. } => match ty_code(w.ty) {
                Some(_) => Ok(()),
                None => Err(format!("{:?} is not a weight type", w.ty)),
            },
            Op::GetRows { table, .. } => match ty_code(table.ty) {
                Some(_) => Ok(()),
                None => Err(format!("{:?} is not a weight type", table.ty)),
            },
            Op::PagedAttention { cache, .. } => {
                if cache.head_dim <= 256 {
                    Ok(())
                } else {
                    Err(format!(
                        "head_dim {} > 256 (the attention kernel keeps 8 values per thread)",
                        cache.head_dim
                    ))
                }
            }
            Op::RmsNorm { .. }
            | Op::Rope { .. }
            | Op::SwiGlu { .. }
            | Op::Add { .. }
            | Op::AddBias { .. }
            | Op::KvWrite { .. } => Ok(()),
        }
    }

    fn func(&self, name: &str) -> Result<&CudaFunction> {
        self.dev
            .funcs
            .get(name)
            .ok_or_else(|| anyhow!("cuda backend: kernel {name} not loaded"))
    }

    fn up<T: DeviceRepr>(&self, h: &[T], what: &str) -> Result<CudaSlice<T>> {
        if h.is_empty() {
            // cudarc cannot allocate 0 elements on every driver; 1 is harmless.
            // SAFETY: a 1-element allocation that no kernel reads (len 0 ops
            // return before launching).
            return drv(unsafe { self.dev.stream.alloc::<T>(1) }, what);
        }
        drv(self.dev.stream.clone_htod(h), what)
    }

    fn scratch<T: DeviceRepr>(&self, len: usize, what: &str) -> Result<CudaSlice<T>> {
        // SAFETY: uninitialized device memory; every kernel that reads a
        // scratch buffer runs after the kernel that writes all of it.
        drv(unsafe { self.dev.stream.alloc::<T>(len.max(1)) }, what)
    }

    fn down<T: DeviceRepr>(&self, d: &CudaSlice<T>, h: &mut [T], what: &str) -> Result<()> {
        if h.is_empty() {
            return Ok(());
        }
        let v = d.slice(0..h.len());
        drv(self.dev.stream.memcpy_dtoh(&v, h), what)
    }

    fn sync(&self, what: &str) -> Result<()> {
        drv(self.dev.stream.synchronize(), what)
    }

    fn weight(&self, w: &QMatrix<'_>) -> Result<Arc<CudaSlice<u8>>> {
        let key = (w.data.as_ptr() as usize, w.data.len(), fingerprint(w.data));
        let mut cache = self
            .weights
            .lock()
            .map_err(|_| anyhow!("cuda backend: weight cache lock poisoned"))?;
        if let Some(s) = cache.get(&key) {
            return Ok(s.clone());
        }
        let s = Arc::new(self.up(w.data, "uploading a weight matrix")?);
        cache.insert(key, s.clone());
        Ok(s)
    }

    fn run_gpu(&self, op: &mut Op<'_>) -> Result<()> {
        let _g = self
            .lock
            .lock()
            .map_err(|_| anyhow!("cuda backend: lock poisoned"))?;
        drv(self.dev.ctx.bind_to_thread(), "binding the context")?;
        match op {
            Op::MatMul { w, x, n, out } => self.matmul(*w, x, *n, out),
            Op::RmsNorm {
                x,
                w,
                dim,
                eps,
                out,
            } => self.rms_norm(x, w, *dim, *eps, out),
            Op::Rope {
                x,
                n_heads,
                head_dim,
                rope_dim,
                positions,
                inv_freq,
                neox,
            } => self.rope(
                x, *n_heads, *head_dim, *rope_dim, positions, inv_freq, *neox,
            ),
            Op::SwiGlu { gate, up, out } => self.swiglu(gate, up, out),
            Op::GetRows { table, ids, out } => self.get_rows(*table, ids, out),
            Op::Add { x, y } => self.add(x, y),
            Op::AddBias { x, bias } => self.add_bias(x, bias),
            Op::KvWrite { k, v, slots, cache } => self.kv_write(k, v, slots, cache),
            Op::PagedAttention {
                q,
                n_heads,
                scale,
                cache,
                batch,
                out,
            } => self.attention(q, *n_heads, *scale, *cache, *batch, out),
        }
    }

    fn matmul(&self, w: QMatrix<'_>, x: &[f32], n: usize, out: &mut [f32]) -> Result<()> {
        let (m, k) = (w.rows, w.cols);
        let tc =
            ty_code(w.ty).ok_or_else(|| anyhow!("mat_mul: {:?} is not a weight type", w.ty))?;
        crate::backend::validate::mat_mul(&w, x.len(), n, out.len())?;
        if n == 0 || m == 0 {
            return Ok(());
        }
        if k == 0 {
            out.fill(0.0);
            return Ok(());
        }
        let (mi, ki, ni) = (i32_of(m, "m")?, i32_of(k, "k")?, i32_of(n, "n")?);
        i32_of(n * k, "n * k")?;
        let wd = self.weight(&w)?;
        let xd = self.up(x, "mat_mul: uploading x")?;
        let mut od = self.scratch::<f32>(n * m, "mat_mul: out")?;
        let s = &self.dev.stream;
        let ra: i32 = match n {
            1 => 1,
            2..=4 => 4,
            5..=8 => 8,
            _ => 32,
        };
        let rw = 32 / ra as u32;
        let qcfg = LaunchConfig {
            grid_dim: (
                u32::try_from((m as u64).div_ceil(rw as u64))?,
                u32::try_from((n as u64).div_ceil(ra as u64))?,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        match w.ty {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
                let f = self.func("mm_float")?;
                let cfg = grid_1d(n * m * 32, 256)?;
                let mut b = s.launch_builder(f);
                b.arg(wd.as_ref())
                    .arg(&mi)
                    .arg(&ki)
                    .arg(&tc)
                    .arg(&xd)
                    .arg(&ni)
                    .arg(&mut od);
                // SAFETY: argument types match mm_float's signature; buffers
                // hold m*k weights, n*k inputs and n*m outputs (checked above).
                drv(unsafe { b.launch(cfg) }, "mat_mul: launching mm_float")?;
            }
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
                let nb = k / 256;
                let mut qs = self.scratch::<i16>(n * k, "mat_mul: act q")?;
                let mut ad = self.scratch::<f32>(n * nb, "mat_mul: act d")?;
                let mut bs = self.scratch::<i32>(n * nb * 16, "mat_mul: act bsum")?;
                let f = self.func("quant_actk")?;
                let mut b = s.launch_builder(f);
                b.arg(&xd)
                    .arg(&ni)
                    .arg(&ki)
                    .arg(&mut qs)
                    .arg(&mut ad)
                    .arg(&mut bs);
                // SAFETY: matches quant_actk; n*k inputs, n*k q, n*nb d, n*nb*16 sums.
                drv(
                    unsafe { b.launch(grid_1d(n * nb, 128)?) },
                    "mat_mul: launching quant_actk",
                )?;
                let f = self.func("mm_qk")?;
                let mut b = s.launch_builder(f);
                b.arg(wd.as_ref())
                    .arg(&mi)
                    .arg(&ki)
                    .arg(&tc)
                    .arg(&qs)
                    .arg(&ad)
                    .arg(&bs)
                    .arg(&ni)
                    .arg(&ra)
                    .arg(&mut od);
                // SAFETY: matches mm_qk; buffers sized as above.
                drv(unsafe { b.launch(qcfg) }, "mat_mul: launching mm_qk")?;
            }
            _ => {
                let nb = k / 32;
                let mut qs = self.scratch::<i16>(n * k, "mat_mul: act q")?;
                let mut ad = self.scratch::<f32>(n * nb, "mat_mul: act d")?;
                let mut asum = self.scratch::<f32>(n * nb, "mat_mul: act s")?;
                let f = self.func("quant_act32")?;
                let mut b = s.launch_builder(f);
                b.arg(&xd)
                    .arg(&ni)
                    .arg(&ki)
                    .arg(&mut qs)
                    .arg(&mut ad)
                    .arg(&mut asum);
                // SAFETY: matches quant_act32; n*k inputs, n*k q, n*nb d and s.
                drv(
                    unsafe { b.launch(grid_1d(n * nb, 128)?) },
                    "mat_mul: launching quant_act32",
                )?;
                let f = self.func("mm_q32")?;
                let mut b = s.launch_builder(f);
                b.arg(wd.as_ref())
                    .arg(&mi)
                    .arg(&ki)
                    .arg(&tc)
                    .arg(&qs)
                    .arg(&ad)
                    .arg(&asum)
                    .arg(&ni)
                    .arg(&ra)
                    .arg(&mut od);
                // SAFETY: matches mm_q32; buffers sized as above.
                drv(unsafe { b.launch(qcfg) }, "mat_mul: launching mm_q32")?;
            }
        }
        self.down(&od, out, "mat_mul: downloading out")?;
        self.sync("mat_mul")
    }

    fn rms_norm(&self, x: &[f32], w: &[f32], dim: usize, eps: f32, out: &mut [f32]) -> Result<()> {
        ensure!(
            dim > 0 && w.len() == dim && x.len().is_multiple_of(dim) && out.len() == x.len(),
            "rms_norm: x {} / out {} / w {} elements, dim {dim}",
            x.len(),
            out.len(),
            w.len()
        );
        let n = x.len() / dim;
        if n == 0 {
            return Ok(());
        }
        let (ni, di) = (i32_of(n, "rows")?, i32_of(dim, "dim")?);
        let xd = self.up(x, "rms_norm: x")?;
        let wd = self.up(w, "rms_norm: w")?;
        let mut od = self.scratch::<f32>(x.len(), "rms_norm: out")?;
        let f = self.func("rms_norm")?;
        let mut b = self.dev.stream.launch_builder(f);
        b.arg(&xd).arg(&wd).arg(&ni).arg(&di).arg(&eps).arg(&mut od);
        // SAFETY: matches rms_norm; n*dim inputs/outputs, dim weights.
        drv(
            unsafe { b.launch(grid_1d(n * 32, 256)?) },
            "rms_norm: launch",
        )?;
        self.down(&od, out, "rms_norm: out")?;
        self.sync("rms_norm")
    }

    #[allow(clippy::too_many_arguments)] // the op's fields
    fn rope(
        &self,
        x: &mut [f32],
        n_heads: usize,
        head_dim: usize,
        rope_dim: usize,
        positions: &[u32],
        inv_freq: &[f32],
        neox: bool,
    ) -> Result<()> {
        let n = positions.len();
        ensure!(
            n_heads > 0 && head_dim > 0,
            "rope: n_heads {n_heads} and head_dim {head_dim} must be > 0"
        );
        ensure!(
            rope_dim.is_multiple_of(2) && rope_dim <= head_dim && inv_freq.len() == rope_dim / 2,
            "rope: rope_dim {rope_dim} (head_dim {head_dim}) with {} inv_freq, expected {}",
            inv_freq.len(),
            rope_dim / 2
        );
        ensure!(
            x.len() == n * n_heads * head_dim,
            "rope: x has {} elements, expected n {n} * n_heads {n_heads} * head_dim {head_dim}",
            x.len()
        );
        let total = n * n_heads * (rope_dim / 2);
        if total == 0 {
            return Ok(());
        }
        let mut xd = self.up(x, "rope: x")?;
        let pd = self.up(positions, "rope: positions")?;
        let fd = self.up(inv_freq, "rope: inv_freq")?;
        let (ni, hi, hdi, rdi) = (
            i32_of(n, "n")?,
            i32_of(n_heads, "n_heads")?,
            i32_of(head_dim, "head_dim")?,
            i32_of(rope_dim, "rope_dim")?,
        );
        let nx = neox as i32;
        let f = self.func("rope")?;
        let mut b = self.dev.stream.launch_builder(f);
        b.arg(&mut xd)
            .arg(&ni)
            .arg(&hi)
            .arg(&hdi)
            .arg(&rdi)
            .arg(&pd)
            .arg(&fd)
            .arg(&nx);
        // SAFETY: matches rope; x holds n*n_heads*head_dim, positions n,
        // inv_freq rope_dim/2 (checked above).
        drv(unsafe { b.launch(grid_1d(total, 256)?) }, "rope: launch")?;
        self.down(&xd, x, "rope: x")?;
        self.sync("rope")
    }

    fn swiglu(&self, gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<()> {
        ensure!(
            gate.len() == up.len() && up.len() == out.len(),
            "swiglu: gate {} / up {} / out {} elements differ",
            gate.len(),
            up.len(),
            out.len()
        );
        if out.is_empty() {
            return Ok(());
        }
        let gd = self.up(gate, "swiglu: gate")?;
        let ud = self.up(up, "swiglu: up")?;
        let mut od = self.scratch::<f32>(out.len(), "swiglu: out")?;
        let len = out.len() as i64;
        let f = self.func("swiglu")?;
        let mut b = self.dev.stream.launch_builder(f);
        b.arg(&gd).arg(&ud).arg(&len).arg(&mut od);
        // SAFETY: matches swiglu; all three buffers hold len elements.
        drv(
            unsafe { b.launch(grid_1d(out.len(), 256)?) },
            "swiglu: launch",
        )?;
        self.down(&od, out, "swiglu: out")?;
        self.sync("swiglu")
    }

    fn get_rows(&self, table: QMatrix<'_>, ids: &[u32], out: &mut [f32]) -> Result<()> {
        let tc = ty_code(table.ty)
            .ok_or_else(|| anyhow!("get_rows: {:?} is not a weight type", table.ty))?;
        let rb = crate::backend::validate::get_rows(&table, ids, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        let td = self.weight(&table)?;
        let idd = self.up(ids, "get_rows: ids")?;
        let mut od = self.scratch::<f32>(out.len(), "get_rows: out")?;
        let (ci, ni) = (i32_of(table.cols, "cols")?, i32_of(ids.len(), "ids")?);
        let rbl = rb as i64;
        let f = self.func("get_rows")?;
        let mut b = self.dev.stream.launch_builder(f);
        b.arg(td.as_ref())
            .arg(&ci)
            .arg(&rbl)
            .arg(&tc)
            .arg(&idd)
            .arg(&ni)
            .arg(&mut od);
        // SAFETY: matches get_rows; ids validated < rows; out n_ids*cols.
        drv(
            unsafe { b.launch(grid_1d(out.len(), 256)?) },
            "get_rows: launch",
        )?;
        self.down(&od, out, "get_rows: out")?;
        self.sync("get_rows")
    }

    fn add(&self, x: &mut [f32], y: &[f32]) -> Result<()> {
        ensure!(
            x.len() == y.len(),
            "add: x has {} elements, y {}",
            x.len(),
            y.len()
        );
        if x.is_empty() {
            return Ok(());
        }
        let mut xd = self.up(x, "add: x")?;
        let yd = self.up(y, "add: y")?;
        let len = x.len() as i64;
        let f = self.func("add")?;
        let mut b = self.dev.stream.launch_builder(f);
        b.arg(&mut xd).arg(&yd).arg(&len);
        // SAFETY: matches add; both buffers hold len elements.
        drv(unsafe { b.launch(grid_1d(x.len(), 256)?) }, "add: launch")?;
        self.down(&xd, x, "add: x")?;
        self.sync("add")
    }

    fn add_bias(&self, x: &mut [f32], bias: &[f32]) -> Result<()> {
        let dim = bias.len();
        ensure!(
            dim > 0 && x.len().is_multiple_of(dim),
            "add_bias: x has {} elements, not rows of bias dim {dim}",
            x.len()
        );
        if x.is_empty() {
            return Ok(());
        }
        let mut xd = self.up(x, "add_bias: x")?;
        let bd = self.up(bias, "add_bias: bias")?;
        let len = x.len() as i64;
        let di = i32_of(dim, "dim")?;
        let f = self.func("add_bias")?;
        let mut b = self.dev.stream.launch_builder(f);
        b.arg(&mut xd).arg(&bd).arg(&len).arg(&di);
        // SAFETY: matches add_bias; x holds len, bias dim elements.
        drv(
            unsafe { b.launch(grid_1d(x.len(), 256)?) },
            "add_bias: launch",
        )?;
        self.down(&xd, x, "add_bias: x")?;
        self.sync("add_bias")
    }

    fn kv_write(
        &self,
        k: &[f32],
        v: &[f32],
        slots: &[u32],
        cache: &mut KvLayerMut<'_>,
    ) -> Result<()> {
        let row = cache.n_kv_heads * cache.head_dim;
        ensure!(
            row > 0 && cache.block_size > 0,
            "kv_write: n_kv_heads {} / head_dim {} / block_size {} must be > 0",
            cache.n_kv_heads,
            cache.head_dim,
            cache.block_size
        );
        ensure!(
            cache.k.len() == cache.v.len()
                && cache.k.len().is_multiple_of(cache.block_size * row),
            "kv_write: cache k {} / v {} elements, not whole blocks of (block_size {}, n_kv_heads {}, head_dim {})",
            cache.k.len(),
            cache.v.len(),
            cache.block_size,
            cache.n_kv_heads,
            cache.head_dim
        );
        ensure!(
            k.len() == slots.len() * row && v.len() == k.len(),
            "kv_write: k {} / v {} elements, expected n {} * n_kv_heads {} * head_dim {}",
            k.len(),
            v.len(),
            slots.len(),
            cache.n_kv_heads,
            cache.head_dim
        );
        let n_cells = cache.k.len() / row;
        for (i, &s) in slots.iter().enumerate() {
            ensure!(
                (s as usize) < n_cells,
                "kv_write: slot {s} of row {i} out of range (cache has {n_cells} cells)"
            );
        }
        if k.is_empty() {
            return Ok(());
        }
        let kd = self.up(k, "kv_write: k")?;
        let vd = self.up(v, "kv_write: v")?;
        let mut k16 = self.scratch::<u16>(k.len(), "kv_write: k16")?;
        let mut v16 = self.scratch::<u16>(k.len(), "kv_write: v16")?;
        let len = k.len() as i64;
        let f = self.func("kv_write")?;
        let mut b = self.dev.stream.launch_builder(f);
        b.arg(&kd).arg(&vd).arg(&len).arg(&mut k16).arg(&mut v16);
        // SAFETY: matches kv_write; all four buffers hold len elements.
        drv(
            unsafe { b.launch(grid_1d(k.len(), 256)?) },
            "kv_write: launch",
        )?;
        let mut kh = vec![0u16; k.len()];
        let mut vh = vec![0u16; k.len()];
        self.down(&k16, &mut kh, "kv_write: k16")?;
        self.down(&v16, &mut vh, "kv_write: v16")?;
        self.sync("kv_write")?;
        // Store row i into cell slots[i], in row order (a repeated slot keeps
        // the last row, as on the CPU).
        let (kh, vh): (&[half::f16], &[half::f16]) = (kh.reinterpret_cast(), vh.reinterpret_cast());
        for (i, &s) in slots.iter().enumerate() {
            let dst = s as usize * row;
            cache.k[dst..dst + row].copy_from_slice(&kh[i * row..(i + 1) * row]);
            cache.v[dst..dst + row].copy_from_slice(&vh[i * row..(i + 1) * row]);
        }
        Ok(())
    }

    fn attention(
        &self,
        q: &[f32],
        n_heads: usize,
        scale: f32,
        cache: KvLayer<'_>,
        batch: AttnBatch<'_>,
        out: &mut [f32],
    ) -> Result<()> {
        let (hd, nkv, bs) = (cache.head_dim, cache.n_kv_heads, cache.block_size);
        ensure!(
            hd > 0 && nkv > 0 && bs > 0 && n_heads > 0,
            "paged_attention: head_dim {hd}, n_kv_heads {nkv}, block_size {bs}, n_heads {n_heads} must be > 0"
        );
        ensure!(
            hd <= 256,
            "paged_attention: head_dim {hd} > 256 is not supported by the CUDA kernel"
        );
        ensure!(
            n_heads.is_multiple_of(nkv),
            "paged_attention: n_heads {n_heads} is not a multiple of n_kv_heads {nkv}"
        );
        let block_elems = bs * nkv * hd;
        ensure!(
            cache.k.len() == cache.v.len() && cache.k.len().is_multiple_of(block_elems),
            "paged_attention: cache k {} / v {} elements, not whole blocks of (block_size {bs}, n_kv_heads {nkv}, head_dim {hd})",
            cache.k.len(),
            cache.v.len()
        );
        let n_blocks = cache.k.len() / block_elems;
        let n_rows = batch.positions.len();
        ensure!(
            batch.row_seq.len() == n_rows,
            "paged_attention: row_seq has {} entries, positions {}",
            batch.row_seq.len(),
            n_rows
        );
        let rowlen = n_heads * hd;
        ensure!(
            q.len() == n_rows * rowlen && out.len() == q.len(),
            "paged_attention: q {} / out {} elements, expected n_rows {n_rows} * n_heads {n_heads} * head_dim {hd}",
            q.len(),
            out.len()
        );
        // Blocks each sequence needs (max over its rows).
        let mut need = vec![0usize; batch.block_tables.len()];
        for r in 0..n_rows {
            let s = batch.row_seq[r] as usize;
            ensure!(
                s < batch.block_tables.len(),
                "paged_attention: row {r} names sequence {s}, only {} block tables",
                batch.block_tables.len()
            );
            let nb = batch.positions[r] as usize / bs + 1;
            let table = batch.block_tables[s];
            ensure!(
                table.len() >= nb,
                "paged_attention: row {r} at position {} needs {nb} blocks of {bs}, table has {}",
                batch.positions[r],
                table.len()
            );
            for (i, &b) in table[..nb].iter().enumerate() {
                ensure!(
                    (b as usize) < n_blocks,
                    "paged_attention: block table {s} entry {i} = {b} out of range ({n_blocks} blocks)"
                );
            }
            need[s] = need[s].max(nb);
        }
        if n_rows == 0 {
            return Ok(());
        }
        // Upload only the referenced blocks; remap the tables onto them.
        let mut remap: HashMap<u32, u32> = HashMap::new();
        let mut order: Vec<u32> = Vec::new();
        let mut flat: Vec<u32> = Vec::new();
        let mut offs: Vec<u32> = Vec::with_capacity(need.len());
        for (s, &nb) in need.iter().enumerate() {
            offs.push(u32::try_from(flat.len())?);
            for &b in &batch.block_tables[s][..nb] {
                let c = *remap.entry(b).or_insert_with(|| {
                    order.push(b);
                    (order.len() - 1) as u32
                });
                flat.push(c);
            }
        }
        let mut kc: Vec<u16> = Vec::with_capacity(order.len() * block_elems);
        let mut vc: Vec<u16> = Vec::with_capacity(order.len() * block_elems);
        let (kb, vb): (&[u16], &[u16]) = (cache.k.reinterpret_cast(), cache.v.reinterpret_cast());
        for &b in &order {
            let o = b as usize * block_elems;
            kc.extend_from_slice(&kb[o..o + block_elems]);
            vc.extend_from_slice(&vb[o..o + block_elems]);
        }
        let qd = self.up(q, "paged_attention: q")?;
        let kd = self.up(&kc, "paged_attention: k blocks")?;
        let vd = self.up(&vc, "paged_attention: v blocks")?;
        let td = self.up(&flat, "paged_attention: tables")?;
        let od_ = self.up(&offs, "paged_attention: table offsets")?;
        let rsd = self.up(batch.row_seq, "paged_attention: row_seq")?;
        let psd = self.up(batch.positions, "paged_attention: positions")?;
        let mut od = self.scratch::<f32>(out.len(), "paged_attention: out")?;
        let (nri, nhi, nkvi, hdi, bsi) = (
            i32_of(n_rows, "n_rows")?,
            i32_of(n_heads, "n_heads")?,
            i32_of(nkv, "n_kv_heads")?,
            i32_of(hd, "head_dim")?,
            i32_of(bs, "block_size")?,
        );
        let blocks = u32::try_from(n_rows * n_heads)?;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        let f = self.func("paged_attention")?;
        let mut b = self.dev.stream.launch_builder(f);
        b.arg(&qd)
            .arg(&nri)
            .arg(&nhi)
            .arg(&nkvi)
            .arg(&hdi)
            .arg(&bsi)
            .arg(&scale)
            .arg(&kd)
            .arg(&vd)
            .arg(&td)
            .arg(&od_)
            .arg(&rsd)
            .arg(&psd)
            .arg(&mut od);
        // SAFETY: matches paged_attention; every table entry a row reads was
        // validated and remapped into the uploaded blocks; q/out hold
        // n_rows*n_heads*head_dim; head_dim <= 256 (shared q buffer).
        drv(unsafe { b.launch(cfg) }, "paged_attention: launch")?;
        self.down(&od, out, "paged_attention: out")?;
        self.sync("paged_attention")
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    /// `auto`: the ops this backend can run (until a device error disables
    /// it). `required`: every op, so that one it cannot run fails in `run`
    /// with the op and the reason instead of falling back.
    fn supports_op(&self, op: &Op<'_>, mode: Mode) -> bool {
        match self.gpu_mode {
            GpuMode::Required => true,
            GpuMode::Off => false,
            GpuMode::Auto => {
                // After a device error the backend declines everything, so
                // dispatch (and its per-backend counts) moves to the cpu.
                let disabled = self.disabled.lock().map(|d| d.is_some()).unwrap_or(true);
                !disabled && self.capability(op, mode).is_ok()
            }
        }
    }

    fn run(&self, mut op: Op<'_>, mode: Mode) -> Result<()> {
        let kind = op.kind();
        if let Err(why) = self.capability(&op, mode) {
            bail!("op {kind} cannot run on the cuda backend ({mode:?}): {why}");
        }
        let disabled = self
            .disabled
            .lock()
            .map_err(|_| anyhow!("cuda backend: state lock poisoned"))?
            .clone();
        if let Some(why) = disabled {
            return match &self.fallback {
                Some(cpu) => cpu.run(op, mode),
                None => bail!("op {kind}: cuda backend disabled: {why}"),
            };
        }
        match self.run_gpu(&mut op) {
            Ok(()) => Ok(()),
            Err(e) => {
                // Device failures (not bad input) disable the backend in auto.
                let device_err = format!("{e:#}").contains("CUDA driver error");
                match (&self.fallback, device_err) {
                    (Some(cpu), true) => {
                        let why = format!("{e:#}");
                        tracing::warn!(
                            "cuda backend failed on op {kind}: {why}; running this and every later op on the cpu"
                        );
                        eprintln!("warning: cuda backend failed on op {kind}: {why}; falling back to the cpu");
                        if let Ok(mut d) = self.disabled.lock() {
                            *d = Some(why);
                        }
                        cpu.run(op, mode)
                            .with_context(|| format!("op {kind}: cpu fallback after a cuda error"))
                    }
                    _ => Err(e.context(format!("op {kind} on cuda"))),
                }
            }
        }
    }
}
