//! Qwen3.5 / 3.6 dense (GGUF arch `qwen35`): Gated DeltaNet (GDN) layers,
//! with a gated full-attention layer every `full_attention_interval`
//! layers, each followed by a SwiGLU FFN; pre-norm, two residuals.
//!
//! Weights stay in GGUF order. The converter permuted every per-value-head
//! tensor (V rows of `attn_qkv`, V conv channels, `attn_gate`, `ssm_beta`,
//! `ssm_alpha`, `ssm_dt`, `ssm_a`, `ssm_out` columns) so that value head h
//! reads key head `h % H_k`. Norm weights are final multipliers (the
//! converter added 1 to all but `ssm_norm`).

use crate::gguf::GgufFile;
use crate::model::config::{Arch, GdnConfig, ModelConfig};
use crate::model::weights::{load_vector, HostStore, Store, WeightRef};
use anyhow::{ensure, Context, Result};

/// One Gated DeltaNet mixer's weights.
pub struct GdnLayer<S: Store> {
    /// (conv_dim, dim): rows [Q (H_k·d_k) ; K (H_k·d_k) ; V (H_v·d_v)].
    pub(crate) w_qkv: S::Mat,
    /// (value_dim, dim): the output gate z, per value head.
    pub(crate) w_z: S::Mat,
    /// (H_v, dim): the write strength β (before sigmoid).
    pub(crate) w_beta: S::Mat,
    /// (H_v, dim): the decay input α (feeds g with dt_bias and ssm_a).
    pub(crate) w_alpha: S::Mat,
    /// (conv_dim * K,): row c holds channel c's K taps, tap K-1 on the
    /// current token and tap 0 on the token K-1 steps back.
    pub(crate) conv_w: S::Vec,
    /// (H_v,)
    pub(crate) dt_bias: S::Vec,
    /// (H_v,) = -exp(A_log), as stored: already negative.
    pub(crate) ssm_a: S::Vec,
    /// (d_v,) the gated RMS norm's weight, shared by every value head.
    pub(crate) ssm_norm: S::Vec,
    /// (dim, value_dim)
    pub(crate) w_out: S::Mat,
}

/// One gated full-attention mixer's weights.
pub struct AttnLayer<S: Store> {
    /// (2 * n_heads * head_dim, dim): per head [q (head_dim) | gate (head_dim)].
    pub(crate) wq: S::Mat,
    /// (n_kv_heads * head_dim, dim)
    pub(crate) wk: S::Mat,
    /// (n_kv_heads * head_dim, dim)
    pub(crate) wv: S::Mat,
    /// (dim, n_heads * head_dim)
    pub(crate) wo: S::Mat,
    /// (head_dim,) per-head RMS norm before RoPE.
    pub(crate) q_norm: S::Vec,
    /// (head_dim,)
    pub(crate) k_norm: S::Vec,
}

/// A layer's token mixer: which one follows `ModelConfig::is_recurrent`.
pub enum Mixer<S: Store> {
    Gdn(GdnLayer<S>),
    Attn(AttnLayer<S>),
}

/// One decoder layer's weights.
pub struct Qwen35Layer<S: Store> {
    /// (dim,)
    pub(crate) attn_norm: S::Vec,
    pub(crate) mixer: Mixer<S>,
    /// (dim,) `post_attention_norm.weight`: the norm before the FFN.
    pub(crate) post_norm: S::Vec,
    /// (ffn_dim, dim)
    pub(crate) w_gate: S::Mat,
    /// (ffn_dim, dim)
    pub(crate) w_up: S::Mat,
    /// (dim, ffn_dim)
    pub(crate) w_down: S::Mat,
}

/// All trunk weights of a qwen35 model (MTP blocks are not loaded).
pub struct Qwen35Weights<S: Store> {
    /// (vocab, dim)
    pub(crate) token_embd: S::Mat,
    /// (dim,)
    pub(crate) output_norm: S::Vec,
    /// (vocab, dim): `output.weight`, or `token_embd.weight` when tied.
    pub(crate) output: S::Mat,
    pub(crate) layers: Vec<Qwen35Layer<S>>,
    /// (rope_dim / 2,) as `ModelConfig::rope_inv_freq` computes it.
    pub(crate) inv_freq: S::Vec,
}

impl<S: Store> Qwen35Weights<S> {
    /// The same weights moved to another store (e.g. uploaded to a device),
    /// matrix by matrix; `progress(done, total)` counts layers.
    pub fn map<T: Store>(
        &self,
        mat: &mut dyn FnMut(&S::Mat) -> Result<T::Mat>,
        vec: &mut dyn FnMut(&S::Vec) -> Result<T::Vec>,
        progress: &dyn Fn(usize, usize),
    ) -> Result<Qwen35Weights<T>> {
        let mut layers = Vec::with_capacity(self.layers.len());
        for (i, l) in self.layers.iter().enumerate() {
            let mixer = match &l.mixer {
                Mixer::Gdn(m) => Mixer::Gdn(GdnLayer {
                    w_qkv: mat(&m.w_qkv)?,
                    w_z: mat(&m.w_z)?,
                    w_beta: mat(&m.w_beta)?,
                    w_alpha: mat(&m.w_alpha)?,
                    conv_w: vec(&m.conv_w)?,
                    dt_bias: vec(&m.dt_bias)?,
                    ssm_a: vec(&m.ssm_a)?,
                    ssm_norm: vec(&m.ssm_norm)?,
                    w_out: mat(&m.w_out)?,
                }),
                Mixer::Attn(m) => Mixer::Attn(AttnLayer {
                    wq: mat(&m.wq)?,
                    wk: mat(&m.wk)?,
                    wv: mat(&m.wv)?,
                    wo: mat(&m.wo)?,
                    q_norm: vec(&m.q_norm)?,
                    k_norm: vec(&m.k_norm)?,
                }),
            };
            layers.push(Qwen35Layer {
                attn_norm: vec(&l.attn_norm)?,
                mixer,
                post_norm: vec(&l.post_norm)?,
                w_gate: mat(&l.w_gate)?,
                w_up: mat(&l.w_up)?,
                w_down: mat(&l.w_down)?,
            });
            progress(i + 1, self.layers.len());
        }
        Ok(Qwen35Weights {
            token_embd: mat(&self.token_embd)?,
            output_norm: vec(&self.output_norm)?,
            output: mat(&self.output)?,
            layers,
            inv_freq: vec(&self.inv_freq)?,
        })
    }
}

/// A qwen35 model: its config and its host (mmap) weights.
pub struct Qwen35Model {
    pub cfg: ModelConfig,
    pub weights: Qwen35Weights<HostStore>,
}

impl Qwen35Model {
    /// Loads the trunk's weights (layers 0..n_layers; MTP blocks after them
    /// are skipped), checking every tensor's shape against `cfg`; errors
    /// name the tensor.
    pub fn load(g: &GgufFile, cfg: ModelConfig, progress: &dyn Fn(usize, usize)) -> Result<Self> {
        ensure!(
            cfg.arch == Arch::Qwen35,
            "Qwen35Model::load needs a qwen35 config, got {:?}",
            cfg.arch
        );
        let gdn = cfg
            .gdn
            .clone()
            .context("a qwen35 config without Gated DeltaNet parameters")?;
        let (d, f) = (cfg.dim, cfg.ffn_dim);
        let token_embd = WeightRef::load(g, "token_embd.weight", cfg.vocab_size, d)?;
        let output = WeightRef::optional(g, "output.weight", cfg.vocab_size, d)?
            .unwrap_or_else(|| token_embd.clone());
        let output_norm = load_vector(g, "output_norm.weight", d)?;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}");
            let mixer = if cfg.is_recurrent(i) {
                Mixer::Gdn(load_gdn(g, &cfg, &gdn, i)?)
            } else {
                Mixer::Attn(load_attn(g, &cfg, i)?)
            };
            layers.push(Qwen35Layer {
                attn_norm: load_vector(g, &n("attn_norm.weight"), d)?,
                mixer,
                post_norm: load_vector(g, &n("post_attention_norm.weight"), d)?,
                w_gate: WeightRef::load(g, &n("ffn_gate.weight"), f, d)?,
                w_up: WeightRef::load(g, &n("ffn_up.weight"), f, d)?,
                w_down: WeightRef::load(g, &n("ffn_down.weight"), d, f)?,
            });
            progress(i + 1, cfg.n_layers);
        }
        let inv_freq = cfg.rope_inv_freq(g)?;
        Ok(Qwen35Model {
            cfg,
            weights: Qwen35Weights {
                token_embd,
                output_norm,
                output,
                layers,
                inv_freq,
            },
        })
    }
}

/// Layer `i`'s Gated DeltaNet tensors.
fn load_gdn(
    g: &GgufFile,
    cfg: &ModelConfig,
    c: &GdnConfig,
    i: usize,
) -> Result<GdnLayer<HostStore>> {
    let n = |s: &str| format!("blk.{i}.{s}");
    let d = cfg.dim;
    let (conv_dim, hv) = (c.conv_dim(), c.n_v_heads);
    // The conv weight is a [K, conv_dim] matrix in GGUF order (K taps
    // contiguous per channel); checking it as one rejects a transposed or
    // 3-D file whose element count happens to match.
    let w_qkv = WeightRef::load(g, &n("attn_qkv.weight"), conv_dim, d)?;
    let conv_name = n("ssm_conv1d.weight");
    WeightRef::load(g, &conv_name, conv_dim, c.conv_kernel)?;
    Ok(GdnLayer {
        w_qkv,
        w_z: WeightRef::load(g, &n("attn_gate.weight"), c.value_dim(), d)?,
        w_beta: WeightRef::load(g, &n("ssm_beta.weight"), hv, d)?,
        w_alpha: WeightRef::load(g, &n("ssm_alpha.weight"), hv, d)?,
        conv_w: load_vector(g, &conv_name, conv_dim * c.conv_kernel)?,
        dt_bias: load_vector(g, &n("ssm_dt.bias"), hv)?,
        // No `.weight` suffix: llama.cpp's name for A.
        ssm_a: load_vector(g, &n("ssm_a"), hv)?,
        ssm_norm: load_vector(g, &n("ssm_norm.weight"), c.d_v)?,
        w_out: WeightRef::load(g, &n("ssm_out.weight"), d, c.value_dim())?,
    })
}

/// Layer `i`'s gated full-attention tensors.
fn load_attn(g: &GgufFile, cfg: &ModelConfig, i: usize) -> Result<AttnLayer<HostStore>> {
    let n = |s: &str| format!("blk.{i}.{s}");
    let (d, q, kv, hd) = (cfg.dim, cfg.q_dim(), cfg.kv_dim(), cfg.head_dim);
    Ok(AttnLayer {
        wq: WeightRef::load(g, &n("attn_q.weight"), 2 * q, d)?,
        wk: WeightRef::load(g, &n("attn_k.weight"), kv, d)?,
        wv: WeightRef::load(g, &n("attn_v.weight"), kv, d)?,
        wo: WeightRef::load(g, &n("attn_output.weight"), d, q)?,
        q_norm: load_vector(g, &n("attn_q_norm.weight"), hd)?,
        k_norm: load_vector(g, &n("attn_k_norm.weight"), hd)?,
    })
}

// The forward graph follows.
