//! The parity harness itself (no GPU needed): it passes an identical
//! backend, fails a backend that is 1 ulp off in exact mode (and accepts it
//! under NMSE bounds in fast mode), fails one that writes NaN, and reports
//! unsupported cases as UNSUPPORTED, never as passes.

use quire::backend::cpu::CpuBackend;
use quire::backend::{Backend, Mode, Op};
use quire::opcheck;

/// Wraps the cpu backend and perturbs outputs; optionally refuses ops.
struct Skewed {
    inner: CpuBackend,
    ulps: i32,
    nan: bool,
    refuse: bool,
}

fn skew(out: &mut [f32], ulps: i32, nan: bool) {
    if let Some(v) = out.first_mut() {
        if nan {
            *v = f32::NAN;
        } else if v.is_finite() && *v != 0.0 {
            *v = f32::from_bits((v.to_bits() as i32 + ulps) as u32);
        }
    }
}

impl Backend for Skewed {
    fn name(&self) -> &'static str {
        "skewed"
    }
    fn supports_op(&self, op: &Op<'_>, mode: Mode) -> bool {
        !self.refuse && self.inner.supports_op(op, mode)
    }
    fn run(&self, op: Op<'_>, mode: Mode) -> anyhow::Result<()> {
        match op {
            Op::SwiGlu { gate, up, out } => {
                self.inner.run(
                    Op::SwiGlu {
                        gate,
                        up,
                        out: &mut *out,
                    },
                    mode,
                )?;
                skew(out, self.ulps, self.nan);
                Ok(())
            }
            other => self.inner.run(other, mode),
        }
    }
}

fn run(be: &Skewed, mode: Mode) -> (usize, usize, usize) {
    let cpu = CpuBackend::new(Some(1)).unwrap();
    let opts = opcheck::Options {
        mode,
        op_filter: Some("swiglu".into()),
        perf: false,
        seed: 1,
        quick: true,
        wave_tail_forced: false,
    };
    let res = opcheck::run(be, &cpu, &opts);
    for r in &res {
        println!("{r}");
    }
    opcheck::summary(&res)
}

fn skewed(ulps: i32, nan: bool, refuse: bool) -> Skewed {
    Skewed {
        inner: CpuBackend::new(Some(1)).unwrap(),
        ulps,
        nan,
        refuse,
    }
}

#[test]
fn identical_backend_passes_exact() {
    let (p, f, u) = run(&skewed(0, false, false), Mode::Exact);
    assert!(p > 0 && f == 0 && u == 0);
}

#[test]
fn one_ulp_fails_exact_but_passes_fast() {
    let (p, f, _) = run(&skewed(1, false, false), Mode::Exact);
    assert!(
        f > 0,
        "a 1-ulp difference must fail exact mode (passed {p})"
    );
    let (_, f, _) = run(&skewed(1, false, false), Mode::Fast);
    assert_eq!(f, 0, "1 ulp is within the fast-mode NMSE bound");
}

#[test]
fn nan_fails_every_mode() {
    for mode in [Mode::Exact, Mode::Fast] {
        let (_, f, _) = run(&skewed(0, true, false), mode);
        assert!(
            f > 0,
            "a NaN where the cpu has a number must fail ({mode:?})"
        );
    }
}

#[test]
fn unsupported_is_reported_not_passed() {
    let (p, f, u) = run(&skewed(0, false, true), Mode::Exact);
    assert_eq!((p, f), (0, 0));
    assert!(u > 0);
}

#[test]
fn portable_cpu_matches_simd_cpu_on_the_quick_grid() {
    let be = CpuBackend::with_options(Some(1), true).unwrap();
    let cpu = CpuBackend::new(Some(2)).unwrap();
    let opts = opcheck::Options {
        mode: Mode::Exact,
        op_filter: None,
        perf: false,
        seed: 3,
        quick: true,
        wave_tail_forced: false,
    };
    let res = opcheck::run(&be, &cpu, &opts);
    let (p, f, u) = opcheck::summary(&res);
    assert_eq!((f, u), (0, 0));
    assert!(p > 100);
}
