//! The quantized KV cache on the default model (`--kv-type`): perplexity
//! of a text with Q8_0 rows stays within 2% of the f16 cache's and with
//! Q4_0 rows within 30% (SmolLM2's 64-value heads are two blocks each),
//! the same bits run to run, and a GPU-only run asks for f16 clearly.

use std::process::Command;

const TEXT: &str = "The paged KV cache stores the keys and values of every token a \
sequence has seen, in blocks of sixteen positions that a block table maps to physical \
memory. Attention reads them in place. Storing each head's row as blocks of thirty-two \
eight-bit values with one scale halves the memory, so twice as many tokens fit, and \
four-bit values with one scale take a little over a quarter. The price is accuracy: \
every key and value is rounded once, when it is written, and read back as the scale \
times its integer. Small models with short heads feel that rounding more than large \
ones. This paragraph exists to be scored: the perplexity of the default model on it, \
with each storage, shows what the rounding costs. It is long enough for a few hundred \
tokens, so that the cache holds many rows when the last ones are scored.";

fn ppl(kv: &str, file: &std::path::Path) -> f64 {
    let out = Command::new(env!("CARGO_BIN_EXE_quire"))
        .args(["perplexity", "--kv-type", kv, "-t", "2", "--ctx", "128"])
        .arg(file)
        .output()
        .expect("running quire perplexity");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "--kv-type {kv}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout.lines().last().expect("a JSON line");
    let v: serde_json::Value = serde_json::from_str(line).expect("JSON");
    v["ppl"].as_f64().expect("ppl")
}

#[test]
fn quantized_kv_perplexity_stays_close_to_f16() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("text.txt");
    std::fs::write(&f, TEXT).unwrap();
    let base = ppl("f16", &f);
    let q8 = ppl("q8_0", &f);
    let q4 = ppl("q4_0", &f);
    println!("perplexity: f16 {base:.4}, q8_0 {q8:.4}, q4_0 {q4:.4}");
    assert!(base.is_finite() && base > 1.0);
    assert!(
        (q8 / base - 1.0).abs() < 0.02,
        "q8_0 {q8} against f16 {base}"
    );
    assert!(
        (q4 / base - 1.0).abs() < 0.30,
        "q4_0 {q4} against f16 {base}"
    );
    // Quantized rows change the numbers (the option takes effect) and
    // give the same bits again.
    assert_ne!(q8, base);
    assert_eq!(ppl("q8_0", &f).to_bits(), q8.to_bits());
}

#[test]
fn gpu_required_with_a_quantized_kv_cache_names_the_alternative() {
    let out = Command::new(env!("CARGO_BIN_EXE_quire"))
        .args([
            "run",
            "--gpu",
            "required",
            "--kv-type",
            "q8_0",
            "-n",
            "1",
            "-p",
            "hi",
        ])
        .output()
        .expect("running quire run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--kv-type f16") && err.contains("--gpu off"),
        "{err}"
    );
}
