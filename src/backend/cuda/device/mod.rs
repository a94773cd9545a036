//! The device room of the `cuda` backend: what every op family stands on
//! and none of them decides. The context, stream and loaded kernels
//! ([`Device`]) and the loading of kernel files (this file); NVRTC
//! (`compile.rs`) and the on-disk kernel cache (`kcache.rs`); device memory
//! (`memory.rs`) and page-locked host memory (`pinned.rs`); captured graphs
//! with programmatic dependent launch (`pdl.rs`); the stream's
//! synchronizations (`sync_count.rs`) and the step phase timer
//! (`step_times.rs`).
//!
//! Which kernel files exist, their sources and entry points is the kernel
//! table's business (`ops/kernels.rs`); what each entry needs at load
//! (shared memory past the default, occupancy counts) the op families'.
//! Both come in as arguments, so this room imports neither.

pub mod compile;
pub mod kcache;
pub(crate) mod launch;
pub mod memory;
pub(crate) mod pdl;
pub(crate) mod pinned;
pub mod step_times;
pub(crate) mod sync_count;

use anyhow::{anyhow, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use std::collections::HashMap;
use std::sync::Arc;

/// One kernel file of the table: (file stem, source, kernel entry points).
pub type KernelFile = (&'static str, &'static str, &'static [&'static str]);

/// Compiled kernels and the device they run on.
pub(crate) struct Device {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) funcs: HashMap<&'static str, CudaFunction>,
    /// CTAs per SM of each split-attention kernel (128 threads, its
    /// dynamic shared memory), from the driver's occupancy at load.
    pub(crate) att_per_sm: HashMap<&'static str, usize>,
    /// Clusters resident at once of each att_pipe_c_ kernel by cluster
    /// size (2..=ATT_CLUSTER_MAX CTAs), from the driver at load (sm_90+).
    pub(crate) att_clusters: HashMap<(&'static str, usize), usize>,
}

pub(crate) fn drv<T>(
    r: std::result::Result<T, cudarc::driver::DriverError>,
    what: &str,
) -> Result<T> {
    r.map_err(|e| anyhow!("CUDA driver error in {what}: {e:?}"))
}

/// Raises kernel `name`'s dynamic shared memory limit to `bytes` (past
/// the default 48 KiB).
pub(crate) fn allow_smem(f: &CudaFunction, bytes: usize, name: &str) -> Result<()> {
    drv(
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            i32::try_from(bytes)?,
        ),
        &format!("{name}: shared memory size"),
    )
}

/// Loads a compiled kernel file (`src`: its full translation unit). A
/// CUBIN from the kernel cache that the driver refuses (another CUDA
/// version's, say) is deleted from the cache and the file compiled to PTX
/// and loaded instead.
fn load_module(
    ctx: &Arc<CudaContext>,
    stem: &str,
    src: &str,
    arch: &str,
    (ptx, origin): (cudarc::nvrtc::Ptx, kcache::Origin),
) -> Result<Arc<CudaModule>> {
    match ctx.load_module(ptx) {
        Ok(m) => Ok(m),
        Err(e) if origin != kcache::Origin::Ptx => {
            tracing::warn!("{stem}.cu: the driver refused its CUBIN ({e:?}); compiling PTX");
            kcache::forget(stem, src, arch);
            let ptx = compile::compile(stem, src, arch)?;
            drv(ctx.load_module(ptx), &format!("loading module {stem}"))
        }
        Err(e) => Err(anyhow!("loading module {stem}: {e:?}")),
    }
}

/// A kernel file compiled (or read from the cache) for one architecture:
/// its full source and code.
type Compiled = Result<(String, (cudarc::nvrtc::Ptx, kcache::Origin))>;

/// Compiles (or reads from the kernel cache, kcache.rs) every (file,
/// architecture) of `jobs` in parallel, results in order. While files
/// compile a progress bar shows on a terminal, and one line on stderr
/// then names what was compiled and how long it took (a cold kernel
/// cache); all from the cache, one INFO log line.
fn compile_all(jobs: &[(&'static str, &str)], source: fn(&str) -> Result<String>) -> Vec<Compiled> {
    let t0 = std::time::Instant::now();
    let dir = kcache::cache_dir();
    let to_compile: Vec<&str> = jobs
        .iter()
        .filter(|(stem, arch)| {
            source(stem).map_or(true, |src| {
                !kcache::is_cached(dir.as_deref(), stem, &src, arch)
            })
        })
        .map(|(stem, _)| *stem)
        .collect();
    let bar = if to_compile.is_empty() {
        indicatif::ProgressBar::hidden()
    } else {
        let b = indicatif::ProgressBar::new(jobs.len() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "compiling CUDA kernels [{bar:30}] {pos}/{len} files {elapsed}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    };
    let compiled: Vec<Compiled> = {
        use rayon::prelude::*;
        jobs.par_iter()
            .map(|(stem, arch)| {
                let src = source(stem)?;
                let ptx = kcache::load(stem, &src, arch)?;
                bar.inc(1);
                Ok((src, ptx))
            })
            .collect()
    };
    bar.finish_and_clear();
    let cached = compiled
        .iter()
        .filter(|r| matches!(r, Ok((_, (_, kcache::Origin::Cached)))))
        .count();
    let secs = t0.elapsed().as_secs_f64();
    if to_compile.is_empty() {
        tracing::info!(
            "{} CUDA kernel files ready in {secs:.2} s from the kernel cache",
            compiled.len()
        );
    } else {
        let place = match &dir {
            Some(d) => format!("cached in {}", d.display()),
            None => "no kernel cache: PTX for the driver to finish".into(),
        };
        eprintln!(
            "cuda: compiled {} kernel files in {secs:.1} s ({place}; {cached} from the cache): {}",
            to_compile.len(),
            to_compile.join(", ")
        );
    }
    compiled
}

/// Compiles (or reads from the kernel cache) every file of `files` for
/// `arch`, and of `sm90a` for `sm_90a`, all in parallel (`compile_all`),
/// then loads them in order and returns their entry points.
/// `source(stem)` is a file's full translation unit; `prepare(entry, f)`
/// runs on each entry point of `files` as it loads (shared memory opt-in,
/// occupancy counts), `prepare_sm90a` on those of `sm90a`. Any failure of
/// `files` fails the load; one of `sm90a` is logged and leaves that file
/// out (the portable kernels serve the same ops), so a driver or NVRTC
/// without `sm_90a` still runs.
pub(crate) fn load_kernels(
    ctx: &Arc<CudaContext>,
    arch: &str,
    files: &[KernelFile],
    sm90a: &[KernelFile],
    source: fn(&str) -> Result<String>,
    prepare: &mut dyn FnMut(&'static str, &CudaFunction) -> Result<()>,
    prepare_sm90a: &mut dyn FnMut(&'static str, &CudaFunction) -> Result<()>,
) -> Result<HashMap<&'static str, CudaFunction>> {
    let jobs: Vec<(&'static str, &str)> = files
        .iter()
        .map(|f| (f.0, arch))
        .chain(sm90a.iter().map(|f| (f.0, "sm_90a")))
        .collect();
    let mut compiled = compile_all(&jobs, source).into_iter();
    let mut funcs = HashMap::new();
    for ((stem, _, entries), c) in files.iter().zip(compiled.by_ref()) {
        let (src, ptx) = c?;
        let module = load_module(ctx, stem, &src, arch, ptx)?;
        for &e in entries.iter() {
            let f = drv(module.load_function(e), &format!("kernel {e} of {stem}.cu"))?;
            prepare(e, &f)?;
            funcs.insert(e, f);
        }
    }
    for ((stem, _, entries), c) in sm90a.iter().zip(compiled) {
        let loaded = c.and_then(|(src, ptx)| {
            let module = load_module(ctx, stem, &src, "sm_90a", ptx)?;
            let mut v = Vec::new();
            for &e in entries.iter() {
                let f = drv(module.load_function(e), &format!("kernel {e} of {stem}.cu"))?;
                prepare_sm90a(e, &f)?;
                v.push((e, f));
            }
            Ok(v)
        });
        match loaded {
            Ok(v) => funcs.extend(v),
            Err(e) => {
                tracing::warn!("{stem}.cu (sm_90a) not loaded, its ops use portable kernels: {e:#}")
            }
        }
    }
    Ok(funcs)
}
