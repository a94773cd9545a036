//! Tensor-parallel collectives on the device (`backend::tp`): NCCL, through
//! cudarc, moves the data on the backend's stream (so a decode graph
//! captures it with the step's kernels); two kernels here do the
//! arithmetic, in the order the cpu's in-process group does it, so a rank
//! on the device gives the cpu rank's bits.
//!
//! * `AllGather`: `ncclAllGather` into the arena (rank-major (world, n, w)),
//!   then `tp_interleave` writes (or adds) out (n, world * w).
//! * `AllReduce` in rank order (`deterministic`): `ncclAllGather` of the
//!   partial sums, then `tp_sum_ranks` adds `((p0 + p1) + ...)` into out.
//!   The all-gather only moves bits, so NCCL's algorithm and protocol
//!   cannot change the result: nothing to pin.
//! * `AllReduce` in any order (`fast`): `ncclAllReduce` (NCCL's own ring or
//!   tree), then the sum is added into out.

use super::super::device::launch::arena3;
use super::super::device::memory::Dev;
use super::super::{drv, grid_1d, i32_of, CudaBackend};
use crate::backend::tp::{Communicator, ReduceOrder};
use crate::backend::validate;
use anyhow::{anyhow, bail, ensure, Result};
use cudarc::driver::{CudaStream, CudaView, CudaViewMut, PushKernelArg};
use std::sync::Arc;

/// One rank's NCCL communicator, bound to its backend's stream.
pub struct NcclComm {
    comm: cudarc::nccl::Comm,
}

// SAFETY: an ncclComm_t may be used from any thread, one call at a time;
// the backend issues every collective under its run lock, on its one
// stream.
unsafe impl Send for NcclComm {}
// SAFETY: as above: shared references only reach NCCL through the
// backend's serialized runs.
unsafe impl Sync for NcclComm {}

/// Whether libnccl can be loaded (cudarc panics on first use of a missing
/// library otherwise). The pip package `nvidia-nccl-cu13` ships it as
/// `libnccl.so.2`; cudarc looks for `libnccl.so`, so a link by that name
/// must be on the library path.
pub fn nccl_present() -> bool {
    // SAFETY: only tries to dlopen libnccl by its candidate names.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

impl NcclComm {
    /// One communicator per stream, rank i on `streams[i]`'s device (one
    /// process, one thread per GPU: `ncclCommInitAll`). NVLink multicast
    /// (NVLS) stays off: `NCCL_NVLS_ENABLE=0` is set for the process first.
    pub fn group(streams: Vec<Arc<CudaStream>>) -> Result<Vec<NcclComm>> {
        if !nccl_present() {
            bail!(
                "NCCL (libnccl.so) was not found on the library path; tensor parallel on GPUs \
                 needs it (pip's nvidia-nccl ships libnccl.so.2: link it as libnccl.so)"
            );
        }
        if std::env::var("NCCL_NVLS_ENABLE").as_deref() != Ok("0") {
            // Set before NCCL reads it; main() sets it at start already.
            std::env::set_var("NCCL_NVLS_ENABLE", "0");
        }
        let n = streams.len();
        let comms = cudarc::nccl::Comm::from_devices(streams)
            .map_err(|e| anyhow!("NCCL: creating {n} communicators: {e:?}"))?;
        Ok(comms.into_iter().map(|comm| NcclComm { comm }).collect())
    }
}

/// NCCL on device buffers, on the backend's stream (the one the
/// communicator was made with).
impl Communicator<Dev> for NcclComm {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn world(&self) -> usize {
        self.comm.world_size()
    }

    fn all_gather(&self, x: CudaView<'_, f32>, mut parts: CudaViewMut<'_, f32>) -> Result<()> {
        ensure!(
            parts.len() == x.len() * self.world(),
            "all_gather: {} values into {}",
            x.len(),
            parts.len()
        );
        self.comm
            .all_gather(&x, &mut parts)
            .map_err(|e| anyhow!("NCCL all_gather of {} values: {e:?}", x.len()))?;
        Ok(())
    }

    fn all_reduce_sum(&self, x: CudaView<'_, f32>, mut sum: CudaViewMut<'_, f32>) -> Result<()> {
        ensure!(
            sum.len() == x.len(),
            "all_reduce: {} values into {}",
            x.len(),
            sum.len()
        );
        self.comm
            .all_reduce(&x, &mut sum, &cudarc::nccl::ReduceOp::Sum)
            .map_err(|e| anyhow!("NCCL all_reduce of {} values: {e:?}", x.len()))?;
        Ok(())
    }
}

impl CudaBackend {
    /// Makes this backend rank `comm.rank()` of a tensor-parallel group:
    /// the collectives run through `comm` (once; a second call is an error).
    pub fn set_comm(&self, comm: NcclComm) -> Result<()> {
        self.comm
            .set(comm)
            .map_err(|_| anyhow!("cuda backend: already a tensor-parallel rank"))
    }

    fn nccl(&self) -> Result<&NcclComm> {
        self.comm
            .get()
            .ok_or_else(|| anyhow!("cuda backend: a collective on a backend that is no rank"))
    }

    /// `AllGather`: x (n, w) of every rank into out (n, world * w); with
    /// `add`, added.
    pub(crate) fn d_all_gather(
        &self,
        x: &CudaView<'_, f32>,
        n: usize,
        out: &mut CudaViewMut<'_, f32>,
        add: bool,
    ) -> Result<()> {
        let c = self.nccl()?;
        let world = c.world();
        validate::all_gather(x.len(), n, out.len(), world)?;
        let mut arena = self.arena(&[out.len() * 4])?;
        arena3::<f32, u8, u8, ()>(&mut arena, (out.len(), 0, 0), |parts, _, _| {
            c.all_gather(x.slice(..), parts.slice_mut(..))?;
            self.tp_interleave(&parts.slice(..), n, world, out, add)
        })
    }

    /// parts (world, n, w) rank-major into out (n, world * w); with `add`,
    /// `out + part` (the cpu's `ops::collective::interleave`).
    pub fn tp_interleave(
        &self,
        parts: &CudaView<'_, f32>,
        n: usize,
        world: usize,
        out: &mut CudaViewMut<'_, f32>,
        add: bool,
    ) -> Result<()> {
        ensure!(
            n > 0 && world > 0 && parts.len() == out.len() && parts.len().is_multiple_of(n * world),
            "tp_interleave: {} parts into {} for {n} rows of {world} ranks",
            parts.len(),
            out.len()
        );
        if out.is_empty() {
            return Ok(());
        }
        let w = out.len() / (n * world);
        let (ni, wi, ri) = (i32_of(n, "n")?, i32_of(w, "w")?, i32_of(world, "world")?);
        let addi = add as i32;
        let cfg = grid_1d(out.len(), 256)?;
        let mut b = self.stream().launch_builder(self.func("tp_interleave")?);
        b.arg(parts)
            .arg(&mut *out)
            .arg(&ni)
            .arg(&wi)
            .arg(&ri)
            .arg(&addi);
        // SAFETY: matches tp_interleave; parts and out hold world*n*w
        // values (checked above).
        drv(unsafe { b.launch(cfg) }, "tp_interleave: launch")?;
        Ok(())
    }

    /// parts (world, len): `out += ((p0 + p1) + ...)` (the cpu's
    /// `ops::collective::sum_ranks`).
    pub fn tp_sum_ranks(
        &self,
        parts: &CudaView<'_, f32>,
        world: usize,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let len = out.len();
        ensure!(
            world > 0 && parts.len() == len * world,
            "tp_sum_ranks: {} parts for {len} values of {world} ranks",
            parts.len()
        );
        if len == 0 {
            return Ok(());
        }
        let (lenl, wi) = (len as i64, i32_of(world, "world")?);
        let cfg = grid_1d(len, 256)?;
        let mut b = self.stream().launch_builder(self.func("tp_sum_ranks")?);
        b.arg(parts).arg(&mut *out).arg(&lenl).arg(&wi);
        // SAFETY: matches tp_sum_ranks; parts holds world*len values, out
        // len (checked above).
        drv(unsafe { b.launch(cfg) }, "tp_sum_ranks: launch")?;
        Ok(())
    }

    /// `AllReduce`: out += Σ_r x_r.
    pub(crate) fn d_all_reduce(
        &self,
        x: &CudaView<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
        order: ReduceOrder,
    ) -> Result<()> {
        let c = self.nccl()?;
        let world = c.world();
        let len = x.len();
        validate::same_len("all_reduce", &[len, out.len()])?;
        if len == 0 {
            return Ok(());
        }
        // Fixed: every rank's partials, summed here in rank order. Any:
        // NCCL's sum, added here.
        let (parts_len, sum_world) = match order {
            ReduceOrder::Fixed => (len * world, world),
            ReduceOrder::Any => (len, 1),
        };
        let mut arena = self.arena(&[parts_len * 4])?;
        arena3::<f32, u8, u8, ()>(&mut arena, (parts_len, 0, 0), |parts, _, _| {
            match order {
                ReduceOrder::Fixed => c.all_gather(x.slice(..), parts.slice_mut(..))?,
                ReduceOrder::Any => c.all_reduce_sum(x.slice(..), parts.slice_mut(..))?,
            }
            self.tp_sum_ranks(&parts.slice(..), sum_world, out)
        })
    }
}
