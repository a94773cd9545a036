//! The qwen35 step graph (Qwen3.5 / 3.6 dense): pre-norm layers whose
//! mixer is a Gated DeltaNet (recurrent state per sequence) or, every
//! `full_attention_interval`-th layer, gated full attention over the paged
//! KV cache; then a SwiGLU FFN. Runs in host memory (the CUDA backend has no
//! kernels for the hybrid ops yet).
//!
//! Every op works per row, per (row, head), or per sequence in position
//! order (the recurrent ops), so a sequence's result never depends on the
//! other sequences of the step.

use super::llama::mat_muls;
use super::qwen35::{AttnLayer, GdnLayer, Mixer, Qwen35Weights};
use crate::backend::{AttnBatch, OpT};
use crate::dispatch::{Exec, HostExec, HostLogits};
use crate::kv::{KvStorage, RecurrentStates};
use crate::model::config::{GdnConfig, ModelConfig};
use crate::model::weights::HostStore;
use crate::model::StepInput;
use anyhow::{bail, ensure, Context, Result};

/// Scratch activations of one step, sized for `n` rows.
struct Scratch {
    h: Vec<f32>,     // (n, dim) normed input
    mixed: Vec<f32>, // (n, conv_dim) raw qkv projections
    conv: Vec<f32>,  // (n, conv_dim) conv + silu output: [q | k | v]
    z: Vec<f32>,     // (n, value_dim) output gate
    a: Vec<f32>,     // (n, h_v)
    b: Vec<f32>,     // (n, h_v)
    g: Vec<f32>,     // (n, h_v) log-decay
    beta: Vec<f32>,  // (n, h_v)
    o: Vec<f32>,     // (n, value_dim) delta rule output
    u: Vec<f32>,     // (n, value_dim) gated norm output
    qg: Vec<f32>,    // (n, n_heads, 2 * head_dim) q and gate, per head
    q_raw: Vec<f32>, // (n, n_heads, head_dim)
    gate: Vec<f32>,  // (n, n_heads, head_dim)
    q: Vec<f32>,     // (n, n_heads, head_dim)
    k_raw: Vec<f32>, // (n, n_kv_heads, head_dim)
    k: Vec<f32>,     // (n, n_kv_heads, head_dim)
    v: Vec<f32>,     // (n, n_kv_heads, head_dim)
    att: Vec<f32>,   // (n, n_heads, head_dim)
    ffn_g: Vec<f32>, // (n, ffn)
    ffn_u: Vec<f32>, // (n, ffn)
    act: Vec<f32>,   // (n, ffn)
}

impl Scratch {
    fn new(c: &ModelConfig, gd: &GdnConfig, n: usize) -> Scratch {
        let z = |len: usize| vec![0f32; n * len];
        let (qd, kvd) = (c.q_dim(), c.kv_dim());
        Scratch {
            h: z(c.dim),
            mixed: z(gd.conv_dim()),
            conv: z(gd.conv_dim()),
            z: z(gd.value_dim()),
            a: z(gd.n_v_heads),
            b: z(gd.n_v_heads),
            g: z(gd.n_v_heads),
            beta: z(gd.n_v_heads),
            o: z(gd.value_dim()),
            u: z(gd.value_dim()),
            qg: z(2 * qd),
            q_raw: z(qd),
            gate: z(qd),
            q: z(qd),
            k_raw: z(kvd),
            k: z(kvd),
            v: z(kvd),
            att: z(qd),
            ffn_g: z(c.ffn_dim),
            ffn_u: z(c.ffn_dim),
            act: z(c.ffn_dim),
        }
    }
}

/// Runs one step. `row_slots` (n,): each row's recurrent state slot (rows
/// of a slot consecutive, in position order); `kv` holds the attention
/// layers only, in order. Returns logits (input.logit_rows.len(), vocab).
pub fn forward_host(
    c: &ModelConfig,
    w: &Qwen35Weights<HostStore>,
    e: &HostExec<'_>,
    kv: &mut KvStorage,
    states: &mut RecurrentStates,
    row_slots: &[u32],
    input: &StepInput<'_>,
) -> Result<HostLogits> {
    input.validate(c.vocab_size)?;
    let gd = c
        .gdn
        .as_ref()
        .context("qwen35 graph without GDN parameters")?;
    let n = input.tokens.len();
    ensure!(
        row_slots.len() == n,
        "qwen35 step: {} state slots for {n} rows",
        row_slots.len()
    );
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
    let d = c.dim;
    let batch = AttnBatch {
        block_tables: input.block_tables,
        row_seq: input.row_seq,
        positions: input.positions,
    };
    let mut x = vec![0f32; n * d]; // (n, dim) residual stream
    e.run(OpT::GetRows {
        table: e.mat(&w.token_embd)?,
        ids: input.tokens,
        out: &mut x,
    })?;
    let mut s = Scratch::new(c, gd, n);
    let (mut gdn_i, mut attn_i) = (0, 0);
    for (li, l) in w.layers.iter().enumerate() {
        match &l.mixer {
            Mixer::Gdn(m) => {
                let (conv_st, ssm_st) = states.layer_mut(gdn_i)?;
                gdn_mixer(
                    c,
                    gd,
                    m,
                    &l.attn_norm,
                    e,
                    &mut x,
                    &mut s,
                    n,
                    row_slots,
                    conv_st,
                    ssm_st,
                )
                .with_context(|| format!("layer {li} (gated deltanet)"))?;
                gdn_i += 1;
            }
            Mixer::Attn(m) => {
                attn_mixer(
                    c,
                    w,
                    m,
                    &l.attn_norm,
                    e,
                    &mut x,
                    &mut s,
                    n,
                    input,
                    batch,
                    kv,
                    attn_i,
                )
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
    let m = logit_rows.len();
    if m == 0 {
        return Ok(HostLogits::default());
    }
    let mut sel = vec![0f32; m * d]; // (m, dim)
    e.run(OpT::SelectRows {
        x: &x,
        dim: d,
        rows: &logit_rows,
        out: &mut sel,
    })?;
    let mut normed = vec![0f32; m * d];
    let mut logits = vec![0f32; m * c.vocab_size];
    mat_muls(
        e,
        &sel,
        m,
        vec![(&w.output, &mut logits, false)],
        Some((&w.output_norm, c.rms_eps, &mut normed)),
        None,
        None,
    )?;
    e.download(logits)
}

/// x += GDN(rms_norm(x)) (spec: projections, gates, conv + SiLU, L2 norm
/// of q and k, the delta rule, gated RMS norm, output projection).
#[allow(clippy::too_many_arguments)]
fn gdn_mixer(
    c: &ModelConfig,
    gd: &GdnConfig,
    m: &GdnLayer<HostStore>,
    norm: &Vec<f32>,
    e: &HostExec<'_>,
    x: &mut Vec<f32>,
    s: &mut Scratch,
    n: usize,
    row_slots: &[u32],
    conv_state: &mut [f32],
    ssm_state: &mut [f32],
) -> Result<()> {
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
        a: &s.a,
        b: &s.b,
        dt_bias: &m.dt_bias,
        ssm_a: &m.ssm_a,
        g: &mut s.g,
        beta: &mut s.beta,
    })?;
    e.run(OpT::Conv1dSilu {
        x: &s.mixed,
        w: &m.conv_w,
        channels: gd.conv_dim(),
        kernel: gd.conv_kernel,
        row_slots,
        state: conv_state,
        out: &mut s.conv,
    })?;
    // q and k: the first 2 * h_k heads of d_k in each row.
    e.run(OpT::L2NormHeads {
        x: &mut s.conv,
        row_len: gd.conv_dim(),
        n_heads: 2 * gd.n_k_heads,
        head_dim: gd.d_k,
        eps: c.rms_eps,
    })?;
    e.run(OpT::DeltaRule {
        qkv: &s.conv,
        g: &s.g,
        beta: &s.beta,
        h_k: gd.n_k_heads,
        h_v: gd.n_v_heads,
        d_k: gd.d_k,
        d_v: gd.d_v,
        row_slots,
        state: ssm_state,
        out: &mut s.o,
    })?;
    e.run(OpT::GatedRmsNorm {
        x: &s.o,
        z: &s.z,
        w: &m.ssm_norm,
        head_dim: gd.d_v,
        eps: c.rms_eps,
        out: &mut s.u,
    })?;
    mat_muls(e, &s.u, n, vec![(&m.w_out, x, true)], None, None, None)
}

/// x += gated attention of rms_norm(x): q and its gate from one projection
/// (per head [q | gate]), per-head q/k RMS norms, partial NEOX RoPE, paged
/// attention, the output times sigmoid(gate), the output projection.
#[allow(clippy::too_many_arguments)]
fn attn_mixer(
    c: &ModelConfig,
    w: &Qwen35Weights<HostStore>,
    m: &AttnLayer<HostStore>,
    norm: &Vec<f32>,
    e: &HostExec<'_>,
    x: &mut Vec<f32>,
    s: &mut Scratch,
    n: usize,
    input: &StepInput<'_>,
    batch: AttnBatch<'_>,
    kv: &mut KvStorage,
    attn_i: usize,
) -> Result<()> {
    let hd = c.head_dim;
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
        x: &s.qg,
        head_dim: hd,
        a: &mut s.q_raw,
        b: &mut s.gate,
    })?;
    // Per-head RMS norm: (n, heads, hd) viewed as (n * heads, hd).
    e.run(OpT::RmsNorm {
        x: &s.q_raw,
        w: &m.q_norm,
        dim: hd,
        eps: c.rms_eps,
        out: &mut s.q,
    })?;
    e.run(OpT::RmsNorm {
        x: &s.k_raw,
        w: &m.k_norm,
        dim: hd,
        eps: c.rms_eps,
        out: &mut s.k,
    })?;
    e.run(OpT::RopeKvWrite {
        q: &mut s.q,
        k: &mut s.k,
        v: &s.v,
        n_heads: c.n_heads,
        rope_dim: c.rope_dim,
        positions: input.positions,
        inv_freq: &w.inv_freq,
        neox: true,
        slots: input.slots,
        cache: kv.layer_mut(attn_i)?,
    })?;
    e.run(OpT::PagedAttention {
        q: &s.q,
        n_heads: c.n_heads,
        scale: 1.0 / (hd as f32).sqrt(),
        cache: kv.layer(attn_i)?,
        batch,
        out: &mut s.att,
    })?;
    e.run(OpT::SigmoidMul {
        x: &mut s.att,
        gate: &s.gate,
    })?;
    mat_muls(e, &s.att, n, vec![(&m.wo, x, true)], None, None, None)
}
