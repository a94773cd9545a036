//! Generated text with stop strings: text is released only when it cannot
//! be the start of a stop string, so a client never sees a partial (or
//! whole) stop string.
//!
//! Invariant: no stop string occurs in `text[..sent]`, and no stop string
//! starts in `text[..sent]` (the held-back tail is the longest suffix that is
//! a proper prefix of a stop string). So a new match can only start at or
//! after `sent`, and searching `text[sent..]` after each piece is complete.

use std::collections::VecDeque;

/// Log-probabilities of one token, with its text.
#[derive(Clone, Debug, PartialEq)]
pub struct LpEntry {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
    /// (token text, bytes, log-probability), most likely first.
    pub top: Vec<(String, Vec<u8>, f32)>,
    /// Byte offset of the token's text in the completion.
    pub offset: usize,
}

/// What a push released.
#[derive(Debug, Default)]
pub struct Released {
    pub text: String,
    pub logprobs: Vec<LpEntry>,
    /// A stop string matched: the choice is over (its text ends before it).
    pub stopped: bool,
}

pub struct StopText {
    stops: Vec<String>,
    /// Every piece so far (cut at a stop string match once stopped).
    text: String,
    /// Bytes of `text` released.
    sent: usize,
    /// Log-probabilities not yet released, with the end offset of their text.
    pending: VecDeque<(usize, LpEntry)>,
    stopped: bool,
}

impl StopText {
    pub fn new(stops: Vec<String>) -> Self {
        StopText {
            stops,
            text: String::new(),
            sent: 0,
            pending: VecDeque::new(),
            stopped: false,
        }
    }

    /// The released text.
    pub fn released(&self) -> &str {
        &self.text[..self.sent]
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Byte offset where the next piece will start.
    pub fn len(&self) -> usize {
        self.text.len()
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    /// Adds a token's text (possibly empty: an incomplete UTF-8 sequence)
    /// and its log-probabilities.
    pub fn push(&mut self, piece: &str, lp: Option<LpEntry>) -> Released {
        if self.stopped {
            return Released::default();
        }
        self.text.push_str(piece);
        if let Some(lp) = lp {
            self.pending.push_back((self.text.len(), lp));
        }
        let tail = &self.text[self.sent..];
        let hit = self
            .stops
            .iter()
            .filter_map(|s| tail.find(s.as_str()))
            .min()
            .map(|i| self.sent + i);
        if let Some(h) = hit {
            self.text.truncate(h);
            let mut r = self.release(h);
            r.stopped = true;
            self.stopped = true;
            self.pending.clear();
            return r;
        }
        let hold = self.holdback();
        self.release(self.text.len() - hold)
    }

    /// Releases everything (generation ended without a stop string).
    pub fn finish(&mut self, rest: Option<&str>) -> Released {
        let mut r = match rest {
            Some(p) if !p.is_empty() => self.push(p, None),
            _ => Released::default(),
        };
        if !self.stopped {
            let more = self.release(self.text.len());
            r.text.push_str(&more.text);
            r.logprobs.extend(more.logprobs);
        }
        r
    }

    /// Length of the longest suffix of the unreleased text that is a proper
    /// prefix of some stop string (cut on a char boundary).
    fn holdback(&self) -> usize {
        let tail = &self.text[self.sent..];
        let max = self
            .stops
            .iter()
            .map(|s| s.len().saturating_sub(1))
            .max()
            .unwrap_or(0)
            .min(tail.len());
        for k in (1..=max).rev() {
            let start = tail.len() - k;
            if !tail.is_char_boundary(start) {
                continue;
            }
            let suffix = &tail[start..];
            if self.stops.iter().any(|s| s.starts_with(suffix)) {
                return k;
            }
        }
        0
    }

    fn release(&mut self, upto: usize) -> Released {
        let text = self.text[self.sent..upto].to_string();
        self.sent = upto;
        let mut logprobs = Vec::new();
        while self.pending.front().is_some_and(|(end, _)| *end <= upto) {
            if let Some((_, lp)) = self.pending.pop_front() {
                logprobs.push(lp);
            }
        }
        Released {
            text,
            logprobs,
            stopped: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool, Vec<String>) {
        let mut t = StopText::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        let mut chunks = Vec::new();
        for p in pieces {
            let r = t.push(p, None);
            out.push_str(&r.text);
            chunks.push(r.text);
            if r.stopped {
                return (out, true, chunks);
            }
        }
        let r = t.finish(None);
        out.push_str(&r.text);
        chunks.push(r.text);
        (out, false, chunks)
    }

    #[test]
    fn no_stop_passes_through() {
        let (out, stopped, chunks) = run(&[], &["Hel", "lo"]);
        assert_eq!(out, "Hello");
        assert!(!stopped);
        assert_eq!(chunks[0], "Hel");
    }

    #[test]
    fn stop_split_across_pieces_is_never_emitted() {
        let (out, stopped, chunks) = run(&["END"], &["abc E", "N", "D more"]);
        assert_eq!(out, "abc ");
        assert!(stopped);
        // "E" and "EN" were held back, never released.
        assert!(chunks.iter().all(|c| !c.contains('E')), "{chunks:?}");
    }

    #[test]
    fn false_start_is_released_later() {
        let (out, stopped, chunks) = run(&["END"], &["a E", "x", "y"]);
        assert_eq!(out, "a Exy");
        assert!(!stopped);
        assert_eq!(chunks[0], "a ");
        assert_eq!(chunks[1], "Ex");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        let (out, stopped, _) = run(&["cd", "b"], &["abcd"]);
        assert_eq!(out, "a");
        assert!(stopped);
    }

    #[test]
    fn multibyte_holdback_cuts_on_char_boundary() {
        let (out, stopped, _) = run(&["é!"], &["café", "?"]);
        assert_eq!(out, "café?");
        assert!(!stopped);
        let (out, stopped, _) = run(&["é!"], &["café", "!"]);
        assert_eq!(out, "caf");
        assert!(stopped);
    }

    #[test]
    fn logprobs_follow_released_text() {
        let mut t = StopText::new(vec!["XY".into()]);
        let lp = |s: &str| LpEntry {
            token: s.into(),
            bytes: s.as_bytes().to_vec(),
            logprob: -1.0,
            top: vec![],
            offset: 0,
        };
        let r = t.push("a", Some(lp("a")));
        assert_eq!(r.logprobs.len(), 1);
        let r = t.push("X", Some(lp("X")));
        assert_eq!(r.text, "");
        assert!(r.logprobs.is_empty());
        let r = t.push("Z", Some(lp("Z")));
        assert_eq!(r.text, "XZ");
        assert_eq!(r.logprobs.len(), 2);
    }
}
