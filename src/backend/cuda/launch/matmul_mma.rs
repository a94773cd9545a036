//! `fast` mode's int8 tensor-core matmul for batched decode and prefill on
//! 32-block weights (mm_q8_mma in kernels/matmul_mma_fast.cu): quant_q8's int8
//! activations (quantized once per input, or already written by the
//! elementwise kernel before: `q8_out`) times the weights' own integers,
//! both block scales applied per 32-block in f32.

use super::act_cache::{ActKey, ACT_Q8};
use super::arena3;
use super::matmul::{ctas_per_sm_knob, job_table, mm_dims, split_k};
use super::matmul_wgmma::{job_maps, JobMaps};
use crate::backend::cuda::mem::Dev;
use crate::backend::cuda::{drv, grid_1d, i32_of, CudaBackend};
use crate::backend::MatJob;
use crate::quant::GgmlType;
use anyhow::Result;
use cudarc::driver::{CudaView, LaunchConfig, PushKernelArg};

/// One instantiation of mq_kernel (matmul_mma_fast.cu): its name, warps
/// along the activation rows (4 wn warps), activation rows per CTA and
/// chunk buffers in shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MqKernel {
    pub name: &'static str,
    pub wn: usize,
    pub tok: usize,
    pub stages: usize,
    /// CTAs per SM its launch bounds promise registers for (its shared
    /// memory must allow as many).
    pub ctas: usize,
    /// Groups of 4 wn warps that split each chunk's blocks (KS).
    pub ks: usize,
}

/// 4 warps of 32 weight rows x 64 activation rows, up to 255 registers.
const MQ_BASE: MqKernel = MqKernel {
    name: "mm_q8_mma",
    wn: 1,
    tok: 64,
    stages: 2,
    ctas: 2,
    ks: 1,
};
/// 8 warps of 32 x 32, 128 registers: twice the warps in flight.
const MQ_W2: MqKernel = MqKernel {
    name: "mm_q8_mma_w2",
    wn: 2,
    tok: 64,
    stages: 2,
    ctas: 2,
    ks: 1,
};
/// Up to 16 rows: 16-row tiles and four chunk buffers (three chunks of
/// weights in flight while one is computed; TOK 64 keeps one), 8 warps in
/// two k groups, two CTAs per SM (128 registers): the 4-bit types.
const MQ_T16_K2B: MqKernel = MqKernel {
    name: "mm_q8_mma_t16_k2b",
    wn: 1,
    tok: 16,
    stages: 4,
    ctas: 2,
    ks: 2,
};
/// The same at one CTA per SM, for Q8_0 (whose four buffers take 161 KiB).
const MQ_T16_K2: MqKernel = MqKernel {
    name: "mm_q8_mma_t16_k2",
    ctas: 1,
    ..MQ_T16_K2B
};
/// Up to 8 rows: 8-row tiles and three chunk buffers, so that even Q8_0's
/// fit twice per SM; two k groups.
const MQ_T8_K2B: MqKernel = MqKernel {
    name: "mm_q8_mma_t8_k2b",
    tok: 8,
    stages: 3,
    ..MQ_T16_K2B
};
/// Every instantiation (source.rs loads these names).
pub(crate) const MQ_KERNELS: [MqKernel; 5] = [MQ_BASE, MQ_W2, MQ_T16_K2B, MQ_T16_K2, MQ_T8_K2B];

/// The mq kernel for `n` activation rows of `ty` weights: the first of the
/// small-batch kernels (MQ_SMALL, in order of preference) whose tile holds
/// `n` rows and whose shared memory for `ty` allows its CTAs per SM (so
/// the 4-bit types take t16_k2b up to 16 rows, Q8_0 t8_k2b up to 8 and
/// t16_k2 up to 16; QUIRE_MQ_SMALL=0 turns them off), else by `mq_wn`.
/// Measured on an H100 (2026-11-23, 8B, tokens/s at B2 / B4 / B8 / B16;
/// the variants without k groups, t16 and t16_1, are no longer built):
/// Q4_0 t16 556 / 1,090 / 2,063 / 3,604, t16_k2b 589 / 1,142 / 2,107 /
/// 3,703 (mm_q8_mma 1,974 at B8); Q8_0 mm_q8_mma 379 / 742 / 1,406 /
/// 2,481, t16_1 394 / 772 / 1,467 / 2,689, t16_k2 412 / 810 / 1,547 /
/// 2,882 (four k groups: 403 / 790 / 1,514 / 2,794), t8_k2b 424 / 830 /
/// 1,578 against t16_k2's 412 / 810 / 1,536 in the same call.
fn mq_kernel(ty: GgmlType, n: usize) -> MqKernel {
    const MQ_SMALL: [MqKernel; 3] = [MQ_T16_K2B, MQ_T8_K2B, MQ_T16_K2];
    static SMALL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let small = *SMALL.get_or_init(|| std::env::var("QUIRE_MQ_SMALL").as_deref() != Ok("0"));
    let fits = |k: &&MqKernel| n <= k.tok && mq_smem(ty, **k).is_some_and(|b| ctas_fit(b, k.ctas));
    if let Some(&k) = MQ_SMALL.iter().find(fits).filter(|_| small) {
        k
    } else if mq_wn(n) == 2 {
        MQ_W2
    } else {
        MQ_BASE
    }
}

/// Whether `ctas` CTAs of `smem` bytes fit one SM (228 KiB on sm_80 /
/// sm_90, 1 KiB of it reserved per CTA), as a kernel's launch bounds
/// assume; one CTA may take at most 227 KiB.
fn ctas_fit(smem: usize, ctas: usize) -> bool {
    smem <= 227 * 1024 && ctas * (smem + 1024) <= 228 * 1024
}

/// Warps of mm_q8_mma along the activation rows for `n` of them: 1
/// (mm_q8_mma) or 2 (mm_q8_mma_w2). QUIRE_MQ_WN=1|2 forces one (tuning
/// knob; no result changes); by default 2 from more than 16 rows. Measured
/// on an H100 (8B Q4_0, 2026-11-23, tokens/s at B8 / B16 / B32 / B64): WN
/// 1 1,487 / 2,444 / 3,461 / 4,290; WN 2 1,217-1,310 / 2,131-2,262 /
/// 3,715-4,105 / 4,390-4,677.
fn mq_wn(n: usize) -> usize {
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

/// Weight rows of one mq CTA (MQ_ROWS), its k chunk in 32-blocks (MQ_KB)
/// and the activation row stride in shared memory (MQ_XLD), as in the
/// kernel.
const MQ_ROWS: usize = 128;
const MQ_KB: usize = 8;
const MQ_XLD: usize = 32 * MQ_KB + 16;

/// Shared memory of one CTA of kernel `kern` for weights of type `ty`
/// (mq_wld and mq_stage_bytes in the kernel), or None for a type it does
/// not take.
pub(crate) fn mq_smem(ty: GgmlType, kern: MqKernel) -> Option<usize> {
    let wld = match ty {
        GgmlType::Q4_0 => 8 * 18,
        GgmlType::Q4_1 => 176,
        GgmlType::Q8_0 => 8 * 34,
        _ => return None,
    };
    // The stages, then one mbarrier per stage (the bulk tensor copies).
    Some(kern.stages * (MQ_ROWS * wld + kern.tok * MQ_XLD + MQ_KB * kern.tok * 8 + 8))
}

/// The most shared memory a launch of the kernel called `name` asks for
/// (set on the function once, at load): over the types it runs.
pub(crate) fn mq_smem_max(name: &str) -> usize {
    let Some(&kern) = MQ_KERNELS.iter().find(|k| k.name == name) else {
        return 0;
    };
    [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0]
        .into_iter()
        .filter_map(|ty| mq_smem(ty, kern))
        .filter(|&b| ctas_fit(b, kern.ctas))
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
    on && mq_smem(ty, MQ_BASE).is_some() && k > 0 && k.is_multiple_of(32 * MQ_KB)
}

/// CTAs per SM that mq_splits aims for: QUIRE_MQ_CTAS_PER_SM (tuning knob),
/// default 2 (two CTAs fit per SM).
fn mq_ctas_per_sm() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| ctas_per_sm_knob("QUIRE_MQ_CTAS_PER_SM"))
}

/// Split-K for an mq kernel with `tok` activation rows per CTA: (splits,
/// blocks per split), `split_k` over its MQ_ROWS x tok tiles (`m` rows in
/// all: the job table's row tiles) and MQ_KB-block chunks, aiming at
/// `ctas_per_sm * sms` CTAs.
pub(crate) fn mq_splits(
    m: usize,
    n: usize,
    tok: usize,
    blocks: usize,
    sms: usize,
    ctas_per_sm: usize,
) -> (usize, usize) {
    let tiles = m.div_ceil(MQ_ROWS) * n.div_ceil(tok);
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
        let kern = mq_kernel(ty, n);
        let smem = mq_smem(ty, kern).ok_or_else(|| {
            anyhow::anyhow!("mat_mul: {} does not take {ty:?} weights", kern.name)
        })?;
        let s = self.stream();
        let nblk = n * k / 32;
        let d = mm_dims(&jobs[0].w, n)?;
        let rows: Vec<usize> = jobs.iter().map(|j| j.w.rows).collect();
        let m_all: usize = rows.iter().sum();
        let (table, ctas) = job_table(jobs, MQ_ROWS, s)?;
        // The weights' tensor maps (sm_90+: the bulk tensor copies of the
        // Q4_0 / Q8_0 chunks, boxes of MQ_ROWS = 128 rows x 8 blocks).
        let maps = if crate::backend::cuda::pdl::arch_major(&self.arch) >= 9 {
            job_maps(&table, k, ty.type_size(), 1)?
        } else {
            JobMaps::none()
        };
        let (splits, bpc) = mq_splits(
            ctas as usize * MQ_ROWS,
            n,
            kern.tok,
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
            let cfg = LaunchConfig {
                grid_dim: (
                    u32::try_from(n.div_ceil(kern.tok))?,
                    ctas,
                    u32::try_from(splits)?,
                ),
                block_dim: (128 * (kern.wn * kern.ks) as u32, 1, 1),
                shared_mem_bytes: u32::try_from(smem)?,
            };
            let bpci = i32_of(bpc, "blocks per split")?;
            let stride = if splits > 1 { (n * m_all) as i64 } else { 0 };
            let mut b = s.launch_builder(self.func(kern.name)?);
            b.arg(&table)
                .arg(&d.ki)
                .arg(&d.rb)
                .arg(&d.tc)
                .arg(&mut *xq)
                .arg(&mut *xds)
                .arg(&d.ni)
                .arg(&bpci)
                .arg(&stride)
                .arg(&mut *part)
                .arg(&maps);
            // SAFETY: matches every mq_kernel instantiation (MQ_KERNELS;
            // kern's block size and shared memory; MQ_ROWS weight rows per
            // CTA row, as the job table); each job's weights hold m rows
            // of rb bytes (rb a multiple of 16: k % 256 == 0, mq_takes; the
            // allocation 256-byte aligned) and its output n*m floats; xq
            // n*k bytes and xds n*k/32 float2 (arena, 256-byte aligned);
            // part splits*n*m_all floats when split (split z writes at
            // z*stride), unused otherwise; maps by value: job_maps's
            // description of the jobs' weights (or zeros before sm_90,
            // where the kernel copies by cp.async).
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
    use super::{
        ctas_fit, mq_kernel, mq_smem, mq_smem_max, mq_splits, MQ_BASE, MQ_KB, MQ_KERNELS,
        MQ_T16_K2, MQ_T16_K2B, MQ_T8_K2B, MQ_W2,
    };
    use crate::quant::GgmlType;

    #[test]
    fn mq_split_k_grids() {
        // 8B shapes, 64 rows on a 132-SM H100 at two CTAs per SM: (splits,
        // blocks per split).
        assert_eq!(mq_splits(4096, 64, 64, 128, 132, 2), (8, 16));
        assert_eq!(mq_splits(14336, 64, 64, 128, 132, 2), (2, 64));
        assert_eq!(mq_splits(4096, 64, 64, 448, 132, 2), (8, 56));
        assert_eq!(mq_splits(4096, 512, 64, 128, 132, 2), (1, 128));
        assert_eq!(mq_splits(128256, 64, 64, 128, 132, 2), (1, 128));
        // 16 rows on the t16 kernel: one column of tiles, as TOK 64's.
        assert_eq!(mq_splits(4096, 16, 16, 128, 132, 2), (8, 16));
        // Whole chunks, none empty, covering every block exactly once.
        for blocks in [8, 16, 24, 128, 448] {
            for m in [1, 97, 4096, 14336] {
                for n in [1, 9, 64, 513] {
                    let (s, per) = mq_splits(m, n, 64, blocks, 132, 2);
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
        // The CTAs per SM of each kernel's launch bounds on 228 KiB SMs (1
        // KiB reserved per CTA), for every kernel and the types it runs.
        for k in MQ_KERNELS {
            assert!(ctas_fit(mq_smem_max(k.name), k.ctas), "{}", k.name);
        }
        assert_eq!(
            mq_smem(GgmlType::Q8_0, MQ_W2),
            Some(mq_smem_max("mm_q8_mma_w2"))
        );
        assert_eq!(mq_smem(GgmlType::Q4_K, MQ_BASE), None);
        assert_eq!(mq_smem_max("mm_f16_tile"), 0);
        // t16_k2b: four buffers of Q4_0 (95 KiB, and a barrier each) and
        // Q4_1 fit twice, Q8_0's only once (t16_k2); three Q8_0 buffers of
        // 8 rows fit twice.
        assert_eq!(
            mq_smem(GgmlType::Q4_0, MQ_T16_K2B),
            Some(4 * (128 * 144 + 16 * 272 + 1024 + 8))
        );
        assert!(!ctas_fit(mq_smem(GgmlType::Q8_0, MQ_T16_K2B).unwrap(), 2));
        assert_eq!(
            mq_smem(GgmlType::Q4_1, MQ_T16_K2B),
            Some(mq_smem_max("mm_q8_mma_t16_k2b"))
        );
        assert_eq!(
            mq_smem(GgmlType::Q8_0, MQ_T16_K2),
            Some(mq_smem_max("mm_q8_mma_t16_k2"))
        );
        assert!(ctas_fit(mq_smem(GgmlType::Q8_0, MQ_T8_K2B).unwrap(), 2));
    }

    #[test]
    fn mq_kernel_choice() {
        // (QUIRE_MQ_SMALL and QUIRE_MQ_WN unset in tests.) No type is
        // named in the rule: shared memory alone sends Q8_0 elsewhere.
        assert_eq!(mq_kernel(GgmlType::Q4_0, 8), MQ_T16_K2B);
        assert_eq!(mq_kernel(GgmlType::Q4_1, 16), MQ_T16_K2B);
        assert_eq!(mq_kernel(GgmlType::Q8_0, 8), MQ_T8_K2B);
        assert_eq!(mq_kernel(GgmlType::Q8_0, 9), MQ_T16_K2);
        assert_eq!(mq_kernel(GgmlType::Q8_0, 16), MQ_T16_K2);
        assert_eq!(mq_kernel(GgmlType::Q8_0, 17), MQ_W2);
        assert_eq!(mq_kernel(GgmlType::Q4_0, 17), MQ_W2);
        assert_eq!(mq_kernel(GgmlType::Q8_0, 64), MQ_W2);
        // The kernel's per-warp tiles: TOK / 8 / WN of 8 rows, at least
        // one; its k groups split a chunk's 8 blocks into even halves.
        for k in MQ_KERNELS {
            assert!(
                k.tok / 8 / k.wn >= 1 && (8 / k.ks).is_multiple_of(2),
                "{}",
                k.name
            );
        }
    }
}
