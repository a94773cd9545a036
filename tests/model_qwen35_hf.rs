//! A tiny random-weight Qwen3.5 (llama.cpp architecture `qwen35`: Gated
//! DeltaNet + gated full attention), built with transformers and converted
//! to GGUF by llama.cpp's own converter (tests/py/qwen35_fixture.py), gives
//! transformers' float32 logits at every position and the same greedy
//! continuation.
//!
//! The fixture has H_v = 2 * H_k (so the converter's v-head reorder is not
//! the identity), 8 layers (6 GDN, 2 attention), randomized norm weights,
//! A_log and dt_bias, and prompts of 24, 37 and 77 tokens (77 spans two of
//! transformers' 64-token GDN chunks). Checked for the f32 and f16 GGUFs and
//! for a GGUF whose converter kept one MTP block (block_count = 9,
//! nextn_predict_layers = 1), which normal decoding must skip.
//!
//! Tolerance: NMSE per position over the vocabulary below 1e-6, the bound
//! tests/model_hf.rs uses for llama/qwen2/qwen3. The f16 file is compared
//! with transformers running on the same f16-rounded matrices (rounding
//! alone moves these logits by NMSE up to 4e-4), so both bounds measure
//! Quire's arithmetic, not the weight format. The fixture redraws any prompt
//! whose greedy continuation has a top-2 logit gap below 0.02, so an exact
//! greedy match is not decided by rounding.
//!
//! The fixture takes about 90 s and is cached under the cargo target tmp
//! directory, keyed by a hash of the script. Needs the interpreter in
//! `QUIRE_PYTHON` with torch, transformers (>= 5, with qwen3_5), tokenizers,
//! safetensors and numpy (scripts/setup-test-env.sh); SKIPPED otherwise. The
//! first run fetches the pinned llama-cpp-python sdist with pip for its
//! converter (nothing is built).

mod common;

use common::{nmse, python, python_has, repo_path};
use quire::engine::teacher_forced_logits;
use quire::kv::SeqId;
use quire::runner::{LogitsWanted, Runner, RunnerOptions, SeqWork};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const BOUND: f64 = 1e-6;
const SCRIPT: &str = "tests/py/qwen35_fixture.py";
const FILES: [&str; 4] = [
    "reference.json",
    "qwen35-f32.gguf",
    "qwen35-f16.gguf",
    "qwen35-mtp-f32.gguf",
];

/// FNV-1a: a stable cache key for the script's contents.
fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Builds the fixture once per script version; None (SKIPPED printed) when
/// the Python packages are missing. A failing script is a test failure.
fn fixture() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let mods = [
            "torch",
            "transformers.models.qwen3_5",
            "tokenizers",
            "safetensors",
            "numpy",
        ];
        if !python_has("model_qwen35_hf", &mods) {
            return None;
        }
        let script = repo_path(SCRIPT);
        let src = std::fs::read(&script).expect("reading the fixture script");
        let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("qwen35-fixture");
        let dir = cache.join(format!("{:016x}", fnv64(&src)));
        if FILES.iter().all(|f| dir.join(f).is_file()) {
            return Some(dir);
        }
        // Built beside the final name and renamed, so an interrupted run
        // never leaves a directory that looks complete.
        let tmp = cache.join(format!("build-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let out = Command::new(python())
            .arg(&script)
            .arg(&tmp)
            .arg("--cache")
            .arg(&cache)
            .output()
            .expect("running the qwen35 fixture script");
        assert!(
            out.status.success(),
            "{SCRIPT} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("{}", String::from_utf8_lossy(&out.stdout));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(&tmp, &dir).expect("moving the fixture into place");
        Some(dir)
    })
    .as_deref()
}

struct Case {
    prompt: Vec<u32>,
    greedy: Vec<u32>,
    /// Logits after each token of prompt + greedy, one row per position.
    logits: Vec<Vec<f32>>,
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("token array")
        .iter()
        .map(|x| x.as_u64().expect("token id") as u32)
        .collect()
}

/// The reference for one weight type ("f32" or "f16") and the vocab size.
fn reference(dir: &Path, kind: &str) -> (usize, Vec<Case>) {
    let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
    let j: Value = serde_json::from_str(&text).unwrap();
    let vocab = j["vocab_size"].as_u64().unwrap() as usize;
    let cases = j["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let r = &c[kind];
            let logits: Vec<Vec<f32>> = r["logits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|row| {
                    let row: Vec<f32> = row
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_f64().unwrap() as f32)
                        .collect();
                    assert_eq!(row.len(), vocab);
                    row
                })
                .collect();
            let case = Case {
                prompt: u32s(&c["prompt"]),
                greedy: u32s(&r["greedy"]),
                logits,
            };
            assert_eq!(case.logits.len(), case.prompt.len() + case.greedy.len());
            case
        })
        .collect();
    (vocab, cases)
}

/// Index of the largest logit, the first one on ties (as torch.argmax).
fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in l.iter().enumerate() {
        if x > l[best] {
            best = i;
        }
    }
    best as u32
}

fn check(file: &str, kind: &str) {
    let test = format!("model_qwen35_hf {file}");
    let Some(dir) = fixture() else {
        return;
    };
    let (v, cases) = reference(dir, kind);
    let mut r = Runner::load(&dir.join(file), &RunnerOptions::default())
        .unwrap_or_else(|e| panic!("{test}: loading: {e:#}"));
    assert_eq!(r.config().vocab_size, v, "{test}: vocab size");
    let mut worst = 0f64;
    for (ci, c) in cases.iter().enumerate() {
        let seq: Vec<u32> = c.prompt.iter().chain(&c.greedy).copied().collect();
        // Teacher forced over prompt + continuation: all at once, and in
        // 7-token steps so recurrent and KV state carry across calls.
        for ubatch in [seq.len(), 7] {
            let got = teacher_forced_logits(&mut r, SeqId(1), &seq, ubatch)
                .unwrap_or_else(|e| panic!("{test}: case {ci}: {e:#}"));
            assert_eq!(got.len(), seq.len() * v, "{test}: case {ci}: logits length");
            for (p, want) in c.logits.iter().enumerate() {
                let e = nmse(&got[p * v..(p + 1) * v], want);
                worst = worst.max(e);
                assert!(
                    e < BOUND,
                    "{test}: case {ci} (prompt {} tokens), ubatch {ubatch}, position {p}: NMSE {e:.3e} >= {BOUND:.0e}",
                    c.prompt.len()
                );
            }
        }

        // Greedy: prefill the prompt, then decode one token per step.
        let n = c.prompt.len();
        let mut last = r
            .step(&[SeqWork {
                seq: SeqId(2),
                tokens: &c.prompt,
                start_pos: 0,
                logits: LogitsWanted::Last,
            }])
            .unwrap_or_else(|e| panic!("{test}: case {ci}: prefill: {e:#}"))
            .pop()
            .unwrap();
        let mut got_tokens = Vec::new();
        for j in 0..c.greedy.len() {
            let e = nmse(&last, &c.logits[n - 1 + j]);
            worst = worst.max(e);
            assert!(
                e < BOUND,
                "{test}: case {ci}: decode step {j}: NMSE {e:.3e} >= {BOUND:.0e}"
            );
            let t = argmax(&last);
            got_tokens.push(t);
            assert_eq!(
                got_tokens,
                c.greedy[..=j],
                "{test}: case {ci}: greedy continuation differs at step {j}"
            );
            if j + 1 < c.greedy.len() {
                last = r
                    .step(&[SeqWork {
                        seq: SeqId(2),
                        tokens: &[t],
                        start_pos: n + j,
                        logits: LogitsWanted::Last,
                    }])
                    .unwrap_or_else(|e| panic!("{test}: case {ci}: decode step {j}: {e:#}"))
                    .pop()
                    .unwrap();
            }
        }
        r.free(SeqId(2));
    }
    eprintln!("{test}: worst NMSE {worst:.3e} (bound {BOUND:.0e})");
}

#[test]
fn qwen35_f32_matches_transformers() {
    check("qwen35-f32.gguf", "f32");
}

#[test]
fn qwen35_f16_matches_transformers() {
    check("qwen35-f16.gguf", "f16");
}

#[test]
fn qwen35_with_mtp_block_matches_transformers() {
    check("qwen35-mtp-f32.gguf", "f32");
}

/// llama.cpp (through llama-cpp-python, when installed) on the same file:
/// the same greedy continuation, and the same top-1 token at every prompt
/// position where the reference's two best logits are not a near tie.
#[test]
fn qwen35_matches_llama_cpp() {
    let test = "model_qwen35_hf llama.cpp";
    let Some(dir) = fixture() else {
        return;
    };
    if !python_has(test, &["llama_cpp", "numpy"]) {
        return;
    }
    let (v, cases) = reference(dir, "f32");
    let model = dir.join("qwen35-f32.gguf");
    let req = serde_json::json!({
        "model": model,
        "prompts": cases.iter().map(|c| c.prompt.clone()).collect::<Vec<_>>(),
        "greedy": cases[0].greedy.len(),
    });
    let mut child = Command::new(python())
        .arg(repo_path("tests/py/llamacpp_qwen35.py"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running llama-cpp-python");
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), req.to_string().as_bytes()).unwrap();
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{test}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut r = Runner::load(&model, &RunnerOptions::default()).unwrap();
    let (mut agree, mut compared) = (0, 0);
    for (ci, c) in cases.iter().enumerate() {
        let theirs_greedy = u32s(&j["greedy"][ci]);
        assert_eq!(theirs_greedy.len(), c.greedy.len());
        // Ours equals transformers' (checked above); llama.cpp's must too.
        assert_eq!(theirs_greedy, c.greedy, "{test}: case {ci}: greedy");
        let ours = teacher_forced_logits(&mut r, SeqId(1), &c.prompt, c.prompt.len()).unwrap();
        let theirs = u32s(&j["top1"][ci]);
        assert_eq!(theirs.len(), c.prompt.len());
        for (p, &t) in theirs.iter().enumerate() {
            let row = &ours[p * v..(p + 1) * v];
            let best = argmax(row);
            let mut sorted = row.to_vec();
            sorted.sort_by(|a, b| b.total_cmp(a));
            if sorted[0] - sorted[1] < 1e-3 {
                continue;
            }
            compared += 1;
            if best == t {
                agree += 1;
            }
        }
    }
    eprintln!("{test}: top-1 agreement {agree}/{compared} positions");
    assert!(compared > 0);
    assert_eq!(agree, compared, "{test}: top-1 differs at some positions");
}
