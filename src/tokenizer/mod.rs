//! Tokenizer built from GGUF metadata, and chat templates.
//!
//! Two families, as in llama.cpp:
//! - `gpt2`: byte-level BPE with merges; text is split by the pre-tokenizer
//!   regexes of the `tokenizer.ggml.pre` family (see [`pretok`]), then each
//!   piece is run through the HF `tokenizers` BPE model.
//! - `llama`: SentencePiece-style BPE over scored tokens with `<0xNN>` byte
//!   fallback (see [`spm`]).
//!
//! Special tokens (control, user-defined and unknown token types) are cut
//! out of the text before either algorithm runs, longest first, the way
//! llama.cpp partitions text: user-defined tokens are always recognised,
//! control/unknown ones only with `parse_special`.

mod chat;
pub mod content;
pub mod pretok;
pub mod sandbox;
pub mod spec;
pub mod spm;
mod stream;

pub use chat::{
    render as render_chat_template, ChatMessage, CHATML_TEMPLATE, TEMPLATE_FUEL,
    TEMPLATE_OUTPUT_SLACK,
};
pub use content::{ChatPrompt, SpecialsInContent};
pub use spec::{TokenType, TokenizerModel, TokenizerSpec};
pub use stream::StreamDecoder;

use anyhow::{anyhow, bail, Context, Result};
use std::collections::HashMap;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{Model, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

/// Token texts that end a turn in common chat formats; those present in the
/// vocab join EOS in [`Tokenizer::stop_ids`].
const END_OF_TURN_TOKENS: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<end_of_turn>",
    "<|end|>",
];

enum Algo {
    // Boxed: both are large and the variants should stay similar in size.
    Bpe {
        pretok: Box<PreTokenizerWrapper>,
        model: Box<BPE>,
    },
    Spm(Box<spm::SpmModel>),
}

/// A tokenizer for one GGUF model. Immutable and `Sync`: share it freely.
pub struct Tokenizer {
    model: TokenizerModel,
    pre_family: &'static str,
    tokens: Vec<String>,
    types: Vec<TokenType>,
    vocab: HashMap<String, u32>,
    algo: Algo,
    /// (text, id, always) sorted by text length, longest first; `always`
    /// marks user-defined tokens, recognised even without `parse_special`.
    specials: Vec<(String, u32, bool)>,
    /// byte-level char -> byte (gpt2 decoding).
    char_to_byte: HashMap<char, u8>,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    stop_ids: Vec<u32>,
    chat_template: Option<String>,
    /// Set once by a server: chat templates render in worker processes
    /// (see [`sandbox`]).
    sandbox: std::sync::OnceLock<std::sync::Arc<sandbox::RenderSandbox>>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("model", &self.model)
            .field("pre", &self.pre_family)
            .field("vocab_size", &self.tokens.len())
            .field("bos_id", &self.bos_id)
            .field("eos_id", &self.eos_id)
            .finish()
    }
}

fn check_id(name: &str, id: Option<u32>, n: usize) -> Result<()> {
    match id {
        Some(i) if i as usize >= n => {
            bail!("{name} = {i} is out of range for a vocab of {n} tokens")
        }
        _ => Ok(()),
    }
}

impl Tokenizer {
    /// Builds a tokenizer from its spec. Errors name the offending key.
    pub fn new(spec: TokenizerSpec) -> Result<Tokenizer> {
        let model = TokenizerModel::parse(&spec.model)?;
        let n = spec.tokens.len();
        if n == 0 {
            bail!("tokenizer.ggml.tokens is empty");
        }
        if u32::try_from(n).is_err() {
            bail!("tokenizer.ggml.tokens has {n} entries, more than u32 ids can address");
        }
        if !spec.token_types.is_empty() && spec.token_types.len() != n {
            bail!(
                "tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {n}",
                spec.token_types.len()
            );
        }
        check_id("tokenizer.ggml.bos_token_id", spec.bos_id, n)?;
        check_id("tokenizer.ggml.eos_token_id", spec.eos_id, n)?;
        check_id("tokenizer.ggml.unknown_token_id", spec.unk_id, n)?;
        check_id("tokenizer.ggml.padding_token_id", spec.pad_id, n)?;
        check_id("tokenizer.ggml.eot_token_id", spec.eot_id, n)?;
        let types: Vec<TokenType> = (0..n).map(|i| spec.token_type(i)).collect();
        // First occurrence wins for duplicate texts (llama.cpp keeps the
        // last in its map, but duplicates only occur among unused tokens).
        let mut vocab = HashMap::with_capacity(n);
        for (i, t) in spec.tokens.iter().enumerate() {
            vocab.entry(t.clone()).or_insert(i as u32);
        }
        let mut specials: Vec<(String, u32, bool)> = types
            .iter()
            .enumerate()
            .filter(|(_, t)| {
                matches!(
                    t,
                    TokenType::Control | TokenType::UserDefined | TokenType::Unknown
                )
            })
            .filter(|(i, _)| !spec.tokens[*i].is_empty())
            .map(|(i, t)| {
                (
                    spec.tokens[i].clone(),
                    i as u32,
                    *t == TokenType::UserDefined,
                )
            })
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));

        let (algo, pre_family) = match model {
            TokenizerModel::Gpt2 => {
                let kind = pretok::resolve(spec.pre.as_deref())?;
                let pretok = pretok::build(&kind)?;
                let mut merges = Vec::with_capacity(spec.merges.len());
                for (rank, m) in spec.merges.iter().enumerate() {
                    // Byte-level token text never contains a literal space, so
                    // the first space after position 0 separates the pair.
                    let cut = m
                        .char_indices()
                        .skip(1)
                        .find(|&(_, c)| c == ' ')
                        .map(|(i, _)| i)
                        .ok_or_else(|| {
                            anyhow!("tokenizer.ggml.merges[{rank}] = {m:?} has no space separator")
                        })?;
                    merges.push((m[..cut].to_string(), m[cut + 1..].to_string()));
                }
                let bpe_vocab: tokenizers::models::bpe::Vocab =
                    vocab.iter().map(|(k, v)| (k.clone(), *v)).collect();
                let model = BPE::builder()
                    .vocab_and_merges(bpe_vocab, merges)
                    .ignore_merges(kind.ignore_merges)
                    .build()
                    .map_err(|e| anyhow!("{e}"))
                    .context("building the BPE model from tokenizer.ggml.tokens/merges")?;
                (
                    Algo::Bpe {
                        pretok: Box::new(pretok),
                        model: Box::new(model),
                    },
                    kind.family,
                )
            }
            TokenizerModel::Llama => (
                Algo::Spm(Box::new(spm::SpmModel::new(
                    &spec.tokens,
                    &spec.scores,
                    spec.unk_id,
                )?)),
                "spm",
            ),
        };

        let mut stop_ids = Vec::new();
        stop_ids.extend(spec.eos_id);
        stop_ids.extend(spec.eot_id);
        for t in END_OF_TURN_TOKENS {
            if let Some(&id) = vocab.get(*t) {
                stop_ids.push(id);
            }
        }
        let mut seen = std::collections::HashSet::new();
        stop_ids.retain(|id| seen.insert(*id));

        Ok(Tokenizer {
            model,
            pre_family,
            tokens: spec.tokens,
            types,
            vocab,
            algo,
            specials,
            char_to_byte: pretok::char_to_byte_map(),
            bos_id: spec.bos_id,
            eos_id: spec.eos_id,
            add_bos: spec.add_bos,
            add_eos: spec.add_eos,
            add_space_prefix: spec.add_space_prefix && model == TokenizerModel::Llama,
            stop_ids,
            chat_template: spec.chat_template,
            sandbox: std::sync::OnceLock::new(),
        })
    }

    /// Reads the tokenizer of a GGUF file (see [`TokenizerSpec::from_gguf`]).
    pub fn from_gguf(f: &crate::gguf::GgufFile) -> Result<Tokenizer> {
        let spec = TokenizerSpec::from_gguf(f)?;
        Tokenizer::new(spec)
            .with_context(|| format!("{}: building the tokenizer", f.path().display()))
    }

    /// Opens `path` and reads its tokenizer.
    pub fn from_gguf_path(path: &std::path::Path) -> Result<Tokenizer> {
        let f = crate::gguf::GgufFile::open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        Tokenizer::from_gguf(&f)
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }
    pub fn model(&self) -> TokenizerModel {
        self.model
    }
    /// Canonical pre-tokenizer family in use ("smollm", "llama3", ...; "spm"
    /// for SentencePiece).
    pub fn pre_family(&self) -> &'static str {
        self.pre_family
    }
    /// EOS, then the end-of-turn tokens present in the vocab (no duplicates).
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }
    /// The raw vocab text of `id`.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }
    /// The id of the token whose raw vocab text is `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.get(text).copied()
    }
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }
    /// The chat template from the file, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Encodes `text`. `add_special` adds BOS/EOS per the file's
    /// add_bos/add_eos flags; `parse_special` recognises control tokens such
    /// as `<|im_start|>` written in the text (user-defined tokens are always
    /// recognised, as in llama.cpp).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        self.encode_with(text, add_special, parse_special, &[])
    }

    /// [`Self::encode`], where no special token is matched that overlaps one
    /// of the `protected` byte ranges of `text` (those bytes stay text; see
    /// [`content`]).
    pub(crate) fn encode_with(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
        protected: &[std::ops::Range<usize>],
    ) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        if add_special && self.add_bos {
            out.push(
                self.bos_id
                    .context("add_bos is set but tokenizer.ggml.bos_token_id is missing")?,
            );
        }
        // SentencePiece prefixes a space to text at the start and after
        // every special token.
        let mut prev_special = true;
        for frag in self.partition(text, parse_special, protected) {
            match frag {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(s) => {
                    self.encode_text(s, prev_special, &mut out)
                        .with_context(|| format!("encoding {:?}", truncate(s, 40)))?;
                    prev_special = false;
                }
            }
        }
        if add_special && self.add_eos {
            out.push(
                self.eos_id
                    .context("add_eos is set but tokenizer.ggml.eos_token_id is missing")?,
            );
        }
        Ok(out)
    }

    fn encode_text(&self, s: &str, prev_special: bool, out: &mut Vec<u32>) -> Result<()> {
        match &self.algo {
            Algo::Bpe { pretok, model } => {
                let mut pts = PreTokenizedString::from(s);
                pretok
                    .pre_tokenize(&mut pts)
                    .map_err(|e| anyhow!("pre-tokenizer ({}): {e}", self.pre_family))?;
                for (piece, _, _) in pts.get_splits(OffsetReferential::Original, OffsetType::Byte) {
                    let toks = model
                        .tokenize(piece)
                        .map_err(|e| anyhow!("BPE on piece {piece:?}: {e}"))?;
                    out.extend(toks.iter().map(|t| t.id));
                }
                Ok(())
            }
            Algo::Spm(m) => {
                let mut t = String::with_capacity(s.len() + 3);
                if self.add_space_prefix && prev_special {
                    t.push('▁');
                }
                for c in s.chars() {
                    if c == ' ' {
                        t.push('▁');
                    } else {
                        t.push(c);
                    }
                }
                m.tokenize(&t, &self.vocab, out)
            }
        }
    }

    /// Splits `text` on special tokens, longest token first, as llama.cpp's
    /// partitioning does; an occurrence overlapping a `protected` byte range
    /// of `text` stays text.
    fn partition<'a>(
        &self,
        text: &'a str,
        parse_special: bool,
        protected: &[std::ops::Range<usize>],
    ) -> Vec<Fragment<'a>> {
        let mut frags = vec![Fragment::Text(text)];
        for (tok, id, always) in &self.specials {
            if !(parse_special || *always) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len());
            for f in frags {
                match f {
                    Fragment::Text(s) if s.contains(tok.as_str()) => {
                        // `s` is a subslice of `text`: its offset there.
                        let base = s.as_ptr() as usize - text.as_ptr() as usize;
                        let (mut start, mut from) = (0, 0);
                        while let Some(rel) = s[from..].find(tok.as_str()) {
                            let pos = from + rel;
                            let (a, b) = (base + pos, base + pos + tok.len());
                            if protected.iter().any(|r| a < r.end && r.start < b) {
                                // Step one char: a later match may start
                                // inside this one.
                                from = pos + s[pos..].chars().next().map_or(1, char::len_utf8);
                                continue;
                            }
                            if pos > start {
                                next.push(Fragment::Text(&s[start..pos]));
                            }
                            next.push(Fragment::Token(*id));
                            start = pos + tok.len();
                            from = start;
                        }
                        if start < s.len() {
                            next.push(Fragment::Text(&s[start..]));
                        }
                    }
                    other => next.push(other),
                }
            }
            frags = next;
        }
        frags
    }

    /// The bytes `id` decodes to. Control and unknown tokens decode to their
    /// text unless `skip_special`; byte tokens to their byte; SentencePiece
    /// `▁` to a space.
    pub fn piece_bytes(&self, id: u32, skip_special: bool) -> Result<Vec<u8>> {
        let text = self.tokens.get(id as usize).ok_or_else(|| {
            anyhow!(
                "token id {id} out of range (vocab size {})",
                self.tokens.len()
            )
        })?;
        let ty = self.types[id as usize];
        Ok(match ty {
            TokenType::Control | TokenType::Unknown => {
                if skip_special {
                    Vec::new()
                } else {
                    text.as_bytes().to_vec()
                }
            }
            TokenType::UserDefined => text.as_bytes().to_vec(),
            TokenType::Unused => Vec::new(),
            _ => match self.model {
                TokenizerModel::Gpt2 => {
                    let mut b = Vec::with_capacity(text.len());
                    for c in text.chars() {
                        match self.char_to_byte.get(&c) {
                            Some(&x) => b.push(x),
                            // Not byte-level text: keep the char's UTF-8.
                            None => b.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                    b
                }
                TokenizerModel::Llama => {
                    if ty == TokenType::Byte {
                        if let Some(x) = spm::parse_byte_token(text) {
                            return Ok(vec![x]);
                        }
                    }
                    text.replace('▁', " ").into_bytes()
                }
            },
        })
    }

    /// The text of one token, special tokens included (lossy for tokens that
    /// are a fragment of a multi-byte character).
    pub fn token_to_piece(&self, id: u32) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.piece_bytes(id, false)?).into_owned())
    }

    /// Decodes `ids`. With SentencePiece and add_space_prefix, a space at the
    /// very start of the output (the one the encoder prefixed to the first
    /// word) is removed; after a rendered BOS it is kept, as in HF. Invalid
    /// UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        let mut d = StreamDecoder::new(self, skip_special);
        let mut s = String::new();
        for &id in ids {
            if let Some(t) = d.push(id)? {
                s.push_str(&t);
            }
        }
        if let Some(t) = d.finish() {
            s.push_str(&t);
        }
        Ok(s)
    }

    pub(crate) fn strips_leading_space(&self) -> bool {
        self.add_space_prefix
    }
}

#[derive(Clone, Copy, Debug)]
enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Tokenizer>();
        check::<StreamDecoder<'static>>();
    }

    #[test]
    fn partition_prefers_longer_specials() {
        let toks: Vec<String> = ["<a>", "<a><b>", "x"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut spec = TokenizerSpec::new("llama", toks);
        spec.token_types = vec![3, 3, 1];
        let t = Tokenizer::new(spec).unwrap();
        let f: Vec<String> = t
            .partition("x<a><b><a>x", true, &[])
            .iter()
            .map(|f| format!("{f:?}"))
            .collect();
        assert_eq!(f, ["Text(\"x\")", "Token(1)", "Token(0)", "Text(\"x\")"]);
        assert_eq!(t.partition("x<a>", false, &[]).len(), 1);
        // A protected range keeps the overlapping occurrence as text.
        let f: Vec<String> = t
            .partition("x<a><b><a>x", true, &[std::ops::Range { start: 1, end: 4 }])
            .iter()
            .map(|f| format!("{f:?}"))
            .collect();
        assert_eq!(f, ["Text(\"x<a><b>\")", "Token(0)", "Text(\"x\")"]);
    }
}
