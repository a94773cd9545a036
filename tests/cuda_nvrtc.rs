//! Compiles every CUDA kernel source through NVRTC (no GPU needed), for
//! the architectures the backend targets. Needs libnvrtc on the loader path
//! (scripts/test.sh puts the `nvidia-cuda-nvrtc` pip package's lib dir on
//! LD_LIBRARY_PATH); without it the tests that compile fail, naming the
//! fix, so CI cannot pass without having compiled the kernels.

use quire::backend::cuda::device::compile;
use quire::backend::cuda::kernels;

/// One entry of the kernel tables: (file stem, source, entry points).
type KernelFile = (&'static str, &'static str, &'static [&'static str]);

/// Fails naming the fix unless NVRTC can run.
fn require_nvrtc(what: &str) {
    assert!(
        compile::nvrtc_present(),
        "libnvrtc cannot be loaded, so {what}. scripts/test.sh puts the lib dir of \
         the nvidia-cuda-nvrtc pip package (installed by scripts/setup-test-env.sh) \
         on LD_LIBRARY_PATH"
    );
}

#[test]
fn every_kernel_compiles_with_nvrtc() {
    require_nvrtc("the CUDA kernels were NOT compiled");
    let mut n = 0;
    // The Hopper-only files (wgmma) are compiled for sm_90a alone.
    let sets = [
        ("sm_80", kernels::KERNELS),
        ("sm_90", kernels::KERNELS),
        ("sm_90a", kernels::KERNELS_SM90A),
    ];
    // Compiled concurrently, as the backend does at start (NVRTC programs
    // are independent), then checked in order.
    let jobs: Vec<(&str, &KernelFile)> = sets
        .iter()
        .flat_map(|(arch, files)| files.iter().map(move |f| (*arch, f)))
        .collect();
    let compiled: Vec<_> = {
        use rayon::prelude::*;
        jobs.par_iter()
            .map(|(arch, (stem, _, _))| {
                kernels::full_source(stem).and_then(|src| compile::compile(stem, &src, arch))
            })
            .collect()
    };
    for ((arch, (stem, _, entries)), ptx) in jobs.into_iter().zip(compiled) {
        let ptx = match ptx {
            Ok(p) => p,
            Err(e) => panic!("{stem}.cu for {arch}: {e:#}"),
        };
        let text = ptx.to_src();
        // QUIRE_DUMP_PTX=dir writes the PTX for reading (e.g. with
        // ptxas -v or nvdisasm when tuning a kernel).
        if let Ok(dir) = std::env::var("QUIRE_DUMP_PTX") {
            let path = std::path::Path::new(&dir).join(format!("{stem}.{arch}.ptx"));
            std::fs::write(&path, &text).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        }
        for e in entries.iter() {
            assert!(
                text.contains(&format!(".entry {e}")),
                "{stem}.cu ({arch}): no entry point {e} in the PTX"
            );
        }
        // And the other way: every extern "C" kernel of the file is
        // listed, so the backend loads it (an unlisted one fails only at
        // its first launch, on a device).
        for body in text.split(".entry ").skip(1) {
            let name = body.split('(').next().unwrap_or("?").trim();
            assert!(
                name.starts_with("_Z") || entries.contains(&name),
                "{stem}.cu ({arch}): kernel {name} is not in kernels::KERNELS"
            );
        }
        // Every kernel waits for the previous grid (GRID_DEP,
        // common.cuh) before it touches what a kernel of the step
        // writes: decode graphs on sm_90+ start a kernel's CTAs before
        // its predecessor has finished. (Before the wait only data no
        // kernel writes may be read; see docs/DETERMINISM.md.)
        if arch.starts_with("sm_90") {
            for body in text.split(".entry ").skip(1) {
                let name = body.split('(').next().unwrap_or("?");
                assert!(
                    body.contains("griddepcontrol.wait"),
                    "{stem}.cu: kernel {name} has no GRID_DEP() (griddepcontrol.wait)"
                );
            }
        }
        // The decode matvecs load their weights evict-first in L2
        // (MV_L2_POL, dequant.cuh): a hint whose loss would only show as
        // a slower decode, so the PTX is checked for it.
        if matches!(*stem, "matmul_fast" | "matmul") {
            for needle in ["createpolicy.fractional.L2::evict_first", "L2::cache_hint"] {
                assert!(
                    text.contains(needle),
                    "{stem}.cu ({arch}): no `{needle}` in the PTX (MV_L2_POL)"
                );
            }
        }
        // Exact mode forbids FMA contraction: no fused multiply-add in
        // the floating-point code (integer mad is fine). Files named
        // `*_fast` hold only non-exact kernels and may use fmaf.
        assert!(
            stem.ends_with("_fast") || !text.contains("fma.rn.f32"),
            "{stem}.cu ({arch}): PTX contains fma.rn.f32"
        );
        n += 1;
    }
    eprintln!("compiled {n} kernel files with NVRTC");
}

#[test]
fn kernel_table_names_every_op_file() {
    let stems: Vec<&str> = kernels::KERNELS.iter().map(|(s, _, _)| *s).collect();
    for want in [
        "matmul",
        "rms_norm",
        "rope",
        "swiglu",
        "get_rows",
        "add",
        "kv_write",
        "attention",
    ] {
        assert!(stems.contains(&want), "no kernel file {want}.cu");
    }
    // Entry names are non-empty and loaded once (some lists are built by
    // const code, e.g. attention_pipe_fast's from ATT_PIPE).
    let mut seen = std::collections::HashSet::new();
    for (stem, _, entries) in kernels::KERNELS.iter().chain(kernels::KERNELS_SM90A) {
        for e in entries.iter() {
            assert!(!e.is_empty(), "{stem}.cu: an empty entry name");
            assert!(seen.insert(*e), "{stem}.cu: entry {e} listed twice");
        }
    }
}

#[test]
fn kernel_cache_compiles_stores_and_reloads_cubins() {
    use quire::backend::cuda::device::kcache::{load_in, Origin};
    require_nvrtc("the kernel cache was NOT exercised");
    let dir = std::env::temp_dir().join(format!("quire-kcache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let add = kernels::full_source("add").unwrap();
    // A miss compiles a CUBIN (an ELF image) and stores it under its key.
    let (_, o) = load_in(Some(&dir), "add", &add, "sm_90").unwrap();
    assert_eq!(o, Origin::Compiled);
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(files.len(), 1, "one file, no temporary left behind");
    let path = files[0].path();
    let name = path.file_name().unwrap().to_str().unwrap().to_string();
    assert!(
        name.starts_with("add.sm_90.") && name.ends_with(".cubin"),
        "{name}"
    );
    assert!(std::fs::read(&path).unwrap().starts_with(b"\x7fELF"));
    // A hit reads it back; another architecture is another file.
    assert_eq!(
        load_in(Some(&dir), "add", &add, "sm_90").unwrap().1,
        Origin::Cached
    );
    assert_eq!(
        load_in(Some(&dir), "add", &add, "sm_80").unwrap().1,
        Origin::Compiled
    );
    // A damaged file is not loaded: compiled again and replaced.
    std::fs::write(&path, b"not a cubin").unwrap();
    assert_eq!(
        load_in(Some(&dir), "add", &add, "sm_90").unwrap().1,
        Origin::Compiled
    );
    assert!(std::fs::read(&path).unwrap().starts_with(b"\x7fELF"));
    // No cache: PTX, as without one.
    assert_eq!(load_in(None, "add", &add, "sm_90").unwrap().1, Origin::Ptx);
    let _ = std::fs::remove_dir_all(&dir);
}
