//! NVRTC: the options every kernel file is compiled with, its compilation
//! to PTX, and whether the driver and NVRTC libraries are present. The
//! source text comes from the caller (the kernel table, `ops/kernels.rs`).

use anyhow::{anyhow, bail, Result};

/// Whether libnvrtc can be loaded (cudarc panics on first use otherwise).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Whether the CUDA driver library (libcuda) can be loaded.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// NVRTC options of every kernel: no FMA contraction, IEEE division and
/// square root, no flush-to-zero (exact mode depends on all four).
/// `QUIRE_CUDA_DEFINES=NAME=VALUE,...` adds `-D` options: tuning macros
/// for benchmark runs (e.g. `MV_UNITS=4`, the decode kernels' units in
/// flight per lane), none of which changes any result.
pub fn nvrtc_options(arch: &str) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={arch}"),
        "--fmad=false".into(),
        "--prec-div=true".into(),
        "--prec-sqrt=true".into(),
        "--ftz=false".into(),
        "--std=c++17".into(),
    ];
    if let Ok(defs) = std::env::var("QUIRE_CUDA_DEFINES") {
        o.extend(
            defs.split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .map(|d| format!("-D{d}")),
        );
    }
    o
}

/// Compiles kernel file `stem` (its full translation unit `src`) to PTX
/// for `arch` (e.g. `sm_90`). Errors carry the NVRTC log.
pub fn compile(stem: &str, src: &str, arch: &str) -> Result<cudarc::nvrtc::Ptx> {
    if !nvrtc_present() {
        bail!("NVRTC (libnvrtc) not found: cannot compile CUDA kernel {stem}.cu");
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options: nvrtc_options(arch),
        name: Some(format!("{stem}.cu")),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(src, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { nvrtc, log, .. } => anyhow!(
            "NVRTC failed to compile {stem}.cu for {arch}: {nvrtc:?}\n{}",
            log.to_string_lossy()
        ),
        other => anyhow!("NVRTC failed on {stem}.cu for {arch}: {other:?}"),
    })
}
