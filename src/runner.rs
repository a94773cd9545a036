//! The model runner: turns a step's work (which tokens of which sequences)
//! into batch inputs (positions, slot mapping, block tables), runs the
//! model, and returns logits per sequence.

use crate::backend::cpu::CpuBackend;
use crate::backend::{Backend, GpuMode, Mode};
use crate::dispatch::step_times::{mark, Point};
use crate::dispatch::{
    load_device, DeviceLoad, DeviceModel, DeviceOptions, Dispatcher, HostExec, HostLogits,
    KvBlocks, TuningOverrides,
};
use crate::gguf::GgufFile;
use crate::kv::{KvManager, RecurrentStates, SeqId};
use crate::model::arch::llama::LlamaGraph;
use crate::model::arch::qwen35_graph::Qwen35Graph;
use crate::model::{KvStorage, Model, ModelConfig, StepInput};
use crate::runner::host_ranks::HostRanks;
use anyhow::{bail, Context, Result};
use hybrid::HybridState;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::Path;

mod embed;
mod greedy;
pub mod host_ranks;
mod hybrid;
mod ranks;
pub use embed::{Pooling, EMBED_SEQ_BASE};

/// Which logits a sequence wants from a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsWanted {
    None,
    /// Only the last row of the sequence's chunk.
    Last,
    /// Every row (teacher forcing, perplexity).
    All,
}

/// One sequence's part of a step: `tokens` at positions
/// `start_pos .. start_pos + tokens.len()`. Earlier positions must already
/// be in the KV cache.
pub struct SeqWork<'a> {
    pub seq: SeqId,
    pub tokens: &'a [u32],
    pub start_pos: usize,
    pub logits: LogitsWanted,
}

/// A step's logits in one flat buffer: item `i` of the step's work owns
/// rows `spans[i]` of `(rows, vocab)`. One buffer instead of one vector per
/// sequence: a batch of 64 decode rows of a 128k vocabulary is 32 MiB, and
/// splitting it (or allocating it fresh) every step cost more host time
/// than the step's kernels (H100, 8B, batch 64). Device logits stay in the
/// page-locked buffer they were copied into, which goes back to the
/// backend's pool when this is dropped: drop it before the next step.
#[derive(Debug, Default)]
pub struct Logits {
    data: HostLogits,
    vocab: usize,
    spans: Vec<std::ops::Range<usize>>,
}

impl Logits {
    /// Work item `i`'s logits: (rows wanted, vocab) flattened (empty when
    /// it wanted none).
    pub fn seq(&self, i: usize) -> &[f32] {
        let r = &self.spans[i];
        &self.data.as_slice()[r.start * self.vocab..r.end * self.vocab]
    }
    /// Number of work items.
    pub fn len(&self) -> usize {
        self.spans.len()
    }
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }
    /// One vector per work item (copies, except for a single item).
    pub fn into_vecs(self) -> Vec<Vec<f32>> {
        if self.spans.len() == 1 {
            return vec![self.data.into_vec()];
        }
        (0..self.spans.len())
            .map(|i| self.seq(i).to_vec())
            .collect()
    }
}

#[derive(Clone, Debug)]
pub struct RunnerOptions {
    /// CPU threads (None: all cores).
    pub threads: Option<usize>,
    pub block_size: usize,
    /// KV capacity in tokens, over all sequences. None: on the host
    /// `HOST_KV_TOKENS`; on a device what its free memory holds after the
    /// weights (past a reserve, `dispatch::auto_kv_blocks`), at most
    /// `kv_seqs` sequences of the full context.
    pub kv_tokens: Option<usize>,
    /// The most sequences an automatic KV size is made for (`quire serve`:
    /// its `--max-running`).
    pub kv_seqs: usize,
    pub mode: Mode,
    /// Show a progress bar while loading.
    pub progress: bool,
    /// GPU use (h-cuda): off (default), auto or required.
    pub gpu: GpuMode,
    /// Overrides of the CUDA backend's tuning table (`--tuning FILE`;
    /// `check-exact` sets `matvec.prequant` and `matvec.norm_ahead`
    /// through them for its fused and unfused runners).
    pub tuning: TuningOverrides,
    /// Sequences that may hold a recurrent state at once (hybrid models
    /// only; each slot holds every Gated DeltaNet layer's state).
    pub state_slots: usize,
    /// Hybrid models: recurrent-state snapshots kept for prefix caching
    /// (each the size of a slot).
    pub state_snapshots: usize,
    /// How the KV cache stores K and V (`--kv-type`); the cuda backend
    /// keeps f16 only.
    pub kv_type: crate::backend::KvType,
    /// Tensor-parallel ranks (`--tensor-parallel`). None: the model whole,
    /// no ranks; Some(1) runs the rank machinery on one rank.
    pub tensor_parallel: Option<usize>,
}

impl Default for RunnerOptions {
    fn default() -> Self {
        RunnerOptions {
            threads: None,
            block_size: 16,
            kv_tokens: Some(HOST_KV_TOKENS),
            kv_seqs: 64,
            mode: Mode::Exact,
            progress: false,
            gpu: GpuMode::Off,
            tuning: Default::default(),
            state_slots: 16,
            state_snapshots: 0,
            kv_type: crate::backend::KvType::F16,
            tensor_parallel: None,
        }
    }
}

/// KV capacity in tokens on the host when none is given.
pub const HOST_KV_TOKENS: usize = 8192;

/// Where a step's ops run and where the KV cache lives.
pub enum Compute {
    /// Host memory: ops through the dispatcher (cpu, or per-op cuda with
    /// host slices under `--gpu auto` when the device path cannot run the
    /// model); KV cache in host memory.
    Host { dx: Dispatcher, storage: KvStorage },
    /// Tensor-parallel ranks on the host (`--tensor-parallel N`), each with
    /// its shard of the weights and of the KV cache's heads.
    Ranks(Box<HostRanks>),
    /// Device memory: weights, activations and KV cache on the GPU, behind
    /// the executor trait ([`load_device`]).
    Device(Box<dyn DeviceModel>),
}

pub struct Runner {
    pub gguf: GgufFile,
    pub model: Model,
    pub kv: KvManager,
    pub compute: Compute,
    /// Recurrent states (hybrid models, host memory).
    hybrid: Option<HybridState>,
    n_threads: usize,
}

impl Runner {
    pub fn load(path: &Path, opts: &RunnerOptions) -> Result<Self> {
        let gguf = GgufFile::open(path).with_context(|| format!("opening {}", path.display()))?;
        let cfg = ModelConfig::from_gguf(&gguf)
            .with_context(|| format!("reading the model config of {}", path.display()))?;
        let name = path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let bar = progress_bar(
            opts.progress,
            cfg.n_layers as u64,
            "loading {msg} [{bar:30}] {pos}/{len} layers",
            &name,
        );
        let model = Model::load(&gguf, cfg.clone(), &|i, _| bar.set_position(i as u64))?;
        let n_kv_layers = model.n_kv_layers();
        bar.finish_and_clear();
        if opts.block_size == 0 {
            bail!("block size must be at least 1");
        }
        // +1: physical block 0 is the null block.
        let n_blocks = opts
            .kv_tokens
            .unwrap_or(HOST_KV_TOKENS)
            .div_ceil(opts.block_size)
            + 1;
        // The device's size: what was asked, or what its memory holds.
        let dev_blocks = match opts.kv_tokens {
            Some(_) => KvBlocks::Fixed(n_blocks),
            None => KvBlocks::Auto {
                max: cfg
                    .context_length
                    .div_ceil(opts.block_size)
                    .saturating_mul(opts.kv_seqs.max(1))
                    .saturating_add(1),
            },
        };
        let host_kv = || {
            KvStorage::of(
                crate::kv::KvGeometry::new(
                    n_kv_layers,
                    n_blocks,
                    opts.block_size,
                    cfg.n_kv_heads,
                    cfg.head_dim,
                )?
                .with_type(opts.kv_type)?,
            )
        };
        if let Some(n) = opts.tensor_parallel {
            return Self::load_ranks(gguf, model, opts, n, dev_blocks, n_blocks, &name);
        }
        let mut host_backends: Vec<Box<dyn Backend>> = Vec::new();
        let quantized_kv = opts.kv_type != crate::backend::KvType::F16;
        match opts.gpu {
            GpuMode::Off => {}
            GpuMode::Required if quantized_kv => bail!(
                "--gpu required: the cuda backend keeps its KV cache in f16; \
                 --kv-type {} runs on the cpu (--gpu off), or use --kv-type f16",
                opts.kv_type
            ),
            GpuMode::Auto if quantized_kv => eprintln!(
                "warning: --gpu auto: the cuda backend keeps its KV cache in f16; \
                 running on the cpu for --kv-type {}",
                opts.kv_type
            ),
            GpuMode::Required | GpuMode::Auto => {
                match open_device(&gguf, &model, opts, dev_blocks, &name) {
                    Ok(DeviceLoad::Device(d)) => {
                        let kv = KvManager::new(d.kv_blocks(), opts.block_size)?;
                        return Ok(Runner {
                            gguf,
                            model,
                            kv,
                            compute: Compute::Device(d),
                            hybrid: HybridState::new(&cfg, opts.state_slots, opts.state_snapshots)?,
                            n_threads: 1,
                        });
                    }
                    // The device path cannot run this model (an op it does
                    // not support): under auto, per-op dispatch with host
                    // slices, cuda where it can and cpu elsewhere.
                    Ok(DeviceLoad::OpByOp(cuda, why)) => {
                        eprintln!("warning: --gpu auto: {why}; running op by op (cuda where supported, else cpu) with host memory");
                        host_backends.push(cuda);
                    }
                    Err(e) if opts.gpu == GpuMode::Required => {
                        return Err(
                            e.context("--gpu required: the CUDA backend cannot run this model")
                        )
                    }
                    Err(e) => {
                        eprintln!(
                            "warning: --gpu auto: no CUDA backend ({e:#}); running on the cpu"
                        )
                    }
                }
            }
        }
        // Touch every tensor page once so the first step does not pay the
        // page faults (and the bar reflects the real load time).
        let bar = progress_bar(opts.progress, 1, "", &name);
        prefault(&gguf, &bar)?;
        bar.finish_and_clear();
        let kv = KvManager::new(n_blocks, opts.block_size)?;
        let cpu = CpuBackend::new(opts.threads)?;
        let n_threads = cpu.n_threads();
        host_backends.push(Box::new(cpu));
        let dx = Dispatcher::new(host_backends, opts.mode);
        let hybrid = HybridState::new(&cfg, opts.state_slots, opts.state_snapshots)?;
        let mut storage = host_kv()?;
        if let Some(h) = &hybrid {
            let g = h.geometry();
            let st = RecurrentStates::new(g.n_layers, g.n_slots, g.conv_len, g.ssm_len)
                .context("allocating the recurrent state")?;
            storage = storage.with_states(st);
        }
        Ok(Runner {
            gguf,
            model,
            kv,
            compute: Compute::Host { dx, storage },
            hybrid,
            n_threads,
        })
    }

    /// Which backend ran each op kind, and how often.
    pub fn backend_report(&self) -> Vec<(String, String, u64)> {
        match &self.compute {
            Compute::Host { dx, .. } => dx.report(),
            Compute::Ranks(r) => r.report(),
            Compute::Device(d) => d.report(),
        }
    }

    /// Decode batch sizes up to `max` that do not run as CUDA graphs on
    /// this device (empty on the host, where none does).
    pub fn decode_sizes_without_graphs(&self, max: usize) -> Vec<usize> {
        match &self.compute {
            Compute::Device(d) => match d.cuda() {
                Some(c) => (1..=max).filter(|&b| !c.graphable(b)).collect(),
                None => Vec::new(),
            },
            Compute::Host { .. } | Compute::Ranks(_) => Vec::new(),
        }
    }

    /// Tokens the KV cache holds (the null block excluded).
    pub fn kv_capacity_tokens(&self) -> usize {
        self.kv.num_blocks().saturating_sub(1) * self.kv.block_size()
    }

    /// A device's steps so far by how they ran (None on the host, whose
    /// steps all run op by op).
    pub fn step_paths(&self) -> Option<crate::dispatch::StepPaths> {
        match &self.compute {
            Compute::Host { .. } | Compute::Ranks(_) => None,
            Compute::Device(d) => Some(d.step_paths()),
        }
    }

    /// Per op kind (kind, count, seconds) on the device, when profiling
    /// (QUIRE_PROFILE_OPS=1).
    pub fn op_profile(&self) -> Option<Vec<(String, u64, f64)>> {
        match &self.compute {
            Compute::Host { .. } | Compute::Ranks(_) => None,
            Compute::Device(d) => d.profile(),
        }
    }

    /// Where the model's tensors live (host, or which device).
    pub fn placement(&self) -> String {
        match &self.compute {
            Compute::Host { .. } => "host memory".into(),
            Compute::Ranks(r) => format!(
                "host memory, {} tensor-parallel ranks of {} threads",
                r.world(),
                r.threads_per_rank()
            ),
            Compute::Device(d) => d.placement(),
        }
    }

    /// Copies physical KV block `src` to `dst` in every layer.
    pub fn copy_block(&mut self, src: u32, dst: u32) -> Result<()> {
        match &mut self.compute {
            Compute::Host { storage, .. } => storage.copy_block(src, dst),
            Compute::Ranks(r) => r.copy_block(src, dst),
            Compute::Device(d) => d.copy_block(src, dst),
        }
    }

    pub fn config(&self) -> &ModelConfig {
        self.model.cfg()
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs one step over several sequences, allocating their KV blocks in
    /// the runner's own manager first. Returns, per work item, its logits:
    /// (rows wanted, vocab) flattened.
    pub fn step(&mut self, work: &[SeqWork<'_>]) -> Result<Vec<Vec<f32>>> {
        Ok(self.step_flat(work)?.into_vecs())
    }

    /// Like [`Runner::step`], with the logits in one buffer (no copy per
    /// sequence).
    pub fn step_flat(&mut self, work: &[SeqWork<'_>]) -> Result<Logits> {
        mark(Point::StepStart);
        let t_alloc = std::time::Instant::now();
        let ctx = self.model.cfg().context_length;
        for w in work {
            let end = w.start_pos + w.tokens.len();
            if end > ctx {
                bail!(
                    "sequence {:?} reaches position {end}, past the model's context length {ctx}",
                    w.seq
                );
            }
            let copies = self
                .kv
                .allocate(w.seq, end)
                .with_context(|| format!("allocating KV blocks for {end} tokens of {:?}", w.seq))?;
            for c in copies {
                self.copy_block(c.src, c.dst)?;
            }
        }
        mark(Point::KvDone);
        if let Compute::Device(d) = &self.compute {
            if d.profiling() {
                d.note_host("host: kv allocate", t_alloc.elapsed().as_secs_f64());
            }
        }
        let r = forward_batch(
            &self.model,
            &self.gguf,
            &mut self.compute,
            self.hybrid.as_mut(),
            &self.kv,
            work,
            false,
        );
        mark(Point::StepEnd);
        r
    }

    /// Like [`Runner::step`], but with blocks already allocated (and any
    /// copy-on-write copies done) in `kv`, a manager owned by someone else
    /// (the serving scheduler). Allocates nothing.
    pub fn step_with_kv(&mut self, kv: &KvManager, work: &[SeqWork<'_>]) -> Result<Logits> {
        forward_batch(
            &self.model,
            &self.gguf,
            &mut self.compute,
            self.hybrid.as_mut(),
            kv,
            work,
            false,
        )
    }

    /// Releases a sequence's KV blocks. Freeing a sequence that holds no
    /// blocks (never allocated, or already freed) is a no-op.
    pub fn free(&mut self, seq: SeqId) {
        if self.kv.contains(seq) {
            // Cannot fail for a sequence the manager holds.
            let _ = self.kv.free(seq);
        }
        self.release_state(seq);
    }

    /// Gives back a sequence's recurrent state slot (hybrid models; a no-op
    /// otherwise). Callers that manage KV blocks themselves (the serving
    /// engine) call this when a sequence ends.
    pub fn release_state(&mut self, seq: SeqId) {
        if let Some(h) = &mut self.hybrid {
            h.release(seq);
        }
    }

    /// Hybrid models: recurrent-state snapshots held beside the slots.
    pub fn state_snapshots(&self) -> usize {
        self.hybrid.as_ref().map_or(0, |h| h.n_snapshots())
    }

    /// Copies state slot `src` into `dst` in every recurrent layer.
    fn copy_state(&mut self, src: u32, dst: u32) -> Result<()> {
        match &mut self.compute {
            Compute::Host { storage, .. } => storage.states_mut()?.copy_slot(src, dst),
            Compute::Ranks(_) => bail!("tensor-parallel ranks hold no recurrent states"),
            Compute::Device(d) => d.copy_state(src, dst),
        }
    }

    /// Hybrid models: `seq` resumes from state snapshot `snap` (a
    /// prefix-cache hit): a fresh slot of its own, filled with the snapshot.
    pub fn restore_state(&mut self, seq: SeqId, snap: u32) -> Result<()> {
        let h = self
            .hybrid
            .as_mut()
            .context("restore_state: not a hybrid model")?;
        let src = h.snapshot_slot(snap)?;
        let dst = h.take_slot(seq)?;
        self.copy_state(src, dst)
            .with_context(|| format!("restoring state snapshot {snap} for {seq}"))
    }

    /// Hybrid models: keeps `seq`'s current state as snapshot `snap`.
    pub fn save_state(&mut self, seq: SeqId, snap: u32) -> Result<()> {
        let h = self
            .hybrid
            .as_ref()
            .context("save_state: not a hybrid model")?;
        let (src, dst) = (h.slot_of(seq)?, h.snapshot_slot(snap)?);
        self.copy_state(src, dst)
            .with_context(|| format!("saving {seq}'s state as snapshot {snap}"))
    }

    /// Hybrid models: `child` continues from `parent`'s current state (a
    /// fork): a slot of its own holding a copy. The KV blocks are the
    /// caller's (`KvManager::fork`).
    pub fn fork_state(&mut self, parent: SeqId, child: SeqId) -> Result<()> {
        let h = self
            .hybrid
            .as_mut()
            .context("fork_state: not a hybrid model")?;
        let src = h.slot_of(parent)?;
        let dst = h.take_slot(child)?;
        self.copy_state(src, dst)
            .with_context(|| format!("forking {parent}'s state to {child}"))
    }

    /// Recurrent state slots, for a hybrid model (each running sequence
    /// holds one).
    pub fn state_slots(&self) -> Option<usize> {
        self.hybrid.as_ref().map(|h| h.n_slots())
    }
}

/// A step's batch inputs built from the block tables of `kv`: slot
/// mapping, positions, which rows want logits (`wanted`: per work item).
struct BatchInput<'k> {
    tokens: Vec<u32>,
    positions: Vec<u32>,
    row_seq: Vec<u32>,
    slots: Vec<u32>,
    logit_rows: Vec<usize>,
    wanted: Vec<usize>,
    tables: Vec<&'k [u32]>,
    state_slots: Vec<u32>,
    fresh_slots: Vec<u32>,
    hidden: bool,
}

impl BatchInput<'_> {
    fn input(&self) -> StepInput<'_> {
        StepInput {
            tokens: &self.tokens,
            positions: &self.positions,
            row_seq: &self.row_seq,
            slots: &self.slots,
            block_tables: &self.tables,
            logit_rows: &self.logit_rows,
            state_slots: &self.state_slots,
            fresh_slots: &self.fresh_slots,
            hidden: self.hidden,
        }
    }
}

fn batch_input<'k>(
    cfg: &ModelConfig,
    kv: &'k KvManager,
    work: &[SeqWork<'_>],
) -> Result<BatchInput<'k>> {
    let ctx = cfg.context_length;
    let n_rows: usize = work.iter().map(|w| w.tokens.len()).sum();
    let mut tokens = Vec::with_capacity(n_rows);
    let mut positions = Vec::with_capacity(n_rows);
    let mut row_seq = Vec::with_capacity(n_rows);
    let mut slots = Vec::with_capacity(n_rows);
    let mut logit_rows = Vec::new();
    let mut wanted = Vec::with_capacity(work.len());
    let mut tables: Vec<&[u32]> = Vec::with_capacity(work.len());
    for (si, w) in work.iter().enumerate() {
        let n = w.tokens.len();
        if n == 0 {
            bail!("step: sequence {:?} has no tokens", w.seq);
        }
        let end = w.start_pos + n;
        if end > ctx {
            bail!(
                "sequence {:?} reaches position {end}, past the model's context length {ctx}",
                w.seq
            );
        }
        let s = kv
            .slot_mapping(w.seq, w.start_pos, n)
            .with_context(|| format!("slot mapping of {:?}", w.seq))?;
        let table = kv
            .block_table(w.seq)
            .with_context(|| format!("no block table for {:?}", w.seq))?;
        let base = tokens.len();
        tokens.extend_from_slice(w.tokens);
        positions.extend((w.start_pos..end).map(|p| p as u32));
        row_seq.extend(std::iter::repeat_n(si as u32, n));
        slots.extend_from_slice(&s);
        let n_want = match w.logits {
            LogitsWanted::None => 0,
            LogitsWanted::Last => 1,
            LogitsWanted::All => n,
        };
        logit_rows.extend(base + n - n_want..base + n);
        wanted.push(n_want);
        tables.push(table);
    }
    Ok(BatchInput {
        tokens,
        positions,
        row_seq,
        slots,
        logit_rows,
        wanted,
        tables,
        state_slots: Vec::new(),
        fresh_slots: Vec::new(),
        hidden: false,
    })
}

/// Builds the step's batch inputs ([`batch_input`]) and runs the model;
/// `hidden`: the rows give their final hidden states (width `dim`) instead
/// of logits.
fn forward_batch(
    model: &Model,
    gguf: &GgufFile,
    compute: &mut Compute,
    hybrid: Option<&mut HybridState>,
    kv: &KvManager,
    work: &[SeqWork<'_>],
    hidden: bool,
) -> Result<Logits> {
    let mut bi = batch_input(model.cfg(), kv, work)?;
    bi.hidden = hidden;
    if let Some(h) = hybrid {
        let s = h.step_slots(work)?;
        bi.state_slots = s.rows;
        bi.fresh_slots = s.fresh;
    }
    mark(Point::InputBuilt);
    let input = bi.input();
    let (n_rows, logit_rows, wanted) = (bi.tokens.len(), &bi.logit_rows, &bi.wanted);
    let t_step = std::time::Instant::now();
    let logits = match compute {
        Compute::Host { dx, storage } => match model {
            Model::Llama(m) => m.forward_host(&HostExec { dx, gguf }, storage, &input)?,
            Model::Qwen35(m) => m.forward_host(&HostExec { dx, gguf }, storage, &input)?,
        },
        Compute::Ranks(r) => r.forward(gguf, &input)?,
        Compute::Device(d) => {
            // A pure decode step: one row per sequence, all logits.
            let decode = !hidden
                && work
                    .iter()
                    .all(|w| w.tokens.len() == 1 && w.logits == LogitsWanted::Last);
            d.step(&input, decode)?
        }
    };
    let v = match hidden {
        true => model.cfg().dim,
        false => model.cfg().vocab_size,
    };
    if logits.len() != logit_rows.len() * v {
        bail!(
            "the model returned {} values for {} rows of width {v}",
            logits.len(),
            logit_rows.len()
        );
    }
    let mut spans = Vec::with_capacity(wanted.len());
    let mut off = 0;
    for n in wanted {
        spans.push(off..off + n);
        off += n;
    }
    let out = Logits {
        data: logits,
        vocab: v,
        spans,
    };
    if let Compute::Device(d) = compute {
        if d.profiling() {
            let kind = match n_rows {
                1 => "host: step wall time, 1 row",
                2..=8 => "host: step wall time, 2..8 rows",
                9..=64 => "host: step wall time, 9..64 rows",
                _ => "host: step wall time, >64 rows",
            };
            d.note_host(kind, t_step.elapsed().as_secs_f64());
        }
    }
    Ok(out)
}

fn progress_bar(show: bool, len: u64, template: &str, name: &str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new(len);
    if !template.is_empty() {
        b.set_style(
            ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
    }
    b.set_message(name.to_string());
    b
}

/// The device path ([`load_device`]): a device backend, a
/// whole-model capability check, the weights uploaded and the KV cache
/// allocated on the device; or, under `--gpu auto`, the backend and the
/// op it cannot run, for op-by-op dispatch with host memory.
fn open_device(
    gguf: &GgufFile,
    model: &Model,
    opts: &RunnerOptions,
    n_blocks: KvBlocks,
    name: &str,
) -> Result<DeviceLoad> {
    let cfg = model.cfg();
    let dev = DeviceOptions {
        gpu: opts.gpu,
        mode: opts.mode,
        tuning: &opts.tuning,
        n_blocks,
        max_seq_blocks: cfg.context_length.div_ceil(opts.block_size),
        block_size: opts.block_size,
        n_kv_heads: cfg.n_kv_heads,
        head_dim: cfg.head_dim,
        n_layers: model.n_kv_layers(),
        states: hybrid::state_geometry(cfg, opts.state_slots, opts.state_snapshots)?,
    };
    let bar = || {
        progress_bar(
            opts.progress,
            cfg.n_layers as u64,
            "uploading {msg} to the GPU [{bar:30}] {pos}/{len} layers",
            name,
        )
    };
    match model {
        Model::Llama(m) => load_device(
            gguf,
            LlamaGraph(cfg.clone()),
            &m.weights,
            &m.op_infos(),
            &dev,
            &bar,
        ),
        Model::Qwen35(m) => load_device(
            gguf,
            Qwen35Graph(cfg.clone()),
            &m.weights,
            &m.op_infos(),
            &dev,
            &bar,
        ),
    }
}

fn prefault(g: &GgufFile, bar: &ProgressBar) -> Result<()> {
    let total: u64 = g.tensors().iter().map(|t| t.n_bytes as u64).sum();
    bar.set_length(total.max(1));
    bar.set_position(0);
    bar.set_style(
        ProgressStyle::with_template("loading {msg} [{bar:30}] {bytes}/{total_bytes}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut done = 0u64;
    let mut sink = 0u8;
    for t in g.tensors() {
        let data = g.tensor_data(&t.name)?;
        for chunk in data.chunks(4096) {
            sink ^= chunk[0];
        }
        done += t.n_bytes as u64;
        bar.set_position(done);
    }
    std::hint::black_box(sink);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Logits;
    use crate::dispatch::HostLogits;

    #[test]
    fn flat_logits_spans() {
        // Three items of vocab 2: two rows, none, one row.
        let l = Logits {
            data: HostLogits::Vec(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            vocab: 2,
            spans: vec![0..2, 2..2, 2..3],
        };
        assert_eq!(l.len(), 3);
        assert_eq!(l.seq(0), &[1.0, 2.0, 3.0, 4.0]);
        assert!(l.seq(1).is_empty());
        assert_eq!(l.seq(2), &[5.0, 6.0]);
        assert_eq!(
            l.into_vecs(),
            vec![vec![1.0, 2.0, 3.0, 4.0], vec![], vec![5.0, 6.0]]
        );
        // A single item keeps the buffer itself.
        let one = Logits {
            data: HostLogits::Vec(vec![7.0, 8.0]),
            vocab: 2,
            spans: std::iter::once(0..1).collect(),
        };
        assert_eq!(one.into_vecs(), vec![vec![7.0, 8.0]]);
    }
}
