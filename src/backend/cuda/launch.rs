//! Kernel launches over device buffers: the one implementation of every op
//! on the GPU. The device memory space (`Dev`) calls these directly; the
//! host-slice path (`host.rs`) uploads, calls them and downloads.
//!
//! Each launcher checks shapes with `backend::validate` (the same checks
//! the cpu backend runs) before it launches anything.

use super::mem::{DevAttnBatch, DevKv, DevKvMut, DevMatrix};
use super::{drv, grid_1d, i32_of, ty_code, CudaBackend};
use crate::backend::{validate, KvInfo, Mode};
use crate::quant::GgmlType;
use anyhow::{anyhow, bail, ensure, Result};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

/// Activation rows per group of the warp-per-row matmul (MV_ROWS in
/// matmul_fast.cu).
const MV_ROWS: usize = 8;

/// Up to this many rows `fast` mode keeps the warp-per-row kernels (one
/// group of MV_ROWS: weights streamed once); beyond, one cuBLAS GEMM, which
/// pays a dequantization of the whole matrix per call but runs on tensor
/// cores. Measured on an H100 (8B Q4_0, 2026-11-22): the warp-per-row
/// kernel over 4 and 8 groups (weights re-read from L2) gave only 835 and
/// 853 tokens/s at batch 32 and 64.
pub(crate) const MV_BATCH: usize = MV_ROWS;

/// Most activation rows `fast` mode gives the int8 tensor-core kernel
/// (mm_q8_mma) before cuBLAS takes over: QUIRE_MMA_MAX_ROWS, default 0
/// (off). The kernel is correct (the parity harness covers it when the
/// variable is set) but not yet fast: it reads activations and scales
/// straight from global memory, without shared-memory tiles, and measured
/// 544-629 tokens/s at batch 16-64 on the 8B Q4_0 shape.
fn mma_max_rows() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("QUIRE_MMA_MAX_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    })
}

/// Bytes each arena region is aligned to (any kernel argument type).
const ARENA_ALIGN: usize = 256;

/// Runs `f` on three typed, disjoint regions at the start of the arena,
/// of `la`, `lb` and `lc` elements. The arena was sized by
/// [`CudaBackend::arena`] for them.
fn arena3<A, B, C, R>(
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
fn dev_ptr<T>(v: &CudaView<'_, T>, s: &std::sync::Arc<cudarc::driver::CudaStream>) -> u64 {
    use cudarc::driver::DevicePtr;
    let (p, _guard) = v.device_ptr(s);
    p
}

fn dev_ptr_mut<T>(v: &CudaViewMut<'_, T>, s: &std::sync::Arc<cudarc::driver::CudaStream>) -> u64 {
    use cudarc::driver::DevicePtr;
    let (p, _guard) = v.device_ptr(s);
    p
}

/// Quantized activations held at the start of the arena: the input's device
/// address, length and row length, and the layout (`ACT_Q8`: quant_q8's
/// int8 rows and float2 scales; `ACT_CANON`: quant_act32's 16-bit rows,
/// scales and sums).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct ActKey {
    ptr: u64,
    len: usize,
    k: usize,
    layout: u8,
}
const ACT_Q8: u8 = 1;
const ACT_CANON: u8 = 2;

impl CudaBackend {
    /// Forgets which activations the arena holds (any op but a matmul, a
    /// new activation buffer, or arena growth may change them).
    pub(crate) fn forget_activations(&self) {
        if let Ok(mut c) = self.act_cache.lock() {
            *c = None;
        }
    }

    /// Whether the arena holds `key`'s quantized activations.
    fn act_cached(&self, key: ActKey) -> bool {
        self.act_cache
            .lock()
            .map(|c| *c == Some(key))
            .unwrap_or(false)
    }

    /// Records `key` as held, unless the matmul's output (`out`, `out_len`
    /// f32) overlaps its input, which then no longer holds those values.
    fn act_remember(&self, key: ActKey, out: u64, out_len: usize) {
        let (a0, a1) = (key.ptr, key.ptr + 4 * key.len as u64);
        let (b0, b1) = (out, out + 4 * out_len as u64);
        let v = if a0 < b1 && b0 < a1 { None } else { Some(key) };
        if let Ok(mut c) = self.act_cache.lock() {
            *c = v;
        }
    }

    /// The scratch arena, grown to hold regions of `bytes` (each rounded up
    /// to ARENA_ALIGN). Ops on the one stream reuse it in order, so no two
    /// kernels that run concurrently share it; a replaced arena is freed
    /// stream-ordered, after the kernels queued on it.
    pub(crate) fn arena(
        &self,
        bytes: &[usize],
    ) -> Result<std::sync::MutexGuard<'_, CudaSlice<u8>>> {
        let need: usize = bytes.iter().map(|b| b.next_multiple_of(ARENA_ALIGN)).sum();
        let mut g = self
            .arena
            .lock()
            .map_err(|_| anyhow!("cuda backend: arena lock poisoned"))?;
        if g.len() < need {
            self.forget_activations();
            *g = self.scratch::<u8>(need.max(2 * g.len()), "growing the scratch arena")?;
        }
        Ok(g)
    }

    /// Bytes of the scratch arena (it only grows; a new size is a new
    /// allocation).
    pub fn arena_len(&self) -> usize {
        self.arena.lock().map(|a| a.len()).unwrap_or(0)
    }

    /// out (n, m) = x (n, k) · wᵀ. `exact`: the canonical kernels;
    /// `deterministic`: the warp-per-row kernels (int8 activations and dp4a
    /// for quantized weights) for every n, in groups of MV_ROWS rows
    /// (batch-invariant); `fast`: those up to MV_BATCH rows, the int8 MMA
    /// kernel if QUIRE_MMA_MAX_ROWS asks for it, and cuBLAS f16 tensor-core
    /// GEMM with f32 accumulation beyond (weights dequantized to f16 per
    /// call).
    pub(crate) fn d_mat_mul(
        &self,
        w: &DevMatrix<'_>,
        x: &CudaView<'_, f32>,
        n: usize,
        out: &mut CudaViewMut<'_, f32>,
        mode: Mode,
    ) -> Result<()> {
        if matches!(w.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            // Float kernels quantize nothing but may overwrite a cached input.
            self.forget_activations();
        }
        if mode != Mode::Exact && n > 0 && w.rows > 0 && w.cols > 0 && w.cols.is_multiple_of(32) {
            validate::mat_mul(w, w.data.len(), x.len(), n, out.len())?;
            let float_w = matches!(w.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
            if mode == Mode::Fast && n > MV_ROWS && !float_w && n <= mma_max_rows() {
                return self.mat_vec_q8(w, x, n, out, true);
            }
            if mode == Mode::Fast && n > MV_BATCH && self.blas.is_some() {
                return self.gemm_f16(w, x, n, out);
            }
            return self.mat_vec(w, x, n, out);
        }
        self.mat_mul_exact(w, x, n, out)
    }

    /// The warp-per-row kernels (validated arguments, k a multiple of 32).
    /// The grid's x dimension walks activation-row groups fastest, so the
    /// groups that read one tile of weight rows run together and all but the
    /// first find it in L2.
    fn mat_vec(
        &self,
        w: &DevMatrix<'_>,
        x: &CudaView<'_, f32>,
        n: usize,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let tc =
            ty_code(w.ty).ok_or_else(|| anyhow!("mat_mul: {:?} is not a weight type", w.ty))?;
        if matches!(w.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            let (m, k) = (w.rows, w.cols);
            let (mi, ki, ni) = (i32_of(m, "m")?, i32_of(k, "k")?, i32_of(n, "n")?);
            i32_of(n * k, "n * k")?;
            let cfg = LaunchConfig {
                grid_dim: (
                    u32::try_from(n.div_ceil(MV_ROWS))?,
                    u32::try_from(m.div_ceil(8))?,
                    1,
                ),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let s = self.stream();
            let mut b = s.launch_builder(self.func("mv_float")?);
            b.arg(&w.data)
                .arg(&mi)
                .arg(&ki)
                .arg(&tc)
                .arg(x)
                .arg(&ni)
                .arg(out);
            // SAFETY: matches mv_float; w holds m rows of k values, x n*k and
            // out n*m (validated by the caller); k is a multiple of 32.
            drv(unsafe { b.launch(cfg) }, "mat_mul: launching mv_float")?;
            return Ok(());
        }
        self.mat_vec_q8(w, x, n, out, false)
    }

    /// Quantized weights: activations to int8 (quant_q8), then the
    /// warp-per-row dp4a kernel or (`mma`) the int8 tensor-core kernel.
    fn mat_vec_q8(
        &self,
        w: &DevMatrix<'_>,
        x: &CudaView<'_, f32>,
        n: usize,
        out: &mut CudaViewMut<'_, f32>,
        mma: bool,
    ) -> Result<()> {
        let tc =
            ty_code(w.ty).ok_or_else(|| anyhow!("mat_mul: {:?} is not a weight type", w.ty))?;
        let (m, k) = (w.rows, w.cols);
        let rb = w.ty.row_bytes(k).map_err(|e| anyhow!("mat_mul: {e}"))? as i64;
        let (mi, ki, ni) = (i32_of(m, "m")?, i32_of(k, "k")?, i32_of(n, "n")?);
        i32_of(n * k, "n * k")?;
        let (kernel, cfg) = if mma {
            let cfg = LaunchConfig {
                grid_dim: (
                    u32::try_from(n.div_ceil(64))?,
                    u32::try_from(m.div_ceil(16))?,
                    1,
                ),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            ("mm_q8_mma", cfg)
        } else {
            let cfg = LaunchConfig {
                grid_dim: (
                    u32::try_from(n.div_ceil(MV_ROWS))?,
                    u32::try_from(m.div_ceil(8))?,
                    1,
                ),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            ("mv_q8", cfg)
        };
        let s = self.stream();
        let nblk = n * k / 32;
        let mut guard = self.arena(&[n * k, nblk * 8, 0])?;
        let key = ActKey {
            ptr: dev_ptr(x, s),
            len: x.len(),
            k,
            layout: ACT_Q8,
        };
        let cached = self.act_cached(key);
        let out_ptr = dev_ptr_mut(out, s);
        let out_len = out.len();
        arena3::<i8, f32, u8, ()>(&mut guard, (n * k, nblk * 2, 0), |xq, xds, _| {
            if !cached {
                let nb = nblk as i64;
                let mut b = s.launch_builder(self.func("quant_q8")?);
                b.arg(x).arg(&nb).arg(&mut *xq).arg(&mut *xds);
                // SAFETY: matches quant_q8 (xds as float2 pairs); x holds
                // nblk blocks of 32 values, xq n*k bytes, xds 2*nblk floats.
                drv(
                    unsafe { b.launch(grid_1d(nblk * 32, 256)?) },
                    "mat_mul: launching quant_q8",
                )?;
            }
            let mut b = s.launch_builder(self.func(kernel)?);
            b.arg(&w.data)
                .arg(&mi)
                .arg(&ki)
                .arg(&rb)
                .arg(&tc)
                .arg(&mut *xq)
                .arg(&mut *xds)
                .arg(&ni)
                .arg(out);
            // SAFETY: matches mv_q8 / mm_q8_mma (same arguments); w holds m
            // rows of rb bytes (256-byte aligned allocation), xq/xds as
            // above, out n*m.
            drv(
                unsafe { b.launch(cfg) },
                "mat_mul: launching the int8 kernel",
            )?;
            Ok(())
        })?;
        self.act_remember(key, out_ptr, out_len);
        Ok(())
    }

    /// Weights to f16 (unless stored as f16), activations to f16, one cuBLAS
    /// GEMM with f32 accumulation and output.
    fn gemm_f16(
        &self,
        w: &DevMatrix<'_>,
        x: &CudaView<'_, f32>,
        n: usize,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        use cudarc::cublas::sys::{
            cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType,
        };
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        self.forget_activations();
        let blas = self
            .blas
            .as_ref()
            .ok_or_else(|| anyhow!("mat_mul: no cuBLAS"))?;
        let (m, k) = (w.rows, w.cols);
        let (mi, ki, ni) = (i32_of(m, "m")?, i32_of(k, "k")?, i32_of(n, "n")?);
        let s = self.stream();
        let f16_weights = w.ty == GgmlType::F16;
        let wlen = if f16_weights { 0 } else { m * k };
        let mut guard = self.arena(&[wlen * 2, n * k * 2, 0])?;
        arena3::<u16, u16, u8, ()>(&mut guard, (wlen, n * k, 0), |w16, x16, _| {
            if !f16_weights {
                let tc = ty_code(w.ty)
                    .ok_or_else(|| anyhow!("mat_mul: {:?} is not a weight type", w.ty))?;
                let rb = w.ty.row_bytes(k).map_err(|e| anyhow!("mat_mul: {e}"))? as i64;
                let mut b = s.launch_builder(self.func("dequant_f16")?);
                b.arg(&w.data)
                    .arg(&mi)
                    .arg(&ki)
                    .arg(&rb)
                    .arg(&tc)
                    .arg(&mut *w16);
                // Quantized types: one thread per 32-value unit (k is a
                // multiple of 32 here); float types: one per element.
                let threads = if tc >= 20 { m * k } else { m * k / 32 };
                // SAFETY: matches dequant_f16; w holds m rows of rb bytes,
                // w16 m*k elements (arena: 256-byte aligned, rows of k
                // halves are 64-byte multiples, for the 16-byte stores).
                drv(
                    unsafe { b.launch(grid_1d(threads, 256)?) },
                    "mat_mul: dequant_f16",
                )?;
            }
            let len = (n * k) as i64;
            let mut b = s.launch_builder(self.func("to_f16")?);
            b.arg(x).arg(&len).arg(&mut *x16);
            // SAFETY: matches to_f16; x and x16 hold n*k elements.
            drv(unsafe { b.launch(grid_1d(n * k, 256)?) }, "mat_mul: to_f16")?;
            let (alpha, beta) = (1.0f32, 0.0f32);
            let (wp, _g1) = if f16_weights {
                w.data.device_ptr(s)
            } else {
                w16.device_ptr(s)
            };
            let (xp, _g2) = x16.device_ptr(s);
            let (op, _g3) = out.device_ptr_mut(s);
            // Column-major view: out^T (m, n) = W (k, m)^T · x^T (k, n).
            // SAFETY: cuBLAS is bound to this backend's stream; the pointers
            // hold m*k (weights), n*k (x) f16 and n*m f32 (out) elements,
            // and stay alive until the GEMM (queued on the same stream) ran.
            unsafe {
                cudarc::cublas::result::gemm_ex(
                    *blas.handle(),
                    cublasOperation_t::CUBLAS_OP_T,
                    cublasOperation_t::CUBLAS_OP_N,
                    mi,
                    ni,
                    ki,
                    (&alpha) as *const f32 as *const _,
                    wp as *const _,
                    cudaDataType::CUDA_R_16F,
                    ki,
                    xp as *const _,
                    cudaDataType::CUDA_R_16F,
                    ki,
                    (&beta) as *const f32 as *const _,
                    op as *mut _,
                    cudaDataType::CUDA_R_32F,
                    mi,
                    cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(|e| anyhow!("mat_mul: cublasGemmEx ({m} x {k}, n {n}): {e:?}"))
        })
    }

    /// The canonical kernels (bitwise equal to the cpu).
    fn mat_mul_exact(
        &self,
        w: &DevMatrix<'_>,
        x: &CudaView<'_, f32>,
        n: usize,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let (m, k) = (w.rows, w.cols);
        let tc =
            ty_code(w.ty).ok_or_else(|| anyhow!("mat_mul: {:?} is not a weight type", w.ty))?;
        validate::mat_mul(w, w.data.len(), x.len(), n, out.len())?;
        if n == 0 || m == 0 {
            return Ok(());
        }
        if k == 0 {
            drv(self.stream().memset_zeros(out), "mat_mul: zero out")?;
            return Ok(());
        }
        let (mi, ki, ni) = (i32_of(m, "m")?, i32_of(k, "k")?, i32_of(n, "n")?);
        i32_of(n * k, "n * k")?;
        let s = self.stream();
        // Rows of activations per thread group (outputs share weight loads).
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
                let mut b = s.launch_builder(self.func("mm_float")?);
                b.arg(&w.data)
                    .arg(&mi)
                    .arg(&ki)
                    .arg(&tc)
                    .arg(x)
                    .arg(&ni)
                    .arg(out);
                // SAFETY: argument types match mm_float's signature; buffers
                // hold m*k weights, n*k inputs and n*m outputs (validated).
                drv(
                    unsafe { b.launch(grid_1d(n * m * 32, 256)?) },
                    "mat_mul: launching mm_float",
                )?;
            }
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
                self.forget_activations();
                let nb = k / 256;
                let mut guard = self.arena(&[n * k * 2, n * nb * 4, n * nb * 16 * 4])?;
                arena3::<i16, f32, i32, ()>(
                    &mut guard,
                    (n * k, n * nb, n * nb * 16),
                    |qs, ad, bs| {
                        let mut b = s.launch_builder(self.func("quant_actk")?);
                        b.arg(x)
                            .arg(&ni)
                            .arg(&ki)
                            .arg(&mut *qs)
                            .arg(&mut *ad)
                            .arg(&mut *bs);
                        // SAFETY: matches quant_actk; n*k inputs, n*k q, n*nb d, n*nb*16 sums.
                        drv(
                            unsafe { b.launch(grid_1d(n * nb, 128)?) },
                            "mat_mul: launching quant_actk",
                        )?;
                        let mut b = s.launch_builder(self.func("mm_qk")?);
                        b.arg(&w.data)
                            .arg(&mi)
                            .arg(&ki)
                            .arg(&tc)
                            .arg(&mut *qs)
                            .arg(&mut *ad)
                            .arg(&mut *bs)
                            .arg(&ni)
                            .arg(&ra)
                            .arg(out);
                        // SAFETY: matches mm_qk; buffers sized as above.
                        drv(unsafe { b.launch(qcfg) }, "mat_mul: launching mm_qk")?;
                        Ok(())
                    },
                )?;
            }
            _ => {
                let nb = k / 32;
                let mut guard = self.arena(&[n * k * 2, n * nb * 4, n * nb * 4])?;
                let key = ActKey {
                    ptr: dev_ptr(x, s),
                    len: x.len(),
                    k,
                    layout: ACT_CANON,
                };
                let cached = self.act_cached(key);
                let (out_ptr, out_len) = (dev_ptr_mut(out, s), out.len());
                arena3::<i16, f32, f32, ()>(
                    &mut guard,
                    (n * k, n * nb, n * nb),
                    |qs, ad, asum| {
                        if !cached {
                            let mut b = s.launch_builder(self.func("quant_act32")?);
                            b.arg(x)
                                .arg(&ni)
                                .arg(&ki)
                                .arg(&mut *qs)
                                .arg(&mut *ad)
                                .arg(&mut *asum);
                            // SAFETY: matches quant_act32 (one warp per
                            // block); n*k inputs, n*k q, n*nb d and s.
                            drv(
                                unsafe { b.launch(grid_1d(n * nb * 32, 256)?) },
                                "mat_mul: launching quant_act32",
                            )?;
                        }
                        if n <= MV_ROWS {
                            // Decode: the warp-per-row kernel (same bits).
                            let cfg = LaunchConfig {
                                grid_dim: (1, u32::try_from(m.div_ceil(8))?, 1),
                                block_dim: (256, 1, 1),
                                shared_mem_bytes: 0,
                            };
                            let mut b = s.launch_builder(self.func("mv_exact32")?);
                            b.arg(&w.data)
                                .arg(&mi)
                                .arg(&ki)
                                .arg(&tc)
                                .arg(&mut *qs)
                                .arg(&mut *ad)
                                .arg(&mut *asum)
                                .arg(&ni)
                                .arg(out);
                            // SAFETY: matches mv_exact32; buffers sized as
                            // above; n <= MV_EXACT_ROWS (one row group).
                            drv(unsafe { b.launch(cfg) }, "mat_mul: launching mv_exact32")?;
                            return Ok(());
                        }
                        let mut b = s.launch_builder(self.func("mm_q32")?);
                        b.arg(&w.data)
                            .arg(&mi)
                            .arg(&ki)
                            .arg(&tc)
                            .arg(&mut *qs)
                            .arg(&mut *ad)
                            .arg(&mut *asum)
                            .arg(&ni)
                            .arg(&ra)
                            .arg(out);
                        // SAFETY: matches mm_q32; buffers sized as above.
                        drv(unsafe { b.launch(qcfg) }, "mat_mul: launching mm_q32")?;
                        Ok(())
                    },
                )?;
                self.act_remember(key, out_ptr, out_len);
            }
        }
        Ok(())
    }

    pub(crate) fn d_rms_norm(
        &self,
        x: &CudaView<'_, f32>,
        w: &CudaView<'_, f32>,
        dim: usize,
        eps: f32,
        out: &mut CudaViewMut<'_, f32>,
        mode: Mode,
    ) -> Result<()> {
        let n = validate::rms_norm(x.len(), w.len(), dim, out.len())?;
        if n == 0 {
            return Ok(());
        }
        let (ni, di) = (i32_of(n, "rows")?, i32_of(dim, "dim")?);
        if mode != Mode::Exact {
            let cfg = LaunchConfig {
                grid_dim: (u32::try_from(n)?, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = self.stream().launch_builder(self.func("rms_norm_fast")?);
            b.arg(x).arg(w).arg(&di).arg(&eps).arg(out);
            // SAFETY: matches rms_norm_fast; n*dim inputs/outputs, dim weights.
            drv(unsafe { b.launch(cfg) }, "rms_norm: launch")?;
            return Ok(());
        }
        // Rows that fit the default 48 KiB of shared memory take the
        // block-per-row kernel (same bits, far less latency-bound).
        if dim * 4 <= 48 * 1024 {
            let cfg = LaunchConfig {
                grid_dim: (u32::try_from(n)?, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: (dim * 4) as u32,
            };
            let mut b = self.stream().launch_builder(self.func("rms_norm_block")?);
            b.arg(x).arg(w).arg(&di).arg(&eps).arg(out);
            // SAFETY: matches rms_norm_block; n*dim inputs/outputs, dim
            // weights, dim floats of dynamic shared memory.
            drv(unsafe { b.launch(cfg) }, "rms_norm: launch")?;
            return Ok(());
        }
        let mut b = self.stream().launch_builder(self.func("rms_norm")?);
        b.arg(x).arg(w).arg(&ni).arg(&di).arg(&eps).arg(out);
        // SAFETY: matches rms_norm; n*dim inputs/outputs, dim weights.
        drv(
            unsafe { b.launch(grid_1d(n * 32, 256)?) },
            "rms_norm: launch",
        )?;
        Ok(())
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

    pub(crate) fn d_swiglu(
        &self,
        gate: &CudaView<'_, f32>,
        up: &CudaView<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        validate::same_len("swiglu", &[gate.len(), up.len(), out.len()])?;
        if out.is_empty() {
            return Ok(());
        }
        let len = out.len() as i64;
        let cfg = grid_1d(out.len(), 256)?;
        let mut b = self.stream().launch_builder(self.func("swiglu")?);
        b.arg(gate).arg(up).arg(&len).arg(out);
        // SAFETY: matches swiglu; all three buffers hold len elements.
        drv(unsafe { b.launch(cfg) }, "swiglu: launch")?;
        Ok(())
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

    #[allow(clippy::too_many_arguments)] // the op's fields and the mode
    pub(crate) fn d_attention(
        &self,
        q: &CudaView<'_, f32>,
        n_heads: usize,
        scale: f32,
        cache: &DevKv<'_>,
        batch: &DevAttnBatch,
        out: &mut CudaViewMut<'_, f32>,
        mode: Mode,
    ) -> Result<()> {
        let (bs, nkv, hd) = cache.geometry();
        let n_blocks = validate::attention(
            (bs, nkv, hd),
            n_heads,
            cache.k.len(),
            cache.v.len(),
            batch.n_rows,
            q.len(),
            out.len(),
        )?;
        ensure!(
            hd <= 256,
            "paged_attention: head_dim {hd} > 256 is not supported by the CUDA kernel"
        );
        // The batch's tables were validated against a cache of this shape.
        ensure!(
            batch.block_size == bs && batch.n_blocks == n_blocks,
            "paged_attention: the batch was validated for {} blocks of {}, the cache has {n_blocks} of {bs}",
            batch.n_blocks,
            batch.block_size
        );
        if batch.n_rows == 0 {
            return Ok(());
        }
        let (nri, nhi, nkvi, hdi, bsi) = (
            i32_of(batch.n_rows, "n_rows")?,
            i32_of(n_heads, "n_heads")?,
            i32_of(nkv, "n_kv_heads")?,
            i32_of(hd, "head_dim")?,
            i32_of(bs, "block_size")?,
        );
        if let (Mode::Fast, Some((tiles, n_tiles))) = (mode, &batch.tiles) {
            if hd.is_multiple_of(16) && hd <= 128 {
                let cfg = LaunchConfig {
                    grid_dim: (u32::try_from(*n_tiles)?, u32::try_from(n_heads)?, 1),
                    block_dim: (32, 1, 1),
                    shared_mem_bytes: 0,
                };
                let mut b = self
                    .stream()
                    .launch_builder(self.func("flash_attention_prefill")?);
                b.arg(q)
                    .arg(&nhi)
                    .arg(&nkvi)
                    .arg(&hdi)
                    .arg(&bsi)
                    .arg(&scale)
                    .arg(&cache.k)
                    .arg(&cache.v)
                    .arg(&batch.tables)
                    .arg(&batch.table_off)
                    .arg(&batch.row_seq)
                    .arg(&batch.positions)
                    .arg(tiles)
                    .arg(out);
                // SAFETY: matches flash_attention_prefill; tables validated at
                // upload for this cache; tiles cover rows < n_rows, each of
                // one sequence; q/out hold n_rows*n_heads*head_dim floats;
                // head_dim a multiple of 16, at most 128 (shared tiles).
                drv(
                    unsafe { b.launch(cfg) },
                    "paged_attention: launching the tensor-core prefill kernel",
                )?;
                return Ok(());
            }
        }
        if mode != Mode::Exact && hd.is_multiple_of(8) {
            return self.attention_split(q, (nri, nhi, nkvi, hdi, bsi), scale, cache, batch, out);
        }
        // exact: one warp per (row, head); otherwise ATT_WARPS (8) warps
        // per (row, head) splitting the keys (attention.cu).
        let (kernel, threads) = match mode {
            Mode::Exact => ("paged_attention", 32),
            Mode::Fast | Mode::Deterministic => ("paged_attention_fast", 256),
        };
        let cfg = LaunchConfig {
            grid_dim: (u32::try_from(batch.n_rows * n_heads)?, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(self.func(kernel)?);
        b.arg(q)
            .arg(&nri)
            .arg(&nhi)
            .arg(&nkvi)
            .arg(&hdi)
            .arg(&bsi)
            .arg(&scale)
            .arg(&cache.k)
            .arg(&cache.v)
            .arg(&batch.tables)
            .arg(&batch.table_off)
            .arg(&batch.row_seq)
            .arg(&batch.positions)
            .arg(out);
        // SAFETY: matches paged_attention; every table entry a row reads was
        // validated below n_blocks at upload (DevAttnBatch::upload) for this
        // cache geometry (checked above); q/out hold n_rows*n_heads*head_dim;
        // head_dim <= 256 (shared q buffer).
        drv(unsafe { b.launch(cfg) }, "paged_attention: launch")?;
        Ok(())
    }

    /// Split-KV attention (fast and deterministic modes, head_dim a
    /// multiple of 8): partials into the scratch arena, then the ordered
    /// combine. Arguments validated by `d_attention`.
    fn attention_split(
        &self,
        q: &CudaView<'_, f32>,
        (nri, nhi, nkvi, hdi, bsi): (i32, i32, i32, i32, i32),
        scale: f32,
        cache: &DevKv<'_>,
        batch: &DevAttnBatch,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let (_, _, hd) = cache.geometry();
        let rh = batch.n_rows * nhi as usize;
        let stride = batch.part_stride;
        let plen = rh * stride * (2 + hd);
        let si = i32_of(stride, "partial stride")?;
        let s = self.stream();
        let mut guard = self.arena(&[plen * 4, 0, 0])?;
        arena3::<f32, u8, u8, ()>(&mut guard, (plen, 0, 0), |part, _, _| {
            let cfg = LaunchConfig {
                grid_dim: (u32::try_from(rh)?, u32::try_from(batch.part_ctas)?, 1),
                block_dim: (32 * 4, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut b = s.launch_builder(self.func("paged_attention_split")?);
            b.arg(q)
                .arg(&nri)
                .arg(&nhi)
                .arg(&nkvi)
                .arg(&hdi)
                .arg(&bsi)
                .arg(&scale)
                .arg(&cache.k)
                .arg(&cache.v)
                .arg(&batch.tables)
                .arg(&batch.table_off)
                .arg(&batch.row_seq)
                .arg(&batch.positions)
                .arg(&si)
                .arg(&mut *part);
            // SAFETY: matches paged_attention_split; tables validated at
            // upload for this cache; part holds rows*heads*stride*(2+hd)
            // floats and stride covers every row's partials (att_parts of
            // the largest position, or ATT_PARTS); head_dim <= 256 and a
            // multiple of 8 (16-byte K loads).
            drv(
                unsafe { b.launch(cfg) },
                "paged_attention: launching the split kernel",
            )?;
            let mut b = s.launch_builder(self.func("attention_combine")?);
            b.arg(&mut *part)
                .arg(&nri)
                .arg(&nhi)
                .arg(&hdi)
                .arg(&batch.positions)
                .arg(&si)
                .arg(out);
            // SAFETY: matches attention_combine; part as above, out holds
            // rows*heads*head_dim floats.
            drv(
                unsafe { b.launch(grid_1d(rh * 32, 256)?) },
                "paged_attention: launching the combine",
            )?;
            Ok(())
        })
    }
}
