//! The greedy token choice on the device (kernels/argmax.cu): a greedy
//! decode step's next token without downloading its logits. The rule is
//! the sampler's (`Sampler::sample` at temperature 0, sampler.rs): the
//! first maximum in id order; a row with a NaN or +inf logit is flagged,
//! not chosen from.

use super::{dev_ptr, dev_ptr_mut};
use crate::backend::cuda::{drv, CudaBackend};
use anyhow::{anyhow, ensure, Result};
use cudarc::driver::{sys, CudaView, CudaViewMut, LaunchConfig, PinnedHostSlice, PushKernelArg};

/// Threads per row (ARGMAX_THREADS in argmax.cu).
const ARGMAX_THREADS: u32 = 1024;

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

    /// For each of the `n` rows of `logits` (n, vocab): `tokens[i]` its
    /// greedy token, `status[i]` 1 where the row holds a NaN or +inf
    /// (`tokens[i]` is then meaningless), else 0.
    pub(crate) fn d_argmax_rows(
        &self,
        logits: &CudaView<'_, f32>,
        n: usize,
        vocab: usize,
        tokens: &mut CudaViewMut<'_, u32>,
        status: &mut CudaViewMut<'_, u32>,
    ) -> Result<()> {
        ensure!(
            tokens.len() >= n && status.len() >= n,
            "argmax_rows: {n} rows need tokens and status >= {n} (got {}, {})",
            tokens.len(),
            status.len()
        );
        let st = self.stream();
        let (t, s) = (dev_ptr_mut(tokens, st), dev_ptr_mut(status, st));
        // SAFETY: t and s hold n u32 each (checked), borrowed mutably here.
        unsafe { self.d_argmax_rows_at(logits, n, vocab, t, s, None) }
    }

    /// [`CudaBackend::d_argmax_rows`] into device addresses (a decode
    /// graph's token input, which the step's embedding reads first), and
    /// with `ring`, also into the slot of that host ring (see
    /// [`GreedyRing`]) that `positions[0]` names.
    ///
    /// # Safety
    /// `tokens` and `status` must each be the address of n u32 of device
    /// memory that nothing reads or writes concurrently with this launch
    /// (stream order).
    pub(crate) unsafe fn d_argmax_rows_at(
        &self,
        logits: &CudaView<'_, f32>,
        n: usize,
        vocab: usize,
        tokens: u64,
        status: u64,
        ring: Option<(&GreedyRing, &CudaView<'_, u32>)>,
    ) -> Result<()> {
        ensure!(
            vocab > 0 && logits.len() >= n * vocab,
            "argmax_rows: {n} rows of {vocab} logits need logits >= {} (got {})",
            n * vocab,
            logits.len()
        );
        if n == 0 {
            return Ok(());
        }
        if let Some((r, pos)) = ring {
            ensure!(
                n <= r.cap && !pos.is_empty(),
                "argmax_rows: {n} rows into a ring of {} per slot",
                r.cap
            );
        }
        let vi = i32::try_from(vocab)?;
        let (rp, pp, cap, ns) = match ring {
            Some((r, pos)) => (
                r.dev_ptr,
                dev_ptr(pos, self.stream()),
                i32::try_from(r.cap)?,
                GREEDY_SLOTS as i32,
            ),
            None => (0u64, 0u64, 0i32, 1i32),
        };
        let cfg = LaunchConfig {
            grid_dim: (u32::try_from(n)?, 1, 1),
            block_dim: (ARGMAX_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(self.func("argmax_rows")?);
        b.arg(logits)
            .arg(&vi)
            .arg(&tokens)
            .arg(&status)
            .arg(&rp)
            .arg(&pp)
            .arg(&cap)
            .arg(&ns);
        // SAFETY: matches argmax_rows (logits, vocab, tokens, status, ring,
        // positions, cap, nslots); the grid has one CTA per row, and each
        // buffer holds the n rows checked above; the ring (when not null)
        // is GREEDY_SLOTS slots of 2 cap u32 of mapped host memory that
        // lives as long as the graphs that capture this launch.
        drv(unsafe { b.launch(cfg) }, "argmax_rows: launch")?;
        Ok(())
    }
}
