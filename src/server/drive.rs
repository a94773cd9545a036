//! Turns a request's engine events into text deltas per choice: streaming
//! detokenization, stop strings (held back, never partially emitted),
//! log-probabilities, finish reasons.

use super::error::ApiError;
use super::text::{LpEntry, StopText};
use crate::serve::{Event, RequestHandle, TokenLogprobs};
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// An output of the driver, in order.
#[derive(Debug)]
pub enum Out {
    Delta {
        index: usize,
        text: String,
        logprobs: Vec<LpEntry>,
    },
    Finish {
        index: usize,
        reason: &'static str,
    },
}

impl Out {
    /// The choice this output is for.
    pub fn index(&self) -> usize {
        match self {
            Out::Delta { index, .. } | Out::Finish { index, .. } => *index,
        }
    }
}

/// Per choice, at the end.
#[derive(Debug, Clone, Default)]
pub struct ChoiceSummary {
    pub completion_tokens: usize,
    pub finish_reason: &'static str,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

/// How a drive ended.
pub enum Ended {
    /// Every choice finished.
    Done(Vec<ChoiceSummary>),
    /// The sink refused an output (the client went away).
    Gone,
}

fn token_text(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.piece_bytes(id, false).unwrap_or_default();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

fn lp_entry(tok: &Tokenizer, id: u32, lp: &TokenLogprobs, offset: usize) -> LpEntry {
    let (token, bytes) = token_text(tok, id);
    LpEntry {
        token,
        bytes,
        logprob: lp.logprob,
        top: lp
            .top
            .iter()
            .map(|&(t, l)| {
                let (s, b) = token_text(tok, t);
                (s, b, l)
            })
            .collect(),
        offset,
    }
}

/// Runs until every choice of `handle` ended. `sink` gets each output and
/// returns false when the client is gone (then the drive stops and
/// dropping `handle` cancels the rest in the engine).
pub async fn drive(
    tok: &Tokenizer,
    mut handle: RequestHandle,
    n: usize,
    stops: &[String],
    sink: &mut (dyn FnMut(Out) -> bool + Send),
) -> Result<Ended, ApiError> {
    let mut decs: Vec<StreamDecoder<'_>> = (0..n).map(|_| StreamDecoder::new(tok, true)).collect();
    let mut texts: Vec<StopText> = (0..n).map(|_| StopText::new(stops.to_vec())).collect();
    let mut sums = vec![ChoiceSummary::default(); n];
    let mut done = vec![false; n];
    let mut live = n;
    while live > 0 {
        let Some(ev) = handle.events.recv().await else {
            return Err(ApiError::unavailable(
                "the engine stopped before the request finished",
            ));
        };
        match ev {
            Event::Token {
                index,
                token,
                logprobs,
            } => {
                if index >= n || done[index] {
                    continue;
                }
                sums[index].completion_tokens += 1;
                let piece = decs[index]
                    .push(token)
                    .map_err(|e| ApiError::internal(format!("detokenizing: {e:#}")))?
                    .unwrap_or_default();
                let lp = logprobs
                    .as_ref()
                    .map(|l| lp_entry(tok, token, l, texts[index].len()));
                let r = texts[index].push(&piece, lp);
                if (!r.text.is_empty() || !r.logprobs.is_empty())
                    && !sink(Out::Delta {
                        index,
                        text: r.text,
                        logprobs: r.logprobs,
                    })
                {
                    return Ok(Ended::Gone);
                }
                if r.stopped {
                    handle.cancel(index);
                    done[index] = true;
                    live -= 1;
                    sums[index].finish_reason = "stop";
                    if !sink(Out::Finish {
                        index,
                        reason: "stop",
                    }) {
                        return Ok(Ended::Gone);
                    }
                }
            }
            Event::Finished {
                index,
                reason,
                completion_tokens,
                cached_tokens,
            } => {
                if index >= n || done[index] {
                    continue;
                }
                done[index] = true;
                live -= 1;
                sums[index].completion_tokens = completion_tokens;
                sums[index].cached_tokens = cached_tokens;
                let rest = decs[index].finish();
                let r = texts[index].finish(rest.as_deref());
                // A stop string can still match in the flushed tail.
                let reason = if r.stopped { "stop" } else { reason.as_str() };
                sums[index].finish_reason = reason;
                if (!r.text.is_empty() || !r.logprobs.is_empty())
                    && !sink(Out::Delta {
                        index,
                        text: r.text,
                        logprobs: r.logprobs,
                    })
                {
                    return Ok(Ended::Gone);
                }
                if !sink(Out::Finish { index, reason }) {
                    return Ok(Ended::Gone);
                }
            }
            Event::Error { message, .. } => {
                return Err(ApiError::internal(message));
            }
        }
    }
    Ok(Ended::Done(sums))
}
