//! The model's vocabulary as llguidance's token trie: each token's bytes,
//! control tokens marked as special so that grammar text never produces
//! them (a grammar names them as `<[id]>` or `<name>`).

use anyhow::{Context, Result};
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use std::sync::Arc;

use crate::tokenizer::{TokenType, Tokenizer};

/// The trie's marker of special tokens (toktrie's convention).
const SPECIAL: u8 = TokTrie::SPECIAL_TOKEN_MARKER;

/// The bytes of every token, in id order: ordinary tokens decode to their
/// text; control and unknown tokens to the special marker and their name;
/// unused tokens to nothing (the trie never offers an empty token).
pub fn token_bytes(tok: &Tokenizer) -> Result<Vec<Vec<u8>>> {
    (0..tok.vocab_size() as u32)
        .map(|id| {
            Ok(match tok.token_type(id) {
                Some(TokenType::Control | TokenType::Unknown) => {
                    let mut b = vec![SPECIAL];
                    b.extend_from_slice(tok.token_text(id).unwrap_or("").as_bytes());
                    b
                }
                Some(TokenType::Unused) => Vec::new(),
                _ => tok
                    .piece_bytes(id, false)
                    .with_context(|| format!("the bytes of token {id}"))?,
            })
        })
        .collect()
}

/// The tokenizer environment llguidance compiles against. Tokenizing text
/// back into ids (only used for forced tokens, which the engine does not
/// take) is the trie's greedy approximation.
pub fn tok_env(tok: &Tokenizer) -> Result<TokEnv> {
    let words = token_bytes(tok)?;
    let eos = tok
        .eos_id()
        .or_else(|| tok.stop_ids().first().copied())
        .context("the model names no end-of-sequence token: constrained output cannot end")?;
    let end_of_turn = tok.stop_ids().iter().copied().find(|&t| t != eos);
    let info = TokRxInfo {
        vocab_size: words.len() as u32,
        tok_eos: eos,
        tok_bos: tok.bos_id(),
        tok_pad: None,
        tok_unk: None,
        tok_end_of_turn: end_of_turn,
    };
    Ok(Arc::new(ApproximateTokEnv::new(TokTrie::from(
        &info, &words,
    ))))
}
