//! The sampled half of `quire check-greedy`: the device's draw
//! (`sample_rows`, ops/sample/kernels/sample.cu) against the host sampler's, bit for
//! bit. First on crafted rows (ties, signed zeros, -inf runs, a NaN, a
//! +inf, random rows of several widths) for every parameter shape the
//! device draws (id order with and without min-p, top-k with and without
//! top-p and min-p, top-k of 1 and of SAMPLE_KMAX, top-k past the finite
//! count, top-p alone: the nucleus, within one batch and over many) and
//! uniforms at both ends of [0, 1); then on a model: sampled
//! decoding with the tokens drawn on the device, one step ahead of the
//! host, against the same seeds sampled on the host.

use crate::backend::cuda::{device_draws, draw_record, DRAW_WORDS};
use crate::kv::SeqId;
use crate::runner::Runner;
use crate::sampler::{DrawParams, Sampler, SamplingParams};
use anyhow::{bail, Result};
use cudarc::driver::CudaSlice;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Parameter shapes the device draws (every one within `device_draws`).
pub(super) fn shapes(vocab: usize) -> Vec<SamplingParams> {
    let p = |temperature, top_k, top_p, min_p| SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        repetition_penalty: 1.0,
        repeat_last_n: 0,
        seed: 0,
    };
    vec![
        p(0.0, 0, 1.0, 0.0),
        p(0.7, 0, 1.0, 0.0),
        p(1.0, 0, 1.0, 0.05),
        p(2.5, vocab + 7, 1.0, 0.0),
        p(0.8, 40, 0.95, 0.05),
        p(1.0, 40, 1.0, 0.0),
        p(1.3, 1, 1.0, 0.0),
        p(1.0, 1024, 0.9, 0.0),
        p(0.5, 300, 0.5, 0.01),
        p(1.0, 1000, 1.0, 0.0),
        p(0.7, 0, 0.9, 0.0),
        p(1.0, 0, 0.95, 0.02),
        p(1.5, 0, 0.999, 0.0),
        p(0.8, vocab, 0.3, 0.0),
    ]
}

/// Rows of `vocab` logits: random, coarse (many exact ties), signed
/// zeros at the top, -inf runs (fewer finite than top-k), all -inf but
/// one, all -inf, a NaN, a +inf.
pub(super) fn rows(vocab: usize, rng: &mut ChaCha8Rng) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    for s in [8.0f32, 2.0, 30.0] {
        out.push((0..vocab).map(|_| rng.random_range(-s..s)).collect());
    }
    out.push(
        (0..vocab)
            .map(|_| (rng.random_range(-6i32..6) as f32) * 0.5)
            .collect(),
    );
    let mut r: Vec<f32> = (0..vocab)
        .map(|_| rng.random_range(-9.0f32..-1.0))
        .collect();
    r[vocab / 3] = -0.0;
    r[7] = 0.0;
    r[vocab - 1] = -0.0;
    out.push(r);
    let mut r: Vec<f32> = (0..vocab).map(|_| rng.random_range(-3.0f32..3.0)).collect();
    for (i, v) in r.iter_mut().enumerate() {
        if i % 97 != 3 {
            *v = f32::NEG_INFINITY;
        }
    }
    out.push(r);
    let mut r = vec![f32::NEG_INFINITY; vocab];
    r[vocab / 2] = -50.0;
    out.push(r);
    out.push(vec![f32::NEG_INFINITY; vocab]);
    let mut r: Vec<f32> = (0..vocab).map(|_| rng.random_range(-3.0f32..3.0)).collect();
    r[vocab - 2] = f32::NAN;
    out.push(r);
    let mut r: Vec<f32> = (0..vocab).map(|_| rng.random_range(-3.0f32..3.0)).collect();
    r[1] = f32::INFINITY;
    out.push(r);
    out
}

/// sample_rows over the `n` rows of `vocab` logits and draw records in
/// (logits, draws), into (tokens, statuses).
pub(super) fn sample_on(
    be: &crate::backend::cuda::CudaBackend,
    (d, dr): (&CudaSlice<f32>, &CudaSlice<u32>),
    n: usize,
    vocab: usize,
    (toks, stat): (&mut CudaSlice<u32>, &mut CudaSlice<u32>),
) -> Result<()> {
    be.d_sample_rows(
        &d.slice(0..n * vocab),
        n,
        vocab,
        &dr.slice(0..n * DRAW_WORDS),
        &mut toks.slice_mut(0..n),
        &mut stat.slice_mut(0..n),
    )
}

/// The device's draws on crafted rows against `Sampler::sample_with`:
/// returns the number of (row, parameters, uniform) cases checked.
fn check_rows(r: &Runner, vocab: usize, seed: u64) -> Result<usize> {
    let be = super::device_backend(r, "check-sample")?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ vocab as u64);
    let rows = rows(vocab, &mut rng);
    let mut cases: Vec<(usize, SamplingParams, f64)> = Vec::new();
    for (ri, _) in rows.iter().enumerate() {
        for p in shapes(vocab) {
            if !device_draws(&p.draw_params(), vocab) {
                continue;
            }
            for u in [
                0.0,
                1.0 - f64::EPSILON / 2.0,
                rng.random::<f64>(),
                rng.random(),
            ] {
                cases.push((ri, p, u));
            }
        }
    }
    let n = cases.len();
    let mut flat = Vec::with_capacity(n * vocab);
    let mut recs = Vec::with_capacity(n * DRAW_WORDS);
    for (ri, p, u) in &cases {
        flat.extend_from_slice(&rows[*ri]);
        let d: DrawParams = p.draw_params();
        recs.extend(draw_record(Some((&d, *u)), false));
    }
    let d = be.up(&flat, "check-sample: logits")?;
    let dr = be.up(&recs, "check-sample: draws")?;
    let mut toks = be.up(&vec![u32::MAX; n], "check-sample: tokens")?;
    let mut stat = be.up(&vec![u32::MAX; n], "check-sample: status")?;
    sample_on(be, (&d, &dr), n, vocab, (&mut toks, &mut stat))?;
    let toks = be.stream().clone_dtoh(&toks)?;
    let stat = be.stream().clone_dtoh(&stat)?;
    for (i, (ri, p, u)) in cases.iter().enumerate() {
        let want = Sampler::new(*p)?.sample_with(&rows[*ri], &[], Some(*u));
        match (&want, stat[i]) {
            (Ok(t), 0) if toks[i] == *t => {}
            (Err(_), 1 | 2) => {}
            _ => bail!(
                "check-sample: vocab {vocab}, row {ri}, {p:?}, u {u}: the sampler gives {want:?}, \
                 the device token {} status {}",
                toks[i],
                stat[i]
            ),
        }
    }
    Ok(n)
}

/// Device time of sample_rows (CUDA events, 100 launches) on `n` random
/// rows of `vocab` logits per parameter shape: what a step pays for its
/// draw. Printed, not checked.
fn time_rows(r: &Runner, vocab: usize, n: usize) -> Result<String> {
    let be = super::device_backend(r, "check-sample")?;
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let flat: Vec<f32> = (0..n * vocab)
        .map(|_| rng.random_range(-8.0f32..8.0))
        .collect();
    // Peaked rows, as a trained model's usually are: 16 ids well above
    // the rest (a nucleus of a few tokens instead of thousands).
    let mut peaked: Vec<f32> = (0..n * vocab)
        .map(|_| rng.random_range(-4.0f32..4.0))
        .collect();
    for row in peaked.chunks_mut(vocab) {
        for j in 0..16 {
            row[rng.random_range(0..vocab)] = 16.0 - j as f32 * 0.5;
        }
    }
    let d = be.up(&flat, "check-sample: logits")?;
    let dp = be.up(&peaked, "check-sample: peaked logits")?;
    let mut toks = be.up(&vec![0u32; n], "check-sample: tokens")?;
    let mut stat = be.up(&vec![0u32; n], "check-sample: status")?;
    let mut out = Vec::new();
    for (name, idx, peak) in [
        ("greedy", 0, false),
        ("T0.7", 1, false),
        ("T0.8 k40 p.95", 4, false),
        ("k40", 5, false),
        ("k1000", 9, false),
        ("k1024 p.9", 7, false),
        ("T0.7 p.9", 10, false),
        ("T1.5 p.999", 12, false),
        ("peaked: T0.7", 1, true),
        ("T0.7 p.9", 10, true),
        ("T1 p.95 min-p.02", 11, true),
    ] {
        let d = if peak { &dp } else { &d };
        let p = shapes(vocab)[idx];
        let recs: Vec<u32> = (0..n)
            .flat_map(|_| draw_record(Some((&p.draw_params(), 0.5)), false))
            .collect();
        let dr = be.up(&recs, "check-sample: draws")?;
        let mut launch = || sample_on(be, (d, &dr), n, vocab, (&mut toks, &mut stat));
        launch()?;
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let st = be.stream();
        let e0 = st.record_event(flags)?;
        for _ in 0..100 {
            launch()?;
        }
        let e1 = st.record_event(flags)?;
        out.push(format!("{name} {:.1} us", e0.elapsed_ms(&e1)? * 10.0));
    }
    Ok(format!("{n} row(s) of {vocab}: {}", out.join(", ")))
}

/// Crafted rows at several widths, then sampled decoding on the device
/// against the host with the same seeds: one sequence, and four in
/// lockstep with different parameters.
pub(super) fn check_sampled(
    r: &mut Runner,
    a: &super::greedy_run::GreedyRunArgs,
    mode: crate::backend::Mode,
) -> Result<()> {
    let vocab = r.config().vocab_size;
    let mut n = 0;
    for v in [vocab, 1001, 4096, 300] {
        n += check_rows(r, v, a.seed)?;
    }
    println!("check-sample: sample_rows agrees with the sampler on {n} crafted cases");

    for (v, rows) in [(vocab, 1), (128_256, 1), (128_256, 64)] {
        println!("check-sample: sample_rows time, {}", time_rows(r, v, rows)?);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(a.seed.wrapping_add(99));
    let b = 4;
    let prompts: Vec<Vec<u32>> = (0..b)
        .map(|i| {
            (0..a.prompt_tokens.max(12) - 3 * i)
                .map(|_| rng.random_range(0..vocab as u32))
                .collect()
        })
        .collect();
    let params: Vec<SamplingParams> = shapes(vocab)
        .into_iter()
        .filter(|p| p.temperature != 0.0 && device_draws(&p.draw_params(), vocab))
        .collect();
    for (k, group) in params.chunks(b).enumerate() {
        let samplers = |seed: u64| -> Result<Vec<Sampler>> {
            (0..b)
                .map(|i| {
                    Sampler::new(SamplingParams {
                        seed: seed + i as u64,
                        ..group[i % group.len()]
                    })
                })
                .collect()
        };
        let run = |r: &mut Runner, base: u64, device: bool| -> Result<Vec<Vec<u32>>> {
            let seqs: Vec<SeqId> = (0..b as u64).map(|i| SeqId(base + i)).collect();
            for (s, p) in seqs.iter().zip(&prompts) {
                crate::engine::prefill(r, *s, &p[..p.len() - 1], 0, 512)?;
            }
            let firsts: Vec<u32> = prompts.iter().map(|p| p[p.len() - 1]).collect();
            let starts: Vec<usize> = prompts.iter().map(|p| p.len() - 1).collect();
            let steps = a.tokens.min(64);
            let mut sm = samplers(a.seed + 1000 * k as u64)?;
            let out = if device {
                if !r.draws_on_device(&sm) {
                    bail!("check-sample: these rows would not draw on the device");
                }
                r.decode_sampled_batch(&seqs, &firsts, &starts, steps, &mut sm, &mut |_| Ok(true))
            } else {
                r.decode_greedy_batch_host(&seqs, &firsts, &starts, steps, &mut sm)
            };
            for s in &seqs {
                r.free(*s);
            }
            out
        };
        let dev = run(r, 100 + 10 * k as u64, true)?;
        let host = run(r, 200 + 10 * k as u64, false)?;
        if dev != host {
            bail!("check-sample: {mode:?}, group {k}: device {dev:?} host {host:?}");
        }
        let distinct: std::collections::HashSet<u32> = dev.iter().flatten().copied().collect();
        println!(
            "check-sample: {mode:?} mode, {b} sampled sequences ({}) in lockstep, {} tokens each \
             identical ({} distinct tokens)",
            group
                .iter()
                .map(|p| format!(
                    "T {} k {} p {} min-p {}",
                    p.temperature, p.top_k, p.top_p, p.min_p
                ))
                .collect::<Vec<_>>()
                .join("; "),
            dev[0].len(),
            distinct.len()
        );
    }
    Ok(())
}
