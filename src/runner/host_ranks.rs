//! Tensor parallelism on the host: a llama-family model split across
//! simulated ranks, each a thread with its own cpu backend (its own worker
//! pool and communicator), its own weights shard and its own KV cache
//! shard (its KV heads, every block). One `KvManager` outside plans the
//! blocks of all ranks; every step runs on every rank, rank 0 returns the
//! logits.

use crate::backend::cpu::CpuBackend;
use crate::backend::tp::local::{LocalComm, LocalGroup};
use crate::backend::tp::{Communicator, Layout, TpRank};
use crate::backend::{HostLogits, KvType, Mode};
use crate::dispatch::{Dispatcher, HostExec};
use crate::gguf::GgufFile;
use crate::kv::{KvGeometry, KvStorage};
use crate::model::{LlamaModel, StepInput};
use anyhow::{anyhow, Context, Result};
use std::sync::Arc;

/// The KV cache every rank holds a head-shard of.
#[derive(Clone, Copy, Debug)]
pub struct KvShape {
    pub n_layers: usize,
    pub n_blocks: usize,
    pub block_size: usize,
    pub ty: KvType,
}

/// A model split across `world` simulated ranks.
pub struct HostRanks {
    ranks: Vec<HostRank>,
    group: Arc<LocalGroup>,
    threads: usize,
}

struct HostRank {
    model: LlamaModel,
    dx: Dispatcher,
    storage: KvStorage,
    comm: Arc<LocalComm>,
}

impl HostRanks {
    /// Cuts `model` into `world` ranks for `mode` (its [`Layout`]); the
    /// ranks share `threads` cpu threads (None: every core) evenly, at
    /// least one each.
    pub fn new(
        g: &GgufFile,
        model: &LlamaModel,
        world: usize,
        mode: Mode,
        threads: Option<usize>,
        kv: KvShape,
    ) -> Result<HostRanks> {
        let group = LocalGroup::new(world)?;
        let total = match threads {
            Some(t) => t,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        let per_rank = (total / world).max(1);
        let mut ranks = Vec::with_capacity(world);
        for (rank, comm) in group.comms().into_iter().enumerate() {
            let t = TpRank {
                rank,
                world,
                layout: Layout::for_mode(mode),
                head: rank == 0,
            };
            let shard = model.shard(g, t)?;
            let comm = Arc::new(comm);
            let cpu = CpuBackend::new(Some(per_rank))?
                .with_comm(Arc::clone(&comm) as Arc<dyn Communicator>);
            let geo = KvGeometry::new(
                kv.n_layers,
                kv.n_blocks,
                kv.block_size,
                shard.cfg.n_kv_heads,
                shard.cfg.head_dim,
            )?
            .with_type(kv.ty)?;
            let storage =
                KvStorage::of(geo).with_context(|| format!("allocating rank {rank}'s KV cache"))?;
            ranks.push(HostRank {
                model: shard,
                dx: Dispatcher::new(vec![Box::new(cpu)], mode),
                storage,
                comm,
            });
        }
        Ok(HostRanks {
            ranks,
            group,
            threads: per_rank,
        })
    }

    pub fn world(&self) -> usize {
        self.ranks.len()
    }

    /// CPU threads of each rank.
    pub fn threads_per_rank(&self) -> usize {
        self.threads
    }

    /// Runs one step on every rank; rank 0's logits. A rank that fails
    /// releases the others (their collectives return errors); the error
    /// returned is the first rank's own failure, not the releases it caused.
    pub fn forward(&mut self, g: &GgufFile, input: &StepInput<'_>) -> Result<HostLogits> {
        let results: Vec<Result<HostLogits>> =
            std::thread::scope(|s| {
                let (first, rest) = self
                    .ranks
                    .split_first_mut()
                    .expect("a group has at least one rank");
                let handles: Vec<_> = rest
                    .iter_mut()
                    .map(|r| s.spawn(move || r.step(g, input)))
                    .collect();
                let mut out = vec![first.step(g, input)];
                for (i, h) in handles.into_iter().enumerate() {
                    out.push(h.join().unwrap_or_else(|_| {
                        Err(anyhow!("tensor-parallel rank {} panicked", i + 1))
                    }));
                }
                out
            });
        if results.iter().all(Result::is_ok) {
            return results.into_iter().next().expect("rank 0's result");
        }
        // Every rank has returned: the group can run the next step.
        self.group.reset();
        let mut errs: Vec<anyhow::Error> = results.into_iter().filter_map(Result::err).collect();
        let own = errs
            .iter()
            .position(|e| !format!("{e:#}").contains("collective abandoned"))
            .unwrap_or(0);
        Err(errs.swap_remove(own))
    }

    /// Copies KV block `src` to `dst` on every rank (copy on write).
    pub fn copy_block(&mut self, src: u32, dst: u32) -> Result<()> {
        for (i, r) in self.ranks.iter_mut().enumerate() {
            r.storage
                .copy_block(src, dst)
                .with_context(|| format!("rank {i}"))?;
        }
        Ok(())
    }

    /// Which backend ran each op kind on rank 0, and how often.
    pub fn report(&self) -> Vec<(String, String, u64)> {
        self.ranks[0].dx.report()
    }
}

impl HostRank {
    fn step(&mut self, g: &GgufFile, input: &StepInput<'_>) -> Result<HostLogits> {
        let rank = self.comm.rank();
        // Releases the other ranks if this one fails or panics.
        let guard = AbortOnDrop(Some(&*self.comm));
        let exec = HostExec {
            dx: &self.dx,
            gguf: g,
        };
        let res = self
            .model
            .forward_host(&exec, &mut self.storage, input)
            .with_context(|| format!("tensor-parallel rank {rank}"));
        match &res {
            Ok(_) => guard.disarm(),
            Err(e) => {
                self.comm.abort(&format!("{e:#}"));
                guard.disarm();
            }
        }
        res
    }
}

/// Aborts the group when dropped armed (a rank unwinding from a panic).
struct AbortOnDrop<'a>(Option<&'a LocalComm>);

impl AbortOnDrop<'_> {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for AbortOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.0 {
            c.abort("panicked");
        }
    }
}
