//! The fuzz targets of tests/fuzz.rs (see scripts/fuzz.sh for long runs).

pub mod gguf;
pub mod gguf_raw;
pub mod http;
pub mod template;

use proptest::test_runner::Config;

/// proptest's config for a target: `default_cases` unless PROPTEST_CASES
/// says otherwise (scripts/fuzz.sh sets it for long runs). Failures are not
/// persisted to files; proptest prints the minimal failing input, and the
/// script keeps the output.
pub fn config(default_cases: u32) -> Config {
    let cases = match std::env::var("PROPTEST_CASES") {
        Ok(_) => Config::default().cases,
        Err(_) => default_cases,
    };
    Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 256,
        ..Config::default()
    }
}

/// The cases a target ran, for scripts/fuzz.sh's summary (the line is
/// printed with --nocapture).
pub fn report(target: &str, cases: u32, extra: &str) {
    println!("fuzz-cases {target} {cases} {extra}");
}
