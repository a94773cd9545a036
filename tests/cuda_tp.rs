//! Tensor-parallel ranks on the device (`dispatch/cuda/ranks.rs`): NCCL
//! communicators, the collectives' kernels, decode graphs that capture
//! them. The one-GPU machine runs one rank through all of it: in `exact`
//! bitwise the cpu, in `deterministic` bitwise the plain device run, in
//! `fast` close; a second rank on one device is a clear error. Several
//! GPUs are needed for more (docs/PERF.md names the runs).

mod common;

use common::tp::{all, load, load_on, synth_model};
use common::{bits, nmse};
use quire::quant::GgmlType;
use quire::runner::{Runner, RunnerOptions};

#[test]
#[ignore = "needs a CUDA device and NCCL (libnccl.so): scripts/gpu-check.sh"]
fn one_rank_on_the_device_through_nccl() {
    common::cuda::require_device();
    let dir = tempfile::tempdir().unwrap();
    let path = synth_model(dir.path(), "tiny-llama-kv4", GgmlType::Q4_0);
    let cpu = all(&mut load(&path, "exact", None));
    let mut r = load_on(&path, "exact", Some(1), "required");
    let got = all(&mut r);
    assert!(
        bits(&got) == bits(&cpu),
        "exact, one rank on the device: nmse {:e} against the cpu",
        nmse(&got, &cpu)
    );
    let p = r.step_paths().expect("a device runner");
    assert!(p.graph > 0 && p.capture_failures == 0, "{p:?}");
    let ran = |r: &Runner, kind: &str| {
        r.backend_report()
            .iter()
            .any(|(k, b, n)| k == kind && b == "cuda" && *n > 0)
    };
    assert!(ran(&r, "all_gather"), "{:?}", r.backend_report());
    for mode in ["deterministic", "fast"] {
        let plain = all(&mut load_on(&path, mode, None, "required"));
        let mut r = load_on(&path, mode, Some(1), "required");
        let one = all(&mut r);
        assert!(ran(&r, "all_reduce"), "{mode}: {:?}", r.backend_report());
        match mode {
            "deterministic" => assert!(
                bits(&one) == bits(&plain),
                "deterministic, one rank: nmse {:e} against the plain device run",
                nmse(&one, &plain)
            ),
            _ => {
                let e = nmse(&one, &plain);
                assert!(e < 1e-6, "fast, one rank: nmse {e:e}");
            }
        }
    }
    // NCCL refuses two ranks on one GPU; Quire asks for a device per rank.
    let n = 1 + quire::backend::cuda::device_count().unwrap_or(1);
    let e = match Runner::load(
        &path,
        &RunnerOptions {
            tensor_parallel: Some(n),
            gpu: "required".parse().unwrap(),
            ..Default::default()
        },
    ) {
        Ok(_) => panic!("{n} ranks loaded on {} devices", n - 1),
        Err(e) => format!("{e:#}"),
    };
    assert!(e.contains(&format!("no CUDA device {}", n - 1)), "{e}");
}
