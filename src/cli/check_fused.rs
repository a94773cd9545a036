//! `quire check-exact --mode fast-norm-ahead`: a `fast` decode path whose
//! arithmetic differs from the op-by-op graph's (norm-ahead: the RMS norms
//! folded into the residual matvecs and the next op's,
//! ops/matmul/norm_ahead.rs) against the op-by-op `fast` graph, both against
//! the cpu's exact logits. Not bitwise: at every step the fused logits
//! must agree on NaN/Inf and be no farther from the cpu's than a bound
//! derived from the op-by-op path's own distance, and the fused path must
//! have run.

use super::greedy_run::{argmax, greedy_chunk, last_logits, random_prompt, GreedyRunArgs};
use crate::backend::{GpuMode, Mode};
use crate::opcheck::compare;
use crate::runner::{Runner, RunnerOptions};
use anyhow::{bail, Context, Result};

/// A step's fused NMSE passes when it is at most this many times the
/// op-by-op path's NMSE (both against the cpu), or below the floor: the
/// fused path may round differently, not worse.
const RATIO: f64 = 4.0;
const FLOOR: f64 = 1e-4;

/// What the check names the fused path in its output.
const NAME: &str = "norm-ahead";
/// The backend report's entry that counts the fused path's runs.
const REPORT_KEY: &str = "norm_ahead";

/// Runs `run` three times side by side (norm-ahead on the GPU, op by op on
/// the GPU, exact on the cpu with `threads`) and compares every step.
pub fn check_norm_ahead(run: &GreedyRunArgs, threads: Option<usize>) -> Result<()> {
    let base = RunnerOptions {
        threads,
        kv_tokens: Some((run.prompt_tokens + run.tokens + 16).max(64)),
        mode: Mode::Fast,
        tuning: run.tuning()?,
        ..Default::default()
    };
    // Only the variant under test differs between the two GPU runners.
    let gpu_opts = |fused: bool| -> Result<RunnerOptions> {
        let switch = if fused { "on" } else { "off" };
        Ok(RunnerOptions {
            gpu: GpuMode::Required,
            tuning: base.tuning.clone().set("matvec.norm_ahead", switch)?,
            ..base.clone()
        })
    };
    let mut fused = Runner::load(&run.model, &gpu_opts(true)?).context("loading (fused)")?;
    let mut plain = Runner::load(&run.model, &gpu_opts(false)?).context("loading (op by op)")?;
    let mut cpu = Runner::load(
        &run.model,
        &RunnerOptions {
            mode: Mode::Exact,
            ..base.clone()
        },
    )
    .context("loading the cpu reference")?;
    println!(
        "check-exact: fast mode, {} against op by op, both against the cpu (exact)",
        NAME
    );
    let vocab = cpu.config().vocab_size;
    let prompt = random_prompt(run.seed, run.prompt_tokens, vocab);
    let mut toks = prompt.clone();
    let (mut worst, mut sum_f, mut sum_p) = (0f64, 0f64, 0f64);
    let (mut top_f, mut top_p) = (0usize, 0usize);
    let mut bad: Option<String> = None;
    for step in 0..=run.tokens {
        let (chunk, start) = greedy_chunk(&prompt, &toks, step);
        let work = last_logits(&chunk, start);
        let lf = fused
            .step(&work)
            .with_context(|| format!("fused step {step}"))?;
        let lp = plain
            .step(&work)
            .with_context(|| format!("op-by-op step {step}"))?;
        let lc = cpu
            .step(&work)
            .with_context(|| format!("cpu step {step}"))?;
        let (f, p, c) = (&lf[0], &lp[0], &lc[0]);
        let (cf, cp) = (compare(f, c), compare(p, c));
        if step > 0 {
            sum_f += cf.nmse;
            sum_p += cp.nmse;
            worst = worst.max(cf.nmse / cp.nmse.max(1e-30));
            top_f += usize::from(argmax(f) == argmax(c));
            top_p += usize::from(argmax(p) == argmax(c));
        }
        let ok = cf.nan_inf_ok && (cf.nmse <= RATIO * cp.nmse || cf.nmse <= FLOOR);
        if !ok && bad.is_none() {
            bad = Some(format!(
                "step {step}: fused NMSE {:.3e} vs op-by-op {:.3e} (NaN/Inf agree: {})",
                cf.nmse, cp.nmse, cf.nan_inf_ok
            ));
        }
        if step < run.tokens {
            toks.push(argmax(c));
        }
    }
    let n = run.tokens.max(1) as f64;
    let ran = fused
        .backend_report()
        .iter()
        .find(|(op, _, _)| op == REPORT_KEY)
        .map_or(0, |r| r.2);
    println!(
        "check-exact: {} decode steps: mean NMSE vs cpu fused {:.3e}, op by op {:.3e} (worst step ratio {:.2}); greedy token as the cpu's: fused {top_f}, op by op {top_p}; fused launches {ran}",
        run.tokens,
        sum_f / n,
        sum_p / n,
        worst
    );
    // Decode graphs replay the captured launch without going through the
    // executor, so the count is of steps run op by op or captured.
    if ran == 0 && run.tokens > 0 {
        bail!(
            "the {} never ran (not taken for this model or device: see RUST_LOG=debug)",
            NAME
        );
    }
    if let Some(why) = bad {
        bail!("{}: {why}", NAME);
    }
    println!("check-exact: PASS (fused within {RATIO}x the op-by-op NMSE or below {FLOOR:e} at every step)");
    Ok(())
}
