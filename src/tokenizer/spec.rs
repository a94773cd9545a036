//! `TokenizerSpec`: everything the tokenizer needs from GGUF metadata, as
//! plain data, so a tokenizer can also be built by hand (tests, synthetic
//! vocabularies) without a GGUF file.

use crate::gguf::GgufFile;
use anyhow::{bail, Context, Result};

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
    /// The largest raw value with a meaning (`Byte`).
    pub const MAX_RAW: i32 = 6;

    /// Maps the raw GGUF value; out-of-range values are treated as
    /// `Undefined` (a spec read from GGUF has none: `from_gguf` rejects
    /// them).
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

    /// Reads the `tokenizer.*` keys. Required: `tokenizer.ggml.model` and
    /// `tokenizer.ggml.tokens` (plus `tokenizer.ggml.merges` for gpt2);
    /// absent flags take llama.cpp's defaults for the model family. Errors
    /// name the key and the file.
    pub fn from_gguf(f: &GgufFile) -> Result<TokenizerSpec> {
        let file = f.path().display().to_string();
        let ctx = |key: &str| format!("{file}: reading {key}");
        let model = f
            .get_str("tokenizer.ggml.model")
            .with_context(|| ctx("tokenizer.ggml.model"))?;
        let kind = TokenizerModel::parse(model).with_context(|| f.path().display().to_string())?;
        let tokens: Vec<String> = f
            .get_str_array("tokenizer.ggml.tokens")
            .with_context(|| ctx("tokenizer.ggml.tokens"))?
            .into_iter()
            .map(str::to_owned)
            .collect();
        let mut spec = TokenizerSpec::new(model, tokens);
        spec.pre = f
            .opt_str("tokenizer.ggml.pre")
            .with_context(|| ctx("tokenizer.ggml.pre"))?
            .map(str::to_owned);
        if f.get("tokenizer.ggml.token_type").is_some() {
            spec.token_types = f
                .get_i32_array("tokenizer.ggml.token_type")
                .with_context(|| ctx("tokenizer.ggml.token_type"))?;
            check_token_types(&spec.token_types, spec.tokens.len())
                .with_context(|| file.clone())?;
        }
        if kind == TokenizerModel::Gpt2 {
            spec.merges = f
                .get_str_array("tokenizer.ggml.merges")
                .with_context(|| ctx("tokenizer.ggml.merges"))?
                .into_iter()
                .map(str::to_owned)
                .collect();
            // Without merges byte-level BPE never joins two bytes: every
            // prompt would become one token per byte, silently.
            if spec.merges.is_empty() {
                bail!(
                    "{file}: tokenizer.ggml.merges is empty: a gpt2 (byte-level BPE) \
                     tokenizer needs its merge list"
                );
            }
        }
        if f.get("tokenizer.ggml.scores").is_some() {
            spec.scores = f
                .get_f32_array("tokenizer.ggml.scores")
                .with_context(|| ctx("tokenizer.ggml.scores"))?;
            if spec.scores.len() != spec.tokens.len() {
                bail!(
                    "{file}: tokenizer.ggml.scores has {} entries but tokenizer.ggml.tokens has {}",
                    spec.scores.len(),
                    spec.tokens.len()
                );
            }
            if let Some(i) = spec.scores.iter().position(|s| s.is_nan()) {
                bail!("{file}: tokenizer.ggml.scores[{i}] is NaN: expected a number (the token's merge score)");
            }
        }
        spec.bos_id = f
            .opt_u32("tokenizer.ggml.bos_token_id")
            .with_context(|| ctx("tokenizer.ggml.bos_token_id"))?;
        spec.eos_id = f
            .opt_u32("tokenizer.ggml.eos_token_id")
            .with_context(|| ctx("tokenizer.ggml.eos_token_id"))?;
        spec.unk_id = f
            .opt_u32("tokenizer.ggml.unknown_token_id")
            .with_context(|| ctx("tokenizer.ggml.unknown_token_id"))?;
        spec.pad_id = f
            .opt_u32("tokenizer.ggml.padding_token_id")
            .with_context(|| ctx("tokenizer.ggml.padding_token_id"))?;
        spec.eot_id = f
            .opt_u32("tokenizer.ggml.eot_token_id")
            .with_context(|| ctx("tokenizer.ggml.eot_token_id"))?;
        if let Some(v) = f
            .opt_bool("tokenizer.ggml.add_bos_token")
            .with_context(|| ctx("tokenizer.ggml.add_bos_token"))?
        {
            spec.add_bos = v;
        }
        if let Some(v) = f
            .opt_bool("tokenizer.ggml.add_eos_token")
            .with_context(|| ctx("tokenizer.ggml.add_eos_token"))?
        {
            spec.add_eos = v;
        }
        if let Some(v) = f
            .opt_bool("tokenizer.ggml.add_space_prefix")
            .with_context(|| ctx("tokenizer.ggml.add_space_prefix"))?
        {
            spec.add_space_prefix = v;
        }
        spec.chat_template = f
            .opt_str("tokenizer.chat_template")
            .with_context(|| ctx("tokenizer.chat_template"))?
            .map(str::to_owned);
        Ok(spec)
    }

    /// Token type of `id` (normal when the file has no type table).
    pub fn token_type(&self, id: usize) -> TokenType {
        self.token_types
            .get(id)
            .map(|&t| TokenType::from_i32(t))
            .unwrap_or(TokenType::Normal)
    }
}

/// `tokenizer.ggml.token_type` must give one known type per token.
fn check_token_types(types: &[i32], n_tokens: usize) -> Result<()> {
    if types.len() != n_tokens {
        bail!(
            "tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {n_tokens}: \
             expected one type per token",
            types.len()
        );
    }
    if let Some((i, v)) = types
        .iter()
        .enumerate()
        .find(|(_, &v)| !(0..=TokenType::MAX_RAW).contains(&v))
    {
        bail!(
            "tokenizer.ggml.token_type[{i}] is {v}: expected 0 to {} (undefined, normal, \
             unknown, control, user-defined, unused, byte)",
            TokenType::MAX_RAW
        );
    }
    Ok(())
}
