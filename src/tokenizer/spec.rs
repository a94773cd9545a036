//! `TokenizerSpec`: everything the tokenizer needs from GGUF metadata, as
//! plain data, so a tokenizer can also be built by hand (tests, synthetic
//! vocabularies) without a GGUF file.

use anyhow::{bail, Result};

/// GGUF `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenType {
    Undefined,
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    /// Maps the raw GGUF value; out-of-range values are treated as
    /// `Undefined` (llama.cpp does the same: only known bits matter).
    pub fn from_i32(v: i32) -> TokenType {
        match v {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }
}

/// The tokenizer algorithm family (`tokenizer.ggml.model`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerModel {
    /// GPT-2 style byte-level BPE with merges (`gpt2`).
    Gpt2,
    /// SentencePiece-style BPE over scored tokens with byte fallback (`llama`).
    Llama,
}

impl TokenizerModel {
    /// Parses `tokenizer.ggml.model`; any other value is an error naming it.
    pub fn parse(name: &str) -> Result<TokenizerModel> {
        match name {
            "gpt2" => Ok(TokenizerModel::Gpt2),
            "llama" => Ok(TokenizerModel::Llama),
            other => bail!(
                "unsupported tokenizer model `{other}` (tokenizer.ggml.model); \
                 supported: gpt2, llama"
            ),
        }
    }
}

/// Tokenizer description as stored in GGUF metadata (`tokenizer.*` keys).
#[derive(Clone, Debug)]
pub struct TokenizerSpec {
    /// `tokenizer.ggml.model`: "gpt2" or "llama" (validated by `Tokenizer::new`).
    pub model: String,
    /// `tokenizer.ggml.pre`: pre-tokenizer family name (BPE only).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, indexed by token id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type` (raw values); empty means all normal.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges` ("left right"), in rank order (BPE only).
    pub merges: Vec<String>,
    /// `tokenizer.ggml.scores` (SentencePiece only); empty means all zero.
    pub scores: Vec<f32>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`, if present (added to the stop ids).
    pub eot_id: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    /// Prefix the first text (and text after a special token) with a space
    /// (SentencePiece only).
    pub add_space_prefix: bool,
    /// `tokenizer.chat_template` (Jinja).
    pub chat_template: Option<String>,
}

impl TokenizerSpec {
    /// A spec with llama.cpp's defaults for the given model family:
    /// SentencePiece adds BOS and a space prefix; GPT-2 BPE adds neither.
    pub fn new(model: &str, tokens: Vec<String>) -> TokenizerSpec {
        let spm = model == "llama";
        TokenizerSpec {
            model: model.to_string(),
            pre: None,
            tokens,
            token_types: Vec::new(),
            merges: Vec::new(),
            scores: Vec::new(),
            bos_id: None,
            eos_id: None,
            unk_id: None,
            pad_id: None,
            eot_id: None,
            add_bos: spm,
            add_eos: false,
            add_space_prefix: spm,
            chat_template: None,
        }
    }

    /// Token type of `id` (normal when the file has no type table).
    pub fn token_type(&self, id: usize) -> TokenType {
        self.token_types
            .get(id)
            .map(|&t| TokenType::from_i32(t))
            .unwrap_or(TokenType::Normal)
    }
}
