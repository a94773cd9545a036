//! The `cuda` backend: CUDA C kernels (`ops/<family>/kernels/<op>.cu`) compiled at run
//! time by NVRTC for the device's architecture, driven through `cudarc`
//! with dynamic loading (the binary builds and starts without CUDA).
//!
//! The `exact` kernels (`<op>.cu`) follow the canonical arithmetic of
//! `src/backend/cpu/canon.rs` (explicitly rounded intrinsics, no FMA
//! contraction, the project's own exp/sin/cos, the same lanes and trees), so
//! in `exact` mode results are bitwise equal to the `cpu` backend's;
//! `deterministic` and `fast` run the kernels of `<op>_fast.cu` where they
//! differ (docs/DETERMINISM.md).
//!
//! Rooms: `device/` (context, memory, kernel loading, NVRTC and its cache,
//! graphs and PDL), `ops/` (the kernel table and one room per op family),
//! `tuning/` (the table).
//!
//! Two memory spaces, one set of kernels (`ops/`):
//! * `Backend<Dev>` (`run_dev.rs`, buffers in `device/memory.rs`): ops over
//!   device buffers. A model step runs entirely on the device through
//!   `dispatch::cuda::CudaExec`: weights uploaded once, the paged KV cache
//!   and block tables resident, K/V read through the block table inside
//!   the attention kernel.
//! * `Backend<Host>` (`host.rs`): ops over host slices, uploaded and
//!   downloaded per op (the parity harness; single-op fallback).

pub mod device;
mod host;
mod ops;
mod run_dev;
pub use device::pinned::PinnedLogits;
pub use ops::collective::{nccl_present, NcclComm};
pub use ops::kernels;

pub use device::pdl::PdlExec;
/// The scratch arena's first size. Every growth is a new allocation, and
/// every captured decode graph reads the old one, so a growth drops them
/// all (each is captured again). Decode steps of up to 64 rows of an 8B
/// model fit in this (their int8 activations and split-K partials), so a
/// server's decode graphs are not dropped while its batch grows; a larger
/// prefill grows it once or twice early on.
const ARENA_START: usize = 64 << 20;

pub(crate) use ops::fast_uses_blas;
pub(crate) use ops::L2Bufs;
pub(crate) use ops::{device_draws, draw_record, GreedyRing, DRAW_WORDS, GREEDY_SLOTS};
pub mod fusion;
mod tuning;
pub(crate) use device::drv;
use device::step_times;
use device::sync_count::SyncCount;
use device::{allow_smem, Device};
pub use tuning::{
    arch_major, AttentionTuning, MatmulTuning, MatvecTuning, RuntimeTuning, Switch, Tuning,
    TuningOverrides,
};

use crate::backend::cpu::CpuBackend;
use crate::backend::{GpuMode, Mode, OpInfo};
use crate::quant::GgmlType;
use anyhow::{anyhow, bail, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Weight cache key: (address, length, fingerprint of the first and last
/// bytes) — the address alone could be reused by a later allocation.
type WeightKey = (usize, usize, u64);

/// The `cuda` backend. See the module doc.
/// Zero bytes after every weight tensor on the device (see up_weight).
pub(crate) const WEIGHT_PAD: usize = 16;

/// Starts (`on`) or stops the CUDA profiler's collection, for
/// `ncu --profile-from-start off` around chosen work (`quire bench` with
/// QUIRE_NCU_STEP). No effect without a CUDA driver.
pub fn profiler_range(on: bool) {
    if !device::compile::driver_present() {
        return;
    }
    // SAFETY: plain driver calls without arguments; they only fail (and
    // are ignored: profiling is optional) when no context is current.
    let _ = unsafe {
        if on {
            cudarc::driver::sys::cuProfilerStart()
        } else {
            cudarc::driver::sys::cuProfilerStop()
        }
    };
}

pub struct CudaBackend {
    gpu_mode: GpuMode,
    /// The tuning table of this device (its architecture's defaults with
    /// the caller's overrides), read by the planners.
    pub(crate) tuning: Tuning,
    dev: Device,
    name: String,
    arch: String,
    /// Streaming multiprocessors (sizes split-K grids).
    sms: usize,
    weights: Mutex<HashMap<WeightKey, Arc<CudaSlice<u8>>>>,
    /// Serializes runs (one stream, one set of scratch buffers).
    lock: Mutex<()>,
    /// Scratch memory of matmul (quantized activations), reused op after
    /// op; see `device/launch.rs`.
    arena: Mutex<CudaSlice<u8>>,
    /// The layout the running op's producer kernel wrote its output in for
    /// the next op's matmul (ops/matmul/prepared.rs), set and cleared with
    /// `op_fusion`: the op's own record, never read by another op.
    op_wrote: Mutex<Option<fusion::ActRead>>,
    /// While a decode graph is captured with the L2 read-ahead: the weights
    /// its matvecs read, in order (ops/l2_ahead).
    l2_log: Mutex<Option<ops::L2Log>>,
    /// The fusion pass's annotation of the op being run (fusion.rs), set
    /// by `run_fused` for the op's duration only: what its output is
    /// written as for the next op, whether it is norm-ahead's producer or
    /// consumer. None outside an executor's planned step.
    op_fusion: Mutex<Option<fusion::OpFusion>>,
    /// Norm-ahead's pending blocks: their key (for the next op only) and
    /// buffer.
    norm_ahead: Mutex<ops::NormAhead>,
    /// How many ops took norm-ahead's blocks (launched or captured).
    pub(crate) norm_ahead_runs: std::sync::atomic::AtomicU64,
    /// gate/up matvecs with the SwiGlu in their epilogue launched or
    /// captured (ops/matmul/glu_launch.rs).
    pub(crate) glu_runs: std::sync::atomic::AtomicU64,
    /// INFO lines already logged (each once per backend: a kernel choice
    /// the tuning table asked for and did not get).
    noted: Mutex<std::collections::HashSet<String>>,
    /// The stream's synchronizations (`sync_ticket` / `synced_past`).
    syncs: SyncCount,
    /// Page-locked buffers the logits downloads land in (a copy into
    /// pageable memory pays a page fault per 4 KiB, and a second host copy
    /// costs as much as the transfer).
    pinned: device::pinned::PinnedPool,
    /// cuBLAS on the backend's stream (fast-mode GEMMs), when libcublas
    /// loads; without it fast mode uses the warp-per-row kernel.
    blas: Option<cudarc::cublas::CudaBlas>,
    /// This backend's NCCL communicator when it is a tensor-parallel rank
    /// (`ops/collective`; set once, after every rank's backend is open).
    comm: std::sync::OnceLock<ops::collective::NcclComm>,
    /// `auto` only: set after a launch/transfer error; the failing op then
    /// runs on `fallback` and every later op is declined (dispatch falls
    /// back to its cpu backend).
    disabled: Mutex<Option<String>>,
    fallback: Option<CpuBackend>,
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

/// CUDA devices on this machine (an error where the driver does not load).
pub fn device_count() -> Result<usize> {
    if !device::compile::driver_present() {
        bail!("the CUDA driver library (libcuda) was not found");
    }
    Ok(drv(CudaContext::device_count(), "cuDeviceGetCount")?.max(0) as usize)
}

impl CudaBackend {
    /// For the parity harness: no cpu fallback after a device error, which
    /// then fails the op that hit it (and stays visible in every later
    /// case) instead of running it on the cpu, where the comparison would
    /// be the reference against itself. `supports_op` still answers from
    /// the backend's capabilities (`auto`), so an op it cannot run stays
    /// UNSUPPORTED.
    pub fn without_fallback(mut self) -> Self {
        self.fallback = None;
        self
    }

    /// Opens device 0 and compiles every kernel for its architecture.
    /// `gpu_mode` decides what an op the backend cannot run does: `required`
    /// makes it an error; `auto` lets dispatch fall back. `GpuMode::Off` is
    /// refused (the caller must not build a CUDA backend then).
    pub fn new(gpu_mode: GpuMode) -> Result<Self> {
        Self::new_tuned(gpu_mode, &TuningOverrides::none())
    }

    /// [`CudaBackend::new`] with `overrides` laid over the device
    /// architecture's tuning defaults (`--tuning FILE`).
    pub fn new_tuned(gpu_mode: GpuMode, overrides: &TuningOverrides) -> Result<Self> {
        Self::new_on(0, gpu_mode, overrides)
    }

    /// [`CudaBackend::new_tuned`] on device `ordinal` (a tensor-parallel
    /// rank's GPU).
    pub fn new_on(ordinal: usize, gpu_mode: GpuMode, overrides: &TuningOverrides) -> Result<Self> {
        if gpu_mode == GpuMode::Off {
            bail!("cuda backend: --gpu off never opens a device");
        }
        if !device::compile::driver_present() {
            bail!("cuda backend: the CUDA driver library (libcuda) was not found");
        }
        if !device::compile::nvrtc_present() {
            bail!(
                "cuda backend: NVRTC (libnvrtc) was not found; it compiles the kernels at run time"
            );
        }
        let n = drv(CudaContext::device_count(), "cuDeviceGetCount")?;
        if n < 1 {
            bail!("cuda backend: no CUDA device");
        }
        if ordinal >= n as usize {
            bail!("cuda backend: no CUDA device {ordinal} (this machine has {n})");
        }
        let ctx = drv(
            CudaContext::new(ordinal),
            &format!("opening device {ordinal}"),
        )?;
        let (maj, min) = drv(ctx.compute_capability(), "compute capability")?;
        let arch = format!("sm_{maj}{min}");
        let tuning = Tuning::resolve(&arch, overrides)?;
        let name = drv(ctx.name(), "device name")?;
        let sms = drv(
            ctx.attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            ),
            "multiprocessor count",
        )?
        .max(1) as usize;
        // One created stream for all work (the legacy default stream cannot
        // be captured into CUDA graphs).
        // SAFETY: every buffer of this backend is used on this one stream
        // only, so cudarc's cross-stream event tracking is not needed;
        // disabled before any buffer exists.
        unsafe { ctx.disable_event_tracking() };
        let stream = drv(ctx.new_stream(), "creating a stream")?;
        let mut att_per_sm = HashMap::new();
        let mut att_clusters = HashMap::new();
        let clusters = device::pdl::arch_major(&arch) >= 9;
        // The Hopper-only kernels, unless the table turns the wgmma GEMM
        // off (then they are not even compiled).
        let sm90a: &[device::KernelFile] = if arch == "sm_90" && tuning.matmul.wgmma != Switch::Off
        {
            ops::kernels::KERNELS_SM90A
        } else {
            &[]
        };
        let funcs = device::load_kernels(
            &ctx,
            &arch,
            ops::kernels::KERNELS,
            sm90a,
            ops::kernels::full_source,
            &mut |e, f| {
                // Kernels past the default 48 KiB of dynamic shared memory
                // opt in to what they use.
                let big_smem = if e == "mm_f16_tile" {
                    Some(ops::TILE_SMEM)
                } else if e.starts_with("mm_q8_mma") {
                    Some(ops::mq_smem_max(e))
                } else if e.starts_with("mm_exact_mma") {
                    ops::xm_smem_max(e)
                } else {
                    ops::attention::att_pipe_smem(e)
                };
                if let Some(bytes) = big_smem {
                    allow_smem(f, bytes, e)?;
                }
                // What the attention planner weighs: occupancy and
                // resident clusters (ops/attention/caps.rs).
                ops::attention::count_at_load(
                    e,
                    f,
                    &stream,
                    clusters,
                    &mut att_per_sm,
                    &mut att_clusters,
                )
            },
            // The GEMMs take more than the default 48 KiB of dynamic
            // shared memory; to_f16_wr takes none.
            &mut |e, f| match ops::wg_smem(e) {
                Some(bytes) => allow_smem(f, bytes, e),
                None => Ok(()),
            },
        )?;
        // Runs only the one op that hit a device error (later ops are
        // declined and go to the dispatcher's own cpu backend): one thread.
        let fallback = if gpu_mode == GpuMode::Auto {
            Some(CpuBackend::new(Some(1))?)
        } else {
            None
        };
        // SAFETY: an allocation nothing reads before writing.
        let arena = drv(
            unsafe { stream.alloc::<u8>(ARENA_START) },
            "allocating the scratch arena",
        )?;
        // SAFETY: only tries to dlopen libcublas by its candidate names
        // (cudarc panics on first use of a missing library otherwise).
        let blas = if unsafe { cudarc::cublas::sys::is_culib_present() } {
            match cudarc::cublas::CudaBlas::new(stream.clone()) {
                Ok(b) => Some(b),
                Err(e) => {
                    tracing::warn!("cuBLAS present but unusable ({e:?}); fast GEMMs disabled");
                    None
                }
            }
        } else {
            None
        };
        Ok(CudaBackend {
            gpu_mode,
            tuning,
            blas,
            arena: Mutex::new(arena),
            op_wrote: Mutex::new(None),
            l2_log: Mutex::new(None),
            syncs: SyncCount::default(),
            op_fusion: Mutex::new(None),
            norm_ahead: Mutex::new(ops::NormAhead::default()),
            norm_ahead_runs: std::sync::atomic::AtomicU64::new(0),
            glu_runs: std::sync::atomic::AtomicU64::new(0),
            noted: Mutex::new(Default::default()),
            pinned: device::pinned::PinnedPool::default(),
            dev: Device {
                ctx,
                stream,
                funcs,
                att_per_sm,
                att_clusters,
            },
            name,
            arch,
            sms,
            weights: Mutex::new(HashMap::new()),
            lock: Mutex::new(()),
            disabled: Mutex::new(None),
            fallback,
            comm: std::sync::OnceLock::new(),
        })
    }

    /// The tuning table this backend runs with.
    pub fn tuning(&self) -> &Tuning {
        &self.tuning
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
    /// Both memory spaces ask this; it depends only on what `OpInfo`
    /// carries (op kind, weight type, head_dim), never on where tensors live.
    pub fn capability(&self, op: &OpInfo, mode: Mode) -> std::result::Result<(), String> {
        // Every op has a kernel in every mode (its family's planner picks
        // it; the hybrid ops one canonical kernel each): only the weight
        // type and the attention's head_dim bound it.
        let _ = mode;
        if matches!(op.kind, "all_gather" | "all_reduce") && self.comm.get().is_none() {
            return Err("a tensor-parallel collective on a backend that is no rank".into());
        }
        if let Some(ty) = op.weight {
            if ty_code(ty).is_none() {
                return Err(format!("{ty:?} is not a weight type"));
            }
        }
        if let Some(t) = op.kv.filter(|&t| t != crate::backend::KvType::F16) {
            return Err(format!(
                "the cuda backend keeps its KV cache in f16, not {t} (use --kv-type f16, or --gpu off)"
            ));
        }
        match op.head_dim {
            // The attention planner's bound: a plan exists for every
            // batch of such heads in every mode.
            Some(hd) => ops::attention::head_dim_supported(hd),
            None => Ok(()),
        }
    }

    /// Logs `line` at INFO the first time this backend sees it.
    pub(crate) fn info_once(&self, line: String) {
        let new = self
            .noted
            .lock()
            .map(|mut n| n.insert(line.clone()))
            .unwrap_or(false);
        if new {
            tracing::info!("{line}");
        }
    }

    /// The stream every launch and copy of this backend is ordered on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.dev.stream
    }

    /// Makes the backend's context current on the calling thread (a runner
    /// may move between threads; the driver binds contexts per thread).
    pub fn bind(&self) -> Result<()> {
        drv(self.dev.ctx.bind_to_thread(), "binding the CUDA context")
    }

    /// Streaming multiprocessors of the device.
    pub(crate) fn sm_count(&self) -> usize {
        self.sms
    }

    fn func(&self, name: &str) -> Result<&CudaFunction> {
        self.dev
            .funcs
            .get(name)
            .ok_or_else(|| anyhow!("cuda backend: kernel {name} not loaded"))
    }

    /// Copies a host slice to a new device buffer (at least one element).
    pub fn up<T: DeviceRepr>(&self, h: &[T], what: &str) -> Result<CudaSlice<T>> {
        if h.is_empty() {
            // cudarc cannot allocate 0 elements on every driver; 1 is harmless.
            // SAFETY: a 1-element allocation that no kernel reads (len 0 ops
            // return before launching).
            return drv(unsafe { self.dev.stream.alloc::<T>(1) }, what);
        }
        drv(self.dev.stream.clone_htod(h), what)
    }

    /// Uploads a weight tensor's bytes with WEIGHT_PAD zero bytes after
    /// them: the int8 kernels read blocks with aligned 4-byte loads that may
    /// reach 2 bytes past the last block (dequant.cuh, ld_words).
    pub(crate) fn up_weight(&self, h: &[u8], what: &str) -> Result<CudaSlice<u8>> {
        let mut d = drv(
            self.dev.stream.alloc_zeros::<u8>(h.len() + WEIGHT_PAD),
            what,
        )?;
        if !h.is_empty() {
            let mut body = d.slice_mut(0..h.len());
            drv(self.dev.stream.memcpy_htod(h, &mut body), what)?;
        }
        Ok(d)
    }

    pub(crate) fn scratch<T: DeviceRepr>(&self, len: usize, what: &str) -> Result<CudaSlice<T>> {
        // SAFETY: uninitialized device memory; every kernel that reads a
        // scratch buffer runs after the kernel that writes all of it.
        drv(unsafe { self.dev.stream.alloc::<T>(len.max(1)) }, what)
    }

    /// Copies the first `h.len()` elements of a device buffer to `h`.
    pub fn down<T: DeviceRepr>(&self, d: &CudaSlice<T>, h: &mut [T], what: &str) -> Result<()> {
        if h.is_empty() {
            return Ok(());
        }
        let v = d.slice(0..h.len());
        drv(self.dev.stream.memcpy_dtoh(&v, h), what)
    }

    /// Downloads the first `len` values of `d` into page-locked memory
    /// (a pooled buffer when one is large enough) and synchronizes the
    /// stream (the step's end). The caller reads that memory directly; it
    /// returns to the pool when dropped.
    pub fn down_logits(
        &self,
        d: &CudaSlice<f32>,
        len: usize,
        what: &str,
    ) -> Result<crate::backend::HostLogits> {
        if len == 0 {
            self.sync(what)?;
            return Ok(crate::backend::HostLogits::Vec(Vec::new()));
        }
        let mut p = match self.pinned.take(len) {
            Some(p) => p,
            None => {
                // SAFETY: the buffer is only read after a copy into it has
                // completed (the stream sync below); flags 0: plain
                // page-locked memory (write-combined memory is slow for
                // the cpu to read).
                let p = unsafe { self.dev.ctx.alloc_pinned_with_flags::<f32>(len, 0) };
                drv(p, "allocating a pinned logits buffer")?
            }
        };
        let v = d.slice(0..len);
        let ptr = {
            // A plain slice of the page-locked memory: the copy moves
            // exactly `len` values (cudarc copies the destination's whole
            // length).
            let host = drv(p.as_mut_slice(), what)?;
            drv(self.dev.stream.memcpy_dtoh(&v, &mut host[..len]), what)?;
            host.as_ptr()
        };
        step_times::mark(step_times::Point::Wait);
        self.sync(what)?;
        step_times::mark(step_times::Point::Waited);
        // SAFETY: ptr is p's start (its slice above); the copy into
        // p[..len] completed (stream synchronized above) and p moves into
        // the PinnedLogits, which nothing writes.
        let l = unsafe { PinnedLogits::new(p, ptr, len, self.pinned.clone()) };
        Ok(crate::backend::HostLogits::Pinned(l))
    }

    /// A page-locked host buffer of `len` u32 (staging for uploads that
    /// should not cost the host a copy each).
    pub fn pinned_u32(&self, len: usize) -> Result<cudarc::driver::PinnedHostSlice<u32>> {
        // SAFETY: u32 has no invalid bit patterns, and the buffer is zeroed
        // here before anything reads it; flags 0: plain page-locked memory.
        let p = unsafe { self.dev.ctx.alloc_pinned_with_flags::<u32>(len.max(1), 0) };
        let mut p = drv(p, "allocating a pinned staging buffer")?;
        drv(p.as_mut_slice(), "zeroing a pinned staging buffer")?.fill(0);
        Ok(p)
    }

    pub fn sync(&self, what: &str) -> Result<()> {
        let n = self.syncs.begin();
        drv(self.dev.stream.synchronize(), what)?;
        self.syncs.end(n);
        Ok(())
    }

    /// A ticket for the work enqueued on the stream so far: it has run
    /// once [`CudaBackend::synced_past`] says so.
    pub fn sync_ticket(&self) -> u64 {
        self.syncs.ticket()
    }

    /// Whether a synchronization that began after `ticket` was taken has
    /// completed (so everything enqueued before the ticket has run).
    pub fn synced_past(&self, ticket: u64) -> bool {
        self.syncs.past(ticket)
    }
}

/// Serializes the backend's users and binds its context to the thread.
fn enter(be: &CudaBackend) -> Result<std::sync::MutexGuard<'_, ()>> {
    let g = be
        .lock
        .lock()
        .map_err(|_| anyhow!("cuda backend: lock poisoned"))?;
    be.bind()?;
    Ok(g)
}

/// `auto`: the ops this backend can run (until a device error disables
/// it). `required`: every op, so that one it cannot run fails in `run`
/// with the op and the reason instead of falling back.
fn supports(be: &CudaBackend, info: &OpInfo, mode: Mode) -> bool {
    match be.gpu_mode {
        GpuMode::Required => true,
        GpuMode::Off => false,
        GpuMode::Auto => {
            // After a device error the backend declines everything, so
            // dispatch (and its per-backend counts) moves to the cpu.
            let disabled = be.disabled.lock().map(|d| d.is_some()).unwrap_or(true);
            !disabled && be.capability(info, mode).is_ok()
        }
    }
}
