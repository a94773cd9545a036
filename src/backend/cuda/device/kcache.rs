//! Compiled kernels cached on disk: one CUBIN per (kernel file, target
//! architecture, NVRTC options, full source).
//!
//! Without a cache every process would compile every kernel file with
//! NVRTC to PTX, and the driver then the PTX for the device the first time
//! it sees it (about two minutes for all of Quire's kernels on an H100
//! machine). With it, a file is compiled once, by NVRTC straight to the
//! device's machine code, in parallel with the others, and later processes
//! load the CUBIN as it is.
//!
//! The cache is on by default, in `$XDG_CACHE_HOME/quire/kernels` (else
//! `~/.cache/quire/kernels`). `QUIRE_KERNEL_CACHE=DIR` puts it elsewhere
//! (`0` or `off`: no cache; every process compiles PTX). A file is named by
//! a 64-bit FNV-1a hash of the source, the options (the tuning defines of
//! `QUIRE_CUDA_DEFINES` included) and the architecture, so an edited kernel
//! or another define set is a new file and a stale one is never loaded.
//! The NVRTC version is not part of the key: a CUBIN of one CUDA major
//! version loads on any driver of it, so a cache built on one machine
//! (`quire kernels --dir D`) can be carried to another. A CUBIN the driver
//! refuses is deleted and the file compiled to PTX instead
//! (`device::load_module`).

use super::compile;
use anyhow::{anyhow, bail, Context, Result};
use std::ffi::CString;
use std::path::{Path, PathBuf};

/// The cache directory (see the module docs); None: no cache.
pub fn cache_dir() -> Option<PathBuf> {
    cache_dir_from(
        std::env::var("QUIRE_KERNEL_CACHE").ok().as_deref(),
        std::env::var_os("XDG_CACHE_HOME").as_deref(),
        std::env::var_os("HOME").as_deref(),
    )
}

/// `cache_dir` from the three variables' values.
fn cache_dir_from(
    explicit: Option<&str>,
    xdg: Option<&std::ffi::OsStr>,
    home: Option<&std::ffi::OsStr>,
) -> Option<PathBuf> {
    match explicit {
        Some(v) if v == "0" || v.eq_ignore_ascii_case("off") => None,
        Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => {
            let base = match (xdg.filter(|x| !x.is_empty()), home) {
                (Some(x), _) => PathBuf::from(x),
                (None, Some(h)) if !h.is_empty() => Path::new(h).join(".cache"),
                _ => return None,
            };
            Some(base.join("quire").join("kernels"))
        }
    }
}

/// Whether `stem` for `arch` is in the cache at `dir` (its CUBIN exists).
pub fn is_cached(dir: Option<&Path>, stem: &str, src: &str, arch: &str) -> bool {
    dir.is_some_and(|d| {
        d.join(file_name(stem, arch, src, &compile::nvrtc_options(arch)))
            .is_file()
    })
}

/// 64-bit FNV-1a over byte strings, each followed by a 0 separator.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in p.iter().chain(&[0u8]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

/// The cache file name of `stem` compiled for `arch` from `src` with
/// `opts`.
pub fn file_name(stem: &str, arch: &str, src: &str, opts: &[String]) -> String {
    let mut parts: Vec<&[u8]> = vec![src.as_bytes(), arch.as_bytes()];
    parts.extend(opts.iter().map(|o| o.as_bytes()));
    format!("{stem}.{arch}.{:016x}.cubin", fnv1a(&parts))
}

/// Compiles one kernel file with NVRTC to a CUBIN for `arch` (a real
/// architecture, `sm_XY` or `sm_90a`). Errors carry the NVRTC log.
pub fn compile_cubin(stem: &str, arch: &str, src: &str, opts: &[String]) -> Result<Vec<u8>> {
    use cudarc::nvrtc::{result, sys};
    if !compile::nvrtc_present() {
        bail!("NVRTC (libnvrtc) not found: cannot compile CUDA kernel {stem}.cu");
    }
    let c_src = CString::new(src).map_err(|_| anyhow!("{stem}.cu: NUL byte in the source"))?;
    let c_name = CString::new(format!("{stem}.cu"))?;
    let prog = result::create_program(&c_src, Some(&c_name))
        .map_err(|e| anyhow!("NVRTC: creating {stem}.cu: {e:?}"))?;
    // SAFETY: prog was just created and is destroyed once, below, on every
    // path; c_src and c_name outlive it.
    let out = unsafe {
        let r = (|| -> Result<Vec<u8>> {
            if let Err(e) = result::compile_program(prog, opts) {
                let log = result::get_program_log(prog)
                    .map(|l| {
                        let bytes: Vec<u8> = l.iter().map(|&c| c as u8).collect();
                        String::from_utf8_lossy(&bytes).into_owned()
                    })
                    .unwrap_or_default();
                bail!("NVRTC failed to compile {stem}.cu for {arch}: {e:?}\n{log}");
            }
            let mut n = 0usize;
            sys::nvrtcGetCUBINSize(prog, &mut n)
                .result()
                .map_err(|e| anyhow!("NVRTC: CUBIN size of {stem}.cu ({arch}): {e:?}"))?;
            if n == 0 {
                bail!("NVRTC made no CUBIN of {stem}.cu for {arch} (not a real architecture?)");
            }
            let mut buf = vec![0u8; n];
            sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut std::ffi::c_char)
                .result()
                .map_err(|e| anyhow!("NVRTC: CUBIN of {stem}.cu ({arch}): {e:?}"))?;
            Ok(buf)
        })();
        let _ = result::destroy_program(prog);
        r
    };
    out
}

/// Whether `bytes` look like a CUBIN (an ELF image).
fn is_elf(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\x7fELF")
}

/// Writes `bytes` to `path` through a temporary file in the same directory
/// (a concurrent reader sees the whole file or none).
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| anyhow!("{path:?}: no directory"))?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {dir:?}"))?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("k"),
        std::process::id()
    ));
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {tmp:?}"))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {tmp:?} to {path:?}"))
}

/// Where a kernel module came from (`load`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Origin {
    /// Read from the cache.
    Cached,
    /// Compiled to a CUBIN now (and stored, when the cache is writable).
    Compiled,
    /// Compiled to PTX (no cache), for the driver to finish.
    Ptx,
}

/// Kernel file `stem` (its full translation unit `src`) for `arch`: the
/// cached CUBIN, else compiled now (a CUBIN, stored in the cache; a cache
/// that cannot be written is only logged), or PTX when there is no cache.
/// `forget` drops a cached file the driver refused.
pub fn load(stem: &str, src: &str, arch: &str) -> Result<(cudarc::nvrtc::Ptx, Origin)> {
    load_in(cache_dir().as_deref(), stem, src, arch)
}

/// `load` with the cache in `dir` (None: no cache).
pub fn load_in(
    dir: Option<&Path>,
    stem: &str,
    src: &str,
    arch: &str,
) -> Result<(cudarc::nvrtc::Ptx, Origin)> {
    let Some(dir) = dir else {
        return Ok((compile::compile(stem, src, arch)?, Origin::Ptx));
    };
    let opts = compile::nvrtc_options(arch);
    let path = dir.join(file_name(stem, arch, src, &opts));
    if let Ok(bytes) = std::fs::read(&path) {
        if is_elf(&bytes) {
            return Ok((cudarc::nvrtc::Ptx::from_binary(bytes), Origin::Cached));
        }
        tracing::warn!("{path:?} is not a CUBIN; compiling {stem}.cu again");
    }
    let bin = compile_cubin(stem, arch, src, &opts)?;
    if let Err(e) = write_atomic(&path, &bin) {
        tracing::warn!("kernel cache not written ({e:#}); QUIRE_KERNEL_CACHE=DIR puts it elsewhere, =off skips it");
    }
    Ok((cudarc::nvrtc::Ptx::from_binary(bin), Origin::Compiled))
}

/// Deletes the cached CUBIN of `stem` (from `src`) for `arch` (the driver
/// refused it), so the next process compiles it again.
pub fn forget(stem: &str, src: &str, arch: &str) {
    let Some(dir) = cache_dir() else { return };
    let opts = compile::nvrtc_options(arch);
    let _ = std::fs::remove_file(dir.join(file_name(stem, arch, src, &opts)));
}

#[cfg(test)]
mod tests {
    use super::{file_name, fnv1a, is_elf};

    #[test]
    fn names_follow_source_options_and_arch() {
        let o = vec!["--fmad=false".to_string()];
        let a = file_name("rope", "sm_90", "src", &o);
        assert!(a.starts_with("rope.sm_90.") && a.ends_with(".cubin"));
        assert_eq!(a, file_name("rope", "sm_90", "src", &o));
        assert_ne!(a, file_name("rope", "sm_90", "src2", &o));
        assert_ne!(a, file_name("rope", "sm_80", "src", &o));
        let d = vec!["--fmad=false".to_string(), "-DMV_UNITS=2".to_string()];
        assert_ne!(a, file_name("rope", "sm_90", "src", &d));
        // Separators: moving a byte between parts changes the hash.
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
    }

    #[test]
    fn the_cache_is_on_by_default() {
        use super::cache_dir_from;
        use std::ffi::OsStr;
        use std::path::PathBuf;
        let h = Some(OsStr::new("/home/u"));
        assert_eq!(
            cache_dir_from(None, None, h),
            Some(PathBuf::from("/home/u/.cache/quire/kernels"))
        );
        assert_eq!(
            cache_dir_from(None, Some(OsStr::new("/x")), h),
            Some(PathBuf::from("/x/quire/kernels"))
        );
        assert_eq!(
            cache_dir_from(Some("/k"), None, h),
            Some(PathBuf::from("/k"))
        );
        assert_eq!(cache_dir_from(Some("off"), None, h), None);
        assert_eq!(cache_dir_from(Some("0"), None, h), None);
        // Empty values count as unset; no home: no cache.
        assert_eq!(
            cache_dir_from(Some(""), Some(OsStr::new("")), h),
            Some(PathBuf::from("/home/u/.cache/quire/kernels"))
        );
        assert_eq!(cache_dir_from(None, None, None), None);
    }

    #[test]
    fn only_elf_images_are_loaded() {
        assert!(is_elf(b"\x7fELF\x02\x01"));
        assert!(!is_elf(b"//\n// Generated by NVIDIA NVVM Compiler"));
        assert!(!is_elf(b""));
    }
}
