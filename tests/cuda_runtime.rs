//! CUDA backend at run time. On a device (`#[ignore]`d: run with
//! `--ignored`, as scripts/gpu-check.sh does; they fail without a usable
//! device): the op parity harness (quick grid, exact mode) against the cpu,
//! the hybrid ops' cases in every mode and state path, and the GpuMode
//! contract on an unsupported op. Without a GPU (CI): the
//! GpuMode contract turns absence into errors.

mod common;

use common::cuda::backend;
use quire::backend::cpu::CpuBackend;
use quire::backend::cuda::device::compile as source;
use quire::backend::cuda::CudaBackend;
use quire::backend::{GpuMode, Mode};
use quire::opcheck;

#[test]
fn off_never_builds_a_device_backend() {
    let e = CudaBackend::new(GpuMode::Off)
        .err()
        .expect("off must refuse");
    assert!(format!("{e:#}").contains("off"), "{e:#}");
}

/// Its premise is a machine without the CUDA driver or without NVRTC (CI
/// has no libcuda): where both load, it fails saying so (GPU machines run
/// the device tests, `--ignored`, instead).
#[test]
fn missing_driver_or_nvrtc_is_an_error_not_a_panic() {
    let (driver, nvrtc) = (source::driver_present(), source::nvrtc_present());
    assert!(
        !(driver && nvrtc),
        "premise: a machine without the CUDA driver (libcuda) or NVRTC, as CI is. \
         Both load here, so their absence cannot be checked; on a GPU machine \
         run the device tests instead (--ignored; scripts/gpu-check.sh tests)"
    );
    let missing = if driver { "libnvrtc" } else { "libcuda" };
    for mode in [GpuMode::Auto, GpuMode::Required] {
        let e = CudaBackend::new(mode)
            .err()
            .expect("no driver/NVRTC: construction must fail");
        let msg = format!("{e:#}");
        assert!(
            msg.contains(missing),
            "the error should name what is missing ({missing}): {msg}"
        );
    }
}

#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn cuda_ops_match_cpu_bitwise_in_exact_mode() {
    let be = backend(GpuMode::Auto);
    let cpu = CpuBackend::new(Some(2)).unwrap();
    let opts = opcheck::Options {
        mode: Mode::Exact,
        op_filter: None,
        perf: false,
        seed: 7,
        quick: true,
        wave_tail_forced: false,
    };
    let res = opcheck::run(&be, &cpu, &opts);
    let (p, f, u) = opcheck::summary(&res);
    for r in &res {
        if !matches!(r.status, opcheck::Status::Pass) {
            eprintln!("{r}");
        }
    }
    assert_eq!(f, 0, "{f} cases failed");
    assert_eq!(u, 0, "{u} cases unsupported");
    assert!(p > 100);
}

/// The hybrid (Gated DeltaNet) ops, the whole grid: bitwise equal to the
/// cpu in every mode (one canonical kernel each), with the fused and the
/// unfused state paths (tuning `gdn.fused`), which must also equal each
/// other; none unsupported.
#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn cuda_hybrid_ops_match_cpu_bitwise_in_every_mode_and_state_path() {
    let mut be = backend(GpuMode::Auto).without_fallback();
    let cpu = CpuBackend::new(Some(2)).unwrap();
    for mode in [Mode::Exact, Mode::Deterministic, Mode::Fast] {
        let opts = opcheck::Options {
            mode,
            op_filter: None,
            perf: false,
            seed: 11,
            quick: false,
            wave_tail_forced: false,
        };
        let mut res = opcheck::hybrid::run(&be, &cpu, &opts);
        res.extend(opcheck::hybrid::state_paths(&mut be, &cpu, &opts));
        let (p, f, u) = opcheck::summary(&res);
        for r in &res {
            if !matches!(r.status, opcheck::Status::Pass) {
                eprintln!("{mode:?}: {r}");
            }
        }
        assert_eq!((f, u), (0, 0), "{mode:?}: {f} failed, {u} unsupported");
        assert!(p >= 70, "{mode:?}: only {p} cases");
    }
}

/// head_dim 320 is beyond the attention kernel: `auto` declines it (dispatch
/// falls back), `required` accepts it and fails naming the op and reason.
#[test]
#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]
fn unsupported_op_auto_declines_required_errors() {
    use half::f16;
    use quire::backend::{AttnBatch, Backend, KvLayer, Op};
    let (auto, req) = (backend(GpuMode::Auto), backend(GpuMode::Required));
    let hd = 320;
    let k = vec![f16::from_f32(0.5); 16 * hd];
    let q = vec![0.25f32; hd];
    let mut out = vec![0f32; hd];
    let table: [u32; 1] = [0];
    let tables: [&[u32]; 1] = [&table];
    let cache = KvLayer {
        k: &k,
        v: &k,
        block_size: 16,
        n_kv_heads: 1,
        head_dim: hd,
        ty: quire::backend::KvType::F16,
    };
    let batch = AttnBatch {
        block_tables: &tables,
        row_seq: &[0],
        positions: &[3],
    };
    let o = Op::PagedAttention {
        q: &q,
        n_heads: 1,
        scale: 1.0,
        cache,
        batch,
        opts: quire::backend::AttnOpts::none(),
        out: &mut out,
    };
    assert!(!auto.supports_op(&o, Mode::Exact));
    assert!(req.supports_op(&o, Mode::Exact));
    let e = req
        .run(o, Mode::Exact)
        .expect_err("required must fail on an unsupported op");
    let msg = format!("{e:#}");
    assert!(
        msg.contains("paged_attention") && msg.contains("head_dim"),
        "{msg}"
    );
}
