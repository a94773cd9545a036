//! The grid's negative control on the cpu: paged attention whose keys are
//! cut into a number of partials that follows the batch's row count, as a
//! split-KV kernel sized to fill a GPU does, merged in f32 (the usual
//! flash-decoding merge). Correct to rounding, but a row's bits depend on
//! its batch: the invariance grid must find that.

use crate::backend::{validate, Backend, Mode, Op};
use anyhow::{bail, Result};

/// Attention only; everything else is unsupported.
pub struct BatchVariant;

impl Backend for BatchVariant {
    fn name(&self) -> &'static str {
        "batch-variant control"
    }

    fn supports_op(&self, op: &Op<'_>, _mode: Mode) -> bool {
        matches!(op, Op::PagedAttention { .. })
    }

    fn run(&self, op: Op<'_>, _mode: Mode) -> Result<()> {
        let Op::PagedAttention {
            q,
            n_heads,
            scale,
            cache,
            batch,
            opts,
            out,
        } = op
        else {
            bail!("the batch-variant control runs paged_attention only");
        };
        let (hd, nkv, bs) = (cache.head_dim, cache.n_kv_heads, cache.block_size);
        validate::host_attention(q.len(), n_heads, &cache, &batch, &opts, out.len())?;
        let n_rows = batch.positions.len();
        // The batch decides the split: 1 to 4 partials.
        let parts = 1 + n_rows % 4;
        for r in 0..n_rows {
            let pos = batch.positions[r] as usize;
            let table = batch.block_tables[batch.row_seq[r] as usize];
            let w = opts.window as usize;
            let lo = if w == 0 {
                0
            } else {
                (pos + 1).saturating_sub(w)
            };
            for h in 0..n_heads {
                let kvh = h / (n_heads / nkv);
                let qv = &q[(r * n_heads + h) * hd..][..hd];
                let at = |j: usize| (table[j / bs] as usize * bs + j % bs) * nkv * hd + kvh * hd;
                let score = |j: usize| {
                    let kr = &cache.k[at(j)..at(j) + hd];
                    let mut s = qv.iter().zip(kr).map(|(a, b)| a * b.to_f32()).sum::<f32>() * scale;
                    if opts.softcap > 0.0 {
                        s = opts.softcap * (s / opts.softcap).tanh();
                    }
                    if let Some(a) = opts.alibi {
                        s += a[h] * (j as f32 - pos as f32);
                    }
                    s
                };
                let n = pos + 1 - lo;
                let (mut m, mut l) = (f32::NEG_INFINITY, 0f32);
                let mut acc = vec![0f32; hd];
                for p in 0..parts {
                    let (a, b) = (lo + n * p / parts, lo + n * (p + 1) / parts);
                    if a == b {
                        continue;
                    }
                    let s: Vec<f32> = (a..b).map(score).collect();
                    let pm = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let mut pl = 0f32;
                    let mut pacc = vec![0f32; hd];
                    for (j, &sj) in (a..b).zip(&s) {
                        let e = (sj - pm).exp();
                        pl += e;
                        for (o, v) in pacc.iter_mut().zip(&cache.v[at(j)..at(j) + hd]) {
                            *o += e * v.to_f32();
                        }
                    }
                    let mn = m.max(pm);
                    let (ca, cb) = ((m - mn).exp(), (pm - mn).exp());
                    l = l * ca + pl * cb;
                    for (o, x) in acc.iter_mut().zip(&pacc) {
                        *o = *o * ca + x * cb;
                    }
                    m = mn;
                }
                if let Some(t) = opts.sinks {
                    let mn = m.max(t[h]);
                    let ca = (m - mn).exp();
                    l = l * ca + (t[h] - mn).exp();
                    acc.iter_mut().for_each(|o| *o *= ca);
                }
                let o = &mut out[(r * n_heads + h) * hd..][..hd];
                for (o, a) in o.iter_mut().zip(&acc) {
                    *o = a / l;
                }
            }
        }
        Ok(())
    }
}
