//! Model hyper-parameters read from GGUF metadata.

use crate::gguf::GgufFile;
use crate::model::weights::optional_vector;
use anyhow::{bail, Context, Result};

/// Supported architectures: the llama family shares one graph
/// (`model/arch/llama.rs`) with its differences as flags; `Qwen35` has its
/// own (`model/arch/qwen35.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, SmolLM2, Mistral (GGUF arch `llama`).
    Llama,
    /// Qwen2 / Qwen2.5: q/k/v biases, NEOX RoPE.
    Qwen2,
    /// Qwen3: per-head q/k RMS norm, NEOX RoPE, explicit head dim.
    Qwen3,
    /// Qwen3.5 / 3.6 dense (GGUF arch `qwen35`): Gated DeltaNet layers
    /// with a gated full-attention layer every `full_attention_interval`.
    Qwen35,
}

/// GGUF architectures whose layers route tokens to experts.
const MOE_ARCHS: &[&str] = &["qwen3next", "qwen35moe", "qwen3moe", "mixtral", "olmoe"];

impl Arch {
    pub fn from_gguf_name(name: &str) -> Result<Self> {
        Ok(match name {
            "llama" | "mistral" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "qwen35" => Arch::Qwen35,
            moe if MOE_ARCHS.contains(&moe) => bail!(
                "model architecture '{moe}' needs mixture-of-experts layers, \
                 which Quire does not have yet"
            ),
            other => bail!(
                "unsupported model architecture '{other}' \
                 (supported: llama, mistral, qwen2, qwen3, qwen35)"
            ),
        })
    }

    /// NEOX-style RoPE rotates pairs (i, i + d/2); GGUF llama weights are
    /// permuted for the interleaved (2i, 2i + 1) form. Qwen35's IMROPE is
    /// NEOX rotation on the first `rope_dim` dims when every position
    /// component is the token position (text input).
    pub fn neox_rope(self) -> bool {
        match self {
            Arch::Llama => false,
            Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen35 => true,
        }
    }
}

/// Gated DeltaNet hyper-parameters (`qwen35.ssm.*` keys).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GdnConfig {
    /// K: causal conv taps (`ssm.conv_kernel`).
    pub conv_kernel: usize,
    /// d_k: key head size (`ssm.state_size`).
    pub d_k: usize,
    /// H_k: key heads (`ssm.group_count`).
    pub n_k_heads: usize,
    /// H_v: value heads (`ssm.time_step_rank`), a multiple of H_k; value
    /// head h reads key head h % H_k (GGUF order).
    pub n_v_heads: usize,
    /// d_v = `ssm.inner_size` / H_v; equal to d_k.
    pub d_v: usize,
    /// Every `full_attention_interval`-th layer is full attention.
    pub full_attention_interval: usize,
    /// MTP blocks after the trunk (`nextn_predict_layers`, 0 if absent);
    /// `ModelConfig::n_layers` already excludes them.
    pub n_nextn: usize,
}

impl GdnConfig {
    pub fn key_dim(&self) -> usize {
        self.n_k_heads * self.d_k
    }

    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.d_v
    }

    /// Channels of the causal conv: q, k and v.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
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
    /// Gated DeltaNet hyper-parameters; Some only for `Arch::Qwen35`.
    pub gdn: Option<GdnConfig>,
    /// Attention options every attention layer of a llama-family file
    /// takes from its metadata (`attention.sliding_window`,
    /// `attn_logit_softcapping`, `attention.max_alibi_bias`); plain for
    /// the other architectures.
    pub attn: AttnHparams,
}

/// The metadata's attention options (see [`ModelConfig::attn`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttnHparams {
    /// Keys j visible from position P: P - j < window (None: all).
    pub sliding_window: Option<usize>,
    /// Logit softcap (0: off).
    pub softcap: f32,
    /// ALiBi's maximum bias (0: no ALiBi).
    pub alibi_max_bias: f32,
}

impl AttnHparams {
    fn read(g: &GgufFile, arch_name: &str) -> Result<AttnHparams> {
        let key = |k: &str| format!("{arch_name}.{k}");
        let nonneg = |k: &str, what: &str| -> Result<f32> {
            let k = key(k);
            let v = g.opt_f32(&k)?.unwrap_or(0.0);
            if !(v.is_finite() && v >= 0.0) {
                bail!("{k} is {v}: expected a finite number >= 0 ({what})");
            }
            Ok(v)
        };
        let window = g.opt_u32(&key("attention.sliding_window"))?;
        Ok(AttnHparams {
            sliding_window: window.filter(|&w| w > 0).map(|w| w as usize),
            softcap: nonneg(
                "attn_logit_softcapping",
                "the attention logit softcap, 0: none",
            )?,
            alibi_max_bias: nonneg("attention.max_alibi_bias", "ALiBi's maximum bias, 0: none")?,
        })
    }
}

/// Checks `block_count` against the layers the file holds, before anything
/// is sized by it: at least 1, no more than the tensor count, and the last
/// layer's `attn_norm.weight` present.
fn check_block_count(g: &GgufFile, arch_name: &str, n_layers: usize, n_nextn: usize) -> Result<()> {
    let key = if n_nextn == 0 {
        format!("{arch_name}.block_count")
    } else {
        format!(
            "{arch_name}.block_count ({}) - {arch_name}.nextn_predict_layers ({n_nextn})",
            n_layers + n_nextn
        )
    };
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

/// The counts against the first layer's matrices, so that a wrong count is
/// an error naming its key (the weight loader checks every layer's shapes
/// again, naming the tensor). `attn` is the first attention layer and how
/// many blocks of n_heads * head_dim rows its `attn_q` has (qwen35 stores
/// q and its output gate), or None when no layer has attention.
fn check_layer_shapes(
    g: &GgufFile,
    arch_name: &str,
    dim: usize,
    (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
    ffn_dim: usize,
    attn: Option<(usize, usize)>,
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
    let mut checks = vec![("blk.0.ffn_gate.weight".to_string(), ffn_dim, ffn)];
    if let Some((i, q_mult)) = attn {
        let heads = match q_mult {
            1 => heads,
            m => format!("{m} x {heads} (queries and their output gates)"),
        };
        checks.push((
            format!("blk.{i}.attn_q.weight"),
            q_mult * n_heads * head_dim,
            heads,
        ));
        checks.push((
            format!("blk.{i}.attn_k.weight"),
            n_kv_heads * head_dim,
            kv_heads,
        ));
    }
    for (name, rows, from) in checks {
        let name = name.as_str();
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

/// qwen35's layer schedule: every `full_attention_interval`-th trunk layer
/// is full attention, the others Gated DeltaNet; MTP blocks (index >=
/// n_layers) are never recurrent.
fn recurrent(c: &GdnConfig, n_layers: usize, i: usize) -> bool {
    i < n_layers && !(i + 1).is_multiple_of(c.full_attention_interval)
}

/// Reads the Gated DeltaNet keys of a qwen35 file (`block_count` includes
/// the MTP blocks).
fn read_gdn(g: &GgufFile, arch_name: &str, block_count: usize) -> Result<GdnConfig> {
    let key = |k: &str| format!("{arch_name}.{k}");
    let nextn_key = key("nextn_predict_layers");
    let n_nextn = g.opt_u32(&nextn_key)?.unwrap_or(0) as usize;
    if n_nextn > 0 && n_nextn >= block_count {
        bail!(
            "{nextn_key} is {n_nextn} but {} is {block_count}: the MTP blocks must \
             leave at least one trunk layer",
            key("block_count")
        );
    }
    let k_key = key("ssm.group_count");
    let v_key = key("ssm.time_step_rank");
    let inner_key = key("ssm.inner_size");
    let state_key = key("ssm.state_size");
    let conv_kernel = count(g, &key("ssm.conv_kernel"), "causal conv taps")?;
    let d_k = count(g, &state_key, "the Gated DeltaNet key head size")?;
    let n_k_heads = count(g, &k_key, "Gated DeltaNet key heads")?;
    let n_v_heads = count(g, &v_key, "Gated DeltaNet value heads")?;
    let inner = count(g, &inner_key, "Gated DeltaNet value heads x head size")?;
    if !n_v_heads.is_multiple_of(n_k_heads) {
        bail!(
            "{v_key} is {n_v_heads} and {k_key} is {n_k_heads}: the value head count \
             must be a multiple of the key head count"
        );
    }
    if !inner.is_multiple_of(n_v_heads) {
        bail!("{inner_key} is {inner}, not a multiple of {v_key} ({n_v_heads})");
    }
    let d_v = inner / n_v_heads;
    if d_v != d_k {
        bail!(
            "{inner_key} / {v_key} is {d_v} but {state_key} is {d_k}: value and key \
             heads of different sizes are not supported"
        );
    }
    let interval_key = key("full_attention_interval");
    let full_attention_interval =
        opt_count(g, &interval_key, "layers per full-attention layer")?.unwrap_or(4);
    let c = GdnConfig {
        conv_kernel,
        d_k,
        n_k_heads,
        n_v_heads,
        d_v,
        full_attention_interval,
        n_nextn,
    };
    // Some converters list the schedule explicitly; Quire follows the
    // interval rule, so a list that disagrees is refused, not ignored.
    let list_key = key("attention.recurrent_layers");
    if let Some(v) = g.get(&list_key) {
        let n_layers = block_count - n_nextn;
        let flags: Option<Vec<bool>> = v
            .as_array()
            .map(|a| a.iter().map(|x| x.as_bool()).collect::<Option<_>>())
            .unwrap_or(None);
        let agrees = flags.is_some_and(|f| {
            f.len() >= n_layers && (0..n_layers).all(|i| f[i] == recurrent(&c, n_layers, i))
        });
        if !agrees {
            bail!(
                "{list_key} does not match the schedule of {interval_key} \
                 ({full_attention_interval}), the only one Quire supports"
            );
        }
    }
    Ok(c)
}

/// The Gated DeltaNet counts against the first recurrent layer's tensors,
/// so that a wrong count is an error naming its key.
fn check_gdn_shapes(
    g: &GgufFile,
    arch_name: &str,
    dim: usize,
    c: &GdnConfig,
    n_layers: usize,
) -> Result<()> {
    let Some(i) = (0..n_layers).find(|&i| recurrent(c, n_layers, i)) else {
        return Ok(());
    };
    let key = |k: &str| format!("{arch_name}.{k}");
    let conv = format!(
        "2 x {} ({}) x {} ({}) + {} ({})",
        key("ssm.group_count"),
        c.n_k_heads,
        key("ssm.state_size"),
        c.d_k,
        key("ssm.inner_size"),
        c.value_dim()
    );
    // (tensor, GGUF dims expected, what gives them)
    let checks = [
        (
            "attn_qkv.weight",
            vec![dim, c.conv_dim()],
            format!("embedding_length x ({conv})"),
        ),
        (
            "ssm_conv1d.weight",
            vec![c.conv_kernel, c.conv_dim()],
            format!("{} ({}) x ({conv})", key("ssm.conv_kernel"), c.conv_kernel),
        ),
        (
            "ssm_a",
            vec![c.n_v_heads],
            format!("{} ({})", key("ssm.time_step_rank"), c.n_v_heads),
        ),
    ];
    for (t, want, from) in checks {
        let name = format!("blk.{i}.{t}");
        let Some(info) = g.tensor(&name) else {
            continue; // the weight loader names the missing tensor
        };
        let dims: Vec<usize> = info.dims.iter().map(|&d| d as usize).collect();
        if dims != want {
            bail!("{name} has shape {dims:?} but the metadata gives {want:?} (from {from})");
        }
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
        // Mixtral-style files say arch `llama` and carry an expert count.
        let experts_key = key("expert_count");
        if let Some(n) = g.opt_u32(&experts_key)?.filter(|&n| n > 0) {
            bail!(
                "{experts_key} is {n}: this model needs mixture-of-experts layers, \
                 which Quire does not have yet"
            );
        }
        let block_count = g.get_u32(&key("block_count"))? as usize;
        let gdn = match arch {
            Arch::Qwen35 => Some(read_gdn(g, &arch_name, block_count)?),
            _ => None,
        };
        // MTP blocks sit after the trunk and are not run when decoding.
        let n_nextn = gdn.as_ref().map_or(0, |c| c.n_nextn);
        let n_layers = block_count - n_nextn;
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
            // embedding_length / head_count is not the head size of any
            // published qwen35 model.
            None if arch == Arch::Qwen35 => {
                bail!("{kl_key} is absent: qwen35 models need it to give the head size")
            }
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
        check_block_count(g, &arch_name, n_layers, n_nextn)?;
        let attn = match &gdn {
            None => Some((0, 1)),
            Some(c) => (0..n_layers)
                .find(|&i| !recurrent(c, n_layers, i))
                .map(|i| (i, 2)),
        };
        let heads = (n_heads, n_kv_heads, head_dim);
        check_layer_shapes(g, &arch_name, dim, heads, ffn_dim, attn)?;
        if let Some(c) = &gdn {
            check_gdn_shapes(g, &arch_name, dim, c, n_layers)?;
        }
        check_rope_freqs(g)?;
        let attn = match arch {
            Arch::Qwen35 => AttnHparams::default(),
            _ => AttnHparams::read(g, &arch_name)?,
        };
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
            gdn,
            attn,
        })
    }

    /// Layer `i` is a Gated DeltaNet layer (qwen35: `(i + 1) % interval != 0`);
    /// false for every layer of the other architectures.
    pub fn is_recurrent(&self, i: usize) -> bool {
        self.gdn
            .as_ref()
            .is_some_and(|c| recurrent(c, self.n_layers, i))
    }

    /// The (rope_dim / 2,) RoPE inverse frequencies, computed in f64 then
    /// rounded to f32 so every backend gets the same table; Llama 3.1+
    /// long-context scaling (`rope_freqs.weight`) divides them.
    pub fn rope_inv_freq(&self, g: &GgufFile) -> Result<Vec<f32>> {
        let half = self.rope_dim / 2;
        let base = self.rope_base as f64;
        let mut inv_freq: Vec<f32> = (0..half)
            .map(|i| (1.0f64 / base.powf(2.0 * i as f64 / self.rope_dim as f64)) as f32)
            .collect();
        if let Some(factors) = optional_vector(g, "rope_freqs.weight", half)? {
            for (f, s) in inv_freq.iter_mut().zip(&factors) {
                *f = (*f as f64 / *s as f64) as f32;
            }
        }
        Ok(inv_freq)
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}
