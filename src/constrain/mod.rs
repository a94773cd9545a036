//! Constrained decoding (structured outputs): a grammar (JSON schema, Lark,
//! regex) compiled with llguidance over the model's vocabulary, and one
//! matcher per sequence that says which tokens may come next.
//!
//! Data flow: the server compiles a request's [`GrammarSpec`] into a
//! [`Grammar`] (on the blocking pool: compiling a large schema takes
//! milliseconds), the engine starts one [`Constraint`] per choice, computes
//! each constrained row's mask while the model step runs
//! ([`Constraint::prepare`]), the sampler reads the mask
//! ([`Constraint::allows`]) and the chosen token advances the matcher
//! ([`Constraint::commit`]).
//!
//! Invariant: a mask is a function of the tokens committed so far and of
//! the grammar, nothing else; masked logits become `-inf` and the others
//! keep every bit. So constrained decoding keeps the guarantees of the
//! mode: deterministic, batch-invariant, and when the unconstrained greedy
//! output already fits the grammar it is the constrained output, bit for
//! bit.

mod vocab;

use anyhow::{anyhow, bail, Context, Result};
use llguidance::api::{ParserLimits, StopReason, TopLevelGrammar};
use llguidance::toktrie::SimpleVob;
use llguidance::{Matcher, ParserFactory, TokenParser};
use serde_json::Value;
use std::sync::Arc;

use crate::sampler::TokenMask;
use crate::tokenizer::Tokenizer;

/// What a request constrains its output to.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A JSON value valid against this schema.
    JsonSchema(Value),
    /// A grammar in llguidance's Lark dialect (`%json {...}` rules and
    /// special tokens such as `<[128010]>` included).
    Lark(String),
    /// Text matching this regular expression (whole output).
    Regex(String),
}

/// The separators of generated JSON when the schema does not choose
/// (`x-guidance`): Python's `json.dumps` defaults, and no free whitespace
/// (a small model can otherwise spend its whole budget on blanks).
pub fn json_options() -> Value {
    serde_json::json!({
        "item_separator": ", ",
        "key_separator": ": ",
        "whitespace_flexible": false,
    })
}

impl GrammarSpec {
    /// The llguidance grammar.
    fn to_top_level(&self) -> Result<TopLevelGrammar> {
        Ok(match self {
            GrammarSpec::JsonObject => TopLevelGrammar::from_json_schema(serde_json::json!({
                "type": "object",
                "x-guidance": json_options(),
            })),
            GrammarSpec::JsonSchema(schema) => {
                let Value::Object(obj) = schema else {
                    // `true` / `false` schemas are valid JSON Schema but say
                    // nothing a client would mean here.
                    bail!("the schema must be a JSON object");
                };
                let mut obj = obj.clone();
                obj.entry("x-guidance").or_insert_with(json_options);
                TopLevelGrammar::from_json_schema(Value::Object(obj))
            }
            GrammarSpec::Lark(src) => TopLevelGrammar::from_lark(src.clone()),
            GrammarSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
        })
    }
}

/// The model's vocabulary as llguidance sees it, and the compiler of
/// grammars over it. Built once per server (a trie of the vocabulary).
pub struct Grammars {
    factory: ParserFactory,
    /// Tokens of the vocabulary (ids at or past it are never allowed).
    vocab: usize,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("vocab", &self.vocab)
            .finish()
    }
}

impl Grammars {
    pub fn new(tok: &Tokenizer) -> Result<Grammars> {
        let env = vocab::tok_env(tok)?;
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| anyhow!("{e}"))
            .context("building the grammar vocabulary")?;
        factory.quiet();
        factory.set_stderr_log_level(0);
        // Error messages go to clients: no parser dumps, no grammar echo.
        *factory.limits_mut() = ParserLimits {
            verbose_errors: false,
            ..ParserLimits::default()
        };
        Ok(Grammars {
            factory,
            vocab: tok.vocab_size(),
        })
    }

    /// Compiles `spec`; the error says what is wrong with it (an
    /// unsupported schema keyword, a Lark syntax error, a limit hit).
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Grammar> {
        let parser = self
            .factory
            .create_parser(spec.to_top_level()?)
            .map_err(|e| anyhow!("{e}"))?;
        let g = Grammar {
            parser: Arc::new(parser),
            vocab: self.vocab,
        };
        // A grammar that cannot produce its first token is an error now,
        // not at the first step.
        g.start().allows(&[])?;
        Ok(g)
    }
}

/// A compiled grammar; [`Grammar::start`] gives each sequence its own
/// matcher (a deep copy: sequences never share parser state).
#[derive(Clone)]
pub struct Grammar {
    parser: Arc<TokenParser>,
    vocab: usize,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Grammar")
    }
}

impl Grammar {
    /// A fresh constraint at the start of the output.
    pub fn start(&self) -> Constraint {
        Constraint {
            matcher: Matcher::new(Ok(self.parser.deep_clone())),
            mask: None,
            vocab: self.vocab,
        }
    }
}

/// The mask state of one sequence.
enum Mask {
    Ready(SimpleVob),
    Failed(String),
}

/// One sequence's position in its grammar.
pub struct Constraint {
    matcher: Matcher,
    /// The allowed set for the next token; None until computed for the
    /// current position.
    mask: Option<Mask>,
    vocab: usize,
}

impl Constraint {
    /// Computes the mask for the next token unless it is ready (the engine
    /// calls this while the model step runs). Errors are kept for
    /// [`Constraint::allows`]'s caller to see.
    pub fn prepare(&mut self) {
        if self.mask.is_some() {
            return;
        }
        let m = if self.matcher.is_stopped() && !self.matcher.is_error() {
            // The grammar is complete: only the end of the output is left.
            Ok(None)
        } else {
            self.matcher.compute_mask().map(Some)
        };
        self.mask = Some(match m {
            Ok(Some(v)) => Mask::Ready(v),
            Ok(None) => Mask::Ready(SimpleVob::alloc(self.vocab)),
            Err(e) => Mask::Failed(format!("{e}")),
        });
    }

    fn mask_result(&self) -> Result<&SimpleVob> {
        match &self.mask {
            Some(Mask::Ready(v)) => Ok(v),
            Some(Mask::Failed(e)) => bail!("grammar: {e}"),
            None => bail!("grammar: the mask was not computed"),
        }
    }

    /// Whether the grammar is complete here: the output may (or, when
    /// nothing else is allowed, must) end.
    pub fn may_end(&mut self) -> bool {
        self.matcher.is_stopped() && !self.matcher.is_error()
            || self.matcher.is_accepting().unwrap_or(false)
    }

    /// The allowed set for the next token; `stops` (the request's stop
    /// tokens) are allowed exactly when the output may end. Computes the
    /// mask if [`Constraint::prepare`] did not.
    pub fn allows<'a>(&'a mut self, stops: &'a [u32]) -> Result<Allowed<'a>> {
        self.prepare();
        let end = self.may_end();
        let vocab = self.vocab;
        let mask = self.mask_result()?;
        if mask.is_zero() && !end {
            bail!("grammar: no token can continue the output");
        }
        Ok(Allowed {
            mask,
            end,
            vocab,
            stops,
        })
    }

    /// Advances past a chosen (non-stop) token.
    pub fn commit(&mut self, tok: u32) -> Result<()> {
        self.mask = None;
        self.matcher
            .consume_token(tok)
            .map_err(|e| anyhow!("grammar: token {tok}: {e}"))?;
        if self.matcher.is_error() || self.matcher.stop_reason() == StopReason::InternalError {
            bail!(
                "grammar: {}",
                self.matcher.get_error().unwrap_or_else(|| "error".into())
            );
        }
        Ok(())
    }
}

/// A ready mask, borrowed from its [`Constraint`].
pub struct Allowed<'a> {
    mask: &'a SimpleVob,
    /// Stop tokens are allowed.
    end: bool,
    vocab: usize,
    stops: &'a [u32],
}

impl Allowed<'_> {
    /// Whether the output may end here (a stop token may come next).
    pub fn end(&self) -> bool {
        self.end
    }

    /// The allowed set as 32-id words (`sampler::WordMask`'s layout)
    /// over the first `out.len() * 32` ids: within the vocabulary, a bit
    /// is set exactly where [`TokenMask::allows`] allows the id, so a
    /// `WordMask` of them applies as [`TokenMask::apply`] does to a row of
    /// `vocab` logits.
    pub fn write_words(&self, out: &mut [u32]) {
        for (w, o) in out.iter_mut().enumerate() {
            *o = self.word(w);
        }
        for &s in self.stops {
            let i = s as usize;
            if i < self.vocab {
                if let Some(o) = out.get_mut(i / 32) {
                    if self.end {
                        *o |= 1 << (i % 32);
                    } else {
                        *o &= !(1 << (i % 32));
                    }
                }
            }
        }
    }

    /// The grammar's own bits for ids 32 w .. 32 w + 31 (stop tokens
    /// aside); ids at or past the vocabulary are never allowed.
    fn word(&self, w: usize) -> u32 {
        let limit = self.vocab.min(self.mask.len());
        let base = w * 32;
        let bits = self.mask.as_slice().get(w).copied().unwrap_or(0);
        match limit.saturating_sub(base) {
            keep if keep >= 32 => bits,
            keep => bits & ((1u32 << keep) - 1),
        }
    }

    /// The grammar's own bit for `id` (stop tokens aside).
    fn bit(&self, id: u32) -> bool {
        (id as usize) < self.vocab && (id as usize) < self.mask.len() && self.mask.is_allowed(id)
    }
}

impl TokenMask for Allowed<'_> {
    fn allows(&self, id: u32) -> bool {
        if self.stops.contains(&id) {
            self.end
        } else {
            self.bit(id)
        }
    }

    /// Word by word over the bitmask (32 tokens at a time; a whole word
    /// refused or allowed costs one test), then the stop tokens.
    fn apply(&self, logits: &mut [f32]) -> bool {
        let saved: Vec<(usize, f32)> = self
            .stops
            .iter()
            .map(|&s| s as usize)
            .filter(|&s| s < logits.len())
            .map(|s| (s, logits[s]))
            .collect();
        let mut any = false;
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = self.word(w);
            if bits == 0 {
                chunk.fill(f32::NEG_INFINITY);
                continue;
            }
            // Stop tokens are decided below, whatever their bit says.
            let stop_bits = self
                .stops
                .iter()
                .filter(|&&t| t as usize / 32 == w)
                .fold(0u32, |m, &t| m | 1 << (t % 32));
            any |= bits & !stop_bits != 0;
            if bits == u32::MAX {
                continue;
            }
            for (i, l) in chunk.iter_mut().enumerate() {
                if bits >> i & 1 == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        for (s, l) in saved {
            logits[s] = if self.end { l } else { f32::NEG_INFINITY };
        }
        let n = logits.len();
        any || self.end && self.stops.iter().any(|&t| (t as usize) < n)
    }
}
