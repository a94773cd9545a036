//! The hybrid (Gated DeltaNet) ops of the op enum over a step's rows: each
//! run of consecutive rows of one state slot goes through the per-sequence
//! kernels of [`super::gdn`], with that slot's state. Serial: a row's state
//! depends on the rows before it, and slots are few per step.

use super::gdn::{self, DeltaRuleForm, DeltaShape};
use anyhow::{ensure, Context, Result};
use std::ops::Range;

/// Runs of consecutive rows with the same slot: (slot, rows). A slot may
/// not come back after another one (its rows must be consecutive, in
/// position order).
fn slot_runs(row_slots: &[u32]) -> Result<Vec<(usize, Range<usize>)>> {
    let mut runs: Vec<(usize, Range<usize>)> = Vec::new();
    for (i, &s) in row_slots.iter().enumerate() {
        match runs.last_mut() {
            Some((last, r)) if *last == s as usize => r.end = i + 1,
            _ => {
                ensure!(
                    !runs.iter().any(|(o, _)| *o == s as usize),
                    "row {i}: state slot {s} appears again after other slots \
                     (a slot's rows must be consecutive)"
                );
                runs.push((s as usize, i..i + 1));
            }
        }
    }
    Ok(runs)
}

/// The `len` elements of slot `s` in a per-layer state array.
fn slot_mut(state: &mut [f32], s: usize, len: usize) -> Result<&mut [f32]> {
    let end = s
        .checked_add(1)
        .and_then(|e| e.checked_mul(len))
        .context("state slot offset overflows")?;
    ensure!(
        end <= state.len(),
        "state slot {s} is out of range: the state holds {} slots of {len}",
        state.len() / len.max(1)
    );
    Ok(&mut state[s * len..end])
}

#[allow(clippy::too_many_arguments)] // the op's fields
pub fn conv1d_silu(
    x: &[f32],
    w: &[f32],
    channels: usize,
    kernel: usize,
    row_slots: &[u32],
    state: &mut [f32],
    out: &mut [f32],
) -> Result<()> {
    let n = row_slots.len();
    ensure!(
        x.len() == n * channels && out.len() == x.len(),
        "conv1d_silu: x {} and out {} for {n} rows of {channels} channels",
        x.len(),
        out.len()
    );
    let len = gdn::conv_state_len(kernel, channels);
    for (s, r) in slot_runs(row_slots)? {
        let (a, b) = (r.start * channels, r.end * channels);
        gdn::causal_conv1d_silu(
            &x[a..b],
            w,
            slot_mut(state, s, len)?,
            &mut out[a..b],
            channels,
            kernel,
        )?;
    }
    Ok(())
}

pub fn l2_norm_heads(
    x: &mut [f32],
    row_len: usize,
    n_heads: usize,
    head_dim: usize,
    eps: f32,
) -> Result<()> {
    let width = n_heads * head_dim;
    ensure!(
        row_len > 0 && width <= row_len && x.len().is_multiple_of(row_len),
        "l2_norm_heads: {n_heads} heads of {head_dim} in rows of {row_len} ({} values)",
        x.len()
    );
    for row in x.chunks_exact_mut(row_len) {
        gdn::l2_norm_heads(&mut row[..width], n_heads, head_dim, eps)?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)] // the op's fields
pub fn delta_rule(
    qkv: &[f32],
    g: &[f32],
    beta: &[f32],
    shape: DeltaShape,
    row_slots: &[u32],
    state: &mut [f32],
    out: &mut [f32],
) -> Result<()> {
    shape.validate()?;
    let n = row_slots.len();
    let (kd, vd) = (shape.h_k * shape.d_k, shape.h_v * shape.d_v);
    let width = 2 * kd + vd;
    ensure!(
        qkv.len() == n * width && out.len() == n * vd,
        "delta_rule: qkv {} (rows of {width}) and out {} (rows of {vd}) for {n} rows",
        qkv.len(),
        out.len()
    );
    ensure!(
        g.len() == n * shape.h_v && beta.len() == g.len(),
        "delta_rule: g {} and beta {} for {n} rows of {} heads",
        g.len(),
        beta.len(),
        shape.h_v
    );
    let len = shape.state_len();
    let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
    for (s, r) in slot_runs(row_slots)? {
        // The kernel takes q, k, v as separate (T, heads, dim) arrays.
        q.clear();
        k.clear();
        v.clear();
        for row in qkv[r.start * width..r.end * width].chunks_exact(width) {
            q.extend_from_slice(&row[..kd]);
            k.extend_from_slice(&row[kd..2 * kd]);
            v.extend_from_slice(&row[2 * kd..]);
        }
        let (ga, gb) = (r.start * shape.h_v, r.end * shape.h_v);
        gdn::gated_delta_rule(
            DeltaRuleForm::Recurrent,
            shape,
            &q,
            &k,
            &v,
            &g[ga..gb],
            &beta[ga..gb],
            slot_mut(state, s, len)?,
            &mut out[r.start * vd..r.end * vd],
        )?;
    }
    Ok(())
}

pub fn split_heads(x: &[f32], head_dim: usize, a: &mut [f32], b: &mut [f32]) -> Result<()> {
    ensure!(
        head_dim > 0
            && x.len().is_multiple_of(2 * head_dim)
            && a.len() * 2 == x.len()
            && b.len() == a.len(),
        "split_heads: x {} into a {} and b {} with head_dim {head_dim}",
        x.len(),
        a.len(),
        b.len()
    );
    for ((src, da), db) in x
        .chunks_exact(2 * head_dim)
        .zip(a.chunks_exact_mut(head_dim))
        .zip(b.chunks_exact_mut(head_dim))
    {
        da.copy_from_slice(&src[..head_dim]);
        db.copy_from_slice(&src[head_dim..]);
    }
    Ok(())
}

pub fn sigmoid_mul(x: &mut [f32], gate: &[f32]) -> Result<()> {
    ensure!(
        x.len() == gate.len(),
        "sigmoid_mul: x {} and gate {}",
        x.len(),
        gate.len()
    );
    for (v, &g) in x.iter_mut().zip(gate) {
        *v *= gdn::sigmoid(g);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_group_consecutive_rows() {
        let r = slot_runs(&[3, 3, 0, 5, 5, 5]).unwrap();
        assert_eq!(r, vec![(3, 0..2), (0, 2..3), (5, 3..6)]);
        assert!(slot_runs(&[1, 2, 1]).is_err());
        assert!(slot_runs(&[]).unwrap().is_empty());
    }

    #[test]
    fn slots_are_bounds_checked() {
        let mut st = vec![0f32; 8];
        assert_eq!(slot_mut(&mut st, 1, 4).unwrap().len(), 4);
        assert!(slot_mut(&mut st, 2, 4).is_err());
        assert!(slot_mut(&mut st, usize::MAX, 4).is_err());
    }

    #[test]
    fn split_and_gate() {
        let x: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let (mut a, mut b) = (vec![0f32; 4], vec![0f32; 4]);
        split_heads(&x, 2, &mut a, &mut b).unwrap();
        assert_eq!(a, [0.0, 1.0, 4.0, 5.0]);
        assert_eq!(b, [2.0, 3.0, 6.0, 7.0]);
        let mut y = vec![2.0f32, -1.0];
        sigmoid_mul(&mut y, &[0.0, 0.0]).unwrap();
        assert_eq!(y, [1.0, -0.5]);
    }
}
