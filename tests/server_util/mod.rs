//! Helpers for the end-to-end server tests: start the built `quire serve`
//! binary on 127.0.0.1 with a free port, raw HTTP over TcpStream, metrics.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub struct Server {
    child: Child,
    /// host:port
    pub addr: String,
    pub key: Option<String>,
    pub model_id: String,
}

/// The default model, or None (after printing SKIPPED) when it cannot be had.
pub fn default_model(test: &str) -> Option<PathBuf> {
    match quire::fetch::default_model_path() {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!("SKIPPED: {test}: the default model is unavailable: {e:#}");
            None
        }
    }
}

impl Server {
    /// Starts `quire serve` on the default model. None (SKIPPED printed)
    /// when the model is unavailable; panics if the server fails to start.
    pub fn start(test: &str, key: Option<&str>, extra: &[&str]) -> Option<Server> {
        let model = default_model(test)?;
        Some(Self::start_model(&model, key, extra))
    }

    /// Starts `quire serve` on `model`; panics if it fails to start.
    pub fn start_model(model: &std::path::Path, key: Option<&str>, extra: &[&str]) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_quire"));
        cmd.arg("serve")
            .arg("--model")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", "0"])
            .args(extra)
            .env_remove("QUIRE_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(k) = key {
            cmd.args(["--api-key", k]);
        }
        let mut child = cmd.spawn().expect("spawning quire serve");
        let stderr = child.stderr.take().expect("stderr piped");
        let (tx, rx) = mpsc::channel();
        // Drain stderr for the server's whole life (a full pipe would block
        // it) and report the listening line.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(rest.trim().to_string());
                }
                eprintln!("[server] {line}");
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!("quire serve did not start listening within 120 s");
            }
        };
        let model_id = model
            .file_name()
            .unwrap()
            .to_string_lossy()
            .trim_end_matches(".gguf")
            .to_string();
        Server {
            child,
            addr,
            key: key.map(str::to_string),
            model_id,
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    fn auth_headers(&self) -> Vec<(String, String)> {
        self.key
            .iter()
            .map(|k| ("Authorization".to_string(), format!("Bearer {k}")))
            .collect()
    }

    /// A request with the server's key (if any).
    pub fn request(&self, method: &str, path: &str, body: Option<&str>) -> Response {
        let h = self.auth_headers();
        let hr: Vec<(&str, &str)> = h.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        http(&self.addr, method, path, &hr, body)
    }

    /// The value of an unlabelled metric line `name value`.
    pub fn metric(&self, name: &str) -> f64 {
        let r = self.request("GET", "/metrics", None);
        assert_eq!(r.status, 200, "GET /metrics: {}", r.body);
        r.body
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("metric {name} missing:\n{}", r.body))
            .trim()
            .parse()
            .expect("metric value")
    }

    /// Waits until `quire_kv_blocks_used` and `quire_running_sequences` are
    /// both 0; returns false on timeout.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < timeout {
            if self.metric("quire_kv_blocks_used") == 0.0
                && self.metric("quire_running_sequences") == 0.0
                && self.metric("quire_queue_depth") == 0.0
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// Sends SIGTERM (graceful shutdown) and waits up to `timeout` for the
    /// exit; returns the exit status, or None on timeout (then kills).
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let st = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("running kill");
        assert!(st.success(), "kill -TERM failed");
        let t0 = Instant::now();
        while t0.elapsed() < timeout {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        None
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: HashMap<String, String>,
    pub body: String,
}

impl Response {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("response is not JSON ({e}): {}", self.body))
    }
}

fn write_request(
    s: &mut TcpStream,
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    req.push_str("\r\n");
    if let Some(b) = body {
        req.push_str(b);
    }
    s.write_all(req.as_bytes()).expect("writing the request");
}

/// One HTTP/1.1 request (Connection: close); the body is de-chunked.
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Response {
    let mut s = TcpStream::connect(addr).expect("connecting to the server");
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    write_request(&mut s, addr, method, path, headers, body);
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("reading the response");
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> Response {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {text:?}"));
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad status line in {head:?}"));
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let body = if headers
        .get("transfer-encoding")
        .is_some_and(|v| v.contains("chunked"))
    {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Response {
        status,
        headers,
        body,
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Opens a streaming request and returns the socket once `n_events` SSE
/// `data:` lines have arrived (the caller may then drop it: a disconnect).
pub fn open_stream(
    addr: &str,
    key: Option<&str>,
    path: &str,
    body: &str,
    n_events: usize,
) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connecting to the server");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let auth = key.map(|k| format!("Bearer {k}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
    write_request(&mut s, addr, "POST", path, &headers, Some(body));
    let mut seen = 0;
    let mut buf = [0u8; 4096];
    let mut acc = String::new();
    while seen < n_events {
        let n = s.read(&mut buf).expect("reading the stream");
        assert!(n > 0, "stream ended after {seen} events: {acc}");
        acc.push_str(&String::from_utf8_lossy(&buf[..n]));
        seen = acc.matches("data: ").count();
    }
    assert!(acc.starts_with("HTTP/1.1 200"), "stream status: {acc}");
    s
}

/// An in-process server state on the default model (engine thread
/// started), for tests through `quire::server::router` or
/// `quire::server::conn::serve`. None (SKIPPED printed) when the model is
/// unavailable.
pub fn in_process_state(
    test: &str,
    kv_tokens: usize,
    max_queue: usize,
) -> Option<std::sync::Arc<quire::server::AppState>> {
    let path = default_model(test)?;
    let opts = quire::runner::RunnerOptions {
        kv_tokens: Some(kv_tokens),
        ..Default::default()
    };
    let runner = quire::runner::Runner::load(&path, &opts).expect("loading the default model");
    let tok = quire::tokenizer::Tokenizer::from_gguf(&runner.gguf).expect("tokenizer");
    let cfg = quire::serve::EngineConfig {
        max_queue,
        ..Default::default()
    };
    // The engine thread ends when the last handle (in the state) drops.
    let (engine, _join) = quire::serve::spawn(runner, cfg).expect("starting the engine");
    let model_id = path
        .file_name()
        .unwrap()
        .to_string_lossy()
        .trim_end_matches(".gguf")
        .to_string();
    Some(std::sync::Arc::new(quire::server::AppState::new(
        engine,
        std::sync::Arc::new(tok),
        model_id,
    )))
}
