//! Model hyper-parameters read from GGUF metadata.

use crate::gguf::GgufFile;
use anyhow::{bail, Context, Result};

/// Architectures of the llama family that share one graph
/// (`model/arch/llama.rs`), with their differences as flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, SmolLM2, Mistral (GGUF arch `llama`).
    Llama,
    /// Qwen2 / Qwen2.5: q/k/v biases, NEOX RoPE.
    Qwen2,
    /// Qwen3: per-head q/k RMS norm, NEOX RoPE, explicit head dim.
    Qwen3,
}

impl Arch {
    pub fn from_gguf_name(name: &str) -> Result<Self> {
        Ok(match name {
            "llama" | "mistral" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            other => bail!(
                "unsupported model architecture '{other}' (supported: llama, mistral, qwen2, qwen3)"
            ),
        })
    }

    /// NEOX-style RoPE rotates pairs (i, i + d/2); GGUF llama weights are
    /// permuted for the interleaved (2i, 2i + 1) form.
    pub fn neox_rope(self) -> bool {
        match self {
            Arch::Llama => false,
            Arch::Qwen2 | Arch::Qwen3 => true,
        }
    }
}

#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub arch: Arch,
    /// The GGUF `general.architecture` string (metadata key prefix).
    pub arch_name: String,
    pub n_layers: usize,
    pub dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub vocab_size: usize,
    pub rope_base: f32,
    pub rope_dim: usize,
    pub rms_eps: f32,
    pub context_length: usize,
}

/// Checks `block_count` against the layers the file holds, before anything
/// is sized by it: at least 1, no more than the tensor count, and the last
/// layer's `attn_norm.weight` present.
fn check_block_count(g: &GgufFile, arch_name: &str, n_layers: usize) -> Result<()> {
    let key = format!("{arch_name}.block_count");
    let n_tensors = g.tensors().len();
    if n_layers == 0 {
        bail!("{key} is 0: a model needs at least one layer");
    }
    if n_layers > n_tensors {
        bail!("{key} is {n_layers} but the file holds only {n_tensors} tensors");
    }
    let last = format!("blk.{}.attn_norm.weight", n_layers - 1);
    if g.tensor(&last).is_none() {
        bail!(
            "{key} is {n_layers} but the file has no tensor {last} (it holds {n_tensors} tensors)"
        );
    }
    Ok(())
}

/// A count read from metadata that must be at least 1.
fn count(g: &GgufFile, key: &str, what: &str) -> Result<usize> {
    let v = g.get_u32(key)? as usize;
    positive(key, v, what)
}

/// An optional count: absent is None, present must be at least 1.
fn opt_count(g: &GgufFile, key: &str, what: &str) -> Result<Option<usize>> {
    g.opt_u32(key)?
        .map(|v| positive(key, v as usize, what))
        .transpose()
}

fn positive(key: &str, v: usize, what: &str) -> Result<usize> {
    if v == 0 {
        bail!("{key} is 0: expected at least 1 ({what})");
    }
    Ok(v)
}

/// An optional float hyper-parameter: absent takes `default`; present must
/// be finite and inside `(0, max)`. NaN, infinite, zero or negative values
/// would not fail later: they turn every activation into NaN or garbage.
fn positive_float(g: &GgufFile, key: &str, default: f32, max: f32, what: &str) -> Result<f32> {
    let Some(v) = g.opt_f32(key)? else {
        return Ok(default);
    };
    if !(v.is_finite() && v > 0.0 && v < max) {
        let range = if max.is_finite() {
            format!("a finite number in (0, {max})")
        } else {
            "a finite number > 0".to_string()
        };
        bail!("{key} is {v}: expected {range} ({what})");
    }
    Ok(v)
}

/// The counts against layer 0's matrices, so that a wrong count is an
/// error naming its key (the weight loader checks every layer's shapes
/// again, naming the tensor).
fn check_layer_shapes(
    g: &GgufFile,
    arch_name: &str,
    dim: usize,
    (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
    ffn_dim: usize,
) -> Result<()> {
    let key = |k: &str| format!("{arch_name}.{k}");
    let heads = format!(
        "{} ({n_heads}) x the head size ({head_dim})",
        key("attention.head_count")
    );
    let kv_heads = format!(
        "{} ({n_kv_heads}) x the head size ({head_dim})",
        key("attention.head_count_kv")
    );
    let ffn = format!("{} ({ffn_dim})", key("feed_forward_length"));
    // (tensor, rows expected, what gives them); every row has `dim` columns.
    let checks = [
        ("blk.0.attn_q.weight", n_heads * head_dim, heads),
        ("blk.0.attn_k.weight", n_kv_heads * head_dim, kv_heads),
        ("blk.0.ffn_gate.weight", ffn_dim, ffn),
    ];
    for (name, rows, from) in checks {
        let Some(t) = g.tensor(name) else {
            continue; // the weight loader names the missing tensor
        };
        if t.dims.len() != 2 || t.dims[0] as usize != dim || t.dims[1] as usize != rows {
            bail!(
                "{name} has shape {:?} but the metadata gives [{dim}, {rows}] \
                 ({} is {dim}; rows from {from})",
                t.dims,
                key("embedding_length")
            );
        }
    }
    Ok(())
}

/// `rope_freqs.weight` (Llama 3.1+ long-context scaling) divides each RoPE
/// frequency: every factor must be finite and positive.
fn check_rope_freqs(g: &GgufFile) -> Result<()> {
    let name = "rope_freqs.weight";
    if g.tensor(name).is_none() {
        return Ok(());
    }
    let factors = g.tensor_f32(name)?;
    if let Some((i, f)) = factors
        .iter()
        .enumerate()
        .find(|(_, f)| !(f.is_finite() && **f > 0.0))
    {
        bail!("tensor {name}[{i}] is {f}: expected a finite number > 0 (a RoPE frequency divisor)");
    }
    Ok(())
}

impl ModelConfig {
    /// Reads and checks the hyper-parameters: counts are at least 1 and
    /// consistent with each other and with the file's tensors, floats are
    /// finite and positive. Errors name the key, its value and what was
    /// expected.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let arch_name = g.arch()?.to_string();
        let arch = Arch::from_gguf_name(&arch_name)?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let n_layers = g.get_u32(&key("block_count"))? as usize;
        let dim = count(g, &key("embedding_length"), "the hidden size")?;
        let head_key = key("attention.head_count");
        let n_heads = count(g, &head_key, "attention heads")?;
        let kv_key = key("attention.head_count_kv");
        let n_kv_heads = opt_count(g, &kv_key, "key/value heads")?.unwrap_or(n_heads);
        let ffn_dim = count(g, &key("feed_forward_length"), "the feed-forward size")?;
        if !n_heads.is_multiple_of(n_kv_heads) {
            bail!(
                "{head_key} is {n_heads} and {kv_key} is {n_kv_heads}: \
                 the head count must be a multiple of the key/value head count"
            );
        }
        let kl_key = key("attention.key_length");
        let head_dim = match opt_count(g, &kl_key, "the head size")? {
            Some(v) => v,
            None => {
                if !dim.is_multiple_of(n_heads) {
                    bail!(
                        "{} is {dim}, not a multiple of {head_key} ({n_heads}), \
                         and {} is absent to give the head size",
                        key("embedding_length"),
                        kl_key
                    );
                }
                dim / n_heads
            }
        };
        // The graph has one head size for keys and values.
        if let Some(v) = g.opt_u32(&key("attention.value_length"))? {
            if v as usize != head_dim {
                bail!(
                    "{} is {v} but the key head size ({kl_key}, or embedding_length / \
                     head_count) is {head_dim}: keys and values of different sizes are \
                     not supported",
                    key("attention.value_length")
                );
            }
        }
        let rope_key = key("rope.dimension_count");
        let rope_dim = opt_count(g, &rope_key, "rotated dimensions per head")?.unwrap_or(head_dim);
        if rope_dim > head_dim || rope_dim % 2 != 0 {
            bail!("{rope_key} is {rope_dim}: expected an even number at most the head size {head_dim}");
        }
        let rope_base = positive_float(
            g,
            &key("rope.freq_base"),
            10000.0,
            f32::INFINITY,
            "the RoPE base frequency, typically 10000 to 1000000",
        )?;
        let rms_eps = positive_float(
            g,
            &key("attention.layer_norm_rms_epsilon"),
            1e-5,
            1.0,
            "the RMS norm epsilon, typically 1e-6 or 1e-5",
        )?;
        let context_length =
            opt_count(g, &key("context_length"), "the trained context length")?.unwrap_or(4096);
        let embd = g
            .tensor("token_embd.weight")
            .context("missing tensor token_embd.weight")?;
        let vocab_size = embd.dims.get(1).copied().unwrap_or(0) as usize;
        if vocab_size == 0 {
            bail!("token_embd.weight has no vocabulary dimension");
        }
        if embd.dims[0] as usize != dim {
            bail!(
                "{arch_name}.embedding_length is {dim} but token_embd.weight has rows of {}",
                embd.dims[0]
            );
        }
        // A tokenizer id past the embedding rows would read outside the
        // table; a row without a token could be sampled but not decoded.
        if let Some(n) = g
            .get("tokenizer.ggml.tokens")
            .and_then(|v| v.as_array())
            .map(<[_]>::len)
        {
            if n != vocab_size {
                bail!(
                    "tokenizer.ggml.tokens has {n} entries but token_embd.weight has \
                     {vocab_size} rows: the vocabulary sizes must match"
                );
            }
        }
        check_block_count(g, &arch_name, n_layers)?;
        check_layer_shapes(g, &arch_name, dim, (n_heads, n_kv_heads, head_dim), ffn_dim)?;
        check_rope_freqs(g)?;
        Ok(ModelConfig {
            arch,
            arch_name,
            n_layers,
            dim,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim,
            vocab_size,
            rope_base,
            rope_dim,
            rms_eps,
            context_length,
        })
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}
