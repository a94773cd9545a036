//! Streaming detokenizer: turns token ids into text as they are generated,
//! yielding only complete UTF-8 (a multi-byte character split across byte
//! tokens is held back until its last byte arrives).

use super::Tokenizer;
use anyhow::Result;

pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    skip_special: bool,
    /// Bytes not yet emitted: at most an incomplete UTF-8 sequence tail.
    pending: Vec<u8>,
    /// Nothing emitted yet (for the SentencePiece leading-space strip).
    at_start: bool,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tok: &'a Tokenizer, skip_special: bool) -> StreamDecoder<'a> {
        StreamDecoder {
            tok,
            skip_special,
            pending: Vec::new(),
            at_start: true,
        }
    }

    /// Adds one token; returns the text it completes, if any. Invalid byte
    /// sequences are emitted as U+FFFD rather than held forever.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        let bytes = self.tok.piece_bytes(id, self.skip_special)?;
        if bytes.is_empty() {
            return Ok(None);
        }
        let mut bytes = &bytes[..];
        if self.at_start && self.pending.is_empty() {
            self.at_start = false;
            if self.tok.strips_leading_space() && bytes.first() == Some(&b' ') {
                bytes = &bytes[1..];
            }
        }
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // Bytes before `valid_up_to` are valid UTF-8: this is lossless.
                    out.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match e.error_len() {
                        // Incomplete tail: keep it for the next token.
                        None => {
                            self.pending.drain(..valid);
                            break;
                        }
                        // Invalid bytes: replace and continue after them.
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
        Ok(if out.is_empty() { None } else { Some(out) })
    }

    /// Flushes what is left (an incomplete sequence becomes U+FFFD).
    pub fn finish(&mut self) -> Option<String> {
        if self.pending.is_empty() {
            return None;
        }
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        Some(s)
    }
}
