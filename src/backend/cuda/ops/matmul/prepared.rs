//! Prepared matmul inputs in the scratch arena: which layout a matmul plan
//! reads its input in, the producers that write it for the next op's
//! matmul (an elementwise kernel told where by `q8_out` / `f16wr_out`, or
//! the standalone conversion where the kernel could not), and whether a
//! matmul finds its input prepared.
//!
//! Nothing here is remembered between ops and nothing is keyed by a
//! device address: the fusion pass (fusion.rs) decides, per op, which op
//! writes a prepared input (`out_for_next`, or a matmul's own products)
//! and which matmul reads it (`input_from`). The launchers obey: an
//! annotated producer always writes its layout (`finish_out_for_next`,
//! `keep_planned_input`), and an annotated reader skips its quantization
//! only where its own plan reads what the pass planned
//! (`input_prepared`) and the arena was not regrown under it
//! (`arena_kept`). An op without annotation quantizes its own input (the
//! same kernels, the same blocks: only slower).

use super::{plan, ExactForm, MmPlan, MmShape};
use crate::backend::cuda::device::launch::arena3;
use crate::backend::cuda::device::launch::{dev_ptr, dev_ptr_mut};
use crate::backend::cuda::device::memory::Dev;
use crate::backend::cuda::fusion::{ActRead, OpFusion};
use crate::backend::cuda::{drv, grid_1d, i32_of, CudaBackend};
use crate::backend::{MatJob, Mode};
use anyhow::Result;
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, PushKernelArg};

/// A producer's promise, handed back by `q8_out` / `f16wr_out` and
/// redeemed with `q8_done` once its kernel is queued: the layout it wrote
/// for the next op's matmul.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ActKey {
    read: ActRead,
}

/// The activation layout a matmul plan reads its input in and keeps at
/// the start of the arena for the next op (None: it prepares nothing
/// there: float weights, the K-quant canonical kernel (whose quant_actk
/// blocks are per job), or nothing runs).
pub(crate) fn act_read(plan: &MmPlan) -> Option<ActRead> {
    // The planner's own answer for quant_q8's blocks.
    if plan.reads_q8() {
        return Some(ActRead::Q8);
    }
    match plan {
        MmPlan::Empty | MmPlan::Zero => None,
        MmPlan::Exact(ExactForm::Float | ExactForm::KQuant) => Some(ActRead::Raw),
        MmPlan::Exact(ExactForm::Matvec | ExactForm::Q32 | ExactForm::Mma { .. }) => {
            Some(ActRead::Canon)
        }
        MmPlan::Tile { .. } | MmPlan::Blas => Some(ActRead::F16),
        MmPlan::Wgmma { .. } => Some(ActRead::F16Wr),
        // Past reads_q8: the float matvecs.
        MmPlan::Matvec { .. } | MmPlan::Short | MmPlan::Mq { .. } => Some(ActRead::Raw),
    }
}

/// Whether a matmul whose annotation says its input is prepared
/// (`input_from`) may skip preparing it: the pass planned the layout
/// `planned` (the planner over whole, aligned buffers) and the plan the
/// launcher made over the real buffers reads `actual`; they differ only
/// where a buffer turned out unaligned (the wgmma GEMM then not taken),
/// and the reader then prepares its own.
pub(crate) fn input_prepared(
    fusion: Option<OpFusion>,
    planned: ActRead,
    actual: Option<ActRead>,
) -> bool {
    let from = fusion.is_some_and(|f| f.input_from.is_some());
    from && actual == Some(planned) && !matches!(planned, ActRead::Raw)
}

impl CudaBackend {
    /// The fusion pass's annotation of the op being run, if it has one
    /// (`run_fused`).
    pub(crate) fn current_fusion(&self) -> Option<OpFusion> {
        self.op_fusion.lock().ok().and_then(|f| *f)
    }

    /// The layout the op's annotation says its output is written in for
    /// the next op's matmul (None: no annotation, or nothing planned).
    fn out_for_next(&self) -> Option<ActRead> {
        self.current_fusion().and_then(|f| f.out_for_next)
    }

    /// The scratch arena as `arena`, and whether what it held before (a
    /// prepared input, where `held`) is still there: false once it grew
    /// (a new allocation).
    pub(crate) fn arena_kept(
        &self,
        bytes: &[usize],
        held: bool,
    ) -> Result<(std::sync::MutexGuard<'_, CudaSlice<u8>>, bool)> {
        let (guard, grew) = self.arena_grown(bytes)?;
        Ok((guard, held && !grew))
    }

    /// For an elementwise kernel of the op being run about to write
    /// activations `out` (rows of k): where the op's annotation says the
    /// next op's matmul reads `out` as quant_q8's blocks, the promise to
    /// redeem once the producer is queued (`q8_done`) and the arena
    /// addresses (xq, xds) it fills instead, with the same bits (q8_block).
    /// `k` only needs to divide the length: the quantized bytes of a buffer
    /// do not depend on its row length, a multiple of 32. (`_rows`: the
    /// output's rows, which the blocks do not depend on.)
    pub(crate) fn q8_out(
        &self,
        out: &CudaViewMut<'_, f32>,
        _rows: Option<usize>,
        k: usize,
        mode: Mode,
    ) -> Result<Option<(ActKey, u64, u64)>> {
        self.q8_out_for(out, self.out_for_next(), k, mode)
    }

    /// `q8_out` for a reader that reads `reader` (the op's own products,
    /// or the next op's as annotated).
    pub(crate) fn q8_out_for(
        &self,
        out: &CudaViewMut<'_, f32>,
        reader: Option<ActRead>,
        k: usize,
        mode: Mode,
    ) -> Result<Option<(ActKey, u64, u64)>> {
        let len = out.len();
        if !self.tuning.matvec.prequant
            || mode == Mode::Exact
            || reader != Some(ActRead::Q8)
            || !q8_shape(len, k)
        {
            return Ok(None);
        }
        let s = self.stream();
        let nblk = len / 32;
        let mut guard = self.arena(&[len, nblk * 8, 0])?;
        let (xq, xds) = arena3::<i8, f32, u8, _>(&mut guard, (len, nblk * 2, 0), |xq, xds, _| {
            Ok((dev_ptr_mut(xq, s), dev_ptr_mut(xds, s)))
        })?;
        Ok(Some((ActKey { read: ActRead::Q8 }, xq, xds)))
    }

    /// For rms_norm, swiglu or the prefill attention about to write
    /// activations `out` (n rows of k) in `fast` mode: where the op's
    /// annotation says the next op's matmul converts `out` with to_f16_wr
    /// for the wgmma prefill GEMM (k a multiple of 256, `out` 16-byte
    /// aligned), the promise to redeem once the producer is queued and the
    /// arena address of the f16 tiles it writes instead (whole tiles of
    /// 128 rows, up to a multiple of 256 rows: every CTA shape's padding;
    /// the same bits).
    pub(crate) fn f16wr_out(
        &self,
        out: &CudaViewMut<'_, f32>,
        n: usize,
        k: usize,
        mode: Mode,
    ) -> Result<Option<(ActKey, u64)>> {
        self.f16wr_out_for(out, n, k, mode, self.out_for_next())
    }

    /// `f16wr_out` for a reader that reads `reader`.
    pub(crate) fn f16wr_out_for(
        &self,
        out: &CudaViewMut<'_, f32>,
        n: usize,
        k: usize,
        mode: Mode,
        reader: Option<ActRead>,
    ) -> Result<Option<(ActKey, u64)>> {
        let s = self.stream();
        if !self.tuning.matvec.prequant
            || mode != Mode::Fast
            || reader != Some(ActRead::F16Wr)
            || !f16wr_shape(out.len(), n, k)
            || !dev_ptr_mut(out, s).is_multiple_of(16)
        {
            return Ok(None);
        }
        let padded = n.div_ceil(256) * 256;
        let mut guard = self.arena(&[padded * k * 2, 0, 0])?;
        let x16 = arena3::<u16, u8, u8, _>(&mut guard, (padded * k, 0, 0), |x16, _, _| {
            Ok(dev_ptr_mut(x16, s))
        })?;
        Ok(Some((
            ActKey {
                read: ActRead::F16Wr,
            },
            x16,
        )))
    }

    /// Records that the op's producer kernel, just queued, wrote the
    /// promised layout (see q8_out): `finish_out_for_next` then has
    /// nothing left to write.
    pub(crate) fn q8_done(&self, key: ActKey) {
        if let Ok(mut w) = self.op_wrote.lock() {
            *w = Some(key.read);
        }
    }

    /// Forgets what the op wrote so far (its own input's blocks, which are
    /// not its output).
    pub(super) fn forget_op_wrote(&self) {
        if let Ok(mut w) = self.op_wrote.lock() {
            *w = None;
        }
    }

    /// The end of an op whose output `out` (`rows` rows where known) the
    /// annotation says is written for the next op's matmul: where the
    /// op's kernel did not write it (a buffer it found unaligned, a kernel
    /// form without that epilogue), the standalone conversion writes it
    /// now, the same kernel the reader would run, so the reader's skip
    /// holds. F16Wr needs the rows (the fusion pass annotates it only
    /// where the op has them) and a 16-byte aligned `out`, without which
    /// the reader does not take the wgmma GEMM on it.
    pub(crate) fn finish_out_for_next(
        &self,
        out: &CudaView<'_, f32>,
        rows: Option<usize>,
        mode: Mode,
    ) -> Result<()> {
        let Some(read) = self.out_for_next() else {
            return Ok(());
        };
        let wrote = self.op_wrote.lock().map(|w| *w).unwrap_or(None);
        if wrote == Some(read) {
            return Ok(());
        }
        match read {
            ActRead::Q8 if mode != Mode::Exact && q8_shape(out.len(), 32) => {
                self.prepare_q8(out, out.len())
            }
            ActRead::F16Wr => match rows {
                Some(n) if n > 0 && out.len().is_multiple_of(n) => {
                    self.prepare_f16wr(out, n, out.len() / n)
                }
                _ => Ok(()),
            },
            _ => Ok(()),
        }
    }

    /// quant_q8 of the `len` values of x into the arena's start (the
    /// layout every q8 reader takes).
    pub(super) fn prepare_q8(&self, x: &CudaView<'_, f32>, len: usize) -> Result<()> {
        let nblk = len / 32;
        let mut guard = self.arena(&[len, nblk * 8, 0])?;
        arena3::<i8, f32, u8, ()>(&mut guard, (len, nblk * 2, 0), |xq, xds, _| {
            self.quant_q8(x, nblk, xq, xds)
        })
    }

    /// to_f16_wr of x (n rows of k) into the arena's start, whole tiles
    /// up to a multiple of 256 rows (the wgmma GEMM's layout and padding,
    /// as `f16wr_out`); nothing where x is not 16-byte aligned or k not a
    /// multiple of 256 (no reader takes the wgmma GEMM on it then).
    pub(super) fn prepare_f16wr(&self, x: &CudaView<'_, f32>, n: usize, k: usize) -> Result<()> {
        let s = self.stream();
        if !f16wr_shape(x.len(), n, k) || !dev_ptr(x, s).is_multiple_of(16) {
            return Ok(());
        }
        let padded = n.div_ceil(256) * 256;
        let mut guard = self.arena(&[padded * k * 2, 0, 0])?;
        arena3::<u16, u8, u8, ()>(&mut guard, (padded * k, 0, 0), |x16, _, _| {
            self.to_f16_wr(x, n, k, padded, x16)
        })
    }

    /// to_f16_wr: x (n, k) to f16 tiles in `x16` (`padded` rows, zeros
    /// past n).
    pub(super) fn to_f16_wr(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        k: usize,
        padded: usize,
        x16: &mut CudaViewMut<'_, u16>,
    ) -> Result<()> {
        let (ni, ki) = (i32_of(n, "n")?, i32_of(k, "k")?);
        let pieces = padded * k / 8;
        let p64 = i64::try_from(pieces)?;
        let mut b = self.stream().launch_builder(self.func("to_f16_wr")?);
        b.arg(x).arg(&ni).arg(&ki).arg(&p64).arg(&mut *x16);
        // SAFETY: matches to_f16_wr (x, n, k, pieces, out): the callers' x
        // holds n * k floats, 16-byte aligned, out padded * k halves (an
        // arena region); k is a multiple of 256.
        drv(
            unsafe { b.launch(grid_1d(pieces, 256)?) },
            "mat_mul: to_f16_wr",
        )?;
        Ok(())
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

    /// Whether the products of an op over x (n rows) that read it in the
    /// layout `actual` find it prepared: the op's annotation says so and
    /// its plan reads what the pass planned.
    pub(crate) fn annotated_input(
        &self,
        n: usize,
        jobs: &[MatJob<'_, Dev>],
        mode: Mode,
        actual: Option<ActRead>,
    ) -> bool {
        let Some(j0) = jobs.first() else {
            return false;
        };
        let fusion = self.current_fusion();
        if fusion.is_none_or(|f| f.input_from.is_none()) {
            return false;
        }
        let rows: Vec<usize> = jobs.iter().map(|j| j.w.rows).collect();
        let planned = self.planned_read(mode, n, j0.w.ty, j0.w.cols, &rows);
        input_prepared(fusion, planned, actual)
    }

    /// After an annotated op's products: where the pass planned them to
    /// read (and so keep) x as the wgmma GEMM's tiles but the plan over
    /// the real buffers took another form (a job's weights unaligned), a
    /// later op the pass gave this input (`input_from`) would expect the
    /// tiles: they are written now, the same conversion.
    pub(super) fn keep_planned_input(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        jobs: &[MatJob<'_, Dev>],
        mode: Mode,
        actual: Option<ActRead>,
    ) -> Result<()> {
        let Some(j0) = jobs.first() else {
            return Ok(());
        };
        // The tiles are `fast`'s alone.
        if mode != Mode::Fast || self.current_fusion().is_none() || actual == Some(ActRead::F16Wr) {
            return Ok(());
        }
        let rows: Vec<usize> = jobs.iter().map(|j| j.w.rows).collect();
        let k = j0.w.cols;
        if self.planned_read(mode, n, j0.w.ty, k, &rows) == ActRead::F16Wr {
            self.prepare_f16wr(x, n, k)?;
        }
        Ok(())
    }
}

/// Whether `len` values in rows of `k` make whole quant_q8 blocks of whole
/// rows (the fusion pass's condition for Q8 outputs).
fn q8_shape(len: usize, k: usize) -> bool {
    len > 0 && k > 0 && k.is_multiple_of(32) && len.is_multiple_of(k)
}

/// Whether `len` values are n rows of k that to_f16_wr takes (k a
/// multiple of 256: the fusion pass's condition for F16Wr outputs).
fn f16wr_shape(len: usize, n: usize, k: usize) -> bool {
    n > 0 && k > 0 && k.is_multiple_of(256) && len == n * k
}

/// The running op's fusion annotation, cleared when dropped (the end of
/// `run_fused`, also on an error), with the record of what its producer
/// wrote.
pub(crate) struct FusionScope<'a>(&'a CudaBackend);

impl Drop for FusionScope<'_> {
    fn drop(&mut self) {
        if let Ok(mut f) = self.0.op_fusion.lock() {
            *f = None;
        }
        if let Ok(mut w) = self.0.op_wrote.lock() {
            *w = None;
        }
    }
}

impl CudaBackend {
    /// What a `MatMuls` of `n` rows of `k` values by `ty` weights with job
    /// rows `rows` reads in `mode`, as the matmul planner plans it over
    /// the executor's buffers (whole allocations: 16-byte aligned): the
    /// fusion pass's input (dispatch/cuda/step_ops.rs), and what an
    /// annotated reader checks its own plan against (`annotated_input`).
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
    /// ends; nothing written yet.
    pub(crate) fn fusion_scope(&self, f: Option<OpFusion>) -> Result<FusionScope<'_>> {
        *self
            .op_fusion
            .lock()
            .map_err(|_| anyhow::anyhow!("cuda backend: op fusion lock poisoned"))? = f;
        *self
            .op_wrote
            .lock()
            .map_err(|_| anyhow::anyhow!("cuda backend: op fusion lock poisoned"))? = None;
        Ok(FusionScope(self))
    }
}

/// Whether `a_len` f32 values at device address `a` and `b_len` at `b`
/// share a byte (a job's output over its own op's input: the op's later
/// jobs then prepare the input again).
pub(super) fn f32_ranges_overlap(a: u64, a_len: usize, b: u64, b_len: usize) -> bool {
    let (a1, b1) = (a + 4 * a_len as u64, b + 4 * b_len as u64);
    a < b1 && b < a1
}

/// Whether any of `jobs`' outputs overlaps x (the op's input).
pub(super) fn outs_overlap(
    x: &CudaView<'_, f32>,
    jobs: &[MatJob<'_, Dev>],
    s: &std::sync::Arc<cudarc::driver::CudaStream>,
) -> bool {
    let xp = dev_ptr(x, s);
    jobs.iter()
        .any(|j| f32_ranges_overlap(xp, x.len(), dev_ptr_mut(&j.out, s), j.out.len()))
}

#[cfg(test)]
mod tests {
    use super::{f32_ranges_overlap, input_prepared};
    use crate::backend::cuda::fusion::{ActRead, OpFusion};

    #[test]
    fn each_plan_reads_its_layout() {
        use super::{act_read, ExactForm, MmPlan};
        use crate::backend::cuda::fusion::ActRead::*;
        let cases = [
            (MmPlan::Empty, None),
            (MmPlan::Zero, None),
            (MmPlan::Exact(ExactForm::Float), Some(Raw)),
            // quant_actk's blocks are the op's own (per job): none kept.
            (MmPlan::Exact(ExactForm::KQuant), Some(Raw)),
            (MmPlan::Exact(ExactForm::Matvec), Some(Canon)),
            (MmPlan::Exact(ExactForm::Q32), Some(Canon)),
            (MmPlan::Exact(ExactForm::Mma { form: 0 }), Some(Canon)),
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
    fn a_reader_skips_only_what_was_planned_and_prepared() {
        use ActRead::*;
        let from = Some(OpFusion {
            input_from: Some(3),
            ..OpFusion::default()
        });
        let not_from = Some(OpFusion::default());
        let layouts = [Q8, Canon, F16, F16Wr, Raw];
        for planned in layouts {
            for actual in layouts.map(Some).into_iter().chain([None]) {
                let want = actual == Some(planned) && planned != Raw;
                assert_eq!(input_prepared(from, planned, actual), want);
                // No annotation, or no producer named: never.
                assert!(!input_prepared(None, planned, actual));
                assert!(!input_prepared(not_from, planned, actual));
            }
        }
        // The one disagreement the buffers can cause: the wgmma GEMM
        // planned, cuBLAS (f16 rows) or the matvecs taken.
        assert!(!input_prepared(from, F16Wr, Some(F16)));
        assert!(!input_prepared(from, F16Wr, Some(Q8)));
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
