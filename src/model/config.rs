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

impl ModelConfig {
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let arch_name = g.arch()?.to_string();
        let arch = Arch::from_gguf_name(&arch_name)?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let n_layers = g.get_u32(&key("block_count"))? as usize;
        let dim = g.get_u32(&key("embedding_length"))? as usize;
        let n_heads = g.get_u32(&key("attention.head_count"))? as usize;
        let n_kv_heads = g
            .opt_u32(&key("attention.head_count_kv"))?
            .map(|v| v as usize)
            .unwrap_or(n_heads);
        let ffn_dim = g.get_u32(&key("feed_forward_length"))? as usize;
        if n_heads == 0 || n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
            bail!("bad head counts: {n_heads} heads, {n_kv_heads} kv heads (heads must be a multiple of kv heads)");
        }
        let head_dim = match g.opt_u32(&key("attention.key_length"))? {
            Some(v) => v as usize,
            None => {
                if !dim.is_multiple_of(n_heads) {
                    bail!("embedding_length {dim} is not a multiple of head_count {n_heads}");
                }
                dim / n_heads
            }
        };
        let rope_dim = g
            .opt_u32(&key("rope.dimension_count"))?
            .map(|v| v as usize)
            .unwrap_or(head_dim);
        if rope_dim > head_dim || rope_dim % 2 != 0 {
            bail!("rope.dimension_count {rope_dim} must be even and at most head dim {head_dim}");
        }
        let rope_base = g.opt_f32(&key("rope.freq_base"))?.unwrap_or(10000.0);
        let rms_eps = g
            .opt_f32(&key("attention.layer_norm_rms_epsilon"))?
            .unwrap_or(1e-5);
        let context_length = g
            .opt_u32(&key("context_length"))?
            .map(|v| v as usize)
            .unwrap_or(4096);
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
        check_block_count(g, &arch_name, n_layers)?;
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
