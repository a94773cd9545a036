//! End-to-end tests of `quire serve` driven by the official `openai` Python
//! client (tests/py/openai_suite.py): chat and completions, streaming and
//! not, logprobs, stop strings, n and seed, errors, 32 concurrent streams,
//! batch invariance end to end; structured outputs and forced tool calls
//! (tests/py/openai_structured.py).

mod server_util;

use server_util::Server;
use std::process::Command;

const KEY: &str = "sk-quire-test";

fn python() -> String {
    std::env::var("QUIRE_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// Whether the interpreter has `openai`; prints SKIPPED when not.
fn have_openai(test: &str) -> bool {
    match Command::new(python())
        .args(["-c", "import openai"])
        .output()
    {
        Ok(o) if o.status.success() => true,
        Ok(o) => {
            eprintln!(
                "SKIPPED: {test}: `{}` cannot import openai ({}); run scripts/setup-test-env.sh and set QUIRE_PYTHON",
                python(),
                String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("")
            );
            false
        }
        Err(e) => {
            eprintln!("SKIPPED: {test}: cannot run `{}`: {e}", python());
            false
        }
    }
}

fn run_suite(test: &str, names: &[&str]) {
    run_script(test, "openai_suite.py", names);
}

/// Runs `names` of tests/py/`script` against a fresh server.
fn run_script(test: &str, script: &str, names: &[&str]) {
    if !have_openai(test) {
        return;
    }
    let Some(srv) = Server::start(test, Some(KEY), &[]) else {
        return;
    };
    let script = format!("{}/tests/py/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(python())
        .arg(&script)
        .arg(srv.base_url())
        .arg(KEY)
        .arg(&srv.model_id)
        .args(names)
        .output()
        .expect("running the openai suite");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(
        out.status.success(),
        "openai suite failed:\n{stdout}\n{stderr}"
    );
    // Every requested test reported ok (a SKIPPED suite would not).
    for n in names {
        assert!(
            stdout.lines().any(|l| l.starts_with(&format!("ok {n} "))),
            "{n} did not report ok:\n{stdout}"
        );
    }
}

#[test]
fn server_openai_api() {
    run_suite(
        "server_openai_api",
        &[
            "models",
            "chat_basic",
            "completions_logprobs",
            "chat_logprobs",
            "stop_strings",
            "n_and_seed",
            "errors",
            "completions_list_echo",
        ],
    );
}

#[test]
fn server_openai_concurrency() {
    run_suite(
        "server_openai_concurrency",
        &["concurrent_streams", "batch_invariance"],
    );
}

/// Structured outputs and forced tool calls (tests/py/openai_structured.py):
/// 20 random JSON schemas validated with `jsonschema`, json_object, the
/// grammar extension, tool_choice "required" and named, streamed and not.
#[test]
fn server_openai_structured() {
    run_script(
        "server_openai_structured",
        "openai_structured.py",
        &[
            "json_schema_random",
            "json_schema_stream_n",
            "json_object",
            "grammar_extension",
            "tool_required",
            "tool_named",
            "structured_errors",
        ],
    );
}
