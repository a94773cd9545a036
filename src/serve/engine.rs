//! The engine thread: admission, decode-first planning, KV allocation,
//! one `Runner::step` per iteration, sampling, events, metrics.
//!
//! Sequence state is one invariant: a running sequence has its first
//! `n_computed` tokens in the KV cache and `n_computed < tokens.len()`, so
//! every step feeds `tokens[n_computed..]` (a decode when one token is
//! left, a prefill chunk otherwise) and the row for the last token yields
//! the logits of the next one. Prefill, decode, prefix-cache hits and
//! recomputation after preemption are all this one rule.
//!
//! KV allocation is owned here, before the step: `Runner::step` then finds
//! every sequence already reserved up to its end, and its own `allocate`
//! call is a no-op. Block copies (copy on write) are run on the runner's
//! storage before the step.

use super::metrics::EndKind;
use super::{
    EngineConfig, EngineHandle, EngineLimits, Event, FinishReason, Metrics, Msg, Submission,
    TokenLogprobs,
};
use crate::kv::{KvError, SeqId};
use crate::runner::{LogitsWanted, Runner, SeqWork};
use crate::sampler::{logprobs, Sampler};
use anyhow::{bail, Context, Result};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// Starts the engine thread, which owns `runner` until every
/// [`EngineHandle`] is dropped and the last sequence has ended.
pub fn spawn(runner: Runner, cfg: EngineConfig) -> Result<(EngineHandle, JoinHandle<()>)> {
    if cfg.max_batch_tokens == 0 {
        bail!("max batch tokens must be at least 1");
    }
    if cfg.max_running == 0 {
        bail!("max running sequences must be at least 1");
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let queued = Arc::new(AtomicUsize::new(0));
    let metrics = Arc::new(Metrics::new());
    let mc = runner.config();
    let kv_blocks = runner.kv.num_blocks().saturating_sub(1);
    let limits = EngineLimits {
        context_length: mc.context_length,
        kv_tokens: kv_blocks * runner.kv.block_size(),
        vocab_size: mc.vocab_size,
    };
    let handle = EngineHandle {
        tx,
        queued: queued.clone(),
        max_queue: cfg.max_queue,
        metrics: metrics.clone(),
        limits,
    };
    let engine = Engine {
        runner,
        cfg,
        rx,
        queued,
        metrics,
        limits,
        waiting: VecDeque::new(),
        running: Vec::new(),
        next_id: 1,
    };
    engine.publish_metrics();
    let join = std::thread::Builder::new()
        .name("quire-engine".into())
        .spawn(move || engine.run())
        .context("starting the engine thread")?;
    Ok((handle, join))
}

/// What a request's sequences share.
struct ReqShared {
    tx: UnboundedSender<Event>,
    cancel: Arc<Vec<AtomicBool>>,
    stop_ids: Vec<u32>,
    top_logprobs: Option<usize>,
    arrival: Instant,
}

/// One choice of a request.
struct Seq {
    id: SeqId,
    index: usize,
    req: Arc<ReqShared>,
    /// Prompt then generated tokens.
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Tokens whose K/V are in the cache (0 while waiting).
    n_computed: usize,
    generated: usize,
    /// Generation ends (Length) when `tokens.len()` reaches this.
    max_len: usize,
    max_tokens: usize,
    sampler: Sampler,
    /// Admit only once this sibling's prompt is prefilled (prefix sharing).
    leader: Option<SeqId>,
    /// Still counted in the handle's queue counter (never admitted yet).
    in_queue_count: bool,
    last_token_at: Option<Instant>,
}

impl Seq {
    fn remaining(&self) -> usize {
        self.tokens.len() - self.n_computed
    }
    fn cancelled(&self) -> bool {
        self.req.tx.is_closed()
            || self
                .req
                .cancel
                .get(self.index)
                .is_some_and(|c| c.load(Ordering::Relaxed))
    }
}

/// One planned row group: `n` tokens of `running[idx]`.
struct Planned {
    idx: usize,
    n: usize,
    logits: bool,
}

struct Engine {
    runner: Runner,
    cfg: EngineConfig,
    rx: Receiver<Msg>,
    queued: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
    limits: EngineLimits,
    /// FIFO; preempted sequences go back to the front.
    waiting: VecDeque<Seq>,
    /// In admission order: the newest is preempted first.
    running: Vec<Seq>,
    next_id: u64,
}

impl Engine {
    fn run(mut self) {
        let mut senders_gone = false;
        loop {
            if self.waiting.is_empty() && self.running.is_empty() {
                if senders_gone {
                    break;
                }
                match self.rx.recv() {
                    Ok(m) => self.handle(m),
                    Err(_) => break,
                }
            }
            loop {
                match self.rx.try_recv() {
                    Ok(m) => self.handle(m),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        senders_gone = true;
                        break;
                    }
                }
            }
            self.reap_cancelled();
            self.admit();
            let plan = self.plan();
            if !plan.is_empty() {
                self.execute(plan);
            }
            self.publish_metrics();
        }
        tracing::info!("engine thread exits");
    }

    fn handle(&mut self, m: Msg) {
        match m {
            Msg::Submit(sub) => self.enqueue(*sub),
            Msg::CancelAll => {
                let running = std::mem::take(&mut self.running);
                let waiting = std::mem::take(&mut self.waiting);
                for s in running.into_iter().chain(waiting) {
                    let index = s.index;
                    let message = "the server is shutting down".to_string();
                    self.end(s, EndKind::Cancelled, Some(Event::Error { index, message }));
                }
            }
        }
    }

    fn enqueue(&mut self, sub: Submission) {
        let Submission {
            req,
            tx,
            cancel,
            arrival,
        } = sub;
        let n = req.n;
        let shared = Arc::new(ReqShared {
            tx,
            cancel,
            stop_ids: req.stop_ids.clone(),
            top_logprobs: req.top_logprobs,
            arrival,
        });
        let max_len = (req.prompt.len() + req.max_tokens).min(self.limits.context_length);
        let mut leader = None;
        for index in 0..n {
            let id = SeqId(self.next_id);
            self.next_id += 1;
            let mut params = req.params;
            params.seed = params.seed.wrapping_add(index as u64);
            let sampler = match Sampler::new(params) {
                Ok(s) => s,
                Err(e) => {
                    // Every choice shares the parameters: fail them all.
                    self.queued.fetch_sub(n - index, Ordering::AcqRel);
                    for i in index..n {
                        let _ = shared.tx.send(Event::Error {
                            index: i,
                            message: format!("invalid sampling parameters: {e:#}"),
                        });
                    }
                    return;
                }
            };
            self.waiting.push_back(Seq {
                id,
                index,
                req: shared.clone(),
                tokens: req.prompt.clone(),
                prompt_len: req.prompt.len(),
                n_computed: 0,
                generated: 0,
                max_len,
                max_tokens: req.max_tokens,
                sampler,
                leader,
                in_queue_count: true,
                last_token_at: None,
            });
            if index == 0 {
                leader = Some(id);
            }
        }
    }

    /// Removes a sequence for good: frees its blocks (if it holds any),
    /// uncounts it from the queue, sends its last event and counts the end.
    fn end(&mut self, s: Seq, kind: EndKind, event: Option<Event>) {
        if self.runner.kv.contains(s.id) {
            if let Err(e) = self.runner.kv.free(s.id) {
                tracing::error!("freeing {}: {e}", s.id);
            }
        }
        if s.in_queue_count {
            self.queued.fetch_sub(1, Ordering::AcqRel);
        }
        if let Some(ev) = event {
            let _ = s.req.tx.send(ev);
        }
        self.metrics.record_end(kind);
    }

    /// Drops sequences whose client is gone or that were cancelled (a stop
    /// string matched): their blocks go back to the pool at once.
    fn reap_cancelled(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].cancelled() {
                let s = self.running.remove(i);
                self.end(s, EndKind::Cancelled, None);
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.waiting.len() {
            if self.waiting[i].cancelled() {
                if let Some(s) = self.waiting.remove(i) {
                    self.end(s, EndKind::Cancelled, None);
                }
            } else {
                i += 1;
            }
        }
    }

    /// Whether `leader` still has prompt tokens to prefill (then its
    /// siblings wait, to hit its blocks in the prefix cache).
    fn leader_pending(&self, leader: SeqId) -> bool {
        self.waiting.iter().any(|s| s.id == leader)
            || self
                .running
                .iter()
                .any(|s| s.id == leader && s.n_computed < s.prompt_len)
    }

    /// Admits waiting sequences in FIFO order while the pool has room for
    /// their whole prompt plus one block of headroom per running sequence
    /// (so admitting does not immediately force preemptions).
    fn admit(&mut self) {
        let bs = self.runner.kv.block_size();
        let usable = self.runner.kv.num_blocks().saturating_sub(1);
        let mut i = 0;
        while i < self.waiting.len() && self.running.len() < self.cfg.max_running {
            if let Some(l) = self.waiting[i].leader {
                if self.leader_pending(l) {
                    i += 1;
                    continue;
                }
            }
            let s = &self.waiting[i];
            let need = (s.tokens.len() + 1).div_ceil(bs);
            if need > usable {
                let msg = format!(
                    "the sequence needs {} tokens of KV cache, more than the server's {} (--kv-tokens)",
                    s.tokens.len() + 1,
                    usable * bs
                );
                if let Some(s) = self.waiting.remove(i) {
                    let index = s.index;
                    self.end(s, EndKind::Error, Some(Event::Error { index, message: msg }));
                }
                continue;
            }
            let free = self.runner.kv.num_free_blocks();
            if !self.running.is_empty() && free < need + self.running.len() {
                break;
            }
            let id = s.id;
            let cached = match self.runner.kv.allocate_with_prefix_reserve(id, &s.tokens, 0) {
                Ok(n) => n,
                Err(KvError::OutOfBlocks { .. }) => break,
                Err(e) => {
                    if let Some(s) = self.waiting.remove(i) {
                        let index = s.index;
                        let message = format!("KV allocation failed: {e}");
                        self.end(s, EndKind::Error, Some(Event::Error { index, message }));
                    }
                    continue;
                }
            };
            let Some(mut s) = self.waiting.remove(i) else {
                break;
            };
            s.n_computed = cached;
            if s.in_queue_count {
                s.in_queue_count = false;
                self.queued.fetch_sub(1, Ordering::AcqRel);
                let pl = s.prompt_len as u64;
                self.metrics.update(|m| m.prompt_tokens_total += pl);
            }
            self.running.push(s);
        }
    }

    /// Preempts the newest running sequence: frees its blocks and puts it at
    /// the front of the queue; it will be recomputed (prefix cache first).
    fn preempt_last(&mut self) {
        let Some(mut s) = self.running.pop() else {
            return;
        };
        if let Err(e) = self.runner.kv.free(s.id) {
            tracing::error!("freeing preempted {}: {e}", s.id);
        }
        tracing::debug!("preempting {} at {} tokens", s.id, s.tokens.len());
        s.n_computed = 0;
        self.metrics.update(|m| m.preemptions_total += 1);
        self.waiting.push_front(s);
    }

    /// Reserves KV for `running[idx]` up to `n_total` tokens and runs the
    /// copy-on-write copies the reservation asks for.
    fn reserve(&mut self, idx: usize, n_total: usize) -> Result<(), KvError> {
        let id = self.running[idx].id;
        let copies = self.runner.kv.allocate(id, n_total)?;
        for c in copies {
            self.runner
                .storage
                .copy_block(c.src, c.dst)
                .map_err(|e| KvError::InvalidArgument(format!("block copy failed: {e:#}")))?;
        }
        Ok(())
    }

    /// Decode-first plan: every running decode (one token each), then prefill
    /// chunks in admission order within `max(min_prefill_tokens, T - D)`.
    /// Allocates the KV of every planned row; preempts the newest sequences
    /// when a decode cannot get a block.
    fn plan(&mut self) -> Vec<Planned> {
        loop {
            let mut plan = Vec::new();
            let mut k = 0;
            while k < self.running.len() {
                if self.running[k].remaining() != 1 {
                    k += 1;
                    continue;
                }
                let end = self.running[k].tokens.len();
                match self.reserve(k, end) {
                    Ok(()) => {
                        plan.push(Planned {
                            idx: k,
                            n: 1,
                            logits: true,
                        });
                        k += 1;
                    }
                    Err(KvError::OutOfBlocks { .. }) if self.running.len() > 1 => {
                        // The victim is the last one, never an already
                        // planned (smaller) index, so `plan` stays valid.
                        self.preempt_last();
                    }
                    Err(e) => {
                        // Alone and out of blocks: it can never grow.
                        let s = self.running.remove(k);
                        let (index, generated) = (s.index, s.generated);
                        let (kind, ev) = match e {
                            KvError::OutOfBlocks { .. } => (
                                EndKind::Length,
                                Event::Finished {
                                    index,
                                    reason: FinishReason::Length,
                                    completion_tokens: generated,
                                },
                            ),
                            e => (
                                EndKind::Error,
                                Event::Error {
                                    index,
                                    message: format!("KV allocation failed: {e}"),
                                },
                            ),
                        };
                        self.end(s, kind, Some(ev));
                        return Vec::new();
                    }
                }
            }
            let d = plan.len();
            let t = self.cfg.max_batch_tokens;
            let mut budget = self.cfg.min_prefill_tokens.max(t.saturating_sub(d));
            let bs = self.runner.kv.block_size();
            for k in 0..self.running.len() {
                if budget == 0 {
                    break;
                }
                let s = &self.running[k];
                if s.remaining() <= 1 {
                    continue;
                }
                let mut n = s.remaining().min(budget);
                if self.cfg.max_prefill_chunk > 0 {
                    n = n.min(self.cfg.max_prefill_chunk);
                }
                let reserved = self.runner.kv.block_table(s.id).map_or(0, |t| t.len()) * bs;
                let avail = reserved.saturating_sub(s.n_computed)
                    + self.runner.kv.num_free_blocks() * bs;
                n = n.min(avail);
                if n == 0 {
                    break;
                }
                let (id, end) = (s.id, s.n_computed + n);
                let logits = end == s.tokens.len();
                match self.reserve(k, end) {
                    Ok(()) => {
                        plan.push(Planned { idx: k, n, logits });
                        budget -= n;
                    }
                    Err(e) => {
                        tracing::debug!("prefill of {id} waits for blocks: {e}");
                        break;
                    }
                }
            }
            if !plan.is_empty() || self.running.is_empty() {
                return plan;
            }
            // Nothing can run: prefills hold the pool between them. Free the
            // newest one and retry (terminates: running shrinks each time).
            if self.running.len() == 1 {
                let s = self.running.remove(0);
                let index = s.index;
                let message = "the KV cache is too small for this sequence".to_string();
                self.end(s, EndKind::Error, Some(Event::Error { index, message }));
                return Vec::new();
            }
            self.preempt_last();
        }
    }

    /// Runs the planned rows in one step and handles their logits.
    fn execute(&mut self, plan: Vec<Planned>) {
        let work: Vec<SeqWork<'_>> = plan
            .iter()
            .map(|p| {
                let s = &self.running[p.idx];
                SeqWork {
                    seq: s.id,
                    tokens: &s.tokens[s.n_computed..s.n_computed + p.n],
                    start_pos: s.n_computed,
                    logits: if p.logits {
                        LogitsWanted::Last
                    } else {
                        LogitsWanted::None
                    },
                }
            })
            .collect();
        let result = self.runner.step(&work);
        drop(work);
        let outs = match result {
            Ok(o) => o,
            Err(e) => {
                // A failed step leaves the written cells undefined: end every
                // sequence of the step with the error.
                let message = format!("model step failed: {e:#}");
                tracing::error!("{message}");
                let mut idxs: Vec<usize> = plan.iter().map(|p| p.idx).collect();
                idxs.sort_unstable();
                for i in idxs.into_iter().rev() {
                    let s = self.running.remove(i);
                    let index = s.index;
                    let message = message.clone();
                    self.end(s, EndKind::Error, Some(Event::Error { index, message }));
                }
                return;
            }
        };
        let now = Instant::now();
        let mut generated = 0u64;
        let mut prefilled = 0u64;
        let mut ended: Vec<(usize, EndKind, Option<Event>)> = Vec::new();
        for (p, logits) in plan.iter().zip(outs) {
            let s = &mut self.running[p.idx];
            if p.n > 1 || s.n_computed < s.prompt_len {
                prefilled += p.n as u64;
            }
            s.n_computed += p.n;
            if let Err(e) = self
                .runner
                .kv
                .commit_full_blocks(s.id, &s.tokens, s.n_computed)
            {
                tracing::warn!("prefix-cache commit for {}: {e}", s.id);
            }
            if !p.logits {
                continue;
            }
            match sample_one(s, &logits, now, &self.metrics) {
                Ok(Some(end)) => ended.push((p.idx, end.0, Some(end.1))),
                Ok(None) => {}
                Err(message) => {
                    let index = s.index;
                    ended.push((p.idx, EndKind::Error, Some(Event::Error { index, message })));
                }
            }
            generated += 1;
        }
        self.metrics.update(|m| m.computed_prompt_tokens_total += prefilled);
        self.metrics.record_step(now, generated);
        ended.sort_by_key(|e| e.0);
        for (idx, kind, ev) in ended.into_iter().rev() {
            let s = self.running.remove(idx);
            self.end(s, kind, ev);
        }
    }

    fn publish_metrics(&self) {
        let kv = &self.runner.kv;
        let km = kv.metrics();
        let (waiting, running) = (self.waiting.len(), self.running.len());
        let (used, free, total) = (
            kv.num_used_blocks(),
            kv.num_free_blocks(),
            kv.num_blocks().saturating_sub(1),
        );
        self.metrics.update(|m| {
            m.queue_depth = waiting;
            m.running = running;
            m.kv_blocks_used = used;
            m.kv_blocks_free = free;
            m.kv_blocks_total = total;
            m.prefix_query_tokens = km.prefix_query_tokens;
            m.prefix_hit_tokens = km.prefix_hit_tokens;
        });
    }
}

/// Samples the next token of `s` from `logits`, sends it, and says whether
/// the sequence ended (with its last event). A send failure (client gone)
/// ends it as cancelled.
fn sample_one(
    s: &mut Seq,
    logits: &[f32],
    now: Instant,
    metrics: &Metrics,
) -> Result<Option<(EndKind, Event)>, String> {
    let tok = s
        .sampler
        .sample(logits, &s.tokens)
        .map_err(|e| format!("sampling failed: {e:#}"))?;
    let lp = s.req.top_logprobs.map(|k| {
        let (logprob, top) = logprobs(logits, tok, k);
        TokenLogprobs { logprob, top }
    });
    s.tokens.push(tok);
    s.generated += 1;
    let since = s.last_token_at.unwrap_or(s.req.arrival);
    metrics.update(|m| {
        let dt = now.duration_since(since).as_secs_f64();
        if s.generated == 1 {
            m.ttft.observe(dt);
        } else {
            m.itl.observe(dt);
        }
    });
    s.last_token_at = Some(now);
    let index = s.index;
    if s.req.stop_ids.contains(&tok) {
        return Ok(Some((
            EndKind::Stop,
            Event::Finished {
                index,
                reason: FinishReason::Stop,
                completion_tokens: s.generated,
            },
        )));
    }
    let sent = s.req.tx.send(Event::Token {
        index,
        token: tok,
        logprobs: lp,
    });
    if sent.is_err() {
        return Ok(Some((
            EndKind::Cancelled,
            Event::Error {
                index,
                message: "client gone".into(),
            },
        )));
    }
    if s.generated >= s.max_tokens || s.tokens.len() >= s.max_len {
        return Ok(Some((
            EndKind::Length,
            Event::Finished {
                index,
                reason: FinishReason::Length,
                completion_tokens: s.generated,
            },
        )));
    }
    Ok(None)
}
