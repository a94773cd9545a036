//! A model resident on the cuda backend (`dispatch::load_device`): the whole-model
//! capability check, the weights uploaded, the KV cache allocated, and the
//! [`DeviceModel`] the runner drives its steps through.

use super::{CudaExec, DevKvCache, DevStore, GreedyTicket};
use crate::backend::cuda::{device_draws, draw_record, CudaBackend};
use crate::backend::{GpuMode, OpInfo};
use crate::dispatch::weights::HostStore;
use crate::dispatch::{DeviceLoad, DeviceModel, DeviceOptions, Exec, Graph, HostLogits, KvBlocks};
use crate::dispatch::{StepInput, StepPaths};
use crate::gguf::GgufFile;
use crate::sampler::DrawParams;
use anyhow::{bail, Context, Result};
use indicatif::ProgressBar;
use std::sync::Arc;

/// Opens the cuda backend (tuned by `opts.tuning`), checks that it can run
/// every op in `ops` (the model's [`OpInfo`]s) in `opts.mode`, uploads the
/// weights (progress on the bar `upload_bar` makes once the check passed)
/// and allocates the KV cache. Under `--gpu required` an op the backend
/// cannot run is an error naming it.
pub fn load<G: Graph>(
    gguf: &GgufFile,
    graph: G,
    host: &G::Weights<HostStore>,
    ops: &[OpInfo],
    opts: &DeviceOptions<'_>,
    upload_bar: &dyn Fn() -> ProgressBar,
) -> Result<DeviceLoad>
where
    G::Weights<DevStore>: Send,
{
    let cuda = CudaBackend::new_tuned(opts.gpu, opts.tuning)?;
    load_on(cuda, gguf, graph, host, ops, opts, upload_bar)
}

/// [`load`] on a backend already open (a tensor-parallel rank's, its
/// communicator set).
pub fn load_on<G: Graph>(
    cuda: CudaBackend,
    gguf: &GgufFile,
    graph: G,
    host: &G::Weights<HostStore>,
    ops: &[OpInfo],
    opts: &DeviceOptions<'_>,
    upload_bar: &dyn Fn() -> ProgressBar,
) -> Result<DeviceLoad>
where
    G::Weights<DevStore>: Send,
{
    for info in ops {
        if let Err(why) = cuda.capability(info, opts.mode) {
            let why = format!(
                "op {} ({:?}{}) cannot run on the cuda backend: {why}",
                info.kind,
                opts.mode,
                info.weight.map(|t| format!(", {t:?}")).unwrap_or_default()
            );
            if opts.gpu == GpuMode::Required {
                bail!("{why}");
            }
            return Ok(DeviceLoad::OpByOp(Box::new(cuda), why));
        }
    }
    tracing::info!("cuda: model on {}", cuda.device_description());
    let exec = CudaExec::new(Arc::new(cuda), opts.mode);
    let bar = upload_bar();
    let weights = exec.upload_weights(
        |mat, vec| G::map_weights::<DevStore>(host, mat, vec, &|i, _| bar.set_position(i as u64)),
        gguf,
    )?;
    bar.finish_and_clear();
    // The recurrent states first: an automatic KV size takes what they
    // leave.
    let states = match opts.states {
        Some(sg) => Some(
            super::DevStates::new(exec.backend(), sg)
                .context("allocating the recurrent state on the device")?,
        ),
        None => None,
    };
    // K and V of every layer, f16.
    let per_block = 4
        * opts.n_layers
        * crate::kv::KvGeometry::new(
            opts.n_layers,
            2,
            opts.block_size,
            opts.n_kv_heads,
            opts.head_dim,
        )?
        .block_elems();
    let n_blocks = match opts.n_blocks {
        KvBlocks::Fixed(n) => n,
        KvBlocks::Auto { max } => {
            exec.backend().bind()?;
            let (free, total) = crate::backend::cuda::drv(
                cudarc::driver::result::mem_get_info(),
                "device memory info",
            )?;
            crate::dispatch::auto_kv_blocks(free, total, per_block, max)?
        }
    };
    let geo = crate::kv::KvGeometry::new(
        opts.n_layers,
        n_blocks,
        opts.block_size,
        opts.n_kv_heads,
        opts.head_dim,
    )?;
    let mut kv = DevKvCache::new(exec.backend(), geo, opts.max_seq_blocks)
        .context("allocating the KV cache on the device")?;
    if let Some(st) = states {
        kv = kv.with_states(st);
    }
    Ok(DeviceLoad::Device(Box::new(CudaModel {
        exec,
        weights,
        kv,
        graph,
        recs: Vec::new(),
    })))
}

/// The model on the device: its executor, weights and KV cache.
struct CudaModel<G: Graph> {
    exec: CudaExec,
    weights: G::Weights<DevStore>,
    kv: DevKvCache,
    graph: G,
    /// The draw records of the step being enqueued (reused step to step).
    recs: Vec<u32>,
}

impl<G: Graph> DeviceModel for CudaModel<G>
where
    G::Weights<DevStore>: Send,
{
    fn placement(&self) -> String {
        format!(
            "cuda device memory, {}",
            self.exec.backend().device_description()
        )
    }
    fn report(&self) -> Vec<(String, String, u64)> {
        self.exec.report()
    }
    fn profile(&self) -> Option<Vec<(String, u64, f64)>> {
        self.exec.profile()
    }
    fn profiling(&self) -> bool {
        self.exec.profiling()
    }
    fn note_host(&self, kind: &'static str, seconds: f64) {
        self.exec.note_host(kind, seconds)
    }
    fn copy_block(&mut self, src: u32, dst: u32) -> Result<()> {
        self.kv.copy_block(self.exec.backend(), src, dst)
    }
    fn copy_state(&mut self, src: u32, dst: u32) -> Result<()> {
        self.kv.copy_state(self.exec.backend(), src, dst)
    }
    fn step(&mut self, input: &StepInput<'_>, decode: bool) -> Result<HostLogits> {
        let (graph, weights) = (&self.graph, &self.weights);
        // A pure decode step (one row per sequence, all logits) replays a
        // captured CUDA graph; anything else runs op by op.
        // Every step's ops carry the fusion pass's annotations
        // (backend/cuda/fusion.rs), planned once per step shape.
        if decode && !input.hidden && self.exec.graphable(input.tokens.len()) {
            // (`Graph::forward` zeroes them on the other path.)
            self.exec.reset_states(&mut self.kv, input.fresh_slots)?;
            self.exec
                .decode_step(graph.vocab(), input, &mut self.kv, &mut |e, kv, bufs| {
                    e.forward_fused(graph, weights, kv, bufs)
                })
        } else {
            self.exec.count_path(|p| match decode {
                true => p.eager += 1,
                false => p.prefill += 1,
            });
            let (n, rows) = (input.tokens.len(), input.logit_rows);
            let rows_all = rows.len() == n && rows.iter().enumerate().all(|(i, &r)| r == i);
            let shape = (n, rows.len(), rows_all, input.hidden);
            let planned = self.exec.plan_step(graph, weights, &self.kv, shape);
            self.exec.begin_step(planned);
            let r = graph.forward(weights, &self.exec, &mut self.kv, input);
            self.exec.begin_step(None);
            r
        }
    }
    fn chains_tokens(&self, rows: usize) -> bool {
        self.exec.backend().tuning.runtime.greedy_chain && self.exec.graphable(rows)
    }
    fn draws(&self, p: &DrawParams, vocab: usize) -> bool {
        device_draws(p, vocab)
    }
    fn enqueue_chained(
        &mut self,
        input: &StepInput<'_>,
        chain: bool,
        draws: &[Option<(DrawParams, f64)>],
    ) -> Result<GreedyTicket> {
        // No records when every row is greedy: the graph's greedy rule.
        self.recs.clear();
        if !draws.iter().all(Option::is_none) {
            self.recs.extend(
                draws
                    .iter()
                    .flat_map(|d| draw_record(d.as_ref().map(|(p, u)| (p, *u)), false)),
            );
        }
        self.exec.reset_states(&mut self.kv, input.fresh_slots)?;
        let (graph, weights) = (&self.graph, &self.weights);
        self.exec.decode_step_greedy(
            graph.vocab(),
            input,
            &mut self.kv,
            &mut |e, kv, bufs| e.forward_fused(graph, weights, kv, bufs),
            chain,
            &self.recs,
        )
    }
    fn step_draw(
        &mut self,
        input: &StepInput<'_>,
        draws: &[Option<(DrawParams, f64)>],
        masks: &mut crate::sampler::RowMasks,
        fill: &mut dyn FnMut(&mut crate::sampler::RowMasks),
    ) -> Result<Vec<u32>> {
        self.exec.reset_states(&mut self.kv, input.fresh_slots)?;
        let (graph, weights) = (&self.graph, &self.weights);
        self.exec.decode_step_draw(
            graph.vocab(),
            input,
            &mut self.kv,
            &mut |e, kv, bufs| e.forward_fused(graph, weights, kv, bufs),
            draws,
            masks,
            fill,
        )
    }
    fn masks_rows(&self, rows: usize) -> bool {
        self.chains_tokens(rows)
    }
    fn chained_tokens(&self, t: GreedyTicket) -> Result<Vec<u32>> {
        self.exec.greedy_wait(t)
    }
    fn cuda(&self) -> Option<&CudaExec> {
        Some(&self.exec)
    }
    fn step_paths(&self) -> StepPaths {
        self.exec.step_paths()
    }
    fn kv_blocks(&self) -> usize {
        self.kv.geo.n_blocks
    }
}
