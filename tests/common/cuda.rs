//! What the CUDA tests need of the machine. A test that needs a CUDA
//! device is `#[ignore = "needs a CUDA device: scripts/gpu-check.sh"]`, so
//! a plain `cargo test` lists it as ignored, never as passed; run with
//! `--ignored` (scripts/gpu-check.sh's `tests` step) it fails, naming what
//! is missing, where there is no usable device.

use quire::backend::cuda::device::compile as source;
use quire::backend::cuda::CudaBackend;
use quire::backend::GpuMode;

/// Panics unless the CUDA driver library and NVRTC both load.
pub fn require_device() {
    assert!(
        source::driver_present(),
        "this test needs a CUDA device, but the CUDA driver library (libcuda) \
         cannot be loaded on this machine; run it on a GPU machine \
         (scripts/build-gpu-tests.sh here, then scripts/gpu-check.sh tests there)"
    );
    assert!(
        source::nvrtc_present(),
        "this test needs a CUDA device and NVRTC, but libnvrtc cannot be \
         loaded on this machine (LD_LIBRARY_PATH?)"
    );
}

/// The CUDA backend on device 0 in `mode`; panics, naming the reason, where
/// there is no usable device.
pub fn backend(mode: GpuMode) -> CudaBackend {
    require_device();
    CudaBackend::new(mode).unwrap_or_else(|e| panic!("this test needs a usable CUDA device: {e:#}"))
}
