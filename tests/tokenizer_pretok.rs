//! Pre-tokenizer families: the pieces each `tokenizer.ggml.pre` family cuts
//! a text into. Expected pieces were produced with Python's `regex` module
//! applying llama.cpp's regex list for each family in sequence (keeping the
//! text between matches as pieces).

use quire::tokenizer::pretok::{resolve, split_text};

const TEXT: &str = "Hello  world's 1234567 x=10;\n\n  ÉTÉ 中文\tok  ";

fn pieces(pre: &str) -> Vec<String> {
    split_text(&resolve(Some(pre)), TEXT).unwrap()
}

#[test]
fn gpt2() {
    let want = [
        "Hello", " ", " world", "'s", " 1234567", " x", "=", "10", ";", "\n\n ", " ÉTÉ", " 中文",
        "\t", "ok", "  ",
    ];
    assert_eq!(pieces("gpt-2"), want);
    // Unknown names fall back to gpt2.
    assert_eq!(pieces("not-a-real-pre"), want);
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
    assert!(resolve(Some("llama-bpe")).ignore_merges);
}

#[test]
fn qwen2_single_digits() {
    let want = [
        "Hello", " ", " world", "'s", " ", "1", "2", "3", "4", "5", "6", "7", " x", "=", "1", "0",
        ";\n\n", " ", " ÉTÉ", " 中文", "\tok", "  ",
    ];
    assert_eq!(pieces("qwen2"), want);
}

#[test]
fn pieces_cover_the_text() {
    for pre in ["gpt-2", "smollm", "llama-bpe", "qwen2", "default", "falcon"] {
        assert_eq!(pieces(pre).concat(), TEXT, "{pre}");
    }
}
