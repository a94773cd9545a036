//! Cross-check against HF transformers loading the same GGUF tokenizer, on
//! seeded random text. transformers' GGUF conversion lacks the `smollm`
//! digit isolation, so the Python side applies it itself (splits the text
//! at every \p{N} character, encodes each piece, concatenates), which is
//! llama.cpp's behaviour. Special tokens are parsed on both sides.
//!
//! Uses the interpreter in `QUIRE_PYTHON` (default `python3`); prints
//! SKIPPED when it lacks `transformers`.

use quire::tokenizer::Tokenizer;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::process::Command;

const SCRIPT: &str = r#"
import json, sys, unicodedata
try:
    from transformers import AutoTokenizer
except Exception as e:
    print(f"missing transformers: {e}", file=sys.stderr); sys.exit(3)
import os
model, texts_path, out_path = sys.argv[1:4]
tok = AutoTokenizer.from_pretrained(os.path.dirname(model), gguf_file=os.path.basename(model))
def enc(s):
    pieces, cur = [], ''
    for c in s:
        if unicodedata.category(c).startswith('N'):
            if cur: pieces.append(cur); cur = ''
            pieces.append(c)
        else:
            cur += c
    if cur: pieces.append(cur)
    out = []
    for p in pieces: out += tok.encode(p, add_special_tokens=False)
    return out
texts = json.load(open(texts_path))
json.dump([enc(s) for s in texts], open(out_path, 'w'))
"#;

#[test]
fn matches_transformers_with_digit_isolation() {
    let path = match quire::fetch::default_model_path() {
        Ok(p) => p,
        Err(e) => {
            println!("SKIPPED: default model unavailable: {e:#}");
            return;
        }
    };
    let t = Tokenizer::from_gguf_path(&path).unwrap();
    let pool: Vec<&str> = vec![
        "a",
        "b",
        "the",
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        "'s",
        "'ll",
        "don't",
        "Hello",
        "WORLD",
        ".",
        ",",
        "!?",
        "()",
        "{}",
        "<",
        ">",
        "=",
        "==",
        "->",
        "_",
        "#",
        "$",
        "é",
        "ü",
        "ß",
        "Ж",
        "中",
        "文",
        "日本",
        "한",
        "🎉",
        "👩\u{200d}💻",
        "0",
        "1",
        "42",
        "2024",
        "3.14",
        "²",
        "½",
        "x",
        "fn",
        "let",
        "    ",
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|im_",
    ];
    let mut rng = ChaCha8Rng::seed_from_u64(20261121);
    let texts: Vec<String> = (0..300)
        .map(|_| {
            let n = rng.random_range(1..25);
            (0..n)
                .map(|_| pool[rng.random_range(0..pool.len())])
                .collect()
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let tp = dir.path().join("texts.json");
    let op = dir.path().join("ids.json");
    std::fs::write(&tp, serde_json::to_string(&texts).unwrap()).unwrap();
    let py = std::env::var("QUIRE_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = match Command::new(&py)
        .args(["-c", SCRIPT])
        .arg(&path)
        .arg(&tp)
        .arg(&op)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            println!("SKIPPED: cannot run {py}: {e}");
            return;
        }
    };
    if out.status.code() == Some(3) {
        println!(
            "SKIPPED: {py}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return;
    }
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want: Vec<Vec<u32>> = serde_json::from_str(&std::fs::read_to_string(&op).unwrap()).unwrap();
    assert_eq!(want.len(), texts.len());
    for (s, w) in texts.iter().zip(&want) {
        let ids = t.encode(s, false, true).unwrap();
        assert_eq!(&ids, w, "text {s:?}");
        assert_eq!(t.decode(&ids, false).unwrap(), *s);
    }
}
