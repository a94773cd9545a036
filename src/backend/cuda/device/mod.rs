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

/// Compiles (or reads from the kernel cache, kcache.rs) every file of
/// `files` for `arch` in parallel, then loads them in order and returns
/// their entry points. `source(stem)` is a file's full translation unit;
/// `prepare(entry, f)` runs on each entry point as it loads (shared memory
/// opt-in, occupancy counts). Any failure fails the load.
pub(crate) fn load_kernels(
    ctx: &Arc<CudaContext>,
    arch: &str,
    files: &[KernelFile],
    source: fn(&str) -> Result<String>,
    prepare: &mut dyn FnMut(&'static str, &CudaFunction) -> Result<()>,
) -> Result<HashMap<&'static str, CudaFunction>> {
    let t0 = std::time::Instant::now();
    type Compiled = Result<(String, (cudarc::nvrtc::Ptx, kcache::Origin))>;
    let compiled: Vec<Compiled> = {
        use rayon::prelude::*;
        files
            .par_iter()
            .map(|(stem, _, _)| {
                let src = source(stem)?;
                let ptx = kcache::load(stem, &src, arch)?;
                Ok((src, ptx))
            })
            .collect()
    };
    let cached = compiled
        .iter()
        .filter(|r| matches!(r, Ok((_, (_, kcache::Origin::Cached)))))
        .count();
    tracing::info!(
        "{} kernel files for {arch} ready in {:.1} s ({cached} from the kernel cache)",
        compiled.len(),
        t0.elapsed().as_secs_f64()
    );
    let mut funcs = HashMap::new();
    for ((stem, _, entries), c) in files.iter().zip(compiled) {
        let (src, ptx) = c?;
        let module = load_module(ctx, stem, &src, arch, ptx)?;
        for &e in entries.iter() {
            let f = drv(module.load_function(e), &format!("kernel {e} of {stem}.cu"))?;
            prepare(e, &f)?;
            funcs.insert(e, f);
        }
    }
    Ok(funcs)
}

/// Compiles and loads `files` (the Hopper-only table) for `sm_90a` into
/// `funcs`, `prepare` running on each entry point. A failure is logged and
/// leaves that file out (the portable kernels serve the same ops), so a
/// driver or NVRTC without `sm_90a` still runs.
pub(crate) fn load_sm90a(
    ctx: &Arc<CudaContext>,
    files: &[KernelFile],
    source: fn(&str) -> Result<String>,
    funcs: &mut HashMap<&'static str, CudaFunction>,
    prepare: &mut dyn FnMut(&'static str, &CudaFunction) -> Result<()>,
) {
    for (stem, _, entries) in files {
        let loaded = (|| -> Result<Vec<(&'static str, CudaFunction)>> {
            let src = source(stem)?;
            let ptx = kcache::load(stem, &src, "sm_90a")?;
            let module = load_module(ctx, stem, &src, "sm_90a", ptx)?;
            let mut v = Vec::new();
            for &e in entries.iter() {
                let f = drv(module.load_function(e), &format!("kernel {e} of {stem}.cu"))?;
                prepare(e, &f)?;
                v.push((e, f));
            }
            Ok(v)
        })();
        match loaded {
            Ok(v) => funcs.extend(v),
            Err(e) => {
                tracing::warn!("{stem}.cu (sm_90a) not loaded, its ops use portable kernels: {e:#}")
            }
        }
    }
}
