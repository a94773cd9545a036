//! Synthetic qwen35 models (Qwen3.5 dense) in llama.cpp's layout: Gated
//! DeltaNet layers with a gated full-attention layer every
//! `full_attention_interval`, and optionally the MTP block after the trunk.
//!
//! Values follow what the converter writes: `ssm_a` = -exp(A_log) is
//! negative, norm weights are final multipliers around 1 (including
//! `ssm_norm`), `ssm_conv1d` is stored as [K, conv_dim] in F32.

use super::{add_matrix, add_vector, f32_bytes, normals, SynthShape};
use crate::gguf::{GgufValue, GgufWriter};
use crate::quant::GgmlType;
use anyhow::Result;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// The Gated DeltaNet part of a qwen35 shape (d_v = d_k).
#[derive(Clone, Debug, PartialEq)]
pub struct SynthGdn {
    /// Rotated dims per attention head (`rope.dimension_count`).
    pub rope_dim: usize,
    pub conv_kernel: usize,
    /// Key (and value) head size.
    pub d_k: usize,
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub full_attention_interval: usize,
    /// MTP blocks written after the trunk (counted in `block_count`).
    pub nextn: usize,
}

impl SynthGdn {
    fn conv_dim(&self) -> usize {
        (2 * self.n_k_heads + self.n_v_heads) * self.d_k
    }

    fn recurrent(&self, n_layers: usize, i: usize) -> bool {
        i < n_layers && !(i + 1).is_multiple_of(self.full_attention_interval)
    }
}

/// A published Qwen3.5 dense size: everything but these is common to all
/// of them (head_dim 256, 64 rotated dims, rope base 1e7, vocab 248320,
/// 16 key heads of 128 for the GDN layers, conv kernel 4, interval 4).
pub(super) const fn shape(
    name: &'static str,
    n_layers: usize,
    dim: usize,
    (n_heads, n_kv_heads): (usize, usize),
    ffn_dim: usize,
    n_v_heads: usize,
    tied: bool,
) -> SynthShape {
    SynthShape {
        name,
        arch: "qwen35",
        n_layers,
        dim,
        n_heads,
        n_kv_heads,
        head_dim: 256,
        ffn_dim,
        vocab: 248320,
        context_length: 262144,
        rope_base: 1e7,
        tied,
        gdn: Some(SynthGdn {
            rope_dim: 64,
            conv_kernel: 4,
            d_k: 128,
            n_k_heads: 16,
            n_v_heads,
            full_attention_interval: 4,
            nextn: 0,
        }),
    }
}

/// A small shape with the published head sizes (attention heads of 256,
/// key and value heads of 128, two value heads per key head): 6 GDN and 2
/// attention layers, for device tests where the kernels' real geometry
/// matters but the model must build in seconds.
pub(super) const SMALL: SynthShape = SynthShape {
    name: "qwen35-small",
    arch: "qwen35",
    n_layers: 8,
    dim: 512,
    n_heads: 4,
    n_kv_heads: 2,
    head_dim: 256,
    ffn_dim: 1024,
    vocab: 4096,
    context_length: 4096,
    rope_base: 1e7,
    tied: false,
    gdn: Some(SynthGdn {
        rope_dim: 64,
        conv_kernel: 4,
        d_k: 128,
        n_k_heads: 4,
        n_v_heads: 8,
        full_attention_interval: 4,
        nextn: 0,
    }),
};

/// The tiny test shape: 3 GDN layers and 1 attention layer, two value
/// heads per key head (so the tiled head mapping matters), partial RoPE.
pub(super) const TINY: SynthShape = tiny("qwen35-tiny", 0, false);
/// TINY plus one MTP block (`blk.4.*`), with tied embeddings.
pub(super) const TINY_MTP: SynthShape = tiny("qwen35-tiny-mtp", 1, true);

const fn tiny(name: &'static str, nextn: usize, tied: bool) -> SynthShape {
    SynthShape {
        name,
        arch: "qwen35",
        n_layers: 4,
        dim: 64,
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 32,
        ffn_dim: 128,
        vocab: 384,
        context_length: 2048,
        rope_base: 1e7,
        tied,
        gdn: Some(SynthGdn {
            rope_dim: 8,
            conv_kernel: 4,
            d_k: 16,
            n_k_heads: 2,
            n_v_heads: 4,
            full_attention_interval: 4,
            nextn,
        }),
    }
}

/// The qwen35-only metadata keys.
pub(super) fn add_keys(w: &mut GgufWriter, s: &SynthShape, h: &SynthGdn) {
    let kv = |k: &str| format!("{}.{k}", s.arch);
    let u = |v: usize| GgufValue::U32(v as u32);
    // IMROPE sections (T, H, W, extra) over rope_dim / 2 frequencies:
    // [11, 11, 10, 0] for 64 rotated dims. Text positions make them moot.
    let half = h.rope_dim / 2;
    let (b, rem) = (half / 3, half % 3);
    let sections = [b + usize::from(rem > 0), b + usize::from(rem > 1), b, 0];
    w.add_kv(
        kv("rope.dimension_sections"),
        GgufValue::Array(sections.iter().map(|&x| GgufValue::I32(x as i32)).collect()),
    );
    w.add_kv(kv("ssm.conv_kernel"), u(h.conv_kernel));
    w.add_kv(kv("ssm.state_size"), u(h.d_k));
    w.add_kv(kv("ssm.group_count"), u(h.n_k_heads));
    w.add_kv(kv("ssm.time_step_rank"), u(h.n_v_heads));
    w.add_kv(kv("ssm.inner_size"), u(h.n_v_heads * h.d_k));
    w.add_kv(kv("full_attention_interval"), u(h.full_attention_interval));
    if h.nextn > 0 {
        w.add_kv(kv("nextn_predict_layers"), u(h.nextn));
    }
}

/// Writes blocks 0..n_layers + nextn: the trunk's GDN and attention
/// layers, then the MTP blocks (an attention layer plus the `nextn.*`
/// tensors).
pub(super) fn add_layers(
    w: &mut GgufWriter,
    s: &SynthShape,
    h: &SynthGdn,
    ty: GgmlType,
    next_seed: &mut dyn FnMut() -> u64,
) -> Result<()> {
    let (d, f, hd) = (s.dim, s.ffn_dim, s.head_dim);
    let (q, kvd) = (s.n_heads * hd, s.n_kv_heads * hd);
    let (hv, vd, conv) = (h.n_v_heads, h.n_v_heads * h.d_k, h.conv_dim());
    // Vectors draw from their own stream, seeded from the caller's.
    let mut rng = ChaCha8Rng::seed_from_u64(next_seed());
    let mut mat = |w: &mut GgufWriter, name: &str, rows: usize, cols: usize| {
        add_matrix(w, name, (rows, cols), ty, next_seed())
    };
    // Norm-like vectors: around 1 (final multipliers).
    let norm = |w: &mut GgufWriter, name: &str, n: usize, seed: u64| {
        add_vector(w, name, n, seed, 1.0, 0.1)
    };
    for i in 0..s.n_layers + h.nextn {
        let n = |x: &str| format!("blk.{i}.{x}");
        norm(w, &n("attn_norm.weight"), d, rng_seed(&mut rng))?;
        if h.recurrent(s.n_layers, i) {
            mat(w, &n("attn_qkv.weight"), conv, d)?;
            mat(w, &n("attn_gate.weight"), vd, d)?;
            mat(w, &n("ssm_beta.weight"), hv, d)?;
            mat(w, &n("ssm_alpha.weight"), hv, d)?;
            // Each channel's taps sum to about one input's scale.
            let k = h.conv_kernel;
            let taps = normals(&mut rng, conv * k, 1.0 / (k as f32).sqrt(), 0.0);
            let dims = [k as u64, conv as u64];
            w.add_tensor(
                n("ssm_conv1d.weight"),
                &dims,
                GgmlType::F32,
                f32_bytes(&taps),
            )?;
            add_vector(w, &n("ssm_dt.bias"), hv, rng_seed(&mut rng), 1.0, 0.5)?;
            // -exp(A_log): negative, magnitudes around 1 (decays e^g in (0, 1)).
            let a: Vec<f32> = normals(&mut rng, hv, 0.5, 0.0)
                .iter()
                .map(|x| -x.exp())
                .collect();
            w.add_tensor(n("ssm_a"), &[hv as u64], GgmlType::F32, f32_bytes(&a))?;
            norm(w, &n("ssm_norm.weight"), h.d_k, rng_seed(&mut rng))?;
            mat(w, &n("ssm_out.weight"), d, vd)?;
        } else {
            // q and its output gate, interleaved per head.
            mat(w, &n("attn_q.weight"), 2 * q, d)?;
            mat(w, &n("attn_k.weight"), kvd, d)?;
            mat(w, &n("attn_v.weight"), kvd, d)?;
            mat(w, &n("attn_output.weight"), d, q)?;
            norm(w, &n("attn_q_norm.weight"), hd, rng_seed(&mut rng))?;
            norm(w, &n("attn_k_norm.weight"), hd, rng_seed(&mut rng))?;
        }
        norm(w, &n("post_attention_norm.weight"), d, rng_seed(&mut rng))?;
        mat(w, &n("ffn_gate.weight"), f, d)?;
        mat(w, &n("ffn_up.weight"), f, d)?;
        mat(w, &n("ffn_down.weight"), d, f)?;
        if i >= s.n_layers {
            // [embedding ; hidden] -> hidden.
            mat(w, &n("nextn.eh_proj.weight"), d, 2 * d)?;
            norm(w, &n("nextn.enorm.weight"), d, rng_seed(&mut rng))?;
            norm(w, &n("nextn.hnorm.weight"), d, rng_seed(&mut rng))?;
            norm(
                w,
                &n("nextn.shared_head_norm.weight"),
                d,
                rng_seed(&mut rng),
            )?;
        }
    }
    Ok(())
}

fn rng_seed(rng: &mut ChaCha8Rng) -> u64 {
    rand::Rng::random(rng)
}
