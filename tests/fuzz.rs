//! Fuzzing on stable Rust with proptest, in one test binary (one link):
//! structure-aware GGUF mutation through the model load path, chat
//! template mutation through rendering, and mutated HTTP requests through
//! the router in process. Default case counts keep the three within about
//! two minutes in a release test build on two cores; PROPTEST_CASES raises
//! them, and scripts/fuzz.sh loops runs for a given number of minutes.

mod fuzz_util;

use fuzz_util::{config, gguf, http, report, template};
use proptest::test_runner::TestRunner;
use std::sync::atomic::{AtomicU32, Ordering};

#[test]
fn fuzz_gguf_load() {
    let bases = gguf::bases();
    let dir = tempfile::tempdir().unwrap();
    let loaded = AtomicU32::new(0);
    let cfg = config(3000);
    let cases = cfg.cases;
    let mut runner = TestRunner::new(cfg);
    let res = runner.run(&gguf::case(), |(seed, muts)| {
        let bytes = gguf::build(&seed, &muts);
        if gguf::check(dir.path(), &bytes)? {
            loaded.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    });
    if let Err(e) = res {
        panic!("{e}");
    }
    let ok = loaded.load(Ordering::Relaxed);
    report(
        "gguf",
        cases,
        &format!("({ok} loaded, {} seeds)", bases.len()),
    );
    // Some mutations (a changed float, a deleted optional key) leave a
    // loadable file: if none ever loads, the use path is not being fuzzed.
    assert!(
        ok > 0 || cases < 50,
        "no mutated file loaded in {cases} cases"
    );
}

#[test]
fn fuzz_chat_template() {
    let cfg = config(10_000);
    let cases = cfg.cases;
    let rendered = AtomicU32::new(0);
    let mut runner = TestRunner::new(cfg);
    let res = runner.run(&template::case(), |(t, muts, msgs, gen)| {
        let src = template::build(&t, &muts);
        if template::check(&src, &msgs, gen)? {
            rendered.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    });
    if let Err(e) = res {
        panic!("{e}");
    }
    let ok = rendered.load(Ordering::Relaxed);
    report("template", cases, &format!("({ok} rendered)"));
    assert!(
        ok > 0 || cases < 50,
        "no mutated template rendered in {cases} cases"
    );
}

#[test]
fn fuzz_http_router() {
    let Some(t) = http::target() else { return };
    let cfg = config(3000);
    let cases = cfg.cases;
    let mut runner = TestRunner::new(cfg);
    let res = runner.run(&http::case(), |r| http::check(t, &r));
    if let Err(e) = res {
        panic!("{e}");
    }
    report("http", cases, "");
}
