//! `quire bench`: prefill (pp) and decode (tg) tokens/s, measured like
//! llama-bench: pp N = one prompt of N random tokens from an empty cache;
//! tg N = N single-token decode steps from an empty cache.

use super::ModelArgs;
use crate::kv::SeqId;
use crate::runner::{LogitsWanted, Runner, SeqWork};
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
        if let Err(e) = r.step(&[SeqWork {
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

fn mean_std(v: &[f64]) -> (f64, f64) {
    let m = v.iter().sum::<f64>() / v.len().max(1) as f64;
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len().max(1) as f64;
    (m, var.sqrt())
}

pub fn bench(a: BenchArgs) -> Result<()> {
    let (mut r, _tok) = a.model.load()?;
    let vocab = r.config().vocab_size;
    let model_name = a
        .model
        .model
        .as_ref()
        .and_then(|p| p.file_name())
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| crate::fetch::DEFAULT_MODEL_FILE.to_string());
    let mut rows = Vec::new();
    if a.prompt_tokens > 0 {
        let toks = random_tokens(a.prompt_tokens, vocab, 1);
        time_pp(&mut r, &toks, a.ubatch, SeqId(0))?; // warm-up
        let v: Vec<f64> = (0..a.reps.max(1))
            .map(|i| time_pp(&mut r, &toks, a.ubatch, SeqId(1 + i as u64)))
            .collect::<Result<_>>()?;
        rows.push((format!("pp{}", a.prompt_tokens), mean_std(&v)));
    }
    if a.gen_tokens > 0 {
        let toks = random_tokens(a.gen_tokens, vocab, 2);
        time_tg(&mut r, &toks[..toks.len().min(8)], SeqId(100))?; // warm-up
        let v: Vec<f64> = (0..a.reps.max(1))
            .map(|i| time_tg(&mut r, &toks, SeqId(101 + i as u64)))
            .collect::<Result<_>>()?;
        rows.push((format!("tg{}", a.gen_tokens), mean_std(&v)));
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
            "results": obj,
        });
        println!("{out}");
    } else {
        println!("| model | threads | test | t/s |");
        println!("|---|---|---|---|");
        for (k, (m, s)) in &rows {
            println!(
                "| {model_name} | {} | {k} | {m:.2} ± {s:.2} |",
                r.n_threads()
            );
        }
    }
    a.model.report_backends(&r);
    Ok(())
}
