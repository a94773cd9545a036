//! Embeddings of a decoder model: each input's prompt rows run with their
//! final hidden state as the output (the output norm's result, the vector
//! the head reads), pooled over the input (mean, or the last token, as
//! llama.cpp's `--pooling mean|last`) and L2-normalized. Inputs share steps
//! up to a token budget, so a request of many short inputs is batched; a
//! long input is cut in chunks.

use super::{forward_batch, LogitsWanted, Runner, SeqWork};
use crate::kv::{KvManager, SeqId};
use anyhow::{bail, Context, Result};

/// How an input's rows become one vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of every row's hidden state.
    Mean,
    /// The last row's hidden state (causal models: the one that saw all).
    Last,
}

impl std::str::FromStr for Pooling {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "mean" => Ok(Pooling::Mean),
            "last" => Ok(Pooling::Last),
            o => Err(format!("pooling must be mean or last, got '{o}'")),
        }
    }
}

/// The first id of an embedding's temporary sequences: far above any id
/// the server's engine gives its own.
pub const EMBED_SEQ_BASE: u64 = 1 << 62;

impl Runner {
    /// One L2-normalized vector of `dim` values per input, its KV blocks
    /// taken from `kv` for the call and released after (an error when the
    /// cache has no room for all of them now). `step_tokens`: most rows
    /// per step. Hybrid models are refused (their recurrent states live in
    /// slots the server's sequences hold).
    pub fn embed_with_kv(
        &mut self,
        kv: &mut KvManager,
        inputs: &[&[u32]],
        pooling: Pooling,
        step_tokens: usize,
    ) -> Result<Vec<Vec<f32>>> {
        if self.hybrid.is_some() {
            bail!("embeddings are not supported for hybrid (recurrent) models");
        }
        let ctx = self.config().context_length;
        for (i, inp) in inputs.iter().enumerate() {
            if inp.is_empty() {
                bail!("input {i} is empty");
            }
            if inp.len() > ctx {
                bail!(
                    "input {i} has {} tokens, past the model's context length {ctx}",
                    inp.len()
                );
            }
        }
        let seqs: Vec<SeqId> = (0..inputs.len() as u64)
            .map(|i| SeqId(EMBED_SEQ_BASE + i))
            .collect();
        let mut taken = 0;
        let mut r = Ok(());
        for (s, inp) in seqs.iter().zip(inputs) {
            r = kv
                .allocate(*s, inp.len())
                .map(|_| ())
                .map_err(|e| anyhow::anyhow!("{e}"));
            if r.is_err() {
                break;
            }
            taken += 1;
        }
        let out = r
            .with_context(|| {
                let total: usize = inputs.iter().map(|i| i.len()).sum();
                format!("the KV cache has no room for the inputs' {total} tokens now")
            })
            .and_then(|()| self.embed_steps(kv, &seqs, inputs, pooling, step_tokens.max(1)));
        for s in &seqs[..taken] {
            let _ = kv.free(*s);
        }
        out
    }

    fn embed_steps(
        &mut self,
        kv: &KvManager,
        seqs: &[SeqId],
        inputs: &[&[u32]],
        pooling: Pooling,
        step_tokens: usize,
    ) -> Result<Vec<Vec<f32>>> {
        let (n, dim) = (inputs.len(), self.config().dim);
        let mut acc = vec![vec![0f64; dim]; n];
        let mut done = vec![0usize; n];
        let mut first = 0;
        while first < n {
            // Pack the next inputs (or chunks of one) into a step.
            let (mut work, mut whose) = (Vec::new(), Vec::new());
            let mut budget = step_tokens;
            let mut j = first;
            while j < n && budget > 0 {
                let start = done[j];
                let take = (inputs[j].len() - start).min(budget);
                let end = start + take;
                let logits = match (pooling, end == inputs[j].len()) {
                    (Pooling::Mean, _) => LogitsWanted::All,
                    (Pooling::Last, true) => LogitsWanted::Last,
                    (Pooling::Last, false) => LogitsWanted::None,
                };
                work.push(SeqWork {
                    seq: seqs[j],
                    tokens: &inputs[j][start..end],
                    start_pos: start,
                    logits,
                });
                whose.push(j);
                budget -= take;
                done[j] = end;
                j += 1;
            }
            let out = forward_batch(
                &self.model,
                &self.gguf,
                &mut self.compute,
                None,
                kv,
                &work,
                true,
            )?;
            for (wi, &j) in whose.iter().enumerate() {
                let rows = out.seq(wi);
                match pooling {
                    Pooling::Mean => {
                        for row in rows.chunks_exact(dim) {
                            for (a, &x) in acc[j].iter_mut().zip(row) {
                                *a += x as f64;
                            }
                        }
                    }
                    Pooling::Last => {
                        if let Some(row) = rows.chunks_exact(dim).last() {
                            for (a, &x) in acc[j].iter_mut().zip(row) {
                                *a = x as f64;
                            }
                        }
                    }
                }
            }
            while first < n && done[first] == inputs[first].len() {
                first += 1;
            }
        }
        Ok(acc
            .into_iter()
            .zip(inputs)
            .map(|(v, inp)| {
                let scale = match pooling {
                    Pooling::Mean => 1.0 / inp.len() as f64,
                    Pooling::Last => 1.0,
                };
                let v: Vec<f64> = v.into_iter().map(|x| x * scale).collect();
                let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
                let inv = if norm > 0.0 { 1.0 / norm } else { 0.0 };
                v.into_iter().map(|x| (x * inv) as f32).collect()
            })
            .collect())
    }
}
