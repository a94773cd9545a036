//! Tensor-parallel ranks on the device (`dispatch/cuda/ranks.rs`): NCCL
//! communicators, the collectives' kernels, decode graphs that capture
//! them. The one-GPU machine runs one rank through all of it: in `exact`
//! bitwise the cpu, in `deterministic` bitwise the plain device run, in
//! `fast` close; a second rank on one device is a clear error. The
//! collectives' kernels are checked for 2 to 8 ranks on their own, against
//! the cpu's arithmetic. Several GPUs are needed for more (docs/PERF.md
//! names the runs).

mod common;

use common::tp::{all, load, load_on, synth_model};
use common::{bits, nmse};
use quire::backend::cpu::ops::collective::{interleave, sum_ranks};
use quire::backend::GpuMode;
use quire::quant::GgmlType;
use quire::runner::{Runner, RunnerOptions};
use rand::{Rng, SeedableRng};

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

/// Bits, every NaN as one value (a GPU's arithmetic returns the canonical
/// NaN, x86 the first operand's payload: where NaNs are is what must agree).
fn bits_nan(v: &[f32]) -> Vec<u32> {
    v.iter()
        .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
        .collect()
}

/// `tp_interleave` and `tp_sum_ranks` on parts of 2 to 8 ranks (what NCCL's
/// all-gather hands them) against the cpu's `interleave` / `sum_ranks`:
/// bitwise, with NaN and infinities at the same places.
#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn collective_kernels_are_bitwise_the_cpu() {
    let be = common::cuda::backend(GpuMode::Required);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let mut vals = |len: usize| -> Vec<f32> {
        (0..len)
            .map(|i| match i % 97 {
                13 => f32::NAN,
                41 => f32::INFINITY,
                _ => rng.random_range(-1e3f32..1e3) * rng.random_range(1e-6f32..1.0),
            })
            .collect()
    };
    for (n, w, world) in [(1, 1, 2), (3, 5, 2), (7, 64, 3), (2, 1000, 4), (33, 96, 8)] {
        let len = n * w * world;
        let parts = vals(len);
        let base = vals(len);
        let pd = be.up(&parts, "parts").unwrap();
        for add in [false, true] {
            let mut want = base.clone();
            interleave(&parts, n, world, &mut want, add);
            let mut od = be.up(&base, "out").unwrap();
            be.tp_interleave(&pd.slice(..), n, world, &mut od.slice_mut(..), add)
                .unwrap();
            let mut got = vec![0f32; len];
            be.down(&od, &mut got, "out").unwrap();
            assert_eq!(
                bits_nan(&got),
                bits_nan(&want),
                "interleave {n}x{w}, {world} ranks, add {add}"
            );
        }
        let mut want = base[..n * w].to_vec();
        sum_ranks(&parts, world, &mut want);
        let mut od = be.up(&base[..n * w], "out").unwrap();
        be.tp_sum_ranks(&pd.slice(..), world, &mut od.slice_mut(..))
            .unwrap();
        let mut got = vec![0f32; n * w];
        be.down(&od, &mut got, "out").unwrap();
        assert_eq!(
            bits_nan(&got),
            bits_nan(&want),
            "sum_ranks {n}x{w}, {world} ranks"
        );
    }
}
