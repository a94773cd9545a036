//! The invariance grid (`quire check-invariance`): the reduced grid is
//! bitwise invariant on the cpu in every mode, with either ISA; the
//! negative control (an attention whose split follows the batch) makes it
//! find differences of every kind it looks for; on cuda (ignored without
//! a GPU) deterministic and exact are invariant and fast is not.

use quire::backend::cpu::CpuBackend;
use quire::backend::Mode;
use quire::opcheck::invariance::{self, control::BatchVariant, Cell, Feature};

#[test]
fn the_reduced_grid_is_invariant_on_the_cpu() {
    let cells = invariance::cells(false);
    assert_eq!(cells.len(), 96);
    let cpu = CpuBackend::new(Some(2)).unwrap();
    for mode in [Mode::Fast, Mode::Deterministic, Mode::Exact] {
        let rep = invariance::run(&cpu, None, mode, &cells, 1, |_, _| {});
        assert!(rep.errors.is_empty(), "{:?}", rep.errors);
        assert!(
            rep.diffs.is_empty(),
            "{mode:?}: {:?}",
            &rep.diffs[..rep.diffs.len().min(5)]
        );
        assert_eq!(rep.unsupported, 0);
        // Every cell's checks, and the norm / matmul rows.
        assert!(rep.checks >= 96 * 5, "{} checks", rep.checks);
    }
}

#[test]
fn the_portable_kernels_give_the_cpu_bits_over_the_grid() {
    let cells: Vec<Cell> = invariance::cells(false).into_iter().step_by(5).collect();
    let cpu = CpuBackend::new(Some(2)).unwrap();
    let portable = CpuBackend::with_options(Some(1), true).unwrap();
    let rep = invariance::run(&portable, Some(&cpu), Mode::Exact, &cells, 2, |_, _| {});
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
    assert!(
        rep.diffs.is_empty(),
        "{:?}",
        &rep.diffs[..rep.diffs.len().min(5)]
    );
}

#[test]
fn the_negative_control_finds_differences() {
    // A few cells of each feature and mask: enough rows for the split to
    // change between a row alone and in a batch.
    let cells: Vec<Cell> = invariance::cells(false)
        .into_iter()
        .filter(|c| c.head_dim == 64 && c.batch == 8)
        .collect();
    assert!(cells.iter().any(|c| c.sliding) && cells.iter().any(|c| c.feature == Feature::Sinks));
    let rep = invariance::run(
        &BatchVariant,
        None,
        Mode::Deterministic,
        &cells,
        3,
        |_, _| {},
    );
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
    for check in ["batch", "chunked", "token"] {
        assert!(
            rep.diffs.iter().any(|d| d.check == check),
            "the control shows no {check} difference"
        );
    }
    // The control is deterministic run to run, and the grid says so.
    assert!(!rep.diffs.iter().any(|d| d.check == "rerun"));
    // It has no norm or matmul: those are reported unsupported.
    assert!(rep.unsupported > 0);
}

#[test]
#[ignore = "needs a CUDA device"]
fn the_reduced_grid_on_cuda() {
    let cells = invariance::cells(false);
    let cpu = CpuBackend::new(None).unwrap();
    let cuda = quire::backend::cuda::CudaBackend::new(quire::backend::GpuMode::Required)
        .unwrap()
        .without_fallback();
    for mode in [Mode::Deterministic, Mode::Exact] {
        let rep = invariance::run(&cuda, Some(&cpu), mode, &cells, 4, |_, _| {});
        assert!(rep.errors.is_empty(), "{mode:?}: {:?}", rep.errors);
        assert!(
            rep.diffs.is_empty(),
            "{mode:?}: {:?}",
            &rep.diffs[..rep.diffs.len().min(5)]
        );
        assert_eq!(rep.unsupported, 0);
    }
    let rep = invariance::run(&cuda, Some(&cpu), Mode::Fast, &cells, 4, |_, _| {});
    assert!(rep.errors.is_empty(), "fast: {:?}", rep.errors);
    assert!(
        !rep.diffs.is_empty(),
        "fast: the negative control found no difference"
    );
}
