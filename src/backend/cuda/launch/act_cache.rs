//! Quantized activations held in the scratch arena between ops: the cache
//! key (which buffer, in which layout), and the producers that fill it for
//! the next matmul (quant_q8, or an elementwise kernel told where by
//! `q8_out`), so consecutive matmuls of one input quantize it once.

use super::arena3;
use super::matmul::{mma_rows, plan, ExactForm, MmPlan, MmShape, MV_BATCH};
use crate::backend::cuda::fusion::{ActRead, OpFusion};
use crate::backend::cuda::launch::{dev_ptr, dev_ptr_mut};
use crate::backend::cuda::mem::Dev;
use crate::backend::cuda::{drv, grid_1d, CudaBackend};
use crate::backend::{MatJob, Mode};
use anyhow::Result;
use cudarc::driver::{CudaStream, CudaView, CudaViewMut, PushKernelArg};

/// Quantized activations held at the start of the arena: the input's device
/// address, length and row length, and the layout (`ACT_Q8`: quant_q8's
/// int8 rows and float2 scales; `ACT_CANON`: quant_act32's 16-bit rows,
/// scales and sums; `ACT_F16`: the tile kernel's f16 rows; `ACT_F16_WR`:
/// to_f16_wr's tiled f16 chunks for the wgmma GEMM).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct ActKey {
    ptr: u64,
    len: usize,
    k: usize,
    layout: u8,
}
impl ActKey {
    pub(super) fn new(
        x: &CudaView<'_, f32>,
        k: usize,
        layout: u8,
        s: &std::sync::Arc<CudaStream>,
    ) -> Self {
        ActKey {
            ptr: dev_ptr(x, s),
            len: x.len(),
            // quant_q8's blocks are 32 consecutive values of the buffer,
            // whatever its row length (a multiple of 32).
            k: if layout == ACT_Q8 { 0 } else { k },
            layout,
        }
    }
}

/// What the producer of a matmul's input knows of that matmul.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reader {
    /// Its plan is known (the op's own products, or the step's fusion
    /// pass): the layout it reads, None where it prepares nothing.
    Known(Option<ActRead>),
    /// A later op's, not planned (an op outside an executor's planned
    /// step): only what the rows alone tell (`predicted_q8`); the output's
    /// rows where known.
    Predicted(Option<usize>),
}

/// The activation layout a matmul plan reads its input in (None: it
/// prepares nothing: float weights, or nothing runs).
pub(crate) fn act_read(plan: &MmPlan) -> Option<ActRead> {
    // The planner's own answer for quant_q8's blocks.
    if plan.reads_q8() {
        return Some(ActRead::Q8);
    }
    match plan {
        MmPlan::Empty | MmPlan::Zero => None,
        MmPlan::Exact(ExactForm::Float) => Some(ActRead::Raw),
        MmPlan::Exact(_) => Some(ActRead::Canon),
        MmPlan::Tile { .. } | MmPlan::Blas => Some(ActRead::F16),
        MmPlan::Wgmma { .. } => Some(ActRead::F16Wr),
        // Past reads_q8: the float matvecs.
        MmPlan::Matvec { .. } | MmPlan::Short | MmPlan::Mq { .. } => Some(ActRead::Raw),
    }
}

pub(super) const ACT_Q8: u8 = 1;
pub(super) const ACT_CANON: u8 = 2;
pub(super) const ACT_F16: u8 = 3;
pub(super) const ACT_F16_WR: u8 = 4;

impl CudaBackend {
    /// Forgets which activations the arena holds (any op but a matmul, a
    /// new activation buffer, or arena growth may change them).
    pub(crate) fn forget_activations(&self) {
        if let Ok(mut c) = self.act_cache.lock() {
            *c = None;
        }
    }

    /// Forgets the held activations if they are those of a buffer
    /// overlapping the `len` f32 at device address `ptr` (a pooled buffer
    /// handed to a new user, who will write it): other buffers' stay.
    pub(crate) fn forget_activations_at(&self, ptr: u64, len: usize) {
        if let Ok(mut c) = self.act_cache.lock() {
            if c.is_some_and(|k| f32_ranges_overlap(k.ptr, k.len, ptr, len)) {
                *c = None;
            }
        }
    }

    /// Whether the arena holds `key`'s quantized activations.
    pub(super) fn act_cached(&self, key: ActKey) -> bool {
        self.act_cache
            .lock()
            .map(|c| *c == Some(key))
            .unwrap_or(false)
    }

    /// Records `key` as held, unless one of the outputs written (device
    /// address, f32 length) overlaps its input, which then no longer holds
    /// those values.
    pub(super) fn act_remember(&self, key: ActKey, outs: &[(u64, usize)]) {
        let clobbered = outs
            .iter()
            .any(|&(p, len)| f32_ranges_overlap(key.ptr, key.len, p, len));
        if let Ok(mut c) = self.act_cache.lock() {
            *c = if clobbered { None } else { Some(key) };
        }
    }

    /// For an elementwise kernel about to write activations `out` (n rows
    /// of k): where the next matmul of `out` would quantize it with
    /// quant_q8 (the warp-per-row kernels: `deterministic`, or `fast` at
    /// decode row counts), the cache key to record once the producer is
    /// queued and the arena addresses (xq, xds) it fills instead, with the
    /// same bits (q8_block). The tuning's `matvec.prequant` = false turns
    /// this off.
    /// The next matmul is the next op's: as the fusion pass planned it
    /// where the running op has an annotation, else predicted from the
    /// rows (`predicted_q8`; `rows` None: unknown, none written; `k` only
    /// needs to divide the length: the quantized bytes of a buffer do not
    /// depend on its row length, a multiple of 32).
    pub(crate) fn q8_out(
        &self,
        out: &CudaViewMut<'_, f32>,
        rows: Option<usize>,
        k: usize,
        mode: Mode,
    ) -> Result<Option<(ActKey, u64, u64)>> {
        self.q8_out_for(out, self.output_reader(rows), k, mode)
    }

    /// The fusion pass's annotation of the op being run, if it has one
    /// (`run_fused`).
    pub(crate) fn current_fusion(&self) -> Option<OpFusion> {
        self.op_fusion.lock().ok().and_then(|f| *f)
    }

    /// The op's output's reader: the matmul of the next op, as the fusion
    /// pass planned it where the op has an annotation (`out_for_next`),
    /// else `Predicted(rows)`.
    pub(super) fn output_reader(&self, rows: Option<usize>) -> Reader {
        match self.current_fusion() {
            Some(f) => Reader::Known(f.out_for_next),
            None => Reader::Predicted(rows),
        }
    }

    /// Whether the matmul after an op writing `rows` rows, not planned
    /// (`Reader::Predicted`: an op outside an executor's planned step),
    /// reads quant_q8's blocks: those the warp-per-row kernels surely read
    /// (`deterministic`; `fast` below the tensor-core rows). Past them
    /// mm_q8_mma reads the same blocks for the types it takes, but which
    /// type comes next is the plan's to know: none are written.
    fn predicted_q8(&self, rows: Option<usize>, mode: Mode) -> bool {
        let (lo, hi) = mma_rows();
        match (mode, rows) {
            (Mode::Exact, _) => false,
            (Mode::Deterministic, _) => true,
            (Mode::Fast, Some(n)) => n <= MV_BATCH && !(n > lo && n <= hi),
            (Mode::Fast, None) => false,
        }
    }

    /// `q8_out` for the matmul `reader` describes.
    pub(crate) fn q8_out_for(
        &self,
        out: &CudaViewMut<'_, f32>,
        reader: Reader,
        k: usize,
        mode: Mode,
    ) -> Result<Option<(ActKey, u64, u64)>> {
        let mv_rows = match reader {
            Reader::Known(r) => mode != Mode::Exact && r == Some(ActRead::Q8),
            Reader::Predicted(rows) => self.predicted_q8(rows, mode),
        };
        let len = out.len();
        if !self.tuning.matvec.prequant
            || !mv_rows
            || len == 0
            || k == 0
            || !k.is_multiple_of(32)
            || !len.is_multiple_of(k)
        {
            return Ok(None);
        }
        let s = self.stream();
        let n = len / k;
        let nblk = n * k / 32;
        let mut guard = self.arena(&[n * k, nblk * 8, 0])?;
        let (xq, xds) =
            arena3::<i8, f32, u8, _>(&mut guard, (n * k, nblk * 2, 0), |xq, xds, _| {
                Ok((dev_ptr_mut(xq, s), dev_ptr_mut(xds, s)))
            })?;
        let key = ActKey {
            ptr: dev_ptr_mut(out, s),
            len,
            k: 0,
            layout: ACT_Q8,
        };
        Ok(Some((key, xq, xds)))
    }

    /// For rms_norm, swiglu or the prefill attention about to write
    /// activations `out` (n rows of k) in `fast` mode: where the next
    /// matmul of `out` would convert it with to_f16_wr for the wgmma
    /// prefill GEMM (the fusion pass planned it so: an op outside a
    /// planned step writes none; k a multiple of 256, `out` 16-byte
    /// aligned), the cache key to record once the producer is queued and
    /// the arena address of the f16 tiles it writes instead (whole tiles
    /// of 128 rows, up to a multiple of 256 rows: every CTA shape's
    /// padding; the same bits). The tuning's `matvec.prequant` = false turns
    /// this off.
    pub(crate) fn f16wr_out(
        &self,
        out: &CudaViewMut<'_, f32>,
        n: usize,
        k: usize,
        mode: Mode,
    ) -> Result<Option<(ActKey, u64)>> {
        self.f16wr_out_for(out, n, k, mode, self.output_reader(Some(n)))
    }

    /// `f16wr_out` for the matmul `reader` describes (predicted: the last
    /// matmul took the wgmma GEMM on n rows).
    pub(crate) fn f16wr_out_for(
        &self,
        out: &CudaViewMut<'_, f32>,
        n: usize,
        k: usize,
        mode: Mode,
        reader: Reader,
    ) -> Result<Option<(ActKey, u64)>> {
        let s = self.stream();
        // Only a planned reader's GEMM is known to be the wgmma one.
        let wgmma = reader == Reader::Known(Some(ActRead::F16Wr));
        if !self.tuning.matvec.prequant
            || mode != Mode::Fast
            || n == 0
            || !wgmma
            || !k.is_multiple_of(256)
            || out.len() != n * k
            || !dev_ptr_mut(out, s).is_multiple_of(16)
        {
            return Ok(None);
        }
        let padded = n.div_ceil(256) * 256;
        let mut guard = self.arena(&[padded * k * 2, 0, 0])?;
        let x16 = arena3::<u16, u8, u8, _>(&mut guard, (padded * k, 0, 0), |x16, _, _| {
            Ok(dev_ptr_mut(x16, s))
        })?;
        let key = ActKey {
            ptr: dev_ptr_mut(out, s),
            len: out.len(),
            k,
            layout: ACT_F16_WR,
        };
        Ok(Some((key, x16)))
    }

    /// quant_q8: `nblk` blocks of 32 activations of x to int8 rows xq and
    /// their float2 (scale, scaled sum) xds, as f32 pairs.
    pub(super) fn quant_q8(
        &self,
        x: &CudaView<'_, f32>,
        nblk: usize,
        xq: &mut CudaViewMut<'_, i8>,
        xds: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let nb = nblk as i64;
        let mut b = self.stream().launch_builder(self.func("quant_q8")?);
        b.arg(x).arg(&nb).arg(xq).arg(xds);
        // SAFETY: matches quant_q8 (xds as float2 pairs); the callers' x
        // holds nblk blocks of 32 values, xq nblk*32 bytes, xds 2*nblk floats.
        drv(
            unsafe { b.launch(grid_1d(nblk * 32, 256)?) },
            "mat_mul: launching quant_q8",
        )?;
        Ok(())
    }

    /// Records that the arena holds `key`'s quantized activations (written
    /// by the elementwise kernel just queued; see q8_out).
    pub(crate) fn q8_done(&self, key: ActKey) {
        self.act_remember(key, &[]);
    }

    /// Device ranges (address, f32 length) of the jobs' outputs.
    pub(super) fn out_ranges(
        jobs: &[MatJob<'_, Dev>],
        s: &std::sync::Arc<CudaStream>,
    ) -> Vec<(u64, usize)> {
        jobs.iter()
            .map(|j| (dev_ptr_mut(&j.out, s), j.out.len()))
            .collect()
    }
}

/// The running op's fusion annotation, cleared when dropped (the end of
/// `run_fused`, also on an error).
pub(crate) struct FusionScope<'a>(&'a CudaBackend);

impl Drop for FusionScope<'_> {
    fn drop(&mut self) {
        if let Ok(mut f) = self.0.op_fusion.lock() {
            *f = None;
        }
    }
}

impl CudaBackend {
    /// What a `MatMuls` of `n` rows of `k` values by `ty` weights with job
    /// rows `rows` reads in `mode`, as the matmul planner plans it over
    /// the executor's buffers (whole allocations: 16-byte aligned): the
    /// fusion pass's input (dispatch/cuda/step_ops.rs). Where the buffers
    /// turn out otherwise the launcher plans again; a producer's blocks
    /// that the products then do not read cost time, never a bit
    /// (`act_cached`).
    pub fn planned_read(
        &self,
        mode: Mode,
        n: usize,
        ty: crate::quant::GgmlType,
        k: usize,
        rows: &[usize],
    ) -> ActRead {
        let shape = MmShape {
            ty,
            k,
            n,
            rows,
            aligned16: true,
            outs_vec4: false,
        };
        act_read(&plan(&shape, mode, &self.mm_caps(), &self.tuning.matmul)).unwrap_or(ActRead::Raw)
    }

    /// Sets the running op's annotation (`current_fusion`) until the scope
    /// ends.
    pub(crate) fn fusion_scope(&self, f: Option<OpFusion>) -> Result<FusionScope<'_>> {
        *self
            .op_fusion
            .lock()
            .map_err(|_| anyhow::anyhow!("cuda backend: op fusion lock poisoned"))? = f;
        Ok(FusionScope(self))
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
    use super::f32_ranges_overlap;

    #[test]
    fn each_plan_reads_its_layout() {
        use super::{act_read, ExactForm, MmPlan};
        use crate::backend::cuda::fusion::ActRead::*;
        let cases = [
            (MmPlan::Empty, None),
            (MmPlan::Zero, None),
            (MmPlan::Exact(ExactForm::Float), Some(Raw)),
            (MmPlan::Exact(ExactForm::KQuant), Some(Canon)),
            (MmPlan::Exact(ExactForm::Matvec), Some(Canon)),
            (MmPlan::Exact(ExactForm::Q32), Some(Canon)),
            (
                MmPlan::Matvec {
                    float: true,
                    warps: 1,
                },
                Some(Raw),
            ),
            (
                MmPlan::Matvec {
                    float: false,
                    warps: 2,
                },
                Some(Q8),
            ),
            (MmPlan::Short, Some(Q8)),
            (
                MmPlan::Tile {
                    splits: vec![(1, 4)],
                },
                Some(F16),
            ),
            (MmPlan::Blas, Some(F16)),
            (
                MmPlan::Wgmma {
                    shape: 0,
                    splits: 1,
                    tail: None,
                },
                Some(F16Wr),
            ),
        ];
        for (plan, want) in cases {
            assert_eq!(act_read(&plan), want, "{plan:?}");
            // The planner's own q8 answer agrees.
            assert_eq!(want == Some(Q8), plan.reads_q8(), "{plan:?}");
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
