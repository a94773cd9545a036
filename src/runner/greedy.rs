//! Greedy decoding of one sequence. Where its steps run as a CUDA decode
//! graph, each step's token is chosen on the device and fed to the next
//! step there (dispatch/cuda/greedy.rs), and the host stays one step
//! ahead: it allocates and enqueues step i + 1 before it waits for step
//! i's token, so its per-step work (KV allocation, input staging, graph
//! launch) overlaps the device's, and no step waits on a logits download.
//! Elsewhere (cpu, op-by-op cuda, QUIRE_GREEDY_CHAIN=0) it samples each
//! step's logits on the host. Either way the tokens are those of
//! `Sampler` with `SamplingParams::greedy()` on the same logits.

use super::{Compute, LogitsWanted, Runner, SeqWork};
use crate::dispatch::cuda::GreedyTicket;
use crate::kv::SeqId;
use crate::model::StepInput;
use crate::sampler::{Sampler, SamplingParams};
use anyhow::{bail, Context, Result};
use std::collections::VecDeque;

/// Whether greedy decoding may keep its tokens on the device
/// (QUIRE_GREEDY_CHAIN=0: never, for comparisons; the same tokens).
fn chain_wanted() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var("QUIRE_GREEDY_CHAIN").map_or(true, |v| v != "0"))
}

impl Runner {
    /// Greedy decoding of `seq`: feeds `first` at position `start_pos`,
    /// then each step's greedy token, for at most `max` steps. `on_token`
    /// receives the chosen tokens in order and ends the run by returning
    /// false. Returns the tokens it received. Earlier positions must be in
    /// the KV cache; the run's positions are allocated here.
    pub fn decode_greedy(
        &mut self,
        seq: SeqId,
        first: u32,
        start_pos: usize,
        max: usize,
        on_token: &mut dyn FnMut(u32) -> Result<bool>,
    ) -> Result<Vec<u32>> {
        if self.greedy_on_device() {
            self.decode_greedy_device(seq, first, start_pos, max, on_token)
        } else {
            self.decode_greedy_host(seq, first, start_pos, max, on_token)
        }
    }

    /// Whether a one-row decode step here runs as a CUDA graph (and the
    /// chain is wanted).
    pub fn greedy_on_device(&self) -> bool {
        match &self.compute {
            Compute::Cuda { exec, .. } => chain_wanted() && exec.graphable(1),
            Compute::Host { .. } => false,
        }
    }

    pub(crate) fn decode_greedy_host(
        &mut self,
        seq: SeqId,
        first: u32,
        start_pos: usize,
        max: usize,
        on_token: &mut dyn FnMut(u32) -> Result<bool>,
    ) -> Result<Vec<u32>> {
        let mut sampler = Sampler::new(SamplingParams::greedy())?;
        let mut out = Vec::new();
        let mut tok = first;
        for i in 0..max {
            let logits = self.step_flat(&[SeqWork {
                seq,
                tokens: std::slice::from_ref(&tok),
                start_pos: start_pos + i,
                logits: LogitsWanted::Last,
            }])?;
            // Greedy with the penalty off reads no history.
            tok = sampler.sample(logits.seq(0), &[])?;
            out.push(tok);
            if !on_token(tok)? {
                break;
            }
        }
        Ok(out)
    }

    fn decode_greedy_device(
        &mut self,
        seq: SeqId,
        first: u32,
        start_pos: usize,
        max: usize,
        on_token: &mut dyn FnMut(u32) -> Result<bool>,
    ) -> Result<Vec<u32>> {
        let mut pending: VecDeque<GreedyTicket> = VecDeque::new();
        let r = self.greedy_device_loop(seq, first, start_pos, max, on_token, &mut pending);
        // After an error, the steps still in flight are waited for (and
        // their tokens dropped): the next run starts with none out.
        while let Some(t) = pending.pop_front() {
            let _ = self.greedy_wait(t);
        }
        r
    }

    fn greedy_device_loop(
        &mut self,
        seq: SeqId,
        first: u32,
        start_pos: usize,
        max: usize,
        on_token: &mut dyn FnMut(u32) -> Result<bool>,
        pending: &mut VecDeque<GreedyTicket>,
    ) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        let mut stopped = false;
        for i in 0..max {
            pending.push_back(self.greedy_enqueue(seq, first, start_pos + i, i > 0)?);
            // One step ahead: step i is queued before step i - 1's token
            // is read.
            if pending.len() > 1 {
                let t = pending.pop_front().context("greedy ticket")?;
                let tok = self.greedy_wait(t)?;
                out.push(tok);
                if !on_token(tok)? {
                    stopped = true;
                    break;
                }
            }
        }
        // The last step's token; after a stop, the step queued past it is
        // waited for by the caller and its token dropped.
        if !stopped {
            if let Some(t) = pending.pop_front() {
                let tok = self.greedy_wait(t)?;
                out.push(tok);
                on_token(tok)?;
            }
        }
        Ok(out)
    }

    /// Allocates position `pos` of `seq` and enqueues its step: token
    /// `first`, or with `chain` the previous greedy step's choice.
    fn greedy_enqueue(
        &mut self,
        seq: SeqId,
        first: u32,
        pos: usize,
        chain: bool,
    ) -> Result<GreedyTicket> {
        let ctx = self.model.cfg.context_length;
        if pos + 1 > ctx {
            bail!(
                "sequence {seq:?} reaches position {}, past the model's context length {ctx}",
                pos + 1
            );
        }
        let copies = self
            .kv
            .allocate(seq, pos + 1)
            .with_context(|| format!("allocating KV blocks for {} tokens of {seq:?}", pos + 1))?;
        for c in copies {
            self.copy_block(c.src, c.dst)?;
        }
        let slots = self
            .kv
            .slot_mapping(seq, pos, 1)
            .with_context(|| format!("slot mapping of {seq:?}"))?;
        let table = self
            .kv
            .block_table(seq)
            .with_context(|| format!("no block table for {seq:?}"))?;
        let input = StepInput {
            // With `chain`, only the count: the token is on the device.
            tokens: &[first],
            positions: &[pos as u32],
            row_seq: &[0],
            slots: &slots,
            block_tables: &[table],
            logit_rows: &[0],
        };
        let model = &self.model;
        match &mut self.compute {
            Compute::Cuda {
                exec,
                weights,
                kv: dev_kv,
            } => exec.decode_step_greedy(
                model.cfg.vocab_size,
                &input,
                dev_kv,
                &mut |e, kv, bufs| {
                    crate::model::arch::llama::forward_bufs(&model.cfg, weights, e, kv, bufs)
                },
                chain,
            ),
            Compute::Host { .. } => bail!("greedy decode on the device: the model is on the host"),
        }
    }

    fn greedy_wait(&self, t: GreedyTicket) -> Result<u32> {
        match &self.compute {
            Compute::Cuda { exec, .. } => Ok(exec.greedy_wait(t)?[0]),
            Compute::Host { .. } => bail!("greedy decode on the device: the model is on the host"),
        }
    }
}
