//! The job table of the `MatMuls` kernels (`MmJobs` in
//! kernels/common.cuh, the same layout): up to MAX_MAT_JOBS matrices of
//! one type and k over one input in one launch, each job's weights,
//! output, rows and CTA range, and whether the one-row matvecs prefetch
//! their weights before waiting for the kernel before them.

use crate::backend::cuda::device::launch::{dev_ptr, dev_ptr_mut};
use crate::backend::cuda::device::memory::{Dev, DevMatrix};
use crate::backend::cuda::i32_of;
use crate::backend::cuda::ty_code;
use crate::backend::{MatJob, MAX_MAT_JOBS};
use anyhow::{anyhow, Result};
use cudarc::driver::{CudaStream, LaunchConfig};

/// Activation rows per group of the warp-per-row matmul (MV_ROWS in
/// mv_q8.cuh).
pub(crate) const MV_ROWS: usize = 8;

/// A matmul's kernel arguments: the weight type code, bytes per weight
/// row, and m, k, n as the kernels' ints (n * k checked to fit too).
pub(crate) struct MmDims {
    pub tc: i32,
    pub rb: i64,
    pub mi: i32,
    pub ki: i32,
    pub ni: i32,
}

pub(crate) fn mm_dims(w: &DevMatrix<'_>, n: usize) -> Result<MmDims> {
    let (m, k) = (w.rows, w.cols);
    let tc = ty_code(w.ty).ok_or_else(|| anyhow!("mat_mul: {:?} is not a weight type", w.ty))?;
    let rb = w.ty.row_bytes(k).map_err(|e| anyhow!("mat_mul: {e}"))? as i64;
    i32_of(n * k, "n * k")?;
    Ok(MmDims {
        tc,
        rb,
        mi: i32_of(m, "m")?,
        ki: i32_of(k, "k")?,
        ni: i32_of(n, "n")?,
    })
}

/// Grid of the warp-per-row kernels: activation-row groups fastest, then
/// the job table's `ctas` CTAs of 8 weight rows (warps, 256 threads).
pub(crate) fn mv_grid(n: usize, ctas: u32) -> Result<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (u32::try_from(n.div_ceil(MV_ROWS))?, ctas, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// The kernels' JobMaps (common.cuh): one tensor map per job, by which the
/// copy engine moves a raw superchunk (a CTA's rows x 8 blocks) in one bulk
/// tensor copy (the wgmma GEMM, the batched-decode mq kernels).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct JobMaps([cudarc::driver::sys::CUtensorMap; MAX_MAT_JOBS]);
// SAFETY: plain data (opaque 64-byte-aligned tensor maps that hold device
// addresses, none into host memory), laid out as the kernels' struct
// JobMaps (MM_JOBS = MAX_MAT_JOBS maps of 128 bytes).
unsafe impl cudarc::driver::DeviceRepr for JobMaps {}

impl JobMaps {
    /// All zeros: for launches whose kernels copy no weights by tensor
    /// map (devices before sm_90).
    pub(crate) fn none() -> Self {
        JobMaps([cudarc::driver::sys::CUtensorMap { opaque: [0; 16] }; MAX_MAT_JOBS])
    }
}

/// The geometry of one job's tensor map (`m` rows of k / 32 blocks of `bs`
/// bytes, k a multiple of 256): dims (u64 per row, rows), the row stride in
/// bytes, the box (u64, rows) = one raw superchunk of the CTA's 128 `mt`
/// rows (8 blocks: `bs` u64). The driver's limits: the stride and the box's
/// row bytes multiples of 16, box sides at most 256.
pub(crate) fn wr_map_geometry(
    m: usize,
    k: usize,
    bs: usize,
    mt: usize,
) -> ([u64; 2], u64, [u32; 2]) {
    let row_bytes = (k / 32 * bs) as u64;
    (
        [row_bytes / 8, m as u64],
        row_bytes,
        [bs as u32, (128 * mt) as u32],
    )
}

/// Tensor maps of a job table's weights (16-byte aligned, rows of k / 32
/// blocks of `bs` bytes, k a multiple of 256), for CTAs of 128 `mt` rows:
/// 2-D u64 elements as wr_map_geometry says, no swizzle (a box lands as
/// the raw stage's rows of 8 `bs` bytes), zeros past the last row.
pub(crate) fn job_maps(table: &MmJobs, k: usize, bs: usize, mt: usize) -> Result<JobMaps> {
    use cudarc::driver::sys;
    let mut maps = JobMaps::none();
    for (j, (addr, m)) in table.weights().enumerate() {
        let (dims, stride, boxd) = wr_map_geometry(m, k, bs, mt);
        crate::backend::cuda::device::launch::encode_tiled_map(
            &mut maps.0[j],
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT64,
            addr,
            (&dims, &[stride], &boxd),
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            &|| format!("mat_mul: job {j}'s weights ({m} rows, k {k}, {bs}-byte blocks)"),
        )?;
    }
    Ok(maps)
}

/// A MatMuls job table (MmJobs in common.cuh, same layout): job j's
/// weights and output addresses, rows, and the end of its CTA range.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct MmJobs {
    w: [u64; MAX_MAT_JOBS],
    out: [u64; MAX_MAT_JOBS],
    /// The L2 read-ahead's progress word, or 0 (ops/l2_ahead).
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
    pub(crate) fn weights(&self) -> impl Iterator<Item = (u64, usize)> + '_ {
        let count = (self.count.max(0) as usize).min(MAX_MAT_JOBS);
        (0..count).map(|j| (self.w[j], self.m[j].max(0) as usize))
    }

    /// Points job `j`'s output at device address `addr`.
    pub(crate) fn set_out(&mut self, j: usize, addr: u64) {
        self.out[j] = addr;
    }

    /// Points the one-row matvecs' progress marks (mv_mark) at device
    /// address `ptr`: job 0 starts at `mark` (256-byte units) of the
    /// step's weight stream.
    pub(crate) fn set_marks(&mut self, ptr: u64, mark: i32) {
        self.mark_ptr = ptr;
        self.mark = mark;
    }

    /// No weight prefetch before the wait (the L2 read-ahead fetches them).
    pub(crate) fn no_prefetch(&mut self) {
        self.prefetch = 0;
    }

    /// The table's bytes, as a kernel parameter passed by value (RawArgs).
    pub(crate) fn param_bytes(&self) -> Vec<u8> {
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
    pub(crate) fn set_add(&mut self, bits: i32) {
        self.add = bits;
    }
}

/// Whether split_sum_jobs can add the partials of `n` activation rows
/// four floats at a time: for every job (its rows, its output's address)
/// n * m a multiple of 4 and the output 16-byte aligned.
pub(crate) fn vec4_ok(n: usize, jobs: impl IntoIterator<Item = (usize, u64)>) -> bool {
    jobs.into_iter()
        .all(|(m, out)| (n * m).is_multiple_of(4) && out.is_multiple_of(16))
}

/// The default of the table's `mv_prefetch_mb`, for job tables built
/// without the table at hand (norm-ahead's launches).
const MV_PREFETCH_MB: usize = 4;

/// Whether a matvec launch prefetches its weights before waiting for the
/// previous kernel (MV_PREFETCH in matmul_fast.cu): quantized weights of at
/// most `mb` MiB in all (the table's `mv_prefetch_mb`). Measured on an H100
/// (tg128): prefetching every matrix: SmolLM2 Q4_0 +5%, 1B Q4_0 +1.6%, but
/// 8B Q4_0 -3.7% and 1B F16 -1.5% (there the early reads compete with the
/// previous kernel's); up to 16 MiB: SmolLM2 1,305 -> 1,367, 8B 365.5 ->
/// 361.4 (its q/k/v and o matrices are 14 and 9 MiB). Launches captured
/// with the L2 read-ahead drop it (`l2_record`).
fn mv_prefetch(jobs: &[MatJob<'_, Dev>], mb: usize) -> bool {
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
/// rows per CTA (grid y), and the total CTA count; the weight prefetch by
/// the default `mv_prefetch_mb` (`job_table_mb` takes the table's).
pub(crate) fn job_table(
    jobs: &mut [MatJob<'_, Dev>],
    rows_per_cta: usize,
    s: &std::sync::Arc<CudaStream>,
) -> Result<(MmJobs, u32)> {
    job_table_mb(jobs, rows_per_cta, s, MV_PREFETCH_MB)
}

/// `job_table` with the weight prefetch for launches of at most
/// `prefetch_mb` MiB of quantized weights.
pub(crate) fn job_table_mb(
    jobs: &mut [MatJob<'_, Dev>],
    rows_per_cta: usize,
    s: &std::sync::Arc<CudaStream>,
    prefetch_mb: usize,
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
    t.prefetch = mv_prefetch(jobs, prefetch_mb) as i32;
    Ok((t, u32::try_from(end)?))
}

#[cfg(test)]
mod tests {
    use super::{prefetch_wanted, vec4_ok};

    #[test]
    fn split_sum_jobs_needs_whole_float4s() {
        // q/k/v of the 8B at 64 rows: three jobs, 16-byte aligned outputs.
        let mut jobs = [
            (4096, 0x7000_0000u64),
            (1024, 0x7100_0000),
            (1024, 0x7200_0100),
        ];
        assert!(vec4_ok(64, jobs.iter().copied()));
        // An odd row count with an odd m: n * m not a multiple of 4.
        jobs[1].0 = 1023;
        assert!(!vec4_ok(3, jobs.iter().copied()));
        assert!(vec4_ok(4, jobs.iter().copied()));
        // An output only 4-byte aligned (a view into a larger buffer).
        jobs[2].1 += 4;
        assert!(!vec4_ok(4, jobs.iter().copied()));
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
