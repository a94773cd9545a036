//! Decoding whose tokens depend on the logits alone (greedy, or sampled
//! without a repetition penalty). Where its steps run as a CUDA decode
//! graph, each step's token is chosen on the device and fed to the next
//! step there (dispatch/cuda/greedy.rs), and the host stays one step
//! ahead: it allocates and enqueues step i + 1 (with its uniform, drawn
//! from the row's sampler in order) before it waits for step i's token,
//! so its per-step work (KV allocation, input staging, graph launch)
//! overlaps the device's, and no step waits on a logits download.
//! Elsewhere (cpu, op-by-op cuda, parameters the device cannot draw,
//! tuning `runtime.greedy_chain = false`) it samples each step's logits on
//! the host.
//! Either way the tokens are those of the rows' `Sampler`s on the same
//! logits.

use super::{Compute, LogitsWanted, Runner, SeqWork};
use crate::dispatch::ChainTicket;
use crate::kv::KvManager;
use crate::kv::SeqId;
use crate::model::StepInput;
use crate::sampler::{DrawParams, RowMasks, Sampler, SamplingParams};
use anyhow::{bail, Context, Result};
use std::collections::VecDeque;

/// The rows of a greedy run: sequence, first token, first position.
struct Rows<'r> {
    seqs: &'r [SeqId],
    firsts: &'r [u32],
    starts: &'r [usize],
}

impl Runner {
    /// Greedy decoding of `seq`: feeds `first` at position `start_pos`,
    /// then each step's greedy token, for at most `max` steps. `on_token`
    /// receives the chosen tokens in order and ends the run by returning
    /// false. Returns the tokens it received. Earlier positions must be in
    /// the KV cache; the run's positions are allocated here (on the device
    /// path, a run that `on_token` ends has computed and cached one
    /// position past its last token).
    pub fn decode_greedy(
        &mut self,
        seq: SeqId,
        first: u32,
        start_pos: usize,
        max: usize,
        on_token: &mut dyn FnMut(u32) -> Result<bool>,
    ) -> Result<Vec<u32>> {
        let mut out =
            self.decode_greedy_batch(&[seq], &[first], &[start_pos], max, &mut |t| on_token(t[0]))?;
        Ok(out.pop().unwrap_or_default())
    }

    /// [`Runner::decode_greedy`] for several sequences in lockstep: row r
    /// feeds `firsts[r]` at `starts[r]`, then its own greedy tokens; every
    /// step is one decode step of all rows. `on_tokens` receives each
    /// step's tokens (one per row) and ends the run for all by returning
    /// false. Returns each row's tokens.
    pub fn decode_greedy_batch(
        &mut self,
        seqs: &[SeqId],
        firsts: &[u32],
        starts: &[usize],
        max: usize,
        on_tokens: &mut dyn FnMut(&[u32]) -> Result<bool>,
    ) -> Result<Vec<Vec<u32>>> {
        let mut samplers = greedy_samplers(seqs.len())?;
        self.decode_sampled_batch(seqs, firsts, starts, max, &mut samplers, on_tokens)
    }

    /// [`Runner::decode_greedy_batch`] with each row's tokens drawn by its
    /// own sampler (`samplers[r]`, which must read the logits alone:
    /// [`SamplingParams::logits_only`]); the samplers' streams advance as
    /// if the host had sampled every step (on the device path, one step
    /// further when `on_tokens` ends the run).
    pub fn decode_sampled_batch(
        &mut self,
        seqs: &[SeqId],
        firsts: &[u32],
        starts: &[usize],
        max: usize,
        samplers: &mut [Sampler],
        on_tokens: &mut dyn FnMut(&[u32]) -> Result<bool>,
    ) -> Result<Vec<Vec<u32>>> {
        if seqs.len() != firsts.len()
            || seqs.len() != starts.len()
            || seqs.len() != samplers.len()
            || seqs.is_empty()
        {
            bail!(
                "decode: {} sequences, {} first tokens, {} start positions, {} samplers",
                seqs.len(),
                firsts.len(),
                starts.len(),
                samplers.len()
            );
        }
        if let Some(s) = samplers.iter().find(|s| !s.logits_only()) {
            bail!(
                "decode: a chained run needs samplers that read the logits alone (got {:?})",
                s.params()
            );
        }
        let rows = Rows {
            seqs,
            firsts,
            starts,
        };
        if self.draws_on_device(samplers) {
            self.decode_greedy_device(&rows, max, samplers, on_tokens)
        } else {
            self.decode_greedy_host(&rows, max, samplers, on_tokens)
        }
    }

    /// Whether a decode step of these rows' samplers can chain its tokens
    /// on the device and the device can draw for every row.
    pub fn draws_on_device(&self, samplers: &[Sampler]) -> bool {
        let vocab = self.model.cfg().vocab_size;
        self.greedy_on_device_rows(samplers.len())
            && samplers
                .iter()
                .all(|s| s.logits_only() && self.device_draws(&s.params().draw_params(), vocab))
    }

    /// Whether the device holding the model can draw with `p`.
    fn device_draws(&self, p: &DrawParams, vocab: usize) -> bool {
        match &self.compute {
            Compute::Device(d) => d.draws(p, vocab),
            Compute::Host { .. } | Compute::Ranks(_) => false,
        }
    }

    /// A decode step of `work` (one token per sequence, each wanting its
    /// logits), with blocks already allocated in `kv` (as
    /// [`Runner::step_with_kv`]), whose next tokens are chosen on the
    /// device: one per sequence, the logits never downloaded. `draws`:
    /// per row, None (greedy) or its draw parameters and this step's
    /// uniform (drawn by the caller from the row's sampler). None where
    /// the step cannot run as such a decode graph here (the caller then
    /// steps with logits and samples on the host, with the same uniforms).
    pub fn step_greedy_with_kv(
        &mut self,
        kv: &KvManager,
        work: &[SeqWork<'_>],
        draws: &[Option<(DrawParams, f64)>],
    ) -> Result<Option<Vec<u32>>> {
        let b = work.len();
        if !self.decode_drawable(work, draws) || !self.greedy_on_device_rows(b) {
            return Ok(None);
        }
        let bi = super::batch_input(self.model.cfg(), kv, work)?;
        let t = enqueue(&mut self.compute, &bi.input(), false, draws)?;
        self.greedy_wait(t).map(Some)
    }

    /// A decode step of `work` (as [`Runner::step_greedy_with_kv`]) whose
    /// tokens the device draws through grammar masks: `fill` writes the
    /// rows' masks into `masks` (one row per sequence, or none) while the
    /// device runs the step's forward, so the host's mask work overlaps
    /// it. A greedy row whose allowed logits are all -inf may come back
    /// with a refused id (the caller then takes the first allowed one).
    /// None where the step cannot run so here (not a decode step, no decode
    /// graph, a hybrid model, parameters the device cannot draw): `fill`
    /// was not called, and the caller samples on the host.
    pub fn step_draw_with_kv(
        &mut self,
        kv: &KvManager,
        work: &[SeqWork<'_>],
        draws: &[Option<(DrawParams, f64)>],
        masks: &mut RowMasks,
        fill: &mut dyn FnMut(&mut RowMasks),
    ) -> Result<Option<Vec<u32>>> {
        let b = work.len();
        if !self.decode_drawable(work, draws) || self.hybrid.is_some() || !self.masks_on_device(b) {
            return Ok(None);
        }
        let bi = super::batch_input(self.model.cfg(), kv, work)?;
        match &mut self.compute {
            Compute::Device(d) => d.step_draw(&bi.input(), draws, masks, fill).map(Some),
            Compute::Host { .. } | Compute::Ranks(_) => Ok(None),
        }
    }

    /// Whether `work` is a decode step (one token per sequence, each
    /// wanting its logits) whose every row the device can draw as
    /// `draws` says.
    fn decode_drawable(&self, work: &[SeqWork<'_>], draws: &[Option<(DrawParams, f64)>]) -> bool {
        let vocab = self.model.cfg().vocab_size;
        !work.is_empty()
            && draws.len() == work.len()
            && work
                .iter()
                .all(|w| w.tokens.len() == 1 && w.logits == LogitsWanted::Last)
            && draws
                .iter()
                .all(|d| d.as_ref().is_none_or(|(p, _)| self.device_draws(p, vocab)))
    }

    /// Whether a decode step of `b` rows here can draw on the device with
    /// grammar masks.
    pub fn masks_on_device(&self, b: usize) -> bool {
        match &self.compute {
            Compute::Device(d) => d.masks_rows(b),
            Compute::Host { .. } | Compute::Ranks(_) => false,
        }
    }

    /// Whether a one-row decode step here chains its tokens on the device
    /// (it runs as a CUDA graph, and tuning `runtime.greedy_chain` is on).
    pub fn greedy_on_device(&self) -> bool {
        self.greedy_on_device_rows(1)
    }

    /// Whether a decode step of `b` rows here chains its tokens on the
    /// device (it runs as a CUDA graph, and tuning `runtime.greedy_chain`
    /// is on).
    pub fn greedy_on_device_rows(&self, b: usize) -> bool {
        match &self.compute {
            Compute::Device(d) => d.chains_tokens(b),
            Compute::Host { .. } | Compute::Ranks(_) => false,
        }
    }

    fn decode_greedy_host(
        &mut self,
        rows: &Rows<'_>,
        max: usize,
        samplers: &mut [Sampler],
        on_tokens: &mut dyn FnMut(&[u32]) -> Result<bool>,
    ) -> Result<Vec<Vec<u32>>> {
        let b = rows.seqs.len();
        let mut out = vec![Vec::new(); b];
        let mut toks = rows.firsts.to_vec();
        for i in 0..max {
            let work: Vec<SeqWork<'_>> = (0..b)
                .map(|r| SeqWork {
                    seq: rows.seqs[r],
                    tokens: std::slice::from_ref(&toks[r]),
                    start_pos: rows.starts[r] + i,
                    logits: LogitsWanted::Last,
                })
                .collect();
            let logits = self.step_flat(&work)?;
            drop(work);
            for (r, t) in toks.iter_mut().enumerate() {
                // Without the penalty the sampler reads no history.
                *t = samplers[r].sample(logits.seq(r), &[])?;
                out[r].push(*t);
            }
            if !on_tokens(&toks)? {
                break;
            }
        }
        Ok(out)
    }

    /// The host path of [`Runner::decode_greedy_batch`] whatever the
    /// backend (`quire check-greedy`'s reference).
    pub(crate) fn decode_greedy_batch_host(
        &mut self,
        seqs: &[SeqId],
        firsts: &[u32],
        starts: &[usize],
        max: usize,
        samplers: &mut [Sampler],
    ) -> Result<Vec<Vec<u32>>> {
        let rows = Rows {
            seqs,
            firsts,
            starts,
        };
        self.decode_greedy_host(&rows, max, samplers, &mut |_| Ok(true))
    }

    fn decode_greedy_device(
        &mut self,
        rows: &Rows<'_>,
        max: usize,
        samplers: &mut [Sampler],
        on_tokens: &mut dyn FnMut(&[u32]) -> Result<bool>,
    ) -> Result<Vec<Vec<u32>>> {
        let mut pending: VecDeque<ChainTicket> = VecDeque::new();
        let r = self.greedy_device_loop(rows, max, samplers, on_tokens, &mut pending);
        // After an error or a stop, the steps still in flight are waited
        // for (and their tokens dropped): the next run starts with none out.
        while let Some(t) = pending.pop_front() {
            let _ = self.greedy_wait(t);
        }
        r
    }

    fn greedy_device_loop(
        &mut self,
        rows: &Rows<'_>,
        max: usize,
        samplers: &mut [Sampler],
        on_tokens: &mut dyn FnMut(&[u32]) -> Result<bool>,
        pending: &mut VecDeque<ChainTicket>,
    ) -> Result<Vec<Vec<u32>>> {
        let greedy = samplers.iter().all(|s| s.params().temperature == 0.0);
        // Each row's draw (empty when every row is greedy: the graph's
        // greedy rule).
        let mut draws = Vec::with_capacity(if greedy { 0 } else { samplers.len() });
        let mut out = vec![Vec::new(); rows.seqs.len()];
        let mut take = |toks: Vec<u32>, out: &mut Vec<Vec<u32>>| -> Result<bool> {
            for (o, &t) in out.iter_mut().zip(&toks) {
                o.push(t);
            }
            on_tokens(&toks)
        };
        for i in 0..max {
            // Each sampled row's uniform for step i, in step order (the
            // host path draws the same ones, one per step).
            draws.clear();
            if !greedy {
                for s in samplers.iter_mut() {
                    let d = s.params().draw_params();
                    let u = if d.temperature != 0.0 {
                        s.next_uniform()
                    } else {
                        0.0
                    };
                    draws.push(Some((d, u)));
                }
            }
            pending.push_back(self.greedy_enqueue(rows, i, &draws)?);
            // One step ahead: step i is queued before step i - 1's tokens
            // are read.
            if pending.len() > 1 {
                let t = pending.pop_front().context("greedy ticket")?;
                let toks = self.greedy_wait(t)?;
                if !take(toks, &mut out)? {
                    return Ok(out);
                }
            }
        }
        if let Some(t) = pending.pop_front() {
            let toks = self.greedy_wait(t)?;
            take(toks, &mut out)?;
        }
        Ok(out)
    }

    /// Allocates step `i`'s positions (`starts[r] + i`) and enqueues the
    /// step: the first tokens, or from step 1 on the previous step's
    /// choices on the device.
    fn greedy_enqueue(
        &mut self,
        rows: &Rows<'_>,
        i: usize,
        draws: &[Option<(DrawParams, f64)>],
    ) -> Result<ChainTicket> {
        let ctx = self.model.cfg().context_length;
        let b = rows.seqs.len();
        let mut slots = Vec::with_capacity(b);
        let mut positions = Vec::with_capacity(b);
        for r in 0..b {
            let (seq, pos) = (rows.seqs[r], rows.starts[r] + i);
            if pos + 1 > ctx {
                bail!(
                    "sequence {seq:?} reaches position {}, past the model's context length {ctx}",
                    pos + 1
                );
            }
            let copies = self.kv.allocate(seq, pos + 1).with_context(|| {
                format!("allocating KV blocks for {} tokens of {seq:?}", pos + 1)
            })?;
            for c in copies {
                self.copy_block(c.src, c.dst)?;
            }
            let s = self
                .kv
                .slot_mapping(seq, pos, 1)
                .with_context(|| format!("slot mapping of {seq:?}"))?;
            slots.extend_from_slice(&s);
            positions.push(u32::try_from(pos)?);
        }
        let mut tables = Vec::with_capacity(b);
        for &seq in rows.seqs {
            tables.push(
                self.kv
                    .block_table(seq)
                    .with_context(|| format!("no block table for {seq:?}"))?,
            );
        }
        let row_seq: Vec<u32> = (0..b as u32).collect();
        // Hybrid models: each row's recurrent state slot (the token is
        // only a placeholder here: slots depend on the sequence and position).
        let (state_slots, fresh_slots) = match &mut self.hybrid {
            Some(h) => {
                let work: Vec<SeqWork<'_>> = (0..b)
                    .map(|r| SeqWork {
                        seq: rows.seqs[r],
                        tokens: &rows.firsts[r..r + 1],
                        start_pos: rows.starts[r] + i,
                        logits: LogitsWanted::Last,
                    })
                    .collect();
                let s = h.step_slots(&work)?;
                (s.rows, s.fresh)
            }
            None => (Vec::new(), Vec::new()),
        };
        let input = StepInput {
            // From step 1 on, only the count: the tokens are on the device.
            tokens: rows.firsts,
            positions: &positions,
            row_seq: &row_seq,
            slots: &slots,
            block_tables: &tables,
            logit_rows: &(0..b).collect::<Vec<_>>(),
            state_slots: &state_slots,
            fresh_slots: &fresh_slots,
            hidden: false,
        };
        enqueue(&mut self.compute, &input, i > 0, draws)
    }

    fn greedy_wait(&self, t: ChainTicket) -> Result<Vec<u32>> {
        match &self.compute {
            Compute::Device(d) => d.chained_tokens(t),
            Compute::Host { .. } | Compute::Ranks(_) => {
                bail!("greedy decode on the device: the model is on the host")
            }
        }
    }
}

/// Greedy samplers for `b` rows.
fn greedy_samplers(b: usize) -> Result<Vec<Sampler>> {
    (0..b)
        .map(|_| Sampler::new(SamplingParams::greedy()))
        .collect()
}

/// Enqueues a decode step of `input` whose tokens are chosen on the device
/// (`DeviceModel::enqueue_chained`; `chain`: its tokens are the previous
/// such step's; `draws`: the rows' draws, empty: greedy).
fn enqueue(
    compute: &mut Compute,
    input: &StepInput<'_>,
    chain: bool,
    draws: &[Option<(DrawParams, f64)>],
) -> Result<ChainTicket> {
    match compute {
        Compute::Device(d) => d.enqueue_chained(input, chain, draws),
        Compute::Host { .. } | Compute::Ranks(_) => {
            bail!("greedy decode on the device: the model is on the host")
        }
    }
}
