//! `quire::hub::pull` and `quire pull` against an in-process mock of the
//! Hugging Face Hub (never huggingface.co): the file a spec selects, the
//! cache layout, no second download, the offline fallback, and the errors.
//!
//! The mock answers what hf-hub's sync client asks (hf-hub 0.4, ureq):
//! `GET /api/models/{owner}/{name}/revision/{rev}` (the file list), then
//! for a download `GET /{owner}/{name}/resolve/{rev}/{file}` twice: with
//! `Range: bytes=0-0` (it reads `etag`, `x-repo-commit` and the size from
//! `Content-Range`), then with `Range: bytes=N-` (the body).
//!
//! hf-hub's client takes a proxy from `ALL_PROXY`/`HTTPS_PROXY`/
//! `HTTP_PROXY` and has no `NO_PROXY`: with one set, these requests to
//! 127.0.0.1 would go through it.

use quire::hub::{pull, HfSpec, PullOptions};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

/// repo -> file -> bytes. Only `.gguf` bytes are served; the other names
/// are listed only.
type Repos = BTreeMap<String, BTreeMap<String, Vec<u8>>>;

struct Mock {
    url: String,
    /// `/resolve/` requests served (metadata and body alike).
    file_requests: Arc<AtomicUsize>,
    info_requests: Arc<AtomicUsize>,
}

impl Mock {
    fn files(&self) -> usize {
        self.file_requests.load(Ordering::SeqCst)
    }
}

fn start(repos: Repos) -> Mock {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let repos = Arc::new(repos);
    let file_requests = Arc::new(AtomicUsize::new(0));
    let info_requests = Arc::new(AtomicUsize::new(0));
    let (f, i) = (file_requests.clone(), info_requests.clone());
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let (repos, f, i) = (repos.clone(), f.clone(), i.clone());
            std::thread::spawn(move || {
                let _ = serve_one(conn, &repos, &f, &i);
            });
        }
    });
    Mock {
        url,
        file_requests,
        info_requests,
    }
}

/// One request per connection (`Connection: close`), so ureq's pool never
/// reuses a socket the mock has finished with.
fn serve_one(
    conn: TcpStream,
    repos: &Repos,
    files: &AtomicUsize,
    infos: &AtomicUsize,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let mut range = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.trim().eq_ignore_ascii_case("range") {
                range = Some(v.trim().to_string());
            }
        }
    }
    let mut out = conn;
    let respond = |out: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]| {
        let mut head = format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        out.write_all(head.as_bytes())?;
        if method != "HEAD" {
            out.write_all(body)?;
        }
        out.flush()
    };
    let not_found = |out: &mut TcpStream| respond(out, "404 Not Found", &[], b"{}");
    if method != "GET" && method != "HEAD" {
        return respond(&mut out, "405 Method Not Allowed", &[], b"");
    }
    let path = target.split('?').next().unwrap_or("");
    if let Some(rest) = path.strip_prefix("/api/models/") {
        infos.fetch_add(1, Ordering::SeqCst);
        let Some((repo, _rev)) = rest.split_once("/revision/") else {
            return not_found(&mut out);
        };
        let Some(files) = repos.get(repo) else {
            return not_found(&mut out);
        };
        let siblings: Vec<_> = files
            .keys()
            .map(|n| serde_json::json!({ "rfilename": n }))
            .collect();
        let body = serde_json::json!({ "id": repo, "sha": SHA, "siblings": siblings });
        let ct = ("Content-Type", "application/json".to_string());
        return respond(&mut out, "200 OK", &[ct], body.to_string().as_bytes());
    }
    // /{owner}/{name}/resolve/{rev}/{file}
    let Some((repo, rest)) = path.trim_start_matches('/').split_once("/resolve/") else {
        return not_found(&mut out);
    };
    files.fetch_add(1, Ordering::SeqCst);
    let Some((_rev, file)) = rest.split_once('/') else {
        return not_found(&mut out);
    };
    let Some(bytes) = repos.get(repo).and_then(|f| f.get(file)) else {
        return not_found(&mut out);
    };
    let len = bytes.len();
    let headers = |from: usize, to: usize| {
        vec![
            ("ETag", format!("\"{}\"", etag(bytes))),
            ("X-Repo-Commit", SHA.to_string()),
            ("Content-Range", format!("bytes {from}-{to}/{len}")),
            ("Accept-Ranges", "bytes".to_string()),
        ]
    };
    match range.as_deref().and_then(|r| r.strip_prefix("bytes=")) {
        Some(r) => {
            let (a, b) = r.split_once('-').unwrap_or((r, ""));
            let from: usize = a.parse().unwrap_or(0).min(len);
            let to = b.parse::<usize>().map_or(len - 1, |b| b.min(len - 1));
            let h = headers(from, to);
            respond(&mut out, "206 Partial Content", &h, &bytes[from..=to])
        }
        None => respond(&mut out, "200 OK", &headers(0, len - 1), bytes),
    }
}

/// A content hash standing in for the Hub's sha256 etag (FNV-1a, hex).
fn etag(bytes: &[u8]) -> String {
    let h = bytes.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100000001b3)
    });
    format!("{h:016x}")
}

fn gguf(dir: &Path, name: &str, ty: quire::quant::GgmlType) -> Vec<u8> {
    let p = dir.join(name);
    let shape = quire::model::synth::find_shape("tiny-llama").unwrap();
    quire::model::synth::write_model(&p, shape, ty, 5).unwrap();
    std::fs::read(p).unwrap()
}

/// `test/tiny`: a Q4_0 and a Q8_0 GGUF, a projector and a README (the
/// last two only listed). `test/two`: two GGUFs, neither a default quant.
fn repos() -> (Repos, tempfile::TempDir) {
    use quire::quant::GgmlType;
    let src = tempfile::tempdir().unwrap();
    let q4 = gguf(src.path(), "q4.gguf", GgmlType::Q4_0);
    let q8 = gguf(src.path(), "q8.gguf", GgmlType::Q8_0);
    assert_ne!(q4, q8);
    let mut tiny = BTreeMap::new();
    tiny.insert("tiny-Q4_0.gguf".to_string(), q4.clone());
    tiny.insert("tiny-Q8_0.gguf".to_string(), q8.clone());
    tiny.insert("mmproj-tiny-F16.gguf".to_string(), b"not served".to_vec());
    tiny.insert("README.md".to_string(), b"# tiny".to_vec());
    let mut two = BTreeMap::new();
    two.insert("two-F16.gguf".to_string(), q8);
    two.insert("two-Q8_0.gguf".to_string(), q4);
    let mut r = Repos::new();
    r.insert("test/tiny".to_string(), tiny);
    r.insert("test/two".to_string(), two);
    (r, src)
}

fn opts(endpoint: &str, cache: &Path) -> PullOptions {
    PullOptions {
        endpoint: Some(endpoint.to_string()),
        cache_dir: Some(cache.to_path_buf()),
        ..PullOptions::default()
    }
}

fn spec(s: &str) -> HfSpec {
    s.parse().unwrap()
}

fn snapshot(cache: &Path, repo_folder: &str, file: &str) -> PathBuf {
    cache
        .join(repo_folder)
        .join("snapshots")
        .join(SHA)
        .join(file)
}

#[test]
fn pull_by_quant_downloads_once_into_the_hf_cache() {
    let (r, _src) = repos();
    let want = r["test/tiny"]["tiny-Q8_0.gguf"].clone();
    let mock = start(r);
    let cache = tempfile::tempdir().unwrap();
    let o = opts(&mock.url, cache.path());

    let path = pull(&spec("test/tiny:q8_0"), &o).unwrap();
    assert_eq!(
        path,
        snapshot(cache.path(), "models--test--tiny", "tiny-Q8_0.gguf")
    );
    assert_eq!(std::fs::read(&path).unwrap(), want);
    // HF layout: the snapshot entry links to the blob named by the etag.
    let blob = cache
        .path()
        .join("models--test--tiny/blobs")
        .join(etag(&want));
    assert_eq!(
        std::fs::canonicalize(&path).unwrap(),
        std::fs::canonicalize(&blob).unwrap()
    );
    let main_ref = cache.path().join("models--test--tiny/refs/main");
    assert_eq!(std::fs::read_to_string(main_ref).unwrap().trim(), SHA);
    let after_first = mock.files();
    assert!(after_first >= 1);

    let again = pull(&spec("test/tiny:Q8_0"), &o).unwrap();
    assert_eq!(again, path);
    assert_eq!(
        mock.files(),
        after_first,
        "the second pull requested the file again"
    );
    assert_eq!(mock.info_requests.load(Ordering::SeqCst), 2);

    // Offline (nothing listens on the endpoint): the cached snapshot.
    let dead = TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let offline = pull(&spec("test/tiny:Q8_0"), &opts(&dead_url, cache.path())).unwrap();
    assert_eq!(offline, path);
    let e = pull(&spec("test/tiny:Q4_0"), &opts(&dead_url, cache.path())).unwrap_err();
    let e = format!("{e:#}");
    assert!(e.contains("listing the files of test/tiny"), "{e}");
    assert!(e.contains("tiny-Q8_0.gguf"), "{e}");
}

#[test]
fn pull_without_quant_takes_the_default_quant() {
    let (r, _src) = repos();
    let want = r["test/tiny"]["tiny-Q4_0.gguf"].clone();
    let mock = start(r);
    let cache = tempfile::tempdir().unwrap();
    let path = pull(&spec("test/tiny"), &opts(&mock.url, cache.path())).unwrap();
    assert_eq!(
        path,
        snapshot(cache.path(), "models--test--tiny", "tiny-Q4_0.gguf")
    );
    assert_eq!(std::fs::read(&path).unwrap(), want);
}

#[test]
fn unmatched_or_ambiguous_choices_list_the_files() {
    let (r, _src) = repos();
    let mock = start(r);
    let cache = tempfile::tempdir().unwrap();
    let o = opts(&mock.url, cache.path());

    let e = format!("{:#}", pull(&spec("test/tiny:Q5_K_M"), &o).unwrap_err());
    assert!(e.contains("Q5_K_M"), "{e}");
    assert!(e.contains("tiny-Q4_0.gguf, tiny-Q8_0.gguf"), "{e}");
    assert!(!e.contains("mmproj"), "{e}");

    let e = format!("{:#}", pull(&spec("test/two"), &o).unwrap_err());
    assert!(e.contains("two-F16.gguf, two-Q8_0.gguf"), "{e}");
    assert!(e.contains("owner/name:QUANT"), "{e}");

    let e = format!("{:#}", pull(&spec("test/missing"), &o).unwrap_err());
    assert!(e.contains("test/missing") && e.contains("404"), "{e}");
    assert_eq!(mock.files(), 0, "nothing to download in any of these");
}

#[test]
fn spec_errors_name_the_problem() {
    for (s, want) in [
        ("test", "no '/'"),
        ("a/b/c", "more than one '/'"),
        ("test/tiny:", "empty quant"),
        ("te st/tiny", "character ' '"),
    ] {
        let e = format!("{:#}", s.parse::<HfSpec>().unwrap_err());
        assert!(e.contains(want), "{s:?}: {e}");
    }
}

#[test]
fn quire_pull_prints_the_path() {
    let (r, _src) = repos();
    let want = r["test/tiny"]["tiny-Q4_0.gguf"].clone();
    let mock = start(r);
    let cache = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_quire"))
        .args([
            "pull",
            "test/tiny:Q4_0",
            "--endpoint",
            &mock.url,
            "--cache-dir",
        ])
        .arg(cache.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "quire pull failed: {stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let path = PathBuf::from(stdout.trim_end_matches('\n'));
    assert_eq!(
        path,
        snapshot(cache.path(), "models--test--tiny", "tiny-Q4_0.gguf")
    );
    assert_eq!(std::fs::read(&path).unwrap(), want);

    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_quire"))
        .args([
            "pull",
            "test/tiny:Q2_K",
            "--endpoint",
            &mock.url,
            "--cache-dir",
        ])
        .arg(cache.path())
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("tiny-Q4_0.gguf, tiny-Q8_0.gguf"),
        "{stderr}"
    );
}
