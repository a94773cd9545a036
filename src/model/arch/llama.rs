//! The llama-family graph: Llama 2/3, SmolLM2, Mistral, Qwen2/2.5 (q/k/v
//! bias) and Qwen3 (per-head q/k norm). GQA; tied or separate output.
//!
//! One call runs one step for a batch of rows from any number of
//! sequences (prefill chunks and decode rows mixed). Every op works per row
//! (or per (row, head)), so a row's result never depends on the rest of the
//! batch: batch invariance follows from the backend's per-row arithmetic.

use crate::backend::tp::{Layout, TpRank};
use crate::backend::{validate, AttnBatch, MatJob, MatNorm, OpInfo, OpT, WeightInfo as _};
use crate::dispatch::{Exec, Graph, HostExec, HostLogits, StepBufs};
use crate::gguf::GgufFile;
use crate::kv::KvStorage;
use crate::model::config::{Arch, ModelConfig};
use crate::model::weights::{load_vector, optional_vector, HostStore, Store, WeightRef};
use crate::model::StepInput;
use anyhow::{bail, ensure, Context, Result};

/// One transformer block's weights, wherever they live.
pub struct Layer<S: Store> {
    pub(crate) attn_norm: S::Vec,
    pub(crate) wq: S::Mat,
    pub(crate) wk: S::Mat,
    pub(crate) wv: S::Mat,
    pub(crate) wo: S::Mat,
    pub(crate) bq: Option<S::Vec>,
    pub(crate) bk: Option<S::Vec>,
    pub(crate) bv: Option<S::Vec>,
    pub(crate) q_norm: Option<S::Vec>,
    pub(crate) k_norm: Option<S::Vec>,
    pub(crate) ffn_norm: S::Vec,
    pub(crate) w_gate: S::Mat,
    pub(crate) w_up: S::Mat,
    pub(crate) w_down: S::Mat,
    /// (n_heads,) learned attention sink logits (`attn_sinks.weight`).
    pub(crate) sinks: Option<S::Vec>,
}

/// All weights of a llama-family model, wherever they live.
pub struct LlamaWeights<S: Store> {
    pub(crate) token_embd: S::Mat,
    pub(crate) output_norm: S::Vec,
    /// `output.weight`, or `token_embd.weight` when tied.
    pub(crate) output: S::Mat,
    pub(crate) layers: Vec<Layer<S>>,
    /// (rope_dim / 2,) inverse frequencies, computed once in f64 then
    /// rounded to f32 so every backend gets the same table.
    pub(crate) inv_freq: S::Vec,
    /// (n_heads,) ALiBi slopes (`alibi_slopes`), when the model has ALiBi.
    pub(crate) alibi: Option<S::Vec>,
    /// This rank's place when the weights are a tensor-parallel shard
    /// (`llama_tp.rs`: heads, FFN columns and the two row-parallel
    /// projections cut as `tp::Layout` says); None: the whole model.
    pub(crate) tp: Option<TpRank>,
}

impl<S: Store> LlamaWeights<S> {
    /// The same weights moved to another store (e.g. uploaded to a device),
    /// matrix by matrix; `progress(done, total)` counts layers.
    pub fn map<T: Store>(
        &self,
        mat: &mut dyn FnMut(&S::Mat) -> Result<T::Mat>,
        vec: &mut dyn FnMut(&S::Vec) -> Result<T::Vec>,
        progress: &dyn Fn(usize, usize),
    ) -> Result<LlamaWeights<T>> {
        fn opt<A, B>(v: &Option<A>, f: &mut dyn FnMut(&A) -> Result<B>) -> Result<Option<B>> {
            v.as_ref().map(f).transpose()
        }
        let mut layers = Vec::with_capacity(self.layers.len());
        for (i, l) in self.layers.iter().enumerate() {
            layers.push(Layer {
                bq: opt(&l.bq, vec)?,
                bk: opt(&l.bk, vec)?,
                bv: opt(&l.bv, vec)?,
                q_norm: opt(&l.q_norm, vec)?,
                k_norm: opt(&l.k_norm, vec)?,
                attn_norm: vec(&l.attn_norm)?,
                ffn_norm: vec(&l.ffn_norm)?,
                wq: mat(&l.wq)?,
                wk: mat(&l.wk)?,
                wv: mat(&l.wv)?,
                wo: mat(&l.wo)?,
                w_gate: mat(&l.w_gate)?,
                w_up: mat(&l.w_up)?,
                w_down: mat(&l.w_down)?,
                sinks: opt(&l.sinks, vec)?,
            });
            progress(i + 1, self.layers.len());
        }
        Ok(LlamaWeights {
            token_embd: mat(&self.token_embd)?,
            output_norm: vec(&self.output_norm)?,
            output: mat(&self.output)?,
            layers,
            inv_freq: vec(&self.inv_freq)?,
            alibi: opt(&self.alibi, vec)?,
            tp: self.tp,
        })
    }
}

/// A llama-family model: its config and its host (mmap) weights.
pub struct LlamaModel {
    pub cfg: ModelConfig,
    pub weights: LlamaWeights<HostStore>,
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
                sinks: optional_vector(g, &n("attn_sinks.weight"), cfg.n_heads)?,
            });
            progress(i + 1, cfg.n_layers);
        }
        let inv_freq = cfg.rope_inv_freq(g)?;
        let alibi = (cfg.attn.alibi_max_bias > 0.0)
            .then(|| crate::backend::alibi_slopes(cfg.n_heads, cfg.attn.alibi_max_bias));
        Ok(LlamaModel {
            cfg,
            weights: LlamaWeights {
                token_embd,
                output_norm,
                output,
                layers,
                inv_freq,
                alibi,
                tp: None,
            },
        })
    }

    /// What the graph asks of a backend: one `OpInfo` per distinct op kind,
    /// weight type and head_dim it issues (for a whole-model capability
    /// check before anything is uploaded).
    pub fn op_infos(&self) -> Vec<OpInfo> {
        let w = &self.weights;
        let mut out = vec![
            OpInfo {
                kind: "get_rows",
                weight: Some(w.token_embd.ty),
                head_dim: None,
                kv: None,
            },
            // The output head (a `MatMuls` with the output norm on it).
            OpInfo {
                kind: "mat_muls",
                weight: Some(w.output.ty),
                head_dim: None,
                kv: None,
            },
            OpInfo {
                kind: "paged_attention",
                weight: None,
                head_dim: Some(self.cfg.head_dim),
                kv: None,
            },
        ];
        for kind in [
            "rms_norm",
            "rope_kv_write",
            "swiglu",
            "select_rows",
            "add_bias",
        ] {
            out.push(OpInfo {
                kind,
                weight: None,
                head_dim: None,
                kv: None,
            });
        }
        for l in &w.layers {
            for m in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
                out.push(OpInfo {
                    kind: "mat_muls",
                    weight: Some(m.ty),
                    head_dim: None,
                    kv: None,
                });
            }
        }
        if w.tp.is_some() {
            for kind in ["all_gather", "all_reduce"] {
                out.push(OpInfo {
                    kind,
                    weight: None,
                    head_dim: None,
                    kv: None,
                });
            }
        }
        let mut uniq: Vec<OpInfo> = Vec::new();
        for i in out {
            if !uniq.contains(&i) {
                uniq.push(i);
            }
        }
        uniq
    }

    /// Runs one step on the host (mmap weights, host KV). See [`forward`].
    pub fn forward_host(
        &self,
        exec: &HostExec<'_>,
        kv: &mut KvStorage,
        input: &StepInput<'_>,
    ) -> Result<HostLogits> {
        forward(&self.cfg, &self.weights, exec, kv, input)
    }
}

/// The llama graph as a device loader takes it ([`Graph`]): the model's
/// config; the weights come separately, in the store of the executor.
pub struct LlamaGraph(pub ModelConfig);

impl Graph for LlamaGraph {
    type Weights<S: Store> = LlamaWeights<S>;

    fn map_weights<S: Store>(
        host: &LlamaWeights<HostStore>,
        mat: &mut dyn FnMut(&WeightRef) -> Result<S::Mat>,
        vec: &mut dyn FnMut(&Vec<f32>) -> Result<S::Vec>,
        progress: &dyn Fn(usize, usize),
    ) -> Result<LlamaWeights<S>> {
        host.map(mat, vec, progress)
    }
    fn vocab(&self) -> usize {
        self.0.vocab_size
    }
    fn forward<E: Exec>(
        &self,
        w: &LlamaWeights<E::S>,
        e: &E,
        kv: &mut E::Kv,
        input: &StepInput<'_>,
    ) -> Result<HostLogits> {
        forward(&self.0, w, e, kv, input)
    }
    fn forward_bufs<E: Exec>(
        &self,
        w: &LlamaWeights<E::S>,
        e: &E,
        kv: &mut E::Kv,
        b: &StepBufs<E::IdxBuf<'_>, E::BatchBuf<'_>>,
    ) -> Result<Option<E::Buf>> {
        forward_bufs(&self.0, w, e, kv, b)
    }
}

/// Runs one step of the graph in `e`'s memory space. Writes K/V of every
/// input row into its slot, and returns logits (input.logit_rows.len(),
/// vocab) for the rows asked.
pub fn forward<E: Exec>(
    c: &ModelConfig,
    w: &LlamaWeights<E::S>,
    e: &E,
    kv: &mut E::Kv,
    input: &StepInput<'_>,
) -> Result<HostLogits> {
    let n = input.tokens.len();
    input.validate(c.vocab_size)?;
    validate::kv_slots(input.slots, E::kv_cells(kv))?;
    let logit_rows: Vec<u32> = input
        .logit_rows
        .iter()
        .map(|&r| {
            if r >= n {
                bail!("logit row {r} out of range for a step of {n} rows");
            }
            Ok(r as u32)
        })
        .collect::<Result<_>>()?;
    if n == 0 {
        return Ok(HostLogits::default());
    }
    let bufs = StepBufs {
        n,
        n_rows: logit_rows.len(),
        tokens: e.idx(input.tokens)?,
        positions: e.idx(input.positions)?,
        slots: e.idx(input.slots)?,
        state_slots: e.idx(input.state_slots)?,
        rows_all: logit_rows.len() == n
            && logit_rows.iter().enumerate().all(|(i, &r)| r as usize == i),
        rows: e.idx(&logit_rows)?,
        hidden: input.hidden,
        batch: e.batch(
            kv,
            AttnBatch {
                block_tables: input.block_tables,
                row_seq: input.row_seq,
                positions: input.positions,
            },
        )?,
    };
    match forward_bufs(c, w, e, kv, &bufs)? {
        Some(logits) => e.download(logits),
        None => Ok(HostLogits::default()),
    }
}

/// One matmul of [`mat_muls`]: weight, output, whether it adds.
pub(crate) type MatSpec<'b, E> = (
    &'b <<E as Exec>::S as Store>::Mat,
    &'b mut <E as Exec>::Buf,
    bool,
);

/// An input's RMS norm for `mat_muls`: weights, eps, scratch (n, k).
pub(crate) type NormSpec<'b, E> = (
    &'b <<E as Exec>::S as Store>::Vec,
    f32,
    &'b mut <E as Exec>::Buf,
);

/// The matmuls of one input x (n, k): one `MatMuls` op per weight type (in
/// the order each type first appears), so a backend can run q/k/v or
/// gate/up in one launch. Each job: (weight, output, whether it adds).
///
/// `norm` (norm weights, eps, scratch (n, k)): the products read
/// rms_norm(x). With one op it rides on that op (`OpT::MatMuls::norm`, so
/// a backend can fold the norm in); with several, an `RmsNorm` op writes
/// the scratch once and every op reads it.
///
/// `next_norm` (norm weights, eps): the hint `OpT::MatMuls::next_norm`,
/// for a residual product whose output the next op normalizes.
///
/// `glu` (n, m): the SwiGlu of jobs 0 and 1 (gate, up). With one op it
/// rides on that op (`OpT::MatMuls::glu`, so a backend can fold it into
/// the products' epilogue); with several, a `SwiGlu` op follows them.
pub(crate) fn mat_muls<'b, E: Exec>(
    e: &E,
    x: &E::Buf,
    n: usize,
    jobs: Vec<MatSpec<'_, E>>,
    norm: Option<NormSpec<'b, E>>,
    next_norm: Option<(&<E::S as Store>::Vec, f32)>,
    glu: Option<&mut E::Buf>,
) -> Result<()> {
    // The outputs stay here (the ops borrow them) for a SwiGlu after.
    let (specs, mut outs): (Vec<_>, Vec<_>) = jobs
        .into_iter()
        .map(|(w, out, add)| ((w, add), out))
        .unzip();
    let mut groups: Vec<Vec<MatJob<'_, E::M>>> = Vec::new();
    for (&(w, add), out) in specs.iter().zip(outs.iter_mut()) {
        let job: MatJob<'_, E::M> = MatJob {
            w: e.mat(w)?,
            out: E::wr(out),
            add,
        };
        let (ty, k) = (job.w.ty(), job.w.cols());
        match groups
            .iter_mut()
            .find(|g| g[0].w.ty() == ty && g[0].w.cols() == k)
        {
            Some(g) => g.push(job),
            None => groups.push(vec![job]),
        }
    }
    let one_op = groups.len() == 1;
    let mut glu = glu;
    let mut op_glu = if one_op {
        glu.take().map(|h| E::wr(h))
    } else {
        None
    };
    match norm {
        Some((w, eps, out)) if !one_op => {
            let k = groups[0][0].w.cols();
            e.run(OpT::RmsNorm {
                x: E::rd(x),
                w: E::param(w),
                dim: k,
                eps,
                out: E::wr(&mut *out),
            })?;
            for jobs in groups {
                e.run(OpT::MatMuls {
                    x: E::rd(out),
                    n,
                    jobs,
                    norm: None,
                    next_norm: next_norm.map(|(w, eps)| (E::param(w), eps)),
                    glu: None,
                })?;
            }
        }
        norm => {
            let mut norm = norm.map(|(w, eps, out)| MatNorm {
                w: E::param(w),
                eps,
                out: E::wr(out),
            });
            for jobs in groups {
                e.run(OpT::MatMuls {
                    x: E::rd(x),
                    n,
                    jobs,
                    norm: norm.take(),
                    next_norm: next_norm.map(|(w, eps)| (E::param(w), eps)),
                    glu: op_glu.take(),
                })?;
            }
        }
    }
    // (Taken by the op where there is one; its borrow of the outputs ends.)
    drop(op_glu);
    if let Some(h) = glu {
        ensure!(
            outs.len() >= 2,
            "mat_muls: a SwiGlu needs the gate and up jobs"
        );
        e.run(OpT::SwiGlu {
            gate: E::rd(&*outs[0]),
            up: E::rd(&*outs[1]),
            out: E::wr(h),
        })?;
    }
    Ok(())
}

/// Runs the step's ops on inputs already in `e`'s memory space (validated
/// where they were uploaded) and returns the logits buffer (rows.len(),
/// vocab), or None when no row wants logits. Issues no host
/// synchronization, so a device executor can capture it as a graph.
pub fn forward_bufs<E: Exec>(
    c: &ModelConfig,
    w: &LlamaWeights<E::S>,
    e: &E,
    kv: &mut E::Kv,
    b: &StepBufs<E::IdxBuf<'_>, E::BatchBuf<'_>>,
) -> Result<Option<E::Buf>> {
    let n = b.n;
    let (d, qd, kvd, hd) = (c.dim, c.q_dim(), c.kv_dim(), c.head_dim);
    let (tokens, positions, slots, batch) = (&b.tokens, &b.positions, &b.slots, &b.batch);
    let mut x = e.output(n * d)?; // (n, dim) residual stream
    e.run(OpT::GetRows {
        table: e.mat(&w.token_embd)?,
        ids: E::idx_view(tokens),
        out: E::wr(&mut x),
    })?;
    let mut h = e.output(n * d)?; // (n, dim)
    let mut q = e.output(n * qd)?; // (n, n_heads, head_dim)
    let mut k = e.output(n * kvd)?; // (n, n_kv_heads, head_dim)
    let mut v = e.output(n * kvd)?;
    // Pre-norm q/k when the model has per-head q/k norms (Qwen3).
    let mut q_raw = e.output(if c.arch == Arch::Qwen3 { n * qd } else { 0 })?;
    let mut k_raw = e.output(if c.arch == Arch::Qwen3 { n * kvd } else { 0 })?;
    let mut att = e.output(n * qd)?; // (n, n_heads, head_dim)
    let mut gate = e.output(n * c.ffn_dim)?; // (n, ffn)
    let mut up = e.output(n * c.ffn_dim)?;
    let mut act = e.output(n * c.ffn_dim)?;
    // A tensor-parallel rank's buffers (`c` holds this rank's heads and
    // FFN columns): the projections' partial or sliced output (n, out_dim)
    // and, under `Layout::Gather`, the gathered inputs of the projections
    // (n, world * qd) and (n, world * ffn).
    let mut tp_bufs = match w.tp {
        None => None,
        Some(t) => {
            let gather = t.layout == Layout::Gather;
            let out_dim = if gather { d / t.world } else { d };
            let full = |len: usize| e.output(if gather { n * len * t.world } else { 0 });
            Some(TpBufs {
                t,
                part: e.output(n * out_dim)?,
                att: full(qd)?,
                act: full(c.ffn_dim)?,
            })
        }
    };
    let scale = 1.0f32 / (hd as f32).sqrt();
    for (li, l) in w.layers.iter().enumerate() {
        let qk_norm = match (&l.q_norm, &l.k_norm) {
            (Some(qn), Some(kn)) => Some((qn, kn)),
            _ => None,
        };
        // With q/k norms the projections land in q_raw / k_raw first.
        let (q_dst, k_dst) = if qk_norm.is_some() {
            (&mut q_raw, &mut k_raw)
        } else {
            (&mut q, &mut k)
        };
        // q/k/v of rms_norm(x) (the attention norm rides on the op).
        mat_muls(
            e,
            &x,
            n,
            vec![
                (&l.wq, &mut *q_dst, false),
                (&l.wk, &mut *k_dst, false),
                (&l.wv, &mut v, false),
            ],
            Some((&l.attn_norm, c.rms_eps, &mut h)),
            None,
            None,
        )?;
        for (b, out) in [(&l.bq, q_dst), (&l.bk, k_dst), (&l.bv, &mut v)] {
            if let Some(b) = b {
                e.run(OpT::AddBias {
                    x: E::wr(out),
                    bias: E::param(b),
                })?;
            }
        }
        if let Some((qn, kn)) = qk_norm {
            // Per-head RMS norm: view (n, heads, hd) as (n * heads, hd).
            for (src, nw, dst) in [(&q_raw, qn, &mut q), (&k_raw, kn, &mut k)] {
                e.run(OpT::RmsNorm {
                    x: E::rd(src),
                    w: E::param(nw),
                    dim: hd,
                    eps: c.rms_eps,
                    out: E::wr(dst),
                })?;
            }
        }
        e.run(OpT::RopeKvWrite {
            q: E::wr(&mut q),
            k: E::wr(&mut k),
            v: E::rd(&v),
            n_heads: c.n_heads,
            rope_dim: c.rope_dim,
            positions: E::idx_view(positions),
            inv_freq: E::param(&w.inv_freq),
            neox: c.arch.neox_rope(),
            slots: E::idx_view(slots),
            cache: E::kv_layer_mut(kv, li)?,
        })
        .with_context(|| format!("layer {li}"))?;
        e.run(OpT::PagedAttention {
            q: E::rd(&q),
            n_heads: c.n_heads,
            scale,
            cache: E::kv_layer(kv, li)?,
            batch: E::batch_view(batch),
            opts: crate::backend::AttnOpts {
                window: c.attn.sliding_window.map_or(Ok(0), u32::try_from)?,
                softcap: c.attn.softcap,
                alibi: w.alibi.as_ref().map(|a| E::param(a)),
                sinks: l.sinks.as_ref().map(|t| E::param(t)),
            },
            out: E::wr(&mut att),
        })
        .with_context(|| format!("layer {li}"))?;
        // x += att · woᵀ (the residual add folded into the matmul); the
        // FFN norm reads x next.
        match &mut tp_bufs {
            None => mat_muls(
                e,
                &att,
                n,
                vec![(&l.wo, &mut x, true)],
                None,
                Some((&l.ffn_norm, c.rms_eps)),
                None,
            )?,
            Some(tb) => tb.project(e, &att, n, &l.wo, &mut x, false)?,
        }
        // act = silu(gate) * up, riding on the gate/up op where it is
        // one (a backend may fold it into the products' epilogue).
        mat_muls(
            e,
            &x,
            n,
            vec![(&l.w_gate, &mut gate, false), (&l.w_up, &mut up, false)],
            Some((&l.ffn_norm, c.rms_eps, &mut h)),
            None,
            Some(&mut act),
        )?;
        // x += act · w_downᵀ; the next layer's attention norm reads x
        // next (no hint: the output norm may follow a row selection).
        let next = w.layers.get(li + 1).map(|nl| (&nl.attn_norm, c.rms_eps));
        match &mut tp_bufs {
            None => mat_muls(
                e,
                &act,
                n,
                vec![(&l.w_down, &mut x, true)],
                None,
                next,
                None,
            )?,
            Some(tb) => tb.project(e, &act, n, &l.w_down, &mut x, true)?,
        }
    }
    // Every rank holds the same residual stream: a rank without the head
    // ends its step here.
    if w.tp.is_some_and(|t| !t.head) {
        return Ok(None);
    }
    output_head(e, c, &w.output, &w.output_norm, &x, b)
}

/// A tensor-parallel rank's buffers for its two row-parallel projections
/// per layer (see `forward_bufs`).
struct TpBufs<B> {
    t: TpRank,
    /// (n, dim / world) under `Layout::Gather`, else (n, dim).
    part: B,
    /// (n, world * q_dim) gathered attention output (`Gather`; else empty).
    att: B,
    /// (n, world * ffn_dim) gathered SwiGLU activations (`Gather`).
    act: B,
}

impl<B> TpBufs<B> {
    /// x (n, dim) += input · wᵀ over every rank, input (n, k) being this
    /// rank's attention output or (`ffn`) SwiGLU activations.
    ///
    /// `Gather`: the inputs are gathered to their full width, this rank's
    /// rows of w (output features) give its slice, and a gathering add puts
    /// every slice into x: each element is `x + dot(whole row, whole k)`,
    /// the bits of one rank. `Reduce`: w holds this rank's columns; the
    /// partial products are all-reduced into x.
    fn project<E: Exec<Buf = B>>(
        &mut self,
        e: &E,
        input: &B,
        n: usize,
        w: &<E::S as Store>::Mat,
        x: &mut B,
        ffn: bool,
    ) -> Result<()> {
        match self.t.layout {
            Layout::Gather => {
                let full = if ffn { &mut self.act } else { &mut self.att };
                e.run(OpT::AllGather {
                    x: E::rd(input),
                    n,
                    out: E::wr(full),
                    add: false,
                })?;
                mat_muls(
                    e,
                    full,
                    n,
                    vec![(w, &mut self.part, false)],
                    None,
                    None,
                    None,
                )?;
                e.run(OpT::AllGather {
                    x: E::rd(&self.part),
                    n,
                    out: E::wr(x),
                    add: true,
                })
            }
            Layout::Reduce(order) => {
                mat_muls(
                    e,
                    input,
                    n,
                    vec![(w, &mut self.part, false)],
                    None,
                    None,
                    None,
                )?;
                e.run(OpT::AllReduce {
                    x: E::rd(&self.part),
                    out: E::wr(x),
                    order,
                })
            }
        }
    }
}

/// The output head of a step's last residual stream `x` (n, dim): the rows
/// of `b.rows` (all of them, in order, without a selection launch when
/// `b.rows_all`) normed with `output_norm`, then their logits (n_rows,
/// vocab) through `output`, or (`b.hidden`) the normed rows themselves
/// (n_rows, dim). None when no row asks. Shared by every graph.
pub(crate) fn output_head<E: Exec>(
    e: &E,
    c: &ModelConfig,
    output: &<E::S as Store>::Mat,
    output_norm: &<E::S as Store>::Vec,
    x: &E::Buf,
    b: &StepBufs<E::IdxBuf<'_>, E::BatchBuf<'_>>,
) -> Result<Option<E::Buf>> {
    let (m, d) = (b.n_rows, c.dim);
    if m == 0 {
        return Ok(None);
    }
    // Every row (a decode step): x itself, no selection launch.
    let sel = if b.rows_all {
        None
    } else {
        let mut sel = e.output(m * d)?; // (m, dim)
        e.run(OpT::SelectRows {
            x: E::rd(x),
            dim: d,
            rows: E::idx_view(&b.rows),
            out: E::wr(&mut sel),
        })?;
        Some(sel)
    };
    let rows = sel.as_ref().unwrap_or(x);
    let mut normed = e.output(m * d)?; // (m, dim)
    if b.hidden {
        // Embeddings: the rows' final hidden state, normed as the head
        // reads it.
        e.run(OpT::RmsNorm {
            x: E::rd(rows),
            w: E::param(output_norm),
            dim: d,
            eps: c.rms_eps,
            out: E::wr(&mut normed),
        })?;
        return Ok(Some(normed));
    }
    // logits (m, vocab) = rms_norm(rows) · outputᵀ (the norm rides on the op).
    let mut logits = e.output(m * c.vocab_size)?;
    mat_muls(
        e,
        rows,
        m,
        vec![(output, &mut logits, false)],
        Some((output_norm, c.rms_eps, &mut normed)),
        None,
        None,
    )?;
    Ok(Some(logits))
}
