//! The engine's view of a request and of each of its choices (the
//! scheduler holds their tokens): shared by the engine loop (engine.rs)
//! and the device-draw masks (masks.rs).

use super::{Event, TokenLogprobs};
use crate::constrain::Constraint;
use crate::sampler::Sampler;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// What a request's sequences share.
pub(super) struct ReqShared {
    pub(super) tx: UnboundedSender<Event>,
    pub(super) cancel: Arc<Vec<AtomicBool>>,
    pub(super) stop_ids: Vec<u32>,
    pub(super) top_logprobs: Option<usize>,
    pub(super) arrival: Instant,
}

/// The engine's side of one choice (the scheduler holds its tokens).
pub(super) struct Seq {
    pub(super) index: usize,
    pub(super) req: Arc<ReqShared>,
    pub(super) prompt_len: usize,
    pub(super) generated: usize,
    /// Generation ends (Length) when the sequence reaches this many tokens.
    pub(super) max_len: usize,
    pub(super) max_tokens: usize,
    pub(super) sampler: Sampler,
    /// The grammar's state, for a structured-output request.
    pub(super) constraint: Option<Constraint>,
    /// Still counted in the handle's queue counter (never scheduled yet).
    pub(super) in_queue_count: bool,
    /// Prompt tokens its first admission took from the prefix cache.
    pub(super) cached_tokens: usize,
    pub(super) last_token_at: Option<Instant>,
}

impl Seq {
    pub(super) fn cancelled(&self) -> bool {
        self.req.tx.is_closed()
            || self
                .req
                .cancel
                .get(self.index)
                .is_some_and(|c| c.load(Ordering::Relaxed))
    }
}

/// A chosen token and, when the request asked, its log-probabilities.
pub(super) type Pick = (u32, Option<TokenLogprobs>);
