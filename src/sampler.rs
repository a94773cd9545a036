//! Token sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty; seeded per request.
//!
//! Reproducible by construction: each request owns a ChaCha20 RNG seeded from
//! its `seed`, every step draws exactly one 53-bit uniform (none when
//! greedy), and the draw (`draw.rs`) runs fixed IEEE double operations in a
//! fixed order, which the CUDA sampler repeats. The same logits, history and
//! seed therefore give the same token on every platform and backend.

mod draw;
mod mask;

pub use draw::{cand_key, det_exp, draw as draw_token, DrawParams, CHUNK};
pub use mask::{RowMasks, WordMask};

use anyhow::{bail, Context, Result};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use std::cmp::Ordering;

/// Per-request sampling parameters (llama.cpp defaults).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 = off.
    pub top_k: usize,
    /// Nucleus mass; 1 = off.
    pub top_p: f32,
    /// Drop tokens below `min_p * p_max`; 0 = off.
    pub min_p: f32,
    /// llama.cpp repetition penalty; 1 = off.
    pub repetition_penalty: f32,
    /// How many of the last history tokens the penalty looks at; 0 = off.
    pub repeat_last_n: usize,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repetition_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Argmax decoding, every filter off.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            repeat_last_n: 0,
            seed: 0,
        }
    }

    /// What the draw of a sampled token reads (temperature and filters).
    pub fn draw_params(&self) -> DrawParams {
        DrawParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
        }
    }

    /// Whether the draw reads the logits alone (no repetition penalty,
    /// which reads the history): then the device may draw, given the
    /// step's uniform ([`Sampler::next_uniform`]).
    pub fn logits_only(&self) -> bool {
        self.repetition_penalty == 1.0 || self.repeat_last_n == 0
    }

    /// Rejects values outside their meaningful ranges.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            bail!(
                "temperature must be finite and >= 0, got {}",
                self.temperature
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            bail!("top_p must be in (0, 1], got {}", self.top_p);
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            bail!("min_p must be in [0, 1], got {}", self.min_p);
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            bail!(
                "repetition_penalty must be finite and > 0, got {}",
                self.repetition_penalty
            );
        }
        Ok(())
    }
}

/// Logits no token can be chosen from: the model's output is not finite.
/// Returned (inside `anyhow::Error`) by [`Sampler::sample`]; callers that
/// know the sequence position downcast it to say where
/// ([`BadLogits::at_position`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadLogits {
    #[error("sample: logit {0} is NaN")]
    Nan(usize),
    #[error("sample: logit {0} is +inf")]
    PosInf(usize),
}

impl BadLogits {
    /// The message for a request: what the model produced, for the token at
    /// `position` of the sequence (prompt tokens included).
    pub fn at_position(&self, position: usize) -> String {
        let (what, id) = match self {
            BadLogits::Nan(i) => ("NaN", i),
            BadLogits::PosInf(i) => ("+inf", i),
        };
        format!(
            "the model produced {what} logits at position {position} (token id {id}): \
             its weights or activations are not finite"
        )
    }

    /// The message for `e` if it is a [`BadLogits`] error.
    pub fn message_of(e: &anyhow::Error, position: usize) -> Option<String> {
        e.downcast_ref::<BadLogits>()
            .map(|b| b.at_position(position))
    }
}

/// Candidate order: logit descending, then id ascending. A total order on
/// non-NaN logits (inputs are checked) with unique ids.
fn cand_cmp(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// OpenAI's logit adjustments: a per-token bias, and penalties on the
/// tokens this sampler has produced (`logit -= count * frequency +
/// (count > 0) * presence`, counting generated tokens only, as OpenAI and
/// vLLM do).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogitAdjust {
    /// (token, bias), ids distinct; biases are added to the logits.
    pub bias: Vec<(u32, f32)>,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
}

impl LogitAdjust {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.bias.is_empty() && self.frequency_penalty == 0.0 && self.presence_penalty == 0.0
    }

    /// Rejects what OpenAI rejects: biases outside [-100, 100], penalties
    /// outside [-2, 2], a repeated token.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                bail!("{name} must be in [-2, 2], got {v}");
            }
        }
        let mut ids: Vec<u32> = self.bias.iter().map(|b| b.0).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            bail!("logit_bias names a token twice");
        }
        if let Some((t, b)) = self.bias.iter().find(|b| !(-100.0..=100.0).contains(&b.1)) {
            bail!("logit_bias of token {t} must be in [-100, 100], got {b}");
        }
        Ok(())
    }
}

/// The first index of the largest value of `v` (no NaN; -0.0 and +0.0
/// already one): the lowest id among equal maxima, as a sequential scan
/// would find it. Two passes the compiler vectorizes: the maximum (exact in
/// any order), then its first position.
fn first_max(v: &[f32]) -> usize {
    const LANES: usize = 16;
    let mut m = [f32::NEG_INFINITY; LANES];
    let chunks = v.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            m[j] = if c[j] > m[j] { c[j] } else { m[j] };
        }
    }
    let max = m
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
    v.iter().position(|&x| x == max).unwrap_or(0)
}

/// The tokens a sampling step may choose (a grammar's mask).
pub trait TokenMask {
    /// Sets the logit of every refused token to `-inf`, leaving the others'
    /// bits alone; false when it refuses every token of `logits`.
    fn apply(&self, logits: &mut [f32]) -> bool;
    /// Whether token `id` is allowed.
    fn allows(&self, id: u32) -> bool;
}

/// One request's sampler: parameters plus its own RNG stream.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha20Rng,
    adjust: LogitAdjust,
    /// Times each token was produced, in first-produced order (the
    /// penalties' counts; only kept when a penalty is on).
    produced: Vec<(u32, u32)>,
    /// The row being sampled (kept to reuse its allocation).
    work: Vec<f32>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        Ok(Sampler {
            params,
            rng: ChaCha20Rng::seed_from_u64(params.seed),
            adjust: LogitAdjust::default(),
            produced: Vec::new(),
            work: Vec::new(),
        })
    }

    /// The sampler with OpenAI's logit bias and penalties.
    pub fn with_adjust(mut self, adjust: LogitAdjust) -> Result<Self> {
        adjust.validate()?;
        self.adjust = adjust;
        Ok(self)
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Whether the draw reads the logits alone (no repetition penalty, no
    /// logit adjustments): then the device may draw.
    pub fn logits_only(&self) -> bool {
        self.params.logits_only() && self.adjust.is_empty()
    }

    /// The uniform of the next sampled step, drawn here for a draw made
    /// elsewhere (the device): exactly the value [`Sampler::sample`] would
    /// draw, so the stream continues as if the host had sampled. Greedy
    /// parameters draw nothing; call it only for temperature > 0.
    pub fn next_uniform(&mut self) -> f64 {
        self.uniform()
    }

    /// A uniform in [0, 1) from the top 53 bits of one RNG word (exact in
    /// f64, independent of `rand`'s float conversion).
    fn uniform(&mut self) -> f64 {
        (self.rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Picks the next token. `history` is the sequence so far (prompt and
    /// generated tokens), read only by the repetition penalty, which applies
    /// in greedy mode too (as in llama.cpp; it is off in `greedy()`).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32> {
        self.sample_with(logits, history, None)
    }

    /// [`Sampler::sample`] with the step's uniform already drawn (`u`,
    /// from [`Sampler::next_uniform`], when a device draw was planned and
    /// the host draws after all); None draws it here.
    pub fn sample_with(&mut self, logits: &[f32], history: &[u32], u: Option<f64>) -> Result<u32> {
        self.sample_masked(logits, history, u, None)
    }

    /// [`Sampler::sample_with`] over the tokens `allowed` accepts (a
    /// grammar's mask): the others' logits become `-inf` before the
    /// penalties and the draw, and every allowed logit keeps its bits, so
    /// an unconstrained choice that is allowed is also the constrained one.
    /// At least one token must be allowed.
    pub fn sample_masked(
        &mut self,
        logits: &[f32],
        history: &[u32],
        u: Option<f64>,
        mask: Option<&dyn TokenMask>,
    ) -> Result<u32> {
        if logits.is_empty() {
            bail!("sample: empty logits");
        }
        if logits.len() > u32::MAX as usize {
            bail!(
                "sample: vocabulary of {} does not fit u32 ids",
                logits.len()
            );
        }
        // A NaN or +inf (a model whose weights or activations went
        // non-finite) is refused, found in a branch-free pass the compiler
        // vectorizes.
        if logits
            .iter()
            .fold(false, |bad, &x| bad | x.is_nan() | (x == f32::INFINITY))
        {
            let i = logits
                .iter()
                .position(|x| x.is_nan() || *x == f32::INFINITY)
                .unwrap_or(0);
            return Err(if logits[i].is_nan() {
                BadLogits::Nan(i)
            } else {
                BadLogits::PosInf(i)
            }
            .into());
        }
        // `+ 0.0` turns -0.0 into +0.0 so equal logits tie on id only. The
        // row's copy lives in the sampler between calls (a vocabulary of
        // floats is worth not allocating per token).
        let mut work = std::mem::take(&mut self.work);
        work.clear();
        work.extend(logits.iter().map(|&x| x + 0.0));
        let tok = self.choose(&mut work, history, u, mask);
        self.work = work;
        let tok = tok?;
        self.note_produced(tok);
        Ok(tok)
    }

    /// The choice over `work` (the row's finite logits, copied).
    fn choose(
        &mut self,
        work: &mut [f32],
        history: &[u32],
        u: Option<f64>,
        mask: Option<&dyn TokenMask>,
    ) -> Result<u32> {
        let p = self.params;
        if let Some(mask) = mask {
            if !mask.apply(work) {
                bail!("sample: the mask allows no token");
            }
        }
        self.apply_repetition_penalty(work, history)?;
        self.apply_adjust(work)?;
        let tok = if p.temperature == 0.0 {
            let best = first_max(work);
            // Every allowed logit -inf (a model's own -inf): the first
            // allowed id, never a masked one.
            match mask {
                Some(m) if !m.allows(best as u32) => (0..work.len() as u32)
                    .find(|&i| m.allows(i))
                    .context("sample: the mask allows no token")?,
                _ => best as u32,
            }
        } else {
            let u = match u {
                Some(u) => u,
                None => self.uniform(),
            };
            draw::draw(work, &p.draw_params(), u)?
        };
        Ok(tok)
    }

    /// Counts a produced token for the penalties.
    fn note_produced(&mut self, tok: u32) {
        if self.adjust.frequency_penalty == 0.0 && self.adjust.presence_penalty == 0.0 {
            return;
        }
        match self.produced.iter_mut().find(|(t, _)| *t == tok) {
            Some((_, n)) => *n += 1,
            None => self.produced.push((tok, 1)),
        }
    }

    /// The bias, then the penalties, each one rounded addition per logit,
    /// in a fixed order (ids as given, tokens in first-produced order).
    fn apply_adjust(&self, logits: &mut [f32]) -> Result<()> {
        let a = &self.adjust;
        let vocab = logits.len();
        for &(t, b) in &a.bias {
            let l = logits.get_mut(t as usize).with_context(|| {
                format!("logit_bias: token {t} outside the vocabulary of {vocab}")
            })?;
            *l += b;
        }
        for &(t, n) in &self.produced {
            if let Some(l) = logits.get_mut(t as usize) {
                *l -= n as f32 * a.frequency_penalty + a.presence_penalty;
            }
        }
        Ok(())
    }

    /// llama.cpp semantics: each distinct token among the last
    /// `repeat_last_n` of history has its logit divided by the penalty if
    /// positive, multiplied if not.
    fn apply_repetition_penalty(&self, logits: &mut [f32], history: &[u32]) -> Result<()> {
        let p = self.params;
        if p.repetition_penalty == 1.0 || p.repeat_last_n == 0 {
            return Ok(());
        }
        let start = history.len().saturating_sub(p.repeat_last_n);
        // Distinct ids of the window (at most repeat_last_n of them), in a
        // fixed order; no vocabulary-sized scratch buffer.
        let mut window = history[start..].to_vec();
        window.sort_unstable();
        window.dedup();
        if let Some(&bad) = window.last().filter(|&&t| t as usize >= logits.len()) {
            bail!(
                "sample: history token {bad} outside vocabulary of {}",
                logits.len()
            );
        }
        for tok in window {
            let l = &mut logits[tok as usize];
            if *l > 0.0 {
                *l /= p.repetition_penalty;
            } else {
                *l *= p.repetition_penalty;
            }
        }
        Ok(())
    }
}

/// Log-probability of `chosen` and the `top_n` most likely tokens (logit
/// descending, ties by id), from a log-softmax over the raw logits in f64
/// (summed in id order). A `chosen` outside the vocabulary, or an all `-inf`
/// row, has log-probability `-inf`; NaN logits propagate as NaN.
pub fn logprobs(logits: &[f32], chosen: u32, top_n: usize) -> (f32, Vec<(u32, f32)>) {
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x)));
    let lse = if max == f64::NEG_INFINITY {
        f64::INFINITY // every log-probability becomes -inf
    } else {
        let sum: f64 = logits.iter().map(|&x| (f64::from(x) - max).exp()).sum();
        max + sum.ln()
    };
    let lp = |x: f32| (f64::from(x) - lse) as f32;
    let chosen_lp = logits
        .get(chosen as usize)
        .map_or(f32::NEG_INFINITY, |&x| lp(x));
    let mut idx: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &x)| (i as u32, x + 0.0))
        .collect();
    let n = top_n.min(idx.len());
    if n > 0 && n < idx.len() {
        idx.select_nth_unstable_by(n - 1, cand_cmp);
    }
    idx.truncate(n);
    idx.sort_unstable_by(cand_cmp);
    (
        chosen_lp,
        idx.into_iter().map(|(i, x)| (i, lp(x))).collect(),
    )
}
