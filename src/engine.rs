//! Generation loops over the runner: one request end to end (`run`,
//! `chat`, `bench`) and teacher-forced scoring (`logits`, `perplexity`).
//! The multi-request step loop of the server builds on the same runner.

use crate::kv::SeqId;
use crate::runner::{LogitsWanted, Runner, SeqWork};
use crate::sampler::{Sampler, SamplingParams};
use anyhow::{bail, Result};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Prefill chunk size (rows per step).
    pub n_ubatch: usize,
    /// Generation stops after emitting one of these.
    pub stop_ids: Vec<u32>,
}

#[derive(Clone, Debug, Default)]
pub struct GenStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_time: Duration,
    pub decode_time: Duration,
    /// Why generation ended: "stop" (a stop token) or "length".
    pub finish_reason: &'static str,
}

impl GenStats {
    pub fn prefill_tps(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_time.as_secs_f64().max(1e-9)
    }
    /// Decode tokens/s over the steps after the first token (the first
    /// token comes out of the prefill).
    pub fn decode_tps(&self) -> f64 {
        (self.generated_tokens.saturating_sub(1)) as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

/// Prefills `prompt` for `seq` starting at position `start` in chunks of
/// `n_ubatch`; returns the logits of the last prompt row.
pub fn prefill(
    runner: &mut Runner,
    seq: SeqId,
    prompt: &[u32],
    start: usize,
    n_ubatch: usize,
) -> Result<Vec<f32>> {
    if prompt.is_empty() {
        bail!("empty prompt: nothing to prefill");
    }
    let n_ubatch = n_ubatch.max(1);
    let mut last = Vec::new();
    let mut pos = start;
    for chunk in prompt.chunks(n_ubatch) {
        let is_last = pos + chunk.len() == start + prompt.len();
        let mut out = runner.step(&[SeqWork {
            seq,
            tokens: chunk,
            start_pos: pos,
            logits: if is_last {
                LogitsWanted::Last
            } else {
                LogitsWanted::None
            },
        }])?;
        pos += chunk.len();
        if is_last {
            last = out.pop().unwrap_or_default();
        }
    }
    Ok(last)
}

/// Generates for one sequence. `on_token` gets each new token and returns
/// false to stop early. The sequence's KV blocks are freed at the end.
pub fn generate(
    runner: &mut Runner,
    seq: SeqId,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_token: &mut dyn FnMut(u32) -> Result<bool>,
) -> Result<(Vec<u32>, GenStats)> {
    let res = generate_inner(runner, seq, prompt, opts, on_token);
    runner.free(seq);
    res
}

fn generate_inner(
    runner: &mut Runner,
    seq: SeqId,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_token: &mut dyn FnMut(u32) -> Result<bool>,
) -> Result<(Vec<u32>, GenStats)> {
    let ctx = runner.config().context_length;
    if prompt.len() >= ctx {
        bail!(
            "prompt of {} tokens does not fit the context of {ctx} tokens",
            prompt.len()
        );
    }
    let mut stats = GenStats {
        prompt_tokens: prompt.len(),
        finish_reason: "length",
        ..Default::default()
    };
    let mut sampler = Sampler::new(opts.sampling)?;
    let mut history: Vec<u32> = prompt.to_vec();
    let mut out = Vec::new();
    let t0 = Instant::now();
    let first = prefill(runner, seq, prompt, 0, opts.n_ubatch)?;
    stats.prefill_time = t0.elapsed();
    let t1 = Instant::now();
    let max_tokens = opts.max_tokens.min(ctx - prompt.len());
    // Decode steps' logits are sampled where the device wrote them (no copy
    // into a vector per token: 0.5 MB for a 128k vocabulary).
    let mut step: Option<crate::runner::Logits> = None;
    // Without a penalty the draw reads nothing but the logits (and the
    // step's uniform): its tokens can be chosen on the device.
    let chain = runner.draws_on_device(std::slice::from_ref(&sampler));
    while out.len() < max_tokens {
        let logits = match &step {
            Some(l) => l.seq(0),
            None => &first[..],
        };
        let tok = sampler.sample(logits, &history)?;
        out.push(tok);
        history.push(tok);
        stats.generated_tokens += 1;
        let keep_going = on_token(tok)?;
        if opts.stop_ids.contains(&tok) {
            stats.finish_reason = "stop";
            break;
        }
        if !keep_going {
            stats.finish_reason = "stop";
            break;
        }
        if out.len() == max_tokens {
            break;
        }
        let pos = history.len() - 1;
        if chain {
            // The rest on the device, one step ahead of the host
            // (runner/greedy.rs): the same tokens as sampling here.
            let left = max_tokens - out.len();
            let mut take = |t: u32| -> Result<bool> {
                out.push(t);
                history.push(t);
                stats.generated_tokens += 1;
                let keep_going = on_token(t)?;
                if opts.stop_ids.contains(&t) || !keep_going {
                    stats.finish_reason = "stop";
                    return Ok(false);
                }
                Ok(true)
            };
            drop(step.take());
            runner.decode_sampled_batch(
                &[seq],
                &[tok],
                &[pos],
                left,
                std::slice::from_mut(&mut sampler),
                &mut |t| take(t[0]),
            )?;
            break;
        }
        drop(step.take()); // its page-locked buffer back to the pool first
        step = Some(runner.step_flat(&[SeqWork {
            seq,
            tokens: &[tok],
            start_pos: pos,
            logits: LogitsWanted::Last,
        }])?);
    }
    stats.decode_time = t1.elapsed();
    Ok((out, stats))
}

/// Teacher-forced logits for every position of `tokens` (one sequence),
/// computed in chunks of `n_ubatch`: (tokens.len(), vocab) flattened.
pub fn teacher_forced_logits(
    runner: &mut Runner,
    seq: SeqId,
    tokens: &[u32],
    n_ubatch: usize,
) -> Result<Vec<f32>> {
    let mut all = Vec::new();
    let mut pos = 0;
    let res = (|| {
        for chunk in tokens.chunks(n_ubatch.max(1)) {
            let mut l = runner.step(&[SeqWork {
                seq,
                tokens: chunk,
                start_pos: pos,
                logits: LogitsWanted::All,
            }])?;
            all.extend(l.pop().unwrap_or_default());
            pos += chunk.len();
        }
        Ok(())
    })();
    runner.free(seq);
    res.map(|_| all)
}

/// Natural-log softmax probability of `target` under `logits` (f64).
pub fn log_prob(logits: &[f32], target: u32) -> f64 {
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let z: f64 = logits.iter().map(|&l| (l as f64 - m).exp()).sum();
    logits[target as usize] as f64 - m - z.ln()
}

#[derive(Clone, Debug)]
pub struct PerplexityResult {
    pub n_chunks: usize,
    pub n_scored: usize,
    pub nll_sum: f64,
}

impl PerplexityResult {
    pub fn ppl(&self) -> f64 {
        (self.nll_sum / self.n_scored.max(1) as f64).exp()
    }
}

/// Perplexity over `tokens` cut into chunks of `n_ctx`; in each chunk the
/// tokens of its second half are scored (as llama.cpp's perplexity tool
/// does), so every scored token has at least n_ctx/2 tokens of context.
/// `n_parallel` chunks run together as separate sequences in one step.
pub fn perplexity(
    runner: &mut Runner,
    tokens: &[u32],
    n_ctx: usize,
    n_parallel: usize,
    on_chunk: &mut dyn FnMut(usize, f64),
) -> Result<PerplexityResult> {
    if n_ctx < 2 {
        bail!("perplexity context must be at least 2 tokens");
    }
    let chunks: Vec<&[u32]> = tokens.chunks_exact(n_ctx).collect();
    if chunks.is_empty() {
        bail!(
            "text has {} tokens, fewer than one chunk of {n_ctx}",
            tokens.len()
        );
    }
    let mut res = PerplexityResult {
        n_chunks: 0,
        n_scored: 0,
        nll_sum: 0.0,
    };
    let v = runner.config().vocab_size;
    for group in chunks.chunks(n_parallel.max(1)) {
        let work: Vec<SeqWork> = group
            .iter()
            .enumerate()
            .map(|(i, c)| SeqWork {
                seq: SeqId(1_000_000 + i as u64),
                tokens: c,
                start_pos: 0,
                logits: LogitsWanted::All,
            })
            .collect();
        let step = runner.step(&work);
        for w in &work {
            runner.free(w.seq);
        }
        for (c, l) in group.iter().zip(step?) {
            for i in n_ctx / 2..n_ctx - 1 {
                res.nll_sum -= log_prob(&l[i * v..(i + 1) * v], c[i + 1]);
                res.n_scored += 1;
            }
            res.n_chunks += 1;
            on_chunk(res.n_chunks, res.ppl());
        }
    }
    Ok(res)
}
