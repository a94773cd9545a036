//! GPT-2 byte-level BPE on a small synthetic vocab: merges, llama3's
//! ignore_merges, special and user-defined tokens, spec errors.

use quire::tokenizer::pretok::byte_to_char_table;
use quire::tokenizer::{Tokenizer, TokenizerSpec};

const AB: u32 = 256;
const ABC: u32 = 257;
const EOT: u32 = 258;
const TOOL: u32 = 259;

/// ids 0..=255: the byte-level char of that byte; then "ab", "abc",
/// "<|eot|>" (control), "<tool>" (user-defined); one merge "a b".
fn spec(pre: &str) -> TokenizerSpec {
    let mut toks: Vec<String> = byte_to_char_table().iter().map(|c| c.to_string()).collect();
    toks.extend(["ab", "abc", "<|eot|>", "<tool>"].map(String::from));
    let mut s = TokenizerSpec::new("gpt2", toks);
    s.pre = Some(pre.into());
    s.token_types = [vec![1; 258], vec![3, 4]].concat();
    s.merges = vec!["a b".into()];
    s.eot_id = Some(EOT);
    s
}

#[test]
fn merges_and_ignore_merges() {
    let t = Tokenizer::new(spec("gpt-2")).unwrap();
    assert_eq!(t.encode("abc", true, false).unwrap(), vec![AB, b'c' as u32]);
    // " ab" is one pre-token: "Ġ" stays alone, "a b" merges.
    assert_eq!(t.encode(" ab", false, false).unwrap(), vec![32, AB]);
    assert_eq!(t.decode(&[32, AB, b'c' as u32], false).unwrap(), " abc");
    // llama3 family: a pre-token found whole in the vocab skips the merges.
    let t = Tokenizer::new(spec("llama-bpe")).unwrap();
    assert_eq!(t.encode("abc", false, false).unwrap(), vec![ABC]);
}

#[test]
fn special_and_user_defined_tokens() {
    let t = Tokenizer::new(spec("gpt-2")).unwrap();
    assert_eq!(t.encode("ab<|eot|>", false, true).unwrap(), vec![AB, EOT]);
    let raw = t.encode("ab<|eot|>", false, false).unwrap();
    assert_eq!(raw.len(), 8, "{raw:?}");
    assert_eq!(t.decode(&raw, true).unwrap(), "ab<|eot|>");
    // User-defined tokens are matched even with parse_special off and are
    // never skipped when decoding.
    assert_eq!(t.encode("<tool>ab", false, false).unwrap(), vec![TOOL, AB]);
    assert_eq!(t.decode(&[TOOL, EOT, AB], true).unwrap(), "<tool>ab");
    assert_eq!(
        t.decode(&[TOOL, EOT, AB], false).unwrap(),
        "<tool><|eot|>ab"
    );
    assert_eq!(t.stop_ids(), &[EOT]);
    assert_eq!(t.token_id("<tool>"), Some(TOOL));
}

#[test]
fn bad_specs_name_the_key() {
    let mut s = spec("gpt-2");
    s.merges = vec!["ab".into()];
    let e = format!("{:#}", Tokenizer::new(s).unwrap_err());
    assert!(e.contains("tokenizer.ggml.merges"), "{e}");

    let mut s = spec("gpt-2");
    s.token_types.pop();
    let e = format!("{:#}", Tokenizer::new(s).unwrap_err());
    assert!(e.contains("tokenizer.ggml.token_type"), "{e}");

    let mut s = spec("gpt-2");
    s.add_bos = true;
    let e = format!(
        "{:#}",
        Tokenizer::new(s)
            .unwrap()
            .encode("a", true, false)
            .unwrap_err()
    );
    assert!(e.contains("bos_token_id"), "{e}");

    let mut s = spec("gpt-2");
    s.model = "bert".into();
    let e = format!("{:#}", Tokenizer::new(s).unwrap_err());
    assert!(e.contains("`bert`"), "{e}");
}
