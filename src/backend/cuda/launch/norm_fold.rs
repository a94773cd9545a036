//! The RMS norm folded into the one-row matvecs of `fast` mode
//! (`OpT::MatMuls` with `norm_in` / `norm_next`).
//!
//! A decode step at batch 1 used to run, between two matvecs, an
//! `rms_norm_fast` kernel of one CTA: a dependent launch whose latency
//! showed as 8% of SmolLM2's step and 17% of the 1B's (PERF.md, 11-23).
//! Here the normalized input never exists: its 32-blocks are quantized as
//! x ⊙ g (`norm_q8_block`: the int8 block and its scale, plus the block's
//! sum of x²), and the matvec multiplies each row's dot by
//! s = rsqrt(sum / k + eps), which is linear in the activations. Those
//! blocks come either from `quant_q8_g` (one kernel, the unfused form) or
//! from the epilogue of the matvec that wrote x (`mv_q8_r1_p*`, given
//! `norm_next`): the last CTA of each 32-row group converts the group, so
//! no kernel of its own runs. Both forms give the same bytes, so the bits
//! do not depend on the fusion; they differ from `rms_norm_fast` then
//! `quant_q8` (the scale is applied after the dot), which is why only
//! `fast` mode folds (QUIRE_NORM_FOLD=0: the old path).
//!
//! The blocks live in their own buffer (`prep`), apart from the arena the
//! producing matvec reads its own input from, and are valid for the next
//! op only (`take_prep` at the start of every op).

use super::dev_ptr;
use crate::backend::cuda::{drv, grid_1d, CudaBackend};
use crate::backend::NormNext;
use anyhow::{anyhow, Result};
use cudarc::driver::{CudaSlice, CudaView, PushKernelArg};

/// What the prep buffer holds: the x it was made from (device address and
/// length), the norm weights' address and eps.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct PrepKey {
    x: u64,
    len: usize,
    g: u64,
    eps: u32,
}

/// The prep buffer and what it holds.
#[derive(Default)]
pub(crate) struct Prep {
    buf: Option<CudaSlice<u8>>,
    key: Option<PrepKey>,
}

/// The kernels' `struct NormPrep` (matmul_fast.cu), same layout: norm
/// weights, then the int8 blocks, their float2 scales, the sums of x² and
/// the per-group counters. All zero: no epilogue.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub(super) struct NormPrepArg {
    g: u64,
    xq: u64,
    xds: u64,
    part: u64,
    cnt: u64,
}
// SAFETY: plain old data of five device addresses (u64), laid out like the
// kernels' struct NormPrep.
unsafe impl cudarc::driver::DeviceRepr for NormPrepArg {}

/// Device addresses of the prep regions for one row of k values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PrepRegions {
    pub cnt: u64,
    pub part: u64,
    pub xds: u64,
    pub xq: u64,
}

/// Byte offsets of the regions for one row of `k` values (k a multiple
/// of 32): counters (k/32 ints), sums (k/32 floats), scales (k/32
/// float2), int8 values (k); each region 256-byte aligned. Returns the
/// offsets and the total.
pub(super) fn prep_layout(k: usize) -> ([usize; 4], usize) {
    let nblk = k / 32;
    let sizes = [nblk * 4, nblk * 4, nblk * 8, k];
    let mut off = [0usize; 4];
    let mut at = 0;
    for (o, s) in off.iter_mut().zip(sizes) {
        *o = at;
        at += s.next_multiple_of(256);
    }
    (off, at)
}

/// Whether `fast` mode folds norms into the one-row matvecs
/// (QUIRE_NORM_FOLD=0: rms_norm_fast then the plain matvec, as before).
pub(super) fn norm_fold() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var("QUIRE_NORM_FOLD").map_or(true, |v| v != "0"))
}

impl PrepKey {
    pub(super) fn new(
        x_ptr: u64,
        len: usize,
        g: &CudaView<'_, f32>,
        eps: f32,
        be: &CudaBackend,
    ) -> Self {
        PrepKey {
            x: x_ptr,
            len,
            g: dev_ptr(g, be.stream()),
            eps: eps.to_bits(),
        }
    }
}

impl CudaBackend {
    /// Takes what the prep buffer holds (valid for the op about to run
    /// only: every op calls this first).
    pub(crate) fn take_prep(&self) -> Option<PrepKey> {
        self.prep.lock().ok().and_then(|mut p| p.key.take())
    }

    /// Records that the op just queued filled the prep buffer from `key`.
    pub(super) fn set_prep(&self, key: PrepKey) {
        if let Ok(mut p) = self.prep.lock() {
            p.key = Some(key);
        }
    }

    /// Bytes of the prep buffer (a larger one is a new allocation: a
    /// captured graph that used the old one must be captured again).
    pub fn prep_len(&self) -> usize {
        self.prep
            .lock()
            .map(|p| p.buf.as_ref().map_or(0, |b| b.len()))
            .unwrap_or(0)
    }

    /// The prep regions for one row of `k` values, growing the buffer
    /// (zeroed: the counters start at zero, and every launch leaves them
    /// so) where it is too small.
    pub(super) fn prep_regions(&self, k: usize) -> Result<PrepRegions> {
        let (off, total) = prep_layout(k);
        let mut p = self
            .prep
            .lock()
            .map_err(|_| anyhow!("cuda backend: prep lock poisoned"))?;
        if p.buf.as_ref().is_none_or(|b| b.len() < total) {
            p.key = None;
            p.buf = Some(drv(
                self.stream().alloc_zeros::<u8>(total),
                "mat_muls: allocating the norm prep buffer",
            )?);
        }
        let buf = p.buf.as_ref().expect("allocated above");
        let base = dev_ptr(&buf.slice(0..total), self.stream());
        Ok(PrepRegions {
            cnt: base + off[0] as u64,
            part: base + off[1] as u64,
            xds: base + off[2] as u64,
            xq: base + off[3] as u64,
        })
    }

    /// quant_q8_g: x (one row of k) and norm weights g into the prep
    /// regions (norm_q8_block per 32-block).
    pub(super) fn quant_q8_g(
        &self,
        x: &CudaView<'_, f32>,
        g: &CudaView<'_, f32>,
        k: usize,
        r: &PrepRegions,
    ) -> Result<()> {
        let nblk = (k / 32) as i64;
        let ki = i32::try_from(k)?;
        let mut b = self.stream().launch_builder(self.func("quant_q8_g")?);
        b.arg(x)
            .arg(g)
            .arg(&ki)
            .arg(&nblk)
            .arg(&r.xq)
            .arg(&r.xds)
            .arg(&r.part);
        // SAFETY: matches quant_q8_g; x and g hold k values (validated by
        // the caller), the regions k bytes, k/32 float2 and k/32 floats
        // (prep_regions(k)).
        drv(
            unsafe { b.launch(grid_1d(k, 256)?) },
            "mat_muls: launching quant_q8_g",
        )?;
        Ok(())
    }

    /// The epilogue argument for a producing matvec: where its output's
    /// blocks go (the norm weights must hold one value per output row).
    pub(super) fn prep_arg(
        &self,
        nn: &NormNext<'_, crate::backend::cuda::mem::Dev>,
        m: usize,
    ) -> Result<NormPrepArg> {
        let r = self.prep_regions(m)?;
        Ok(NormPrepArg {
            g: dev_ptr(&nn.w, self.stream()),
            xq: r.xq,
            xds: r.xds,
            part: r.part,
            cnt: r.cnt,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::prep_layout;

    #[test]
    fn prep_regions_are_aligned_and_disjoint() {
        // SmolLM2's 576: 18 blocks.
        let (off, total) = prep_layout(576);
        assert_eq!(off, [0, 256, 512, 768]);
        assert_eq!(total, 768 + 768);
        // The 8B's 4096: 128 blocks.
        let (off, total) = prep_layout(4096);
        assert_eq!(off, [0, 512, 1024, 2048]);
        assert_eq!(total, 2048 + 4096);
    }
}
