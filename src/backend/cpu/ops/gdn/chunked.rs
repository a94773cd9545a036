//! Chunked (WY / UT transform) form of the gated delta rule, for prefill.
//! Same math as the recurrent form (spec: llama.cpp `build_delta_net_chunking`,
//! transformers `torch_chunk_gated_delta_rule`); agrees with it to f32
//! rounding only, so `exact` mode uses the recurrent form.
//!
//! Per value head h (key head `h % H_k`) and per chunk of L <= C tokens
//! (local indices i, j in [0, L); the last chunk is simply shorter, which
//! equals llama.cpp's zero padding with beta = g = 0 because padded rows
//! only ever add exact zeros and are dropped):
//!
//! ```text
//! G[i]    = G[i-1] + g[i]  (G[0] = g[0])            in-chunk cumulative log-decay
//! A[i][j] = (Σ_m (beta_i k_i[m]) k_j[m]) * exp(G[i] - G[j])     j < i  (mask before exp)
//! U[i]    = beta_i v_i          - Σ_{j<i} A[i][j] U[j]          forward substitution:
//! W[i]    = beta_i k_i exp(G[i]) - Σ_{j<i} A[i][j] W[j]         U = (I + A)^-1 diag(beta) V, ...
//! V'[i][c] = U[i][c] - Σ_m W[i][m] S[m][c]                     (S: the chunk-start state)
//! M[i][j] = (Σ_m qs_i[m] k_j[m]) * exp(G[i] - G[j])             j <= i
//! O[i][c] = exp(G[i]) * Σ_m qs_i[m] S[m][c] + Σ_{j<=i} M[i][j] V'[j][c]
//! S[m][c] = exp(G[L-1]) * S[m][c] + Σ_j (exp(G[L-1] - G[j]) * k_j[m]) * V'[j][c]
//! ```
//!
//! with `qs = q * rsqrt(d_k)`. All sums are sequential in the summed index
//! from `0.0` (the substitutions subtract in increasing j from the first
//! term). Scratch is allocated once per call, not per chunk or head.

use super::DeltaShape;
use crate::backend::cpu::canon;

/// Sequential dot product from `0.0`.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (&x, &y) in a.iter().zip(b) {
        acc += x * y;
    }
    acc
}

#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    shape: DeltaShape,
    t_len: usize,
    chunk: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    out: &mut [f32],
) {
    let DeltaShape { h_k, h_v, d_k, d_v } = shape;
    let c = chunk.min(t_len).max(1);
    let scale = canon::rsqrt(d_k as f32);
    let mut cum = vec![0f32; c]; // G
    let mut a_mat = vec![0f32; c * c]; // A, row-major, strictly lower used
    let mut m_mat = vec![0f32; c * c]; // M, row-major, lower with diagonal
    let mut u = vec![0f32; c * d_v]; // U then V' in place
    let mut w = vec![0f32; c * d_k];
    let mut qs = vec![0f32; c * d_k];
    let mut kb = vec![0f32; d_k];
    let mut tail = vec![0f32; c]; // exp(G[L-1] - G[j])

    for h in 0..h_v {
        let kh = shape.k_head(h);
        let krow = |t: usize| &k[(t * h_k + kh) * d_k..][..d_k];
        let s = &mut state[h * d_k * d_v..][..d_k * d_v];
        let mut t0 = 0;
        while t0 < t_len {
            let l = c.min(t_len - t0);
            let gb = |i: usize| (g[(t0 + i) * h_v + h], beta[(t0 + i) * h_v + h]);
            // G: in-chunk cumulative sum.
            let mut acc = 0f32;
            for (i, gi) in cum.iter_mut().enumerate().take(l) {
                acc = if i == 0 { gb(0).0 } else { acc + gb(i).0 };
                *gi = acc;
            }
            for i in 0..l {
                let qi = &q[((t0 + i) * h_k + kh) * d_k..][..d_k];
                for (o, &x) in qs[i * d_k..(i + 1) * d_k].iter_mut().zip(qi) {
                    *o = x * scale;
                }
            }
            // A (strictly lower) and M (lower with diagonal).
            for i in 0..l {
                let (_, bi) = gb(i);
                let ki = krow(t0 + i);
                for (o, &x) in kb.iter_mut().zip(ki) {
                    *o = bi * x;
                }
                for j in 0..=i {
                    let kj = krow(t0 + j);
                    let decay = canon::exp(cum[i] - cum[j]);
                    if j < i {
                        a_mat[i * c + j] = dot(&kb, kj) * decay;
                    }
                    m_mat[i * c + j] = dot(&qs[i * d_k..(i + 1) * d_k], kj) * decay;
                }
            }
            // U and W by forward substitution with the unit lower (I + A).
            for i in 0..l {
                let (_, bi) = gb(i);
                let vi = &v[((t0 + i) * h_v + h) * d_v..][..d_v];
                let (done, row) = u.split_at_mut(i * d_v);
                let row = &mut row[..d_v];
                for (o, &x) in row.iter_mut().zip(vi) {
                    *o = bi * x;
                }
                for j in 0..i {
                    let aij = a_mat[i * c + j];
                    for (o, &x) in row.iter_mut().zip(&done[j * d_v..(j + 1) * d_v]) {
                        *o -= aij * x;
                    }
                }
                let ki = krow(t0 + i);
                let eg = canon::exp(cum[i]);
                let (done, row) = w.split_at_mut(i * d_k);
                let row = &mut row[..d_k];
                for (o, &x) in row.iter_mut().zip(ki) {
                    *o = (bi * x) * eg;
                }
                for j in 0..i {
                    let aij = a_mat[i * c + j];
                    for (o, &x) in row.iter_mut().zip(&done[j * d_k..(j + 1) * d_k]) {
                        *o -= aij * x;
                    }
                }
            }
            // V' = U - W S (in place in u), reading the chunk-start state.
            for i in 0..l {
                let wi = &w[i * d_k..(i + 1) * d_k];
                for (col_idx, col) in s.chunks_exact(d_k).enumerate() {
                    u[i * d_v + col_idx] -= dot(wi, col);
                }
            }
            // Outputs, from the chunk-start state and V'.
            for i in 0..l {
                let eg = canon::exp(cum[i]);
                let qi = &qs[i * d_k..(i + 1) * d_k];
                let o = &mut out[((t0 + i) * h_v + h) * d_v..][..d_v];
                for (col_idx, col) in s.chunks_exact(d_k).enumerate() {
                    let mut acc = eg * dot(qi, col);
                    for j in 0..=i {
                        acc += m_mat[i * c + j] * u[j * d_v + col_idx];
                    }
                    o[col_idx] = acc;
                }
            }
            // State carried to the next chunk.
            let last = cum[l - 1];
            let e_last = canon::exp(last);
            for (j, tj) in tail.iter_mut().enumerate().take(l) {
                *tj = canon::exp(last - cum[j]);
            }
            for (col_idx, col) in s.chunks_exact_mut(d_k).enumerate() {
                for (m, sv) in col.iter_mut().enumerate() {
                    let mut acc = 0f32;
                    for j in 0..l {
                        acc +=
                            (tail[j] * k[((t0 + j) * h_k + kh) * d_k + m]) * u[j * d_v + col_idx];
                    }
                    *sv = e_last * *sv + acc;
                }
            }
            t0 += l;
        }
    }
}
