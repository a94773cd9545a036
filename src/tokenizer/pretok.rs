//! Pre-tokenizer regexes per `tokenizer.ggml.pre` family, and the GPT-2
//! byte <-> unicode mapping.
//!
//! The regex lists follow llama.cpp's per-family table: each regex splits
//! every piece produced by the previous one, keeping both the matches and
//! the text between them (HF `Split` with `Isolated` behaviour has exactly
//! these semantics). Unmatched text is kept as its own piece, which is why
//! the GPT-2 regex needs no trailing `|\s+`.

use anyhow::{anyhow, bail, Context, Result};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{
    OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, SplitDelimiterBehavior,
};

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// llama3 regex with the case-insensitive contractions spelled out (as
/// llama.cpp does, so the meaning does not depend on the engine's `(?i:)`).
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5: QWEN2's, with combining marks (\p{M}) joining letter runs and
/// kept out of symbol runs.
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A resolved pre-tokenizer family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreTokenizerKind {
    /// Canonical family name (for logs and tests).
    pub family: &'static str,
    /// Regexes applied in order.
    pub regexes: Vec<&'static str>,
    /// llama3-style BPE: a pre-token that is itself in the vocab is emitted
    /// whole, without running the merges.
    pub ignore_merges: bool,
}

/// Resolves a `tokenizer.ggml.pre` value. An absent value means plain
/// GPT-2; an unknown one is an error, as in llama.cpp: falling back to
/// another family would silently give wrong token ids.
pub fn resolve(pre: Option<&str>) -> Result<PreTokenizerKind> {
    let k = |family, regexes: Vec<&'static str>, ignore_merges| PreTokenizerKind {
        family,
        regexes,
        ignore_merges,
    };
    Ok(match pre.unwrap_or("gpt-2") {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" => {
            k("llama3", vec![LLAMA3], true)
        }
        "qwen2" | "deepseek-r1-qwen" | "megrez" | "stablelm2" => k("qwen2", vec![QWEN2], false),
        "qwen35" => k("qwen35", vec![QWEN35], false),
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            k("smollm", vec![r"\p{N}", GPT2], false)
        }
        "falcon" => k(
            "falcon",
            vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"],
            false,
        ),
        "default" => k(
            "default",
            vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
            false,
        ),
        "gpt-2" | "gpt2" | "phi-2" | "mpt" | "olmo" | "jais" | "roberta-bpe" | "jina-v1-en"
        | "jina-v2-es" | "jina-v2-de" | "jina-v2-code" | "jina-es" | "jina-de" | "gigachat" => {
            k("gpt2", vec![GPT2], false)
        }
        other => bail!(
            "unknown pre-tokenizer `{other}` (tokenizer.ggml.pre); known: llama3, llama-bpe, \
             qwen2, qwen35, smollm, starcoder, falcon, default, gpt2 and their aliases \
             (src/tokenizer/pretok.rs)"
        ),
    })
}

/// Builds the HF pre-tokenizer: the family's regex splits, then the
/// byte-level mapping (without its own regex, and without a prefix space).
pub fn build(kind: &PreTokenizerKind) -> Result<PreTokenizerWrapper> {
    let mut steps = regex_steps(kind)?;
    steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
        false, false, false,
    )));
    Ok(PreTokenizerWrapper::Sequence(Sequence::new(steps)))
}

/// Splits `text` with the family's regexes only (no byte-level mapping):
/// the pieces BPE will see, as plain text. For tests and debugging.
pub fn split_text(kind: &PreTokenizerKind, text: &str) -> Result<Vec<String>> {
    let seq = Sequence::new(regex_steps(kind)?);
    let mut pts = PreTokenizedString::from(text);
    seq.pre_tokenize(&mut pts)
        .map_err(|e| anyhow!("pre-tokenizer ({}): {e}", kind.family))?;
    Ok(pts
        .get_splits(OffsetReferential::Original, OffsetType::Byte)
        .into_iter()
        .map(|(s, _, _)| s.to_string())
        .collect())
}

fn regex_steps(kind: &PreTokenizerKind) -> Result<Vec<PreTokenizerWrapper>> {
    let mut steps = Vec::with_capacity(kind.regexes.len() + 1);
    for re in &kind.regexes {
        let split = Split::new(
            SplitPattern::Regex((*re).to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("compiling pre-tokenizer regex {re:?} ({})", kind.family))?;
        steps.push(PreTokenizerWrapper::Split(split));
    }
    Ok(steps)
}

/// GPT-2's reversible byte -> printable char table: printable Latin-1
/// bytes map to themselves, the other 68 to U+0100.. in byte order.
pub fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let c = if printable {
            b
        } else {
            n += 1;
            255 + n
        };
        // Every value is below U+0200, hence a valid scalar value.
        table[b as usize] = char::from_u32(c).unwrap_or('\u{FFFD}');
    }
    table
}

/// Inverse of `byte_to_char_table`, for decoding byte-level token text.
pub fn char_to_byte_map() -> std::collections::HashMap<char, u8> {
    byte_to_char_table()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_a_bijection() {
        let t = byte_to_char_table();
        let inv = char_to_byte_map();
        assert_eq!(inv.len(), 256);
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        for (b, c) in t.iter().enumerate() {
            assert_eq!(inv[c] as usize, b);
        }
    }

    #[test]
    fn unknown_pre_is_an_error() {
        let err = resolve(Some("no-such-pre")).unwrap_err();
        assert!(format!("{err}").contains("no-such-pre"), "{err}");
        assert_eq!(resolve(None).unwrap().family, "gpt2");
        assert_eq!(resolve(Some("smollm")).unwrap().regexes.len(), 2);
        assert!(resolve(Some("llama-bpe")).unwrap().ignore_merges);
        assert_eq!(resolve(Some("qwen35")).unwrap().family, "qwen35");
    }
}
