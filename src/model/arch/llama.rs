//! The llama-family graph: Llama 2/3, SmolLM2, Mistral, Qwen2/2.5 (q/k/v
//! bias) and Qwen3 (per-head q/k norm). GQA; tied or separate output.
//!
//! One call runs one step for a batch of rows from any number of
//! sequences (prefill chunks and decode rows mixed). Every op works per row
//! (or per (row, head)), so a row's result never depends on the rest of the
//! batch: batch invariance follows from the backend's per-row arithmetic.

use crate::backend::{AttnBatch, KvLayer, KvLayerMut, Op};
use crate::dispatch::Dispatcher;
use crate::gguf::GgufFile;
use crate::model::config::{Arch, ModelConfig};
use crate::model::kv_storage::KvStorage;
use crate::model::weights::{load_vector, optional_vector, WeightRef};
use crate::model::StepInput;
use anyhow::{bail, Context, Result};

struct Layer {
    attn_norm: Vec<f32>,
    wq: WeightRef,
    wk: WeightRef,
    wv: WeightRef,
    wo: WeightRef,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    w_gate: WeightRef,
    w_up: WeightRef,
    w_down: WeightRef,
}

pub struct LlamaModel {
    pub cfg: ModelConfig,
    token_embd: WeightRef,
    output_norm: Vec<f32>,
    /// `output.weight`, or `token_embd.weight` when tied.
    output: WeightRef,
    layers: Vec<Layer>,
    /// (rope_dim / 2,) inverse frequencies, computed once in f64 then
    /// rounded to f32 so every backend gets the same table.
    inv_freq: Vec<f32>,
}

impl LlamaModel {
    pub fn load(g: &GgufFile, cfg: ModelConfig, progress: &dyn Fn(usize, usize)) -> Result<Self> {
        let (d, q, kv, f) = (cfg.dim, cfg.q_dim(), cfg.kv_dim(), cfg.ffn_dim);
        let token_embd = WeightRef::load(g, "token_embd.weight", cfg.vocab_size, d)?;
        let output = WeightRef::optional(g, "output.weight", cfg.vocab_size, d)?
            .unwrap_or_else(|| token_embd.clone());
        let output_norm = load_vector(g, "output_norm.weight", d)?;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}");
            let (q_norm, k_norm) = if cfg.arch == Arch::Qwen3 {
                (
                    Some(load_vector(g, &n("attn_q_norm.weight"), cfg.head_dim)?),
                    Some(load_vector(g, &n("attn_k_norm.weight"), cfg.head_dim)?),
                )
            } else {
                (None, None)
            };
            layers.push(Layer {
                attn_norm: load_vector(g, &n("attn_norm.weight"), d)?,
                wq: WeightRef::load(g, &n("attn_q.weight"), q, d)?,
                wk: WeightRef::load(g, &n("attn_k.weight"), kv, d)?,
                wv: WeightRef::load(g, &n("attn_v.weight"), kv, d)?,
                wo: WeightRef::load(g, &n("attn_output.weight"), d, q)?,
                bq: optional_vector(g, &n("attn_q.bias"), q)?,
                bk: optional_vector(g, &n("attn_k.bias"), kv)?,
                bv: optional_vector(g, &n("attn_v.bias"), kv)?,
                q_norm,
                k_norm,
                ffn_norm: load_vector(g, &n("ffn_norm.weight"), d)?,
                w_gate: WeightRef::load(g, &n("ffn_gate.weight"), f, d)?,
                w_up: WeightRef::load(g, &n("ffn_up.weight"), f, d)?,
                w_down: WeightRef::load(g, &n("ffn_down.weight"), d, f)?,
            });
            progress(i + 1, cfg.n_layers);
        }
        let half = cfg.rope_dim / 2;
        let mut inv_freq: Vec<f32> = (0..half)
            .map(|i| {
                (1.0f64 / (cfg.rope_base as f64).powf(2.0 * i as f64 / cfg.rope_dim as f64)) as f32
            })
            .collect();
        // Llama 3.1+ long-context scaling ships as per-frequency divisors.
        if let Some(factors) = optional_vector(g, "rope_freqs.weight", half)? {
            for (f, s) in inv_freq.iter_mut().zip(&factors) {
                *f = (*f as f64 / *s as f64) as f32;
            }
        }
        Ok(LlamaModel {
            cfg,
            token_embd,
            output_norm,
            output,
            layers,
            inv_freq,
        })
    }

    /// Runs one step. Writes K/V of every input row into its slot, and
    /// returns logits (input.logit_rows.len(), vocab) for the rows asked.
    pub fn forward(
        &self,
        g: &GgufFile,
        dx: &Dispatcher,
        kv: &mut KvStorage,
        input: &StepInput<'_>,
    ) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let n = input.tokens.len();
        input.validate(c.vocab_size)?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let (d, qd, kvd, hd) = (c.dim, c.q_dim(), c.kv_dim(), c.head_dim);
        let mut x = vec![0f32; n * d]; // (n, dim) residual stream
        dx.run(Op::GetRows {
            table: self.token_embd.matrix(g)?,
            ids: input.tokens,
            out: &mut x,
        })?;
        let mut h = vec![0f32; n * d]; // (n, dim)
        let mut q = vec![0f32; n * qd]; // (n, n_heads, head_dim)
        let mut k = vec![0f32; n * kvd]; // (n, n_kv_heads, head_dim)
        let mut v = vec![0f32; n * kvd];
        let mut att = vec![0f32; n * qd]; // (n, n_heads, head_dim)
        let mut o = vec![0f32; n * d];
        let mut gate = vec![0f32; n * c.ffn_dim]; // (n, ffn)
        let mut up = vec![0f32; n * c.ffn_dim];
        let mut act = vec![0f32; n * c.ffn_dim];
        let batch = AttnBatch {
            block_tables: input.block_tables,
            row_seq: input.row_seq,
            positions: input.positions,
        };
        let scale = 1.0f32 / (hd as f32).sqrt();
        for (li, l) in self.layers.iter().enumerate() {
            dx.run(Op::RmsNorm {
                x: &x,
                w: &l.attn_norm,
                dim: d,
                eps: c.rms_eps,
                out: &mut h,
            })?;
            for (w, b, out) in [
                (&l.wq, &l.bq, &mut q),
                (&l.wk, &l.bk, &mut k),
                (&l.wv, &l.bv, &mut v),
            ] {
                dx.run(Op::MatMul {
                    w: w.matrix(g)?,
                    x: &h,
                    n,
                    out,
                })?;
                if let Some(b) = b {
                    dx.run(Op::AddBias { x: out, bias: b })?;
                }
            }
            if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
                // Per-head RMS norm: view (n, heads, hd) as (n * heads, hd).
                let tmp = q.clone();
                dx.run(Op::RmsNorm {
                    x: &tmp,
                    w: qn,
                    dim: hd,
                    eps: c.rms_eps,
                    out: &mut q,
                })?;
                let tmp = k.clone();
                dx.run(Op::RmsNorm {
                    x: &tmp,
                    w: kn,
                    dim: hd,
                    eps: c.rms_eps,
                    out: &mut k,
                })?;
            }
            for (t, heads) in [(&mut q, c.n_heads), (&mut k, c.n_kv_heads)] {
                dx.run(Op::Rope {
                    x: t,
                    n_heads: heads,
                    head_dim: hd,
                    rope_dim: c.rope_dim,
                    positions: input.positions,
                    inv_freq: &self.inv_freq,
                    neox: c.arch.neox_rope(),
                })?;
            }
            let block_size = kv.block_size();
            let (kc, vc) = kv.layer_mut(li)?;
            dx.run(Op::KvWrite {
                k: &k,
                v: &v,
                slots: input.slots,
                cache: KvLayerMut {
                    k: kc,
                    v: vc,
                    block_size,
                    n_kv_heads: c.n_kv_heads,
                    head_dim: hd,
                },
            })
            .with_context(|| format!("layer {li}"))?;
            let (kc, vc) = kv.layer(li)?;
            dx.run(Op::PagedAttention {
                q: &q,
                n_heads: c.n_heads,
                scale,
                cache: KvLayer {
                    k: kc,
                    v: vc,
                    block_size: kv.block_size(),
                    n_kv_heads: c.n_kv_heads,
                    head_dim: hd,
                },
                batch,
                out: &mut att,
            })
            .with_context(|| format!("layer {li}"))?;
            dx.run(Op::MatMul {
                w: l.wo.matrix(g)?,
                x: &att,
                n,
                out: &mut o,
            })?;
            dx.run(Op::Add { x: &mut x, y: &o })?;
            dx.run(Op::RmsNorm {
                x: &x,
                w: &l.ffn_norm,
                dim: d,
                eps: c.rms_eps,
                out: &mut h,
            })?;
            dx.run(Op::MatMul {
                w: l.w_gate.matrix(g)?,
                x: &h,
                n,
                out: &mut gate,
            })?;
            dx.run(Op::MatMul {
                w: l.w_up.matrix(g)?,
                x: &h,
                n,
                out: &mut up,
            })?;
            dx.run(Op::SwiGlu {
                gate: &gate,
                up: &up,
                out: &mut act,
            })?;
            dx.run(Op::MatMul {
                w: l.w_down.matrix(g)?,
                x: &act,
                n,
                out: &mut o,
            })?;
            dx.run(Op::Add { x: &mut x, y: &o })?;
        }
        // Only the rows that want logits go through the output head.
        let m = input.logit_rows.len();
        if m == 0 {
            return Ok(Vec::new());
        }
        let mut sel = vec![0f32; m * d]; // (m, dim)
        for (i, &r) in input.logit_rows.iter().enumerate() {
            if r >= n {
                bail!("logit row {r} out of range for a step of {n} rows");
            }
            sel[i * d..(i + 1) * d].copy_from_slice(&x[r * d..(r + 1) * d]);
        }
        let mut normed = vec![0f32; m * d];
        dx.run(Op::RmsNorm {
            x: &sel,
            w: &self.output_norm,
            dim: d,
            eps: c.rms_eps,
            out: &mut normed,
        })?;
        let mut logits = vec![0f32; m * c.vocab_size]; // (m, vocab)
        dx.run(Op::MatMul {
            w: self.output.matrix(g)?,
            x: &normed,
            n: m,
            out: &mut logits,
        })?;
        Ok(logits)
    }
}
