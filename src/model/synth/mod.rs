//! Random-weight GGUF models of named real shapes (`quire synth`) and tiny
//! test shapes. Benchmarks at real sizes run without downloading weights,
//! and tests compare tiny models against Hugging Face transformers.

use crate::gguf::{GgufValue, GgufWriter};
use crate::quant::{self, GgmlType};
use anyhow::{bail, Context, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use std::path::Path;

mod qwen35;
pub use qwen35::SynthGdn;

/// The shape of a model to synthesize.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthShape {
    pub name: &'static str,
    /// GGUF architecture: llama, qwen2, qwen3 or qwen35.
    pub arch: &'static str,
    pub n_layers: usize,
    pub dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub vocab: usize,
    pub context_length: usize,
    pub rope_base: f32,
    pub tied: bool,
    /// The Gated DeltaNet part of a qwen35 shape; None for the others.
    pub gdn: Option<SynthGdn>,
}

// A const constructor for the table below: positional arguments keep each
// shape on one line.
#[allow(clippy::too_many_arguments)]
const fn shape(
    name: &'static str,
    arch: &'static str,
    n_layers: usize,
    dim: usize,
    heads: (usize, usize, usize),
    ffn_dim: usize,
    vocab: usize,
    context_length: usize,
    rope_base: f32,
    tied: bool,
) -> SynthShape {
    SynthShape {
        name,
        arch,
        n_layers,
        dim,
        n_heads: heads.0,
        n_kv_heads: heads.1,
        head_dim: heads.2,
        ffn_dim,
        vocab,
        context_length,
        rope_base,
        tied,
        gdn: None,
    }
}

/// Named shapes. Real ones follow the published configs.
pub const SHAPES: &[SynthShape] = &[
    shape(
        "SmolLM2-135M",
        "llama",
        30,
        576,
        (9, 3, 64),
        1536,
        49152,
        8192,
        100000.0,
        true,
    ),
    shape(
        "Llama-3.2-1B",
        "llama",
        16,
        2048,
        (32, 8, 64),
        8192,
        128256,
        131072,
        500000.0,
        true,
    ),
    shape(
        "Llama-3.1-8B",
        "llama",
        32,
        4096,
        (32, 8, 128),
        14336,
        128256,
        131072,
        500000.0,
        false,
    ),
    shape(
        "Qwen2.5-7B",
        "qwen2",
        28,
        3584,
        (28, 4, 128),
        18944,
        152064,
        32768,
        1000000.0,
        false,
    ),
    shape(
        "Qwen3-0.6B",
        "qwen3",
        28,
        1024,
        (16, 8, 128),
        3072,
        151936,
        40960,
        1000000.0,
        true,
    ),
    // Tiny shapes for tests: every dimension a multiple of 256 where a
    // K-quant needs it (row lengths dim and ffn_dim).
    shape(
        "tiny-llama",
        "llama",
        2,
        256,
        (4, 2, 64),
        512,
        384,
        2048,
        10000.0,
        false,
    ),
    shape(
        "tiny-llama-tied",
        "llama",
        2,
        256,
        (8, 1, 32),
        256,
        320,
        2048,
        10000.0,
        true,
    ),
    // Four KV heads: splits 2 and 4 ways (tensor-parallel tests).
    shape(
        "tiny-llama-kv4",
        "llama",
        2,
        256,
        (8, 4, 32),
        768,
        384,
        2048,
        10000.0,
        false,
    ),
    shape(
        "tiny-qwen2",
        "qwen2",
        2,
        256,
        (4, 2, 64),
        512,
        384,
        2048,
        1000000.0,
        true,
    ),
    // Llama 3's 128k vocabulary on a tiny body: decode graphs whose
    // logits dominate their buffers (tests/cuda_graphs.rs).
    shape(
        "tiny-llama-128k",
        "llama",
        2,
        512,
        (8, 2, 64),
        1024,
        128256,
        4096,
        500000.0,
        false,
    ),
    shape(
        "tiny-qwen3",
        "qwen3",
        2,
        256,
        (4, 2, 128),
        512,
        384,
        2048,
        1000000.0,
        false,
    ),
    // Qwen3.5 dense (spec'd in model/synth/qwen35.rs): layers, dim,
    // (heads, kv heads), ffn, value heads, tied.
    qwen35::shape("Qwen3.5-0.8B", 24, 1024, (8, 2), 3584, 16, true),
    qwen35::shape("Qwen3.5-2B", 24, 2048, (8, 2), 6144, 16, true),
    qwen35::shape("Qwen3.5-4B", 32, 2560, (16, 4), 9216, 32, true),
    qwen35::shape("Qwen3.5-9B", 32, 4096, (16, 4), 12288, 32, false),
    qwen35::shape("Qwen3.5-27B", 64, 5120, (24, 4), 17408, 48, false),
    qwen35::TINY,
    qwen35::SMALL,
    qwen35::TINY_MTP,
];

pub fn find_shape(name: &str) -> Result<&'static SynthShape> {
    SHAPES
        .iter()
        .find(|s| s.name.eq_ignore_ascii_case(name))
        .with_context(|| {
            let names: Vec<&str> = SHAPES.iter().map(|s| s.name).collect();
            format!("unknown shape '{name}' (known: {})", names.join(", "))
        })
}

/// Standard normal samples (Box-Muller), scaled.
fn normals(rng: &mut ChaCha8Rng, n: usize, std: f32, mean: f32) -> Vec<f32> {
    let mut v = Vec::with_capacity(n + 1);
    while v.len() < n {
        let u1: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
        let u2: f64 = rng.random();
        let r = (-2.0 * u1.ln()).sqrt();
        let t = 2.0 * std::f64::consts::PI * u2;
        v.push(mean + std * (r * t.cos()) as f32);
        v.push(mean + std * (r * t.sin()) as f32);
    }
    v.truncate(n);
    v
}

/// A random (rows, cols) matrix quantized to `ty`, rows in parallel with
/// one RNG per row (so the result does not depend on the thread count).
fn matrix(seed: u64, rows: usize, cols: usize, std: f32, ty: GgmlType) -> Result<Vec<u8>> {
    let row_bytes = ty
        .row_bytes(cols)
        .with_context(|| format!("a row of {cols} elements cannot be stored as {}", ty.name()))?;
    let rows_data: Vec<Result<Vec<u8>>> = (0..rows)
        .into_par_iter()
        .map(|r| {
            let mut rng =
                ChaCha8Rng::seed_from_u64(seed ^ (r as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let x = normals(&mut rng, cols, std, 0.0);
            Ok(quant::quantize(ty, &x)?)
        })
        .collect();
    let mut out = Vec::with_capacity(rows * row_bytes);
    for r in rows_data {
        out.extend(r?);
    }
    Ok(out)
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Adds a random (rows, cols) matrix in `ty`, std 1/sqrt(cols) so a
/// product keeps O(1) activations.
fn add_matrix(
    w: &mut GgufWriter,
    name: &str,
    (rows, cols): (usize, usize),
    ty: GgmlType,
    seed: u64,
) -> Result<()> {
    let std = 1.0 / (cols as f32).sqrt();
    let data = matrix(seed, rows, cols, std, ty).with_context(|| format!("tensor {name}"))?;
    w.add_tensor(name, &[cols as u64, rows as u64], ty, data)?;
    Ok(())
}

/// Adds an F32 vector of `n` normal samples around `mean`.
fn add_vector(
    w: &mut GgufWriter,
    name: &str,
    n: usize,
    seed: u64,
    mean: f32,
    std: f32,
) -> Result<()> {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    let v = normals(&mut r, n, std, mean);
    w.add_tensor(name, &[n as u64], GgmlType::F32, f32_bytes(&v))?;
    Ok(())
}

/// GPT-2's byte-to-unicode table: printable stand-ins for every byte.
fn byte_tokens() -> Vec<String> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut pairs: Vec<(u32, u32)> = bs.into_iter().zip(cs).collect();
    pairs.sort();
    pairs
        .into_iter()
        .map(|(_, c)| char::from_u32(c).unwrap_or('?').to_string())
        .collect()
}

/// Writes a random-weight model of `shape` with matrices in `ty` (norms
/// F32). The tokenizer is a byte-level GPT-2 vocabulary with one merge,
/// padded with `<extra_N>` tokens, plus ChatML specials.
pub fn write_model(path: &Path, s: &SynthShape, ty: GgmlType, seed: u64) -> Result<()> {
    if s.vocab < 260 {
        bail!("vocab {} too small for the byte-level tokenizer", s.vocab);
    }
    let mut w = GgufWriter::new();
    let a = s.arch;
    let kv = |k: &str| format!("{a}.{k}");
    w.add_kv("general.architecture", GgufValue::String(a.to_string()));
    w.add_kv(
        "general.name",
        GgufValue::String(format!("synthetic {}", s.name)),
    );
    w.add_kv("general.alignment", GgufValue::U32(32));
    // qwen35 counts its MTP blocks in block_count.
    let n_blocks = s.n_layers + s.gdn.as_ref().map_or(0, |h| h.nextn);
    w.add_kv(kv("block_count"), GgufValue::U32(n_blocks as u32));
    w.add_kv(
        kv("context_length"),
        GgufValue::U32(s.context_length as u32),
    );
    w.add_kv(kv("embedding_length"), GgufValue::U32(s.dim as u32));
    w.add_kv(kv("feed_forward_length"), GgufValue::U32(s.ffn_dim as u32));
    w.add_kv(kv("attention.head_count"), GgufValue::U32(s.n_heads as u32));
    w.add_kv(
        kv("attention.head_count_kv"),
        GgufValue::U32(s.n_kv_heads as u32),
    );
    w.add_kv(
        kv("attention.key_length"),
        GgufValue::U32(s.head_dim as u32),
    );
    w.add_kv(
        kv("attention.value_length"),
        GgufValue::U32(s.head_dim as u32),
    );
    w.add_kv(kv("rope.freq_base"), GgufValue::F32(s.rope_base));
    let rope_dim = s.gdn.as_ref().map_or(s.head_dim, |h| h.rope_dim);
    w.add_kv(kv("rope.dimension_count"), GgufValue::U32(rope_dim as u32));
    w.add_kv(kv("attention.layer_norm_rms_epsilon"), GgufValue::F32(1e-6));
    if let Some(h) = &s.gdn {
        qwen35::add_keys(&mut w, s, h);
    }

    let mut tokens = byte_tokens();
    let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
    tokens.extend(specials.iter().map(|t| t.to_string()));
    let mut types = vec![1i32; 256];
    types.extend([3, 3, 3]);
    // One merge, so the merges array has a string element type (llama.cpp
    // rejects an empty, untyped one).
    tokens.push("Ġt".to_string());
    types.push(1);
    while tokens.len() < s.vocab {
        tokens.push(format!("<extra_{}>", tokens.len()));
        types.push(4);
    }
    w.add_kv("tokenizer.ggml.model", GgufValue::String("gpt2".into()));
    let pre = if s.gdn.is_some() { "qwen35" } else { "default" };
    w.add_kv("tokenizer.ggml.pre", GgufValue::String(pre.into()));
    w.add_kv(
        "tokenizer.ggml.tokens",
        GgufValue::Array(tokens.into_iter().map(GgufValue::String).collect()),
    );
    w.add_kv(
        "tokenizer.ggml.token_type",
        GgufValue::Array(types.into_iter().map(GgufValue::I32).collect()),
    );
    w.add_kv(
        "tokenizer.ggml.merges",
        GgufValue::Array(vec![GgufValue::String("Ġ t".into())]),
    );
    w.add_kv("tokenizer.ggml.bos_token_id", GgufValue::U32(256));
    w.add_kv("tokenizer.ggml.eos_token_id", GgufValue::U32(258));
    w.add_kv("tokenizer.ggml.add_bos_token", GgufValue::Bool(false));
    w.add_kv(
        "tokenizer.chat_template",
        GgufValue::String(
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}".into(),
        ),
    );

    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut next_seed = move || rng.random::<u64>();
    let d = s.dim;
    // Embeddings: unit variance so the first norm sees O(1) activations.
    {
        let data = matrix(next_seed(), s.vocab, d, 1.0, ty).context("tensor token_embd.weight")?;
        w.add_tensor("token_embd.weight", &[d as u64, s.vocab as u64], ty, data)?;
    }
    match &s.gdn {
        Some(h) => qwen35::add_layers(&mut w, s, h, ty, &mut next_seed)?,
        None => add_llama_layers(&mut w, s, ty, &mut next_seed)?,
    }
    add_vector(&mut w, "output_norm.weight", d, next_seed(), 1.0, 0.1)?;
    if !s.tied {
        add_matrix(&mut w, "output.weight", (s.vocab, d), ty, next_seed())?;
    }
    w.write_to(path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// The layers of the llama family (llama, qwen2's q/k/v biases, qwen3's
/// q/k norms).
fn add_llama_layers(
    w: &mut GgufWriter,
    s: &SynthShape,
    ty: GgmlType,
    next_seed: &mut dyn FnMut() -> u64,
) -> Result<()> {
    let a = s.arch;
    let (d, q, kvd, f) = (
        s.dim,
        s.n_heads * s.head_dim,
        s.n_kv_heads * s.head_dim,
        s.ffn_dim,
    );
    let mat = |w: &mut GgufWriter, name: &str, rows: usize, cols: usize, sd: u64| {
        add_matrix(w, name, (rows, cols), ty, sd)
    };
    let vecf = add_vector;
    for i in 0..s.n_layers {
        let n = |x: &str| format!("blk.{i}.{x}");
        vecf(w, &n("attn_norm.weight"), d, next_seed(), 1.0, 0.1)?;
        mat(w, &n("attn_q.weight"), q, d, next_seed())?;
        mat(w, &n("attn_k.weight"), kvd, d, next_seed())?;
        mat(w, &n("attn_v.weight"), kvd, d, next_seed())?;
        mat(w, &n("attn_output.weight"), d, q, next_seed())?;
        if a == "qwen2" {
            vecf(w, &n("attn_q.bias"), q, next_seed(), 0.0, 0.1)?;
            vecf(w, &n("attn_k.bias"), kvd, next_seed(), 0.0, 0.1)?;
            vecf(w, &n("attn_v.bias"), kvd, next_seed(), 0.0, 0.1)?;
        }
        if a == "qwen3" {
            vecf(
                w,
                &n("attn_q_norm.weight"),
                s.head_dim,
                next_seed(),
                1.0,
                0.1,
            )?;
            vecf(
                w,
                &n("attn_k_norm.weight"),
                s.head_dim,
                next_seed(),
                1.0,
                0.1,
            )?;
        }
        vecf(w, &n("ffn_norm.weight"), d, next_seed(), 1.0, 0.1)?;
        mat(w, &n("ffn_gate.weight"), f, d, next_seed())?;
        mat(w, &n("ffn_up.weight"), f, d, next_seed())?;
        mat(w, &n("ffn_down.weight"), d, f, next_seed())?;
    }
    Ok(())
}
