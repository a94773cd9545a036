//! Matmul launches: canonical kernels (`exact`), the int8 warp-per-row
//! and tensor-core kernels (`deterministic`, `fast`) and cuBLAS (`fast`,
//! many rows), plus the cache of quantized activations in the arena.

use super::{arena3, dev_ptr, dev_ptr_mut};
use crate::backend::cuda::mem::DevMatrix;
use crate::backend::cuda::{drv, grid_1d, i32_of, ty_code, CudaBackend};
use crate::backend::{validate, Mode};
use crate::quant::GgmlType;
use anyhow::{anyhow, Result};
use cudarc::driver::{CudaStream, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

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

/// The activation rows for which `fast` mode uses the tensor-core tile
/// kernel (mm_f16_tile) on quantized weights: more than `lo`, at most `hi`
/// (QUIRE_MMA_MIN_ROWS, default 7; QUIRE_MMA_MAX_ROWS, default 64). Below,
/// the warp-per-row kernel; above, cuBLAS (prefill: the f16 dequantization
/// per call is paid back by the GEMM's tensor-core rate). Measured on an
/// H100, 8B Q4_0 (2026-11-22), batches of 2/4/6/8 decode rows: warp-per-row
/// 356/557/670/743 tokens/s, tile kernel 220/430/630/821-908.
fn mma_rows() -> (usize, usize) {
    static V: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        let var = |name: &str, default: usize| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        (var("QUIRE_MMA_MIN_ROWS", 7), var("QUIRE_MMA_MAX_ROWS", 64))
    })
}

/// Whether `fast` mode runs an `n`-row matmul of quantized weights through
/// cuBLAS (which a CUDA graph does not capture).
pub(crate) fn fast_uses_blas(n: usize) -> bool {
    let (lo, hi) = mma_rows();
    n > MV_BATCH && !(n > lo && n <= hi)
}

/// Weight rows and activation rows of one mm_f16_tile CTA (TT_ROWS,
/// TT_TOK in matmul_fast.cu), and its k chunk in 32-value units.
const TILE_ROWS: usize = 128;
const TILE_TOK: usize = 64;
const TILE_KU: usize = 2;
/// mm_f16_tile's dynamic shared memory (TT_SMEM): the f16 weight tile
/// (128 rows of 72 halves), then 3 pipeline stages of raw weights (128 rows
/// of 17 words) and activations (64 rows of 72 halves): 70.5 KiB.
pub(crate) const TILE_SMEM: usize = 128 * 72 * 2 + 3 * (128 * 17 * 4 + 64 * 72 * 2);

/// Split-K for mm_f16_tile: (splits, units per split) so that the grid
/// fills the GPU in one wave of at most two CTAs per SM (a 4096-row matrix
/// has only 32 row tiles), each split a whole number of k chunks and none
/// empty. Depends only on the shapes and the device, never on the data.
fn tile_splits(m: usize, n: usize, units: usize, sms: usize) -> (usize, usize) {
    let tiles = m.div_ceil(TILE_ROWS) * n.div_ceil(TILE_TOK);
    let chunks = units.div_ceil(TILE_KU);
    let want = ((2 * sms) / tiles.max(1)).clamp(1, chunks.max(1));
    let per = chunks.div_ceil(want);
    let upc = per * TILE_KU;
    (units.div_ceil(upc).max(1), upc)
}

/// A matmul's kernel arguments: the weight type code, bytes per weight
/// row, and m, k, n as the kernels' ints (n * k checked to fit too).
struct MmDims {
    tc: i32,
    rb: i64,
    mi: i32,
    ki: i32,
    ni: i32,
}

fn mm_dims(w: &DevMatrix<'_>, n: usize) -> Result<MmDims> {
    let (m, k) = (w.rows, w.cols);
    let tc = ty_code(w.ty).ok_or_else(|| anyhow!("mat_mul: {:?} is not a weight type", w.ty))?;
    let rb = w.ty.row_bytes(k).map_err(|e| anyhow!("mat_mul: {e}"))? as i64;
    i32_of(n * k, "n * k")?;
    Ok(MmDims {
        tc,
        rb,
        mi: i32_of(m, "m")?,
        ki: i32_of(k, "k")?,
        ni: i32_of(n, "n")?,
    })
}

/// Grid of the warp-per-row kernels: activation-row groups fastest, 8
/// weight rows (warps) per 256-thread block.
fn mv_grid(n: usize, m: usize) -> Result<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (
            u32::try_from(n.div_ceil(MV_ROWS))?,
            u32::try_from(m.div_ceil(8))?,
            1,
        ),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// Quantized activations held at the start of the arena: the input's device
/// address, length and row length, and the layout (`ACT_Q8`: quant_q8's
/// int8 rows and float2 scales; `ACT_CANON`: quant_act32's 16-bit rows,
/// scales and sums; `ACT_F16`: the tile kernel's f16 rows).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct ActKey {
    ptr: u64,
    len: usize,
    k: usize,
    layout: u8,
}
impl ActKey {
    fn new(x: &CudaView<'_, f32>, k: usize, layout: u8, s: &std::sync::Arc<CudaStream>) -> Self {
        ActKey {
            ptr: dev_ptr(x, s),
            len: x.len(),
            k,
            layout,
        }
    }
}

const ACT_Q8: u8 = 1;
const ACT_CANON: u8 = 2;
const ACT_F16: u8 = 3;

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
        let v = if f32_ranges_overlap(key.ptr, key.len, out, out_len) {
            None
        } else {
            Some(key)
        };
        if let Ok(mut c) = self.act_cache.lock() {
            *c = v;
        }
    }

    /// out (n, m) = x (n, k) · wᵀ. `exact`: the canonical kernels;
    /// `deterministic`: the warp-per-row kernels (int8 activations and dp4a
    /// for quantized weights) for every n, in groups of MV_ROWS rows
    /// (batch-invariant); `fast`: those up to MV_BATCH rows, the int8 MMA
    /// kernel for batched decode (see mma_rows), and cuBLAS f16
    /// tensor-core GEMM with f32 accumulation beyond (weights dequantized to
    /// f16 per call).
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
            let (lo, hi) = mma_rows();
            if mode == Mode::Fast && !float_w && n > lo && n <= hi {
                return self.mm_tile(w, x, n, out);
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
        if matches!(w.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            let d = mm_dims(w, n)?;
            let s = self.stream();
            let mut b = s.launch_builder(self.func("mv_float")?);
            b.arg(&w.data)
                .arg(&d.mi)
                .arg(&d.ki)
                .arg(&d.tc)
                .arg(x)
                .arg(&d.ni)
                .arg(out);
            // SAFETY: matches mv_float; w holds m rows of k values, x n*k and
            // out n*m (validated by the caller); k is a multiple of 32.
            drv(
                unsafe { b.launch(mv_grid(n, w.rows)?) },
                "mat_mul: launching mv_float",
            )?;
            return Ok(());
        }
        self.mat_vec_q8(w, x, n, out)
    }

    /// Quantized weights: activations to int8 (quant_q8), then the
    /// warp-per-row dp4a kernel.
    fn mat_vec_q8(
        &self,
        w: &DevMatrix<'_>,
        x: &CudaView<'_, f32>,
        n: usize,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let d = mm_dims(w, n)?;
        let k = w.cols;
        let s = self.stream();
        let nblk = n * k / 32;
        let mut guard = self.arena(&[n * k, nblk * 8, 0])?;
        let key = ActKey::new(x, k, ACT_Q8, s);
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
            let mut b = s.launch_builder(self.func("mv_q8")?);
            b.arg(&w.data)
                .arg(&d.mi)
                .arg(&d.ki)
                .arg(&d.rb)
                .arg(&d.tc)
                .arg(&mut *xq)
                .arg(&mut *xds)
                .arg(&d.ni)
                .arg(out);
            // SAFETY: matches mv_q8; w holds m rows of rb bytes (256-byte
            // aligned allocation), xq/xds as above, out n*m.
            drv(
                unsafe { b.launch(mv_grid(n, w.rows)?) },
                "mat_mul: launching mv_q8",
            )?;
            Ok(())
        })?;
        self.act_remember(key, out_ptr, out_len);
        Ok(())
    }

    /// Batched decode on quantized weights: activations to f16, then
    /// mm_f16_tile (weight tiles dequantized to f16 in shared memory,
    /// tensor-core MMA), split over k so that the grid has about two CTAs
    /// per SM, and the splits' partial sums added in order (split_sum).
    fn mm_tile(
        &self,
        w: &DevMatrix<'_>,
        x: &CudaView<'_, f32>,
        n: usize,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let d = mm_dims(w, n)?;
        let (m, k) = (w.rows, w.cols);
        let (splits, upc) = tile_splits(m, n, k / 32, self.sm_count());
        let part_len = if splits > 1 { splits * n * m } else { 0 };
        let s = self.stream();
        let mut guard = self.arena(&[n * k * 2, part_len * 4, 0])?;
        // The f16 activations at the start of the arena serve every matmul
        // of the same input (q/k/v, gate/up), like quant_q8's.
        let key = ActKey::new(x, k, ACT_F16, s);
        let cached = self.act_cached(key);
        let out_ptr = dev_ptr_mut(out, s);
        let out_len = out.len();
        arena3::<u16, f32, u8, ()>(&mut guard, (n * k, part_len, 0), |x16, part, _| {
            if !cached {
                let len = (n * k) as i64;
                let mut b = s.launch_builder(self.func("to_f16")?);
                b.arg(x).arg(&len).arg(&mut *x16);
                // SAFETY: matches to_f16; x and x16 hold n*k elements.
                drv(unsafe { b.launch(grid_1d(n * k, 256)?) }, "mat_mul: to_f16")?;
            }
            let cfg = LaunchConfig {
                grid_dim: (
                    u32::try_from(n.div_ceil(TILE_TOK))?,
                    u32::try_from(m.div_ceil(TILE_ROWS))?,
                    u32::try_from(splits)?,
                ),
                block_dim: (256, 1, 1),
                shared_mem_bytes: TILE_SMEM as u32,
            };
            let upci = i32_of(upc, "units per split")?;
            let stride = (n * m) as i64;
            let mut b = s.launch_builder(self.func("mm_f16_tile")?);
            b.arg(&w.data)
                .arg(&d.mi)
                .arg(&d.ki)
                .arg(&d.rb)
                .arg(&d.tc)
                .arg(&mut *x16)
                .arg(&d.ni)
                .arg(&upci);
            if splits > 1 {
                b.arg(&stride).arg(&mut *part);
                // SAFETY: matches mm_f16_tile; w holds m rows of rb bytes,
                // x16 n*k halves (arena: 256-byte aligned, rows of k halves
                // 64-byte multiples, for the 16-byte loads), part
                // splits*n*m floats (split z writes its n*m at z*stride).
                drv(unsafe { b.launch(cfg) }, "mat_mul: mm_f16_tile")?;
                let sp = i32_of(splits, "splits")?;
                let mut b = s.launch_builder(self.func("split_sum")?);
                b.arg(&mut *part).arg(&sp).arg(&stride).arg(&mut *out);
                // SAFETY: matches split_sum; part holds splits*n*m floats,
                // out n*m.
                drv(
                    unsafe { b.launch(grid_1d(n * m, 256)?) },
                    "mat_mul: split_sum",
                )?;
            } else {
                let zero = 0i64;
                b.arg(&zero).arg(&mut *out);
                // SAFETY: as above, one split writing out (n*m floats).
                drv(unsafe { b.launch(cfg) }, "mat_mul: mm_f16_tile")?;
            }
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
        let MmDims { tc, rb, mi, ki, ni } = mm_dims(w, n)?;
        let s = self.stream();
        let f16_weights = w.ty == GgmlType::F16;
        let wlen = if f16_weights { 0 } else { m * k };
        let mut guard = self.arena(&[wlen * 2, n * k * 2, 0])?;
        arena3::<u16, u16, u8, ()>(&mut guard, (wlen, n * k, 0), |w16, x16, _| {
            if !f16_weights {
                let mut b = s.launch_builder(self.func("dequant_f16")?);
                b.arg(&w.data)
                    .arg(&mi)
                    .arg(&ki)
                    .arg(&rb)
                    .arg(&tc)
                    .arg(&mut *w16);
                // Quantized types: one thread per 32-value unit (k is a
                // multiple of 32 here); float types: one per element.
                let float_w = matches!(w.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
                let threads = if float_w { m * k } else { m * k / 32 };
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
        validate::mat_mul(w, w.data.len(), x.len(), n, out.len())?;
        if n == 0 || m == 0 {
            return Ok(());
        }
        if k == 0 {
            drv(self.stream().memset_zeros(out), "mat_mul: zero out")?;
            return Ok(());
        }
        let MmDims { tc, mi, ki, ni, .. } = mm_dims(w, n)?;
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
                let key = ActKey::new(x, k, ACT_CANON, s);
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
                            let per_cta = 8 * crate::backend::cuda::source::MV_EXACT_WR;
                            let cfg = LaunchConfig {
                                grid_dim: (1, u32::try_from(m.div_ceil(per_cta))?, 1),
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
}

/// Whether `a_len` f32 values at device address `a` and `b_len` at `b`
/// share a byte.
fn f32_ranges_overlap(a: u64, a_len: usize, b: u64, b_len: usize) -> bool {
    let (a1, b1) = (a + 4 * a_len as u64, b + 4 * b_len as u64);
    a < b1 && b < a1
}

#[cfg(test)]
mod tests {
    use super::{f32_ranges_overlap, tile_splits};

    #[test]
    fn split_k_grids() {
        // 8B shapes on a 132-SM H100: (splits, units per split).
        assert_eq!(tile_splits(4096, 64, 128, 132), (8, 16));
        assert_eq!(tile_splits(1024, 64, 128, 132), (32, 4));
        assert_eq!(tile_splits(14336, 64, 128, 132), (2, 64));
        assert_eq!(tile_splits(4096, 64, 448, 132), (8, 56));
        assert_eq!(tile_splits(128256, 64, 128, 132), (1, 128));
        // Every split is non-empty and they cover the units exactly.
        for units in [1, 2, 3, 17, 18, 128, 449] {
            for m in [1, 97, 4096] {
                let (s, upc) = tile_splits(m, 17, units, 132);
                assert!(upc % 2 == 0 && s >= 1);
                assert!((s - 1) * upc < units && s * upc >= units, "{m} {units}");
            }
        }
    }

    #[test]
    fn overlap_of_device_ranges() {
        // Adjacent ranges do not overlap; one shared value does.
        assert!(!f32_ranges_overlap(1000, 10, 1040, 10));
        assert!(!f32_ranges_overlap(1040, 10, 1000, 10));
        assert!(f32_ranges_overlap(1000, 11, 1040, 10));
        assert!(f32_ranges_overlap(1040, 10, 1000, 11));
        // Containment, and an empty range overlaps nothing.
        assert!(f32_ranges_overlap(1000, 100, 1200, 4));
        assert!(!f32_ranges_overlap(1000, 0, 1000, 4));
    }
}
