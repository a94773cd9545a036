//! `fast` mode's int8 tensor-core matmul for batched decode and prefill on
//! 32-block weights (mm_q8_mma in kernels/matmul_mma_fast.cu): quant_q8's int8
//! activations (quantized once per input, or already written by the
//! elementwise kernel before: `q8_out`) times the weights' own integers,
//! both block scales applied per 32-block in f32.

use super::arena3;
use super::matmul::{ctas_per_sm_knob, job_table, mm_dims, split_k, ActKey, ACT_Q8};
use crate::backend::cuda::mem::Dev;
use crate::backend::cuda::{drv, grid_1d, i32_of, CudaBackend};
use crate::backend::MatJob;
use crate::quant::GgmlType;
use anyhow::Result;
use cudarc::driver::{CudaView, LaunchConfig, PushKernelArg};

/// Warps of mm_q8_mma along the activation rows for `n` of them: 1 (the
/// kernel mm_q8_mma: 4 warps of 32 weight rows x 64 activation rows, up to
/// 255 registers) or 2 (mm_q8_mma_w2: 8 warps of 32 x 32, 128 registers,
/// twice the warps in flight). QUIRE_MQ_WN=1|2 forces one (tuning knob;
/// no result changes); by default 2 from more than 16 rows. Measured on an
/// H100 (8B Q4_0, 2026-11-23, tokens/s at B8 / B16 / B32 / B64): WN 1
/// 1,487 / 2,444 / 3,461 / 4,290; WN 2 1,217-1,310 / 2,131-2,262 /
/// 3,715-4,105 / 4,390-4,677.
pub(crate) fn mq_wn(n: usize) -> usize {
    static V: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let forced = *V.get_or_init(|| match std::env::var("QUIRE_MQ_WN").as_deref() {
        Ok("1") => Some(1),
        Ok("2") => Some(2),
        _ => None,
    });
    forced.unwrap_or(if n > 16 { 2 } else { 1 })
}
/// Whether the splits of all jobs are added by one split_sum_jobs launch
/// (four floats per thread) where the shapes allow; QUIRE_SPLIT_SUM_JOBS=0
/// keeps one scalar split_sum per job (same bits; A/B knob).
fn split_sum_jobs_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("QUIRE_SPLIT_SUM_JOBS").as_deref() != Ok("0"))
}

/// Weight rows and activation rows of one mm_q8_mma CTA (MQ_ROWS,
/// MQ_TOK), its k chunk in 32-blocks (MQ_KB), the chunks in flight
/// (MQ_STAGES) and the activation row stride in shared memory (MQ_XLD), as
/// in the kernel.
const MQ_ROWS: usize = 128;
const MQ_TOK: usize = 64;
const MQ_KB: usize = 8;
const MQ_STAGES: usize = 2;
const MQ_XLD: usize = 32 * MQ_KB + 16;

/// Shared memory of one mm_q8_mma CTA for weights of type `ty` (mq_wld and
/// mq_stage_bytes in the kernel), or None for a type it does not take.
pub(crate) fn mq_smem(ty: GgmlType) -> Option<usize> {
    let wld = match ty {
        GgmlType::Q4_0 => 8 * 18,
        GgmlType::Q4_1 => 176,
        GgmlType::Q8_0 => 8 * 34,
        _ => return None,
    };
    Some(MQ_STAGES * (MQ_ROWS * wld + MQ_TOK * MQ_XLD + MQ_KB * MQ_TOK * 8))
}

/// The most shared memory any mm_q8_mma launch asks for (set on the
/// function once, at load).
pub(crate) fn mq_smem_max() -> usize {
    [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0]
        .into_iter()
        .filter_map(mq_smem)
        .max()
        .unwrap_or(0)
}

/// Whether `fast` mode runs a matmul of `ty` weights with rows of `k`
/// values through mm_q8_mma (from more than QUIRE_MMA_MIN_ROWS activation
/// rows): Q4_0, Q4_1 and Q8_0 with k a multiple of 256 (whole chunks; row
/// bytes then multiples of 16 for the 16-byte copies). QUIRE_MQ=0 turns the
/// kernel off (the f16 tile kernel and cuBLAS then take these shapes).
pub(crate) fn mq_takes(ty: GgmlType, k: usize) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let on = *ON.get_or_init(|| std::env::var("QUIRE_MQ").as_deref() != Ok("0"));
    on && mq_smem(ty).is_some() && k > 0 && k.is_multiple_of(32 * MQ_KB)
}

/// CTAs per SM that mq_splits aims for: QUIRE_MQ_CTAS_PER_SM (tuning knob),
/// default 2 (two CTAs fit per SM).
fn mq_ctas_per_sm() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| ctas_per_sm_knob("QUIRE_MQ_CTAS_PER_SM"))
}

/// Split-K for mm_q8_mma: (splits, blocks per split), `split_k` over its
/// MQ_ROWS x MQ_TOK tiles (`m` rows in all: the job table's row tiles) and
/// MQ_KB-block chunks, aiming at `ctas_per_sm * sms` CTAs.
pub(crate) fn mq_splits(
    m: usize,
    n: usize,
    blocks: usize,
    sms: usize,
    ctas_per_sm: usize,
) -> (usize, usize) {
    let tiles = m.div_ceil(MQ_ROWS) * n.div_ceil(MQ_TOK);
    split_k(tiles, blocks, MQ_KB, ctas_per_sm * sms)
}

impl CudaBackend {
    /// Every job in one mm_q8_mma launch (validated jobs of one type and
    /// k, which `mq_takes`; the job table's CTA rows cover each job's row
    /// tiles): activations to int8 (quant_q8, unless the arena holds them),
    /// then the kernel, split over k when the row tiles of all jobs
    /// together would leave SMs idle, and per job the splits' partial sums
    /// added in split order (split_sum), which adds into the output for
    /// `add`.
    pub(super) fn mm_q8_mma(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        jobs: &mut [MatJob<'_, Dev>],
    ) -> Result<()> {
        let (ty, k) = (jobs[0].w.ty, jobs[0].w.cols);
        let smem = mq_smem(ty)
            .ok_or_else(|| anyhow::anyhow!("mat_mul: mm_q8_mma does not take {ty:?} weights"))?;
        let s = self.stream();
        let nblk = n * k / 32;
        let d = mm_dims(&jobs[0].w, n)?;
        let rows: Vec<usize> = jobs.iter().map(|j| j.w.rows).collect();
        let m_all: usize = rows.iter().sum();
        let (table, ctas) = job_table(jobs, MQ_ROWS, s)?;
        let (splits, bpc) = mq_splits(
            ctas as usize * MQ_ROWS,
            n,
            k / 32,
            self.sm_count(),
            mq_ctas_per_sm(),
        );
        let part_len = if splits > 1 { splits * n * m_all } else { 0 };
        let mut guard = self.arena(&[n * k, nblk * 8, part_len * 4])?;
        let key = ActKey::new(x, k, ACT_Q8, s);
        let cached = self.act_cached(key);
        let outs = Self::out_ranges(jobs, s);
        arena3::<i8, f32, f32, ()>(&mut guard, (n * k, nblk * 2, part_len), |xq, xds, part| {
            if !cached {
                self.quant_q8(x, nblk, xq, xds)?;
            }
            let wn = mq_wn(n);
            let name = if wn == 2 { "mm_q8_mma_w2" } else { "mm_q8_mma" };
            let cfg = LaunchConfig {
                grid_dim: (
                    u32::try_from(n.div_ceil(MQ_TOK))?,
                    ctas,
                    u32::try_from(splits)?,
                ),
                block_dim: (128 * wn as u32, 1, 1),
                shared_mem_bytes: u32::try_from(smem)?,
            };
            let bpci = i32_of(bpc, "blocks per split")?;
            let stride = if splits > 1 { (n * m_all) as i64 } else { 0 };
            let mut b = s.launch_builder(self.func(name)?);
            b.arg(&table)
                .arg(&d.ki)
                .arg(&d.rb)
                .arg(&d.tc)
                .arg(&mut *xq)
                .arg(&mut *xds)
                .arg(&d.ni)
                .arg(&bpci)
                .arg(&stride)
                .arg(&mut *part);
            // SAFETY: matches mm_q8_mma / mm_q8_mma_w2 (MQ_ROWS weight rows
            // per CTA row, as the job table); each job's weights hold m rows
            // of rb bytes (rb a multiple of 16: k % 256 == 0, mq_takes; the
            // allocation 256-byte aligned) and its output n*m floats; xq
            // n*k bytes and xds n*k/32 float2 (arena, 256-byte aligned);
            // part splits*n*m_all floats when split (split z writes at
            // z*stride), unused otherwise.
            drv(unsafe { b.launch(cfg) }, "mat_mul: mm_q8_mma")?;
            if splits > 1 && table.vec4_ok(n) && split_sum_jobs_on() {
                // One launch for every job, four floats per thread (the
                // partials of all jobs lie back to back; part is 256-byte
                // aligned and stride a multiple of 4: every n * m is).
                let sp = i32_of(splits, "splits")?;
                let mut b = s.launch_builder(self.func("split_sum_jobs")?);
                let pv = part.slice(0..);
                b.arg(&pv).arg(&sp).arg(&stride).arg(&d.ni).arg(&table);
                // SAFETY: matches split_sum_jobs; part holds splits*n*m_all
                // floats (split s at s*stride, stride = n*m_all), the table's
                // outputs n*m_j floats each, 16-byte aligned (vec4_ok).
                drv(
                    unsafe { b.launch(grid_1d(n * m_all / 4, 256)?) },
                    "mat_mul: split_sum_jobs",
                )?;
            } else if splits > 1 {
                let sp = i32_of(splits, "splits")?;
                let mut off = 0;
                for (j, &m) in jobs.iter_mut().zip(&rows) {
                    let len = (n * m) as i64;
                    let add = j.add as i32;
                    let pj = part.slice(n * off..);
                    let mut b = s.launch_builder(self.func("split_sum")?);
                    b.arg(&pj)
                        .arg(&sp)
                        .arg(&len)
                        .arg(&stride)
                        .arg(&add)
                        .arg(&mut j.out);
                    // SAFETY: matches split_sum; pj starts at this job's
                    // n*m partials of split 0, split s at s*stride (within
                    // part's splits*n*m_all floats); out n*m floats.
                    drv(
                        unsafe { b.launch(grid_1d(n * m, 256)?) },
                        "mat_mul: split_sum",
                    )?;
                    off += m;
                }
            }
            Ok(())
        })?;
        // A later matmul of the same input finds its int8 rows in the
        // arena, unless an output overwrote the input.
        self.act_remember(key, &outs);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{mq_smem, mq_smem_max, mq_splits, MQ_KB};
    use crate::quant::GgmlType;

    #[test]
    fn mq_split_k_grids() {
        // 8B shapes, 64 rows on a 132-SM H100 at two CTAs per SM: (splits,
        // blocks per split).
        assert_eq!(mq_splits(4096, 64, 128, 132, 2), (8, 16));
        assert_eq!(mq_splits(14336, 64, 128, 132, 2), (2, 64));
        assert_eq!(mq_splits(4096, 64, 448, 132, 2), (8, 56));
        assert_eq!(mq_splits(4096, 512, 128, 132, 2), (1, 128));
        assert_eq!(mq_splits(128256, 64, 128, 132, 2), (1, 128));
        // Whole chunks, none empty, covering every block exactly once.
        for blocks in [8, 16, 24, 128, 448] {
            for m in [1, 97, 4096, 14336] {
                for n in [1, 9, 64, 513] {
                    let (s, per) = mq_splits(m, n, blocks, 132, 2);
                    assert!(per % MQ_KB == 0 && s >= 1);
                    assert!(
                        (s - 1) * per < blocks && s * per >= blocks,
                        "{m} {n} {blocks}"
                    );
                }
            }
        }
    }

    #[test]
    fn mq_shared_memory_fits_two_ctas() {
        // Two CTAs per SM (the kernel's launch bounds) on 228 KiB SMs (1 KiB
        // reserved per CTA).
        assert!(2 * (mq_smem_max() + 1024) <= 228 * 1024);
        assert_eq!(mq_smem(GgmlType::Q8_0), Some(mq_smem_max()));
        assert_eq!(mq_smem(GgmlType::Q4_K), None);
    }
}
