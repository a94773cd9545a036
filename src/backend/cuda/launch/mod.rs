//! Kernel launches over device buffers: the one implementation of every op
//! on the GPU. The device memory space (`Dev`) calls these directly; the
//! host-slice path (`host.rs`) uploads, calls them and downloads.
//!
//! Each launcher checks shapes with `backend::validate` (the same checks
//! the cpu backend runs) before it launches anything.
//!
//! `matmul/`: the matmul planner (pure: kernel and geometry of every
//! `MatMuls` op); `matmul_launch.rs`: its entry and the matvec and tile
//! launches (`mm_jobs.rs`: the job table of its launches;
//! `matmul_exact.rs`, `matmul_mma.rs`, `matmul_blas.rs`: the canonical,
//! int8 tensor-core and cuBLAS forms; `matmul_wgmma.rs`: the Hopper
//! prefill GEMM; `matmul_glu.rs`: gate/up with the SwiGlu);
//! `prepared.rs`: matmul inputs prepared in the arena by the op before;
//! `rms_norm.rs`: the RMS
//! norm launches; here: the scratch arena
//! and the element-wise ops.

mod l2_ahead;
mod matmul;
mod matmul_blas;
mod matmul_exact;
mod matmul_glu;
mod matmul_launch;
mod matmul_mma;
mod matmul_norm;
mod matmul_wgmma;
mod mm_jobs;
mod norm_ahead;
mod prepared;
mod rms_norm;
mod sample;

pub(crate) use l2_ahead::{L2Bufs, L2Log};
pub(crate) use matmul::{fast_uses_blas, mq_smem_max, wg_smem, TILE_SMEM};
pub(crate) use norm_ahead::NormAhead;
pub(crate) use sample::{device_draws, draw_record, GreedyRing, DRAW_WORDS, GREEDY_SLOTS};

use super::device::memory::{DevKvMut, DevMatrix};
use super::{drv, grid_1d, i32_of, ty_code, CudaBackend};
use crate::backend::{validate, KvInfo, Mode};
use anyhow::{anyhow, bail, Result};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

/// Bytes each arena region is aligned to (any kernel argument type).
const ARENA_ALIGN: usize = 256;

/// Runs `f` on three typed, disjoint regions at the start of the arena,
/// of `la`, `lb` and `lc` elements. The arena was sized by
/// [`CudaBackend::arena`] for them.
pub(crate) fn arena3<A, B, C, R>(
    arena: &mut CudaSlice<u8>,
    (la, lb, lc): (usize, usize, usize),
    f: impl FnOnce(
        &mut CudaViewMut<'_, A>,
        &mut CudaViewMut<'_, B>,
        &mut CudaViewMut<'_, C>,
    ) -> Result<R>,
) -> Result<R> {
    let ra = (la * std::mem::size_of::<A>()).next_multiple_of(ARENA_ALIGN);
    let rb = (lb * std::mem::size_of::<B>()).next_multiple_of(ARENA_ALIGN);
    let (mut va, mut rest) = arena
        .try_split_at_mut(ra)
        .ok_or_else(|| anyhow!("scratch arena too small"))?;
    let (mut vb, mut vc) = rest
        .try_split_at_mut(rb)
        .ok_or_else(|| anyhow!("scratch arena too small"))?;
    // SAFETY: the regions are disjoint, start at multiples of ARENA_ALIGN
    // bytes (the allocation itself is at least 256-byte aligned), and are
    // only used as i8 / i16 / i32 / f32 / u8, for which every bit pattern is valid.
    // transmute_mut checks each region holds the requested length.
    let views = unsafe {
        (
            va.transmute_mut::<A>(la),
            vb.transmute_mut::<B>(lb),
            vc.transmute_mut::<C>(lc),
        )
    };
    match views {
        (Some(mut a), Some(mut b), Some(mut c)) => f(&mut a, &mut b, &mut c),
        _ => bail!("scratch arena too small"),
    }
}

/// Device address of a view (for identity checks only).
pub(super) fn dev_ptr<T>(
    v: &CudaView<'_, T>,
    s: &std::sync::Arc<cudarc::driver::CudaStream>,
) -> u64 {
    use cudarc::driver::DevicePtr;
    let (p, _guard) = v.device_ptr(s);
    p
}

pub(super) fn dev_ptr_mut<T>(
    v: &CudaViewMut<'_, T>,
    s: &std::sync::Arc<cudarc::driver::CudaStream>,
) -> u64 {
    use cudarc::driver::DevicePtr;
    let (p, _guard) = v.device_ptr(s);
    p
}

/// A launch configuration of `grid` x `block` threads with `smem` bytes
/// of dynamic shared memory on `stream`, in thread-block clusters of
/// `cluster` CTAs; `attr` receives the cluster attribute, which the
/// configuration points to (so it must outlive every use).
fn cluster_config(
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    smem: u32,
    stream: &cudarc::driver::CudaStream,
    cluster: (u32, u32, u32),
    attr: &mut cudarc::driver::sys::CUlaunchAttribute,
) -> cudarc::driver::sys::CUlaunchConfig {
    use cudarc::driver::sys;
    // SAFETY: a zeroed union then one field written (no read).
    let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
    value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 {
        x: cluster.0,
        y: cluster.1,
        z: cluster.2,
    };
    *attr = sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
        pad: [0; 4],
        value,
    };
    sys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block.0,
        blockDimY: block.1,
        blockDimZ: block.2,
        sharedMemBytes: smem,
        hStream: stream.cu_stream(),
        attrs: attr,
        numAttrs: 1,
    }
}

/// Clusters of (1, `cluster_y`, 1) CTAs of `threads` with `smem` bytes
/// of dynamic shared memory of kernel `f` that the device holds at once
/// (cuOccupancyMaxActiveClusters; a GPC holds whole clusters only, so
/// this can be less than the CTAs per SM times the SMs allow).
pub(crate) fn max_active_clusters(
    f: &cudarc::driver::CudaFunction,
    stream: &cudarc::driver::CudaStream,
    smem: usize,
    cluster_y: usize,
    threads: usize,
) -> Result<usize> {
    let cy = u32::try_from(cluster_y)?;
    // SAFETY: plain data, overwritten by cluster_config.
    let mut attr = unsafe { std::mem::zeroed() };
    let cfg = cluster_config(
        (1, cy, 1),
        (u32::try_from(threads)?, 1, 1),
        u32::try_from(smem)?,
        stream,
        (1, cy, 1),
        &mut attr,
    );
    let mut n: std::ffi::c_int = 0;
    // SAFETY: n receives the count; cfg and attr outlive the call; f is a
    // loaded kernel of the stream's context.
    unsafe { cudarc::driver::sys::cuOccupancyMaxActiveClusters(&mut n, f.cu_function(), &cfg) }
        .result()
        .map_err(|e| anyhow!("CUDA driver error: cluster occupancy: {e:?}"))?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// Encodes a tiled tensor map (cuTensorMapEncodeTiled) of `dims` elements
/// of `dtype` at device address `addr`, with byte `strides` for the dims
/// past the first and boxes of `boxd`: unit element strides, no
/// interleave, zeros past the edges. `what` names the tensor in the error.
pub(crate) fn encode_tiled_map(
    map: &mut cudarc::driver::sys::CUtensorMap,
    dtype: cudarc::driver::sys::CUtensorMapDataType,
    addr: u64,
    (dims, strides, boxd): (&[u64], &[u64], &[u32]),
    swizzle: cudarc::driver::sys::CUtensorMapSwizzle,
    l2: cudarc::driver::sys::CUtensorMapL2promotion,
    what: &dyn Fn() -> String,
) -> Result<()> {
    use cudarc::driver::sys;
    let rank = dims.len();
    if !(1..=5).contains(&rank) || strides.len() + 1 != rank || boxd.len() != rank {
        bail!(
            "{}: a tensor map of rank {rank} needs {} strides and {rank} box sides (got {}, {})",
            what(),
            rank.saturating_sub(1),
            strides.len(),
            boxd.len()
        );
    }
    let estr = [1u32; 5];
    // SAFETY: encodes a descriptor into `map` from the slices above (rank
    // dims, rank - 1 strides, rank box sides and element strides, checked
    // just above); no memory is accessed at `addr` by this call.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            map,
            dtype,
            rank as u32,
            addr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxd.as_ptr(),
            estr.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            l2,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        bail!("{}: cuTensorMapEncodeTiled: {r:?}", what());
    }
    Ok(())
}

/// Kernel arguments for a `cuLaunchKernelEx` launch (`launch_clustered`):
/// each value in its own slot (8 bytes, or a struct's size), its bytes at
/// the slot's start, so the pointer to a slot is a pointer to a value of
/// the parameter's C type (`int`, `float`, a device pointer, a struct
/// passed by value). The driver copies the bytes, so a slot needs no
/// alignment beyond its own.
pub(crate) struct RawArgs {
    slots: Vec<Box<[u8]>>,
}

impl RawArgs {
    pub(crate) fn new() -> Self {
        RawArgs { slots: Vec::new() }
    }

    fn put(mut self, bytes: &[u8]) -> Self {
        let mut slot = vec![0u8; bytes.len().max(8)].into_boxed_slice();
        slot[..bytes.len()].copy_from_slice(bytes);
        self.slots.push(slot);
        self
    }

    /// A struct passed by value, as its bytes (`bytes.len()` its C size).
    pub(crate) fn bytes(self, bytes: &[u8]) -> Self {
        self.put(bytes)
    }

    /// A device pointer (`const T*` / `T*`).
    pub(crate) fn ptr(self, v: u64) -> Self {
        self.put(&v.to_ne_bytes())
    }

    pub(crate) fn i32(self, v: i32) -> Self {
        self.put(&v.to_ne_bytes())
    }

    /// A `long long`.
    pub(crate) fn i64(self, v: i64) -> Self {
        self.put(&v.to_ne_bytes())
    }

    pub(crate) fn f32(self, v: f32) -> Self {
        self.put(&v.to_ne_bytes())
    }

    /// One pointer per argument, in order (valid while self is and is not
    /// changed).
    pub(crate) fn params(&mut self) -> Vec<*mut std::ffi::c_void> {
        self.slots
            .iter_mut()
            .map(|s| s.as_mut_ptr().cast::<std::ffi::c_void>())
            .collect()
    }
}

impl CudaBackend {
    /// The scratch arena, grown to hold regions of `bytes` (each rounded up
    /// to ARENA_ALIGN). Ops on the one stream reuse it in order, so no two
    /// kernels that run concurrently share it; a replaced arena is freed
    /// stream-ordered, after the kernels queued on it.
    pub(crate) fn arena(
        &self,
        bytes: &[usize],
    ) -> Result<std::sync::MutexGuard<'_, CudaSlice<u8>>> {
        Ok(self.arena_grown(bytes)?.0)
    }

    /// `arena`, and whether it grew (a new allocation: what the old one
    /// held, a prepared input included, is not in it).
    pub(crate) fn arena_grown(
        &self,
        bytes: &[usize],
    ) -> Result<(std::sync::MutexGuard<'_, CudaSlice<u8>>, bool)> {
        let need: usize = bytes.iter().map(|b| b.next_multiple_of(ARENA_ALIGN)).sum();
        let mut g = self
            .arena
            .lock()
            .map_err(|_| anyhow!("cuda backend: arena lock poisoned"))?;
        let grow = g.len() < need;
        if grow {
            *g = self.scratch::<u8>(need.max(2 * g.len()), "growing the scratch arena")?;
        }
        Ok((g, grow))
    }

    /// Launches kernel `name` on the backend's stream with thread-block
    /// clusters of `cluster` CTAs (cuLaunchKernelEx; a stream capture keeps
    /// the attribute in the graph's kernel node).
    ///
    /// # Safety
    /// `params` holds one pointer per kernel parameter, to a value of the
    /// parameter's C type, valid for the call; the kernel's contract
    /// (buffers, bounds) holds for `cfg`; `cluster` divides the grid and is
    /// a size the device holds (`att_clusters` > 0: the device has
    /// clusters, and past 8 CTAs the kernel has opted in).
    pub(crate) unsafe fn launch_clustered(
        &self,
        name: &str,
        cfg: LaunchConfig,
        cluster: (u32, u32, u32),
        params: &mut [*mut std::ffi::c_void],
    ) -> Result<()> {
        let f = self.func(name)?;
        // SAFETY: plain data, overwritten by cluster_config.
        let mut attr = std::mem::zeroed();
        let lc = cluster_config(
            cfg.grid_dim,
            cfg.block_dim,
            cfg.shared_mem_bytes,
            self.stream(),
            cluster,
            &mut attr,
        );
        // SAFETY: the caller's contract; lc and attr outlive the call.
        let r = cudarc::driver::sys::cuLaunchKernelEx(
            &lc,
            f.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        );
        r.result().map_err(|e| {
            anyhow!("CUDA driver error: launching {name} in clusters of {cluster:?}: {e:?}")
        })
    }

    /// Bytes of the scratch arena (it only grows; a new size is a new
    /// allocation).
    pub fn arena_len(&self) -> usize {
        self.arena.lock().map(|a| a.len()).unwrap_or(0)
    }

    #[allow(clippy::too_many_arguments)] // the op's fields
    pub(crate) fn d_rope(
        &self,
        x: &mut CudaViewMut<'_, f32>,
        n_heads: usize,
        head_dim: usize,
        rope_dim: usize,
        positions: &CudaView<'_, u32>,
        inv_freq: &CudaView<'_, f32>,
        neox: bool,
    ) -> Result<()> {
        let n = positions.len();
        validate::rope(x.len(), n_heads, head_dim, rope_dim, n, inv_freq.len())?;
        let total = n * n_heads * (rope_dim / 2);
        if total == 0 {
            return Ok(());
        }
        let (ni, hi, hdi, rdi) = (
            i32_of(n, "n")?,
            i32_of(n_heads, "n_heads")?,
            i32_of(head_dim, "head_dim")?,
            i32_of(rope_dim, "rope_dim")?,
        );
        let nx = neox as i32;
        let mut b = self.stream().launch_builder(self.func("rope")?);
        b.arg(x)
            .arg(&ni)
            .arg(&hi)
            .arg(&hdi)
            .arg(&rdi)
            .arg(positions)
            .arg(inv_freq)
            .arg(&nx);
        // SAFETY: matches rope; x holds n*n_heads*head_dim, positions n,
        // inv_freq rope_dim/2 (validated).
        drv(unsafe { b.launch(grid_1d(total, 256)?) }, "rope: launch")?;
        Ok(())
    }

    /// swiglu. Where the op's annotation says the next matmul reads the
    /// output quantized (q8_out), swiglu_q8 does it in the same pass; where
    /// it reads the wgmma GEMM's tiles (with `rows` known), swiglu_f16wr;
    /// where neither kernel could (buffers unaligned), the plain kernel and
    /// the standalone conversion (`finish_out_for_next`).
    pub(crate) fn d_swiglu(
        &self,
        gate: &CudaView<'_, f32>,
        up: &CudaView<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
        rows: Option<usize>,
        mode: Mode,
    ) -> Result<()> {
        validate::same_len("swiglu", &[gate.len(), up.len(), out.len()])?;
        if out.is_empty() {
            return Ok(());
        }
        let pre = match rows {
            Some(r) if r > 0 && out.len().is_multiple_of(r) => {
                self.q8_out(out, Some(r), out.len() / r, mode)?
            }
            Some(_) => None,
            None => self.q8_out(out, None, 32, mode)?,
        };
        // A `SwiGlu` op has no row count: no wgmma tiles then (they need
        // the rows); q8 blocks need none.
        let r = rows.unwrap_or(0);
        let f16 = if pre.is_none()
            && r > 0
            && out.len().is_multiple_of(r)
            && dev_ptr(gate, self.stream()).is_multiple_of(16)
            && dev_ptr(up, self.stream()).is_multiple_of(16)
        {
            self.f16wr_out(out, r, out.len() / r, mode)?
                .map(|(key, p)| (key, p, r))
        } else {
            None
        };
        if let Some((key, x16, n)) = f16 {
            let k = out.len() / n;
            let pieces = n.div_ceil(256) * 256 * k / 8;
            let (ni, ki, p64) = (i32_of(n, "rows")?, i32_of(k, "k")?, i64::try_from(pieces)?);
            let mut b = self.stream().launch_builder(self.func("swiglu_f16wr")?);
            b.arg(gate)
                .arg(up)
                .arg(&ni)
                .arg(&ki)
                .arg(&p64)
                .arg(&mut *out)
                .arg(&x16);
            // SAFETY: matches swiglu_f16wr; the three buffers hold n * k
            // elements, 16-byte aligned (checked here and by f16wr_out), k
            // a multiple of 256; x16 an arena region of `pieces` 16-byte
            // pieces (whole tiles up to 256-row multiples: f16wr_out).
            drv(unsafe { b.launch(grid_1d(pieces, 256)?) }, "swiglu: launch")?;
            self.q8_done(key);
            return Ok(());
        }
        if let Some((key, xq, xds)) = pre {
            let len = out.len() as i64;
            let cfg = grid_1d(out.len(), 256)?;
            let mut b = self.stream().launch_builder(self.func("swiglu_q8")?);
            b.arg(gate)
                .arg(up)
                .arg(&len)
                .arg(&mut *out)
                .arg(&xq)
                .arg(&xds);
            // SAFETY: matches swiglu_q8; the three buffers hold len elements
            // (a multiple of 32: rows of k, k a multiple of 32); xq / xds
            // arena regions of len bytes and len / 32 float2 (q8_out).
            drv(unsafe { b.launch(cfg) }, "swiglu: launch")?;
            self.q8_done(key);
            return Ok(());
        }
        let len = out.len() as i64;
        let cfg = grid_1d(out.len(), 256)?;
        let mut b = self.stream().launch_builder(self.func("swiglu")?);
        b.arg(gate).arg(up).arg(&len).arg(&mut *out);
        // SAFETY: matches swiglu; all three buffers hold len elements.
        drv(unsafe { b.launch(cfg) }, "swiglu: launch")?;
        self.finish_out_for_next(&out.as_view(), rows, mode)
    }

    pub(crate) fn d_get_rows(
        &self,
        table: &DevMatrix<'_>,
        ids: &CudaView<'_, u32>,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let tc = ty_code(table.ty)
            .ok_or_else(|| anyhow!("get_rows: {:?} is not a weight type", table.ty))?;
        let rb = validate::get_rows(table, table.data.len(), ids.len(), out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        let (ri, ci, ni) = (
            i32_of(table.rows, "rows")?,
            i32_of(table.cols, "cols")?,
            i32_of(ids.len(), "ids")?,
        );
        let rbl = rb as i64;
        let cfg = grid_1d(out.len(), 256)?;
        let mut b = self.stream().launch_builder(self.func("get_rows")?);
        b.arg(&table.data)
            .arg(&ri)
            .arg(&ci)
            .arg(&rbl)
            .arg(&tc)
            .arg(ids)
            .arg(&ni)
            .arg(out);
        // SAFETY: matches get_rows; the kernel bounds-checks every id
        // against table_rows; out holds n_ids*cols (validated).
        drv(unsafe { b.launch(cfg) }, "get_rows: launch")?;
        Ok(())
    }

    pub(crate) fn d_select_rows(
        &self,
        x: &CudaView<'_, f32>,
        dim: usize,
        rows: &CudaView<'_, u32>,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let n = validate::select_rows(x.len(), dim, rows.len(), out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        let (ni, di, mi) = (
            i32_of(n, "n")?,
            i32_of(dim, "dim")?,
            i32_of(rows.len(), "rows")?,
        );
        let cfg = grid_1d(out.len(), 256)?;
        let mut b = self.stream().launch_builder(self.func("select_rows")?);
        b.arg(x).arg(&ni).arg(&di).arg(rows).arg(&mi).arg(out);
        // SAFETY: matches select_rows; the kernel bounds-checks every row
        // against n; out holds m*dim (validated).
        drv(unsafe { b.launch(cfg) }, "select_rows: launch")?;
        Ok(())
    }

    pub(crate) fn d_add(&self, x: &mut CudaViewMut<'_, f32>, y: &CudaView<'_, f32>) -> Result<()> {
        validate::same_len("add", &[x.len(), y.len()])?;
        if x.is_empty() {
            return Ok(());
        }
        let len = x.len() as i64;
        let cfg = grid_1d(x.len(), 256)?;
        let mut b = self.stream().launch_builder(self.func("add")?);
        b.arg(x).arg(y).arg(&len);
        // SAFETY: matches add; both buffers hold len elements.
        drv(unsafe { b.launch(cfg) }, "add: launch")?;
        Ok(())
    }

    pub(crate) fn d_add_bias(
        &self,
        x: &mut CudaViewMut<'_, f32>,
        bias: &CudaView<'_, f32>,
    ) -> Result<()> {
        let dim = bias.len();
        validate::add_bias(x.len(), dim)?;
        if x.is_empty() {
            return Ok(());
        }
        let len = x.len() as i64;
        let di = i32_of(dim, "dim")?;
        let cfg = grid_1d(x.len(), 256)?;
        let mut b = self.stream().launch_builder(self.func("add_bias")?);
        b.arg(x).arg(bias).arg(&len).arg(&di);
        // SAFETY: matches add_bias; x holds len, bias dim elements.
        drv(unsafe { b.launch(cfg) }, "add_bias: launch")?;
        Ok(())
    }

    /// Stores k, v rows into cells `slots` of the cache. The slot values
    /// must have been checked distinct and in range where they were
    /// uploaded; the kernel skips any slot out of range regardless.
    /// Rope of q and k and the K/V store in one kernel (rope_kv_write.cu),
    /// the bits of d_rope, d_rope, d_kv_write.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn d_rope_kv_write(
        &self,
        q: &mut CudaViewMut<'_, f32>,
        k: &mut CudaViewMut<'_, f32>,
        v: &CudaView<'_, f32>,
        n_heads: usize,
        rope_dim: usize,
        positions: &CudaView<'_, u32>,
        inv_freq: &CudaView<'_, f32>,
        neox: bool,
        slots: &CudaView<'_, u32>,
        cache: &mut DevKvMut<'_>,
    ) -> Result<()> {
        let (nkv, hd) = (cache.n_kv_heads, cache.head_dim);
        let n = positions.len();
        validate::rope(q.len(), n_heads, hd, rope_dim, n, inv_freq.len())?;
        validate::rope(k.len(), nkv, hd, rope_dim, n, inv_freq.len())?;
        let n_cells = validate::kv_write(
            cache.geometry(),
            cache.k.len(),
            cache.v.len(),
            k.len(),
            v.len(),
            slots.len(),
        )?;
        let per_row = (n_heads + nkv) * (rope_dim / 2) + nkv * (hd - rope_dim) + nkv * hd;
        if n == 0 {
            return Ok(());
        }
        let nx = neox as i32;
        let nc = n_cells as i64;
        let dims = [
            i32_of(n, "n")?,
            i32_of(n_heads, "n_heads")?,
            i32_of(nkv, "n_kv_heads")?,
            i32_of(hd, "head_dim")?,
            i32_of(rope_dim, "rope_dim")?,
        ];
        let mut b = self.stream().launch_builder(self.func("rope_kv_write")?);
        b.arg(&mut *q)
            .arg(&mut *k)
            .arg(v)
            .arg(&dims[0])
            .arg(&dims[1])
            .arg(&dims[2])
            .arg(&dims[3])
            .arg(&dims[4])
            .arg(positions)
            .arg(inv_freq)
            .arg(&nx)
            .arg(slots)
            .arg(&nc)
            .arg(&mut cache.k)
            .arg(&mut cache.v);
        // SAFETY: matches rope_kv_write; q holds n*n_heads*head_dim, k and
        // v n*n_kv*head_dim, positions and slots n, inv_freq rope_dim/2
        // (validated); the kernel skips slots >= n_cells.
        drv(
            unsafe { b.launch(grid_1d(n * per_row, 256)?) },
            "rope_kv_write: launch",
        )?;
        Ok(())
    }

    pub(crate) fn d_kv_write(
        &self,
        k: &CudaView<'_, f32>,
        v: &CudaView<'_, f32>,
        slots: &CudaView<'_, u32>,
        cache: &mut DevKvMut<'_>,
    ) -> Result<()> {
        let n_cells = validate::kv_write(
            cache.geometry(),
            cache.k.len(),
            cache.v.len(),
            k.len(),
            v.len(),
            slots.len(),
        )?;
        if k.is_empty() {
            return Ok(());
        }
        let row = cache.n_kv_heads * cache.head_dim;
        let (ni, ri) = (i32_of(slots.len(), "n")?, i32_of(row, "row")?);
        let nc = n_cells as i64;
        let cfg = grid_1d(k.len(), 256)?;
        let mut b = self.stream().launch_builder(self.func("kv_write")?);
        b.arg(k)
            .arg(v)
            .arg(slots)
            .arg(&ni)
            .arg(&ri)
            .arg(&nc)
            .arg(&mut cache.k)
            .arg(&mut cache.v);
        // SAFETY: matches kv_write; k, v hold n*row; the kernel skips slots
        // >= n_cells, so every write is inside the cache.
        drv(unsafe { b.launch(cfg) }, "kv_write: launch")?;
        Ok(())
    }
}

#[cfg(test)]
mod raw_args_tests {
    use super::RawArgs;

    #[test]
    fn each_argument_starts_its_own_slot() {
        let mut a = RawArgs::new().ptr(0x1122_3344_5566_7788).i32(-2).f32(1.5);
        let p = a.params();
        assert_eq!(p.len(), 3);
        // SAFETY: each pointer addresses an 8-byte slot of `a`, alive here.
        unsafe {
            assert_eq!(p[0].cast::<u64>().read_unaligned(), 0x1122_3344_5566_7788);
            assert_eq!(p[1].cast::<i32>().read_unaligned(), -2);
            assert_eq!(p[2].cast::<f32>().read_unaligned(), 1.5);
        }
    }

    #[test]
    fn a_struct_argument_keeps_all_its_bytes() {
        let blob: Vec<u8> = (0..=255u8).collect();
        let mut a = RawArgs::new().i32(7).bytes(&blob).i32(9);
        let p = a.params();
        assert_eq!(p.len(), 3);
        // SAFETY: p[1] addresses a 256-byte slot of `a`, p[0] and p[2]
        // 8-byte ones, all alive here.
        unsafe {
            assert_eq!(p[0].cast::<i32>().read_unaligned(), 7);
            let got = std::slice::from_raw_parts(p[1].cast::<u8>(), 256);
            assert_eq!(got, &blob[..]);
            assert_eq!(p[2].cast::<i32>().read_unaligned(), 9);
        }
    }
}
