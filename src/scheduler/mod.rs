//! Decode-first continuous batching scheduler (pure: no device, no model).
//!
//! A request is its tokens (prompt, then sampled tokens) and a counter of
//! computed tokens that catches up with the token count; there are no
//! separate prefill/decode phases. A running request with exactly one pending
//! token is a *decode*. Each step:
//!
//! 1. every running decode is scheduled first (oldest first); when the KV
//!    pool is out of blocks the newest running request is preempted: its
//!    blocks are freed and it goes to the front of the waiting queue, to be
//!    recomputed (prefix-cache hits make that cheap);
//! 2. prefill chunks (running requests still catching up, then waiting
//!    requests in FIFO order) fill the prefill budget: by default the dynamic
//!    `max(n_ubatch, T - D)` (T = max batch tokens, D = scheduled decodes), or
//!    a static budget; optionally each request's chunk is capped at
//!    `max(n_ubatch, min(T, ceil(0.04 * n_ctx)))` tokens. A running chunk
//!    short of blocks preempts the newest running request if it is newer
//!    (older requests keep priority for memory, even over a planned decode,
//!    which is then withdrawn); otherwise the chunk shrinks to what fits.
//!    Waiting requests are admitted only if the step preempted nobody, and
//!    the first one that does not fit stops admission (FIFO).
//!
//! With `D + prefill <= T`, the dynamic budget is plain chunked prefill with
//! a T-token batch.

mod core;

pub use self::core::{Scheduler, StateSave};

use crate::kv::{BlockCopy, SeqId};

/// How many prompt tokens a step may compute besides its decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrefillBudget {
    /// `max(n_ubatch, T - D)`: decodes never starve prefill below a ubatch.
    #[default]
    Dynamic,
    /// A fixed number of prefill tokens per step, whatever D is.
    Static(usize),
}

/// Per-request cap on the prefill chunk of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrefillCap {
    #[default]
    Off,
    /// `max(n_ubatch, min(T, ceil(0.04 * n_ctx)))`.
    Auto,
    /// A fixed number of tokens (at least 1).
    Tokens(usize),
}

/// Scheduler limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// T: the batch token budget.
    pub max_batch_tokens: usize,
    /// Micro-batch size: the least prefill budget a step gets.
    pub n_ubatch: usize,
    /// Context length: positions run in `0..n_ctx`.
    pub n_ctx: usize,
    /// Most requests running at once.
    pub max_running: usize,
    pub budget: PrefillBudget,
    pub cap: PrefillCap,
    /// Register full blocks in the prefix cache so later requests with the
    /// same prefix skip their prefill (on by default).
    pub prefix_caching: bool,
    /// Hybrid models (a sequence resumes only with its recurrent state):
    /// prefix hits come from state snapshots alone. None: attention only.
    pub state_snapshots: Option<StateSnapshots>,
    /// Every attention layer sees only the last `w` positions: after each
    /// step a sequence's blocks before its next query's window go back to
    /// the pool (`KvManager::release_before`). None: keep every block.
    pub sliding_window: Option<usize>,
}

/// State snapshots of a hybrid model: `capacity` snapshot slots (0: no
/// prefix hits), taken where a step of a sequence ends on a multiple of
/// `stride` tokens (a multiple of the block size). With snapshots on,
/// prefill chunks end at those multiples so that every one is captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateSnapshots {
    pub capacity: usize,
    pub stride: usize,
}

impl SchedulerConfig {
    /// Dynamic budget, no cap, 256 running requests at most.
    pub fn new(max_batch_tokens: usize, n_ubatch: usize, n_ctx: usize) -> Self {
        SchedulerConfig {
            max_batch_tokens,
            n_ubatch,
            n_ctx,
            max_running: 256,
            budget: PrefillBudget::Dynamic,
            cap: PrefillCap::Off,
            prefix_caching: true,
            state_snapshots: None,
            sliding_window: None,
        }
    }

    /// Prefill tokens allowed in a step with `n_decodes` scheduled decodes.
    pub fn prefill_budget(&self, n_decodes: usize) -> usize {
        match self.budget {
            PrefillBudget::Dynamic => self
                .n_ubatch
                .max(self.max_batch_tokens.saturating_sub(n_decodes)),
            PrefillBudget::Static(n) => n,
        }
    }

    /// Most tokens one request may prefill in a step.
    pub fn prefill_cap(&self) -> usize {
        match self.cap {
            PrefillCap::Off => usize::MAX,
            PrefillCap::Auto => {
                // ceil(0.04 * n_ctx) = ceil(n_ctx / 25), in integers.
                let pct = self.n_ctx.div_ceil(25);
                self.n_ubatch.max(self.max_batch_tokens.min(pct))
            }
            PrefillCap::Tokens(n) => n,
        }
    }

    fn validate(&self) -> anyhow::Result<()> {
        let ok = self.max_batch_tokens > 0
            && self.n_ubatch > 0
            && self.n_ctx > 0
            && self.max_running > 0
            && self.budget != PrefillBudget::Static(0)
            && self.cap != PrefillCap::Tokens(0)
            && self.state_snapshots.is_none_or(|s| s.stride > 0);
        anyhow::ensure!(ok, "invalid scheduler config (zero limit): {self:?}");
        Ok(())
    }
}

/// One request's work in a step: compute tokens at positions
/// `start..start + tokens.len()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledSeq {
    pub seq: SeqId,
    /// First position computed this step.
    pub start: usize,
    /// Token ids at positions `start..`.
    pub tokens: Vec<u32>,
    /// The step reaches the request's last token: sample from its logits.
    pub sample: bool,
    /// Block copies to execute before this step (copy on write).
    pub copies: Vec<BlockCopy>,
    /// Hybrid models: the state snapshot to restore into the sequence's
    /// state slot before this step (a prefix-cache hit resumes there).
    pub restore: Option<u32>,
}

impl ScheduledSeq {
    /// Number of tokens computed this step.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
    /// `start..start + len`.
    pub fn positions(&self) -> std::ops::Range<usize> {
        self.start..self.start + self.tokens.len()
    }
}

/// What one step computes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepPlan {
    /// Decodes first (oldest first), then prefill chunks.
    pub seqs: Vec<ScheduledSeq>,
    /// Decodes scheduled (the D of the dynamic budget).
    pub n_decodes: usize,
    /// Prefill tokens scheduled.
    pub n_prefill_tokens: usize,
    /// Requests preempted this step, in preemption order (newest first).
    pub preempted: Vec<SeqId>,
    /// Requests that can never be scheduled again: their next position would
    /// reach `n_ctx`, or their tokens outgrew the whole KV pool. The engine
    /// should finish them.
    pub must_finish: Vec<SeqId>,
}

impl StepPlan {
    /// Total tokens computed this step.
    pub fn n_tokens(&self) -> usize {
        self.seqs.iter().map(ScheduledSeq::len).sum()
    }
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }
}
