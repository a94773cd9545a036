//! `quire bench`: prefill (pp) and decode (tg) tokens/s, measured like
//! llama-bench: pp N = one prompt of N random tokens from an empty cache;
//! tg N = N single-token decode steps from an empty cache (or after a
//! prompt of `--depth` tokens). `--batch` adds batched decode measured like
//! llama-batched-bench: B sequences of `--batch-prompt` tokens each, then
//! `-g` steps of B rows; tokens/s counts every generated token.

use super::ModelArgs;
use crate::kv::SeqId;
use crate::runner::{LogitsWanted, Runner, SeqWork};
use crate::sampler::{Sampler, SamplingParams};
use anyhow::Result;
use clap::Args;
use rand::{Rng, SeedableRng};
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens for the prefill test (0 = skip).
    #[arg(long, short = 'p', default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Tokens for the decode test (0 = skip).
    #[arg(long, short = 'g', default_value_t = 128)]
    pub gen_tokens: usize,
    /// Prefill chunk size.
    #[arg(long, default_value_t = 512)]
    pub ubatch: usize,
    /// Repetitions of each test (after one warm-up run).
    #[arg(long, short = 'r', default_value_t = 3)]
    pub reps: usize,
    /// Print results as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Batch-1 decode after prompts of these lengths (comma-separated),
    /// besides the empty-cache tg test.
    #[arg(long, value_delimiter = ',')]
    pub depth: Vec<usize>,
    /// Batched decode at these batch sizes (comma-separated, e.g. 8,32,64).
    #[arg(long, value_delimiter = ',')]
    pub batch: Vec<usize>,
    /// Prompt tokens of each sequence of the batched decode test.
    #[arg(long, default_value_t = 128)]
    pub batch_prompt: usize,
    /// Physical KV block order: `in-order` (a fresh free list) or
    /// `scattered` (the free list shuffled before every test, so every
    /// sequence's blocks are spread over random physical blocks).
    #[arg(long, value_enum, default_value_t = KvLayout::InOrder)]
    pub kv_layout: KvLayout,
    /// The tg, tg@d and batched tests generate their tokens greedily
    /// (`Runner::decode_greedy`: on the GPU each token is chosen on the
    /// device and the host stays one step ahead, as `quire run
    /// --temperature 0` decodes) instead of feeding random tokens and
    /// reading every step's logits on the host; rows marked "greedy".
    #[arg(long)]
    pub greedy: bool,
    /// As --greedy, but the tokens are sampled with these parameters,
    /// `TEMPERATURE,TOP_K,TOP_P,MIN_P` (e.g. `0.8,40,0.95,0.05`, the `run`
    /// defaults; seeded per sequence): on the GPU drawn on the device
    /// where it can (ops/sample/kernels/sample.cu), else on the host
    /// (`--tune runtime.greedy_chain=false`: always on the host). Rows marked "sampled".
    #[arg(long, value_parser = parse_sample)]
    pub sample: Option<SamplingParams>,
    /// Write a PNG plot of decode tokens/s against batch size and against
    /// context length (from the tg, --batch and --depth tests).
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
}

/// `--sample`'s `TEMPERATURE,TOP_K,TOP_P,MIN_P`.
fn parse_sample(s: &str) -> Result<SamplingParams, String> {
    let v: Vec<&str> = s.split(',').collect();
    let [t, k, p, m] = v[..] else {
        return Err(format!("expected TEMPERATURE,TOP_K,TOP_P,MIN_P, got {s:?}"));
    };
    let f = |x: &str| x.trim().parse::<f32>().map_err(|e| format!("{x:?}: {e}"));
    let params = SamplingParams {
        temperature: f(t)?,
        top_k: k.trim().parse().map_err(|e| format!("{k:?}: {e}"))?,
        top_p: f(p)?,
        min_p: f(m)?,
        repetition_penalty: 1.0,
        repeat_last_n: 0,
        seed: 0,
    };
    params.validate().map_err(|e| format!("{e:#}"))?;
    Ok(params)
}

/// The samplers of a chained decode test: one per sequence, seeded apart.
fn chain_samplers(p: &SamplingParams, b: usize, seed: u64) -> Result<Vec<Sampler>> {
    (0..b)
        .map(|i| {
            Sampler::new(SamplingParams {
                seed: seed + i as u64,
                ..*p
            })
        })
        .collect()
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvLayout {
    InOrder,
    Scattered,
}

/// Shuffles the runner's KV free list: takes every free block (one
/// one-block sequence each), then frees them in a random order.
fn scatter_kv(r: &mut Runner, seed: u64) -> Result<()> {
    let bs = r.kv.block_size();
    let n = r.kv.num_free_blocks();
    let ids: Vec<SeqId> = (0..n as u64).map(|i| SeqId(1 << 40 | i)).collect();
    for id in &ids {
        r.kv.allocate(*id, bs)
            .map_err(|e| anyhow::anyhow!("scattering the KV free list: {e}"))?;
    }
    let mut order = ids;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    for i in (1..order.len()).rev() {
        order.swap(i, rng.random_range(0..=i));
    }
    for id in order {
        r.free(id);
    }
    Ok(())
}

/// Generated tokens/s of `gen` decode steps over `b` sequences, each
/// prefilled with `prompt` tokens first (not timed).
fn time_batched(
    r: &mut Runner,
    b: usize,
    prompt: usize,
    gen: usize,
    ubatch: usize,
    seed: u64,
    chain: Option<&SamplingParams>,
) -> Result<f64> {
    let vocab = r.config().vocab_size;
    let seqs: Vec<SeqId> = (0..b as u64).map(|i| SeqId(5000 + i)).collect();
    let toks: Vec<Vec<u32>> = (0..b)
        .map(|i| random_tokens(prompt + gen, vocab, seed + i as u64))
        .collect();
    let res = (|| {
        for (s, t) in seqs.iter().zip(&toks) {
            crate::engine::prefill(r, *s, &t[..prompt], 0, ubatch)?;
        }
        if let Some(p) = chain {
            // The rows' own greedy or sampled tokens, chosen on the device
            // where the steps run as graphs (Runner::decode_sampled_batch).
            let firsts: Vec<u32> = toks.iter().map(|t| t[prompt]).collect();
            let mut sm = chain_samplers(p, b, seed)?;
            let t0 = Instant::now();
            let out = r.decode_sampled_batch(
                &seqs,
                &firsts,
                &vec![prompt; b],
                gen,
                &mut sm,
                &mut |_| Ok(true),
            )?;
            anyhow::ensure!(
                out.iter().all(|o| o.len() == gen),
                "greedy batched decode: fewer than {gen} tokens"
            );
            return Ok((b * gen) as f64 / t0.elapsed().as_secs_f64());
        }
        // QUIRE_NCU_STEP=i: the profiler collects decode step i only
        // (`ncu --profile-from-start off`).
        let ncu_step: Option<usize> = std::env::var("QUIRE_NCU_STEP")
            .ok()
            .and_then(|v| v.parse().ok());
        let t0 = Instant::now();
        for step in 0..gen {
            if ncu_step == Some(step) {
                crate::backend::cuda::profiler_range(true);
            }
            let work: Vec<SeqWork<'_>> = seqs
                .iter()
                .zip(&toks)
                .map(|(s, t)| SeqWork {
                    seq: *s,
                    tokens: std::slice::from_ref(&t[prompt + step]),
                    start_pos: prompt + step,
                    logits: LogitsWanted::Last,
                })
                .collect();
            // Dropped at once: its buffer serves the next step.
            drop(r.step_flat(&work)?);
            if ncu_step == Some(step) {
                crate::backend::cuda::profiler_range(false);
            }
        }
        let tps = (b * gen) as f64 / t0.elapsed().as_secs_f64();
        for (phase, n, us) in crate::backend::cuda::device::step_times::report() {
            eprintln!("step phase (QUIRE_STEP_TIMES=1, batch {b}): {phase:45} {n:6} x {us:8.2} us");
        }
        Ok(tps)
    })();
    for s in seqs {
        r.free(s);
    }
    res
}

/// Decode tokens/s at batch 1 after a prompt of `depth` tokens.
fn time_depth(r: &mut Runner, depth: usize, gen: usize, ubatch: usize) -> Result<f64> {
    time_batched(r, 1, depth, gen, ubatch, 7, None)
}

fn random_tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(0..vocab as u32)).collect()
}

fn time_pp(r: &mut Runner, toks: &[u32], ubatch: usize, seq: SeqId) -> Result<f64> {
    let t = Instant::now();
    let res = crate::engine::prefill(r, seq, toks, 0, ubatch);
    let dt = t.elapsed().as_secs_f64();
    r.free(seq);
    res?;
    Ok(toks.len() as f64 / dt)
}

fn time_tg(r: &mut Runner, toks: &[u32], seq: SeqId) -> Result<f64> {
    let t = Instant::now();
    let mut res = Ok(());
    for (i, tok) in toks.iter().enumerate() {
        // The logits stay where the device wrote them, as a server reads
        // them (no copy into a vector per token).
        if let Err(e) = r.step_flat(&[SeqWork {
            seq,
            tokens: std::slice::from_ref(tok),
            start_pos: i,
            logits: LogitsWanted::Last,
        }]) {
            res = Err(e);
            break;
        }
    }
    let dt = t.elapsed().as_secs_f64();
    r.free(seq);
    res?;
    Ok(toks.len() as f64 / dt)
}

/// Greedy (or sampled with `p`) decode tokens/s: `gen` steps after a
/// prompt of `depth` random tokens (prefilled first, not timed), fed
/// `first` and then their own choices.
fn time_greedy(
    r: &mut Runner,
    depth: usize,
    gen: usize,
    ubatch: usize,
    seq: SeqId,
    p: &SamplingParams,
) -> Result<f64> {
    let vocab = r.config().vocab_size;
    let toks = random_tokens(depth + 1, vocab, 7);
    let res = (|| {
        if depth > 0 {
            crate::engine::prefill(r, seq, &toks[..depth], 0, ubatch)?;
        }
        let t0 = Instant::now();
        let mut sm = chain_samplers(p, 1, 7)?;
        let out = r
            .decode_sampled_batch(&[seq], &[toks[depth]], &[depth], gen, &mut sm, &mut |_| {
                Ok(true)
            })?
            .pop()
            .unwrap_or_default();
        anyhow::ensure!(
            out.len() == gen,
            "greedy decode: {} of {gen} tokens",
            out.len()
        );
        Ok(gen as f64 / t0.elapsed().as_secs_f64())
    })();
    r.free(seq);
    res
}

/// The chained decode tests' parameters: --sample's, --greedy's, or none
/// (random tokens fed, logits read on the host).
fn chain_params(a: &BenchArgs) -> Option<SamplingParams> {
    a.sample.or(a.greedy.then(SamplingParams::greedy))
}

fn chain_tag(a: &BenchArgs) -> &'static str {
    match (a.sample.is_some(), a.greedy) {
        (true, _) => " sampled",
        (false, true) => " greedy",
        _ => "",
    }
}

fn mean_std(v: &[f64]) -> (f64, f64) {
    let m = v.iter().sum::<f64>() / v.len().max(1) as f64;
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len().max(1) as f64;
    (m, var.sqrt())
}

pub fn bench(a: BenchArgs) -> Result<()> {
    // A hybrid model needs a recurrent state slot per sequence of the
    // largest batch.
    let mut margs = a.model.clone();
    margs.state_slots = margs
        .state_slots
        .max(a.batch.iter().copied().max().unwrap_or(1));
    let (mut r, _tok) = margs.load()?;
    let vocab = r.config().vocab_size;
    let model_name = a
        .model
        .model
        .as_ref()
        .and_then(|p| p.file_name())
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| crate::fetch::DEFAULT_MODEL_FILE.to_string());
    let mut rows = Vec::new();
    // (x, tokens/s) for the plot: batch size, context length.
    let (mut batch_pts, mut ctx_pts) = (Vec::new(), Vec::new());
    let layout = a.kv_layout;
    let mut prep_seed = 0u64;
    let mut prep = |r: &mut Runner| -> Result<()> {
        prep_seed += 1;
        match layout {
            KvLayout::InOrder => Ok(()),
            KvLayout::Scattered => scatter_kv(r, prep_seed),
        }
    };
    if a.prompt_tokens > 0 {
        let toks = random_tokens(a.prompt_tokens, vocab, 1);
        time_pp(&mut r, &toks, a.ubatch, SeqId(0))?; // warm-up
        let v: Vec<f64> = (0..a.reps.max(1))
            .map(|i| {
                prep(&mut r)?;
                time_pp(&mut r, &toks, a.ubatch, SeqId(1 + i as u64))
            })
            .collect::<Result<_>>()?;
        rows.push((format!("pp{}", a.prompt_tokens), mean_std(&v)));
    }
    if a.gen_tokens > 0 {
        let toks = random_tokens(a.gen_tokens, vocab, 2);
        let (g, ub) = (a.gen_tokens, a.ubatch);
        // The greedy or sampled form (--greedy, --sample) from an empty
        // cache and after a prompt.
        let chain = chain_params(&a);
        let tg = move |r: &mut Runner, depth: usize, gen: usize, seq: SeqId| {
            if let Some(p) = &chain {
                time_greedy(r, depth, gen, ub, seq, p)
            } else if depth == 0 {
                time_tg(r, &toks[..gen], seq)
            } else {
                time_depth(r, depth, gen, ub)
            }
        };
        let tag = chain_tag(&a);
        tg(&mut r, 0, g.min(8), SeqId(100))?; // warm-up
        let v: Vec<f64> = (0..a.reps.max(1))
            .map(|i| {
                prep(&mut r)?;
                tg(&mut r, 0, g, SeqId(101 + i as u64))
            })
            .collect::<Result<_>>()?;
        let ms = mean_std(&v);
        batch_pts.push((1.0, ms.0));
        ctx_pts.push((a.gen_tokens as f64, ms.0));
        rows.push((format!("tg{g}{tag}"), ms));
        for &d in &a.depth {
            prep(&mut r)?;
            tg(&mut r, d, g.min(8), SeqId(200))?; // warm-up
            let v: Vec<f64> = (0..a.reps.max(1))
                .map(|i| {
                    prep(&mut r)?;
                    tg(&mut r, d, g, SeqId(201 + i as u64))
                })
                .collect::<Result<_>>()?;
            let ms = mean_std(&v);
            ctx_pts.push(((d + g) as f64, ms.0));
            rows.push((format!("tg{g}@d{d}{tag}"), ms));
        }
    }
    if a.gen_tokens > 0 {
        for &b in &a.batch {
            anyhow::ensure!(b > 0, "--batch sizes must be at least 1");
            let need = b * (a.batch_prompt + a.gen_tokens);
            anyhow::ensure!(
                need <= r.kv.num_blocks().saturating_sub(1) * r.kv.block_size(),
                "batched decode at B={b} needs {need} KV tokens; pass --kv-tokens {need} or more"
            );
            prep(&mut r)?;
            let chain = chain_params(&a);
            time_batched(&mut r, b, a.batch_prompt, 4, a.ubatch, 11, chain.as_ref())?; // warm-up
            let v: Vec<f64> = (0..a.reps.max(1))
                .map(|i| {
                    prep(&mut r)?;
                    time_batched(
                        &mut r,
                        b,
                        a.batch_prompt,
                        a.gen_tokens,
                        a.ubatch,
                        100 * i as u64,
                        chain.as_ref(),
                    )
                })
                .collect::<Result<_>>()?;
            let ms = mean_std(&v);
            batch_pts.push((b as f64, ms.0));
            let tag = chain_tag(&a);
            rows.push((
                format!("tg{} B{b} p{}{tag}", a.gen_tokens, a.batch_prompt),
                ms,
            ));
        }
    }
    if a.json {
        let obj: serde_json::Map<String, serde_json::Value> = rows
            .iter()
            .map(|(k, (m, s))| (k.clone(), serde_json::json!({"tps": m, "std": s})))
            .collect();
        let out = serde_json::json!({
            "engine": "quire",
            "model": model_name,
            "threads": r.n_threads(),
            "tensor_parallel": a.model.tensor_parallel,
            "results": obj,
        });
        println!("{out}");
    } else {
        // Threads as ranks x threads each under tensor parallelism.
        let threads = match a.model.tensor_parallel {
            None => r.n_threads().to_string(),
            Some(n) => format!("{n}x{}", r.n_threads() / n.max(1)),
        };
        println!("| model | threads | test | t/s |");
        println!("|---|---|---|---|");
        for (k, (m, s)) in &rows {
            println!("| {model_name} | {threads} | {k} | {m:.2} ± {s:.2} |");
        }
    }
    a.model.report_backends(&r);
    if let Some(p) = r.step_paths() {
        eprintln!(
            "device steps: {} graph replays, {} graph warm-ups, {} decode op by op, {} prefill; {} captures, {} failed",
            p.graph, p.warmup, p.eager, p.prefill, p.captures, p.capture_failures
        );
    }
    if let Some(path) = &a.plot {
        write_plot(path, &model_name, &a, batch_pts, ctx_pts)?;
        println!("plot written to {}", path.display());
    }
    Ok(())
}

fn write_plot(
    path: &std::path::Path,
    model_name: &str,
    a: &BenchArgs,
    mut batch_pts: Vec<(f64, f64)>,
    mut ctx_pts: Vec<(f64, f64)>,
) -> Result<()> {
    use super::plot::{write_png, Panel, Series};
    batch_pts.sort_by(|x, y| x.0.total_cmp(&y.0));
    ctx_pts.sort_by(|x, y| x.0.total_cmp(&y.0));
    let label = format!("quire {:?}", a.model.mode).to_lowercase();
    write_png(
        path,
        &format!("quire bench: {model_name}"),
        &[
            Panel {
                title: format!("decode, generated tok/s (tg{})", a.gen_tokens),
                x_label: "sequences in the batch".into(),
                y_label: "tokens/s".into(),
                series: vec![Series {
                    label: label.clone(),
                    points: batch_pts,
                }],
            },
            Panel {
                title: "batch-1 decode".into(),
                x_label: "context length at the last step".into(),
                y_label: "tokens/s".into(),
                series: vec![Series {
                    label,
                    points: ctx_pts,
                }],
            },
        ],
    )
}
