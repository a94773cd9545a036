//! Pre-tokenizer families: the pieces each `tokenizer.ggml.pre` family cuts
//! a text into. Expected pieces were produced with Python's `regex` module
//! applying llama.cpp's regex list for each family in sequence (keeping the
//! text between matches as pieces).

use quire::tokenizer::pretok::{resolve, split_text};

const TEXT: &str = "Hello  world's 1234567 x=10;\n\n  ÉTÉ 中文\tok  ";

fn pieces(pre: &str) -> Vec<String> {
    split_text(&resolve(Some(pre)).unwrap(), TEXT).unwrap()
}

#[test]
fn gpt2() {
    let want = [
        "Hello", " ", " world", "'s", " 1234567", " x", "=", "10", ";", "\n\n ", " ÉTÉ", " 中文",
        "\t", "ok", "  ",
    ];
    assert_eq!(pieces("gpt-2"), want);
    // An unknown name is an error, never a silent fallback (wrong ids).
    let err = resolve(Some("not-a-real-pre")).unwrap_err();
    assert!(format!("{err}").contains("not-a-real-pre"), "{err}");
}

#[test]
fn smollm_isolates_digits() {
    let want = [
        "Hello", " ", " world", "'s", " ", "1", "2", "3", "4", "5", "6", "7", " x", "=", "1", "0",
        ";", "\n\n ", " ÉTÉ", " 中文", "\t", "ok", "  ",
    ];
    assert_eq!(pieces("smollm"), want);
}

#[test]
fn llama3_groups_digits_by_three() {
    let want = [
        "Hello", " ", " world", "'s", " ", "123", "456", "7", " x", "=", "10", ";\n\n", " ",
        " ÉTÉ", " 中文", "\tok", "  ",
    ];
    assert_eq!(pieces("llama-bpe"), want);
    assert!(resolve(Some("llama-bpe")).unwrap().ignore_merges);
}

#[test]
fn qwen2_single_digits() {
    let want = [
        "Hello", " ", " world", "'s", " ", "1", "2", "3", "4", "5", "6", "7", " x", "=", "1", "0",
        ";\n\n", " ", " ÉTÉ", " 中文", "\tok", "  ",
    ];
    assert_eq!(pieces("qwen2"), want);
}

/// Qwen3.5: combining marks join the letters before them (QWEN2 cuts them
/// off). Expected pieces from Python's `regex` with llama.cpp's pattern.
#[test]
fn qwen35_keeps_combining_marks_in_words() {
    let text =
        "Cafe\u{301} na\u{308}ive 12 x\u{301}=\u{301};\n Hindi \u{939}\u{93f}\u{902}\u{926}\u{940}";
    let got = split_text(&resolve(Some("qwen35")).unwrap(), text).unwrap();
    let want = [
        "Cafe\u{301}",
        " na\u{308}ive",
        " ",
        "1",
        "2",
        " x\u{301}",
        "=\u{301}",
        ";\n",
        " Hindi",
        " \u{939}\u{93f}\u{902}\u{926}\u{940}",
    ];
    assert_eq!(got, want);
    let q2 = split_text(&resolve(Some("qwen2")).unwrap(), text).unwrap();
    assert_eq!(q2[..2], ["Cafe", "\u{301}"]);
}

#[test]
fn pieces_cover_the_text() {
    for pre in [
        "gpt-2",
        "smollm",
        "llama-bpe",
        "qwen2",
        "qwen35",
        "default",
        "falcon",
    ] {
        assert_eq!(pieces(pre).concat(), TEXT, "{pre}");
    }
}
