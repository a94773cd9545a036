//! `quire tuning`: the CUDA tuning table of an architecture, as JSON (the
//! defaults, or with a file's and `--tune` overrides laid over them), to
//! start a `--tuning FILE` from. Needs no device.

use crate::backend::cuda::Tuning;
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct TuningArgs {
    /// Device architecture whose defaults to print.
    #[arg(long, default_value = "sm_90")]
    pub arch: String,
    /// Overrides to lay over the defaults (checked: unknown keys fail).
    #[arg(long, value_name = "FILE")]
    pub tuning: Option<PathBuf>,
    /// One override, `table.key=value` (repeatable).
    #[arg(long = "tune", value_name = "KEY=VALUE")]
    pub tune: Vec<String>,
}

pub fn tuning(a: TuningArgs) -> Result<()> {
    let o = super::tuning_overrides(a.tuning.as_deref(), &a.tune)?;
    let t = Tuning::resolve(&a.arch, &o)?;
    println!("{}", serde_json::to_string_pretty(&t)?);
    Ok(())
}
