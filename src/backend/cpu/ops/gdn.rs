//! Gated DeltaNet (the `qwen35` linear-attention layer): CPU reference
//! kernels as pure functions over slices, for one sequence at a time.
//!
//! Per token the layer runs (GGUF tensor names):
//! `mixed = attn_qkv · x` -> [`causal_conv1d_silu`] (conv state carried) ->
//! split into q (H_k, d_k), k (H_k, d_k), v (H_v, d_v) -> [`l2_norm_heads`]
//! on q and k -> [`gdn_gates`] from `ssm_alpha · x`, `ssm_beta · x`,
//! `ssm_dt.bias`, `ssm_a` -> [`gated_delta_rule`] (state carried) ->
//! [`gated_rms_norm`] with `ssm_norm` and z = `attn_gate · x` -> `ssm_out`.
//!
//! # Conventions
//!
//! * Activations are token-major: an argument of shape (T, H, d) has element
//!   (t, h, e) at `(t * H + h) * d + e`.
//! * **Head mapping** (GGUF order): value head `h` reads key/query head
//!   `h % H_k` ([`DeltaShape::k_head`]). The GGUF converter permuted every
//!   per-value-head tensor from Hugging Face's grouped order (value head j
//!   reads key head `j / (H_v / H_k)`) to this tiled order, so no other
//!   permutation is needed when the weights come from a GGUF.
//! * **Recurrent state** S_h (d_k x d_v per value head, S[i][j] with i the
//!   key index and j the value index) is stored as llama.cpp stores it:
//!   element (h, i, j) at `h * d_k * d_v + j * d_k + i`, so each value
//!   column j is a contiguous run over the key index ([`DeltaShape::state_index`]).
//! * **Conv state**: the last K-1 raw (pre-conv) inputs per channel, element
//!   (tau, c) at `c * (K - 1) + tau`, tau = 0 the oldest (llama.cpp's layout).
//!   Both states start at zero for a new sequence.
//!
//! # Determinism
//!
//! Every function is single-threaded and every reduction over a head
//! dimension is the canonical 32-lane sum [`canon::dot32_by`] (lane `l` adds
//! the terms `l, l + 32, ...` in order from `0.0`, then the pairwise
//! 32-lane tree), so a CUDA warp reproduces it bit for bit with one lane per
//! stride. Every multiply and add is rounded on its own (no FMA: Rust never
//! contracts). The conv's K-tap sum is sequential. Transcendentals are the canonical ones of
//! [`crate::backend::cpu::canon`] (`exp`, `silu`, `rsqrt`) plus [`softplus`]
//! below, built from plain IEEE operations only. Results therefore depend
//! only on the inputs, never on the thread count or the ISA.
//!
//! For `exact` mode the canonical delta rule is [`DeltaRuleForm::Recurrent`]:
//! its operation sequence per token is fixed and independent of how many
//! tokens a call holds, so prefilling T tokens at once equals decoding them
//! one by one, bit for bit. [`DeltaRuleForm::Chunked`] (prefill only) agrees
//! with it to f32 rounding, not bitwise.

use crate::backend::cpu::canon;
use anyhow::{ensure, Result};

mod chunked;

/// Chunk length of the chunked (WY / UT) delta rule (llama.cpp's choice).
pub const GDN_CHUNK: usize = 64;

/// Threshold above which `softplus(x) = x` (torch's default, 20).
pub const SOFTPLUS_THRESHOLD: f32 = 20.0;

/// Head counts and sizes of one Gated DeltaNet layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaShape {
    /// Key (and query) heads: `ssm.group_count`.
    pub h_k: usize,
    /// Value heads: `ssm.time_step_rank`; a multiple of `h_k`.
    pub h_v: usize,
    /// Key head size: `ssm.state_size`.
    pub d_k: usize,
    /// Value head size: `ssm.inner_size / h_v`.
    pub d_v: usize,
}

impl DeltaShape {
    /// Errors unless every size is positive and `h_v` is a multiple of `h_k`.
    pub fn validate(&self) -> Result<()> {
        let DeltaShape { h_k, h_v, d_k, d_v } = *self;
        ensure!(
            h_k > 0 && h_v > 0 && d_k > 0 && d_v > 0,
            "gated_delta_rule: zero size in h_k {h_k}, h_v {h_v}, d_k {d_k}, d_v {d_v}"
        );
        ensure!(
            h_v.is_multiple_of(h_k),
            "gated_delta_rule: h_v {h_v} is not a multiple of h_k {h_k}"
        );
        Ok(())
    }

    /// The key/query head that value head `h` reads (tiled, GGUF order).
    #[inline]
    pub fn k_head(&self, h: usize) -> usize {
        h % self.h_k
    }

    /// Recurrent state length for one sequence: `h_v * d_k * d_v`.
    pub fn state_len(&self) -> usize {
        self.h_v * self.d_k * self.d_v
    }

    /// Offset of S_h[i][j] (key index i, value index j) in the state.
    #[inline]
    pub fn state_index(&self, h: usize, i: usize, j: usize) -> usize {
        h * self.d_k * self.d_v + j * self.d_k + i
    }

    /// Tokens in a call (`g` elements / h_v), after checking every
    /// argument length against the shape.
    #[allow(clippy::too_many_arguments)]
    fn check_args(
        &self,
        q: usize,
        k: usize,
        v: usize,
        g: usize,
        beta: usize,
        state: usize,
        out: usize,
    ) -> Result<usize> {
        self.validate()?;
        let DeltaShape { h_k, h_v, d_k, d_v } = *self;
        ensure!(
            g.is_multiple_of(h_v),
            "gated_delta_rule: g has {g} elements, not a multiple of h_v {h_v}"
        );
        let t = g / h_v;
        let want = [
            ("q", q, t * h_k * d_k, "T * h_k * d_k"),
            ("k", k, t * h_k * d_k, "T * h_k * d_k"),
            ("v", v, t * h_v * d_v, "T * h_v * d_v"),
            ("beta", beta, t * h_v, "T * h_v"),
            ("state", state, self.state_len(), "h_v * d_k * d_v"),
            ("out", out, t * h_v * d_v, "T * h_v * d_v"),
        ];
        for (name, got, need, what) in want {
            ensure!(
                got == need,
                "gated_delta_rule: {name} has {got} elements, expected {what} = {need} \
                 (T {t}, h_k {h_k}, h_v {h_v}, d_k {d_k}, d_v {d_v})"
            );
        }
        Ok(t)
    }
}

/// Which formulation of the delta rule a prefill uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeltaRuleForm {
    /// Token by token; canonical (bitwise independent of T and of how a
    /// sequence is split into calls). Use for `exact` and for decode.
    Recurrent,
    /// WY / UT chunked form with [`GDN_CHUNK`]-token chunks; agrees with
    /// `Recurrent` to f32 rounding. Prefill speed path only.
    Chunked,
}

/// Conv state length for one sequence: `(kernel - 1) * channels`.
pub fn conv_state_len(kernel: usize, channels: usize) -> usize {
    kernel.saturating_sub(1) * channels
}

/// Depthwise causal conv over time, no bias, followed by SiLU, for one
/// sequence's chunk of T tokens.
///
/// * `x`: (T, channels) raw `attn_qkv` outputs.
/// * `w`: (channels, kernel) = `ssm_conv1d.weight`; `w[c * kernel + i]`
///   multiplies the input `kernel - 1 - i` steps back (the last tap the
///   current token).
/// * `state`: (channels, kernel - 1), see the module docs; read, then
///   replaced by the last `kernel - 1` raw inputs (old state followed by x).
/// * `out`: (T, channels).
///
/// `out[t][c] = silu(Σ_{i=0}^{K-1} w[c][i] * win[i])` with `win` the K raw
/// inputs ending at token t, summed for i increasing from `0.0`. Each
/// output depends only on those K values, so any split of a sequence
/// into calls gives the same bits.
pub fn causal_conv1d_silu(
    x: &[f32],
    w: &[f32],
    state: &mut [f32],
    out: &mut [f32],
    channels: usize,
    kernel: usize,
) -> Result<()> {
    ensure!(
        channels > 0 && kernel > 0,
        "causal_conv1d: zero size in channels {channels}, kernel {kernel}"
    );
    ensure!(
        x.len().is_multiple_of(channels),
        "causal_conv1d: x has {} elements, not a multiple of channels {channels}",
        x.len()
    );
    let t_len = x.len() / channels;
    let ks = kernel - 1;
    ensure!(
        w.len() == channels * kernel,
        "causal_conv1d: w has {} elements, expected channels {channels} * kernel {kernel}",
        w.len()
    );
    ensure!(
        state.len() == ks * channels,
        "causal_conv1d: state has {} elements, expected (kernel {kernel} - 1) * channels {channels}",
        state.len()
    );
    ensure!(
        out.len() == x.len(),
        "causal_conv1d: out has {} elements, expected T {t_len} * channels {channels}",
        out.len()
    );
    for c in 0..channels {
        let wc = &w[c * kernel..(c + 1) * kernel];
        let sc = &mut state[c * ks..(c + 1) * ks];
        // The raw input at position p of the stream [old state (ks), x (T)],
        // p in [0, ks + T).
        let raw = |sc: &[f32], p: usize| {
            if p < ks {
                sc[p]
            } else {
                x[(p - ks) * channels + c]
            }
        };
        for t in 0..t_len {
            // Window of token t: stream positions t .. t + kernel.
            let mut acc = 0f32;
            for (i, &wi) in wc.iter().enumerate() {
                acc += wi * raw(sc, t + i);
            }
            out[t * channels + c] = canon::silu(acc);
        }
        // New state = stream positions T .. T + ks. Increasing tau reads
        // position tau + T >= tau, never an entry already overwritten.
        for tau in 0..ks {
            let v = raw(sc, tau + t_len);
            sc[tau] = v;
        }
    }
    Ok(())
}

/// In-place L2 norm of each of `n_rows` rows of `head_dim` (ggml's form):
/// `ss = dot32(x, x)`; `n = sqrt(ss)`; `x *= 1 / max(n, eps)`.
/// `eps` is `attention.layer_norm_rms_epsilon`. A NaN norm propagates.
pub fn l2_norm_heads(x: &mut [f32], n_rows: usize, head_dim: usize, eps: f32) -> Result<()> {
    ensure!(
        x.len() == n_rows * head_dim,
        "l2_norm: x has {} elements, expected rows {n_rows} * head_dim {head_dim}",
        x.len()
    );
    if head_dim == 0 {
        return Ok(());
    }
    for row in x.chunks_exact_mut(head_dim) {
        let ss = canon::dot32(row, row);
        let n = ss.sqrt();
        // `n < eps` is false for NaN, so a NaN norm is kept (f32::max would drop it).
        let scale = 1.0 / if n < eps { eps } else { n };
        for v in row.iter_mut() {
            *v *= scale;
        }
    }
    Ok(())
}

/// Per-head RMSNorm gated by SiLU (`ssm_norm`, a plain multiplier: the
/// converter does not add 1 to it):
/// `ss = dot32(x, x)`; `scale = rsqrt(ss / head_dim + eps)`;
/// `out = ((x * scale) * w) * silu(z)`.
///
/// * `x`, `z`, `out`: (n_rows, head_dim), rows are (token, value head);
///   z is `attn_gate · x` in the same (GGUF) head order as the delta-rule output.
/// * `w`: (head_dim,), shared by all heads.
/// * `eps`: `attention.layer_norm_rms_epsilon`.
pub fn gated_rms_norm(
    x: &[f32],
    z: &[f32],
    w: &[f32],
    head_dim: usize,
    eps: f32,
    out: &mut [f32],
) -> Result<()> {
    ensure!(head_dim > 0, "gated_rms_norm: head_dim is 0");
    ensure!(
        w.len() == head_dim,
        "gated_rms_norm: w has {} elements, expected head_dim {head_dim}",
        w.len()
    );
    ensure!(
        x.len().is_multiple_of(head_dim) && z.len() == x.len() && out.len() == x.len(),
        "gated_rms_norm: x {}, z {}, out {} elements; expected equal multiples of head_dim {head_dim}",
        x.len(),
        z.len(),
        out.len()
    );
    for ((xr, zr), or) in x
        .chunks_exact(head_dim)
        .zip(z.chunks_exact(head_dim))
        .zip(out.chunks_exact_mut(head_dim))
    {
        let ss = canon::dot32(xr, xr);
        let scale = canon::rsqrt(ss / head_dim as f32 + eps);
        for (((o, &v), &zv), &wv) in or.iter_mut().zip(xr).zip(zr).zip(w) {
            *o = ((v * scale) * wv) * canon::silu(zv);
        }
    }
    Ok(())
}

/// `1 / (1 + exp(-x))` with the canonical exp (0 below x = -88.8, where
/// that exp overflows; the true value there is below 4e-39).
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + canon::exp(-x))
}

/// `softplus(x) = ln(1 + e^x)`, or `x` above [`SOFTPLUS_THRESHOLD`]
/// (torch's rule; the error there is below e^-20). Below, `e = exp(x)`,
/// `u = 1 + e`, and `ln(1 + e) = e` when `u == 1`, else
/// `ln(u) * (e / (u - 1))` (the classic log1p correction, accurate for
/// tiny e where `ln(u)` alone would lose everything).
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x.is_nan() || x > SOFTPLUS_THRESHOLD {
        return x;
    }
    let e = canon::exp(x);
    let u = 1.0 + e;
    if u == 1.0 {
        return e;
    }
    ln_ge1(u) * (e / (u - 1.0))
}

const LN2_HI: f32 = f32::from_bits(0x3f31_7200); // 16 significant bits
const LN2_LO: f32 = 1.428_606_8e-6;

/// Natural log for finite `u >= 1`, from plain IEEE operations: write
/// `u = 2^e * m` (exact bit extraction) with m in [sqrt(1/2), sqrt(2)),
/// `s = (m - 1) / (m + 1)`, `ln m = 2s * (1 + s²/3 + s⁴/5 + … + s¹⁰/11)`
/// (Horner in s², |s| < 0.172 so the truncation is < 1e-10 relative),
/// `ln u = e * LN2_HI + (e * LN2_LO + ln m)` (the first product is exact).
#[inline]
fn ln_ge1(u: f32) -> f32 {
    let bits = u.to_bits();
    let mut e = ((bits >> 23) & 0xff) as i32 - 127;
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    if m > std::f32::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let mut p = 1.0 / 11.0;
    p = p * s2 + 1.0 / 9.0;
    p = p * s2 + 1.0 / 7.0;
    p = p * s2 + 1.0 / 5.0;
    p = p * s2 + 1.0 / 3.0;
    p = p * s2 + 1.0;
    let ln_m = (2.0 * s) * p;
    let ef = e as f32;
    ef * LN2_HI + (ef * LN2_LO + ln_m)
}

/// Decay and write strength per (token, value head):
/// `g = softplus(a + dt_bias) * ssm_a` (<= 0; `ssm_a` is already
/// `-exp(A_log)` in the GGUF, do not exponentiate it again) and
/// `beta = sigmoid(b)`.
///
/// * `a`: (T, H_v) = `ssm_alpha · x` (the decay path);
///   `b`: (T, H_v) = `ssm_beta · x` (the write strength).
/// * `dt_bias` = `ssm_dt.bias`, `ssm_a`: (H_v,).
/// * `g_out`, `beta_out`: (T, H_v).
pub fn gdn_gates(
    a: &[f32],
    b: &[f32],
    dt_bias: &[f32],
    ssm_a: &[f32],
    g_out: &mut [f32],
    beta_out: &mut [f32],
) -> Result<()> {
    let h_v = dt_bias.len();
    ensure!(h_v > 0, "gdn_gates: dt_bias is empty");
    ensure!(
        ssm_a.len() == h_v,
        "gdn_gates: ssm_a has {} elements, dt_bias {h_v}",
        ssm_a.len()
    );
    ensure!(
        a.len().is_multiple_of(h_v) && b.len() == a.len() && g_out.len() == a.len() && beta_out.len() == a.len(),
        "gdn_gates: a {}, b {}, g_out {}, beta_out {} elements; expected equal multiples of h_v {h_v}",
        a.len(),
        b.len(),
        g_out.len(),
        beta_out.len()
    );
    for (r, (go, bo)) in g_out
        .chunks_exact_mut(h_v)
        .zip(beta_out.chunks_exact_mut(h_v))
        .enumerate()
    {
        let (ar, br) = (&a[r * h_v..(r + 1) * h_v], &b[r * h_v..(r + 1) * h_v]);
        for h in 0..h_v {
            go[h] = softplus(ar[h] + dt_bias[h]) * ssm_a[h];
            bo[h] = sigmoid(br[h]);
        }
    }
    Ok(())
}

/// The gated delta rule over T tokens of one sequence, updating `state`.
///
/// * `q`, `k`: (T, H_k, d_k), already L2-normalised ([`l2_norm_heads`]);
///   q is **not** yet scaled: the kernel uses `q * (1 / sqrt(d_k))`
///   (`canon::rsqrt(d_k)`, one rounded multiply per element).
/// * `v`: (T, H_v, d_v); `g`, `beta`: (T, H_v) from [`gdn_gates`].
/// * `state`: (H_v, d_v, d_k) layout, see [`DeltaShape::state_index`].
/// * `out`: (T, H_v, d_v).
///
/// See [`DeltaRuleForm`] for the two forms; they compute the same math.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule(
    form: DeltaRuleForm,
    shape: DeltaShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    out: &mut [f32],
) -> Result<()> {
    if form == DeltaRuleForm::Chunked {
        return gated_delta_rule_chunked(shape, GDN_CHUNK, q, k, v, g, beta, state, out);
    }
    let t = shape.check_args(
        q.len(),
        k.len(),
        v.len(),
        g.len(),
        beta.len(),
        state.len(),
        out.len(),
    )?;
    recurrent(shape, t, q, k, v, g, beta, state, out);
    Ok(())
}

/// [`gated_delta_rule`] in chunked form with a chosen chunk length (tests
/// and tuning; [`GDN_CHUNK`] is the production value).
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule_chunked(
    shape: DeltaShape,
    chunk: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    out: &mut [f32],
) -> Result<()> {
    ensure!(chunk > 0, "gated_delta_rule: chunk length 0");
    let t = shape.check_args(
        q.len(),
        k.len(),
        v.len(),
        g.len(),
        beta.len(),
        state.len(),
        out.len(),
    )?;
    chunked::run(shape, t, chunk, q, k, v, g, beta, state, out);
    Ok(())
}

/// Recurrent form. Per token t (increasing) and value head h, with
/// `kh = h % H_k`, `qs[i] = q[t][kh][i] * scale`, `decay = exp(g[t][h])`
/// and for every value column j (each column's update reads only itself):
///
/// ```text
/// S[i][j] = S[i][j] * decay                 for all i     (decay first)
/// kv      = dot32_i(S[i][j] * k[t][kh][i])
/// d       = beta[t][h] * (v[t][h][j] - kv)
/// S[i][j] = S[i][j] + k[t][kh][i] * d       for all i
/// out[t][h][j] = dot32_i(S[i][j] * qs[i])   (the updated state)
/// ```
///
/// A CUDA warp per column holds lane `l`'s entries `i = l, l + 32, ...` in
/// registers and computes the same bits.
///
/// This is transformers' `torch_recurrent_gated_delta_rule` step order.
#[allow(clippy::too_many_arguments)]
fn recurrent(
    shape: DeltaShape,
    t_len: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    out: &mut [f32],
) {
    let DeltaShape { h_k, h_v, d_k, d_v } = shape;
    let scale = canon::rsqrt(d_k as f32);
    let mut qs = vec![0f32; d_k];
    for t in 0..t_len {
        for h in 0..h_v {
            let kh = shape.k_head(h);
            let qt = &q[(t * h_k + kh) * d_k..][..d_k];
            let kt = &k[(t * h_k + kh) * d_k..][..d_k];
            let vt = &v[(t * h_v + h) * d_v..][..d_v];
            let decay = canon::exp(g[t * h_v + h]);
            let b = beta[t * h_v + h];
            let s = &mut state[h * d_k * d_v..][..d_k * d_v];
            let o = &mut out[(t * h_v + h) * d_v..][..d_v];
            for (qsi, &qi) in qs.iter_mut().zip(qt) {
                *qsi = qi * scale;
            }
            for (j, col) in s.chunks_exact_mut(d_k).enumerate() {
                for sv in col.iter_mut() {
                    *sv *= decay;
                }
                let kv = canon::dot32(col, kt);
                let d = b * (vt[j] - kv);
                for (sv, &ki) in col.iter_mut().zip(kt) {
                    *sv += ki * d;
                }
                o[j] = canon::dot32(col, &qs);
            }
        }
    }
}
