//! Norm-ahead (`fast` mode, one row; on by default for narrow residuals,
//! `fusion::norm_ahead_rule`; the tuning switch `matvec.norm_ahead`
//! forces it): the RMS norm between a residual matvec and the next op's
//! matvecs folded into both, so that a one-row decode layer loses its two
//! `rms_norm_fast` launches. Which ops pair up is the step's fusion pass's
//! answer (fusion.rs: `ahead_producer`, `ahead_consumer`); an op outside a
//! planned step takes no part.
//!
//! The producer is a `MatMuls` whose one job adds into the residual stream
//! x and whose `next_norm` names the next op's norm (the model passes it:
//! o -> FFN norm, down -> the next layer's attention norm). It stores x
//! and quantizes each block of 32 values of x * g (without the norm's
//! 1/rms, which divides out of every block's scale) and stores the block's
//! sum of squares into this module's buffer (`fusion::producer_form`: on
//! sm_90+ a thread-block cluster of 4 CTAs of 8 rows per block,
//! `mv_q8_r1_na_c4` / `_w2c4`, rank 0 quantizing; elsewhere one CTA of
//! 1,024 threads, `mv_q8_r1_na`). The consumer, the very next op (a
//! `MatMuls` carrying that norm on that x), skips `rms_norm_fast` and the
//! quantization and runs the usual one-row matvec on those blocks, which
//! scales each output by rsqrt(sum / dim + eps) (`mv_q8_r1_nc` and its
//! split-row forms, or for a gate/up op with its SwiGlu the fused
//! `mv_q8_r1_glu*_nc`: separate entries, so the plain kernels keep their
//! code). The blocks serve the next op only (`take_norm_ahead` at every
//! op), and only if the producer ran (it may not find its buffer during a
//! capture: the consumer then runs the plain path).
//!
//! Not the bits of `RmsNorm` then `MatMuls` (the 1/rms is applied after
//! the products instead of before the rounding to int8), so `fast` mode
//! only; `check-exact --mode fast-norm-ahead` checks it against the plain
//! graph and the cpu, `quire ops --mode fast --op norm_ahead` producer /
//! consumer pairs against the cpu's ops.
//!
//! On by default for residual rows of at most `fusion::NORM_AHEAD_MAX_DIM`
//! values (`fusion::norm_ahead_rule`). Measured on an H200 (2026-11-29,
//! docs/PERF.md), after 512 tokens: SmolLM2 (576) +5-7% with the cluster
//! producer and the fused SwiGlu consumer (+0.5-1.6% with the one-CTA
//! producer and the unfused pair); the 1B (2,048) -15% (the cluster
//! producer's down projection ran 9.2 against 6.4 us alone under ncu, and
//! its launches overlapped far less with their neighbours), the 8B (4,096)
//! -11%.

use super::{job_table, mm_dims, mv_grid, mv_name, mv_warps, MV_Q8_NC};
use crate::backend::cuda::device::launch::dev_ptr;
use crate::backend::cuda::device::memory::Dev;
use crate::backend::cuda::fusion::producer_form;
use crate::backend::cuda::fusion::ActRead;
use crate::backend::cuda::{drv, CudaBackend, Switch};
use crate::backend::{validate, MatJob, Mode, WeightInfo};
use crate::quant::GgmlType;
use anyhow::{Context, Result};
use cudarc::driver::{CudaSlice, CudaView, LaunchConfig, PushKernelArg};

/// What the producer left for the next op: blocks of a residual row of
/// `len` values. Which op consumes them is the fusion pass's answer
/// (fusion.rs: the op right after, normalizing that residual with the
/// producer's norm weights and eps), never a match of device addresses;
/// the width is checked.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct AheadKey {
    len: usize,
}

/// Device addresses of the producer's blocks for one consumer: the int8
/// blocks (dim), their scales (dim / 32 float2), the sums of squares
/// (dim / 32 f32), and how many blocks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AheadBlocks {
    pub(crate) nq: u64,
    pub(crate) nds: u64,
    pub(crate) parts: u64,
    pub(crate) blocks: i32,
}

/// The pending blocks' key (valid for the next op only) with their
/// address in the buffer, and the buffer: int8 blocks (dim), block scales
/// (dim / 32 float2), sums of squares (dim / 32 f32), each at a 256-byte
/// boundary.
#[derive(Default)]
pub(crate) struct NormAhead {
    key: Option<(AheadKey, u64)>,
    buf: Option<CudaSlice<u8>>,
}

/// Byte offsets of the scales and the sums in the buffer for `dim`, and its
/// size.
fn layout(dim: usize) -> (usize, usize, usize) {
    let a = |b: usize| b.next_multiple_of(256);
    let nb = dim / 32;
    let ds = a(dim);
    let parts = ds + a(nb * 8);
    (ds, parts, parts + a(nb * 4))
}

/// Whether the weight type runs through the int8 warp-per-row matvecs.
fn q8_type(ty: GgmlType) -> bool {
    !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

impl CudaBackend {
    /// The producer's blocks (their width and address), taken (so they
    /// serve only the op right after). Off, no producer ever sets them.
    pub(crate) fn take_norm_ahead(&self) -> Option<(AheadKey, u64)> {
        if self.tuning.matvec.norm_ahead == Switch::Off {
            return None;
        }
        self.norm_ahead.lock().ok().and_then(|mut s| s.key.take())
    }

    /// The buffer's base address for `dim`, allocated (or grown) outside
    /// a stream capture only: None while capturing without one large
    /// enough (the caller then runs the plain path).
    fn norm_ahead_buf(&self, dim: usize) -> Result<Option<u64>> {
        let need = layout(dim).2;
        let mut s = self
            .norm_ahead
            .lock()
            .map_err(|_| anyhow::anyhow!("norm-ahead lock poisoned"))?;
        if s.buf.as_ref().is_none_or(|b| b.len() < need) {
            let capturing = drv(self.stream().capture_status(), "norm-ahead: capture status")?;
            if capturing
                != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
            {
                return Ok(None);
            }
            s.buf = Some(self.scratch::<u8>(need, "norm-ahead buffer")?);
        }
        let b = s.buf.as_ref().expect("allocated above");
        Ok(Some(dev_ptr(&b.slice(0..need), self.stream())))
    }

    /// The producer: `jobs` (one adding job, the residual stream) by
    /// `mv_q8_r1_na` when norm-ahead applies, leaving the next op's input
    /// blocks for norm weights `g` (its eps is the consumer's to apply).
    /// Ok(false): it does not apply (nothing ran; the caller runs the plain
    /// op).
    pub(crate) fn mat_muls_ahead(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        jobs: &mut [MatJob<'_, Dev>],
        g: &CudaView<'_, f32>,
        mode: Mode,
    ) -> Result<bool> {
        if jobs.len() != 1 {
            return Ok(false);
        }
        let job = &jobs[0];
        let (k, m) = (job.w.cols, job.w.rows);
        // The fusion pass's decision (fusion.rs: it pairs the producer with
        // the next op, under `fusion::norm_ahead_rule`); an op outside a
        // planned step is never a producer. The structural conditions
        // below are the pass's too.
        let on = self.current_fusion().is_some_and(|f| f.ahead_producer);
        if !on
            || mode != Mode::Fast
            || n != 1
            || !job.add
            || !q8_type(job.w.ty)
            || k == 0
            || !k.is_multiple_of(32)
            || m == 0
            || !m.is_multiple_of(32)
            || g.len() != m
            || job.out.len() != m
        {
            return Ok(false);
        }
        validate::mat_muls(x.len(), n, &[(&job.w as &dyn WeightInfo, job.out.len())])
            .context("mat_muls (norm-ahead producer)")?;
        let d = mm_dims(&job.w, n)?;
        let Some(base) = self.norm_ahead_buf(m)? else {
            return Ok(false);
        };
        let (ds_off, parts_off, _) = layout(m);
        let s = self.stream();
        let clusters = crate::backend::cuda::device::pdl::arch_major(&self.arch) >= 9
            && self.tuning.matvec.norm_ahead_clusters;
        let (name, threads, rows, csize) = producer_form(clusters, k, m);
        let (mut table, ctas) = job_table(jobs, rows, s)?;
        self.l2_record(jobs, &mut table)?;
        let g_ptr = dev_ptr(g, s);
        let cfg = LaunchConfig {
            grid_dim: (1, ctas, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY (of the launch in mat_vec_q8, for the `extra` arguments):
        // mv_q8_r1_na* take one job of m rows (a multiple of 32: `rows`
        // per CTA, csize CTAs per 32 rows, m / rows CTAs, which csize
        // divides) adding into its output of m floats (n = 1, validated),
        // then g (m floats) and nq, nds, nparts pointing into the
        // norm-ahead buffer laid out for m (`layout`): m bytes, m / 32
        // float2 and m / 32 floats.
        let extra = [g_ptr, base, base + ds_off as u64, base + parts_off as u64];
        // The input's blocks as the op's annotation says (the attention
        // before may have written them); the kernel reads quant_q8's.
        let pre = self.annotated_input(n, jobs, mode, Some(ActRead::Q8));
        self.mat_vec_q8(x, n, jobs, (&d, &table, cfg, name), &extra, csize, pre)?;
        if let Ok(mut st) = self.norm_ahead.lock() {
            st.key = Some((AheadKey { len: m }, base));
        }
        Ok(true)
    }

    /// The producer's blocks (`ahead`, left by the op before, which the
    /// fusion pass paired with this one) as the input of rows of `k`.
    pub(crate) fn ahead_for(
        &self,
        k: usize,
        ahead: Option<(AheadKey, u64)>,
    ) -> Option<AheadBlocks> {
        let (key, base) = ahead?;
        if k != key.len {
            return None;
        }
        let (ds_off, parts_off, _) = layout(k);
        Some(AheadBlocks {
            nq: base,
            nds: base + ds_off as u64,
            parts: base + parts_off as u64,
            blocks: i32::try_from(k / 32).ok()?,
        })
    }

    /// The consumer: `jobs` of rms_norm(x) (the norm's `eps`; its weights
    /// were the producer's) from the blocks the op before left (`ahead`),
    /// by the one-row matvec with the norm's scale applied after the
    /// products. Ok(false): no blocks of this width, or not a one-row
    /// `fast` op of quantized weights (nothing ran).
    pub(crate) fn mat_muls_norm_ahead(
        &self,
        x: &CudaView<'_, f32>,
        eps: f32,
        n: usize,
        jobs: &mut [MatJob<'_, Dev>],
        mode: Mode,
        ahead: Option<(AheadKey, u64)>,
    ) -> Result<bool> {
        let s = self.stream();
        let k = jobs.first().map_or(0, |j| j.w.cols);
        let Some(AheadBlocks {
            nq,
            nds,
            parts,
            blocks,
        }) = self.ahead_for(k, ahead)
        else {
            return Ok(false);
        };
        if mode != Mode::Fast || n != 1 || jobs.iter().any(|j| !q8_type(j.w.ty) || j.w.cols != k) {
            return Ok(false);
        }
        let shapes: Vec<(&dyn WeightInfo, usize)> = jobs
            .iter()
            .map(|j| (&j.w as &dyn WeightInfo, j.out.len()))
            .collect();
        validate::mat_muls(x.len(), n, &shapes).context("mat_muls (norm-ahead consumer)")?;
        let d = mm_dims(&jobs[0].w, n)?;
        let m: usize = jobs.iter().map(|j| j.w.rows).sum();
        let warps = mv_warps(mode, n, false, k >= 3 * m);
        let (mut table, ctas) = job_table(jobs, 8 / warps, s)?;
        self.l2_record(jobs, &mut table)?;
        let cfg = mv_grid(n, ctas)?;
        let name = mv_name(n, warps, MV_Q8_NC);
        // The norm's scratch is not written and no arena block is: the
        // cached activations stay what they were.
        let mut b = s.launch_builder(self.func(name)?);
        b.arg(&table)
            .arg(&d.ki)
            .arg(&d.rb)
            .arg(&d.tc)
            .arg(&nq)
            .arg(&nds)
            .arg(&d.ni)
            .arg(&parts)
            .arg(&blocks)
            .arg(&eps);
        // SAFETY: matches mv_q8_r1_nc and its split-row variants (8 /
        // warps rows per CTA, as the job table; n = 1): each job's weights hold m
        // rows of rb bytes and its output m floats (validated); nq / nds
        // hold the k int8 and k / 32 float2 the producer stored for this x
        // (the key matched: same buffer, length, norm weights and eps, and
        // no op ran between), and parts its k / 32 sums.
        drv(
            unsafe { b.launch(cfg) },
            "mat_mul: launching mv_q8 (norm-ahead)",
        )?;
        self.norm_ahead_runs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// q8_block's arithmetic (common.cuh): d = amax / 127, q = round to
    /// nearest even of v / d, clamped to +-127.
    fn q8(v: &[f32]) -> (Vec<i32>, f32) {
        let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
        let d = amax / 127.0;
        let q = v
            .iter()
            .map(|&x| {
                if d == 0.0 {
                    0
                } else {
                    ((x / d).round_ties_even() as i32).clamp(-127, 127)
                }
            })
            .collect();
        (q, d)
    }

    /// A row's int8 dot with 4-bit weights (one scale per 32-block), from
    /// activations y quantized per block.
    fn dot(wq: &[i32], ws: &[f32], y: &[f32]) -> f64 {
        let mut acc = 0f64;
        for (b, yb) in y.chunks(32).enumerate() {
            let (q, d) = q8(yb);
            let i: i32 = q.iter().zip(&wq[32 * b..]).map(|(a, w)| a * w).sum();
            acc += (ws[b] * d) as f64 * i as f64;
        }
        acc
    }

    #[test]
    fn the_norm_scale_divides_out_of_the_blocks() {
        // Norm-ahead's premise: quantizing x * g and scaling the finished
        // dot by 1/rms is as accurate as quantizing x * g / rms (the plain
        // path), against the f64 product; on random rows of several
        // scales and norm weights of both signs.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let (k, rows) = (2048usize, 64usize);
        let (mut e_plain, mut e_ahead, mut den) = (0f64, 0f64, 0f64);
        for r in 0..rows {
            let scale = 0.01 + 10.0 * r as f32 / rows as f32;
            let x: Vec<f32> = (0..k)
                .map(|_| scale * rng.random_range(-3.0f32..3.0))
                .collect();
            let g: Vec<f32> = (0..k).map(|_| rng.random_range(-1.5f32..1.5)).collect();
            let wq: Vec<i32> = (0..k).map(|_| rng.random_range(-8..8)).collect();
            let ws: Vec<f32> = (0..k / 32)
                .map(|_| rng.random_range(0.001f32..0.02))
                .collect();
            let ss: f32 = x.iter().map(|v| v * v).sum();
            let rs = 1.0 / (ss / k as f32 + 1e-5).sqrt();
            let exact: f64 = (0..k)
                .map(|i| {
                    (ws[i / 32] as f64 * wq[i] as f64) * (x[i] as f64 * rs as f64 * g[i] as f64)
                })
                .sum();
            let yn: Vec<f32> = (0..k).map(|i| x[i] * rs * g[i]).collect();
            let y: Vec<f32> = (0..k).map(|i| x[i] * g[i]).collect();
            let plain = dot(&wq, &ws, &yn);
            let ahead = dot(&wq, &ws, &y) * rs as f64;
            e_plain += (plain - exact).powi(2);
            e_ahead += (ahead - exact).powi(2);
            den += exact * exact;
        }
        let (np, na) = (e_plain / den, e_ahead / den);
        assert!(np < 1e-3 && na < 1e-3, "nmse plain {np:e}, ahead {na:e}");
        assert!(na <= 1.5 * np, "nmse plain {np:e}, ahead {na:e}");
    }

    #[test]
    fn layout_aligns_each_part() {
        // SmolLM2 (576): 576 int8, 18 float2 (144 B), 18 f32 (72 B).
        assert_eq!(layout(576), (768, 1024, 1280));
        // The 8B (4,096): 4,096 int8, 128 float2, 128 f32.
        assert_eq!(layout(4096), (4096, 5120, 5632));
    }
}
