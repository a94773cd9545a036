//! The cuBLAS path of `fast` mode (prefill and large batches): weights to
//! f16 (unless stored as f16), the input to f16 once per input (the
//! activation cache), then cuBLAS f16 tensor-core GEMMs with f32
//! accumulation and output.
//!
//! Jobs of one MatMuls op with the same shape (k and v of a GQA model,
//! gate and up) run as one strided-batched GEMM: a 1,024-row k or v
//! projection alone fills a quarter of an H100 at 512 tokens, and gate and
//! up each end on a partial wave.

use super::jobs::{mm_dims, MmDims};
use super::prepared::outs_overlap;
use crate::backend::cuda::device::launch::{arena3, dev_ptr, dev_ptr_mut};
use crate::backend::cuda::device::memory::Dev;
use crate::backend::cuda::{drv, grid_1d, CudaBackend};
use crate::backend::MatJob;
use crate::quant::GgmlType;
use anyhow::{anyhow, Result};
use cudarc::driver::{CudaView, PushKernelArg};

/// How a run of same-shaped jobs is batched: the jobs in the order of
/// their outputs' addresses, and the (positive) distance between
/// consecutive outputs (f32 elements) and, for weights already f16,
/// between consecutive weight matrices (f16 elements). None: the distances
/// differ or a weight stride would be negative (cuBLAS takes one stride
/// each), so the jobs run one GEMM each.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct BatchPlan {
    pub order: Vec<usize>,
    pub stride_c: i64,
    pub stride_a: Option<i64>,
}

/// `outs`: each job's output address (bytes); `weights`: each job's f16
/// weight address (bytes) when stored as f16, None when they are
/// dequantized into consecutive scratch matrices (whose stride is then
/// the caller's).
pub(super) fn batch_plan(outs: &[u64], weights: Option<&[u64]>) -> Option<BatchPlan> {
    if outs.len() < 2 {
        return None;
    }
    let mut order: Vec<usize> = (0..outs.len()).collect();
    order.sort_by_key(|&i| outs[i]);
    let dist = |v: &[u64], elem: u64| -> Option<i64> {
        let d0 = v[order[1]] as i128 - v[order[0]] as i128;
        let uniform = order
            .windows(2)
            .all(|w| v[w[1]] as i128 - v[w[0]] as i128 == d0);
        (uniform && d0 > 0 && d0 % elem as i128 == 0).then(|| (d0 / elem as i128) as i64)
    };
    let stride_c = dist(outs, 4)?;
    let stride_a = match weights {
        Some(w) => Some(dist(w, 2)?),
        None => None,
    };
    Some(BatchPlan {
        order,
        stride_c,
        stride_a,
    })
}

impl CudaBackend {
    /// x16[..len] = x[..len] as f16 (round to nearest even): the f16
    /// activations of the tensor-core paths (cuBLAS, the tile and wgmma
    /// kernels). Both hold at least `len` elements.
    pub(super) fn to_f16_into(
        &self,
        x: &CudaView<'_, f32>,
        x16: &mut cudarc::driver::CudaViewMut<'_, u16>,
        len: usize,
    ) -> Result<()> {
        if x.len() < len || x16.len() < len {
            return Err(anyhow!(
                "mat_mul: to_f16 of {len} values into buffers of {} and {}",
                x.len(),
                x16.len()
            ));
        }
        let n = len as i64;
        let mut b = self.stream().launch_builder(self.func("to_f16")?);
        b.arg(x).arg(&n).arg(&mut *x16);
        // SAFETY: matches to_f16; x and x16 hold at least len elements
        // (checked above).
        drv(unsafe { b.launch(grid_1d(len, 256)?) }, "mat_mul: to_f16")?;
        Ok(())
    }

    /// out_j (n, m_j) (=, or +=) x (n, k) · w_jᵀ for every job, through
    /// cuBLAS: runs of consecutive jobs with the same rows and `add` as
    /// one strided-batched GEMM where `batch_plan` allows, else one GEMM
    /// each. Validated arguments, k a multiple of 32.
    pub(super) fn gemm_f16_jobs(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        jobs: &mut [MatJob<'_, Dev>],
        pre: bool,
    ) -> Result<()> {
        let s = self.stream();
        let (mut i, mut pre) = (0, pre);
        while i < jobs.len() {
            let mut e = i + 1;
            while e < jobs.len() && jobs[e].w.rows == jobs[i].w.rows && jobs[e].add == jobs[i].add {
                e += 1;
            }
            self.gemm_f16(x, n, &mut jobs[i..e], pre)?;
            // The next GEMMs find the f16 rows this one wrote, unless one
            // of its jobs wrote over the input.
            pre = !outs_overlap(x, &jobs[i..e], s);
            i = e;
        }
        Ok(())
    }

    /// One strided-batched GEMM over `jobs` (same type, rows, k and add;
    /// one job: a plain GEMM), or one GEMM per job when they cannot be
    /// batched (see `batch_plan`).
    fn gemm_f16(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        jobs: &mut [MatJob<'_, Dev>],
        pre: bool,
    ) -> Result<()> {
        use cudarc::cublas::sys::{
            cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType,
        };
        use cudarc::driver::DevicePtr;
        let blas = self
            .blas
            .as_ref()
            .ok_or_else(|| anyhow!("mat_mul: no cuBLAS"))?;
        let s = self.stream();
        let w0 = &jobs[0].w;
        let (m, k, add) = (w0.rows, w0.cols, jobs[0].add);
        let MmDims { tc, rb, mi, ki, ni } = mm_dims(w0, n)?;
        let f16_weights = w0.ty == GgmlType::F16;
        let outs: Vec<u64> = jobs.iter().map(|j| dev_ptr_mut(&j.out, s)).collect();
        let wptrs: Vec<u64> = jobs.iter().map(|j| dev_ptr(&j.w.data, s)).collect();
        // Batched only with outputs at least n*m floats apart (each job
        // writes n*m): overlapping ones keep the op's order, one GEMM each.
        let plan = batch_plan(&outs, f16_weights.then_some(&wptrs[..]))
            .filter(|p| p.stride_c as u64 >= (n * m) as u64);
        if jobs.len() > 1 && plan.is_none() {
            let mut pre = pre;
            for j in 0..jobs.len() {
                self.gemm_f16(x, n, &mut jobs[j..j + 1], pre)?;
                pre = !outs_overlap(x, &jobs[j..=j], s);
            }
            return Ok(());
        }
        let (order, stride_c, stride_a) = match plan {
            Some(p) => (p.order, p.stride_c, p.stride_a),
            None => (vec![0], 0, None),
        };
        let batch = order.len();
        let wlen = if f16_weights { 0 } else { batch * m * k };
        // The f16 activations at the start of the arena (mm_tile's layout)
        // serve every matmul of the same input (`pre`): q/k/v and gate/up
        // convert their input once.
        let (mut guard, cached) = self.arena_kept(&[n * k * 2, wlen * 2, 0], pre)?;
        arena3::<u16, u16, u8, ()>(&mut guard, (n * k, wlen, 0), |x16, w16, _| {
            if !f16_weights {
                // Quantized types: one thread per 32-value unit (k is a
                // multiple of 32 here); F32 / BF16: one per element.
                let per_elem = matches!(w0.ty, GgmlType::F32 | GgmlType::BF16);
                let threads = if per_elem { m * k } else { m * k / 32 };
                // The jobs' weights one after another, in batch order.
                for (slot, &j) in order.iter().enumerate() {
                    let mut dst = w16.slice_mut(slot * m * k..(slot + 1) * m * k);
                    let mut b = s.launch_builder(self.func("dequant_f16")?);
                    b.arg(&jobs[j].w.data)
                        .arg(&mi)
                        .arg(&ki)
                        .arg(&rb)
                        .arg(&tc)
                        .arg(&mut dst);
                    // SAFETY: matches dequant_f16; the job's weights hold m
                    // rows of rb bytes, dst m*k elements (arena: 256-byte
                    // aligned, and m*k halves a multiple of 32 bytes with
                    // k a multiple of 32, so every slot is 64-byte aligned
                    // for the 16-byte stores).
                    drv(
                        unsafe { b.launch(grid_1d(threads, 256)?) },
                        "mat_mul: dequant_f16",
                    )?;
                }
            }
            if !cached {
                self.to_f16_into(x, x16, n * k)?;
            }
            let (alpha, beta) = (1.0f32, if add { 1.0f32 } else { 0.0 });
            let (w16p, _g1) = w16.device_ptr(s);
            let (xp, _g2) = x16.device_ptr(s);
            let first = order[0];
            let wp = if f16_weights { wptrs[first] } else { w16p };
            let op = outs[first];
            // f16 weights: the jobs' own matrices stride_a apart; else the
            // dequantized ones, m*k apart.
            let sa = stride_a.unwrap_or((m * k) as i64);
            let bi = i32::try_from(batch)?;
            // Column-major view: out^T (m, n) = W (k, m)^T · x^T (k, n),
            // for each batch entry (the same x: stride 0).
            // SAFETY: cuBLAS is bound to this backend's stream; for entry
            // b the pointers wp + b*sa halves (m*k: a job's weights, by
            // batch_plan or the scratch layout above), x16 (n*k halves)
            // and op + b*stride_c floats (a job's n*m output, by
            // batch_plan) stay alive until the GEMM, queued on the same
            // stream, has run.
            // One job: batch 1 of the same call (strides unused).
            unsafe {
                cudarc::cublas::result::gemm_strided_batched_ex(
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
                    sa,
                    xp as *const _,
                    cudaDataType::CUDA_R_16F,
                    ki,
                    0,
                    (&beta) as *const f32 as *const _,
                    op as *mut _,
                    cudaDataType::CUDA_R_32F,
                    mi,
                    stride_c,
                    bi,
                    cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(|e| anyhow!("mat_mul: cuBLAS GEMM ({m} x {k}, n {n}, batch {batch}): {e:?}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{batch_plan, BatchPlan};

    #[test]
    fn same_shaped_jobs_batch_in_output_order() {
        // k then v outputs 4 KiB apart: stride 1,024 floats.
        assert_eq!(
            batch_plan(&[0x1000, 0x2000], None),
            Some(BatchPlan {
                order: vec![0, 1],
                stride_c: 1024,
                stride_a: None
            })
        );
        // Outputs in reverse order: the batch follows the outputs, and
        // f16 weights must then be in the same order.
        assert_eq!(
            batch_plan(&[0x2000, 0x1000], Some(&[0x9000, 0x8000])),
            Some(BatchPlan {
                order: vec![1, 0],
                stride_c: 1024,
                stride_a: Some(2048)
            })
        );
        // Weights the other way round: no positive stride for both.
        assert_eq!(batch_plan(&[0x1000, 0x2000], Some(&[0x9000, 0x8000])), None);
        // Three outputs unevenly spaced: one GEMM each.
        assert_eq!(batch_plan(&[0x1000, 0x2000, 0x4000], None), None);
        // Evenly spaced: one batch of three.
        assert_eq!(
            batch_plan(&[0x3000, 0x1000, 0x2000], None).map(|p| p.order),
            Some(vec![1, 2, 0])
        );
        // One job, or an output not a whole number of floats apart.
        assert_eq!(batch_plan(&[0x1000], None), None);
        assert_eq!(batch_plan(&[0x1000, 0x1002], None), None);
    }
}
