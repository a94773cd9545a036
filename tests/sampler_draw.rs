//! The sampled draw (`sampler/draw.rs`): its exp, and the token it picks
//! for a uniform against the weights' cumulative mass, in id order and in
//! sorted order. The CUDA sampler is checked against this code bitwise
//! (`quire check-sample`); here the code itself is checked against the
//! distribution it defines.

use quire::sampler::{cand_key, det_exp, draw_token, DrawParams};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn random_logits(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

#[test]
fn det_exp_is_exp_within_3e_13() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for _ in 0..200_000 {
        let x: f64 = -rng.random_range(0.0..708.0);
        let (a, b) = (det_exp(x), x.exp());
        assert!(((a - b) / b).abs() < 3e-13, "x {x}: {a} vs {b}");
    }
    assert_eq!(det_exp(0.0), 1.0);
    assert_eq!(det_exp(-0.0), 1.0);
    assert_eq!(det_exp(f64::NEG_INFINITY), 0.0);
    assert_eq!(det_exp(-708.5), 0.0);
    assert!(det_exp(-708.0) > 0.0);
    // Monotone across many reduction boundaries.
    let mut prev = 1.0;
    for i in 1..100_000 {
        let v = det_exp(-(i as f64) * 0.007);
        assert!(v <= prev, "{i}");
        prev = v;
    }
}

/// The ids in the draw's candidate order, and their weights.
fn reference_weights(logits: &[f32], p: &DrawParams) -> Vec<(u32, f64)> {
    let mut ids: Vec<u32> = (0..logits.len() as u32)
        .filter(|&i| logits[i as usize] != f32::NEG_INFINITY)
        .collect();
    let finite = ids.len();
    let sorted = !(p.top_p >= 1.0 && (p.top_k == 0 || p.top_k >= finite));
    if sorted {
        ids.sort_by_key(|&i| cand_key(i, logits[i as usize]));
        if p.top_k > 0 {
            ids.truncate(p.top_k);
        }
    }
    let max = ids
        .iter()
        .map(|&i| logits[i as usize])
        .fold(f32::MIN, f32::max) as f64;
    let inv_t = 1.0 / p.temperature as f64;
    let mut w: Vec<(u32, f64)> = ids
        .iter()
        .map(|&i| (i, det_exp((logits[i as usize] as f64 - max) * inv_t)))
        .collect();
    if sorted && p.top_p < 1.0 {
        let s: f64 = w.iter().map(|x| x.1).sum();
        let mut cum = 0.0;
        let keep = w
            .iter()
            .position(|x| {
                cum += x.1;
                cum >= p.top_p as f64 * s * (1.0 - 1e-12)
            })
            .unwrap();
        w.truncate(keep + 1);
    }
    for x in &mut w {
        if x.1 < p.min_p as f64 {
            x.1 = 0.0;
        }
    }
    w
}

/// Draws on a grid of uniforms: every token's share of the grid is its
/// share of the kept mass (within the grid's resolution), and nothing
/// outside the kept set is drawn.
fn check_grid(logits: &[f32], p: DrawParams) {
    let w = reference_weights(logits, &p);
    let total: f64 = w.iter().map(|x| x.1).sum();
    let n = 20_000;
    let mut counts = std::collections::HashMap::new();
    for g in 0..n {
        let u = (g as f64 + 0.5) / n as f64;
        let t = draw_token(logits, &p, u).unwrap();
        *counts.entry(t).or_insert(0usize) += 1;
    }
    for (&t, &c) in &counts {
        let wt = w.iter().find(|x| x.0 == t).map_or(0.0, |x| x.1);
        assert!(wt > 0.0, "{p:?}: drew {t}, weight {wt}");
        let want = wt / total * n as f64;
        assert!(
            (c as f64 - want).abs() <= 1.5,
            "{p:?}: token {t} {c} vs {want}"
        );
    }
    for &(t, wt) in &w {
        let want = wt / total * n as f64;
        if want > 1.5 {
            assert!(counts.contains_key(&t), "{p:?}: token {t} never drawn");
        }
    }
    // The ends of [0, 1) stay inside the kept set.
    for u in [0.0, 1.0 - f64::EPSILON / 2.0] {
        let t = draw_token(logits, &p, u).unwrap();
        assert!(
            w.iter().any(|x| x.0 == t && x.1 > 0.0),
            "{p:?}: u {u} drew {t}"
        );
    }
}

fn params(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> DrawParams {
    DrawParams {
        temperature,
        top_k,
        top_p,
        min_p,
    }
}

#[test]
fn id_order_draw_matches_its_weights() {
    // Several chunks, a ragged last one, -inf logits and ties.
    let mut logits = random_logits(3, 1000, 3.0);
    for i in (0..1000).step_by(7) {
        logits[i] = f32::NEG_INFINITY;
    }
    logits[500] = logits[501];
    for p in [
        params(1.0, 0, 1.0, 0.0),
        params(0.4, 0, 1.0, 0.0),
        params(1.0, 0, 1.0, 0.05),
        params(2.0, 5000, 1.0, 0.0),
    ] {
        check_grid(&logits, p);
    }
}

#[test]
fn sorted_draw_matches_its_weights() {
    let mut logits = random_logits(4, 700, 2.0);
    logits[10] = logits[20];
    logits[30] = f32::NEG_INFINITY;
    for p in [
        params(1.0, 40, 1.0, 0.0),
        params(0.8, 40, 0.95, 0.05),
        params(1.0, 0, 0.9, 0.0),
        // The nucleus form: no top-k cut (none, or past the finite count).
        params(0.7, 0, 0.5, 0.02),
        params(1.2, 800, 0.97, 0.0),
        params(1.5, 3, 0.5, 0.0),
        params(1.0, 1, 1.0, 0.0),
    ] {
        check_grid(&logits, p);
    }
}

#[test]
fn all_neg_inf_is_an_error() {
    let p = params(1.0, 0, 1.0, 0.0);
    assert!(draw_token(&[f32::NEG_INFINITY; 4], &p, 0.5).is_err());
    assert_eq!(draw_token(&[f32::NEG_INFINITY, 2.0], &p, 0.99).unwrap(), 1);
}
