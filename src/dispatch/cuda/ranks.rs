//! A model split across GPUs (`--tensor-parallel N` with `--gpu`; the
//! runner loads each rank's shard, `runner/ranks.rs`): one cuda backend
//! per device, NCCL communicators between them
//! (`backend/cuda/ops/collective`), each rank a resident model of its
//! shard with its KV heads. Every step runs on every
//! rank at once, one thread each (the collectives meet in the middle);
//! rank 0's logits come back. Decode steps replay each rank's CUDA graph,
//! collectives included.

use crate::backend::cuda::{CudaBackend, NcclComm, TuningOverrides};
use crate::backend::GpuMode;
use crate::dispatch::{DeviceModel, HostLogits, StepInput, StepPaths};
use crate::sampler::DrawParams;
use anyhow::{anyhow, bail, Context, Result};

/// Opens devices 0..world as tensor-parallel ranks: a cuda backend each,
/// linked by NCCL (one communicator per backend, on its stream).
pub fn open_ranks(
    world: usize,
    gpu: GpuMode,
    tuning: &TuningOverrides,
) -> Result<Vec<CudaBackend>> {
    let backends: Vec<CudaBackend> = (0..world)
        .map(|r| CudaBackend::new_on(r, gpu, tuning))
        .collect::<Result<_>>()?;
    let comms = NcclComm::group(backends.iter().map(|b| b.stream().clone()).collect())?;
    for (b, c) in backends.iter().zip(comms) {
        b.set_comm(c)?;
    }
    Ok(backends)
}

/// The ranks' resident models (rank order) as one: every step runs on
/// all of them at once; rank 0's logits come back.
pub fn device_ranks(ranks: Vec<Box<dyn DeviceModel>>) -> Result<Box<dyn DeviceModel>> {
    if ranks.is_empty() {
        bail!("a tensor-parallel group needs at least one rank");
    }
    Ok(Box::new(DeviceRanks { ranks }))
}

/// The ranks on their devices.
struct DeviceRanks {
    ranks: Vec<Box<dyn DeviceModel>>,
}

impl DeviceRanks {
    /// Runs `f` on every rank at once (rank 0 on this thread); every
    /// rank's result, in rank order.
    fn each<R: Send>(
        &mut self,
        f: impl Fn(usize, &mut dyn DeviceModel) -> Result<R> + Sync,
    ) -> Vec<Result<R>> {
        let f = &f;
        std::thread::scope(|s| {
            let (first, rest) = self.ranks.split_first_mut().expect("at least one rank");
            let hs: Vec<_> = rest
                .iter_mut()
                .enumerate()
                .map(|(i, r)| s.spawn(move || f(i + 1, r.as_mut())))
                .collect();
            let mut out = vec![f(0, first.as_mut())];
            for (i, h) in hs.into_iter().enumerate() {
                out.push(
                    h.join().unwrap_or_else(|_| {
                        Err(anyhow!("tensor-parallel rank {} panicked", i + 1))
                    }),
                );
            }
            out
        })
    }
}

impl DeviceModel for DeviceRanks {
    fn placement(&self) -> String {
        format!(
            "{} tensor-parallel ranks, rank 0 in {}",
            self.ranks.len(),
            self.ranks[0].placement()
        )
    }
    fn report(&self) -> Vec<(String, String, u64)> {
        self.ranks[0].report()
    }
    fn profile(&self) -> Option<Vec<(String, u64, f64)>> {
        self.ranks[0].profile()
    }
    fn profiling(&self) -> bool {
        self.ranks[0].profiling()
    }
    fn note_host(&self, kind: &'static str, seconds: f64) {
        self.ranks[0].note_host(kind, seconds)
    }
    fn copy_block(&mut self, src: u32, dst: u32) -> Result<()> {
        for (i, r) in self.ranks.iter_mut().enumerate() {
            r.copy_block(src, dst)
                .with_context(|| format!("tensor-parallel rank {i}"))?;
        }
        Ok(())
    }
    fn copy_state(&mut self, _src: u32, _dst: u32) -> Result<()> {
        bail!("tensor-parallel ranks hold no recurrent states")
    }
    fn step(&mut self, input: &StepInput<'_>, decode: bool) -> Result<HostLogits> {
        let mut res = self.each(|i, r| {
            r.step(input, decode)
                .with_context(|| format!("tensor-parallel rank {i}"))
        });
        if let Some(e) = res.iter().position(Result::is_err) {
            return res.swap_remove(e);
        }
        res.swap_remove(0)
    }
    // Tokens are drawn on the host: the chained and masked device draws
    // are one device's.
    fn chains_tokens(&self, _rows: usize) -> bool {
        false
    }
    fn draws(&self, _p: &DrawParams, _vocab: usize) -> bool {
        false
    }
    fn enqueue_chained(
        &mut self,
        _input: &StepInput<'_>,
        _chain: bool,
        _draws: &[Option<(DrawParams, f64)>],
    ) -> Result<super::GreedyTicket> {
        bail!("tensor-parallel ranks draw their tokens on the host")
    }
    fn masks_rows(&self, _rows: usize) -> bool {
        false
    }
    fn step_draw(
        &mut self,
        _input: &StepInput<'_>,
        _draws: &[Option<(DrawParams, f64)>],
        _masks: &mut crate::sampler::RowMasks,
        _fill: &mut dyn FnMut(&mut crate::sampler::RowMasks),
    ) -> Result<Vec<u32>> {
        bail!("tensor-parallel ranks draw their tokens on the host")
    }
    fn chained_tokens(&self, _t: super::GreedyTicket) -> Result<Vec<u32>> {
        bail!("tensor-parallel ranks draw their tokens on the host")
    }
    fn cuda(&self) -> Option<&super::CudaExec> {
        None
    }
    fn step_paths(&self) -> StepPaths {
        self.ranks[0].step_paths()
    }
    fn kv_blocks(&self) -> usize {
        self.ranks[0].kv_blocks()
    }
}
