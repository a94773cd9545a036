//! Issue 59 F7: API key edge cases. An empty or whitespace-only key refuses
//! to start; the `Bearer` scheme is case-insensitive; with a key set, unknown
//! paths answer 401 without it (only /health stays open).

mod server_util;

use server_util::{default_model, http, Server};
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const KEY: &str = "test-key-456";

/// Runs `quire serve --api-key <key>` and expects it to exit non-zero
/// (within 60 s) with `needle` on stderr.
fn refuses_key(test: &str, key: &str, needle: &str) {
    let Some(model) = default_model(test) else {
        return;
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_quire"))
        .arg("serve")
        .arg("--model")
        .arg(&model)
        .args(["--host", "127.0.0.1", "--port", "0", "--api-key", key])
        .env_remove("QUIRE_API_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning quire serve");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("quire serve --api-key {key:?} kept running: it must refuse to start");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success(), "exit {status}: {err}");
    assert!(err.contains("--api-key") && err.contains(needle), "{err}");
}

#[test]
fn empty_api_key_refuses_to_start() {
    refuses_key("empty_api_key_refuses_to_start", "", "empty");
}

#[test]
fn whitespace_api_key_refuses_to_start() {
    refuses_key("whitespace_api_key_refuses_to_start", "   ", "whitespace");
}

#[test]
fn bearer_scheme_and_unknown_paths() {
    let Some(srv) = Server::start("bearer_scheme_and_unknown_paths", Some(KEY), &[]) else {
        return;
    };
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let h = format!("{scheme} {KEY}");
        let r = http(
            &srv.addr,
            "GET",
            "/v1/models",
            &[("Authorization", &h)],
            None,
        );
        assert_eq!(r.status, 200, "{scheme}: {}", r.body);
    }
    // Another scheme, or the key alone, is refused.
    for h in [format!("Basic {KEY}"), KEY.to_string()] {
        let r = http(
            &srv.addr,
            "GET",
            "/v1/models",
            &[("Authorization", &h)],
            None,
        );
        assert_eq!(r.status, 401, "{h}: {}", r.body);
    }
    // Unknown paths: 401 without a valid key, 404 with one.
    for path in ["/nope", "/v1/nope", "/v1/models/x/y"] {
        let r = http(&srv.addr, "GET", path, &[], None);
        assert_eq!(r.status, 401, "{path}: {}", r.body);
        assert!(r.body.contains("API key"), "{path}: {}", r.body);
        let r = http(
            &srv.addr,
            "POST",
            path,
            &[("Authorization", "Bearer wrong")],
            Some("{}"),
        );
        assert_eq!(r.status, 401, "{path}: {}", r.body);
        let r = srv.request("GET", path, None);
        assert_eq!(r.status, 404, "{path}: {}", r.body);
    }
    // A wrong method on a known route needs the key too.
    let r = http(&srv.addr, "GET", "/v1/chat/completions", &[], None);
    assert_eq!(r.status, 401, "{}", r.body);
    // /health stays open.
    let r = http(&srv.addr, "GET", "/health", &[], None);
    assert_eq!(r.status, 200, "{}", r.body);
}
