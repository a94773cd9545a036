//! The scheduler state machine: waiting queue, running list, step planning.
//!
//! Invariants:
//! - a request is in exactly one of `waiting` / `running`;
//! - running requests hold KV blocks for at least `n_computed` tokens (plus
//!   this step's chunk once scheduled); waiting requests hold none;
//! - `running` is in admission order: the last one is the newest, the first
//!   to be preempted;
//! - every running request has at least one pending token
//!   (`n_computed < tokens.len()`), which `on_step_done` maintains by
//!   requiring a sampled token wherever a step reached the last token.

use std::collections::{HashMap, VecDeque};

use anyhow::{bail, ensure, Context, Result};

use super::{ScheduledSeq, SchedulerConfig, StepPlan};
use crate::kv::{prefix_hash, KvError, KvManager, SeqId, SnapshotIndex};

/// A state snapshot to take now: sequence `seq`'s state (after the step
/// just done) into snapshot slot `slot`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateSave {
    pub seq: SeqId,
    pub slot: u32,
}

#[derive(Debug, Clone)]
struct Request {
    seq: SeqId,
    /// Prompt, then sampled tokens.
    tokens: Vec<u32>,
    /// Tokens whose KV is computed (or served from the prefix cache).
    n_computed: usize,
    n_preemptions: u32,
}

impl Request {
    fn remaining(&self) -> usize {
        self.tokens.len() - self.n_computed
    }
}

/// What `on_step_done` must know about the step in flight.
#[derive(Debug, Clone)]
struct InFlight {
    seq: SeqId,
    n: usize,
    sample: bool,
}

/// Decode-first scheduler owning the KV manager.
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    kv: KvManager,
    waiting: VecDeque<Request>,
    running: Vec<Request>,
    in_flight: Option<Vec<InFlight>>,
    n_preemptions: u64,
    /// Hybrid models with snapshots: which slot holds which prefix's state.
    snaps: Option<SnapshotIndex>,
    /// Snapshots the last `on_step_done` registered, for the engine to take.
    saves: Vec<StateSave>,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, kv: KvManager) -> Result<Self> {
        cfg.validate()?;
        if let Some(s) = cfg.state_snapshots {
            ensure!(
                s.stride.is_multiple_of(kv.block_size()),
                "state snapshot stride {} is not a multiple of the KV block size {}",
                s.stride,
                kv.block_size()
            );
        }
        let snaps = match cfg.state_snapshots {
            Some(s) if s.capacity > 0 && cfg.prefix_caching => {
                Some(SnapshotIndex::new(s.capacity, s.stride)?)
            }
            _ => None,
        };
        Ok(Scheduler {
            cfg,
            kv,
            waiting: VecDeque::new(),
            running: Vec::new(),
            in_flight: None,
            n_preemptions: 0,
            snaps,
            saves: Vec::new(),
        })
    }

    /// The snapshots the last step registered (taken by the engine right
    /// after `on_step_done`, before any of their sequences' slots is freed;
    /// the next `on_step_done` forgets any left untaken).
    pub fn take_saves(&mut self) -> Vec<StateSave> {
        std::mem::take(&mut self.saves)
    }

    /// A chunk of `n` tokens from `start`, cut to end at the next snapshot
    /// boundary (so every boundary's state is captured).
    fn cut(&self, start: usize, n: usize) -> usize {
        match &self.snaps {
            Some(s) => n.min(s.next_boundary(start) - start),
            None => n,
        }
    }

    /// Where a new request may resume: (cached tokens, snapshot to
    /// restore). Attention-only models take the whole cached prefix
    /// (`n_hit`); hybrids the longest boundary within it that has a
    /// snapshot, or nothing.
    fn resume_point(&mut self, tokens: &[u32], n_hit: usize) -> (usize, Option<u32>) {
        if self.cfg.state_snapshots.is_none() {
            return (n_hit, None);
        }
        let Some(s) = self.snaps.as_mut() else {
            return (0, None);
        };
        let mut b = n_hit / s.stride() * s.stride();
        while b > 0 {
            if let Some(slot) = s.lookup(prefix_hash(&tokens[..b], self.kv.block_size()), b) {
                return (b, Some(slot));
            }
            b -= s.stride();
        }
        (0, None)
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }
    /// The KV manager: block tables and slot mappings for the runner.
    pub fn kv(&self) -> &KvManager {
        &self.kv
    }
    /// The KV manager, for work outside the scheduler's sequences that
    /// allocates and frees its blocks between two steps (embeddings).
    pub fn kv_mut(&mut self) -> &mut KvManager {
        &mut self.kv
    }
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }
    pub fn num_running(&self) -> usize {
        self.running.len()
    }
    pub fn has_unfinished(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }
    /// Running requests, oldest first.
    pub fn running_ids(&self) -> Vec<SeqId> {
        self.running.iter().map(|r| r.seq).collect()
    }
    /// Waiting requests, next to be admitted first.
    pub fn waiting_ids(&self) -> Vec<SeqId> {
        self.waiting.iter().map(|r| r.seq).collect()
    }
    /// Total preemptions so far.
    pub fn num_preemptions(&self) -> u64 {
        self.n_preemptions
    }

    fn find(&self, seq: SeqId) -> Option<&Request> {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .find(|r| r.seq == seq)
    }
    /// A request's tokens (prompt and sampled so far).
    pub fn tokens(&self, seq: SeqId) -> Option<&[u32]> {
        self.find(seq).map(|r| r.tokens.as_slice())
    }
    /// A request's computed-token counter.
    pub fn num_computed(&self, seq: SeqId) -> Option<usize> {
        self.find(seq).map(|r| r.n_computed)
    }
    /// How often a request was preempted.
    pub fn num_preemptions_of(&self, seq: SeqId) -> Option<u32> {
        self.find(seq).map(|r| r.n_preemptions)
    }

    /// Usable blocks: all but the null block.
    fn pool_tokens(&self) -> usize {
        (self.kv.num_blocks() - 1) * self.kv.block_size()
    }

    /// Queues a request. The prompt must be non-empty, fit the context and
    /// fit the whole KV pool.
    pub fn add_request(&mut self, seq: SeqId, prompt: Vec<u32>) -> Result<()> {
        ensure!(!prompt.is_empty(), "request {seq}: empty prompt");
        ensure!(
            prompt.len() <= self.cfg.n_ctx,
            "request {seq}: prompt of {} tokens exceeds n_ctx {}",
            prompt.len(),
            self.cfg.n_ctx
        );
        ensure!(
            prompt.len() <= self.pool_tokens(),
            "request {seq}: prompt of {} tokens exceeds the KV pool ({} tokens)",
            prompt.len(),
            self.pool_tokens()
        );
        ensure!(
            self.find(seq).is_none() && !self.kv.contains(seq),
            "request {seq} already exists"
        );
        self.waiting.push_back(Request {
            seq,
            tokens: prompt,
            n_computed: 0,
            n_preemptions: 0,
        });
        Ok(())
    }

    /// A request that can never be scheduled again: its next position would
    /// reach `n_ctx`, or its tokens outgrew the whole pool.
    fn must_finish(&self, r: &Request) -> bool {
        r.tokens.len() > self.cfg.n_ctx || r.tokens.len() > self.pool_tokens()
    }

    /// Frees the running request at `idx` and requeues it at the front of
    /// the waiting queue, to be recomputed from scratch. A planned entry of
    /// it (a phase-1 decode) is withdrawn with its block copies, whose
    /// destination blocks are freed with the rest.
    fn preempt(&mut self, idx: usize, plan: &mut StepPlan) -> Result<()> {
        let mut r = self.running.remove(idx);
        if let Some(k) = plan.seqs.iter().position(|e| e.seq == r.seq) {
            plan.seqs.remove(k);
            if k < plan.n_decodes {
                plan.n_decodes -= 1;
            }
        }
        self.kv
            .free(r.seq)
            .with_context(|| format!("preempting {}", r.seq))?;
        r.n_computed = 0;
        r.n_preemptions += 1;
        self.n_preemptions += 1;
        plan.preempted.push(r.seq);
        self.waiting.push_front(r);
        Ok(())
    }

    fn entry(r: &Request, n: usize, copies: Vec<crate::kv::BlockCopy>) -> ScheduledSeq {
        let end = r.n_computed + n;
        ScheduledSeq {
            seq: r.seq,
            start: r.n_computed,
            tokens: r.tokens[r.n_computed..end].to_vec(),
            sample: end == r.tokens.len(),
            copies,
            restore: None,
        }
    }

    /// Plans the next step. Must be followed by [`Self::on_step_done`]
    /// before the next call when the plan is not empty.
    pub fn schedule(&mut self) -> Result<StepPlan> {
        ensure!(
            self.in_flight.is_none(),
            "schedule: the previous step is still in flight (call on_step_done)"
        );
        let mut plan = StepPlan::default();
        self.schedule_decodes(&mut plan)?;
        let budget = self.cfg.prefill_budget(plan.n_decodes);
        let mut left = budget;
        self.schedule_running_prefills(&mut plan, &mut left)?;
        // As in vLLM, a step that had to preempt admits nobody new: the
        // pool is under pressure and the preempted would be re-admitted.
        if plan.preempted.is_empty() {
            self.admit_waiting(&mut plan, &mut left)?;
        }
        plan.n_prefill_tokens = budget - left;
        if !plan.is_empty() {
            self.in_flight = Some(
                plan.seqs
                    .iter()
                    .map(|s| InFlight {
                        seq: s.seq,
                        n: s.len(),
                        sample: s.sample,
                    })
                    .collect(),
            );
        }
        Ok(plan)
    }

    /// Phase 1: every running decode, oldest first; out of blocks preempts
    /// the newest running request (possibly the one being scheduled).
    fn schedule_decodes(&mut self, plan: &mut StepPlan) -> Result<()> {
        let mut i = 0;
        while i < self.running.len() {
            let r = &self.running[i];
            if r.remaining() != 1 {
                i += 1;
                continue;
            }
            if self.must_finish(r) {
                plan.must_finish.push(r.seq);
                i += 1;
                continue;
            }
            let (seq, target) = (r.seq, r.n_computed + 1);
            match self.kv.allocate(seq, target) {
                Ok(copies) => {
                    plan.seqs.push(Self::entry(&self.running[i], 1, copies));
                    plan.n_decodes += 1;
                    i += 1;
                }
                Err(KvError::OutOfBlocks { .. }) => {
                    // Victims come from the not-yet-scheduled tail (newer
                    // than this one), so no planned entry is invalidated; if
                    // the victim is this request, the loop ends: it was the
                    // last.
                    let victim = self.running.len() - 1;
                    self.preempt(victim, plan)?;
                }
                Err(e) => return Err(e).with_context(|| format!("decode of {seq}")),
            }
        }
        Ok(())
    }

    /// Phase 2a: running requests still catching up (chunked prefill or a
    /// recompute), oldest first, within the budget and the cap.
    fn schedule_running_prefills(&mut self, plan: &mut StepPlan, left: &mut usize) -> Result<()> {
        let cap = self.cfg.prefill_cap();
        let mut i = 0;
        while i < self.running.len() && *left > 0 {
            let r = &self.running[i];
            if r.remaining() < 2 {
                i += 1;
                continue;
            }
            let seq = r.seq;
            let mut n = self.cut(r.n_computed, r.remaining().min(*left).min(cap));
            loop {
                let n_computed = self.running[i].n_computed;
                match self.kv.allocate(seq, n_computed + n) {
                    Ok(copies) => {
                        plan.seqs.push(Self::entry(&self.running[i], n, copies));
                        *left -= n;
                        break;
                    }
                    Err(KvError::OutOfBlocks { .. }) => {
                        // Older requests keep priority for memory: preempt
                        // the newest running request if it is newer than
                        // this one, even a decode planned in phase 1 (its
                        // entry is withdrawn). Never this request itself: a
                        // shrunken chunk still makes progress.
                        if self.running.len() > i + 1 {
                            self.preempt(self.running.len() - 1, plan)?;
                            continue;
                        }
                        // Nothing to take from: shrink the chunk to what the
                        // table plus the free blocks can hold.
                        let b = self.kv.block_size();
                        let have = self.kv.block_table(seq).map_or(0, <[u32]>::len);
                        let fit = (have + self.kv.num_free_blocks()) * b;
                        let fit_n = fit.saturating_sub(n_computed).min(n);
                        if fit_n == 0 || fit_n == n {
                            break;
                        }
                        n = fit_n;
                    }
                    Err(e) => return Err(e).with_context(|| format!("prefill of {seq}")),
                }
            }
            i += 1;
        }
        Ok(())
    }

    /// Phase 2b: waiting requests in FIFO order; the first that does not fit
    /// stops admission (no overtaking). Prefix-cache hits skip cached tokens.
    fn admit_waiting(&mut self, plan: &mut StepPlan, left: &mut usize) -> Result<()> {
        let cap = self.cfg.prefill_cap();
        let mut w = 0;
        while w < self.waiting.len() && *left > 0 && self.running.len() < self.cfg.max_running {
            let r = &self.waiting[w];
            if self.must_finish(r) {
                plan.must_finish.push(r.seq);
                w += 1;
                continue;
            }
            let (_, n_hit) = self.kv.get_computed_blocks(&r.tokens);
            let (seq, tokens) = (r.seq, r.tokens.clone());
            let (n_cached, restore) = self.resume_point(&tokens, n_hit);
            let n = self.cut(n_cached, (tokens.len() - n_cached).min(*left).min(cap));
            match self
                .kv
                .allocate_with_prefix_upto(seq, &tokens, n_cached, n_cached + n)
            {
                Ok(got) => {
                    ensure!(
                        got == n_cached,
                        "prefix lookup changed: {got} vs {n_cached}"
                    );
                    let mut r = self.waiting.remove(w).context("waiting index")?;
                    r.n_computed = n_cached;
                    let mut e = Self::entry(&r, n, Vec::new());
                    e.restore = restore;
                    plan.seqs.push(e);
                    *left -= n;
                    self.running.push(r);
                }
                Err(KvError::OutOfBlocks { .. }) => break,
                Err(e) => return Err(e).with_context(|| format!("admitting {seq}")),
            }
        }
        Ok(())
    }

    /// Completes the step in flight: advances computed counters, registers
    /// newly full blocks in the prefix cache and appends the sampled tokens.
    /// Every planned request that is still live and reached its last token
    /// (`sample == true`) needs exactly one sampled token; nothing else may
    /// have one. On error nothing changes.
    pub fn on_step_done(&mut self, sampled: &[(SeqId, u32)]) -> Result<()> {
        let Some(flight) = self.in_flight.as_ref() else {
            ensure!(sampled.is_empty(), "on_step_done: no step in flight");
            return Ok(());
        };
        let mut tokens: HashMap<SeqId, u32> = HashMap::new();
        for &(seq, tok) in sampled {
            if tokens.insert(seq, tok).is_some() {
                bail!("on_step_done: two tokens for {seq}");
            }
            let f = flight.iter().find(|f| f.seq == seq);
            ensure!(
                f.is_some_and(|f| f.sample),
                "on_step_done: {seq} was not due for sampling"
            );
        }
        for f in flight {
            let live = self.running.iter().any(|r| r.seq == f.seq);
            ensure!(
                !(live && f.sample) || tokens.contains_key(&f.seq),
                "on_step_done: missing sampled token for {}",
                f.seq
            );
        }
        // Snapshots the engine did not take after the last step were never
        // filled: forget them rather than serve an empty slot later.
        if let Some(s) = self.snaps.as_mut() {
            for save in self.saves.drain(..) {
                s.forget_slot(save.slot);
            }
        }
        let flight = self.in_flight.take().unwrap_or_default();
        for f in flight {
            // Finished (or otherwise gone) requests are skipped.
            let Some(r) = self.running.iter_mut().find(|r| r.seq == f.seq) else {
                continue;
            };
            r.n_computed += f.n;
            // Without prefix caching nothing is ever registered, so every
            // lookup misses and every prompt is prefilled in full.
            if self.cfg.prefix_caching {
                self.kv
                    .commit_full_blocks(r.seq, &r.tokens, r.n_computed)
                    .with_context(|| format!("committing blocks of {}", r.seq))?;
                // The state after this step is the prefix's: keep it where
                // the prefix ends on a boundary (its blocks are committed).
                if let Some(s) = self.snaps.as_mut() {
                    let n = r.n_computed;
                    if s.is_boundary(n) {
                        let h = prefix_hash(&r.tokens[..n], self.kv.block_size());
                        if let Some(slot) = s.insert(h, n) {
                            self.saves.push(StateSave { seq: r.seq, slot });
                        }
                    }
                }
            }
            // The next query is at n_computed: keys before its window are
            // never read again (committed above, so a prefix hit can still
            // revive them).
            if let Some(w) = self.cfg.sliding_window {
                self.kv
                    .release_before(r.seq, (r.n_computed + 1).saturating_sub(w))
                    .with_context(|| format!("releasing the window of {}", r.seq))?;
            }
            if let Some(&tok) = tokens.get(&f.seq) {
                r.tokens.push(tok);
            }
        }
        Ok(())
    }

    /// Removes a request (running or waiting) and frees its blocks.
    pub fn finish(&mut self, seq: SeqId) -> Result<()> {
        if let Some(i) = self.running.iter().position(|r| r.seq == seq) {
            self.running.remove(i);
            self.kv
                .free(seq)
                .with_context(|| format!("finishing {seq}"))?;
            return Ok(());
        }
        if let Some(i) = self.waiting.iter().position(|r| r.seq == seq) {
            self.waiting.remove(i);
            return Ok(());
        }
        bail!("finish: unknown request {seq}")
    }
}
