//! Matmul launches of `exact` mode: the canonical kernels (bitwise equal to
//! the cpu), for every job of a `MatMuls` op.

use super::act_cache::ACT_CANON;
use super::arena3;
use super::matmul::{job_table, mm_dims, MmDims, MV_ROWS};
use crate::backend::cuda::mem::{Dev, DevMatrix};
use crate::backend::cuda::{drv, grid_1d, CudaBackend};
use crate::backend::MatJob;
use crate::quant::GgmlType;
use anyhow::Result;
use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

/// The exact decode matvec for `n` activation rows: `_r1` for one row,
/// `_s2` for two warps per weight row.
pub(super) fn mv_exact_name(n: usize, split: bool) -> &'static str {
    match (n, split) {
        (1, false) => "mv_exact32_r1",
        (1, true) => "mv_exact32_r1_s2",
        (_, false) => "mv_exact32",
        (_, true) => "mv_exact32_s2",
    }
}

/// Whether an exact decode launch of `ctas` one-warp CTAs (8 warps of
/// MV_EXACT_WR weight rows each) runs with a warp pair per
/// row instead: when it is under QUIRE_MV_EXACT_SPLIT_WAVES waves of 4
/// CTAs per SM. Both forms give the same bits; the split trades a pair
/// barrier and longer folds for twice the warps in flight (the 8B's QKV, o
/// and down projections are 384, 256 and 256 CTAs for 528 slots on an
/// H100 at 4 CTAs per SM; the one-row kernels run at 3 since 2026-11-27,
/// MV_EXACT_R1_MINB). Default 0 (never). Measured on an H100 (2026-11-23, exact tg128,
/// waves 0 / 1 / 2 / always): 8B Q4_0 251.2 / 258.9 / 261.7 / 245.9 tok/s;
/// 8B Q8_0 (34-byte blocks: a lane's loads keep more bytes in flight)
/// 207.6 / - / 203.0 / 193.5. Once the Q4_0 loop lost its offset
/// subtractions (2026-11-27, 115.5 -> 76 instructions per block and row)
/// the split stopped paying for Q4_0 too: waves 2 -> 0, 8B Q4_0 tg128 /
/// tg128@d512 300.3 / 284.7 -> 310.2 / 293.4 tok/s.
fn exact_split(ctas: usize, sms: usize) -> bool {
    static V: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let set = *V.get_or_init(|| {
        std::env::var("QUIRE_MV_EXACT_SPLIT_WAVES")
            .ok()
            .and_then(|v| v.parse().ok())
    });
    ctas < set.unwrap_or(0) * 4 * sms
}

impl CudaBackend {
    /// The canonical kernels for validated jobs (n, m, k > 0): 32-block
    /// weights quantize the activations once (cached across ops) and run
    /// every job in one mv_exact32 launch for decode; other shapes and
    /// types run job by job.
    pub(super) fn mat_muls_exact(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        jobs: &mut [MatJob<'_, Dev>],
    ) -> Result<()> {
        let ty = jobs[0].w.ty;
        if matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) || ty.block_size() == 256 {
            for j in jobs.iter_mut() {
                self.mat_mul_exact_one(&j.w, x, n, &mut j.out, j.add)?;
            }
            return Ok(());
        }
        let k = jobs[0].w.cols;
        let s = self.stream();
        let nb = k / 32;
        // qs: (n, k) i16; ad: (n, nb); asum: (2, n, nb), the float sums
        // then the integer ones (quant_act32).
        let mut guard = self.arena(&[n * k * 2, n * nb * 4, 2 * n * nb * 4])?;
        let key = super::ActKey::new(x, k, ACT_CANON, s);
        let cached = self.act_cached(key);
        let outs = Self::out_ranges(jobs, s);
        let ni = crate::backend::cuda::i32_of(n, "n")?;
        let ki = crate::backend::cuda::i32_of(k, "k")?;
        arena3::<i16, f32, f32, ()>(&mut guard, (n * k, n * nb, 2 * n * nb), |qs, ad, asum| {
            // (The norm, swiglu and attention writing these activations
            // themselves, so that no quant_act32 runs, was measured on an
            // H200 on 2026-11-27 (commit 8de7f66) and removed: exact
            // tg128 / tg128@d512 without / with it, 8B Q4_0 329.8 / 314.7
            // -> 328.1 / 308.1 tok/s, 8B Q8_0 268.8 / 258.7 -> 268.0 /
            // 254.9, 1B Q4_0 1,142 / 1,063 -> 1,133 / 1,044, SmolLM2
            // 1,070 / 944 -> 1,095 / 958: the quantization moved onto the
            // latency-bound producers' critical path costs about what its
            // launch did under PDL.)
            if !cached {
                let mut b = s.launch_builder(self.func("quant_act32")?);
                b.arg(x)
                    .arg(&ni)
                    .arg(&ki)
                    .arg(&mut *qs)
                    .arg(&mut *ad)
                    .arg(&mut *asum);
                // SAFETY: matches quant_act32 (one warp per block); n*k
                // inputs, n*k q, n*nb d and 2*n*nb s.
                drv(
                    unsafe { b.launch(grid_1d(n * nb * 32, 256)?) },
                    "mat_mul: launching quant_act32",
                )?;
            }
            if n <= MV_ROWS {
                // Decode: the warp-per-row kernel (same bits), all jobs;
                // a warp pair per MV_EXACT_WR rows when one warp each
                // leaves the GPU short of warps (exact_split).
                let wr = crate::backend::cuda::source::MV_EXACT_WR;
                // CTAs of the one-warp form (8 warps of MV_EXACT_WR rows).
                let ctas1: usize = jobs.iter().map(|j| j.w.rows.div_ceil(8 * wr)).sum();
                let split = exact_split(ctas1, self.sm_count());
                let per_cta = if split { 4 * wr } else { 8 * wr };
                let (table, ctas) = job_table(jobs, per_cta, s)?;
                let tc = crate::backend::cuda::ty_code(ty)
                    .ok_or_else(|| anyhow::anyhow!("mat_mul: {ty:?} is not a weight type"))?;
                let cfg = LaunchConfig {
                    grid_dim: (1, ctas, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                let name = mv_exact_name(n, split);
                let mut b = s.launch_builder(self.func(name)?);
                b.arg(&table)
                    .arg(&ki)
                    .arg(&tc)
                    .arg(&mut *qs)
                    .arg(&mut *ad)
                    .arg(&mut *asum)
                    .arg(&ni);
                // SAFETY: matches mv_exact32, mv_exact32_r1 and their _s2
                // forms (the same parameters); the job table holds each
                // job's weights (m rows) and output (n*m, validated) and its
                // CTA ranges of per_cta rows (8 / S warps of MV_EXACT_WR
                // rows, the kernel's S); n <= MV_EXACT_ROWS; static shared
                // memory only.
                drv(unsafe { b.launch(cfg) }, "mat_mul: launching mv_exact32")?;
                return Ok(());
            }
            for j in jobs.iter_mut() {
                let MmDims { tc, mi, .. } = mm_dims(&j.w, n)?;
                let add = j.add as i32;
                let (ra, cfg) = q_grid(j.w.rows, n)?;
                let mut b = s.launch_builder(self.func("mm_q32")?);
                b.arg(&j.w.data)
                    .arg(&mi)
                    .arg(&ki)
                    .arg(&tc)
                    .arg(&mut *qs)
                    .arg(&mut *ad)
                    .arg(&mut *asum)
                    .arg(&ni)
                    .arg(&ra)
                    .arg(&add)
                    .arg(&mut j.out);
                // SAFETY: matches mm_q32; buffers sized as above, out n*m.
                drv(unsafe { b.launch(cfg) }, "mat_mul: launching mm_q32")?;
            }
            Ok(())
        })?;
        self.act_remember(key, &outs);
        Ok(())
    }

    /// One job of float or K-quant weights.
    fn mat_mul_exact_one(
        &self,
        w: &DevMatrix<'_>,
        x: &CudaView<'_, f32>,
        n: usize,
        out: &mut CudaViewMut<'_, f32>,
        add: bool,
    ) -> Result<()> {
        let k = w.cols;
        let MmDims { tc, mi, ki, ni, .. } = mm_dims(w, n)?;
        let add = add as i32;
        let s = self.stream();
        if matches!(w.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            let mut b = s.launch_builder(self.func("mm_float")?);
            b.arg(&w.data)
                .arg(&mi)
                .arg(&ki)
                .arg(&tc)
                .arg(x)
                .arg(&ni)
                .arg(&add)
                .arg(out);
            // SAFETY: argument types match mm_float's signature; buffers
            // hold m*k weights, n*k inputs and n*m outputs (validated).
            drv(
                unsafe { b.launch(grid_1d(n * w.rows * 32, 256)?) },
                "mat_mul: launching mm_float",
            )?;
            return Ok(());
        }
        self.forget_activations();
        let nb = k / 256;
        let (ra, qcfg) = q_grid(w.rows, n)?;
        let mut guard = self.arena(&[n * k * 2, n * nb * 4, n * nb * 16 * 4])?;
        arena3::<i16, f32, i32, ()>(&mut guard, (n * k, n * nb, n * nb * 16), |qs, ad, bs| {
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
                .arg(&add)
                .arg(out);
            // SAFETY: matches mm_qk; buffers sized as above, out n*m.
            drv(unsafe { b.launch(qcfg) }, "mat_mul: launching mm_qk")?;
            Ok(())
        })
    }
}

/// Grid of mm_q32 / mm_qk: `ra` activation rows per thread group (outputs
/// share weight loads), 32 / ra weight rows per CTA.
fn q_grid(m: usize, n: usize) -> Result<(i32, LaunchConfig)> {
    let ra: i32 = match n {
        1 => 1,
        2..=4 => 4,
        5..=8 => 8,
        _ => 32,
    };
    let rw = 32 / ra as u64;
    Ok((
        ra,
        LaunchConfig {
            grid_dim: (
                u32::try_from((m as u64).div_ceil(rw))?,
                u32::try_from((n as u64).div_ceil(ra as u64))?,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        },
    ))
}
