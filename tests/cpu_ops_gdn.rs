//! Gated DeltaNet CPU kernels (src/backend/cpu/ops/gdn.rs): bitwise
//! chunk-split invariance of the conv and the recurrent delta rule, chunked vs
//! recurrent agreement, f64 references written from the equations of
//! transformers' `torch_recurrent_gated_delta_rule`, the tiled head mapping
//! with H_v = 2 * H_k, and a cross-check against transformers' own functions
//! (SKIPPED when `QUIRE_PYTHON` lacks torch/transformers).
#![allow(clippy::needless_range_loop)] // index loops mirror the math

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::{bits, nmse, python, repo_path};
use quire::backend::cpu::ops::gdn::{
    causal_conv1d_silu, conv_state_len, gated_delta_rule, gated_delta_rule_chunked, gated_rms_norm,
    gdn_gates, l2_norm_heads, sigmoid, softplus, DeltaRuleForm, DeltaShape, GDN_CHUNK,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

const EPS: f32 = 1e-6;

fn uniform(rng: &mut ChaCha8Rng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

/// Random delta-rule inputs as the layer produces them: q, k L2-normalised
/// (q unscaled), g and beta from the gate functions with realistic ranges.
struct DeltaInputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    state: Vec<f32>,
}

fn delta_inputs(rng: &mut ChaCha8Rng, s: DeltaShape, t: usize) -> DeltaInputs {
    let mut q = uniform(rng, t * s.h_k * s.d_k, -1.0, 1.0);
    let mut k = uniform(rng, t * s.h_k * s.d_k, -1.0, 1.0);
    l2_norm_heads(&mut q, t * s.h_k, s.d_k, EPS).unwrap();
    l2_norm_heads(&mut k, t * s.h_k, s.d_k, EPS).unwrap();
    let v = uniform(rng, t * s.h_v * s.d_v, -2.0, 2.0);
    let a = uniform(rng, t * s.h_v, -4.0, 4.0);
    let b = uniform(rng, t * s.h_v, -4.0, 4.0);
    let dt_bias = uniform(rng, s.h_v, -1.0, 1.0);
    // ssm_a = -exp(A_log), A_log in [-3, 1].
    let ssm_a: Vec<f32> = uniform(rng, s.h_v, -3.0, 1.0)
        .iter()
        .map(|x| -(*x as f64).exp() as f32)
        .collect();
    let mut g = vec![0f32; t * s.h_v];
    let mut beta = vec![0f32; t * s.h_v];
    gdn_gates(&a, &b, &dt_bias, &ssm_a, &mut g, &mut beta).unwrap();
    let state = uniform(rng, s.state_len(), -0.5, 0.5);
    DeltaInputs {
        q,
        k,
        v,
        g,
        beta,
        state,
    }
}

/// Runs the delta rule over `inp` split into calls of the given sizes.
fn run_split(
    form: DeltaRuleForm,
    s: DeltaShape,
    inp: &DeltaInputs,
    splits: &[usize],
) -> (Vec<f32>, Vec<f32>) {
    let t: usize = splits.iter().sum();
    let mut out = vec![0f32; t * s.h_v * s.d_v];
    let mut state = inp.state.clone();
    let mut t0 = 0;
    for &n in splits {
        let qk = |x: &[f32]| x[t0 * s.h_k * s.d_k..(t0 + n) * s.h_k * s.d_k].to_vec();
        let hv = |x: &[f32], d: usize| x[t0 * s.h_v * d..(t0 + n) * s.h_v * d].to_vec();
        gated_delta_rule(
            form,
            s,
            &qk(&inp.q),
            &qk(&inp.k),
            &hv(&inp.v, s.d_v),
            &hv(&inp.g, 1),
            &hv(&inp.beta, 1),
            &mut state,
            &mut out[t0 * s.h_v * s.d_v..(t0 + n) * s.h_v * s.d_v],
        )
        .unwrap();
        t0 += n;
    }
    (out, state)
}

/// Random split of `t` into positive parts (some of them single tokens).
fn random_splits(rng: &mut ChaCha8Rng, t: usize) -> Vec<usize> {
    let mut parts = Vec::new();
    let mut left = t;
    while left > 0 {
        let n = if rng.random_bool(0.3) {
            1
        } else {
            rng.random_range(1..=left.min(40))
        };
        let n = n.min(left);
        parts.push(n);
        left -= n;
    }
    parts
}

/// Naive f64 delta rule straight from `torch_recurrent_gated_delta_rule`:
/// state S[h][i][j] (HF layout), per token: S *= exp(g); kv_mem = Σ_i S k;
/// delta = (v - kv_mem) * beta; S += k ⊗ delta; out = Σ_i S q / sqrt(d_k).
/// `k_head` maps a value head to its key head. Returns (out, state in
/// Quire's layout).
fn ref_delta_f64(
    s: DeltaShape,
    inp: &DeltaInputs,
    k_head: impl Fn(usize) -> usize,
) -> (Vec<f64>, Vec<f64>) {
    let DeltaShape { h_k, h_v, d_k, d_v } = s;
    let t_len = inp.g.len() / h_v;
    let mut st = vec![vec![vec![0f64; d_v]; d_k]; h_v];
    for h in 0..h_v {
        for i in 0..d_k {
            for j in 0..d_v {
                st[h][i][j] = inp.state[s.state_index(h, i, j)] as f64;
            }
        }
    }
    let scale = 1.0 / (d_k as f64).sqrt();
    let mut out = vec![0f64; t_len * h_v * d_v];
    for t in 0..t_len {
        for h in 0..h_v {
            let kh = k_head(h);
            let q = |i: usize| inp.q[(t * h_k + kh) * d_k + i] as f64 * scale;
            let k = |i: usize| inp.k[(t * h_k + kh) * d_k + i] as f64;
            let decay = (inp.g[t * h_v + h] as f64).exp();
            let beta = inp.beta[t * h_v + h] as f64;
            let sh = &mut st[h];
            for row in sh.iter_mut() {
                for x in row.iter_mut() {
                    *x *= decay;
                }
            }
            for j in 0..d_v {
                let kv_mem: f64 = (0..d_k).map(|i| sh[i][j] * k(i)).sum();
                let delta = (inp.v[(t * h_v + h) * d_v + j] as f64 - kv_mem) * beta;
                for i in 0..d_k {
                    sh[i][j] += k(i) * delta;
                }
            }
            for j in 0..d_v {
                out[(t * h_v + h) * d_v + j] = (0..d_k).map(|i| sh[i][j] * q(i)).sum();
            }
        }
    }
    let mut state = vec![0f64; s.state_len()];
    for h in 0..h_v {
        for i in 0..d_k {
            for j in 0..d_v {
                state[s.state_index(h, i, j)] = st[h][i][j];
            }
        }
    }
    (out, state)
}

fn nmse64(got: &[f32], want: &[f64]) -> f64 {
    // Compared in f64 against the f64 values, not their f32 rounding.
    assert_eq!(got.len(), want.len());
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| (*a as f64 - b).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| b * b).sum();
    num / den.max(1e-300)
}

const SHAPE: DeltaShape = DeltaShape {
    h_k: 2,
    h_v: 4,
    d_k: 16,
    d_v: 12,
};

#[test]
fn conv_chunk_split_invariance_bitwise() {
    let mut rng = ChaCha8Rng::seed_from_u64(60);
    for &(channels, kernel) in &[(10usize, 4usize), (7, 1), (5, 2), (3, 6)] {
        let t = 37;
        let x = uniform(&mut rng, t * channels, -3.0, 3.0);
        let w = uniform(&mut rng, channels * kernel, -1.0, 1.0);
        let state0 = uniform(&mut rng, conv_state_len(kernel, channels), -3.0, 3.0);
        let mut state_all = state0.clone();
        let mut out_all = vec![0f32; x.len()];
        causal_conv1d_silu(&x, &w, &mut state_all, &mut out_all, channels, kernel).unwrap();

        // f64 reference over the stream [state0, x].
        let ks = kernel - 1;
        let raw = |c: usize, p: usize| -> f64 {
            if p < ks {
                state0[c * ks + p] as f64
            } else {
                x[(p - ks) * channels + c] as f64
            }
        };
        let want: Vec<f64> = (0..t * channels)
            .map(|e| {
                let (tt, c) = (e / channels, e % channels);
                let acc: f64 = (0..kernel)
                    .map(|i| w[c * kernel + i] as f64 * raw(c, tt + i))
                    .sum();
                acc / (1.0 + (-acc).exp())
            })
            .collect();
        assert!(
            nmse64(&out_all, &want) < 1e-12,
            "conv vs f64 (C {channels}, K {kernel})"
        );
        // The new state is exactly the last K-1 raw inputs.
        for c in 0..channels {
            for tau in 0..ks {
                assert_eq!(
                    state_all[c * ks + tau].to_bits(),
                    (raw(c, t + tau) as f32).to_bits()
                );
            }
        }

        for _ in 0..5 {
            let splits = random_splits(&mut rng, t);
            let mut state = state0.clone();
            let mut out = vec![0f32; x.len()];
            let mut t0 = 0;
            for n in splits {
                let r = t0 * channels..(t0 + n) * channels;
                causal_conv1d_silu(&x[r.clone()], &w, &mut state, &mut out[r], channels, kernel)
                    .unwrap();
                t0 += n;
            }
            assert_eq!(bits(&out), bits(&out_all), "conv output split-dependent");
            assert_eq!(bits(&state), bits(&state_all), "conv state split-dependent");
        }
    }
}

#[test]
fn recurrent_prefill_equals_decode_bitwise() {
    let mut rng = ChaCha8Rng::seed_from_u64(61);
    for s in [
        SHAPE,
        DeltaShape {
            h_k: 3,
            h_v: 3,
            d_k: 8,
            d_v: 8,
        },
    ] {
        let t = 50;
        let inp = delta_inputs(&mut rng, s, t);
        let (out_all, st_all) = run_split(DeltaRuleForm::Recurrent, s, &inp, &[t]);
        let (out_one, st_one) = run_split(DeltaRuleForm::Recurrent, s, &inp, &vec![1; t]);
        assert_eq!(
            bits(&out_all),
            bits(&out_one),
            "prefill vs token-by-token output"
        );
        assert_eq!(
            bits(&st_all),
            bits(&st_one),
            "prefill vs token-by-token state"
        );
        let splits = random_splits(&mut rng, t);
        let (out_r, st_r) = run_split(DeltaRuleForm::Recurrent, s, &inp, &splits);
        assert_eq!(bits(&out_all), bits(&out_r), "split {splits:?}");
        assert_eq!(bits(&st_all), bits(&st_r), "split {splits:?}");
        // Not trivially equal: outputs and state actually move.
        assert!(out_all.iter().all(|x| x.is_finite()) && out_all.iter().any(|x| x.abs() > 1e-3));
        assert_ne!(bits(&st_all), bits(&inp.state));
    }
}

#[test]
fn chunked_matches_recurrent() {
    let mut rng = ChaCha8Rng::seed_from_u64(62);
    for &t in &[1usize, 63, 64, 65, 150] {
        let inp = delta_inputs(&mut rng, SHAPE, t);
        let (out_r, st_r) = run_split(DeltaRuleForm::Recurrent, SHAPE, &inp, &[t]);
        let (out_c, st_c) = run_split(DeltaRuleForm::Chunked, SHAPE, &inp, &[t]);
        let (e_o, e_s) = (nmse(&out_c, &out_r), nmse(&st_c, &st_r));
        assert!(
            e_o < 1e-10 && e_s < 1e-10,
            "T {t}: chunked vs recurrent nmse out {e_o:e} state {e_s:e}"
        );
        // Other chunk lengths, and the chunked form across split calls.
        for chunk in [1usize, 7, GDN_CHUNK] {
            let mut state = inp.state.clone();
            let mut out = vec![0f32; out_r.len()];
            gated_delta_rule_chunked(
                SHAPE, chunk, &inp.q, &inp.k, &inp.v, &inp.g, &inp.beta, &mut state, &mut out,
            )
            .unwrap();
            assert!(
                nmse(&out, &out_r) < 1e-10 && nmse(&state, &st_r) < 1e-10,
                "T {t} chunk {chunk}"
            );
        }
        let splits = random_splits(&mut rng, t);
        let (out_s, st_s) = run_split(DeltaRuleForm::Chunked, SHAPE, &inp, &splits);
        assert!(
            nmse(&out_s, &out_r) < 1e-10 && nmse(&st_s, &st_r) < 1e-10,
            "T {t} splits {splits:?}"
        );
    }
}

#[test]
fn recurrent_matches_f64_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(63);
    for s in [
        SHAPE,
        DeltaShape {
            h_k: 1,
            h_v: 3,
            d_k: 32,
            d_v: 32,
        },
    ] {
        let t = 70;
        let inp = delta_inputs(&mut rng, s, t);
        let (out, st) = run_split(DeltaRuleForm::Recurrent, s, &inp, &[t]);
        let (want_o, want_s) = ref_delta_f64(s, &inp, |h| h % s.h_k);
        let (e_o, e_s) = (nmse64(&out, &want_o), nmse64(&st, &want_s));
        assert!(
            e_o < 1e-10 && e_s < 1e-10,
            "{s:?}: nmse out {e_o:e} state {e_s:e}"
        );
    }
}

/// With H_v = 2 * H_k the tiled mapping (h % H_k) and the grouped one
/// (h / 2) differ; the kernel must follow the tiled one, and running
/// Hugging Face's grouped math on the converter's permuted heads must give
/// the same result.
#[test]
fn head_mapping_is_tiled() {
    let mut rng = ChaCha8Rng::seed_from_u64(64);
    let s = DeltaShape {
        h_k: 2,
        h_v: 4,
        d_k: 16,
        d_v: 16,
    };
    assert_eq!(
        (0..4).map(|h| s.k_head(h)).collect::<Vec<_>>(),
        [0, 1, 0, 1]
    );
    let t = 20;
    let inp = delta_inputs(&mut rng, s, t);
    let (out, _) = run_split(DeltaRuleForm::Recurrent, s, &inp, &[t]);
    let r = s.h_v / s.h_k;
    let (tiled, _) = ref_delta_f64(s, &inp, |h| h % s.h_k);
    let (grouped, _) = ref_delta_f64(s, &inp, |h| h / r);
    assert!(nmse64(&out, &tiled) < 1e-10);
    assert!(
        nmse64(&out, &grouped) > 1e-2,
        "the grouped mapping must not match"
    );
    let (out_c, _) = run_split(DeltaRuleForm::Chunked, s, &inp, &[t]);
    assert!(nmse64(&out_c, &tiled) < 1e-10);

    // HF order: HF head j = g*r + s is GGUF head s*H_k + g.
    let gguf_of_hf = |j: usize| (j % r) * s.h_k + j / r;
    let perm = |x: &[f32], d: usize| -> Vec<f32> {
        let mut y = vec![0f32; x.len()];
        for tt in 0..t {
            for j in 0..s.h_v {
                let src = (tt * s.h_v + gguf_of_hf(j)) * d;
                y[(tt * s.h_v + j) * d..][..d].copy_from_slice(&x[src..src + d]);
            }
        }
        y
    };
    let hs = s.d_k * s.d_v;
    let mut state_hf = vec![0f32; inp.state.len()];
    for j in 0..s.h_v {
        state_hf[j * hs..(j + 1) * hs].copy_from_slice(&inp.state[gguf_of_hf(j) * hs..][..hs]);
    }
    let hf = DeltaInputs {
        q: inp.q.clone(),
        k: inp.k.clone(),
        v: perm(&inp.v, s.d_v),
        g: perm(&inp.g, 1),
        beta: perm(&inp.beta, 1),
        state: state_hf,
    };
    let (out_hf, _) = ref_delta_f64(s, &hf, |j| j / r);
    for tt in 0..t {
        for j in 0..s.h_v {
            for e in 0..s.d_v {
                let got = out[(tt * s.h_v + gguf_of_hf(j)) * s.d_v + e] as f64;
                let want = out_hf[(tt * s.h_v + j) * s.d_v + e];
                assert!(
                    (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "t {tt} hf head {j}"
                );
            }
        }
    }
}

#[test]
fn gates_norms_match_f64() {
    let mut rng = ChaCha8Rng::seed_from_u64(65);
    // softplus over a wide range, including both sides of the threshold.
    let mut xs = uniform(&mut rng, 2000, -40.0, 40.0);
    xs.extend([-100.0f32, -20.5, -1e-3, 1e-3, 19.99, 20.0, 20.01, 80.0]);
    for &x in &xs {
        let want = (x as f64).exp().ln_1p();
        let got = softplus(x) as f64;
        assert!(
            (got - want).abs() <= 4e-7 * want.abs() + 1e-45,
            "softplus({x}) = {got}, want {want}"
        );
        let sw = 1.0 / (1.0 + (-(x as f64)).exp());
        // Below x = -88.8 the canonical exp overflows and sigmoid is 0 (true value < 4e-39).
        assert!(
            (sigmoid(x) as f64 - sw).abs() <= 4e-7 * sw + 4e-39,
            "sigmoid({x})"
        );
    }
    assert!(softplus(f32::NAN).is_nan());

    let (t, h_v) = (9, 5);
    let a = uniform(&mut rng, t * h_v, -6.0, 6.0);
    let b = uniform(&mut rng, t * h_v, -6.0, 6.0);
    let dt = uniform(&mut rng, h_v, -1.0, 1.0);
    let ssm_a: Vec<f32> = uniform(&mut rng, h_v, -3.0, 1.0)
        .iter()
        .map(|x| -x.exp())
        .collect();
    let (mut g, mut beta) = (vec![0f32; t * h_v], vec![0f32; t * h_v]);
    gdn_gates(&a, &b, &dt, &ssm_a, &mut g, &mut beta).unwrap();
    for e in 0..t * h_v {
        let h = e % h_v;
        let wg = ((a[e] + dt[h]) as f64).exp().ln_1p() * ssm_a[h] as f64;
        let wb = 1.0 / (1.0 + (-(b[e] as f64)).exp());
        assert!(
            (g[e] as f64 - wg).abs() <= 1e-6 * wg.abs() && g[e] < 0.0,
            "g[{e}]"
        );
        assert!((beta[e] as f64 - wb).abs() <= 1e-6 * wb, "beta[{e}]");
    }
    // Swapped a/b would fail: a and b are independent random data.
    let (mut g2, mut b2) = (vec![0f32; t * h_v], vec![0f32; t * h_v]);
    gdn_gates(&b, &a, &dt, &ssm_a, &mut g2, &mut b2).unwrap();
    assert_ne!(bits(&g), bits(&g2));

    // L2 norm, with one row below eps (scaled by 1/eps, not normalised).
    let d = 24;
    let mut x = uniform(&mut rng, 4 * d, -2.0, 2.0);
    for v in x[3 * d..].iter_mut() {
        *v *= 1e-8;
    }
    let x0 = x.clone();
    l2_norm_heads(&mut x, 4, d, EPS).unwrap();
    for r in 0..4 {
        let row = &x0[r * d..(r + 1) * d];
        let n = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>().sqrt();
        let want: Vec<f64> = row.iter().map(|&v| v as f64 / n.max(EPS as f64)).collect();
        assert!(nmse64(&x[r * d..(r + 1) * d], &want) < 1e-12, "l2 row {r}");
    }

    // Gated RMSNorm: weight used as is (no +1), silu gate.
    let rows = 6;
    let xn = uniform(&mut rng, rows * d, -3.0, 3.0);
    let z = uniform(&mut rng, rows * d, -5.0, 5.0);
    let w = uniform(&mut rng, d, -1.5, 1.5);
    let mut out = vec![0f32; rows * d];
    gated_rms_norm(&xn, &z, &w, d, EPS, &mut out).unwrap();
    let mut want = vec![0f64; rows * d];
    for r in 0..rows {
        let xr = &xn[r * d..(r + 1) * d];
        let ms = xr.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / d as f64;
        let sc = 1.0 / (ms + EPS as f64).sqrt();
        for e in 0..d {
            let zz = z[r * d + e] as f64;
            want[r * d + e] = xr[e] as f64 * sc * w[e] as f64 * (zz / (1.0 + (-zz).exp()));
        }
    }
    assert!(nmse64(&out, &want) < 1e-12);
}

#[test]
fn bad_shapes_are_errors() {
    let s = DeltaShape {
        h_k: 3,
        h_v: 4,
        d_k: 4,
        d_v: 4,
    };
    let z = vec![0.5f32; 64];
    let mut st = vec![0f32; 64];
    let mut out = vec![0f32; 16];
    let e = gated_delta_rule(
        DeltaRuleForm::Recurrent,
        s,
        &z[..12],
        &z[..12],
        &z[..16],
        &z[..4],
        &z[..4],
        &mut st,
        &mut out,
    )
    .unwrap_err();
    assert!(e.to_string().contains("not a multiple of h_k"), "{e}");
    let s = DeltaShape {
        h_k: 2,
        h_v: 4,
        d_k: 4,
        d_v: 4,
    };
    let e = gated_delta_rule(
        DeltaRuleForm::Chunked,
        s,
        &z[..8],
        &z[..7],
        &z[..16],
        &z[..4],
        &z[..4],
        &mut st,
        &mut out,
    )
    .unwrap_err();
    assert!(e.to_string().contains("k has 7"), "{e}");
    let mut cs = vec![0f32; 5];
    let mut co = vec![0f32; 8];
    let e = causal_conv1d_silu(&z[..8], &z[..8], &mut cs, &mut co, 2, 4).unwrap_err();
    assert!(e.to_string().contains("state"), "{e}");
    assert!(l2_norm_heads(&mut co, 3, 3, EPS).is_err());
    assert!(gated_rms_norm(&z[..8], &z[..7], &z[..4], 4, EPS, &mut co).is_err());
}

/// Cross-check against transformers' qwen3_5 functions (conv update, gates,
/// both delta-rule forms with the L2 norm inside, gated RMSNorm).
#[test]
fn matches_transformers_qwen3_5() {
    let script = repo_path("tests/py/gdn_reference.py");
    match Command::new(python())
        .arg(&script)
        .arg("check-imports")
        .output()
    {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            println!(
                "SKIPPED: matches_transformers_qwen3_5: `{}` cannot import torch / transformers qwen3_5 ({}); run scripts/setup-test-env.sh and set QUIRE_PYTHON",
                python(),
                String::from_utf8_lossy(&o.stdout).trim()
            );
            return;
        }
        Err(e) => {
            println!(
                "SKIPPED: matches_transformers_qwen3_5: cannot run `{}`: {e}",
                python()
            );
            return;
        }
    }
    let mut rng = ChaCha8Rng::seed_from_u64(66);
    let s = DeltaShape {
        h_k: 2,
        h_v: 4,
        d_k: 16,
        d_v: 16,
    };
    let t = 70; // two HF chunks of 64

    // Conv.
    let (channels, kernel) = (12, 4);
    let cx = uniform(&mut rng, t * channels, -3.0, 3.0);
    let cw = uniform(&mut rng, channels * kernel, -1.0, 1.0);
    let cs0 = uniform(&mut rng, conv_state_len(kernel, channels), -3.0, 3.0);
    let mut cs = cs0.clone();
    let mut co = vec![0f32; cx.len()];
    causal_conv1d_silu(&cx, &cw, &mut cs, &mut co, channels, kernel).unwrap();

    // Gates.
    let a = uniform(&mut rng, t * s.h_v, -4.0, 4.0);
    let b = uniform(&mut rng, t * s.h_v, -4.0, 4.0);
    let dt = uniform(&mut rng, s.h_v, -1.0, 1.0);
    let ssm_a: Vec<f32> = uniform(&mut rng, s.h_v, -3.0, 1.0)
        .iter()
        .map(|x| -x.exp())
        .collect();
    let (mut g, mut beta) = (vec![0f32; t * s.h_v], vec![0f32; t * s.h_v]);
    gdn_gates(&a, &b, &dt, &ssm_a, &mut g, &mut beta).unwrap();

    // Delta rule from raw q, k (our L2 norm, then the kernel).
    let q_raw = uniform(&mut rng, t * s.h_k * s.d_k, -1.0, 1.0);
    let k_raw = uniform(&mut rng, t * s.h_k * s.d_k, -1.0, 1.0);
    let v = uniform(&mut rng, t * s.h_v * s.d_v, -2.0, 2.0);
    let state0 = uniform(&mut rng, s.state_len(), -0.5, 0.5);
    let (mut q, mut k) = (q_raw.clone(), k_raw.clone());
    l2_norm_heads(&mut q, t * s.h_k, s.d_k, EPS).unwrap();
    l2_norm_heads(&mut k, t * s.h_k, s.d_k, EPS).unwrap();
    let inp = DeltaInputs {
        q,
        k,
        v: v.clone(),
        g: g.clone(),
        beta: beta.clone(),
        state: state0.clone(),
    };
    let (out_r, st_r) = run_split(DeltaRuleForm::Recurrent, s, &inp, &[t]);
    let (out_c, st_c) = run_split(DeltaRuleForm::Chunked, s, &inp, &[t]);

    // Gated norm.
    let nx = uniform(&mut rng, t * s.h_v * s.d_v, -3.0, 3.0);
    let nz = uniform(&mut rng, nx.len(), -5.0, 5.0);
    let nw = uniform(&mut rng, s.d_v, -1.5, 1.5);
    let mut nout = vec![0f32; nx.len()];
    gated_rms_norm(&nx, &nz, &nw, s.d_v, EPS, &mut nout).unwrap();

    let input = json!({
        "conv": {"T": t, "channels": channels, "kernel": kernel, "x": cx, "w": cw, "state": cs0},
        "gates": {"a": a, "b": b, "dt_bias": dt, "ssm_a": ssm_a},
        "delta": {"h_k": s.h_k, "h_v": s.h_v, "d_k": s.d_k, "d_v": s.d_v, "T": t,
                  "q": q_raw, "k": k_raw, "v": v, "g": g, "beta": beta, "state": state0},
        "norm": {"x": nx, "z": nz, "w": nw, "eps": EPS},
    });
    let mut child = Command::new(python())
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "gdn_reference.py failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let py: Value = serde_json::from_slice(&o.stdout).unwrap();
    let arr = |key: &str| -> Vec<f32> {
        py[key]
            .as_array()
            .unwrap_or_else(|| panic!("missing {key}"))
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect()
    };
    let check = |name: &str, ours: &[f32], key: &str, bound: f64| {
        let e = nmse(ours, &arr(key));
        println!("{name} vs transformers {key}: nmse {e:e}");
        assert!(
            e < bound,
            "{name} vs transformers {key}: nmse {e:e} >= {bound:e}"
        );
    };
    check("conv out", &co, "conv_out", 1e-12);
    check("conv state", &cs, "conv_state", 1e-30);
    check("g", &g, "g", 1e-12);
    check("beta", &beta, "beta", 1e-12);
    for (ours_o, ours_s, form) in [(&out_r, &st_r, "recurrent"), (&out_c, &st_c, "chunked")] {
        for hf in ["recurrent", "chunk"] {
            check(&format!("{form} out"), ours_o, &format!("{hf}_out"), 1e-10);
            check(
                &format!("{form} state"),
                ours_s,
                &format!("{hf}_state"),
                1e-10,
            );
        }
    }
    check("gated norm", &nout, "norm_out", 1e-12);
}
