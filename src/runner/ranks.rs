//! `Runner::load` for `--tensor-parallel N`: the model cut into ranks on
//! GPUs (`dispatch::cuda::open_ranks`, each rank's shard loaded on its
//! device, `dispatch::cuda::device_ranks`) or on the host's simulated
//! ranks (`runner/host_ranks.rs`).

use super::{prefault, progress_bar, Compute, Runner, RunnerOptions};
use crate::backend::tp::{Layout, TpRank};
use crate::backend::GpuMode;
use crate::dispatch::{DeviceLoad, DeviceModel, DeviceOptions, KvBlocks};
use crate::gguf::GgufFile;
use crate::kv::KvManager;
use crate::model::arch::llama::LlamaGraph;
use crate::model::LlamaModel;
use crate::model::Model;
use crate::runner::host_ranks::{HostRanks, KvShape};
use anyhow::{bail, Context, Result};

impl Runner {
    /// `Runner::load` for `--tensor-parallel N`: ranks on GPUs 0..N
    /// (`--gpu`; under `auto` the host's simulated ranks when that fails),
    /// or the host's simulated ranks (`host_ranks.rs`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn load_ranks(
        gguf: GgufFile,
        model: Model,
        opts: &RunnerOptions,
        n: usize,
        dev_blocks: KvBlocks,
        n_blocks: usize,
        name: &str,
    ) -> Result<Self> {
        let Model::Llama(m) = &model else {
            bail!(
                "--tensor-parallel {n}: {:?} models (hybrid) do not split yet; llama-family models do",
                model.cfg().arch
            );
        };
        let n_kv_layers = model.n_kv_layers();
        if opts.gpu != GpuMode::Off {
            let cfg = model.cfg();
            let dev = DeviceOptions {
                gpu: opts.gpu,
                mode: opts.mode,
                tuning: &opts.tuning,
                n_blocks: dev_blocks,
                max_seq_blocks: cfg.context_length.div_ceil(opts.block_size),
                block_size: opts.block_size,
                n_kv_heads: cfg.n_kv_heads,
                head_dim: cfg.head_dim,
                n_layers: n_kv_layers,
                states: None,
            };
            let bar = || {
                progress_bar(
                    opts.progress,
                    cfg.n_layers as u64,
                    "uploading {msg} to the GPUs [{bar:30}] {pos}/{len} layers",
                    name,
                )
            };
            let res = if opts.kv_type != crate::backend::KvType::F16 {
                Err(anyhow::anyhow!(
                    "the cuda backend keeps its KV cache in f16, not {}",
                    opts.kv_type
                ))
            } else {
                load_device_ranks(&gguf, m, n, &dev, &bar)
            };
            match res {
                Ok(d) => {
                    return Ok(Runner {
                        kv: KvManager::new(d.kv_blocks(), opts.block_size)?,
                        gguf,
                        model,
                        compute: Compute::Device(d),
                        hybrid: None,
                        n_threads: 1,
                    })
                }
                Err(e) if opts.gpu == GpuMode::Required => {
                    return Err(e.context(format!("--gpu required --tensor-parallel {n}")))
                }
                Err(e) => eprintln!(
                    "warning: --gpu auto --tensor-parallel {n}: {e:#}; running the ranks on the cpu"
                ),
            }
        }
        let bar = progress_bar(opts.progress, 1, "", name);
        prefault(&gguf, &bar)?;
        bar.finish_and_clear();
        let kv_shape = KvShape {
            n_layers: n_kv_layers,
            n_blocks,
            block_size: opts.block_size,
            ty: opts.kv_type,
        };
        let ranks = HostRanks::new(&gguf, m, n, opts.mode, opts.threads, kv_shape)
            .with_context(|| format!("--tensor-parallel {n}"))?;
        let n_threads = ranks.threads_per_rank() * n;
        Ok(Runner {
            kv: KvManager::new(n_blocks, opts.block_size)?,
            gguf,
            model,
            compute: Compute::Ranks(Box::new(ranks)),
            hybrid: None,
            n_threads,
        })
    }
}

/// Opens GPUs 0..world as ranks and loads rank r's shard of `model` on
/// device r. The KV cache has the same blocks on every rank (rank 0's
/// automatic size, or `opts.n_blocks`).
fn load_device_ranks(
    gguf: &GgufFile,
    model: &LlamaModel,
    world: usize,
    opts: &DeviceOptions<'_>,
    upload_bar: &dyn Fn() -> indicatif::ProgressBar,
) -> Result<Box<dyn DeviceModel>> {
    let backends = crate::dispatch::cuda::open_ranks(world, opts.gpu, opts.tuning)?;
    let mut ranks = Vec::with_capacity(world);
    let mut n_blocks = opts.n_blocks;
    for (rank, be) in backends.into_iter().enumerate() {
        let t = TpRank {
            rank,
            world,
            layout: Layout::for_mode(opts.mode),
            head: true,
        };
        let shard = model.shard(gguf, t)?;
        let o = DeviceOptions {
            n_blocks,
            n_kv_heads: shard.cfg.n_kv_heads,
            states: None,
            ..*opts
        };
        let graph = LlamaGraph(shard.cfg.clone());
        let loaded = crate::dispatch::cuda::load_on(
            be,
            gguf,
            graph,
            &shard.weights,
            &shard.op_infos(),
            &o,
            upload_bar,
        )
        .with_context(|| format!("tensor-parallel rank {rank}"))?;
        let d = match loaded {
            DeviceLoad::Device(d) => d,
            DeviceLoad::OpByOp(_, why) => bail!("tensor-parallel rank {rank}: {why}"),
        };
        n_blocks = KvBlocks::Fixed(d.kv_blocks());
        ranks.push(d);
    }
    crate::dispatch::cuda::device_ranks(ranks)
}
