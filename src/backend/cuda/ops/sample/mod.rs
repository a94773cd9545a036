//! The token choice on the device (kernels/sample.cu here): a decode step's
//! next token without downloading its logits. The rule is the sampler's,
//! bit for bit: at temperature 0 the first maximum in id order; above it,
//! sampler/draw.rs's draw given the step's uniform. A row with a NaN or
//! +inf logit (or, sampled, only -inf logits) is flagged, not chosen from.

use crate::backend::cuda::device::launch::{dev_ptr, dev_ptr_mut};
use crate::backend::cuda::{drv, CudaBackend};
use anyhow::{anyhow, ensure, Result};
use cudarc::driver::{sys, CudaView, CudaViewMut, LaunchConfig, PinnedHostSlice, PushKernelArg};

/// Threads per row (SAMPLE_THREADS in sample.cu).
const SAMPLE_THREADS: u32 = 512;

/// CTAs per row on sm_90+ (a thread-block cluster; 8 is portable).
const SAMPLE_CLUSTER: u32 = 8;

/// Sorted candidates a device draw handles (SAMPLE_KMAX in sample.cu):
/// top-k up to this many; a row with more is drawn on the host.
pub const SAMPLE_KMAX: usize = 1024;

/// Vocabulary a device draw in id order handles (SAMPLE_MAX_CHUNKS chunks
/// of SAMPLE_CHUNK ids in sample.cu).
pub const SAMPLE_MAX_VOCAB: usize = 1024 * crate::sampler::CHUNK;

/// u32 words of one row's draw record (sample.cu's params).
pub const DRAW_WORDS: usize = 7;

/// The draw record's word that says mask_rows masks the row.
pub const MASKED_WORD: usize = 6;

/// CTAs per row of mask_rows.
const MASK_CTAS: u32 = 8;

/// Threads per CTA of mask_rows (MASK_THREADS in sample.cu).
const MASK_THREADS: u32 = 256;

/// A row's draw record: temperature, top-k, top-p, min-p and the uniform
/// (`None`, or temperature 0: the greedy rule), and whether the row's
/// logits are masked first (`masked`: mask_rows).
pub fn draw_record(
    p: Option<(&crate::sampler::DrawParams, f64)>,
    masked: bool,
) -> [u32; DRAW_WORDS] {
    let mut r = match p {
        Some((d, u)) if d.temperature != 0.0 => {
            let ub = u.to_bits();
            [
                d.temperature.to_bits(),
                u32::try_from(d.top_k).unwrap_or(u32::MAX),
                d.top_p.to_bits(),
                d.min_p.to_bits(),
                ub as u32,
                (ub >> 32) as u32,
                0,
            ]
        }
        _ => [0; DRAW_WORDS],
    };
    r[MASKED_WORD] = u32::from(masked);
    r
}

/// Whether the device can draw for these parameters over `vocab` logits
/// whatever the logits are (status 3 never set): greedy; top-k within
/// SAMPLE_KMAX (with top-p, a row of at most top-k finite logits draws
/// as a nucleus: the vocabulary within SAMPLE_MAX_VOCAB); or no top-k
/// below the vocabulary (id order, or the nucleus of top-p), with the
/// vocabulary within SAMPLE_MAX_VOCAB.
pub fn device_draws(d: &crate::sampler::DrawParams, vocab: usize) -> bool {
    let small = vocab <= SAMPLE_MAX_VOCAB;
    d.temperature == 0.0
        || ((1..=SAMPLE_KMAX).contains(&d.top_k) && (d.top_p >= 1.0 || small))
        || ((d.top_k == 0 || d.top_k >= vocab) && small)
}

/// Slots of a [`GreedyRing`]: greedy steps whose results may be unread.
pub const GREEDY_SLOTS: usize = 4;

/// Page-locked host memory the device writes greedy tokens into (no copy
/// on the stream): GREEDY_SLOTS slots of (tokens (cap), status (cap)) u32,
/// slot = the step's first position % GREEDY_SLOTS. The host reads a slot
/// once the step that wrote it has completed, before the step
/// GREEDY_SLOTS positions later is enqueued.
pub struct GreedyRing {
    host: PinnedHostSlice<u32>,
    dev_ptr: u64,
    pub cap: usize,
}

impl GreedyRing {
    /// Slot `s` (tokens, then statuses) of a completed step.
    pub fn slot(&self, s: usize) -> Result<&[u32]> {
        let all = drv(self.host.as_slice(), "greedy ring")?;
        Ok(&all[2 * self.cap * s..2 * self.cap * (s + 1)])
    }
}

// SAFETY: the ring's memory is plain page-locked host memory, not tied to
// a thread; the device writes it only inside steps the owner orders.
unsafe impl Send for GreedyRing {}
impl CudaBackend {
    /// A zeroed [`GreedyRing`] of `cap` rows per slot.
    pub(crate) fn greedy_ring(&self, cap: usize) -> Result<GreedyRing> {
        let len = 2 * cap.max(1) * GREEDY_SLOTS;
        // SAFETY: u32 has no invalid bit patterns and the buffer is zeroed
        // below before anything reads it; DEVICEMAP: the device may write
        // it through the pointer queried next.
        let p = unsafe {
            self.dev
                .ctx
                .alloc_pinned_with_flags::<u32>(len, sys::CU_MEMHOSTALLOC_DEVICEMAP)
        };
        let mut host = drv(p, "allocating the greedy ring")?;
        let hp = drv(host.as_mut_slice(), "greedy ring")?;
        hp.fill(0);
        let mut d: sys::CUdeviceptr = 0;
        // SAFETY: hp points at the mapped allocation just made; flags 0.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, hp.as_mut_ptr().cast(), 0) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(anyhow!(
                "greedy ring: cuMemHostGetDevicePointer failed: {r:?}"
            ));
        }
        Ok(GreedyRing {
            host,
            dev_ptr: d,
            cap: cap.max(1),
        })
    }

    /// For each of the `n` rows of `logits` (n, vocab), with its draw
    /// record in `params` (n, DRAW_WORDS): `tokens[i]` its token,
    /// `status[i]` 0, or (`tokens[i]` then 0) 1 where the row holds a NaN
    /// or +inf, 2 where a sampled row is all -inf, 3 where a sampled row
    /// has more sorted candidates than SAMPLE_KMAX.
    pub(crate) fn d_sample_rows(
        &self,
        logits: &CudaView<'_, f32>,
        n: usize,
        vocab: usize,
        params: &CudaView<'_, u32>,
        tokens: &mut CudaViewMut<'_, u32>,
        status: &mut CudaViewMut<'_, u32>,
    ) -> Result<()> {
        ensure!(
            tokens.len() >= n && status.len() >= n,
            "sample_rows: {n} rows need tokens and status >= {n} (got {}, {})",
            tokens.len(),
            status.len()
        );
        let st = self.stream();
        let (t, s) = (dev_ptr_mut(tokens, st), dev_ptr_mut(status, st));
        let p = dev_ptr(params, st);
        ensure!(
            params.len() >= n * DRAW_WORDS,
            "sample_rows: {n} rows need {} draw words (got {})",
            n * DRAW_WORDS,
            params.len()
        );
        // SAFETY: t and s hold n u32 each (checked), borrowed mutably here;
        // params holds n records (checked), borrowed.
        unsafe { self.d_sample_rows_at(logits, n, vocab, p, t, s, None) }
    }

    /// Masks the logits of the rows whose draw record says so (mask_rows
    /// in sample.cu), in place: a refused id's logit becomes -inf unless
    /// it is a NaN or +inf (which sample_rows then refuses, as the host
    /// sampler does); allowed ids keep their bits.
    ///
    /// # Safety
    /// `logits` must be the address of n * vocab f32, `params` of n draw
    /// records and `masks` of n * mwords u32, of device memory that nothing
    /// reads or writes (logits) or writes (params, masks) concurrently
    /// with this launch (stream order).
    pub(crate) unsafe fn d_mask_rows_at(
        &self,
        logits: u64,
        n: usize,
        vocab: usize,
        params: u64,
        masks: u64,
        mwords: usize,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        ensure!(
            mwords * 32 >= vocab,
            "mask_rows: {mwords} words cannot mask {vocab} ids"
        );
        let (vi, mw) = (i32::try_from(vocab)?, i32::try_from(mwords)?);
        let cfg = LaunchConfig {
            grid_dim: (MASK_CTAS, u32::try_from(n)?, 1),
            block_dim: (MASK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(self.func("mask_rows")?);
        b.arg(&logits).arg(&vi).arg(&params).arg(&masks).arg(&mw);
        // SAFETY: matches mask_rows (logits, vocab, params, masks, mwords);
        // one CTA row per logits row, each buffer holding the n rows the
        // caller promised.
        drv(unsafe { b.launch(cfg) }, "mask_rows: launch")?;
        Ok(())
    }

    /// [`CudaBackend::d_sample_rows`] with device addresses (a decode
    /// graph's draw records, and its token input, which the step's
    /// embedding reads first), and with `ring` = (ring, steps), also into
    /// the slot of that host ring (see [`GreedyRing`]) that the first of
    /// the graph's step words (`DevAttnBatch::step_words`, its first row's
    /// position) names; the launch then advances the step words' n
    /// positions and n slots by one (sample.cu).
    ///
    /// # Safety
    /// `params` must be the address of n draw records (n * DRAW_WORDS
    /// u32), `tokens` and `status` each of n u32, and with a ring `steps`
    /// of 4 n + 1 u32 whose last is zero, of device memory that nothing
    /// writes (params) or reads or writes (tokens, status, steps)
    /// concurrently with this launch (stream order).
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn d_sample_rows_at(
        &self,
        logits: &CudaView<'_, f32>,
        n: usize,
        vocab: usize,
        params: u64,
        tokens: u64,
        status: u64,
        ring: Option<(&GreedyRing, u64)>,
    ) -> Result<()> {
        ensure!(
            vocab > 0 && logits.len() >= n * vocab,
            "sample_rows: {n} rows of {vocab} logits need logits >= {} (got {})",
            n * vocab,
            logits.len()
        );
        if n == 0 {
            return Ok(());
        }
        if let Some((r, _)) = ring {
            ensure!(
                n <= r.cap,
                "sample_rows: {n} rows into a ring of {} per slot",
                r.cap
            );
        }
        let vi = i32::try_from(vocab)?;
        let (rp, pp, cap, ns) = match ring {
            Some((r, steps)) => (r.dev_ptr, steps, i32::try_from(r.cap)?, GREEDY_SLOTS as i32),
            None => (0u64, 0u64, 0i32, 1i32),
        };
        // A cluster of SAMPLE_CLUSTER CTAs per row on sm_90+ (one row's
        // passes over the logits spread over as many SMs; tuning
        // `runtime.sample_cluster`), else one CTA.
        let cl = if crate::backend::cuda::device::pdl::arch_major(&self.arch) >= 9
            && self.tuning.runtime.sample_cluster
        {
            SAMPLE_CLUSTER
        } else {
            1
        };
        let cfg = LaunchConfig {
            grid_dim: (cl, u32::try_from(n)?, 1),
            block_dim: (SAMPLE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        if cl > 1 {
            let mut ptrs: [u64; 7] = [
                dev_ptr(logits, self.stream()),
                params,
                tokens,
                status,
                rp,
                pp,
                0,
            ];
            let mut ints: [i32; 3] = [vi, cap, ns];
            let [lp, prm, tp, sp, rpp, ppp, _] = &mut ptrs;
            let [vip, capp, nsp] = &mut ints;
            let mut args: [*mut std::ffi::c_void; 9] = [
                (lp as *mut u64).cast(),
                (vip as *mut i32).cast(),
                (prm as *mut u64).cast(),
                (tp as *mut u64).cast(),
                (sp as *mut u64).cast(),
                (rpp as *mut u64).cast(),
                (ppp as *mut u64).cast(),
                (capp as *mut i32).cast(),
                (nsp as *mut i32).cast(),
            ];
            // SAFETY: one pointer per sample_rows parameter (logits, vocab,
            // params, tokens, status, ring, steps, cap, nslots), each to
            // a value of its C type living through the call; the buffers
            // hold the n rows checked above or promised by the caller; the
            // cluster (SAMPLE_CLUSTER along x) divides the grid and is a
            // portable size on sm_90.
            unsafe { self.launch_clustered("sample_rows", cfg, (cl, 1, 1), &mut args)? };
            return Ok(());
        }
        let mut b = self.stream().launch_builder(self.func("sample_rows")?);
        b.arg(logits)
            .arg(&vi)
            .arg(&params)
            .arg(&tokens)
            .arg(&status)
            .arg(&rp)
            .arg(&pp)
            .arg(&cap)
            .arg(&ns);
        // SAFETY: matches sample_rows (logits, vocab, params, tokens,
        // status, ring, steps, cap, nslots); the grid has one CTA per
        // row, and each buffer holds the n rows checked above or promised
        // by the caller; the ring (when not null) is GREEDY_SLOTS slots of
        // 2 cap u32 of mapped host memory that lives as long as the graphs
        // that capture this launch.
        drv(unsafe { b.launch(cfg) }, "sample_rows: launch")?;
        Ok(())
    }
}
