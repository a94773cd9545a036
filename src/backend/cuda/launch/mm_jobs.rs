//! The job table of the `MatMuls` kernels (`MmJobs` in
//! kernels/common.cuh, the same layout): up to MAX_MAT_JOBS matrices of
//! one type and k over one input in one launch, each job's weights,
//! output, rows and CTA range, and whether the one-row matvecs prefetch
//! their weights before waiting for the kernel before them.

use super::{dev_ptr, dev_ptr_mut, i32_of};
use crate::backend::cuda::mem::Dev;
use crate::backend::{MatJob, MAX_MAT_JOBS};
use anyhow::Result;
use cudarc::driver::CudaStream;

/// A MatMuls job table (MmJobs in common.cuh, same layout): job j's
/// weights and output addresses, rows, and the end of its CTA range.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub(super) struct MmJobs {
    w: [u64; MAX_MAT_JOBS],
    out: [u64; MAX_MAT_JOBS],
    /// The L2 read-ahead's progress word, or 0 (l2_ahead.rs).
    mark_ptr: u64,
    m: [i32; MAX_MAT_JOBS],
    end: [i32; MAX_MAT_JOBS],
    add: i32,
    count: i32,
    /// 1: the kernel prefetches its weight rows before waiting for its
    /// predecessor (see mv_prefetch).
    prefetch: i32,
    /// Job 0's first byte in the step's weight stream, in 256-byte units.
    mark: i32,
}
// SAFETY: MmJobs is #[repr(C)] plain data (u64 addresses and i32s) laid out
// like the kernels' struct MmJobs (8-byte fields first, no pointers into
// host memory), so it may be copied into a kernel's parameters.
unsafe impl cudarc::driver::DeviceRepr for MmJobs {}

impl MmJobs {
    /// Each job's weight address and rows, in table order.
    pub(super) fn weights(&self) -> impl Iterator<Item = (u64, usize)> + '_ {
        let count = (self.count.max(0) as usize).min(MAX_MAT_JOBS);
        (0..count).map(|j| (self.w[j], self.m[j].max(0) as usize))
    }

    /// Points job `j`'s output at device address `addr`.
    pub(super) fn set_out(&mut self, j: usize, addr: u64) {
        self.out[j] = addr;
    }

    /// Points the one-row matvecs' progress marks (mv_mark) at device
    /// address `ptr`: job 0 starts at `mark` (256-byte units) of the
    /// step's weight stream.
    pub(super) fn set_marks(&mut self, ptr: u64, mark: i32) {
        self.mark_ptr = ptr;
        self.mark = mark;
    }

    /// No weight prefetch before the wait (the L2 read-ahead fetches them).
    pub(super) fn no_prefetch(&mut self) {
        self.prefetch = 0;
    }

    /// The table's bytes, as a kernel parameter passed by value (RawArgs).
    pub(super) fn param_bytes(&self) -> Vec<u8> {
        // SAFETY: MmJobs is #[repr(C)] plain data without padding (eight
        // u64s and their arrays, then i32s: 120 bytes, a multiple of 8),
        // so all of its bytes are initialized.
        unsafe {
            std::slice::from_raw_parts(
                (self as *const MmJobs).cast::<u8>(),
                std::mem::size_of::<MmJobs>(),
            )
        }
        .to_vec()
    }

    /// Sets the table's add bits (bit j: job j adds into its output).
    pub(super) fn set_add(&mut self, bits: i32) {
        self.add = bits;
    }

    /// Whether split_sum_jobs can add this table's partials of `n`
    /// activation rows four floats at a time: every job's n * m a multiple
    /// of 4 and every output 16-byte aligned.
    pub(super) fn vec4_ok(&self, n: usize) -> bool {
        let count = self.count.max(0) as usize;
        (0..count.min(MAX_MAT_JOBS)).all(|j| {
            (n * self.m[j].max(0) as usize).is_multiple_of(4) && self.out[j].is_multiple_of(16)
        })
    }
}

/// Whether a matvec launch prefetches its weights before waiting for the
/// previous kernel (MV_PREFETCH in matmul_fast.cu): quantized weights of at
/// most QUIRE_MV_PREFETCH_MB (default 4) MiB in all. Measured on an H100
/// (2026-11-22, tg128): prefetching every matrix: SmolLM2 Q4_0 +5%, 1B
/// Q4_0 +1.6%, but 8B Q4_0 -3.7% and 1B F16 -1.5% (there the early reads
/// compete with the previous kernel's); up to 16 MiB: SmolLM2 1,305 ->
/// 1,367, 8B 365.5 -> 361.4 (its q/k/v and o matrices are 14 and 9 MiB).
/// Launches captured with the L2 read-ahead drop it (`l2_record`).
fn mv_prefetch(jobs: &[MatJob<'_, Dev>]) -> bool {
    static MB: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let mb = *MB.get_or_init(|| {
        std::env::var("QUIRE_MV_PREFETCH_MB")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(4)
    });
    let bytes: usize = jobs.iter().map(|j| j.w.data.len()).sum();
    let quantized = jobs.iter().all(|j| j.w.ty.block_size() > 1);
    prefetch_wanted(bytes, quantized, mb << 20)
}

/// mv_prefetch's rule: quantized weights (the float matvecs never
/// prefetch) of at most `limit` bytes.
fn prefetch_wanted(bytes: usize, quantized: bool, limit: usize) -> bool {
    quantized && bytes <= limit
}

/// The job table of validated jobs for a kernel of `rows_per_cta` weight
/// rows per CTA (grid y), and the total CTA count.
pub(super) fn job_table(
    jobs: &mut [MatJob<'_, Dev>],
    rows_per_cta: usize,
    s: &std::sync::Arc<CudaStream>,
) -> Result<(MmJobs, u32)> {
    let mut t = MmJobs {
        count: i32_of(jobs.len(), "jobs")?,
        ..Default::default()
    };
    let mut end = 0usize;
    for (i, j) in jobs.iter_mut().enumerate() {
        t.w[i] = dev_ptr(&j.w.data, s);
        t.out[i] = dev_ptr_mut(&j.out, s);
        t.m[i] = i32_of(j.w.rows, "m")?;
        end += j.w.rows.div_ceil(rows_per_cta);
        t.end[i] = i32_of(end, "CTAs of a matmul")?;
        t.add |= (j.add as i32) << i;
    }
    t.prefetch = mv_prefetch(jobs) as i32;
    Ok((t, u32::try_from(end)?))
}

#[cfg(test)]
mod tests {
    use super::{prefetch_wanted, MmJobs};

    #[test]
    fn split_sum_jobs_needs_whole_float4s() {
        // q/k/v of the 8B at 64 rows: three jobs, 16-byte aligned outputs.
        let mut t = MmJobs {
            count: 3,
            ..Default::default()
        };
        t.m[..3].copy_from_slice(&[4096, 1024, 1024]);
        t.out[..3].copy_from_slice(&[0x7000_0000, 0x7100_0000, 0x7200_0100]);
        assert!(t.vec4_ok(64));
        // An odd row count with an odd m: n * m not a multiple of 4.
        t.m[1] = 1023;
        assert!(!t.vec4_ok(3));
        assert!(t.vec4_ok(4));
        // An output only 4-byte aligned (a view into a larger buffer).
        t.out[2] += 4;
        assert!(!t.vec4_ok(4));
        // Jobs past `count` are not looked at.
        t.count = 2;
        assert!(t.vec4_ok(4));
    }

    #[test]
    fn matvec_prefetch_rule() {
        let mib = 1 << 20;
        assert!(prefetch_wanted(4 * mib, true, 4 * mib));
        assert!(!prefetch_wanted(4 * mib + 1, true, 4 * mib));
        assert!(!prefetch_wanted(1, false, 4 * mib));
        assert!(!prefetch_wanted(1, true, 0));
    }
}
