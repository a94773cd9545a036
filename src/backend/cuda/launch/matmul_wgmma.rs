//! `fast` mode's prefill GEMM on Hopper (kernels/matmul_wgmma_fast.cu):
//! 32-value block weights dequantized to f16 tile by tile in shared memory
//! and multiplied by wgmma with f16 activations and f32 accumulation, in
//! place of the cuBLAS path's dequantization of every whole matrix to
//! device memory per call. All jobs of a MatMuls op run in one launch.

use super::act_cache::{ActKey, ACT_F16};
use super::arena3;
use super::matmul::job_table;
use crate::backend::cuda::mem::Dev;
use crate::backend::cuda::source::{WG_KERNELS, WR_KERNELS};
use crate::backend::cuda::{drv, i32_of, ty_code, CudaBackend};
use crate::backend::MatJob;
use crate::quant::GgmlType;
use anyhow::Result;
use cudarc::driver::{CudaView, LaunchConfig, PushKernelArg};

/// Weight rows per CTA.
const WG_BM: usize = 128;

/// Threads per CTA of `bn` activation rows (WG_THREADS): two consumer
/// warpgroups and two producer warpgroups at 128 rows, one at 256.
const fn wg_threads(bn: usize) -> u32 {
    if bn == 128 {
        512
    } else {
        384
    }
}

/// The weight type of each WG_KERNELS row (its kernel type code is the row
/// index: `wg_type_index`), for the shared memory of an entry by name.
const WG_TYPES: [GgmlType; 5] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
];

/// The opt-in shared memory limit of an sm_90 CTA (WG_SMEM_MAX).
const WG_SMEM_MAX: usize = 232_448;

/// Dynamic shared memory of a CTA (wg_smem_bytes of
/// matmul_wgmma_fast.cu): 1,024 bytes of alignment slack, `sw` f16 weight
/// tiles, `sx` activation stages of `bn` rows, two raw superchunks of 128
/// rows x 8 blocks of `bs` bytes (+16 bytes of slack each) and the
/// mbarriers.
const fn wg_smem_bytes(bs: usize, bn: usize, sw: usize, sx: usize) -> usize {
    1024 + sw * WG_BM * 128 + sx * bn * 128 + 2 * (WG_BM * 8 * bs + 16) + 128
}

/// Stage counts (weight tiles, activation tiles), as wg_stages: the first
/// of (4, 6), (4, 5), (4, 4), (3, 4), (3, 3) that fits.
const fn wg_stages(bs: usize, bn: usize) -> (usize, usize) {
    const C: [(usize, usize); 5] = [(4, 6), (4, 5), (4, 4), (3, 4), (3, 3)];
    let mut i = 0;
    while i < C.len() {
        if wg_smem_bytes(bs, bn, C[i].0, C[i].1) <= WG_SMEM_MAX {
            return C[i];
        }
        i += 1;
    }
    (3, 3)
}

/// Dynamic shared memory of the entry for block size `bs` and `bn`
/// activation rows.
pub(super) const fn wg_smem_of(bs: usize, bn: usize) -> usize {
    let (sw, sx) = wg_stages(bs, bn);
    wg_smem_bytes(bs, bn, sw, sx)
}

/// Threads per CTA of the register-A form (WR_THREADS) with 128 `mt` rows:
/// one producer and 2 `mt` consumer warpgroups.
const fn wr_threads(mt: usize) -> u32 {
    128 + 256 * mt as u32
}

/// Dynamic shared memory of a register-A CTA (wr_smem_bytes): 1,024
/// bytes of alignment slack, `sx` activation chunks of 128 tokens, `sr`
/// raw superchunks of 128 `mt` rows x 8 blocks of `bs` bytes, mbarriers.
const fn wr_smem_bytes(bs: usize, mt: usize, sr: usize, sx: usize) -> usize {
    1024 + sx * 128 * 128 + sr * 128 * mt * 8 * bs + 256
}

/// Stage counts (raw superchunks, activation chunks), as wr_stages: the
/// first of (3, 6), (3, 5), (2, 6), (2, 5), (2, 4) that fits.
const fn wr_stages(bs: usize, mt: usize) -> (usize, usize) {
    const C: [(usize, usize); 5] = [(3, 6), (3, 5), (2, 6), (2, 5), (2, 4)];
    let mut i = 0;
    while i < C.len() {
        if wr_smem_bytes(bs, mt, C[i].0, C[i].1) <= WG_SMEM_MAX {
            return C[i];
        }
        i += 1;
    }
    (2, 4)
}

/// Dynamic shared memory of the register-A entry for block size `bs` and
/// 128 `mt` rows per CTA.
pub(super) const fn wr_smem_of(bs: usize, mt: usize) -> usize {
    let (sr, sx) = wr_stages(bs, mt);
    wr_smem_bytes(bs, mt, sr, sx)
}

/// The dynamic shared memory of a `mm_wg_*` or `mm_wr_*` entry, None for
/// other names.
pub(crate) fn wg_smem(name: &str) -> Option<usize> {
    let find = |table: &[[&str; 2]; 5], size: fn(usize, usize) -> usize| {
        table.iter().enumerate().find_map(|(t, row)| {
            row.iter()
                .position(|n| *n == name)
                .map(|i| size(WG_TYPES[t].type_size(), i + 1))
        })
    };
    find(&WG_KERNELS, |bs, i| wg_smem_of(bs, 128 * i)).or_else(|| find(&WR_KERNELS, wr_smem_of))
}

/// Which wgmma form QUIRE_WGMMA selects: 1 the shared-memory decode
/// (`mm_wg_*`), 2 the register-A form (`mm_wr_*`).
fn wr_form() -> bool {
    std::env::var("QUIRE_WGMMA").is_ok_and(|v| v == "2")
}

/// Weight-row tiles per CTA of the register-A form (MT: 128 MT rows): the
/// choice with the fewer CTA-waves of work, counting an MT = 2 CTA as two
/// (ties take 2: fewer L2 bytes per FLOP). `QUIRE_WR_MT=1|2` forces one.
pub(super) fn wr_mt(rows: &[usize], n: usize, sms: usize) -> usize {
    if let Some(mt) = std::env::var("QUIRE_WR_MT")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|b| *b == 1 || *b == 2)
    {
        return mt;
    }
    let sms = sms.max(1);
    let waves = |mt: usize| -> usize {
        let tiles: usize = rows.iter().map(|r| r.div_ceil(128 * mt)).sum();
        (tiles * n.div_ceil(128)).div_ceil(sms) * mt
    };
    if waves(2) <= waves(1) {
        2
    } else {
        1
    }
}

/// The row of WG_KERNELS for a weight type: its kernel type code (TY_Q4_0
/// .. TY_Q8_0 are 0..4, the rows' order), None for types the kernel does
/// not decode (K-quants, float types).
fn wg_type_index(ty: GgmlType) -> Option<usize> {
    ty_code(ty)
        .and_then(|c| usize::try_from(c).ok())
        .filter(|&c| c < WG_KERNELS.len())
}

/// Activation rows per CTA (128 or 256): the choice with the fewer
/// CTA-waves of work, counting a 256-row CTA as two 128-row ones (it does
/// twice the work); ties take 256 (each weight tile is decoded once for
/// twice the rows). `QUIRE_WG_BN=128|256` forces one (comparisons).
pub(super) fn wg_bn(rows: &[usize], n: usize, sms: usize) -> usize {
    if let Some(bn) = std::env::var("QUIRE_WG_BN")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|b| *b == 128 || *b == 256)
    {
        return bn;
    }
    let tiles: usize = rows.iter().map(|r| r.div_ceil(WG_BM)).sum();
    let sms = sms.max(1);
    let waves = |bn: usize| -> usize { (tiles * n.div_ceil(bn)).div_ceil(sms) * (bn / 128) };
    if waves(256) <= waves(128) {
        256
    } else {
        128
    }
}

impl CudaBackend {
    /// Whether the wgmma GEMM takes these jobs: its kernels are loaded
    /// (sm_90), the type is a 32-value block type, k is a multiple of 256
    /// (the raw superchunks: eight blocks, a multiple of 16 bytes for every
    /// such type) and every weight starts 16-byte aligned.
    pub(super) fn wg_takes(&self, jobs: &[MatJob<'_, Dev>]) -> bool {
        let Some(j0) = jobs.first() else {
            return false;
        };
        let Some(t) = wg_type_index(j0.w.ty) else {
            return false;
        };
        let s = self.stream();
        j0.w.cols.is_multiple_of(256)
            && jobs
                .iter()
                .all(|j| super::dev_ptr(&j.w.data, s).is_multiple_of(16))
            && self.func(WG_KERNELS[t][0]).is_ok()
    }

    /// out_j (n, m_j) (=, or +=) x (n, k) · w_jᵀ for every job in one
    /// launch (validated arguments, `wg_takes`: k a multiple of 256).
    pub(super) fn mm_wgmma(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        jobs: &mut [MatJob<'_, Dev>],
    ) -> Result<()> {
        let s = self.stream();
        let (ty, k) = (jobs[0].w.ty, jobs[0].w.cols);
        let t = wg_type_index(ty).expect("wg_takes checked the type");
        let rows: Vec<usize> = jobs.iter().map(|j| j.w.rows).collect();
        // (name, rows per CTA, tokens per CTA, threads, shared memory)
        let (name, bm, bn, threads, smem) = if wr_form() {
            let mt = wr_mt(&rows, n, self.sm_count());
            let smem = wr_smem_of(ty.type_size(), mt);
            (WR_KERNELS[t][mt - 1], 128 * mt, 128, wr_threads(mt), smem)
        } else {
            let bn = wg_bn(&rows, n, self.sm_count());
            let smem = wg_smem_of(ty.type_size(), bn);
            (WG_KERNELS[t][bn / 128 - 1], WG_BM, bn, wg_threads(bn), smem)
        };
        let mut guard = self.arena(&[n * k * 2, 0, 0])?;
        // The f16 activations at the start of the arena: the cuBLAS path's
        // cache, so q/k/v and gate/up convert their input once.
        let key = ActKey::new(x, k, ACT_F16, s);
        let cached = self.act_cached(key);
        let out_ranges: Vec<(u64, usize)> = jobs
            .iter()
            .map(|j| (super::dev_ptr_mut(&j.out, s), j.out.len()))
            .collect();
        let (table, ctas) = job_table(jobs, bm, s)?;
        let (ni, ki) = (i32_of(n, "n")?, i32_of(k, "k")?);
        arena3::<u16, u8, u8, ()>(&mut guard, (n * k, 0, 0), |x16, _, _| {
            if !cached {
                self.to_f16_into(x, x16, n * k)?;
            }
            let cfg = LaunchConfig {
                grid_dim: (u32::try_from(n.div_ceil(bn))?, ctas, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: u32::try_from(smem)?,
            };
            let mut b = s.launch_builder(self.func(name)?);
            b.arg(&table).arg(&mut *x16).arg(&ni).arg(&ki);
            // SAFETY: matches mm_wg_* (MmJobs by value, x16, n, k): the
            // table's weights hold m_j rows of k / 32 blocks (validated),
            // its outputs n * m_j floats, x16 n*k halves; the kernel's
            // dynamic shared memory limit was raised to wg_smem at load.
            drv(unsafe { b.launch(cfg) }, &format!("mat_mul: {name}"))?;
            Ok(())
        })?;
        self.act_remember(key, &out_ranges);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{wg_bn, wg_smem, wg_smem_of, wg_stages, wg_type_index, WG_SMEM_MAX, WG_TYPES};
    use crate::quant::GgmlType;

    #[test]
    fn kernel_rows_follow_the_type_codes() {
        assert_eq!(wg_type_index(GgmlType::Q4_0), Some(0));
        assert_eq!(wg_type_index(GgmlType::Q5_1), Some(3));
        assert_eq!(wg_type_index(GgmlType::Q8_0), Some(4));
        assert_eq!(wg_type_index(GgmlType::Q4_K), None);
        assert_eq!(wg_type_index(GgmlType::F16), None);
    }

    #[test]
    fn shared_memory_fits_an_h100_cta() {
        // 227 KiB is the opt-in limit per CTA on sm_90.
        for (t, ty) in WG_TYPES.iter().enumerate() {
            assert_eq!(wg_type_index(*ty), Some(t));
            for bn in [128, 256] {
                let bytes = wg_smem_of(ty.type_size(), bn);
                assert!(bytes <= WG_SMEM_MAX && WG_SMEM_MAX <= 227 * 1024);
            }
        }
        // 128 tokens: four weight tiles and six activation stages (five
        // for Q8_0's larger raw superchunks); 256 tokens: three and four
        // (three for Q8_0).
        assert_eq!(wg_stages(18, 128), (4, 6));
        assert_eq!(wg_stages(34, 128), (4, 5));
        assert_eq!(wg_stages(18, 256), (3, 4));
        assert_eq!(wg_stages(24, 256), (3, 4));
        assert_eq!(wg_stages(34, 256), (3, 3));
        assert_eq!(wg_smem("mm_wg_q8_0_n256"), Some(wg_smem_of(34, 256)));
        assert_eq!(wg_smem("mm_wg_q4_0_n128"), Some(wg_smem_of(18, 128)));
        assert_eq!(wg_smem("mm_q8_mma"), None);
    }

    #[test]
    fn activation_rows_per_cta_by_waves() {
        if std::env::var("QUIRE_WG_BN").is_ok() {
            eprintln!("SKIPPED: QUIRE_WG_BN set");
            return;
        }
        // 8B gate and up at 512 tokens: 224 row tiles x 4 = 896 CTAs of
        // 128 tokens (7 waves on 132 SMs) vs 448 of 256 (4 waves, 8 units).
        assert_eq!(wg_bn(&[14336, 14336], 512, 132), 128);
        // 8B q/k/v at 512 tokens: 48 x 4 = 192 CTAs (2 waves) vs 96 (1
        // wave, 2 units): a tie, 256.
        assert_eq!(wg_bn(&[4096, 1024, 1024], 512, 132), 256);
        // 200 tokens of a 4096-row matrix: 64 CTAs of 128 tokens fit one
        // wave; 32 of 256 take as long.
        assert_eq!(wg_bn(&[4096], 200, 132), 128);
    }
}
