//! `quire check-invariance`: the invariance grid (opcheck/invariance) on
//! a backend in a mode: batch invariance, chunked = at once = token by
//! token, run to run, and in `exact` the cpu's bits. Exits non-zero on
//! any difference, or with `--expect-differences` (the negative control:
//! cuda's `fast`, or the cpu's batch-variant control) on none.

use crate::backend::cpu::CpuBackend;
use crate::backend::{Backend, GpuMode, Mode};
use crate::opcheck::invariance::{self, control::BatchVariant, Report};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct CheckInvarianceArgs {
    /// Backend under test: cpu, cpu-portable (single-threaded portable
    /// kernels), cuda, or control (a cpu attention whose split follows the
    /// batch: the negative control).
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// Mode: exact, deterministic or fast.
    #[arg(long, default_value = "deterministic")]
    pub mode: Mode,
    /// The full grid (head dims 64-256, KV 256 and 1,024, batch 1/8/33,
    /// GQA 1-8; 1,152 cells) instead of the reduced one (96 cells).
    #[arg(long)]
    pub full: bool,
    /// Succeed only if the grid finds a difference (negative controls).
    #[arg(long)]
    pub expect_differences: bool,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// CPU threads of the cpu backends.
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// CUDA tuning overrides (JSON file; see `quire tuning`).
    #[arg(long, value_name = "FILE")]
    pub tuning: Option<PathBuf>,
    /// One tuning override, `table.key=value` (repeatable).
    #[arg(long = "tune", value_name = "KEY=VALUE")]
    pub tune: Vec<String>,
    /// Print every difference (default: the first 20).
    #[arg(long)]
    pub all: bool,
}

pub fn check_invariance(a: CheckInvarianceArgs) -> Result<()> {
    let cells = invariance::cells(a.full);
    let cpu = CpuBackend::new(a.threads)?;
    println!(
        "quire check-invariance: backend {}, mode {:?}, {} grid ({} cells), seed {}",
        a.backend,
        a.mode,
        if a.full { "full" } else { "reduced" },
        cells.len(),
        a.seed
    );
    let t0 = Instant::now();
    let mut last = Instant::now();
    let progress = |done: usize, total: usize| {
        if last.elapsed().as_secs() >= 10 || done == total {
            eprintln!(
                "  {done}/{total} cells, {:.0} s",
                t0.elapsed().as_secs_f64()
            );
            last = Instant::now();
        }
    };
    let run = |be: &dyn Backend, reference: Option<&dyn Backend>| {
        invariance::run(be, reference, a.mode, &cells, a.seed, progress)
    };
    let rep = match a.backend.as_str() {
        "cpu" => run(&cpu, None),
        "cpu-portable" => run(&CpuBackend::with_options(Some(1), true)?, Some(&cpu)),
        "control" => run(&BatchVariant, None),
        "cuda" => {
            let tuning = super::tuning_overrides(a.tuning.as_deref(), &a.tune)?;
            let c = crate::backend::cuda::CudaBackend::new_tuned(GpuMode::Auto, &tuning)
                .context("quire check-invariance --backend cuda")?
                .without_fallback();
            println!("device: {}", c.device_description());
            run(&c, Some(&cpu))
        }
        other => bail!("unknown backend '{other}' (expected cpu, cpu-portable, cuda or control)"),
    };
    report(&rep, a.all, t0.elapsed().as_secs_f64());
    let found = !rep.diffs.is_empty();
    if !rep.errors.is_empty() {
        bail!("{} launches failed", rep.errors.len());
    }
    match (a.expect_differences, found) {
        (false, false) => {
            println!("invariant: every check bitwise equal");
            Ok(())
        }
        (false, true) => bail!("{} differences", rep.diffs.len()),
        (true, true) => {
            println!(
                "negative control: {} differences found, as expected (the checks can fail)",
                rep.diffs.len()
            );
            Ok(())
        }
        (true, false) => bail!("negative control: no difference found, but one was expected"),
    }
}

fn report(rep: &Report, all: bool, secs: f64) {
    let shown = if all { usize::MAX } else { 20 };
    for f in rep.diffs.iter().take(shown) {
        println!("DIFF   {:8} {} ({})", f.check, f.what, f.detail);
    }
    if rep.diffs.len() > shown {
        println!("... {} more differences (--all)", rep.diffs.len() - shown);
    }
    for f in &rep.errors {
        println!("ERROR  {} ({})", f.what, f.detail);
    }
    let mut by: std::collections::BTreeMap<&str, usize> = Default::default();
    for f in &rep.diffs {
        *by.entry(f.check).or_default() += 1;
    }
    println!(
        "summary: {} cells, {} checks, {} differences {:?}, {} errors, {} unsupported, {:.1} s",
        rep.cells,
        rep.checks,
        rep.diffs.len(),
        by,
        rep.errors.len(),
        rep.unsupported,
        secs
    );
}
