//! `quire ops`: the op parity harness (every op x dtype x shape on a
//! backend vs the `cpu` reference), and `quire check-exact`: a whole-model
//! greedy run on the GPU (`--gpu required`) and on the CPU, comparing the
//! logits bitwise at every step.

use super::greedy_run::{argmax, greedy_chunk, last_logits, random_prompt, GreedyRunArgs};
use crate::backend::cpu::CpuBackend;
use crate::backend::{GpuMode, Mode};
use crate::opcheck::{self, Status};
use crate::runner::{Runner, RunnerOptions};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct OpsArgs {
    /// Backend under test: cuda, or cpu-portable (the CPU's portable
    /// kernels, single-threaded; checks the harness without a GPU).
    #[arg(long, default_value = "cuda")]
    pub backend: String,
    /// Mode: exact (bitwise), deterministic or fast (NMSE bounds).
    #[arg(long, default_value = "exact")]
    pub mode: Mode,
    /// Only ops whose name contains this (mat_mul, mat_muls, mat_muls_norm,
    /// rms_norm, rope, swiglu, get_rows, select_rows, add, add_bias,
    /// kv_write, rope_kv_write, paged_attention, and the hybrid ops
    /// conv1d_silu, l2_norm_heads, gdn_gates, delta_rule, gated_rms_norm,
    /// split_heads, sigmoid_mul).
    #[arg(long)]
    pub op: Option<String>,
    /// Time each op and print GB/s and TFLOP/s (times include the host <->
    /// device transfers of the current host-slice op interface).
    #[arg(long)]
    pub perf: bool,
    /// Reduced shape grid.
    #[arg(long)]
    pub quick: bool,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// CPU threads of the reference.
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// CUDA tuning overrides (JSON file; see `quire tuning`).
    #[arg(long, value_name = "FILE")]
    pub tuning: Option<PathBuf>,
    /// One tuning override, `table.key=value` (repeatable), e.g. to cover
    /// a kernel form its planner does not take by default.
    #[arg(long = "tune", value_name = "KEY=VALUE")]
    pub tune: Vec<String>,
}

pub fn ops(a: OpsArgs) -> Result<()> {
    let cpu = CpuBackend::new(a.threads)?;
    let mut opts = opcheck::Options {
        mode: a.mode,
        op_filter: a.op.clone(),
        perf: a.perf,
        seed: a.seed,
        quick: a.quick,
        wave_tail_forced: false,
    };
    let header = || {
        println!(
            "quire ops: backend {} vs cpu, mode {:?}, seed {}",
            a.backend, a.mode, a.seed
        )
    };
    let res = match a.backend.as_str() {
        "cuda" => {
            // Capabilities decide UNSUPPORTED; a device error fails the
            // case (no cpu fallback: that would compare the cpu with itself).
            let tuning = super::tuning_overrides(a.tuning.as_deref(), &a.tune)?;
            let mut c = crate::backend::cuda::CudaBackend::new_tuned(GpuMode::Auto, &tuning)
                .context("quire ops --backend cuda")?
                .without_fallback();
            println!("device: {}", c.device_description());
            opts.wave_tail_forced = c.tuning().matmul.wr_tail_sms.is_some();
            header();
            let glu_before = c.glu_runs.load(std::sync::atomic::Ordering::Relaxed);
            let mut res = opcheck::run(&c, &cpu, &opts);
            // The fused gate/up + SwiGlu launch must have run where its
            // rule takes one of the one-row shapes built for it (not in
            // `exact`; matmul.mv_glu_form=off or matvec.prequant=false
            // turn it off).
            let glu_wanted = opts.mode != crate::backend::Mode::Exact
                && opts
                    .op_filter
                    .as_deref()
                    .is_none_or(|f| "mat_muls_glu".contains(f))
                && opcheck::mat_muls_glu::fusable_cases(opts.quick)
                    .any(|(ty, k, b)| c.glu_takes(ty, k, b));
            if glu_wanted && c.glu_runs.load(std::sync::atomic::Ordering::Relaxed) == glu_before {
                res.push(opcheck::CaseResult {
                    op: "mat_muls_glu",
                    desc: "the fused launch".into(),
                    status: Status::Fail(
                        "mv_q8_r1_glu never ran on the one-row cases with the norm".into(),
                    ),
                    nmse: f64::NAN,
                    bitwise: false,
                    perf: None,
                });
            }
            // Device-op pairs (norm-ahead, `fast` only): after the host-op
            // grid, which never takes that path.
            res.extend(opcheck::norm_ahead::run(&mut c, &cpu, &opts));
            res
        }
        "cpu-portable" => {
            header();
            opcheck::run(&CpuBackend::with_options(Some(1), true)?, &cpu, &opts)
        }
        other => bail!("unknown backend '{other}' (expected cuda or cpu-portable)"),
    };
    for r in &res {
        println!("{r}");
    }
    let (p, f, u) = opcheck::summary(&res);
    println!(
        "summary: {} cases: {p} passed, {f} failed, {u} unsupported (backend {}, mode {:?})",
        res.len(),
        a.backend,
        a.mode
    );
    println!("{p} passed, {f} failed");
    if f > 0 {
        let names: Vec<String> = res
            .iter()
            .filter(|r| matches!(r.status, Status::Fail(_)))
            .map(|r| format!("{} {}", r.op, r.desc))
            .collect();
        bail!("{f} op parity case(s) failed: {}", names.join("; "));
    }
    Ok(())
}

#[derive(Args, Debug)]
pub struct CheckExactArgs {
    #[command(flatten)]
    pub run: GreedyRunArgs,
    /// CPU threads.
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// exact: the GPU against the CPU. deterministic / fast: the GPU with
    /// its fusions (norm and swiglu quantizing for the next matmul) against
    /// the GPU without them, same mode: the fusions must not change a bit.
    /// fast-norm-ahead: norm-ahead (the norms folded into the residual
    /// matvecs and the next op's) against the op-by-op graph, both against
    /// the CPU (NMSE, not bitwise).
    #[arg(long, default_value = "exact", value_parser = ["exact", "deterministic", "fast", "fast-norm-ahead"])]
    pub mode: String,
}

/// Loads the model twice (GPU required + exact, and CPU), prefills a random
/// prompt and decodes greedily, comparing every step's logits bitwise.
pub fn check_exact(a: CheckExactArgs) -> Result<()> {
    if a.mode == "fast-norm-ahead" {
        return super::check_fused::check_norm_ahead(&a.run, a.threads);
    }
    let mode = match a.mode.as_str() {
        "deterministic" => Mode::Deterministic,
        "fast" => Mode::Fast,
        _ => Mode::Exact,
    };
    let base = RunnerOptions {
        threads: a.threads,
        kv_tokens: Some((a.run.prompt_tokens + a.run.tokens + 16).max(64)),
        mode,
        // The prequant fusions are checked without norm-ahead (it has its
        // own check, `fast-norm-ahead`).
        tuning: a.run.tuning()?.set("matvec.norm_ahead", "off")?,
        ..Default::default()
    };
    let mut gpu = Runner::load(
        &a.run.model,
        &RunnerOptions {
            gpu: GpuMode::Required,
            ..base.clone()
        },
    )
    .context("loading the model with --gpu required")?;
    // The reference: the cpu (exact), or the GPU without fusions.
    let (ref_name, ref_opts) = if mode == Mode::Exact {
        ("cpu", base.clone())
    } else {
        (
            "gpu-unfused",
            RunnerOptions {
                gpu: GpuMode::Required,
                tuning: base.tuning.clone().set("matvec.prequant", "false")?,
                ..base.clone()
            },
        )
    };
    println!("check-exact: {mode:?} mode, gpu against {ref_name}");
    let mut cpu = Runner::load(&a.run.model, &ref_opts)
        .with_context(|| format!("loading the reference model ({ref_name})"))?;
    let vocab = cpu.config().vocab_size;
    let prompt = random_prompt(a.run.seed, a.run.prompt_tokens, vocab);
    let mut toks = prompt.clone();
    let (mut t_gpu, mut t_cpu) = (0f64, 0f64);
    let mut mismatches = 0usize;
    let mut first_bad: Option<usize> = None;
    for step in 0..=a.run.tokens {
        let (chunk, start) = greedy_chunk(&prompt, &toks, step);
        let work = last_logits(&chunk, start);
        let t = Instant::now();
        let lg = gpu
            .step(&work)
            .with_context(|| format!("gpu step {step}"))?;
        t_gpu += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let lc = cpu
            .step(&work)
            .with_context(|| format!("cpu step {step}"))?;
        t_cpu += t.elapsed().as_secs_f64();
        let (g, c) = (&lg[0], &lc[0]);
        let same = g.len() == c.len()
            && g.iter()
                .zip(c.iter())
                .all(|(x, y)| x.to_bits() == y.to_bits());
        if !same {
            mismatches += 1;
            if first_bad.is_none() {
                first_bad = Some(step);
                let n_diff = g
                    .iter()
                    .zip(c.iter())
                    .filter(|(x, y)| x.to_bits() != y.to_bits())
                    .count();
                let maxd = g
                    .iter()
                    .zip(c.iter())
                    .map(|(x, y)| (x - y).abs())
                    .fold(0f32, f32::max);
                println!(
                    "step {step}: logits differ in {n_diff}/{} entries (max |diff| {maxd:e})",
                    c.len()
                );
            }
        }
        // Both continue with the CPU's greedy token.
        if step < a.run.tokens {
            toks.push(argmax(c));
        }
    }
    gpu.report_backends_to_stdout();
    println!(
        "check-exact: {} steps ({} prompt tokens + {} greedy), {} bitwise equal, {} differ; gpu {:.2}s, {ref_name} {:.2}s",
        a.run.tokens + 1,
        prompt.len(),
        a.run.tokens,
        a.run.tokens + 1 - mismatches,
        mismatches,
        t_gpu,
        t_cpu
    );
    if let Some(s) = first_bad {
        bail!("GPU logits are not bitwise equal to the {ref_name} reference's (first at step {s})");
    }
    println!("check-exact: PASS (every step's logits bitwise equal)");
    Ok(())
}

impl Runner {
    /// Prints the dispatcher's op kind -> backend counts.
    pub fn report_backends_to_stdout(&self) {
        println!("op kind -> backend (count):");
        for (op, b, n) in self.backend_report() {
            println!("  {op:16} {b:6} {n}");
        }
    }
}
