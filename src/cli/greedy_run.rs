//! A model and a greedy run on it, shared by the whole-model checks
//! (check-exact and its norm-ahead form, check-greedy, check-sample): the
//! arguments, the random prompt and the steps of the run.

use crate::kv::SeqId;
use crate::runner::{LogitsWanted, SeqWork};
use clap::Args;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;

/// A model and a greedy run on it: a random prompt, then greedy tokens
/// (check-exact, check-greedy, check-sample).
#[derive(Args, Debug)]
pub struct GreedyRunArgs {
    /// GGUF model.
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    /// Greedy tokens to generate after the prompt.
    #[arg(long, default_value_t = 256)]
    pub tokens: usize,
    /// Random prompt tokens (prefilled in one step; > 32 crosses an
    /// attention chunk inside the prefill).
    #[arg(long, default_value_t = 40)]
    pub prompt_tokens: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// CUDA tuning overrides (JSON file; see `quire tuning`) for every GPU
    /// runner of the check (under what the check itself sets).
    #[arg(long, value_name = "FILE")]
    pub tuning: Option<std::path::PathBuf>,
    /// One CUDA tuning override, `table.key=value` (repeatable; after
    /// --tuning), e.g. `--tune matvec.l2_ahead_mb=0`.
    #[arg(long = "tune", value_name = "KEY=VALUE")]
    pub tune: Vec<String>,
}

impl GreedyRunArgs {
    /// `--tuning FILE` then every `--tune`, in order.
    pub(super) fn tuning(&self) -> anyhow::Result<crate::backend::cuda::TuningOverrides> {
        super::tuning_overrides(self.tuning.as_deref(), &self.tune)
    }
}

/// The first maximum's index (check-exact continues with it).
pub(super) fn argmax(v: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// `n` (at least 1) random token ids below `vocab`, from `seed`.
pub(super) fn random_prompt(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n.max(1))
        .map(|_| rng.random_range(0..vocab as u32))
        .collect()
}

/// Step `step` of a greedy run whose tokens so far are `toks` (the prompt,
/// then one token per step): the step's tokens and first position.
pub(super) fn greedy_chunk(prompt: &[u32], toks: &[u32], step: usize) -> (Vec<u32>, usize) {
    if step == 0 {
        (prompt.to_vec(), 0)
    } else {
        (vec![*toks.last().unwrap_or(&0)], toks.len() - 1)
    }
}

/// One sequence's step asking for its last row's logits.
pub(super) fn last_logits(tokens: &[u32], start: usize) -> [SeqWork<'_>; 1] {
    [SeqWork {
        seq: SeqId(1),
        tokens,
        start_pos: start,
        logits: LogitsWanted::Last,
    }]
}
