//! `quire kernels`: fills the kernel cache (backend/cuda/device/kcache.rs) for a
//! device architecture without a device, e.g. to build the CUBINs on one
//! machine and carry them to another (NVRTC only; no driver needed).

use crate::backend::cuda::device::kcache;
use crate::backend::cuda::kernels as table;
use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct KernelsArgs {
    /// Device architectures, comma-separated (sm_80, sm_90, ...). For
    /// sm_90 the Hopper-only files are compiled for sm_90a too, as a
    /// device of compute capability 9.0 loads them (unless its tuning
    /// table turns `matmul.wgmma` off).
    #[arg(long, default_value = "sm_90")]
    pub arch: String,
    /// Cache directory (default: the one every process uses,
    /// `~/.cache/quire/kernels` or QUIRE_KERNEL_CACHE). Another directory
    /// is used by a process whose QUIRE_KERNEL_CACHE names it.
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

pub fn kernels(a: KernelsArgs) -> Result<()> {
    let Some(dir) = a.dir.clone().or_else(kcache::cache_dir) else {
        bail!("no kernel cache directory (no HOME, or QUIRE_KERNEL_CACHE=off): give --dir");
    };
    let mut jobs: Vec<(&'static str, String)> = Vec::new();
    for arch in a.arch.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if !arch.starts_with("sm_") {
            bail!("--arch {arch}: give a real architecture such as sm_90");
        }
        jobs.extend(
            table::KERNELS
                .iter()
                .map(|(s, _, _)| (*s, arch.to_string())),
        );
        if arch == "sm_90" {
            jobs.extend(
                table::KERNELS_SM90A
                    .iter()
                    .map(|(s, _, _)| (*s, "sm_90a".to_string())),
            );
        }
    }
    let t0 = std::time::Instant::now();
    let done: Vec<(String, Result<(kcache::Origin, f64)>)> = {
        use rayon::prelude::*;
        jobs.par_iter()
            .map(|(stem, arch)| {
                let t = std::time::Instant::now();
                let r = table::full_source(stem)
                    .and_then(|src| kcache::load_in(Some(&dir), stem, &src, arch))
                    .map(|(_, o)| (o, t.elapsed().as_secs_f64()));
                (format!("{stem}.cu ({arch})"), r)
            })
            .collect()
    };
    let mut failed = 0;
    for (name, r) in &done {
        match r {
            Ok((o, s)) => println!("{name}: {o:?} in {s:.1} s"),
            Err(e) => {
                failed += 1;
                println!("{name}: FAILED: {e:#}");
            }
        }
    }
    println!(
        "{} kernel files in {:.1} s into {}",
        done.len(),
        t0.elapsed().as_secs_f64(),
        dir.display()
    );
    if failed > 0 {
        bail!("{failed} kernel files failed to compile");
    }
    Ok(())
}
