//! The engine thread: the [`Scheduler`] plans each step (decode first,
//! prefill chunks in the rest of the budget, prefix-cache hits, preemption),
//! [`run_plan`] runs it on the model, each sequence samples with its own
//! seeded [`Sampler`], and events go to the request's channel.
//!
//! The scheduler owns the KV manager (allocation, prefix cache, preemption);
//! the runner's own manager is unused here. Sequences whose client went away
//! or that were cancelled are finished before the next plan, so their blocks
//! return to the pool at once.

use super::metrics::EndKind;
use super::seq::{Pick, ReqShared, Seq};
use super::step::{run_plan, run_plan_draw, run_plan_greedy};
use super::{
    EngineConfig, EngineHandle, EngineLimits, Event, FinishReason, Metrics, Msg, Submission,
    TokenLogprobs,
};
use crate::constrain::Constraint;
use crate::kv::{KvManager, SeqId};
use crate::runner::Runner;
use crate::sampler::{logprobs, BadLogits, RowMasks, Sampler};
use crate::scheduler::{PrefillBudget, Scheduler, SchedulerConfig, StateSnapshots};
use anyhow::{anyhow, bail, Context, Result};
use rayon::prelude::*;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Starts the engine thread, which owns `runner` until every
/// [`EngineHandle`] is dropped and the last sequence has ended.
pub fn spawn(runner: Runner, cfg: EngineConfig) -> Result<(EngineHandle, JoinHandle<()>)> {
    if cfg.max_batch_tokens == 0 || cfg.max_running == 0 || cfg.min_prefill_tokens == 0 {
        bail!("max batch tokens, max running and min prefill tokens must be at least 1");
    }
    let mc = runner.config().clone();
    let mut scfg = SchedulerConfig::new(
        cfg.max_batch_tokens,
        cfg.min_prefill_tokens,
        mc.context_length,
    );
    scfg.max_running = cfg.max_running;
    scfg.prefix_caching = cfg.prefix_caching;
    scfg.sliding_window = mc.attn.sliding_window;
    if let Some(slots) = runner.state_slots() {
        // A hybrid model: each running sequence holds a recurrent state
        // slot, and a cached prefix resumes only where a state snapshot
        // exists (taken every `state_snapshot_stride` tokens).
        let capacity = runner.state_snapshots();
        scfg.state_snapshots = Some(StateSnapshots {
            capacity,
            stride: cfg.state_snapshot_stride,
        });
        scfg.max_running = cfg.max_running.min(slots);
        eprintln!(
            "quire serve: hybrid model: at most {} running sequences (--state-slots {slots}); \
             prefix caching {}",
            scfg.max_running,
            if cfg.prefix_caching && capacity > 0 {
                format!(
                    "through {capacity} state snapshots every {} tokens",
                    cfg.state_snapshot_stride
                )
            } else {
                "off (no state snapshots)".into()
            }
        );
    }
    scfg.budget = match cfg.static_prefill_budget {
        Some(n) => PrefillBudget::Static(n),
        None => PrefillBudget::Dynamic,
    };
    scfg.cap = cfg.max_prefill_chunk;
    // Same geometry as the runner's KV storage, which the step writes.
    let kv = KvManager::new(runner.kv.num_blocks(), runner.kv.block_size())
        .map_err(|e| anyhow!("creating the KV manager: {e}"))?;
    let sched = Scheduler::new(scfg, kv)?;
    let (tx, rx) = std::sync::mpsc::channel();
    let queued = Arc::new(AtomicUsize::new(0));
    let metrics = Arc::new(Metrics::new());
    let limits = EngineLimits {
        context_length: mc.context_length,
        kv_tokens: (runner.kv.num_blocks().saturating_sub(1)) * runner.kv.block_size(),
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
        sched,
        rx,
        queued,
        metrics,
        limits,
        seqs: BTreeMap::new(),
        deferred: VecDeque::new(),
        next_id: 1,
        row_masks: RowMasks::default(),
    };
    engine.publish_metrics();
    let join = std::thread::Builder::new()
        .name("quire-engine".into())
        .spawn(move || engine.run())
        .context("starting the engine thread")?;
    Ok((handle, join))
}

/// A step's result: every planned row's logits, or (a greedy step on the
/// device) each planned sequence's chosen token.
enum StepOut {
    Logits(crate::runner::Logits),
    Tokens(Vec<u32>),
}

/// A sibling choice held back until its leader's prompt is prefilled, so
/// that it is admitted with the leader's blocks as prefix-cache hits.
struct Deferred {
    id: SeqId,
    leader: SeqId,
    prompt: Vec<u32>,
    seq: Seq,
}

struct Engine {
    runner: Runner,
    sched: Scheduler,
    rx: Receiver<Msg>,
    queued: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
    limits: EngineLimits,
    /// Every sequence known to the scheduler.
    seqs: BTreeMap<SeqId, Seq>,
    deferred: VecDeque<Deferred>,
    next_id: u64,
    /// The grammar masks of a step drawn on the device (masks.rs).
    row_masks: RowMasks,
}

impl Engine {
    fn run(mut self) {
        let mut senders_gone = false;
        loop {
            let idle = self.seqs.is_empty() && self.deferred.is_empty();
            if idle {
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
            self.release_deferred();
            if let Err(e) = self.step() {
                // The scheduler's state can no longer be trusted: end every
                // sequence with the error, and keep serving new requests.
                tracing::error!("engine step failed: {e:#}");
                self.fail_all(&format!("engine error: {e:#}"));
            }
            self.publish_metrics();
        }
        tracing::info!("engine thread exits");
    }

    fn handle(&mut self, m: Msg) {
        match m {
            Msg::Submit(sub) => self.enqueue(*sub),
            Msg::Embed(job) => {
                let super::EmbedJob {
                    inputs,
                    pooling,
                    reply,
                } = *job;
                let refs: Vec<&[u32]> = inputs.iter().map(Vec::as_slice).collect();
                let budget = self.sched.config().max_batch_tokens;
                let r = self
                    .runner
                    .embed_with_kv(self.sched.kv_mut(), &refs, pooling, budget)
                    .map_err(|e| format!("{e:#}"));
                // The client may have gone: nothing to do then.
                let _ = reply.send(r);
            }
            Msg::CancelAll => self.fail_all("the server is shutting down"),
        }
    }

    fn fail_all(&mut self, message: &str) {
        let ids: Vec<SeqId> = self.seqs.keys().copied().collect();
        for id in ids {
            if let Some(s) = self.seqs.remove(&id) {
                let index = s.index;
                let ev = Event::Error {
                    index,
                    message: message.to_string(),
                };
                self.end(id, s, EndKind::Cancelled, Some(ev));
            }
        }
        for d in std::mem::take(&mut self.deferred) {
            let index = d.seq.index;
            let ev = Event::Error {
                index,
                message: message.to_string(),
            };
            self.end(d.id, d.seq, EndKind::Cancelled, Some(ev));
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
            let sampler = match Sampler::new(params).and_then(|s| s.with_adjust(req.adjust.clone()))
            {
                Ok(s) => s,
                Err(e) => {
                    // Every choice shares the parameters: fail the rest.
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
            let seq = Seq {
                index,
                req: shared.clone(),
                prompt_len: req.prompt.len(),
                generated: 0,
                max_len,
                max_tokens: req.max_tokens,
                sampler,
                constraint: req.grammar.as_ref().map(|g| g.start()),
                in_queue_count: true,
                cached_tokens: 0,
                last_token_at: None,
            };
            match leader {
                None => {
                    if let Err(e) = self.sched.add_request(id, req.prompt.clone()) {
                        let message = format!("{e:#}");
                        self.end(
                            id,
                            seq,
                            EndKind::Error,
                            Some(Event::Error { index, message }),
                        );
                        // Siblings would fail the same way.
                        for i in 1..n {
                            self.queued.fetch_sub(1, Ordering::AcqRel);
                            let _ = shared.tx.send(Event::Error {
                                index: i,
                                message: "the request was rejected".into(),
                            });
                        }
                        return;
                    }
                    self.seqs.insert(id, seq);
                    leader = Some(id);
                }
                Some(l) => self.deferred.push_back(Deferred {
                    id,
                    leader: l,
                    prompt: req.prompt.clone(),
                    seq,
                }),
            }
        }
    }

    /// Hands deferred siblings to the scheduler once their leader's prompt
    /// is computed (or the leader is gone).
    fn release_deferred(&mut self) {
        let mut keep = VecDeque::new();
        while let Some(d) = self.deferred.pop_front() {
            let pending = self
                .sched
                .num_computed(d.leader)
                .is_some_and(|c| self.seqs.get(&d.leader).is_some_and(|l| c < l.prompt_len));
            if pending {
                keep.push_back(d);
                continue;
            }
            match self.sched.add_request(d.id, d.prompt) {
                Ok(()) => {
                    self.seqs.insert(d.id, d.seq);
                }
                Err(e) => {
                    let index = d.seq.index;
                    let message = format!("{e:#}");
                    self.end(
                        d.id,
                        d.seq,
                        EndKind::Error,
                        Some(Event::Error { index, message }),
                    );
                }
            }
        }
        self.deferred = keep;
    }

    /// Removes a sequence for good: finishes it in the scheduler (freeing
    /// its blocks), uncounts it from the queue, sends its last event.
    fn end(&mut self, id: SeqId, s: Seq, kind: EndKind, event: Option<Event>) {
        self.runner.release_state(id);
        if self.sched.tokens(id).is_some() {
            if let Err(e) = self.sched.finish(id) {
                tracing::error!("finishing {id}: {e:#}");
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
        let gone: Vec<SeqId> = self
            .seqs
            .iter()
            .filter(|(_, s)| s.cancelled())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            if let Some(s) = self.seqs.remove(&id) {
                self.end(id, s, EndKind::Cancelled, None);
            }
        }
        let (gone, keep): (Vec<Deferred>, Vec<Deferred>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|d| d.seq.cancelled());
        self.deferred = keep.into();
        for d in gone {
            self.end(d.id, d.seq, EndKind::Cancelled, None);
        }
    }

    /// Plans and runs one step, samples, sends events.
    fn step(&mut self) -> Result<()> {
        let plan = self.sched.schedule().context("scheduling")?;
        // Preempted sequences are recomputed from position 0: their
        // recurrent state slots (hybrid models) are free until then.
        for &seq in &plan.preempted {
            self.runner.release_state(seq);
        }
        for id in &plan.must_finish {
            if let Some(s) = self.seqs.remove(id) {
                let ev = Event::Finished {
                    index: s.index,
                    reason: FinishReason::Length,
                    completion_tokens: s.generated,
                    cached_tokens: s.cached_tokens,
                };
                self.end(*id, s, EndKind::Length, Some(ev));
            }
        }
        if plan.is_empty() {
            // Nothing runnable (e.g. every waiting prompt is blocked behind
            // the pool): wait for a message rather than spin.
            if self.sched.has_unfinished() {
                match self.rx.recv_timeout(Duration::from_millis(5)) {
                    Ok(m) => self.handle(m),
                    Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
                }
            }
            return Ok(());
        }
        let mut newly = 0u64;
        for ss in &plan.seqs {
            if let Some(s) = self.seqs.get_mut(&ss.seq) {
                if s.in_queue_count {
                    s.in_queue_count = false;
                    s.cached_tokens = ss.start;
                    self.queued.fetch_sub(1, Ordering::AcqRel);
                    newly += s.prompt_len as u64;
                }
            }
        }
        let prefilled = plan.n_prefill_tokens as u64;
        let preemptions = self.sched.num_preemptions();
        self.metrics.update(|m| {
            m.prompt_tokens_total += newly;
            m.computed_prompt_tokens_total += prefilled;
            m.preemptions_total = preemptions;
        });
        // Every planned row a decode row whose draw reads the logits alone
        // (greedy, or sampled without a repetition penalty), without
        // logprobs: the device chooses the tokens and no logits come down
        // (Runner::step_greedy_with_kv), with constrained rows through
        // their grammar masks, computed while the forward runs
        // (Runner::step_draw_with_kv, masks.rs). Sampled rows' uniforms
        // are drawn here, once: if the device step cannot run or fails,
        // the step runs again with logits (it rewrites the same cells) and
        // each sequence samples with its uniform, and fails, on its own.
        let on_device = plan.seqs.iter().all(|ss| {
            self.seqs
                .get(&ss.seq)
                .is_some_and(|s| s.sampler.logits_only() && s.req.top_logprobs.is_none())
        });
        let constrained = plan.seqs.iter().any(|ss| {
            self.seqs
                .get(&ss.seq)
                .is_some_and(|s| s.constraint.is_some())
        });
        let mut uniforms: Vec<Option<f64>> = vec![None; plan.seqs.len()];
        let mut chosen = None;
        // Rows whose grammar could not go on (their end messages).
        let mut dead: Vec<(usize, String)> = Vec::new();
        self.row_masks.reset(0, 0);
        if on_device {
            let mut draws = Vec::with_capacity(plan.seqs.len());
            for (i, ss) in plan.seqs.iter().enumerate() {
                let s = self.seqs.get_mut(&ss.seq).context("planned sequence")?;
                let p = s.sampler.params().draw_params();
                draws.push(if ss.sample && p.temperature != 0.0 {
                    let u = s.sampler.next_uniform();
                    uniforms[i] = Some(u);
                    Some((p, u))
                } else {
                    None
                });
            }
            let r = if constrained {
                let (seqs, masks) = (&mut self.seqs, &mut self.row_masks);
                let vocab = self.limits.vocab_size;
                let mut fill =
                    |m: &mut RowMasks| dead = super::masks::step_masks(seqs, &plan, vocab, m);
                run_plan_draw(
                    &mut self.runner,
                    self.sched.kv(),
                    &plan,
                    &draws,
                    masks,
                    &mut fill,
                )
            } else {
                run_plan_greedy(&mut self.runner, self.sched.kv(), &plan, &draws)
            };
            match r {
                Ok(t) => chosen = t,
                // A hybrid's recurrent state may have advanced: the step
                // cannot run again.
                Err(e) if self.runner.state_slots().is_some() => {
                    return Err(e.context("decode step drawing on the device"))
                }
                Err(e) => tracing::debug!(
                    "decode step drawing on the device: {e:#}; stepping with logits"
                ),
            }
            if chosen.is_none() {
                dead.clear();
            }
        }
        let outs = match chosen {
            Some(t) => Ok(StepOut::Tokens(t)),
            None => {
                // Grammar masks of the rows this step samples, computed on
                // another thread while the model step runs (a mask reads
                // only the tokens already committed).
                let sampling: Vec<SeqId> = plan
                    .seqs
                    .iter()
                    .filter(|ss| ss.sample)
                    .map(|ss| ss.seq)
                    .collect();
                let masks: Vec<&mut Constraint> = self
                    .seqs
                    .iter_mut()
                    .filter(|(id, _)| sampling.contains(id))
                    .filter_map(|(_, s)| s.constraint.as_mut())
                    .collect();
                let (runner, kv) = (&mut self.runner, self.sched.kv());
                std::thread::scope(|sc| {
                    let worker = (!masks.is_empty()).then(|| {
                        sc.spawn(move || masks.into_par_iter().for_each(Constraint::prepare))
                    });
                    let outs = run_plan(runner, kv, &plan).map(StepOut::Logits);
                    // A mask not computed (the worker panicked) is computed
                    // again, and its error reported, when sampling.
                    if let Some(w) = worker {
                        let _ = w.join();
                    }
                    outs
                })
            }
        };
        let outs = match outs {
            Ok(o) => o,
            Err(e) => {
                // The step's cells are undefined: end its sequences.
                let message = format!("model step failed: {e:#}");
                tracing::error!("{message}");
                for ss in &plan.seqs {
                    if let Some(s) = self.seqs.remove(&ss.seq) {
                        let index = s.index;
                        let message = message.clone();
                        self.end(
                            ss.seq,
                            s,
                            EndKind::Error,
                            Some(Event::Error { index, message }),
                        );
                    }
                }
                return self.sched.on_step_done(&[]);
            }
        };
        let now = Instant::now();
        // Each sampled row's token: drawn on the device, or here from its
        // logits, rows in parallel (a row reads its own logits and changes
        // only its own sampler and grammar state), then sent in plan order.
        let mut picks: Vec<Option<Result<Pick, String>>> = match &outs {
            StepOut::Tokens(t) => {
                let mut picks: Vec<Option<Result<Pick, String>>> = plan
                    .seqs
                    .iter()
                    .enumerate()
                    .map(|(i, ss)| ss.sample.then(|| Ok((t[i], None))))
                    .collect();
                if constrained {
                    for (i, r) in
                        super::masks::device_picks(&mut self.seqs, &plan, t, &self.row_masks)
                    {
                        picks[i] = Some(r);
                    }
                    for (i, message) in dead.drain(..) {
                        picks[i] = Some(Err(message));
                    }
                }
                picks
            }
            StepOut::Logits(l) => {
                let at = super::masks::sampled_rows(&plan);
                let sched = &self.sched;
                let mut rows: Vec<(usize, &mut Seq, &[u32], &[f32])> = self
                    .seqs
                    .iter_mut()
                    .filter_map(|(id, s)| {
                        let &i = at.get(id)?;
                        Some((i, s, sched.tokens(*id)?, l.seq(i)))
                    })
                    .collect();
                let chosen: Vec<(usize, Result<Pick, String>)> = rows
                    .par_iter_mut()
                    .map(|(i, s, history, logits)| (*i, choose(s, logits, history, uniforms[*i])))
                    .collect();
                let mut picks = vec![None; plan.seqs.len()];
                for (i, r) in chosen {
                    picks[i] = Some(r);
                }
                picks
            }
        };
        let mut sampled = Vec::new();
        let mut ended: Vec<(SeqId, EndKind, Event)> = Vec::new();
        for (i, ss) in plan.seqs.iter().enumerate() {
            let Some(pick) = picks[i].take() else {
                continue;
            };
            let (Some(s), Some(history)) = (self.seqs.get_mut(&ss.seq), self.sched.tokens(ss.seq))
            else {
                continue;
            };
            let picked = pick.map(|(tok, lp)| emit_token(s, tok, lp, history, now, &self.metrics));
            match picked {
                Ok((tok, end)) => {
                    sampled.push((ss.seq, tok));
                    if let Some((kind, ev)) = end {
                        ended.push((ss.seq, kind, ev));
                    }
                }
                Err(message) => {
                    let index = s.index;
                    // Finished before on_step_done: it then needs no token.
                    if let Some(s) = self.seqs.remove(&ss.seq) {
                        self.end(
                            ss.seq,
                            s,
                            EndKind::Error,
                            Some(Event::Error { index, message }),
                        );
                    }
                }
            }
        }
        // The logits' page-locked buffer back to the pool for the next step.
        drop(outs);
        self.metrics
            .record_step(now, sampled.len() as u64, self.runner.step_paths());
        self.sched
            .on_step_done(&sampled)
            .context("completing the step")?;
        // Hybrid models: snapshots of states that ended on a boundary,
        // taken before any of their sequences ends below.
        for s in self.sched.take_saves() {
            self.runner.save_state(s.seq, s.slot)?;
        }
        for (id, kind, ev) in ended {
            if let Some(s) = self.seqs.remove(&id) {
                self.end(id, s, kind, Some(ev));
            }
        }
        Ok(())
    }

    fn publish_metrics(&self) {
        let kv = self.sched.kv();
        let km = kv.metrics();
        let waiting = self.sched.num_waiting() + self.deferred.len();
        let running = self.sched.num_running();
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

/// Chooses the next token of `s` (whose tokens so far are `history`) from
/// its logits, through its grammar's mask if it has one, and advances the
/// grammar. The error is the sequence's end message.
fn choose(s: &mut Seq, logits: &[f32], history: &[u32], u: Option<f64>) -> Result<Pick, String> {
    // A NaN or +inf row ends this sequence alone (its caller frees its
    // blocks); the position is that of the token it was to choose.
    let bad = |e: anyhow::Error| {
        BadLogits::message_of(&e, history.len())
            .unwrap_or_else(|| format!("sampling failed: {e:#}"))
    };
    let tok = match s.constraint.as_mut() {
        None => s.sampler.sample_with(logits, history, u).map_err(bad)?,
        Some(c) => {
            let stops = &s.req.stop_ids;
            let allowed = c.allows(stops).map_err(|e| format!("{e:#}"))?;
            let tok = s
                .sampler
                .sample_masked(logits, history, u, Some(&allowed))
                .map_err(bad)?;
            if !stops.contains(&tok) {
                c.commit(tok).map_err(|e| format!("{e:#}"))?;
            }
            tok
        }
    };
    // Log-probabilities read the model's logits, not the masked ones.
    let lp = s.req.top_logprobs.map(|k| {
        let (logprob, top) = logprobs(logits, tok, k);
        TokenLogprobs { logprob, top }
    });
    Ok((tok, lp))
}

/// Counts and sends a sequence's chosen token (with its logprobs, if
/// asked), and says whether and how the sequence ends with it.
fn emit_token(
    s: &mut Seq,
    tok: u32,
    lp: Option<TokenLogprobs>,
    history: &[u32],
    now: Instant,
    metrics: &Metrics,
) -> (u32, Option<(EndKind, Event)>) {
    s.generated += 1;
    let since = s.last_token_at.unwrap_or(s.req.arrival);
    let first = s.generated == 1;
    metrics.update(|m| {
        let dt = now.duration_since(since).as_secs_f64();
        if first {
            m.ttft.observe(dt);
        } else {
            m.itl.observe(dt);
        }
    });
    s.last_token_at = Some(now);
    let index = s.index;
    if s.req.stop_ids.contains(&tok) {
        let ev = Event::Finished {
            index,
            reason: FinishReason::Stop,
            completion_tokens: s.generated,
            cached_tokens: s.cached_tokens,
        };
        return (tok, Some((EndKind::Stop, ev)));
    }
    let sent = s.req.tx.send(Event::Token {
        index,
        token: tok,
        logprobs: lp,
    });
    if sent.is_err() {
        return (
            tok,
            Some((
                EndKind::Cancelled,
                Event::Error {
                    index,
                    message: "client gone".into(),
                },
            )),
        );
    }
    if s.generated >= s.max_tokens || history.len() + 1 >= s.max_len {
        let ev = Event::Finished {
            index,
            reason: FinishReason::Length,
            completion_tokens: s.generated,
            cached_tokens: s.cached_tokens,
        };
        return (tok, Some((EndKind::Length, ev)));
    }
    (tok, None)
}
