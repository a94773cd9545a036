//! GGUF models from the Hugging Face Hub: `--hf-repo owner/name[:quant]`
//! and `quire pull`.
//!
//! Files land in the standard Hugging Face cache (hf-hub's layout:
//! `$HF_HOME/hub`, default `~/.cache/huggingface/hub`, then
//! `models--owner--name/{blobs,refs,snapshots}`), so a model fetched here
//! is shared with the Python tools and the other way round.
//!
//! Which `.gguf` of a repo is taken (see [`choose_gguf`]): vision
//! projectors (`mmproj*`) are never candidates. With a quant, the file
//! whose name contains it (case-insensitive); when several do, the one
//! where it stands as a whole word (`Q4_0` takes `m-Q4_0.gguf` over
//! `m-Q4_0_4_4.gguf`). Without a quant, the only `.gguf`, else the one
//! word-matching `Q4_K_M`, else `Q4_0`. Anything else is an error that
//! lists the repo's `.gguf` files. Split GGUFs (`-00001-of-00003.gguf`)
//! are refused.
//!
//! The repo's file list is asked for on every pull; a file already in the
//! snapshot of the repo's current commit is not downloaded again. When the
//! list cannot be had (offline), the snapshot the cache last recorded for
//! the revision is used, with a warning.

use anyhow::{bail, Context, Result};
use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo, RepoType};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Longest owner or name the Hub accepts.
const MAX_PART_LEN: usize = 96;

/// Quants tried, in order, when a spec names none and the repo has several
/// `.gguf` files (llama.cpp's default first).
const DEFAULT_QUANTS: [&str; 2] = ["Q4_K_M", "Q4_0"];

/// `owner/name[:quant]`. Invariant: `repo` is exactly `owner/name`, each
/// part a valid Hub name (so the cache folder `models--owner--name` is
/// unambiguous and stays inside the cache); `quant`, when present, is
/// non-empty and made of `[A-Za-z0-9_.-]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfSpec {
    repo: String,
    quant: Option<String>,
}

impl HfSpec {
    /// `owner/name`.
    pub fn repo(&self) -> &str {
        &self.repo
    }

    /// The quant asked for, as written (matched case-insensitively).
    pub fn quant(&self) -> Option<&str> {
        self.quant.as_deref()
    }
}

impl fmt::Display for HfSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.quant {
            Some(q) => write!(f, "{}:{q}", self.repo),
            None => f.write_str(&self.repo),
        }
    }
}

impl FromStr for HfSpec {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        const FORM: &str = "expected owner/name[:quant]";
        if s.is_empty() {
            bail!("empty model spec ({FORM})");
        }
        let (repo, quant) = match s.split_once(':') {
            Some((r, q)) => (r, Some(q)),
            None => (s, None),
        };
        let parts: Vec<&str> = repo.split('/').collect();
        match parts.len() {
            1 => bail!("{s:?}: no '/' between owner and name ({FORM})"),
            2 => {}
            _ => bail!("{s:?}: more than one '/' ({FORM})"),
        }
        check_name(s, "owner", parts[0])?;
        check_name(s, "name", parts[1])?;
        let quant = match quant {
            Some("") => bail!("{s:?}: empty quant after ':' ({FORM})"),
            Some(q) => {
                if let Some(c) = q.chars().find(|c| !name_char(*c)) {
                    bail!("{s:?}: character {c:?} in the quant (letters, digits, '_', '-', '.')");
                }
                Some(q.to_string())
            }
            None => None,
        };
        Ok(HfSpec {
            repo: repo.to_string(),
            quant,
        })
    }
}

fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// The Hub's rules for an owner or a repo name.
fn check_name(spec: &str, what: &str, part: &str) -> Result<()> {
    if part.is_empty() {
        bail!("{spec:?}: empty {what} (expected owner/name[:quant])");
    }
    if let Some(c) = part.chars().find(|c| !name_char(*c)) {
        bail!("{spec:?}: character {c:?} in the {what} (letters, digits, '_', '-', '.')");
    }
    if part.contains("--") || part.contains("..") {
        bail!("{spec:?}: '--' and '..' are not allowed in the {what}");
    }
    if part.starts_with(['-', '.']) || part.ends_with(['-', '.']) {
        bail!("{spec:?}: the {what} cannot start or end with '-' or '.'");
    }
    if part.len() > MAX_PART_LEN {
        bail!("{spec:?}: the {what} is longer than {MAX_PART_LEN} characters");
    }
    Ok(())
}

/// Where and how to pull. Every field left `None` takes hf-hub's default
/// (`HF_ENDPOINT` or https://huggingface.co; `$HF_HOME/hub` or
/// `~/.cache/huggingface/hub`; the token file `huggingface-cli login`
/// writes; revision `main`).
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// Hub base URL (a mirror, or a local server in tests).
    pub endpoint: Option<String>,
    /// The hub cache directory itself (holding `models--*` folders).
    pub cache_dir: Option<PathBuf>,
    /// Access token for gated or private repos.
    pub token: Option<String>,
    /// Branch, tag or commit.
    pub revision: Option<String>,
}

/// Downloads the chosen `.gguf` of `spec` into the cache (unless already
/// there) and returns its local path (a link into the cache's blobs).
pub fn pull(spec: &HfSpec, opts: &PullOptions) -> Result<PathBuf> {
    let revision = opts.revision.as_deref().unwrap_or("main");
    check_revision(revision)?;
    let cache = match &opts.cache_dir {
        Some(d) => Cache::new(d.clone()),
        None => Cache::from_env(),
    };
    let mut builder = ApiBuilder::from_env()
        .with_progress(false)
        .with_cache_dir(cache.path().clone());
    if let Some(e) = &opts.endpoint {
        builder = builder.with_endpoint(e.trim_end_matches('/').to_string());
    }
    if opts.token.is_some() {
        builder = builder.with_token(opts.token.clone());
    }
    let api = builder
        .build()
        .context("building the Hugging Face client")?;
    let repo = Repo::with_revision(spec.repo.clone(), RepoType::Model, revision.to_string());
    let repo_dir = cache.path().join(repo.folder_name());
    let api_repo = api.repo(repo.clone());

    let info = match api_repo.info() {
        Ok(i) => i,
        Err(e) => {
            // Offline: the snapshot the cache last recorded for this revision.
            let listing = format!("listing the files of {} (revision {revision})", spec.repo);
            let Some((commit, names)) = cached_snapshot(&repo_dir, revision) else {
                return Err(e).context(listing);
            };
            let file = match choose_gguf(&names, spec.quant()) {
                Ok(f) => f,
                Err(ce) => {
                    let why = format!("{listing} (cached snapshot {commit}: {ce:#})");
                    return Err(e).context(why);
                }
            };
            eprintln!("quire: {listing} failed ({e}); using the cached snapshot {commit}");
            return Ok(repo_dir.join("snapshots").join(commit).join(file));
        }
    };
    check_commit(&info.sha)?;
    let names: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
    let file = choose_gguf(&names, spec.quant())
        .with_context(|| format!("{spec} (revision {revision})"))?;
    check_rel_path(&file)?;

    let local = repo_dir.join("snapshots").join(&info.sha).join(&file);
    if local.is_file() {
        // Already pulled at this commit; the ref is rewritten so that an
        // offline pull later finds this snapshot.
        cache
            .repo(repo)
            .create_ref(&info.sha)
            .with_context(|| format!("recording {revision} in {}", repo_dir.display()))?;
        return Ok(local);
    }
    eprintln!("quire: downloading {file} from {}", spec.repo);
    api_repo
        .download_with_progress(&file, Bar(indicatif::ProgressBar::new(0)))
        .with_context(|| format!("downloading {file} of {}", spec.repo))
}

/// The `.gguf` of `names` (repo-relative paths) that `quant` selects; the
/// rules are in the module docs.
pub fn choose_gguf(names: &[String], quant: Option<&str>) -> Result<String> {
    let ggufs: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| {
            let base = base_name(n).to_ascii_lowercase();
            base.ends_with(".gguf") && !base.starts_with("mmproj")
        })
        .collect();
    let listed = || {
        if ggufs.is_empty() {
            "the repo has no .gguf files".to_string()
        } else {
            format!("the repo's .gguf files: {}", ggufs.join(", "))
        }
    };
    let chosen: Vec<&str> = match quant {
        Some(q) => {
            let found = by_quant(&ggufs, q);
            if found.is_empty() {
                bail!("no .gguf file name contains {q:?}; {}", listed());
            }
            found
        }
        None if ggufs.len() == 1 => ggufs.clone(),
        None if ggufs.is_empty() => bail!("{}", listed()),
        None => match DEFAULT_QUANTS
            .iter()
            .map(|q| whole_word(&ggufs, q))
            .find(|f| !f.is_empty())
        {
            Some(f) => f,
            None => bail!(
                "several .gguf files and none is {}: name one as owner/name:QUANT; {}",
                DEFAULT_QUANTS.join(" or "),
                listed()
            ),
        },
    };
    if chosen.iter().all(|n| split_part(n)) {
        bail!(
            "{} is a split (multi-part) GGUF, which is not supported; {}",
            chosen.join(", "),
            listed()
        );
    }
    match chosen[..] {
        [one] => Ok(one.to_string()),
        _ => bail!(
            "{} all match; name the quant in full; {}",
            chosen.join(", "),
            listed()
        ),
    }
}

/// Files whose base name contains `q` (case-insensitive); when that is
/// several, those where `q` stands as a whole word, if any.
fn by_quant<'a>(ggufs: &[&'a str], q: &str) -> Vec<&'a str> {
    let ql = q.to_ascii_lowercase();
    let found: Vec<&str> = ggufs
        .iter()
        .copied()
        .filter(|n| base_name(n).to_ascii_lowercase().contains(&ql))
        .collect();
    if found.len() > 1 {
        let exact = whole_word(&found, q);
        if !exact.is_empty() {
            return exact;
        }
    }
    found
}

/// Files whose base name holds `q` (case-insensitive) with neither a
/// letter, a digit nor '_' on either side.
fn whole_word<'a>(ggufs: &[&'a str], q: &str) -> Vec<&'a str> {
    let ql = q.to_ascii_lowercase();
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    ggufs
        .iter()
        .copied()
        .filter(|n| {
            let b = base_name(n).to_ascii_lowercase();
            b.match_indices(&ql).any(|(i, _)| {
                !word(b[..i].chars().next_back()) && !word(b[i + ql.len()..].chars().next())
            })
        })
        .collect()
}

fn base_name(n: &str) -> &str {
    n.rsplit('/').next().unwrap_or(n)
}

/// `…-00001-of-00003.gguf`.
fn split_part(n: &str) -> bool {
    let b = base_name(n).to_ascii_lowercase();
    let digits5 = |s: &str| s.len() == 5 && s.bytes().all(|c| c.is_ascii_digit());
    let Some((head, total)) = b.strip_suffix(".gguf").and_then(|s| s.rsplit_once("-of-")) else {
        return false;
    };
    head.rsplit_once('-')
        .is_some_and(|(_, idx)| digits5(idx) && digits5(total))
}

/// A revision becomes a file under `refs/`: no `..`, no absolute path.
fn check_revision(r: &str) -> Result<()> {
    let ok = !r.is_empty()
        && !r.starts_with('/')
        && !r.split('/').any(|p| p.is_empty() || p == "." || p == "..")
        && r.chars().all(|c| name_char(c) || c == '/');
    if !ok {
        bail!("revision {r:?}: expected a branch, tag or commit ([A-Za-z0-9_.-/], no '..')");
    }
    Ok(())
}

/// The server's commit names a folder under `snapshots/`.
fn check_commit(sha: &str) -> Result<()> {
    if sha.is_empty() || sha.len() > 64 || !sha.chars().all(|c| c.is_ascii_alphanumeric()) {
        bail!("the hub answered an invalid commit {sha:?}");
    }
    Ok(())
}

/// A file name from the server is joined under the snapshot folder: it
/// must stay inside it.
fn check_rel_path(f: &str) -> Result<()> {
    if f.starts_with('/') || f.contains('\\') || f.split('/').any(|p| p.is_empty() || p == "..") {
        bail!("the hub listed an unsafe file name {f:?}");
    }
    Ok(())
}

/// The commit `refs/<revision>` records and the files of its snapshot
/// (repo-relative, `/`-separated), if the cache holds one.
fn cached_snapshot(repo_dir: &Path, revision: &str) -> Option<(String, Vec<String>)> {
    let commit = std::fs::read_to_string(repo_dir.join("refs").join(revision)).ok()?;
    let commit = commit.trim().to_string();
    check_commit(&commit).ok()?;
    let root = repo_dir.join("snapshots").join(&commit);
    let mut names = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).ok()?.flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.is_file() {
                let rel = p.strip_prefix(&root).ok()?;
                let parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                names.push(parts.join("/"));
            }
        }
    }
    names.sort();
    Some((commit, names))
}

/// hf-hub's progress callbacks on our indicatif bar (hidden when stderr is
/// not a terminal).
struct Bar(indicatif::ProgressBar);

impl hf_hub::api::Progress for Bar {
    fn init(&mut self, size: usize, filename: &str) {
        self.0.set_length(size as u64);
        self.0.set_position(0);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{msg} [{elapsed_precise}] [{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec} ({eta})",
        ) {
            self.0.set_style(style);
        }
        self.0.set_message(base_name(filename).to_string());
    }

    fn update(&mut self, size: usize) {
        self.0.inc(size as u64);
    }

    fn finish(&mut self) {
        self.0.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(s: &str) -> String {
        format!("{:#}", s.parse::<HfSpec>().unwrap_err())
    }

    #[test]
    fn specs_parse() {
        let s: HfSpec = "unsloth/Qwen3-0.6B-GGUF:Q4_K_M".parse().unwrap();
        assert_eq!(s.repo(), "unsloth/Qwen3-0.6B-GGUF");
        assert_eq!(s.quant(), Some("Q4_K_M"));
        assert_eq!(s.to_string(), "unsloth/Qwen3-0.6B-GGUF:Q4_K_M");
        let s: HfSpec = "a_b/c.d".parse().unwrap();
        assert_eq!((s.repo(), s.quant()), ("a_b/c.d", None));
    }

    #[test]
    fn bad_specs_name_the_problem() {
        for (s, want) in [
            ("", "empty model spec"),
            ("noslash", "no '/'"),
            ("a/b/c", "more than one '/'"),
            ("/b", "empty owner"),
            ("a/", "empty name"),
            ("a/b:", "empty quant"),
            ("a b/c", "character ' ' in the owner"),
            ("a/b?x", "character '?' in the name"),
            ("a/b:Q4:K", "character ':' in the quant"),
            ("a/..", "'..'"),
            ("a--x/b", "'--'"),
            ("-a/b", "start or end"),
        ] {
            let e = err(s);
            assert!(e.contains(want), "{s:?}: {e}");
        }
        let long = format!("a/{}", "x".repeat(MAX_PART_LEN + 1));
        assert!(err(&long).contains("longer than"), "{}", err(&long));
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn choice_by_quant() {
        let n = names(&[
            "README.md",
            "m-Q4_0.gguf",
            "m-Q4_0_4_4.gguf",
            "sub/m-Q4_K_M.gguf",
            "m-Q4_K_S.gguf",
            "mmproj-m-Q8_0.gguf",
            "m-Q8_0.gguf",
        ]);
        let pick = |q| choose_gguf(&n, q).map_err(|e| format!("{e:#}"));
        assert_eq!(pick(Some("q4_0")).unwrap(), "m-Q4_0.gguf");
        assert_eq!(pick(Some("Q4_0_4_4")).unwrap(), "m-Q4_0_4_4.gguf");
        assert_eq!(pick(Some("Q4_K_M")).unwrap(), "sub/m-Q4_K_M.gguf");
        // The projector is never a candidate.
        assert_eq!(pick(Some("Q8_0")).unwrap(), "m-Q8_0.gguf");
        let e = pick(Some("Q4_K")).unwrap_err();
        assert!(
            e.contains("all match") && e.contains("m-Q4_K_S.gguf"),
            "{e}"
        );
        let e = pick(Some("IQ2_XS")).unwrap_err();
        assert!(
            e.contains("no .gguf file name contains") && e.contains("m-Q8_0.gguf"),
            "{e}"
        );
        // No quant: Q4_K_M first.
        assert_eq!(pick(None).unwrap(), "sub/m-Q4_K_M.gguf");
    }

    #[test]
    fn choice_without_quant() {
        let one = names(&["x.bin", "only.gguf"]);
        assert_eq!(choose_gguf(&one, None).unwrap(), "only.gguf");
        let q40 = names(&["m-Q4_0.gguf", "m-Q8_0.gguf"]);
        assert_eq!(choose_gguf(&q40, None).unwrap(), "m-Q4_0.gguf");
        let two = names(&["m-F16.gguf", "m-Q8_0.gguf"]);
        let e = format!("{:#}", choose_gguf(&two, None).unwrap_err());
        assert!(
            e.contains("owner/name:QUANT") && e.contains("m-F16.gguf, m-Q8_0.gguf"),
            "{e}"
        );
        let none = names(&["README.md"]);
        let e = format!("{:#}", choose_gguf(&none, None).unwrap_err());
        assert!(e.contains("no .gguf files"), "{e}");
    }

    #[test]
    fn split_ggufs_are_refused() {
        assert!(split_part("dir/m-Q8_0-00001-of-00003.gguf"));
        assert!(!split_part("m-Q8_0.gguf"));
        assert!(!split_part("m-00001-of-3.gguf"));
        let n = names(&[
            "m-Q8_0-00001-of-00002.gguf",
            "m-Q8_0-00002-of-00002.gguf",
            "m-Q4_0.gguf",
        ]);
        let e = format!("{:#}", choose_gguf(&n, Some("Q8_0")).unwrap_err());
        assert!(e.contains("split (multi-part)"), "{e}");
        assert_eq!(choose_gguf(&n, Some("Q4_0")).unwrap(), "m-Q4_0.gguf");
    }

    #[test]
    fn revisions_and_names_stay_in_the_cache() {
        for ok in ["main", "v1.0", "refs/pr/1", "0123abcd"] {
            assert!(check_revision(ok).is_ok(), "{ok}");
        }
        for bad in ["", "/etc", "../x", "a/../b", "a//b", "a b"] {
            assert!(check_revision(bad).is_err(), "{bad}");
        }
        assert!(check_rel_path("a/b.gguf").is_ok());
        for bad in ["/a.gguf", "../a.gguf", "a/../../b.gguf", "a\\b.gguf"] {
            assert!(check_rel_path(bad).is_err(), "{bad}");
        }
        assert!(check_commit("../../x").is_err());
    }
}
