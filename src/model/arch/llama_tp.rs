//! A llama-family model cut into one tensor-parallel rank's share (`backend::tp`):
//! its query and KV heads, its FFN columns, and the attention output and
//! FFN down projections cut as the mode's [`Layout`] says. Norms, RoPE
//! frequencies, the embeddings and the output head stay whole (every rank
//! holds the same residual stream; rank 0 reads the head).

use super::llama::{Layer, LlamaModel, LlamaWeights};
use crate::backend::tp::{shapes, Layout, TpRank};
use crate::gguf::GgufFile;
use crate::model::shard::{cut, part, Cut};
use crate::model::weights::WeightRef;
use anyhow::{bail, Context, Result};

impl LlamaModel {
    /// Rank `t.rank`'s share of the model, split `t.world` ways (an error
    /// naming the dimension that does not divide). The weights it cuts are
    /// copied out of the mmap; the whole ones are shared.
    pub fn shard(&self, g: &GgufFile, t: TpRank) -> Result<LlamaModel> {
        self.cut_rank(g, t)
            .with_context(|| format!("cutting tensor-parallel rank {} of {}", t.rank, t.world))
    }

    fn cut_rank(&self, g: &GgufFile, t: TpRank) -> Result<LlamaModel> {
        let c = &self.cfg;
        let w = &self.weights;
        if w.tp.is_some() {
            bail!("the model is already a tensor-parallel shard");
        }
        // The largest block among the weights whose k a Reduce layout cuts.
        let block = w
            .layers
            .iter()
            .flat_map(|l| [l.wo.ty.block_size(), l.w_down.ty.block_size()])
            .max()
            .unwrap_or(1);
        let s = shapes(
            (c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.dim),
            t.world,
            t.layout,
            block,
        )?;
        let (r, n) = (t.rank, t.world);
        let hd = c.head_dim;
        let heads = part(c.n_heads, r, n);
        let q_rows = heads.start * hd..heads.end * hd;
        let kv = part(c.n_kv_heads, r, n);
        let kv_rows = kv.start * hd..kv.end * hd;
        let ffn = part(c.ffn_dim, r, n);
        let rows =
            |m: &WeightRef, range: &std::ops::Range<usize>| cut(g, m, &Cut::Rows(range.clone()));
        let slice = |v: &Option<Vec<f32>>, range: &std::ops::Range<usize>| {
            v.as_ref().map(|v| v[range.clone()].to_vec())
        };
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            let (wo, w_down) = match t.layout {
                Layout::Gather => {
                    let out = part(c.dim, r, n);
                    (rows(&l.wo, &out)?, rows(&l.w_down, &out)?)
                }
                Layout::Reduce(_) => (
                    cut(g, &l.wo, &Cut::Cols(q_rows.clone()))?,
                    cut(g, &l.w_down, &Cut::Cols(ffn.clone()))?,
                ),
            };
            layers.push(Layer {
                attn_norm: l.attn_norm.clone(),
                wq: rows(&l.wq, &q_rows)?,
                wk: rows(&l.wk, &kv_rows)?,
                wv: rows(&l.wv, &kv_rows)?,
                wo,
                bq: slice(&l.bq, &q_rows),
                bk: slice(&l.bk, &kv_rows),
                bv: slice(&l.bv, &kv_rows),
                q_norm: l.q_norm.clone(),
                k_norm: l.k_norm.clone(),
                ffn_norm: l.ffn_norm.clone(),
                w_gate: rows(&l.w_gate, &ffn)?,
                w_up: rows(&l.w_up, &ffn)?,
                w_down,
                sinks: slice(&l.sinks, &heads),
            });
        }
        let mut cfg = c.clone();
        cfg.n_heads = s.n_heads;
        cfg.n_kv_heads = s.n_kv_heads;
        cfg.ffn_dim = s.ffn_dim;
        Ok(LlamaModel {
            cfg,
            weights: LlamaWeights {
                token_embd: w.token_embd.clone(),
                output_norm: w.output_norm.clone(),
                output: w.output.clone(),
                layers,
                inv_freq: w.inv_freq.clone(),
                alibi: slice(&w.alibi, &heads),
                tp: Some(t),
            },
        })
    }
}
