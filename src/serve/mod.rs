//! The multi-request engine: one thread owns the [`Runner`] (the model, its
//! KV storage and the KV block manager) and steps every live sequence
//! together, decode-first; callers talk to it through channels.
//!
//! ```text
//! HTTP handlers --EngineHandle::submit--> Msg queue --> engine thread
//!      ^                                                    | step loop:
//!      +---- tokio mpsc (Event per token / end) <-----------+ admit, plan, step, sample
//! ```
//!
//! Planning is the pure [`crate::scheduler`]'s: decode first, prefill chunks
//! in the rest of the token budget, prefix-cache hits, preemption with
//! recomputation. [`step::run_plan`] runs its plan on the model.
//!
//! Each request may ask for `n` choices: `n` sequences sharing the prompt.
//! The first one is queued alone; its siblings wait until its prompt is
//! prefilled and its full blocks are in the prefix cache, then reuse them.

mod engine;
mod masks;
pub mod metrics;
mod seq;
pub mod step;

pub use engine::spawn;
pub use metrics::{EndKind, Metrics};

use crate::sampler::SamplingParams;
use crate::scheduler::PrefillCap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// Engine settings.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Most sequences that may wait for admission (the queue); a request that
    /// would exceed it is refused with [`SubmitError::QueueFull`].
    pub max_queue: usize,
    /// T: most tokens (rows) one step runs, decodes and prefill chunks together.
    pub max_batch_tokens: usize,
    /// Floor of the prefill budget: each step gives prefill chunks
    /// `max(min_prefill_tokens, T - D)` tokens, D = live decodes (decode first;
    /// the floor keeps prompts moving when T is saturated by decodes).
    pub min_prefill_tokens: usize,
    /// Some(n): a static prefill budget of n tokens per step, whatever the
    /// number of decodes (instead of the dynamic `max(min, T - D)`).
    pub static_prefill_budget: Option<usize>,
    /// Most tokens one sequence prefills per step.
    pub max_prefill_chunk: PrefillCap,
    /// Most sequences running at once.
    pub max_running: usize,
    /// Reuse cached KV blocks of shared prompt prefixes.
    pub prefix_caching: bool,
    /// Hybrid models: tokens between recurrent-state snapshots (a multiple
    /// of the block size; the runner holds the snapshots).
    pub state_snapshot_stride: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_queue: 256,
            max_batch_tokens: 256,
            min_prefill_tokens: 32,
            static_prefill_budget: None,
            max_prefill_chunk: PrefillCap::Off,
            max_running: 64,
            prefix_caching: true,
            state_snapshot_stride: 256,
        }
    }
}

/// One generation request (all its `n` choices).
#[derive(Clone, Debug)]
pub struct GenRequest {
    pub prompt: Vec<u32>,
    /// Choice `i` samples with seed `params.seed + i` (wrapping), so the
    /// choices differ and each stays reproducible.
    pub params: SamplingParams,
    /// Most tokens generated per choice (the context length also bounds it).
    pub max_tokens: usize,
    /// Generation ends (reason Stop) after one of these tokens; it is not
    /// sent as a Token event.
    pub stop_ids: Vec<u32>,
    /// Some(k): send the chosen token's log-probability and the k most likely.
    pub top_logprobs: Option<usize>,
    pub n: usize,
    /// OpenAI's `logit_bias`, `frequency_penalty`, `presence_penalty`.
    pub adjust: crate::sampler::LogitAdjust,
    /// Structured output: every choice's tokens follow this grammar (each
    /// choice its own matcher), and a stop token comes only where the
    /// grammar is complete.
    pub grammar: Option<crate::constrain::Grammar>,
}

/// The log-probabilities of one generated token.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub logprob: f32,
    /// (token, log-probability), most likely first.
    pub top: Vec<(u32, f32)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token.
    Stop,
    /// max_tokens or the context length.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// What the engine sends back for a request, per choice `index`.
#[derive(Clone, Debug)]
pub enum Event {
    Token {
        index: usize,
        token: u32,
        logprobs: Option<TokenLogprobs>,
    },
    /// The choice ended; `completion_tokens` counts the stop token too;
    /// `cached_tokens`: prompt tokens its first admission took from the
    /// prefix cache.
    Finished {
        index: usize,
        reason: FinishReason,
        completion_tokens: usize,
        cached_tokens: usize,
    },
    /// The choice failed (or the server shuts down); no more events for it.
    Error { index: usize, message: String },
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the request queue is full ({0} waiting)")]
    QueueFull(usize),
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("the engine has stopped")]
    Stopped,
}

/// A submitted request: its events, and a way to end single choices early
/// (a stop string matched). Dropping it cancels every choice; the engine
/// frees their KV blocks at its next step.
pub struct RequestHandle {
    pub events: mpsc::UnboundedReceiver<Event>,
    /// The cancel flags of each submitted request, in choice order (one
    /// part, or one per request of a [`RequestHandle::merge`]).
    cancel: Vec<Arc<Vec<AtomicBool>>>,
}

impl RequestHandle {
    /// Ends choice `index` (its blocks are freed at the next step).
    pub fn cancel(&self, mut index: usize) {
        for part in &self.cancel {
            if index < part.len() {
                part[index].store(true, Ordering::Relaxed);
                return;
            }
            index -= part.len();
        }
    }

    /// One handle over several requests (a completion with a list of
    /// prompts): choice `j` of request `p` becomes choice `p * n + j`,
    /// where `n` is each request's choice count. Events keep their order
    /// within a request. Dropping the merged handle drops the requests'
    /// (their choices are cancelled). Needs a tokio runtime.
    pub fn merge(handles: Vec<RequestHandle>, n: usize) -> RequestHandle {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut cancel = Vec::with_capacity(handles.len());
        for (p, h) in handles.into_iter().enumerate() {
            cancel.extend(h.cancel);
            let mut events = h.events;
            let tx = tx.clone();
            let offset = p * n;
            tokio::spawn(async move {
                loop {
                    let ev = tokio::select! {
                        ev = events.recv() => ev,
                        _ = tx.closed() => None,
                    };
                    let Some(ev) = ev else { break };
                    let ev = match ev {
                        Event::Token {
                            index,
                            token,
                            logprobs,
                        } => Event::Token {
                            index: index + offset,
                            token,
                            logprobs,
                        },
                        Event::Finished {
                            index,
                            reason,
                            completion_tokens,
                            cached_tokens,
                        } => Event::Finished {
                            index: index + offset,
                            reason,
                            completion_tokens,
                            cached_tokens,
                        },
                        Event::Error { index, message } => Event::Error {
                            index: index + offset,
                            message,
                        },
                    };
                    if tx.send(ev).is_err() {
                        break;
                    }
                }
            });
        }
        RequestHandle { events: rx, cancel }
    }
}

pub(crate) enum Msg {
    Submit(Box<Submission>),
    /// Embed inputs between two steps (`EngineHandle::embed`).
    Embed(Box<EmbedJob>),
    /// Cancel every live sequence (shutdown deadline passed).
    CancelAll,
}

/// The result of an embedding job: a vector per input, or why not.
pub type EmbedResult = Result<Vec<Vec<f32>>, String>;

pub(crate) struct EmbedJob {
    inputs: Vec<Vec<u32>>,
    pooling: crate::runner::Pooling,
    reply: tokio::sync::oneshot::Sender<EmbedResult>,
}

pub(crate) struct Submission {
    req: GenRequest,
    tx: mpsc::UnboundedSender<Event>,
    cancel: Arc<Vec<AtomicBool>>,
    arrival: Instant,
}

/// Limits the server checks before submitting.
#[derive(Clone, Copy, Debug)]
pub struct EngineLimits {
    pub context_length: usize,
    /// KV capacity in tokens (the pool, null block excluded).
    pub kv_tokens: usize,
    pub vocab_size: usize,
}

/// Cloneable handle to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: std::sync::mpsc::Sender<Msg>,
    /// Sequences submitted and not yet admitted (the engine decrements).
    queued: Arc<AtomicUsize>,
    max_queue: usize,
    pub metrics: Arc<Metrics>,
    pub limits: EngineLimits,
}

impl EngineHandle {
    /// Queues an embedding job (`inputs`: token ids, each non-empty and
    /// within the vocabulary): the engine runs it between two steps with
    /// KV blocks of its cache and answers on the returned channel.
    pub fn embed(
        &self,
        inputs: Vec<Vec<u32>>,
        pooling: crate::runner::Pooling,
    ) -> Result<tokio::sync::oneshot::Receiver<EmbedResult>, SubmitError> {
        for (i, inp) in inputs.iter().enumerate() {
            if inp.is_empty() {
                return Err(SubmitError::Invalid(format!("input {i} is empty")));
            }
            if let Some(&t) = inp.iter().find(|&&t| t as usize >= self.limits.vocab_size) {
                return Err(SubmitError::Invalid(format!(
                    "input {i}: token id {t} is outside the vocabulary of {}",
                    self.limits.vocab_size
                )));
            }
        }
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.tx
            .send(Msg::Embed(Box::new(EmbedJob {
                inputs,
                pooling,
                reply,
            })))
            .map_err(|_| SubmitError::Stopped)?;
        Ok(rx)
    }

    /// Queues a request. Refuses it when its `n` sequences would overflow
    /// the queue, so the caller can answer 429 at once.
    pub fn submit(&self, req: GenRequest) -> Result<RequestHandle, SubmitError> {
        let n = req.n;
        if n == 0 {
            return Err(SubmitError::Invalid("n must be at least 1".into()));
        }
        if req.prompt.is_empty() {
            return Err(SubmitError::Invalid("the prompt is empty".into()));
        }
        if let Some(&t) = req
            .prompt
            .iter()
            .find(|&&t| t as usize >= self.limits.vocab_size)
        {
            return Err(SubmitError::Invalid(format!(
                "token id {t} is outside the vocabulary of {}",
                self.limits.vocab_size
            )));
        }
        let max_q = self.max_queue;
        if self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q + n <= max_q).then_some(q + n)
            })
            .is_err()
        {
            self.metrics.update(|s| s.requests_rejected_queue_full += 1);
            return Err(SubmitError::QueueFull(self.queued.load(Ordering::Acquire)));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel: Arc<Vec<AtomicBool>> =
            Arc::new((0..n).map(|_| AtomicBool::new(false)).collect());
        let sub = Submission {
            req,
            tx,
            cancel: cancel.clone(),
            arrival: Instant::now(),
        };
        if self.tx.send(Msg::Submit(Box::new(sub))).is_err() {
            self.queued.fetch_sub(n, Ordering::AcqRel);
            return Err(SubmitError::Stopped);
        }
        Ok(RequestHandle {
            events: rx,
            cancel: vec![cancel],
        })
    }

    /// Most sequences that may wait for admission (`EngineConfig::max_queue`):
    /// a request of more choices than this can never be queued.
    pub fn max_queue(&self) -> usize {
        self.max_queue
    }

    /// Sequences waiting for admission.
    pub fn queue_depth(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// Asks the engine to cancel every live sequence (shutdown deadline).
    pub fn cancel_all(&self) {
        let _ = self.tx.send(Msg::CancelAll);
    }
}
