//! SentencePiece-style BPE over scored tokens (`tokenizer.ggml.model =
//! llama`), with `<0xNN>` byte fallback, as llama.cpp's SPM tokenizer does.
//!
//! Algorithm: start from one symbol per UTF-8 character; repeatedly merge
//! the adjacent pair whose concatenation is a vocab token with the highest
//! score (ties: leftmost pair first); finally emit each symbol's token, or
//! its bytes as byte tokens when the symbol (a lone character) is not in
//! the vocab.

use anyhow::{bail, Result};
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

pub struct SpmModel {
    /// score per token id (0.0 where the file has none).
    scores: Vec<f32>,
    /// id of `<0xNN>` for each byte, when present.
    byte_tokens: [Option<u32>; 256],
    unk_id: Option<u32>,
}

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    /// byte length of the merged text, to detect stale entries.
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Bigram {
    // Max-heap: higher score first, then the leftmost pair.
    fn cmp(&self, o: &Self) -> Ordering {
        self.score
            .total_cmp(&o.score)
            .then_with(|| o.left.cmp(&self.left))
    }
}

impl SpmModel {
    pub fn new(tokens: &[String], scores: &[f32], unk_id: Option<u32>) -> Result<SpmModel> {
        if !scores.is_empty() && scores.len() != tokens.len() {
            bail!(
                "tokenizer.ggml.scores has {} entries but tokenizer.ggml.tokens has {}",
                scores.len(),
                tokens.len()
            );
        }
        let mut byte_tokens = [None; 256];
        for (id, t) in tokens.iter().enumerate() {
            if let Some(b) = parse_byte_token(t) {
                byte_tokens[b as usize].get_or_insert(id as u32);
            }
        }
        let scores = if scores.is_empty() {
            vec![0.0; tokens.len()]
        } else {
            scores.to_vec()
        };
        Ok(SpmModel {
            scores,
            byte_tokens,
            unk_id,
        })
    }

    /// Tokenizes `text` (spaces already replaced by `▁`), appending ids.
    pub fn tokenize(
        &self,
        text: &str,
        vocab: &HashMap<String, u32>,
        out: &mut Vec<u32>,
    ) -> Result<()> {
        let mut syms: Vec<Symbol> = Vec::new();
        for (i, (start, c)) in text.char_indices().enumerate() {
            syms.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: None,
            });
            if i > 0 {
                syms[i - 1].next = Some(i);
            }
        }
        let mut heap = BinaryHeap::new();
        let try_add = |heap: &mut BinaryHeap<Bigram>, syms: &[Symbol], l: usize, r: usize| {
            let (a, b) = (syms[l], syms[r]);
            let s = &text[a.start..b.start + b.len];
            if let Some(&id) = vocab.get(s) {
                heap.push(Bigram {
                    left: l,
                    right: r,
                    score: self.scores.get(id as usize).copied().unwrap_or(0.0),
                    len: s.len(),
                });
            }
        };
        for i in 1..syms.len() {
            try_add(&mut heap, &syms, i - 1, i);
        }
        while let Some(bg) = heap.pop() {
            let (l, r) = (syms[bg.left], syms[bg.right]);
            // Stale: one side was merged away or grew since this was queued.
            if l.len == 0 || r.len == 0 || l.len + r.len != bg.len || l.next != Some(bg.right) {
                continue;
            }
            syms[bg.left].len += r.len;
            syms[bg.left].next = r.next;
            syms[bg.right].len = 0;
            if let Some(n) = r.next {
                syms[n].prev = Some(bg.left);
            }
            if let Some(p) = syms[bg.left].prev {
                try_add(&mut heap, &syms, p, bg.left);
            }
            if let Some(n) = syms[bg.left].next {
                try_add(&mut heap, &syms, bg.left, n);
            }
        }
        let mut cur = if syms.is_empty() { None } else { Some(0) };
        while let Some(i) = cur {
            let s = syms[i];
            let piece = &text[s.start..s.start + s.len];
            if let Some(&id) = vocab.get(piece) {
                out.push(id);
            } else {
                for &b in piece.as_bytes() {
                    match (self.byte_tokens[b as usize], self.unk_id) {
                        (Some(id), _) | (None, Some(id)) => out.push(id),
                        (None, None) => bail!(
                            "SentencePiece: no token for {piece:?} and neither a byte \
                             token <0x{b:02X}> nor an unknown token in the vocab"
                        ),
                    }
                }
            }
            cur = s.next;
        }
        Ok(())
    }
}

/// Parses `<0xNN>` byte-fallback token text.
pub fn parse_byte_token(t: &str) -> Option<u8> {
    let hex = t.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}
