//! The qwen35 step graph (Qwen3.5 / 3.6 dense): pre-norm layers whose
//! mixer is a Gated DeltaNet (recurrent state per sequence) or, every
//! `full_attention_interval`-th layer, gated full attention over the paged
//! KV cache; then a SwiGLU FFN. Written once over [`Exec`], like the llama
//! graph: the host runs it through the dispatcher, the cuda executor on the
//! device (and captures its decode steps as graphs).
//!
//! Every op works per row, per (row, head), or per sequence in position
//! order (the recurrent ops), so a sequence's result never depends on the
//! other sequences of the step.

use super::llama::{mat_muls, output_head};
use super::qwen35::{AttnLayer, GdnLayer, Mixer, Qwen35Model, Qwen35Weights};
use crate::backend::{validate, AttnBatch, OpInfo, OpT};
use crate::dispatch::{Exec, Graph, HostExec, HostLogits, StepBufs};
use crate::kv::KvStorage;
use crate::model::config::{GdnConfig, ModelConfig};
use crate::model::weights::{HostStore, Store, WeightRef};
use crate::model::StepInput;
use anyhow::{bail, ensure, Context, Result};

/// Scratch activations of one step, sized for `n` rows.
struct Scratch<B> {
    h: B,     // (n, dim) normed input
    mixed: B, // (n, conv_dim) raw qkv projections
    conv: B,  // (n, conv_dim) conv + silu output: [q | k | v]
    z: B,     // (n, value_dim) output gate
    a: B,     // (n, h_v)
    b: B,     // (n, h_v)
    g: B,     // (n, h_v) log-decay
    beta: B,  // (n, h_v)
    o: B,     // (n, value_dim) delta rule output
    u: B,     // (n, value_dim) gated norm output
    qg: B,    // (n, n_heads, 2 * head_dim) q and gate, per head
    q_raw: B, // (n, n_heads, head_dim)
    gate: B,  // (n, n_heads, head_dim)
    q: B,     // (n, n_heads, head_dim)
    k_raw: B, // (n, n_kv_heads, head_dim)
    k: B,     // (n, n_kv_heads, head_dim)
    v: B,     // (n, n_kv_heads, head_dim)
    att: B,   // (n, n_heads, head_dim)
    ffn_g: B, // (n, ffn)
    ffn_u: B, // (n, ffn)
    act: B,   // (n, ffn)
}

impl<B> Scratch<B> {
    fn new<E: Exec<Buf = B>>(e: &E, c: &ModelConfig, gd: &GdnConfig, n: usize) -> Result<Self> {
        let z = |len: usize| e.output(n * len);
        let (qd, kvd) = (c.q_dim(), c.kv_dim());
        Ok(Scratch {
            h: z(c.dim)?,
            mixed: z(gd.conv_dim())?,
            conv: z(gd.conv_dim())?,
            z: z(gd.value_dim())?,
            a: z(gd.n_v_heads)?,
            b: z(gd.n_v_heads)?,
            g: z(gd.n_v_heads)?,
            beta: z(gd.n_v_heads)?,
            o: z(gd.value_dim())?,
            u: z(gd.value_dim())?,
            qg: z(2 * qd)?,
            q_raw: z(qd)?,
            gate: z(qd)?,
            q: z(qd)?,
            k_raw: z(kvd)?,
            k: z(kvd)?,
            v: z(kvd)?,
            att: z(qd)?,
            ffn_g: z(c.ffn_dim)?,
            ffn_u: z(c.ffn_dim)?,
            act: z(c.ffn_dim)?,
        })
    }
}

impl Qwen35Model {
    /// What the graph asks of a backend: one `OpInfo` per distinct op
    /// kind, weight type and head_dim it issues.
    pub fn op_infos(&self) -> Vec<OpInfo> {
        let w = &self.weights;
        let info = |kind, weight, head_dim| OpInfo {
            kind,
            weight,
            head_dim,
            kv: None,
        };
        let mut out = vec![
            info("get_rows", Some(w.token_embd.ty), None),
            info("mat_muls", Some(w.output.ty), None),
            info("paged_attention", None, Some(self.cfg.head_dim)),
        ];
        for kind in [
            "rms_norm",
            "rope_kv_write",
            "swiglu",
            "select_rows",
            "conv1d_silu",
            "l2_norm_heads",
            "gdn_gates",
            "delta_rule",
            "gated_rms_norm",
            "split_heads",
            "sigmoid_mul",
        ] {
            out.push(info(kind, None, None));
        }
        let mut mats: Vec<&WeightRef> = Vec::new();
        for l in &w.layers {
            mats.extend([&l.w_gate, &l.w_up, &l.w_down]);
            match &l.mixer {
                Mixer::Gdn(m) => mats.extend([&m.w_qkv, &m.w_z, &m.w_beta, &m.w_alpha, &m.w_out]),
                Mixer::Attn(m) => mats.extend([&m.wq, &m.wk, &m.wv, &m.wo]),
            }
        }
        for m in mats {
            out.push(info("mat_muls", Some(m.ty), None));
        }
        let mut uniq: Vec<OpInfo> = Vec::new();
        for i in out {
            if !uniq.contains(&i) {
                uniq.push(i);
            }
        }
        uniq
    }

    /// Runs one step on the host (mmap weights; host KV cache holding the
    /// recurrent states). See [`forward`].
    pub fn forward_host(
        &self,
        exec: &HostExec<'_>,
        kv: &mut KvStorage,
        input: &StepInput<'_>,
    ) -> Result<HostLogits> {
        forward(&self.cfg, &self.weights, exec, kv, input)
    }
}

/// The qwen35 graph as a device loader takes it ([`Graph`]).
pub struct Qwen35Graph(pub ModelConfig);

impl Graph for Qwen35Graph {
    type Weights<S: Store> = Qwen35Weights<S>;

    fn map_weights<S: Store>(
        host: &Qwen35Weights<HostStore>,
        mat: &mut dyn FnMut(&WeightRef) -> Result<S::Mat>,
        vec: &mut dyn FnMut(&Vec<f32>) -> Result<S::Vec>,
        progress: &dyn Fn(usize, usize),
    ) -> Result<Qwen35Weights<S>> {
        host.map(mat, vec, progress)
    }
    fn vocab(&self) -> usize {
        self.0.vocab_size
    }
    fn forward<E: Exec>(
        &self,
        w: &Qwen35Weights<E::S>,
        e: &E,
        kv: &mut E::Kv,
        input: &StepInput<'_>,
    ) -> Result<HostLogits> {
        forward(&self.0, w, e, kv, input)
    }
    fn forward_bufs<E: Exec>(
        &self,
        w: &Qwen35Weights<E::S>,
        e: &E,
        kv: &mut E::Kv,
        b: &StepBufs<E::IdxBuf<'_>, E::BatchBuf<'_>>,
    ) -> Result<Option<E::Buf>> {
        forward_bufs(&self.0, w, e, kv, b)
    }
}

/// Runs one step in `e`'s memory space: zeroes the fresh state slots, then
/// the ops. `input.state_slots` (n,): each row's recurrent state slot (rows
/// of a slot consecutive, in position order); the cache holds the
/// attention layers' blocks (in order) and the recurrent states. Returns
/// logits (input.logit_rows.len(), vocab).
pub fn forward<E: Exec>(
    c: &ModelConfig,
    w: &Qwen35Weights<E::S>,
    e: &E,
    kv: &mut E::Kv,
    input: &StepInput<'_>,
) -> Result<HostLogits> {
    input.validate(c.vocab_size)?;
    validate::kv_slots(input.slots, E::kv_cells(kv))?;
    let n = input.tokens.len();
    ensure!(
        input.state_slots.len() == n,
        "qwen35 step: {} state slots for {n} rows",
        input.state_slots.len()
    );
    check_runs(input.state_slots)?;
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
    e.reset_states(kv, input.fresh_slots)?;
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

/// Errors unless every slot's rows are consecutive (the recurrent ops
/// carry a slot's state from row to row within one run).
pub fn check_runs(state_slots: &[u32]) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for (i, &s) in state_slots.iter().enumerate() {
        if (i == 0 || state_slots[i - 1] != s) && !seen.insert(s) {
            bail!(
                "row {i}: state slot {s} appears again after other slots \
                 (a slot's rows must be consecutive)"
            );
        }
    }
    Ok(())
}

/// Runs the step's ops on inputs already in `e`'s memory space and returns
/// the logits buffer (rows.len(), vocab), or None when no row wants
/// logits. Issues no host synchronization (a device executor captures it).
pub fn forward_bufs<E: Exec>(
    c: &ModelConfig,
    w: &Qwen35Weights<E::S>,
    e: &E,
    kv: &mut E::Kv,
    bufs: &StepBufs<E::IdxBuf<'_>, E::BatchBuf<'_>>,
) -> Result<Option<E::Buf>> {
    let gd = c
        .gdn
        .as_ref()
        .context("qwen35 graph without GDN parameters")?;
    let (n, d) = (bufs.n, c.dim);
    let mut x = e.output(n * d)?; // (n, dim) residual stream
    e.run(OpT::GetRows {
        table: e.mat(&w.token_embd)?,
        ids: E::idx_view(&bufs.tokens),
        out: E::wr(&mut x),
    })?;
    let mut s = Scratch::new(e, c, gd, n)?;
    let (mut gdn_i, mut attn_i) = (0, 0);
    for (li, l) in w.layers.iter().enumerate() {
        match &l.mixer {
            Mixer::Gdn(mx) => {
                gdn_mixer(c, gd, mx, &l.attn_norm, e, &mut x, &mut s, bufs, kv, gdn_i)
                    .with_context(|| format!("layer {li} (gated deltanet)"))?;
                gdn_i += 1;
            }
            Mixer::Attn(mx) => {
                attn_mixer(c, w, mx, &l.attn_norm, e, &mut x, &mut s, bufs, kv, attn_i)
                    .with_context(|| format!("layer {li} (attention)"))?;
                attn_i += 1;
            }
        }
        // act = silu(gate) * up of rms_norm(x); x += act · w_downᵀ.
        mat_muls(
            e,
            &x,
            n,
            vec![
                (&l.w_gate, &mut s.ffn_g, false),
                (&l.w_up, &mut s.ffn_u, false),
            ],
            Some((&l.post_norm, c.rms_eps, &mut s.h)),
            None,
            Some(&mut s.act),
        )?;
        mat_muls(
            e,
            &s.act,
            n,
            vec![(&l.w_down, &mut x, true)],
            None,
            None,
            None,
        )?;
    }
    output_head(e, c, &w.output, &w.output_norm, &x, bufs)
}

/// x += GDN(rms_norm(x)) (spec: projections, gates, conv + SiLU, L2 norm
/// of q and k, the delta rule, gated RMS norm, output projection), with
/// recurrent layer `gdn_i`'s states in the cache.
#[allow(clippy::too_many_arguments)]
fn gdn_mixer<E: Exec>(
    c: &ModelConfig,
    gd: &GdnConfig,
    m: &GdnLayer<E::S>,
    norm: &<E::S as Store>::Vec,
    e: &E,
    x: &mut E::Buf,
    s: &mut Scratch<E::Buf>,
    bufs: &StepBufs<E::IdxBuf<'_>, E::BatchBuf<'_>>,
    kv: &mut E::Kv,
    gdn_i: usize,
) -> Result<()> {
    let n = bufs.n;
    mat_muls(
        e,
        x,
        n,
        vec![
            (&m.w_qkv, &mut s.mixed, false),
            (&m.w_z, &mut s.z, false),
            (&m.w_beta, &mut s.b, false),
            (&m.w_alpha, &mut s.a, false),
        ],
        Some((norm, c.rms_eps, &mut s.h)),
        None,
        None,
    )?;
    e.run(OpT::GdnGates {
        a: E::rd(&s.a),
        b: E::rd(&s.b),
        dt_bias: E::param(&m.dt_bias),
        ssm_a: E::param(&m.ssm_a),
        g: E::wr(&mut s.g),
        beta: E::wr(&mut s.beta),
    })?;
    let row_slots = &bufs.state_slots;
    {
        let (conv_state, _) = E::state_layer_mut(kv, gdn_i)?;
        e.run(OpT::Conv1dSilu {
            x: E::rd(&s.mixed),
            w: E::param(&m.conv_w),
            channels: gd.conv_dim(),
            kernel: gd.conv_kernel,
            row_slots: E::idx_view(row_slots),
            state: conv_state,
            out: E::wr(&mut s.conv),
        })?;
    }
    // q and k: the first 2 * h_k heads of d_k in each row.
    e.run(OpT::L2NormHeads {
        x: E::wr(&mut s.conv),
        row_len: gd.conv_dim(),
        n_heads: 2 * gd.n_k_heads,
        head_dim: gd.d_k,
        eps: c.rms_eps,
    })?;
    {
        let (_, ssm_state) = E::state_layer_mut(kv, gdn_i)?;
        e.run(OpT::DeltaRule {
            qkv: E::rd(&s.conv),
            g: E::rd(&s.g),
            beta: E::rd(&s.beta),
            h_k: gd.n_k_heads,
            h_v: gd.n_v_heads,
            d_k: gd.d_k,
            d_v: gd.d_v,
            row_slots: E::idx_view(row_slots),
            state: ssm_state,
            out: E::wr(&mut s.o),
        })?;
    }
    e.run(OpT::GatedRmsNorm {
        x: E::rd(&s.o),
        z: E::rd(&s.z),
        w: E::param(&m.ssm_norm),
        head_dim: gd.d_v,
        eps: c.rms_eps,
        out: E::wr(&mut s.u),
    })?;
    mat_muls(e, &s.u, n, vec![(&m.w_out, x, true)], None, None, None)
}

/// x += gated attention of rms_norm(x): q and its gate from one projection
/// (per head [q | gate]), per-head q/k RMS norms, partial NEOX RoPE, paged
/// attention, the output times sigmoid(gate), the output projection.
#[allow(clippy::too_many_arguments)]
fn attn_mixer<E: Exec>(
    c: &ModelConfig,
    w: &Qwen35Weights<E::S>,
    m: &AttnLayer<E::S>,
    norm: &<E::S as Store>::Vec,
    e: &E,
    x: &mut E::Buf,
    s: &mut Scratch<E::Buf>,
    bufs: &StepBufs<E::IdxBuf<'_>, E::BatchBuf<'_>>,
    kv: &mut E::Kv,
    attn_i: usize,
) -> Result<()> {
    let (n, hd) = (bufs.n, c.head_dim);
    mat_muls(
        e,
        x,
        n,
        vec![
            (&m.wq, &mut s.qg, false),
            (&m.wk, &mut s.k_raw, false),
            (&m.wv, &mut s.v, false),
        ],
        Some((norm, c.rms_eps, &mut s.h)),
        None,
        None,
    )?;
    e.run(OpT::SplitHeads {
        x: E::rd(&s.qg),
        head_dim: hd,
        a: E::wr(&mut s.q_raw),
        b: E::wr(&mut s.gate),
    })?;
    // Per-head RMS norm: (n, heads, hd) viewed as (n * heads, hd).
    e.run(OpT::RmsNorm {
        x: E::rd(&s.q_raw),
        w: E::param(&m.q_norm),
        dim: hd,
        eps: c.rms_eps,
        out: E::wr(&mut s.q),
    })?;
    e.run(OpT::RmsNorm {
        x: E::rd(&s.k_raw),
        w: E::param(&m.k_norm),
        dim: hd,
        eps: c.rms_eps,
        out: E::wr(&mut s.k),
    })?;
    e.run(OpT::RopeKvWrite {
        q: E::wr(&mut s.q),
        k: E::wr(&mut s.k),
        v: E::rd(&s.v),
        n_heads: c.n_heads,
        rope_dim: c.rope_dim,
        positions: E::idx_view(&bufs.positions),
        inv_freq: E::param(&w.inv_freq),
        neox: true,
        slots: E::idx_view(&bufs.slots),
        cache: E::kv_layer_mut(kv, attn_i)?,
    })?;
    e.run(OpT::PagedAttention {
        q: E::rd(&s.q),
        n_heads: c.n_heads,
        scale: 1.0 / (hd as f32).sqrt(),
        cache: E::kv_layer(kv, attn_i)?,
        batch: E::batch_view(&bufs.batch),
        opts: crate::backend::AttnOpts::none(),
        out: E::wr(&mut s.att),
    })?;
    e.run(OpT::SigmoidMul {
        x: E::wr(&mut s.att),
        gate: E::rd(&s.gate),
    })?;
    mat_muls(e, &s.att, n, vec![(&m.wo, x, true)], None, None, None)
}
