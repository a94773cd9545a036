//! Tools to trust a model: `quire tokenize`, `quire logits`,
//! `quire perplexity`.

use super::ModelArgs;
use crate::engine::{perplexity as ppl, teacher_forced_logits};
use crate::kv::SeqId;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct TokenizeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text to tokenize.
    pub text: String,
    /// Parse special tokens written in the text (e.g. `<|im_start|>`).
    #[arg(long)]
    pub special: bool,
    /// Add BOS/EOS as the model's metadata asks.
    #[arg(long)]
    pub add_special: bool,
}

#[derive(Args, Debug)]
pub struct LogitsArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text to score (teacher forced).
    pub text: String,
    /// Top-k entries per position.
    #[arg(long, short = 'k', default_value_t = 5)]
    pub top_k: usize,
    #[arg(long)]
    pub special: bool,
    #[arg(long, default_value_t = 512)]
    pub ubatch: usize,
}

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to score.
    pub file: PathBuf,
    /// Tokens per chunk.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    /// Chunks evaluated together as separate sequences of one batch.
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Stop after this many chunks (0 = all).
    #[arg(long, default_value_t = 0)]
    pub max_chunks: usize,
}

pub fn tokenize(a: TokenizeArgs) -> Result<()> {
    let path = a.model.resolve_path()?;
    let g = crate::gguf::GgufFile::open(&path)?;
    let tok = crate::tokenizer::Tokenizer::from_gguf(&g)?;
    let ids = tok.encode(&a.text, a.add_special, a.special)?;
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}

/// Indices of the k largest logits, descending (ties: lower id first).
pub fn top_k(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let k = k.min(idx.len());
    let cmp = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    if k < idx.len() && k > 0 {
        idx.select_nth_unstable_by(k - 1, cmp);
    }
    idx.truncate(k);
    idx.sort_by(cmp);
    idx.into_iter().map(|i| (i, logits[i as usize])).collect()
}

pub fn logits(a: LogitsArgs) -> Result<()> {
    let (mut r, tok) = a.model.load()?;
    let ids = tok.encode(&a.text, true, a.special)?;
    if ids.is_empty() {
        bail!("the text tokenizes to nothing");
    }
    let l = teacher_forced_logits(&mut r, SeqId(0), &ids, a.ubatch)?;
    let v = r.config().vocab_size;
    for (i, &t) in ids.iter().enumerate() {
        let top: Vec<serde_json::Value> = top_k(&l[i * v..(i + 1) * v], a.top_k)
            .into_iter()
            .map(|(id, x)| serde_json::json!([id, x]))
            .collect();
        println!("{}", serde_json::json!({"pos": i, "token": t, "top": top}));
    }
    Ok(())
}

pub fn perplexity(a: PerplexityArgs) -> Result<()> {
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("reading {}", a.file.display()))?;
    let mut model = a.model.clone();
    model.kv_tokens = Some(
        model
            .kv_tokens
            .unwrap_or(crate::runner::HOST_KV_TOKENS)
            .max(a.ctx * a.parallel.max(1)),
    );
    let (mut r, tok) = model.load()?;
    let mut ids = tok.encode(&text, true, false)?;
    if a.max_chunks > 0 {
        ids.truncate(a.max_chunks * a.ctx);
    }
    let res = ppl(&mut r, &ids, a.ctx, a.parallel, &mut |c, p| {
        eprintln!("chunk {c}: ppl so far {p:.4}");
    })?;
    println!(
        "{}",
        serde_json::json!({
            "chunks": res.n_chunks,
            "scored_tokens": res.n_scored,
            "ppl": res.ppl(),
        })
    );
    Ok(())
}
