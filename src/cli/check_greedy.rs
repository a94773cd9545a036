//! `quire check-greedy`: the device's greedy token choice against the
//! sampler's. First on crafted logits rows (ties, signed zeros, all -inf,
//! NaN, +inf, random rows, both load paths of sample_rows), then on a
//! model: greedy decoding with the tokens chosen on the device, one step
//! ahead of the host (runner/greedy.rs), against the same steps with
//! every step's logits downloaded and sampled on the host. Same logits,
//! so the tokens must be identical. Then the same for sampled decoding
//! (check_sample.rs).

use crate::backend::{GpuMode, Mode};
use crate::kv::SeqId;
use crate::runner::{Runner, RunnerOptions};
use crate::sampler::{Sampler, SamplingParams};
use anyhow::{bail, Context, Result};
use clap::Args;
use rand::{Rng, SeedableRng};
use std::time::Instant;

#[derive(Args, Debug)]
pub struct CheckGreedyArgs {
    #[command(flatten)]
    pub run: super::greedy_run::GreedyRunArgs,
    #[arg(long, default_value = "fast", value_parser = ["exact", "deterministic", "fast"])]
    pub mode: String,
}

/// Crafted rows of `vocab` logits and what the sampler makes of each.
fn crafted_rows(vocab: usize, rng: &mut rand_chacha::ChaCha8Rng) -> Vec<Vec<f32>> {
    let rand_row = |rng: &mut rand_chacha::ChaCha8Rng| -> Vec<f32> {
        (0..vocab).map(|_| rng.random_range(-8.0f32..8.0)).collect()
    };
    let mut rows = Vec::new();
    for _ in 0..16 {
        rows.push(rand_row(rng));
    }
    // Two equal maxima: the lower id.
    let mut r = rand_row(rng);
    r[vocab - 3] = 9.5;
    r[17] = 9.5;
    rows.push(r);
    // The maximum at the last id (the scalar tail of a vocab not a
    // multiple of 4, and the last float4 otherwise).
    let mut r = rand_row(rng);
    r[vocab - 1] = 20.0;
    rows.push(r);
    // -0.0 and +0.0 tie: the lower id, whichever sign it has.
    let mut r: Vec<f32> = (0..vocab)
        .map(|_| rng.random_range(-8.0f32..-1.0))
        .collect();
    r[9] = -0.0;
    r[4] = 0.0;
    r[2] = -0.0;
    rows.push(r);
    // All -inf: id 0.
    rows.push(vec![f32::NEG_INFINITY; vocab]);
    // A NaN, and a +inf: errors.
    let mut r = rand_row(rng);
    r[vocab / 2] = f32::NAN;
    rows.push(r);
    let mut r = rand_row(rng);
    r[3] = f32::INFINITY;
    rows.push(r);
    rows
}

/// The device's greedy rule (sample_rows) on crafted rows against the sampler: returns
/// the number of rows checked.
fn check_rows(r: &Runner, vocab: usize, seed: u64) -> Result<usize> {
    let be = super::device_backend(r, "check-greedy")?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let rows = crafted_rows(vocab, &mut rng);
    let n = rows.len();
    let flat: Vec<f32> = rows.concat();
    let d = be.up(&flat, "check-greedy: logits")?;
    let mut toks = be.up(&vec![u32::MAX; n], "check-greedy: tokens")?;
    let mut stat = be.up(&vec![u32::MAX; n], "check-greedy: status")?;
    let recs = be.up(
        &vec![0u32; n * crate::backend::cuda::DRAW_WORDS],
        "check-greedy: draws",
    )?;
    be.d_sample_rows(
        &d.slice(0..n * vocab),
        n,
        vocab,
        &recs.slice(0..recs.len()),
        &mut toks.slice_mut(0..n),
        &mut stat.slice_mut(0..n),
    )?;
    let toks = be.stream().clone_dtoh(&toks)?;
    let stat = be.stream().clone_dtoh(&stat)?;
    for (i, row) in rows.iter().enumerate() {
        let want = Sampler::new(SamplingParams::greedy())?.sample(row, &[]);
        match (want, stat[i]) {
            (Ok(t), 0) if toks[i] == t => {}
            (Err(_), 1) => {}
            (w, s) => bail!(
                "check-greedy: vocab {vocab}, row {i}: the sampler gives {w:?}, the device token {} status {s}",
                toks[i]
            ),
        }
    }
    Ok(n)
}

pub fn check_greedy(a: CheckGreedyArgs) -> Result<()> {
    let mode = match a.mode.as_str() {
        "deterministic" => Mode::Deterministic,
        "exact" => Mode::Exact,
        _ => Mode::Fast,
    };
    let mut r = Runner::load(
        &a.run.model,
        &RunnerOptions {
            gpu: GpuMode::Required,
            // The single run twice, then four sequences of up to 64 tokens.
            kv_tokens: Some(
                2 * (a.run.prompt_tokens + a.run.tokens + 16)
                    + 4 * (a.run.prompt_tokens.max(12) + 80),
            ),
            mode,
            tuning: a.run.tuning()?,
            ..Default::default()
        },
    )
    .context("loading the model with --gpu required")?;
    if !r.greedy_on_device() {
        bail!("check-greedy: decode steps here do not run as CUDA graphs (tuning runtime.graphs or runtime.greedy_chain off?)");
    }
    let vocab = r.config().vocab_size;
    let mut rows = 0;
    for v in [vocab, 1001, 4096] {
        rows += check_rows(&r, v, a.run.seed)?;
    }
    println!(
        "check-greedy: sample_rows (greedy rule) agrees with the sampler on {rows} crafted rows"
    );
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(a.run.seed);
    let prompt: Vec<u32> = (0..a.run.prompt_tokens.max(1))
        .map(|_| rng.random_range(0..vocab as u32))
        .collect();
    let (p, last) = (prompt.len() - 1, prompt[prompt.len() - 1]);
    let run = |r: &mut Runner, seq: SeqId, device: bool| -> Result<(Vec<u32>, f64)> {
        crate::engine::prefill(r, seq, &prompt[..p], 0, 512)?;
        let t = Instant::now();
        let out = if device {
            r.decode_greedy(seq, last, p, a.run.tokens, &mut |_| Ok(true))
        } else {
            let mut g = vec![Sampler::new(SamplingParams::greedy())?];
            r.decode_greedy_batch_host(&[seq], &[last], &[p], a.run.tokens, &mut g)
                .map(|mut o| o.pop().unwrap_or_default())
        };
        let dt = t.elapsed().as_secs_f64();
        r.free(seq);
        Ok((out?, dt))
    };
    let (dev, t_dev) = run(&mut r, SeqId(1), true)?;
    let (host, t_host) = run(&mut r, SeqId(2), false)?;
    let n = dev.len().min(host.len());
    if let Some(i) = (0..n).find(|&i| dev[i] != host[i]) {
        bail!(
            "check-greedy: token {i} differs: device {} host {} (device {:?}.., host {:?}..)",
            dev[i],
            host[i],
            &dev[..=i],
            &host[..=i]
        );
    }
    if dev.len() != a.run.tokens || host.len() != a.run.tokens {
        bail!(
            "check-greedy: {} device and {} host tokens of {}",
            dev.len(),
            host.len(),
            a.run.tokens
        );
    }
    println!(
        "check-greedy: {mode:?} mode, {} tokens after a {}-token prompt identical; device chain {:.1} tok/s, host sampling {:.1} tok/s",
        a.run.tokens,
        prompt.len(),
        a.run.tokens as f64 / t_dev,
        a.run.tokens as f64 / t_host
    );
    // Four sequences in lockstep, prompts of different lengths.
    let b = 4;
    let prompts: Vec<Vec<u32>> = (0..b)
        .map(|i| {
            (0..a.run.prompt_tokens.max(12) - 3 * i)
                .map(|_| rng.random_range(0..vocab as u32))
                .collect()
        })
        .collect();
    let batch = |r: &mut Runner, base: u64, device: bool| -> Result<Vec<Vec<u32>>> {
        let seqs: Vec<SeqId> = (0..b as u64).map(|i| SeqId(base + i)).collect();
        for (s, p) in seqs.iter().zip(&prompts) {
            crate::engine::prefill(r, *s, &p[..p.len() - 1], 0, 512)?;
        }
        let firsts: Vec<u32> = prompts.iter().map(|p| p[p.len() - 1]).collect();
        let starts: Vec<usize> = prompts.iter().map(|p| p.len() - 1).collect();
        let n = a.run.tokens.min(64);
        let out = if device {
            r.decode_greedy_batch(&seqs, &firsts, &starts, n, &mut |_| Ok(true))
        } else {
            let mut g: Vec<Sampler> = (0..b)
                .map(|_| Sampler::new(SamplingParams::greedy()))
                .collect::<Result<_>>()?;
            r.decode_greedy_batch_host(&seqs, &firsts, &starts, n, &mut g)
        };
        for s in &seqs {
            r.free(*s);
        }
        out
    };
    let dev = batch(&mut r, 10, true)?;
    let host = batch(&mut r, 20, false)?;
    if dev != host {
        bail!("check-greedy: {b} sequences in lockstep: device {dev:?} host {host:?}");
    }
    println!(
        "check-greedy: {b} sequences in lockstep, {} tokens each identical",
        dev[0].len()
    );
    super::check_sample::check_sampled(&mut r, &a.run, mode)?;
    let vocab = r.config().vocab_size;
    let mut n = 0;
    for v in [vocab, 1001, 4096, 300] {
        n += super::check_masked::check_masked_rows(&r, v, a.run.seed)?;
    }
    println!(
        "check-sample: mask_rows + sample_rows agree with the masked sampler on {n} crafted cases"
    );
    Ok(())
}
