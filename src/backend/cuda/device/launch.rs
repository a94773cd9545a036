//! Launch plumbing every op family shares: the scratch arena (typed,
//! disjoint regions of one growable allocation, reused op after op on the
//! one stream), kernel arguments for `cuLaunchKernelEx` (`RawArgs`),
//! launches in thread-block clusters and their occupancy, tensor maps for
//! the bulk tensor copies, and device addresses of views.

use super::super::CudaBackend;
use anyhow::{anyhow, bail, Result};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, LaunchConfig};

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
pub(crate) fn dev_ptr<T>(
    v: &CudaView<'_, T>,
    s: &std::sync::Arc<cudarc::driver::CudaStream>,
) -> u64 {
    use cudarc::driver::DevicePtr;
    let (p, _guard) = v.device_ptr(s);
    p
}

pub(crate) fn dev_ptr_mut<T>(
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
