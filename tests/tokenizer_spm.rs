//! SentencePiece (`tokenizer.ggml.model = llama`) on a small synthetic
//! vocab, written to a GGUF file and read back through `from_gguf`. The
//! expected ids are derived by hand from the algorithm (highest-scoring
//! pair first, leftmost on ties; byte fallback for unknown characters).

use quire::gguf::{GgufFile, GgufWriter};
use quire::tokenizer::{ChatMessage, StreamDecoder, Tokenizer, TokenizerSpec};

const UNK: u32 = 0;
const BOS: u32 = 1;
const EOS: u32 = 2;
const USER: u32 = 277;

fn byte_id(b: u8) -> u32 {
    3 + b as u32
}

/// ids: 0 <unk>, 1 <s>, 2 </s>, 3..=258 <0x00>..<0xFF>, then scored pieces,
/// then 277 `<|user|>` (user-defined).
fn vocab() -> (Vec<String>, Vec<f32>, Vec<i32>) {
    let mut toks: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut scores = vec![0.0f32; 3];
    let mut types = vec![2, 3, 3];
    for b in 0..=255u8 {
        toks.push(format!("<0x{b:02X}>"));
        scores.push(0.0);
        types.push(6);
    }
    let pieces: [(&str, f32); 18] = [
        ("▁", -1.0),
        ("h", -2.0),
        ("e", -2.0),
        ("l", -2.0),
        ("o", -2.0),
        ("w", -2.0),
        ("r", -2.0),
        ("d", -2.0),
        ("ll", -3.0),
        ("he", -4.0),
        ("llo", -5.0),
        ("hello", -6.0),
        ("▁hello", -7.0),
        ("or", -3.5),
        ("▁w", -4.5),
        ("▁wor", -6.0),
        ("ld", -5.5),
        ("▁world", -8.0),
    ];
    for (p, s) in pieces {
        toks.push(p.into());
        scores.push(s);
        types.push(1);
    }
    toks.push("<|user|>".into());
    scores.push(0.0);
    types.push(4);
    assert_eq!(toks.len(), USER as usize + 1);
    (toks, scores, types)
}

fn write_gguf(dir: &std::path::Path, with_tokens: bool) -> std::path::PathBuf {
    let (toks, scores, types) = vocab();
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", "llama");
    w.add_kv("tokenizer.ggml.model", "llama");
    if with_tokens {
        w.add_kv("tokenizer.ggml.tokens", toks);
    }
    w.add_kv("tokenizer.ggml.scores", scores);
    w.add_kv("tokenizer.ggml.token_type", types);
    w.add_kv("tokenizer.ggml.bos_token_id", BOS);
    w.add_kv("tokenizer.ggml.eos_token_id", EOS);
    w.add_kv("tokenizer.ggml.unknown_token_id", UNK);
    let path = dir.join(if with_tokens {
        "spm.gguf"
    } else {
        "broken.gguf"
    });
    w.write_to(&path).expect("writing the synthetic GGUF");
    path
}

fn load() -> (tempfile::TempDir, Tokenizer) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_gguf(dir.path(), true);
    let f = GgufFile::open(&path).unwrap();
    let t = Tokenizer::from_gguf(&f).unwrap();
    (dir, t)
}

#[test]
fn merges_by_score_with_space_prefix_and_bos() {
    let (_d, t) = load();
    assert_eq!(t.vocab_size(), 278);
    assert_eq!(t.bos_id(), Some(BOS));
    // llama defaults: add_bos and add_space_prefix are on.
    assert_eq!(
        t.encode("hello world", true, false).unwrap(),
        vec![BOS, 271, 276]
    );
    assert_eq!(
        t.encode("hello world", false, false).unwrap(),
        vec![271, 276]
    );
    assert_eq!(t.decode(&[BOS, 271, 276], true).unwrap(), "hello world");
    // Only a space at the very start of the output is removed (as HF does):
    // a rendered BOS keeps the word's space.
    assert_eq!(
        t.decode(&[BOS, 271, 276], false).unwrap(),
        "<s> hello world"
    );
    assert_eq!(t.token_to_piece(271).unwrap(), " hello");
}

#[test]
fn byte_fallback_and_streaming() {
    let (_d, t) = load();
    // "i" and "ü" are not pieces: their UTF-8 bytes become byte tokens.
    let ids = t.encode("hi ü", false, false).unwrap();
    let want = vec![259, 260, byte_id(b'i'), 259, byte_id(0xC3), byte_id(0xBC)];
    assert_eq!(ids, want);
    assert_eq!(t.decode(&ids, true).unwrap(), "hi ü");
    let mut s = StreamDecoder::new(&t, true);
    let outs: Vec<Option<String>> = ids.iter().map(|&i| s.push(i).unwrap()).collect();
    assert_eq!(outs[4], None, "half of ü must be held back");
    assert_eq!(outs[5].as_deref(), Some("ü"));
    assert_eq!(s.finish(), None);
    // A dangling lead byte is flushed as U+FFFD at the end.
    let mut s = StreamDecoder::new(&t, true);
    assert_eq!(s.push(byte_id(0xC3)).unwrap(), None);
    assert_eq!(s.finish().as_deref(), Some("\u{FFFD}"));
}

#[test]
fn special_tokens() {
    let (_d, t) = load();
    assert_eq!(t.encode("</s>", false, true).unwrap(), vec![EOS]);
    let raw = t.encode("</s>", false, false).unwrap();
    let want: Vec<u32> = std::iter::once(259)
        .chain("</s>".bytes().map(byte_id))
        .collect();
    assert_eq!(raw, want);
    assert_eq!(t.decode(&raw, true).unwrap(), "</s>");
    // User-defined tokens are recognised even without parse_special, and a
    // space is prefixed to the text that follows them.
    let ids = t.encode("hello<|user|>world", false, false).unwrap();
    assert_eq!(ids, vec![271, USER, 276]);
    assert_eq!(t.decode(&ids, true).unwrap(), "hello<|user|> world");
}

#[test]
fn chatml_fallback_without_template() {
    let (_d, t) = load();
    assert!(t.chat_template().is_none());
    let m = [
        ChatMessage::new("system", "S"),
        ChatMessage::new("user", "U"),
    ];
    assert_eq!(
        t.apply_chat_template(&m, true).unwrap(),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        t.apply_chat_template(&m[1..], false).unwrap(),
        "<|im_start|>user\nU<|im_end|>\n"
    );
}

#[test]
fn add_eos_and_bad_specs() {
    let (toks, scores, types) = vocab();
    let mut spec = TokenizerSpec::new("llama", toks.clone());
    spec.scores = scores.clone();
    spec.token_types = types.clone();
    spec.bos_id = Some(BOS);
    spec.eos_id = Some(EOS);
    spec.add_eos = true;
    let t = Tokenizer::new(spec.clone()).unwrap();
    assert_eq!(t.encode("hello", true, false).unwrap(), vec![BOS, 271, EOS]);
    assert_eq!(t.stop_ids(), &[EOS]);

    let mut bad = spec.clone();
    bad.model = "wordpiece".into();
    let e = format!("{:#}", Tokenizer::new(bad).unwrap_err());
    assert!(e.contains("wordpiece"), "{e}");

    let mut bad = spec.clone();
    bad.scores.pop();
    let e = format!("{:#}", Tokenizer::new(bad).unwrap_err());
    assert!(e.contains("tokenizer.ggml.scores"), "{e}");

    let mut bad = spec;
    bad.eos_id = Some(toks.len() as u32);
    let e = format!("{:#}", Tokenizer::new(bad).unwrap_err());
    assert!(e.contains("tokenizer.ggml.eos_token_id"), "{e}");

    let dir = tempfile::tempdir().unwrap();
    let path = write_gguf(dir.path(), false);
    let f = GgufFile::open(&path).unwrap();
    let e = format!("{:#}", Tokenizer::from_gguf(&f).unwrap_err());
    assert!(e.contains("tokenizer.ggml.tokens"), "{e}");
}
