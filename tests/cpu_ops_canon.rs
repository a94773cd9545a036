//! Canonical functions against f64 std over wide ranges.

mod cpu_ops_util;
use cpu_ops_util::*;

use quire::backend::cpu::canon;
use rand::Rng;

/// Distance in units in the last place of `want` (as f32).
fn ulps(got: f32, want: f64) -> f64 {
    let w = want as f32;
    if got == w {
        return 0.0;
    }
    let ulp = if w == 0.0 {
        f32::from_bits(1) as f64
    } else {
        (f32::from_bits(w.abs().to_bits() + 1) - w.abs()) as f64
    };
    (got as f64 - want).abs() / ulp
}

#[test]
fn exp_accuracy() {
    let mut r = rng(1);
    let mut worst = 0f64;
    for i in 0..200_000 {
        let x: f32 = if i % 2 == 0 {
            r.random_range(-87.0..88.5)
        } else {
            r.random_range(-10.0..10.0)
        };
        let u = ulps(canon::exp(x), (x as f64).exp());
        worst = worst.max(u);
    }
    println!("exp worst {worst:.2} ulp");
    assert!(worst <= 4.0, "exp worst error {worst} ulp");
    // Subnormal range: absolute error within a couple of subnormal ulps.
    for x in [-88.0f32, -95.0, -100.0, -103.5] {
        let u = ulps(canon::exp(x), (x as f64).exp());
        assert!(u <= 4.0, "exp({x}) error {u} ulp");
    }
    assert_eq!(canon::exp(f32::NEG_INFINITY), 0.0);
    assert_eq!(canon::exp(100.0), f32::INFINITY);
    assert!(canon::exp(f32::NAN).is_nan());
    assert_eq!(canon::exp(0.0), 1.0);
}

#[test]
fn silu_and_rsqrt_accuracy() {
    let mut r = rng(2);
    let mut worst_s = 0f64;
    let mut worst_r = 0f64;
    for _ in 0..100_000 {
        let x: f32 = r.random_range(-60.0..60.0);
        let xd = x as f64;
        worst_s = worst_s.max(ulps(canon::silu(x), xd / (1.0 + (-xd).exp())));
        let y: f32 = r.random_range(1e-6..1e6);
        worst_r = worst_r.max(ulps(canon::rsqrt(y), 1.0 / (y as f64).sqrt()));
    }
    // rsqrt = 1 / sqrt(x): two correct roundings, so at most ~1.5 ulp.
    println!("silu worst {worst_s:.2} ulp, rsqrt worst {worst_r:.2} ulp");
    assert!(worst_s <= 6.0, "silu worst {worst_s} ulp");
    assert!(worst_r <= 2.0, "rsqrt worst {worst_r} ulp");
    assert_eq!(canon::silu(-200.0), -0.0);
}

#[test]
fn sin_cos_accuracy_wide_range() {
    let mut r = rng(3);
    let mut worst = 0f64;
    for i in 0..300_000 {
        let x: f32 = match i % 3 {
            0 => r.random_range(-4.0..4.0),
            1 => r.random_range(-1.0e5..1.0e5),
            // Actual RoPE angles: position times a frequency.
            _ => (r.random_range(0..100_000u32) as f32) * r.random_range(1e-4f32..1.0),
        };
        let (s, c) = canon::sin_cos(x);
        let xd = x as f64;
        worst = worst.max((s as f64 - xd.sin()).abs());
        worst = worst.max((c as f64 - xd.cos()).abs());
    }
    println!("sin/cos worst abs error {worst:.3e}");
    // A few ulp of 1.0 (ulp(1) = 1.19e-7), over angles up to 1e5.
    assert!(worst < 3.0e-7, "sin/cos worst abs error {worst:.3e}");
}

#[test]
fn dot32_matches_definition() {
    let mut r = rng(4);
    for k in [1usize, 31, 32, 33, 100, 576] {
        let a = rand_vec(&mut r, k, 1.0);
        let b = rand_vec(&mut r, k, 1.0);
        // Literal restatement of the canonical rule.
        let mut lane = [0f32; 32];
        for e in 0..k {
            lane[e % 32] += a[e] * b[e];
        }
        for s in [16, 8, 4, 2, 1] {
            for i in 0..s {
                lane[i] += lane[i + s];
            }
        }
        assert_eq!(canon::dot32(&a, &b).to_bits(), lane[0].to_bits(), "k {k}");
        let want: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
        assert!((canon::dot32(&a, &b) as f64 - want).abs() < 1e-5 * (k as f64).sqrt());
    }
}

/// The AVX2 exp used by attention is bitwise the canonical scalar exp.
#[test]
fn exp8_bitwise_equals_exp() {
    #[cfg(target_arch = "x86_64")]
    {
        if !(std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("f16c"))
        {
            println!("SKIPPED: no AVX2/F16C on this machine");
            return;
        }
        use quire::backend::cpu::ops::attention_avx2::exp8;
        use std::arch::x86_64::*;
        let mut r = rng(5);
        let mut xs: Vec<f32> = (0..400_000)
            .map(|i| match i % 4 {
                0 => r.random_range(-110.0..95.0),
                1 => r.random_range(-1.0..1.0),
                2 => r.random_range(-30.0..0.0),
                _ => f32::from_bits(r.random::<u32>()), // any bit pattern
            })
            .collect();
        xs.extend_from_slice(&[
            0.0,
            -0.0,
            88.8,
            88.80001,
            -104.0,
            -104.00001,
            88.72,
            -87.5,
            -103.9,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            0.5 * std::f32::consts::LN_2,
        ]);
        while !xs.len().is_multiple_of(8) {
            xs.push(1.0);
        }
        for c in xs.chunks_exact(8) {
            let mut got = [0f32; 8];
            // SAFETY: AVX2 + F16C checked above; both arrays hold 8 lanes.
            unsafe { _mm256_storeu_ps(got.as_mut_ptr(), exp8(_mm256_loadu_ps(c.as_ptr()))) };
            for (g, &x) in got.iter().zip(c) {
                let want = canon::exp(x);
                assert!(
                    g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                    "exp8({x:e}) = {g:e}, canonical {want:e}"
                );
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    println!("SKIPPED: not x86_64");
}

#[test]
fn tanh_accuracy() {
    let mut r = rng(7);
    let mut worst = 0f64;
    for i in 0..200_000 {
        let x: f32 = match i % 3 {
            0 => r.random_range(-0.2..0.2),
            1 => r.random_range(-4.0..4.0),
            _ => r.random_range(-20.0..20.0),
        };
        let u = ulps(canon::tanh(x), (x as f64).tanh());
        worst = worst.max(u);
    }
    println!("tanh worst {worst:.2} ulp");
    assert!(worst <= 8.0, "tanh worst error {worst} ulp");
    assert_eq!(canon::tanh(0.0), 0.0);
    assert_eq!(canon::tanh(100.0), 1.0);
    assert_eq!(canon::tanh(-100.0), -1.0);
    assert_eq!(canon::tanh(f32::INFINITY), 1.0);
    assert!(canon::tanh(f32::NAN).is_nan());
    // Odd: tanh(-x) = -tanh(x) bitwise.
    for x in [0.01f32, 0.124, 0.125, 0.7, 3.0] {
        assert_eq!(canon::tanh(-x).to_bits(), (-canon::tanh(x)).to_bits());
    }
}
